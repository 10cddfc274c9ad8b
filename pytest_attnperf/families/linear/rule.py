"""The linear families' correctness rule: a normwise bound in unit roundoffs against the fp64
reference, then an elementwise bound against the yardstick (``checks.assert_elementwise``); the
rule, its factors and their evidence: docs/checks.md, "The normwise bound of the linear families"
and "Factors".
"""

from __future__ import annotations

from typing import Any

from pytest_attnperf.families.checks import UNIT_ROUNDOFF as ROUNDOFF
from pytest_attnperf.families.checks import CheckFailed, assert_elementwise, assert_finite, assert_reaches

__all__ = [
    "FAMILY_OUT_FACTOR", "GRAD_FACTOR", "GRAD_UNITS", "OUT_FACTOR", "OUT_UNITS", "UNIT_ROUNDOFF", "YARDSTICK_NORMWISE",
    "assert_checked", "assert_elements", "assert_normwise", "axes_of", "check_elements", "check_tensor", "factors",
]

# an fp32 case is held to TF32's: fla's Triton kernels read fp32 tiles as TF32 (``checks.UNIT_ROUNDOFF``)
UNIT_ROUNDOFF = {dtype: ROUNDOFF["tf32" if dtype == "fp32" else dtype] for dtype in ("bf16", "fp16", "fp32")}
OUT_UNITS, GRAD_UNITS = 2.0, 4.0
OUT_FACTOR, GRAD_FACTOR = 16.0, 32.0  # elementwise: see assert_checked and docs/checks.md
# a gate's gradient: its normwise bound is at least this many times the yardstick's own normwise
# error. Under strong decays (exp(-20) a token) dg is of order exp(g) while the chunk and recurrent
# backwards form it from O(1) terms that cancel: an fp32 chunk form keeps no digit of it (normwise
# error about 1.0 against fp64, absolute 1e-10 of the other gradients), nor does fla's fused
# recurrent GLA (2.5e3); autograd through exp(g) S keeps it (docs/catalogue.md)
YARDSTICK_NORMWISE = 2.0
# GDN's outputs: set from what fla's GDN forwards needed on the suite's GPU shapes (docs/checks.md, "Factors")
FAMILY_OUT_FACTOR = {"gdn": 12.0}


def _normwise(value: Any, reference: Any) -> float:
    ref = reference.double()
    return float((value.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def assert_normwise(name: str, value: Any, reference: Any, dtype: str, units: float, axes: str | None = None,
                    yardstick: Any = None) -> float:
    """Fail unless finite and ``|value - ref| / |ref| <= units * u(dtype)``, or (a ``yardstick``
    given: a gate's gradient) ``YARDSTICK_NORMWISE`` times the yardstick's own normwise error where
    that is larger; returns the error."""
    assert_finite(name, value, axes)
    if tuple(value.shape) != tuple(reference.shape):
        raise CheckFailed(f"{name}: shape {tuple(value.shape)}, reference {tuple(reference.shape)}")
    error = _normwise(value, reference)
    allowed = units * UNIT_ROUNDOFF[dtype]
    own = _normwise(yardstick, reference) if yardstick is not None else 0.0
    if YARDSTICK_NORMWISE * own > allowed:
        allowed = YARDSTICK_NORMWISE * own
        why = f"{YARDSTICK_NORMWISE:g} x the yardstick's own normwise error {own:.3g}"
    else:
        why = f"{units:g} x the {dtype} unit roundoff {UNIT_ROUNDOFF[dtype]:.3g}"
    if not error <= allowed:
        raise CheckFailed(f"{name}: normwise relative error {error:.3g} against fp64 exceeds {allowed:.3g} (= {why})",
                          error / allowed)
    return error


def axes_of(name: str, ndim: int) -> str:
    """The axis letters of a tensor of the families' layout: ``b t h d`` (a GLA gate's last is ``k``,
    a state, ``h0``, ``ht`` or ``dh0``, is ``b h k v``)."""
    if name in ("h0", "ht", "dh0") and ndim == 4:
        return "b h k v"
    return {4: "b t h k" if name in ("g", "dg") else "b t h d", 3: "b t h"}.get(ndim, "")


def assert_checked(name: str, value: Any, reference: Any, yardstick: Any, dtype: str, units: float,
                   factor: float, tensor: str = "out") -> float:
    """Finite, then the normwise bound (``units`` unit roundoffs), then every element within
    ``factor`` times the yardstick's error near it and its RMS error, plus the rounding of the
    element itself (``assert_elements``); returns the worse of the two errors over its bound.
    ``tensor`` (``out``, ``dq``, ``dg``...) names the axes."""
    error = assert_normwise(name, value, reference, dtype, units, axes_of(tensor, value.ndim), yardstick)
    worst = assert_elements(name, value, reference, yardstick, dtype, factor, tensor)
    return max(error / (units * UNIT_ROUNDOFF[dtype]), worst)


def assert_elements(name: str, value: Any, reference: Any, yardstick: Any, dtype: str, factor: float,
                    tensor: str = "out") -> float:
    """``checks.assert_elementwise`` in the families' layout: a per-token tensor ``[B, T, H]`` (a
    scalar gate, beta) smooths the yardstick's error along time, the others along the channels.
    Returns the worst element's error over its bound."""
    return assert_elementwise(name, value, reference, yardstick, dtype=dtype, unit=UNIT_ROUNDOFF[dtype],
                              factor=factor, yardstick_name="the yardstick's", axes=axes_of(tensor, value.ndim),
                              axis=1 if value.ndim == 3 else -1).worst_ratio


def factors(family: str, name: str) -> tuple[float, float]:
    """The normwise units and the elementwise factor of an output (``out``, and the final state
    ``ht``: formed by the same forward products) or a gradient."""
    if name in ("out", "ht"):
        return OUT_UNITS, FAMILY_OUT_FACTOR.get(family, OUT_FACTOR)
    return GRAD_UNITS, GRAD_FACTOR


def check_tensor(family: str, label: str, name: str, value: Any, reference: Any, yardstick: Any, dtype: str) -> float:
    """The family's rule for one output (``out``) or gradient (``dq``, ``dg``...): a gradient
    reaches its input, then ``assert_checked`` with the output's or the gradients' units and
    factor. Returns the worst error over its bound (at most 1: it raises ``CheckFailed`` above)."""
    # a gate's gradient that its own yardstick gets no digit of (strong decays): zero is as near as any
    lost = name == "dg" and _normwise(yardstick, reference) >= 1.0 / YARDSTICK_NORMWISE
    if name not in ("out", "ht") and not lost:
        assert_reaches(label, value, reference)
    units, factor = factors(family, name)
    return assert_checked(label, value, reference, yardstick, dtype, units, factor, tensor=name)


def check_elements(family: str, label: str, name: str, value: Any, reference: Any, yardstick: Any,
                   dtype: str) -> float:
    """The elementwise part of ``check_tensor`` alone; returns the worst element's error over its bound."""
    return assert_elements(label, value, reference, yardstick, dtype, factors(family, name)[1], name)
