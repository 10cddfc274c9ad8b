"""The roofline: where a case sits against the machine's ceilings, and floors on it. Pure.

Arithmetic intensity ``flops / bytes``, the ridge point ``P / B``, the bound (compute or memory)
and the roofline fraction ``max(achieved / P, achieved bytes/s / B)``. A floor (``roofline``,
``mfu`` or ``bandwidth``, ``Floors.parse``) fails a case only when it is below it by more than
its measurement can be off (``judge_floor``). docs/roofline.md, "The roofline position of a
case" and "Floors".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields

__all__ = [
    "METRICS",
    "NOISE_K",
    "Ceiling",
    "Floor",
    "FloorCheck",
    "FloorOutcome",
    "Floors",
    "Position",
    "attainable_flops",
    "bound",
    "intensity",
    "judge_floor",
    "median_sigma",
    "ridge",
    "roofline_fraction",
]

METRICS = ("roofline", "mfu", "bandwidth")
# A floor fails only when achieved x (1 + NOISE_K x sigma) is still below it: the gate's bar is
# three standard deviations of a median's run-to-run move, and a floor uses the same one, so a
# case that sits on its floor fails about as rarely on noise as an unchanged case regresses.
NOISE_K = 3.0
_Z95 = 1.959963984540054


def intensity(flops: float, bytes_moved: float) -> float:
    """Arithmetic intensity in FLOP/byte; infinite for a cost that moves no bytes."""
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"a cost cannot be negative ({flops} FLOP, {bytes_moved} bytes)")
    return flops / bytes_moved if bytes_moved else math.inf


def ridge(peak_flops: float, bytes_per_s: float) -> float:
    """The ridge point in FLOP/byte: peak FLOP/s over bandwidth."""
    return peak_flops / bytes_per_s


def attainable_flops(intensity_flop_per_byte: float, peak_flops: float, bytes_per_s: float) -> float:
    """The roofline: ``min(peak, intensity x bandwidth)`` in FLOP/s."""
    if math.isinf(intensity_flop_per_byte):
        return peak_flops
    return min(peak_flops, intensity_flop_per_byte * bytes_per_s)


def bound(intensity_flop_per_byte: float, ridge_flop_per_byte: float) -> str:
    """'compute' at or above the ridge point, else 'memory'."""
    return "compute" if intensity_flop_per_byte >= ridge_flop_per_byte else "memory"


def roofline_fraction(flops: float, bytes_moved: float, seconds: float, peak_flops: float,
                      bytes_per_s: float) -> float:
    """Achieved over attainable: the larger of the compute and the bandwidth fraction."""
    if seconds <= 0:
        raise ValueError(f"a call cannot take {seconds} s")
    return max(flops / seconds / peak_flops, bytes_moved / seconds / bytes_per_s)


@dataclass(frozen=True)
class Ceiling:
    """One ceiling: FLOP/s or bytes/s, and where it came from ('measured', 'spec' or 'user')."""

    value: float
    source: str


@dataclass(frozen=True)
class Position:
    """A case on the roofline: its cost, its time and the two ceilings it is judged against."""

    flops: float
    bytes: float
    seconds: float
    peak: Ceiling  # FLOP/s for the case's dtype
    bandwidth: Ceiling  # bytes/s

    @property
    def intensity(self) -> float:
        """The case's arithmetic intensity in FLOP/byte."""
        return intensity(self.flops, self.bytes)

    @property
    def ridge(self) -> float:
        """The ridge point of the two ceilings, in FLOP/byte."""
        return ridge(self.peak.value, self.bandwidth.value)

    @property
    def bound(self) -> str:
        """'compute' or 'memory': the side of the ridge the case's intensity is on."""
        return bound(self.intensity, self.ridge)

    @property
    def attainable_flops(self) -> float:
        """The roofline's FLOP/s at the case's intensity."""
        return attainable_flops(self.intensity, self.peak.value, self.bandwidth.value)

    @property
    def fraction(self) -> float:
        """Achieved over attainable (1.0: on the roofline)."""
        return roofline_fraction(self.flops, self.bytes, self.seconds, self.peak.value, self.bandwidth.value)

    @property
    def sources(self) -> str:
        """'measured', 'spec', 'user', or 'peak X, bandwidth Y' when they differ."""
        if self.peak.source == self.bandwidth.source:
            return self.peak.source
        return f"peak {self.peak.source}, bandwidth {self.bandwidth.source}"

    def describe(self, dtype: str) -> str:
        """The ceiling used, for a failure message."""
        which = (f"{dtype} peak {self.peak.value / 1e12:.1f} TFLOP/s ({self.peak.source})"
                 if self.bound == "compute" else
                 f"{self.intensity:.1f} FLOP/B x bandwidth {self.bandwidth.value / 1e9:.0f} GB/s "
                 f"({self.bandwidth.source})")
        side = ">=" if self.bound == "compute" else "<"
        return (f"attainable {self.attainable_flops / 1e12:.2f} TFLOP/s = {which}; the case is {self.bound} "
                f"bound ({self.intensity:.1f} FLOP/B {side} ridge {self.ridge:.1f} FLOP/B)")


