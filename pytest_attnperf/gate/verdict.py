"""The regression verdict on a sample summary (``measure.summary``). Pure: numbers in, verdicts out.

A case regresses only when all three hold: its median is slower than the baseline's centre by
more than the tolerance; the 95% order-statistic intervals of the two medians do not overlap;
the slowdown is beyond ``3 * sqrt(sigma**2 * (1 + 1/m) + machine**2)``, ``sigma`` the run-to-run
noise over the baseline's ``m`` recordings (``run_noise``, never below its floors) and ``machine``
the between-machines term. An improvement is judged symmetrically and never fails; with fewer
than ``MIN_SAMPLES`` samples the verdict rests on the tolerance alone. docs/gate.md, "A
regression", "Run-to-run noise" and "Between machines"; the figures: docs/evidence.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from pytest_attnperf.measure.summary import Summary

__all__ = [
    "HISTORY_MIN", "HISTORY_ROBUST", "MAX_OVERHEAD_SHIFT_MS", "MIN_SAMPLES", "Verdict", "centre_overhead_ms",
    "centre_ms", "held_by", "overhead_shift_ms", "judge", "run_noise",
]

MIN_SAMPLES = 5
HISTORY_MIN = 3  # recordings before a case's own run-to-run spread is trusted
HISTORY_ROBUST = 5  # recordings before one of them may be set aside as odd (the scaled MAD)
# the largest difference of two machines' sample overheads taken as a shift of their cases, three times
# the between-machines offset (docs/evidence.md, "Sample overhead"): beyond it, a floor is taken as
# measured wrong, and the between-machines offset stands
MAX_OVERHEAD_SHIFT_MS = 0.006


@dataclass(frozen=True)
class Verdict:
    """``status`` is one of: new, unchanged, improved, regressed, and (set by the plugin) recorded,
    not compared (another mode), clock changed (fails: see ``perf._clock_changed``), unjudged (a
    host-clock case timed on a contended host: see ``policy._unjudged``)."""

    status: str
    ratio: float | None
    message: str
    machine_noise: float = 0.0  # the between-machines term the noise bar used (0: none, or no bar)
    machine_shift_ms: float | None = None  # the centre's move for this machine (see judge); None: not moved
    held: str | None = None  # why a change beyond the tolerance was judged unchanged (see ``held_by``)
    required: bool = False  # a verdict that judged nothing, where the run requires a judgement: it fails

    @property
    def failed(self) -> bool:
        """Whether the verdict fails the test (regressed, or the clock changed; unjudged, where
        ``required``)."""
        return self.status in ("regressed", "clock changed") or (self.required and self.status == "unjudged")

    @property
    def change_pct(self) -> float | None:
        """The change against the baseline in percent; None without a ratio."""
        return None if self.ratio is None else 100.0 * (self.ratio - 1.0)


MAD_TO_SIGMA = 1.4826  # a normal distribution's sigma per median absolute deviation


def centre_ms(baseline: Summary) -> float:
    """The baseline's centre: the median of its recordings from ``HISTORY_MIN`` on, else its
    latest median."""
    runs = baseline.run_medians_ms
    return statistics.median(runs) if len(runs) >= HISTORY_MIN else baseline.median_ms


def run_noise(baseline: Summary, floor: float, floor_ms: float = 0.0) -> tuple[float, int, float, str]:
    """The baseline's centre, its recordings ``m``, the run-to-run ``sigma`` and where it came from.

    ``sigma`` is never below ``floor`` (a share of the centre) nor below ``floor_ms`` (a time,
    ``--attnperf-run-noise-time``) as a share of the centre: a short kernel's median moves
    between processes by a time that does not shrink with it, so below 20 us a share alone is too
    tight (docs/evidence.md, "Time floor").

    From ``HISTORY_MIN`` recordings on, the centre is their median and sigma their sample
    standard deviation. From ``HISTORY_ROBUST`` recordings on, sigma is the smaller of that and
    the median absolute deviation scaled to a normal sigma, which one odd recording does not
    move (a step held by a minority of the recordings leaves it at zero); the sd stays in the
    minimum because it is exact for a history split evenly between two levels (a machine-to-machine
    step: there the scaled MAD overstates the spread by half, and a bar that wide let a real +7%
    pass at a 5% tolerance). With three or four recordings an odd one cannot be told from a
    level the case returns to, and the MAD of three is zero whenever two agree, which a clock
    ticking in 32 ns makes common: an unchanged run that reads the odd recording's level again is
    then called a regression (docs/evidence.md, "Run-to-run noise", the 9.2 us cudnn case). (Every
    recording kept passed the gate against the ones before it, so none is far off.) When the
    recordings come from two or more machines (recordings of unknown machine, from older files,
    counting as one more) it is the standard deviation alone: each machine moves a case by its own
    amount, and a machine with a minority of the recordings is exactly what the MAD would leave
    out."""
    runs, centre = baseline.run_medians_ms, centre_ms(baseline)
    timed = floor_ms / centre if centre > 0 else 0.0
    by_time = f" ({1e3 * floor_ms:g} us)" if timed > floor else ""
    floor = max(floor, timed)
    if len(runs) >= HISTORY_MIN:
        mad = MAD_TO_SIGMA * statistics.median(abs(r - centre) for r in runs)
        sd = statistics.stdev(runs)
        machines = len(set(baseline.run_machines))  # unknown machines (None) count as one more
        own = (sd if machines >= 2 or len(runs) < HISTORY_ROBUST else min(mad, sd)) / centre
        source = f"{100 * own:.2f}% over {len(runs)} recordings" + (
            f" from {machines} machines" if machines >= 2 else "") + (
            f", floored at {100 * floor:.2f}%{by_time}" if own < floor else "")
        m, sigma = len(runs), max(own, floor)
    else:
        m, sigma = 1, floor
        source = f"the {100 * floor:.2f}%{by_time} floor (fewer than {HISTORY_MIN} recordings)"
    return centre, m, sigma, source


def centre_overhead_ms(baseline: Summary) -> float | None:
    """The sample overhead of the recordings behind the baseline's centre (the latest one with
    fewer than ``HISTORY_MIN`` recordings, else the median of all), None if one is missing."""
    floors = baseline.run_overheads_ms[-1:] if len(baseline.run_medians_ms) < HISTORY_MIN else baseline.run_overheads_ms
    known = [f for f in floors if f is not None]
    return statistics.median(known) if known and len(known) == len(floors) else None


def overhead_shift_ms(baseline: Summary, here_ms: float | None) -> tuple[float | None, str | None]:
    """``(shift, None)``: this machine's sample overhead ``here_ms`` less the floor behind the
    baseline's centre, to move the centre by; ``(None, why)`` when a floor is missing or the
    difference is implausible (beyond ``MAX_OVERHEAD_SHIFT_MS``, or moving the centre to zero or
    below): then the caller keeps the between-machines offset. ``why`` is None when simply
    unknown, else words for the run's summary."""
    recorded = centre_overhead_ms(baseline)
    if recorded is None or here_ms is None:
        return None, None
    shift = here_ms - recorded
    if abs(shift) > MAX_OVERHEAD_SHIFT_MS:
        return None, (f"sample overhead here {1e3 * here_ms:.2f} us, the recordings' {1e3 * recorded:.2f} us: "
                      f"more than {1e3 * MAX_OVERHEAD_SHIFT_MS:g} us apart, taken as measured wrong; the offset stands")
    if centre_ms(baseline) + shift <= 0:
        return None, (f"sample overhead here {1e3 * here_ms:.2f} us, the recordings' {1e3 * recorded:.2f} us: the "
                      "difference would empty a case's centre; the offset stands")
    return shift, None


