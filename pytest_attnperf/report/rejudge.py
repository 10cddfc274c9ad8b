"""Judge a noise-benchmark work folder's saved runs again with the gate in this tree.

    attnperf-rejudge noise-work [--tolerance 1.5%] [--least-noise 0.5%] [--least-noise-time 0.1us]
                     [--machine-noise 0] [--machine-offset 0] [--overheads] [--machine-residual 0.5us]
                     [--baseline-overhead 3.26us]

For changing the gate without a GPU: the steady runs' medians (``run<i>.json``) are judged against
the work folder's baseline as ``pytest_attnperf.gate.verdict.judge`` would judge them now, and the
injected runs' flags (``inject<pct>.xml``) again; only medians are saved, so the counts are upper
bounds. docs/noise-benchmark.md, "Re-judging saved runs".
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_attnperf.gate.verdict import judge, overhead_shift_ms
from pytest_attnperf.measure.summary import Summary
from pytest_attnperf.options import duration_ms, fraction
from pytest_attnperf.store import baselines
from pytest_attnperf.store.runs import read_run, run_files, testcase_nodeid

CURRENT = re.compile(r"current:\s+median ([0-9.eE+-]+) ms")


def point(ms: float) -> Summary:
    """A run's median with no spread of its own (only medians are saved)."""
    return Summary(ms, ms, ms, 0.0, 1000)


def shifted(summary: Summary, entry: dict[str, Any], run_clock: str | None, machine: tuple[float, float],
            run_floor_ms: float | None, floors: tuple[float, float | None] | None,
            ) -> tuple[float, float, float | None]:
    """The between-machines terms for one case of one run: ``machine`` and no shift, or, with
    ``floors`` (the residual, and a baseline floor for a file that holds none), as
    ``perf.Perf._machine_terms`` would give them: the case cold on the ``cuda-graph-nodes``
    clock in the baseline and in the run, and ``gate.overhead_shift_ms`` giving a shift from the
    run's floor as the gate used it (``Run.gate_overhead_ms``)."""
    if floors is None or not any(machine):
        return (*machine, None)
    nodes = (entry.get("mode"), entry.get("clock")) == ("cold", "cuda-graph-nodes")
    if not nodes or run_clock not in (None, "cuda-graph-nodes"):
        return (*machine, None)
    residual_ms, fallback_ms = floors
    if fallback_ms is not None and not any(summary.run_overheads_ms):  # a file from before floors were kept
        summary = replace(summary, run_overheads_ms=(fallback_ms,) * len(summary.run_medians_ms))
    shift_ms, _ = overhead_shift_ms(summary, run_floor_ms)
    return (*machine, None) if shift_ms is None else (machine[0], residual_ms, shift_ms)


def steady(work: Path, base: baselines.BaselineFile, tolerance: float, floor: float,
           machine: tuple[float, float], floors: tuple[float, float | None] | None = None,
           floor_ms: float = 0.0) -> tuple[int, int, list[tuple[str, str, float]]]:
    """Judgements made, cases not compared (eager-timed, against another machine) and
    (run, case, change %) of those that regressed."""
    made, skipped, flagged = 0, 0, []
    for run in run_files(work):
        found = read_run(run)
        for case, ms in sorted(found.medians.items()):
            summary = base.summary(case)
            if summary is None:
                continue
            if case in found.event_timed and any(machine):
                skipped += 1
                continue
            terms = shifted(summary, base.entries[case], (found.clocks or {}).get(case), machine,
                            found.gate_overhead_ms, floors)
            verdict = judge(point(ms), summary, tolerance, floor, *terms, least_noise_ms=floor_ms)
            made += 1
            change = verdict.change_pct  # a regressed verdict always has a ratio
            if verdict.status == "regressed" and change is not None:
                flagged.append((run.name, case, change))
    return made, skipped, flagged


