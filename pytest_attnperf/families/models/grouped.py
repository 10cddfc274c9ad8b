"""Softmax attention with grouped K/V heads at model shapes: the check on two key/value groups
(``softmax.sliced.run_sliced``) where the whole case's fp64 reference does not fit.

At Llama-3-8B's 32 query heads and T=16384 the fp64 scores alone are 69 GB."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import memory
from pytest_attnperf.families.softmax.sliced import run_sliced

__all__ = ["fits_whole", "run_grouped", "scores_gb"]

WHOLE_CHECK_MAX_GB = 4.5  # fp64 scores of the whole case up to this: the family's own check (every head)


def scores_gb(case: Any) -> float:
    """The fp64 T x T scores of every (batch, query head) pair of ``case`` (its reference's), in GB."""
    return memory.scores_gb(case, "fp64")


def fits_whole(case: Any) -> bool:
    """Whether the family's own check (the fp64 reference of every head) is taken for ``case``."""
    return scores_gb(case) <= WHOLE_CHECK_MAX_GB


def run_grouped(kernel: Kernel, case: Any, direction: str, device: Any) -> Callable[[], Any]:
    """Check ``kernel`` on ``case`` (a ``SoftmaxCase``, grouped or not) on two key/value groups and
    return the zero-argument callable to time, which runs the whole case."""
    return run_sliced(kernel, case, direction, device, "grouped")
