"""What one measured case produced: its result (times, rates, verdict, roofline, floors) and its
row in the summary table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pytest_attnperf.costs import Cost, Metrics
from pytest_attnperf.gate.memory import MemoryCheck
from pytest_attnperf.gate.physics import PhysicsCheck
from pytest_attnperf.gate.roofline import FloorOutcome, Position
from pytest_attnperf.gate.verdict import Verdict
from pytest_attnperf.hw.ceilings import Ceilings
from pytest_attnperf.measure.timing import Measurement

__all__ = ["PerfResult", "Row"]


@dataclass(frozen=True)
class PerfResult:
    """What one case measured: times, rates against the hardware, and the baseline verdict."""

    measurement: Measurement
    metrics: Metrics
    verdict: Verdict
    cost: Cost
    backend: str
    roofline: Position | None = None  # against the measured ceilings (see floors.check)
    floors: FloorOutcome | None = None  # the test's floors judged, if it has any
    dtype: str | None = None
    physics: PhysicsCheck | None = None  # its speed against the ceilings (see floors.check); None in a pool run
    kernels_changed: str | None = None  # how its kernels differ from the baseline entry's (None: same, or not compared)

    @property
    def median_ms(self) -> float:
        """The measured median per call, in ms."""
        return self.measurement.median_ms

    @property
    def tflops(self) -> float:
        """The achieved TFLOP/s."""
        return self.metrics.tflops

    @property
    def mfu(self) -> float | None:
        """Fraction of the card's peak dense FLOP/s for the dtype (None if unknown)."""
        return self.metrics.mfu

    @property
    def bandwidth_frac(self) -> float | None:
        """Fraction of the card's memory bandwidth (None if unknown)."""
        return self.metrics.bandwidth_frac

    @property
    def peak_mib(self) -> float | None:
        """The peak memory the case allocated, in MiB; None where not measured."""
        return self.measurement.peak_mib


@dataclass(frozen=True)
class Row:
    """One measured case, for the summary table."""

    nodeid: str
    backend: str
    median_ms: float
    stdrel: float
    tflops: float
    mfu: float | None
    gb_per_s: float
    bandwidth_frac: float | None
    peak_mib: float | None
    eager_ms: float | None
    intensity: float
    bound: str | None
    status: str
    change_pct: float | None
    eager_change_pct: float | None = None
    notes: tuple[str, ...] = ()
    roofline_frac: float | None = None  # achieved over attainable (roofline.Position.fraction)
    ceilings: Ceilings | None = None  # what the roofline and MFU were judged against
    params: dict[str, Any] = field(default_factory=dict)  # the case as plain data (reportgen.case_params)
    bitwise: bool | None = None  # two replays of one timed draw gave equal bits (None: not compared)
    verified: int = 0  # timed draws checked after sampling
    kernels: dict[str, int] | None = None  # the kernel inventory of one timed call (measure/inventory.py)
    kernels_changed: str | None = None  # how it differs from the baseline entry's (None: same, or not compared)
    kernels_source: str | None = None  # how the inventory was read: "graph replay" or "eager call"
    inventory_s: float = 0.0  # host seconds reading it took
    kernels_vs_eager: str | None = None  # how the eager checked call's kernels differ from it (a note; None: same)
    memory: tuple[MemoryCheck, ...] = ()  # the peak against the baseline's and the family's bound (gate.memory)
    drift_pct: float | None = None  # a lasting slowdown on the run history, in percent (plugins.history)
