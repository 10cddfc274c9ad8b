"""The kernel inventory: which device kernels one timed call launches, and how many of each.

One replay of a case's first timed graph is profiled after sampling, less what the harness adds
(the L2 flush, the replay's own launches); names are normalised (``normalise``) and counted per
call. ``diff`` compares with a baseline entry's ``kernels``; ``against_checked`` with the eager
checked call's kernels (a note, never a failure).

docs/measurement.md, "The kernel inventory".
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_attnperf.measure import profiled

__all__ = ["AGREE_MAX_LAUNCHES", "EAGER", "GRAPH", "Harness", "Inventory", "KernelChange",
           "against_checked", "device_kernels", "diff", "disagreement", "eager_difference", "entry_kernels",
           "kernels_problem", "normalise", "per_call", "take"]

# a graph of more launches than this is not compared with the case's other graphs: the profiler's
# activity buffers may drop records of a long replay (a Python loop over tokens captured whole),
# which would read as a graph doing less work
AGREE_MAX_LAUNCHES = 2048
GRAPH, EAGER = "graph replay", "eager call"

Profile = Callable[[Callable[[], Any]], list[str]]  # raw names of the device activity one call of fn made

# launches the eager checked call may make and a graph cannot hold: copies from or to pageable host
# memory block the host, which capture refuses (docs/measurement.md, "The kernel inventory")
HOST_COPY = re.compile(r"^Memcpy (HtoD|DtoH) .*Pageable")

_TEMPLATE = re.compile(r"<[^<>]*>")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def normalise(name: str) -> str:
    """A kernel's name as the inventory counts it: the demangled name without its return type,
    template arguments and parameter list (``void at::native::f<4, Fill<float>>(int)`` ->
    ``at::native::f``), addresses replaced by ``0x?``, spaces collapsed. Names with no C++ in
    them (Triton's ``chunk_fwd_kernel_o``, cuDNN's generated names, ``Memcpy DtoD (Device ->
    Device)``) are kept as they are. Why: docs/measurement.md, "The kernel inventory"."""
    text = " ".join(name.split())
    if text.startswith("void "):
        text = text[5:]
    while True:
        stripped = _TEMPLATE.sub("", text)
        if stripped == text:
            break
        text = stripped
    if text.endswith(")"):
        opening = _matching_open(text)
        if opening > 0 and not text[opening - 1].isspace():
            text = text[:opening]
    return " ".join(_ADDRESS.sub("0x?", text).split())


def _matching_open(text: str) -> int:
    """The index of the ``(`` that the final ``)`` of ``text`` closes, -1 when none does."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return -1


def per_call(raw: Counter[str], calls: int = 1) -> dict[str, int]:
    """Raw names' counts normalised and divided by ``calls`` (a hot graph holds several), each
    rounded up: a kernel seen at all counts at least once."""
    counts: Counter[str] = Counter()
    for name, n in raw.items():
        if n > 0:
            counts[normalise(name)] += n
    return {name: max(1, math.ceil(n / max(1, calls))) for name, n in sorted(counts.items())}


@dataclass(frozen=True)
class Harness:
    """What the harness launches itself, as raw names and counts: ``replayed``, a replay of a graph
    holding only the L2 flush; ``flush``, the flush called eagerly."""

    replayed: Counter[str]
    flush: Counter[str]

    @property
    def visible(self) -> bool:
        """Whether the profiler sees a graph's kernels: the flush graph's replay shows the flush."""
        return bool(self.flush) and all(self.replayed[name] >= n for name, n in self.flush.items())

    def of_replay(self, holds_flush: bool) -> Counter[str]:
        """The harness's part of one replay: the flush graph's, or without the flush (a hot graph,
        a one-call graph timed with events around its replay) that less the flush."""
        return Counter(self.replayed) if holds_flush else self.replayed - self.flush


@dataclass(frozen=True)
class Inventory:
    """The kernels one timed call launched (normalised names, counts per call), how they were read
    (``GRAPH`` or ``EAGER``) and the host seconds the profiling took. ``disagrees``: how the case's
    other timed graphs, replayed once each, launched other kernels than the first (None: the same,
    or not compared). ``vs_eager``: how the eager checked call's kernels differ from a graph's
    (``eager_difference``; None: the same, or not compared)."""

    kernels: dict[str, int]
    source: str
    seconds: float
    disagrees: str | None = None
    vs_eager: str | None = None
    note: str | None = None  # why the other graphs were not compared, where the profile missed them


