"""The gate's rules over successive runs of one case, with plain numbers: what ``gate.policy``
decides and keeps, recording after recording, on the figures the end-to-end tests use.

Each measurement is the kit's scripted one (20 samples ``factor * (1 + s)``, ``s`` in
``kit.JITTER``); the gate's terms come from a real config (``pytester.parseconfig``) through
``read_settings``, so an option is proven to reach the rule; a recording is the entry the fixture
writes, rounded as the baseline file keeps it; a gated run measures a suspected regression once
more, as the fixture does. One end-to-end run per verdict stays in tests/test_plugin.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from kit import JITTER

from pytest_attnperf.gate import policy
from pytest_attnperf.gate.policy import GateTerms, Here
from pytest_attnperf.gate.verdict import Verdict
from pytest_attnperf.measure.sampling import Measurement
from pytest_attnperf.measure.summary import Summary
from pytest_attnperf.options import OPTIONS, read_settings
from pytest_attnperf.store.baselines import entry_problem, rounded

pytest_plugins = ["pytester"]

TIGHT = "--attnperf-tolerance=1.5%"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ATTNPERF_* variable from the calling shell changes the terms."""
    for opt in OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)


@pytest.fixture
def terms(pytester: pytest.Pytester) -> Any:
    """The gate's terms of a run given these options (a real config, read as the plugin reads it)."""
    def read(*args: str) -> GateTerms:
        return GateTerms.from_settings(read_settings(pytester.parseconfig("-p", "pytest_attnperf.plugin", *args)))
    return read


def scripted(factor: float, clock: str = "scripted", *, mode: str = "cold", calls: int = 1,
             notes: tuple[str, ...] = ()) -> Measurement:
    """The kit's scripted timer's measurement at ``factor`` ms."""
    return Measurement(tuple(factor * (1 + s) for s in JITTER), clock, mode, calls_per_sample=calls, notes=notes)


class Case:
    """One case's baseline entry, as recordings write it and gated runs read it; each run on a
    machine of a name whose usable sample overhead is ``overhead_ms`` (None: not measured)."""

    def __init__(self) -> None:
        self.entry: dict[str, Any] | None = None
        self.refusals: list[str] = []  # why a run did not use the sample overheads' difference

    def record(self, m: Measurement, terms: GateTerms, machine: str = "A",
               overhead_ms: float | None = None) -> dict[str, Any]:
        """--update-baselines: the entry the fixture writes for ``m`` (``Perf._entry``), rounded."""
        past = policy.history(self.entry, m, terms, Here(machine, lambda: overhead_ms))
        self._refused(past.refusal)
        s = m.summary
        entry: dict[str, Any] = {"median_ms": s.median_ms, "ci_low_ms": s.ci_low_ms, "ci_high_ms": s.ci_high_ms,
                                 "stdrel": s.stdrel, "n_samples": s.n_samples, "clock": m.clock, "mode": m.mode}
        if m.mode == "hot":
            entry["hot_sample_ms"] = terms.hot_sample_ms
        if m.notes:
            entry["notes"] = list(m.notes)
        entry["run_medians_ms"], entry["run_machines"], entry["run_overheads_ms"] = (
            past.medians_ms, past.machines, past.overheads_ms)
        self.entry = {k: rounded(v) for k, v in entry.items()}
        assert entry_problem(self.entry) is None  # the file still loads
        return self.entry

    def gate(self, m: Measurement, terms: GateTerms, machine: str = "A",
             overhead_ms: float | None = None) -> tuple[Verdict, Measurement]:
        """A gating run: the verdict on ``m``, measured again (the same figures) where a
        regression is suspected, and the measurement the case reports."""
        summary = Summary.from_mapping(self.entry) if self.entry is not None else None
        here = Here(machine, lambda: overhead_ms)
        decision = policy.decide(m, self.entry, summary, terms, here)
        self._refused(decision.refusal)
        if not decision.remeasure:
            return decision.verdict, m
        verdict, kept, refused = policy.decide_again(decision.verdict, m, m, summary, terms, here)
        self._refused(refused)
        return verdict, kept

    def verdict(self, m: Measurement, terms: GateTerms, machine: str = "A",
                overhead_ms: float | None = None) -> Verdict:
        return self.gate(m, terms, machine, overhead_ms)[0]

    def _refused(self, refusal: str | None) -> None:
        if refusal:
            self.refusals.append(refusal)


