"""Softmax cases with call axes timed with their timed draws where the axes allow: a shape (more
queries than keys, a value head dim of its own) or a returned LSE; a mask is timed unchecked."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from pytest_attnperf.families.checks import CheckFailed
from pytest_attnperf.families.draws import Timed
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import kernels as softmax

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


def test_a_masked_case_is_timed_unchecked() -> None:
    case = dataclasses.replace(CASE, mask="padding", lse=False, kv_seq=None, head_dim_v=None)
    checked = softmax.check_case(registered(softmax.naive), case, "fwd", CPU)
    assert not isinstance(checked.call, Timed)
