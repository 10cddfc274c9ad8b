"""A benchmark-only plugin: known extra work injected into chosen cases, and a do_bench cross-check.

Loaded by the noise benchmark with ``-p noise_benchmark.inject``; it does nothing unless
its environment variables are set. ``ATTNPERF_INJECT`` adds that fraction of extra device work
(a spin kernel captured into the same graph, or a busy wait on the CPU, less its least cost) after
each call of the cases ``ATTNPERF_INJECT_EVERY`` picks, logged to ``ATTNPERF_INJECT_LOG``;
``ATTNPERF_COMPARE_FILE`` times each GPU case again with ``triton.testing.do_bench_cudagraph``.
Neither touches the run's sample overhead. docs/noise-benchmark.md, "Injected work".
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from collections.abc import Callable, Generator
from dataclasses import replace
from typing import Any

import pytest

from pytest_attnperf.hw.table import DetectedDevice
from pytest_attnperf.measure.nvml import read_sm_clock
from pytest_attnperf.measure.timing import (
    Measurement,
    SamplingPlan,
    Timer,
    default_timer,
    one_element_add,
)

__all__ = ["InjectingTimer", "is_picked"]


def is_picked(nodeid: str, every: int) -> bool:
    """Whether a case gets the injected work: a fixed choice per node id."""
    return zlib.crc32(nodeid.encode()) % every == 0


def _current_nodeid() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]


def _with_extra_work(fn: Callable[[], Any], extra_s: float, device: DetectedDevice) -> Callable[[], Any]:
    if device.is_gpu:
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up
        cuda: Any = torch.cuda  # torch.cuda._sleep is unannotated

        clock_hz = cuda.get_device_properties(0).clock_rate * 1e3  # kHz in torch
        cycles = max(1, int(extra_s * clock_hz))  # at zero, one cycle: the least a spin kernel costs

        def slowed_gpu() -> Any:
            result = fn()
            cuda._sleep(cycles)
            return result

        slowed_gpu.extra_s, slowed_gpu.wrapped = extra_s, fn  # type: ignore[attr-defined] # for scripted timers
        return slowed_gpu

    def slowed_cpu() -> Any:
        result = fn()
        until = time.perf_counter() + extra_s
        while time.perf_counter() < until:
            pass
        return result

    slowed_cpu.extra_s, slowed_cpu.wrapped = extra_s, fn  # type: ignore[attr-defined]
    return slowed_cpu


SAME_LENGTH_MAX_MS = 1000.0  # do_bench's rep at the harness's graph length, at most (its capture
# runs that many ms of eager calls on the host)


def _do_bench(run: Callable[[], float], suffix: str, device: int) -> dict[str, Any]:
    """``{"do_bench<suffix>_ms": median, "clock_after_do_bench<suffix>": NVML's SM clock and
    throttle reasons right after}``, or the median 0.0 and the error (recorded, not raised: the
    cross-check is advisory, and one failure leaves the other figures standing)."""
    try:
        taken = run()
    except Exception as exc:  # noqa: BLE001 - see above
        return {f"do_bench{suffix}_ms": 0.0, f"error{suffix}": repr(exc)[:200]}
    return {f"do_bench{suffix}_ms": taken, f"clock_after_do_bench{suffix}": read_sm_clock(device)}


class InjectingTimer:
    """Wraps the run's timer; see the module docstring."""

    def __init__(self, inner: Timer, device: DetectedDevice, fraction: float, every: int, compare: str | None,
                 log: str | None = None):
        self.inner, self.device, self.fraction, self.every, self.compare = inner, device, fraction, every, compare
        self.log = log
        self._least_by_mode: dict[str, tuple[float, str]] = {}  # see _least

    def measure(self, fn: Callable[[], Any], plan: SamplingPlan) -> Measurement:
        """The inner timer's measurement of ``fn``: in a picked case with the extra work added
        (noted, and logged), and with do_bench's figures on the same callable written to the
        compare file when comparing."""
        if plan.overhead:  # the run's sample overhead, timed inside its first case: no case's extra work, and
            return self.inner.measure(fn, plan)  # cold whatever the mode, so no do_bench row either
        nodeid = _current_nodeid()
        notes: tuple[str, ...] = ()
        injected: dict[str, Any] | None = None
        if self.fraction > 0 and is_picked(nodeid, self.every):
            fn, injected = self._slowed(fn, plan)
            notes = (injected.pop("note"),)
        measured = self.inner.measure(fn, plan)
        if injected is not None and self.log:
            with open(self.log, "a", encoding="utf-8") as out:
                out.write(json.dumps({"nodeid": nodeid, **injected, "median_ms": measured.median_ms}) + "\n")
        if self.compare and self.device.is_gpu:
            import torch  # noqa: PLC0415 - torch loads on first use, not at start-up
            from triton.testing import do_bench_cudagraph  # noqa: PLC0415 - triton loads on first use

            # triton's median over its replays, like ours, at its default 20 ms of calls per graph
            # and at about the harness's calls per graph: do_bench sizes its graph as rep over its
            # own eager estimate of one call, host time included, so a host-bound short callable
            # gets far fewer calls at 20 ms than the harness, which sizes by device time; and a
            # short kernel's time per call falls as its graph grows (docs/measurement.md, "Hot mode").
            # The SM clock (NVML) after each (ours: read by the timer after sampling), to see
            # whether a gap follows the clock. A callable it cannot capture is recorded with its
            # error and left out.
            line: dict[str, Any] = {"nodeid": nodeid, "mode": measured.mode, "ours_ms": measured.median_ms,
                    "clock_after_ours": measured.sm_clock_mhz, "calls": measured.calls_per_sample}
            device = torch.cuda.current_device()
            line.update(_do_bench(lambda: do_bench_cudagraph(fn, return_mode="median"), "", device))
            if line["do_bench_ms"] > 0 and measured.calls_per_sample > 1 and measured.eager_ms:
                rep = min(SAME_LENGTH_MAX_MS, measured.calls_per_sample * measured.eager_ms)
                line["do_bench_same_rep_ms"] = rep
                line.update(_do_bench(lambda: do_bench_cudagraph(fn, rep=rep, return_mode="median"), "_same", device))
            with open(self.compare, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")
        return replace(measured, notes=measured.notes + notes) if notes else measured

    def _slowed(self, fn: Callable[[], Any], plan: SamplingPlan) -> tuple[Callable[[], Any], dict[str, Any]]:
        """``fn`` with the fraction's extra work after each call, less the extra work's own least
        cost (``_least``), the case timed first as it is on a short budget; and what was added,
        for the log and the case's note. A case re-measured after a suspected regression is
        slowed afresh (its base timed again), and its log line written again."""
        base = self.inner.measure(fn, replace(plan, budget_s=min(plan.budget_s, 0.2)))
        base_ms = base.median_ms
        if not (math.isfinite(base_ms) and base_ms > 0):  # the plugin fails the case for its time
            return fn, {"fraction": self.fraction, "base_ms": base_ms, "least_ms": 0.0, "extra_ms": 0.0,
                        "note": f"not injected: the case read {base_ms!r} ms"}
        least_ms, least_clock = self._least(plan)
        want_ms = self.fraction * base_ms
        if least_clock != base.clock:  # e.g. a case that cannot be captured: its spin is launched
            least_ms = 0.0  # from the host, at another cost than the one measured in a graph
            note = (f"injected +{100 * self.fraction:g}% extra work (base {base_ms:.4g} ms; the extra work's own "
                    f"cost not taken off: the case is timed on {base.clock}, the least on {least_clock})")
        elif want_ms < least_ms:
            note = (f"injected +{100 * self.fraction:g}% extra work asked, +{100 * least_ms / base_ms:.3g}% given: "
                    f"the least extra work, {1e3 * least_ms:.2f} us, is more than {1e3 * want_ms:.2f} us "
                    f"(base {base_ms:.4g} ms)")
        else:
            note = (f"injected +{100 * self.fraction:g}% extra work (base {base_ms:.4g} ms; the extra work's own "
                    f"{1e3 * least_ms:.2f} us taken off)")
        extra_ms = max(0.0, want_ms - least_ms)
        added = {"fraction": self.fraction, "base_ms": base_ms, "least_ms": least_ms, "extra_ms": extra_ms,
                 "note": note}
        return _with_extra_work(fn, extra_ms / 1e3, self.device), added

    def _least(self, plan: SamplingPlan) -> tuple[float, str]:
        """What the extra work costs at its least (``_with_extra_work`` at zero: a one-cycle spin
        kernel, which costs a microsecond or so however short), and the clock it was timed on, once
        per mode: a one-element add (a no-op on the CPU) timed as it is and with it. Not each
        case's own difference: two medians of a long case carry more of its noise than the cost
        sought (docs/noise-benchmark.md, "Injected work")."""
        if plan.mode not in self._least_by_mode:
            tiny = one_element_add() if self.device.is_gpu else (lambda: None)
            quick = replace(plan, budget_s=min(plan.budget_s, 0.2))
            bare = self.inner.measure(tiny, quick)
            spun = self.inner.measure(_with_extra_work(tiny, 0.0, self.device), quick)
            self._least_by_mode[plan.mode] = (max(0.0, spun.median_ms - bare.median_ms), bare.clock)
        return self._least_by_mode[plan.mode]


@pytest.hookimpl(wrapper=True)
def pytest_attnperf_make_timer(config: pytest.Config, device: DetectedDevice) -> Generator[None, Any, Any]:
    timer = yield
    fraction = float(os.environ.get("ATTNPERF_INJECT", "0") or 0)
    compare = os.environ.get("ATTNPERF_COMPARE_FILE") or None
    log = os.environ.get("ATTNPERF_INJECT_LOG") or None
    if config.getoption("attnperf_pool_out", None) is not None:  # a pool run of --attnperf-processes: the
        compare = log = None  # run it works for compares and logs its own process (the injection applies alike)
    if fraction <= 0 and compare is None:
        return timer
    every = int(os.environ.get("ATTNPERF_INJECT_EVERY", "2"))
    return InjectingTimer(timer or default_timer(device), device, fraction, every, compare, log)
