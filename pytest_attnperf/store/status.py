"""The run's exit status, decided where the kernel under test cannot reach it.

An exit handler a kernel registers can end the process with the real ``os._exit(0)`` after
pytest decided the status, and no guard inside the process is complete. So the plugin writes
the status pytest decided (and the counts of cases left unjudged and never run) to the file
named by ``STATUS_ENV`` at the run's end, and ``attnperf-run`` (``main``) runs pytest in a child
process and exits with that status; a child that ended 0 without writing it, or with another
status, is not a pass (``decide``). Nothing here imports pytest or torch. docs/isolation.md,
"Exit handlers, and the exit status decided outside the run".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["DIED", "STATUS_ENV", "decide", "main", "read", "take_path", "write"]

STATUS_ENV = "ATTNPERF_STATUS_FILE"
DIED = 3  # pytest's status for an internal error: the run ended before it could say how it went
_PASS_THROUGH = ("--version", "-V", "--help", "-h", "--co", "--collect-only")  # runs that configure no plugin's end


def take_path() -> Path | None:
    """The status file this run writes (``STATUS_ENV``), taken out of the environment so that the
    processes the run starts (pool runs, pytest-xdist workers) do not write it too."""
    value = os.environ.pop(STATUS_ENV, None)
    return Path(value) if value else None


def write(path: Path, exitstatus: int, unjudged: int, not_run: int = 0) -> None:
    """The exit status pytest decided, the cases left unjudged and those never run (where any were),
    written whole (a temporary file renamed over the path), with this process's id."""
    data = {"exitstatus": int(exitstatus), "unjudged": int(unjudged), "pid": os.getpid()}
    if not_run:
        data["not_run"] = int(not_run)
    text = json.dumps(data)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read(path: Path) -> dict[str, Any] | None:
    """What ``write`` left, None where there is no such file or it is not one (a run that ended
    before writing, or a file written by something else)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("exitstatus"), int) or isinstance(
            data.get("exitstatus"), bool):
        return None
    return data


def decide(returncode: int, recorded: dict[str, Any] | None, args: Sequence[str] = ()) -> tuple[int, str | None]:
    """The run's exit status from the child's ``returncode`` and the status it ``recorded``, and a
    line saying why where they disagree (None where they agree):

    - nothing recorded: the child ended before its end (an exit from a kernel or an exit handler,
      a signal, a crash): its own status, or ``DIED`` where that was 0 (a run that never reached
      its end is no pass); a run that configures nothing to the end (``--version``, ``--help``,
      ``--collect-only``) passes its status through;
    - recorded, and different: the recorded status where it is a failure (something after
      pytest's decision, an exit handler, changed it), else the child's (it failed on its way out);
    - recorded as 0 with cases never run: 1 (pytest reports each as an error, so this is a guard).
    """
    if recorded is None:
        if returncode != 0 or any(arg in _PASS_THROUGH for arg in args):
            return returncode, None
        return DIED, (f"attnperf-run: pytest ended with exit status 0 without recording how the run went (a kernel or "
                      f"an exit handler ended the process, or it was killed): exit status {DIED}, no pass")
    status = int(recorded["exitstatus"])
    not_run = recorded.get("not_run")
    if status == 0 and isinstance(not_run, int) and not_run > 0:
        return 1, f"attnperf-run: {not_run} collected case(s) were never run, yet pytest decided exit status 0: 1"
    if status == returncode:
        return status, None
    final = status if status != 0 else returncode
    return final, (f"attnperf-run: pytest decided exit status {status}, but the process ended with {returncode} (an "
                   f"exit handler or a kernel changed it after the run's end): exit status {final}")


def main(argv: Sequence[str] | None = None, command: Sequence[str] | None = None) -> int:
    """``attnperf-run [pytest arguments]``: pytest in a child process (``command``, by default this
    Python's ``-m pytest``), its exit status decided here (``decide``) from the status it recorded."""
    args = list(sys.argv[1:] if argv is None else argv)
    run = [*(command or [sys.executable, "-m", "pytest"]), *args]
    with tempfile.TemporaryDirectory(prefix="attnperf-run-") as folder:
        path = Path(folder) / "status.json"
        env = {**os.environ, STATUS_ENV: str(path)}
        try:
            returncode = subprocess.call(run, env=env)
        except KeyboardInterrupt:
            returncode = 2  # the child got the interrupt too; pytest's status for it
        if returncode < 0:  # ended by a signal: the shell's status for it
            returncode = 128 - returncode
        recorded = read(path)
    status, line = decide(returncode, recorded, args)
    if line is not None:
        print(line, file=sys.stderr, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
