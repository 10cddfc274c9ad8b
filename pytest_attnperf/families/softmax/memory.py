"""The memory a tiled softmax-attention kernel may hold above its inputs (pure arithmetic).

A tiled kernel (flash, memory-efficient, cuDNN, flex) streams K/V tiles past each query tile and
keeps, per query row, a running maximum and sum: it writes the output and, for the backward, one
log-sum-exp per row, never the ``B x H x T x T`` scores. What it must hold, in bytes, with ``e``
the element size of the case's dtype and ``Tp`` the sequence rounded up to 128 (kernels pad rows
to their tile):

- forward: the output ``B*H*T*d*e``; row statistics ``2*B*H*Tp*4`` (log-sum-exp and one more
  per-row figure, fp32); for grouped K/V, K and V expanded to the query heads ``2*B*H*T*d*e``
  (what a kernel without native GQA does), over the cache's ``Tk`` keys in a decode case;
- forward and backward, also: the gradients ``(B*H + 2*B*Hkv)*T*d*e``; an fp32 dq accumulator
  ``B*H*Tp*d*4``; one more row statistic (``rowsum(dO * O)``) ``B*H*Tp*4``; for grouped K/V,
  per-query-head dk and dv before the group sum, fp32, ``2*B*H*Tp*d*4``.

The bound is ``SLACK`` times their sum plus ``FIXED_MIB`` (docs/memory.md, "The analytic bound").
The scores alone are ``T / d`` times the output (16 times at T=1024, d=64), so a kernel that
materialises them is over the bound once they outweigh the slack and the fixed part.
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
