"""``attnperf``: the fixture object that times a callable, gates it and reports it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Protocol

import pytest

from pytest_attnperf import floors
from pytest_attnperf.costs import Cost, metrics
from pytest_attnperf.families.memory import bound_for
from pytest_attnperf.gate import physics, policy
from pytest_attnperf.gate.drift import DriftNote
from pytest_attnperf.gate.memory import MemoryCheck, Tolerance, against_baseline, against_bound
from pytest_attnperf.gate.verdict import Verdict
from pytest_attnperf.markers import backends_seen, pin_backend, profile_names, prove_backend
from pytest_attnperf.measure import inventory
from pytest_attnperf.measure.pooling import Taken, pool, write_taken
from pytest_attnperf.measure.profiled import cupti_attached_note
from pytest_attnperf.measure.timing import REPLAY_CLOCK, Measurement
from pytest_attnperf.measure.verify import Draws, TimedDiffers, raised_as_differing
from pytest_attnperf.outcome import PerfResult, Row
from pytest_attnperf.parallel.fleet import case_key, timing_turn
from pytest_attnperf.report.params import case_params
from pytest_attnperf.session import AttnPerfSession
from pytest_attnperf.store.baselines import BaselineError, entry_problem, rounded

__all__ = ["PENDING_KEY", "VERIFY_S_KEY", "CaseHistory", "Perf", "PoolSamples"]

PENDING_KEY = pytest.StashKey[dict[str, Any]]()
VERIFY_S_KEY = pytest.StashKey[float]()  # host seconds a test's timers spent checking their timed draws
RECORD_TRIES = 3  # measurements a recording takes before it refuses to write an entry the reader would refuse



def _raised_inside(fn: Callable[[], Any], exc: BaseException) -> bool:
    """Whether ``exc`` was raised from inside a call of ``fn`` (its code is on the traceback): the
    kernel's skip in a timed call, not the timer's."""
    call = fn if hasattr(fn, "__code__") else type(fn).__call__
    code = getattr(call, "__code__", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False

class PoolSamples(Protocol):
    """What ``Perf`` asks of the run's pool runs (``plugins.pool.PoolRuns``)."""

    def settle(self) -> None:
        """Return once every pool run has exited: no other process on the GPU."""

    def for_case(self, key: str) -> list[Taken]:
        """The pool runs' measurements of the case."""


class CaseHistory(Protocol):
    """What ``Perf`` asks of the run history (``plugins.history.HistoryRecorder``)."""

    def record(self, key: str, result: PerfResult) -> DriftNote | None:
        """The case's drift on its history plus this run (None: none), and its record appended."""


