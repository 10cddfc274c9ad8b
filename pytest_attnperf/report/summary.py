"""The summary table printed at the end of a run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from pytest_attnperf.outcome import Row

__all__ = ["summary_lines"]

SHARED_NOTE = 3  # a note on more cases than this, and on most of them, is printed once with its count
_HEADER = ("case", "backend", "median", "spread", "TFLOP/s", "MFU %", "GB/s", "BW %", "FLOP/B", "bound",
           "roof %", "peak MiB", "eager", "eager vs base", "bitwise", "vs baseline")
_BOUND = {"compute": "cmp", "memory": "mem"}


def _time(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if ms < 1.0 else f"{ms:.3f} ms"


def _pct(frac: float | None) -> str:
    return "-" if frac is None else f"{100 * frac:.1f}"


def _change(row: Row) -> str:
    if row.change_pct is None:
        return row.status
    return f"{row.change_pct:+.1f}% {row.status}"


def _case(nodeid: str) -> str:
    return nodeid.rsplit("::", 1)[-1]


def summary_lines(rows: Sequence[Row], hw_name: str, drift: Sequence[str] = ()) -> list[str]:
    """A fixed-width table, one line per measured case, then notes.

    "FLOP/B" is the cost model's arithmetic intensity; "bound" is "cmp" or "mem" by the side of
    the ridge point (peak FLOP/s over bandwidth, the measured ceilings where known) it falls on;
    "roof %" is the achieved FLOP/s over the attainable ``min(peak, FLOP/B x bandwidth)``. The
    ceilings behind them are printed under the table (see roofline.py and ceilings.py).

    "vs baseline" is the gated device-time verdict; "eager vs base" is the eager per-call time
    (host overhead included) against the baseline's, reported and never gated: host time is
    too noisy to fail a test on, but a kernel author should see which of the two moved.

    "bitwise" says whether two replays of one timed draw gave the same bits (``measure.verify``):
    "no" is no failure (a kernel with atomics is correct and not reproducible) unless the test
    or kernel is marked ``attnperf_deterministic``."""
    table = [_HEADER] + [
        (
            _case(r.nodeid),
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
            _time(r.eager_ms),
            "-" if r.eager_change_pct is None else f"{r.eager_change_pct:+.1f}%",
            "-" if r.bitwise is None else "yes" if r.bitwise else "no",
            _change(r),
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADER))]
    statuses = Counter(r.status for r in rows)
    counted = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
    lines = [f"attnperf on {hw_name}: {len(rows)} measured cases" + (f" ({counted})" if counted else "")]
    for n, line in enumerate(table):
        cells = zip(line, widths, strict=True)
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(cells)))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    notes = [(r.nodeid, note) for r in rows for note in r.notes]
    counts = Counter(note for _, note in notes)
    shared = {note for note, n in counts.items() if n > SHARED_NOTE and 2 * n > len(rows)}
    for nodeid, note in notes:  # a note most cases share (no NVML, say) is printed once
        if note not in shared:
            lines.append(f"note: {_case(nodeid)}: {note}")
    for note in sorted(shared):
        lines.append(f"note, {counts[note]} of {len(rows)} cases: {note}")
    shown: list[object] = []
    for r in rows:  # the ceilings are the run's: one set of lines
        if r.ceilings is not None and r.ceilings not in shown:
            shown.append(r.ceilings)
            lines.extend(r.ceilings.lines())
    if drift:
        lines.append("environment differs from the baseline's header: " + ", ".join(drift))
    return lines