def injected(work: Path, base: baselines.BaselineFile, tolerance: float, floor: float,
             machine: tuple[float, float], floor_ms: float = 0.0) -> dict[str, tuple[int, int]]:
    """Per inject report: (cases flagged REGRESSED on the device, of them still regressed)."""
    out = {}
    for report in sorted(work.glob("inject*.xml")):
        flagged = kept = 0
        for case in ET.parse(report).getroot().iter("testcase"):
            said = " ".join(f.get("message", "") + (f.text or "") for f in case.findall("failure"))
            found = CURRENT.search(said)
            if "REGRESSED" not in said or not found:
                continue
            summary = base.summary(testcase_nodeid(case))
            if summary is None:
                continue
            flagged += 1
            judged = judge(point(float(found.group(1))), summary, tolerance, floor, *machine, least_noise_ms=floor_ms)
            kept += judged.status == "regressed"
        out[report.name] = (flagged, kept)
    return out


def main(argv: list[str] | None = None) -> int:
    """The ``attnperf-rejudge`` command: judge the work folder's saved runs again and print the counts;
    the exit status."""
    parser = argparse.ArgumentParser(prog="attnperf-rejudge", description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--hw", help="the baseline's name in the work folder (default: its only .yaml)")
    parser.add_argument("--tolerance", type=fraction, default=0.015)
    parser.add_argument("--least-noise", type=fraction, default=0.005, help="--attnperf-run-noise")
    parser.add_argument("--least-noise-time", type=duration_ms, default=0.0001,
                        help="--attnperf-run-noise-time (default 0.1us; 0: no time floor)")
    parser.add_argument("--machine-noise", type=fraction, default=0.0)
    parser.add_argument("--machine-offset", type=duration_ms, default=0.0,
                        help="--attnperf-machine-offset ('1us'; a bare number is in us)")
    parser.add_argument("--overheads", action="store_true",
                        help="move each centre by the run's sample overhead less the recordings' (as the plugin does)")
    parser.add_argument("--machine-residual", type=duration_ms, default=0.0005,
                        help="--attnperf-machine-residual, with --overheads (default 0.5us)")
    parser.add_argument("--baseline-overhead", type=duration_ms, default=None,
                        help="with --overheads: the recordings' floor for a file that holds none ('3.26us')")
    args = parser.parse_args(argv)
    found = [args.workdir / f"{args.hw}.yaml"] if args.hw else sorted(args.workdir.glob("*.yaml"))
    if len(found) != 1 or not found[0].exists():
        parser.error(f"need one baseline .yaml in {args.workdir} (found {[p.name for p in found]}); pass --hw")
    base = baselines.load(found[0])
    if base is None:
        parser.error(f"{found[0]} holds no baseline")
    settings = (args.tolerance, args.least_noise, (args.machine_noise, args.machine_offset))
    floors = (args.machine_residual, args.baseline_overhead) if args.overheads else None
    made, skipped, flagged = steady(args.workdir, base, *settings, floors, args.least_noise_time)
    moved = (f"; with overheads: centres moved by the sample overheads' difference, "
             f"{1e3 * args.machine_residual:g} us residual"
             + (f", recordings' overhead {1e3 * args.baseline_overhead:g} us where the file has none"
                if args.baseline_overhead is not None else "")) if floors else ""
    print(f"tolerance {100 * args.tolerance:g}%, least noise {100 * args.least_noise:g}% and "
          f"{1e3 * args.least_noise_time:g} us, "
          f"machine noise {100 * args.machine_noise:g}% and {1e3 * args.machine_offset:g} us{moved} "
          "(each interval test taken as passed: upper bounds)")
    print(f"steady runs: {made} judgements, {len(flagged)} regressed"
          + (f"; {skipped} eager-timed not compared (another machine)" if skipped else ""))
    for run, case, change in flagged:
        print(f"  {run} {case} {change:+.2f}%")
    for report, (was, kept) in injected(args.workdir, base, *settings, args.least_noise_time).items():
        print(f"{report}: {was} flagged on the device, {kept} still regressed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
