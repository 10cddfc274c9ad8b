"""The fp64 linear-attention references and their cost models, on the CPU.

* The references agree with flash-linear-attention's own pure-PyTorch references
  (``fla.ops.*.naive``), so they share fla's conventions (scale, gate order, state orientation).
* Coincidences between the variants hold (GLA with zero gates is linear attention, ...).
* Every reference is differentiable (``gradcheck``), so backward checks can use it.
* The FLOP models equal a brute-force count of the multiply-adds of chunkwise and recurrent
  algorithms written out here, which themselves reproduce the references' outputs.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import pytest
import torch
import torch.nn.functional as F

from pytest_attnperf.costs import Cost, softmax_attention
from pytest_attnperf.families.linear import costs as costs_linear
from pytest_attnperf.families.linear import reference as ref

B, T, H, K, V = 2, 33, 2, 16, 32  # T=33 is a multiple of no chunk size
SCALE = K**-0.5  # fla's default scale, the only one fla's naive_recurrent_gla knows

# fla's naive references compute in fp32 whatever the inputs' dtype (they call ``.float()``),
# so they cannot be compared at fp64 precision. fp32 rounds at u = 6e-8; each output here sums
# at most T*K = 528 products, and measured errors against our fp64 are 1e-7 (recurrent) to 7e-7
# (chunked) of the output's largest value. 1e-5 leaves 15x headroom, while any convention slip
# (scale, order of decay and write, beta, normalisation) moves outputs by 1e-2 or more:
# test_fp32_tolerance_catches_a_tiny_slip shows that a 1e-4 error in scale is caught.
FP32_TOL = 1e-5
# fla's naive_chunk_linear_attn keeps the inputs' dtype, so it is compared at fp64 precision.
FP64_TOL = 1e-10


@cache
def fla_naive(family: str) -> ModuleType:
    """``fla/ops/<family>/naive.py``, loaded by path.

    ``import fla.ops...`` runs ``fla/__init__``, which imports every Triton module of fla (about
    12 s on this CPU); the naive files import only torch, einops and torch.nn.functional.
    """
    spec = importlib.util.find_spec("fla")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / family / "naive.py"
    module_spec = importlib.util.spec_from_file_location(f"_fla_naive_{family}", path)
    assert module_spec is not None, path
    assert module_spec.loader is not None, path
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference, relative to the largest magnitude of ``expected``."""
    expected = expected.double()
    return float((actual.double() - expected).abs().max() / expected.abs().max())


