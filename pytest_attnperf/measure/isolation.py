"""Case isolation: one bad kernel costs only its own case.

Around the call of each attention case, ``CaseGuard`` (``plugins/guard.py``) uses this module's
parts: torch's switches and functions (``measure.switches``, ``measure.torch_functions``), the
process (``measure.process``: exits, exit handlers, threads, child processes, signals), memory
(``release_memory``) and time (``SIGALRM``, then a watchdog, for ``--attnperf-case-timeout``).

docs/isolation.md describes each check. torch is imported only for attention cases.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

import pytest

from pytest_attnperf.measure import process
from pytest_attnperf.measure.switches import (
    GlobalSwitch,
    changed_globals,
    describe_changes,
    restore_globals,
    snapshot_globals,
    snapshot_rng,
    torch_globals,
)
from pytest_attnperf.measure.torch_functions import (
    Functions,
    describe_functions,
    drop_overrides,
    pop_modes,
    pop_saved_hooks,
    restore_functions,
    snapshot_functions,
)

__all__ = [
    "GRACE_S",
    "CaseClock",
    "CaseState",
    "is_attention_case",
    "is_out_of_memory",
    "oom_request",
    "release_memory",
]

GRACE_S = 60.0  # after the time limit, how long a call stuck outside Python gets before the process ends
EXIT_STUCK = 3  # pytest's exit status for an internal error: the run was cut short


def is_attention_case(item: pytest.Item) -> bool:
    """Whether the test uses one of attnperf's fixtures (the suites' tests all do)."""
    return any(name.startswith("attnperf") for name in getattr(item, "fixturenames", ()))


# -- memory --------------------------------------------------------------------------------

_OOM_TEXT = re.compile(r"out of memory", re.IGNORECASE)
_TRIED = re.compile(r"Tried to allocate ([\d.]+ ?[KMGTP]?i?B)", re.IGNORECASE)
_STATE = re.compile(r"(GPU \d+ has a total capacity.*?)(?:If reserved but unallocated|See documentation|$)",
                    re.IGNORECASE | re.DOTALL)


def is_out_of_memory(exc: BaseException | None) -> bool:
    """torch's ``OutOfMemoryError``, or any error whose message (or one it was raised from)
    says CUDA ran out of memory."""
    seen = 0
    while exc is not None and seen < 8:
        if type(exc).__name__ == "OutOfMemoryError" or (
                isinstance(exc, (RuntimeError, MemoryError)) and _OOM_TEXT.search(str(exc))):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def oom_request(message: str) -> str | None:
    """The size in torch's out-of-memory message ("Tried to allocate 2.00 GiB"), or None."""
    found = _TRIED.search(message)
    return found.group(1) if found else None


def oom_state(message: str) -> str | None:
    """The memory state torch's message gives (capacity, free, in use), without its advice."""
    found = _STATE.search(message)
    return " ".join(found.group(1).split())[:400] if found else None


def memory_state() -> str:
    """CUDA memory now, from the caching allocator and the driver; what is known without it."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return "CUDA not initialized in this process"
    gib = 2**30
    text = (f"{torch.cuda.memory_allocated() / gib:.2f} GiB allocated, "
            f"{torch.cuda.memory_reserved() / gib:.2f} GiB reserved by PyTorch")
    try:
        free, total = torch.cuda.mem_get_info()
        text += f", {free / gib:.2f} of {total / gib:.2f} GiB free on the device"
    except Exception:  # noqa: BLE001 - the allocator's figures stand on their own
        pass
    return text


def clear_traceback(tb: TracebackType | None) -> None:
    """Drop the local variables of a finished case's frames (its inputs, outputs, callables and
    graphs), keeping the traceback itself for its report."""
    while tb is not None:
        frame = tb.tb_frame
        try:
            frame.clear()
        except RuntimeError:  # a frame still running (the caller's own)
            pass
        else:
            _ = frame.f_locals  # before Python 3.13, clear() keeps a dict copy of the locals; reading empties it
        tb = tb.tb_next


def release_memory() -> None:
    """Collect garbage and, where CUDA is in use, hand the allocator's cached blocks (graph pools
    no longer used included) back to the device."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


# -- time ----------------------------------------------------------------------------------


def time_limit_unavailable() -> str | None:
    """Why the case time limit cannot be enforced here, or None."""
    if not hasattr(signal, "SIGALRM") or not hasattr(signal, "setitimer"):
        return f"no SIGALRM on {sys.platform}"
    if threading.current_thread() is not threading.main_thread():
        return "tests do not run on the main thread"
    return None


