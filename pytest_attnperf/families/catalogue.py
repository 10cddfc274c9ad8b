"""The correctness catalogue: rows generated from named trigger classes, apart from the timed tables.

Each row is a family's case tagged with the trigger classes it exercises (``CLASSES``: where
published attention-kernel bugs live) and the tier it belongs to (``smoke`` reaches every class of
the family at least once; ``full`` is the whole catalogue). Rows run check-only: the suite
(``families.catalogue_suite``) checks every registered kernel of the family on them and times
nothing. docs/catalogue.md lists the classes, the rows and the bugs they come from.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from pytest_attnperf.families.linear.case import LinearCase
from pytest_attnperf.families.softmax.kernels import SoftmaxCase

__all__ = ["CLASSES", "TIERS", "Row", "classes_of", "linear_rows", "rows", "softmax_rows"]

TIERS = ("off", "smoke", "full")

CLASSES: dict[str, str] = {
    "tile-edge": "lengths around a tile (15, 17, 63, 65, 127, 129, 255, 257) and a prime: a last partial block",
    "tiny-seq": "one or two tokens: an empty or degenerate tile",
    "q-lt-k": "fewer queries than keys, causal aligned lower-right (decode, chunked prefill)",
    "head-dim": "head dims other than the timed tables' (32, 64): 16, 80, 96, 128, 256, 40",
    "asym-dim": "a key/query head dim different from the value's",
    "gqa": "grouped query (or value) heads at ratios 2, 4 and 8",
    "mqa": "one key/value head for every query head",
    "batch-heads": "three or more sequences and heads, each with its own content: per-batch and per-head offsets",
    "window-edge": "sliding windows of 1, an odd width, T-1 and at least T",
    "layout-strided": "non-contiguous inputs: a transposed view of a [B, T, H, D] buffer, a channel slice",
    "layout-stride0": "K and V of one head expanded over the query heads with stride 0",
    "grid-limit": "batch x heads past 65535 (a launch grid's y and z limit)",
    "long-keys": "more than 65536 keys (16-bit indices and offsets)",
    "long-seq": "a sequence past 65536 tokens (16-bit indices and offsets)",
    "low-precision": "bf16 and fp16 inputs on the catalogue's shapes",
    "large-logits": "scores past exp's overflow: a row maximum not subtracted overflows",
    "negative-lse": "every score of a row about -150: a running maximum started at 0 underflows the sum",
    "ties": "every key of a head equal: tied scores, a uniform softmax",
    "onehot": "one-hot queries and keys, zero queries: sparse, exactly tied scores",
    "gate-near-zero": "log decays near 0: the state keeps everything",
    "gate-strong": "log decays of -20 to -60 a token: the state forgets at once, exp(-cumsum) overflows",
    "decay-underflow": "about exp(-3) a token: a chunk's cumulative decay underflows fp32",
    "beta-bounds": "GDN's beta at 0 and at its maximum on alternate tokens",
    "large-state": "a state past fp16's range while the output stays representable",
    "backward": "the gradients (every fwdbwd row)",
    "state": "an initial state in and the final state out (fla's initial_state, output_final_state)",
    "varlen": "sequences packed with cu_seqlens: ragged, of one token, across a chunk of 64",
    "split-state": "relation: two calls with the state carried equal one call on the whole",
    "packed-loop": "relation: packed sequences equal one call per sequence",
    "batch-split": "relation: a batch of N equals N calls of one batch entry",
    "lse": "the log-sum-exp returned beside the output (return_lse=True)",
    "q-gt-k": "more queries than keys, causal aligned lower-right: the top rows see no key",
    "v-dim": "a value head dim other than the query/key one (MLA's qk 192 / v 128)",
    "mask": "an explicit attn_mask: padding by batch entry, per-head patterns, additive biases",
    "fully-masked": "rows whose every key is masked: output 0 and log-sum-exp -inf, not NaN",
    "prefix": "relation: appending tokens leaves a causal kernel's earlier outputs as they were",
    "inference": "relation: the forward under no_grad and inference_mode equals the grad-mode call, inputs and "
                 "initial state unchanged",
    "kv-cache": "decode into a KV cache: new tokens written at each request's cache_seqlens, attending its own prefix; "
                "the cache checked after the call",
    "paged": "a paged KV cache: a block table into a shuffled pool of pages, new tokens crossing a page",
    "cache-ragged": "requests of different cache lengths in one call, one of them 0 or 1 token",
}


@dataclass(frozen=True)
class Row:
    """One catalogue row: a family's case, the trigger classes it exercises, its tier (``smoke``
    rows are in the full tier too) and whether it needs a GPU's memory or time (``gpu``)."""

    case: Any  # the family's case type (SoftmaxCase, LinearCase)
    classes: tuple[str, ...]
    tier: str = "full"
    gpu: bool = False

    def __post_init__(self) -> None:
        unknown = [c for c in self.classes if c not in CLASSES]
        if unknown or self.tier not in TIERS[1:]:
            raise ValueError(f"catalogue row {self.case.id}: unknown class {unknown} or tier {self.tier!r}")

    @property
    def id(self) -> str:
        """The case's id, which names the row."""
        return str(self.case.id)