class Perf:
    """Times one callable per test on the run's device and checks it against the baseline.

    ``measure(fn, cost=..., dtype=...)`` warms ``fn`` up, proves the pinned SDPA backend
    when the test carries ``attnperf_sdpa_backend``, samples device time, computes TFLOP/s, MFU, GB/s
    and bandwidth from ``cost``, and fails the test when it regressed against
    ``baselines/<hw>.yaml``. With ``--update-baselines`` it records instead (the entry is
    written at the end of the session, and only if the test passed). ``pool_runs`` and
    ``history`` are the run's plugins of those names, where it has them.
    """

    def __init__(self, request: pytest.FixtureRequest, session: AttnPerfSession, pool_runs: PoolSamples | None = None,
                 history: CaseHistory | None = None) -> None:
        self._request = request
        self._session = session
        self._pool_runs = pool_runs
        self._history = history
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
        session.hardware  # noqa: B018 - the card is resolved (a --hw mismatch raised) before anything is timed
        marker = node.get_closest_marker("attnperf_sdpa_backend")
        pinned = marker.args[0] if marker else None
        # under pytest-xdist: refused on a shared GPU, one at a time on the CPU
        with timing_turn(session.seat, lambda: session.device.is_gpu):
            try:
                result = self._timed(fn, cost, dtype, pinned, detect_backend, mode)
            except (pytest.skip.Exception, pytest.xfail.Exception) as exc:
                if not _raised_inside(fn, exc):  # the timer's own (a pool run that cannot take the case)
                    raise
                pytest.fail(f"{self._key}: the kernel raised {type(exc).__name__} ({exc}) inside a timed call, after "
                            "its checked call had passed: a case that skips or xfails only while it is timed would "
                            "leave the gate unjudged; refuse a case in its checked call (NotImplementedError) or in "
                            "supports", pytrace=False)
        memory = self._memory(result.measurement)
        # --attnperf-history: judged, appended
        drifted = self._history.record(self._key, result) if self._history is not None else None
        self._record(result, memory, drifted)
        verdict, measurement = result.verdict, result.measurement
        node.user_properties.extend(_junit_properties(result, memory))  # JUnit XML; the noise benchmark reads it
        self._session.overhead.measure()  # measured before any test (session.prepare); here only if that step could not
        self._feed_benchmark(result)
        breached = [check.message for check in memory if check.failed]
        if verdict.failed:
            drift = session.baselines.drift()
            extra = f"\n  environment differs from the baseline's: {', '.join(drift)}" if drift else ""
            unquoted = [n for n in measurement.notes if n not in verdict.message]  # "clock changed" quotes its own
            if unquoted:
                extra += "\n  notes: " + "; ".join(unquoted)
            earlier = (self._baseline_entry() or {}).get("notes")
            if isinstance(earlier, list) and earlier:
                extra += "\n  baseline notes: " + "; ".join(str(n) for n in earlier)
            for kernel_note in (result.kernels_changed, measurement.kernels_vs_eager):
                extra += f"\n  {kernel_note}" if kernel_note else ""
            below = floors.failure_message(result, session.ceilings)
            more = "".join(f"\n{line}" for line in [below, *breached] if line)
            pytest.fail(f"{self._key}: {verdict.message}{extra}{more}", pytrace=False)
        below = floors.failure_message(result, session.ceilings)
        if below or breached:  # a memory breach fails apart from the time's verdict
            pytest.fail(f"{self._key}: " + "\n".join(line for line in [*breached, below] if line), pytrace=False)
        if result.kernels_changed and session.settings.fail_on_kernel_change:
            pytest.fail(f"{self._key}: {result.kernels_changed} (against {session.baselines.path}; "
                        "--attnperf-fail-on-kernel-change is set)", pytrace=False)
        if drifted is not None and drifted.fails:
            pytest.fail(f"{self._key}: DRIFTED {drifted.pct:+.1f}% on its history (--attnperf-fail-on-drift): "
                        f"last good {drifted.last_good or '?'}, first bad {drifted.first_bad or 'this run'}, "
                        f"p={drifted.shift.p_value:.2g}; now {drifted.shift.after_ms:.4g} ms, before "
                        f"{drifted.shift.before_ms:.4g} ms", pytrace=False)
        return result

    def _memory(self, measurement: Measurement) -> tuple[MemoryCheck, ...]:
        """The peak above the inputs judged against the family's bound, for a tiled kernel, and
        against the baseline entry's (not when recording, nor in a pool run); docs/memory.md."""
        settings = self._session.settings
        if settings.pool_out is not None or measurement.peak_mib is None:
            return ()
        callspec = getattr(self._request.node, "callspec", None)
        params = callspec.params if callspec else {}
        kernel = params.get("kernel")
        bound = bound_for(kernel, params.get("case"), params.get("direction"))
        checks = [against_bound(measurement.peak_mib, bound, f"kernel '{getattr(kernel, 'name', '?')}'")]
        if not settings.update_baselines:
            recorded = (self._baseline_entry() or {}).get("peak_mib")
            checks.append(against_baseline(measurement.peak_mib, recorded, Tolerance.parse(settings.memory_tolerance)))
        return tuple(check for check in checks if check is not None)

    def _timed(self, fn: Callable[[], Any], cost: Cost, dtype: str, pinned: str | None, detect_backend: bool,
               mode: str | None) -> PerfResult:
        """Prove the backend, time, gate, and place the case on the roofline."""
        session, node = self._session, self._request.node
        device = session.device
        self._baseline_usable()  # a case whose baseline cannot be read fails before it costs its timing
        with pin_backend(pinned) if pinned else nullcontext():
            again, problem = _called_again(fn), None
            checked: list[str] | None = None  # the CUDA kernels of the proof's profile of the checked call
            try:
                if pinned:
                    backend = pinned
                    _, checked = prove_backend(again, pinned, device)
                elif detect_backend:
                    ops, checked = profile_names(again, device)
                    backend = "+".join(sorted(backends_seen(ops, checked))) or "-"
                else:
                    backend = "-"
            except TimedDiffers as exc:
                problem = str(exc)
            if problem is not None:  # failed outside the handler: the message alone, no chained traceback
                pytest.fail(f"{self._key}: {problem}", pytrace=False)
            plan = replace(session.plan(mode), checked_kernels=tuple(checked) if checked else None)
            measurement = self._pooled(self._sampled(fn, plan))
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
            metrics=metrics(cost, measurement.median_ms / 1e3, *floors.rate_peaks(session.ceilings, dtype)),
            verdict=verdict,
            cost=cost,
            backend=backend,
        )
        # roofline position and floors, JUnit properties
        result = floors.check(node, result, dtype, session.ceilings, session.settings, session.hardware.name,
                              device.is_gpu)
        return replace(result, kernels_changed=self._kernels_changed(measurement))

    def _kernels_changed(self, measurement: Measurement) -> str | None:
        """How the measurement's kernel inventory differs from the baseline entry's, in a run that
        gates (``inventory.verdict``; None when it agrees or either has none)."""
        settings = self._session.settings
        if settings.update_baselines or settings.pool_out is not None:
            return None
        return inventory.verdict(self._baseline_entry(), measurement.kernels, measurement.kernels_source)

    def _baseline_usable(self) -> None:
        """Fail the case, before anything is timed, when the baseline file cannot be read or this
        case's entry in it is unusable (a gating run; a recording run rewrites the entry)."""
        session = self._session
        if session.settings.pool_out is not None:
            return
        problem = None
        try:
            baseline = session.baselines.file
        except BaselineError as exc:
            problem = f"{exc}\nNothing was written; fix or remove the file."
        if problem is None and not session.settings.update_baselines and baseline and self._key in baseline.unusable:
            problem = (f"{baseline.unusable[self._key].problem}\nRecord the case again with "
                       "--update-baselines, or fix the entry.")  # costs this case only
        if problem is not None:  # failed outside the handler: the message alone, no chained traceback
            pytest.fail(problem, pytrace=False)

    def _gate(self, fn: Callable[[], Any], measurement: Measurement, plan: Any) -> tuple[Verdict, Measurement]:
        """The verdict on ``measurement`` (``policy.decide``), after timing once more where it
        suspects a regression (the baseline was found usable before timing: ``_baseline_usable``)."""
        session = self._session
        if session.settings.pool_out is not None:
            return Verdict("pool run", None, "measured for the main run's --attnperf-processes; not gated"), measurement
        if session.settings.update_baselines:
            return Verdict("recorded", None, "recorded for --update-baselines"), self._recordable(fn, measurement, plan)
        baseline = session.baselines.file
        entry = baseline.entries.get(self._key) if baseline else None
        summary = baseline.summary(self._key) if baseline else None
        terms, here = session.gate_terms, session.here
        decision = policy.decide(measurement, entry, summary, terms, here)
        self._refused(decision.refusal)
        if decision.missing:
            pytest.fail(f"{self._key}: no entry in {session.baselines.path} and --attnperf-require-baseline is set; "
                        "record it with --update-baselines", pytrace=False)
        if not decision.remeasure:
            return decision.verdict, measurement
        # a suspected regression is measured once more; its kernels were read the first time
        again = self._pooled(self._sampled(fn, replace(plan, inventory=False)))
        verdict, kept, refused = policy.decide_again(decision.verdict, measurement, again, summary, terms, here)
        self._refused(refused)
        return verdict, replace(kept, kernels=measurement.kernels, kernels_source=measurement.kernels_source,
                                inventory_s=measurement.inventory_s, kernels_vs_eager=measurement.kernels_vs_eager)

    def _recordable(self, fn: Callable[[], Any], measurement: Measurement, plan: Any) -> Measurement:
        """A measurement whose entry the baseline reader accepts (``store.baselines.entry_problem``,
        on the figures as the file rounds them): the first, or one of up to ``RECORD_TRIES - 1``
        more, each with twice the samples and budget of the one before (a busy host's scheduler
        ticks widen a short sampling's interval beyond what the reader takes, and more samples
        narrow it). Where none is, the case fails and nothing is recorded for it."""
        problem, tries = _recorded_problem(measurement), 1
        first = measurement
        while problem is not None and tries < RECORD_TRIES:
            scale = 2 ** tries
            tries += 1
            again = self._pooled(self._sampled(fn, replace(plan, inventory=False, min_samples=plan.min_samples * scale,
                                                           budget_s=plan.budget_s * scale)))
            measurement = replace(again, kernels=first.kernels, kernels_source=first.kernels_source,
                                  inventory_s=first.inventory_s, kernels_vs_eager=first.kernels_vs_eager)
            note = (f"re-measured for the recording ({tries} of at most {RECORD_TRIES}, {scale}x the samples): "
                    f"the baseline reader refuses the first: {problem}")
            problem = _recorded_problem(measurement)
            measurement = replace(measurement, notes=(*measurement.notes, note))
        if problem is not None:
            pytest.fail(f"{self._key}: NOT RECORDED: measured {tries} times, each too noisy to be a baseline: the "
                        f"baseline reader would refuse the entry ({problem}; last: {measurement.summary.describe()}). "
                        f"{self._session.baselines.path} keeps what it had for this case; record it on an idle host",
                        pytrace=False)
        return measurement

    def _sampled(self, fn: Callable[[], Any], plan: Any) -> Measurement:
        """The timer's measurement of ``fn``; a timed result that fails its check
        (``verify.TimedDiffers``) fails the case with its message, and under the
        ``attnperf_deterministic`` marker so do replays that are not bitwise equal. Not before the
        run's pool runs have exited (``PoolRuns.settle``): no other process on the GPU."""
        if self._pool_runs is not None:
            self._pool_runs.settle()
        try:
            measurement = self._session.timer.measure(fn, plan)
            node = self._request.node
            checking_s = measurement.verify_s + measurement.inventory_s  # the harness's checks, and the inventory
            node.stash[VERIFY_S_KEY] = node.stash.get(VERIFY_S_KEY, 0.0) + checking_s
        except TimedDiffers as exc:
            problem: str | None = str(exc)
        else:
            problem = _determinism_failure(self._request.node, measurement)
            if problem is None:
                return measurement
        pytest.fail(f"{self._key}: {problem}", pytrace=False)

    def _refused(self, refusal: str | None) -> None:
        """Note, for the run's summary, why the sample overheads' difference was not used."""
        if refusal:
            self._session.overhead.refusals.add(refusal)

    def _pooled(self, measurement: Measurement) -> Measurement:
        """In a pool run, the measurement as taken, also written to the pool run's file; in a run
        with pool runs, pooled with their samples of this case (``pooling.pool``)."""
        session, nodeid = self._session, self._key
        if session.settings.pool_out is not None:
            write_taken(session.settings.pool_out, nodeid, measurement)
            return measurement
        taken = self._pool_runs.for_case(nodeid) if self._pool_runs is not None else []
        return pool(measurement, taken) if taken else measurement

    def _record(self, result: PerfResult, memory: tuple[MemoryCheck, ...] = (),
                drifted: DriftNote | None = None) -> None:
        m, s = result.measurement, result.measurement.summary
        before = self._baseline_entry()
        if self._session.settings.update_baselines:  # the entry is written only then
            entry = self._entry(result, before)
            problem = entry_problem({key: rounded(value) for key, value in entry.items()})  # as the file keeps it
            if problem is not None:  # never written: the reader would set it aside and fail the case's next gate
                pytest.fail(f"{self._key}: NOT RECORDED: the baseline reader would refuse this entry ({problem}); "
                            f"{self._session.baselines.path} keeps what it had for this case", pytrace=False)
            self._request.node.stash[PENDING_KEY] = entry
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
                status="drifted" if drifted is not None and drifted.fails else result.verdict.status,
                change_pct=result.verdict.change_pct,
                eager_change_pct=eager_change,
                notes=(m.notes + policy.verdict_notes(result.verdict, self._session.gate_terms) + floors.notes(result)
                       + self._impossible_rates(result)
                       + ((result.kernels_changed,) if result.kernels_changed else ())
                       + ((m.kernels_vs_eager,) if m.kernels_vs_eager else ())
                       + ((drifted.text(),) if drifted is not None else ())),
                roofline_frac=result.roofline.fraction if result.roofline else None,
                ceilings=self._session.ceilings,
                params=_case_params(self._request.node, result.cost),
                bitwise=m.bitwise,
                verified=m.verified,
                kernels=m.kernels,
                kernels_changed=result.kernels_changed,
                kernels_source=m.kernels_source,
                inventory_s=m.inventory_s,
                kernels_vs_eager=m.kernels_vs_eager,
                memory=memory,
                drift_pct=None if drifted is None else drifted.pct,
            )
        )

    def _impossible_rates(self, result: PerfResult) -> tuple[str, ...]:
        """MFU or bandwidth % above 100% of a measured ceiling, named (``physics.above_measured``)."""
        ceilings, dtype = self._session.ceilings, result.dtype or "?"
        return physics.above_measured(result.mfu, result.bandwidth_frac, ceilings.rate_peak(dtype),
                                      ceilings.rate_bandwidth(), dtype)

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
        if m.mode == "hot":  # a hot figure is comparable only at the same sample length (see policy.decide)
            entry["hot_sample_ms"] = self._session.settings.hot_sample_ms
        if m.peak_mib is not None:
            entry["peak_mib"] = m.peak_mib
        if m.eager_ms is not None:
            entry["eager_ms"] = m.eager_ms
        if m.kernels is not None:  # the kernels one timed call launched (measure/inventory.py)
            entry["kernels"] = dict(m.kernels)
            if m.kernels_source != inventory.GRAPH:
                entry["kernels_source"] = m.kernels_source
        if m.notes:  # how it was measured (throttled clocks, eager fallback): kept with the figure
            entry["notes"] = list(m.notes)
        past = policy.history(before, m, self._session.gate_terms, self._session.here)
        self._refused(past.refusal)
        entry["run_medians_ms"], entry["run_machines"], entry["run_overheads_ms"] = (
            past.medians_ms, past.machines, past.overheads_ms)
        return entry

    def _baseline_entry(self) -> dict[str, Any] | None:
        try:
            baseline = self._session.baselines.file
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
                "attnperf_verified": result.measurement.verified,  # timed draws checked after sampling
                "attnperf_bitwise": result.measurement.bitwise,  # two replays of one draw: equal bits
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
                "attnperf_overhead_ms": self._session.overhead.measure()[0],  # cold, one call a sample
                "attnperf_gate_overhead_ms": self._session.overhead.for_gate_ms(),  # the same, if the gate may use it
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


