"""``attnperf-history``: a run history read back, and each case's lasting shifts reported.

``attnperf-history HISTORY [--plot DIR] [--out FILE]`` reads ``<hw>.jsonl`` files (or the
folders holding them), finds each case's shifts in its run medians (``gate.drift``), and prints
a Markdown report: per shift its size, the last good and first bad commit (the range to
bisect) and its p-value. ``--plot DIR`` draws a PNG per case that shifted (matplotlib, imported
only then). Needs the optional extra ``history`` (ruptures); without it, it says how to install it.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_attnperf.gate import drift
from pytest_attnperf.options import fraction
from pytest_attnperf.store import history

__all__ = ["CaseSeries", "Found", "case_series", "main", "markdown", "plot"]

PLOT_HINT = "pip install matplotlib"
TICKS_NAMED = 40  # a plot of at most this many runs names each run's commit


@dataclass(frozen=True)
class CaseSeries:
    """One case's runs in one mode, oldest first: the last record of each run."""

    hw: str
    case: str
    mode: str
    records: tuple[Mapping[str, Any], ...]

    @property
    def medians_ms(self) -> list[float]:
        """The runs' medians."""
        return [float(r["median_ms"]) for r in self.records]

    def label(self, index: int) -> str:
        """Run ``index``'s commit (12 characters), else its run id."""
        record = self.records[index]
        commit = record.get("commit")
        return str(commit)[:12] if commit else f"run {str(record.get('run', '?'))[:8]}"


@dataclass(frozen=True)
class Found:
    """A case's series and the shifts that count."""

    series: CaseSeries
    shifts: tuple[drift.Shift, ...]


def case_series(hw: str, records: Sequence[Mapping[str, Any]]) -> list[CaseSeries]:
    """Each case and mode's runs, in the order the runs first appear; a case measured twice in one
    run (a rerun) keeps its last record."""
    found = []
    for (case, mode), rows in sorted(history.series(records).items()):
        by_run: dict[str, Mapping[str, Any]] = {}
        for row in rows:
            by_run[str(row.get("run"))] = row  # the dict keeps the first appearance's place
        found.append(CaseSeries(hw, case, mode, tuple(by_run.values())))
    return found


def _files(paths: Sequence[Path]) -> list[Path]:
    files: list[Path] = []
    for path in paths:
        files.extend(sorted(path.glob("*.jsonl")) if path.is_dir() else [path])
    return files


def _pct(size: float) -> str:
    return f"{100 * size:+.1f}%"


def markdown(found: Sequence[Found], *, cases: int, skipped: int, window: int) -> str:
    """The report: one row per shift, then what was read."""
    shifted = [f for f in found if f.shifts]
    lines = [f"# Shifts in the run history: {len(shifted)} of {cases} cases", ""]
    if shifted:
        lines += ["| case | hw | mode | runs | shift | at run | last good | first bad | p-value | before | after |",
                  "|---|---|---|---:|---:|---:|---|---|---:|---:|---:|"]
    for f in shifted:
        s = f.series
        for shift in f.shifts:
            way = "slower" if shift.slower else "faster"
            lines.append(f"| `{s.case}` | {s.hw} | {s.mode} | {len(s.records)} | {_pct(shift.size)} {way} | "
                         f"{shift.index + 1} | {s.label(shift.index - 1)} | {s.label(shift.index)} | "
                         f"{shift.p_value:.2g} | {shift.before_ms:.4g} ms | {shift.after_ms:.4g} ms |")
    if not shifted:
        lines.append("No case shifted lastingly.")
    lines += ["", f"Rule: a shift counts at {100 * drift.Rule().min_shift:g}% or more, p at most "
                  f"{drift.Rule().max_p:g}, its first {drift.Rule().persist} runs all beyond the noise "
                  f"(docs/history.md); {'the last ' + str(window) + ' runs of each case' if window else 'every run'}."]
    if skipped:
        lines.append(f"Skipped {skipped} lines that could not be read or are of a later schema.")
    return "\n".join(lines) + "\n"


def _file_name(s: CaseSeries) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{s.hw}-{s.case}-{s.mode}").strip("_")[:150] + ".png"