# -- softmax ---------------------------------------------------------------------------------


def _softmax(batch: int, heads: int, seq: int, dim: int, dtype: str = "fp32", *, causal: bool = True,
             kv_heads: int | None = None, window: int | None = None, kv_seq: int | None = None,
             values: str = "normal", layout: str = "contiguous", lse: bool = False, dim_v: int | None = None,
             mask: str | None = None, relation: str | None = None, cache: str | None = None,
             lengths: tuple[int, ...] | None = None, page: int | None = None) -> SoftmaxCase:
    parts = [f"b{batch}", f"h{heads}"] + ([f"kv{kv_heads}"] if kv_heads else []) + [f"t{seq}"]
    parts += [f"k{kv_seq}"] if kv_seq else []
    parts += [f"d{dim}"] + ([f"v{dim_v}"] if dim_v else []) + ([f"w{window}"] if window else [])
    parts += (["causal"] if causal else []) + [dtype]
    parts += [] if values == "normal" else [values]
    parts += [] if layout == "contiguous" else [layout]
    parts += (["lse"] if lse else []) + ([f"mask-{mask}"] if mask else []) + ([f"rel-{relation}"] if relation else [])
    parts += [f"{cache}{page or ''}-lens{'x'.join(map(str, lengths or ()))}"] if cache else []
    return SoftmaxCase("cat-" + "-".join(parts), batch, heads, seq, dim, dtype, causal, kv_heads=kv_heads,
                       window=window, gpu=False, kv_seq=kv_seq, values=values, layout=layout, lse=lse,
                       head_dim_v=dim_v, mask=mask, relation=relation, cache=cache, cache_lengths=lengths,
                       page_size=page)


