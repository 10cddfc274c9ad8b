"""A history record for the tests of ``store.history``, and a writer that appends them from a
process of its own: such a process imports this module alone, in a fraction of a second, not the
test module (whose ruptures and scipy take seconds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_attnperf.store import history


def record(median: float, *, run: str = "r", commit: str | None = "c", case: str = "case[a]",
           mode: str = "cold") -> dict[str, Any]:
    return history.make_record(
        run=run, commit=commit, machine={"host": "h", "hw": "h200", "device": "NVIDIA H200", "id": "m"},
        software={"torch": "2"}, case=case, mode=mode, clock="cuda-graph-nodes",
        summary={"median_ms": median, "ci_low_ms": median * 0.99, "ci_high_ms": median * 1.01, "stdrel": 0.01,
                 "n_samples": 20}, peak_mib=3.0, verdict="unchanged", change_pct=0.0)


def write(path: str, writer: int, count: int) -> None:
    """``count`` records of the run ``w<writer>``, cases ``w<writer>-<i>`` in order, appended one by one."""
    for i in range(count):
        history.append(Path(path), {**record(1.0 + i / 1e4, run=f"w{writer}"), "case": f"w{writer}-{i}",
                                    "padding": "x" * (i % 7) * 1000})  # lines from 200 bytes to 6 kB
