"""Decode kernels for the softmax family: a right one that splits the cache, and wrong ones, each
wrong in one known way.

Load it as a pytest plugin (``-p zoo.decode`` with ``tests/`` on the path): it adds each kernel
to the ``softmax`` family, where they take decode cases only (``kv_seq`` set). ``zoo-ok-*`` must
pass; ``zoo-bad-decode-upper-left`` must fail its check on every causal case (it aligns the mask
to the start of the cache, as SDPA's ``is_causal`` does); ``zoo-bad-decode-reads-twice`` is right
but reads the cache twice, so it must fail a bandwidth floor set for the kernel it doubles
(``HELD_TO``: tools/decode_floors.py gives it that kernel's floors).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from pytest_attnperf.families.registry import KernelRegistry
from pytest_attnperf.families.softmax.kernels import SoftmaxCase, sdpa

__all__ = ["FAMILY", "HELD_TO", "KERNELS", "pytest_attnperf_register_kernels", "register"]

FAMILY = "softmax"
SPLITS = 4
HELD_TO = {"zoo-bad-decode-reads-twice": "sdpa-flash"}  # a slowed kernel and the built-in whose floors it must meet


def _decode_only(case: SoftmaxCase) -> str | None:
    if not case.decode:
        return "a decode kernel: this case has as many keys as queries"
    return None


def _decode_plain(case: SoftmaxCase) -> str | None:
    return _decode_only(case) or ("no window" if case.window else None)


def upper_left(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
    """SDPA's ``is_causal`` on fewer queries than keys: query i sees keys 0..i, the start of the cache."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def reads_twice(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
    """The built-in SDPA twice over the whole cache, the two (equal) answers averaged: exact, at twice the bytes."""
    first: Tensor = sdpa(q, k, v, causal=causal, scale=scale)
    second: Tensor = sdpa(q, k, v, causal=causal, scale=scale)
    return (first + second) / 2


def split_kv(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
    """Flash-decoding's split: the cache cut into ``SPLITS`` parts, each part's softmax in fp32 with
    its log-sum-exp, the parts merged by their weights; lower-right causal and window as the family says."""
    from pytest_attnperf.families.softmax.reference import attention_mask

    tq, tk = q.shape[2], k.shape[2]
    group = q.shape[1] // k.shape[1]
    qf = q.float().reshape(q.shape[0], k.shape[1], group * tq, q.shape[3])
    mask = attention_mask(tq, causal, window, q.device, tk)
    bounds = [tk * i // SPLITS for i in range(SPLITS + 1)]
    outs, lses = [], []
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        scores = qf @ k[:, :, lo:hi].float().transpose(-1, -2) * scale
        if mask is not None:
            seen = mask[:, lo:hi].repeat(group, 1)
            scores = scores.masked_fill(~seen, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        outs.append(torch.exp(scores - safe) @ v[:, :, lo:hi].float())
        lses.append(lse)
    total = torch.logsumexp(torch.cat(lses, dim=-1), dim=-1, keepdim=True)
    out = sum(torch.exp(torch.where(torch.isfinite(lse), lse - total, torch.full_like(lse, float("-inf")))) * part
              for part, lse in zip(outs, lses, strict=True))
    assert isinstance(out, Tensor)
    return out.reshape(q.shape[0], q.shape[1], tq, v.shape[3]).to(q.dtype)


KERNELS: dict[str, tuple[Any, dict[str, Any]]] = {
    "zoo-ok-decode-split-kv": (split_kv, {"supports": _decode_only, "backward": False}),
    "zoo-bad-decode-upper-left": (upper_left, {"supports": _decode_plain, "backward": False}),
    "zoo-bad-decode-reads-twice": (reads_twice, {"supports": _decode_plain, "backward": False,
                                                 "sdpa_backend": "flash"}),
}


def register(registry: KernelRegistry) -> None:
    """Add every kernel of this module to ``registry``'s softmax family."""
    for name, (fn, options) in KERNELS.items():
        registry.kernel(family=FAMILY, name=name, **options)(fn)


def pytest_attnperf_register_kernels(registry: KernelRegistry) -> None:
    """The plugin hook: the decode zoo joins the softmax family."""
    register(registry)
