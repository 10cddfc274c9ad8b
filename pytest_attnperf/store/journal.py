"""What a dead run leaves: a recording's journal and the run's marker.

Each entry a recording commits is appended, as one JSON line synced to disk, to
``<baselines>/.<hw>.recording-<host>-<pid>-<token>.jsonl``; the next ``--update-baselines`` for
that hardware on that host merges the journals of runs no longer alive (docs/gate.md, "The
baseline store"). A run's marker (``RunMarker``), kept from collection to a clean end, names the
case a run was in when it ended where Python cannot stop it (docs/isolation.md, "A process
that ends").
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["Journal", "RunMarker", "left_behind", "read", "run_id"]


def _host() -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in socket.gethostname()) or "host"


_TOKENS: dict[int, str] = {}  # this process's token, by pid (a forked child draws its own)


def run_id() -> str:
    """``<pid>-<token>``: this process's name in journal and marker file names, apart from any
    earlier process that had the same pid."""
    pid = os.getpid()
    token = _TOKENS.setdefault(pid, secrets.token_hex(4))
    return f"{pid}-{token}"


def _gone(name: str) -> bool:
    """Whether the process named ``<pid>-<token>`` (or a bare ``<pid>``) has ended: another
    token with this process's pid is an earlier process's; another pid is looked up."""
    pid, _, token = name.partition("-")
    if not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return name != run_id()
    return not _alive(int(pid))


def _plain(value: Any) -> Any:
    """numpy scalars and other number-likes as plain numbers, for JSON."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


class Journal:
    """The run's journal for one hardware's baseline file."""

    def __init__(self, folder: Path, hw: str) -> None:
        self.path = folder / f".{hw}.recording-{_host()}-{run_id()}.jsonl"
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
        if _gone(path.name[len(prefix):-len(".jsonl")]):
            found.append(path)
    return found


class RunMarker:
    """A run's marker: written when its attention cases are collected, told each case as it
    starts, removed at its clean end. A marker whose process is gone is a run that died."""

    def __init__(self, folder: Path, args: list[str]) -> None:
        self.folder = folder
        self.path = folder / f"{_host()}-{run_id()}.json"
        self.record: dict[str, Any] = {"pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                       "cwd": os.getcwd(), "args": args, "case": None}

    def write(self, case: str | None = None) -> None:
        """Write the marker naming ``case`` (atomically; a marker that cannot be written is none)."""
        self.record["case"] = case
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            part = self.path.with_suffix(".part")
            part.write_text(json.dumps(self.record), encoding="utf-8")
            os.replace(part, self.path)
        except OSError:
            pass

    def remove(self) -> None:
        """The run ends cleanly: no marker."""
        self.path.unlink(missing_ok=True)

    def dead_runs(self) -> list[dict[str, Any]]:
        """The records of markers that runs on this host left and no longer hold (their process
        is gone), oldest first; each read is removed, so a dead run is named once."""
        prefix = f"{_host()}-"
        found = []
        for path in sorted(self.folder.glob(f"{prefix}*.json")):
            name = path.name[len(prefix):-len(".json")]
            if not _gone(name):
                continue
            try:
                found.append(dict(json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, ValueError, TypeError):
                found.append({"pid": int(name.partition("-")[0])})
            path.unlink(missing_ok=True)
        return sorted(found, key=lambda record: str(record.get("started", "")))
