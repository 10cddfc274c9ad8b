"""Pool runs started together and timed one at a time: the turn each one waits for.

A pool run's start-up uses the host only, its tests the GPU. So ``PoolResults.run`` starts every
pool run at once, and each waits before its first test until its parent writes to its GO pipe
(``Turn.wait``) and writes to DONE after its last (``Turn.done``); the parent gives the next one
its turn once the one before has exited (``Turns``), so two processes never run cases on the GPU
together. docs/measurement.md, "Short cases in several processes".
"""

from __future__ import annotations

import os
import select
import subprocess

__all__ = ["GO", "TURN_FLAG", "Turn", "Turns", "supported"]

TURN_FLAG = "--attnperf-pool-turn"
GO = b"go\n"
DONE = b"done\n"
POLL_S = 0.2  # how often a wait for DONE looks whether the pool run has exited without writing it


def supported() -> bool:
    """Whether pool runs can be given their turn through inherited pipes (POSIX)."""
    return os.name == "posix"


class Turn:
    """A pool run's side: the GO end to wait on and the DONE end to write to, each used once."""

    def __init__(self, go: int, done: int) -> None:
        self._go: int | None = go
        self._done: int | None = done
        for fd in (go, done):  # not handed on to what the pool run starts (compile workers)
            os.set_inheritable(fd, False)

    @classmethod
    def parse(cls, text: str) -> Turn:
        """``GO,DONE``, two open file descriptors; ``ValueError`` saying what is wrong."""
        try:
            go, done = (int(part) for part in text.split(","))
            os.fstat(go)
            os.fstat(done)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{TURN_FLAG}={text}: not two open file descriptors GO,DONE ({exc})") from None
        return cls(go, done)

    def wait(self) -> bool:
        """Block until the parent gives this pool run its turn: True; False when it closed GO
        without one (it stopped)."""
        go, self._go = self._go, None
        if go is None:
            return True  # waited already
        got = b""
        try:
            while not got.endswith(b"\n"):
                chunk = os.read(go, 16)
                if not chunk:
                    break
                got += chunk
        finally:
            os.close(go)
        return got == GO

    def done(self) -> None:
        """Tell the parent this pool run's last test is over (it may be exiting still)."""
        done, self._done = self._done, None
        if done is None:
            return
        try:
            os.write(done, DONE)
        except OSError:  # the parent is gone: nobody to tell
            pass
        finally:
            os.close(done)


class Turns:
    """The parent's side for one pool run: the GO end to write its turn to, the DONE end to read,
    and the pool run's own ends until it has started. Each end is closed once, then forgotten
    (a closed descriptor's number is soon another file's)."""

    def __init__(self) -> None:
        go_read, go_write = os.pipe()
        done_read, done_write = os.pipe()
        self._fds: dict[str, int] = {"go": go_write, "done": done_read, "child_go": go_read,
                                     "child_done": done_write}

    def flag(self) -> str:
        """The pool run's argument naming its ends."""
        return f"{TURN_FLAG}={self._fds['child_go']},{self._fds['child_done']}"

    def child_ends(self) -> tuple[int, int]:
        """The ends the pool run inherits."""
        return self._fds["child_go"], self._fds["child_done"]

    def started(self) -> None:
        """The pool run has its own copies of its ends: this process closes them."""
        self._shut("child_go", "child_done")

    def give(self) -> None:
        """The pool run's turn."""
        try:
            os.write(self._fds["go"], GO)
        except (OSError, KeyError):  # it has exited already (its wait for DONE sees that), or given
            pass
        self._shut("go")

    def wait_done(self, child: subprocess.Popen[bytes]) -> None:
        """Until the pool run writes DONE, closes it, or exits."""
        done = self._fds.get("done")
        while done is not None:
            ready, _, _ = select.select([done], [], [], POLL_S)
            if ready or child.poll() is not None:
                break
        self._shut("done")

    def close(self) -> None:
        """Every end still open here (a pool run waiting for its turn then ends without one)."""
        self._shut(*list(self._fds))

    def _shut(self, *names: str) -> None:
        for name in names:
            fd = self._fds.pop(name, None)
            if fd is not None:
                os.close(fd)
