"""pytest-attnperf's hooks and fixtures. Thin: the work lives in the modules they call.

Loading this plugin imports nothing heavy; torch is imported the first time a test asks for
the device, and only then.
"""

from __future__ import annotations

import warnings
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_attnperf import hookspecs, markers
from pytest_attnperf.families import parametrize as suite
from pytest_attnperf.families.builtin import CALLS
from pytest_attnperf.families.registry import KernelRegistry, import_ahead
from pytest_attnperf.fixture import PENDING_KEY, Perf
from pytest_attnperf.hw.detect import detect_device
from pytest_attnperf.hw.table import DetectedDevice, HardwareSpec
from pytest_attnperf.measure.overhead import NO_CUDA
from pytest_attnperf.measure.timing import REPLAY_CLOCK
from pytest_attnperf.options import add_options, read_settings
from pytest_attnperf.parallel import fleet
from pytest_attnperf.plugins import autotune, catalogue, failures, guard, history, results, timeline, xdist
from pytest_attnperf.plugins.autotune import AutotunePlugin
from pytest_attnperf.plugins.history import HistoryRecorder
from pytest_attnperf.plugins.pool import POOL_RUN, POOL_RUNS, PoolRun, PoolRuns
from pytest_attnperf.plugins.results import Results
from pytest_attnperf.report.summary import BENCHMARK_CLOCK, outside_summary, summary_lines
from pytest_attnperf.session import SESSION_KEY, AttnPerfSession, get_session
from pytest_attnperf.store import status

CALL_PASSED_KEY = pytest.StashKey[bool]()  # the call phase passed; committed at teardown
STATUS_KEY = pytest.StashKey[Path | None]()  # where attnperf-run reads the exit status pytest decided

# -- configuration --------------------------------------------------------------------------


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Add attnperf's hook specifications."""
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add attnperf's command-line options and ini keys."""
    add_options(parser)
    catalogue.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers, the timeline, the run's session and the case guard, and the plugins
    this run needs besides (``_optional_plugins``); an explicit ``--hw`` is checked here."""
    for line in markers.MARKERS:
        config.addinivalue_line("markers", line)
    if not fleet.is_worker(config):  # registered first, so its end-of-run writing follows the other plugins'
        config.pluginmanager.register(Results(config), results.NAME)
    config.stash[STATUS_KEY] = status.take_path()  # taken before any worker or pool run is started
    _output_folders(config)
    config.stash[timeline.KEY] = clock = timeline.Timeline.begin()
    config.pluginmanager.register(clock, "attnperf-timeline")  # the run's stages; the tests' phases from their reports
    config.stash[failures.KEY] = failed = failures.Failures()
    config.pluginmanager.register(failed, failures.NAME)  # the attention cases that failed, for the report
    pool_run = PoolRun.given(config)  # a pool run of --attnperf-processes: its input file read
    session = AttnPerfSession(config, pool_run.settings if pool_run is not None else read_settings(config))
    config.stash[SESSION_KEY] = session
    config.stash[suite.RUN_KEY] = session  # what parametrizing reads: the device and the kernels
    xdist.configure(config, session)  # under pytest-xdist: a worker's GPU, before anything starts CUDA
    config.pluginmanager.register(guard.CaseGuard(config, session.settings.case_timeout_s), guard.NAME)
    catalogue.configure(config)  # the correctness catalogue's tier and its coverage report
    for plugin, name in _optional_plugins(config, session, pool_run):
        config.pluginmanager.register(plugin, name)
    if session.settings.hw is not None and session.fleet is None:  # a controller opens no device: its workers check
        session.hardware  # noqa: B018 - an explicit --hw is checked at start-up


def _output_folders(config: pytest.Config) -> None:
    """The folder of pytest-benchmark's ``--benchmark-json`` made now, where it is missing (its file
    is written at the run's end, and a missing folder lost the run's JSON then); one that cannot be
    made is a usage error naming it, before anything runs."""
    path = config.getoption("benchmark_json", None)
    if not isinstance(path, Path) or getattr(config, "workerinput", None) is not None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise pytest.UsageError(f"attnperf: --benchmark-json={path}: its folder cannot be made: {exc}") from None


def _optional_plugins(
    config: pytest.Config, session: AttnPerfSession, pool_run: PoolRun | None,
) -> list[tuple[object, str]]:
    """The plugin objects of machinery this run uses, each holding its own state: a pool run's
    input (``PoolRun``), the pool runs of ``--attnperf-processes`` above 1 (``PoolRuns``; not on a
    pytest-xdist controller, whose workers start them), Triton's cache and its recorded autotune
    choices (``AutotunePlugin``; not with ``--attnperf-triton-cache=off`` or in a pool run). None
    of them when only collecting, and no pool runs when only checking."""
    s = session.settings
    plugins: list[tuple[object, str]] = []
    if config.option.collectonly:
        return [(pool_run, POOL_RUN)] if pool_run is not None else []
    if pool_run is not None:
        plugins.append((pool_run, POOL_RUN))
    elif s.processes > 1 and not s.check_only and not fleet.is_controller(config):
        plugins.append((PoolRuns(session, ahead=import_ahead), POOL_RUNS))
    if history.wanted(config, session) and not fleet.is_controller(config):  # those that measure append
        plugins.append((HistoryRecorder(session), history.NAME))
    root = autotune.cache_root(config) if pool_run is None else None
    if root is not None:
        plugins.append((AutotunePlugin(session, root), autotune.NAME))
    return plugins


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Under ``attnperf-run``: the exit status pytest decided, the cases left unjudged and those a
    dead pytest-xdist worker left unrun, written for it to check (``store.status``): an exit
    handler that ends the process after this cannot change how the run is read."""
    path = config.stash.get(STATUS_KEY, None)
    session = config.pluginmanager.get_plugin("session")
    if path is None or session is None:
        return
    state = config.stash.get(SESSION_KEY, None)
    unjudged = sum(row.status == "unjudged" for row in state.rows) if state is not None else 0
    not_run = len(state.fleet.not_run) if state is not None and state.fleet is not None else 0
    try:
        status.write(path, int(session.exitstatus), unjudged, not_run)
    except OSError as exc:  # attnperf-run then reads no status: no pass
        config.get_terminal_writer().line(f"attnperf: the run's exit status could not be written to {path}: {exc}",
                                          red=True)


