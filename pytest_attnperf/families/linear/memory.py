"""The memory a chunked (or fused recurrent) linear-attention kernel may hold above its inputs
(pure arithmetic).

A chunk kernel cuts the sequence into chunks of ``C`` tokens (fla's 64): within a chunk it
multiplies dense ``C x C`` tiles; between chunks it carries one ``K x V`` state per batch entry and
head, and keeps the state at each chunk's start for its backward. Per case, with
``N = B*T*H`` tokens over all heads, ``W = max(K, V)``, ``Tc = ceil(T / C)`` chunks, ``e`` the
element size of the dtype and fp32 (4 bytes) for what fla keeps in fp32:

- forward: the output ``N*V*e``; per-token intermediates (the gate's cumulative sum, the delta
  rule's ``w`` and ``u``, its corrected values) ``4*N*W*4``; intra-chunk matrices (``C`` per
  token: scores, the delta rule's triangular inverse) ``2*N*C*4``; chunk states
  ``B*H*Tc*K*V*4``;
- forward and backward, also: the gradients of every input ``4*N*W*4``; the backward's
  per-token intermediates ``8*N*W*4``; its intra-chunk matrices ``4*N*C*4``; the chunk states
  recomputed and their gradients ``2*B*H*Tc*K*V*4``.

With grouped values (GDN's ``key_heads`` under ``H`` value heads) every term counts value heads:
fla's kernels keep their intermediates per value head, and its backward writes ``dq`` and ``dk`` per
value head before summing each group onto its key head; the fewer queries and keys are inputs.

That is ``O(B*H*T*W)`` plus ``O(B*H*(T/C)*K*V)``: what a kernel needs that keeps neither a state
per token (``B*H*T*K*V``, ``C`` times the chunk states: a torch loop under autograd) nor the
``T x T`` scores (the parallel form). A recurrent kernel fused over the sequence needs less. The
bound is ``SLACK`` times their sum plus ``FIXED_MIB`` (docs/memory.md, "Linear families").
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
