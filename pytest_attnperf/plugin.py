"""pytest-attnperf's hooks and fixtures. Thin: the work lives in the modules they call.

Loading this plugin imports nothing heavy; torch is imported the first time a test asks for
the device, and only then.
"""

from __future__ import annotations

import warnings
from collections.abc import Generator
from typing import Any

import pytest

from . import hookspecs, markers, suite
from .hardware import DetectedDevice, HardwareSpec
from .options import add_options, read_settings
from .perf import PENDING_KEY, Perf
from .registry import KernelRegistry
from .report import summary_lines
from .session import SESSION_KEY, AttnPerfSession, get_session
from .timing import REPLAY_CLOCK

CALL_PASSED_KEY = pytest.StashKey[bool]()  # the call phase passed; committed at teardown

# -- configuration --------------------------------------------------------------------------


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    for line in markers.MARKERS:
        config.addinivalue_line("markers", line)
    session = AttnPerfSession(config, read_settings(config))
    distributed = hasattr(config, "workerinput") or bool(getattr(config.option, "numprocesses", None))
    if session.settings.update_baselines and distributed:
        raise pytest.UsageError(
            "attnperf: --update-baselines cannot run under pytest-xdist (each worker would write the "
            "file on its own and lose the others' entries); run it without -n"
        )
    config.stash[SESSION_KEY] = session
    if session.settings.hw is not None:
        session.hardware  # noqa: B018 - an explicit --hw is checked at start-up


@pytest.hookimpl(trylast=True)
def pytest_attnperf_detect_device(config: pytest.Config) -> DetectedDevice:
    """CUDA device 0 when torch sees one, else the CPU."""
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return DetectedDevice(
            kind="cuda",
            name=props.name,
            capability=(props.major, props.minor),
            sm_count=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            extra={"uuid": str(getattr(props, "uuid", "") or "")},
        )
    import platform

    return DetectedDevice(kind="cpu", name=platform.processor() or platform.machine() or "cpu")


# -- collection and running -----------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark's, which reads the fixture names
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    suite.remove_invalid(config, items)
    benchmarking = config.pluginmanager.hasplugin("benchmark")
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
    get_session(session.config).check_baselines(session.items)  # the file's problems, before any test
    get_session(session.config).start_workers(session.items)  # --attnperf-processes, before any test


def pytest_runtest_setup(item: pytest.Item) -> None:
    mark = item.get_closest_marker("requires_hw")
    if mark is not None:
        session = get_session(item.config)
        why = markers.requirement_failure(mark, session.device, session.hardware.name)
        if why:
            pytest.skip(why)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    mark = item.get_closest_marker("sdpa_backend")
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
        pytest.skip(f"sdpa_backend('{backend}') cannot run on {where}: {reason}")
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    passed = report.passed and not hasattr(report, "wasxfail")  # an unexpected pass is no baseline
    if report.when == "call":  # set on every call, so a rerun's earlier attempt never counts
        item.stash[CALL_PASSED_KEY] = passed and PENDING_KEY in item.stash
    elif report.when == "teardown" and report.passed and item.stash.get(CALL_PASSED_KEY, False):
        # committed once teardown passed too: a fixture that fails after the measurement
        # (a leak check, say) keeps the test's entry out of the baseline
        get_session(item.config).pending[item.nodeid] = item.stash[PENDING_KEY]
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    if SESSION_KEY in session.config.stash:
        get_session(session.config).write_baselines()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = get_session(config)
    gone = suite.removed(config)
    if not state.rows and state.write_note is None and not gone and state.workers is None:
        return
    terminalreporter.section("attnperf")
    if gone:
        terminalreporter.write_line(f"{len(gone)} kernel x case combinations removed at collection:")
        for reason, count in suite.count_reasons(gone).items():
            terminalreporter.write_line(f"  {count:4d} x {reason}")
    if state.rows:
        for line in summary_lines(state.rows, state.hardware.name, state.drift()):
            terminalreporter.write_line(line)
        floor_ms, how = state.floor or (None, "no CUDA device")
        if floor_ms is not None:
            terminalreporter.write_line(f"sample floor ({how}): {1e3 * floor_ms:.2f} us")
        elif how != "no CUDA device":  # it failed on a GPU: say why
            terminalreporter.write_line(f"sample floor not measured: {how}")
        for refused in sorted(state.floor_refusals):
            terminalreporter.write_line(f"floors not used: {refused}")
    if state.workers is not None:
        for line in state.workers.summary(state.settings.processes_below_ms):
            terminalreporter.write_line(line)
    if state.write_note:
        terminalreporter.write_line(f"baselines: {state.write_note}")


# -- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def attnperf_device(request: pytest.FixtureRequest) -> Any:
    """The torch.device this run measures on: CUDA device 0 when present, else the CPU."""
    import torch

    return torch.device("cuda", 0) if get_session(request.config).device.is_gpu else torch.device("cpu")


@pytest.fixture(scope="session")
def attnperf_gpu(request: pytest.FixtureRequest) -> Any:
    """The CUDA torch.device; the test is skipped, with the reason, when there is none."""
    import torch

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
    return Perf(request, get_session(request.config))
