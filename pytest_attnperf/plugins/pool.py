"""Short cases timed in more than one process (``--attnperf-processes``).

A short kernel's cold median moves from one process to the next by more than anything within a
process can average away, so with ``--attnperf-processes=N`` on a CUDA device, N - 1 pool runs
measure the cases whose baseline centre is under ``--attnperf-processes-below`` before this run's
tests, and this run pools their samples with its own. Two plugin objects: ``PoolRuns`` in the
parent run (it starts the pool runs, input written by ``write_input``, and holds what they
measured), ``PoolRun`` in a pool run (it reads the input and collects exactly its cases). The
samples' file and their pooling: ``measure/pooling.py``. docs/measurement.md, "Short cases in
several processes"; the evidence: docs/evidence.md.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_attnperf.gate.verdict import centre_ms
from pytest_attnperf.measure import child as child_run
from pytest_attnperf.measure.pooling import Taken, read_taken, short_cases
from pytest_attnperf.measure.profiled import CUPTI_ENV
from pytest_attnperf.options import Settings
from pytest_attnperf.parallel.fleet import case_key, group_of
from pytest_attnperf.plugins import turns
from pytest_attnperf.plugins.pool_settings import settings_data, settings_from_data
from pytest_attnperf.plugins.turns import Turn, Turns
from pytest_attnperf.session import AttnPerfSession
from pytest_attnperf.store.baselines import BaselineError, BaselineFile

__all__ = ["INPUT_FORMAT", "POOL_INPUT_FLAG", "POOL_OUT_FLAG", "PoolResults", "PoolRun", "PoolRuns", "pool_run_args",
           "read_input", "write_input"]

POOL_INPUT_FLAG = "--attnperf-pool-input"
POOL_OUT_FLAG = "--attnperf-pool-out"
INPUT_FORMAT = 1  # the input file's "format": a pool run refuses any other
POOL_RUNS = "attnperf-pool-runs"  # the plugins' names
POOL_RUN = "attnperf-pool-run"


# -- a pool run's input and command line -----------------------------------------------------


def write_input(path: Path, nodeids: Sequence[str], settings: Settings) -> None:
    """A pool run's input: ``{"format": 1, "nodeids": [...], "settings": {...}}``, the cases by
    node id (relative to the rootdir) and this run's settings (``pool_settings.settings_data``)."""
    data = {"format": INPUT_FORMAT, "nodeids": list(nodeids), "settings": settings_data(settings)}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def read_input(path: Path) -> tuple[list[str], dict[str, Any]]:
    """A pool run's input file: its node ids and its settings' data; ``ValueError`` saying what
    is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:  # not UTF-8, or not JSON
        raise ValueError(f"is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != INPUT_FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise ValueError(f"is not a pool run's input of format {INPUT_FORMAT} (format: {found!r}; written by "
                         "another version of pytest-attnperf?)")
    nodeids, settings = data.get("nodeids"), data.get("settings")
    if not isinstance(nodeids, list) or not all(isinstance(n, str) for n in nodeids):
        raise ValueError("'nodeids' is not a list of node ids")
    if not isinstance(settings, dict):
        raise ValueError("'settings' is not an object")
    return nodeids, settings


def pool_run_args(config: pytest.Config, input_path: Path, out: Path, scratch: Path) -> list[str]:
    """A pool run's pytest arguments: what decides which code it loads and how (this run's
    plugins given with ``-p``, rootdir, ini file, ``-o`` overrides, import mode, conftest
    options), the places a pool run may write (its cache, JUnit file, temporary folder and
    benchmark storage, all in ``scratch``: an ini's or PYTEST_ADDOPTS's --lf, --junitxml or
    --benchmark-autosave then reach it harmlessly), its input file and where its samples go.
    Nothing else of this run's command line: the cases and the settings are in the input."""
    option = config.option
    args = [arg for name in getattr(option, "plugins", None) or [] for arg in ("-p", name)]
    args += ["--rootdir", str(config.rootpath)]
    if config.inipath is not None:
        args += ["-c", str(config.inipath)]
    args += [arg for value in getattr(option, "override_ini", None) or [] for arg in ("-o", value)]
    args.append(f"--import-mode={getattr(option, 'importmode', 'prepend')}")
    if getattr(option, "noconftest", False):
        args.append("--noconftest")
    if getattr(option, "confcutdir", None):
        args.append(f"--confcutdir={option.confcutdir}")
    if config.pluginmanager.hasplugin("cacheprovider"):
        args += ["-o", f"cache_dir={scratch / 'cache'}"]
    if config.pluginmanager.hasplugin("junitxml"):
        args.append(f"--junitxml={scratch / 'junit.xml'}")
    if config.pluginmanager.hasplugin("tmpdir"):
        args.append(f"--basetemp={scratch / 'tmp'}")
    if config.pluginmanager.hasplugin("benchmark"):
        args.append(f"--benchmark-storage=file://{scratch / 'benchmarks'}")
    if config.pluginmanager.hasplugin("xdist"):  # an ini's -n must not make the pool run a pytest-xdist controller
        args += ["-n", "0"]
    return [*args, f"{POOL_INPUT_FLAG}={input_path}", f"{POOL_OUT_FLAG}={out}"]


