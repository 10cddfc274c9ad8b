"""The studies a sweep answers: scaling exponents and crossovers. Plain numbers in, plain numbers out.

* ``fit_exponent``: the slope ``b`` of ``log y = a + b log x`` by least squares, with a 95%
  confidence interval from Student's t with ``n - 2`` degrees of freedom (numpy only).
* ``compute_range``: the points a time exponent is fitted over (see its docstring for the rule).
* ``crossover``: the ``x`` where one series becomes lower than another for good, interpolated
  on log-log axes between the two measured points that bracket it.
* ``analytic_crossover``: the least integer ``x`` where one cost model's figure is at most
  another's, solved by bisection (both costs known to grow at different rates).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Crossover",
    "ExponentFit",
    "analytic_crossover",
    "compute_range",
    "crossover",
    "fit_exponent",
    "t_quantile",
]


def _t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` degrees of freedom (closed forms for integer df,
    Abramowitz and Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2 == 1:
        total, term = 0.0, c
        for j in range(1, (df - 1) // 2 + 1):  # cos + 2/3 cos^3 + (2*4)/(3*5) cos^5 + ...
            total += term
            term *= c * c * (2 * j) / (2 * j + 1)
        return 2.0 / math.pi * (theta + s * total) if df > 1 else 2.0 * theta / math.pi
    total, term = 0.0, 1.0
    for j in range(1, df // 2 + 1):  # 1 + 1/2 cos^2 + (1*3)/(2*4) cos^4 + ...
        total += term
        term *= c * c * (2 * j - 1) / (2 * j)
    return s * total


def t_quantile(df: int, level: float = 0.95) -> float:
    """The ``t`` with ``P(|T| <= t) = level`` for Student's t with ``df`` (>= 1) degrees of freedom."""
    if df < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, got {df}")
    lo, hi = 0.0, 1.0
    while _t_two_sided_mass(hi, df) < level:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _t_two_sided_mass(mid, df) < level else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class ExponentFit:
    """``log y = intercept + exponent * log x`` over ``n`` points from ``x_min`` to ``x_max``; the
    95% interval of the exponent is ``(ci_low, ci_high)``, infinite both ways for two points (no
    residual to estimate from)."""

    exponent: float
    intercept: float
    ci_low: float
    ci_high: float
    n: int
    x_min: float
    x_max: float


def fit_exponent(xs: Sequence[float], ys: Sequence[float], level: float = 0.95) -> ExponentFit:
    """Least-squares slope of ``log y`` against ``log x`` with its ``level`` confidence interval."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} x values but {len(ys)} y values")
    if len(xs) < 2:
        raise ValueError(f"an exponent needs at least 2 points, got {len(xs)}")
    if min(xs) <= 0 or min(ys) <= 0:
        raise ValueError("a log-log fit needs positive values")
    x, y = np.log(np.asarray(xs, dtype=float)), np.log(np.asarray(ys, dtype=float))
    sxx = float(((x - x.mean()) ** 2).sum())
    if sxx == 0:
        raise ValueError("an exponent needs at least two different x values")
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    n = len(xs)
    if n == 2:
        half = math.inf
    else:
        residual = y - (y.mean() + slope * (x - x.mean()))
        se = math.sqrt(float((residual**2).sum()) / (n - 2) / sxx)
        half = t_quantile(n - 2, level) * se
    intercept = float(y.mean() - slope * x.mean())
    return ExponentFit(slope, intercept, slope - half, slope + half, n, float(min(xs)), float(max(xs)))


def compute_range(
    xs: Sequence[float], ys: Sequence[float], min_ratio: float = 4.0, min_points: int = 3,
) -> list[int]:
    """Indices (in ``x`` order) of the points a time exponent is fitted over.

    A short call's time is mostly fixed costs (launches, the pipeline's fill and drain) that do
    not grow with the problem, which flattens the low end of a log-log curve. The rule: keep the
    points whose ``y`` is at least ``min_ratio`` times the series' smallest ``y``; if fewer than
    ``min_points`` pass, keep the ``min_points`` largest ``x`` instead (all points if fewer)."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    if not order:
        return []
    least = min(ys)
    kept = [i for i in order if ys[i] >= min_ratio * least]
    return kept if len(kept) >= min_points else order[-min_points:]


@dataclass(frozen=True)
class Crossover:
    """Where series A (e.g. a linear kernel's time) becomes lower than series B for good.

    ``status``: 'crossed' (``x`` interpolated), 'below the sweep' (A lower at every point),
    'beyond the sweep' (A not lower at the last point) or 'no data' (fewer than two shared
    points). ``crossings`` counts the sign changes seen (more than one: a noisy or non-monotone
    ratio; ``x`` is the last crossing)."""

    status: str
    x: float | None
    crossings: int = 0


def crossover(xs: Sequence[float], a: Sequence[float], b: Sequence[float]) -> Crossover:
    """The ``x`` from which ``a < b`` holds at every later point, log-log interpolated.

    Between the last point where ``a >= b`` and the next one, ``log(a/b)`` is taken as linear
    in ``log x`` and its zero is the answer."""
    points = sorted((x, ai / bi) for x, ai, bi in zip(xs, a, b, strict=True) if x > 0 and ai > 0 and bi > 0)
    if len(points) < 2:
        return Crossover("no data", None)
    logs = [(math.log(x), math.log(r)) for x, r in points]
    crossings = sum(1 for (_, r0), (_, r1) in zip(logs, logs[1:], strict=False) if (r0 < 0) != (r1 < 0))
    not_lower = [i for i, (_, lr) in enumerate(logs) if lr >= 0]
    if not not_lower:
        return Crossover("below the sweep", None, crossings)
    last = not_lower[-1]
    if last == len(logs) - 1:
        return Crossover("beyond the sweep", None, crossings)
    (x0, r0), (x1, r1) = logs[last], logs[last + 1]
    x_star = x0 + (0.0 - r0) * (x1 - x0) / (r1 - r0)
    return Crossover("crossed", math.exp(x_star), crossings)


def analytic_crossover(
    lower_after: Callable[[int], float], higher_after: Callable[[int], float], lo: int = 1, hi: int = 1 << 24,
) -> int | None:
    """The least integer ``x`` in ``[lo, hi]`` with ``lower_after(x) <= higher_after(x)``, assuming
    that once it holds it keeps holding (a cost growing like ``x`` against one growing like
    ``x**2``); None when it does not hold at ``hi``; ``lo`` when it already holds there."""
    if lower_after(hi) > higher_after(hi):
        return None
    if lower_after(lo) <= higher_after(lo):
        return lo
    while hi - lo > 1:  # invariant: fails at lo, holds at hi
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if lower_after(mid) <= higher_after(mid) else (mid, hi)
    return hi
