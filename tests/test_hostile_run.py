"""No green run that judged nothing: the exit status is decided where the kernel cannot reach it
(``attnperf-run``), exit handlers and threads a kernel leaves are named and cost its case, a
contended host's unjudged cases are counted in the run's last lines and fail under
``--attnperf-require-baseline``.

Mostly units with fakes: the wrapper with a scripted child, the guard's parts in this process,
the gate's policy on plain numbers; the two pytester runs use the scripted ticked clock of
``test_contended_host``, so nothing depends on this machine's load.
"""

from __future__ import annotations

import atexit
import importlib
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kit import PLUGIN_NO_CEILINGS as PLUGIN
from kit import TESTS, conftest, make_project
from test_contended_host import TICKED_TIMER  # a scripted clock on whole 8 ms ticks

from pytest_attnperf import plugin
from pytest_attnperf.gate import policy
from pytest_attnperf.gate.policy import GateTerms, Here
from pytest_attnperf.measure import isolation, process
from pytest_attnperf.measure.contention import CONTENDED, HostLoad, contention_note, overloaded, own_running
from pytest_attnperf.measure.sampling import Measurement
from pytest_attnperf.measure.summary import Summary
from pytest_attnperf.store import status

# -- the exit status, decided outside the pytest process ---------------------------------------

CHILD = f'''
import json, os, sys
path = os.environ["{status.STATUS_ENV}"]
if sys.argv[1] != "none":
    with open(path, "w") as out:
        json.dump({{"exitstatus": int(sys.argv[1]), "unjudged": 0, "pid": os.getpid()}}, out)
os._exit(int(sys.argv[2]))
'''


