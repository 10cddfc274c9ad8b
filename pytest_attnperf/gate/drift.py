"""Shifts in a case's history of medians: change points found by ``ruptures`` (PELT, least
squares), each kept only when it is large, significant and persistent (pure).

The steps (the noise, the candidates, the rule, the start) and what the rule finds on synthetic
series: docs/history.md, "Finding shifts". ``ruptures`` and ``scipy`` are imported on first use
(the optional extra ``history``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["INSTALL_HINT", "DriftNote", "Rule", "Shift", "available", "drifted", "find_shifts", "noise_sigma"]

INSTALL_HINT = "pip install 'pytest-attnperf[history]' (ruptures and scipy)"
PENALTY_SIGMAS = 4.0  # PELT's penalty per change point, in sigma^2 x ln(n): twice BIC's 2 sigma^2 ln(n)
BAND_SIGMAS = 2.0  # a run after a shift is beyond the noise when this many sigmas from the level before


@dataclass(frozen=True)
class Rule:
    """What a shift must be to count: its least size (a fraction), its greatest p-value, the runs
    after it that must all stay shifted, and the least noise assumed (a fraction of the median)."""

    min_shift: float = 0.01
    max_p: float = 0.01
    persist: int = 2
    noise_floor: float = 0.002

    def __post_init__(self) -> None:
        if self.persist < 1:
            raise ValueError("persist must be at least 1")


@dataclass(frozen=True)
class Shift:
    """One change in a series: ``index`` is the first run at the new level (``index - 1`` the
    last at the old one); ``size`` the change of the level's median, a fraction (+0.03: 3%
    slower); ``p_value`` Student's t-test between the segments either side."""

    index: int
    size: float
    p_value: float
    before_ms: float
    after_ms: float

    @property
    def slower(self) -> bool:
        """Whether the runs after it are slower than those before."""
        return self.size > 0


@dataclass(frozen=True)
class DriftNote:
    """A case's drift found on its history plus this run: the shift, its range and whether it
    fails the case (``--attnperf-fail-on-drift`` and not failed otherwise)."""

    shift: Shift
    last_good: str | None
    first_bad: str | None
    fails: bool

    @property
    def pct(self) -> float:
        """The shift's size in percent."""
        return 100.0 * self.shift.size

    def text(self) -> str:
        """One line: size, the range to bisect, the p-value."""
        first = "this run" if self.first_bad is None else self.first_bad
        return (f"drifted {self.pct:+.1f}% on its history (last good {self.last_good or '?'}, first bad {first}, "
                f"p={self.shift.p_value:.2g})")


def available() -> str | None:
    """None when the change-point library can be imported, else how to install it."""
    try:
        import ruptures  # noqa: F401, PLC0415 - the optional history extra, loaded on first use
        import scipy.stats  # noqa: F401, PLC0415 - the optional history extra, loaded on first use
    except ImportError:
        return INSTALL_HINT
    return None


def noise_sigma(values: Sequence[float], floor: float) -> float:
    """The run-to-run noise of ``values``, as a fraction of their median (see the module's step 1)."""
    centre = statistics.median(values)
    rel = [v / centre for v in values]
    diffs = [b - a for a, b in zip(rel, rel[1:], strict=False)]
    if len(diffs) < 2:
        return floor
    mid = statistics.median(diffs)
    mad = statistics.median(abs(d - mid) for d in diffs)
    return max(1.4826 * mad / math.sqrt(2.0), floor)


def _candidates(rel: Sequence[float], sigma: float, min_size: int) -> list[int]:
    """PELT's change points of ``rel`` (each the index of the first run of a new segment)."""
    import numpy as np  # noqa: PLC0415 - numpy loads on first use, not at start-up
    import ruptures  # noqa: PLC0415 - the optional history extra, loaded on first use

    if len(rel) < 2 * min_size:
        return []
    signal = np.asarray(rel, dtype=float).reshape(-1, 1)
    penalty = PENALTY_SIGMAS * sigma * sigma * math.log(len(rel))
    found = ruptures.Pelt(model="l2", min_size=min_size, jump=1).fit(signal).predict(pen=penalty)
    return [int(i) for i in found[:-1]]  # the last is the series' end


