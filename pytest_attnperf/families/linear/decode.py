"""Linear-attention decode: a few recurrent steps from a given state, forward only (docs/decode.md,
"Linear attention: recurrent steps from a state"). Each linear family has a decode family whose
kernels take the state ``[B, H, K, V]`` (fp32, key-first, fla's layout) and return the new one::

    linear_attn_decode: fn(q, k, v, *, scale, initial_state) -> (o, final_state)
    gla_decode:         fn(q, k, v, g, *, scale, initial_state) -> (o, final_state)
    simple_gla_decode:  fn(q, k, v, g, *, scale, initial_state) -> (o, final_state)
    gdn_decode:         fn(q, k, v, g, beta, *, scale, initial_state) -> (o, final_state)

Both the output and the new state are checked against the fp64 recurrence from the same state.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_attnperf.families.checks import (
    Answer,
    Checked,
    CheckFailed,
    call_checked,
    expect_tensor,
    own_copies,
    plain,
    reported_plainly,
)
from pytest_attnperf.families.draws import timed
from pytest_attnperf.families.linear import axes as call_axes
from pytest_attnperf.families.linear import costs as costs_linear
from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear import rule
from pytest_attnperf.families.linear.case import key_heads_refusal
from pytest_attnperf.families.linear.suite import INSTALL_HINT, fla_missing
from pytest_attnperf.families.linear.variants import VARIANTS
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.measure.switches import exact_fp32

__all__ = ["ATTNPERF_CASES", "ATTNPERF_DIRECTIONS", "ATTNPERF_FAMILY", "BASE", "CASES", "CPU", "DIRECTIONS",
           "FAMILIES", "GPU", "LinearDecodeCase", "check_case", "cost", "register", "test_linear_decode"]

FAMILIES = ("linear_attn_decode", "gla_decode", "simple_gla_decode", "gdn_decode")
BASE = {family: family.removesuffix("_decode") for family in FAMILIES}  # the whole-sequence family
DIRECTIONS = ("fwd",)
HEAD_AXIS = 2  # [B, T, H, ...]
STATE_CHECK_DTYPE = "fp32"  # the state is fp32 whatever the inputs' dtype


@dataclass(frozen=True)
class LinearDecodeCase:
    """``seq`` new tokens (1 to a few) of ``batch`` requests, each with a state per (value) head;
    ``key_heads`` (``gdn_decode`` only) the query/key heads when fewer (``linear.case``)."""

    id: str
    batch: int
    heads: int
    seq: int
    key_dim: int
    value_dim: int
    dtype: str
    gpu: bool = True
    key_heads: int | None = None

    @property
    def scale(self) -> float:
        """The attention scale, ``key_dim ** -0.5``."""
        scale: float = self.key_dim**-0.5  # int ** negative int: typeshed says Any
        return scale

    @property
    def n_key_heads(self) -> int:
        """The query/key heads: ``key_heads``, or ``heads`` when not grouped."""
        return self.heads if self.key_heads is None else self.key_heads

    def refusal(self, family: str) -> str | None:
        """Why every kernel of decode family ``family`` refuses this case (None: none does)."""
        return key_heads_refusal(BASE.get(family, family), self.key_heads)

    def whole(self) -> linear.LinearCase:
        """The whole-sequence case of these shapes (its inputs are drawn alike)."""
        return linear.LinearCase(self.id, self.batch, self.heads, self.seq, self.key_dim, self.value_dim, self.dtype,
                                 gpu=self.gpu, key_heads=self.key_heads)


# -- kernels ------------------------------------------------------------------------------


def _fla(module: str, name: str) -> Callable[..., Any]:

    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


def la_fused_recurrent(q: Any, k: Any, v: Any, *, scale: float, initial_state: Any) -> Any:
    """fla fused_recurrent_linear_attn from a state (normalize=False)."""
    fn = _fla("fla.ops.linear_attn", "fused_recurrent_linear_attn")
    return fn(q, k, v, scale=scale, initial_state=initial_state, output_final_state=True, normalize=False)


def gla_fused_recurrent(q: Any, k: Any, v: Any, g: Any, *, scale: float, initial_state: Any) -> Any:
    """fla fused_recurrent_gla from a state (per-key gates as gk)."""
    fn = _fla("fla.ops.gla", "fused_recurrent_gla")
    return fn(q, k, v, gk=g, scale=scale, initial_state=initial_state, output_final_state=True)


def simple_gla_fused_recurrent(q: Any, k: Any, v: Any, g: Any, *, scale: float, initial_state: Any) -> Any:
    """fla fused_recurrent_simple_gla from a state."""
    fn = _fla("fla.ops.simple_gla", "fused_recurrent_simple_gla")
    return fn(q, k, v, g=g, scale=scale, initial_state=initial_state, output_final_state=True)


def gdn_fused_recurrent(q: Any, k: Any, v: Any, g: Any, beta: Any, *, scale: float, initial_state: Any) -> Any:
    """fla fused_recurrent_gated_delta_rule from a state."""
    fn = _fla("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule")
    return fn(q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state, output_final_state=True)


def torch_recurrent(family: str) -> Callable[..., Any]:
    """The family's token recurrence in fp32 as a kernel: ``(o in q's dtype, fp32 state)``."""
    recurrence = linear._recurrence_fn(BASE[family])

    def step(*inputs: Any, scale: float, initial_state: Any) -> Any:
        import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

        out, state = recurrence(*inputs, scale=scale, initial_state=initial_state, final_state=True,
                                compute=torch.float32)
        return out.to(inputs[0].dtype), state

    step.__doc__ = f"The {BASE[family]} recurrence in fp32 (PyTorch, token by token), from the given state."
    return step


def register(registry: KernelRegistry) -> None:
    """Add the decode families' kernels: fla's fused recurrent kernels (CUDA) and the fp32 recurrence."""
    for family, fn in (("linear_attn_decode", la_fused_recurrent), ("gla_decode", gla_fused_recurrent),
                       ("simple_gla_decode", simple_gla_fused_recurrent), ("gdn_decode", gdn_fused_recurrent)):
        registry.add(Kernel(family, "fla-fused-recurrent", fn, backward=False, device_kinds=("cuda",),
                            form="recurrent", unsupported=linear.FLA_REFUSALS, description=(fn.__doc__ or "").strip(),
                            imports=linear.FLA_IMPORTS))
    for family in FAMILIES:
        step = torch_recurrent(family)
        registry.add(Kernel(family, "torch-recurrent", step, backward=False, form="recurrent",
                            description=(step.__doc__ or "").strip()))


# -- running a case -----------------------------------------------------------------------


@dataclass(frozen=True)
class PreparedDecode:
    """A case's inputs (the family's, then the initial state), the fp64 reference and the fp32
    recurrence's answer (out, new state)."""

    inputs: tuple[Any, ...]
    names: tuple[str, ...]
    reference: tuple[Any, Any]
    yardstick: tuple[Any, Any]


