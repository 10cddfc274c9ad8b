"""The gate's policy as a pure function: a measurement and a baseline entry in, a decision out.

No pytester run and no device: each rule of ``gate.policy`` is checked with plain numbers.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from pytest_attnperf.gate import policy
from pytest_attnperf.gate.policy import GateTerms, Here
from pytest_attnperf.measure.sampling import Measurement
from pytest_attnperf.measure.summary import Summary

TERMS = GateTerms(tolerance=0.05, run_noise=0.005, run_noise_time_ms=1e-4, machine_noise=0.007,
                  machine_offset_ms=0.002, machine_residual_ms=0.0005, hot_sample_ms=20.0)
HERE = Here(machine="this-box", overhead_ms=lambda: None)


def timed(centre_ms: float, *, seed: int = 0, clock: str = "cuda-graph-nodes", mode: str = "cold",
          n: int = 40, calls: int = 1) -> Measurement:
    """A measurement of ``n`` samples with 0.3% noise about ``centre_ms``."""
    rng = random.Random(seed)
    return Measurement(tuple(centre_ms * (1 + rng.gauss(0, 0.003)) for _ in range(n)), clock, mode,
                       calls_per_sample=calls)


def entry_of(m: Measurement, *, machines: tuple[str | None, ...] = ("this-box",) * 3,
             medians: tuple[float, ...] | None = None, **extra: Any) -> dict[str, Any]:
    """The baseline entry a recording of ``m`` would hold (three recordings on ``machines``)."""
    s = m.summary
    runs = medians if medians is not None else (s.median_ms,) * len(machines)
    return {"median_ms": s.median_ms, "ci_low_ms": s.ci_low_ms, "ci_high_ms": s.ci_high_ms, "stdrel": s.stdrel,
            "n_samples": s.n_samples, "clock": m.clock, "mode": m.mode, "run_medians_ms": list(runs),
            "run_machines": list(machines), "run_overheads_ms": [None] * len(runs), **extra}


def decide(m: Measurement, entry: dict[str, Any] | None, terms: GateTerms = TERMS,
           here: Here = HERE) -> policy.Decision:
    summary = Summary.from_mapping(entry) if entry is not None else None
    return policy.decide(m, entry, summary, terms, here)


def test_an_unchanged_case_passes_and_is_not_measured_again() -> None:
    decision = decide(timed(1.0, seed=1), entry_of(timed(1.0, seed=2)))
    assert decision.verdict.status == "unchanged"
    assert not decision.remeasure
    assert not decision.missing


def test_a_slower_case_is_suspected_and_measured_once_more() -> None:
    base = entry_of(timed(1.0, seed=2))
    first = timed(1.10, seed=1)
    decision = decide(first, base)
    assert decision.verdict.status == "regressed"
    assert decision.remeasure


def test_the_second_measurement_decides_and_says_so() -> None:
    base = entry_of(timed(1.0, seed=2))
    first = timed(1.10, seed=1)
    verdict = decide(first, base).verdict
    summary = Summary.from_mapping(base)
    second, kept, _ = policy.decide_again(verdict, first, timed(1.0, seed=3), summary, TERMS, HERE)
    assert second.status == "unchanged"
    assert kept.notes == (f"re-measured after a suspected regression ({verdict.change_pct:+.1f}% first)",)
    assert verdict.change_pct == pytest.approx(10.0, abs=0.5)
    again, kept, _ = policy.decide_again(verdict, first, timed(1.10, seed=4), summary, TERMS, HERE)
    assert again.failed


def test_a_second_measurement_on_another_clock_leaves_the_first_verdict_standing() -> None:
    base = entry_of(timed(1.0, seed=2))
    first = timed(1.10, seed=1)
    verdict = decide(first, base).verdict
    fallback = timed(0.5, seed=3, clock="cuda-events")
    kept_verdict, kept, _ = policy.decide_again(verdict, first, fallback, Summary.from_mapping(base), TERMS, HERE)
    assert kept_verdict is verdict
    assert kept.samples_ms == first.samples_ms
    assert "fell back to the cuda-events clock" in kept.notes[-1]


def test_another_mode_is_not_compared_and_another_clock_fails() -> None:
    base = entry_of(timed(1.0, seed=2))
    hot = decide(timed(1.0, mode="hot", clock="cuda-graph"), base)
    assert hot.verdict.status == "not compared"
    assert "baseline measured as cold/cuda-graph-nodes" in hot.verdict.message
    eager = decide(timed(1.0, clock="cuda-events"), base)
    assert eager.verdict.status == "clock changed"
    assert eager.verdict.failed
    assert not eager.remeasure


def test_hot_samples_of_another_length_are_not_compared() -> None:
    hot = timed(1.0, mode="hot", clock="cuda-graph", calls=20)
    assert decide(hot, entry_of(hot, hot_sample_ms=20.0)).verdict.status == "unchanged"
    other = decide(hot, entry_of(hot, hot_sample_ms=0.5))
    assert other.verdict.status == "not compared"
    assert "hot samples lasted about 0.5 ms" in other.verdict.message


def test_no_entry_is_new_unless_an_entry_is_required() -> None:
    assert decide(timed(1.0), None).verdict.status == "new"
    assert not decide(timed(1.0), None).missing
    strict = dataclasses.replace(TERMS, require_baseline=True)
    assert decide(timed(1.0), None, strict).missing


def test_an_eager_clock_is_compared_only_with_this_machines_recordings() -> None:
    eager = timed(1.0, clock="cuda-events")
    assert decide(eager, entry_of(eager)).verdict.status == "unchanged"
    other = decide(eager, entry_of(eager, machines=("elsewhere",) * 3))
    assert other.verdict.status == "not compared"
    assert "another machine" in other.verdict.message


def test_another_machines_recordings_widen_the_bar() -> None:
    base = timed(0.02, seed=2)  # 20 us: a fixed 2 us offset a sample is 10% of it
    slower = timed(0.0214, seed=1)  # +7%
    assert decide(slower, entry_of(base)).verdict.failed
    judged = decide(slower, entry_of(base, machines=("elsewhere",) * 3)).verdict
    assert not judged.failed
    assert judged.machine_noise > 0
    assert policy.verdict_notes(judged, TERMS)[0].startswith("judged against recordings from another machine")


def test_an_unchanged_case_beyond_the_tolerance_notes_why() -> None:
    """+7% at 5% against a history whose spread makes a wide bar: unchanged, with a note naming
    the test that held it; an unchanged case within the tolerance gets no such note."""
    base = entry_of(timed(1.0, seed=2), medians=(0.94, 1.0, 1.06))
    judged = decide(timed(1.07, seed=1), base).verdict
    assert judged.status == "unchanged"
    assert [n for n in policy.verdict_notes(judged, TERMS) if n.startswith("unchanged: ")] == [
        f"unchanged: {judged.held}"]
    assert "beyond the 5.0% tolerance but within the noise bar" in (judged.held or "")
    assert policy.verdict_notes(decide(timed(1.0, seed=1), base).verdict, TERMS) == ()


def test_history_grows_while_unchanged_and_restarts_on_a_change() -> None:
    base = entry_of(timed(1.0, seed=2), medians=(1.0, 1.0, 1.0))
    grown = policy.history(base, timed(1.0, seed=1), TERMS, HERE)
    assert grown.medians_ms[:3] == [1.0, 1.0, 1.0]
    assert len(grown.medians_ms) == 4
    assert grown.machines[-1] == "this-box"
    restarted = policy.history(base, timed(1.2, seed=1), TERMS, HERE)
    assert len(restarted.medians_ms) == 1
    assert restarted.machines == ["this-box"]
    assert policy.history(None, timed(1.0), TERMS, HERE).medians_ms == [pytest.approx(1.0, rel=0.01)]


def test_history_keeps_the_latest_recordings_only() -> None:
    many = tuple(1.0 for _ in range(policy.HISTORY_KEEP))
    base = entry_of(timed(1.0, seed=2), machines=("this-box",) * len(many), medians=many)
    kept = policy.history(base, timed(1.0, seed=1), TERMS, HERE)
    assert len(kept.medians_ms) == policy.HISTORY_KEEP


def test_history_restarts_when_the_case_is_timed_another_way() -> None:
    base = entry_of(timed(1.0, seed=2))
    assert len(policy.history(base, timed(1.0, clock="cuda-events"), TERMS, HERE).medians_ms) == 1
    hot = timed(1.0, mode="hot", clock="cuda-graph")
    assert len(policy.history(entry_of(hot, hot_sample_ms=0.5), hot, TERMS, HERE).medians_ms) == 1


def test_the_sample_floor_is_read_only_when_a_rule_needs_it() -> None:
    reads: list[int] = []

    def floor() -> float | None:
        reads.append(1)
        return 0.0035

    here = Here(machine="this-box", overhead_ms=floor)
    decide(timed(1.0, seed=1), entry_of(timed(1.0, seed=2)), here=here)  # recorded here: no machine terms
    assert reads == []
    decide(timed(1.0, seed=1), entry_of(timed(1.0, seed=2), machines=("elsewhere",) * 3), here=here)
    assert reads == [1]


CONTENDED_NOTE = "host contended: load 5.2 on 2 cores; samples quantised at 8.0 ms"


def contended(m: Measurement, note: str = CONTENDED_NOTE) -> Measurement:
    """``m`` as the host timer gives it when the host was contended while it sampled."""
    return dataclasses.replace(m, notes=(*m.notes, note))


def test_a_contended_host_case_is_unjudged_not_failed_and_says_why() -> None:
    base = entry_of(timed(0.05, clock="host", mode="host", seed=2))
    decision = decide(contended(timed(8.35, clock="host", mode="host", seed=1)), base)
    assert decision.verdict.status == "unjudged"
    assert not decision.verdict.failed
    assert not decision.remeasure
    assert CONTENDED_NOTE in decision.verdict.message
    assert decision.verdict.change_pct == pytest.approx(16600, rel=0.01)
    assert policy.verdict_notes(decision.verdict, TERMS)[0].startswith("unjudged: ")


def test_a_contended_note_on_a_device_clock_changes_nothing() -> None:
    base = entry_of(timed(1.0, seed=2))
    assert decide(contended(timed(1.10, seed=1)), base).verdict.status == "regressed"


def test_a_contended_case_without_a_baseline_is_new() -> None:
    assert decide(contended(timed(1.0, clock="host", mode="host")), None).verdict.status == "new"


def test_a_contended_re_measurement_leaves_the_case_unjudged() -> None:
    base = entry_of(timed(1.0, clock="host", mode="host", seed=2))
    summary = Summary.from_mapping(base)
    first = timed(1.10, clock="host", mode="host", seed=1)
    verdict = decide(first, base).verdict
    assert verdict.status == "regressed"
    again = contended(timed(1.10, clock="host", mode="host", seed=3))
    second, kept, _ = policy.decide_again(verdict, first, again, summary, TERMS, HERE)
    assert second.status == "unjudged"
    assert not second.failed
    assert kept is again
