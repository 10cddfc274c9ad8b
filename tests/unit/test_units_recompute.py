"""The flash-style forward the softmax yardstick takes each element's further error from
(``families.softmax.recompute``): it computes the same attention, and lands off where a tiled GPU
kernel does and PyTorch does not (one visible key)."""

from __future__ import annotations

import torch

from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.recompute import RECIPROCAL_ERROR, recomputed_output
from pytest_attnperf.families.softmax.reference import softmax_attention

OPTS = {"causal": True, "scale": 32**-0.5, "window": None}


def draw(tq: int, tk: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(tq * 1000 + tk)
    return tuple(torch.randn(2, 2, t, 32, generator=gen).to(dtype) for t in (tq, tk, tk))


def test_it_computes_the_same_attention_over_many_blocks() -> None:
    q, k, v = draw(70, 300)
    exact = softmax_attention(q.double(), k.double(), v.double(), **OPTS)
    torch.testing.assert_close(recomputed_output(q, k, v, OPTS, exact).double(), exact, rtol=1e-5, atol=1e-6)


def test_on_a_row_of_one_key_it_lands_off_where_pytorch_is_exact() -> None:
    q, k, v = draw(1, 1)
    opts = dict(OPTS, causal=False)
    exact = softmax_attention(q.double(), k.double(), v.double(), **opts)
    assert torch.equal(softmax.naive(q, k, v, **opts).double(), exact)  # PyTorch: softmax of one score is 1
    error = (recomputed_output(q, k, v, opts, exact).double() - exact).abs()
    assert error.max() > 0  # the approximate reciprocal's error, as an H100's kernels land
    assert bool((error <= 3 * RECIPROCAL_ERROR * exact.abs()).all())  # and no more than a few ulps of it


def test_the_prepared_yardstick_takes_the_further_of_the_two_at_each_element() -> None:
    case = softmax.SoftmaxCase("one-key", 1, 2, 1, 16, "fp32", False)
    prepared = softmax.prepare(case, "fwd", torch.device("cpu"))
    exact, yardstick = prepared.reference[0], prepared.torch_value[0]
    naive = softmax.naive(prepared.q, prepared.k, prepared.v, causal=False, scale=case.scale)
    assert torch.equal(naive.double(), exact)
    assert (yardstick.double() - exact).abs().max() > 0
