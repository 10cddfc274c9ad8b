"""The gate's policy: from a measurement, its baseline entry and the gate's terms, the verdict,
whether to measure once more, and the recording history to write. Pure: no pytest, no device.

The fixture (``pytest_attnperf.fixture``) times the case and asks ``decide``; on ``remeasure`` it
times the case again and asks ``decide_again``; when recording it asks ``history``. Every rule
that turns numbers into a verdict lives here, so each is tested with plain numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from pytest_attnperf.gate.verdict import (
    HISTORY_MIN,
    HISTORY_ROBUST,
    Verdict,
    centre_ms,
    judge,
    overhead_shift_ms,
)
from pytest_attnperf.measure.contention import CONTENDED
from pytest_attnperf.measure.sampling import Measurement
from pytest_attnperf.measure.summary import Summary

__all__ = ["HISTORY_KEEP", "Decision", "GateTerms", "Here", "RecordingRuns", "decide", "decide_again", "history",
           "verdict_notes"]

HISTORY_KEEP = HISTORY_ROBUST  # recordings of a case kept: enough for the robust spread


@dataclass(frozen=True)
class GateTerms:
    """The gate's settings, read once from the options (see ``Settings``)."""

    tolerance: float  # --attnperf-tolerance, a fraction
    run_noise: float  # --attnperf-run-noise, the least run-to-run sd of a median, a fraction
    run_noise_time_ms: float  # --attnperf-run-noise-time, the same as a time a sample
    machine_noise: float  # --attnperf-machine-noise, a fraction
    machine_offset_ms: float  # --attnperf-machine-offset, a time a sample
    machine_residual_ms: float  # --attnperf-machine-residual, a time a sample
    hot_sample_ms: float  # --attnperf-hot-sample: hot figures compare only at one sample length
    require_baseline: bool = False  # --attnperf-require-baseline

    @classmethod
    def from_settings(cls, settings: Any) -> GateTerms:
        """The terms of a ``Settings``."""
        return cls(
            tolerance=settings.tolerance, run_noise=settings.run_noise, run_noise_time_ms=settings.run_noise_time_ms,
            machine_noise=settings.machine_noise, machine_offset_ms=settings.machine_offset_ms,
            machine_residual_ms=settings.machine_residual_ms, hot_sample_ms=settings.hot_sample_ms,
            require_baseline=settings.require_baseline,
        )


@dataclass(frozen=True)
class Here:
    """What the gate knows of the machine it runs on."""

    machine: str  # this machine's name in the recording histories
    overhead_ms: Callable[[], float | None]  # the run's sample overhead as the gate may use it, measured on first need


class RecordingRuns(NamedTuple):
    """A recording's history: its medians, the machine and sample overhead of each, this one last."""

    medians_ms: list[float]
    machines: list[str | None]
    overheads_ms: list[float | None]
    refusal: str | None = None  # why the sample overheads' difference was not used in judging it


@dataclass(frozen=True)
class Decision:
    """The gate's answer for one measurement."""

    verdict: Verdict
    remeasure: bool = False  # a suspected regression: time the case once more, then ``decide_again``
    missing: bool = False  # no baseline entry while --attnperf-require-baseline is set: the case fails
    refusal: str | None = None  # why the sample overheads' difference was not used (for the run's summary)


def _hot_sample_ms(entry: Mapping[str, Any]) -> float:
    """The sample length of a hot baseline entry: 0.5 ms where not written (the only length
    before ``--attnperf-hot-sample``)."""
    return float(entry.get("hot_sample_ms", 0.5))


def _other_sample(entry: Mapping[str, Any], sample_ms: float) -> bool:
    """Whether a hot entry was sampled at another length than ``sample_ms`` (the file keeps 5
    significant digits, so equal within that)."""
    return not math.isclose(_hot_sample_ms(entry), sample_ms, rel_tol=1e-4)


def _calls_a_sample(measurement: Measurement) -> int:
    """Calls in one sample: hot mode's graph of N calls (clock ``cuda-graph``) holds N; each
    other clock's sample holds one call (``cuda-graph-replays`` replays a one-call graph N
    times, each replay paying its own launch)."""
    return max(1, measurement.calls_per_sample) if measurement.clock == "cuda-graph" else 1


