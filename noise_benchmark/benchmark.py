"""The noise benchmark: how steady the harness is, and what its gate catches.

    python -m noise_benchmark.benchmark --runs 5 --inject 0.02,0.05,0.10 -- suites/ --hw=h200 -k softmax

It runs from a checkout of the repository (this folder is not in the installed package).

Its stages, in this order (--stages names some; default the first three, --compare adds the
fourth): record (fresh baselines in the work folder, --records times), steady (--runs unchanged
runs gated against them), inject (extra device work in the cases --every picks), compare (the
harness against triton's do_bench_cudagraph, GPU). Everything after -- goes to pytest. A call
writes its report to <workdir>/report-<stages>.txt; it exits 2 when inject has no baseline file,
3 when --time-limit stopped it, 130 when interrupted. More: docs/noise-benchmark.md.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TypeVar

from noise_benchmark import compare
from noise_benchmark.inject import is_picked
from pytest_attnperf.measure import child as child_run
from pytest_attnperf.store import baselines as store
from pytest_attnperf.store.runs import (
    SIZES,
    BadReport,
    Run,
    _count_spread,
    _judged_line,
    _outcomes,
    _per_case,
    _size_class,
    _spread,
    _spreads,
    _with,
    read_run,
    run_files,
    testcase_nodeid,
)

T = TypeVar("T")

__all__ = ["Run", "main", "read_run", "run_files", "testcase_nodeid"]

STAGES = ("record", "steady", "inject", "compare")


def _stages(text: str) -> tuple[str, ...]:
    """``--stages``: names from STAGES, comma-separated; they run in STAGES order."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    unknown = names - set(STAGES)
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: stages are a comma-separated subset of {','.join(STAGES)}")
    return tuple(stage for stage in STAGES if stage in names)


_now = time.monotonic  # the clock of --time-limit (tests put a fake one here)


