"""``attnperf``: the fixture object that times a callable, gates it and reports it."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import pytest

from . import floors
from .baselines import BaselineError
from .costs import Cost, Metrics, metrics
from .distributed import case_key, timing_turn
from .gate import HISTORY_MIN, HISTORY_ROBUST, Summary, Verdict, centre_ms, floor_shift_ms, judge
from .markers import backends_seen, cupti_attached_note, pin_backend, profile_names, prove_backend
from .processes import pool, write_taken
from .roofline import Position
from .session import AttnPerfSession, Row
from .timing import REPLAY_CLOCK, Measurement

__all__ = ["PENDING_KEY", "Perf", "PerfResult"]

PENDING_KEY = pytest.StashKey[dict[str, Any]]()
HISTORY_KEEP = HISTORY_ROBUST  # recordings of a case kept: enough for the robust spread


def _hot_sample_ms(entry: dict[str, Any]) -> float:
    """The sample length of a hot baseline entry: 0.5 ms where not written (the only length
    before ``--attnperf-hot-sample``)."""
    return float(entry.get("hot_sample_ms", 0.5))


def _other_sample(entry: dict[str, Any], sample_ms: float) -> bool:
    """Whether a hot entry was sampled at another length than ``sample_ms`` (the file keeps 5
    significant digits, so equal within that)."""
    return not math.isclose(_hot_sample_ms(entry), sample_ms, rel_tol=1e-4)


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


def _verdict_notes(verdict: Verdict, noise: float, offset_ms: float, residual_ms: float) -> tuple[str, ...]:
    """For the summary table: why a case was not compared, or that it was judged against
    another machine's recordings, with what (the same words for every such case, so the table
    prints them once; a case's own figures are in its verdict message)."""
    if verdict.status == "not compared":
        return (f"not compared: {verdict.message}",)
    against = "judged against recordings from another machine"
    if verdict.machine_shift_ms is not None:
        bar = (f"; the bar includes {100 * noise:.2f}% (--attnperf-machine-noise) and {1e3 * residual_ms:g} us a "
               "sample (--attnperf-machine-residual) between machines" if verdict.machine_noise > 0 else "")
        return (f"{against}: centre moved by this machine's sample floor less the recordings'{bar}",)
    if verdict.machine_noise <= 0:
        return ()
    offset = f" and {1e3 * offset_ms:g} us a sample (--attnperf-machine-offset)" if offset_ms > 0 else ""
    return (f"{against}: the bar includes {100 * noise:.2f}% (--attnperf-machine-noise){offset} between machines",)


@dataclass(frozen=True)
class PerfResult:
    """What one case measured: times, rates against the hardware, and the baseline verdict."""

    measurement: Measurement
    metrics: Metrics
    verdict: Verdict
    cost: Cost
    backend: str
    roofline: Position | None = None  # against the measured ceilings (see floors.check)
    floors: floors.FloorOutcome | None = None  # the test's floors judged, if it has any
    dtype: str | None = None

    @property
    def median_ms(self) -> float:
        return self.measurement.median_ms

    @property
    def tflops(self) -> float:
        return self.metrics.tflops

    @property
    def mfu(self) -> float | None:
        """Fraction of the card's peak dense FLOP/s for the dtype (None if unknown)."""
        return self.metrics.mfu

    @property
    def bandwidth_frac(self) -> float | None:
        """Fraction of the card's memory bandwidth (None if unknown)."""
        return self.metrics.bandwidth_frac

    @property
    def peak_mib(self) -> float | None:
        return self.measurement.peak_mib


