"""The memory a tiled softmax-attention kernel may hold above its inputs (pure arithmetic).

A tiled kernel (flash, memory-efficient, cuDNN, flex) keeps, per query row, a running maximum and
sum, never the ``B x H x T x T`` scores: its output, row statistics, K/V expanded for grouped
heads and, backward, the gradients and fp32 accumulators. The bound is ``SLACK`` times their sum
plus ``FIXED_MIB``; the terms and what the bound catches: docs/memory.md, "The analytic bound"
and "Softmax".
"""

from __future__ import annotations

import math
from typing import Any

from pytest_attnperf.costs import DTYPE_BYTES
from pytest_attnperf.families.softmax.kernels import SoftmaxCase
from pytest_attnperf.gate.memory import MIB, Bound

__all__ = ["FIXED_MIB", "ROW_PAD", "SLACK", "memory_bound", "scores_gb"]

SLACK = 2.0  # a kernel may keep twice what the algorithm needs (staging copies, padding to its tiles)
FIXED_MIB = 16.0  # library workspaces (cuDNN's, the RNG state) and the allocator's rounding
ROW_PAD = 128  # rows padded to the largest query tile a kernel uses
FP32 = 4


def memory_bound(case: SoftmaxCase, direction: str) -> Bound:
    """The most a tiled kernel may hold above the inputs of ``case`` (``fwd`` or ``fwdbwd``)."""
    b, h, kv, t, d = case.batch, case.heads, case.n_kv_heads, case.seq, case.head_dim
    e, rows = DTYPE_BYTES[case.dtype], b * h * math.ceil(t / ROW_PAD) * ROW_PAD
    grouped, backward = kv != h, direction == "fwdbwd"
    terms: list[tuple[str, float]] = [("output", b * h * t * d * e),
                                      ("row statistics", (3 if backward else 2) * rows * FP32)]
    if grouped:  # over the whole cache where the keys outnumber the queries (decode)
        terms.append(("K/V expanded to the query heads", 2 * b * h * case.n_kv_seq * d * e))
    if backward:
        terms += [("gradients", (b * h + 2 * b * kv) * t * d * e), ("fp32 dq accumulator", rows * d * FP32)]
        if grouped:
            terms.append(("per-query-head fp32 dk, dv", 2 * rows * d * FP32))
    return Bound(tuple(terms), SLACK, FIXED_MIB * MIB)


def scores_gb(case: Any, dtype: str, copies: float = 1.0) -> float:
    """GB that ``copies`` of ``case``'s T x T scores in ``dtype`` take (every batch entry and query
    head): the one estimate of what holding the scores costs, for a reference or a kernel."""
    keys = getattr(case, "n_kv_seq", case.seq)
    return float(copies * DTYPE_BYTES[dtype] * case.batch * case.heads * case.seq * keys / 1e9)