_cache: dict[tuple[str, LinearDecodeCase, str, int], PreparedDecode] = {}


def prepare(family: str, case: LinearDecodeCase, device: Any, seed: int = 0) -> PreparedDecode:
    """The case's inputs (seeded by family, case and ``seed``) and both yardsticks, cached for the
    case's kernels."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


    key = (family, case, str(device), seed)
    if key in _cache:
        return _cache[key]
    _cache.clear()
    base = BASE[family]
    tensors = linear._inputs(base, case.whole(), device, False, seed)
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(f"{family}:{case.id}:h0:{seed}".encode()))
    h0 = torch.randn((case.batch, case.heads, case.key_dim, case.value_dim), generator=gen, device=device)
    inputs = (*tensors, h0)
    names = (*("q", "k", "v", "g", "beta")[: len(tensors)], "h0")
    recurrence = linear._recurrence_fn(base)

    def run(compute: Any) -> tuple[Any, Any]:
        with torch.no_grad():
            out, state = recurrence(*tensors, scale=case.scale, initial_state=h0.to(compute), final_state=True,
                                    compute=compute)
        return out, state

    with exact_fp32():  # the fp32 recurrence at full precision, whatever TF32 setting the project made
        prepared = PreparedDecode(inputs, names, run(torch.float64), run(torch.float32))
    _cache[key] = prepared
    return prepared


def check_tensor(family: str, label: str, name: str, value: Any, reference: Any, yardstick: Any, dtype: str) -> float:
    """The output held as a recurrent kernel's output in ``dtype``; the new state (``ht``) as an
    fp32 tensor, with the output's units and factor. Returns the worst error over its bound."""
    units, factor = rule.factors(BASE[family], "out")
    held = dtype if name == "out" else STATE_CHECK_DTYPE
    return rule.assert_checked(label, value, reference, yardstick, held, units, factor, tensor=name)


def _expect(kernel: Kernel, got: Any, out_shape: tuple[int, ...], state: Any, q: Any) -> tuple[Any, Any]:

    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise CheckFailed(f"{kernel.name}: returned {type(got).__name__}, not (output, final_state)")
    out, new = got
    expect_tensor(kernel.name, out, out_shape, q.dtype, q.device)
    expect_tensor(f"{kernel.name} final_state", new, tuple(state.shape), state.dtype, state.device)
    return out, new