def statuses(case: Case, factors: dict[str, float], terms: GateTerms, **where: Any) -> str:
    return case.verdict(scripted(factors["a"]), terms, **where).status


# -- the recording history --------------------------------------------------------------------


def test_recordings_build_a_history_and_a_real_change_restarts_it(terms: Any) -> None:
    """Re-recording an unchanged case appends its median (the gate's run-to-run spread); sigma 1%
    over 3 recordings holds +2.5% at a 1% tolerance; a change beyond the tolerance (a new kernel)
    starts the history afresh."""
    case, default = Case(), terms()
    for factor in (1.0, 1.01, 0.99):
        case.record(scripted(factor), default)
    assert case.entry is not None
    assert case.entry["run_medians_ms"] == pytest.approx([1.0, 1.01, 0.99], rel=1e-3)
    judged = case.verdict(scripted(1.025), terms("--attnperf-tolerance=1%"))
    assert judged.status == "unchanged"
    assert judged.change_pct == pytest.approx(2.5, abs=0.05)
    assert case.record(scripted(0.5), default)["run_medians_ms"] == pytest.approx([0.5], rel=1e-3)


def test_a_recording_beyond_the_tolerance_but_within_the_noise_keeps_the_history(terms: Any) -> None:
    """At a 1% tolerance, +1.5% on one recording is beyond the tolerance but inside the noise bar
    (0.5% floor: 3 * 0.5% * sqrt(2) = 2.1%), so the history grows; +5% is a real change and
    restarts it."""
    case, one_pct = Case(), terms("--attnperf-tolerance=1%")
    case.record(scripted(1.0), terms())
    assert case.record(scripted(1.015), one_pct)["run_medians_ms"] == pytest.approx([1.0, 1.015], rel=1e-3)
    assert case.record(scripted(1.06), one_pct)["run_medians_ms"] == pytest.approx([1.06], rel=1e-3)


def test_least_noise_in_time_widens_the_bar_a_sample_holds_once(terms: Any) -> None:
    """--attnperf-run-noise-time reaches the gate and the history. One recording of a ~1 ms case,
    +2.5% at a 1.5% tolerance: on the 0.5% floor (bar 2.1%) it regresses, and recording it restarts
    the history; with a 30 us time floor (3% of 1 ms: bar 12.7%) it passes, and a recording 2.4%
    off joins the history."""
    case, tight, wide = Case(), terms(TIGHT), terms(TIGHT, "--attnperf-run-noise-time=30us")
    assert wide.run_noise_time_ms == pytest.approx(0.03)
    case.record(scripted(1.0), terms())
    assert case.verdict(scripted(1.025), tight).status == "regressed"
    passed = case.verdict(scripted(1.025), wide)
    assert passed.status == "unchanged"
    assert passed.change_pct == pytest.approx(2.5, abs=0.05)
    assert case.record(scripted(1.025), tight)["run_medians_ms"] == pytest.approx([1.025], rel=1e-3)  # restarted
    assert case.record(scripted(1.0), wide)["run_medians_ms"] == pytest.approx([1.025, 1.0], rel=1e-3)


def test_in_hot_mode_the_least_noise_in_time_is_spread_over_the_calls_of_a_sample(terms: Any) -> None:
    """A graph of 64 calls a sample: 30 us a sample is 0.47 us a call, 0.05% of 1 ms, under the
    0.5% floor, so +2.5% regresses as without it."""
    case = Case()
    case.record(scripted(1.0, "cuda-graph", calls=64), terms())
    slower = scripted(1.025, "cuda-graph", calls=64)
    assert case.verdict(slower, terms(TIGHT, "--attnperf-run-noise-time=30us")).status == "regressed"


