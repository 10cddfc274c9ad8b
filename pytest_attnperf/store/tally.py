"""What a run did with its baseline file, counted for the terminal summary. Pure: keys and
entries in, counts and words out.

A gating run says which file it read and how its cases met the file's entries (matched, new,
not run); a recording says which file it wrote and, of the entries written, how many were new,
continued their history or restarted it (``gate.policy.history`` restarts it on a change of
mode, clock or hot sample length, on an events-timed case recorded on another machine, and on a
recording the gate calls a real change), and how many recordings each entry now holds.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_attnperf.gate.verdict import HISTORY_MIN
from pytest_attnperf.store.baselines import entry_problem

__all__ = ["Gated", "Recorded", "gated", "gating_line", "recorded", "recording_line", "restart_reason"]


@dataclass(frozen=True)
class Gated:
    """How a gating run's measured cases met the file: cases with an entry, cases without one,
    and the file's entries no case of this run measured."""

    matched: int
    new: int
    not_run: int


@dataclass(frozen=True)
class Recorded:
    """The entries a recording wrote: how many, how many new, continued or restarted (with why),
    and how many entries hold each number of recordings."""

    written: int
    new: int
    continued: int
    restarted: dict[str, int] = field(default_factory=dict)  # why the history restarted -> entries
    recordings: dict[int, int] = field(default_factory=dict)  # recordings held -> entries


def gated(measured: Iterable[str], in_file: Collection[str]) -> Gated:
    """The counts of a gating run: ``measured``, the keys of its measured cases; ``in_file``, the
    keys of the file's entries (usable or not)."""
    cases = set(measured)
    matched = len(cases & set(in_file))
    return Gated(matched=matched, new=len(cases) - matched, not_run=len(set(in_file) - cases))


def _recordings(entry: Mapping[str, Any]) -> int:
    """The recordings an entry holds (one for an entry written before histories were kept)."""
    runs = entry.get("run_medians_ms")
    return len(runs) if isinstance(runs, list) and runs else 1


def _centre_machines(entry: Mapping[str, Any]) -> set[Any]:
    """The machines of the recordings behind an entry's centre (as ``gate.policy`` reads them)."""
    machines = entry.get("run_machines")
    if not isinstance(machines, list):
        return {None}
    return set(machines[-1:] if _recordings(entry) < HISTORY_MIN else machines)


def restart_reason(before: Any, after: Mapping[str, Any]) -> str:
    """Why a recording whose entry ``before`` existed holds one recording in ``after``: the old
    entry unusable, the case measured another way, an events-timed case recorded on another
    machine, or (what is left) a change the gate judged real."""
    if entry_problem(before) is not None:
        return "the old entry unusable"
    if (before.get("mode"), before.get("clock")) != (after.get("mode"), after.get("clock")) or (
            after.get("mode") == "hot" and not math.isclose(float(before.get("hot_sample_ms", 0.5)),
                                                            float(after.get("hot_sample_ms", 0.5)), rel_tol=1e-4)):
        return "measured another way"
    machines = after.get("run_machines")
    here = machines[-1] if isinstance(machines, list) and machines else None
    if after.get("clock") == "cuda-events" and _centre_machines(before) != {here}:
        return "events-timed on another machine"
    return "judged a real change"


def recorded(before: Mapping[str, Any], written: Mapping[str, Mapping[str, Any]]) -> Recorded:
    """The counts of a recording: ``before``, the file's entries as the run read them (unusable
    ones as they were); ``written``, the entries it wrote. A written entry with one recording
    whose case had an entry restarted its history; with more, it continued it."""
    restarted: Counter[str] = Counter()
    new = continued = 0
    for key, entry in written.items():
        if key not in before:
            new += 1
        elif _recordings(entry) > 1:
            continued += 1
        else:
            restarted[restart_reason(before[key], entry)] += 1
    held = Counter(_recordings(entry) for entry in written.values())
    return Recorded(written=len(written), new=new, continued=continued, restarted=dict(restarted),
                    recordings=dict(sorted(held.items())))


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def gating_line(path: Path, counts: Gated, exists: bool = True) -> str:
    """The summary line of a gating run: the file it read and the counts."""
    new = f"{counts.new} case{'' if counts.new == 1 else 's'} new (no entry)"
    if not exists:
        return f"gated against {path}: no such file; {new}"
    return (f"gated against {path}: {_entries(counts.matched)} matched, {new}, "
            f"{_entries(counts.not_run)} in the file not run")


def recording_line(path: Path, counts: Recorded) -> str:
    """The summary line of a recording: the file it wrote, what became of each entry's history,
    and the recordings each entry holds ("3 entries hold 1 recording, 17 hold 4")."""
    restarted = sum(counts.restarted.values())
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.restarted.items(), key=lambda kv: (-kv[1], kv[0])))
    held = ", ".join(
        f"{_entries(n) if i == 0 else n} hold{'s' if n == 1 else ''} {k} recording{'' if k == 1 else 's'}"
        for i, (k, n) in enumerate(counts.recordings.items()))
    return (f"recorded into {path}: {_entries(counts.written)} written, {counts.new} new, {counts.continued} "
            f"continued their history, {restarted} restarted it" + (f" ({why})" if why else "")
            + (f"; {held}" if held else ""))
