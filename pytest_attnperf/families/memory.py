"""Each family's analytic memory bound for a case: which bound applies to a kernel, if any.

A kernel registered as tiled (``Kernel.tiled``, the default) of a family with a bound is held to
it; a kernel registered with ``tiled=False`` (it materialises the scores, or a state per step, on
purpose), a family without a bound, and a case of a type its family does not know, are not.
"""

from __future__ import annotations

from typing import Any

from pytest_attnperf.families.family import FAMILIES
from pytest_attnperf.gate.memory import Bound

__all__ = ["bound_for"]

DIRECTIONS = ("fwd", "fwdbwd")


def bound_for(kernel: Any, case: Any, direction: Any) -> Bound | None:
    """The bound ``kernel`` is held to on ``case`` in ``direction`` (a test's ``kernel``,
    ``case`` and ``direction`` parameters), or None: its family's (``Family.memory_bound``)."""
    if not getattr(kernel, "tiled", False) or direction not in DIRECTIONS:
        return None
    fam = FAMILIES.get(getattr(kernel, "family", None) or "")
    return fam.memory_bound(case, direction) if fam is not None else None