def test_run_noise_floor_is_an_option(terms: Any, pytester: pytest.Pytester) -> None:
    """One recording, 1% slower at a 0.5% tolerance: within the default 0.5% floor's bar (2.12%),
    a regression once the floor is 0; a value that is no fraction is refused, naming its source."""
    case = Case()
    case.record(scripted(1.0), terms())
    assert case.verdict(scripted(1.01), terms("--attnperf-tolerance=0.5%")).status == "unchanged"
    assert case.verdict(scripted(1.01), terms("--attnperf-tolerance=0.5%", "--attnperf-run-noise=0")).failed
    with pytest.raises(pytest.UsageError, match="bad value 'lots' from --attnperf-run-noise"):
        terms("--attnperf-run-noise=lots")


def test_the_history_keeps_five_recordings_and_their_machines(terms: Any) -> None:
    """Six recordings (the sixth on another machine): the oldest drops out of both lists."""
    case = Case()
    for machine in "AAAAAB":
        entry = case.record(scripted(1.0), terms(), machine=machine)
    assert entry["run_machines"] == ["A", "A", "A", "A", "B"]
    assert len(entry["run_medians_ms"]) == len(entry["run_overheads_ms"]) == 5
    assert case.verdict(scripted(1.0), terms()).status == "unchanged"


# -- hot samples of another length -------------------------------------------------------------


def test_hot_baseline_from_another_sample_length_is_not_compared(terms: Any) -> None:
    """A hot entry keeps its sample length; a hot run at another --attnperf-hot-sample is not gated
    against it (however slow), and recording at the new length starts the history afresh. At the
    same length a slowdown still fails. An entry without the length was taken at 0.5 ms; a length
    the file rounds is still the same length."""
    case, hot, short = Case(), terms("--attnperf-mode=hot"), terms("--attnperf-mode=hot", "--attnperf-hot-sample=0.5ms")
    assert case.record(scripted(1.0, mode="hot"), hot)["hot_sample_ms"] == 20.0  # do_bench_cudagraph's length
    assert case.verdict(scripted(1.5, mode="hot"), hot).failed
    other = case.verdict(scripted(1.5, mode="hot"), short)
    assert other.status == "not compared"
    assert "hot samples lasted about 20 ms, this run's 0.5 ms" in other.message
    entry = case.record(scripted(1.0, mode="hot"), short)  # unchanged: only the new length restarts it
    assert entry["hot_sample_ms"] == 0.5
    assert len(entry["run_medians_ms"]) == 1
    del entry["hot_sample_ms"]  # written before the option: taken at 0.5 ms, the only length then
    assert case.verdict(scripted(1.5, mode="hot"), short).failed
    older = case.verdict(scripted(1.5, mode="hot"), hot)
    assert older.status == "not compared"
    assert "hot samples lasted about 0.5 ms, this run's 20 ms" in older.message
    odd = terms("--attnperf-mode=hot", "--attnperf-hot-sample=0.1234567ms")
    assert case.record(scripted(1.0, mode="hot"), odd)["hot_sample_ms"] == 0.12346
    assert case.verdict(scripted(1.0, mode="hot"), odd).status == "unchanged"


# -- clocks -------------------------------------------------------------------------------------


def test_a_re_measurement_on_another_clock_keeps_the_first_verdict(terms: Any) -> None:
    """+10% on the baseline's clock, then the confirming measurement falls back to another clock:
    the comparable measurement's verdict stands and its note says why."""
    case = Case()
    case.record(scripted(1.0), terms())
    summary = Summary.from_mapping(case.entry or {})
    first = scripted(1.1)
    decision = policy.decide(first, case.entry, summary, terms(), Here("A", lambda: None))
    assert decision.remeasure
    fallback = scripted(1.1, "cuda-events", notes=("scripted fallback to cuda-events",))
    verdict, kept, _ = policy.decide_again(decision.verdict, first, fallback, summary, terms(), Here("A", lambda: None))
    assert verdict.status == "regressed"
    assert "REGRESSED +10.0%" in verdict.message
    assert kept.clock == "scripted"
    assert kept.notes == ("re-measuring the suspected regression fell back to the cuda-events clock (scripted "
                          "fallback to cuda-events); the scripted measurement's verdict stands",)


