"""The run's state: device, hardware, timer, kernels, baselines, results.

Created by ``pytest_configure`` and kept in ``config.stash``. Everything
heavy (torch, the device query, the baseline file) is resolved on first use, so a run with no
attention tests imports nothing and writes nothing.
"""

from __future__ import annotations

import gc
import math
import warnings
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from pytest_attnperf.families.builtin import CALLS, check_signature, register_builtin
from pytest_attnperf.families.registry import KernelRegistry
from pytest_attnperf.gate.policy import GateTerms, Here
from pytest_attnperf.hw import ceilings
from pytest_attnperf.hw.ceilings import Ceilings
from pytest_attnperf.hw.table import DetectedDevice, HardwareMismatch, HardwareSpec, machine_id, resolve
from pytest_attnperf.measure.timing import SamplingPlan, Timer, default_timer, one_element_add
from pytest_attnperf.options import Settings, source, user_cache
from pytest_attnperf.outcome import Row
from pytest_attnperf.parallel.fleet import Fleet, Seat
from pytest_attnperf.store import baselines as store
from pytest_attnperf.store import envinfo, tally
from pytest_attnperf.store import journal as journals
from pytest_attnperf.store.yamlstrict import cut

__all__ = ["SESSION_KEY", "AttnPerfSession", "get_session"]

FREEZE_ENTRIES = 10_000  # a baseline this large (about 5 MB) is frozen out of the collector once read
STARTUP_LISTED = 20  # unusable entries named at start-up, the rest counted


