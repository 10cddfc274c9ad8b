"""The run's history (plugin ``HistoryRecorder``, registered under ``--attnperf-history``): each
measured case judged on its history so far plus this run, then appended to it.

Each process that measures appends its own cases as they end (a pytest-xdist worker too, not
the controller): the process that timed a case knows its device, its hardware and its machine
(a fleet may mix cards, and each card has its own history file); a worker that dies later keeps
what it appended; and the controller's channel stays as it is. ``history.append`` makes
concurrent appends safe, so workers and concurrent runs share one file.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from pytest_attnperf.gate import drift
from pytest_attnperf.gate.drift import DriftNote
from pytest_attnperf.options import project_dir
from pytest_attnperf.outcome import PerfResult
from pytest_attnperf.session import AttnPerfSession
from pytest_attnperf.store import history
from pytest_attnperf.store.baselines import BaselineError
from pytest_attnperf.store.history import git_commit, history_path

__all__ = ["NAME", "WINDOW", "HistoryRecorder", "since_recorded", "wanted"]

NAME = "attnperf-history"
WINDOW = 30  # runs of a case a gating run judges drift on: a shift older than this no longer fails
SOFTWARE = ("torch", "triton", "fla", "cuda", "driver", "python")  # envinfo's versions a record keeps
DRIFTED = "drifted"


def since_recorded(records: list[Any]) -> list[Any]:
    """The records from the case's latest recording on: recording its baseline again accepts the
    level it runs at, so the gate judges drift only since (``attnperf-history`` reports every shift)."""
    last = max((i for i, r in enumerate(records) if r.get("verdict") == "recorded"), default=0)
    return records[last:]


def wanted(config: pytest.Config, session: AttnPerfSession) -> bool:
    """Whether this run keeps a history: ``--attnperf-history`` given, in a process that measures
    (not a pool run, not only checking or collecting)."""
    s = session.settings
    return s.history_dir is not None and s.pool_out is None and not s.check_only and not config.option.collectonly


@dataclass(eq=False)  # a registered plugin: hashed by identity
class HistoryRecorder:
    """The run's id and commit, the history read once (for drift), and the appends."""

    session: AttnPerfSession
    run: str = field(default_factory=lambda: uuid.uuid4().hex)
    problem: str | None = None  # the first append that failed, for the summary
    appended: int = 0

    def __post_init__(self) -> None:
        seat = self.session.seat
        if seat is not None and seat.testrunuid:  # a pytest-xdist worker: the run's one id
            self.run = seat.testrunuid

    @classmethod
    def of(cls, config: pytest.Config) -> HistoryRecorder | None:
        """The run's recorder, if registered."""
        found = config.pluginmanager.get_plugin(NAME)
        return found if isinstance(found, HistoryRecorder) else None

    @cached_property
    def commit(self) -> str | None:
        """``--attnperf-commit`` when given, else the project's git HEAD, else None."""
        given = self.session.settings.commit
        return given if given else git_commit(project_dir(self.session.config))

    @cached_property
    def path(self) -> Path:
        """The history file of the run's hardware."""
        folder = self.session.settings.history_dir
        assert folder is not None  # registered only with one
        return history_path(folder, self.session.hardware.name)

    @cached_property
    def _past(self) -> dict[tuple[str, str], list[Any]]:
        """The history as it was when this run first needed it, by case and mode; empty, with the
        problem named in the summary, where the file cannot be read (a FIFO, a device, a link loop)."""
        try:
            return history.series(history.read(self.path).records)
        except BaselineError as exc:
            self.problem = self.problem or f"NOT read, drift not judged: {exc}"
            return {}

    def judge(self, key: str, result: PerfResult) -> DriftNote | None:
        """The case's drift on the history so far plus this run, since its latest recording and
        at most ``WINDOW`` runs (gating runs, with the change-point library installed); None when
        it has not drifted slower."""
        s = self.session.settings
        if s.update_baselines or drift.available() is not None:
            return None
        m = result.measurement
        past = since_recorded(self._past.get((key, m.mode), []))[-(WINDOW - 1):]
        medians = [float(r["median_ms"]) for r in past] + [m.summary.median_ms]
        shift = drift.drifted(medians)
        if shift is None:
            return None
        commits = [r.get("commit") for r in past] + [None]
        last_good, first_bad = commits[shift.index - 1], commits[shift.index]
        return DriftNote(shift, None if last_good is None else str(last_good),
                         None if first_bad is None else str(first_bad),
                         fails=s.fail_on_drift and not result.verdict.failed)

    def add(self, key: str, result: PerfResult, note: DriftNote | None) -> None:
        """Append the case's record; a history that cannot be written is noted, never fails the case."""
        m, verdict = result.measurement, result.verdict
        env = self.session.environment
        record = history.make_record(
            run=self.run, commit=self.commit,
            machine={"host": history.host(), "hw": self.session.hardware.name, "device": self.session.device.name,
                     "id": self.session.machine},
            software={k: env.get(k) for k in SOFTWARE}, case=key, mode=m.mode, clock=m.clock,
            summary={"median_ms": m.summary.median_ms, "ci_low_ms": m.summary.ci_low_ms,
                     "ci_high_ms": m.summary.ci_high_ms, "stdrel": m.summary.stdrel, "n_samples": m.summary.n_samples},
            peak_mib=m.peak_mib, verdict=DRIFTED if note is not None and note.fails else verdict.status,
            change_pct=verdict.change_pct, drift_pct=None if note is None else round(note.pct, 4))
        try:
            history.append(self.path, record)
        except Exception as exc:  # noqa: BLE001 - a history that cannot be written must not fail the case
            self.problem = self.problem or f"NOT appended to {self.path}: {type(exc).__name__}: {exc}"
            return
        self.appended += 1

    def record(self, key: str, result: PerfResult) -> DriftNote | None:
        """The case's drift (``judge``; None without it) and its record appended (``add``)."""
        note = self.judge(key, result)
        self.add(key, result, note)
        return note

    def summary_line(self) -> str | None:
        """For the terminal summary: what this process appended, or why not."""
        if self.problem:
            return f"history: {self.problem}"
        if self.appended:
            return f"history: appended {self.appended} records to {self.path} (run {self.run[:12]})"
        return None
