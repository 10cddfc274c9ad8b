"""A pytest-xdist worker that dies ends the run; every collected case is still accounted for: the
one it died in fails, and each case no worker ran is an error naming the dead worker."""

from __future__ import annotations

import json
import re

import kit
import pytest

from pytest_attnperf.store import status

pytest.importorskip("xdist")

PLUGIN = (*kit.PLUGIN, "-p", "no:randomly")

CONFTEST = '''
from pathlib import Path


def pytest_testnodedown(node, error):
    """The controller: a worker died (the cases below wait for it, so some are left to run)."""
    if error is not None:
        (Path(__file__).parent / "died").write_text(str(node.gateway.id))
'''

TESTS = '''
import os
import time
from pathlib import Path

import pytest


def test_crash():
    os._exit(1)


@pytest.mark.parametrize("n", range(7))
def test_case(n):
    """Waits until the controller has taken in the death, so the surviving worker cannot run
    every case first, whatever the load; the bound only turns a missing death into a failure."""
    deadline = time.monotonic() + 300
    while not (Path(__file__).parent / "died").exists():
        assert time.monotonic() < deadline, "no worker died"
        time.sleep(0.01)
'''

CRASH = "test_cases.py::test_crash"
COLLECTED = [CRASH, *(f"test_cases.py::test_case[{n}]" for n in range(7))]


def test_a_dead_worker_leaves_no_case_unreported(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-n 2`` and a case that calls ``os._exit(1)``: the run fails, the crashed case is reported
    as failed, every case never run as an error naming the worker that died and that case; pytest's
    last line, the attnperf summary and the recorded run status count them, and the outcomes add up
    to the collected count."""
    kit.make_project(pytester, CONFTEST, ini="attnperf_baselines = baselines\n", test_cases=TESTS)
    monkeypatch.setenv(status.STATUS_ENV, str(pytester.path / "status.json"))
    result = pytester.runpytest(*PLUGIN, "-n", "2", "-rA")
    out = result.stdout.str()

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # xdist's message, in the FAILURES section and, when the terminal is wide enough, in the summary
    crashed = set(re.findall(r"worker '(gw\d)' crashed while running '([^']+)'", out))
    assert len(crashed) == 1
    dead, case = crashed.pop()
    assert case == CRASH
    assert (pytester.path / "died").read_text() == dead

    outcomes = kit.outcomes(result)
    assert sorted(outcomes) == sorted(COLLECTED)  # each collected case reported exactly once, by its node id
    assert outcomes[CRASH] == "FAILED"
    errors = [nodeid for nodeid, outcome in outcomes.items() if outcome == "ERROR"]
    passed = [nodeid for nodeid, outcome in outcomes.items() if outcome == "PASSED"]
    assert errors  # the surviving worker waited for the death, so cases were left
    assert len(passed) + len(errors) + 1 == len(COLLECTED)

    message = f"not run: worker {dead} died while running {CRASH}, which ended the run"
    lines = result.stdout.lines
    assert lines.count(message) == len(errors)  # in the ERRORS section, under each case's header
    for nodeid in errors:
        header = next(i for i, line in enumerate(lines) if f" ERROR at setup of {nodeid.split('::')[1]} " in line)
        assert lines[header + 1] == message

    assert f"[{len(COLLECTED)} items]" in out
    last = lines[-1]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (failed|passed|errors?)", last)}
    assert counts == {"failed": 1, "passed": len(passed), "error" if len(errors) == 1 else "errors": len(errors)}
    assert sum(counts.values()) == len(COLLECTED)
    assert (f"pytest-xdist: {len(errors)} of {len(COLLECTED)} collected cases not run, each reported as an error: "
            f"worker {dead} died while running {CRASH}, which ended the run") in lines

    recorded = json.loads((pytester.path / "status.json").read_text())
    assert recorded["exitstatus"] == pytest.ExitCode.TESTS_FAILED
    assert recorded["not_run"] == len(errors)
