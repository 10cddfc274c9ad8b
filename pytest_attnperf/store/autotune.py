"""Triton autotune choices recorded with a baseline and installed on a fresh machine.

fla's Triton kernels autotune on every new key and, with ``cache_results``, Triton keeps each
result on disk as ``<TRITON_CACHE_DIR>/<hash>/<kernel>.autotune.json``; the hash covers Triton's
own source, the target, the kernel's source, the tuning key and the configs tried, so a file
applies only where all of them match. ``--update-baselines`` on a CUDA device copies the files
this run's kernels produced into ``baselines/<hw>.autotune/`` (``<hash>.json`` each, plus
``manifest.yaml``); a gating run on a CUDA device installs them into the Triton cache folder it
points ``TRITON_CACHE_DIR`` at (``--attnperf-triton-cache``), so the kernels run the
configurations their baselines were timed with, and reports every kernel that autotuned anyway
(no recorded choice applied: environment drift). See docs/autotune.md.

Triton reads ``TRITON_CACHE_DIR`` at each use (``triton.knobs``), so setting it before the first
test runs is enough even where importing torch already imported triton.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import wraps
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from pytest_attnperf.parallel.fleet import case_key
from pytest_attnperf.store.baselines import write_atomic

__all__ = [
    "AutotuneError", "AutotuneRun", "Choice", "autotune_notes_for_case", "chosen_config", "describe_config",
    "install", "load_manifest", "record", "scan", "summary_lines",
]

FORMAT = 1
MANIFEST = "manifest.yaml"
SUFFIX = ".autotune.json"
OUTSIDE = "outside any test (a pool run of --attnperf-processes)"
T = TypeVar("T")

RUN_KEY = pytest.StashKey["AutotuneRun"]()
CLOCK_KEY = pytest.StashKey["WarmupClock"]()
BEFORE_KEY = pytest.StashKey[frozenset[str]]()  # autotune files present when the case started
NOTHING_AUTOTUNED = "none to write: no Triton kernel autotuned in the measured tests"
FINISHED_KEY = pytest.StashKey[bool]()  # the case's results credited (case_finished ran)
MEASURE_AT_KEY = pytest.StashKey[float]()  # host time (time.time) attnperf.measure was entered


class AutotuneError(Exception):
    """A recorded choice or manifest that cannot be used; the message names the file and the cause."""


@dataclass(frozen=True)
class Choice:
    """One recorded autotune result: the Triton cache hash folder it lives in and what it chose."""

    hash_dir: str
    kernel: str
    file: str  # Triton's file name in the hash folder: <kernel>.autotune.json
    key: tuple[str, ...]
    chosen: str
    source: str  # the test whose run produced it
    triton: str | None

    def as_mapping(self) -> dict[str, Any]:
        """The choice as plain data, as the manifest holds it."""
        return {"kernel": self.kernel, "file": self.file, "key": list(self.key), "chosen": self.chosen,
                "source": self.source, "triton": self.triton}


# -- pure: Triton's files -------------------------------------------------------------------


def scan(cache_dir: Path) -> dict[str, Path]:
    """Every autotune result under ``cache_dir``, as ``"<hash>/<kernel>.autotune.json"`` -> path."""
    found: dict[str, Path] = {}
    if not cache_dir.is_dir():
        return found
    for sub in os.scandir(cache_dir):
        if not sub.is_dir(follow_symlinks=False):
            continue
        for entry in os.scandir(sub.path):
            if entry.name.endswith(SUFFIX) and entry.is_file():
                found[f"{sub.name}/{entry.name}"] = Path(entry.path)
    return found


def describe_config(config: Mapping[str, Any]) -> str:
    """A Triton ``Config.__dict__`` as one readable line: ``BT=64 BV=32 num_warps=4 num_stages=2``."""
    kwargs = config.get("kwargs") or {}
    parts = [f"{k}={v}" for k, v in sorted(kwargs.items())]
    for name in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        if config.get(name) is not None:
            parts.append(f"{name}={config[name]}")
    return " ".join(parts)


def _timing(value: Any) -> tuple[float, ...]:
    """A timing as Triton stores it (one number, or the quantiles' list, median first)."""
    return tuple(float(v) for v in value) if isinstance(value, list) else (float(value),)


def chosen_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """The config Triton takes from a result file: the least timing (compared as Triton does)."""
    pairs = data.get("configs_timings")
    if not isinstance(pairs, list) or not pairs:
        raise ValueError("no 'configs_timings' list")
    best = min(pairs, key=lambda pair: _timing(pair[1]))
    if not isinstance(best[0], dict):
        raise ValueError("a config is not a mapping")
    return best[0]


def read_result(path: Path) -> tuple[tuple[str, ...], str]:
    """``(key, chosen config)`` of one Triton autotune result file; ``AutotuneError`` if unusable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        key = data.get("key") or []
        return tuple(str(k) for k in key), describe_config(chosen_config(data))
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise AutotuneError(f"{path} is not a Triton autotune result: {type(exc).__name__}: {exc}") from None


# -- pure: the recorded folder ---------------------------------------------------------------


def folder_for(baselines_dir: Path, hw: str) -> Path:
    return baselines_dir / f"{hw}.autotune"


def load_manifest(folder: Path) -> dict[str, Choice]:
    """The recorded choices by hash folder; empty when there is no manifest; ``AutotuneError``
    naming the file when it is unreadable."""
    path = folder / MANIFEST
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise AutotuneError(f"{path} cannot be read: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise AutotuneError(f"{path} is not an attnperf autotune manifest (expected 'format: {FORMAT}' and 'entries')")
    choices = {}
    for hash_dir, entry in data["entries"].items():
        try:
            choices[str(hash_dir)] = Choice(
                hash_dir=str(hash_dir), kernel=str(entry["kernel"]), file=str(entry["file"]),
                key=tuple(str(k) for k in entry.get("key") or ()), chosen=str(entry.get("chosen", "")),
                source=str(entry.get("source", "")),
                triton=None if entry.get("triton") is None else str(entry["triton"]),
            )
        except (KeyError, TypeError) as exc:
            raise AutotuneError(f"{path}, entry '{hash_dir}': {type(exc).__name__}: {exc}") from None
        if "/" in choices[str(hash_dir)].file or "/" in str(hash_dir):
            raise AutotuneError(f"{path}, entry '{hash_dir}': a hash folder or file name holds '/'")
    return choices


def record(
    folder: Path, cache_dir: Path, produced: Mapping[str, str], triton: str | None,
) -> tuple[int, int, list[str]]:
    """Copy the result files ``produced`` (``"<hash>/<file>"`` -> the test that produced it) from
    ``cache_dir`` into ``folder`` as ``<hash>.json`` and merge them into the manifest: entries of
    other hash folders are kept. Returns ``(written, kept, problems)``; an unreadable manifest
    raises ``AutotuneError`` and nothing is written."""
    choices = load_manifest(folder)
    written, problems = 0, []
    for rel, source in sorted(produced.items()):
        hash_dir, _, name = rel.partition("/")
        path = cache_dir / hash_dir / name
        try:
            key, chosen = read_result(path)
            text = path.read_text(encoding="utf-8")
        except (AutotuneError, OSError) as exc:
            problems.append(f"not recorded: {exc}")
            continue
        write_atomic(folder / f"{hash_dir}.json", text)
        choices[hash_dir] = Choice(hash_dir, name[: -len(SUFFIX)], name, key, chosen, source, triton)
        written += 1
    if written:
        manifest = {"format": FORMAT, "triton": triton,
                    "entries": {h: c.as_mapping() for h, c in sorted(choices.items())}}
        write_atomic(folder / MANIFEST, yaml.safe_dump(manifest, sort_keys=True, default_flow_style=False, width=120))
    return written, len(choices) - written, problems


def install(folder: Path, cache_dir: Path) -> tuple[dict[str, Choice], list[str]]:
    """Copy the recorded choices into ``cache_dir`` under their hash folders and remove every
    other autotune result there (one left by an earlier run would hide that no recorded choice
    applies); compiled kernels are kept. Returns the choices installed, by ``"<hash>/<file>"``,
    and the problems met (each costs only its own entry)."""
    choices = load_manifest(folder)
    installed: dict[str, Choice] = {}
    problems = []
    for hash_dir, choice in sorted(choices.items()):
        source = folder / f"{hash_dir}.json"
        try:
            read_result(source)
        except AutotuneError as exc:
            problems.append(f"not installed: {exc}")
            continue
        target = cache_dir / hash_dir / choice.file
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{choice.file}.{os.getpid()}.tmp")
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
        installed[f"{hash_dir}/{choice.file}"] = choice
    for rel, path in scan(cache_dir).items():
        if rel not in installed:
            path.unlink(missing_ok=True)
    return installed, problems


# -- the run ---------------------------------------------------------------------------------


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


@dataclass
class WarmupClock:
    """Host wall time of measured tests' call phases, split where ``attnperf.measure`` began."""

    before_measure_s: float = 0.0
    in_measure_s: float = 0.0
    tests: int = 0


def _triton_version() -> str | None:
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


def _cache_root(config: pytest.Config) -> Path | None:
    """The folder given (``~`` and environment variables expanded; a leading
    ``$XDG_CACHE_HOME``, as in the default, is ``~/.cache`` when the variable is unset or not
    absolute), or None: ``off``."""
    from pytest_attnperf.options import _get, user_cache

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


def start(config: pytest.Config, items: Iterable[pytest.Item], session: Any) -> None:
    """Before any test runs: on a CUDA device, when recording or when ``baselines/<hw>.autotune``
    exists, point Triton's cache at ``--attnperf-triton-cache``/<hw> and install the recorded
    choices there. Does nothing in a pool run (its parent did it), when only collecting, when
    no test measures, on the CPU, or with ``--attnperf-triton-cache=off``. ``session`` is the
    run's (its settings, device, hardware and pytest-xdist seat)."""
    s = session.settings
    if s.pool_out is not None or config.option.collectonly:
        return
    if not any("attnperf" in getattr(item, "fixturenames", ()) for item in items):
        return
    try:
        if not session.device.is_gpu:
            return
        hw = session.hardware.name
    except Exception:  # noqa: BLE001 - each test that needs the device meets the error itself
        return
    root = _cache_root(config)
    folder = folder_for(s.baselines_dir, hw)
    if root is None or not (s.update_baselines or folder.is_dir()):
        return
    seat = session.seat  # under pytest-xdist each worker has a folder of its own: install clears other results
    cache_dir = root / hw / seat.worker if seat is not None else root / hw
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
    config.stash[RUN_KEY] = run


def case_started(item: pytest.Item) -> None:
    run = item.config.stash.get(RUN_KEY, None)
    if run is not None:
        item.stash[BEFORE_KEY] = frozenset(scan(run.cache_dir))


def autotune_notes_for_case(run: AutotuneRun, nodeid: str) -> tuple[str, ...]:
    """The case's note for each kernel that autotuned during it (none while recording, where
    autotuning is what is being recorded)."""
    if run.recording:
        return ()
    kernels = sorted({rel.split("/", 1)[1][: -len(SUFFIX)] for rel, source in run.produced.items() if source == nodeid})
    return tuple(f"autotuned in this run: {k} (no recorded choice in {run.folder.name} applied)" for k in kernels)


def case_finished(item: pytest.Item, rows: list[Any]) -> None:
    """Credit the autotune results that appeared during the case to it, and note them on its
    row of the summary table (``rows``: the run's)."""
    run = item.config.stash.get(RUN_KEY, None)
    before = item.stash.get(BEFORE_KEY, None)
    if run is None or before is None:
        return
    if item.stash.get(FINISHED_KEY, False):  # credited already, at its teardown report
        return
    item.stash[FINISHED_KEY] = True
    key = case_key(item)
    for rel in sorted(set(scan(run.cache_dir)) - before - set(run.installed)):
        run.produced.setdefault(rel, key)
    notes = autotune_notes_for_case(run, key)
    if not notes:
        return
    for i, row in enumerate(rows):
        if row.nodeid == key:
            rows[i] = replace(row, notes=row.notes + notes)


def clock_measure(perf: T, node: pytest.Item) -> T:
    """``perf`` with its ``measure`` noting, on the host clock, when it began (for the warm-up
    vs measuring split of the summary); the callable it times is passed on untouched."""
    measure: Callable[..., Any] = getattr(perf, "measure")  # noqa: B009 - any object with a measure method

    @wraps(measure)
    def clocked(*args: Any, **kwargs: Any) -> Any:
        node.stash.setdefault(MEASURE_AT_KEY, time.time())
        return measure(*args, **kwargs)

    setattr(perf, "measure", clocked)  # noqa: B010
    return perf


def account_call(item: pytest.Item, call: pytest.CallInfo[Any]) -> None:
    """Add a measured test's call phase to the run's warm-up / measuring totals."""
    began = item.stash.get(MEASURE_AT_KEY, None)
    if began is None:
        return
    clock = item.config.stash.setdefault(CLOCK_KEY, WarmupClock())
    clock.before_measure_s += max(0.0, began - call.start)
    clock.in_measure_s += max(0.0, call.stop - began)
    clock.tests += 1


def note_skip(item: pytest.Item, skipped: bool) -> None:
    """Remember a test skipped in its call phase: a kernel that refuses a case (fla's backward
    on some Triton versions) may autotune its first kernels before refusing, and a gating run
    meets the same autotuning, so those choices are recorded too."""
    run = item.config.stash.get(RUN_KEY, None)
    if run is not None and skipped:
        run.skipped.add(case_key(item))


def finish(config: pytest.Config, pending: Mapping[str, Any]) -> None:
    """At session end: while recording, write the results produced by the passed, measured
    tests, by tests skipped after their kernels ran, and by pool runs into
    ``baselines/<hw>.autotune``; then restore TRITON_CACHE_DIR."""
    run = config.stash.get(RUN_KEY, None)
    if run is None:
        return
    keep = _to_record(run, pending)
    if keep:
        _record_into(run, run.cache_dir, keep)
    elif run.recording and pending:
        run.write_note = NOTHING_AUTOTUNED
    _restore_env(run)


def _to_record(run: AutotuneRun, pending: Mapping[str, Any]) -> dict[str, str]:
    """The results a recording run keeps: those of passed, measured tests, of tests skipped
    after their kernels ran, and those that appeared outside any test (``--attnperf-processes``
    runs)."""
    for rel in sorted(set(scan(run.cache_dir)) - run.present_at_start - set(run.produced)):
        run.produced[rel] = OUTSIDE
    if not (run.recording and pending):
        return {}
    return {rel: src for rel, src in run.produced.items() if src in pending or src in run.skipped or src == OUTSIDE}


def _record_into(run: AutotuneRun, cache_dir: Path, keep: Mapping[str, str]) -> None:
    try:
        written, kept, problems = record(run.folder, cache_dir, keep, run.triton_here)
    except (AutotuneError, OSError) as exc:
        run.write_note = f"NOT written: {exc}. The folder was left as it was."
    else:
        run.problems.extend(problems)
        run.write_note = f"wrote {written} autotune choices to {run.folder} ({kept} other entries kept)"


def _restore_env(run: AutotuneRun) -> None:
    if run.previous_env is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = run.previous_env


def case_files(config: pytest.Config, key: str) -> dict[str, str]:
    """A recording pytest-xdist worker: the result files that autotuned during case ``key``, as
    text, sent with the case so that a worker that dies later still has its choices recorded."""
    run = config.stash.get(RUN_KEY, None)
    if run is None or not run.recording:
        return {}
    files = {}
    for rel, source in run.produced.items():
        if source == key:
            try:
                files[rel] = (run.cache_dir / rel).read_text(encoding="utf-8")
            except OSError:  # sent again, or named, at the worker's end
                continue
    return files


def worker_payload(config: pytest.Config, pending: Mapping[str, Any]) -> dict[str, Any]:
    """A pytest-xdist worker's part, at its end, for the controller, which records once for all
    (``merge_workers``): its run, its time split, and the result files to record, as text."""
    run = config.stash.get(RUN_KEY, None)
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
    return {"run": run, "clock": config.stash.get(CLOCK_KEY, None), "keep": keep, "files": files}


def merge_workers(config: pytest.Config, payloads: Sequence[Mapping[str, Any]], pending: Mapping[str, Any]) -> None:
    """The controller of a pytest-xdist run: one run and one time split made of the workers',
    for the summary, and the workers' result files recorded once (those of cases whose entries
    arrived)."""
    clocks = [p["clock"] for p in payloads if p.get("clock") is not None]
    if clocks:
        config.stash[CLOCK_KEY] = WarmupClock(sum(c.before_measure_s for c in clocks),
                                              sum(c.in_measure_s for c in clocks), sum(c.tests for c in clocks))
    runs = [p["run"] for p in payloads if p.get("run") is not None]
    if not runs:
        return
    run = replace(runs[0], produced={}, skipped=set(), problems=[], write_note=None)
    for other in runs:
        run.installed.update(other.installed)
        run.produced.update(other.produced)
        run.skipped |= other.skipped
        run.problems.extend(p for p in other.problems if p not in run.problems)
    config.stash[RUN_KEY] = run
    keep = {rel: src for p in payloads for rel, src in p.get("keep", {}).items()
            if src in pending or src in run.skipped or src == OUTSIDE}
    if run.recording and pending and not keep:
        run.write_note = NOTHING_AUTOTUNED
    if not (run.recording and keep):
        return
    with tempfile.TemporaryDirectory(prefix="attnperf-autotune-") as scratch:
        for p in payloads:
            for rel, text in p.get("files", {}).items():
                if rel in keep:
                    target = Path(scratch) / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text, encoding="utf-8")
        _record_into(run, Path(scratch), keep)


