"""The noise benchmark's pytest runs read back: each run's benchmark JSON and JUnit outcomes,
per-case medians and their spread across runs."""

from __future__ import annotations

import json
import statistics
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["SIZES", "BadReport", "Run", "read_run", "run_files", "testcase_nodeid"]

SIZES = (">=50us", ">=10us", "<10us")  # the size classes of cases, by their median


def run_files(work: Path, suffix: str = ".json") -> list[Path]:
    """The steady runs' ``run<i>.json`` (or other ``suffix``) in the work folder, by run number."""
    numbered = [(int(p.stem[3:]), p) for p in work.glob(f"run*{suffix}") if p.stem[3:].isdigit()]
    return [p for _, p in sorted(numbered)]


class Run(NamedTuple):
    """A steady run's benchmark JSON, as the report reads it."""

    medians: dict[str, float]  # each case's median in ms
    machines: set[str]  # the machine names the plugin wrote beside them (``attnperf_machine``)
    event_timed: set[str]  # cases timed with events around eager launches (clock ``cuda-events``:
    # not graph-capturable, so launch and host overhead are in the figure)
    verdicts: dict[str, str] | None = None  # each case's gate status (``verdict``: unchanged, new, ...)
    floor_ms: float | None = None  # the run's sample overhead (``attnperf_overhead_ms``), on CUDA
    gate_overhead_ms: float | None = None  # the overhead as the gate used it (``attnperf_gate_overhead_ms``;
    # runs from before that key: ``attnperf_overhead_ms``, which the gate did not use then)
    clocks: dict[str, str] | None = None  # each case's clock (``attnperf_clock``)


# the sample overhead's keys in the benchmark JSON, then their names in runs saved before the
# names were settled (read, never written)
OVERHEAD = ("attnperf_overhead_ms", "attnperf_floor_ms")
GATE_OVERHEAD = ("attnperf_gate_overhead_ms", "attnperf_gate_floor_ms")


def _first_extra(benchmarks: list[dict[str, Any]], key: str, old: str) -> tuple[bool, float | None]:
    """Whether any case carries ``key`` (or, where none does, ``old``) in its ``extra_info``, and
    the first non-null value."""
    extras = [b.get("extra_info", {}) for b in benchmarks]
    if not any(key in e for e in extras):
        key = old
    found = [e[key] for e in extras if key in e]
    return bool(found), next((float(v) for v in found if v is not None), None)


def read_run(path: Path) -> Run:
    """One saved run (pytest-benchmark's JSON at ``path``): each case's median in ms and what the
    plugin wrote beside it."""
    data = json.loads(path.read_text())
    benchmarks = data["benchmarks"]
    floor = _first_extra(benchmarks, *OVERHEAD)[1]
    has_gate_floor, gate_floor = _first_extra(benchmarks, *GATE_OVERHEAD)
    return Run(
        medians={b["fullname"]: b["stats"]["median"] * 1e3 for b in benchmarks},
        machines={str(b["extra_info"]["attnperf_machine"]) for b in benchmarks
                  if "attnperf_machine" in b.get("extra_info", {})},
        event_timed={b["fullname"] for b in benchmarks
                     if b.get("extra_info", {}).get("attnperf_clock") == "cuda-events"},
        verdicts={b["fullname"]: str(b["extra_info"]["verdict"]) for b in benchmarks
                  if "verdict" in b.get("extra_info", {})},
        floor_ms=floor,
        gate_overhead_ms=gate_floor if has_gate_floor else floor,
        clocks={b["fullname"]: str(b["extra_info"]["attnperf_clock"]) for b in benchmarks
                if "attnperf_clock" in b.get("extra_info", {})},
    )


JUDGED = ("unchanged", "improved", "regressed")  # verdicts of a case compared with its baseline


