"""Impossible speeds: a case faster than the machine's ceilings allow. Pure.

A call takes at least the roofline time ``max(flops / peak, bytes / bandwidth)``; a median below
it by more than ``TOLERANCE`` is a wrong cost model or timer, not a fast kernel, and is refused
(the test fails, ``--update-baselines`` writes no entry). An unknown ceiling is left out of the
roofline time; with neither known the check does not run (``not_run``) and says why.
docs/roofline.md, "Impossible speeds".
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_attnperf.gate.roofline import Ceiling

__all__ = ["TOLERANCE", "PhysicsCheck", "above_measured", "judge", "not_run", "roofline_seconds"]

# How far above its ceilings a case may read before it is refused: the ceilings are medians
# that move between runs by a few percent (the power cap, the clock), and the case's median by its
# own noise (three standard deviations of the gate's least run-to-run noise are 1.5%); beyond 5%
# the figure is a bug, not noise. The evidence: docs/roofline.md, "Impossible speeds".
TOLERANCE = 0.05
_SOURCES = {"measured": "measured", "spec": "vendor spec", "user": "--attnperf-peaks"}


@dataclass(frozen=True)
class PhysicsCheck:
    """A case's figures against the ceilings: ``status`` is 'possible', 'impossible' (the test
    fails with ``message``) or 'not run' (``message`` says why); ``fraction`` is the roofline
    time over the median (None when not run)."""

    status: str
    fraction: float | None = None
    message: str = ""

    @property
    def failed(self) -> bool:
        """Whether the case's speed is impossible, which fails the test."""
        return self.status == "impossible"


def roofline_seconds(flops: float, bytes_moved: float, peak: Ceiling | None, bandwidth: Ceiling | None) -> float | None:
    """The least time a call can take: ``max(flops / peak, bytes / bandwidth)`` over the
    ceilings known (FLOP/s and bytes/s); None with neither."""
    times = [work / ceiling.value for work, ceiling in ((flops, peak), (bytes_moved, bandwidth)) if ceiling]
    return max(times) if times else None


def not_run(reason: str) -> PhysicsCheck:
    """The check could not be made, for ``reason``."""
    return PhysicsCheck("not run", None, f"impossible-speed check not run: {reason}")


def judge(flops: float, bytes_moved: float, seconds: float, dtype: str, peak: Ceiling | None,
          bandwidth: Ceiling | None, tolerance: float = TOLERANCE) -> PhysicsCheck:
    """Refuse a median of ``seconds`` that is under the roofline time by more than
    ``tolerance``: ``roofline_seconds / seconds > 1 + tolerance``. ``peak`` is the ``dtype``
    matmul ceiling (FLOP/s), ``bandwidth`` the copy ceiling (bytes/s)."""
    if seconds <= 0:
        raise ValueError(f"a call cannot take {seconds} s")
    least = roofline_seconds(flops, bytes_moved, peak, bandwidth)
    if least is None:
        return not_run(f"no {dtype} matmul ceiling and no copy bandwidth known")
    fraction = least / seconds
    if fraction <= 1 + tolerance:
        return PhysicsCheck("possible", fraction)
    return PhysicsCheck("impossible", fraction, _message(flops, bytes_moved, seconds, dtype, peak, bandwidth,
                                                         least, fraction, tolerance))


def _message(flops: float, bytes_moved: float, seconds: float, dtype: str, peak: Ceiling | None,
             bandwidth: Ceiling | None, least: float, fraction: float, tolerance: float) -> str:
    """What was achieved against which ceiling, the cost model's counts and the times."""
    lines = [f"IMPOSSIBLE SPEED: the cost model or the timer is wrong: {100 * fraction:.1f}% of the roofline, "
             f"above the {100 * (1 + tolerance):.0f}% the ceilings' noise allows (physics.TOLERANCE)"]
    if peak is not None:
        lines.append(f"  compute: achieved {flops / seconds / 1e12:.2f} TFLOP/s against the {dtype} matmul "
                     f"{_named(peak)} {peak.value / 1e12:.1f} TFLOP/s ({_SOURCES.get(peak.source, peak.source)}): "
                     f"{100 * flops / seconds / peak.value:.1f}%")
    if bandwidth is not None:
        which = "copy bandwidth" if bandwidth.source == "measured" else "memory bandwidth"
        lines.append(f"  memory: achieved {bytes_moved / seconds / 1e9:.1f} GB/s against the {which} "
                     f"{_named(bandwidth)} {bandwidth.value / 1e9:.1f} GB/s "
                     f"({_SOURCES.get(bandwidth.source, bandwidth.source)}): "
                     f"{100 * bytes_moved / seconds / bandwidth.value:.1f}%")
    lines.append(f"  cost model: {flops:.6g} FLOP, {bytes_moved:.6g} bytes; the roofline time is {1e3 * least:.4g} ms, "
                 f"the median {1e3 * seconds:.4g} ms")
    lines.append("  a FLOP or byte count above the kernel's work, or a timer that misses work (a cached answer, "
                 "work left running after the timed call), reads so; if the ceiling is wrong, give --attnperf-peaks")
    return "\n".join(lines)


def above_measured(mfu: float | None, bandwidth_frac: float | None, peak: Ceiling | None,
                   bandwidth: Ceiling | None, dtype: str) -> tuple[str, ...]:
    """A note for each of MFU and bandwidth % above 100% of a *measured* ceiling (the figures they
    are taken against where no vendor's or user's is known: the CPU's): no kernel beats the
    machine, so the figure is impossible, whether the ceiling was measured low (a busy host) or
    the cost model or timer is wrong. Named wherever the impossible-speed check itself does not
    run (the CPU) or passes."""
    found = []
    for name, frac, ceiling, unit, what in (("MFU", mfu, peak, 1e12, f"{dtype} matmul ceiling"),
                                            ("bandwidth", bandwidth_frac, bandwidth, 1e9, "copy bandwidth")):
        if frac is None or ceiling is None or ceiling.source != "measured" or frac <= 1.0:
            continue
        figure = f"{ceiling.value / unit:.3g} {'TFLOP/s' if unit == 1e12 else 'GB/s'}"
        found.append(f"IMPOSSIBLE {name} {100 * frac:.1f}%: above 100% of the measured {what} ({figure}); the "
                     "ceiling was measured low (a busy host: --attnperf-ceilings=measure on an idle one) or the cost "
                     "model or the timer is wrong")
    return tuple(found)


def _named(ceiling: Ceiling) -> str:
    """'ceiling' for a measured figure, 'peak' for a vendor's or the user's (docs/glossary.md)."""
    return "ceiling" if ceiling.source == "measured" else "peak"