def _recorded_problem(measurement: Measurement) -> str | None:
    """Why the baseline reader would refuse an entry of ``measurement``'s figures, rounded as the
    file keeps them (None: it would take it)."""
    s = measurement.summary
    entry: dict[str, Any] = {"median_ms": s.median_ms, "ci_low_ms": s.ci_low_ms, "ci_high_ms": s.ci_high_ms,
                             "stdrel": s.stdrel, "n_samples": s.n_samples}
    if measurement.kernels is not None:
        entry["kernels"] = dict(measurement.kernels)
    return entry_problem({key: rounded(value) for key, value in entry.items()})


def _called_again(fn: Callable[[], Any]) -> Callable[[], Any]:
    """``fn`` for the profiled call of the backend proof: for a checked case (``verify.Draws``),
    an exception from the kernel, which returned on the same inputs when it was checked, is a
    ``TimedDiffers`` naming that (a kernel that keeps a graph it cannot use twice, say)."""
    if not isinstance(fn, Draws):
        return fn

    def call() -> Any:
        return raised_as_differing(fn, "the kernel raised when called again on the checked inputs, where its checked "
                                       "call had returned")

    return call


def _determinism_failure(node: Any, measurement: Measurement) -> str | None:
    """Why a test or kernel marked ``attnperf_deterministic`` fails: its replays differed, or
    could not be compared (None when it is not marked or they were bitwise equal)."""
    marked = node.get_closest_marker("attnperf_deterministic") is not None
    callspec = getattr(node, "callspec", None)
    kernel = callspec.params.get("kernel") if callspec else None
    if not (marked or getattr(kernel, "deterministic", False)) or measurement.bitwise:
        return None
    if measurement.bitwise is None:
        return ("attnperf_deterministic: the timed calls' results could not be compared bit for bit "
                "(the callable returned no tensors)")
    return (f"attnperf_deterministic: two replays of the same timed draw gave different bits (largest "
            f"difference {measurement.bitwise_diff:.3g}); the test or kernel is marked as bitwise reproducible")