def _judged_line(runs: list[Run], false: int) -> str:
    """How many cases the gate compared with a baseline, beside the false regressions: a steady
    run with no baseline file in the work folder reports every case ``new`` and can flag none."""
    counts: dict[str, int] = {}
    for run in runs:
        for status in (run.verdicts or {}).values():
            counts[status] = counts.get(status, 0) + 1
    judged = sum(counts.get(s, 0) for s in JUDGED)
    line = f"false regressions over {len(runs)} unchanged runs: {false} in {judged} judgements"
    others = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()) if s not in JUDGED)
    if others:
        line += f" (not judged: {others})"
    if counts and not judged:
        why = ("no case had a baseline entry (run the record stage in this work folder first, or start "
               "it from a baseline file)") if set(counts) == {"new"} else "see 'not judged'"
        line += f"; NOTHING WAS GATED: {why}"
    return line


def testcase_nodeid(case: ET.Element) -> str:
    """The pytest node id of a JUnit XML ``testcase`` (``classname`` is the module's dotted path)."""
    return f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"


class BadReport(ValueError):
    """A JUnit report that cannot be parsed (a run killed while writing it); names the file."""


_NOT_JUDGED = {"not compared", "unjudged"}  # passing verdicts that judged nothing: no catch to count


def _outcomes(path: Path) -> dict[str, str]:
    """Node id -> "regressed" (a failure saying REGRESSED), "failed" (any other failure or
    error: a changed clock, a wrong result, a crash), "not compared" (passed, and the plugin's
    verdict says its baseline could not be compared with it, e.g. an events-timed case against
    another machine's recordings, or a case recorded in another mode; or "unjudged", a CPU case
    timed on a contended host) or "passed", from a JUnit
    XML report; skipped tests (nothing measured) are left out, and a run that left no report
    gives none. ``BadReport`` when the file is not XML."""
    if not path.exists():
        return {}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise BadReport(f"{path.name} is unreadable ({exc}): cut while pytest wrote it?") from None
    found: dict[str, str] = {}
    for case in root.iter("testcase"):
        if case.find("skipped") is not None or case.get("name") is None:  # an interrupted run
            continue  # writes a nameless testcase for the test it cut
        bad = [*case.findall("failure"), *case.findall("error")]
        said = " ".join(b.get("message", "") + (b.text or "") for b in bad)
        verdicts = [p.get("value") for p in case.iter("property") if p.get("name") == "attnperf_verdict"]
        found[testcase_nodeid(case)] = ("regressed" if "REGRESSED" in said else "failed" if bad
                                        else "not compared" if _NOT_JUDGED & set(verdicts) else "passed")
    return found


def _with(outcomes: dict[str, str], outcome: str) -> set[str]:
    return {case for case, got in outcomes.items() if got == outcome}


def _size_class(ms: float) -> str:
    return ">=50us" if ms >= 0.05 else ">=10us" if ms >= 0.01 else "<10us"


def _per_case(runs: list[dict[str, float]]) -> dict[str, list[float]]:
    """Each case's medians over the runs it appeared in."""
    return {case: [r[case] for r in runs if case in r] for case in sorted(set().union(*runs))}


def _spread(values: list[float]) -> tuple[float, float, float]:
    """``(median, range, sd)`` of a case's medians: range = (max - min) / median, sd = standard
    deviation / mean (0 for one value)."""
    median = statistics.median(values)
    spread = (max(values) - min(values)) / median if median > 0 else 0.0
    sd = statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 and median > 0 else 0.0
    return median, spread, sd


class SpreadCount(NamedTuple):
    """Of the cases of 10 us or more with two medians or more (``cases``), how many spread
    above 1% by range and by standard deviation."""

    cases: int
    over_range: int
    over_sd: int


def _spreads(per_case: dict[str, list[float]]) -> dict[str, tuple[float, float, float]]:
    """``_spread`` of each case with two medians or more (one has no spread to speak of)."""
    return {case: _spread(values) for case, values in per_case.items() if len(values) > 1}


def _count_spread(spreads: list[tuple[float, float, float]]) -> SpreadCount:
    sized = [(spread, sd) for median, spread, sd in spreads if median >= 0.01]
    return SpreadCount(len(sized), sum(spread > 0.01 for spread, _ in sized), sum(sd > 0.01 for _, sd in sized))