# -- between machines ---------------------------------------------------------------------------

ANOTHER_MACHINE = ("judged against recordings from another machine: the bar includes 0.70% "
                   "(--attnperf-machine-noise) and 2 us a sample (--attnperf-machine-offset) between machines")


def test_a_baseline_from_another_machine_allows_for_the_move_between_machines(terms: Any) -> None:
    """Three recordings on machine A; +2.5% at a 1.5% tolerance fails on A (same machine) and
    passes on B, where the between-machines term applies and the note says so. Once the history
    also holds a recording from B, its own spread covers the moves and C gets no extra term."""
    case, tight = Case(), terms(TIGHT)
    for _ in range(3):
        case.record(scripted(1.0), terms(), machine="A")
    assert case.verdict(scripted(1.025), tight, machine="A").failed
    assert policy.verdict_notes(case.verdict(scripted(1.0), tight, machine="A"), tight) == ()
    on_b = case.verdict(scripted(1.025), tight, machine="B")
    assert on_b.status == "unchanged"
    assert on_b.change_pct == pytest.approx(2.5, abs=0.05)
    assert policy.verdict_notes(on_b, tight)[0] == ANOTHER_MACHINE
    entry = case.record(scripted(1.025), terms(), machine="B")
    assert entry["run_machines"] == ["A", "A", "A", "B"]
    # on C the A+B history's own spread (sd 1.25%: bar 4.2%) judges +5%; a 5% machine term on top
    # (bar 15.6%) would pass it
    on_c = case.verdict(scripted(1.05), terms(TIGHT, "--attnperf-machine-noise=5%"), machine="C")
    assert on_c.status == "regressed"
    assert "1.25% over 4 recordings from 2 machines: beyond its 3-sigma bar of 4.19%" in on_c.message


def test_with_two_recordings_the_machine_term_follows_the_latest(terms: Any) -> None:
    """Below three recordings the centre is the latest one: recorded on A then B, a run on A is
    judged against B's recording, so the between-machines term applies; on B it does not."""
    case, tight = Case(), terms(TIGHT)
    case.record(scripted(1.0), terms(), machine="A")
    assert case.record(scripted(0.985), terms(), machine="B")["run_machines"] == ["A", "B"]
    assert case.verdict(scripted(1.01), tight, machine="A").status == "unchanged"  # +2.5% against B's 0.985
    assert case.verdict(scripted(1.01), tight, machine="B").failed


@pytest.mark.parametrize("machines", [[None, None, None], [None, "A", "A"]])
def test_recordings_of_unknown_machine_do_not_count_as_a_second_machine(
        terms: Any, machines: list[str | None]) -> None:
    """Histories from before machines were noted (all or partly unknown) are likely from one box:
    on B, +2.5% at a 1.5% tolerance still gets the between-machines term and passes."""
    case, tight = Case(), terms(TIGHT)
    for _ in range(3):
        case.record(scripted(1.0), terms(), machine="A")
    assert case.entry is not None
    case.entry["run_machines"] = machines
    on_b = case.verdict(scripted(1.025), tight, machine="B")
    assert on_b.status == "unchanged"
    assert policy.verdict_notes(on_b, tight)[0] == ANOTHER_MACHINE