def softmax_rows() -> Iterator[Row]:
    """The softmax family's catalogue (``SoftmaxCase``: [B, H, T, d], K/V may have fewer heads)."""
    S = _softmax
    # smoke: every class at least once, each row small
    yield Row(S(3, 3, 17, 32), ("tile-edge", "batch-heads"), "smoke")
    yield Row(S(1, 2, 33, 32, causal=False), ("tile-edge",), "smoke")  # a padded last key tile the causal limit hides
    yield Row(S(1, 2, 1, 16, causal=False), ("tiny-seq", "head-dim"), "smoke")
    yield Row(S(2, 2, 1, 32, kv_seq=255), ("q-lt-k", "tiny-seq", "tile-edge"), "smoke")
    yield Row(S(2, 2, 17, 32, kv_seq=65), ("q-lt-k", "tile-edge"), "smoke")
    yield Row(S(1, 2, 65, 96, "bf16"), ("head-dim", "tile-edge", "low-precision"), "smoke")
    yield Row(S(2, 8, 33, 32, kv_heads=2), ("gqa",), "smoke")
    yield Row(S(1, 4, 31, 32, kv_heads=1), ("mqa",), "smoke")
    yield Row(S(1, 2, 64, 32, window=1), ("window-edge",), "smoke")
    yield Row(S(2, 3, 40, 32, layout="transposed"), ("layout-strided", "batch-heads"), "smoke")
    yield Row(S(1, 4, 24, 32, kv_heads=1, layout="expanded-kv"), ("layout-stride0", "mqa"), "smoke")
    yield Row(S(4097, 16, 1, 8, kv_seq=2), ("grid-limit", "q-lt-k"), "smoke")
    yield Row(S(1, 1, 2, 8, "bf16", kv_seq=65600), ("long-keys", "q-lt-k", "low-precision"), "smoke")
    yield Row(S(2, 2, 48, 32, causal=False, values="large-logits"), ("large-logits",), "smoke")
    yield Row(S(2, 2, 48, 32, "fp16", values="large-logits"), ("large-logits", "low-precision"), "smoke")
    yield Row(S(2, 2, 40, 32, values="negative-lse"), ("negative-lse",), "smoke")
    yield Row(S(2, 2, 40, 32, values="ties"), ("ties",), "smoke")
    yield Row(S(2, 2, 40, 32, causal=False, values="onehot"), ("onehot",), "smoke")
    # the call axes (a kernel that does not declare one refuses its rows) and the checks between calls
    yield Row(S(2, 2, 17, 32, lse=True), ("lse",), "smoke")
    yield Row(S(2, 2, 17, 32, kv_seq=9), ("q-gt-k",), "smoke")  # the top 8 rows see no key
    yield Row(S(2, 2, 17, 32, kv_seq=9, lse=True), ("q-gt-k", "lse"), "smoke")
    yield Row(S(1, 2, 20, 48, dim_v=32), ("v-dim", "asym-dim"), "smoke")  # MLA's 192 / 128, scaled down
    yield Row(S(3, 2, 20, 32, causal=False, mask="padding"), ("mask",), "smoke")
    yield Row(S(1, 4, 20, 32, causal=False, mask="per-head"), ("mask", "batch-heads"), "smoke")
    yield Row(S(2, 3, 20, 32, causal=False, mask="fully-masked"), ("mask", "fully-masked"), "smoke")
    yield Row(S(2, 3, 20, 32, causal=False, mask="fully-masked", lse=True), ("mask", "fully-masked", "lse"), "smoke")
    yield Row(S(2, 2, 40, 32, relation="prefix"), ("prefix",), "smoke")
    yield Row(S(2, 2, 40, 32, relation="inference"), ("inference",), "smoke")
    yield Row(S(4, 2, 20, 32, relation="batch-split"), ("batch-split", "batch-heads"), "smoke")
    # decode into a KV cache (kv_seq: the cache's slots; lens: each request's tokens before the call)
    yield Row(S(3, 4, 1, 32, kv_heads=2, kv_seq=32, cache="append", lengths=(5, 0, 17)),
              ("kv-cache", "cache-ragged", "gqa"), "smoke")
    yield Row(S(2, 2, 3, 32, kv_seq=24, cache="append", lengths=(1, 20)), ("kv-cache", "cache-ragged"), "smoke")
    yield Row(S(3, 4, 1, 32, kv_heads=2, kv_seq=32, cache="paged", page=8, lengths=(9, 0, 23)),
              ("paged", "kv-cache", "cache-ragged", "gqa"), "smoke")
    yield Row(S(2, 2, 3, 32, kv_seq=32, cache="paged", page=4, lengths=(7, 2)), ("paged", "kv-cache"), "smoke")
    yield Row(S(2, 4, 2, 32, kv_heads=2, kv_seq=32, lse=True, cache="paged", page=8, lengths=(0, 21)),
              ("paged", "kv-cache", "lse"), "smoke")  # a decode step's LSE, as split-KV and cascade merges read it
    # full: the rest of each class
    for t in (2, 15, 63, 127, 129, 255, 257, 263):
        yield Row(S(2, 2, t, 32), ("tile-edge",) + (("tiny-seq",) if t <= 2 else ()))
    for t in (63, 129):
        yield Row(S(2, 2, t, 32, "fp16", causal=False), ("tile-edge", "low-precision"))
    for q, k in ((1, 128), (1, 513), (15, 16), (63, 200), (128, 513), (127, 129)):
        yield Row(S(2, 2, q, 32, kv_seq=k), ("q-lt-k",) + (("tile-edge",) if k % 16 else ()))
    yield Row(S(1, 2, 1, 64, "bf16", kv_seq=1000), ("q-lt-k", "low-precision"))
    for d in (16, 40, 64, 80, 128, 256):
        yield Row(S(1, 2, 70, d), ("head-dim", "tile-edge"))
    yield Row(S(1, 2, 70, 128, "bf16"), ("head-dim", "low-precision"))
    for heads, kv in ((4, 2), (8, 4), (16, 2), (6, 3)):
        yield Row(S(2, heads, 33, 32, kv_heads=kv), ("gqa",))
    yield Row(S(1, 4, 31, 32, kv_heads=2, kv_seq=97), ("gqa", "q-lt-k"))
    yield Row(S(2, 8, 33, 32, kv_heads=1, causal=False), ("mqa",))
    for w in (33, 63, 64, 100):
        yield Row(S(1, 2, 64, 32, window=w), ("window-edge",))
    yield Row(S(1, 2, 17, 32, window=5, kv_seq=80), ("window-edge", "q-lt-k"))
    yield Row(S(4, 5, 29, 32), ("batch-heads", "tile-edge"))
    yield Row(S(3, 4, 40, 32, kv_heads=2, layout="sliced"), ("layout-strided", "gqa"))
    yield Row(S(2, 3, 1, 32, kv_seq=90, layout="transposed"), ("layout-strided", "q-lt-k"))
    yield Row(S(2, 4, 24, 32, kv_heads=1, causal=False, layout="expanded-kv"), ("layout-stride0",))
    yield Row(S(33000, 2, 3, 8), ("grid-limit",))
    yield Row(S(1, 1, 1, 8, "bf16", kv_seq=70000, causal=False), ("long-keys", "q-lt-k", "low-precision"))
    for values in ("large-logits", "negative-lse", "ties", "onehot"):
        yield Row(S(2, 2, 65, 32, "bf16", values=values), (values, "low-precision", "tile-edge"))
        yield Row(S(1, 4, 1, 32, kv_heads=2, kv_seq=77, values=values), (values, "q-lt-k", "gqa"))
    yield Row(S(1, 2, 70, 32, "bf16", lse=True), ("lse", "low-precision", "tile-edge"))
    yield Row(S(2, 2, 40, 32, causal=False, values="large-logits", lse=True), ("lse", "large-logits"))
    yield Row(S(1, 4, 31, 32, kv_heads=2, kv_seq=5), ("q-gt-k", "gqa"))
    yield Row(S(1, 2, 20, 32, kv_seq=4, causal=False), ("q-gt-k",))
    yield Row(S(1, 2, 70, 32, "bf16", kv_seq=65, lse=True), ("q-gt-k", "lse", "low-precision", "tile-edge"))
    yield Row(S(2, 8, 33, 48, kv_heads=2, dim_v=32), ("v-dim", "asym-dim", "gqa"))
    yield Row(S(1, 2, 65, 32, "bf16", dim_v=64), ("v-dim", "asym-dim", "low-precision", "tile-edge"))
    yield Row(S(3, 2, 20, 32, "bf16", mask="padding-additive"), ("mask", "low-precision"))
    yield Row(S(1, 4, 20, 32, "fp16", mask="alibi"), ("mask", "low-precision"))
    yield Row(S(2, 4, 17, 32, kv_heads=2, kv_seq=9, mask="fully-masked"), ("mask", "fully-masked", "q-gt-k", "gqa"))
    yield Row(S(1, 2, 100, 32, kv_seq=130, relation="prefix"), ("prefix", "q-lt-k", "tile-edge"))
    yield Row(S(2, 4, 40, 32, "bf16", kv_heads=2, relation="inference"), ("inference", "gqa", "low-precision"))
    yield Row(S(5, 4, 33, 32, "bf16", kv_heads=2, relation="batch-split"), ("batch-split", "gqa", "low-precision"))
    yield Row(S(4, 4, 1, 64, "bf16", kv_heads=1, kv_seq=128, cache="append", lengths=(0, 1, 63, 127)),
              ("kv-cache", "cache-ragged", "mqa", "low-precision"))
    yield Row(S(4, 2, 16, 32, "fp16", kv_seq=160, cache="append", lengths=(0, 47, 1, 144)),
              ("kv-cache", "cache-ragged", "low-precision"))
    yield Row(S(2, 2, 4, 32, causal=False, kv_seq=64, cache="append", lengths=(30, 1)), ("kv-cache", "cache-ragged"))
    yield Row(S(3, 4, 1, 64, "bf16", kv_heads=1, kv_seq=96, lse=True, cache="append", lengths=(1, 0, 95)),
              ("kv-cache", "cache-ragged", "lse", "mqa", "low-precision"))
    yield Row(S(2, 2, 4, 32, window=8, kv_seq=64, cache="append", lengths=(30, 3)), ("kv-cache", "window-edge"))
    yield Row(S(4, 4, 1, 64, "bf16", kv_heads=2, kv_seq=128, cache="paged", page=16, lengths=(0, 15, 16, 127)),
              ("paged", "kv-cache", "cache-ragged", "gqa", "low-precision"))
    yield Row(S(3, 2, 5, 32, kv_seq=64, cache="paged", page=16, lengths=(13, 30, 1)),
              ("paged", "kv-cache", "cache-ragged", "tile-edge"))
    yield Row(S(2, 2, 20, 32, "fp16", kv_seq=96, cache="paged", page=16, lengths=(76, 9)),
              ("paged", "kv-cache", "low-precision"))
    # a GPU's tiles: lengths around 128-wide blocks, the head dims flash kernels specialise on
    for t in (1023, 1025, 2049):
        yield Row(S(2, 4, t, 128, "bf16"), ("tile-edge", "low-precision"), gpu=True)
    for d in (80, 96, 192, 256):
        yield Row(S(2, 4, 1024, d, "bf16"), ("head-dim", "low-precision"), gpu=True)
    yield Row(S(3, 32, 777, 128, "fp16", kv_heads=4, kv_seq=2049), ("gqa", "q-lt-k", "batch-heads", "low-precision"),
              gpu=True)
    yield Row(S(1, 8, 1, 128, "bf16", kv_heads=1, kv_seq=131073), ("long-keys", "mqa", "low-precision"), gpu=True)
    yield Row(S(4200, 16, 64, 64, "bf16", causal=False), ("grid-limit", "low-precision"), gpu=True)
    yield Row(S(2, 8, 4096, 64, "bf16", window=1023), ("window-edge", "low-precision"), gpu=True)
    yield Row(S(2, 4, 1000, 64, "fp16", values="large-logits"), ("large-logits", "low-precision"), gpu=True)
    yield Row(S(2, 4, 1000, 64, "bf16", values="negative-lse"), ("negative-lse", "low-precision"), gpu=True)
    yield Row(S(2, 4, 1025, 64, "bf16", lse=True), ("lse", "low-precision", "tile-edge"), gpu=True)
    yield Row(S(2, 4, 1024, 64, "bf16", kv_seq=700), ("q-gt-k", "low-precision"), gpu=True)
    yield Row(S(2, 4, 1024, 192, "bf16", dim_v=128), ("v-dim", "asym-dim", "low-precision"), gpu=True)
    yield Row(S(4, 8, 1024, 64, "bf16", causal=False, mask="padding"), ("mask", "low-precision"), gpu=True)
    yield Row(S(2, 4, 2048, 64, "bf16", relation="prefix"), ("prefix", "low-precision"), gpu=True)
    yield Row(S(8, 32, 1, 128, "bf16", kv_heads=8, kv_seq=4096, cache="append",
                lengths=(0, 1, 255, 256, 1000, 2047, 4000, 4095)),
              ("kv-cache", "cache-ragged", "gqa", "low-precision"), gpu=True)
    for page in (16, 256):
        yield Row(S(8, 32, 1, 128, "bf16", kv_heads=8, kv_seq=4096, cache="paged", page=page,
                    lengths=(0, 1, page - 1, page, 1000, 2047, 4000, 4095)),
                  ("paged", "kv-cache", "cache-ragged", "gqa", "low-precision"), gpu=True)
    yield Row(S(4, 32, 16, 128, "bf16", kv_heads=8, kv_seq=8192, cache="paged", page=256, lengths=(250, 0, 4000, 8100)),
              ("paged", "kv-cache", "cache-ragged", "gqa", "low-precision"), gpu=True)