@dataclass(frozen=True)
class Inputs:
    """One set of fp64 inputs in fla's [B, T, H, ...] layout."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    gk: torch.Tensor  # per-key-channel log gate [B, T, H, K]
    g: torch.Tensor  # per-head log gate [B, T, H]
    beta: torch.Tensor  # [B, T, H] in (0, 1)
    h0: torch.Tensor  # initial state [B, H, K, V]

    @property
    def qn(self) -> torch.Tensor:
        return F.normalize(self.q, dim=-1)

    @property
    def kn(self) -> torch.Tensor:
        return F.normalize(self.k, dim=-1)


def make_inputs(seq: int = T, seed: int = 0, *, batch: int = B, heads: int = H, key_dim: int = K,
                value_dim: int = V) -> Inputs:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    return Inputs(
        q=randn(batch, seq, heads, key_dim),
        k=randn(batch, seq, heads, key_dim),
        v=randn(batch, seq, heads, value_dim),
        gk=F.logsigmoid(randn(batch, seq, heads, key_dim)),
        g=F.logsigmoid(randn(batch, seq, heads)),
        beta=torch.rand(batch, seq, heads, generator=gen, dtype=torch.float64),
        h0=randn(batch, heads, key_dim, value_dim),
    )


@pytest.fixture(scope="module")
def x() -> Inputs:
    """B=2, T=33, H=2, K=16, V=32 fp64 inputs."""
    return make_inputs()


# --- agreement with fla's naive references ------------------------------------------------

Pair = tuple[torch.Tensor, torch.Tensor | None]


@dataclass(frozen=True)
class FlaCase:
    """One fla naive function and our reference on the same inputs: (output, final state or None)."""

    id: str
    fla: Callable[[Inputs], Pair]
    ours: Callable[[Inputs], Pair]


def _la_naive_recurrent(x: Inputs, normalize: bool) -> Pair:
    q, k = (x.q.abs(), x.k.abs()) if normalize else (x.q, x.k)  # positive features keep q.z > 0
    o, state = fla_naive("linear_attn").naive_recurrent_linear_attn(
        q, k, x.v, scale=SCALE, output_final_state=True, normalize=normalize
    )
    return o, (None if normalize else state)


def _la_ours(x: Inputs, normalize: bool) -> Pair:
    q, k = (x.q.abs(), x.k.abs()) if normalize else (x.q, x.k)
    o, state = ref.linear_attention(q, k, x.v, scale=SCALE, normalize=normalize, final_state=True)
    return o, (None if normalize else state)


FLA_CASES = (
    FlaCase("linear_attn-naive_recurrent", lambda x: _la_naive_recurrent(x, False), lambda x: _la_ours(x, False)),
    FlaCase(
        "linear_attn-naive_recurrent-normalize", lambda x: _la_naive_recurrent(x, True), lambda x: _la_ours(x, True)
    ),
    FlaCase(
        "gla-naive_recurrent-h0",
        lambda x: fla_naive("gla").naive_recurrent_gla(
            x.q, x.k, x.v, x.gk, initial_state=x.h0, output_final_state=True
        ),
        lambda x: ref.gla(x.q, x.k, x.v, x.gk, scale=SCALE, initial_state=x.h0, final_state=True),
    ),
    FlaCase(
        "simple_gla-naive_recurrent-h0",
        lambda x: fla_naive("simple_gla").naive_recurrent_simple_gla(
            x.q, x.k, x.v, x.g, scale=SCALE, initial_state=x.h0, output_final_state=True
        ),
        lambda x: ref.simple_gla(x.q, x.k, x.v, x.g, scale=SCALE, initial_state=x.h0, final_state=True),
    ),
    FlaCase(
        "simple_gla-naive_chunk-c16-h0",
        lambda x: fla_naive("simple_gla").naive_chunk_simple_gla(
            x.q, x.k, x.v, x.g, initial_state=x.h0.float(), output_final_state=True, chunk_size=16, scale=SCALE
        ),
        lambda x: ref.simple_gla(x.q, x.k, x.v, x.g, scale=SCALE, initial_state=x.h0, final_state=True),
    ),
    FlaCase(
        "simple_gla-naive_chunk-c64",
        lambda x: fla_naive("simple_gla").naive_chunk_simple_gla(
            x.q, x.k, x.v, x.g, output_final_state=True, scale=SCALE
        ),
        lambda x: ref.simple_gla(x.q, x.k, x.v, x.g, scale=SCALE, final_state=True),
    ),
    FlaCase(
        "simple_gla-naive_parallel",
        lambda x: (fla_naive("simple_gla").naive_parallel_simple_gla(x.q, x.k, x.v, x.g, scale=SCALE)[0], None),
        lambda x: (ref.simple_gla(x.q, x.k, x.v, x.g, scale=SCALE), None),
    ),
    FlaCase(
        "gated_delta_rule-naive_recurrent-h0",
        # note fla's argument order here: beta before g (its chunk functions take g, beta)
        lambda x: fla_naive("gated_delta_rule").naive_recurrent_gated_delta_rule(
            x.qn, x.kn, x.v, x.beta, x.g, scale=SCALE, initial_state=x.h0, output_final_state=True
        ),
        lambda x: ref.gated_delta_rule(
            x.qn, x.kn, x.v, x.g, x.beta, scale=SCALE, initial_state=x.h0, final_state=True
        ),
    ),
    FlaCase(
        "gated_delta_rule-naive_recurrent-beta0to2",
        lambda x: fla_naive("gated_delta_rule").naive_recurrent_gated_delta_rule(
            x.qn, x.kn, x.v, 2 * x.beta, x.g, scale=SCALE, output_final_state=True
        ),
        lambda x: ref.gated_delta_rule(x.qn, x.kn, x.v, x.g, 2 * x.beta, scale=SCALE, final_state=True),
    ),
    FlaCase(
        "gated_delta_rule-naive_chunk-c16-h0",
        lambda x: fla_naive("gated_delta_rule").naive_chunk_gated_delta_rule(
            x.qn, x.kn, x.v, x.g, x.beta, chunk_size=16, scale=SCALE, initial_state=x.h0, output_final_state=True
        ),
        lambda x: ref.gated_delta_rule(
            x.qn, x.kn, x.v, x.g, x.beta, scale=SCALE, initial_state=x.h0, final_state=True
        ),
    ),
    FlaCase(
        "gated_delta_rule-naive_chunk-c64",
        lambda x: fla_naive("gated_delta_rule").naive_chunk_gated_delta_rule(
            x.qn, x.kn, x.v, x.g, x.beta, scale=SCALE, output_final_state=True
        ),
        lambda x: ref.gated_delta_rule(x.qn, x.kn, x.v, x.g, x.beta, scale=SCALE, final_state=True),
    ),
)


@pytest.mark.parametrize("case", FLA_CASES, ids=lambda c: c.id)
def test_reference_agrees_with_fla_naive(case: FlaCase, x: Inputs) -> None:
    fla_o, fla_state = case.fla(x)
    our_o, our_state = case.ours(x)
    assert our_o.dtype == torch.float64
    assert our_o.shape == (B, T, H, V) == fla_o.shape
    err = rel_err(fla_o, our_o)
    assert err < FP32_TOL, f"output differs from fla's by {err:.1e} of its largest value (tolerance {FP32_TOL:.0e})"
    if fla_state is not None:
        assert our_state is not None
        assert our_state.shape == (B, H, K, V) == fla_state.shape
        err = rel_err(fla_state, our_state)
        assert err < FP32_TOL, f"final state differs from fla's by {err:.1e} (tolerance {FP32_TOL:.0e})"


@pytest.mark.parametrize("normalize", [False, True], ids=["plain", "normalize"])
def test_linear_attention_matches_fla_naive_chunk_in_fp64(normalize: bool) -> None:
    """naive_chunk_linear_attn keeps fp64, but needs whole chunks of its fixed 64 tokens."""
    x = make_inputs(seq=128)
    q, k = (x.q.abs(), x.k.abs()) if normalize else (x.q, x.k)
    fla_o = fla_naive("linear_attn").naive_chunk_linear_attn(q, k, x.v, scale=SCALE, normalize=normalize)
    assert fla_o.dtype == torch.float64
    err = rel_err(fla_o, ref.linear_attention(q, k, x.v, scale=SCALE, normalize=normalize))
    assert err < FP64_TOL, f"output differs from fla's by {err:.1e} (tolerance {FP64_TOL:.0e})"


def test_fp32_tolerance_catches_a_tiny_slip(x: Inputs) -> None:
    fla_o, _ = fla_naive("gated_delta_rule").naive_recurrent_gated_delta_rule(x.qn, x.kn, x.v, x.beta, x.g, scale=SCALE)
    slipped = ref.gated_delta_rule(x.qn, x.kn, x.v, x.g, x.beta, scale=SCALE * (1 + 1e-4))
    assert rel_err(fla_o, slipped) > FP32_TOL


def test_gated_delta_rule_l2norm_option_matches_normalised_inputs(x: Inputs) -> None:
    inside = ref.gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, scale=SCALE, l2norm_qk=True)
    outside = ref.gated_delta_rule(ref.l2norm(x.q), ref.l2norm(x.k), x.v, x.g, x.beta, scale=SCALE)
    torch.testing.assert_close(inside, outside, rtol=0, atol=0)
    assert rel_err(ref.l2norm(x.k), x.kn) < 1e-6  # only fla's eps=1e-6 in the norm differs


# --- coincidences between the variants ----------------------------------------------------

def assert_tight(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to fp64 rounding: the two sides compute the same sums in a different order."""
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)


