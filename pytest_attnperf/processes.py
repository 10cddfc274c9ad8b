"""Short cases timed in more than one process (``--attnperf-processes``).

A short kernel's cold median moves from one process to the next by more than anything within a
process can average away. On the H200 (sessions 10 and 11, ``tools/shift_diag.py``), 28
captures of each case, with new inputs and flush buffers, still left the processes' means of
12-14 us kernels 0.4-0.7% apart (standard deviation), and with eight captures sampled in turn
(cold mode's default) a handful of 10-40 us cases moved by 1-1.4% over three whole-suite runs.
Each process is one draw of that offset; the only way to average it is to time the case in more
processes.

With ``--attnperf-processes=N`` (default 3; 1 turns it off) on a CUDA device, before this run's
tests start, N - 1 worker pytest runs measure the cases whose baseline centre is under
``--attnperf-processes-below`` (50 us), one after the other, on the same device. A worker runs
the same tests with the same settings, gates nothing and writes nothing but each measurement's
samples, a line per case, to a file. When this run measures such a case, its figure pools the
samples of all N processes, the same number from each (evenly spaced through each process's
sequence), so the reported median is taken over N processes' offsets and not one. Cases with no
baseline entry, or at or over the threshold, are timed here only, as without the option.

Session 11 (H200, two GPUs of one host, 8 runs each of the 40 cases under 50 us, three
processes a run): the pooled median's standard deviation over the runs was at most 0.53% and
0.58% (median case 0.22% and 0.16%), where the main process's own median, what a run without
workers reports, reached 1.17% (2 cases over 1%). The workers added 78-86 s a run.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from . import child_run
from .timing import Measurement

__all__ = ["WORKER_OUT_FLAG", "Taken", "Workers", "pool", "read_taken", "short_cases", "worker_args",
           "write_taken"]

WORKER_OUT_FLAG = "--attnperf-worker-out"
_NOT_FORWARDED = {"update_baselines", "require_baseline", "processes", "processes_below"}


@dataclass(frozen=True)
class Taken:
    """One worker process's measurement of a case."""

    samples_ms: tuple[float, ...]
    clock: str
    mode: str
    calls_per_sample: int

    @property
    def median_ms(self) -> float:
        ordered = sorted(self.samples_ms)
        n = len(ordered)
        return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def write_taken(path: Path, nodeid: str, measurement: Measurement) -> None:
    """In a worker: append this case's samples to ``path`` (one JSON line, flushed, so a worker
    that dies later keeps what it measured)."""
    line = json.dumps({
        "nodeid": nodeid, "samples_ms": list(measurement.samples_ms), "clock": measurement.clock,
        "mode": measurement.mode, "calls_per_sample": measurement.calls_per_sample,
    })
    with open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


def read_taken(path: Path) -> dict[str, Taken]:
    """A worker's file: nodeid -> its measurement (the last, if a case was measured twice).
    A line that does not parse (a worker killed mid-write) is skipped."""
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
                                              int(row["calls_per_sample"]))
        except (ValueError, KeyError, TypeError):
            continue
    return taken


def short_cases(nodeids: Iterable[str], centres_ms: Mapping[str, float], below_ms: float) -> list[str]:
    """The node ids whose baseline centre is under ``below_ms`` (those without one are left out)."""
    return [n for n in nodeids if n in centres_ms and centres_ms[n] < below_ms]