def child(recorded: str, ends: int, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """attnperf-run around a scripted child that records ``recorded`` ("none": nothing) and ends
    with ``ends`` through the real ``os._exit``."""
    code = status.main([recorded, str(ends)], command=[sys.executable, "-c", CHILD])
    return code, capsys.readouterr().err


def test_an_exit_0_after_a_failing_run_is_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = child("1", 0, capsys)
    assert code == 1
    assert "pytest decided exit status 1, but the process ended with 0" in err


def test_a_run_that_ends_0_without_recording_its_status_is_no_pass(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = child("none", 0, capsys)
    assert code == status.DIED
    assert "without recording how the run went" in err


@pytest.mark.parametrize(("recorded", "ends", "final"), [("0", 0, 0), ("1", 1, 1), ("0", 1, 1), ("none", 2, 2),
                                                         ("5", 0, 5)])
def test_agreeing_or_failing_statuses_pass_through(recorded: str, ends: int, final: int,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, err = child(recorded, ends, capsys)
    assert code == final
    assert bool(err) == (recorded not in ("none", str(ends)))  # a line only where they disagree


def test_a_run_that_configures_nothing_to_its_end_passes_its_status_through() -> None:
    assert status.decide(0, None, ["--version"]) == (0, None)
    assert status.decide(0, None, ["tests/"])[0] == status.DIED


def test_the_status_file_is_taken_out_of_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(status.STATUS_ENV, str(tmp_path / "s.json"))
    assert status.take_path() == tmp_path / "s.json"
    assert status.STATUS_ENV not in os.environ  # workers and pool runs started after do not write it
    status.write(tmp_path / "s.json", 1, 2)
    assert status.read(tmp_path / "s.json") == {"exitstatus": 1, "unjudged": 2, "pid": os.getpid()}
    (tmp_path / "t.json").write_text('{"exitstatus": true}')
    assert status.read(tmp_path / "t.json") is None


FAILS_THEN_EXITS_0 = '''
import atexit
from os import _exit  # the real one, taken at import: no guard on os reaches it

atexit.register(lambda: _exit(0))


def test_fails():
    assert False
'''


def test_a_failing_run_whose_exit_handler_calls_the_real_os_exit_0_exits_1_under_attnperf_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The plugin's own record, end to end: pytest alone exits 0 here."""
    test = tmp_path / "test_exits.py"
    test.write_text(FAILS_THEN_EXITS_0)
    code = status.main(["-q", "-p", "no:cacheprovider", "-p", "pytest_attnperf.plugin", str(test)])
    assert code == 1
    assert "pytest decided exit status 1, but the process ended with 0" in capsys.readouterr().err


# -- exit handlers and threads a kernel leaves ---------------------------------------------------


def kernel_exit_handler() -> None:
    """What a hostile kernel's exit handler would be (never run: unregistered)."""
    raise AssertionError("an unregistered exit handler ran")


REGISTERS = '''
import atexit
from pytest_attnperf.measure import process

def kernel_exit_handler():
    print("the kernel's exit handler ran")

with process.ExitRefusal() as exits:
    atexit.register(kernel_exit_handler)
    {inside}
print(exits.handlers)
'''


@pytest.mark.parametrize("inside", ["pass", "atexit.register(print, 'a second handler ran')"])
def test_an_exit_handler_a_kernel_registers_is_named_and_unregistered(inside: str) -> None:
    ran = subprocess.run([sys.executable, "-c", REGISTERS.format(inside=inside)], capture_output=True, text=True,
                         check=True)
    lines = ran.stdout.splitlines()
    handlers = eval(lines[0])  # noqa: S307 - the list the script printed
    assert handlers[0] == "atexit.register(__main__.kernel_exit_handler) at <string>:9 in <module>"
    assert len(handlers) == 1 + (inside != "pass")
    assert lines[1:] == []  # neither ran at the interpreter's exit
    assert atexit.register.__name__ == "register"


def test_a_librarys_exit_handler_registered_during_a_case_stays() -> None:
    library = {"__name__": "torch._inductor.fake", "atexit": atexit, "handler": kernel_exit_handler}
    with process.ExitRefusal() as exits:
        exec("atexit.register(handler)", library)  # noqa: S102 - code whose module is a library's
    try:
        assert exits.handlers == []
    finally:
        atexit.unregister(kernel_exit_handler)


def test_an_exit_handler_a_module_registers_as_the_kernel_first_imports_it_stays(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "imaging_lib.py").write_text("import atexit\n\ndef clear_cache():\n    pass\n\n"
                                             "atexit.register(clear_cache)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "imaging_lib", raising=False)
    with process.ExitRefusal() as exits:
        imported = importlib.import_module("imaging_lib")  # a kernel's first call importing a library (PIL does this)
    try:
        assert exits.handlers == []
    finally:
        atexit.unregister(imported.clear_cache)


MONITOR = """import atexit, threading

stop = threading.Event()

def _at_exit():
    stop.set()

def start():
    atexit.register(_at_exit)
    threading.Thread(target=stop.wait, args=(60,), name="lib-monitor", daemon=True).start()
"""


def test_an_installed_librarys_handler_and_thread_started_during_the_call_are_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed = tmp_path / "site-packages"
    installed.mkdir()
    (installed / "monitor_lib.py").write_text(MONITOR)  # as tqdm starts its monitor inside torch's compiler
    monkeypatch.syspath_prepend(str(installed))
    monkeypatch.delitem(sys.modules, "monitor_lib", raising=False)
    lib = importlib.import_module("monitor_lib")
    before = process.thread_idents()
    with process.ExitRefusal() as exits:
        lib.start()
    try:
        assert exits.handlers == []
        assert process.new_threads(before) == []
    finally:
        lib.stop.set()
        atexit.unregister(lib._at_exit)


def test_the_guard_fails_a_case_that_registered_an_exit_handler() -> None:
    state = isolation.CaseState.take()
    with process.ExitRefusal() as exits:
        atexit.register(kernel_exit_handler)
    findings = isolation.undo(state, None, exits)
    assert [f.what for f in findings] == ["registered an exit handler"]
    assert "kernel_exit_handler" in findings[0].failure("case")


def busy_kernel_thread(stop: threading.Event) -> None:
    """A kernel's own thread: its code is on the thread's stack while it waits."""
    stop.wait(60)


def test_a_thread_a_kernel_leaves_running_is_named_and_fails_its_case() -> None:
    state = isolation.CaseState.take()
    stop = threading.Event()
    left = threading.Thread(target=busy_kernel_thread, args=(stop,), name="hostile-spinner", daemon=True)
    left.start()
    try:
        findings = isolation.undo(state, None, process.ExitRefusal())
    finally:
        stop.set()
        left.join()
    assert [f.what for f in findings] == ["left threads running"]
    text = findings[0].failure("case")
    assert "thread 'hostile-spinner'" in text
    assert f"target {__name__}.busy_kernel_thread" in text
    assert "their load is this kernel's" in text


def test_an_idle_library_pool_a_case_started_is_not_a_thread_left_running() -> None:
    before = process.thread_idents()
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(int).result()
        assert process.new_threads(before) == []  # its worker waits for work in the standard library


def test_this_processs_own_running_threads_are_not_the_hosts_load(tmp_path: Path) -> None:
    me = threading.get_native_id()
    for tid, state in ((me, "R"), (me + 1, "R"), (me + 2, "S"), (me + 3, "R")):
        (tmp_path / str(tid)).mkdir()
        (tmp_path / str(tid) / "stat").write_text(f"{tid} (python3) {state} 1 2 3")
    assert own_running(str(tmp_path)) == 2  # the reader's own thread left out
    assert overloaded([HostLoad(5.0, 2, own=3)]) is None  # 2.0 on 2 cores: the rest was this kernel's
    assert contention_note([1.0] * 20, [HostLoad(7.0, 2, own=1)]) == (
        f"{CONTENDED}: load 6.0 (less 1 of this process's own threads) on 2 cores")


# -- unjudged cases: counted, failed under --attnperf-require-baseline -------------------------

TERMS = GateTerms(tolerance=0.1, run_noise=0.01, run_noise_time_ms=0.0, machine_noise=0.0, machine_offset_ms=0.0,
                  machine_residual_ms=0.0, hot_sample_ms=20.0)
HERE = Here("box", lambda: None)


def contended_decision(required: bool) -> policy.Decision:
    measured = Measurement((99.0,) * 20, clock="host", mode="host", notes=(f"{CONTENDED}: load 5.0 on 2 cores",))
    entry = {"median_ms": 1.0, "ci_low_ms": 0.99, "ci_high_ms": 1.01, "stdrel": 0.01, "n_samples": 20,
             "mode": "host", "clock": "host"}
    terms = GateTerms(**{**vars(TERMS), "require_baseline": required})
    return policy.decide(measured, entry, Summary.from_mapping(entry), terms, HERE)


def test_an_unjudged_case_passes_unless_every_case_must_be_judged() -> None:
    assert contended_decision(False).verdict.status == "unjudged"
    assert not contended_decision(False).verdict.failed
    required = contended_decision(True).verdict
    assert required.status == "unjudged"
    assert required.failed
    assert "--attnperf-require-baseline is set, so a case the gate could not judge fails" in required.message


class Reporter:
    """What ``_unjudged_last`` asks of pytest's terminal reporter."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.stats: dict[str, list[Any]] = {"passed": [object()] * 3}
        self.recoloured = False

    def write_line(self, line: str, **markup: bool) -> None:
        self.lines.append(line)

    def _set_main_color(self) -> None:
        self.recoloured = True


class State:
    def __init__(self, statuses: list[str], required: bool) -> None:
        self.rows = [SimpleNamespace(nodeid=f"t[{i}]", status=s) for i, s in enumerate(statuses)]
        self.settings = type("S", (), {"require_baseline": required})()


@pytest.mark.parametrize("required", [False, True])
def test_a_run_with_unjudged_cases_ends_with_a_line_counting_them(required: bool) -> None:
    reporter = Reporter()
    plugin._unjudged_last(reporter, State(["unjudged", "unchanged", "unjudged"], required))  # type: ignore[arg-type]
    assert len(reporter.lines) == 1
    assert reporter.lines[0].startswith("UNJUDGED: 2 cases of 3 timed on a contended host were not judged")
    assert ("each FAILED" in reporter.lines[0]) == required
    assert len(reporter.stats["unjudged"]) == 2  # pytest's last line: "..., 2 unjudged in ..."
    assert reporter.recoloured


def test_a_run_with_every_case_judged_says_nothing_of_it() -> None:
    reporter = Reporter()
    plugin._unjudged_last(reporter, State(["unchanged"], True))  # type: ignore[arg-type]
    assert reporter.lines == []
    assert "unjudged" not in reporter.stats




# pytest's last line: the outcome, warnings if a run had any (an import's, say), then the unjudged count
LAST_LINE = r"{}, (\d+ warnings?, )?2 unjudged in "


def test_on_a_contended_host_require_baseline_fails_every_unjudged_case_and_the_last_lines_count_them(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project = make_project(pytester, conftest("cpu") + TICKED_TIMER, test_cases=TESTS)
    project.runpytest(*PLUGIN, "--hw=cpu", "--update-baselines").assert_outcomes(passed=2)
    monkeypatch.setenv("TICKED", "1")
    passed = project.runpytest(*PLUGIN, "--hw=cpu")
    passed.assert_outcomes(passed=2)
    assert passed.ret == 0
    assert re.match(LAST_LINE.format("2 passed"), passed.stdout.lines[-1].lstrip("= "))
    failed = project.runpytest(*PLUGIN, "--hw=cpu", "--attnperf-require-baseline")
    failed.assert_outcomes(failed=2)
    failed.stdout.fnmatch_lines(["*UNJUDGED: host contended: samples quantised at 8.0 ms*"
                                 "--attnperf-require-baseline is set, so a case the gate could not judge fails",
                                 "UNJUDGED: 2 cases of 2 timed on a contended host were not judged against their "
                                 "baselines; each FAILED*"])
    assert re.match(LAST_LINE.format("2 failed"), failed.stdout.lines[-1].lstrip("= "))