# -- the linear families ---------------------------------------------------------------------


def _linear(batch: int, heads: int, seq: int, key_dim: int, value_dim: int | None = None, dtype: str = "fp32", *,
            key_heads: int | None = None, beta_max: float = 1.0, values: str = "normal",
            layout: str = "contiguous", state: bool = False, lengths: tuple[int, ...] | None = None,
            relation: str | None = None) -> LinearCase:
    value_dim = key_dim if value_dim is None else value_dim
    parts = [f"b{batch}", f"h{heads}"] + ([f"hk{key_heads}"] if key_heads else []) + [f"t{seq}", f"d{key_dim}"]
    parts += [f"v{value_dim}"] if value_dim != key_dim else []
    parts += [f"beta{beta_max:g}"] if beta_max != 1.0 else []
    parts += [dtype] + ([] if values == "normal" else [values]) + ([] if layout == "contiguous" else [layout])
    parts += (["state"] if state else []) + ([f"lens{'x'.join(map(str, lengths))}"] if lengths else [])
    parts += [f"rel-{relation}"] if relation else []
    return LinearCase("cat-" + "-".join(parts), batch, heads, seq, key_dim, value_dim, dtype, beta_max=beta_max,
                      gpu=False, key_heads=key_heads, values=values, layout=layout, state=state, lengths=lengths,
                      relation=relation)