def pytest_timeout_owns(item: pytest.Item) -> bool:
    """Whether pytest-timeout limits this test (then it owns SIGALRM and the limit)."""
    config = item.config
    if not config.pluginmanager.hasplugin("timeout"):
        return False
    if item.get_closest_marker("timeout") is not None:
        return True
    values: list[Any] = [config.getoption("timeout", None), os.environ.get("PYTEST_TIMEOUT")]
    try:
        values.append(config.getini("timeout"))
    except ValueError:
        pass
    for value in values:
        try:
            if value not in (None, "") and float(value) > 0:
                return True
        except (TypeError, ValueError):
            continue
    return False


def _seconds(value: float) -> str:
    return f"{value:g}s"


class CaseClock:
    """The time limit of one case's call: ``SIGALRM`` after ``limit_s`` raises a failure in the
    main thread; a watchdog thread ends the process ``GRACE_S`` later if the call is still
    stuck; ``faulthandler`` does the same ``GRACE_S`` after that, should the interpreter be held
    too (unless pytest's own ``faulthandler_timeout`` uses it). Both write to ``stderr_fd``, the
    terminal's stderr as it was before pytest captured output."""

    def __init__(self, nodeid: str, limit_s: float, stderr_fd: int, use_faulthandler: bool) -> None:
        self.nodeid, self.limit_s, self.stderr_fd = nodeid, limit_s, stderr_fd
        self.use_faulthandler = use_faulthandler
        self._previous: Any = None
        self._watchdog: threading.Timer | None = None
        self._finished = False  # set first on exit: a late alarm or watchdog then does nothing
        self._fired = False  # the alarm went off (its timer reads 0 then, rightly)
        self._started = 0.0
        self.tampered: list[str] = []  # what the call did to the limit's handler and timer

    def __enter__(self) -> CaseClock:
        self._previous = signal.signal(signal.SIGALRM, self._expired)
        self._started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, self.limit_s)
        self._watchdog = threading.Timer(self.limit_s + GRACE_S, self._stuck)
        self._watchdog.daemon = True
        self._watchdog.start()
        if self.use_faulthandler:
            faulthandler.dump_traceback_later(self.limit_s + 2 * GRACE_S, exit=True, file=self.stderr_fd)
        return self

    def __exit__(self, *exc: object) -> None:
        self._finished = True
        try:
            self.tampered = self._tampering()
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, self._previous)
            if self._watchdog is not None:
                self._watchdog.cancel()
            if self.use_faulthandler:
                faulthandler.cancel_dump_traceback_later()

    def _tampering(self) -> list[str]:
        """What the call changed of the limit: its ``SIGALRM`` handler replaced or ignored, its
        timer cancelled (``signal.alarm(0)``), re-armed later or made periodic (``setitimer``).
        A timer at 0 is cancelled only while the limit has not passed: one that went off is 0 too."""
        lines = []
        handler = signal.getsignal(signal.SIGALRM)
        if handler != self._expired:
            lines.append(f"  SIGALRM handler (signal.signal): the case time limit's -> "
                         f"{process.describe_handler(handler)}")
        left_s, interval_s = signal.getitimer(signal.ITIMER_REAL)
        to_go_s = self.limit_s - (time.monotonic() - self._started)
        if left_s == 0 and not self._fired and to_go_s > 0.05:
            lines.append("  the case time limit's timer (signal.setitimer(signal.ITIMER_REAL)): cancelled "
                         "(signal.alarm(0) or signal.setitimer)")
        elif left_s > to_go_s + 0.5 or interval_s > 0:
            lines.append(f"  the case time limit's timer (signal.setitimer(signal.ITIMER_REAL)): re-armed, "
                         f"{left_s:g}s to go (interval {interval_s:g}s) where {max(to_go_s, 0):.3g}s were left")
        return lines

    def _expired(self, signum: int, frame: FrameType | None) -> None:
        self._fired = True
        if self._finished:
            return
        stack = "".join(traceback.format_stack(frame)[-12:]) if frame is not None else "  (no frame)\n"
        raise pytest.fail.Exception(
            f"{self.nodeid}: exceeded the case time limit of {_seconds(self.limit_s)} "
            f"(--attnperf-case-timeout) in warm-up, correctness check or timing; it was stuck at:\n{stack}"
            "The run goes on with the next case.",
            pytrace=False,
        )

    def _stuck(self) -> None:
        if self._finished:
            return
        message = (
            f"\n\nattnperf: {self.nodeid} exceeded the case time limit of {_seconds(self.limit_s)} and has not "
            f"returned to Python {_seconds(GRACE_S)} later (stuck inside a C call: a GPU deadlock, say), so it "
            f"cannot be failed on its own. Every thread's stack follows; the process ends now (exit status "
            f"{EXIT_STUCK}).\n\n"
        )
        try:
            os.write(self.stderr_fd, message.encode())
            faulthandler.dump_traceback(file=self.stderr_fd, all_threads=True)
        finally:
            process.real_exit(EXIT_STUCK)


