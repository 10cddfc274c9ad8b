"""The run history's drift check against known injected work (``tools/h200.sh history``).

Reads a history file and the injection log of ``noise_benchmark.inject``
(``ATTNPERF_INJECT_LOG``) and prints, per case: whether work was injected and how much it got,
the shift ``attnperf-history`` finds (size, run, range), the gate's verdicts in the injected runs,
and whether that is the expected answer (an injected case shifts at the first injected run;
an untouched case does not shift). Last, one line of counts.

    python3 tools/history_check.py HISTORY.jsonl --inject-log INJECT.jsonl --first-injected 6
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from pytest_attnperf.gate import drift
from pytest_attnperf.report.drifts import case_series
from pytest_attnperf.report.summary import case_labels
from pytest_attnperf.store import history


def _injected(path: Path) -> dict[str, float]:
    """Each injected case's extra work, as the median's share over its untouched time."""
    got: dict[str, list[float]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        row = json.loads(line)
        if row.get("base_ms") and row.get("median_ms"):
            got.setdefault(row["nodeid"], []).append(row["median_ms"] / row["base_ms"] - 1.0)
    return {k: statistics.median(v) for k, v in got.items()}


def main() -> int:
    """Print the table and the counts; 0 when every case got the expected answer, else 1."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("history", type=Path)
    parser.add_argument("--inject-log", type=Path, required=True)
    parser.add_argument("--first-injected", type=int, required=True, help="the first injected run, 1-based")
    args = parser.parse_args()
    injected = _injected(args.inject_log)
    series = case_series(args.history.stem, history.read(args.history).records)
    labels = case_labels([s.case for s in series])
    rows, good = [], 0
    for s, label in zip(series, labels, strict=True):
        shifts = drift.find_shifts(s.medians_ms)
        got = injected.get(s.case)
        verdicts = ",".join(str(r.get("verdict")) for r in s.records[args.first_injected - 1:])
        if got is not None:
            ok = len(shifts) == 1 and shifts[0].index == args.first_injected - 1 and shifts[0].slower
        else:
            ok = not shifts
        good += ok
        found = "; ".join(f"{100 * sh.size:+.1f}% at run {sh.index + 1} ({s.label(sh.index - 1)}..{s.label(sh.index)}, "
                          f"p={sh.p_value:.1g})" for sh in shifts) or "none"
        rows.append(f"| {label} | {'-' if got is None else f'{100 * got:+.1f}%'} | {found} | {verdicts} | "
                    f"{'yes' if ok else 'NO'} |")
    print("| case | injected (got) | shift found | verdicts, injected runs | expected |")
    print("|---|---:|---|---|---|")
    print("\n".join(rows))
    hit = sum(1 for s in series if s.case in injected)
    print(f"{good} of {len(series)} cases as expected ({hit} injected from run {args.first_injected}, "
          f"{len(series) - hit} untouched)")
    return 0 if good == len(series) else 1


if __name__ == "__main__":
    raise SystemExit(main())
