"""The run's sample overhead: the least a cold sample can hold on this machine, a one-element add
timed once a run, reported beside every case and, when timed as cold cases are, used by the gate
against another machine's recordings (docs/evidence.md, "Fixed time per sample")."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pytest_attnperf.measure.timing import SamplingPlan, Timer, one_element_add

__all__ = ["NO_CUDA", "SampleOverhead"]

NO_CUDA = "no CUDA device"
HOW = "one-element add, cold"


@dataclass
class SampleOverhead:
    """Timed on first need with ``timer`` and the run's ``cold_plan`` (one call a sample, whatever
    the run's mode: hot mode's graphs of many calls would spread a per-sample cost over them), on
    CUDA device 0 only. ``refusals`` gathers why a case's centre was not moved by it (the gate's
    words, for the summary)."""

    is_gpu: Callable[[], bool]
    timer: Callable[[], Timer]
    cold_plan: Callable[[], SamplingPlan]
    figure: tuple[float | None, str] | None = None  # (ms, how) once timed; (None, why) when it could not be
    gate_figure_ms: float | None = None  # see for_gate_ms
    refusals: set[str] = field(default_factory=set)

    def measure(self) -> tuple[float | None, str]:
        """``(ms, how)``, timed once a run; ``(None, why)`` without CUDA or when it fails."""
        if self.figure is None:
            self.figure, self.gate_figure_ms = self._time()
        return self.figure

    def for_gate_ms(self) -> float | None:
        """The overhead as the gate uses it: kept with each recording (``run_overheads_ms``) and,
        against another machine's recordings, the difference moves a cold case's centre. Only
        one timed the way cold cases are (events inside the graph, ``cuda-graph-nodes``) and not
        caught at a held-down clock; else None, and the reason is in ``measure``'s words."""
        self.measure()
        return self.gate_figure_ms

    def _time(self) -> tuple[tuple[float | None, str], float | None]:
        if not self.is_gpu():  # a CPU run need not import torch for it
            return (None, NO_CUDA), None
        plan = replace(self.cold_plan(), overhead=True)
        try:
            import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

            if not torch.cuda.is_available():
                return (None, NO_CUDA), None
            m = self.timer().measure(one_element_add(), plan)
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not fail the run
            return (None, f"{HOW} failed: {type(exc).__name__}: {str(exc)[:120]}"), None
        if not (math.isfinite(m.median_ms) and m.median_ms > 0):
            return (None, f"{HOW} read {m.median_ms!r} ms"), None
        doubts = [n for n in m.notes if n.startswith(("still throttled", "clocks held down"))]
        if m.clock != "cuda-graph-nodes":
            doubts.insert(0, f"clock {m.clock}")
        if doubts:
            return (m.median_ms, f"{HOW}; not used by the gate: {'; '.join(doubts)}"), None
        return (m.median_ms, HOW), m.median_ms
