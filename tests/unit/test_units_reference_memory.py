"""What the softmax references hold over a long grouped KV cache: the fp64 reference
(``families.softmax.reference.softmax_attention``) and the flash-style yardstick
(``families.softmax.recompute.recomputed_output``) stack a GQA group's query heads against their
one K/V head, so neither copies K or V to the query heads; a case's preparation
(``kernels.prepare``) allocates nothing larger than one fp64 copy of K. On an H100 the decode row
b32-h32-kv8-t1-cache32k-d128 asked for 32 GiB at once: torch.matmul copied the fp64 K it
broadcast over each group's query heads."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.decode import decode_case
from pytest_attnperf.families.softmax.recompute import recomputed_output
from pytest_attnperf.families.softmax.reference import softmax_attention

BATCH, HEADS, KV_HEADS, QUERIES, KEYS, DIM = 2, 8, 2, 1, 512, 64  # a decode step over a group of 4


class Allocations(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Every tensor an operator returns while on, by the bytes of the memory it owns (a view or an
    expansion of another tensor's memory owns none)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.made: list[tuple[int, str, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        inputs = {x.untyped_storage().data_ptr() for x in _tensors(args) + _tensors(kwargs or {})}
        out = func(*args, **(kwargs or {}))
        for x in _tensors(out):
            if x.untyped_storage().data_ptr() not in inputs:
                self.made.append((x.untyped_storage().nbytes(), str(func), tuple(x.shape)))
        return out

    def largest(self) -> tuple[int, str, tuple[int, ...]]:
        return max(self.made, default=(0, "", ()))


def _tensors(tree: Any) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [x for item in tree for x in _tensors(item)]
    if isinstance(tree, dict):
        return [x for item in tree.values() for x in _tensors(item)]
    return []


def draw(dtype: torch.dtype, requires_grad: bool = False) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(BATCH, HEADS, QUERIES, DIM, generator=gen)
    k, v = (torch.randn(BATCH, KV_HEADS, KEYS, DIM, generator=gen) for _ in range(2))
    return tuple(x.to(dtype).requires_grad_(requires_grad) for x in (q, k, v))


CALLS: list[Any] = [
    pytest.param({}, id="out"),
    pytest.param({"return_lse": True}, id="lse"),
    pytest.param({"attn_mask": torch.rand(BATCH, 1, QUERIES, KEYS, generator=torch.Generator().manual_seed(1)) > 0.3},
                 id="mask"),
]


@pytest.mark.parametrize("extra", CALLS)
def test_the_fp64_reference_copies_no_k_or_v_to_the_query_heads(extra: dict[str, Any]) -> None:
    q, k, v = draw(torch.float64)
    with Allocations() as made:
        softmax_attention(q, k, v, causal=True, scale=DIM**-0.5, **extra)
    size, func, shape = made.largest()
    assert size < k.nbytes, f"{func} made {shape}: {size} bytes, K itself is {k.nbytes}"


def test_its_gradients_copy_no_k_or_v_to_the_query_heads_either() -> None:
    q, k, v = draw(torch.float64, requires_grad=True)
    out = softmax_attention(q, k, v, causal=True, scale=DIM**-0.5)
    grad_out = torch.ones_like(out)
    with Allocations() as made:
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad_out)
    size, func, shape = made.largest()
    assert size <= k.nbytes, f"{func} made {shape}: {size} bytes, K itself is {k.nbytes}"
    # and the group's query heads are summed into each K/V head, as repeating K/V would have them
    repeated = [x.detach().repeat_interleave(HEADS // KV_HEADS, dim=1).requires_grad_(True) for x in (k, v)]
    want = torch.autograd.grad(softmax_attention(q, *repeated, causal=True, scale=DIM**-0.5), repeated, grad_out)
    for got, expanded in zip((dk, dv), want, strict=True):
        torch.testing.assert_close(got, expanded.view(BATCH, KV_HEADS, -1, KEYS, DIM).sum(2))


def test_the_flash_style_yardstick_holds_k_at_its_own_heads_in_fp32_and_v_not_at_all() -> None:
    q, k, v = draw(torch.bfloat16)
    opts = {"causal": True, "scale": DIM**-0.5, "window": None}
    exact = softmax_attention(q.double(), k.double(), v.double(), causal=True, scale=DIM**-0.5)
    with Allocations() as made:
        found = recomputed_output(q, k, v, opts, exact)
    size, func, shape = made.largest()
    assert size <= k.numel() * 4, f"{func} made {shape}: {size} bytes, K in fp32 is {k.numel() * 4}"
    torch.testing.assert_close(found.double(), exact, rtol=2e-2, atol=2e-2)  # still the same attention


def test_preparing_a_grouped_decode_case_allocates_nothing_larger_than_one_fp64_copy_of_k() -> None:
    # bf16 over groups of 4: naive's own K/V repeated to the query heads is the size of one fp64 K
    case = decode_case(BATCH, QUERIES, KEYS, heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, gpu=False,
                       prefix="memory-")
    softmax.forget()
    try:
        with Allocations() as made:
            softmax.prepare(case, "fwd", torch.device("cpu"))
    finally:
        softmax.forget()
    fp64_k = BATCH * KV_HEADS * KEYS * DIM * 8
    size, func, shape = made.largest()
    assert size <= fp64_k, f"{func} made {shape}: {size} bytes, one fp64 copy of K is {fp64_k}"


def test_the_fp32_draws_are_not_held_through_the_references(monkeypatch: pytest.MonkeyPatch) -> None:
    case = decode_case(BATCH, QUERIES, KEYS + 3, heads=HEADS, kv_heads=KV_HEADS, head_dim=DIM, gpu=False,
                       prefix="draws-")
    shape_kv = (BATCH, KV_HEADS, KEYS + 3, DIM)
    alive: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        alive.append(sum(1 for x in gc.get_objects()
                         if isinstance(x, torch.Tensor) and x.dtype == torch.float32 and tuple(x.shape) == shape_kv))
        return softmax_attention(*args, **kwargs)

    monkeypatch.setattr(softmax, "reference", counting)
    softmax.forget()
    try:
        softmax.prepare(case, "fwd", torch.device("cpu"))
    finally:
        softmax.forget()
    assert alive
    assert set(alive) == {0}