def held_by(change: float, tolerance: float, overlap: bool, bar: float) -> str | None:
    """Why a change (a fraction, +0.10 = 10% slower) beyond ``tolerance`` is no regression or
    improvement: the 95% intervals of the medians overlap, it is within the run-to-run noise bar
    ``bar`` (a fraction), or both; None for a change within the tolerance, which needs no reason.
    Without it, ``+608% unchanged`` reads as a gate that did not look."""
    if abs(change) <= tolerance:
        return None
    beyond = f"{100 * change:+.1f}% is beyond the {100 * tolerance:.1f}% tolerance but"
    noise = f"within the noise bar of {100 * bar:.2f}%"
    if overlap and abs(change) <= bar:
        return f"{beyond} the 95% intervals overlap and it is {noise}"
    if overlap:
        return f"{beyond} the 95% intervals overlap"
    if abs(change) <= bar:
        return f"{beyond} {noise}"
    return None


def judge(
    current: Summary, baseline: Summary | None, tolerance: float, least_noise: float = 0.0,
    machine_noise: float = 0.0, machine_offset_ms: float = 0.0, machine_shift_ms: float | None = None,
    least_noise_ms: float = 0.0,
) -> Verdict:
    """Compare a measurement with its baseline; ``tolerance``, ``least_noise`` (the least
    run-to-run standard deviation assumed) and ``machine_noise`` are fractions (0.05 = 5%);
    ``least_noise_ms``, the least run-to-run standard deviation as a time (see ``run_noise``).

    ``machine_noise`` and ``machine_offset_ms`` are the standard deviations of a case's move
    between two machines (another GPU or boot: each shifts a case's median by its own
    amount) as a share of the case and as a fixed time per call, for a baseline whose
    recordings cannot show it, all being from one machine other than this run's. Together,
    ``machine = sqrt(machine_noise**2 + (machine_offset_ms / centre)**2)``, they add to the
    variance of the difference: ``bar = 3 * sqrt(sigma**2 * (1 + 1/m) + machine**2)``. The
    fixed part matters for short kernels only: 1 us is 11% of a 9 us kernel, 0.1% of a 1 ms one.

    ``machine_shift_ms`` is the part of that fixed move which is known: this machine's sample
    floor less the recordings' (the plugin measures a one-element add once a run and keeps it
    with each recording). The baseline's centre and interval are moved by it before comparing,
    so every figure in the verdict (the change, the bar) is against the moved centre, and
    ``machine_offset_ms`` is then what is left unexplained (``--attnperf-machine-residual``).
    A shift that would move the centre to zero or below is the caller's error (``ValueError``):
    the plugin keeps the offset instead of such a shift."""
    if baseline is None:
        return Verdict("new", None, f"no baseline; measured {current.describe()}")
    recorded, m, sigma, source = run_noise(baseline, least_noise, least_noise_ms)
    shift_ms = machine_shift_ms or 0.0
    centre = recorded + shift_ms
    if centre <= 0:
        raise ValueError(f"a shift of {machine_shift_ms!r} ms moves the centre {recorded!r} ms to {centre!r} ms")
    sigma *= max(1.0, recorded / centre)  # the recordings' spread, as a share of a smaller centre
    machine = math.hypot(machine_noise, machine_offset_ms / centre)
    if machine > 0:
        parts = f"{100 * machine_noise:.2f}% and {1e3 * machine_offset_ms:.2g} us; " if machine_offset_ms > 0 else ""
        source += f", plus {100 * machine:.2f}% between machines ({parts}no recording from this one)"
    ratio = current.median_ms / centre
    bar = 3.0 * math.sqrt(sigma**2 * (1.0 + 1.0 / m) + machine**2)
    few = min(current.n_samples, baseline.n_samples) < MIN_SAMPLES
    slower = ratio > 1.0 + tolerance
    faster = ratio < 1.0 / (1.0 + tolerance)
    if few:
        real_slower, real_faster, overlap = slower, faster, False
        test = (
            f"too few samples for the interval test (n={current.n_samples} now, "
            f"{baseline.n_samples} in the baseline, need {MIN_SAMPLES}): judged on the tolerance alone"
        )
    else:
        beyond_noise = abs(ratio - 1.0) > bar
        scale = recorded / baseline.median_ms  # the latest recording's interval, moved to the centre
        low, high = baseline.ci_low_ms * scale + shift_ms, baseline.ci_high_ms * scale + shift_ms
        real_slower = slower and current.ci_low_ms > high and beyond_noise
        real_faster = faster and current.ci_high_ms < low and beyond_noise
        overlap = current.ci_low_ms <= high and low <= current.ci_high_ms
        test = (f"95% intervals of the medians {'overlap' if overlap else 'do not overlap'}; "
                f"run-to-run noise {source}: {'beyond' if beyond_noise else 'within'} "
                f"its 3-sigma bar of {100 * bar:.2f}%")
    centre_note = f", centre {recorded:.4g} ms = median of {m} recordings" if m > 1 else ""
    if machine_shift_ms is not None:
        centre_note += (f"; centre moved {1e3 * shift_ms:+.2f} us to {centre:.4g} ms, this machine's sample overhead "
                        f"less the recordings' ({100 * (current.median_ms / recorded - 1):+.1f}% unmoved)")
    body = (
        f"{100 * (ratio - 1):+.1f}% against the baseline (tolerance {100 * tolerance:.1f}%; {test})\n"
        f"  baseline: {baseline.describe()}{centre_note}\n"
        f"  current:  {current.describe()}"
    )
    used = 0.0 if few else machine
    if real_slower:
        return Verdict("regressed", ratio, "REGRESSED " + body, used, machine_shift_ms)
    if real_faster:
        return Verdict("improved", ratio, "improved " + body, used, machine_shift_ms)
    held = None if few else held_by(ratio - 1.0, tolerance, overlap, bar)  # few: the tolerance alone decided
    return Verdict("unchanged", ratio, "unchanged " + body, used, machine_shift_ms, held)
