"""Softmax attention checked on a slice: for shapes whose whole fp64 reference does not fit.

At B=4 H=16 T=16384 the fp64 scores alone are 137 GB. Each (batch, head) pair of attention is
computed on its own, so the kernel runs on the whole case (the call that is timed) and its output
and gradients are compared, for the first and the last (batch, head) pair only, against the fp64
reference and PyTorch's own same-dtype answer computed on those two pairs, with the tolerance of
``checks.assert_close`` (the rule of the softmax suite). The timed draws (``families.draws``)
are the checked inputs with signs changed only, so those two pairs' references still serve.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_attnperf.families.registry import Kernel

__all__ = ["run_softmax"]

_DTYPES = ("bf16", "fp16", "fp32")


def _pairs(x: Any) -> Any:
    """The first and the last (batch, head) pair of ``[B, H, T, d]``, as ``[2, 1, T, d]``."""
    import torch

    return torch.stack([x[0, 0], x[-1, -1]])[:, None]


def run_softmax(kernel: Kernel, case: Any, direction: str, device: Any) -> Callable[[], Any]:
    """Check ``kernel`` on ``case`` (a ``SoftmaxCase`` without GQA) on two (batch, head) pairs and
    return the zero-argument callable to time, which runs the whole case."""
    import zlib

    import torch

    from pytest_attnperf.families.checks import FACTOR, GRAD_FACTOR, Answer, assert_close, call_checked
    from pytest_attnperf.families.draws import timed
    from pytest_attnperf.families.softmax.kernels import naive
    from pytest_attnperf.families.softmax.reference import softmax_attention as reference

    if case.n_kv_heads != case.heads:
        raise ValueError(f"{case.id}: the sliced check takes no grouped K/V heads")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(f"sliced:{case.id}".encode()))
    backward = direction == "fwdbwd"
    shape = (case.batch, case.heads, case.seq, case.head_dim)

    def draw() -> Any:
        return torch.randn(shape, generator=gen, device=device).to(dtype)

    q, k, v = (draw().requires_grad_(backward) for _ in range(3))
    grad_out = draw()
    opts = dict(causal=case.causal, scale=case.scale, window=case.window)

    def run_on(xs: tuple[Any, ...], grads: Any) -> Any:
        out = kernel.fn(*xs, **opts)
        if not backward:
            return (out,)
        return (out,) + tuple(torch.autograd.grad(out, xs, grads))

    def call() -> Any:
        return run_on((q, k, v), grad_out)

    got = call_checked(kernel, call, "q, k, v", (q, k, v), device)

    def both(fn: Any, cast: Any) -> tuple[Any, ...]:
        leaves = [cast(_pairs(x.detach())).requires_grad_(backward) for x in (q, k, v)]
        out = fn(*leaves, **opts)
        if not backward:
            return (out.detach(),)
        grads = torch.autograd.grad(out, leaves, cast(_pairs(grad_out)).to(out.dtype))
        return (out.detach(),) + tuple(g.detach() for g in grads)

    exact = both(reference, lambda x: x.double())
    mine = both(naive, lambda x: x)

    def check(label: str, name: str, value: Any, ref: Any, own: Any) -> float:
        factor = FACTOR if name == "out" else GRAD_FACTOR
        close = assert_close(label, _pairs(value.detach()), ref, own, case.dtype, factor)
        return close.error / close.allowed if close.allowed > 0 else 0.0

    names = ("out", "dq", "dk", "dv")[: len(got)]
    for name, value, ref, own in zip(names, got, exact, mine, strict=True):
        check(f"{kernel.name} {name}", name, value, ref, own)
    answer = Answer(names, tuple(x.detach() for x in got), exact[: len(got)], mine[: len(got)], call, run_on=run_on,
                    inputs=(q, k, v), input_names=("q", "k", "v"), grad_out=grad_out if backward else None)
    return timed(answer, kernel.name, check, f"sliced:{case.id}:{direction}", 1, permute=False)