def _clock_changed(baseline_clock: Any, measurement: Measurement) -> Verdict:
    """A failing verdict for a case whose baseline was timed with another clock in the same
    mode: the kernel changed how it can be timed (typically it stopped being graph-capturable),
    which no tolerance can judge, so it is never passed silently."""
    why = "; ".join(measurement.notes) or "no reason given"
    return Verdict(
        "clock changed", None,
        f"CLOCK CHANGED: the baseline was timed with the {baseline_clock} clock, this run with the "
        f"{measurement.clock} clock ({why}), so the times are not comparable and the case cannot be "
        f"gated (this run: {measurement.summary.describe()}). If the kernel is meant to be timed "
        "this way now, re-record it with --update-baselines.",
    )


def _contended(measurement: Measurement) -> str | None:
    """The host timer's note that the host was contended while it sampled (``measure.contention``),
    for a host-clock measurement; None otherwise, and for every device clock."""
    if measurement.clock != "host":
        return None
    return next((note for note in measurement.notes if note.startswith(CONTENDED)), None)


def _unjudged(note: str, measurement: Measurement, baseline: Summary, terms: GateTerms) -> Verdict:
    """The verdict of a host-clock case timed on a contended host: its samples hold other work's
    time slices (scheduler ticks), so against the baseline they say nothing of the kernel,
    neither a regression to fail nor an unchanged case to pass as such. It passes, counted as
    unjudged in the run's last line, unless ``--attnperf-require-baseline`` (what CI runs with)
    asks that every case be judged: then it fails."""
    required = terms.require_baseline
    return Verdict(
        "unjudged", measurement.median_ms / centre_ms(baseline),
        f"UNJUDGED: {note}, so the host clock timed other work too and the case is not judged "
        f"against its baseline (this run: {measurement.summary.describe()}); rerun it on an idle host"
        + ("; --attnperf-require-baseline is set, so a case the gate could not judge fails" if required else ""),
        required=required,
    )


def _centre_machines(baseline: Summary) -> tuple[str | None, ...]:
    """The machines of the recordings behind ``baseline``'s centre: with fewer than
    ``HISTORY_MIN`` the centre is the latest recording, else the median of them all."""
    machines = baseline.run_machines
    return machines[-1:] if len(baseline.run_medians_ms) < HISTORY_MIN else machines


def _all_from_here(baseline: Summary, here: Here) -> bool:
    """Whether every recording behind ``baseline``'s centre is from this machine. A case timed
    with events around eager launches has the host's speed in its figure, so it is compared
    only with such a baseline, and its recordings on another machine start a history of their
    own (docs/gate.md, "Between machines")."""
    return set(_centre_machines(baseline)) == {here.machine}


def _overhead_shift(baseline: Summary, measurement: Measurement, here: Here) -> tuple[float | None, str | None]:
    """The sample overheads' difference to move the baseline's centre by (``verdict.overhead_shift_ms``: this
    run's gate floor less the recordings'), for a case timed as the floor is (cold,
    ``cuda-graph-nodes``), and why it was refused; ``(None, None)`` for a case timed otherwise."""
    if measurement.mode != "cold" or measurement.clock != "cuda-graph-nodes":
        return None, None
    return overhead_shift_ms(baseline, here.overhead_ms())


def _machine_terms(baseline: Summary | None, measurement: Measurement, terms: GateTerms,
                   here: Here) -> tuple[tuple[float, float, float | None], str | None]:
    """The between-machines terms for judging against ``baseline`` (see ``verdict.judge``):
    ``(--attnperf-machine-noise, fixed ms per call, known shift in ms or None)``, else
    ``(0, 0, None)``; and why the floors' shift was refused, if it was.

    With fewer than ``HISTORY_MIN`` recordings the centre is the latest one, so the terms
    apply unless it is known to come from this machine; with more, the centre is their
    median, and they apply unless one of them is from this machine or they come from two or
    more known machines (their own spread then shows the moves). Recordings of unknown
    machine are likely from one box, so they do not make a second machine here.

    The fixed part: where the sample overheads give the move, it is the shift and
    ``--attnperf-machine-residual`` the fixed term; else ``--attnperf-machine-offset``, a
    cost paid once per sample, so a graph of N calls, hot mode's, spreads it over N."""
    if baseline is None:
        return (0.0, 0.0, None), None
    behind = _centre_machines(baseline)
    if here.machine in behind or len(set(behind) - {None}) >= 2:
        return (0.0, 0.0, None), None
    shift_ms, refused = _overhead_shift(baseline, measurement, here)
    if shift_ms is not None:
        return (terms.machine_noise, terms.machine_residual_ms, shift_ms), refused
    return (terms.machine_noise, terms.machine_offset_ms / _calls_a_sample(measurement), None), refused