def _pool_env() -> dict[str, str]:
    """The environment of this process, with this copy of pytest_attnperf first on the path (it
    may be imported from a checkout that the pool run's directory does not hold), and
    ``TEARDOWN_CUPTI=1`` unless this process has the variable: a pool run started without it timed
    short cases up to 15% slower than its parent until its first profile, and as its parent with
    it (docs/evidence.md, "Pool runs and TEARDOWN_CUPTI")."""
    # not a worker of theirs: pytest-xdist's variables left out
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")}
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault(CUPTI_ENV, "1")
    return env


@dataclass
class _Started:
    """One pool run as ``PoolResults.run`` started it: its files, its process (None when it
    could not start) and its turn's pipes (None where they are not passed)."""

    index: int
    out: Path
    log: Path
    child: subprocess.Popen[bytes] | None = None
    turns: Turns | None = None
    status: int | None = None  # once it has exited
    measured: int | None = None  # cases in its samples' file, read once its tests were over


@dataclass
class PoolResults:
    """What a session's pool runs measured."""

    taken: dict[str, list[Taken]]
    cases: int = 0
    processes: int = 1
    seconds: float = 0.0
    problems: tuple[str, ...] = ()  # a pool run that failed: named with its kept log
    missing: tuple[str, ...] = ()  # a pool run that measured fewer cases (skipped or failed there)
    when: str = "before the tests"
    _pending: list[_Started] = field(default_factory=list)  # started, their exit status not yet read
    _folder: Path | None = None
    _nodeids: tuple[str, ...] = ()

    def for_case(self, nodeid: str) -> list[Taken]:
        """What each pool run measured for ``nodeid``; empty when none did."""
        return self.taken.get(nodeid, [])

    def add(self, other: PoolResults) -> None:
        """Take in another set of pool runs (a pytest-xdist worker's next group)."""
        self.settle()
        other.settle()
        for nodeid, taken in other.taken.items():
            self.taken.setdefault(nodeid, []).extend(taken)
        self.cases += other.cases
        self.seconds += other.seconds
        self.problems += other.problems
        self.missing += other.missing

    def summary(self, below_ms: float) -> list[str]:
        """For the run's summary: nothing when no case was chosen (every case then timed here only,
        as without the option), else how many in how many processes, and any pool run that did not
        measure them all."""
        self.settle()
        lines = [f"{self.cases} cases under {1e3 * below_ms:g} us timed in {self.processes} processes "
                 f"({self.processes - 1} pool runs {self.when}, {self.seconds:.0f} s)"] if self.cases else []
        return lines + [f"pool run {p}" for p in (*self.problems, *self.missing)]

    @classmethod
    def run(cls, config: pytest.Config, settings: Settings, nodeids: Sequence[str],
            meanwhile: Callable[[], object] | None = None) -> PoolResults:
        """Run ``settings.processes - 1`` pool runs over ``nodeids`` and read what each measured.
        They start together and take the GPU one after another (``plugins.turns``): a pool
        run's tests begin once the one before it has exited; ``meanwhile`` runs here while the
        first starts up. This returns when the last one's tests are over, before it has exited
        (``settle`` waits for that: this run times nothing before it). A pool run that fails
        (exit status other than 0, or 1 for failed tests, or one that cannot start) is named
        with its log, which is kept with its input; one that measured fewer cases is counted,
        with its log when a test failed there. Their cases pool what the others measured."""
        processes = settings.processes
        runs = cls(taken={}, cases=len(nodeids), processes=processes)
        if not nodeids or processes < 2:
            return runs
        folder = Path(tempfile.mkdtemp(prefix="attnperf-pool-"))
        started = time.monotonic()
        given = folder / "input.json"
        try:
            write_input(given, nodeids, settings)
        except OSError as exc:  # a full disk, say: no pool run
            runs.problems = (f"s not started: {given} could not be written: {exc}",)
            shutil.rmtree(folder, ignore_errors=True)
            return runs
        runs._folder, runs._nodeids = folder, tuple(nodeids)
        pending = [_Started(i, folder / f"pool{i}.jsonl", folder / f"pool{i}.log") for i in range(1, processes)]
        runs._pending = pending
        together = turns.supported()
        problems: list[str] = []
        try:
            if together:
                for run in pending:
                    _start(config, run, given, folder, problems, with_turn=True)
                if meanwhile is not None:
                    meanwhile()
            before: _Started | None = None
            for run in pending:
                if not together:
                    _start(config, run, given, folder, problems, with_turn=False)
                if run.child is None:
                    continue
                if before is not None and before.child is not None and before.status is None:  # never two on the GPU
                    before.status = child_run.wait_for(before.child)
                if run.turns is not None:
                    run.turns.give()
                    run.turns.wait_done(run.child)
                else:
                    run.status = child_run.wait_for(run.child)
                got = read_taken(run.out)  # complete: its tests are over
                run.measured = len(got)
                for nodeid, taken in got.items():
                    runs.taken.setdefault(nodeid, []).append(taken)
                before = run
        except BaseException:
            _stop(pending)
            raise
        finally:
            runs.seconds = time.monotonic() - started
            runs.problems = tuple(problems)
        return runs

    def settle(self) -> None:
        """Wait for the pool runs to exit, and name those that failed or measured fewer cases;
        their logs are removed unless kept to be read."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        problems, missing, keep = list(self.problems), list(self.missing), bool(self.problems)
        try:
            for run in pending:
                if run.child is None:
                    continue
                if run.status is None:
                    run.status = child_run.wait_for(run.child)
                got = run.measured if run.measured is not None else len(read_taken(run.out))  # not read: stopped
                status, count = run.status, len(self._nodeids)
                if status not in (0, 1):  # 1: a test failed there (it fails here too)
                    keep = True
                    problems.append(f"{run.index}: exit status {status}, measured {got} of {count} cases; "
                                    f"the rest are pooled over fewer processes (log: {run.log})")
                elif got < count:  # a test failed there (1; its log is kept) or was skipped
                    kept = f"; log: {run.log}" if status else ""
                    keep = keep or bool(status)
                    missing.append(f"{run.index}: measured {got} of {count} cases (the rest were skipped or "
                                   f"failed there, and are pooled over fewer processes{kept})")
        except BaseException:
            _stop(pending)
            raise
        finally:
            self.problems, self.missing = tuple(problems), tuple(missing)
            if not keep and self._folder is not None:  # the logs are kept only to be read
                shutil.rmtree(self._folder, ignore_errors=True)


def _start(config: pytest.Config, run: _Started, given: Path, folder: Path, problems: list[str],
           with_turn: bool) -> None:
    """Start pool run ``run`` (with its turn's pipes, ``with_turn``); one that cannot start is
    named in ``problems``."""
    run.turns = Turns() if with_turn else None
    cmd = [sys.executable, "-m", "pytest", *pool_run_args(config, given, run.out, folder / f"w{run.index}")]
    if run.turns is not None:
        cmd.append(run.turns.flag())
    with open(run.log, "w", encoding="utf-8") as sink:
        sink.write(shlex.join(cmd) + "\n")
        sink.flush()
        try:
            run.child = child_run.start(cmd, env=_pool_env(), cwd=config.invocation_params.dir, stdout=sink,
                                        pass_fds=run.turns.child_ends() if run.turns is not None else ())
        except OSError as exc:  # no such interpreter any more, or no process to be had
            problems.append(f"{run.index}: could not start: {exc} (log: {run.log})")
            if run.turns is not None:
                run.turns.close()
            run.turns = None
            return
    if run.turns is not None:
        run.turns.started()


def _stop(pending: Sequence[_Started]) -> None:
    """Interrupted: every pool run still waiting for its turn ends without one, and one still
    running is interrupted (``child.interrupt``)."""
    for run in pending:
        if run.turns is not None:
            run.turns.close()
    for run in pending:
        if run.child is not None and run.child.poll() is None:
            child_run.interrupt(run.child)


class PoolRuns:
    """The pool runs of a run with ``--attnperf-processes`` above 1, and what they measured.
    Registered by ``pytest_configure`` (not in a pool run, a pytest-xdist controller, a
    check-only or collect-only run). ``session`` is the run's (its settings, device, baseline
    and pytest-xdist seat); ``ahead(items)`` what this run does while its first pool run starts
    up (the plugin's: import the modules its kernels name, ``registry.import_ahead``)."""

    def __init__(self, session: AttnPerfSession,
                 ahead: Callable[[Sequence[pytest.Item]], object] | None = None) -> None:
        self.session = session
        self.ahead = ahead
        self.results: PoolResults | None = None  # once started
        self.plan: dict[str, list[str]] = {}  # a pytest-xdist worker: case -> its group's short cases

    @staticmethod
    def of(config: pytest.Config) -> PoolRuns | None:
        """The run's registered plugin; None where the run has no pool runs."""
        plugin = config.pluginmanager.get_plugin(POOL_RUNS)
        return plugin if isinstance(plugin, PoolRuns) else None

    @pytest.hookimpl(trylast=True)  # after the baseline file's check and the run's preparation
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Before any test: the pool runs over the selected cases whose baseline centre is under
        ``--attnperf-processes-below``."""
        self.start(session.items)

    def start(self, items: Sequence[pytest.Item]) -> None:
        """Run the pool runs over ``items``' short cases. Only on a CUDA device (the offset is the
        GPU's; a host clock's samples are noisier than it). In a pytest-xdist worker they run
        later, before the first case of each group (``for_case``): which groups a worker gets is
        known only as it gets them."""
        state, s = self.session, self.session.settings
        measured = [item for item in items if "attnperf" in getattr(item, "fixturenames", ())]
        ids = [case_key(item) for item in measured]
        if not ids:  # no measured case: the device is not even looked up
            return
        try:
            if not state.device.is_gpu:
                return
        except Exception:  # noqa: BLE001 - each test that needs the device meets the error, as without pool runs
            return
        try:
            baseline = state.baselines.file
        except BaselineError as exc:
            self.results = PoolResults({}, processes=s.processes, problems=(f"no pool runs: {exc}",))
            return
        chosen = short_cases(ids, centres_ms(baseline) if baseline else {}, s.processes_below_ms)
        if state.seat is not None:
            short = set(chosen)
            groups: dict[str, list[str]] = {}
            for item, key in zip(measured, ids, strict=True):
                if key in short:
                    groups.setdefault(group_of(item) or key, []).append(key)
            self.plan = {key: group for group in groups.values() for key in group}
            self.results = PoolResults({}, processes=s.processes, when="before each group's first case")
            return
        ahead = self.ahead
        self.results = PoolResults.run(state.config, s, chosen,
                                       meanwhile=(lambda: ahead(measured)) if ahead is not None else None)

    def for_case(self, key: str) -> list[Taken]:
        """The pool runs' measurements of a case; in a pytest-xdist worker, its group's pool runs
        run first if they have not."""
        if self.results is None:
            return []
        group = self.plan.get(key)
        if group:
            for other in group:
                self.plan.pop(other, None)
            self.results.add(PoolResults.run(self.session.config, self.session.settings, group))
        return self.results.for_case(key)

    def settle(self) -> None:
        """Before this run times anything: every pool run has exited (``PoolResults.settle``)."""
        if self.results is not None:
            self.results.settle()

    def summary_lines(self) -> list[str]:
        """The summary's lines on the pool runs (``PoolResults.summary``); none before they started."""
        return self.results.summary(self.session.settings.processes_below_ms) if self.results is not None else []