def plot(found: Found, folder: Path) -> Path:
    """A PNG of the case's medians (with their 95% intervals), its levels and its shifts."""
    import matplotlib  # noqa: PLC0415 - optional, looked up where plots are drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - optional, looked up where plots are drawn

    s = found.series
    runs = list(range(1, len(s.records) + 1))
    medians = s.medians_ms
    low = [m - float(r.get("ci_low_ms", m)) for m, r in zip(medians, s.records, strict=True)]
    high = [float(r.get("ci_high_ms", m)) - m for m, r in zip(medians, s.records, strict=True)]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.errorbar(runs, medians, yerr=[low, high], fmt="o-", ms=4, lw=1, capsize=2, label="median (95% CI)")
    bounds = [0, *(sh.index for sh in found.shifts), len(medians)]
    levels = [found.shifts[0].before_ms] + [sh.after_ms for sh in found.shifts] if found.shifts else []
    for (a, b), level in zip(zip(bounds, bounds[1:], strict=False), levels, strict=False):
        ax.hlines(level, a + 0.6, b + 0.4, colors="grey", linestyles="dashed")
    for sh in found.shifts:
        ax.axvline(sh.index + 0.5, color="red", lw=1)
        ax.annotate(f"{_pct(sh.size)} (p={sh.p_value:.1g})", (sh.index + 0.6, sh.after_ms), color="red", fontsize=8)
    if len(runs) <= TICKS_NAMED:  # each run's commit under its point
        ax.set_xticks(runs, [s.label(i) for i in range(len(runs))], rotation=60, ha="right", fontsize=7)
    ax.set_xlabel("run (commit)")
    ax.set_ylabel("median (ms)")
    ax.set_title(f"{s.case} ({s.hw}, {s.mode})", fontsize=8)
    ax.legend(fontsize=8)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / _file_name(s)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _percent(text: str) -> float:
    try:
        return fraction(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnperf-history", description=__doc__.split("\n\n")[1])
    parser.add_argument("history", nargs="+", type=Path, help="<hw>.jsonl files, or folders of them")
    parser.add_argument("--case", default="", help="only cases whose key holds this text (default: all)")
    parser.add_argument("--window", type=int, default=0, help="judge each case's last N runs only (default 0: all)")
    parser.add_argument("--min-shift", type=_percent, default=drift.Rule().min_shift,
                        help="least shift that counts (default 1%%)")
    parser.add_argument("--max-p", type=float, default=drift.Rule().max_p, help="greatest p-value (default 0.01)")
    parser.add_argument("--persist", type=int, default=drift.Rule().persist,
                        help="runs after a shift that must all stay shifted (default 2)")
    parser.add_argument("--plot", type=Path, default=None,
                        help="folder for a PNG per case that shifted (default: none)")
    parser.add_argument("--out", type=Path, default=None, help="write the Markdown here (default: standard output)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: 0 when read and reported, 2 on a usage problem or a missing library."""
    args = _parser().parse_args(argv)
    missing = drift.available()
    if missing is not None:
        print(f"attnperf-history needs the change-point library: {missing}", file=sys.stderr)
        return 2
    try:
        rule = drift.Rule(min_shift=args.min_shift, max_p=args.max_p, persist=args.persist)
    except ValueError as exc:
        print(f"attnperf-history: {exc}", file=sys.stderr)
        return 2
    files = _files(args.history)
    absent = [str(p) for p in files if not p.is_file()]
    if absent or not files:
        print(f"attnperf-history: no history at {', '.join(absent or map(str, args.history))}", file=sys.stderr)
        return 2
    found, cases, skipped = [], 0, 0
    for path in files:
        read = history.read(path)
        skipped += read.unreadable + read.newer
        for s in case_series(path.stem, read.records):
            if args.case not in s.case:
                continue
            cases += 1
            if args.window > 0:
                s = CaseSeries(s.hw, s.case, s.mode, s.records[-args.window:])
            found.append(Found(s, tuple(drift.find_shifts(s.medians_ms, rule))))
    text = markdown(found, cases=cases, skipped=skipped, window=args.window)
    if args.plot is not None:
        text += _plots([f for f in found if f.shifts], args.plot)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


def _plots(shifted: Sequence[Found], folder: Path) -> str:
    """The plots' lines for the report: where each went, or why none was drawn."""
    if not shifted:
        return ""
    try:
        import matplotlib  # noqa: F401, PLC0415 - optional, looked up where plots are drawn
    except ImportError:
        return f"\nNo plots: matplotlib is not installed ({PLOT_HINT}).\n"
    lines = ["", "Plots:"] + [f"- `{plot(f, folder)}`" for f in shifted]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
