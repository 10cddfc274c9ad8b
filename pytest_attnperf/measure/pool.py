"""Short cases timed in more than one process (``--attnperf-processes``).

A short kernel's cold median moves from one process to the next by more than anything within a
process can average away: new captures, inputs and flush buffers do not remove it, nor do cold
mode's eight captures sampled in turn (docs/evidence.md, "--attnperf-cold-graphs 8"). Each
process is one draw of that offset; the only way to average it is to time the case in more
processes.

With ``--attnperf-processes=N`` (default 3; 1 turns it off) on a CUDA device, before this run's
tests start, N - 1 pool runs measure the cases whose baseline centre is under
``--attnperf-processes-below`` (50 us), one after the other, on the same device. A pool runs
the same tests with the same settings, gates nothing and writes nothing but each measurement's
samples, a line per case, to a file. When this run measures such a case, its figure pools the
samples of all N processes, about the same number from each (whole rounds of the cold graphs,
spread evenly through each process's sequence), so the reported median is taken over N
processes' offsets and not one. A suspected regression's re-measurement re-times the main
process only and pools it with the same pool-run samples: it re-checks this process's part. Cases
with no baseline entry, or at or over the threshold, are timed here only, as without the
option. What the pooling removes, and what the pool runs cost: docs/evidence.md,
"--attnperf-processes 3".
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from pytest_attnperf.gate.verdict import centre_ms
from pytest_attnperf.measure import child as child_run
from pytest_attnperf.measure.timing import Measurement
from pytest_attnperf.store.baselines import BaselineFile

__all__ = ["POOL_OUT_FLAG", "Taken", "PoolRuns", "pool", "read_taken", "short_cases", "pool_run_args",
           "write_taken"]

POOL_OUT_FLAG = "--attnperf-pool-out"
# the invocation's options a pool run does not take over: what would make it write where the main
# run writes, select other cases, stop on cache state, spread over xdist workers or debug. (The
# attnperf options go over as given, with its environment and ini file: a pool run's settings
# refuse --update-baselines, --attnperf-require-baseline and more pool runs.) True: takes a value.
_DROPPED = {
    "--junitxml": True, "--junit-xml": True, "--junit-prefix": True, "--basetemp": True, "--rootdir": True,
    "-c": True, "--config-file": True, "-k": True, "-m": True, "--deselect": True, "-n": True,
    "--numprocesses": True, "--dist": True, "--maxprocesses": True, "--benchmark-json": True,
    "--benchmark-save": True, "--benchmark-compare-fail": True, "--benchmark-storage": True,
    "--benchmark-autosave": False, "--lf": False, "--last-failed": False, "--ff": False, "--failed-first": False,
    "--nf": False, "--new-first": False, "--sw": False, "--stepwise": False, "--sw-skip": False,
    "--stepwise-skip": False, "--cache-clear": False, "--collect-only": False, "--co": False, "--pdb": False,
    "--trace": False, "-d": False, "--distload": False, "--tx": True, "--px": True, "--rsyncdir": True,
}


@dataclass(frozen=True)
class Taken:
    """One pool run's measurement of a case."""

    samples_ms: tuple[float, ...]
    clock: str
    mode: str
    calls_per_sample: int
    graphs: int = 1  # cold graphs its samples go round, in turn
    notes: tuple[str, ...] = ()

    @property
    def median_ms(self) -> float:
        """The median of this process's samples, in ms."""
        return statistics.median(self.samples_ms)


def write_taken(path: Path, nodeid: str, measurement: Measurement) -> None:
    """In a pool run: append this case's samples to ``path`` (one JSON line, flushed, so a pool run
    that dies later keeps what it measured)."""
    line = json.dumps({
        "nodeid": nodeid, "samples_ms": list(measurement.samples_ms), "clock": measurement.clock,
        "mode": measurement.mode, "calls_per_sample": measurement.calls_per_sample,
        "graphs": measurement.graphs, "notes": list(measurement.notes),
    })
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


def read_taken(path: Path) -> dict[str, Taken]:
    """A pool run's file: nodeid -> its measurement (the last, if a case was measured twice).
    A line that does not parse (a pool run killed mid-write) is skipped."""
    taken: dict[str, Taken] = {}
    if not path.exists():
        return taken
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            samples = tuple(float(v) for v in row["samples_ms"])
            if not samples or not all(math.isfinite(v) and v > 0 for v in samples):
                continue
            taken[str(row["nodeid"])] = Taken(samples, str(row["clock"]), str(row["mode"]),
                                              int(row["calls_per_sample"]), max(1, int(row.get("graphs", 1))),
                                              tuple(str(n) for n in row.get("notes", ())))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return taken