def _seconds(text: str) -> float:
    """An argparse type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive number of seconds")
    return value


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: an integer no smaller than ``least``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"{text}: must be at least {least}")
        return value

    return parse


# the folder that holds noise_benchmark: a pytest run in another working folder imports the inject plugin from it
CHECKOUT = Path(__file__).resolve().parent.parent


def _child_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a pytest run: this process's with ``env`` over it, and CHECKOUT first on
    PYTHONPATH (an existing PYTHONPATH kept after it), so that ``-p noise_benchmark.inject`` loads
    in any working folder."""
    merged = {**os.environ, **(env or {})}
    merged["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHECKOUT), merged.get("PYTHONPATH", "")) if p)
    return merged


def _pytest(args: list[str], env: dict[str, str] | None = None) -> int:
    cmd = [sys.executable, "-m", "pytest", "-p", "noise_benchmark.inject", "-q", "-p", "no:cacheprovider", *args]
    print("+", " ".join(cmd), flush=True)
    return child_run.wait_for(child_run.start(cmd, _child_env(env)))


def _hw(args: list[str]) -> str | None:
    """The ``--hw`` among the pytest arguments (the last one, as pytest reads them), if any."""
    hw = None
    for i, arg in enumerate(args):
        if arg.startswith("--hw="):
            hw = arg.split("=", 1)[1]
        elif arg == "--hw" and i + 1 < len(args):
            hw = args[i + 1]
    return hw


def _baseline_path(work: Path, hw: str | None) -> Path | None:
    """The record stage's ``<hw>.yaml`` in the work folder: that of ``--hw``, else any one."""
    if hw:
        path = work / f"{hw}.yaml"
        return path if path.exists() else None
    return next(iter(sorted(work.glob("*.yaml"))), None)


def _missing_baseline(work: Path, hw: str | None) -> str:
    return (
        f"noise: stage inject gates against the baselines of a record stage, and there is no "
        f"{hw or '<hw>'}.yaml in {work.resolve()}; run --stages record with the same --workdir first"
    )


def _recording_lines(work: Path, hw: str | None) -> list[str]:
    """The spread of each case's median over its recordings in the work folder's baseline file
    (``run_medians_ms``: each recording is one pytest process, as each steady run is), and the
    cases left with fewer recordings than the rest (a recording the gate judged a real change
    against the ones before starts the history afresh)."""
    path = _baseline_path(work, hw)
    if path is None:
        return []
    try:
        loaded = store.load(path)
    except store.BaselineError as exc:
        return [f"recordings: {path.name} unreadable ({exc})"]
    histories = {case: [float(v) for v in entry.get("run_medians_ms") or []]
                 for case, entry in (loaded.entries if loaded else {}).items()}
    most = max((len(v) for v in histories.values()), default=0)
    if most < 2:
        return [f"recordings: at most one per case in {path.name}, no spread"]
    spreads = _spreads(histories)
    count = _count_spread(list(spreads.values()))
    worst = sorted(((sd, case) for case, (median, _, sd) in spreads.items() if median >= 0.01 and sd > 0.01),
                   reverse=True)
    shown = ", ".join(f"{case.rsplit('::', 1)[-1]} {100 * sd:.2f}%" for sd, case in worst[:3])
    fewer = sorted(case for case, values in histories.items() if len(values) < most)
    lines = [f"recordings in {path.name} (one process each): cases >= 10 us with range > 1%: {count.over_range} of "
             f"{count.cases}; with sd > 1%: {count.over_sd} of {count.cases}" + (f" ({shown})" if shown else "")]
    if fewer:
        names = ", ".join(c.rsplit("::", 1)[-1] for c in fewer[:3]) + (", ..." if len(fewer) > 3 else "")
        lines.append(f"  {len(fewer)} case(s) with fewer than {most} recordings, their history restarted by a "
                     f"recording judged a real change, or recorded fewer times: {names}")
    return lines


def _steady_runs(work: Path) -> tuple[dict[Path, Run], list[str]]:
    """Each readable ``run<i>.json`` in the work folder (``read_run``), and a note per unreadable one."""
    runs: dict[Path, Run] = {}
    notes: list[str] = []
    for path in run_files(work):
        try:
            runs[path] = read_run(path)
        except (ValueError, KeyError, TypeError) as exc:
            notes.append(f"{path.name}: unreadable, left out ({type(exc).__name__}: {exc})")
    return runs, notes


def _steady_lines(work: Path) -> list[str]:
    """The steady table, from whatever ``run*.json`` (and ``run*.xml``) the work folder holds."""
    by_path, notes = _steady_runs(work)
    runs = [run.medians for run in by_path.values()]
    # the gate's verdicts are in the JSON beside the medians; the JUnit reports add the cases that
    # failed for another reason (a changed clock, a crash: no verdict, or none that says so)
    false_regressions = [{c for c, v in (run.verdicts or {}).items() if v == "regressed"} for run in by_path.values()]
    outcomes: list[dict[str, str]] = []
    for path in by_path:
        try:
            outcomes.append(_outcomes(path.with_suffix(".xml")))
        except BadReport as exc:
            outcomes.append({})
            notes.append(f"{exc} Its cases that failed for another reason are not listed.")
    if not runs:
        return [f"no steady runs in {work}", *notes]
    lines = [f"{len(runs)} unchanged runs (run*.json in the work folder); run-to-run spread of a case's "
             "median: range = (max - min) / median, sd = standard deviation / mean", ""]
    lines.append(f"{'case':<78} {'median':>10} {'range':>7} {'sd':>6} {'runs':>5} {'false':>5}")
    events = set().union(*(run.event_timed for run in by_path.values()))
    per_case = _per_case(runs)
    spreads = _spreads(per_case)
    over = _count_spread(list(spreads.values()))
    over_events = _count_spread([spread for case, spread in spreads.items() if case in events])
    for case, values in per_case.items():
        median, spread, sd = spreads.get(case) or _spread(values)
        times_flagged = sum(case in f for f in false_regressions)
        cells = f"{100 * spread:>6.2f}% {100 * sd:>5.2f}%" if len(values) > 1 else f"{'-':>7} {'-':>6}"
        lines.append(f"{case.rsplit('::', 1)[-1][:78]:<78} {median:>8.4f}ms {cells} {len(values):>5} "
                     f"{times_flagged:>5}" + ("  events" if case in events else ""))
    lines.append(_judged_line(list(by_path.values()), sum(len(f) for f in false_regressions)))
    machines = {path.stem: run.machines for path, run in by_path.items()}
    if any(machines.values()):  # which runs shared a machine (a GPU, a boot): their medians move together
        lines.append("machines: " + "; ".join(f"{run} on {', '.join(sorted(m)) or '?'}" for run, m in machines.items()))
    floors = {path.stem: run.floor_ms for path, run in by_path.items() if run.floor_ms is not None}
    if floors:  # a machine whose samples carry a fixed cost shows it here (see --attnperf-machine-offset)
        lines.append("sample overhead: " + "; ".join(f"{run} {1e3 * ms:.2f} us" for run, ms in floors.items()))
    others = sorted(set().union(*(_with(o, "failed") for o in outcomes)))
    if others:
        shown = ", ".join(c.rsplit("::", 1)[-1] for c in others[:5]) + (", ..." if len(others) > 5 else "")
        lines.append(f"cases that failed for another reason in some run: {len(others)} ({shown})")
    if over.cases:
        lines.append(f"cases >= 10 us with run-to-run range > 1%: {over.over_range} of {over.cases}; "
                     f"with sd > 1%: {over.over_sd} of {over.cases}")
    else:  # one run per folder once had the report say "range > 1%: 0 of 262"
        lines.append("run-to-run spread: no case of 10 us or more has two runs in this folder (run more, "
                     "or --keep-runs)")
    if over_events.cases:
        lines.append(f"  of them timed with events around eager launches ('events': not graph-capturable, launch "
                     f"and host overhead included): {over_events.cases}, range > 1%: {over_events.over_range}, "
                     f"sd > 1%: {over_events.over_sd}")
    return [*lines, *notes]


def _size_medians(work: Path, baseline: Path) -> tuple[dict[str, float], str]:
    """Each case's median in ms for the size classes, and where it came from: the steady runs if
    the work folder has them, else the baseline file."""
    runs = [run.medians for run in _steady_runs(work)[0].values()]
    if runs:
        medians = {case: statistics.median(values) for case, values in _per_case(runs).items()}
        return medians, f"the medians of {len(runs)} steady runs"
    loaded = store.load(baseline)
    entries = loaded.entries if loaded else {}
    return {case: float(entry["median_ms"]) for case, entry in entries.items()}, f"the medians in {baseline.name}"


def _inject_lines(gate: list[str], work: Path, fraction: float, every: int, base: dict[str, float]) -> list[str]:
    """One injected run: caught per size class among the picked cases, untouched cases flagged."""
    tag = f"inject{int(round(fraction * 1000))}"
    env = {"ATTNPERF_INJECT": str(fraction), "ATTNPERF_INJECT_EVERY": str(every),
           "ATTNPERF_INJECT_LOG": str(work / f"{tag}.jsonl")}
    for old in (f"{tag}.xml", f"{tag}.jsonl"):  # an earlier call's report is not this run's
        (work / old).unlink(missing_ok=True)
    try:
        code = _pytest([*gate, "--benchmark-disable", f"--junitxml={work}/{tag}.xml"], env)
    except KeyboardInterrupt as stop:  # count the cases the run finished, then stop the call
        raise Interrupted(_inject_counts(work, tag, fraction, every, base, None)) from stop
    return _inject_counts(work, tag, fraction, every, base, code)


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT, carrying the report lines of what it finished."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines


def _inject_counts(work: Path, tag: str, fraction: float, every: int, base: dict[str, float],
                   code: int | None) -> list[str]:
    """The lines of one injected run's JUnit report; ``code`` is pytest's exit status, None when
    the run was interrupted."""
    interrupted = code is None
    if not (work / f"{tag}.xml").exists():
        why = "interrupted before pytest wrote" if interrupted else f"pytest (exit {code}) wrote no report"
        return [f"+{100 * fraction:g}%: {why} {tag}.xml"]
    try:
        cases = _outcomes(work / f"{tag}.xml")
    except BadReport as exc:
        return [f"+{100 * fraction:g}%: {exc}" + (" (the run was interrupted)" if interrupted else "")]
    flagged = _with(cases, "regressed")
    chosen = {case for case in cases if is_picked(case, every)}
    unjudged = chosen & _with(cases, "not compared")  # nothing to catch it with: not counted
    picked = chosen - unjudged
    given = _given(work / f"{tag}.jsonl")
    lines: list[str] = []
    for size in SIZES:
        group = {case for case in picked if case in base and _size_class(base[case]) == size}
        if group:
            lines.append(f"+{100 * fraction:g}% on {len(group)} cases {size}: caught {len(group & flagged)}"
                         + _given_words(group, flagged, given))
    unsized = {case for case in picked if case not in base}
    if unsized:  # e.g. tests that measure nothing; listed so that no count hides them
        lines.append(f"+{100 * fraction:g}%: {len(unsized)} picked cases without a median "
                     f"(caught {len(unsized & flagged)})")
    lines.append(f"+{100 * fraction:g}%: untouched cases flagged: {len(flagged - chosen)}")
    if unjudged:
        lines.append(f"+{100 * fraction:g}%: {len(unjudged)} picked cases not compared with their baseline "
                     "(not counted; their notes in the pytest output say why)")
    if interrupted:
        lines.append(f"+{100 * fraction:g}%: interrupted; the counts cover the {len(cases)} cases it finished")
    return lines


class Given(NamedTuple):
    """What one picked case got, from the inject plugin's log (``ATTNPERF_INJECT_LOG``)."""

    slowed: float  # its median with the work added over its median without, less 1, in one process
    more: bool  # asked for less than the extra work's least (a spin kernel's own launch): given that


def _given(path: Path) -> dict[str, Given]:
    """Each logged case's ``Given``; a torn or foreign line is skipped."""
    found: dict[str, Given] = {}
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            row = json.loads(line)
            found[row["nodeid"]] = Given(row["median_ms"] / row["base_ms"] - 1,
                                         row["fraction"] * row["base_ms"] < row["least_ms"])
        except (ValueError, KeyError, TypeError, ZeroDivisionError):
            continue
    return found


def _given_words(group: set[str], flagged: set[str], given: dict[str, Given]) -> str:
    """How much the group's cases slowed in their own process (median, range), and how many could
    not be given as little as asked, with how many of those were caught."""
    slowed = sorted(100 * given[case].slowed for case in group if case in given)
    if not slowed:
        return ""
    words = (f"; slowed by median +{statistics.median(slowed):.2f}% (+{slowed[0]:.2f} to +{slowed[-1]:.2f}%) "
             f"in the run's own process")
    more = {case for case in group if case in given and given[case].more}
    if more:
        words += f"; {len(more)} given more than asked (the least extra work), caught {len(more & flagged)}"
    return words


def _set_aside(work: Path, i: int) -> None:
    """A cut steady run's files become ``run<i>.cut<k>.json``/``.xml`` (k: the first unused), out of
    ``run_files`` and of the next call's numbering, and never over an earlier cut run's files."""
    parts = [p for p in (work / f"run{i}.json", work / f"run{i}.xml") if p.exists()]
    k = 0
    while any(p.with_name(f"run{i}.cut{k}{p.suffix}").exists() for p in parts):
        k += 1
    for part in parts:
        part.rename(part.with_name(f"run{i}.cut{k}{part.suffix}"))


class OutOfTime(Exception):
    """The next pytest run would not finish inside ``--time-limit``; the message says where."""


class Deadline:
    """Runs each pytest call of a noise call unless it would end past the time limit. A run is taken
    to last as long as the longest run of its stage so far in this call; for a stage not yet run,
    twice the longest run of any stage (an injected run re-measures every case it catches, so it
    runs longer than an unchanged one: docs/noise-benchmark.md, "Splitting over several calls").
    The first run of a call always starts."""

    def __init__(self, limit_s: float | None, clock: Callable[[], float]) -> None:
        self.limit_s, self.clock = limit_s, clock
        self.start = clock()
        self.longest: dict[str, float] = {}  # stage -> its longest run in this call
        self.current = ""  # the run under way

    def check(self, stage: str, what: str) -> None:
        """``OutOfTime`` when ``what``, a run of ``stage``, would end past the limit."""
        if self.limit_s is None or not self.longest:
            return
        used = self.clock() - self.start
        if stage in self.longest:
            guess, basis = self.longest[stage], f"the longest {stage} run in this call"
        else:
            guess, basis = 2.0 * max(self.longest.values()), f"twice the longest run in this call, no {stage} run yet"
        if used + guess > self.limit_s:
            raise OutOfTime(f"stopped before {what}: {used:.0f} s of the {self.limit_s:g} s time limit used, "
                            f"and it would take about {guess:.0f} s ({basis})")

    def run(self, stage: str, what: str, call: Callable[[], T]) -> T:
        self.check(stage, what)
        self.current = what
        begin = self.clock()
        try:
            result = call()
        finally:
            self.longest[stage] = max(self.longest.get(stage, 0.0), self.clock() - begin)
        self.current = ""  # finished: an interrupt from here on did not cut it
        return result


def _compare_lines(gate: list[str], work: Path) -> list[str]:
    """Run the selection once more, hot, beside triton's do_bench_cudagraph, and compare the two."""
    compare_file = work / "compare.jsonl"
    compare_file.unlink(missing_ok=True)
    _pytest([*gate, "--benchmark-disable", "--attnperf-mode=hot"], {"ATTNPERF_COMPARE_FILE": str(compare_file)})
    return compare.compare_lines(compare_file)


def main(argv: list[str] | None = None) -> int:
    """The noise benchmark's command (``python -m noise_benchmark.benchmark``; ``attnperf noise`` in a
    checkout): run the chosen stages in the work folder and write their report; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m noise_benchmark.benchmark", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=_count(0), default=5)
    parser.add_argument("--records", type=_count(1), default=3,
                        help="recordings by the record stage: three give each case its own run-to-run noise")
    parser.add_argument("--inject", default="0.02,0.05,0.10", help="fractions of extra work, comma-separated")
    parser.add_argument("--every", type=int, default=2, help="inject into cases with crc32(nodeid) %% EVERY == 0")
    parser.add_argument("--compare", action="store_true",
                        help="add the compare stage (do_bench_cudagraph, GPU) to the stages")
    parser.add_argument("--stages", type=_stages, default=None,
                        help="comma-separated subset of record,steady,inject,compare "
                             "(default: record,steady,inject, and compare with --compare)")
    parser.add_argument("--keep-runs", action="store_true",
                        help="steady: keep the work folder's earlier runs and add this call's after them")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("--time-limit", type=_seconds, default=None, metavar="SECONDS",
                        help="start no pytest run likely to end past this many seconds after the call began "
                             "(taken to last as long as the longest run of its stage so far, twice the longest "
                             "of any for a new stage; the first run always starts); exit status 3 when it stops")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    if importlib.util.find_spec("pytest_benchmark") is None:  # its runs write and read pytest-benchmark's JSON
        print("noise benchmark: needs pytest-benchmark: pip install -e '.[benchmark]' in the checkout", file=sys.stderr)
        return 2
    named = set(opts.stages or ("record", "steady", "inject")) | ({"compare"} if opts.compare else set())
    stages: tuple[str, ...] = tuple(s for s in STAGES if s in named)
    args = [a for a in opts.pytest_args if a != "--"]
    work = opts.workdir or Path(tempfile.mkdtemp(prefix="noise-benchmark-"))
    work.mkdir(parents=True, exist_ok=True)
    gate = [*args, f"--attnperf-baselines={work}"]
    hw = _hw(args)
    if "inject" in stages and "record" not in stages and _baseline_path(work, hw) is None:
        print(_missing_baseline(work, hw), file=sys.stderr)
        return 2

    deadline = Deadline(opts.time_limit, _now)
    status = 0
    restore_signals = child_run.stop_signals_as_interrupts()  # a scheduler's SIGTERM: the report is still written
    ran: list[str] = []  # the lines of the inject and compare stages run in this call
    notes: list[str] = []
    try:
        if "record" in stages:  # each recording adds to the cases' run_medians_ms
            for r in range(opts.records):
                deadline.run("record", f"recording {r + 1} of {opts.records}",
                             lambda: _pytest([*gate, "--update-baselines", "--benchmark-disable"]))
        if "steady" in stages:
            earlier = run_files(work) if opts.keep_runs else []
            first = int(earlier[-1].stem[3:]) + 1 if earlier else 0
            if opts.runs:  # before an earlier call's runs are deleted for this call's
                deadline.check("steady", f"steady run{first}")
            if not opts.keep_runs:  # an earlier call's runs (and cut runs) are not this call's
                for old in [*run_files(work), *run_files(work, ".xml"), *work.glob("run*.cut*.*")]:
                    old.unlink()
            for i in range(first, first + opts.runs):
                try:
                    deadline.run("steady", f"steady run{i}", functools.partial(
                        _pytest, [*gate, f"--benchmark-json={work}/run{i}.json", f"--junitxml={work}/run{i}.xml"]))
                except KeyboardInterrupt:  # its reports hold part of the cases: set aside, not a run
                    _set_aside(work, i)
                    raise
        if "inject" in stages:
            baseline = _baseline_path(work, hw)
            fractions = [float(f) for f in opts.inject.split(",") if f]
            if baseline is None:  # the record stage of this call wrote none
                print(_missing_baseline(work, hw), file=sys.stderr)
                notes.append(_missing_baseline(work, hw))
                status = 2
            elif fractions:
                deadline.check("inject", f"the +{100 * fractions[0]:g}% injected run")
                try:
                    base, source = _size_medians(work, baseline)
                except store.BaselineError as exc:
                    base, source = {}, f"nothing: {exc}"
                ran.append(f"injected work: every {opts.every}, size classes from {source}")
                for fraction in fractions:
                    ran.extend(deadline.run("inject", f"the +{100 * fraction:g}% injected run",
                                            functools.partial(_inject_lines, gate, work, fraction, opts.every, base)))
        if "compare" in stages:
            ran.extend(deadline.run("compare", "the compare run", lambda: _compare_lines(gate, work)))
    except KeyboardInterrupt as stop:  # e.g. `timeout -s INT`: report what the finished runs left
        ran.extend(stop.lines if isinstance(stop, Interrupted) else [])
        during = f" during {deadline.current}" if deadline.current else ""
        notes.append(f"interrupted{during}: the report covers the runs that finished (a cut steady run's "
                     "files are kept as run<i>.cut<k>.json and .xml, not counted; a cut injected run's "
                     "finished cases are counted; a cut recording has added its finished cases to the "
                     "baseline file, one recording more than the others)")
        status = status or 130
    except OutOfTime as exc:
        notes.append(f"{exc}; the report covers the runs that finished")
        status = status or 3
    finally:
        restore_signals()

    lines = [f"noise benchmark: stages {','.join(stages)}, workdir {work}", f"pytest {' '.join(args)}", ""]
    lines += _steady_lines(work)
    recordings = _recording_lines(work, hw)
    lines += ["", *recordings] if recordings else []
    lines += ["", *ran] if ran else []
    lines += ["", *notes] if notes else []
    report = "\n".join(lines)
    (work / f"report-{'-'.join(stages)}.txt").write_text(report + "\n")
    print(report)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
