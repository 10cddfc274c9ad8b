"""The memory a chunked (or fused recurrent) linear-attention kernel may hold above its inputs
(pure arithmetic).

A chunk kernel of ``C`` tokens (fla's 64) holds its output, per-token intermediates, intra-chunk
matrices and one ``K x V`` state per chunk (and, backward, their gradients and recomputations):
``O(B*H*T*W)`` plus ``O(B*H*(T/C)*K*V)``, every term counting value heads; the bound is ``SLACK``
times their sum plus ``FIXED_MIB``. The terms: docs/memory.md, "Linear families".
"""

from __future__ import annotations

import math

from pytest_attnperf.costs import DTYPE_BYTES
from pytest_attnperf.families.linear.case import LinearCase
from pytest_attnperf.gate.memory import MIB, Bound

__all__ = ["CHUNK", "FIXED_MIB", "SLACK", "memory_bound"]

CHUNK = 64  # fla's chunk length
SLACK = 2.0
FIXED_MIB = 16.0
FP32 = 4


def memory_bound(case: LinearCase, direction: str) -> Bound:
    """The most a chunked kernel may hold above the inputs of ``case`` (``fwd`` or ``fwdbwd``)."""
    tokens = case.batch * case.seq * case.heads  # value heads, also where the queries and keys have fewer
    wide, e = max(case.key_dim, case.value_dim), DTYPE_BYTES[case.dtype]
    states = case.batch * case.heads * math.ceil(case.seq / CHUNK) * case.key_dim * case.value_dim * FP32
    terms: list[tuple[str, float]] = [
        ("output", tokens * case.value_dim * e),
        ("per-token intermediates", 4 * tokens * wide * FP32),
        ("intra-chunk matrices", 2 * tokens * CHUNK * FP32),
        ("chunk states", states),
    ]
    if direction == "fwdbwd":
        terms += [
            ("gradients", 4 * tokens * wide * FP32),
            ("backward per-token intermediates", 8 * tokens * wide * FP32),
            ("backward intra-chunk matrices", 4 * tokens * CHUNK * FP32),
            ("chunk states recomputed and their gradients", 2 * states),
        ]
    return Bound(tuple(terms), SLACK, FIXED_MIB * MIB)