def short_cases(nodeids: Iterable[str], centres_ms: Mapping[str, float], below_ms: float) -> list[str]:
    """The node ids whose baseline centre is under ``below_ms`` (those without one are left out)."""
    return [n for n in nodeids if n in centres_ms and centres_ms[n] < below_ms]


def _share(samples: Sequence[float], graphs: int, about: int) -> list[float]:
    """About ``about`` of ``samples`` as whole rounds of the ``graphs`` they go round in turn
    (cold mode: sample i is graph i mod graphs), the rounds spread evenly through the sequence,
    so every graph keeps its share (each capture of a short kernel has a median of its own).
    Every sample is one round when they do not fill one."""
    size = graphs if 1 < graphs <= len(samples) else 1
    rounds = len(samples) // size
    take = max(1, min(rounds, about // size))
    return [v for j in range(take) for v in samples[(j * rounds // take) * size:][:size]]


def pool(measurement: Measurement, taken: Sequence[Taken]) -> Measurement:
    """``measurement`` with the pool runs' samples of the case added, about as many from each
    process as the smallest gives (``_share``). A pool run that timed the case with another clock
    or mode is left out, and the note says so; the pool runs' own notes (a throttled clock, say)
    are kept, named as theirs."""
    usable = [t for t in taken if (t.clock, t.mode) == (measurement.clock, measurement.mode)]
    notes = list(measurement.notes)
    if len(usable) < len(taken):
        notes.append(f"{len(taken) - len(usable)} pool-run measurement(s) taken with another clock or mode, not pooled")
    if not usable:
        return replace(measurement, notes=tuple(notes)) if len(notes) > len(measurement.notes) else measurement
    sets = [(list(measurement.samples_ms), measurement.graphs), *((list(t.samples_ms), t.graphs) for t in usable)]
    about = min(len(samples) for samples, _ in sets)
    shares = [_share(samples, graphs, about) for samples, graphs in sets]
    samples = [v for share in shares for v in share]
    medians = (measurement.median_ms, *(t.median_ms for t in usable))
    counts = sorted({len(share) for share in shares})  # one count unless the graphs differ
    each = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    notes += [f"pool run {i}: {note}" for i, t in enumerate(usable, 1) for note in t.notes]
    notes.append(f"{len(sets)} processes pooled, {each} samples each (medians "
                 f"{', '.join(f'{1e3 * m:.2f}' for m in medians)} us, this one first)")
    return replace(measurement, samples_ms=tuple(samples), notes=tuple(notes), processes=len(sets),
                   process_medians_ms=medians)


def _invocation_args(config: pytest.Config) -> list[str]:
    """The invocation's arguments a pool run takes over (plugins, a project's own options, the
    attnperf options, -x, -W, -o, ...): without its paths and node ids (the pool run gets its
    own) and ``_DROPPED``. The paths and node ids are the words pytest took as such
    (``config.args``)."""
    out: list[str] = []
    args = list(config.invocation_params.args)
    paths = set(config.args)
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2]
        if name in _DROPPED:
            inline = "=" in arg if arg.startswith("--") else len(arg) > 2
            i += 2 if _DROPPED[name] and not inline else 1
            continue
        if not arg.startswith("-") and arg in paths:
            i += 1
            continue
        out.append(arg)
        i += 1
    return out


def pool_run_args(config: pytest.Config, nodeids: Sequence[str], out: Path, scratch: Path) -> list[str]:
    """A pool run's pytest arguments: the invocation's own (``_invocation_args``; the pool run
    inherits the environment, so the attnperf settings resolve there as here), the rootdir and
    ini file, the cases by absolute node id, and the places a pool run may write: its cache, JUnit
    file, temporary folder and benchmark storage, all in ``scratch`` (an ini's or
    PYTEST_ADDOPTS's --lf, --junitxml or --benchmark-autosave then reach the pool run
    harmlessly)."""
    args = [*_invocation_args(config), "--rootdir", str(config.rootpath)]
    if config.inipath is not None:
        args += ["-c", str(config.inipath)]
    if config.pluginmanager.hasplugin("cacheprovider"):
        args += ["-o", f"cache_dir={scratch / 'cache'}"]
    if config.pluginmanager.hasplugin("junitxml"):
        args.append(f"--junitxml={scratch / 'junit.xml'}")
    if config.pluginmanager.hasplugin("tmpdir"):
        args.append(f"--basetemp={scratch / 'tmp'}")
    if config.pluginmanager.hasplugin("benchmark"):
        args.append(f"--benchmark-storage=file://{scratch / 'benchmarks'}")
    if config.pluginmanager.hasplugin("xdist"):  # an ini's -n must not make the pool run a pytest-xdist controller
        args += ["-n", "0"]
    args += [f"{POOL_OUT_FLAG}={out}", *(f"{config.rootpath}{os.sep}{n}" for n in nodeids)]
    return args


def _pool_env() -> dict[str, str]:
    """The environment of this process, with this copy of pytest_attnperf first on the path (it
    may be imported from a checkout that the pool run's directory does not hold)."""
    # not a worker of theirs: pytest-xdist's variables left out
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")}
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    return env


@dataclass
class PoolRuns:
    """The pool runs of one session, and what they measured."""

    taken: dict[str, list[Taken]]
    cases: int = 0
    processes: int = 1
    seconds: float = 0.0
    problems: tuple[str, ...] = ()  # a pool run that failed: named with its kept log
    missing: tuple[str, ...] = ()  # a pool run that measured fewer cases (skipped or failed there)
    when: str = "before the tests"

    def for_case(self, nodeid: str) -> list[Taken]:
        """What each pool run measured for ``nodeid``; empty when none did."""
        return self.taken.get(nodeid, [])

    def add(self, other: PoolRuns) -> None:
        """Take in another set of pool runs (a pytest-xdist worker's next group)."""
        for nodeid, taken in other.taken.items():
            self.taken.setdefault(nodeid, []).extend(taken)
        self.cases += other.cases
        self.seconds += other.seconds
        self.problems += other.problems
        self.missing += other.missing

    def summary(self, below_ms: float) -> list[str]:
        """For the run's summary: nothing when no case was chosen (every case then timed here only,
        as without the option), else how many in how many processes, and any pool run that did not
        measure them all."""
        lines = [f"{self.cases} cases under {1e3 * below_ms:g} us timed in {self.processes} processes "
                 f"({self.processes - 1} pool runs {self.when}, {self.seconds:.0f} s)"] if self.cases else []
        return lines + [f"pool run {p}" for p in (*self.problems, *self.missing)]

    @classmethod
    def run(cls, config: pytest.Config, nodeids: Sequence[str], processes: int) -> PoolRuns:
        """Run ``processes - 1`` pool runs over ``nodeids``, one after another, and read what each
        measured. A pool run that fails (exit status other than 0, or 1 for failed tests, or one
        that cannot start) is named with its log, which is kept; one that measured fewer cases
        is counted, with its log when a test failed there. Their cases pool what the others
        measured."""
        runs = cls(taken={}, cases=len(nodeids), processes=processes)
        if not nodeids or processes < 2:
            return runs
        folder = Path(tempfile.mkdtemp(prefix="attnperf-pool-"))
        started = time.monotonic()
        problems, missing, keep = [], [], False
        try:
            for i in range(1, processes):
                out, log = folder / f"pool{i}.jsonl", folder / f"pool{i}.log"
                cmd = [sys.executable, "-m", "pytest", *pool_run_args(config, nodeids, out, folder / f"w{i}")]
                with open(log, "w", encoding="utf-8") as sink:
                    sink.write(shlex.join(cmd) + "\n")
                    sink.flush()
                    try:
                        child = child_run.start(cmd, env=_pool_env(), cwd=config.invocation_params.dir, stdout=sink)
                    except OSError as exc:  # too many node ids for one command line, say
                        problems.append(f"{i}: could not start: {exc} (log: {log})")
                        continue
                    status = child_run.wait_for(child)
                got = read_taken(out)
                if status not in (0, 1):  # 1: a test failed there (it fails here too)
                    problems.append(f"{i}: exit status {status}, measured {len(got)} of {len(nodeids)} cases; the "
                                    f"rest are pooled over fewer processes (log: {log})")
                elif len(got) < len(nodeids):  # a test failed there (1; its log is kept) or was skipped
                    kept = f"; log: {log}" if status else ""
                    keep = keep or bool(status)
                    missing.append(f"{i}: measured {len(got)} of {len(nodeids)} cases (the rest were skipped or "
                                   f"failed there, and are pooled over fewer processes{kept})")
                for nodeid, taken in got.items():
                    runs.taken.setdefault(nodeid, []).append(taken)
        finally:
            runs.seconds = time.monotonic() - started
            runs.problems, runs.missing = tuple(problems), tuple(missing)
            if not (problems or keep):  # the logs are kept only to be read
                shutil.rmtree(folder, ignore_errors=True)
        return runs


def centres_ms(baseline: BaselineFile) -> dict[str, float]:
    """Each readable entry's centre (``gate.centre_ms``) in ``baseline`` (a BaselineFile)."""
    out = {}
    for nodeid in baseline.entries:
        try:
            summary = baseline.summary(nodeid)
        except (KeyError, TypeError, ValueError):
            continue
        if summary is not None:
            out[nodeid] = centre_ms(summary)
    return out
