"""A model's layer specs as the families' cases: prefill (B=1), training (B x T) and decode (one
new token of each of B requests) shapes, one case per model, layer kind, tensor-parallel degree
and shape, with ids such as ``llama3-8b.full.tp8.prefill-t4096`` (pure but for the case types).

A softmax layer's decode case is a ``SoftmaxCase`` with ``kv_seq``; a linear layer's is its
family's recurrent step from a state (``LinearDecodeCase``), one per batch size. A sliding
window at least as long as the sequence is causal attention without a window. The default
shapes: docs/models.md, "Shapes".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_attnperf.families.linear.case import LinearCase
from pytest_attnperf.families.linear.decode import LinearDecodeCase
from pytest_attnperf.families.models.layers import AttentionLayers, LayerSpec, LinearLayers
from pytest_attnperf.families.softmax.decode import cache_label
from pytest_attnperf.families.softmax.kernels import SoftmaxCase

__all__ = ["CaseName", "ModelCases", "Shapes", "build", "case_name", "parse_decode", "parse_prefill", "parse_train",
           "shapes"]

GPU_PREFILL, GPU_TRAIN, GPU_DECODE = (4096, 16384), ((8, 4096),), ((1, 32768), (32, 8192))
CPU_PREFILL, CPU_TRAIN, CPU_DECODE = (128,), ((2, 64),), ((2, 64),)


def _positive(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a whole number") from None
    if value < 1:
        raise ValueError(f"{what} {text!r} must be at least 1")
    return value


def _items(text: str) -> list[str]:
    return [p.strip().lower() for p in text.split(",") if p.strip()]


def parse_prefill(text: str) -> tuple[int, ...] | None:
    """'4096,16384' as (4096, 16384); 'none' as (): no prefill cases; '' as None (the defaults)."""
    items = _items(text)
    if not items:
        return None
    return () if items == ["none"] else tuple(dict.fromkeys(_positive(p, "sequence length") for p in items))


def _pairs(text: str, second: str, form: str, example: str) -> tuple[tuple[int, int], ...] | None:
    items = _items(text)
    if not items:
        return None
    if items == ["none"]:
        return ()
    out = []
    for item in items:
        batch, sep, length = item.partition("x")
        if not sep:
            raise ValueError(f"{item!r} is not {form}, such as {example}")
        out.append((_positive(batch, "batch"), _positive(length, second)))
    return tuple(dict.fromkeys(out))  # a shape given twice is one shape (its cases' ids would clash)


def parse_train(text: str) -> tuple[tuple[int, int], ...] | None:
    """'8x4096,4x8192' as ((8, 4096), (4, 8192)), batch by sequence; 'none' as (); '' as None."""
    return _pairs(text, "sequence length", "BATCHxSEQ", "8x4096")


def parse_decode(text: str) -> tuple[tuple[int, int], ...] | None:
    """'1x32768,32x8192' as ((1, 32768), (32, 8192)), batch by cached tokens; 'none' as (); '' as None."""
    return _pairs(text, "cache length", "BATCHxCACHE", "32x8192")


@dataclass(frozen=True)
class Shapes:
    """The shapes every model layer is run at, and their dtype."""

    prefill: tuple[int, ...]
    train: tuple[tuple[int, int], ...]
    dtype: str
    gpu: bool
    decode: tuple[tuple[int, int], ...] = ()  # (batch, cached tokens)


def shapes(prefill: str = "", train: str = "", gpu: bool = True, decode: str = "") -> Shapes:
    """The shapes given (``--attnperf-model-prefill``, ``--attnperf-model-train``,
    ``--attnperf-model-decode``), or the device's defaults."""
    given_prefill, given_train, given_decode = parse_prefill(prefill), parse_train(train), parse_decode(decode)
    return Shapes(
        given_prefill if given_prefill is not None else GPU_PREFILL if gpu else CPU_PREFILL,
        given_train if given_train is not None else GPU_TRAIN if gpu else CPU_TRAIN,
        "bf16" if gpu else "fp32", gpu,
        given_decode if given_decode is not None else GPU_DECODE if gpu else CPU_DECODE,
    )


@dataclass(frozen=True)
class CaseName:
    """What a model case's id says: ``llama3-8b.full.tp8.decode-b32-cache8k`` is model ``llama3-8b``,
    layer kind ``full``, degree 8, phase ``decode``, shape ``b32-cache8k``."""

    model: str
    kind: str
    tp: int
    phase: str  # prefill, train or decode
    shape: str  # t4096, b8-t4096, b32-cache8k, b32