def take(profile: Profile, harness: Harness, replay: Callable[[], Any] | None, eager: Callable[[], Any], *,
         holds_flush: bool, calls: int, others: Sequence[Callable[[], Any]] = (),
         besides: Callable[[], Any] | None = None) -> Inventory:
    """The inventory of one timed call: ``replay`` (one replay of its graph, ``calls`` calls in
    it) profiled less the harness's part (and what a replay of ``besides``, a graph of what the
    harness put between the calls, launches), or one ``eager`` call profiled where there is no graph
    or the profiler does not see a graph's kernels. ``others``, the replays of the case's other
    timed graphs (cold mode's captures over other draws), are profiled together, once each, and
    must launch what the first does, as many times each (``disagreement``), where the first
    launches at most ``AGREE_MAX_LAUNCHES``. A profile of the other replays that recorded no
    kernel at all is a profile that missed them, not graphs that did nothing: their results were
    checked after sampling (``verify``), before the inventory, and a graph that launches nothing
    leaves its outputs as the check poisoned them. Such a case is not compared, and ``note`` says so."""
    began = time.perf_counter()
    if replay is not None and harness.visible:
        part = harness.of_replay(holds_flush)
        seen = Counter(profile(replay)) - part
        if besides is not None:
            seen -= Counter(profile(besides)) - harness.of_replay(False)
        disagrees = note = None
        if others and sum(seen.values()) <= AGREE_MAX_LAUNCHES:
            def each_once() -> None:
                for other in others:
                    other()

            together = Counter(profile(each_once)) - Counter({k: n * len(others) for k, n in part.items()})
            if seen and not together:
                note = (f"kernel inventory: the profile of the other {len(others)} timed graphs' replays recorded "
                        f"none of their kernels (the first's: {sum(seen.values())} launches); not compared, their "
                        "results were checked")
            else:
                disagrees = disagreement(seen, together, len(others))
        return Inventory(per_call(seen, calls), GRAPH, time.perf_counter() - began, disagrees, note=note)
    return Inventory(per_call(Counter(profile(eager))), EAGER, time.perf_counter() - began)


def disagreement(first: Counter[str], others: Counter[str], count: int) -> str | None:
    """How ``count`` other graphs' kernels (raw names, counted together) differ from ``count``
    times the first graph's, by normalised name; None when they agree."""
    expected = Counter({name: n * count for name, n in _normalised(first).items()})
    got = _normalised(others)
    if expected == got:
        return None
    names = sorted(set(expected) | set(got), key=lambda k: (-abs(got[k] - expected[k]), k))
    shown = [f"{k} {got[k]} where {count} x the first's would be {expected[k]}" for k in names
             if got[k] != expected[k]]
    more = f", and {len(shown) - 4} more" if len(shown) > 4 else ""
    return (f"the case's {count + 1} timed graphs launch different kernels: over the other {count}, "
            + "; ".join(shown[:4]) + more)


def against_checked(profile: Profile, taken: Inventory, checked: Sequence[str] | None, call: Callable[[], Any],
                    notes: list[str]) -> str | None:
    """How the eager checked call's kernels differ from ``taken``, a graph's inventory
    (``eager_difference``): ``checked``, the raw names the backend proof's profile of that call
    recorded, or where it took none, one call of ``call`` profiled now. None for an inventory
    read from an eager call (nothing to compare); a profile that fails adds a note to ``notes``."""
    if taken.source != GRAPH:
        return None
    try:
        raw = list(checked) if checked else profile(call)
    except Exception as exc:  # noqa: BLE001 - the comparison is a report; its failure is not the case's
        notes.append(f"eager checked call's kernels not read ({type(exc).__name__}: {str(exc)[:120]})")
        return None
    return eager_difference(taken.kernels, Counter(raw))


