"""What a kernel can do to the process around an attention case, and how each is undone.

``os._exit`` and ``os.exec*`` refused during the call (``ExitRefusal``), exit handlers a kernel
registers unregistered, threads it left running named (``new_threads``), child processes it left
killed (``new_children``), the handlers of ``GUARDED_SIGNALS`` set back.

docs/isolation.md says why each matters and what goes through. Nothing here imports torch.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

__all__ = [
    "GUARDED_SIGNALS",
    "HELPERS",
    "LIBRARIES",
    "ExitRefusal",
    "ExitRefused",
    "alarm_left",
    "describe_handler",
    "kill_children",
    "live_children",
    "new_children",
    "new_threads",
    "real_exit",
    "restore_handlers",
    "snapshot_handlers",
    "thread_idents",
]

real_exit: Callable[[int], NoReturn] = os._exit
"""``os._exit`` as it was when the plugin loaded: the harness's watchdog ends the process with it."""

HARNESS_CALLERS = ("_pytest", "pytest", "execnet", "xdist", "pytest_attnperf")
"""Modules whose own calls of ``os._exit`` go through during a case (execnet ends a worker whose
controller has gone that way)."""

_EXITS = ("_exit", "execv", "execve")  # os.execl, execvp... call os.execv or os.execve

LIBRARIES = HARNESS_CALLERS + ("torch", "triton", "fla", "numpy", "transformers", "coverage", "setuptools",
                               "pkg_resources", "importlib_metadata")
"""Modules whose exit handlers and threads, made during a case, are the library's own (torch's
compiler registers its cleanup on first use, and keeps a thread pool), besides the standard library's."""


INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def _library(module: str) -> bool:
    """Whether ``module`` (a dotted name) is the standard library's, one of ``LIBRARIES``, or an
    installed package's (its file under ``site-packages``: tqdm's monitor thread and exit handler,
    started by torch's compiler inside a case, are tqdm's). A kernel's own code is the project's,
    outside them (an editable install included)."""
    top = module.split(".")[0]
    if top in LIBRARIES or top in sys.stdlib_module_names:
        return True
    loaded = sys.modules.get(module) or sys.modules.get(top)
    return _installed(str(getattr(loaded, "__file__", None) or ""))


def _installed(filename: str) -> bool:
    """Whether ``filename`` belongs to an installed package (under ``site-packages``)."""
    return any(part in filename for part in INSTALLED)


class ExitRefused(BaseException):
    """Raised in place of ``os._exit`` or ``os.exec*`` during a case's call. A ``BaseException``,
    as ``SystemExit`` is: a kernel's ``except Exception`` does not swallow it."""


def _caller(frame: FrameType | None) -> FrameType | None:
    """The first frame outside ``os``, ``posix`` and this module: who called the exit."""
    while frame is not None and frame.f_globals.get("__name__") in ("os", "posix", __name__):
        frame = frame.f_back
    return frame


