"""A case's samples from the pool runs of ``--attnperf-processes``: one pool run's measurement
(``Taken``), the file each pool run appends them to, and pooling them with this process's
(``pool``). The pool runs themselves: ``plugins/pool.py``; why they exist: docs/measurement.md,
"Short cases in several processes"."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from pytest_attnperf.measure.timing import Measurement

__all__ = ["APART", "Taken", "pool", "read_taken", "short_cases", "write_taken"]


@dataclass(frozen=True)
class Taken:
    """One pool run's measurement of a case."""

    samples_ms: tuple[float, ...]
    clock: str
    mode: str
    calls_per_sample: int
    graphs: int = 1  # cold graphs its samples go round, in turn
    notes: tuple[str, ...] = ()

    @property
    def median_ms(self) -> float:
        """The median of this process's samples, in ms."""
        return statistics.median(self.samples_ms)


def write_taken(path: Path, nodeid: str, measurement: Measurement) -> None:
    """In a pool run: append this case's samples to ``path`` (one JSON line, flushed, so a pool run
    that dies later keeps what it measured)."""
    line = json.dumps({
        "nodeid": nodeid, "samples_ms": list(measurement.samples_ms), "clock": measurement.clock,
        "mode": measurement.mode, "calls_per_sample": measurement.calls_per_sample,
        "graphs": measurement.graphs, "notes": list(measurement.notes),
    })
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


def read_taken(path: Path) -> dict[str, Taken]:
    """A pool run's file: nodeid -> its measurement (the last, if a case was measured twice).
    A line that does not parse (a pool run killed mid-write) is skipped."""
    taken: dict[str, Taken] = {}
    if not path.exists():
        return taken
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            samples = tuple(float(v) for v in row["samples_ms"])
            if not samples or not all(math.isfinite(v) and v > 0 for v in samples):
                continue
            taken[str(row["nodeid"])] = Taken(samples, str(row["clock"]), str(row["mode"]),
                                              int(row["calls_per_sample"]), max(1, int(row.get("graphs", 1))),
                                              tuple(str(n) for n in row.get("notes", ())))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return taken


def short_cases(nodeids: Iterable[str], centres_ms: Mapping[str, float], below_ms: float) -> list[str]:
    """The node ids whose baseline centre is under ``below_ms`` (those without one are left out)."""
    return [n for n in nodeids if n in centres_ms and centres_ms[n] < below_ms]


def _share(samples: Sequence[float], graphs: int, about: int) -> list[float]:
    """About ``about`` of ``samples`` as whole rounds of the ``graphs`` they go round in turn
    (cold mode: sample i is graph i mod graphs), the rounds spread evenly through the sequence,
    so every graph keeps its share (each capture of a short kernel has a median of its own).
    Every sample is one round when they do not fill one."""
    size = graphs if 1 < graphs <= len(samples) else 1
    rounds = len(samples) // size
    take = max(1, min(rounds, about // size))
    return [v for j in range(take) for v in samples[(j * rounds // take) * size:][:size]]


APART = 0.05
"""Every pool run's median this far from this process's, on one side: more than seven times the
0.4-0.7% sd a short case's median moves by between processes (docs/evidence.md,
"--attnperf-processes 3"), so not that spread."""


def _apart(mine_ms: float, theirs_ms: Sequence[float]) -> list[str]:
    """A note when every pool run's median is more than ``APART`` from this process's, all on one
    side: the processes then time the case differently (an environment of their own, say), and
    the pooled figure mixes the two; none otherwise."""
    shifts = [m / mine_ms - 1 for m in theirs_ms] if mine_ms > 0 else []
    if not shifts or not (all(v > APART for v in shifts) or all(v < -APART for v in shifts)):
        return []
    lo, hi = min(shifts), max(shifts)
    return [f"every pool run's median is {lo:+.1%}{'' if hi == lo else f' to {hi:+.1%}'} from this "
            "process's, beyond the spread between processes: they time this case differently "
            "(docs/measurement.md, \"Short cases in several processes\")"]


def pool(measurement: Measurement, taken: Sequence[Taken]) -> Measurement:
    """``measurement`` with the pool runs' samples of the case added, about as many from each
    process as the smallest gives (``_share``). A pool run that timed the case with another clock
    or mode is left out, and the note says so; the pool runs' own notes (a throttled clock, say)
    are kept, named as theirs."""
    usable = [t for t in taken if (t.clock, t.mode) == (measurement.clock, measurement.mode)]
    notes = list(measurement.notes)
    if len(usable) < len(taken):
        notes.append(f"{len(taken) - len(usable)} pool-run measurement(s) taken with another clock or mode, not pooled")
    if not usable:
        return replace(measurement, notes=tuple(notes)) if len(notes) > len(measurement.notes) else measurement
    sets = [(list(measurement.samples_ms), measurement.graphs), *((list(t.samples_ms), t.graphs) for t in usable)]
    about = min(len(samples) for samples, _ in sets)
    shares = [_share(samples, graphs, about) for samples, graphs in sets]
    samples = [v for share in shares for v in share]
    medians = (measurement.median_ms, *(t.median_ms for t in usable))
    counts = sorted({len(share) for share in shares})  # one count unless the graphs differ
    each = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    notes += [f"pool run {i}: {note}" for i, t in enumerate(usable, 1) for note in t.notes]
    notes.append(f"{len(sets)} processes pooled, {each} samples each (medians "
                 f"{', '.join(f'{1e3 * m:.2f}' for m in medians)} us, this one first)")
    notes.extend(_apart(measurement.median_ms, medians[1:]))
    return replace(measurement, samples_ms=tuple(samples), notes=tuple(notes), processes=len(sets),
                   process_medians_ms=medians)