def eager_difference(graph: Mapping[str, int], eager: Counter[str], limit: int = 4) -> str | None:
    """How one eager call's kernels (``eager``, raw names) differ from ``graph``, a graph's
    inventory (normalised, per call); None when they agree. Copies from or to pageable host
    memory that only the eager call makes (``HOST_COPY``) are left out. At most ``limit`` names a
    part, then how many more."""
    counted = {k: n for k, n in per_call(eager).items() if k in graph or not HOST_COPY.match(k)}
    change = diff(graph, counted)
    if change is None:
        return None
    parts = _parts((("only eager", [f"{k} x{n}" for k, n in change.added.items()]),
                    ("only in the graph", [f"{k} x{n}" for k, n in change.removed.items()]),
                    ("count", [f"{k} {a} in the graph, {b} eager" for k, (a, b) in change.recounted.items()])),
                   limit)
    return "the eager checked call launches other kernels than the timed graph: " + "; ".join(parts)


def _parts(labelled: Sequence[tuple[str, list[str]]], limit: int) -> list[str]:
    """``label a, b, and 3 more`` for each label with items, at most ``limit`` items shown."""
    parts = []
    for label, items in labelled:
        if items:
            more = f", and {len(items) - limit} more" if len(items) > limit else ""
            parts.append(f"{label} {', '.join(items[:limit])}{more}")
    return parts


def _normalised(raw: Counter[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for name, n in raw.items():
        if n > 0:
            counts[normalise(name)] += n
    return counts


def device_kernels(fn: Callable[[], Any]) -> list[str]:
    """The raw names of the device activity (kernels, copies, fills) that one call of ``fn``
    made, from ``torch.profiler``'s CUDA activity (``profiled.profile``, which owns
    ``TEARDOWN_CUPTI``)."""
    return profiled.profile(fn, cuda=True, who="kernel inventory's")[1]


# -- the verdict against the baseline entry ------------------------------------------------------


@dataclass(frozen=True)
class KernelChange:
    """How a run's inventory differs from its baseline entry's: kernels added and removed (with
    their counts per call), and kernels whose count changed (before, after)."""

    added: dict[str, int]
    removed: dict[str, int]
    recounted: dict[str, tuple[int, int]]

    def message(self, limit: int = 6) -> str:
        """``kernels changed: added a x1, b x2; removed c x1; count d 2 -> 3`` (at most ``limit``
        names a part, then how many more)."""
        parts = _parts((("added", [f"{k} x{n}" for k, n in self.added.items()]),
                        ("removed", [f"{k} x{n}" for k, n in self.removed.items()]),
                        ("count", [f"{k} {a} -> {b}" for k, (a, b) in self.recounted.items()])), limit)
        return "kernels changed: " + "; ".join(parts)


def diff(before: Mapping[str, int], after: Mapping[str, int]) -> KernelChange | None:
    """What ``after`` added, removed and recounted against ``before``; None when they are equal."""
    if dict(before) == dict(after):
        return None
    return KernelChange(
        added={k: after[k] for k in sorted(after) if k not in before},
        removed={k: before[k] for k in sorted(before) if k not in after},
        recounted={k: (before[k], after[k]) for k in sorted(after) if k in before and before[k] != after[k]},
    )


def kernels_problem(value: object) -> str | None:
    """Why an entry's ``kernels`` is not an inventory (a mapping of names to positive whole
    counts), None when it is."""
    if not isinstance(value, dict):
        return f"'kernels' must map kernel names to counts, not {type(value).__name__} {value!r:.60}"
    for name, n in value.items():
        if not isinstance(name, str) or not isinstance(n, int) or isinstance(n, bool) or n < 1:
            return f"'kernels' entry {name!r:.80}: {n!r:.20} is not a positive whole count"
    return None


def entry_kernels(entry: Mapping[str, Any] | None) -> dict[str, int] | None:
    """The inventory a baseline entry keeps, None where it keeps none (older entries, CPU cases)."""
    value = entry.get("kernels") if entry else None
    return dict(value) if isinstance(value, dict) and kernels_problem(value) is None else None



def verdict(entry: Mapping[str, Any] | None, kernels: Mapping[str, int] | None, source: str | None) -> str | None:
    """The case's kernel verdict against its baseline entry: ``KernelChange.message`` when the
    inventories differ, None when they agree or one side has none (an entry recorded before
    inventories, a CPU case). Inventories read differently (a graph's replay here, an eager call
    there) are not compared either: the one says it."""
    before = entry_kernels(entry)
    if before is None or kernels is None:
        return None
    recorded = entry.get("kernels_source", GRAPH) if entry else GRAPH
    if recorded != source:
        return None
    change = diff(before, kernels)
    return change.message() if change else None