def test_gla_with_zero_gates_is_linear_attention(x: Inputs) -> None:
    zeros = torch.zeros_like(x.gk)
    o, state = ref.gla(x.q, x.k, x.v, zeros, scale=SCALE, initial_state=x.h0, final_state=True)
    o_la, state_la = ref.linear_attention(x.q, x.k, x.v, scale=SCALE, initial_state=x.h0, final_state=True)
    assert_tight(o, o_la)
    assert_tight(state, state_la)


def test_simple_gla_is_gla_with_the_gate_broadcast_over_keys(x: Inputs) -> None:
    o = ref.simple_gla(x.q, x.k, x.v, x.g, scale=SCALE, initial_state=x.h0)
    o_gla = ref.gla(x.q, x.k, x.v, x.g[..., None].expand(B, T, H, K), scale=SCALE, initial_state=x.h0)
    assert_tight(o, o_gla)


def test_gated_delta_rule_with_beta_zero_only_decays_the_state(x: Inputs) -> None:
    no_write = torch.zeros_like(x.beta)
    o, state = ref.gated_delta_rule(x.qn, x.kn, x.v, x.g, no_write, scale=SCALE, final_state=True)
    assert not o.any()
    assert not state.any()  # from a zero state nothing is ever written
    o, state = ref.gated_delta_rule(x.qn, x.kn, x.v, x.g, no_write, scale=SCALE, initial_state=x.h0, final_state=True)
    decay = torch.exp(torch.cumsum(x.g, dim=1))  # [B, T, H]: exp(g_1 + ... + g_t)
    expected = SCALE * decay[..., None] * torch.einsum("bthk,bhkv->bthv", x.qn, x.h0)
    assert_tight(o, expected)
    assert_tight(state, decay[:, -1, :, None, None] * x.h0)


def test_gated_delta_rule_with_no_decay_and_no_write_gives_zeros(x: Inputs) -> None:
    o = ref.gated_delta_rule(x.qn, x.kn, x.v, torch.zeros_like(x.g), torch.zeros_like(x.beta), scale=SCALE)
    assert o.shape == (B, T, H, V)
    assert not o.any()


def test_delta_rule_overwrites_where_linear_attention_accumulates() -> None:
    """Two writes under one unit key with beta=1: the delta rule keeps the second value only."""
    key = F.normalize(torch.randn(1, 1, 1, K, dtype=torch.float64), dim=-1).expand(1, 2, 1, K)
    values = torch.randn(1, 2, 1, V, dtype=torch.float64)
    ones, zeros = torch.ones(1, 2, 1, dtype=torch.float64), torch.zeros(1, 2, 1, dtype=torch.float64)
    o_delta = ref.gated_delta_rule(key, key, values, zeros, ones, scale=1.0)
    o_linear = ref.linear_attention(key, key, values, scale=1.0)
    assert_tight(o_delta[:, 1], values[:, 1])
    assert_tight(o_linear[:, 1], values[:, 0] + values[:, 1])


def test_non_causal_linear_attention_reads_the_last_state(x: Inputs) -> None:
    for normalize in (False, True):
        q, k = x.q.abs(), x.k.abs()
        causal = ref.linear_attention(q, k, x.v, scale=SCALE, normalize=normalize)
        full = ref.linear_attention(q, k, x.v, scale=SCALE, normalize=normalize, causal=False)
        assert_tight(full[:, -1], causal[:, -1])
        expected = SCALE * torch.einsum("bthk,bshk,bshv->bthv", q, k, x.v)
        if normalize:
            expected = expected / (SCALE * torch.einsum("bthk,bshk->bth", q, k)[..., None] + ref.NORMALIZE_EPS)
        assert_tight(full, expected)


