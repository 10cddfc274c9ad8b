"""Where a run's wall time goes, for the summary: start-up and collection, preparing (Triton's
cache, the baseline file, pool runs), the tests' own phases, the time between tests and
the session's end (baselines, autotune choices, report). Host wall time of the run's stages, read
with ``time.perf_counter``; nothing here times a kernel."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

__all__ = ["Timeline", "process_age_s"]

KEY = pytest.StashKey["Timeline"]()


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: ``/proc``), or None where that is unknown."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as uptime:
            up_s = float(uptime.read().split()[0])
        return max(0.0, up_s - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


@dataclass(eq=False)  # a registered plugin: pluggy keeps plugins in sets, so hashed by identity
class Timeline:
    """The run's stages, as ``time.perf_counter`` readings and sums."""

    started: float  # the process's start where known, else pytest_configure
    since_process_start: bool
    collected: float | None = None
    prepared: float | None = None
    finishing: float | None = None
    finished: float | None = None
    in_tests_s: float = 0.0  # setup + call + teardown of every test (summed over workers under xdist)
    tests: int = 0

    @classmethod
    def begin(cls) -> Timeline:
        """A timeline begun now, its start the process's own where that is known."""
        now, age = time.perf_counter(), process_age_s()
        return cls(now - (age or 0.0), age is not None)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each phase's report (a worker's too, on a pytest-xdist controller)."""
        self.in_tests_s += report.duration
        self.tests += report.when == "call"

    def line(self, distributed: bool) -> str | None:
        """The summary's line of where the run's time went; None before the run has finished, or
        without tests."""
        if None in (self.collected, self.prepared, self.finishing, self.finished) or not self.tests:
            return None
        assert self.collected is not None  # for mypy
        assert self.prepared is not None
        assert self.finishing is not None
        assert self.finished is not None
        start = "the process started" if self.since_process_start else "pytest_configure"
        total = time.perf_counter() - self.started
        parts = [f"{self.collected - self.started:.1f} s start-up and collection",
                 f"{self.prepared - self.collected:.1f} s preparing"]
        if distributed:
            parts.append(f"{self.finishing - self.prepared:.1f} s running {self.tests} tests on the workers "
                         f"({self.in_tests_s:.1f} s in their phases, summed over workers)")
        else:
            between = max(0.0, self.finishing - self.prepared - self.in_tests_s)
            parts.append(f"{self.in_tests_s:.1f} s in tests (setup, call and teardown; {self.tests} called)")
            parts.append(f"{between:.1f} s between tests")
        parts.append(f"{self.finished - self.finishing:.1f} s at the session's end")
        return f"wall time {total:.1f} s since {start}: " + ", ".join(parts)
