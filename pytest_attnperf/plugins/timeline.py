"""Where a run's wall time goes, for the summary: start-up and collection, preparing (Triton's
cache, the baseline file, pool runs), the tests' own phases, the time between tests and
the session's end (baselines, autotune choices, report); and the measured tests' call phases
split where ``attnperf.measure`` began (warm-up vs measuring). Host wall time of the run's
stages, read with ``time.perf_counter`` and ``time.time``; nothing here times a kernel."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import wraps
from typing import Any, TypeVar

import pytest

from pytest_attnperf.fixture import VERIFY_S_KEY

__all__ = ["Timeline", "clock_measure", "process_age_s"]

KEY = pytest.StashKey["Timeline"]()
MEASURE_AT_KEY = pytest.StashKey[float]()  # host time (time.time) attnperf.measure was entered
SPLIT_ATTR = "attnperf_measure_split_s"  # on a call report: (before attnperf.measure, in it, checking), seconds
T = TypeVar("T")


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
    before_measure_s: float = 0.0  # measured tests' call phases before attnperf.measure (summed likewise)
    in_measure_s: float = 0.0  # and in it
    checking_s: float = 0.0  # of which checking the timed draws (measure.verify)
    measured: int = 0  # the measured tests

    @classmethod
    def begin(cls) -> Timeline:
        """A timeline begun now, its start the process's own where that is known."""
        now, age = time.perf_counter(), process_age_s()
        return cls(now - (age or 0.0), age is not None)

    @pytest.hookimpl(wrapper=True, trylast=True)  # inside every other wrapper: around the preparation only
    def pytest_collection_finish(self, session: pytest.Session) -> Generator[None, None, None]:
        """Collection ends and preparation (Triton's cache, the baseline file, the sample overhead,
        the pool runs) begins; its end when every plain implementation has run."""
        self.collected = time.perf_counter()
        try:
            return (yield)
        finally:
            self.prepared = time.perf_counter()

    @pytest.hookimpl(wrapper=True, trylast=True)  # inside the terminal reporter's, which writes the summary after
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        """The session's end (baselines, autotune choices, report), as every plain implementation runs."""
        self.finishing = time.perf_counter()
        try:
            return (yield)
        finally:
            self.finished = time.perf_counter()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        """A measured test's call report carries its warm-up vs measuring split (to a pytest-xdist
        controller too)."""
        report = yield
        began = item.stash.get(MEASURE_AT_KEY, None)
        if report.when == "call" and began is not None:
            checking = item.stash.get(VERIFY_S_KEY, 0.0)
            setattr(report, SPLIT_ATTR, (max(0.0, began - call.start), max(0.0, call.stop - began), checking))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each phase's report (a worker's too, on a pytest-xdist controller)."""
        self.in_tests_s += report.duration
        self.tests += report.when == "call"
        split = getattr(report, SPLIT_ATTR, None)
        if report.when == "call" and split is not None:
            self.before_measure_s += float(split[0])
            self.in_measure_s += float(split[1])
            self.checking_s += float(split[2]) if len(split) > 2 else 0.0
            self.measured += 1

    def measure_line(self) -> str | None:
        """The summary's line on warm-up vs measuring time; None when no test measured."""
        if not self.measured:
            return None
        return (f"time in {self.measured} measured tests: {self.before_measure_s:.1f} s before attnperf.measure "
                f"(inputs, checks and the kernels' first calls: compiling, autotuning), "
                f"{self.in_measure_s:.1f} s in it (warm-up calls, capture, sampling; {self.checking_s:.1f} s of it "
                "checking what the timed calls computed)")

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