def test_wrong_gate_shapes_are_refused(x: Inputs) -> None:
    with pytest.raises(ValueError, match=r"g must have the keys' shape"):
        ref.gla(x.q, x.k, x.v, x.g, scale=SCALE)
    with pytest.raises(ValueError, match=r"beta must have shape \[B, T, H\]"):
        ref.gated_delta_rule(x.q, x.k, x.v, x.g, x.beta[:, :-1], scale=SCALE)
    with pytest.raises(ValueError, match="initial_state has shape"):
        ref.linear_attention(x.q, x.k, x.v, scale=SCALE, initial_state=x.h0[0])


# --- chunked forms --------------------------------------------------------------------------

CHUNK_TOL = 1e-10  # fp64 both ways: measured agreement is within 2e-15 of the largest value


@dataclass(frozen=True)
class ChunkCase:
    """A chunked form and the token recurrence it must equal, on the same inputs."""

    id: str
    chunked: Callable[..., Any]
    token: Callable[..., Any]
    inputs: Callable[[Inputs], tuple[torch.Tensor, ...]]


CHUNK_CASES = (
    ChunkCase("linear_attention", ref.chunk_linear_attention, ref.linear_attention, lambda x: (x.q, x.k, x.v)),
    ChunkCase("gla", ref.chunk_gla, ref.gla, lambda x: (x.q, x.k, x.v, x.gk)),
    ChunkCase("simple_gla", ref.chunk_simple_gla, ref.simple_gla, lambda x: (x.q, x.k, x.v, x.g)),
    ChunkCase("gated_delta_rule", ref.chunk_gated_delta_rule, ref.gated_delta_rule,
              lambda x: (x.qn, x.kn, x.v, x.g, x.beta)),
    ChunkCase("gated_delta_rule-beta0to2", ref.chunk_gated_delta_rule, ref.gated_delta_rule,
              lambda x: (x.qn, x.kn, x.v, x.g, 2 * x.beta)),
)


@pytest.mark.parametrize("chunk", [1, 8, 16, 64])  # 33 tokens: a partial last chunk, or one chunk
@pytest.mark.parametrize("case", CHUNK_CASES, ids=lambda c: c.id)
def test_chunked_form_equals_the_token_recurrence(case: ChunkCase, chunk: int, x: Inputs) -> None:
    args = case.inputs(x)
    o, state = case.chunked(*args, scale=SCALE, chunk=chunk, initial_state=x.h0, final_state=True)
    o_ref, state_ref = case.token(*args, scale=SCALE, initial_state=x.h0, final_state=True)
    assert o.dtype == torch.float64
    assert o.shape == o_ref.shape == (B, T, H, V)
    assert rel_err(o, o_ref) < CHUNK_TOL
    assert rel_err(state, state_ref) < CHUNK_TOL


