"""Softmax cases with call axes timed with their timed draws where the axes allow: a shape (more
queries than keys, a value head dim of its own) or a returned LSE; a mask with draws of signs
only (the mask stays where it is); a KV cache is timed unchecked."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from pytest_attnperf.families.checks import CheckFailed
from pytest_attnperf.families.draws import Timed
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.measure.timing import HostTimer, SamplingPlan
from pytest_attnperf.measure.verify import UNVERIFIED

CPU = torch.device("cpu")
CASE = softmax.SoftmaxCase("axes", batch=2, heads=2, seq=9, head_dim=8, dtype="fp32", causal=True, gpu=False,
                           kv_seq=5, head_dim_v=4, lse=True)


def registered(fn: Any, name: str = "naive-axes") -> Kernel:
    return Kernel("softmax", name, fn, axes=("lse", "q-gt-k", "v-dim", "mask"))


@pytest.mark.parametrize("direction", ["fwd", "fwdbwd"])
def test_a_case_whose_axes_are_shapes_and_an_lse_is_timed_with_checked_draws(direction: str) -> None:
    assert set(CASE.axes) == {"lse", "q-gt-k", "v-dim"}
    timed = softmax.check_case(registered(softmax.naive), CASE, direction, CPU).call
    assert isinstance(timed, Timed)
    assert timed.verify(1, timed.draw(1)()) <= 1.0


def test_a_kernel_that_answers_each_shape_with_its_first_answer_fails_a_timed_draw() -> None:
    first: dict[Any, Any] = {}

    def stale(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        key = (tuple(q.shape), bool(opts.get("return_lse")))
        if key not in first:
            first[key] = softmax.naive(q, k, v, **opts)
        return first[key]

    timed = softmax.check_case(registered(stale, "stale"), CASE, "fwd", CPU).call
    assert isinstance(timed, Timed)
    with pytest.raises(CheckFailed):
        timed.verify(1, timed.draw(1)())


@pytest.mark.parametrize("direction", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("mask", ["padding", "padding-additive", "per-head", "fully-masked", "alibi"])
def test_a_masked_case_is_timed_with_draws_of_signs_only(mask: str, direction: str) -> None:
    """The draws negate v (and vary its value columns) but move no batch entry or head, so the
    mask, per batch entry and head, still lines up; the honest kernel passes every draw."""
    case = dataclasses.replace(CASE, mask=mask, lse=False, kv_seq=None, head_dim_v=None)
    timed = softmax.check_case(registered(softmax.naive), case, direction, CPU).call
    assert isinstance(timed, Timed)
    for index in (1, 2):
        call, vary = timed.draw(index), timed.vary(index)
        assert timed.verify(index, call()) <= 1.0
        vary()
        assert timed.verify(index, call()) <= 1.0
        assert not timed.transform(index).permutes()
        assert "v negated" in timed.describe(index)


def test_a_kernel_that_ignores_the_mask_on_its_timed_calls_fails_a_timed_draw() -> None:
    """Correct on the checked call; on every later call it drops the mask: the draw's check fails."""
    calls = [0]

    def forgetful(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        calls[0] += 1
        if calls[0] > 1:
            opts.pop("attn_mask", None)
        return softmax.naive(q, k, v, **opts)

    case = dataclasses.replace(CASE, mask="padding", lse=False, kv_seq=None, head_dim_v=None)
    timed = softmax.check_case(registered(forgetful, "forgetful"), case, "fwd", CPU).call
    assert isinstance(timed, Timed)
    with pytest.raises(CheckFailed):
        timed.verify(1, timed.draw(1)())


def test_a_content_cache_on_a_masked_case_misses_on_a_varied_call() -> None:
    """A cache keyed on q, k, v's bytes answers nothing once the draw's value columns vary."""
    kept: dict[bytes, Any] = {}
    hits = [0]

    def cached(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        key = b"".join(x.detach().contiguous().numpy().tobytes() for x in (q, k, v))
        if key in kept:
            hits[0] += 1
            return kept[key].clone()
        kept[key] = out = softmax.naive(q, k, v, **opts)
        return out

    case = dataclasses.replace(CASE, mask="padding", lse=False, kv_seq=None, head_dim_v=None)
    timed = softmax.check_case(registered(cached, "cached"), case, "fwd", CPU).call
    assert isinstance(timed, Timed)
    call, vary = timed.draw(1), timed.vary(1)
    call()
    before = hits[0]
    for _ in range(5):
        vary()
        assert timed.verify(1, call()) <= 1.0
    assert hits[0] == before


def test_a_masked_case_timed_on_the_host_is_verified_after_sampling() -> None:
    case = dataclasses.replace(CASE, mask="fully-masked", lse=False, kv_seq=None, head_dim_v=None)
    timed = softmax.check_case(registered(softmax.naive), case, "fwdbwd", CPU).call
    m = HostTimer().measure(timed, SamplingPlan(min_samples=5, max_samples=5, budget_s=30.0, warmup_calls=1))
    assert (m.verified, m.bitwise) == (2, True)
    assert UNVERIFIED not in m.notes
