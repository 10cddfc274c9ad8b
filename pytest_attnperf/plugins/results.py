"""What the whole run's results make at its end, written once: in a single process, or on a
pytest-xdist controller for all its workers (a worker registers no ``Results``: it sends its share
to the controller, ``plugins.xdist.Worker``). At the session's end: the workers' rows in order, the
baseline file, the report (``--attnperf-report``) and the pull-request comment
(``--attnperf-pr-comment``); for the terminal summary, the line that re-runs each failed case alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_attnperf.families import parametrize as suite
from pytest_attnperf.plugins import failures, xdist
from pytest_attnperf.report.triage import pr_comment, rerun_args, rerun_line
from pytest_attnperf.session import SESSION_KEY, AttnPerfSession, get_session
from pytest_attnperf.store.baselines import BaselineError

__all__ = ["NAME", "Results"]

NAME = "attnperf-results"


@dataclass(eq=False)  # a registered plugin: pluggy keeps plugins in sets, so hashed by identity
class Results:
    """The plugin a single process or a pytest-xdist controller registers (never a worker): it
    writes the run's baselines, report and pull-request comment, and says how to re-run a failed
    case."""

    config: pytest.Config
    report_note: str | None = None  # what --attnperf-report wrote, for the terminal summary
    pr_note: str | None = None  # what --attnperf-pr-comment wrote

    @classmethod
    def of(cls, config: pytest.Config) -> Results | None:
        """The run's plugin, if registered (not in a pytest-xdist worker)."""
        found = config.pluginmanager.get_plugin(NAME)
        return found if isinstance(found, Results) else None

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """At the run's end: the workers' results merged, the baselines and the report written."""
        if SESSION_KEY not in session.config.stash:
            return
        state = get_session(self.config)
        if state.fleet is not None:
            state.fleet.forget_groups()
            state.rows[:] = xdist.rows_in_order(state.rows)
        mixed = state.fleet.mixed if state.fleet is not None and state.fleet.mixed else None
        state.baselines.write(mixed)
        if state.baselines.failed and session.exitstatus == pytest.ExitCode.OK:  # its entries were saved aside
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self._write_report()
        self._write_pr_comment()

    def reruns(self) -> dict[str, str]:
        """Each failed attention case's command that re-runs it alone, by its key."""
        config = self.config
        failed = failures.Failures.of(config)
        if failed is None or not failed.seen:
            return {}
        state, root, here = get_session(config), config.rootpath, config.invocation_params.dir
        args = list(config.invocation_params.args)
        plugin_flag = any(a == "-p" and b == "pytest_attnperf.plugin" for a, b in zip(args, args[1:], strict=False))
        hw = _hw_name(state)
        return {f.nodeid: rerun_line(rerun_args(f.nodeid, state.settings, hw, root, plugin_flag), root, here)
                for f in failed.seen}

    def _write_pr_comment(self) -> None:
        """``--attnperf-pr-comment=FILE``: the run's regressions, improvements, memory changes, drifts
        and failures as Markdown."""
        state = get_session(self.config)
        path = state.settings.pr_comment
        if path is None:
            return
        try:
            entries = dict(state.baselines.file.entries) if state.rows and state.baselines.file is not None else {}
        except BaselineError:
            entries = {}
        failed = failures.Failures.of(self.config)
        text = pr_comment(state.rows, failed.seen if failed is not None else [], entries, _hw_name(state) or "?",
                          self.reruns())
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        except OSError as exc:
            self.pr_note = f"NOT written to {path}: {exc}"
        else:
            self.pr_note = f"wrote {path}"

    def _write_report(self) -> None:
        """``--attnperf-report=DIR``: the studies' report of this run's measured cases and correctness
        failures."""
        state, failed = get_session(self.config), failures.Failures.of(self.config)
        folder = state.settings.report_dir
        seen = failed.seen if failed is not None else []
        # a controller that measured nothing has no device facts to write (its workers looked the device up)
        if folder is None or not (state.rows or (seen and state.fleet is None)):
            return
        from pytest_attnperf.report.studies import write_run  # noqa: PLC0415 - it imports numpy: only where a report is written

        try:
            self.report_note = write_run(state.rows, state.environment, state.hardware, suite.removed(self.config),
                                         folder, seen)
        except Exception as exc:  # noqa: BLE001 - a report that cannot be written must not hide the results
            self.report_note = f"NOT written to {folder}: {type(exc).__name__}: {exc}"


def _hw_name(state: AttnPerfSession) -> str | None:
    """The run's hardware name: ``--hw``, else the one found (None where it cannot be)."""
    if state.settings.hw:
        return state.settings.hw
    try:
        return state.hardware.name
    except Exception:  # noqa: BLE001 - a device that cannot be looked up: the line goes without --hw
        return None