@pytest.mark.parametrize("case", CHUNK_CASES, ids=lambda c: c.id)
def test_chunked_gradients_equal_the_token_recurrences(case: ChunkCase) -> None:
    x = make_inputs(seq=21, seed=3)
    leaves = [t.detach().clone().requires_grad_(True) for t in case.inputs(x)]
    grad_out = torch.randn(B, 21, H, V, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    chunked = torch.autograd.grad(case.chunked(*leaves, scale=SCALE, chunk=8), leaves, grad_out)
    token = torch.autograd.grad(case.token(*leaves, scale=SCALE), leaves, grad_out)
    for got, want in zip(chunked, token, strict=True):
        assert rel_err(got, want) < CHUNK_TOL


@pytest.mark.parametrize("case", CHUNK_CASES[:3], ids=lambda c: c.id)
def test_recurrent_gradients_equal_autograd_through_the_token_recurrence(case: ChunkCase) -> None:
    """A recurrent backward written out (the gate's gradient from the reverse cumulative sum of
    ``q dq - k dk``, as fla's kernels take it) equals autograd through the definition in fp64."""
    x = make_inputs(seq=21, seed=5)
    leaves = [t.detach().clone().requires_grad_(True) for t in case.inputs(x)]
    grad_out = torch.randn(B, 21, H, V, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    want = torch.autograd.grad(case.token(*leaves, scale=SCALE), leaves, grad_out)
    gate = leaves[3].detach() if len(leaves) > 3 else None
    q, k, v = (t.detach() for t in leaves[:3])
    got = ref.recurrent_gradients(q, k, v, gate, grad_out, scale=SCALE)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert g.dtype == torch.float64
        assert rel_err(g, w) < CHUNK_TOL


def test_recurrences_run_in_the_dtype_asked(x: Inputs) -> None:
    """``compute=float32``: the same recurrence, state and output in float32, within float32's
    rounding of the fp64 answer; a wrong gate shape is refused by the gradients too."""
    o32 = ref.gla(x.q, x.k, x.v, x.gk, scale=SCALE, compute=torch.float32)
    assert o32.dtype == torch.float32
    assert 0 < rel_err(o32, ref.gla(x.q, x.k, x.v, x.gk, scale=SCALE)) < 1e-5
    grads = ref.recurrent_gradients(x.q, x.k, x.v, x.g, x.v, scale=SCALE, compute=torch.float32)
    assert [g.dtype for g in grads] == [torch.float32] * 4
    assert grads[3].shape == x.g.shape
    exact = ref.recurrent_gradients(x.q, x.k, x.v, x.g, x.v, scale=SCALE)
    assert all(0 < rel_err(g, e) < 1e-5 for g, e in zip(grads, exact, strict=True))
    with pytest.raises(ValueError, match="g must have the keys' shape"):
        ref.recurrent_gradients(x.q, x.k, x.v, x.gk[..., :3], x.v, scale=SCALE)


def test_chunked_form_at_a_lower_precision_rounds_where_a_kernel_stores(x: Inputs) -> None:
    """``store`` rounds the intermediates: the error grows to bf16's scale, and no further."""
    q, k, v = (t.to(torch.bfloat16) for t in (x.q, x.k, x.v))
    # without final_state the output alone (chunk_linear_attention's return type does not say so)
    exact = cast(torch.Tensor, ref.chunk_linear_attention(q, k, v, scale=SCALE))
    plain = cast(torch.Tensor, ref.chunk_linear_attention(q, k, v, scale=SCALE, compute=torch.float32))
    rounded = cast(torch.Tensor, ref.chunk_linear_attention(q, k, v, scale=SCALE, compute=torch.float32,
                                                            store=torch.bfloat16))
    assert plain.dtype == rounded.dtype == torch.float32
    assert rel_err(plain, exact) < 1e-6
    assert 2.0**-12 < rel_err(rounded, exact) < 4 * 2.0**-8


def test_chunked_gla_refuses_a_decay_its_dtype_cannot_hold(x: Inputs) -> None:
    with pytest.raises(ValueError, match="decays by exp.*use a smaller chunk"):
        ref.chunk_gla(x.q, x.k, x.v, x.gk - 10.0, scale=SCALE, compute=torch.float32)
    ref.chunk_gla(x.q, x.k, x.v, x.gk - 10.0, scale=SCALE, compute=torch.float32, chunk=4)


# --- gradients ------------------------------------------------------------------------------


@dataclass(frozen=True)
class GradCase:
    id: str
    fn: Callable[..., torch.Tensor]
    inputs: Callable[[Inputs], tuple[torch.Tensor, ...]]


GRAD_CASES = (
    GradCase("linear_attention", lambda q, k, v, h0: ref.linear_attention(q, k, v, scale=0.7, initial_state=h0),
             lambda x: (x.q, x.k, x.v, x.h0)),
    GradCase("linear_attention-normalize", lambda q, k, v: ref.linear_attention(q, k, v, scale=0.7, normalize=True),
             lambda x: (x.q.abs() + 0.5, x.k.abs() + 0.5, x.v)),
    GradCase("gla", lambda q, k, v, g, h0: ref.gla(q, k, v, g, scale=0.7, initial_state=h0),
             lambda x: (x.q, x.k, x.v, x.gk, x.h0)),
    GradCase("simple_gla", lambda q, k, v, g, h0: ref.simple_gla(q, k, v, g, scale=0.7, initial_state=h0),
             lambda x: (x.q, x.k, x.v, x.g, x.h0)),
    GradCase(
        "gated_delta_rule",
        lambda q, k, v, g, beta, h0: ref.gated_delta_rule(q, k, v, g, beta, scale=0.7, initial_state=h0),
        lambda x: (x.qn, x.kn, x.v, x.g, x.beta, x.h0),
    ),
    GradCase(
        "gated_delta_rule-l2norm",
        lambda q, k, v, g, beta: ref.gated_delta_rule(q, k, v, g, beta, scale=0.7, l2norm_qk=True),
        lambda x: (x.q, x.k, x.v, x.g, x.beta),
    ),
)


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_reference_gradients(case: GradCase) -> None:
    tiny = make_inputs(seq=5, seed=1, batch=1, heads=2, key_dim=3, value_dim=3)
    args = tuple(t.detach().clone().requires_grad_(True) for t in case.inputs(tiny))
    assert torch.autograd.gradcheck(case.fn, args, eps=1e-6, atol=1e-7, rtol=1e-5)


# --- cost models against brute-force counts ---------------------------------------------------


class Counter:
    """Multiply-adds of the products a brute-force algorithm performs, counted as it runs."""

    def __init__(self) -> None:
        self.madds = 0

    def mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """[m, n] @ [n, p]: m*n*p multiply-adds."""
        self.madds += a.shape[0] * a.shape[1] * b.shape[1]
        return a @ b

    def unit_lower_inverse(self, a: torch.Tensor) -> torch.Tensor:
        """(I + a)^-1 for strictly lower-triangular a, by forward substitution, one madd at a time."""
        n = a.shape[0]
        inv = torch.eye(n, dtype=a.dtype)
        for j in range(n):
            for i in range(j + 1, n):
                acc = -a[i, j]  # times inv[j, j] = 1: no multiply
                for m in range(j + 1, i):
                    acc = acc - a[i, m] * inv[m, j]
                    self.madds += 1
                inv[i, j] = acc
        return inv


def _one_head(x: Inputs) -> dict[str, torch.Tensor]:
    return {"q": x.q[0, :, 0], "k": x.k[0, :, 0], "v": x.v[0, :, 0], "gk": x.gk[0, :, 0], "g": x.g[0, :, 0],
            "beta": x.beta[0, :, 0]}


def linear_chunk(t: dict[str, torch.Tensor], chunk: int, count: Counter, gated: bool) -> torch.Tensor:
    """Chunkwise (gated) linear attention for one head, [T, K] tensors; gates per key channel."""
    seq, key_dim = t["q"].shape
    state = torch.zeros(key_dim, t["v"].shape[1], dtype=torch.float64)
    outputs = []
    for start in range(0, seq, chunk):
        q, k, v = (t[n][start:start + chunk] for n in ("q", "k", "v"))
        c = q.shape[0]
        gamma = t["gk"][start:start + chunk].cumsum(0) if gated else torch.zeros(c, key_dim, dtype=torch.float64)
        q_decayed, k_undecayed = q * SCALE * gamma.exp(), k * (-gamma).exp()
        scores = count.mm(q_decayed, k_undecayed.T).tril()
        outputs.append(count.mm(q_decayed, state) + count.mm(scores, v))
        k_to_end = k * (gamma[-1] - gamma).exp()
        state = gamma[-1].exp()[:, None] * state + count.mm(k_to_end.T, v)
    return torch.cat(outputs)


def delta_chunk(t: dict[str, torch.Tensor], chunk: int, count: Counter) -> torch.Tensor:
    """Chunkwise gated delta rule in the WY form for one head (derivation in costs_linear)."""
    seq, key_dim = t["q"].shape
    state = torch.zeros(key_dim, t["v"].shape[1], dtype=torch.float64)
    outputs = []
    for start in range(0, seq, chunk):
        q, k, v, g, beta = (t[n][start:start + chunk] for n in ("q", "k", "v", "g", "beta"))
        gamma = g.cumsum(0)
        decay = (gamma[:, None] - gamma[None, :]).exp().tril()  # exp(gamma_i - gamma_j), j <= i
        a = (beta[:, None] * decay * count.mm(k, k.T)).tril(-1)
        inverse = count.unit_lower_inverse(a)
        w = count.mm(inverse, (beta * gamma.exp())[:, None] * k)
        u = count.mm(inverse, beta[:, None] * v) - count.mm(w, state)
        scores = count.mm(q * SCALE, k.T) * decay
        outputs.append(count.mm(q * SCALE * gamma.exp()[:, None], state) + count.mm(scores, u))
        state = gamma[-1].exp() * state + count.mm((k * (gamma[-1] - gamma).exp()[:, None]).T, u)
    return torch.cat(outputs)


def linear_recurrent(t: dict[str, torch.Tensor], count: Counter, delta: bool) -> torch.Tensor:
    """Token-by-token linear attention (or, with ``delta``, the gated delta rule) for one head."""
    state = torch.zeros(t["q"].shape[1], t["v"].shape[1], dtype=torch.float64)
    outputs = []
    for i in range(t["q"].shape[0]):
        q, k, v = t["q"][i:i + 1], t["k"][i:i + 1], t["v"][i:i + 1]  # [1, K], [1, K], [1, V]
        if delta:
            state = t["g"][i].exp() * state
            v = t["beta"][i] * (v - count.mm(k, state))
        state = state + count.mm(k.T, v)
        outputs.append(count.mm(q * SCALE, state))
    return torch.cat(outputs)


BRUTE = {"seq": 13, "chunk": 5, "key_dim": 2, "value_dim": 3}  # chunks of 5, 5 and 3 tokens


def _model(fn: Callable[..., Any], form: str) -> float:
    cost = fn(batch=1, heads=1, seq=BRUTE["seq"], key_dim=BRUTE["key_dim"], value_dim=BRUTE["value_dim"],
              dtype="fp32", form=form, chunk=BRUTE["chunk"])
    return float(cost.flops)


@pytest.fixture(scope="module")
def one_head() -> tuple[Inputs, dict[str, torch.Tensor]]:
    """A single (batch, head) of 13 tokens, K=2, V=3, with normalised keys and queries."""
    x = make_inputs(seq=BRUTE["seq"], seed=2, batch=1, heads=1, key_dim=BRUTE["key_dim"], value_dim=BRUTE["value_dim"])
    x = Inputs(x.qn, x.kn, x.v, x.gk, x.g, x.beta, x.h0)
    return x, _one_head(x)


@pytest.mark.parametrize("variant", ["linear_attention", "gla", "simple_gla"])
def test_linear_chunk_flops_equal_a_brute_force_count(
    variant: str, one_head: tuple[Inputs, dict[str, torch.Tensor]]
) -> None:
    x, t = one_head
    if variant == "simple_gla":
        t = {**t, "gk": t["g"][:, None].expand_as(t["k"])}
    count = Counter()
    o = linear_chunk(t, BRUTE["chunk"], count, gated=variant != "linear_attention")
    expected = {
        "linear_attention": lambda: ref.linear_attention(x.q, x.k, x.v, scale=SCALE),
        "gla": lambda: ref.gla(x.q, x.k, x.v, x.gk, scale=SCALE),
        "simple_gla": lambda: ref.simple_gla(x.q, x.k, x.v, x.g, scale=SCALE),
    }[variant]()
    assert_tight(o, expected[0, :, 0])  # the counted algorithm is the real one
    assert _model(getattr(costs_linear, variant), "chunk") == 2 * count.madds


def test_delta_rule_chunk_flops_equal_a_brute_force_count(one_head: tuple[Inputs, dict[str, torch.Tensor]]) -> None:
    x, t = one_head
    count = Counter()
    o = delta_chunk(t, BRUTE["chunk"], count)
    assert_tight(o, ref.gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, scale=SCALE)[0, :, 0])
    assert _model(costs_linear.gated_delta_rule, "chunk") == 2 * count.madds


@pytest.mark.parametrize("delta", [False, True], ids=["linear_attention", "gated_delta_rule"])
def test_recurrent_flops_equal_a_brute_force_count(
    delta: bool, one_head: tuple[Inputs, dict[str, torch.Tensor]]
) -> None:
    x, t = one_head
    count = Counter()
    o = linear_recurrent(t, count, delta)
    model: Callable[..., Cost]
    if delta:
        expected, model = ref.gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, scale=SCALE), costs_linear.gated_delta_rule
    else:
        expected, model = ref.linear_attention(x.q, x.k, x.v, scale=SCALE), costs_linear.linear_attention
    assert_tight(o, expected[0, :, 0])
    assert _model(model, "recurrent") == 2 * count.madds