@pytest.hookimpl(trylast=True)
def pytest_attnperf_visible_gpus(config: pytest.Config) -> list[str]:
    """``CUDA_VISIBLE_DEVICES``'s list, else one index per device NVML or torch counts."""
    return fleet.visible_gpus()


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before pytest-xdist's own count of CPUs
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per visible GPU (none: pytest-xdist's own count, one per CPU)."""
    if not xdist.planned(config):
        return None  # a project that merely has the plugin installed: pytest-xdist's own count
    gpus = config.hook.pytest_attnperf_visible_gpus(config=config)
    return len(gpus) if gpus else None


@pytest.hookimpl(trylast=True)
def pytest_attnperf_detect_device(config: pytest.Config) -> DetectedDevice:
    """CUDA device 0 when torch sees one, else the CPU."""
    return detect_device()


# -- collection and running -----------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, Any]:
    """``--attnperf-suites`` (and ``--attnperf-model``: the models' suite): the built-in suite modules join
    the session's top-level collectors; a module that declares a table but collects no test fails
    its collection, saying what is missing."""
    report = yield
    if isinstance(collector, pytest.Session) and report.passed:
        settings = get_session(collector.config).settings
        names = settings.suites + (("models",) if settings.models else ())  # --attnperf-model: the models' suite
        if names:
            report.result.extend(suite.suite_modules(collector, names))
    if isinstance(collector, pytest.Module) and report.passed and not report.result:
        module = collector.obj  # imported: its collection passed
        tests = [name for name, value in vars(module).items() if name.startswith("test") and callable(value)]
        if hasattr(module, "ATTNPERF_CASES") and not tests:  # (not one whose every combination was removed)
            report.outcome = "failed"
            report.longrepr = (f"attnperf: {collector.nodeid} declares ATTNPERF_CASES but holds no test to run them: "
                               "import the family's test function (from pytest_attnperf.families.softmax.suite "
                               "import test_softmax) or define one taking case, kernel and direction")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Generator[None, Any, Any]:
    """A test function's parametrized items, less the kernel x case combinations the kernel cannot take.
    A mistake in the project's glue found here (a case row, a kernel's signature) is the module's
    collection error, its message alone (pytest shows a ``CollectError`` without the frames)."""
    try:
        made = yield
        return suite.remove_invalid(collector.config, made) if isinstance(made, list) else made
    except pytest.UsageError as exc:
        raise collector.CollectError(str(exc)) from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module declaring ``ATTNPERF_FAMILY`` and ``ATTNPERF_CASES`` is a suite: kernels x cases x directions."""
    suite.generate(metafunc)


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark's, which reads the fixture names
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Before pytest-benchmark: group a shape's cases for pytest-xdist, check the markers, and make each
    attnperf test a benchmark timed on the device clock."""
    xdist.add_groups(config, items)  # a pytest-xdist worker under --dist loadgroup: a shape's cases together
    benchmarking = config.pluginmanager.hasplugin("benchmark") and not get_session(config).settings.check_only
    suite.check_unique(items)
    for item in items:
        markers.check_marker_args(item)
        names = getattr(item, "fixturenames", None)
        if benchmarking and names is not None and "attnperf" in names:
            # pytest-benchmark then treats the test as a benchmark from the start: its skip and
            # only options act before anything is measured, and its timer is the device clock
            if "benchmark" not in names:
                names.append("benchmark")
            theirs = item.get_closest_marker("benchmark")
            kwargs = dict(theirs.kwargs) if theirs else {}
            kwargs["timer"] = REPLAY_CLOCK
            item.add_marker(pytest.mark.benchmark(**kwargs), append=False)


def pytest_collection_finish(session: pytest.Session) -> None:
    """After collection, before any test: the baseline file's problems, and the sample overhead
    and ceilings (Triton's cache comes before, and the pool runs after: their plugins')."""
    state = get_session(session.config)
    if "registry" in vars(state):  # built: some module was parametrized (a kernel in a misspelt family joins none)
        suite.check_families(session.config, state.registry, tuple(CALLS))
    _name_baseline_problems(session.config, session.items)  # the file's problems, before any test
    if not state.settings.check_only:  # nothing is timed then
        xdist.prepare(state, session.items)  # the sample overhead and the ceilings, before any test


def _name_baseline_problems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """At start-up, when measured cases are selected: the baseline file read once and its problems
    named on the terminal before anything is measured (``BaselineKeeper.startup_lines``)."""
    if config.option.collectonly or not any("attnperf" in getattr(i, "fixturenames", ()) for i in items):
        return
    keeper = get_session(config).baselines
    try:
        keeper.path  # noqa: B018 - the device lookup every measured case makes anyway
    except Exception:  # noqa: BLE001 - each measured case meets the error itself
        return
    lines = keeper.startup_lines()
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and lines:
        reporter.ensure_newline()
        for line in lines:
            reporter.write_line(line, yellow=True)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test whose ``attnperf_requires_hw`` marker this device does not meet."""
    mark = item.get_closest_marker("attnperf_requires_hw")
    if mark is not None:
        session = get_session(item.config)
        why = markers.requirement_failure(mark, session.device, session.hardware.name)
        if why:
            pytest.skip(why)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """Under ``attnperf_sdpa_backend``: the call with SDPA pinned to that backend, skipped when the
    backend is not available for the case."""
    mark = item.get_closest_marker("attnperf_sdpa_backend")
    if mark is None:
        return (yield)
    backend = mark.args[0]
    reason = None
    try:
        # record under the filters in force (a -W error still raises), to quote torch's reasons
        with warnings.catch_warnings(record=True) as seen:
            try:
                with markers.pin_backend(backend):
                    result = yield
            except RuntimeError as exc:
                reason = markers.unavailable_reason(exc, [str(w.message) for w in seen])
                if reason is None:
                    raise
    finally:
        for w in seen:  # hand the test's warnings on to pytest, now that recording has stopped
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if reason is not None:
        where = get_session(item.config).device.name
        pytest.skip(f"attnperf_sdpa_backend('{backend}') cannot run on {where}: {reason}")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Commit a test's baseline entry once its call and teardown have passed (kept on the item
    for a pytest-xdist worker's ``xdist.Worker``, which sends the case to the controller)."""
    report = yield
    passed = report.passed and not hasattr(report, "wasxfail")  # an unexpected pass is no baseline
    if report.when == "call":  # set on every call, so a rerun's earlier attempt never counts
        item.stash[CALL_PASSED_KEY] = passed and PENDING_KEY in item.stash
    elif report.when == "teardown":
        entry = None
        if report.passed and item.stash.get(CALL_PASSED_KEY, False):
            # committed once teardown passed too: a fixture that fails after the measurement
            # (a leak check, say) keeps the test's entry out of the baseline
            entry = item.stash[PENDING_KEY]
            get_session(item.config).baselines.commit(fleet.case_key(item), entry)
        item.stash[xdist.COMMITTED_KEY] = entry  # this attempt's: a rerun's earlier entry never travels
    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The attnperf section of the terminal summary: removed combinations, rows, floors, workers,
    pool runs, baselines, autotune and the timeline."""
    state = get_session(config)
    gone = suite.removed(config)
    opted_out = suite.opted_out_lines(config)
    checked = state.checked_only
    fleet_lines = xdist.summary_lines(state)
    pool_runs, autotuning = PoolRuns.of(config), AutotunePlugin.of(config)
    pooled = pool_runs is not None and pool_runs.results is not None
    written = Results.of(config)  # none in a pytest-xdist worker: the controller's summary says it all
    reruns = written.reruns() if written is not None else {}
    if not (state.rows or state.baselines.write_note is not None or gone or opted_out or pooled or checked
            or fleet_lines or reruns):
        return
    terminalreporter.section("attnperf")
    for line in fleet_lines:
        terminalreporter.write_line(line)
    if gone:
        terminalreporter.write_line(f"{len(gone)} kernel x case combinations removed at collection:")
        for reason, count in suite.count_reasons(gone).items():
            terminalreporter.write_line(f"  {count:4d} x {reason}")
    for line in opted_out:
        terminalreporter.write_line(line)
    if checked:
        terminalreporter.write_line(f"{checked} cases checked only (--attnperf-check-only): correctness "
                                    "checked; nothing timed, gated or recorded")
    if state.rows:
        drift = xdist.merged_drift(state) if state.fleet is not None else state.baselines.drift()
        for line in summary_lines(state.rows, state.hardware.name, drift):
            terminalreporter.write_line(line)
        overhead_ms, how = state.overhead.figure or (None, NO_CUDA)
        if overhead_ms is not None:
            terminalreporter.write_line(f"sample overhead ({how}): {1e3 * overhead_ms:.2f} us")
        elif how != NO_CUDA:  # it failed on a GPU: say why
            terminalreporter.write_line(f"sample overhead not measured: {how}")
        for refused in sorted(state.overhead.refusals):
            terminalreporter.write_line(f"sample overheads not used: {refused}")
    for line in pool_runs.summary_lines() if pool_runs is not None else ():
        terminalreporter.write_line(line)
    keeper = state.baselines
    for note in (keeper.gating_note(row.nodeid for row in state.rows), keeper.write_note, keeper.record_note,
                 keeper.ignore_note):
        if note:
            terminalreporter.write_line(f"baselines: {note}")
    recorder = HistoryRecorder.of(config)
    appended = recorder.summary_line() if recorder is not None else None
    if appended:
        terminalreporter.write_line(appended)
    clock = config.stash.get(timeline.KEY, None)
    for line in [clock.measure_line() if clock is not None else None,
                 *(autotuning.summary_lines() if autotuning is not None else ()),
                 clock.line(distributed=state.fleet is not None) if clock is not None and state.rows else None]:
        if line:
            terminalreporter.write_line(line)
    if written is not None and written.report_note is not None:
        terminalreporter.write_line(f"report: {written.report_note}")
    if written is not None and written.pr_note is not None:
        terminalreporter.write_line(f"pull-request comment: {written.pr_note}")
    if reruns:
        terminalreporter.write_line(f"re-run a failed case alone ({len(reruns)}), from {config.rootpath}:")
        for key in sorted(reruns):
            terminalreporter.write_line(f"  {reruns[key]}")
    _unjudged_last(terminalreporter, state)


def _unjudged_last(terminalreporter: Any, state: AttnPerfSession) -> None:
    """The section's last line, where cases went unjudged: how many, and whether they failed
    (``--attnperf-require-baseline``) or passed unjudged; and the count in pytest's last line
    ("2 passed, 2 unjudged in 3.1s"), so a run that judged nothing never reads as plain green."""
    unjudged = [row for row in state.rows if row.status == "unjudged"]
    if not unjudged:
        return
    n = len(unjudged)
    cases = f"{n} case{'s' if n != 1 else ''}"
    if state.settings.require_baseline:
        outcome = "each FAILED, since --attnperf-require-baseline asks that every case be judged"
    else:
        outcome = "they passed without being judged (--attnperf-require-baseline fails them)"
    terminalreporter.write_line(f"UNJUDGED: {cases} of {len(state.rows)} timed on a contended host were not "
                                f"judged against their baselines; {outcome}; rerun on an idle host", yellow=True)
    terminalreporter.stats.setdefault("unjudged", []).extend(UnjudgedCount(row.nodeid) for row in unjudged)
    recolour = getattr(terminalreporter, "_set_main_color", None)
    if callable(recolour):  # pytest's last line counts a status it did not know before in its colour
        recolour()


class UnjudgedCount:
    """One unjudged case in the terminal reporter's ``stats``, which its last line counts."""

    count_towards_summary = True

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config: pytest.Config, benchmarks: Any, output_json: dict[str, Any]) -> None:
    """attnperf's cases in pytest-benchmark's JSON: parameters as plain data (a case's fields,
    the kernel's name, the direction) and the timer named by the clock that took the samples."""
    for bench in output_json.get("benchmarks", []):
        extra = bench.get("extra_info") or {}
        if BENCHMARK_CLOCK not in extra:
            continue
        if isinstance(bench.get("params"), dict):
            bench["params"] = suite.plain_params(bench["params"])  # a new dict: the test's own stays
        if isinstance(bench.get("options"), dict):
            bench["options"] = {**bench["options"], "timer": f"attnperf {extra['attnperf_clock']} clock"}


