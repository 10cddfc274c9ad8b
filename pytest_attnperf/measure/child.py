"""The noise benchmark's pytest runs, as child processes that an interrupt does not cost their reports.

``subprocess.run`` kills its child 0.25 s after a Ctrl-C, too soon for a pytest with many failures
to print them and write its reports (docs/noise-benchmark.md, "Splitting over several calls").
Here the child runs in a session of its own, so a signal reaches it only through ``wait_for``:
exactly one SIGINT (pytest then stops the running test, prints its failures and writes its JUnit
and JSON reports), up to ``INTERRUPT_GRACE_S`` to finish, and a kill past that. On Linux the
child is also set to die with this process, so a benchmark killed outright leaves no pytest on the
GPU.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["ECHO_S", "INTERRUPT_GRACE_S", "interrupt", "start", "stop_signals_as_interrupts", "wait_for"]

INTERRUPT_GRACE_S = 20.0  # how long an interrupted pytest run may take to write its reports
ECHO_S = 1.0  # a second interrupt this soon after the first is the same one (`timeout` signals twice)


def die_with_parent() -> None:
    """In the child, before it runs (Linux): SIGKILL when this process dies, even by SIGKILL."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the finally of wait_for is all there is
        pass


def _in_child() -> None:
    """In the child, before it runs: SIGINT back to its default, so the child's Python raises
    KeyboardInterrupt on the one SIGINT ``wait_for`` sends. An ignored SIGINT is inherited (a
    shell's background job, a test runner's worker), and Python keeps it ignored: the child
    would run on to the grace period's kill and lose its reports. Then ``die_with_parent``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform == "linux":
        die_with_parent()


def start(cmd: list[str], env: dict[str, str], cwd: str | os.PathLike[str] | None = None,
          stdout: Any = None, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    """``cmd`` in a session of its own (no terminal or group signal reaches it directly), in
    ``cwd``, its output (stderr too, when ``stdout`` is given) to ``stdout``; ``pass_fds`` stay
    open in it (POSIX)."""
    return subprocess.Popen(cmd, env=env, cwd=cwd, stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                            start_new_session=True, preexec_fn=_in_child if os.name == "posix" else None,
                            pass_fds=pass_fds)


def wait_for(child: subprocess.Popen[bytes]) -> int:
    """The child's exit status. Interrupted, this sends the child one SIGINT, waits up to
    INTERRUPT_GRACE_S for it, kills it (and its process group) past that or at a second
    interrupt (one within ECHO_S of the first is taken for the same), and re-raises."""
    try:
        return child.wait()
    except KeyboardInterrupt:
        interrupt(child)
        raise
    finally:
        _kill(child)


def interrupt(child: subprocess.Popen[bytes]) -> None:
    """Stop ``child`` as an interrupt does: one SIGINT, up to INTERRUPT_GRACE_S for it to write
    its reports (a second interrupt, not within ECHO_S of the first, cuts that short), then a
    kill of it and its process group if it still runs."""
    first = time.monotonic()
    try:
        child.send_signal(signal.SIGINT)
    except (OSError, ValueError):  # gone already, or no SIGINT to send on this platform
        pass
    try:
        while True:
            try:
                child.wait(timeout=max(0.0, first + INTERRUPT_GRACE_S - time.monotonic()))
                break
            except subprocess.TimeoutExpired:
                break
            except KeyboardInterrupt:
                if time.monotonic() - first >= ECHO_S:
                    break
    finally:
        _kill(child)


def _kill(child: subprocess.Popen[bytes]) -> None:
    """Not left running on the GPU after this process stops waiting for it."""
    if child.poll() is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)  # with whatever it started (compile workers)
        except (OSError, AttributeError):
            child.kill()
        child.wait()


def stop_signals_as_interrupts() -> Callable[[], None]:
    """SIGTERM and SIGHUP (a scheduler's stop, an ssh drop) raise KeyboardInterrupt as Ctrl-C does, so
    the running pytest gets its SIGINT and the caller its chance to report; an ignored one (as
    under nohup) stays ignored. Returns what puts the previous handlers back. Only the main
    thread can set handlers: elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    stops = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    before = {sig: signal.signal(sig, signal.default_int_handler) for sig in stops
              if signal.getsignal(sig) is not signal.SIG_IGN}

    def restore() -> None:
        for sig, handler in before.items():
            signal.signal(sig, handler)

    return restore