def _p_value(before: Sequence[float], after: Sequence[float]) -> float:
    """Student's two-sided t-test, the variance pooled (one noise either side of a step: Welch's
    test, with two runs after a shift, has a single degree of freedom and finds nothing); two
    constant segments at different levels give 0."""
    from scipy import stats  # noqa: PLC0415 - the optional history extra, loaded on first use

    if statistics.pvariance(before) == 0 and statistics.pvariance(after) == 0:
        return 0.0 if statistics.fmean(before) != statistics.fmean(after) else 1.0
    p = float(stats.ttest_ind(before, after, equal_var=True).pvalue)
    return p if math.isfinite(p) else 1.0


def _judged(values: Sequence[float], cuts: Sequence[int], at: int, sigma: float, rule: Rule) -> tuple[Shift, bool]:
    """The shift at ``cuts[at]`` between its neighbouring cuts, and whether it counts."""
    bounds = [0, *cuts, len(values)]
    before, after = values[bounds[at]:bounds[at + 1]], values[bounds[at + 1]:bounds[at + 2]]
    level, now = statistics.median(before), statistics.median(after)
    shift = Shift(cuts[at], now / level - 1.0, _p_value(before, after), level, now)
    sign = 1.0 if shift.size > 0 else -1.0
    band = max(BAND_SIGMAS * sigma, rule.min_shift / 2.0, abs(shift.size) / 4.0)  # a spike and a normal run: no level
    held = len(after) >= rule.persist and all(sign * (v / level - 1.0) > band for v in after[:rule.persist])
    counts = abs(shift.size) >= rule.min_shift and shift.p_value <= rule.max_p and held
    return shift, counts


def _started(values: Sequence[float], cuts: Sequence[int], at: int, shift: Shift, sigma: float,
             rule: Rule) -> Shift:
    """``shift`` with its first run moved back over the runs already beyond the noise band (step 4),
    never into the previous shift's first two runs."""
    start = cuts[at - 1] + 2 if at > 0 else 2
    first, sign = shift.index, 1.0 if shift.slower else -1.0
    band = max(BAND_SIGMAS * sigma, rule.min_shift / 2.0)
    while first - 1 >= start:
        level = statistics.median(values[start - 2:first - 1])
        if not sign * (values[first - 1] / level - 1.0) > band:
            break
        first -= 1
    if first == shift.index:
        return shift
    return Shift(first, shift.size, shift.p_value, shift.before_ms, shift.after_ms)


def find_shifts(medians_ms: Sequence[float], rule: Rule | None = None) -> list[Shift]:
    """The shifts of a series of medians that count under ``rule``, oldest first (module doc)."""
    rule = rule or Rule()
    values = [float(v) for v in medians_ms]
    if len(values) < 2 * rule.persist or not all(math.isfinite(v) and v > 0 for v in values):
        return []
    sigma = noise_sigma(values, rule.noise_floor)
    centre = statistics.median(values)
    cuts = _candidates([v / centre for v in values], sigma, rule.persist)
    while cuts:
        judged = [_judged(values, cuts, i, sigma, rule) for i in range(len(cuts))]
        failing = [i for i, (_, ok) in enumerate(judged) if not ok]
        if not failing:
            return [_started(values, cuts, i, shift, sigma, rule) for i, (shift, _) in enumerate(judged)]
        weakest = max(failing, key=lambda i: (judged[i][0].p_value, -abs(judged[i][0].size)))
        cuts = cuts[:weakest] + cuts[weakest + 1:]
    return []


def drifted(medians_ms: Sequence[float], rule: Rule | None = None) -> Shift | None:
    """The shift a gating run fails a case for: the series' last shift, when it is a slowdown
    (the latest run, the series' last, is at its new level); None otherwise."""
    shifts = find_shifts(medians_ms, rule)
    return shifts[-1] if shifts and shifts[-1].slower else None
