"""Softmax attention: naive, every SDPA backend, GQA and sliding window; fwd and fwd+bwd.

The GPU table covers model-ladder attention (B=32 T=1024 d=64, H in 8, 12, 16), sequence
scaling (B=1 H=12 d=64, T from 256 to 2048), the small-sequence regime (B=1000 H=80 T<=48),
GQA and sliding windows; the CPU table holds shapes a CPU finishes in milliseconds.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_attnperf import costs
from pytest_attnperf.families.checks import reported_plainly
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax.kernels import SoftmaxCase, check_case

__all__ = ["ATTNPERF_CASES", "ATTNPERF_FAMILY", "CASES", "FAMILY", "test_softmax"]

FAMILY = "softmax"

CASES = (
    # model-ladder attention, causal bf16
    SoftmaxCase("b32-h8-t1024-d64-causal-bf16", 32, 8, 1024, 64, "bf16", True),
    SoftmaxCase("b32-h12-t1024-d64-causal-bf16", 32, 12, 1024, 64, "bf16", True),
    SoftmaxCase("b32-h16-t1024-d64-causal-bf16", 32, 16, 1024, 64, "bf16", True),
    # sequence scaling, causal bf16
    SoftmaxCase("b1-h12-t256-d64-causal-bf16", 1, 12, 256, 64, "bf16", True),
    SoftmaxCase("b1-h12-t512-d64-causal-bf16", 1, 12, 512, 64, "bf16", True),
    SoftmaxCase("b1-h12-t1024-d64-causal-bf16", 1, 12, 1024, 64, "bf16", True),
    SoftmaxCase("b1-h12-t2048-d64-causal-bf16", 1, 12, 2048, 64, "bf16", True),
    # small sequences, many heads, non-causal fp16
    SoftmaxCase("b1000-h80-t32-d64-fp16", 1000, 80, 32, 64, "fp16", False),
    SoftmaxCase("b1000-h80-t48-d64-fp16", 1000, 80, 48, 64, "fp16", False),
    # dtype coverage at one mid-size shape
    SoftmaxCase("b2-h8-t512-d64-fp16", 2, 8, 512, 64, "fp16", False),
    SoftmaxCase("b2-h8-t512-d64-causal-fp32", 2, 8, 512, 64, "fp32", True),
    # GQA, 12 query heads over 3 K/V heads (group 4), and group 8
    SoftmaxCase("b2-h12-kv3-t1024-d64-causal-bf16", 2, 12, 1024, 64, "bf16", True, kv_heads=3),
    SoftmaxCase("b2-h16-kv2-t1024-d64-causal-bf16", 2, 16, 1024, 64, "bf16", True, kv_heads=2),
    # sliding window 128 (and 512), cost counted over the visible keys only
    SoftmaxCase("b1-h12-t2048-d64-w128-bf16", 1, 12, 2048, 64, "bf16", True, window=128),
    SoftmaxCase("b1-h12-t4096-d64-w512-bf16", 1, 12, 4096, 64, "bf16", True, window=512),
    # the CPU table: shapes a CPU finishes in milliseconds, same code paths
    SoftmaxCase("cpu-b2-h4-t128-d32-causal-fp32", 2, 4, 128, 32, "fp32", True, gpu=False),
    SoftmaxCase("cpu-b2-h4-t128-d32-bf16", 2, 4, 128, 32, "bf16", False, gpu=False),
    SoftmaxCase("cpu-b16-h8-t32-d64-fp32", 16, 8, 32, 64, "fp32", False, gpu=False),
    SoftmaxCase("cpu-b2-h12-kv3-t64-d32-causal-fp32", 2, 12, 64, 32, "fp32", True, kv_heads=3, gpu=False),
    SoftmaxCase("cpu-b1-h4-t256-d32-w32-fp32", 1, 4, 256, 32, "fp32", True, window=32, gpu=False),
    # fp16, causal, and a length no block of 32 or 64 divides: a kernel's last partial block
    SoftmaxCase("cpu-b2-h4-t200-d32-causal-fp16", 2, 4, 200, 32, "fp16", True, gpu=False),
)

ATTNPERF_FAMILY, ATTNPERF_CASES = FAMILY, CASES  # what the plugin parametrizes


def test_softmax(
    case: SoftmaxCase, kernel: Kernel, direction: str, attnperf_device: Any, attnperf_seed: int, attnperf: Any,
    request: pytest.FixtureRequest,
) -> None:
    """Output (and gradients for fwdbwd) against fp64, then device time against the baseline."""
    with reported_plainly(attnperf_seed):  # a wrong answer fails with its message alone
        checked = check_case(kernel, case, direction, attnperf_device, seed=attnperf_seed)
    for name, ratio in checked.properties():  # each tensor's error over its bound: the margin
        request.node.user_properties.append((name, ratio))
    timed = checked.call
    cost = costs.softmax_attention(
        batch=case.batch, heads=case.heads, kv_heads=case.kv_heads, seq=case.seq,
        head_dim=case.head_dim, dtype=case.dtype, causal=case.causal, window=case.window,
        backward=direction == "fwdbwd", kv_seq=case.kv_seq,
    )
    attnperf.measure(timed, cost=cost, dtype=case.dtype, detect_backend=kernel.sdpa_backend is None)