# model names and kinds hold letters, digits, '-' and '_' (docs/models.md), never a dot
_CASE_ID = re.compile(r"(?P<model>[\w-]+)\.(?P<kind>[\w-]+)\.tp(?P<tp>\d+)\."
                      r"(?P<phase>prefill|train|decode)-(?P<shape>[\w-]+)")


def case_name(case_id: str) -> CaseName | None:
    """The parts of an id ``build`` gives a case; None for any other id."""
    m = _CASE_ID.fullmatch(case_id)
    if m is None:
        return None
    return CaseName(m["model"], m["kind"], int(m["tp"]), m["phase"], m["shape"])


@dataclass(frozen=True)
class ModelCases:
    """The cases of the models given, by family (``softmax``, ``gdn``...), and each case's layer spec by id."""

    softmax: tuple[SoftmaxCase, ...]
    linear: tuple[LinearCase, ...]
    layers: dict[str, tuple[str, LayerSpec]]  # case id -> (model name, the layers it stands for)
    softmax_decode: tuple[SoftmaxCase, ...] = ()
    linear_decode: tuple[LinearDecodeCase, ...] = ()


def _points(s: Shapes) -> list[tuple[str, int, int]]:
    return ([(f"prefill-t{t}", 1, t) for t in s.prefill]
            + [(f"train-b{b}-t{t}", b, t) for b, t in s.train])


def _softmax(case_id: str, spec: AttentionLayers, batch: int, seq: int, s: Shapes,
             cache: int | None = None) -> SoftmaxCase:
    """``seq`` queries over as many keys, or (decode) over ``cache`` keys, causal aligned to their end."""
    keys = seq if cache is None else cache
    window = spec.window if spec.window is not None and spec.window < keys else None
    kv = spec.kv_heads if spec.kv_heads != spec.heads else None
    return SoftmaxCase(case_id, batch, spec.heads, seq, spec.head_dim, s.dtype, True, kv_heads=kv, window=window,
                       gpu=s.gpu, kv_seq=cache)


def _key_heads(spec: LinearLayers) -> int | None:
    """The rank's query/key heads where fewer than its value heads (``key_heads``: each serves
    ``value_heads // key_heads`` value heads, docs/models.md, "Linear layers"), else None."""
    return spec.key_heads if spec.key_heads != spec.value_heads else None


def _linear(case_id: str, spec: LinearLayers, batch: int, seq: int, s: Shapes) -> LinearCase:
    """A gated DeltaNet case at the rank's value heads and query/key heads."""
    return LinearCase(case_id, batch, spec.value_heads, seq, spec.key_dim, spec.value_dim, s.dtype, gpu=s.gpu,
                      key_heads=_key_heads(spec))


def _linear_decode(case_id: str, spec: LinearLayers, batch: int, s: Shapes) -> LinearDecodeCase:
    """One recurrent step of each request from its state, at the rank's value and query/key heads."""
    return LinearDecodeCase(case_id, batch, spec.value_heads, 1, spec.key_dim, spec.value_dim, s.dtype, gpu=s.gpu,
                            key_heads=_key_heads(spec))


def build(models: Sequence[tuple[str, dict[int, tuple[LayerSpec, ...]]]], s: Shapes) -> ModelCases:
    """The cases of each ``(model name, layer specs by tensor-parallel degree)`` at the shapes ``s``."""
    softmax: list[SoftmaxCase] = []
    linear: list[LinearCase] = []
    softmax_decode: list[SoftmaxCase] = []
    linear_decode: list[LinearDecodeCase] = []
    layers: dict[str, tuple[str, LayerSpec]] = {}
    for name, by_tp in models:
        for tp, specs in by_tp.items():
            for spec in specs:
                base = f"{name}.{spec.kind}.tp{tp}"
                for point, batch, seq in _points(s):
                    case_id = f"{base}.{point}"
                    layers[case_id] = (name, spec)
                    if isinstance(spec, AttentionLayers):
                        softmax.append(_softmax(case_id, spec, batch, seq, s))
                    else:
                        linear.append(_linear(case_id, spec, batch, seq, s))
                if isinstance(spec, AttentionLayers):
                    for batch, cache in s.decode:
                        case_id = f"{base}.decode-b{batch}-cache{cache_label(cache)}"
                        layers[case_id] = (name, spec)
                        softmax_decode.append(_softmax(case_id, spec, batch, 1, s, cache=cache))
                else:
                    for batch in dict.fromkeys(b for b, _ in s.decode):  # a state has no cache length
                        case_id = f"{base}.decode-b{batch}"
                        layers[case_id] = (name, spec)
                        linear_decode.append(_linear_decode(case_id, spec, batch, s))
    return ModelCases(tuple(softmax), tuple(linear), layers, tuple(softmax_decode), tuple(linear_decode))