def test_triangular_inverse_count_matches_forward_substitution() -> None:
    for n in range(8):
        count = Counter()
        a = torch.randn(n, n, dtype=torch.float64).tril(-1)
        inverse = count.unit_lower_inverse(a)
        torch.testing.assert_close(inverse @ (torch.eye(n, dtype=torch.float64) + a), torch.eye(n, dtype=torch.float64))
        assert costs_linear.triangular_inverse_flops(n) == 2 * count.madds


def test_chunk_flops_closed_forms() -> None:
    seq, chunk, kd, vd = 4096, 64, 128, 256
    assert costs_linear.linear_attention_flops_per_head(seq, kd, vd, "chunk", chunk) == (
        2 * (kd + vd) * seq * chunk + 4 * kd * vd * seq
    )
    assert costs_linear.delta_rule_flops_per_head(seq, kd, vd, "chunk", chunk) == (
        (6 * kd + 4 * vd) * seq * chunk + 6 * kd * vd * seq + seq * (chunk - 1) * (chunk - 2) / 3
    )
    cost = costs_linear.gla(batch=4, heads=16, seq=seq, key_dim=kd, value_dim=vd, dtype="bf16")
    assert cost.flops == 4 * 16 * costs_linear.linear_attention_flops_per_head(seq, kd, vd, "chunk", chunk)


