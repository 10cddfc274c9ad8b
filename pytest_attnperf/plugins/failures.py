"""The correctness failures of a run, collected: each attention case's failed call report is marked
with its key where the test ran and kept where reports are logged (``report/failures.py`` holds
what is kept, and the report's use of it)."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_attnperf.measure.isolation import is_attention_case
from pytest_attnperf.parallel.fleet import case_key
from pytest_attnperf.report.failures import CASE_ATTR, Failure, failure_of

__all__ = ["KEY", "NAME", "Failures"]

KEY = pytest.StashKey["Failures"]()
NAME = "attnperf-failures"


@dataclass(eq=False)  # a registered plugin: pluggy keeps plugins in sets, so hashed by identity
class Failures:
    """The failed call reports of attention cases, marked where the test ran and collected where
    the reports are logged (a pytest-xdist controller logs its workers')."""

    seen: list[Failure] = field(default_factory=list)

    @classmethod
    def of(cls, config: pytest.Config) -> Failures | None:
        """The run's plugin, if registered."""
        return config.stash.get(KEY, None)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        """An attention case's failed call report carries the case's key."""
        report = yield
        if report.when == "call" and report.failed and is_attention_case(item):
            setattr(report, CASE_ATTR, case_key(item))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each report (a worker's too, on a pytest-xdist controller): an attention case's failure kept."""
        failure = failure_of(report)
        if failure is not None:
            self.seen.append(failure)