@pytest.hookimpl(wrapper=True, optionalhook=True)
def pytest_benchmark_group_stats(config: pytest.Config, benchmarks: Any, group_by: str) -> Generator[None, Any, Any]:
    """pytest-benchmark's terminal table without the cases attnperf's summary shows, unless
    ``--attnperf-benchmark-table`` or a comparison (``--benchmark-compare``, whose table and
    ``--benchmark-compare-fail`` check need them) is asked for. pytest-benchmark has no option that
    hides only attnperf's rows (``--benchmark-quiet`` hides every benchmark's table and its notes
    of what it wrote), so this is its documented grouping hook: the grouped stats feed the table
    only, and are made after the JSON and saved runs are written."""
    groups = yield
    state = config.stash.get(SESSION_KEY, None)
    comparing = config.getoption("benchmark_compare", None) or config.getoption("benchmark_compare_fail", None)
    if state is None or state.settings.benchmark_table or comparing:
        return groups
    return outside_summary(list(groups))


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def attnperf_device(request: pytest.FixtureRequest) -> Any:
    """The torch.device this run measures on: CUDA device 0 when present, else the CPU."""
    import torch  # noqa: PLC0415 - torch loads when a test first asks for the device, not at start-up

    return torch.device("cuda", 0) if get_session(request.config).device.is_gpu else torch.device("cpu")


