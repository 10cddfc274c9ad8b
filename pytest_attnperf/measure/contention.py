"""Whether host-clock samples were taken on a contended host: two signals, each a pure function
of plain numbers (quantised samples, and a load average above the cores less this process's own
runnable threads, ``own_running``), and the note ``HostTimer`` adds when either fires (the gate
then leaves the case unjudged: ``gate.policy``).

docs/measurement.md, "On the CPU".
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["CONTENDED", "LOAD_PER_CORE", "HostLoad", "contention_note", "host_load", "overloaded", "own_running",
           "quantised_step_ms"]

CONTENDED = "host contended"  # the note's first words: what the gate looks for on a host-clock measurement

# A sample is stalled when it lies at least STALL_MIN_MS and at least the fastest sample's own time
# above the fastest sample: the call took twice as long as it can, by more than a scheduler tick's
# least length (1 ms at CONFIG_HZ=1000). Noise a 10-30% CPU tolerance covers never doubles a call.
STALL_MIN_MS = 1.0
# Stalled samples must be this share of all of them: below it the median (and so the verdict)
# stands on calls that kept their core; a quarter is far more than an idle host's rare preemption.
STALLED_SHARE = 0.25
# ... and at least this share of the stalled ones lie on whole multiples of one step (within
# LATTICE_TOLERANCE of the step): ticks make a lattice, a kernel's own slow path or continuous
# noise does not. Only the smallest STEP_CANDIDATES stalled excesses are tried as the step, so one
# odd sample below the tick cannot hide it and the test stays linear in the samples.
ON_LATTICE_SHARE = 0.8
LATTICE_TOLERANCE = 0.05
STEP_CANDIDATES = 5
# Runnable threads per core above which the timed thread waits for a core: 1.0 is a full host;
# the 1-minute average lags, so a half more leaves room for a brief burst (a compile) before it.
LOAD_PER_CORE = 1.5


class HostLoad(NamedTuple):
    """The 1-minute load average, the cores this process may run on, and this process's own
    runnable threads besides the one reading it (``own_running``), which are no other work's."""

    load: float
    cores: int
    own: int = 0

    @property
    def others(self) -> float:
        """The load of other work: the load less this process's own runnable threads, never below 0."""
        return max(0.0, self.load - self.own)


def own_running(task_dir: str = "/proc/self/task") -> int:
    """The threads of this process in the running state (``R`` in ``/proc/self/task/<tid>/stat``),
    the calling thread left out; 0 where there is no ``/proc``."""
    me = str(threading.get_native_id())
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return 0
    running = 0
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"{task_dir}/{tid}/stat", encoding="utf-8", errors="replace") as handle:
                state = handle.read().rpartition(")")[2].split()[:1]
        except OSError:  # a thread that ended meanwhile
            continue
        running += state == ["R"]
    return running


def host_load() -> HostLoad | None:
    """The host's load (``os.getloadavg``), this process's cores (its affinity where the
    platform has one, else ``os.cpu_count``) and its own runnable threads; None where the
    platform gives no load average."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this platform
        return None
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return HostLoad(load, max(1, cores), own_running())


def overloaded(readings: Sequence[HostLoad | None]) -> HostLoad | None:
    """The highest reading whose load of other work (``HostLoad.others``) over its cores is
    above ``LOAD_PER_CORE``; None if none is."""
    over = [r for r in readings if r is not None and r.others / r.cores > LOAD_PER_CORE]
    return max(over, key=lambda r: r.others / r.cores, default=None)


def _on_lattice(excess_ms: float, step_ms: float) -> bool:
    """Whether ``excess_ms`` is a whole, non-zero multiple of ``step_ms`` within the tolerance."""
    multiple = round(excess_ms / step_ms)
    return multiple >= 1 and abs(excess_ms - multiple * step_ms) <= LATTICE_TOLERANCE * step_ms


def quantised_step_ms(samples_ms: Sequence[float]) -> float | None:
    """The step the samples are quantised at, or None: at least ``STALLED_SHARE`` of them are
    stalled (see ``STALL_MIN_MS``), and ``ON_LATTICE_SHARE`` of those exceed the fastest sample
    by whole multiples of one step, the smallest such step of the candidates tried."""
    if not samples_ms:
        return None
    fastest = min(samples_ms)
    excess = sorted(s - fastest for s in samples_ms if s - fastest >= max(STALL_MIN_MS, fastest))
    if not excess or len(excess) < STALLED_SHARE * len(samples_ms):
        return None
    for step_ms in excess[:STEP_CANDIDATES]:
        if sum(_on_lattice(e, step_ms) for e in excess) >= ON_LATTICE_SHARE * len(excess):
            return step_ms
    return None


def contention_note(samples_ms: Sequence[float], readings: Sequence[HostLoad | None]) -> str | None:
    """The measurement's note when the host was contended while it sampled, naming each signal
    that fired (``host contended: load 5.2 on 2 cores; samples quantised at 8.0 ms``); None if
    neither did."""
    signals = []
    heavy = overloaded(readings)
    if heavy is not None:
        own = f" (less {heavy.own} of this process's own threads)" if heavy.own else ""
        signals.append(f"load {heavy.others:.1f}{own} on {heavy.cores} cores")
    step_ms = quantised_step_ms(samples_ms)
    if step_ms is not None:
        signals.append(f"samples quantised at {step_ms:.1f} ms")
    return f"{CONTENDED}: " + "; ".join(signals) if signals else None
