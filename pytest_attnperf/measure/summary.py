"""What a set of per-call times tells: median, its 95% distribution-free interval, relative spread
(``Summary``, of a measurement's samples or read from a baseline entry). Pure; the gate judges it
(``gate.verdict``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["OLD_OVERHEADS_KEY", "OVERHEADS_KEY", "Summary", "median_ci"]

_Z95 = 1.959963984540054
# a baseline entry's sample overhead of each recording; files written before the name was settled
# hold it under the old one, read when the new is absent and written under the new
OVERHEADS_KEY, OLD_OVERHEADS_KEY = "run_overheads_ms", "run_floors_ms"


def median_ci(sorted_values: Sequence[float]) -> tuple[float, float]:
    """95% distribution-free confidence interval of the median (binomial order statistics,
    normal approximation of the ranks)."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("no samples")
    half_width = _Z95 * math.sqrt(n) / 2.0
    lo = max(int(math.floor(n / 2.0 - half_width)), 1)
    hi = min(int(math.ceil(n / 2.0 + half_width)) + 1, n)
    return sorted_values[lo - 1], sorted_values[hi - 1]


@dataclass(frozen=True)
class Summary:
    """What a set of per-call times (ms) tells: median, its 95% interval, relative spread."""

    median_ms: float
    ci_low_ms: float
    ci_high_ms: float
    stdrel: float
    n_samples: int
    run_medians_ms: tuple[float, ...] = ()  # a baseline's medians of its recordings, oldest first
    run_machines: tuple[str | None, ...] = ()  # the machine of each recording (None: not known)
    run_overheads_ms: tuple[float | None, ...] = ()  # each recording's sample overhead (None: not measured)

    @classmethod
    def from_samples(cls, samples_ms: Sequence[float]) -> Summary:
        """The summary of per-call times in ms; an empty sequence is a ValueError."""
        if not samples_ms:
            raise ValueError("no samples")
        ordered = sorted(samples_ms)
        low, high = median_ci(ordered)
        mean = statistics.fmean(ordered)
        stdev = statistics.stdev(ordered) if len(ordered) > 1 else 0.0
        return cls(
            median_ms=statistics.median(ordered),
            ci_low_ms=low,
            ci_high_ms=high,
            stdrel=stdev / mean if mean > 0 else 0.0,
            n_samples=len(ordered),
        )

    @classmethod
    def from_mapping(cls, entry: Mapping[str, object]) -> Summary:
        """Read a baseline entry; raises KeyError/TypeError/ValueError on a malformed one: a
        missing or non-numeric field, a time that is not positive and finite (the gate divides
        by them), an interval that does not hold the median, a history of the wrong length."""

        def num(key: str) -> float:
            value = entry[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise TypeError(f"'{key}' is {value!r}, not a finite number")
            return float(value)

        runs = entry.get("run_medians_ms", [])
        median, low, high = num("median_ms"), num("ci_low_ms"), num("ci_high_ms")
        if median <= 0:
            raise ValueError(f"'median_ms' is {entry['median_ms']!r}; a time must be positive")
        if low <= 0:
            raise ValueError(f"'ci_low_ms' is {entry['ci_low_ms']!r}; a time must be positive")
        if not low <= median <= high:
            raise ValueError(f"the interval {low!r}..{high!r} does not hold 'median_ms' {median!r}")
        count = entry["n_samples"]
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise TypeError(f"'n_samples' is {count!r}, not a whole number of at least 1")
        if not isinstance(runs, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in runs
        ):
            raise TypeError(f"'run_medians_ms' is {runs!r}, not a list of positive numbers")
        machines = entry.get("run_machines", [None] * len(runs))
        if not isinstance(machines, list) or len(machines) != len(runs) or not all(
            m is None or isinstance(m, str) for m in machines
        ):
            raise TypeError(f"'run_machines' is {machines!r}, not one name (or null) per recording")
        key = OVERHEADS_KEY if OVERHEADS_KEY in entry or OLD_OVERHEADS_KEY not in entry else OLD_OVERHEADS_KEY
        overheads = entry.get(key, [None] * len(runs))
        if not isinstance(overheads, list) or len(overheads) != len(runs) or not all(
            f is None or (isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) and f > 0)
            for f in overheads
        ):
            raise TypeError(f"'{key}' is {overheads!r}, not one positive time (or null) per recording")
        if num("stdrel") < 0:
            raise ValueError(f"'stdrel' is {entry['stdrel']!r}; a spread cannot be negative")
        for key in ("hot_sample_ms", "eager_ms"):  # optional times, divided by when present
            if key in entry and num(key) <= 0:
                raise ValueError(f"'{key}' is {entry[key]!r}; a time must be positive")
        for key in ("tflops", "gb_per_s", "peak_mib"):  # optional figures, shown beside the time
            if key in entry and entry[key] is not None and num(key) < 0:
                raise ValueError(f"'{key}' is {entry[key]!r}; it cannot be negative")
        return cls(
            median_ms=median,
            ci_low_ms=low,
            ci_high_ms=high,
            stdrel=num("stdrel"),
            n_samples=count,
            run_medians_ms=tuple(float(v) for v in runs),
            run_machines=tuple(machines),
            run_overheads_ms=tuple(None if f is None else float(f) for f in overheads),
        )

    def describe(self) -> str:
        """The median, its 95% interval, spread and sample count, as one phrase for messages."""
        return (
            f"median {self.median_ms:.4g} ms (95% CI {self.ci_low_ms:.4g}..{self.ci_high_ms:.4g}, "
            f"spread {100 * self.stdrel:.2f}%, n={self.n_samples})"
        )
