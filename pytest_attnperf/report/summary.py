"""The summary table printed at the end of a run."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pytest_attnperf.outcome import Row

__all__ = ["BENCHMARK_CLOCK", "case_labels", "outside_summary", "summary_lines"]

SHARED_NOTE = 3  # a note on more cases than this, and on most of them, is printed once with its count
_HEADER = ("case", "backend", "median", "spread", "TFLOP/s", "MFU %", "GB/s", "BW %", "FLOP/B", "bound",
           "roof %", "peak MiB", "mem vs base", "mem bound %", "eager", "eager vs base", "bitwise", "vs baseline")
_BOUND = {"compute": "cmp", "memory": "mem"}
BENCHMARK_CLOCK = "attnperf_clock"  # the extra_info key of a pytest-benchmark entry attnperf measured


def _time(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if ms < 1.0 else f"{ms:.3f} ms"


def _pct(frac: float | None) -> str:
    return "-" if frac is None else f"{100 * frac:.1f}"


def _memory(row: Row, bound: bool) -> str:
    """The peak against the baseline's ("+0.0% unchanged") or as a share of the family's bound
    ("38 within", "140 OVER"); "-" where not judged."""
    for check in row.memory:
        if bound != check.of_bound or check.ratio is None:
            continue
        if bound:
            return f"{100 * check.ratio:.0f} " + ("OVER" if check.failed else "within")
        return f"{100 * (check.ratio - 1):+.1f}% " + ("REGRESSED" if check.failed else check.status)
    return "-"


def _change(row: Row) -> str:
    if row.change_pct is None:
        return row.status
    return f"{row.change_pct:+.1f}% {row.status}"


_SEPARATOR = re.compile(r"(/|::)")  # between a node id's folders, module, class and function


def _label(tokens: Sequence[str], params: str, depth: int) -> str:
    """The node id's last ``depth`` names (folders, module, class, function) and its parameters."""
    return "".join(tokens[max(0, len(tokens) - 2 * depth + 1):]) + params


def case_labels(nodeids: Sequence[str]) -> list[str]:
    """Each node id as the summary shows it: the test and its parametrize id
    (``test_softmax[sdpa-b2]``), widened by as many enclosing names as it takes to differ from
    every other row (``test_a.py::test_softmax[sdpa-b2]``, ``a/test_a.py::...``), so that two
    modules' tests with one name and one id are told apart while a unique row stays short. The
    parametrize id is never split: it may hold ``/`` or ``::`` itself."""
    split = [nodeid.partition("[") for nodeid in nodeids]
    tokens = [_SEPARATOR.split(name) for name, _, _ in split]
    params = [bracket + rest for _, bracket, rest in split]
    depths = [1] * len(nodeids)
    while True:
        labels = [_label(t, p, d) for t, p, d in zip(tokens, params, depths, strict=True)]
        counts = Counter(labels)
        widen = [i for i, label in enumerate(labels) if counts[label] > 1 and 2 * depths[i] - 1 < len(tokens[i])]
        if not widen:  # every row unique, or as long as its node id (the same test measured twice)
            return labels
        for i in widen:
            depths[i] += 1


def summary_lines(rows: Sequence[Row], hw_name: str, drift: Sequence[str] = ()) -> list[str]:
    """A fixed-width table, one line per measured case, then notes.

    "FLOP/B" is the cost model's arithmetic intensity; "bound" is "cmp" or "mem" by the side of
    the ridge point (peak FLOP/s over bandwidth, the measured ceilings where known) it falls on;
    "roof %" is the achieved FLOP/s over the attainable ``min(peak, FLOP/B x bandwidth)``. The
    ceilings behind them are printed under the table (see roofline.py and ceilings.py).

    "peak MiB" is the peak memory above the inputs; "mem vs base" its change against the
    baseline's and "mem bound %" its share of the family's bound for a tiled kernel, each gated
    apart from the time (``gate.memory``, docs/memory.md).

    "vs baseline" is the gated device-time verdict; "eager vs base" is the eager per-call time
    (host overhead included) against the baseline's, reported and never gated: host time is
    too noisy to fail a test on, but a kernel author should see which of the two moved.

    "bitwise" says whether two replays of one timed draw gave the same bits (``measure.verify``):
    "no" is no failure (a kernel with atomics is correct and not reproducible) unless the test
    or kernel is marked ``attnperf_deterministic``."""
    labels = case_labels([r.nodeid for r in rows])
    table = [_HEADER] + [
        (
            label,
            r.backend,
            _time(r.median_ms),
            f"{100 * r.stdrel:.2f}%",
            f"{r.tflops:.2f}",
            _pct(r.mfu),
            f"{r.gb_per_s:.1f}",
            _pct(r.bandwidth_frac),
            f"{r.intensity:.0f}",
            _BOUND.get(r.bound or "", "-"),
            _pct(r.roofline_frac),
            "-" if r.peak_mib is None else f"{r.peak_mib:.1f}",
            _memory(r, bound=False),
            _memory(r, bound=True),
            _time(r.eager_ms),
            "-" if r.eager_change_pct is None else f"{r.eager_change_pct:+.1f}%",
            "-" if r.bitwise is None else "yes" if r.bitwise else "no",
            _change(r),
        )
        for r, label in zip(rows, labels, strict=True)
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADER))]
    statuses = Counter(r.status for r in rows)
    counted = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
    breaches = Counter(c.status for r in rows for c in r.memory if c.failed)  # the memory gate's, apart
    counted += "".join(f"; {n} {s}" for s, n in sorted(breaches.items()))
    lines = [f"attnperf on {hw_name}: {len(rows)} measured cases" + (f" ({counted})" if counted else "")]
    for n, line in enumerate(table):
        cells = zip(line, widths, strict=True)
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(cells)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    notes = [(label, note) for r, label in zip(rows, labels, strict=True) for note in r.notes]
    counts = Counter(note for _, note in notes)
    shared = {note for note, n in counts.items() if n > SHARED_NOTE and 2 * n > len(rows)}
    for label, note in notes:  # a note most cases share (no NVML, say) is printed once
        if note not in shared:
            lines.append(f"note: {label}: {note}")
    for note in sorted(shared):
        lines.append(f"note, {counts[note]} of {len(rows)} cases: {note}")
    shown: list[object] = []
    for r in rows:  # the ceilings are the run's: one set of lines
        if r.ceilings is not None and r.ceilings not in shown:
            shown.append(r.ceilings)
            lines.extend(r.ceilings.lines())
    changed = sum(1 for r in rows if r.kernels_changed)
    if changed:
        lines.append(f"kernels changed in {changed} of {len(rows)} cases against their baseline entries (their notes "
                     "say how; docs/measurement.md, \"The kernel inventory\")")
    if drift:
        lines.append("environment differs from the baseline's header: " + ", ".join(drift))
    return lines


BenchmarkGroups = list[tuple[Any, list[dict[str, Any]]]]  # pytest-benchmark's grouped stats: (group, entries)


def outside_summary(groups: BenchmarkGroups) -> BenchmarkGroups:
    """pytest-benchmark's groups less the entries attnperf measured, and less the groups left
    empty. Those entries are in the attnperf summary already; pytest-benchmark's table would
    show them again with columns (mean, max, OPS over the replayed device samples) that do not
    match its figures. A project's own benchmarks stay in its table."""
    kept = [(name, [b for b in benches if BENCHMARK_CLOCK not in (b.get("extra_info") or {})])
            for name, benches in groups]
    return [(name, benches) for name, benches in kept if benches]