class Perf:
    """Times one callable per test on the run's device and checks it against the baseline.

    ``measure(fn, cost=..., dtype=...)`` warms ``fn`` up, proves the pinned SDPA backend
    when the test carries ``sdpa_backend``, samples device time, computes TFLOP/s, MFU, GB/s
    and bandwidth from ``cost``, and fails the test when it regressed against
    ``baselines/<hw>.yaml``. With ``--update-baselines`` it records instead (the entry is
    written at the end of the session, and only if the test passed).
    """

    def __init__(self, request: pytest.FixtureRequest, session: AttnPerfSession) -> None:
        self._request = request
        self._session = session
        self._used = False
        self._key = case_key(request.node)  # the node id, less pytest-xdist's group suffix

    def measure(
        self,
        fn: Callable[[], Any],
        *,
        cost: Cost,
        dtype: str,
        detect_backend: bool = False,
        mode: str | None = None,
    ) -> PerfResult | None:
        """Measure ``fn`` (a zero-argument callable doing one call of the kernel); None under
        ``--attnperf-check-only``, which times nothing (the test's own checks have run)."""
        if self._used:
            raise RuntimeError("attnperf.measure can be called once per test (one baseline entry per test id)")
        self._used = True
        session, node = self._session, self._request.node
        if session.settings.check_only:
            session.checked_only += 1
            node.user_properties.append(("attnperf_verdict", "checked only"))
            return None
        hw, device = session.hardware, session.device
        marker = node.get_closest_marker("sdpa_backend")
        pinned = marker.args[0] if marker else None
        with timing_turn(session):  # under pytest-xdist: refused on a shared GPU, one at a time on the CPU
            result = self._timed(fn, cost, dtype, pinned, detect_backend, mode)
        self._record(result)
        verdict, measurement = result.verdict, result.measurement
        node.user_properties.extend(_junit_properties(result))  # JUnit XML; the noise benchmark reads the verdict
        self._session.measure_floor()  # once per run, outside any case's timing (here at the latest)
        self._feed_benchmark(result)
        if verdict.failed:
            drift = session.drift()
            extra = f"\n  environment differs from the baseline's: {', '.join(drift)}" if drift else ""
            unquoted = [n for n in measurement.notes if n not in verdict.message]  # "clock changed" quotes its own
            if unquoted:
                extra += "\n  notes: " + "; ".join(unquoted)
            earlier = (self._baseline_entry() or {}).get("notes")
            if isinstance(earlier, list) and earlier:
                extra += "\n  baseline notes: " + "; ".join(str(n) for n in earlier)
            below = floors.failure_message(result, floors.for_session(session))
            pytest.fail(f"{self._key}: {verdict.message}{extra}" + (f"\n{below}" if below else ""), pytrace=False)
        below = floors.failure_message(result, floors.for_session(session))
        if below:
            pytest.fail(f"{self._key}: {below}", pytrace=False)
        return result

    def _timed(self, fn: Callable[[], Any], cost: Cost, dtype: str, pinned: str | None, detect_backend: bool,
               mode: str | None) -> PerfResult:
        """Prove the backend, time, gate, and place the case on the roofline."""
        session, node = self._session, self._request.node
        device = session.device
        with pin_backend(pinned) if pinned else nullcontext():
            if pinned:
                backend = pinned
                prove_backend(fn, pinned, device)
            elif detect_backend:
                seen = backends_seen(*profile_names(fn, device))
                backend = "+".join(sorted(seen)) or "-"
            else:
                backend = "-"
            plan = session.plan(mode)
            measurement = self._pooled(session.timer.measure(fn, plan))
            if not measurement.median_ms > 0:
                pytest.fail(f"{self._key}: the {measurement.clock} clock measured a median of "
                            f"{measurement.median_ms} ms; a time must be positive (did the callable "
                            "do any work?). Nothing is gated or recorded.", pytrace=False)
            verdict, measurement = self._gate(fn, measurement, plan)
        attached = cupti_attached_note() if device.is_gpu else None  # about every measurement taken
        if attached:
            measurement = replace(measurement, notes=measurement.notes + (attached,))

        result = PerfResult(
            measurement=measurement,
            metrics=metrics(cost, measurement.median_ms / 1e3, *floors.rate_peaks(session, dtype)),
            verdict=verdict,
            cost=cost,
            backend=backend,
        )
        result = floors.check(node, session, result, dtype)  # roofline position and floors, JUnit properties
        return result

    def _gate(self, fn: Callable[[], Any], measurement: Measurement, plan: Any) -> tuple[Verdict, Measurement]:
        session = self._session
        problem = None
        try:
            baseline = session.baseline
        except BaselineError as exc:
            problem = f"{exc}\nNothing was written; fix or remove the file."
        if problem is not None:
            pytest.fail(problem, pytrace=False)
        if session.settings.worker_out is not None:
            return Verdict("worker", None, "measured for the main run's --attnperf-processes; not gated"), measurement
        if session.settings.update_baselines:
            return Verdict("recorded", None, "recorded for --update-baselines"), measurement
        if baseline and self._key in baseline.unusable:  # costs this case only
            pytest.fail(f"{baseline.unusable[self._key].problem}\nRecord the case again with "
                        "--update-baselines, or fix the entry.", pytrace=False)
        entry = baseline.entries.get(self._key) if baseline else None
        if entry is not None and entry.get("mode") != measurement.mode:  # the run's choice (--attnperf-mode)
            return Verdict(
                "not compared", None,
                f"baseline measured as {entry.get('mode')}/{entry.get('clock')}, this run as "
                f"{measurement.mode}/{measurement.clock}: times are not comparable",
            ), measurement
        if entry is not None and entry.get("clock") != measurement.clock:  # the kernel's doing: fail
            return _clock_changed(entry.get("clock"), measurement), measurement
        if entry is not None and measurement.mode == "hot" and _other_sample(entry, plan.hot_sample_ms):
            return Verdict(
                "not compared", None,
                f"baseline's hot samples lasted about {_hot_sample_ms(entry):g} ms, this run's "
                f"{plan.hot_sample_ms:g} ms (--attnperf-hot-sample): a short kernel's time per call can "
                "depend on how many calls a graph holds, so times are not comparable",
            ), measurement
        summary = baseline.summary(self._key) if baseline else None
        if summary is None and session.settings.require_baseline:
            pytest.fail(
                f"{self._key}: no entry in {session.baseline_path} and "
                "--attnperf-require-baseline is set; record it with --update-baselines",
                pytrace=False,
            )
        tolerance, floor = session.settings.tolerance, session.settings.run_noise
        if summary is not None and measurement.clock == "cuda-events" and not self._all_from_here(summary):
            return Verdict(
                "not compared", measurement.median_ms / centre_ms(summary),
                "timed with events around eager launches (not graph-capturable), so the host's speed "
                "is in the figure, and the baseline's recordings come from another machine: a slower "
                "host cannot be told from a slower kernel; record this machine (--update-baselines) "
                "to gate it here",
            ), measurement
        machine = self._machine_terms(summary, measurement)
        floor_ms = self._noise_floor_ms(measurement)
        verdict = judge(measurement.summary, summary, tolerance, floor, *machine, noise_floor_ms=floor_ms)
        if verdict.failed:  # a suspected regression is measured once more before the verdict
            again = self._pooled(session.timer.measure(fn, plan))
            if again.clock != measurement.clock:  # not comparable: the first verdict stands
                note = (f"re-measuring the suspected regression fell back to the {again.clock} clock "
                        f"({'; '.join(again.notes) or 'no reason given'}); the {measurement.clock} "
                        "measurement's verdict stands")
                return verdict, replace(measurement, notes=measurement.notes + (note,))
            second = judge(again.summary, summary, tolerance, floor, *machine, noise_floor_ms=floor_ms)
            note = f"re-measured after a suspected regression ({verdict.change_pct:+.1f}% first)"
            return second, replace(again, notes=again.notes + (note,))
        return verdict, measurement

    def _pooled(self, measurement: Measurement) -> Measurement:
        """In a worker, the measurement as taken, also written to the worker's file; in a run
        with worker processes, pooled with their samples of this case (``processes.pool``)."""
        session, nodeid = self._session, self._key
        if session.settings.worker_out is not None:
            write_taken(session.settings.worker_out, nodeid, measurement)
            return measurement
        taken = session.pool_for(nodeid)
        return pool(measurement, taken) if taken else measurement

    def _record(self, result: PerfResult) -> None:
        m, s = result.measurement, result.measurement.summary
        before = self._baseline_entry()
        if self._session.settings.update_baselines:  # the entry is written only then
            self._request.node.stash[PENDING_KEY] = self._entry(result, before)
        eager_change = None
        if m.eager_ms is not None and before and isinstance(before.get("eager_ms"), (int, float)) \
                and before["eager_ms"] > 0:  # never divide by a bad entry's time
            eager_change = 100.0 * (m.eager_ms / before["eager_ms"] - 1.0)
        self._session.rows.append(
            Row(
                nodeid=self._key,
                backend=result.backend,
                median_ms=s.median_ms,
                stdrel=s.stdrel,
                tflops=result.tflops,
                mfu=result.mfu,
                gb_per_s=result.metrics.gb_per_s,
                bandwidth_frac=result.bandwidth_frac,
                peak_mib=m.peak_mib,
                eager_ms=m.eager_ms,
                intensity=result.metrics.intensity_flop_per_byte,
                bound=result.roofline.bound if result.roofline else result.metrics.bound,
                status=result.verdict.status,
                change_pct=result.verdict.change_pct,
                eager_change_pct=eager_change,
                notes=m.notes + _verdict_notes(result.verdict, *self._machine_terms_set()) + floors.notes(result),
                roofline_frac=result.roofline.fraction if result.roofline else None,
                ceilings=floors.for_session(self._session),
                params=_case_params(self._request.node, result.cost),
            )
        )

    def _entry(self, result: PerfResult, before: dict[str, Any] | None) -> dict[str, Any]:
        """The baseline entry ``--update-baselines`` writes for this case."""
        m, s = result.measurement, result.measurement.summary
        entry: dict[str, Any] = {
            "median_ms": s.median_ms,
            "ci_low_ms": s.ci_low_ms,
            "ci_high_ms": s.ci_high_ms,
            "stdrel": s.stdrel,
            "n_samples": s.n_samples,
            "tflops": result.tflops,
            "gb_per_s": result.metrics.gb_per_s,
            "clock": m.clock,
            "mode": m.mode,
            "backend": result.backend,
        }
        if m.mode == "hot":  # a hot figure is comparable only at the same sample length (see _gate)
            entry["hot_sample_ms"] = self._session.settings.hot_sample_ms
        if m.peak_mib is not None:
            entry["peak_mib"] = m.peak_mib
        if m.eager_ms is not None:
            entry["eager_ms"] = m.eager_ms
        if m.notes:  # how it was measured (throttled clocks, eager fallback): kept with the figure
            entry["notes"] = list(m.notes)
        entry["run_medians_ms"], entry["run_machines"], entry["run_floors_ms"] = self._history(before, m)
        return entry

    def _history(
        self, before: dict[str, Any] | None, m: Measurement,
    ) -> tuple[list[float], list[str | None], list[float | None]]:
        """The medians of this case's recordings, this one last, the machine of each and its
        sample floor (``AttnPerfSession.gate_floor_ms``; None where not measured or not usable): the
        earlier ones are kept (up to ``HISTORY_KEEP``) while the case was measured the same way
        and the gate, judging this recording against them, found no real change; a change it
        calls regressed or improved (beyond the tolerance *and* the noise bar: a new kernel)
        starts the history afresh, since the old recordings no longer describe the kernel.

        A change beyond the tolerance alone is not enough: at a tight tolerance (1.5%) the
        medians of an unchanged ~10 us kernel move that much between runs, and restarting on
        them left such cases with one recording, gated on the noise floor alone."""
        median_ms, here = m.summary.median_ms, self._session.machine  # > 0: measure() saw to it
        floor_ms = self._session.gate_floor_ms()
        fresh: tuple[list[float], list[str | None], list[float | None]] = [median_ms], [here], [floor_ms]
        if not before or (before.get("mode"), before.get("clock")) != (m.mode, m.clock):
            return fresh
        if m.mode == "hot" and _other_sample(before, self._session.settings.hot_sample_ms):
            return fresh
        try:
            earlier = Summary.from_mapping(before)
        except (KeyError, TypeError, ValueError):
            return fresh
        if m.clock == "cuda-events" and not self._all_from_here(earlier):  # per machine: see _gate
            return fresh
        settings = self._session.settings
        judged = judge(m.summary, earlier, settings.tolerance, settings.run_noise,
                       *self._machine_terms(earlier, m), noise_floor_ms=self._noise_floor_ms(m))
        if judged.status in ("regressed", "improved"):
            return fresh
        if earlier.run_medians_ms:
            runs, machines, floors = (list(earlier.run_medians_ms), list(earlier.run_machines),
                                      list(earlier.run_floors_ms))
        else:  # an entry from before histories: its median, machine unknown
            runs, machines, floors = [earlier.median_ms], [None], [None]
        keep = slice(-HISTORY_KEEP, None)
        return [*runs, median_ms][keep], [*machines, here][keep], [*floors, floor_ms][keep]

    @staticmethod
    def _centre_machines(baseline: Summary) -> tuple[str | None, ...]:
        """The machines of the recordings behind ``baseline``'s centre: with fewer than
        ``HISTORY_MIN`` the centre is the latest recording, else the median of them all."""
        machines = baseline.run_machines
        return machines[-1:] if len(baseline.run_medians_ms) < HISTORY_MIN else machines

    def _all_from_here(self, baseline: Summary) -> bool:
        """Whether every recording behind ``baseline``'s centre is from this machine. A case timed
        with events around eager launches has the host's speed in its figure (fla's naive GDN
        moved -22% to +78% between H200 hosts), so it is compared only with such a baseline, and
        its recordings on another machine start a history of their own."""
        return set(self._centre_machines(baseline)) == {self._session.machine}

    def _machine_terms_set(self) -> tuple[float, float, float]:
        settings = self._session.settings
        return settings.machine_noise, settings.machine_offset_ms, settings.machine_residual_ms

    def _machine_terms(
        self, baseline: Summary | None, measurement: Measurement,
    ) -> tuple[float, float, float | None]:
        """The between-machines terms for judging against ``baseline`` (see ``gate.judge``):
        ``(--attnperf-machine-noise, fixed ms per call, known shift in ms or None)``, else
        ``(0, 0, None)``.

        With fewer than ``HISTORY_MIN`` recordings the centre is the latest one, so the terms
        apply unless it is known to come from this machine; with more, the centre is their
        median, and they apply unless one of them is from this machine or they come from two or
        more known machines (their own spread then shows the moves). Recordings of unknown
        machine (made before machines were noted) are likely from one box, so they do not make a
        second machine here (``run_noise`` still counts them as one for its spread).

        The fixed part: where ``_floor_shift`` knows the move, it is the shift and
        ``--attnperf-machine-residual`` the fixed term; else ``--attnperf-machine-offset``, a
        cost paid once per sample, so a graph of N calls, hot mode's, spreads it over N."""
        if baseline is None:
            return 0.0, 0.0, None
        behind = self._centre_machines(baseline)
        if self._session.machine in behind or len(set(behind) - {None}) >= 2:
            return 0.0, 0.0, None
        noise, offset_ms, residual_ms = self._machine_terms_set()
        shift_ms = self._floor_shift(baseline, measurement)
        if shift_ms is not None:
            return noise, residual_ms, shift_ms
        return noise, offset_ms / _calls_a_sample(measurement), None

    def _noise_floor_ms(self, measurement: Measurement) -> float:
        """``--attnperf-run-noise-time`` a call: measured on cold samples (one call each), it is
        taken, like the offset, as a time a sample, so a graph of N calls spreads it over N."""
        return self._session.settings.run_noise_time_ms / _calls_a_sample(measurement)

    def _floor_shift(self, baseline: Summary, measurement: Measurement) -> float | None:
        """The floors' difference to move the baseline's centre by (``gate.floor_shift_ms``:
        this run's ``AttnPerfSession.gate_floor_ms``, timed as cold cases are and clocks not
        held down, less the recordings'), for a case timed that way too (cold,
        ``cuda-graph-nodes``); None when the case is timed otherwise, a floor is missing or the
        difference is implausible, which the run's summary then reports once."""
        if measurement.mode != "cold" or measurement.clock != "cuda-graph-nodes":
            return None
        shift_ms, refused = floor_shift_ms(baseline, self._session.gate_floor_ms())
        if refused:
            self._session.floor_refusals.add(refused)
        return shift_ms

    def _baseline_entry(self) -> dict[str, Any] | None:
        try:
            baseline = self._session.baseline
        except BaselineError:
            return None
        return baseline.entries.get(self._key) if baseline else None

    def _feed_benchmark(self, result: PerfResult) -> None:
        """Hand the device samples to pytest-benchmark (its timer is ``REPLAY_CLOCK``)."""
        config = self._request.config
        if not config.pluginmanager.hasplugin("benchmark"):
            return
        bench = self._request.getfixturevalue("benchmark")
        bench.extra_info.update(
            {
                "attnperf_clock": result.measurement.clock,
                "attnperf_mode": result.measurement.mode,
                "attnperf_graphs": result.measurement.graphs,  # cold graphs sampled in turn
                "attnperf_processes": result.measurement.processes,  # processes pooled (--attnperf-processes)
                "attnperf_process_medians_ms": list(result.measurement.process_medians_ms),  # this one first
                "backend": result.backend,
                "tflops": result.tflops,
                "mfu": result.mfu,
                "gb_per_s": result.metrics.gb_per_s,
                "bandwidth_frac": result.bandwidth_frac,
                "intensity_flop_per_byte": result.metrics.intensity_flop_per_byte,
                "ridge_flop_per_byte": result.metrics.ridge_flop_per_byte,
                "peak_mib": result.peak_mib,
                "eager_ms": result.measurement.eager_ms,
                "verdict": result.verdict.status,
                "attnperf_machine": self._session.machine,
                "attnperf_floor_ms": self._session.measure_floor()[0],  # cold, one call a sample
                "attnperf_gate_floor_ms": self._session.gate_floor_ms(),  # the same, if the gate may use it
                "family": _family(self._request.node),
                "flops": result.cost.flops,
                "bytes": result.cost.bytes,
                "baseline_ms": _baseline_ms(result),  # the centre the verdict compared against
                "change_pct": result.verdict.change_pct,
            }
        )
        bench.extra_info.update(floors.extra_info(result))  # roofline position, ceilings and floors
        rounds = REPLAY_CLOCK.load(result.measurement.samples_ms)
        try:
            bench.pedantic(REPLAY_CLOCK.step, rounds=rounds, iterations=1, warmup_rounds=0)
        finally:
            REPLAY_CLOCK.finish()