def _importing(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs inside an import (importlib's frames below it): a module registering
    its exit handler as it loads (PIL, tqdm, filelock do), which a kernel's first call can trigger."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _where(caller: FrameType | None) -> str:
    """`` at kernels.py:12 in fused``: where a frame is; empty for none."""
    if caller is None:
        return ""
    return f" at {os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno} in {caller.f_code.co_name}"


def _call_text(name: str, args: tuple[Any, ...]) -> str:
    text = f"os.{name}({', '.join(repr(a) for a in args)})"
    return text if len(text) <= 120 else text[:117] + "...)"


class ExitRefusal:
    """During a case's call: ``os._exit`` and ``os.execv``/``os.execve`` (``posix``'s too) raise
    ``ExitRefused`` and are noted in ``calls``, each with where it was called; exit handlers a
    kernel's own code registers (``atexit.register``) are noted in ``handlers`` and unregistered
    when the block ends. Put back on exit."""

    def __init__(self) -> None:
        self.calls: list[str] = []  # "os._exit(0) at kernels.py:12 in fused"
        self.handlers: list[str] = []  # "conftest.on_exit, registered at conftest.py:9 in kernel (unregistered)"
        self._pid = os.getpid()
        self._saved: list[tuple[Any, str, Any]] = []
        self._registered: list[Callable[..., Any]] = []

    def __enter__(self) -> ExitRefusal:
        owners = [os] + ([sys.modules["posix"]] if "posix" in sys.modules else [])
        for owner in owners:
            for name in _EXITS:
                real = getattr(owner, name, None)
                if real is not None:
                    self._saved.append((owner, name, real))
                    setattr(owner, name, self._refuser(name, real))
        self._saved.append((atexit, "register", atexit.register))
        atexit.register = self._noting(atexit.register)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, real in reversed(self._saved):
            setattr(owner, name, real)
        self._saved.clear()
        for handler in self._registered:
            atexit.unregister(handler)
        self._registered.clear()

    def _noting(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[..., Any]:
            done: Callable[..., Any] = real(func, *args, **kwargs)
            caller = _caller(sys._getframe(1))
            module = str(caller.f_globals.get("__name__", "")) if caller is not None else ""
            installed = caller is not None and _installed(caller.f_code.co_filename)
            if os.getpid() == self._pid and not _library(module) and not installed and not _importing(caller):
                self._registered.append(func)
                name = f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func)[:60])}"
                self.handlers.append(f"atexit.register({name}){_where(caller)}")
            return done

        register.__qualname__ = register.__name__ = "noted_register"
        return register

    def _refuser(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            caller = _caller(sys._getframe(1))
            module = str(caller.f_globals.get("__name__", "")) if caller is not None else ""
            if os.getpid() != self._pid or module.split(".")[0] in HARNESS_CALLERS:
                return real(*args, **kwargs)  # a forked child, or the harness: exits
            call = _call_text(name, args)
            self.calls.append(call + _where(caller))
            raise ExitRefused(f"{call} refused during an attention case: it would end the run with no summary")

        refused.__qualname__ = refused.__name__ = f"refused_{name}"
        return refused


# -- child processes -----------------------------------------------------------------------

# matched in the whole command line, as module or as path: torch's own start is a path
# (".../torch/_inductor/compile_worker/__main__.py --pickler=...")
HELPERS = ("torch._inductor.compile_worker", "torch/_inductor/compile_worker", "multiprocessing.resource_tracker",
           "multiprocessing.forkserver")
"""Command-line parts of the helper processes torch's compiler and multiprocessing start once and
keep for the run; a case that started one did not leave it behind."""


def _stat(pid: int | str) -> tuple[str, int] | None:
    """A process's state letter and parent pid from ``/proc/<pid>/stat``; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            fields = handle.read().rpartition(")")[2].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def _child_pids(me: int) -> set[int] | None:
    """The pids whose parent is this process: from each thread's ``children`` file where the
    kernel has them, else by a pass over ``/proc``; None without ``/proc``."""
    task = f"/proc/{me}/task"
    if os.path.exists(f"{task}/{me}/children"):
        pids: set[int] = set()
        for tid in os.listdir(task):
            try:
                with open(f"{task}/{tid}/children", encoding="utf-8") as handle:
                    pids.update(int(pid) for pid in handle.read().split())
            except OSError:  # a thread that ended meanwhile
                continue
        return pids
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    found = ((entry, _stat(entry)) for entry in entries if entry.isdigit())
    return {int(entry) for entry, stat in found if stat is not None and stat[1] == me}


def command_line(pid: int, whole: bool = False) -> str:
    """A process's command line, shortened unless ``whole``; ``?`` once it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            text = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    return text if whole or len(text) <= 160 else text[:157] + "..."


def live_children() -> dict[int, str] | None:
    """The live children of this process (zombies, already ended, left out) and their command lines;
    None where it cannot be known (no ``/proc``)."""
    pids = _child_pids(os.getpid())
    if pids is None:
        return None
    children = {}
    for pid in pids:
        stat = _stat(pid)
        if stat is not None and stat[0] not in "ZX":
            children[pid] = command_line(pid)
    return children


def new_children(before: dict[int, str] | None) -> dict[int, str]:
    """The live children that were not there ``before``, helpers (``HELPERS``) left out."""
    if before is None:
        return {}
    now = live_children() or {}
    return {pid: cmd for pid, cmd in sorted(now.items())
            if pid not in before and not any(helper in command_line(pid, whole=True) for helper in HELPERS)}


def kill_children(children: dict[int, str], wait_s: float = 2.0) -> list[str]:
    """``SIGKILL`` each child and reap it (waiting at most ``wait_s`` in all); a line per child."""
    lines = []
    deadline = time.monotonic() + wait_s
    for pid, cmd in children.items():
        try:
            os.kill(pid, signal.SIGKILL)
            outcome = "killed"
        except ProcessLookupError:
            outcome = "ended meanwhile"
        except OSError as exc:
            lines.append(f"  pid {pid}: {cmd} (could not be killed: {exc})")
            continue
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere
                break
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        lines.append(f"  pid {pid}: {cmd} ({outcome})")
    return lines


# -- threads -------------------------------------------------------------------------------


def thread_idents() -> set[int]:
    """The idents of this process's live Python threads."""
    return {t.ident for t in threading.enumerate() if t.ident is not None}


def _describe_thread(thread: threading.Thread, frame: FrameType | None) -> str:
    target = getattr(thread, "_target", None)
    made = (f", target {getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', '?')}"
            if target is not None else "")
    now = f", now{_where(frame)}" if frame is not None else ""
    return f"  thread '{thread.name}' (native id {thread.native_id}{', daemon' if thread.daemon else ''}{made}{now})"


def new_threads(before: set[int]) -> list[str]:
    """A line for each live Python thread not in ``before`` that runs code outside the standard
    library and ``LIBRARIES`` (a library's pool worker waiting for work is its own): threads a
    case started and left running. Their load is the kernel's, not the host's."""
    frames = sys._current_frames()
    lines = []
    for thread in threading.enumerate():
        if thread.ident is None or thread.ident in before or not thread.is_alive():
            continue
        frame = frames.get(thread.ident)
        target = getattr(thread, "_target", None)
        owner = str(getattr(target, "__module__", None) or type(thread).__module__)
        own_code = [f for f in _stack(frame) if not _library(str(f.f_globals.get("__name__", "")))
                    and not _installed(f.f_code.co_filename)]
        if _library(owner) and not own_code:
            continue
        lines.append(_describe_thread(thread, own_code[0] if own_code else frame))
    return lines


def _stack(frame: FrameType | None) -> list[FrameType]:
    """A thread's frames, innermost first."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    return frames


# -- signals -------------------------------------------------------------------------------

GUARDED_SIGNALS = ("SIGALRM", "SIGINT", "SIGTERM")
"""Signals whose handler a case must leave as it found it: ``SIGALRM`` is the case time limit,
``SIGINT`` and ``SIGTERM`` end a run with its summary and reports."""


def snapshot_handlers() -> dict[str, Any]:
    """Each guarded signal's handler, by name (those this platform has)."""
    return {name: signal.getsignal(getattr(signal, name)) for name in GUARDED_SIGNALS if hasattr(signal, name)}


def describe_handler(handler: Any) -> str:
    """A handler as a failure names it."""
    if handler is None:
        return "a handler not set from Python"
    if handler == signal.SIG_DFL:
        return "SIG_DFL (the default action)"
    if handler == signal.SIG_IGN:
        return "SIG_IGN (ignored)"
    module, name = getattr(handler, "__module__", None), getattr(handler, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(handler)[:100]


def restore_handlers(before: dict[str, Any]) -> list[str]:
    """Set every guarded signal's handler that differs from ``before`` back (on the main thread,
    where handlers can be set); a line per changed one."""
    lines = []
    for name, was in before.items():
        number = getattr(signal, name)
        now = signal.getsignal(number)
        if now == was:
            continue
        line = f"  {name} handler (signal.signal): {describe_handler(was)} -> {describe_handler(now)}"
        try:
            if was is None:
                raise ValueError("it was not set from Python")
            signal.signal(number, was)
        except (ValueError, OSError, TypeError) as exc:
            line += f" (could not be set back: {exc})"
        lines.append(line)
    return lines


def alarm_left(armed_before: bool) -> list[str]:
    """Where no alarm was armed before the case (no case time limit) and one is now, cancel it:
    it would end the process, or fail another case, when it fires."""
    if armed_before or not hasattr(signal, "getitimer"):
        return []
    left_s, interval_s = signal.getitimer(signal.ITIMER_REAL)
    if left_s == 0 and interval_s == 0:
        return []
    signal.setitimer(signal.ITIMER_REAL, 0)
    return [f"  an alarm (signal.alarm, signal.setitimer) left armed, {left_s:g}s to go: cancelled"]


def alarm_armed() -> bool:
    """Whether the real-time interval timer (``signal.alarm``'s) is armed now."""
    return hasattr(signal, "getitimer") and signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0)
