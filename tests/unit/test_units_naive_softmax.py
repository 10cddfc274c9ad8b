"""The ``naive`` softmax kernel (``families.softmax.kernels.naive``): where no row can be empty it
is the plain formula, bit for bit, with no passes over the scores for empty rows; where one can (an
explicit mask, causal with more queries than keys) an empty row's output is 0 and its LSE -inf."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.reference import attention_mask, masked_scores


def draw(tq: int, tk: int, heads: int = 4, kv_heads: int = 4, dtype: torch.dtype = torch.float32,
         ) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(tq * 1000 + tk)
    q = torch.randn(2, heads, tq, 16, generator=gen)
    k, v = (torch.randn(2, kv_heads, tk, 16, generator=gen) for _ in range(2))
    return tuple(x.to(dtype) for x in (q, k, v))


def plain_formula(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None) -> tuple[Any, Any]:
    """naive as it was before it handled empty rows (scores, the causal (window) mask, softmax,
    @ v), and the log-sum-exp of its scores."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    mask = attention_mask(q.shape[2], causal, window, q.device, k.shape[2])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v), torch.logsumexp(scores.float(), dim=-1)


FULL_ROWS = [  # queries, keys, query heads, kv heads, causal, window: every row sees at least one key
    pytest.param(33, 33, 4, 4, True, None, id="causal"),
    pytest.param(33, 33, 4, 2, True, None, id="causal-gqa"),
    pytest.param(5, 40, 4, 1, True, None, id="causal-decode"),
    pytest.param(40, 40, 4, 4, True, 7, id="causal-window"),
    pytest.param(3, 40, 4, 4, True, 1, id="causal-window-of-one"),
    pytest.param(20, 12, 4, 4, False, None, id="full-more-queries"),
]


@pytest.mark.parametrize(("tq", "tk", "heads", "kv_heads", "causal", "window"), FULL_ROWS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_where_no_row_can_be_empty_it_is_the_plain_formula_bit_for_bit(
    tq: int, tk: int, heads: int, kv_heads: int, causal: bool, window: int | None, dtype: torch.dtype,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_empty_rows(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("naive looked for empty rows where none can be")

    monkeypatch.setattr(softmax, "masked_scores", no_empty_rows)
    q, k, v = draw(tq, tk, heads, kv_heads, dtype)
    opts: dict[str, Any] = {"causal": causal, "scale": 0.25, "window": window}
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = softmax.naive(*leaves, **opts)
    expected_leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    expected, expected_lse = plain_formula(*expected_leaves, **opts)
    assert torch.equal(out, expected)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    for got, want in zip(torch.autograd.grad(out, leaves, grad_out),
                         torch.autograd.grad(expected, expected_leaves, grad_out), strict=True):
        assert torch.equal(got, want)
    found, lse = softmax.naive(q, k, v, **opts, return_lse=True)
    assert torch.equal(found, expected.detach())
    assert torch.equal(lse, expected_lse.detach())


def test_causal_with_more_queries_than_keys_leaves_the_first_rows_zero_with_lse_minus_inf() -> None:
    q, k, v = draw(9, 4, heads=4, kv_heads=2)
    out, lse = softmax.naive(q, k, v, causal=True, scale=0.25, window=None, return_lse=True)
    empty = 9 - 4  # lower-right: query i sees keys 0 .. i - 5
    assert torch.equal(out[:, :, :empty], torch.zeros_like(out[:, :, :empty]))
    assert bool(torch.isneginf(lse[:, :, :empty]).all())
    assert bool(torch.isfinite(out).all())
    assert bool(torch.isfinite(lse[:, :, empty:]).all())
    assert bool((out[:, :, empty:].abs().sum(-1) > 0).all())


@pytest.mark.parametrize("additive", [False, True], ids=["boolean", "additive"])
def test_a_fully_masked_row_of_an_explicit_mask_is_zero_with_lse_minus_inf(additive: bool) -> None:
    q, k, v = draw(6, 6)
    visible = torch.ones(2, 4, 6, 6, dtype=torch.bool)
    visible[0, 1, 2] = False  # one row of one head sees no key
    visible[1, :, 5] = False  # the last row of every head of the second batch entry
    mask = visible if not additive else torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
    out, lse = softmax.naive(q, k, v, causal=False, scale=0.25, window=None, attn_mask=mask, return_lse=True)
    empty = ~visible.any(-1)
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert bool(torch.isneginf(lse[empty]).all())
    assert bool(torch.isfinite(lse[~empty]).all())
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize(("tq", "tk", "causal", "mask"), [
    pytest.param(9, 4, True, False, id="causal-more-queries"),
    pytest.param(6, 6, False, True, id="explicit-mask"),
])
def test_where_a_row_can_be_empty_it_takes_the_empty_row_path(tq: int, tk: int, causal: bool, mask: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return masked_scores(*args, **kwargs)

    monkeypatch.setattr(softmax, "masked_scores", counted)
    q, k, v = draw(tq, tk)
    attn_mask = torch.ones(1, 1, tq, tk, dtype=torch.bool) if mask else None
    softmax.naive(q, k, v, causal=causal, scale=0.25, window=None, attn_mask=attn_mask)
    assert calls == [1]
