"""What a flash-style kernel's own rounding makes of a case: the yardstick's second half.

PyTorch's materialised answer in the case's dtype is the yardstick of the rule (``families.checks``),
but a correct tiled kernel rounds along another path: it never holds the softmax, it rescales a
running sum block by block, it forms each probability from a fused exponent argument, and in the
backward it recomputes the probabilities from a stored log-sum-exp. Where that path errs more than
PyTorch's (one visible key, where PyTorch is exact; long rows, where its blocked sums are more
accurate than a running one), the rule would fail a correct kernel. So each element's yardstick is
the further of PyTorch's answer and this emulation's (``further``). docs/catalogue.md, "Yardsticks".
"""

from __future__ import annotations

import math
from typing import Any

from pytest_attnperf.families.softmax.reference import masked_scores

__all__ = ["BLOCK", "further", "recomputed_gradients", "recomputed_output"]

BLOCK = 64  # keys per block of the emulated forward, as flash and memory-efficient kernels tile them
LOG2E = math.log2(math.e)
RECIPROCAL_ERROR = 2.0**-23  # relative: one fp32 ulp at 1, the GPU's approximate reciprocal's bound


def further(a: Any, b: Any, reference: Any) -> Any:
    """Elementwise, whichever of ``a`` and ``b`` is further from ``reference``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    return torch.where((a.double() - reference).abs() >= (b.double() - reference).abs(), a, b)


def _grouped(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    group = q.shape[1] // k.shape[1]
    kk, vv = (x.detach().repeat_interleave(group, dim=1).float() for x in (k, v))
    return q.detach().float(), kk, vv


def _stacked(x: Any, kv_heads: int) -> Any:
    """``[B, H, T, d]`` as ``[B, Hkv, (H / Hkv) T, d]``: each GQA group's query heads stacked as
    rows against their one K/V head, so a product with K or V copies neither to the query heads."""
    return x.reshape(x.shape[0], kv_heads, -1, x.shape[-1])


def recomputed_output(q: Any, k: Any, v: Any, opts: dict[str, Any], reference: Any) -> Any:
    """``out`` as a flash-style forward forms it in the inputs' dtype: fp32 scores, keys in blocks
    of ``BLOCK`` with a running maximum and sum rescaled at each block; each probability
    ``exp2(s c - m c)`` with ``c = scale log2(e)``, the argument formed in one fused step against
    the separately rounded scaled maximum; the probabilities cast to the dtype for their product
    with V; the sum divided out at the end by a reciprocal that a GPU approximates to one ulp
    (``rcp.approx``): of its two one-ulp errors, each element takes the one further from
    ``reference``. A row of one key, where PyTorch is exact, so lands an ulp or two off, as
    torch's memory-efficient kernel does on an H100."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    dtype, c = q.dtype, opts["scale"] * LOG2E
    kv_heads, keys, values = k.shape[1], k.shape[2], v.detach()
    kk = k.detach().float()  # at the K/V heads: one fp32 copy of the keys, none of them at the query heads
    scores = (_stacked(q.detach().float(), kv_heads) @ kk.transpose(-1, -2)).view(*q.shape[:3], keys)
    bias = opts.get("attn_mask")
    if bias is not None and bias.dtype != torch.bool:  # an additive mask, added to the scaled scores in fp32
        bias = bias.float() / opts["scale"]
    scores, empty = masked_scores(scores, opts["causal"], opts["window"], bias)
    scores = scores.masked_fill(empty, float("-inf"))  # a row with no visible key: nothing summed, output 0
    shape = scores.shape[:-1] + (1,)
    top = torch.full(shape, float("-inf"), device=q.device)
    total = torch.zeros(shape, device=q.device)
    acc = torch.zeros(scores.shape[:-1] + (values.shape[-1],), device=q.device)
    for start in range(0, scores.shape[-1], BLOCK):
        block = scores[..., start:start + BLOCK]
        new_top = torch.maximum(top, block.amax(-1, keepdim=True))
        scaled = torch.where(new_top.isinf(), 0.0, new_top * c)  # a row with nothing visible yet: no shift
        p = torch.exp2((block.double() * c - scaled.double()).float())
        alpha = torch.exp2((top.double() * c - scaled.double()).float())
        total = total * alpha + p.sum(-1, keepdim=True)
        product = _stacked(p.to(dtype).float(), kv_heads) @ values[..., start:start + BLOCK, :].to(dtype).float()
        acc = acc * alpha + product.view(acc.shape)
        top = new_top
    reciprocal = torch.where(total > 0, 1.0 / total, 0.0)
    high, low = ((acc * (reciprocal * (1.0 + side * RECIPROCAL_ERROR))).to(dtype) for side in (1, -1))
    return further(high, low, reference)


def recomputed_gradients(q: Any, k: Any, v: Any, grad_out: Any, opts: dict[str, Any]) -> tuple[Any, Any, Any]:
    """``dq, dk, dv`` as a flash-style backward forms them in the inputs' dtype: the scores
    recomputed in fp32, the probabilities as ``exp(s - lse)`` from the row's fp32 log-sum-exp, cast
    to the dtype for ``dv``. Where the scores are large the LSE's own rounding (``|lse| u``) shifts
    every probability of its row alike, which autograd through a stored softmax never sees: on the
    CPU at scores of spread 47, torch's flash backward's fp32 ``dv`` erred 16x autograd's. The
    forward's and the backward's scores are rounded apart as two passes of a kernel round them.
    (docs/catalogue.md, "Yardsticks")."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


    dtype, scale = q.dtype, opts["scale"]
    group = q.shape[1] // k.shape[1]
    qq, kk, vv = _grouped(q, k, v)
    do = grad_out.float()
    bias = opts.get("attn_mask")

    def scores(first: Any, second: Any, unit: float) -> Any:
        """Scores with the masks (an additive one in units of ``unit``); an empty row's all 0."""
        found = first @ second.transpose(-1, -2)
        added = bias if bias is None or bias.dtype == torch.bool else bias.float() / unit
        return masked_scores(found, opts["causal"], opts["window"], added)[0]

    empty = masked_scores(qq[..., :1] @ kk[..., :1].transpose(-1, -2), opts["causal"], opts["window"], bias)[1]

    # the forward's scores with the scale folded into q, the backward's scaled after the product: a
    # kernel's two passes round them apart, so even a row of one visible key has p = exp(s' - lse) != 1
    forward = scores(qq * scale, kk, 1.0)
    top = forward.amax(-1, keepdim=True)
    lse = top + torch.log(torch.exp(forward - top).sum(-1, keepdim=True))
    p = torch.exp(scores(qq, kk, scale) * scale - lse).masked_fill(empty, 0.0)
    o = (p.to(dtype) @ vv.to(dtype)).float()
    dv = p.to(dtype).float().transpose(-1, -2) @ do
    ds = p * (do @ vv.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    dq, dk = (ds @ kk) * scale, (ds.transpose(-1, -2) @ qq) * scale
    if group > 1:  # each K/V head's gradient: the sum over its group's query heads (dv's head dim its own)
        dk, dv = (x.view(x.shape[0], x.shape[1] // group, group, *x.shape[2:]).sum(2) for x in (dk, dv))
    return dq.to(dtype), dk.to(dtype), dv.to(dtype)