# --- cost models: scaling and conventions ---------------------------------------------------

MODELS: dict[str, Callable[..., Cost]] = {
    "linear_attention": costs_linear.linear_attention,
    "gla": costs_linear.gla,
    "simple_gla": costs_linear.simple_gla,
    "gated_delta_rule": costs_linear.gated_delta_rule,
}
SHAPE: dict[str, Any] = {"batch": 4, "heads": 16, "key_dim": 128, "value_dim": 128}


@pytest.mark.parametrize("form", costs_linear.FORMS)
@pytest.mark.parametrize("name", MODELS)
def test_backward_costs_more_than_forward(name: str, form: str) -> None:
    fwd = MODELS[name](**SHAPE, seq=1024, dtype="bf16", form=form)
    both = MODELS[name](**SHAPE, seq=1024, dtype="bf16", form=form, backward=True)
    assert both.flops == 3 * fwd.flops  # backward = 2x forward, by the stated convention
    assert both.bytes > 2 * fwd.bytes


def test_bytes_are_every_input_read_and_every_output_written_once() -> None:
    b, h, s, kd, vd = SHAPE["batch"], SHAPE["heads"], 1000, SHAPE["key_dim"], SHAPE["value_dim"]
    tokens = b * h * s
    la = costs_linear.linear_attention(batch=b, heads=h, seq=s, key_dim=kd, value_dim=vd, dtype="bf16")
    assert la.bytes == 2 * tokens * (2 * kd + 2 * vd)  # q, k, v read, o written
    gla = costs_linear.gla(batch=b, heads=h, seq=s, key_dim=kd, value_dim=vd, dtype="bf16")
    assert gla.bytes == la.bytes + 4 * tokens * kd  # + fp32 gates [B, T, H, K]
    gdn = costs_linear.gated_delta_rule(batch=b, heads=h, seq=s, key_dim=kd, value_dim=vd, dtype="bf16")
    assert gdn.bytes == la.bytes + (4 + 2) * tokens  # + fp32 g and bf16 beta, [B, T, H] each
    with_states = costs_linear.linear_attention(
        batch=b, heads=h, seq=s, key_dim=kd, value_dim=vd, dtype="bf16", initial_state=True, final_state=True
    )
    assert with_states.bytes == la.bytes + 2 * 4 * b * h * kd * vd  # fp32 states in and out


@pytest.mark.parametrize("name", MODELS)
def test_bytes_scale_with_the_element_size(name: str) -> None:
    def cost(dtype: str) -> float:
        extra = {} if name == "linear_attention" else {"gate_dtype": dtype}
        return MODELS[name](**SHAPE, seq=2048, dtype=dtype, backward=True, **extra).bytes

    assert cost("fp32") == 2 * cost("bf16") == 2 * cost("fp16")
    assert cost("fp64") == 2 * cost("fp32")


