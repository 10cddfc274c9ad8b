"""The memory gate. Pure: numbers in, checks out.

A case's peak memory above its inputs (``Measurement.peak_mib``) is judged twice, apart from its
time: against its baseline entry's ``peak_mib`` (``memory regressed`` beyond ``baseline x (1 +
share) + floor``, ``--attnperf-memory-tolerance``, ``Tolerance``), and, for a tiled kernel, against
its family's analytic bound (``Bound``, made by ``families.memory``: ``over the memory bound``).
docs/memory.md, "Against the baseline" and "The analytic bound".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["DEFAULT_TOLERANCE", "MIB", "Bound", "MemoryCheck", "Tolerance", "against_baseline", "against_bound"]

MIB = float(2**20)
DEFAULT_TOLERANCE = "4MiB+1%"  # docs/memory.md, "Tolerance": what moved between H200 runs, with room

_PART = re.compile(r"^\s*(?P<value>[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(?P<unit>MiB|%)\s*$")


@dataclass(frozen=True)
class Tolerance:
    """How far a peak may grow over its baseline's: ``floor_mib`` plus ``share`` of it; ``off``:
    not compared."""

    floor_mib: float = 4.0
    share: float = 0.01
    off: bool = False

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        """``off``, or ``<MiB>MiB+<percent>%`` (either part alone: ``2MiB``, ``5%``); a ValueError
        says what is wrong."""
        if text.strip().lower() == "off":
            return cls(0.0, 0.0, off=True)
        floor, share, seen = 0.0, 0.0, set()
        for part in text.split("+"):
            match = _PART.match(part)
            if match is None:
                raise ValueError("expected off, or a floor and a share such as 1MiB+1% (either alone)")
            unit, value = match["unit"], float(match["value"])
            if unit in seen or not math.isfinite(value):
                raise ValueError(f"{part.strip()!r}: give each of MiB and % once, as a finite number")
            seen.add(unit)
            floor, share = (value, share) if unit == "MiB" else (floor, value / 100)
        return cls(floor, share)

    def allowed_mib(self, baseline_mib: float) -> float:
        """The most a case whose baseline peaked at ``baseline_mib`` may peak at."""
        return baseline_mib * (1.0 + self.share) + self.floor_mib

    def describe(self) -> str:
        """The tolerance as the option writes it."""
        return "off" if self.off else f"{self.floor_mib:g}MiB+{100 * self.share:g}%"


@dataclass(frozen=True)
class Bound:
    """The most a tiled kernel may hold above its inputs on one case, in bytes: ``slack`` times
    the sum of ``terms`` (what the algorithm must hold: its outputs, row statistics, gradients,
    each named with its bytes) plus ``fixed_bytes`` (library workspaces, rounding)."""

    terms: tuple[tuple[str, float], ...]
    slack: float
    fixed_bytes: float

    @property
    def needed_bytes(self) -> float:
        """What the terms add up to, before slack."""
        return sum(size for _, size in self.terms)

    @property
    def bytes(self) -> float:
        """The bound."""
        return self.slack * self.needed_bytes + self.fixed_bytes

    @property
    def mib(self) -> float:
        """The bound in MiB."""
        return self.bytes / MIB

    def describe(self) -> str:
        """The bound's arithmetic in words, for messages."""
        terms = " + ".join(f"{name} {size / MIB:.1f} MiB" for name, size in self.terms)
        return f"{self.slack:g} x ({terms}) + {self.fixed_bytes / MIB:g} MiB"


@dataclass(frozen=True)
class MemoryCheck:
    """One judgement of a peak: ``status`` is ``memory regressed`` or ``over the memory bound``
    (both fail the case), or ``unchanged``, ``smaller`` (against the baseline) or ``within
    bound``; ``ratio`` is the peak over the baseline's or over the bound."""

    status: str
    ratio: float | None
    message: str
    limit_mib: float | None = None  # the most the peak was allowed: the baseline's plus the tolerance, or the bound

    @property
    def failed(self) -> bool:
        """Whether the check fails the case."""
        return self.status in ("memory regressed", "over the memory bound")

    @property
    def of_bound(self) -> bool:
        """Whether this is the check against the bound (else against the baseline)."""
        return self.status in ("within bound", "over the memory bound")


def against_baseline(peak_mib: float | None, baseline_mib: object, tolerance: Tolerance) -> MemoryCheck | None:
    """``peak_mib`` judged against the baseline entry's ``peak_mib``; None where either is not
    known (a CPU run, an entry recorded without one) or the tolerance is off."""
    if tolerance.off or peak_mib is None or not _figure(baseline_mib):
        return None
    base = float(baseline_mib)  # type: ignore[arg-type]  # _figure checked it
    allowed = tolerance.allowed_mib(base)
    ratio = peak_mib / base if base > 0 else None
    change = f" ({100 * (ratio - 1):+.1f}%)" if ratio is not None else ""
    figures = (f"peak above the inputs {peak_mib:.2f} MiB, baseline {base:.2f} MiB{change}; allowed {allowed:.2f} "
               f"MiB (--attnperf-memory-tolerance {tolerance.describe()})")
    if peak_mib > allowed:
        return MemoryCheck("memory regressed", ratio, f"memory regressed: {figures}", allowed)
    status = "smaller" if peak_mib < base / (1.0 + tolerance.share) - tolerance.floor_mib else "unchanged"
    return MemoryCheck(status, ratio, f"memory {status}: {figures}", allowed)


def against_bound(peak_mib: float | None, bound: Bound | None, kernel: str = "the kernel") -> MemoryCheck | None:
    """``peak_mib`` judged against a tiled kernel's analytic ``bound``; None where either is not
    known."""
    if peak_mib is None or bound is None:
        return None
    ratio = peak_mib / bound.mib
    figures = f"peak above the inputs {peak_mib:.2f} MiB, bound {bound.mib:.2f} MiB = {bound.describe()}"
    if peak_mib > bound.mib:
        return MemoryCheck("over the memory bound", ratio, (
            f"over the memory bound: {figures}; {kernel} is registered as tiled, and a tiled kernel needs "
            "O(T) workspace per head, not the T x T scores (register a kernel that materialises them with "
            "tiled=False)"), bound.mib)
    return MemoryCheck("within bound", ratio, f"within the memory bound: {figures}", bound.mib)


def _figure(value: object) -> bool:
    """A usable recorded peak: a finite number, not negative."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
