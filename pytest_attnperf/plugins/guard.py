"""The case guard: the plugin object that isolates each attention case (time limit, torch's state,
the process, memory), its parts in ``measure/isolation.py``; docs/isolation.md describes each check."""

from __future__ import annotations

import gc
import os
import sys
import traceback
from collections.abc import Generator
from types import TracebackType
from typing import Any

import pytest

from pytest_attnperf.measure import process
from pytest_attnperf.measure.isolation import (
    CaseClock,
    CaseState,
    clear_traceback,
    is_attention_case,
    is_out_of_memory,
    memory_state,
    oom_request,
    oom_state,
    pytest_timeout_owns,
    release_keeping_state,
    time_limit_unavailable,
    undo,
)
from pytest_attnperf.measure.switches import describe_changes, restore_rng
from pytest_attnperf.options import user_cache
from pytest_attnperf.store.journal import RunMarker

__all__ = ["INTERPRETER_FROZEN", "NAME", "REFREEZE_OBJECTS", "CaseGuard", "OwnerFreeze"]

NAME = "attnperf-isolation"
FAILED_TRACEBACKS = pytest.StashKey[list[TracebackType]]()  # a case's failures, cleared when it ends
CALLED = pytest.StashKey[bool]()  # the case reached its call phase or failed before it
REFREEZE_OBJECTS = 20_000
"""New objects surviving a case's collection from which they are frozen (``CaseGuard._refreeze``)."""
INTERPRETER_FROZEN = gc.get_freeze_count()
"""Objects in the permanent generation when the plugin is first imported (as pytest starts, before
its conftests and tests): the interpreter's own. CPython 3.12 starts with its static types' base
and MRO tuples there (375 on 3.12.1), 3.11 and 3.13 with none; a count above this at collection
was frozen by the process's owner."""


class OwnerFreeze:
    """Whether the process's owner froze objects of its own, read at each run's collection until
    seen once: ``gc.get_freeze_count`` walks the permanent generation (28 ms with half a million
    objects there), and a process that runs many sessions (pytester's) froze them once. Were an
    owner to unfreeze later, a run would only skip freezing its own, as it does beside an owner's."""

    froze = False

    @classmethod
    def seen(cls) -> bool:
        """Whether objects beyond the interpreter's own are frozen, or were at an earlier run."""
        cls.froze = cls.froze or gc.get_freeze_count() > INTERPRETER_FROZEN
        return cls.froze


def _failures_cleared(tracebacks: list[TracebackType]) -> None:
    """A failed case's frames hold its tensors wherever its traceback is kept (pytest's call
    record, ``sys.last_traceback`` for post-mortem tools): their locals are dropped, once the
    report and any debugger are done with them."""
    for tb in tracebacks:
        clear_traceback(tb)
    clear_traceback(getattr(sys, "last_traceback", None))
    last = getattr(sys, "last_exc", None)
    if last is not None:
        clear_traceback(last.__traceback__)