def _drift(run: AutotuneRun) -> str:
    recorded = ", ".join(run.recorded_tritons) or "unknown"
    return f"triton {recorded} recorded, {run.triton_here} here"


def summary_lines(config: pytest.Config) -> list[str]:
    """The summary's lines on autotune choices and on warm-up vs measuring time."""
    lines = []
    clock = config.stash.get(CLOCK_KEY, None)
    if clock is not None and clock.tests:
        lines.append(
            f"time in {clock.tests} measured tests: {clock.before_measure_s:.1f} s before attnperf.measure "
            f"(inputs, checks and the kernels' first calls: compiling, autotuning), "
            f"{clock.in_measure_s:.1f} s in it (warm-up calls, capture, sampling)"
        )
    run = config.stash.get(RUN_KEY, None)
    if run is None:
        return lines
    name = run.folder.name
    if run.recording:
        lines.append(f"autotune choices: {run.write_note or 'none written (no measured test passed)'}")
    else:
        lines.append(f"autotune choices: {len(run.installed)} installed from {name} into {run.cache_dir}")
        kernels = sorted({rel.split("/", 1)[1][: -len(SUFFIX)] for rel in run.produced})
        if kernels:
            lines.append(f"autotuned in this run (no recorded choice applied): {len(kernels)} kernels "
                         f"({', '.join(kernels)}) - environment drift vs {name} ({_drift(run)}); "
                         "re-record with --update-baselines")
        stale = [v for v in run.recorded_tritons if v != run.triton_here]
        if stale:
            lines.append(f"drift: {name} was recorded with triton {', '.join(stale)}, {run.triton_here} here: "
                         "its choices apply only to the Triton that made them")
    lines.extend(f"autotune: {p}" for p in run.problems)
    return lines
