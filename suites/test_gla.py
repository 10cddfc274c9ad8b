"""Gated linear attention (per-key log decay) from flash-linear-attention, forward and forward+backward."""

from __future__ import annotations

import linear_cases

from pytest_attnperf.variants import linear

CASES = tuple(c for c in linear_cases.CASES if c.beta_max == 1.0)  # beta is GDN's alone

FAMILY = "gla"


def test_gla(case, kernel, direction, attnperf_device, attnperf):
    """Output and gradients against our fp64 recurrence, then device time against the baseline."""
    timed = linear.run_case(FAMILY, kernel, case, direction, attnperf_device)
    result = attnperf.measure(timed, cost=linear.cost(FAMILY, kernel, case, direction), dtype=case.dtype)
    assert result.median_ms > 0