def linear_rows() -> Iterator[Row]:
    """The linear families' catalogue (``LinearCase``, [B, T, H, D]); a row a family cannot take
    (a gate regime for linear attention, beta for the others, grouped heads but for GDN) is left
    out of that family's rows (``rows``)."""
    L = _linear
    # smoke: small enough for Triton's interpreter (fla's fused recurrent kernels on a CPU)
    yield Row(L(1, 2, 17, 16), ("tile-edge",), "smoke")
    yield Row(L(3, 3, 5, 16), ("batch-heads",), "smoke")
    yield Row(L(1, 2, 1, 16), ("tiny-seq",), "smoke")
    yield Row(L(1, 1, 33, 16, 32), ("asym-dim",), "smoke")
    yield Row(L(1, 1, 17, 80), ("head-dim",), "smoke")
    yield Row(L(1, 1, 33, 16, dtype="bf16"), ("low-precision",), "smoke")
    yield Row(L(1, 4, 9, 16, key_heads=2), ("gqa",), "smoke")  # 2 key heads: h % kv and h // group differ
    yield Row(L(1, 4, 9, 16, key_heads=1), ("mqa",), "smoke")
    yield Row(L(2, 2, 9, 16, layout="transposed"), ("layout-strided",), "smoke")
    yield Row(L(1100, 60, 2, 4), ("grid-limit",), "smoke")
    yield Row(L(1, 1, 65600, 4), ("long-seq",), "smoke")
    yield Row(L(1, 1, 33, 16, values="gate-near-zero"), ("gate-near-zero",), "smoke")
    yield Row(L(1, 2, 20, 16, values="gate-strong"), ("gate-strong",), "smoke")
    yield Row(L(1, 1, 40, 16, values="decay-underflow"), ("decay-underflow",), "smoke")
    yield Row(L(1, 2, 20, 16, beta_max=2.0, values="beta-bounds"), ("beta-bounds",), "smoke")
    yield Row(L(1, 1, 24, 16, dtype="fp16", values="large-state"), ("large-state", "low-precision"), "smoke")
    # the call axes (a kernel that does not declare one refuses its rows) and the relations between calls
    # (24 batch x heads x tokens each, but one: Triton's interpreter takes about 0.1 s a token there)
    yield Row(L(2, 1, 12, 16, state=True), ("state",), "smoke")
    yield Row(L(1, 1, 24, 16, lengths=(1, 9, 14)), ("varlen",), "smoke")  # ragged, one of one token
    yield Row(L(1, 1, 24, 16, lengths=(9, 1, 14), state=True), ("varlen", "state"), "smoke")
    yield Row(L(1, 1, 138, 16, lengths=(5, 70, 63)), ("varlen", "tile-edge"), "smoke")  # across a chunk of 64
    yield Row(L(2, 1, 12, 16, state=True, relation="split-state"), ("split-state",), "smoke")
    yield Row(L(1, 1, 24, 16, lengths=(1, 9, 14), relation="packed-loop"), ("packed-loop",), "smoke")
    yield Row(L(3, 1, 8, 16, relation="batch-split"), ("batch-split",), "smoke")
    yield Row(L(2, 2, 10, 16, state=True, relation="inference"), ("inference", "state"), "smoke")
    for t in (2, 15, 63, 127, 129, 257, 263):
        yield Row(L(1, 2, t, 16), ("tile-edge",) + (("tiny-seq",) if t <= 2 else ()))
    for k, v in ((16, 64), (64, 16), (32, 48)):
        yield Row(L(1, 2, 70, k, v), ("asym-dim", "tile-edge"))
    for d in (32, 64, 128, 256):
        yield Row(L(1, 1, 33, d), ("head-dim",))
    for dtype in ("bf16", "fp16"):
        yield Row(L(2, 3, 100, 32, dtype=dtype), ("low-precision", "batch-heads"))
    for heads, key_heads in ((4, 2), (8, 2), (8, 1)):
        yield Row(L(2, heads, 33, 16, key_heads=key_heads), ("gqa",) + (("mqa",) if key_heads == 1 else ()))
    yield Row(L(4, 5, 29, 16), ("batch-heads", "tile-edge"))
    yield Row(L(2, 3, 40, 16, layout="sliced"), ("layout-strided", "batch-heads"))
    yield Row(L(33000, 2, 3, 4), ("grid-limit",))
    for values in ("gate-near-zero", "gate-strong", "decay-underflow", "beta-bounds"):
        yield Row(L(2, 2, 129, 16, dtype="bf16", beta_max=2.0 if values == "beta-bounds" else 1.0, values=values),
                  (values, "low-precision", "tile-edge"))
    yield Row(L(1, 2, 300, 16, values="decay-underflow"), ("decay-underflow",))
    yield Row(L(1, 2, 100, 16, dtype="fp16", values="large-state"), ("large-state", "low-precision"))
    yield Row(L(1, 2, 70, 16, state=True), ("state", "tile-edge"))
    yield Row(L(1, 1, 33, 16, dtype="bf16", state=True), ("state", "low-precision"))
    yield Row(L(1, 4, 12, 16, key_heads=2, state=True), ("state", "gqa"))
    yield Row(L(1, 2, 200, 16, lengths=(64, 1, 65, 70)), ("varlen", "tile-edge"))
    yield Row(L(1, 2, 136, 16, lengths=(63, 2, 71), state=True), ("varlen", "state", "tile-edge"))
    yield Row(L(1, 2, 130, 16, state=True, relation="split-state"), ("split-state", "tile-edge"))
    yield Row(L(1, 1, 138, 16, lengths=(5, 70, 63), state=True, relation="packed-loop"), ("packed-loop", "state"))
    yield Row(L(4, 2, 20, 16, dtype="bf16", state=True, relation="batch-split"), ("batch-split", "state",
                                                                                   "low-precision"))
    # a GPU's tiles and sizes: fla's chunks of 64, its head dims up to 256, long sequences
    for t in (4095, 4097):
        yield Row(L(2, 4, t, 128, dtype="bf16"), ("tile-edge", "low-precision"), gpu=True)
    yield Row(L(2, 4, 1000, 256, dtype="bf16"), ("head-dim", "low-precision"), gpu=True)
    yield Row(L(2, 4, 1000, 128, 64, dtype="bf16"), ("asym-dim", "low-precision"), gpu=True)
    yield Row(L(3, 16, 1000, 128, dtype="fp16", key_heads=4), ("gqa", "batch-heads", "low-precision"), gpu=True)
    yield Row(L(1, 2, 70000, 64, dtype="bf16"), ("long-seq", "low-precision"), gpu=True)
    yield Row(L(2200, 32, 64, 64, dtype="bf16"), ("grid-limit", "low-precision"), gpu=True)
    for values in ("gate-strong", "decay-underflow", "beta-bounds"):
        yield Row(L(2, 4, 1000, 128, dtype="bf16", beta_max=2.0 if values == "beta-bounds" else 1.0, values=values),
                  (values, "low-precision"), gpu=True)
    yield Row(L(2, 4, 1000, 128, dtype="bf16", state=True), ("state", "low-precision"), gpu=True)
    yield Row(L(1, 4, 2653, 128, dtype="bf16", lengths=(1, 500, 1023, 64, 1065), state=True),
              ("varlen", "state", "low-precision"), gpu=True)
    yield Row(L(1, 4, 2000, 64, dtype="bf16", state=True, relation="split-state"), ("split-state", "low-precision"),
              gpu=True)


