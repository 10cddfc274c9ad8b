"""The run's sample overhead (a one-element add, cold), as ``measure.overhead.SampleOverhead``
times it once and gives it to the gate: which figures the gate may use, and how the session has
it timed. A faked CUDA device whose timer gives fixed figures; no pytest run."""

from __future__ import annotations

import pytest
from kit import H200, cuda_available

from pytest_attnperf.measure.overhead import SampleOverhead
from pytest_attnperf.measure.timing import Measurement, SamplingPlan
from pytest_attnperf.session import AttnPerfSession


def session_timing_overhead(monkeypatch: pytest.MonkeyPatch, median_ms: float, clock: str = "cuda-graph-nodes",
                         notes: tuple[str, ...] = (), plans: list[SamplingPlan] | None = None) -> AttnPerfSession:
    """An ``AttnPerfSession`` on a (faked) CUDA device whose timer gives every measurement,
    the floor's included, these figures (and appends each plan it is given to ``plans``)."""
    seen = plans if plans is not None else []

    class Timer:
        def measure(self, fn: object, plan: SamplingPlan) -> Measurement:
            seen.append(plan)
            m = Measurement((1.0,) * 10, clock=clock, mode="cold", notes=notes)
            object.__setattr__(m.summary, "median_ms", median_ms)  # NaN and 0 too, which samples cannot give
            return m

    cuda_available(monkeypatch)
    session = AttnPerfSession.__new__(AttnPerfSession)
    session.__dict__.update(device=H200, timer=Timer(),
                            plan=lambda mode=None: SamplingPlan(mode=mode or "cold"))
    return session


def overhead_timed_at(monkeypatch: pytest.MonkeyPatch, median_ms: float, clock: str = "cuda-graph-nodes",
                      notes: tuple[str, ...] = ()) -> SampleOverhead:
    """The sample overhead of a session whose timer gives these figures."""
    return session_timing_overhead(monkeypatch, median_ms, clock, notes).overhead


@pytest.mark.parametrize(("median_ms", "clock", "notes", "gate_ms", "how"), [
    (0.00326, "cuda-graph-nodes", (), 0.00326, "one-element add, cold"),
    (0.00358, "cuda-graph", ("no timing events inside the graph (...)",), None,
     "one-element add, cold; not used by the gate: clock cuda-graph"),
    (0.004, "cuda-graph-nodes", ("still throttled (sw-power-cap) after re-measuring",), None,
     "one-element add, cold; not used by the gate: still throttled (sw-power-cap) after re-measuring"),
    (0.004, "cuda-graph-nodes", ("clock throttled (sw-power-cap) at 1700.0 MHz; re-measured",), 0.004,
     "one-element add, cold"),  # re-measured and no longer throttled: fine
    (0.004, "cuda-graph-nodes", ("clocks held down while sampling (power 31% of 0.50 s, NVML violation counters)",),
     None, "one-element add, cold; not used by the gate: clocks held down while sampling (power 31% of 0.50 s, "
     "NVML violation counters)"),
])
def test_which_overheads_the_gate_may_use(monkeypatch: pytest.MonkeyPatch, median_ms: float, clock: str,
                                       notes: tuple[str, ...], gate_ms: float | None, how: str) -> None:
    """Only a floor timed as cold cases are (events inside the graph) and not at a held-down
    clock is kept with recordings and moves centres; every floor is still reported."""
    overhead = overhead_timed_at(monkeypatch, median_ms, clock, notes)
    assert overhead.for_gate_ms() == gate_ms
    assert overhead.measure() == (median_ms, how)


def test_the_overhead_is_timed_cold_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the run's mode, and marked so that a wrapping timer (the noise benchmark's
    injection, do_bench comparison) can tell it from the case it is timed in."""
    plans: list[SamplingPlan] = []
    session = session_timing_overhead(monkeypatch, 0.00326, plans=plans)
    session.__dict__["plan"] = lambda mode=None: SamplingPlan(mode=mode or "hot")
    session.overhead.measure()
    session.overhead.measure()  # once per run
    assert [(p.mode, p.overhead) for p in plans] == [("cold", True)]
    assert not SamplingPlan().overhead


@pytest.mark.parametrize("bad", [0.0, float("nan"), float("inf")])
def test_an_overhead_that_is_not_a_positive_time_is_not_kept(monkeypatch: pytest.MonkeyPatch, bad: float) -> None:
    """A zero, NaN or infinite floor would make the baseline file unloadable once written into
    ``run_overheads_ms``: it is reported as not measured and kept out."""
    overhead = overhead_timed_at(monkeypatch, bad)
    assert overhead.for_gate_ms() is None
    assert overhead.measure() == (None, f"one-element add, cold read {bad!r} ms")
