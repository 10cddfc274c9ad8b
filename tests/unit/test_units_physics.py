"""The impossible-speed rule with plain numbers: a median under the roofline time by more than
the tolerance is refused, for a compute-bound and a memory-bound cost, at, just under and just
over the tolerance."""

from __future__ import annotations

import pytest

from pytest_attnperf.gate.physics import TOLERANCE, judge, not_run, roofline_seconds
from pytest_attnperf.gate.roofline import Ceiling, roofline_fraction

PEAK = Ceiling(1000e12, "measured")  # 1000 TFLOP/s
BAND = Ceiling(4e12, "spec")  # 4000 GB/s: ridge 250 FLOP/B
COMPUTE = (1e12, 1e9)  # 1000 FLOP/B: 1 ms at the peak
MEMORY = (1e9, 4e9)  # 0.25 FLOP/B: 1 ms at the bandwidth


@pytest.mark.parametrize("cost", [COMPUTE, MEMORY], ids=["compute-bound", "memory-bound"])
def test_a_median_at_or_just_under_the_tolerance_below_the_roofline_time_is_possible(
        cost: tuple[float, float]) -> None:
    assert roofline_seconds(*cost, PEAK, BAND) == pytest.approx(1e-3)
    for over in (1.0, 1 + TOLERANCE - 0.001, 1 + TOLERANCE):
        check = judge(*cost, 1e-3 / over, "bf16", PEAK, BAND)
        assert (check.status, check.failed) == ("possible", False), over
        assert check.fraction == pytest.approx(over)


@pytest.mark.parametrize("cost", [COMPUTE, MEMORY], ids=["compute-bound", "memory-bound"])
def test_a_median_just_over_the_tolerance_below_the_roofline_time_is_impossible(cost: tuple[float, float]) -> None:
    check = judge(*cost, 1e-3 / (1 + TOLERANCE + 0.001), "bf16", PEAK, BAND)
    assert (check.status, check.failed) == ("impossible", True)
    assert check.fraction == pytest.approx(1.051)
    assert check.message.startswith("IMPOSSIBLE SPEED: the cost model or the timer is wrong: 105.1% of the roofline")


def test_the_fraction_is_the_roofline_fraction() -> None:
    for flops, nbytes in (COMPUTE, MEMORY, (3e11, 2e9)):
        check = judge(flops, nbytes, 0.7e-3, "bf16", PEAK, BAND)
        assert check.fraction == pytest.approx(roofline_fraction(flops, nbytes, 0.7e-3, PEAK.value, BAND.value))


def test_the_message_names_the_rates_the_ceilings_the_counts_and_the_times() -> None:
    message = judge(*COMPUTE, 0.5e-3, "bf16", PEAK, BAND).message  # 2000 TFLOP/s: 200%
    assert "200.0% of the roofline, above the 105% the ceilings' noise allows" in message
    assert ("compute: achieved 2000.00 TFLOP/s against the bf16 matmul ceiling 1000.0 TFLOP/s (measured): "
            "200.0%") in message
    assert "memory: achieved 2000.0 GB/s against the memory bandwidth peak 4000.0 GB/s (vendor spec): 50.0%" in message
    assert "cost model: 1e+12 FLOP, 1e+09 bytes; the roofline time is 1 ms, the median 0.5 ms" in message
    user = judge(*MEMORY, 0.5e-3, "fp16", PEAK, Ceiling(4e12, "user")).message
    assert "memory bandwidth peak 4000.0 GB/s (--attnperf-peaks): 200.0%" in user


def test_an_unknown_ceiling_is_left_out_and_with_none_the_check_does_not_run() -> None:
    assert judge(*MEMORY, 0.5e-3, "bf16", PEAK, None).status == "possible"  # 2 TFLOP/s of 1000
    only_band = judge(*MEMORY, 0.5e-3, "bf16", None, BAND)
    assert only_band.status == "impossible"
    assert "compute:" not in only_band.message
    assert judge(*MEMORY, 0.5e-3, "bf16", None, None) == not_run("no bf16 matmul ceiling and no copy bandwidth known")
    with pytest.raises(ValueError, match="cannot take"):
        judge(*MEMORY, 0.0, "bf16", PEAK, BAND)