@dataclass
class AttnPerfSession:
    """The run's state: its settings, the device and its figures found on first need, the pending
    entries and rows, and its place under pytest-xdist."""

    config: pytest.Config
    settings: Settings
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    journal_refused: dict[str, str] = field(default_factory=dict)  # dead runs' journal entries left out, their problem
    rows: list[Row] = field(default_factory=list)
    write_note: str | None = None
    record_note: str | None = None  # what a recording did with each entry's history (store.tally)
    ignore_note: str | None = None  # the .gitignore a recording wrote into the baselines folder
    overhead: tuple[float | None, str] | None = None  # see measure_overhead: (ms, how), once measured
    overhead_for_gate_ms: float | None = None  # see gate_overhead_ms
    overhead_refusals: set[str] = field(default_factory=set)  # floors' differences the gate did not use, and why
    checked_only: int = 0  # cases --attnperf-check-only let through measure() untimed
    fleet: Fleet | None = None  # a pytest-xdist controller's workers (plugins/xdist.py)
    seat: Seat | None = None  # a pytest-xdist worker's GPU and place in the fleet

    # -- device and hardware -------------------------------------------------------------
    @cached_property
    def device(self) -> DetectedDevice:
        """The device a ``pytest_attnperf_detect_device`` implementation found; a UsageError if
        none did."""
        detected: DetectedDevice | None = self.config.hook.pytest_attnperf_detect_device(config=self.config)
        if detected is None:
            raise pytest.UsageError("attnperf: no pytest_attnperf_detect_device implementation returned a device")
        return detected

    @cached_property
    def hardware(self) -> HardwareSpec:
        """The hardware spec for ``--hw``, or for the device detected; a UsageError when the two
        do not match."""
        try:
            return resolve(self.settings.hw, self.device)
        except HardwareMismatch as exc:
            raise pytest.UsageError(f"attnperf: {exc} (the name from {source(self.config, 'hw')})") from None

    @cached_property
    def machine(self) -> str:
        """The name of this machine in the recording histories (``--attnperf-machine`` or detected)."""
        return self.settings.machine or machine_id(self.device)

    @cached_property
    def timer(self) -> Timer:
        """The timer a ``pytest_attnperf_make_timer`` implementation made, else the device's default."""
        made = self.config.hook.pytest_attnperf_make_timer(config=self.config, device=self.device)
        return made if made is not None else default_timer(self.device)

    @cached_property
    def registry(self) -> KernelRegistry:
        """The built-in kernels and those the ``pytest_attnperf_register_kernels`` hooks add."""
        registry = KernelRegistry()
        register_builtin(registry)
        self.config.hook.pytest_attnperf_register_kernels(registry=registry, config=self.config)
        wrong = [why for family in CALLS for k in registry.family(family)
                 if (why := check_signature(family, k.name, k.fn)) is not None]
        if wrong:  # every one of its cases would fail with the same TypeError: say it once, here
            raise pytest.UsageError("attnperf: " + "\n  ".join(wrong))
        return registry

    @cached_property
    def ceilings(self) -> Ceilings:
        """The machine's ceilings beside the spec's and the user's (``hw.ceilings.obtain``), found on
        first need and kept for the run."""
        s = self.settings
        return ceilings.obtain(self.hardware, s.ceilings, s.peaks, pool_run=s.pool_out is not None,
                               environment=lambda: self.environment, machine=self.machine,
                               folder=user_cache(*ceilings.CACHE_FOLDER),
                               measure_now=lambda: ceilings.measure(self.timer, self.plan("cold"), self.device))

    @cached_property
    def gate_terms(self) -> GateTerms:
        """The gate's settings, frozen once for the run."""
        return GateTerms.from_settings(self.settings)

    @cached_property
    def here(self) -> Here:
        """What the gate knows of this machine: its name and its sample overhead (measured on first need)."""
        return Here(self.machine, self.gate_overhead_ms)

    def plan(self, mode: str | None = None) -> SamplingPlan:
        """The sampling plan from the settings, in ``mode`` when given."""
        s = self.settings
        return SamplingPlan(
            mode=mode or s.mode,
            min_samples=s.min_samples,
            target_stdrel=s.target_stdrel,
            budget_s=s.budget_s,
            cold_graphs=s.cold_graphs,
            hot_sample_ms=s.hot_sample_ms,
            inventory=s.pool_out is None,  # a pool run's figures are pooled; the main run reads the kernels
        )

    def measure_overhead(self) -> tuple[float | None, str]:
        """The timer's figure for the least a sample can hold, a one-element add on CUDA device
        0, cold (one call a sample, whatever the run's mode: hot mode's graphs of many calls
        would spread a per-sample cost over them), measured once per run: beside each case in
        the benchmark JSON, so runs on two machines show whether a machine's samples carry a
        fixed cost of their own (see --attnperf-machine-offset and docs/evidence.md,
        "Fixed time per sample"). ``(None, why)`` without CUDA or when it fails. Where the gate may
        use it, see ``gate_overhead_ms``."""
        if self.overhead is None:
            self.overhead, self.overhead_for_gate_ms = self._overhead()
        return self.overhead

    def gate_overhead_ms(self) -> float | None:
        """The floor as the gate uses it: kept with each recording (``run_floors_ms``) and,
        against another machine's recordings, the difference moves a cold case's centre
        (``Perf._machine_terms``). Only a floor timed the way cold cases are (events inside the
        graph, ``cuda-graph-nodes``) and not caught at a held-down clock; else None, and the
        reason is in ``measure_overhead``'s words."""
        self.measure_overhead()
        return self.overhead_for_gate_ms

    def _overhead(self) -> tuple[tuple[float | None, str], float | None]:
        if not self.device.is_gpu:  # a CPU run need not import torch for it
            return (None, "no CUDA device"), None
        plan = replace(self.plan("cold"), overhead=True)
        how = "one-element add, cold"
        try:
            import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

            if not torch.cuda.is_available():
                return (None, "no CUDA device"), None
            m = self.timer.measure(one_element_add(), plan)
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not fail the run
            return (None, f"{how} failed: {type(exc).__name__}: {str(exc)[:120]}"), None
        if not (math.isfinite(m.median_ms) and m.median_ms > 0):
            return (None, f"{how} read {m.median_ms!r} ms"), None
        doubts = [n for n in m.notes if n.startswith(("still throttled", "clocks held down"))]
        if m.clock != "cuda-graph-nodes":
            doubts.insert(0, f"clock {m.clock}")
        if doubts:
            return (m.median_ms, f"{how}; not used by the gate: {'; '.join(doubts)}"), None
        return (m.median_ms, how), m.median_ms

    def prepare(self, items: list[pytest.Item]) -> None:
        """Before any test, when measured cases are selected: measure the sample overhead and the
        ceilings (or read them from their cache), so no case's time includes them. Not in a pool
        run (its parent prepared) or when only collecting; a device that cannot be looked up is
        left to each case to report."""
        if self.settings.pool_out is not None or self.config.option.collectonly:
            return
        if not any("attnperf" in getattr(item, "fixturenames", ()) for item in items):
            return
        try:
            self.hardware  # noqa: B018 - the device lookup each measured case makes anyway
        except Exception:  # noqa: BLE001 - each measured case meets the error itself
            return
        self.measure_overhead()
        self.ceilings  # noqa: B018 - measured, or read from their cache, now

    # -- baselines ------------------------------------------------------------------------
    @cached_property
    def journal(self) -> journals.Journal | None:
        """The journal of this recording (``pytest_attnperf.store.journal``); None unless recording,
        and under pytest-xdist (its workers send each entry to the controller as their case ends,
        and one journal cannot hold the entries of workers on different cards)."""
        if not self.settings.update_baselines or self.seat is not None or self.fleet is not None:
            return None
        try:
            return journals.Journal(self.settings.baselines_dir, self.hardware.name)
        except Exception:  # noqa: BLE001 - no hardware to name it by: the run's end reports that anyway
            return None

    def commit(self, key: str, entry: dict[str, Any]) -> None:
        """A measured case's entry, to be written at the run's end; journaled at once."""
        self.pending[key] = entry
        if self.journal is not None:
            self.journal.add(key, entry)

    def _left_behind(self) -> tuple[list[Path], dict[str, dict[str, Any]]]:
        """Journals that dead recordings on this host left for this hardware, and their entries
        that pass the check a baseline file's entries pass; the others are kept, with their
        problem, in ``journal_refused`` (a bad line must not replace a good entry)."""
        paths = journals.left_behind(self.settings.baselines_dir, self.hardware.name)
        entries: dict[str, dict[str, Any]] = {}
        readable = []
        for path in paths:
            try:
                entries.update(journals.read(path))
            except OSError:
                continue
            readable.append(path)
        problems = {key: store.entry_problem(entry) for key, entry in entries.items()}
        self.journal_refused = {key: problem for key, problem in problems.items() if problem is not None}
        return readable, {key: entry for key, entry in entries.items() if problems[key] is None}

    def _refused_note(self) -> str:
        """The journal entries left out of the merge, named with their problem (cut short)."""
        refused = self.journal_refused
        if not refused:
            return ""
        shown = [f"{cut(key)}: {cut(refused[key])}" for key in sorted(refused)[:3]]
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        return (f"; left out {len(refused)} journal entr{'y' if len(refused) == 1 else 'ies'} that "
                f"{'is' if len(refused) == 1 else 'are'} no usable baseline entry ({'; '.join(shown)}{more})")

    @property
    def baseline_path(self) -> Path:
        """The baseline file of this hardware: ``<baselines dir>/<hw>.yaml``."""
        return self.settings.baselines_dir / f"{self.hardware.name}.yaml"

    @cached_property
    def baseline(self) -> store.BaselineFile | None:
        """The hardware's baseline file (None if absent), read once a run; raises
        ``BaselineError`` if unusable as a whole, and sets bad entries aside (``unusable``)."""
        loaded = store.load(self.baseline_path, keep_unusable=True)
        if loaded is not None and len(loaded.entries) >= FREEZE_ENTRIES:
            # keep the collector from walking the file's millions of objects in later collections,
            # which would land as pauses in timed calls
            gc.collect()
            gc.freeze()
        return loaded

    def check_baselines(self, items: list[pytest.Item]) -> None:
        """At start-up, when measured cases are selected: read the baseline file once and name
        its problems on the terminal before anything is measured (a file that cannot be used,
        each unusable entry). Their cases fail when measured; the others are gated."""
        if self.config.option.collectonly or not any("attnperf" in getattr(i, "fixturenames", ()) for i in items):
            return
        try:
            path = self.baseline_path  # the device lookup every measured case makes anyway
        except Exception:  # noqa: BLE001 - each measured case meets the error itself
            return
        missing = self._check_folder()
        try:
            baseline = self.baseline
        except store.BaselineError as exc:
            lines = [f"attnperf: {exc}", "  every measured case fails; --update-baselines will not overwrite it"]
        else:
            bad = baseline.unusable if baseline else {}
            lines = [f"attnperf: {path}: {len(bad)} unusable entr{'y' if len(bad) == 1 else 'ies'}; each one's case "
                     "fails until --update-baselines records it again:"] if bad else []
            shown = sorted(bad)[:STARTUP_LISTED]
            lines += [f"  {key}: {bad[key].cause}" for key in shown]
            if len(bad) > len(shown):
                lines.append(f"  ... and {len(bad) - len(shown)} more")
        lines += [missing] if missing else []
        if not self.settings.update_baselines:
            left, entries = self._left_behind()
            if left:
                lines.append(f"attnperf: {len(left)} recording journal{'s' if len(left) > 1 else ''} with "
                             f"{len(entries)} measured entries, left by runs that ended before writing them: "
                             f"{', '.join(str(p) for p in left)}; the next --update-baselines for "
                             f"{self.hardware.name} on this host merges them")
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and lines:
            reporter.ensure_newline()
            for line in lines:
                reporter.write_line(line, yellow=True)

    def _check_folder(self) -> str | None:
        """A gating run whose baselines folder does not exist (a mistyped ``--attnperf-baselines``)
        gates nothing: every case would pass as new. Returns the warning, naming the resolved
        path (also issued as a ``PytestConfigWarning``); under ``--attnperf-require-baseline`` it
        is a usage error."""
        s = self.settings
        if s.update_baselines or s.check_only or s.pool_out is not None or s.baselines_dir.is_dir():
            return None
        text = (f"attnperf: no baselines folder at {s.baselines_dir} (--attnperf-baselines, ATTNPERF_BASELINES or "
                "the ini's attnperf_baselines, relative to the ini file's folder)")
        if s.require_baseline:
            raise pytest.UsageError(f"{text}; --attnperf-require-baseline needs its entries")
        text += ": every measured case is new and passes ungated; --update-baselines records them"
        warnings.warn(pytest.PytestConfigWarning(text), stacklevel=2)
        return text

    @cached_property
    def environment(self) -> dict[str, str | None]:
        """The header of a baseline file measured now (versions, device, driver, date), found once."""
        return envinfo.environment(self.device, self.hardware.name)

    def drift(self) -> list[str]:
        """``'<name> <baseline's> -> <now>'`` for each compared version that moved since the baseline;
        empty without a usable baseline."""
        try:
            baseline = self.baseline
        except store.BaselineError:
            return []
        return envinfo.drift(baseline.meta, self.environment) if baseline else []

    def write_baselines(self) -> None:
        """Merge the passed, measured cases into the file, under its lock; never touch an
        unreadable file. When the file cannot be written (unreadable, locked too long, folder
        not writable, disk full) the measured entries go to a file of their own in the temporary
        folder, the summary names both, and the run's exit status is a failure."""
        if not self.settings.update_baselines:
            return
        if self.fleet is not None and self.fleet.mixed:
            if self.pending:
                self._not_written(self.fleet.mixed)
            return
        left, recovered = self._left_behind()
        recovered = {k: v for k, v in recovered.items() if k not in self.pending}  # this run's own win
        if not self.pending and not recovered:
            return
        measured = {**recovered, **self.pending}
        path = self.baseline_path
        before = self._entries_read()  # as the run read it (a pytest-xdist controller reads it here), not as written
        try:
            merged, removed = store.update(path, measured, self.environment, known=self.__dict__.get("baseline"))
        except store.LockTimeout as exc:
            self._not_written(f"{exc}", measured, left)
            return
        except store.BaselineError as exc:
            self._not_written(f"{exc}. The file was left as it was", measured, left)
            return
        except OSError as exc:
            self._not_written(f"cannot write {path}: {exc}", measured, left)
            return
        self._journals_done(left)
        self.record_note = tally.recording_line(path, tally.recorded(before, measured))
        ignored = store.ignore_transients(path.parent)
        if ignored is not None:
            self.ignore_note = f"wrote {ignored}, which keeps the store's lock and temporary files out of git"
        kept = len(merged.entries) + len(merged.unusable) - len(measured)
        unusable = f", {len(merged.unusable)} of them unusable and left as they were" if merged.unusable else ""
        stale = (f"; removed {len(removed)} temporary file{'s' if len(removed) > 1 else ''} an interrupted "
                 "write had left" if removed else "")
        many = len(left) > 1
        from_journals = (f"; with them {len(recovered)} entries that {len(left)} recording{'s' if many else ''} "
                         f"ended before writing had left in {'their' if many else 'its'} journal"
                         f"{'s' if many else ''}" if recovered else "")
        self.write_note = (
            f"wrote {len(self.pending)} measured entries to {path} ({kept} other entries kept{unusable}){from_journals}"
            f"{self._refused_note()}{stale}"
        )
        if self.journal is not None and self.journal.problem is not None:
            self.write_note += f"; {self.journal.problem}"

    def _entries_read(self) -> dict[str, Any]:
        """The baseline file's entries as this run read them (unusable ones as they were); empty
        without a file or when it could not be read."""
        try:
            baseline = self.baseline
        except store.BaselineError:
            return {}
        if baseline is None:
            return {}
        return {**{key: u.raw for key, u in baseline.unusable.items()}, **baseline.entries}

    def gating_note(self) -> str | None:
        """For the summary of a gating run that measured: the file it read, the entries its
        cases matched, the cases without one and the entries it did not run (None when
        recording, in a pool run, or when the file could not be read: its cases said so)."""
        s = self.settings
        if s.update_baselines or s.pool_out is not None or not self.rows:
            return None
        try:
            baseline = self.baseline
        except store.BaselineError:
            return None
        keys = [*baseline.entries, *baseline.unusable] if baseline is not None else []
        counts = tally.gated((row.nodeid for row in self.rows), keys)
        return tally.gating_line(self.baseline_path, counts, exists=baseline is not None)

    def _journals_done(self, left: list[Path]) -> None:
        """The entries are safe (written, or saved aside): this run's journal and those it merged go."""
        for path in left:
            path.unlink(missing_ok=True)
        if self.journal is not None:
            self.journal.remove()

    def _not_written(self, cause: str, measured: dict[str, Any] | None = None, left: list[Path] | None = None) -> None:
        """The one summary line of an update that could not write, with where its entries went."""
        measured = self.pending if measured is None else measured
        try:
            aside = store.save_unsaved(self.hardware.name, measured, self.environment)
        except OSError as exc:
            own = [self.journal.path] if self.journal is not None and self.journal.problem is None else []
            holders = [path for path in own + (left or []) if path.exists()]
            if holders and (own or not self.pending):
                kept = (f"saving them aside failed too ({exc}): the {len(measured)} measured entries stay in the "
                        f"journal{'s' if len(holders) > 1 else ''} {', '.join(str(p) for p in holders)}, which the "
                        f"next --update-baselines for {self.hardware.name} merges")
            else:
                kept = f"saving them aside failed too ({exc}): the {len(measured)} measured entries are lost"
        else:
            self._journals_done(left or [])
            kept = (f"the {len(measured)} measured entries are in {aside}; merge them with "
                    f"'attnperf-baselines merge {aside} {self.baseline_path}'")
        self.write_note = f"ERROR, NOT written: {cause}. {kept}"
        session = self.config.pluginmanager.get_plugin("session")
        if session is not None and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


SESSION_KEY = pytest.StashKey[AttnPerfSession]()


def get_session(config: pytest.Config) -> AttnPerfSession:
    """The attnperf session of a configured pytest run."""
    return config.stash[SESSION_KEY]
