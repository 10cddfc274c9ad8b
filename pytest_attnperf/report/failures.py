"""The correctness failures of a run: attention cases whose test failed before or inside
``attnperf.measure`` (a failed numerical check, a kernel that raised), so were never measured
and have no summary row; the studies' report lists them (collected by ``plugins.failures.Failures``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pytest

__all__ = ["CASE_ATTR", "Failure", "failure_of", "first_line", "unmeasured"]

FAILED = "Failed: "  # what pytest.fail's exception puts before its message
CASE_ATTR = "attnperf_case"  # on an attention case's failed call report: its key (sent to a pytest-xdist controller)


@dataclass(frozen=True)
class Failure:
    """One failed case: its key (the node id less pytest-xdist's group suffix) and the first line
    of its failure message."""

    nodeid: str
    message: str


def first_line(report: pytest.TestReport) -> str:
    """The failure's first line as pytest's short summary gives it: the crash message
    (``RuntimeError: ...``, ``Failed: ...``) where the report has one, else the first non-blank
    line of its text (a traceback's first line would be source code); ``pytest.fail``'s message
    without the ``Failed:`` its exception adds."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = str(getattr(crash, "message", None) or report.longreprtext)
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line.removeprefix(FAILED)


def failure_of(report: pytest.TestReport) -> Failure | None:
    """The failure a call report records, if it is an attention case's failed call."""
    key = getattr(report, CASE_ATTR, None)
    if report.when != "call" or not report.failed or not isinstance(key, str):
        return None
    return Failure(key, first_line(report))


def unmeasured(failures: Iterable[Failure], measured: Iterable[str]) -> list[Failure]:
    """The failures of cases that have no row, once each in node-id order: a case that failed
    after measuring (a regression) is in the table with its status instead."""
    done = set(measured)
    first: dict[str, Failure] = {}
    for failure in failures:
        if failure.nodeid not in done:
            first.setdefault(failure.nodeid, failure)
    return [first[key] for key in sorted(first)]
