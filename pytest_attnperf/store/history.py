"""The history of gating and recording runs: one JSON line per measured case, appended to
``<history dir>/<hw>.jsonl`` (schema in docs/history.md).

Each record is one ``write`` to a file opened with ``O_APPEND``, under the same exclusive lock
that guards a baseline file (``baselines.locked`` on a sibling ``.<hw>.jsonl.lock``): the
kernel places every appended write at the file's end, and the lock keeps two writers' lines
whole where a file system does not make a large append atomic (NFS). Several runs and
pytest-xdist workers may append at once and nothing is lost; a line a killed writer left half
written is skipped when read, and counted.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import socket
import stat
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_attnperf.store.baselines import locked, read_regular, rounded

__all__ = ["SCHEMA", "History", "append", "git_commit", "history_path", "make_record", "read", "series"]

SCHEMA = 1  # docs/history.md; a reader skips records of a later schema, and says so
GIT_TIMEOUT_S = 10.0


def history_path(folder: Path, hw: str) -> Path:
    """The history file of hardware ``hw``: ``<folder>/<hw>.jsonl``."""
    return folder / f"{hw}.jsonl"


def git_commit(root: Path) -> str | None:
    """``git rev-parse HEAD`` in ``root``, None where it is no git checkout or git is missing."""
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    text = done.stdout.strip()
    return text if done.returncode == 0 and text else None


def utc_now() -> str:
    """The time now, UTC, to the second: ``2026-01-31T12:00:00Z``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_record(*, run: str, commit: str | None, machine: Mapping[str, Any], software: Mapping[str, Any],
                case: str, mode: str, clock: str, summary: Mapping[str, Any], peak_mib: float | None,
                verdict: str, change_pct: float | None, drift_pct: float | None = None,
                time: str | None = None) -> dict[str, Any]:
    """One record of schema ``SCHEMA``; ``summary`` holds ``median_ms``, ``ci_low_ms``,
    ``ci_high_ms``, ``stdrel`` and ``n_samples``."""
    return {
        "schema": SCHEMA,
        "run": run,
        "time": time or utc_now(),
        "commit": commit,
        "machine": dict(machine),
        "software": dict(software),
        "case": case,
        "mode": mode,
        "clock": clock,
        "median_ms": rounded(summary["median_ms"], 6),
        "ci_low_ms": rounded(summary["ci_low_ms"], 6),
        "ci_high_ms": rounded(summary["ci_high_ms"], 6),
        "stdrel": rounded(summary["stdrel"]),
        "n_samples": summary["n_samples"],
        "peak_mib": rounded(peak_mib),
        "verdict": verdict,
        "change_pct": rounded(change_pct),
        "drift_pct": rounded(drift_pct),
    }


def append(path: Path, record: Mapping[str, Any]) -> None:
    """Append ``record`` as one line: one ``write`` with ``O_APPEND``, under the file's lock."""
    data = (json.dumps(record, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)  # a FIFO never blocks
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(f"{path} is not a regular file; nothing appended")
            view = memoryview(data)
            while view:  # a regular file takes the whole write; a short one is finished, still locked
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)


@dataclass(frozen=True)
class History:
    """The records read from a history file, oldest first, and the lines skipped: those that do
    not parse (a writer killed mid-line) and those of a later schema."""

    records: tuple[dict[str, Any], ...]
    unreadable: int = 0
    newer: int = 0


def _lines(path: Path) -> Iterator[str]:
    raw = read_regular(path, "history file")  # a FIFO or device is refused, naming it, never read
    if raw is None:
        return
    yield from raw.decode("utf-8", errors="replace").splitlines()


def _time(value: Any) -> bool:
    """Whether ``value`` is a time a record can hold: a positive, finite number (a NaN median
    would hide every shift in its case's history)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def read(path: Path) -> History:
    """The history at ``path`` (empty when there is no file); a record that cannot be read, or
    whose median is not a positive finite time, is counted as unreadable and left out.
    ``store.baselines.BaselineError`` names a path that is no regular file."""
    records, unreadable, newer = [], 0, 0
    for line in _lines(path):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # not JSON, a number of too many digits, nesting too deep
            unreadable += 1
            continue
        if not isinstance(record, dict) or not isinstance(record.get("schema"), int):
            unreadable += 1
        elif record["schema"] > SCHEMA:
            newer += 1
        elif isinstance(record.get("case"), str) and _time(record.get("median_ms")):
            records.append(record)
        else:
            unreadable += 1
    return History(tuple(records), unreadable, newer)


def series(records: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """The records by case and mode, each list in the history's order (a run's own order)."""
    found: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for record in records:
        found.setdefault((str(record["case"]), str(record.get("mode", "cold"))), []).append(record)
    return found


def host() -> str:
    """The host's name."""
    return socket.gethostname()
