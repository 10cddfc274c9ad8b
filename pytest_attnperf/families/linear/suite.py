"""Linear attention from flash-linear-attention: LA, GLA, simple GLA and Gated DeltaNet,
forward and forward+backward, each kernel against our fp64 recurrence.

The GPU table times linear attention at B=4 H=16 D=128 against T from 1K to 16K and D=64 at
T=4096, and at a model-ladder head (hidden 512 = 8 heads x 64, B=32 T=1024), in bf16; that head
again at B=2 in fp16 and fp32, and GDN's grouped values (8 value heads over 4 key heads) in fp16. The built-in
kernels come from flash-linear-attention (``pip install pytest-attnperf[linear]``); without it
each of their cases is skipped with that hint, and a project's own kernels still run. A row with
``key_heads`` (GDN's grouped values: fewer query/key heads than value heads) is removed for the
other families at collection.
"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_attnperf.families.checks import reported_plainly
from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear.case import LinearCase
from pytest_attnperf.families.registry import Kernel

__all__ = ["ATTNPERF_CASES", "ATTNPERF_FAMILY", "CASES", "FAMILY", "fla_missing", "test_linear"]

FAMILY = linear.FAMILIES

# fla autotunes each Triton kernel once per (heads, key dim, value dim, chunk): every new head
# shape costs minutes of compiling on a fresh machine, while a longer sequence costs nothing
# extra. Rows in priority order; a D=256 point and a hidden-1024 head (H=8, D=128) are left to
# users who need them (add a LinearCase row).
GPU = (
    # sequence scaling, B=4 H=16 D=128
    LinearCase("b4-h16-t1024-d128-bf16", 4, 16, 1024, 128, 128, "bf16"),
    LinearCase("b4-h16-t4096-d128-bf16", 4, 16, 4096, 128, 128, "bf16"),
    # model-ladder head, hidden 512 = 8 heads x 64, B=32 T=1024
    LinearCase("ladder-h512-b32-h8-t1024-d64-bf16", 32, 8, 1024, 64, 64, "bf16"),
    # a length that is not a multiple of the chunk size: the tail-chunk path
    LinearCase("b2-h16-t1000-d128-bf16", 2, 16, 1000, 128, 128, "bf16"),
    # GDN with negative eigenvalues allowed: beta in (0, 2)
    LinearCase("b4-h16-t1024-d128-beta2-bf16", 4, 16, 1024, 128, 128, "bf16", beta_max=2.0),
    # the long end of sequence scaling, and head dim 64 at T=4096
    LinearCase("b4-h16-t16384-d128-bf16", 4, 16, 16384, 128, 128, "bf16"),
    LinearCase("b4-h16-t4096-d64-bf16", 4, 16, 4096, 64, 64, "bf16"),
    # the higher precisions, at the ladder's head (8 heads x 64), two sequences: in bf16 a 1% error
    # is one or two ulps, as large as a correct kernel's rounding, so a gradient 1% off on one head,
    # or 0.1% of the outputs 1% off, passes every bf16 row; fp16 (1% is 10-20 ulps) catches them,
    # fp32 (held to TF32) the denser ones (docs/checks.md, "Power"). Then GDN's grouped values on
    # the GPU: 8 value heads over 4 query/key heads. Opt-in (--attnperf-opt-in=precision): each new
    # dtype makes fla autotune every kernel again (recording them took about 1,400 s on an
    # H200); the H200's choices are recorded (docs/evidence.md, "Recording the precision rows")
    LinearCase("b2-h8-t1024-d64-fp16", 2, 8, 1024, 64, 64, "fp16", opt_in="precision"),
    LinearCase("b2-h8-t1024-d64-fp32", 2, 8, 1024, 64, 64, "fp32", opt_in="precision"),
    LinearCase("b2-h8-hk4-t1024-d64-fp16", 2, 8, 1024, 64, 64, "fp16", key_heads=4, opt_in="precision"),
)

CPU = (
    LinearCase("cpu-b2-h2-t33-d16-fp32", 2, 2, 33, 16, 32, "fp32", gpu=False),
    # a chunk of 64 and a tail of 36: what a chunk kernel carries from one chunk to the next
    LinearCase("cpu-b2-h2-t100-d16-fp32", 2, 2, 100, 16, 16, "fp32", gpu=False),
    LinearCase("cpu-b1-h4-t64-d32-beta2-fp32", 1, 4, 64, 32, 32, "fp32", beta_max=2.0, gpu=False),
    # GDN's grouped values: 4 value heads over 2 query/key heads, a chunk and a tail of 6 tokens
    LinearCase("cpu-b2-h4-hk2-t70-d16-fp32", 2, 4, 70, 16, 16, "fp32", gpu=False, key_heads=2),
)

CASES = GPU + CPU

ATTNPERF_FAMILY, ATTNPERF_CASES = FAMILY, CASES  # what the plugin parametrizes

INSTALL_HINT = "pip install pytest-attnperf[linear]"


def fla_missing() -> str | None:
    """Why flash-linear-attention cannot be imported (None when it can)."""
    try:
        import fla  # noqa: F401, PLC0415 - whether it imports at all: seconds, and optional
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def test_linear(
    case: LinearCase, kernel: Kernel, direction: str, attnperf_device: Any, attnperf_seed: int, attnperf: Any,
    request: pytest.FixtureRequest,
) -> None:
    """Output and gradients against our fp64 recurrence, then device time against the baseline."""
    if kernel.fn.__module__ == linear.__name__ and (why := fla_missing()):  # a built-in, from fla
        pytest.skip(f"{kernel.name} needs flash-linear-attention ({why}): {INSTALL_HINT}")
    with reported_plainly(attnperf_seed):  # a wrong answer fails with its message alone
        checked = linear.check_case(kernel.family, kernel, case, direction, attnperf_device, seed=attnperf_seed)
    for name, ratio in checked.properties():  # each tensor's error over its bound: the margin
        request.node.user_properties.append((name, ratio))
    timed = checked.call
    cost = linear.cost(kernel.family, kernel, case, direction)
    attnperf.measure(timed, cost=cost, dtype=case.dtype)  # gates the time; fails on a regression