def _evenly(samples: Sequence[float], n: int) -> list[float]:
    """``n`` of ``samples`` spread evenly through their order (cold samples go round the
    captured graphs in turn, so this keeps every graph's share)."""
    return [samples[i * len(samples) // n] for i in range(n)]


def pool(measurement: Measurement, taken: Sequence[Taken]) -> Measurement:
    """``measurement`` with the workers' samples of the case added, as many from each process as
    the smallest gives. A worker that timed the case another way (clock, mode, or calls a
    sample) is left out, and the note says so."""
    usable = [t for t in taken if (t.clock, t.mode, t.calls_per_sample)
              == (measurement.clock, measurement.mode, measurement.calls_per_sample)]
    notes = list(measurement.notes)
    if len(usable) < len(taken):
        notes.append(f"{len(taken) - len(usable)} worker measurement(s) taken another way (clock, mode or calls "
                     f"a sample), not pooled")
    if not usable:
        return replace(measurement, notes=tuple(notes)) if notes != list(measurement.notes) else measurement
    sets = [list(measurement.samples_ms), *(list(t.samples_ms) for t in usable)]
    each = min(len(s) for s in sets)
    samples = [v for s in sets for v in _evenly(s, each)]
    medians = (measurement.median_ms, *(t.median_ms for t in usable))
    notes.append(f"{len(sets)} processes pooled, {each} samples each (medians "
                 f"{', '.join(f'{1e3 * m:.2f}' for m in medians)} us, this one first)")
    return replace(measurement, samples_ms=tuple(samples), notes=tuple(notes), processes=len(sets),
                   process_medians_ms=medians)


def _plugin_args(args: Sequence[str]) -> list[str]:
    """The ``-p NAME`` arguments of an invocation, as given (plugins a worker must load too)."""
    out: list[str] = []
    it = iter(args)
    for arg in it:
        if arg == "-p":
            name = next(it, None)
            if name is not None:
                out += ["-p", name]
        elif arg.startswith("-p") and len(arg) > 2 and not arg.startswith("--"):
            out += ["-p", arg[2:]]
    return out


def worker_args(config: pytest.Config, nodeids: Sequence[str], out: Path) -> list[str]:
    """A worker's pytest arguments: the cases, the invocation's plugins, the rootdir and ini
    file, pytest-timeout's limit, and every attnperf setting as resolved here (so one from an
    environment variable or an ini key reaches the worker as it reached this run), except
    those that make a run write or fail what a worker does not."""
    from .options import OPTIONS, raw_value

    args = ["-p", "no:cacheprovider", "-q", "--rootdir", str(config.rootpath)]
    if config.inipath is not None:
        args += ["-c", str(config.inipath)]
    args += _plugin_args(config.invocation_params.args)
    for opt in OPTIONS:
        if opt.dest in _NOT_FORWARDED or opt.is_flag:
            continue
        text, source = raw_value(config, opt)
        if source != "the default":
            args.append(f"{opt.flag}={text}")
    timeout = config.getoption("timeout", None)  # None where no plugin adds --timeout
    if timeout:  # pytest-timeout's per-test limit, so a hanging kernel does not hang the worker
        args.append(f"--timeout={timeout}")
    args += [f"{WORKER_OUT_FLAG}={out}", *nodeids]
    return args


def _worker_env() -> dict[str, str]:
    """This process's environment, with this copy of pytest_attnperf first on the path (it may
    be imported from a checkout that the worker's directory does not hold)."""
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [env.get("PYTHONPATH")])])
    return env


@dataclass
class Workers:
    """The worker runs of one session, and what they measured."""

    taken: dict[str, list[Taken]]
    cases: int = 0
    processes: int = 1
    seconds: float = 0.0
    problems: tuple[str, ...] = ()

    def for_case(self, nodeid: str) -> list[Taken]:
        return self.taken.get(nodeid, [])

    def summary(self, below_ms: float) -> list[str]:
        """For the run's summary: nothing when no case was chosen (every case then timed here only,
        as without the option), else how many in how many processes, and any worker that did not
        measure them all."""
        lines = [f"{self.cases} cases under {1e3 * below_ms:g} us timed in {self.processes} processes "
                 f"({self.processes - 1} worker runs before the tests, {self.seconds:.0f} s)"] if self.cases else []
        return lines + [f"worker {p}" for p in self.problems]

    @classmethod
    def run(cls, config: pytest.Config, nodeids: Sequence[str], processes: int) -> Workers:
        """Run ``processes - 1`` workers over ``nodeids``, one after another, and read what each
        measured. A worker that fails (exit status other than 0, or 1 for failed tests) is
        named with its log; its cases keep what the others measured."""
        workers = cls(taken={}, cases=len(nodeids), processes=processes)
        if not nodeids or processes < 2:
            return workers
        folder = Path(tempfile.mkdtemp(prefix="attnperf-workers-"))
        started = time.monotonic()
        problems = []
        for i in range(1, processes):
            out, log = folder / f"worker{i}.jsonl", folder / f"worker{i}.log"
            cmd = [sys.executable, "-m", "pytest", *worker_args(config, nodeids, out)]
            with open(log, "w", encoding="utf-8") as sink:
                sink.write(shlex.join(cmd) + "\n")
                sink.flush()
                child = child_run.start(cmd, env=_worker_env(), cwd=config.rootpath, stdout=sink)
                status = child_run.wait_for(child)
            got = read_taken(out)
            if status not in (0, 1) or len(got) < len(nodeids):  # 1: a test failed there (it fails here too)
                problems.append(f"{i}: exit status {status}, measured {len(got)} of {len(nodeids)} cases (the rest "
                                f"were skipped, failed or not reached there, and are pooled over fewer processes; "
                                f"log: {log})")
            for nodeid, taken in got.items():
                workers.taken.setdefault(nodeid, []).append(taken)
        workers.seconds = time.monotonic() - started
        workers.problems = tuple(problems)
        if not problems:  # the logs are kept only to be read
            shutil.rmtree(folder, ignore_errors=True)
        return workers


def centres_ms(baseline: Any) -> dict[str, float]:
    """Each readable entry's centre (``gate.centre_ms``) in ``baseline`` (a BaselineFile)."""
    from .gate import centre_ms

    out = {}
    for nodeid in baseline.entries:
        try:
            summary = baseline.summary(nodeid)
        except (KeyError, TypeError, ValueError):
            continue
        if summary is not None:
            out[nodeid] = centre_ms(summary)
    return out