class CaseGuard:
    """Registered by ``pytest_configure``: state, memory and time isolation of attention cases."""

    def __init__(self, config: pytest.Config, limit_s: float) -> None:
        self.config, self.limit_s = config, limit_s
        self.stderr_fd: int | None = None  # a copy of stderr as it is now, before any test's capture
        self.froze = False  # objects alive after collection moved out of the collector's reach
        self.marker: RunMarker | None = None  # this run's, once it has attention cases
        self.dead_runs: list[dict[str, Any]] = []  # markers runs that died left
        if limit_s > 0:
            try:
                self.stderr_fd = os.dup(2)
            except OSError:
                pass

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """At the run's end, after its summary and reports: the run's marker removed, the copy
        of stderr closed, the objects frozen after collection unfrozen."""
        if self.marker is not None:
            self.marker.remove()
        if self.stderr_fd is not None:
            os.close(self.stderr_fd)
            self.stderr_fd = None
        if self.froze:
            gc.unfreeze()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Once the cases are collected (torch imported, the items made): what is alive now lives
        for the run, so the collector's full pass after each case need not walk it again. The
        pass then costs microseconds where it cost 0.4 s with torch and fla loaded; objects frozen
        before by the process's owner stay theirs (no freeze here, no unfreeze at the end), those
        the interpreter froze at its start (``INTERPRETER_FROZEN``) are no owner's. The markers of
        runs that died are read, and this run's written."""
        if any(is_attention_case(item) for item in session.items):
            if not OwnerFreeze.seen():  # else frozen by the process's owner: theirs
                gc.collect()
                gc.freeze()
                self.froze = True
            if not session.config.option.collectonly:
                self.marker = RunMarker(user_cache("pytest-attnperf", "runs"),
                                        list(session.config.invocation_params.args))
                self.dead_runs = self.marker.dead_runs()
                self.marker.write()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """A line for each earlier run on this host that ended without its summary."""
        for run in self.dead_runs:
            args = " ".join(map(str, run.get("args") or []))
            args = args if len(args) <= 300 else args[:297] + "..."
            terminalreporter.write_line(
                f"attnperf: an earlier run on this host ended without its summary or reports (pid {run.get('pid')}, "
                f"started {run.get('started', '?')} in {run.get('cwd', '?')}: pytest {args}), during "
                f"{run.get('case') or 'no case'}: ended where Python cannot stop it (a C-level exit, a kill), "
                "so its exit status, 0 included, is no pass",
                yellow=True)

    def _faulthandler_free(self) -> bool:
        try:
            return not float(self.config.getini("faulthandler_timeout") or 0) > 0
        except (TypeError, ValueError):  # pytest's faulthandler plugin not loaded
            return True

    def _clock(self, item: pytest.Item) -> CaseClock | None:
        if self.limit_s <= 0 or self.stderr_fd is None or time_limit_unavailable() or pytest_timeout_owns(item):
            return None
        return CaseClock(item.nodeid, self.limit_s, self.stderr_fd, self._faulthandler_free())

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: outside the attnperf_sdpa_backend pin
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """Around an attention case's call: the case time limit, ``os._exit`` refused, torch's
        state, the signal handlers and the child processes checked and undone, the random
        generators set back, an out-of-memory error reported with the memory state after release."""
        if not is_attention_case(item):
            return (yield)
        before = CaseState.take()
        clock = self._clock(item)
        exits = process.ExitRefusal()
        failure: BaseException | None = None
        try:
            with exits:
                if clock is None:
                    result = yield
                else:
                    with clock:
                        result = yield
        except BaseException as exc:  # noqa: BLE001 - re-raised below, or replaced by a clearer failure
            failure = exc
        findings = undo(before, clock, exits)
        reseeded, rng_not_restored = restore_rng(before.rng)
        if failure is not None and is_out_of_memory(failure):
            raise self._oom_failure(item, failure) from None
        if reseeded or rng_not_restored:  # put back: reported, not failed (a test may seed its own inputs)
            seeds = describe_changes(reseeded, rng_not_restored).strip()
            item.warn(pytest.PytestWarning(f"{item.nodeid}: the case reseeded a global generator (set back now, so "
                                           f"later cases draw as they would have): {seeds}"))
        if isinstance(failure, process.ExitRefused):
            failure = None  # its finding says more
        if findings:
            if failure is None or isinstance(failure, pytest.skip.Exception):
                pytest.fail("\n".join(finding.failure(item.nodeid) for finding in findings), pytrace=False)
            item.add_report_section("call", "attnperf", "\n".join(finding.section() for finding in findings))
        if failure is not None:
            raise failure
        return result

    def _oom_failure(self, item: pytest.Item, exc: BaseException) -> BaseException:
        """The case's failure for an out-of-memory error, after its frames are cleared and
        memory released (so the state it reports is what the next case gets)."""
        text = str(exc)
        where = traceback.extract_tb(exc.__traceback__)[-3:]
        clear_traceback(exc.__traceback__)
        exc.__traceback__ = None
        size = oom_request(text)
        said = oom_state(text)
        release_keeping_state()
        lines = [
            f"{item.nodeid}: out of memory: the case tried to allocate "
            + (size if size else "an amount torch's message does not give")
            + f" ({type(exc).__name__}).",
        ]
        if said:
            lines.append(f"  at the time: {said}")
        lines.append(f"  after its memory was released: {memory_state()}; the run goes on.")
        lines.extend(f"  raised at {frame.filename}:{frame.lineno} in {frame.name}" for frame in where[-1:])
        return pytest.fail.Exception("\n".join(lines), pytrace=False)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        """Note that the case reached its call (or failed before it), and keep an attention case's
        failure tracebacks to clear at its end."""
        report = yield
        if call.when == "call" or (call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception)):
            item.stash[CALLED] = True  # it ran, or failed holding what it made
        if call.excinfo is not None and is_attention_case(item):
            item.stash.setdefault(FAILED_TRACEBACKS, []).append(call.excinfo.tb)
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        """After an attention case: its failures' frames cleared and, when it ran, its memory
        released and what it left alive frozen once that is much."""
        attention = is_attention_case(item)  # read now: pytest drops the item's fixtures at its end
        if attention and self.marker is not None:
            self.marker.write(item.nodeid)
        result = yield
        if attention:
            _failures_cleared(item.stash.get(FAILED_TRACEBACKS, []))
            item.stash[FAILED_TRACEBACKS] = []
            if item.stash.get(CALLED, False):  # a case skipped before its call made nothing to release,
                release_keeping_state()  # and a collection costs 0.4 s with torch and fla loaded
                self._refreeze()
        return result

    def _refreeze(self) -> None:
        """After a case's full collection: when the modules a case imported for the run (torch's
        compiler stack for flex attention, Triton's JIT) left ``REFREEZE_OBJECTS`` or more new
        objects, freeze those survivors too, so the pass after each later case does not walk
        them (it took 70-100 ms a case once they were there, on the CPU). The case's own garbage
        went in the collection just made; frozen objects are still freed by reference counting,
        and only a reference cycle among them that dies later waits for the run's end."""
        if self.froze and len(gc.get_objects()) >= REFREEZE_OBJECTS:
            gc.freeze()

    def pytest_report_header(self, config: pytest.Config) -> str | None:
        """A header line when ``--attnperf-case-timeout`` cannot be enforced, and why."""
        why = time_limit_unavailable() if self.limit_s > 0 else None
        return f"attnperf: --attnperf-case-timeout is not enforced ({why})" if why else None
