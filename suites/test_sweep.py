"""Sequence-length sweeps of softmax and linear attention at one shared shape, for the studies.

GPU: B=4 H=16 head dim 128 bf16 causal, T from 512 to 16384, forward and forward+backward: the
fastest SDPA backends (cuDNN, flash), the math backend (T x T scores in memory, capped below)
and fla's chunk kernels of LA, GLA, simple GLA and GDN. CPU: B=2 H=2 head dim 32 fp32, T from 32
to 128 (the fewest points and the least span a fit takes): the naive softmax, SDPA math and fla's
naive recurrences, so the report is produced on any machine. Each point is an ordinary gated
case; ``--attnperf-report=DIR`` fits exponents and finds crossovers over them (docs/reports.md).

fla 0.6 autotunes its chunk kernels on keys of heads, key and value width and chunk size (and
batch, for the gate cumsum), not on T: the whole GPU sweep shares the B=4 H=16 D=128 tunings of
the linear suite, and a longer sequence compiles nothing new.
"""

from __future__ import annotations

import dataclasses

import pytest

from pytest_attnperf import costs
from pytest_attnperf.families import parametrize as suite
from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear.kernels import LinearCase
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import sliced
from pytest_attnperf.families.softmax.kernels import SoftmaxCase
from pytest_attnperf.session import get_session

pytestmark = pytest.mark.attnperf_sweep("seq-b{batch}-h{heads}-{dtype}", axis="seq")

GPU_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
CPU_SEQS = (32, 64, 128)

SOFTMAX = tuple(SoftmaxCase(f"b4-h16-t{t}-d128-causal-bf16", 4, 16, t, 128, "bf16", True) for t in GPU_SEQS) + tuple(
    SoftmaxCase(f"cpu-b2-h2-t{t}-d32-causal-fp32", 2, 2, t, 32, "fp32", True, gpu=False) for t in CPU_SEQS)
LINEAR = tuple(LinearCase(f"b4-h16-t{t}-d128-bf16", 4, 16, t, 128, 128, "bf16") for t in GPU_SEQS) + tuple(
    LinearCase(f"cpu-b2-h2-t{t}-d32-fp32", 2, 2, t, 32, 32, "fp32", gpu=False) for t in CPU_SEQS)

GPU_SOFTMAX, CPU_SOFTMAX = ("sdpa-cudnn", "sdpa-flash"), ("naive",)
GPU_LINEAR, CPU_LINEAR = ("fla-chunk",), ("fla-naive",)

# The math backend holds fp32 T x T scores (it computes bf16 in fp32) and, forward+backward, about
# five such tensors at once: B=4 H=16 T=8192 is 86 GB by that count, beyond a share of a 141 GB card.
MATH_MAX_GB = 40.0
MATH_SCORE_COPIES = 5


def math_gb(case: SoftmaxCase) -> float:
    """The math backend's estimated peak: ``MATH_SCORE_COPIES`` fp32 score tensors."""
    return MATH_SCORE_COPIES * 4.0 * case.batch * case.heads * case.seq**2 / 1e9


def _math_capped(kernel: Kernel) -> Kernel:
    def supports(case: SoftmaxCase) -> str | None:
        if math_gb(case) > MATH_MAX_GB:
            return (f"materialises fp32 T x T scores: about {math_gb(case):.0f} GB at T={case.seq} "
                    f"(the sweep caps it at {MATH_MAX_GB:g} GB)")
        return kernel.supports(case)

    return dataclasses.replace(kernel, supports=supports)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    session = get_session(metafunc.config)
    gpu = session.device.is_gpu
    if metafunc.function.__name__ == "test_sweep_softmax":
        math = next(k for k in session.registry.family("softmax") if k.name == "sdpa-math")
        chosen = GPU_SOFTMAX if gpu else CPU_SOFTMAX
        suite.parametrize(metafunc, "softmax", SOFTMAX, kernels=(*chosen, _math_capped(math)))
    elif metafunc.function.__name__ == "test_sweep_linear":
        suite.parametrize(metafunc, linear.FAMILIES, LINEAR, kernels=GPU_LINEAR if gpu else CPU_LINEAR)


def test_sweep_softmax(case, kernel, direction, attnperf_device, attnperf):
    """Output and gradients on two (batch, head) pairs against fp64, then device time."""
    timed = sliced.run_softmax(kernel, case, direction, attnperf_device)
    cost = costs.softmax_attention(batch=case.batch, heads=case.heads, seq=case.seq, head_dim=case.head_dim,
                                   dtype=case.dtype, causal=case.causal, backward=direction == "fwdbwd")
    attnperf.measure(timed, cost=cost, dtype=case.dtype, detect_backend=kernel.sdpa_backend is None)


def test_sweep_linear(case, kernel, direction, attnperf_device, attnperf):
    """Output and gradients against our fp64 recurrence, then device time."""
    timed = linear.run_case(kernel.family, kernel, case, direction, attnperf_device)
    attnperf.measure(timed, cost=linear.cost(kernel.family, kernel, case, direction), dtype=case.dtype)
