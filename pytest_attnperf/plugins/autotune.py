"""The run's Triton cache: recorded autotune choices installed before the tests, what autotuned
anyway noted on each case, and a recording run's choices written at its end (docs/autotune.md).

``AutotunePlugin`` is registered by ``pytest_configure`` unless ``--attnperf-triton-cache=off``,
in a pool run of ``--attnperf-processes`` (its parent installed) or when only collecting; it holds
the run's state. Under pytest-xdist each worker manages a cache folder of its own and hands the
controller what it produced; the controller records once for all (docs/parallel.md).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from pytest_attnperf.options import _get, user_cache
from pytest_attnperf.parallel.fleet import case_key, decode, encode
from pytest_attnperf.session import AttnPerfSession
from pytest_attnperf.store.autotune import (
    AutotuneError,
    Choice,
    _triton_version,
    folder_for,
    install,
    kernel_of,
    record,
    scan,
)

__all__ = ["NAME", "AutotunePlugin", "AutotuneRun", "autotune_notes_for_case", "cache_root"]

NAME = "attnperf-autotune"
OUTSIDE = "outside any test (a pool run of --attnperf-processes)"
NOTHING_AUTOTUNED = "none to write: no Triton kernel autotuned in the measured tests"
FILES_ATTR = "attnperf_autotune"  # on a pytest-xdist worker's teardown report: the case's result files
OUTPUT_KEY = "attnperf-autotune"  # in a worker's workeroutput: its run and the files to record
BEFORE_KEY = pytest.StashKey[frozenset[str]]()  # autotune files present when the case started
FINISHED_KEY = pytest.StashKey[bool]()  # the case's results credited (case_finished ran)


@dataclass
class AutotuneRun:
    """A run whose Triton cache folder attnperf manages: what it installed and what autotuned."""

    cache_dir: Path
    folder: Path
    recording: bool
    installed: dict[str, Choice]
    triton_here: str | None
    previous_env: str | None
    problems: list[str] = field(default_factory=list)
    present_at_start: frozenset[str] = frozenset()
    produced: dict[str, str] = field(default_factory=dict)  # "<hash>/<file>" -> the test it appeared in
    skipped: set[str] = field(default_factory=set)  # tests skipped after their kernels ran (a refused backward)
    write_note: str | None = None

    @property
    def recorded_tritons(self) -> list[str]:
        """The Triton versions the installed choices were recorded with."""
        return sorted({c.triton for c in self.installed.values() if c.triton})


def cache_root(config: pytest.Config) -> Path | None:
    """The folder ``--attnperf-triton-cache`` gives (``~`` and environment variables expanded; a
    leading ``$XDG_CACHE_HOME``, as in the default, is ``~/.cache`` when the variable is unset or
    not absolute), or None: ``off``."""
    text = _get(config, "triton_cache", str).strip()
    if text.lower() in ("off", "none", "0", "false", ""):
        return None
    for variable in ("$XDG_CACHE_HOME", "${XDG_CACHE_HOME}"):  # the default's; ~/.cache when unset
        if text == variable or text.startswith(variable + "/"):
            return user_cache(*Path(text[len(variable):].lstrip("/")).parts)
    root = Path(os.path.expandvars(os.path.expanduser(text)))
    return root if root.is_absolute() else Path(config.rootpath) / root


def _point_triton_at(cache_dir: Path) -> str | None:
    """Set ``TRITON_CACHE_DIR``; if triton is already imported, check that it reads the new
    folder (it does, through ``triton.knobs``, unless code set ``knobs.cache.dir``). A line
    for the summary when it could not be made to."""
    os.environ["TRITON_CACHE_DIR"] = str(cache_dir)
    triton = sys.modules.get("triton")
    knobs = getattr(triton, "knobs", None) if triton is not None else None
    if knobs is None:
        return None
    try:
        if str(knobs.cache.dir) != str(cache_dir):
            knobs.cache.dir = str(cache_dir)
        if str(knobs.cache.dir) != str(cache_dir):
            return f"triton was imported first and reads its cache from {knobs.cache.dir}"
    except Exception as exc:  # noqa: BLE001 - a triton without these knobs reads the variable at use
        return f"triton was imported first and its cache knob could not be checked: {exc}"
    return None


def autotune_notes_for_case(run: AutotuneRun, nodeid: str) -> tuple[str, ...]:
    """The case's note for each kernel that autotuned during it (none while recording, where
    autotuning is what is being recorded)."""
    if run.recording:
        return ()
    kernels = sorted({kernel_of(rel) for rel, source in run.produced.items() if source == nodeid})
    return tuple(f"autotuned in this run: {k} (no recorded choice in {run.folder.name} applied)" for k in kernels)


def _to_record(run: AutotuneRun, pending: Mapping[str, Any]) -> dict[str, str]:
    """The results a recording run keeps: those of passed, measured tests, of tests skipped
    after their kernels ran, and those that appeared outside any test (``--attnperf-processes``
    runs)."""
    for rel in sorted(set(scan(run.cache_dir)) - run.present_at_start - set(run.produced)):
        run.produced[rel] = OUTSIDE
    return {rel: src for rel, src in run.produced.items() if _kept(run, pending, src)}


def _kept(run: AutotuneRun, pending: Mapping[str, Any], source: str) -> bool:
    """Whether a recording keeps the results that appeared in ``source`` (a test, or ``OUTSIDE``):
    those of a passed, measured test, of a test skipped after its kernels ran and of pool runs,
    once the run has an entry to record."""
    return run.recording and bool(pending) and (source in pending or source in run.skipped or source == OUTSIDE)


def _record_into(run: AutotuneRun, cache_dir: Path, keep: Mapping[str, str]) -> None:
    try:
        written, kept, problems = record(run.folder, cache_dir, keep, run.triton_here)
    except (AutotuneError, OSError) as exc:
        run.write_note = f"NOT written: {exc}. The folder was left as it was."
    else:
        run.problems.extend(p for p in problems if p not in run.problems)  # a case's, met again at the end
        run.write_note = f"wrote {written} autotune choices to {run.folder} ({kept} other entries kept)"


def _restore_env(run: AutotuneRun) -> None:
    if run.previous_env is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = run.previous_env


class AutotunePlugin:
    """The run's Triton cache and what autotuned in it. ``session`` is the run's (its settings,
    device, hardware, pytest-xdist seat or fleet, rows and pending entries)."""

    def __init__(self, session: AttnPerfSession, root: Path) -> None:
        self.session = session
        self.root = root  # --attnperf-triton-cache
        self.run: AutotuneRun | None = None  # once started on a CUDA device; a controller's, once merged
        self.problems: list[str] = []  # a controller's: workers' parts that could not be read
        self.received: dict[str, str] = {}  # a controller's: result files sent with the workers' cases
        self.sources: dict[str, str] = {}  # and the cases they were sent with
        self.parts: list[Mapping[str, Any]] = []  # a controller's: the workers' end-of-run parts

    @staticmethod
    def of(config: pytest.Config) -> AutotunePlugin | None:
        """The run's registered plugin; None where the run leaves Triton's cache alone."""
        plugin = config.pluginmanager.get_plugin(NAME)
        return plugin if isinstance(plugin, AutotunePlugin) else None

    # -- before the tests ---------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)  # before the preparation, the pool runs (which inherit TRITON_CACHE_DIR), the tests
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Before any test: Triton's cache pointed at this run's folder, the recorded choices installed there."""
        self.run = self._start(session.config, session.items)

    def _start(self, config: pytest.Config, items: Iterable[pytest.Item]) -> AutotuneRun | None:
        """On a CUDA device, when recording or when ``baselines/<hw>.autotune`` exists, point
        Triton's cache at ``--attnperf-triton-cache``/<hw> and install the recorded choices there.
        None when no test measures, on the CPU, or with neither recording nor recorded choices."""
        s, state = self.session.settings, self.session
        if not any("attnperf" in getattr(item, "fixturenames", ()) for item in items):
            return None
        try:
            if not state.device.is_gpu:
                return None
            hw = state.hardware.name
        except Exception:  # noqa: BLE001 - each test that needs the device meets the error itself
            return None
        folder = folder_for(s.baselines_dir, hw)
        if not (s.update_baselines or folder.is_dir()):
            return None
        seat = state.seat  # under pytest-xdist each worker has a folder of its own: install clears other results
        cache_dir = self.root / hw / seat.worker if seat is not None else self.root / hw
        cache_dir.mkdir(parents=True, exist_ok=True)
        try:
            installed, problems = install(folder, cache_dir)
        except (AutotuneError, OSError) as exc:
            installed, problems = {}, [f"no recorded choices installed: {exc}"]
        run = AutotuneRun(cache_dir=cache_dir, folder=folder, recording=s.update_baselines, installed=installed,
                          triton_here=_triton_version(), previous_env=os.environ.get("TRITON_CACHE_DIR"),
                          problems=problems)
        refused = _point_triton_at(cache_dir)
        if refused:
            run.problems.append(refused)
        if os.environ.get("TRITON_CACHE_MANAGER"):
            run.problems.append("TRITON_CACHE_MANAGER is set: Triton may not read the installed files")
        run.present_at_start = frozenset(scan(cache_dir))
        return run

    # -- each case ------------------------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        """Around each test: the results that appear during it are its own."""
        if self.run is not None:
            item.stash[BEFORE_KEY] = frozenset(scan(self.run.cache_dir))
        try:
            return (yield)
        finally:
            self._case_finished(item)
            self._record_case(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        """After a test's teardown, before its report: the kernels that autotuned in it, noted on
        its row (before a pytest-xdist worker sends the row with the report)."""
        try:
            return (yield)
        finally:
            self._case_finished(item)

    def _case_finished(self, item: pytest.Item) -> None:
        """Credit the results that appeared during the case to it (once), and note them on its
        row of the summary table."""
        run, before = self.run, item.stash.get(BEFORE_KEY, None)
        if run is None or before is None or item.stash.get(FINISHED_KEY, False):
            return
        item.stash[FINISHED_KEY] = True
        key = case_key(item)
        for rel in sorted(set(scan(run.cache_dir)) - before - set(run.installed)):
            run.produced.setdefault(rel, key)
        notes = autotune_notes_for_case(run, key)
        if not notes:
            return
        rows = self.session.rows
        for i, row in enumerate(rows):
            if row.nodeid == key:
                rows[i] = replace(row, notes=row.notes + notes)

    def _record_case(self, item: pytest.Item) -> None:
        """A recording outside pytest-xdist: at the end of a case whose entry was committed (and
        journaled), or that was skipped after its kernels ran once the run has committed an entry,
        the case's choices are written, so a run that dies later leaves its journaled entries with
        the choices they were timed with (the run's end writes them all again, with those made
        outside any test)."""
        run, state = self.run, self.session
        if run is None or state.seat is not None or state.fleet is not None:
            return
        key = case_key(item)
        keep = {rel: source for rel, source in run.produced.items() if source == key}
        if keep and _kept(run, state.baselines.pending, key):
            _record_into(run, run.cache_dir, keep)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        """A test skipped in its call phase is remembered: a kernel that refuses a case (fla's
        backward on some Triton versions) may autotune its first kernels before refusing, and a
        gating run meets the same autotuning, so those choices are recorded too. A recording
        pytest-xdist worker's teardown report carries the result files of the case, so that a
        worker that dies later still has its choices recorded."""
        report = yield
        run = self.run
        if run is not None and report.when == "call" and report.skipped:
            run.skipped.add(case_key(item))
        elif run is not None and report.when == "teardown" and run.recording and self.session.seat is not None:
            key = case_key(item)
            files = {}
            for rel in (rel for rel, source in run.produced.items() if source == key):
                try:
                    files[rel] = (run.cache_dir / rel).read_text(encoding="utf-8")
                except OSError:  # sent again, or named, at the worker's end
                    continue
            if files:
                setattr(report, FILES_ATTR, {"key": key, "files": files})
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """A pytest-xdist controller: the result files a worker sent with a case (recorded at the
        end if the case's entry arrived)."""
        sent = getattr(report, FILES_ATTR, None)
        if self.session.fleet is None or not isinstance(sent, dict):
            return
        for rel, text in sent.get("files", {}).items():
            self.received.setdefault(rel, text)
            self.sources.setdefault(rel, str(sent.get("key")))

    # -- the run's end ----------------------------------------------------------------------------

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        """A pytest-xdist controller: a finished worker's part (its run and the files to record)."""
        text = getattr(node, "workeroutput", {}).get(OUTPUT_KEY)
        if not isinstance(text, str):
            return
        try:
            self.parts.append(decode(text))
        except Exception as exc:  # noqa: BLE001 - named in the summary, never dropped silently
            self.problems.append(f"{node.gateway.id}: its autotune results could not be read "
                                 f"({type(exc).__name__}: {exc})")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """At the run's end: a pytest-xdist worker hands its part to the controller, which records
        once for all; any other run records its own while recording. TRITON_CACHE_DIR is restored."""
        state, config = self.session, session.config
        if state.seat is not None:
            part = self._worker_part(state.baselines.pending)
            if hasattr(config, "workeroutput"):
                config.workeroutput[OUTPUT_KEY] = encode(part)
        elif state.fleet is not None:
            self._merge([*self.parts, {"keep": self.sources, "files": self.received}], state.baselines.pending)
        elif self.run is not None:
            keep = _to_record(self.run, state.baselines.pending)
            if keep:
                _record_into(self.run, self.run.cache_dir, keep)
            elif self.run.recording and state.baselines.pending:
                self.run.write_note = NOTHING_AUTOTUNED
            _restore_env(self.run)

    def _worker_part(self, pending: Mapping[str, Any]) -> dict[str, Any]:
        """A pytest-xdist worker's part, for the controller, which records once for all
        (``_merge``): its run and the result files to record, as text."""
        run = self.run
        files: dict[str, str] = {}
        keep: dict[str, str] = {}
        if run is not None:
            keep = _to_record(run, pending)
            for rel in keep:
                try:
                    files[rel] = (run.cache_dir / rel).read_text(encoding="utf-8")
                except OSError as exc:
                    run.problems.append(f"not recorded: {run.cache_dir / rel}: {exc}")
            _restore_env(run)
        return {"run": run, "keep": keep, "files": files}

    def _merge(self, parts: Sequence[Mapping[str, Any]], pending: Mapping[str, Any]) -> None:
        """The controller of a pytest-xdist run: one run made of the workers', for the summary,
        and the workers' result files recorded once (those of cases whose entries arrived)."""
        runs = [p["run"] for p in parts if p.get("run") is not None]
        if not runs:
            return
        run = replace(runs[0], produced={}, skipped=set(), problems=[], write_note=None)
        for other in runs:
            run.installed.update(other.installed)
            run.produced.update(other.produced)
            run.skipped |= other.skipped
            run.problems.extend(p for p in other.problems if p not in run.problems)
        self.run = run
        keep = {rel: src for p in parts for rel, src in p.get("keep", {}).items() if _kept(run, pending, src)}
        if run.recording and pending and not keep:
            run.write_note = NOTHING_AUTOTUNED
        if not (run.recording and keep):
            return
        with tempfile.TemporaryDirectory(prefix="attnperf-autotune-") as scratch:
            for p in parts:
                for rel, text in p.get("files", {}).items():
                    if rel in keep:
                        target = Path(scratch) / rel
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_text(text, encoding="utf-8")
            _record_into(run, Path(scratch), keep)

    def summary_lines(self) -> list[str]:
        """The summary's lines on autotune choices: written or installed, what autotuned anyway
        (environment drift), and any problem."""
        run = self.run
        if run is None:
            return [f"autotune: {p}" for p in self.problems]
        name = run.folder.name
        lines = []
        if run.recording:
            lines.append(f"autotune choices: {run.write_note or 'none written (no measured test passed)'}")
        else:
            lines.append(f"autotune choices: {len(run.installed)} installed from {name} into {run.cache_dir}")
            kernels = sorted({kernel_of(rel) for rel in run.produced})
            recorded = ", ".join(run.recorded_tritons) or "unknown"
            if kernels:
                lines.append(f"autotuned in this run (no recorded choice applied): {len(kernels)} kernels "
                             f"({', '.join(kernels)}) - environment drift vs {name} (triton {recorded} recorded, "
                             f"{run.triton_here} here); re-record with --update-baselines")
            stale = [v for v in run.recorded_tritons if v != run.triton_here]
            if stale:
                lines.append(f"drift: {name} was recorded with triton {', '.join(stale)}, {run.triton_here} here: "
                             "its choices apply only to the Triton that made them")
        lines.extend(f"autotune: {p}" for p in [*run.problems, *self.problems])
        return lines