def rows(family: str, tier: str, gpu: bool, source: Iterable[Row]) -> tuple[Row, ...]:
    """The rows of ``family`` in ``tier`` (``smoke``: its smoke rows; ``full``: every row) among
    its catalogue ``source`` (``softmax_rows``, ``linear_rows``: the family's ``Family.rows`` says
    which), with the GPU rows only where ``gpu``. A row whose case the family refuses (a linear
    row with the timed draws' ``values`` of another family) is left out; each case is given the
    family's own id prefix."""
    if tier not in TIERS:
        raise ValueError(f"no catalogue tier {tier!r} (known: {', '.join(TIERS)})")
    if tier == "off":
        return ()
    chosen = [r for r in source
              if (tier == "full" or r.tier == "smoke") and (gpu or not r.gpu) and r.case.refusal(family) is None]
    return tuple(replace(r, case=replace(r.case, gpu=r.gpu, **_inference(r))) for r in chosen)


def _inference(row: Row) -> dict[str, bool]:
    """A softmax smoke row's forward is also called under ``torch.inference_mode()`` (one more call;
    ``families.softmax.relations``)."""
    return {"inference": True} if isinstance(row.case, SoftmaxCase) and row.tier == "smoke" else {}


def classes_of(rows: Iterable[Row]) -> tuple[str, ...]:
    """Every class that ``rows`` (a family's full catalogue, GPU rows included) reach, and ``backward``."""
    found = {c for r in rows for c in r.classes}
    return tuple(c for c in CLASSES if c in found or c == "backward")