@pytest.mark.parametrize("form", costs_linear.FORMS)
@pytest.mark.parametrize("name", MODELS)
def test_linear_attention_is_linear_in_the_sequence_and_softmax_quadratic(name: str, form: str) -> None:
    def flops(seq: int) -> float:
        return MODELS[name](**SHAPE, seq=seq, dtype="bf16", form=form, backward=True).flops

    assert flops(8192) == 2 * flops(4096)

    def softmax(seq: int) -> float:
        return softmax_attention(batch=4, heads=16, seq=seq, head_dim=128, dtype="bf16", causal=True).flops

    assert softmax(8192) / softmax(4096) == pytest.approx(4, rel=1e-3)


def test_chunk_form_does_more_flops_than_recurrent_but_the_same_state_work() -> None:
    for name, model in MODELS.items():
        chunk = model(**SHAPE, seq=4096, dtype="bf16", form="chunk").flops
        recurrent = model(**SHAPE, seq=4096, dtype="bf16", form="recurrent").flops
        per_token = (chunk - recurrent) / (SHAPE["batch"] * SHAPE["heads"] * 4096)
        expected = 2 * 64 * 256 if name != "gated_delta_rule" else 64 * (6 * 128 + 4 * 128) + 63 * 62 / 3
        assert per_token == pytest.approx(expected, rel=1e-12), name


def test_a_partial_last_chunk_counts_at_its_own_length() -> None:
    assert costs_linear.chunk_lengths(33, 16) == [16, 16, 1]
    assert costs_linear.chunk_lengths(32, 16) == [16, 16]
    assert costs_linear.chunk_lengths(0, 16) == []
    one = costs_linear.linear_attention_flops_per_head(1, 4, 4, "chunk", 64)
    assert one == 2 * (4 + 4) + 4 * 4 * 4


def test_bad_arguments_are_usage_errors() -> None:
    base: dict[str, Any] = {"batch": 1, "heads": 1, "seq": 8, "key_dim": 4, "value_dim": 4}
    with pytest.raises(ValueError, match="form must be one of"):
        costs_linear.gla(**base, dtype="bf16", form="parallel")
    with pytest.raises(ValueError, match="chunk must be a positive"):
        costs_linear.gated_delta_rule(**base, dtype="bf16", chunk=0)
    with pytest.raises(ValueError, match="unknown dtype 'bfloat16'"):
        costs_linear.linear_attention(**base, dtype="bfloat16")
    with pytest.raises(ValueError, match="unknown gate_dtype"):
        costs_linear.gla(**base, dtype="bf16", gate_dtype="float")


def test_modules_import_nothing_heavy() -> None:
    """The cost model is pure and the references import torch only when called."""
    code = (
        "import sys; import pytest_attnperf.families.linear.costs, pytest_attnperf.families.linear.reference; "
        "heavy = sorted(m for m in ('torch', 'triton', 'fla') if m in sys.modules); "
        "assert not heavy, heavy"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr



@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("seq", [1, 33, 64, 100, 128, 130])
def test_a_gates_gradient_summed_within_chunks_is_the_sum_over_the_sequence(seq: int, per_head: bool) -> None:
    """``gate_gradient``'s chunk form (each chunk's own terms, then what follows it) is the whole
    reverse cumulative sum, for sequences shorter than a chunk, of whole chunks and with a tail."""
    from pytest_attnperf.families.linear.gate import gate_gradient

    gen = torch.Generator().manual_seed(seq)
    q, k, dq, dk = (torch.randn(2, seq, 3, 5, generator=gen, dtype=torch.float64) for _ in range(4))
    whole = gate_gradient(q, k, dq, dk, per_head=per_head)
    assert whole.shape == ((2, seq, 3) if per_head else (2, seq, 3, 5))
    terms = (q * dq - k * dk).sum(-1) if per_head else q * dq - k * dk
    assert torch.allclose(whole[:, 0], terms.sum(1), atol=1e-12)
    chunked = gate_gradient(q, k, dq, dk, per_head=per_head, chunk=16, later=whole)
    assert torch.allclose(chunked, whole, atol=1e-12)
    wrong_later = gate_gradient(q, k, dq, dk, per_head=per_head, chunk=16, later=whole + 1.0)
    assert seq <= 16 or not torch.allclose(wrong_later, whole)  # the part after a chunk is used


def test_the_gates_yardstick_errs_at_least_as_much_as_autograds_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate's yardstick is the worse of autograd's and the chunk form's, element by element,
    so its bound is never tighter than autograd's alone."""
    from pytest_attnperf.families.linear import kernels as linear
    from pytest_attnperf.families.linear.case import LinearCase

    case = LinearCase("units-b1-h2-t100-d16-fp16", 1, 2, 100, 16, 16, "fp16", gpu=False)
    for family in ("gla", "simple_gla"):
        with monkeypatch.context() as patched:  # autograd's gate gradient alone
            patched.setattr(linear.PreparedLinear, "_gate_yardstick", lambda self, leaves, grads: grads[3].detach())
            linear._cache.clear()
            autograd = linear.prepare(family, case, "fwdbwd", torch.device("cpu")).reference("chunk")[1][4]
        linear._cache.clear()
        reference, yardstick = linear.prepare(family, case, "fwdbwd", torch.device("cpu")).reference("chunk")
        ref = reference[4].double()
        assert bool(((yardstick[4].double() - ref).abs() >= (autograd.double() - ref).abs()).all()), family
        assert not torch.equal(yardstick[4], autograd), family  # the chunk form is the worse somewhere
    linear._cache.clear()
