"""A recording's journal: each entry a recording commits is appended, as one JSON line, to
``<baselines>/.<hw>.recording-<host>-<pid>.jsonl`` and synced to disk, so a run that dies
before its end (SIGKILL, a crash, a machine taken back) leaves what it measured. The run removes
its journal once its entries are written (or saved aside). The next ``--update-baselines`` for
that hardware on that host merges the journals of runs no longer alive (its own entries win),
then removes them; a gating run only names them."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["Journal", "left_behind", "read"]


def _host() -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname()) or "host"


def _plain(value: Any) -> Any:
    """numpy scalars and other number-likes as plain numbers, for JSON."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


class Journal:
    """The run's journal for one hardware's baseline file."""

    def __init__(self, folder: Path, hw: str) -> None:
        self.path = folder / f".{hw}.recording-{_host()}-{os.getpid()}.jsonl"
        self.problem: str | None = None  # the first write that failed (the run goes on without it)

    def add(self, key: str, entry: Mapping[str, Any]) -> None:
        """Append one entry (a JSON line, flushed and synced); after a failed write, kept in
        ``problem``, nothing more is written."""
        if self.problem is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"key": key, "entry": dict(entry)}, default=_plain) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            self.problem = f"the recording's journal {self.path} cannot be written: {exc}"

    def remove(self) -> None:
        """Delete the journal file (one already gone is fine)."""
        self.path.unlink(missing_ok=True)


def read(path: Path) -> dict[str, dict[str, Any]]:
    """The entries a journal holds, the later line winning; a line cut short by the run's end is
    skipped."""
    entries: dict[str, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
                entries[str(record["key"])] = dict(record["entry"])
            except (ValueError, KeyError, TypeError):
                continue
    return entries


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def left_behind(folder: Path, hw: str) -> list[Path]:
    """Journals of ``hw`` that runs on this host left and no longer write (their process is gone)."""
    prefix = f".{hw}.recording-{_host()}-"
    found = []
    for path in sorted(folder.glob(f"{prefix}*.jsonl")):
        pid = path.name[len(prefix):-len(".jsonl")]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            found.append(path)
    return found