def _least_noise_ms(measurement: Measurement, terms: GateTerms) -> float:
    """``--attnperf-run-noise-time`` a call: measured on cold samples (one call each), it is
    taken, like the offset, as a time a sample, so a graph of N calls spreads it over N."""
    return terms.run_noise_time_ms / _calls_a_sample(measurement)


def _judge(measurement: Measurement, summary: Summary | None, terms: GateTerms,
           here: Here) -> tuple[Verdict, str | None]:
    machine, refused = _machine_terms(summary, measurement, terms, here)
    verdict = judge(measurement.summary, summary, terms.tolerance, terms.run_noise, *machine,
                    least_noise_ms=_least_noise_ms(measurement, terms))
    return verdict, refused


def decide(measurement: Measurement, entry: Mapping[str, Any] | None, summary: Summary | None,
           terms: GateTerms, here: Here) -> Decision:
    """The verdict on ``measurement`` against its baseline ``entry`` (``summary``: the entry read
    as a ``Summary``; both None without one)."""
    if entry is not None and entry.get("mode") != measurement.mode:  # the run's choice (--attnperf-mode)
        return Decision(Verdict(
            "not compared", None,
            f"baseline measured as {entry.get('mode')}/{entry.get('clock')}, this run as "
            f"{measurement.mode}/{measurement.clock}: times are not comparable",
        ))
    if entry is not None and entry.get("clock") != measurement.clock:  # the kernel's doing: fail
        return Decision(_clock_changed(entry.get("clock"), measurement))
    if entry is not None and measurement.mode == "hot" and _other_sample(entry, terms.hot_sample_ms):
        return Decision(Verdict(
            "not compared", None,
            f"baseline's hot samples lasted about {_hot_sample_ms(entry):g} ms, this run's "
            f"{terms.hot_sample_ms:g} ms (--attnperf-hot-sample): a short kernel's time per call can "
            "depend on how many calls a graph holds, so times are not comparable",
        ))
    if summary is None and terms.require_baseline:
        return Decision(Verdict("new", None, "no baseline entry"), missing=True)
    contended = _contended(measurement)
    if summary is not None and contended is not None:  # a failing case on a busy CPU: not the kernel's doing
        return Decision(_unjudged(contended, measurement, summary, terms))
    if summary is not None and measurement.clock == "cuda-events" and not _all_from_here(summary, here):
        return Decision(Verdict(
            "not compared", measurement.median_ms / centre_ms(summary),
            "timed with events around eager launches (not graph-capturable), so the host's speed "
            "is in the figure, and the baseline's recordings come from another machine: a slower "
            "host cannot be told from a slower kernel; record this machine (--update-baselines) "
            "to gate it here",
        ))
    verdict, refused = _judge(measurement, summary, terms, here)
    return Decision(verdict, remeasure=verdict.failed, refusal=refused)


def decide_again(first: Verdict, measurement: Measurement, again: Measurement, summary: Summary | None,
                 terms: GateTerms, here: Here) -> tuple[Verdict, Measurement, str | None]:
    """The verdict after a suspected regression was measured once more: the second
    measurement's, noted as such; or, where it fell back to another clock, the first's."""
    if again.clock != measurement.clock:  # not comparable: the first verdict stands
        note = (f"re-measuring the suspected regression fell back to the {again.clock} clock "
                f"({'; '.join(again.notes) or 'no reason given'}); the {measurement.clock} "
                "measurement's verdict stands")
        return first, replace(measurement, notes=(*measurement.notes, note)), None
    contended = _contended(again)
    if summary is not None and contended is not None:
        return _unjudged(contended, again, summary, terms), again, None
    second, refused = _judge(again, summary, terms, here)
    note = f"re-measured after a suspected regression ({first.change_pct:+.1f}% first)"
    return second, replace(again, notes=(*again.notes, note)), refused