@pytest.fixture(scope="session")
def attnperf_seed(request: pytest.FixtureRequest) -> int:
    """The run's ``--attnperf-seed``: mixed into every case's input draw (0: the usual inputs)."""
    return get_session(request.config).settings.seed


@pytest.fixture(scope="session")
def attnperf_gpu(request: pytest.FixtureRequest) -> Any:
    """The CUDA torch.device; the test is skipped, with the reason, when there is none."""
    import torch  # noqa: PLC0415 - torch loads when a test first asks for the device, not at start-up

    if not get_session(request.config).device.is_gpu:
        pytest.skip("needs a CUDA GPU; torch.cuda.is_available() is False on this machine")
    return torch.device("cuda", 0)


@pytest.fixture(scope="session")
def attnperf_hw(request: pytest.FixtureRequest) -> HardwareSpec:
    """The hardware spec of this run (``--hw`` or detected): peaks, bandwidth, L2, sources."""
    return get_session(request.config).hardware


@pytest.fixture(scope="session")
def attnperf_registry(request: pytest.FixtureRequest) -> KernelRegistry:
    """Every registered kernel: the built-in ones and those added by
    ``pytest_attnperf_register_kernels`` hooks."""
    return get_session(request.config).registry


@pytest.fixture
def attnperf(request: pytest.FixtureRequest) -> Perf:
    """Times a callable on the device and gates it against the baseline.

    ``result = attnperf.measure(fn, cost=costs.softmax_attention(...), dtype="bf16")``
    returns median device time, TFLOP/s, MFU, GB/s, bandwidth fraction and peak memory, and
    fails the test when the case regressed beyond the tolerance against baselines/<hw>.yaml.
    """
    perf = Perf(request, get_session(request.config), PoolRuns.of(request.config), HistoryRecorder.of(request.config))
    return timeline.clock_measure(perf, request.node)