def _case_params(node: Any, cost: Cost) -> dict[str, Any]:
    """The test's parameters and sweep marker as plain data, for the report."""
    from .reportgen import case_params

    callspec = getattr(node, "callspec", None)
    mark = node.get_closest_marker("attnperf_sweep")
    sweep = (str(mark.args[0]), str(mark.kwargs.get("axis", "seq"))) if mark and mark.args else None
    return case_params(callspec.params if callspec else {}, sweep, cost)


def _family(node: Any) -> str | None:
    """The family of the test's ``kernel`` parameter, if it has one."""
    callspec = getattr(node, "callspec", None)
    return getattr(callspec.params.get("kernel"), "family", None) if callspec else None


def _baseline_ms(result: PerfResult) -> float | None:
    """The baseline time the verdict compared the median against (None when it compared none)."""
    ratio = result.verdict.ratio
    return result.median_ms / ratio if ratio else None


def _junit_properties(result: PerfResult) -> list[tuple[str, str]]:
    """The case's figures as JUnit XML properties (``attnperf_*``); those not known are left out."""
    figures = {
        "median_ms": result.median_ms, "baseline_ms": _baseline_ms(result),
        "change_pct": result.verdict.change_pct, "tflops": result.tflops, "mfu": result.mfu,
    }
    found = [(f"attnperf_{name}", f"{value:.6g}") for name, value in figures.items() if value is not None]
    return [*found, ("attnperf_verdict", result.verdict.status)]


def _calls_a_sample(measurement: Measurement) -> int:
    """Calls in one sample: hot mode's graph of N calls (clock ``cuda-graph``) holds N; each
    other clock's sample holds one call (``cuda-graph-replays`` replays a one-call graph N
    times, each replay paying its own launch)."""
    return max(1, measurement.calls_per_sample) if measurement.clock == "cuda-graph" else 1