def history(before: Mapping[str, Any] | None, m: Measurement, terms: GateTerms, here: Here) -> RecordingRuns:
    """The medians of a case's recordings, this one last, the machine of each and its sample
    floor (None where not measured or not usable): the earlier ones are kept (up to
    ``HISTORY_KEEP``) while the case was measured the same way and the gate, judging this
    recording against them, found no real change; a change it calls regressed or improved
    (beyond the tolerance *and* the noise bar: a new kernel) starts the history afresh, since
    the old recordings no longer describe the kernel.

    A change beyond the tolerance alone is not enough: at a tight tolerance the medians of an
    unchanged short kernel move that much between runs, and restarting on them would leave
    such cases with one recording, gated on the noise floor alone."""
    median_ms, floor_ms = m.summary.median_ms, here.overhead_ms()
    fresh = RecordingRuns([median_ms], [here.machine], [floor_ms])
    if not before or (before.get("mode"), before.get("clock")) != (m.mode, m.clock):
        return fresh
    if m.mode == "hot" and _other_sample(before, terms.hot_sample_ms):
        return fresh
    try:
        earlier = Summary.from_mapping(before)
    except (KeyError, TypeError, ValueError):
        return fresh
    if m.clock == "cuda-events" and not _all_from_here(earlier, here):  # per machine: see decide
        return fresh
    judged, refused = _judge(m, earlier, terms, here)
    if judged.status in ("regressed", "improved"):
        return fresh._replace(refusal=refused)
    if earlier.run_medians_ms:
        runs, machines, floors = (list(earlier.run_medians_ms), list(earlier.run_machines),
                                  list(earlier.run_overheads_ms))
    else:  # an entry without a history: its median, machine unknown
        runs, machines, floors = [earlier.median_ms], [None], [None]
    keep = slice(-HISTORY_KEEP, None)
    return RecordingRuns([*runs, median_ms][keep], [*machines, here.machine][keep], [*floors, floor_ms][keep], refused)


def verdict_notes(verdict: Verdict, terms: GateTerms) -> tuple[str, ...]:
    """For the summary table: why a case was not compared or not judged; that it was judged against another
    machine's recordings, with what (the same words for every such case, so the table prints
    them once); and why a change beyond the tolerance was judged unchanged (the case's own
    figures; its others are in its verdict message)."""
    if verdict.status == "not compared":
        return (f"not compared: {verdict.message}",)
    if verdict.status == "unjudged":  # the measurement's own note names the signals, case by case
        return ("unjudged: host-clock times taken on a contended host are not judged against the baseline; "
                "rerun on an idle host",)
    held = (f"unchanged: {verdict.held}",) if verdict.held else ()
    return _machine_notes(verdict, terms) + held


def _machine_notes(verdict: Verdict, terms: GateTerms) -> tuple[str, ...]:
    """The note of a verdict judged against another machine's recordings, with what the bar holds."""
    noise, offset_ms, residual_ms = terms.machine_noise, terms.machine_offset_ms, terms.machine_residual_ms
    against = "judged against recordings from another machine"
    if verdict.machine_shift_ms is not None:
        bar = (f"; the bar includes {100 * noise:.2f}% (--attnperf-machine-noise) and {1e3 * residual_ms:g} us a "
               "sample (--attnperf-machine-residual) between machines" if verdict.machine_noise > 0 else "")
        return (f"{against}: centre moved by this machine's sample overhead less the recordings'{bar}",)
    if verdict.machine_noise <= 0:
        return ()
    offset = f" and {1e3 * offset_ms:g} us a sample (--attnperf-machine-offset)" if offset_ms > 0 else ""
    return (f"{against}: the bar includes {100 * noise:.2f}% (--attnperf-machine-noise){offset} between machines",)