def check_case(family: str, kernel: Kernel, case: LinearDecodeCase, direction: str, device: Any,
               seed: int = 0) -> Any:
    """Check ``kernel`` on ``case``: its return value's contract (an output of ``v``'s shape and the
    query's dtype, a new fp32 state of the initial one's shape; no writes into the inputs, the
    state included), then both tensors against the fp64 recurrence; a ``checks.Checked``."""
    if direction != "fwd":
        raise ValueError(f"decode runs forward only, not {direction!r}")
    p = prepare(family, case, device, seed)
    out_shape = tuple(p.inputs[2].shape)

    def run_on(xs: tuple[Any, ...], grad_out: Any, check: bool = False) -> Any:
        got = kernel.fn(*xs[:-1], scale=case.scale, initial_state=xs[-1])
        if isinstance(got, (tuple, list)):
            got = tuple(plain(kernel, x) for x in got)
        return _expect(kernel, got, out_shape, xs[-1], xs[0]) if check else tuple(got)

    inputs = own_copies(p.inputs)
    got = call_checked(kernel, lambda: run_on(inputs, None, True), ", ".join(p.names), inputs, device)
    names = ("out", "ht")
    a = Answer(names, tuple(x.detach() for x in got), p.reference, p.yardstick, lambda: run_on(inputs, None),
               run_on=run_on, inputs=inputs, input_names=p.names)
    ratios = {name: check_tensor(family, f"{kernel.name} {name}", name, value, ref, yard, case.dtype)
              for name, value, ref, yard in zip(a.names, a.got, a.reference, a.yardstick, strict=True)}

    def check(label: str, name: str, value: Any, reference: Any, yardstick: Any) -> float:
        return check_tensor(family, label, name, value, reference, yardstick, case.dtype)

    return Checked(timed(a, kernel.name, check, f"{family}:{case.id}:{direction}:{seed}", HEAD_AXIS,
                         head_axes=call_axes.STATE_HEAD_AXES), ratios)


def cost(family: str, case: LinearDecodeCase) -> Any:
    """The recurrent form's cost over the new tokens, reading the initial state and writing the new one."""
    model = costs_linear.MODELS[BASE[family]]
    grouped: dict[str, Any] = {"key_heads": case.n_key_heads} if VARIANTS[BASE[family]].grouped_values else {}
    return model(batch=case.batch, heads=case.heads, seq=case.seq, key_dim=case.key_dim, value_dim=case.value_dim,
                 dtype=case.dtype, form="recurrent", initial_state=True, final_state=True, **grouped)


# -- the suite ----------------------------------------------------------------------------

# Qwen3-Next-class heads (16 of 128 x 128): one new token at B=1 and 32, four at B=32
GPU = tuple(LinearDecodeCase(f"b{b}-h16-t{t}-d128-bf16", b, 16, t, 128, 128, "bf16")
            for b, t in ((1, 1), (32, 1), (32, 4)))
CPU = (
    LinearDecodeCase("cpu-b2-h2-t1-d16-fp32", 2, 2, 1, 16, 32, "fp32", gpu=False),
    LinearDecodeCase("cpu-b3-h4-t4-d32-bf16", 3, 4, 4, 32, 32, "bf16", gpu=False),
    # grouped values (GDN only): 4 value heads over 2 query/key heads
    LinearDecodeCase("cpu-b2-h4-hk2-t2-d16-fp32", 2, 4, 2, 16, 16, "fp32", gpu=False, key_heads=2),
)
CASES = GPU + CPU

ATTNPERF_FAMILY, ATTNPERF_CASES, ATTNPERF_DIRECTIONS = FAMILIES, CASES, DIRECTIONS  # what the plugin parametrizes


def test_linear_decode(
    case: LinearDecodeCase, kernel: Kernel, direction: str, attnperf_device: Any, attnperf_seed: int, attnperf: Any,
    request: pytest.FixtureRequest,
) -> None:
    """Output and new state against the fp64 recurrence from the same state, then device time."""
    if kernel.fn.__module__ == __name__ and kernel.name.startswith("fla-") and (why := fla_missing()):
        pytest.skip(f"{kernel.name} needs flash-linear-attention ({why}): {INSTALL_HINT}")
    with reported_plainly(attnperf_seed):
        checked = check_case(kernel.family, kernel, case, direction, attnperf_device, seed=attnperf_seed)
    for name, ratio in checked.properties():
        request.node.user_properties.append((name, ratio))
    attnperf.measure(checked.call, cost=cost(kernel.family, case), dtype=case.dtype)
