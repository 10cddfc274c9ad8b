"""What a failed run hands on: one command per failed case that re-runs it alone, and a short
Markdown table fit for a pull-request comment (``--attnperf-pr-comment``; docs/history.md,
"Triage")."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_attnperf.options import Settings
from pytest_attnperf.outcome import Row
from pytest_attnperf.report.failures import Failure
from pytest_attnperf.report.summary import case_labels

__all__ = ["MEMORY_SHOWN", "pr_comment", "rerun_args", "rerun_line"]

MEMORY_SHOWN = 0.02  # a peak memory this far from the baseline's is listed (shown, not gated)
SUITE_PREFIX = "pytest_attnperf/families/"  # node ids of the suites --attnperf-suites adds
DEFAULT_TOLERANCE = 0.05


def _shown_path(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when inside it, else absolute."""
    try:
        return str(path.relative_to(root)) or "."
    except ValueError:
        return str(path)


MODELS_SUITE = "models"  # the suite --attnperf-model adds (families/models/suite.py), not --attnperf-suites


def _selection(nodeid: str, settings: Settings) -> list[str]:
    """The arguments that select the case: its node id, or for a built-in suite's case (its file
    lives in the installed package) the suite and its exact name; a model's case is collected by
    its models, degrees and shapes (``--attnperf-model``), which are given as the run had them."""
    if nodeid.startswith(SUITE_PREFIX):
        suite = nodeid[len(SUITE_PREFIX):].split("/", 1)[0]
        name = nodeid.rsplit("::", 1)[-1]
        if suite == MODELS_SUITE:
            shapes = [(flag, value) for flag, value in (("--attnperf-model-prefill", settings.model_prefill),
                                                        ("--attnperf-model-train", settings.model_train),
                                                        ("--attnperf-model-decode", settings.model_decode)) if value]
            return [f"--attnperf-model={','.join(settings.models)}",
                    f"--attnperf-tp={','.join(str(tp) for tp in settings.tp)}",
                    *(f"{flag}={value}" for flag, value in shapes), "-k", name]
        return [f"--attnperf-suites={suite}", "-k", name]
    return [nodeid]


def rerun_args(nodeid: str, settings: Settings, hw: str | None, root: Path, plugin_flag: bool = False) -> list[str]:
    """pytest's arguments that re-run one case alone, with the options that change its result:
    the hardware, the baselines folder, and the mode, seed, tolerance, recording or checking,
    and the history when drift fails cases, where they are not the defaults."""
    args = (["-p", "pytest_attnperf.plugin"] if plugin_flag else []) + _selection(nodeid, settings)
    args += [f"--hw={hw}"] if hw else []
    args.append(f"--attnperf-baselines={_shown_path(settings.baselines_dir, root)}")
    if settings.mode != "cold":
        args.append(f"--attnperf-mode={settings.mode}")
    if settings.seed:
        args.append(f"--attnperf-seed={settings.seed}")
    if abs(settings.tolerance - DEFAULT_TOLERANCE) > 1e-12:
        args.append(f"--attnperf-tolerance={100 * settings.tolerance:g}%")
    if settings.update_baselines:
        args.append("--update-baselines")
    if settings.check_only:
        args.append("--attnperf-check-only")
    if settings.fail_on_drift and settings.history_dir is not None:
        args += [f"--attnperf-history={_shown_path(settings.history_dir, root)}", "--attnperf-fail-on-drift"]
    return args


def rerun_line(args: Sequence[str], root: Path, here: Path) -> str:
    """The shell line: ``pytest`` and ``args`` quoted, from ``root`` (a ``cd`` first when the run
    started elsewhere: node ids are relative to the rootdir)."""
    line = "pytest " + " ".join(shlex.quote(a) for a in args)
    return line if os.path.samefile(root, here) else f"cd {shlex.quote(str(root))} && {line}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}%"


def _time(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms * 1e3:.1f} us" if ms < 1.0 else f"{ms:.3f} ms"


def _memory_change(row: Row, entry: Mapping[str, Any] | None) -> float | None:
    """The peak memory's change against the baseline entry's, a fraction; None unless both exist."""
    before = (entry or {}).get("peak_mib")
    if row.peak_mib is None or not isinstance(before, (int, float)) or isinstance(before, bool) or before <= 0:
        return None
    return row.peak_mib / before - 1.0


def pr_comment(rows: Sequence[Row], failures: Iterable[Failure], entries: Mapping[str, Mapping[str, Any]],
               hw: str, reruns: Mapping[str, str]) -> str:
    """The Markdown: a headline of counts, a table of the cases that regressed, improved, drifted
    or moved in memory, the correctness failures, and the re-run lines."""
    labels = dict(zip((r.nodeid for r in rows), case_labels([r.nodeid for r in rows]), strict=True))
    failed = sorted({f.nodeid: f for f in failures if f.nodeid not in labels}.values(), key=lambda f: f.nodeid)
    table = []
    for r in rows:
        memory = _memory_change(r, entries.get(r.nodeid))
        moved = memory is not None and abs(memory) >= MEMORY_SHOWN
        breached = [check.status for check in r.memory if check.failed]  # the memory gate's (gate.memory)
        if r.status in ("regressed", "improved", "drifted", "clock changed") or r.drift_pct is not None or moved \
                or breached:
            baseline = r.median_ms / (1 + r.change_pct / 100) if r.change_pct is not None else None
            mem = "-" if r.peak_mib is None else f"{r.peak_mib:.1f}"
            mem += f" ({_pct(None if memory is None else 100 * memory)})" if memory is not None else ""
            verdict = "; ".join([r.status, *breached])
            table.append(f"| `{labels[r.nodeid]}` | {verdict} | {_pct(r.change_pct)} | {_time(r.median_ms)} | "
                         f"{_time(baseline)} | {mem} | {_pct(r.drift_pct)} |")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    said = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    lines = [f"### attnperf on {hw}: {len(rows)} measured cases ({said or 'none'})"
             + (f", {len(failed)} failed before being measured" if failed else ""), ""]
    if table:
        lines += ["| case | verdict | vs baseline | median | baseline | peak MiB (vs baseline) | drift |",
                  "|---|---|---:|---:|---:|---:|---:|", *table, ""]
    else:
        lines += ["No regression, improvement, drift or memory change.", ""]
    if failed:
        lines += ["Failed before being measured:", ""] + [f"- `{f.nodeid}`: {f.message}" for f in failed] + [""]
    if reruns:
        lines += ["<details><summary>Re-run a failed case alone</summary>", "", "```"]
        lines += [reruns[key] for key in sorted(reruns)] + ["```", "", "</details>", ""]
    return "\n".join(lines)
