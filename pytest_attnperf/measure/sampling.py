"""Sampling a callable: the plan (mode, least samples, target spread, budget), warm-up, adaptive
sampling until the spread is small enough or the budget is spent, the garbage collector held
off during timed calls (``collector.gc_paused``), and the host timer (``HostTimer``) for the
CPU, whose work is synchronous. The CUDA timer is in ``measure.timing``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_attnperf.measure.collector import gc_paused
from pytest_attnperf.measure.contention import HostLoad, contention_note, host_load
from pytest_attnperf.measure.summary import Summary
from pytest_attnperf.measure.verify import Replays

__all__ = ["REPLAY_CLOCK", "HostTimer", "Measurement", "ReplayClock", "RunningSpread", "SamplingPlan", "Timer",
           "gc_paused", "sample_adaptively", "warm_up"]


@dataclass(frozen=True)
class SamplingPlan:
    """How to sample one case."""

    mode: str = "cold"
    min_samples: int = 10
    max_samples: int = 2000
    target_stdrel: float = 0.005
    budget_s: float = 0.5
    warmup_calls: int = 3  # at most; fewer once budget_s is spent (see warm_up)
    cold_graphs: int = 8  # cold mode: captures of the case, sampled in turn (see _capture_cold)
    hot_sample_ms: float = 20.0  # hot mode: calls per graph chosen so a sample lasts about this
    inventory: bool = False  # on CUDA, read the kernels one timed call launches after sampling (measure/inventory.py)
    checked_kernels: tuple[str, ...] | None = None  # the raw names the backend proof's profile of the checked call
    # recorded (None: it took none; the inventory profiles one more eager call to compare with its graph's)
    overhead: bool = False  # the run's sample overhead (measure.overhead), not a case: a timer
    # that wraps another to change the cases (the noise benchmark's inject.py) leaves it alone


@dataclass(frozen=True)
class Measurement:
    """Per-call times of one case and how they were taken."""

    samples_ms: tuple[float, ...]
    clock: str  # "cuda-graph", "cuda-events" or "host"
    mode: str  # "cold", "hot" or "host"
    calls_per_sample: int = 1
    eager_ms: float | None = None
    peak_mib: float | None = None
    notes: tuple[str, ...] = ()
    sm_clock_mhz: float | None = None
    graphs: int = 1  # cold graphs sampled in turn (see _capture_cold)
    processes: int = 1  # processes whose samples are pooled (see pool.pool)
    process_medians_ms: tuple[float, ...] = ()  # each pooled process's own median, this one first
    verified: int = 0  # timed draws whose results were checked after sampling (measure.verify)
    bitwise: bool | None = None  # two replays (calls) of one timed draw gave equal bits; None: not compared
    bitwise_diff: float | None = None  # where they did not, the largest difference
    verify_s: float = 0.0  # host seconds the checks of the timed draws took (the harness's cost)
    kernels: dict[str, int] | None = None  # the kernel inventory of one timed call (None: not read)
    kernels_source: str | None = None  # how it was read: a graph's replay or an eager call (measure/inventory.py)
    inventory_s: float = 0.0  # host seconds reading it took (the harness's cost)
    kernels_vs_eager: str | None = None  # how the eager checked call's kernels differ from it (a note; None: same)
    summary: Summary = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "summary", Summary.from_samples(self.samples_ms))

    @property
    def median_ms(self) -> float:
        """The median per-call time in ms."""
        return self.summary.median_ms


class Timer(Protocol):
    """Anything that turns a zero-argument callable into a ``Measurement``."""

    def measure(self, fn: Callable[[], Any], plan: SamplingPlan) -> Measurement:
        """Time ``fn`` as ``plan`` says."""


def warm_up(fn: Callable[[], Any], plan: SamplingPlan) -> int:
    """The untimed calls before sampling (autotuning and lazy initialisation happen here):
    ``plan.warmup_calls`` of them, or fewer, at least one, once the host has spent
    ``plan.budget_s`` making them. A host-bound callable, such as fla's naive recurrences (a
    Python loop over tokens; docs/measurement.md, "On a GPU"), need not run three times before it
    is timed. Returns the calls made."""
    deadline = time.monotonic() + plan.budget_s
    made = 0
    while made < plan.warmup_calls:
        fn()
        made += 1
        if time.monotonic() >= deadline:
            break
    return made


def sample_adaptively(take_ms: Callable[[], float], plan: SamplingPlan, rounds_of: int = 1) -> list[float]:
    """Call ``take_ms`` until the floor is met and the spread is small or the budget is spent.
    With ``rounds_of`` > 1 (a sampler that goes round that many graphs in turn) it stops only
    after a whole round, so each graph gives as many samples as the next."""
    samples: list[float] = []
    deadline = time.monotonic() + plan.budget_s
    rounds_of = max(1, rounds_of)
    most = max(plan.max_samples, rounds_of) // rounds_of * rounds_of
    spread = RunningSpread()
    while len(samples) < most:
        samples.append(take_ms())
        spread.add(samples[-1])
        if len(samples) < max(plan.min_samples, 2) or len(samples) % rounds_of:  # a spread needs two samples
            continue
        if spread.stdrel() <= plan.target_stdrel or time.monotonic() >= deadline:
            break
    return samples


class RunningSpread:
    """The mean and sample standard deviation of the values added so far, kept up to date at each
    value (Welford's update), so that asking after every round costs the same at the 2000th sample
    as at the 10th: recomputing ``statistics.stdev`` over all samples each round (exact, in
    rationals) took longer than a short kernel's samples themselves."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self._m2 = 0.0  # the sum of squared differences from the mean

    def add(self, value: float) -> None:
        """Take in one more value."""
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self._m2 += delta * (value - self.mean)

    def stdrel(self) -> float:
        """The sample standard deviation over the mean (0 for fewer than two values or a mean of 0)."""
        if self.n < 2 or self.mean <= 0:
            return 0.0
        return math.sqrt(max(0.0, self._m2) / (self.n - 1)) / self.mean


class ReplayClock:
    """A clock for pytest-benchmark that advances only by measured per-call times.

    pytest-benchmark reads its timer before and after the target; here the target is
    ``step``, which advances the clock by the next sample our timer measured on the device.
    Its statistics and JSON therefore carry device time, not host time.
    """

    def __init__(self) -> None:
        self._now_s = 0.0
        self._pending: list[float] = []
        self._loaded = False

    def __call__(self) -> float:
        """The clock's reading in seconds; a RuntimeError when no samples are loaded (pytest-benchmark
        calibrating it, say)."""
        if not self._loaded:  # e.g. benchmark(fn) calibrating this clock: it would never advance
            raise RuntimeError(
                "a test using the attnperf fixture has pytest-benchmark's timer set to attnperf's "
                "device clock; call benchmark(...) in a test of its own"
            )
        return self._now_s

    def load(self, samples_ms: tuple[float, ...]) -> int:
        """Queue ``samples_ms`` for ``step`` to replay, in order; returns the rounds to run."""
        self._pending = [s / 1e3 for s in reversed(samples_ms)]
        self._loaded = True
        return len(samples_ms)

    def step(self) -> None:
        """Advance the clock by the next queued sample."""
        self._now_s += self._pending.pop()

    def finish(self) -> None:
        """Drop the samples not replayed; reading the clock is an error again until the next
        ``load``."""
        self._pending, self._loaded = [], False


REPLAY_CLOCK = ReplayClock()


HOST_DRAWS = 2  # timed draws the host timer alternates: two, so a result left from the other draw shows


class HostTimer:
    """Host clock around synchronous CPU work. ``clock_ns`` (``time.perf_counter_ns``, looked up
    when sampling starts) and ``load`` (the host's load, read before and after sampling:
    ``contention.host_load``) may be replaced, for tests."""

    def __init__(self, clock_ns: Callable[[], int] | None = None,
                 load: Callable[[], HostLoad | None] = host_load) -> None:
        self._clock_ns, self._load = clock_ns, load

    def measure(self, fn: Callable[[], Any], plan: SamplingPlan) -> Measurement:
        """Host-clock samples of ``fn`` after its warm-up, the garbage collector paused. The
        samples alternate between ``HOST_DRAWS`` timed draws (``verify.Replays``; a plain
        callable is one), each call's contents varied before the clock starts
        (``Replays.vary``); the last call's result is checked as it returned, each draw after
        sampling on one more call, and two more calls of the first are compared bit for bit. A
        contended host (``contention.contention_note``) is noted, so the gate leaves the case
        unjudged."""
        replays = Replays(fn)
        try:
            return self._measure(replays, plan)
        finally:
            replays.release()

    def _measure(self, replays: Replays, plan: SamplingPlan) -> Measurement:
        calls = [replays.call(index) for index in range(1, (HOST_DRAWS if replays.draws else 1) + 1)]
        warm_up(calls[0], plan)
        for later in calls[1:]:  # each draw's first call untimed, where an exception names the draw
            later()
        bare = [replays.bare(index) for index in range(1, len(calls) + 1)]
        varies = [replays.vary(index) for index in range(1, len(calls) + 1)]
        turn, clock_ns = [0], self._clock_ns or time.perf_counter_ns
        last: list[Any] = [None]  # the last timed call's result, checked as it returned (Replays.check_last)

        def take_ms() -> float:
            index = turn[0] % len(bare)
            turn[0] += 1
            varies[index]()  # contents no call has read, written before the clock starts
            call = bare[index]
            start = clock_ns()
            out = call()
            taken = clock_ns() - start
            last[0] = out  # after the clock's second read
            return taken / 1e6

        loads = [self._load()]
        with gc_paused():
            samples = sample_adaptively(take_ms, plan, rounds_of=len(calls))
        loads.append(self._load())
        if last[0] is not None:
            replays.check_last((turn[0] - 1) % len(bare) + 1, "a host-timed call", last[0])
        last[0] = None
        for index, call in enumerate(calls, start=1):
            replays.check(index, "a host-timed call", call)
        replays.compare(1, calls[0])
        contended = None if plan.overhead else contention_note(samples, loads)  # the run's overhead is no case
        notes = replays.notes(plan.overhead) + ((contended,) if contended else ())
        return Measurement(tuple(samples), clock="host", mode="host", notes=notes,
                           verified=replays.verified,
                           bitwise=replays.bitwise, bitwise_diff=replays.bitwise_diff, verify_s=replays.seconds)
