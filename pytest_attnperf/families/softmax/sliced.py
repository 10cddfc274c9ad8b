"""Softmax attention checked on two slices: for shapes whose whole fp64 reference does not fit.

The kernel runs on the whole case (the call that is timed), and two slices of its answer are
compared against fp64: the first key/value head of the first batch entry and the last of the
last, each with every query head of its group, under the softmax suite's rule
(``checks.assert_close``). docs/reports.md, "The suites".
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from pytest_attnperf.families.checks import FACTOR, GRAD_FACTOR, Answer, assert_close, call_checked
from pytest_attnperf.families.draws import timed
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax.kernels import held_to_tf32, naive
from pytest_attnperf.families.softmax.reference import softmax_attention as reference
from pytest_attnperf.measure.switches import exact_fp32

__all__ = ["run_sliced", "run_softmax"]


def _slices(x: Any, per_group: int) -> Any:
    """The first ``per_group`` heads of batch entry 0 and the last ``per_group`` of the last
    entry of ``[B, H, T, d]``, as ``[2, per_group, T, d]``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    return torch.stack([x[0, :per_group], x[-1, -per_group:]])


def _by_head(fn: Any, q: Any, k: Any, v: Any, grad_out: Any, backward: bool, opts: dict[str, Any],
             ) -> tuple[Any, ...]:
    """``fn`` on each query head of the slices ``q`` ``[2, g, T, d]`` over ``k``, ``v`` ``[2, 1, T, d]``
    in turn: the output and (``backward``) dq per head, dk and dv summed over the group."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    outs, dqs, dks, dvs = [], [], [], []
    for head in range(q.shape[1]):
        leaves = [x.detach().requires_grad_(backward) for x in (q[:, head:head + 1], k, v)]
        out = fn(*leaves, **opts)
        outs.append(out.detach())
        if backward:
            dq, dk, dv = torch.autograd.grad(out, leaves, grad_out[:, head:head + 1].to(out.dtype))
            dqs.append(dq)
            dks.append(dk)
            dvs.append(dv)
    if not backward:
        return (torch.cat(outs, 1),)
    return torch.cat(outs, 1), torch.cat(dqs, 1), sum(dks), sum(dvs)


def run_sliced(kernel: Kernel, case: Any, direction: str, device: Any, label: str) -> Callable[[], Any]:
    """Check ``kernel`` on ``case`` (a ``SoftmaxCase``, grouped or not) on two key/value groups and
    return the zero-argument callable to time, which runs the whole case. ``label`` seeds the
    inputs' draw and names the timed draws."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(f"{label}:{case.id}".encode()))
    backward = direction == "fwdbwd"
    group = case.heads // case.n_kv_heads

    def draw(heads: int) -> Any:
        return torch.randn((case.batch, heads, case.seq, case.head_dim), generator=gen, device=device).to(dtype)

    q = draw(case.heads).requires_grad_(backward)
    k, v = (draw(case.n_kv_heads).requires_grad_(backward) for _ in range(2))
    grad_out = draw(case.heads)
    opts = dict(causal=case.causal, scale=case.scale, window=case.window)

    def run_on(xs: tuple[Any, ...], grads: Any) -> Any:
        out = kernel.fn(*xs, **opts)
        if not backward:
            return (out,)
        return (out,) + tuple(torch.autograd.grad(out, xs, grads))

    def call() -> Any:
        return run_on((q, k, v), grad_out)

    got = call_checked(kernel, call, "q, k, v", (q, k, v), device)
    names = ("out", "dq", "dk", "dv")[: len(got)]
    widths = {"out": group, "dq": group, "dk": 1, "dv": 1}
    sq, sk, sv, sg = (_slices(x.detach(), n) for x, n in ((q, group), (k, 1), (v, 1), (grad_out, group)))
    exact = _by_head(reference, sq.double(), sk.double(), sv.double(), sg.double(), backward, opts)
    from pytest_attnperf.families.tf32 import tf32_products  # noqa: PLC0415 - families.tf32 imports torch: kept out of the plugin's start-up

    with exact_fp32(), tf32_products() if held_to_tf32(kernel.tf32, case.dtype) else nullcontext():
        mine = _by_head(naive, sq, sk, sv, sg, backward, opts)  # TF32 only where the kernel declares it

    def check(label: str, name: str, value: Any, ref: Any, own: Any) -> float:
        factor = FACTOR if name == "out" else GRAD_FACTOR[case.dtype]
        close = assert_close(label, _slices(value.detach(), widths[name]), ref, own, case.dtype, factor)
        return close.error / close.allowed if close.allowed > 0 else 0.0

    for name, value, ref, own in zip(names, got, exact, mine, strict=True):
        check(f"{kernel.name} {name}", name, value, ref, own)
    answer = Answer(names, tuple(x.detach() for x in got), exact[: len(got)], mine[: len(got)], call, run_on=run_on,
                    inputs=(q, k, v), input_names=("q", "k", "v"), grad_out=grad_out if backward else None)
    return timed(answer, kernel.name, check, f"{label}:{case.id}:{direction}", 1, permute=False)


def run_softmax(kernel: Kernel, case: Any, direction: str, device: Any) -> Callable[[], Any]:
    """The sweep's check: ``run_sliced`` on a case without grouped K/V heads (its slices are the
    first and the last (batch, head) pair)."""
    if case.n_kv_heads != case.heads:
        raise ValueError(f"{case.id}: the sliced check takes no grouped K/V heads")
    return run_sliced(kernel, case, direction, device, "sliced")