# -- what a case may leave changed ---------------------------------------------------------


@dataclass(frozen=True)
class CaseState:
    """What a case's call may change, read before it."""

    switches: tuple[GlobalSwitch, ...]
    torch: dict[str, Any]  # torch's switches, by name
    rng: dict[str, tuple[int, Any]]
    functions: Functions
    handlers: dict[str, Any]
    alarm_armed: bool
    children: dict[int, str] | None
    threads: frozenset[int] = frozenset()

    @classmethod
    def take(cls) -> CaseState:
        """What the case's call may change, read now."""
        switches = torch_globals()
        return cls(switches, snapshot_globals(switches), snapshot_rng(), snapshot_functions(),
                   process.snapshot_handlers(), process.alarm_armed(), process.live_children(),
                   frozenset(process.thread_idents()))


@dataclass(frozen=True)
class Finding:
    """One thing a case did that would carry into later cases, and how it was undone."""

    what: str  # "changed torch's global state"
    why: str  # "which would carry into every later case"
    done: str  # "set back now"
    lines: str  # one indented line per change

    def failure(self, nodeid: str) -> str:
        return f"{nodeid}: the case {self.what}, {self.why}; {self.done}:\n{self.lines}"

    def section(self) -> str:
        return f"the case also {self.what}, {self.done}:\n{self.lines}"


def undo(before: CaseState, clock: CaseClock | None, exits: process.ExitRefusal) -> list[Finding]:
    """After a case's call: its left children killed, its replaced torch functions, torch
    switches and signal handlers put back; a finding for each kind of change."""
    findings = []
    if exits.calls:
        findings.append(Finding(
            f"called {'; '.join(exits.calls)}",
            "which would end the run at once with no summary, JUnit file or baselines, and an exit status "
            "CI can read as a pass", "refused (ExitRefused was raised in its place), and the run goes on",
            "  a case that must end the process can raise an exception or call pytest.fail instead"))
    if exits.handlers:
        findings.append(Finding(
            "registered an exit handler", "which runs after the run's exit status is decided and can change it (a "
            "handler calling os._exit(0) turns a failing run into a passing one)", "unregistered now",
            "\n".join(f"  {handler}" for handler in exits.handlers)))
    replaced = restore_functions(before.functions)  # first: setting the switches back calls torch
    changes = changed_globals(before.torch, snapshot_globals(before.switches))
    if changes:
        not_restored = restore_globals(before.switches, before.torch)
        findings.append(Finding("changed torch's global state", "which would carry into every later case",
                                "set back now", describe_changes(changes, not_restored)))
    if replaced:
        findings.append(Finding("replaced torch functions", "which every later case would call in place of "
                                "torch's own", "put back now", describe_functions(replaced)))
    modes = pop_modes(before.functions.modes)
    if modes:
        findings.append(Finding("left a torch mode on", "which would intercept every later case's torch calls",
                                "popped now", "\n".join(f"  {mode}" for mode in modes)))
    kept = drop_overrides(before.functions.impls) + pop_saved_hooks(before.functions.saved_hooks)
    if kept:
        findings.append(Finding("left saved-tensor hooks or an operator override on", "which every later case's "
                                "references and checks would go through", "removed now",
                                "\n".join(f"  {k}" for k in kept)))
    signals = (clock.tampered if clock is not None else process.alarm_left(before.alarm_armed))
    signals = signals + process.restore_handlers(before.handlers)
    if signals:
        findings.append(Finding("changed signal handling", "which would switch off the case time limit (SIGALRM) "
                                "or keep an interrupt (SIGINT, SIGTERM) from ending the run with its summary",
                                "set back now", "\n".join(signals)))
    threads = process.new_threads(set(before.threads))
    if threads:
        findings.append(Finding(
            "left threads running", "whose load would slow every later case and read as the host's (a busy host "
            "leaves its cases unjudged); their load is this kernel's", "they cannot be stopped from outside",
            "\n".join(threads)))
    left = process.new_children(before.children)
    if left:
        findings.append(Finding("left child processes running", "which could hang the run or hold its memory "
                                "and devices", "killed (SIGKILL) now", "\n".join(process.kill_children(left))))
    return findings


def release_keeping_state() -> None:
    """``release_memory``, with torch's switches as they were before it: a guard a case kept
    (an inference-mode one, say) restores what it saved when it is freed."""
    if "torch" not in sys.modules:
        release_memory()
        return
    switches = torch_globals()
    held = snapshot_globals(switches)
    release_memory()
    if changed_globals(held, snapshot_globals(switches)):
        restore_globals(switches, held)
