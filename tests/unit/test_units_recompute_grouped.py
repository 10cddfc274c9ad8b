"""The recomputing backward (``families.softmax.recompute.recomputed_gradients``) on grouped K/V
heads whose values have a head dim of their own: dk and dv summed over each group, each by its
own shape."""

from __future__ import annotations

import torch

from pytest_attnperf.families.softmax.recompute import recomputed_gradients
from pytest_attnperf.families.softmax.reference import softmax_attention


def test_grouped_heads_with_their_own_value_head_dim_sum_each_gradient_over_its_group() -> None:
    gen = torch.Generator().manual_seed(33)
    q = torch.randn(2, 8, 33, 48, generator=gen)
    k = torch.randn(2, 2, 33, 48, generator=gen)
    v = torch.randn(2, 2, 33, 32, generator=gen)
    grad_out = torch.randn(2, 8, 33, 32, generator=gen)
    opts = {"scale": 48**-0.5, "causal": True, "window": None}

    dq, dk, dv = recomputed_gradients(q, k, v, grad_out, opts)

    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dq.dtype == dk.dtype == dv.dtype == torch.float32
    leaves = tuple(x.double().requires_grad_(True) for x in (q, k, v))
    out = softmax_attention(*leaves, causal=True, scale=opts["scale"])
    exact = torch.autograd.grad(out, leaves, grad_out.double())
    for got, want in zip((dq, dk, dv), exact, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