# -- floors --------------------------------------------------------------------------------


def _fraction(metric: str, value: object) -> float:
    """0.5 or '50%' as 0.5; a floor is a fraction of a ceiling, above 0 and at most 1."""
    try:
        if isinstance(value, bool):
            raise ValueError
        if isinstance(value, str):
            text = value.strip()
            number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        else:
            number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"floor {metric}={value!r} is not a fraction such as 0.5 or '50%'") from None
    if not 0 < number <= 1:
        raise ValueError(f"floor {metric}={value!r} must be above 0 and at most 1 (a fraction of a ceiling)")
    return number


@dataclass(frozen=True)
class Floor:
    """Least fractions a case must reach; None: no floor on that metric."""

    roofline: float | None = None
    mfu: float | None = None
    bandwidth: float | None = None

    @classmethod
    def parse(cls, values: Mapping[str, object], where: str = "") -> Floor:
        """A floor from ``{metric: fraction}``; an unknown metric or a bad fraction is a ValueError."""
        unknown = sorted(set(values) - set(METRICS))
        if unknown:
            raise ValueError(f"{where}unknown floor metric {', '.join(unknown)}: the metrics are "
                             f"{', '.join(METRICS)}")
        return cls(**{m: None if values.get(m) is None else _fraction(m, values[m]) for m in METRICS})

    def items(self) -> list[tuple[str, float]]:
        """``(metric, fraction)`` of each metric that has a floor."""
        return [(f.name, getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None]

    def __bool__(self) -> bool:
        return bool(self.items())


@dataclass(frozen=True)
class Floors:
    """Floors by card: ``by_hw`` maps a hardware name (``--hw``) to its floor; ``any_hw``
    applies on every card without one of its own (also on a card outside the table)."""

    any_hw: Floor = Floor()
    by_hw: tuple[tuple[str, Floor], ...] = ()

    @classmethod
    def parse(cls, spec: object, where: str = "") -> Floors:
        """The one shape of the marker's keywords and of ``registry.kernel(floors=...)``:

        * ``{"roofline": 0.5, "mfu": None, "bandwidth": None}``: on every card;
        * ``{"roofline": 0.5, "hw": "h200"}`` (or a list of names): on those cards only;
        * ``{"h200": {"roofline": 0.6}, "gb10": {"roofline": 0.3}}``: one floor per card,
          beside which top-level metrics apply to the other cards.

        ``None`` is no floor; a ``Floors`` is returned as it is."""
        if spec is None:
            return cls()
        if isinstance(spec, Floors):
            return spec
        if not isinstance(spec, Mapping):
            raise ValueError(f"{where}floors must be a mapping such as {{'roofline': 0.5}} or "
                             f"{{'h200': {{'roofline': 0.5}}}}, not {spec!r}")
        top = {k: v for k, v in spec.items() if k in METRICS}
        cards = {k: v for k, v in spec.items() if k not in METRICS and k != "hw"}
        for name, value in cards.items():
            if not isinstance(value, Mapping):
                raise ValueError(f"{where}'{name}' is neither a floor metric ({', '.join(METRICS)}) nor a card "
                                 f"name with a mapping of floors such as {name}=dict(roofline=0.5)")
        by_hw = {str(name).lower(): Floor.parse(value, f"{where}{name}: ") for name, value in cards.items()}
        floor = Floor.parse(top, where)
        hw = spec.get("hw")
        if hw is not None:
            names = [hw] if isinstance(hw, str) else list(hw)
            if not names or not all(isinstance(n, str) and n for n in names):
                raise ValueError(f"{where}hw={hw!r} must be a hardware name or a list of them")
            if not floor:
                raise ValueError(f"{where}hw={hw!r} given without a floor metric ({', '.join(METRICS)})")
            for name in names:
                by_hw.setdefault(name.lower(), floor)
            floor = Floor()
        return cls(floor, tuple(sorted(by_hw.items())))

    def for_hw(self, hw_name: str) -> tuple[Floor, str | None] | None:
        """The floor that applies on ``hw_name`` and the card it names (None: any card)."""
        own = dict(self.by_hw).get(hw_name.lower())
        if own:
            return own, hw_name.lower()
        return (self.any_hw, None) if self.any_hw else None


@dataclass(frozen=True)
class FloorCheck:
    """One floor judged: ``status`` is 'passed', 'within noise' (below the floor by less than
    the noise bar: passed), 'failed', or 'no ceiling' (nothing to judge against: failed)."""

    metric: str
    floor: float
    achieved: float | None
    margin: float  # NOISE_K x the median's relative standard deviation
    status: str

    @property
    def failed(self) -> bool:
        """Whether this floor fails the test (below it beyond the noise, or no ceiling)."""
        return self.status in ("failed", "no ceiling")


def median_sigma(median_ms: float, ci_low_ms: float, ci_high_ms: float, run_noise: float,
                 run_noise_time_ms: float) -> float:
    """A median's relative standard deviation: its own 95% interval's half width (over 1.96) and
    the gate's least run-to-run noise (``--attnperf-run-noise``, and ``--attnperf-run-noise-time``
    over the median), in quadrature."""
    within = (ci_high_ms - ci_low_ms) / (2 * _Z95) / median_ms
    between = max(run_noise, run_noise_time_ms / median_ms)
    return math.hypot(within, between)


def judge_floor(metric: str, achieved: float | None, floor: float, sigma: float, k: float = NOISE_K) -> FloorCheck:
    """Fail only when ``achieved x (1 + k x sigma) < floor``: the achieved fraction is a rate,
    inversely proportional to the median, so its relative error is the median's."""
    margin = k * sigma
    if achieved is None:
        return FloorCheck(metric, floor, None, margin, "no ceiling")
    if achieved >= floor:
        status = "passed"
    elif achieved * (1 + margin) >= floor:
        status = "within noise"
    else:
        status = "failed"
    return FloorCheck(metric, floor, achieved, margin, status)


@dataclass(frozen=True)
class FloorOutcome:
    """A test's floors judged: each check, where the floor came from and for which card."""

    checks: tuple[FloorCheck, ...]
    source: str
    hw: str | None  # the card the floor names; None: a floor for every card

    @property
    def failed(self) -> bool:
        """Whether any floor fails the test."""
        return any(c.failed for c in self.checks)

    @property
    def status(self) -> str:
        """The worst status among the checks."""
        order = ("no ceiling", "failed", "within noise", "passed")
        return min((c.status for c in self.checks), key=order.index)
