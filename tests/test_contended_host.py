"""A contended CPU end to end under pytester: the host timer itself, on a scripted clock whose
samples sit on whole scheduler ticks, so its note, the gate's "unjudged" and the summary are
the plugin's own.

The clock (in the project's conftest.py) times every call at 50 us; with ``TICKED`` set in the
environment, most calls also wait one or more 8 ms ticks, as on a busy 2-core host. The load
reader says the host is idle, so the samples alone show the contention.
"""

from __future__ import annotations

import pytest
from kit import PLUGIN, TESTS, conftest, entries, make_project

TICKED_TIMER = '''

from pytest_attnperf.measure.contention import HostLoad
from pytest_attnperf.measure.sampling import HostTimer

TICKED_MS = (0.05, 8.05, 8.05, 16.05, 8.05)  # a 50 us call, most samples held up by whole 8 ms ticks


class TickedClock:
    """A nanosecond clock: each second reading is the next call's duration after the first."""

    def __init__(self):
        self.now, self.turn, self.started = 0, 0, False

    def __call__(self):
        if self.started:
            durations = TICKED_MS if os.environ.get("TICKED") else (0.05,)
            self.now += round(1e6 * durations[self.turn % len(durations)])
            self.turn += 1
        self.started = not self.started
        return self.now


def pytest_attnperf_make_timer(config, device):
    return HostTimer(clock_ns=TickedClock(), load=lambda: HostLoad(0.3, 2))
'''

NOTE = "host contended: samples quantised at 8.0 ms"
# the cases' own samples make the claims: the machine's matmul and copy ceilings (a roofline no
# claim here reads, most of a run's time on the CPU) are not measured
CPU_RUN = (*PLUGIN, "--hw=cpu", "--attnperf-ceilings=off")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester, conftest("cpu") + TICKED_TIMER, test_cases=TESTS)


def test_a_contended_cpu_run_passes_unjudged_and_says_why(project: pytest.Pytester,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    project.runpytest(*CPU_RUN, "--update-baselines").assert_outcomes(passed=2)
    monkeypatch.setenv("TICKED", "1")
    result = project.runpytest(*CPU_RUN)
    result.assert_outcomes(passed=2)
    out = result.stdout.str()
    assert "REGRESSED" not in out
    result.stdout.fnmatch_lines(["attnperf on cpu: 2 measured cases (2 unjudged)",
                                 f"note: test_case?a?: {NOTE}",
                                 "note: test_case?a?: unjudged: host-clock times taken on a contended host*"])


def test_a_recording_on_a_contended_cpu_notes_it_in_the_entry(project: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TICKED", "1")
    project.runpytest(*CPU_RUN, "--update-baselines").assert_outcomes(passed=2)
    assert NOTE in entries(project, "cpu")["test_cases.py::test_case[a]"]["notes"]