class PoolRun:
    """One pool run: the child pytest ``PoolResults.run`` starts. Registered by
    ``pytest_configure`` when ``--attnperf-pool-input`` is given: the run's settings come from
    that file, not from its own options, and it collects exactly the file's cases; the fixture
    writes each measurement's samples to ``--attnperf-pool-out`` (``write_taken``)."""

    def __init__(self, path: Path, nodeids: Sequence[str], settings: Settings, turn: Turn | None = None) -> None:
        self.path = path
        self.nodeids = tuple(nodeids)
        self.settings = settings
        self.turn = turn  # started with the others: its tests wait for their turn (plugins.turns)

    @classmethod
    def given(cls, config: pytest.Config) -> PoolRun | None:
        """The pool run this process is, its input file read; None in any other run. A missing or
        unusable input is a usage error naming the file."""
        given, out = config.getoption("attnperf_pool_input"), config.getoption("attnperf_pool_out")
        if given is None:
            if out is not None:
                raise pytest.UsageError(f"attnperf: {POOL_OUT_FLAG} is a pool run's, given with {POOL_INPUT_FLAG}")
            return None
        path = Path(config.invocation_params.dir, given)
        if out is None:
            raise pytest.UsageError(f"attnperf: pool run input {path}: no {POOL_OUT_FLAG} to write its samples to")
        try:
            nodeids, data = read_input(path)
            settings = settings_from_data(data, Path(config.invocation_params.dir, out))
        except ValueError as exc:
            raise pytest.UsageError(f"attnperf: pool run input {path}: {exc}") from None
        turn = config.getoption("attnperf_pool_turn")
        try:
            return cls(path, nodeids, settings, Turn.parse(turn) if turn is not None else None)
        except ValueError as exc:
            raise pytest.UsageError(f"attnperf: pool run input {path}: {exc}") from None

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        """Its tests once it has its turn (the pool run before it has exited); it says so when
        they are over. Without a turn (its parent stopped), no test runs."""
        if self.turn is not None and not self.turn.wait():
            pytest.exit("attnperf: this pool run's parent stopped before its turn came",
                        returncode=pytest.ExitCode.INTERRUPTED)
        try:
            return (yield)
        finally:
            if self.turn is not None:
                self.turn.done()

    def pytest_configure(self, config: pytest.Config) -> None:
        """Collect the input's cases and nothing else: each case of a file under the rootdir by
        its node id; a built-in suite's (``pytest_attnperf/families/...``, outside a checkout)
        through ``--attnperf-suites``, whose other cases are deselected."""
        config.args = [f"{config.rootpath}{os.sep}{n}" for n in self.nodeids
                       if (config.rootpath / n.split("::", 1)[0]).exists()]
        config.args_source = pytest.Config.ArgsSource.ARGS

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Only the input's cases (a built-in suite's module brings all of its own)."""
        chosen = set(self.nodeids)
        dropped = [item for item in items if case_key(item) not in chosen]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if case_key(item) in chosen]


def centres_ms(baseline: BaselineFile) -> dict[str, float]:
    """Each readable entry's centre (``gate.centre_ms``) in ``baseline`` (a BaselineFile)."""
    out = {}
    for nodeid in baseline.entries:
        try:
            summary = baseline.summary(nodeid)
        except (KeyError, TypeError, ValueError):
            continue
        if summary is not None:
            out[nodeid] = centre_ms(summary)
    return out
