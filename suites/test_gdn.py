"""Gated DeltaNet (log decay, beta in (0,1) and (0,2)) from flash-linear-attention, forward and forward+backward."""

from __future__ import annotations

import linear_cases

from pytest_attnperf.variants import linear

FAMILY = "gdn"
CASES = linear_cases.CASES


def test_gdn(case, kernel, direction, attnperf_device, attnperf):
    """Output and gradients against our fp64 recurrence, then device time against the baseline."""
    timed = linear.run_case(FAMILY, kernel, case, direction, attnperf_device)
    result = attnperf.measure(timed, cost=linear.cost(FAMILY, kernel, case, direction), dtype=case.dtype)
    assert result.median_ms > 0