@pytest.mark.parametrize(("calls", "status"), [(1, "unchanged"), (64, "regressed")])
def test_the_machine_offset_is_per_sample(terms: Any, calls: int, status: str) -> None:
    """A 10 us case 25% slower on another machine: one call a sample (cold), the 2 us offset is 20%
    of the case and the bar about 61%; 64 calls a sample (hot mode's graphs), it is 0.03 us a call
    and the bar about 3%."""
    case = Case()
    case.record(scripted(0.01, "cuda-graph", calls=calls), terms(), machine="A")
    judged = case.verdict(scripted(0.0125, "cuda-graph", calls=calls), terms(), machine="B")
    assert judged.status == status
    assert judged.change_pct == pytest.approx(25.0, abs=0.05)


def test_an_eager_timed_case_is_not_compared_against_another_machines_recordings(terms: Any) -> None:
    """A case timed with events around eager launches has the host's speed in its figure: recorded
    on A, 20% slower on B it is 'not compared', saying why; on A the same slowdown fails."""
    case = Case()
    case.record(scripted(1.0, "cuda-events"), terms(), machine="A")
    on_b = case.verdict(scripted(1.2, "cuda-events"), terms(), machine="B")
    assert on_b.status == "not compared"
    assert not on_b.failed
    assert on_b.change_pct == pytest.approx(20.0, abs=0.05)
    assert on_b.message.startswith("timed with events around eager launches (not graph-capturable), so the host's "
                                   "speed is in the figure, and the baseline's recordings come from another machine")
    assert on_b.message.endswith("record this machine (--update-baselines) to gate it here")
    assert policy.verdict_notes(on_b, terms()) == (f"not compared: {on_b.message}",)
    on_a = case.verdict(scripted(1.2, "cuda-events"), terms(), machine="A")
    assert on_a.status == "regressed"
    assert "REGRESSED +20.0%" in on_a.message


def test_an_eager_timed_case_keeps_a_history_per_machine(terms: Any) -> None:
    """Recording an eager-timed case on B after A starts B's own history instead of joining A's (a
    history from two hosts would let a third compare against their mixed centre); then B gates it
    and A does not."""
    case = Case()
    for machine in ("A", "A", "A", "B"):
        entry = case.record(scripted(1.0, "cuda-events"), terms(), machine=machine)
    assert entry["run_machines"] == ["B"]
    assert case.verdict(scripted(1.2, "cuda-events"), terms(), machine="B").failed
    assert case.verdict(scripted(1.2, "cuda-events"), terms(), machine="A").status == "not compared"


# -- the sample overheads' difference between machines ----------------------------------------

MOVED = ("judged against recordings from another machine: centre moved by this machine's sample overhead less the "
         "recordings'; the bar includes 0.70% (--attnperf-machine-noise) and 0.5 us a sample "
         "(--attnperf-machine-residual) between machines")


def test_the_overheads_difference_moves_the_centre_on_another_machine(terms: Any) -> None:
    """Two H200 hosts in small: recorded on A (overhead 3.26 us), a 60 us case reads 1.84 us longer
    on B (overhead 5.10 us). Each recording keeps its overhead; on B the centre is moved by the
    difference, the bar takes the 0.5 us residual instead of the 2 us offset, and +5% of real work
    is caught at a 1.5% tolerance (with the offset alone its bar is about 10%: it passes, as it
    does when B's overhead is not measured, or when a recording behind the centre has none)."""
    a, b, tight = Case(), Case(), terms(TIGHT)
    for case in (a, b):
        case.record(scripted(0.060, "cuda-graph-nodes"), terms(), machine="A", overhead_ms=0.00326)
    assert a.entry is not None
    assert a.entry["run_overheads_ms"] == [0.00326]
    same = scripted(0.060 + 0.00184, "cuda-graph-nodes")
    slower = scripted(0.060 * 1.05 + 0.00184, "cuda-graph-nodes")
    unmoved = a.verdict(same, tight, machine="B", overhead_ms=0.0051)
    assert unmoved.status == "unchanged"
    assert policy.verdict_notes(unmoved, tight) == (MOVED,)
    caught = b.verdict(slower, tight, machine="B", overhead_ms=0.0051)
    assert caught.status == "regressed"
    assert "REGRESSED +4.9% against the baseline" in caught.message
    assert "centre moved +1.84 us to 0.06184 ms" in caught.message
    assert "(+8.1% unmoved)" in caught.message
    assert b.verdict(slower, tight, machine="B", overhead_ms=None).status == "unchanged"  # not measured: the offset
    # a history holding a recording without an overhead behind the centre: the offset
    a.record(same, terms(), machine="A", overhead_ms=0.0051)
    assert a.record(same, terms(), machine="A", overhead_ms=None)["run_overheads_ms"] == [0.00326, 0.0051, None]
    assert a.verdict(same, tight, machine="B", overhead_ms=0.0051).status == "unchanged"
    b.record(slower, terms(), machine="A", overhead_ms=0.0051)  # +8%: a new kernel, its history restarts
    b.record(slower, terms(), machine="A", overhead_ms=None)
    assert b.entry is not None
    assert b.entry["run_overheads_ms"] == [0.0051, None]
    assert b.verdict(slower, tight, machine="B", overhead_ms=0.0051).status == "unchanged"


