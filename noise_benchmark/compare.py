"""The noise benchmark's ``compare`` stage read back: the harness's median against
``triton.testing.do_bench_cudagraph`` on the same callables, and the SM clocks beside each."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from noise_benchmark.inject import SAME_LENGTH_MAX_MS
from pytest_attnperf.store.runs import SIZES, _size_class

__all__ = ["WITHIN", "compare_lines"]


WITHIN = 0.03  # the bar for the harness against do_bench_cudagraph


def _ratio(row: dict[str, Any]) -> float:
    ratio: float = row["ours_ms"] / row["do_bench_ms"]
    return ratio


CLOCK_GAP = 0.01  # SM clocks further apart than this count as a gap (the H200 steps by 15 MHz, 0.76%)


def _clock_gap(row: dict[str, Any], suffix: str = "") -> tuple[float, float, tuple[str, ...]] | None:
    """``(do_bench's SM clock, the harness's, NVML's throttle reasons after do_bench)`` where the
    clocks read right after each were more than ``CLOCK_GAP`` apart (20 ms of back-to-back calls
    of a large kernel can trip the power cap, on either side: it depends on when the cap bites),
    else None. ``suffix`` "_same": do_bench at the harness's graph length."""
    after = row.get(f"clock_after_do_bench{suffix}") or [None, []]
    ours, theirs = row.get("clock_after_ours"), after[0]
    if ours is not None and theirs is not None and abs(theirs - ours) > CLOCK_GAP * ours:
        return theirs, ours, tuple(after[1] or ())
    return None


def _same(row: dict[str, Any]) -> float | None:
    """The harness's median over do_bench's at about the harness's calls per graph, or None
    where that was not timed (a one-call graph, or do_bench failed)."""
    return row["ours_ms"] / row["do_bench_same_ms"] if row.get("do_bench_same_ms", 0) > 0 else None


def _same_label(row: dict[str, Any]) -> str:
    """How the report names do_bench's figure at the harness's graph length: by the harness's
    calls a graph, or by its rep where that was capped (``inject.SAME_LENGTH_MAX_MS``: do_bench's
    graph then held fewer calls than the harness's)."""
    rep = row.get("do_bench_same_rep_ms", 0.0)
    if rep >= SAME_LENGTH_MAX_MS:
        return f"at rep {rep:g} ms (capped; fewer calls than the harness's {row.get('calls', '?')})"
    return f"at the harness's {row.get('calls', '?')} calls a graph"


def _same_outside_lines(timed: list[dict[str, Any]]) -> list[str]:
    """The cases outside ``WITHIN`` of do_bench at the harness's graph length, each with both
    SM clocks where they were apart, and the cases where that do_bench failed."""
    outside = [r for r in timed if (x := _same(r)) is not None and abs(x - 1) > WITHIN]
    failed = [r for r in timed if r.get("error_same")]
    lines = []
    if outside:
        lines.append(f"at the harness's graph length, outside {100 * WITHIN:g}%: {len(outside)} cases")
        for row in sorted(outside, key=lambda r: -abs((_same(r) or 1.0) - 1))[:SHOWN]:
            lines.append(f"  {_case_name(row)}: harness {1e3 * row['ours_ms']:.2f} us, do_bench {_same_label(row)} "
                         f"{1e3 * row['do_bench_same_ms']:.2f} us (x{_same(row):.3f}){_clock_note(row, '_same')}")
    if failed:
        lines.append(f"at the harness's graph length, do_bench failed on {len(failed)} cases "
                     f"(first: {failed[0]['error_same']})")
    return lines


def _outside_lines(timed: list[dict[str, Any]]) -> list[str]:
    """For the cases outside ``WITHIN``: in how many the SM clocks after the harness and after
    do_bench differed (``_clock_gap``), which side was lower, the clocks and do_bench's throttle
    reasons; then each case, the furthest from do_bench first, up to ``SHOWN`` of them."""
    outside = sorted((r for r in timed if abs(_ratio(r) - 1) > WITHIN), key=lambda r: -abs(_ratio(r) - 1))
    if not outside:
        return []
    gaps = [gap for gap in map(_clock_gap, outside) if gap is not None]
    line = f"outside {100 * WITHIN:g}%: {len(outside)} cases; the SM clocks after each differed in {len(gaps)}"
    sides = (("do_bench", [g for g in gaps if g[0] < g[1]]), ("the harness", [g for g in gaps if g[1] < g[0]]))
    for side, low in sides:
        if low:
            reasons = sorted({reason for *_, why in low for reason in why}) or ["none given"]
            line += (f"; {side} lower in {len(low)} (do_bench {min(t for t, _, _ in low):g}-"
                     f"{max(t for t, _, _ in low):g} MHz, harness {min(o for _, o, _ in low):g}-"
                     f"{max(o for _, o, _ in low):g} MHz; do_bench's throttle reasons: {', '.join(reasons)})")
    return [line, *(_outside_line(r) for r in outside[:SHOWN])] + (
        [f"  ... and {len(outside) - SHOWN} more in compare.jsonl"] if len(outside) > SHOWN else [])


SHOWN = 20  # cases outside WITHIN named one a line in the compare report, the furthest first


def _outside_line(row: dict[str, Any]) -> str:
    """One case outside ``WITHIN``: both medians, do_bench's at about the harness's calls per
    graph too (do_bench at 20 ms sizes its graph by the eager time of one call: a gap there only
    points at the graph's length), and both SM clocks where they differed."""
    line = (f"  {_case_name(row)}: harness {1e3 * row['ours_ms']:.2f} us, do_bench {1e3 * row['do_bench_ms']:.2f} us "
            f"(x{_ratio(row):.3f})")
    same = _same(row)
    if same is not None:
        line += f", {_same_label(row)} {1e3 * row['do_bench_same_ms']:.2f} us (x{same:.3f})"
    return line + _clock_note(row)


def _case_name(row: dict[str, Any]) -> str:
    """A compare row's case as the report names it: the test part of its node id."""
    return str(row.get("nodeid", "?")).split("::")[-1]


def _clock_note(row: dict[str, Any], suffix: str = "") -> str:
    """``"; do_bench at <MHz> (<reasons>), harness <MHz>"`` where ``_clock_gap`` finds the two
    clocks apart, else empty."""
    gap = _clock_gap(row, suffix)
    if gap is None:
        return ""
    theirs, ours, why = gap
    return f"; do_bench at {theirs:g} MHz ({', '.join(why) or 'no reason given'}), harness {ours:g}"


def compare_lines(compare: Path) -> list[str]:
    """Our median against triton's do_bench_cudagraph on the same callables, per size class, from
    the comparison run's file."""
    rows = [json.loads(line) for line in compare.read_text().splitlines()] if compare.exists() else []
    # do_bench_cudagraph replays back to back, L2 warm: only hot measurements are its like (a case
    # marked cold keeps its mode in the hot run)
    other = [r for r in rows if r.get("mode", "hot") != "hot"]
    left_out = [f"compare: {len(other)} cases not timed hot ({', '.join(sorted({str(r.get('mode')) for r in other}))}) "
                "left out: do_bench_cudagraph does not flush the L2"] if other else []
    rows = [r for r in rows if r.get("mode", "hot") == "hot"]
    timed = [r for r in rows if r["do_bench_ms"] > 0]
    if not timed:
        return [f"compare: no do_bench_cudagraph timings of hot cases in {compare} (it needs a GPU)", *left_out]
    lines = []
    for size in SIZES:
        group = [r for r in timed if _size_class(r["ours_ms"]) == size]
        if group:
            ratios = [_ratio(r) for r in group]
            worst = max(ratios, key=lambda x: abs(x - 1))
            within = sum(abs(x - 1) <= WITHIN for x in ratios)
            same = [x for x in map(_same, group) if x is not None]
            lines.append(f"harness / do_bench_cudagraph, {len(ratios)} cases {size}: median ratio "
                         f"{statistics.median(ratios):.3f}, worst {worst:.3f}, within {100 * WITHIN:g}%: {within}"
                         + (f"; at the harness's calls a graph ({len(same)} cases): median "
                            f"{statistics.median(same):.3f}, within {100 * WITHIN:g}%: "
                            f"{sum(abs(x - 1) <= WITHIN for x in same)}" if same else ""))
    lines.extend(_outside_lines(timed))
    lines.extend(_same_outside_lines(timed))
    if len(timed) < len(rows):
        lines.append(f"compare: do_bench_cudagraph failed on {len(rows) - len(timed)} cases (see {compare})")
    return lines + left_out
