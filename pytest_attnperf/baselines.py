"""Per-hardware baseline files: ``<folder>/<hw>.yaml``.

Layout (sorted keys, rounded floats, so a diff reads well)::

    format: 1
    meta: {hardware: h200, device: NVIDIA H200, torch: ..., triton: ..., fla: ..., cuda: ...,
           driver: ..., date: ...}
    entries:
      suites/test_softmax.py::test_softmax[...]: {median_ms: ..., ci_low_ms: ..., ...}

A file that cannot be read is never overwritten: ``load`` raises ``BaselineError`` naming the
file and the cause, and an update then writes nothing. ``save`` writes a temporary file in the
same folder, flushes it to disk and renames it over the old one, so a reader sees the old file
or the new one, never half of one. ``merge`` replaces only the entries that were measured.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .gate import Summary

__all__ = ["FORMAT", "BaselineError", "BaselineFile", "load", "merge", "rounded", "save"]

FORMAT = 1


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and the cause."""


@dataclass
class BaselineFile:
    meta: dict[str, Any] = field(default_factory=dict)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    def summary(self, key: str) -> Summary | None:
        entry = self.entries.get(key)
        return None if entry is None else Summary.from_mapping(entry)


def rounded(value: Any, digits: int = 5) -> Any:
    """Floats (also in a list) to ``digits`` significant digits; other values unchanged."""
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value != 0.0:
        return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))
    return value


def load(path: Path) -> BaselineFile | None:
    """The file's contents, None when it does not exist; ``BaselineError`` when unusable."""
    if not path.exists():
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"baseline file {path} cannot be read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BaselineError(f"baseline file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BaselineError(
            f"baseline file {path} is not an attnperf baseline (expected a mapping with "
            f"'format: {FORMAT}', 'meta' and 'entries')"
        )
    meta, entries = data.get("meta") or {}, data.get("entries") or {}
    if not isinstance(meta, dict) or not isinstance(entries, dict):
        raise BaselineError(f"baseline file {path}: 'meta' and 'entries' must be mappings")
    for key, entry in entries.items():
        try:
            if not isinstance(entry, dict):
                raise TypeError("not a mapping")
            Summary.from_mapping(entry)
        except (KeyError, TypeError, ValueError) as exc:
            raise BaselineError(f"baseline file {path}, entry '{key}': {type(exc).__name__}: {exc}") from None
    return BaselineFile(meta=dict(meta), entries={str(k): dict(v) for k, v in entries.items()})


def merge(
    existing: BaselineFile | None, measured: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any]
) -> BaselineFile:
    """Existing entries, with those in ``measured`` replaced or added; ``meta`` updated."""
    merged = BaselineFile(
        meta=dict(existing.meta) if existing else {},
        entries={k: dict(v) for k, v in existing.entries.items()} if existing else {},
    )
    merged.meta.update(meta)
    for key, entry in measured.items():
        merged.entries[key] = {k: rounded(v) for k, v in entry.items()}
    return merged


def _file_mode(path: Path) -> int:
    """The old file's permissions, or what the umask gives a new file (mkstemp makes 0600)."""
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def save(path: Path, baseline: BaselineFile) -> None:
    """Write atomically: temporary file in the same folder, fsync, rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(
        {"format": FORMAT, "meta": baseline.meta, "entries": baseline.entries},
        sort_keys=True,
        default_flow_style=False,
        width=120,
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