def _case_params(node: Any, cost: Cost) -> dict[str, Any]:
    """The test's parameters and sweep marker as plain data, for the report."""
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


def _junit_properties(result: PerfResult, memory: tuple[MemoryCheck, ...] = ()) -> list[tuple[str, str]]:
    """The case's figures as JUnit XML properties (``attnperf_*``); those not known are left out."""
    bound = next((c.limit_mib for c in memory if c.of_bound), None)
    figures = {
        "median_ms": result.median_ms, "baseline_ms": _baseline_ms(result),
        "change_pct": result.verdict.change_pct, "tflops": result.tflops, "mfu": result.mfu,
        "peak_mib": result.peak_mib, "memory_bound_mib": bound,
    }
    found = [(f"attnperf_{name}", f"{value:.6g}") for name, value in figures.items() if value is not None]
    m = result.measurement
    checks = [("attnperf_verified", str(m.verified))] + (
        [] if m.bitwise is None else [("attnperf_bitwise", "yes" if m.bitwise else "no")])
    changed = [(f"attnperf_{name}", text) for name, text in (("kernels_changed", result.kernels_changed),
                                                             ("kernels_vs_eager", m.kernels_vs_eager)) if text]
    judged = [("attnperf_memory", "; ".join(c.status for c in memory))] if memory else []
    return [*found, *checks, *changed, *judged, ("attnperf_verdict", result.verdict.status)]