@pytest.mark.parametrize(("clock", "case_ms", "floor_a", "floor_b", "usable", "moved", "refused"), [
    ("cuda-graph-nodes", 0.060, 0.00326, 0.0051, True, True, None),
    ("cuda-graph", 0.060, 0.00326, 0.0051, True, False, None),  # the fallback clock: launch inside its samples
    ("cuda-graph-nodes", 0.060, 0.00326, 0.0051, False, False, None),  # B's overhead not usable (timed otherwise)
    ("cuda-graph-nodes", 0.060, 0.00326, 0.05, True, False, "more than 6 us apart"),  # an overhead gone wrong
    ("cuda-graph-nodes", 0.004, 0.0099, 0.0051, True, False, "would empty a case's centre"),
    ("cuda-graph-nodes", 0.060, 0.00326, 0.00326, True, True, None),  # equal overheads: moved by zero, residual
])
def test_the_centre_moves_only_for_a_plausible_shift_on_the_overheads_clock(
        terms: Any, clock: str, case_ms: float, floor_a: float, floor_b: float, usable: bool, moved: bool,
        refused: str | None) -> None:
    """A case recorded on A and run 5% slower on B plus B's overhead less A's: caught where the
    centre moves, inside the 2 us offset's bar (about 10% at 60 us) where it does not. The note
    says which term the bar used; a difference not used for being implausible is refused, saying
    why (the run reports it once under its summary)."""
    a, b, tight = Case(), Case(), terms(TIGHT)
    for case in (a, b):
        case.record(scripted(case_ms, clock), terms(), machine="A", overhead_ms=floor_a)
    overhead_b = floor_b if usable else None
    slower = scripted(case_ms * 1.05 + (floor_b - floor_a if moved else 0.0), clock)
    judged = a.verdict(slower, tight, machine="B", overhead_ms=overhead_b)
    other = b.verdict(scripted(case_ms, clock), tight, machine="B", overhead_ms=overhead_b)
    notes = " ".join(policy.verdict_notes(judged, tight) + policy.verdict_notes(other, tight))
    if moved:
        assert judged.status == "regressed"
        assert "--attnperf-machine-residual" in notes
        assert "--attnperf-machine-offset" not in notes
    else:
        assert judged.status == "unchanged"
        assert "2 us a sample (--attnperf-machine-offset)" in notes
        assert "centre moved" not in notes + judged.message
    assert other.status == "unchanged"
    assert bool(a.refusals) == bool(refused)
    assert all(refused in why for why in a.refusals + b.refusals) if refused else not b.refusals


def test_an_overhead_the_gate_may_not_use_is_not_recorded(terms: Any) -> None:
    """Recorded while the overhead was timed on another clock (or at a held-down clock, where
    ``AttnPerfSession.gate_overhead_ms`` gives None): the entry keeps no overhead for it."""
    assert Case().record(scripted(1.0), terms(), overhead_ms=None)["run_overheads_ms"] == [None]
