"""A zoo for the softmax family's call axes (``lse``, ``q-gt-k``, ``v-dim``, ``mask``) and its checks
between calls (``prefix``, ``inference``): wrong kernels, each a published class of bug (a finite
log-sum-exp for a row with no visible key, NaN for a fully masked row, causal aligned top-left when
the lengths differ, an output sized by the query/key head dim, a mask ignored for one batch entry or
taken from one head, a prefix that sees later tokens, another branch or a write into the inputs only
under inference), each beside one correct twin, ``twin-axes``, which differs from it only by the bug.

Every kernel is softmax attention over materialised scores in the inputs' dtype (differentiable
through autograd), in the family's call: ``attn_mask=`` and ``return_lse=True`` where the case
carries them (``families.softmax.axes``), causal aligned lower-right. ``PAIRS`` names each wrong
kernel with its class, the smoke row of that class that catches it, and the directions its bug
lives in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from pytest_attnperf.families.registry import Kernel, KernelRegistry

__all__ = ["AXES", "BUGS", "PAIRS", "Pair", "attention", "pytest_attnperf_register_kernels", "register", "twin"]

AXES = ("lse", "q-gt-k", "v-dim", "mask")
DIRECTIONS = ("fwd", "fwdbwd")


def _visible(tq: int, tk: int, causal: bool, window: int | None, device: Any, top_left: bool) -> Tensor | None:
    """Visible (query, key) pairs: lower-right causal (``top_left``: the bug's upper-left), a window."""
    if not causal:
        return None
    i = torch.arange(tq, device=device)[:, None] + (0 if top_left else tk - tq)
    j = torch.arange(tk, device=device)[None, :]
    visible = j <= i
    if window is not None:
        visible &= j > i - window
    return visible


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None,
              attn_mask: Tensor | None = None, return_lse: bool = False, bug: str | None = None) -> Any:
    """Softmax attention in the inputs' dtype with ``bug`` planted (None: correct)."""
    if bug == "inference-writes-input" and not torch.is_grad_enabled():
        with torch.no_grad():
            q.mul_(scale)  # the query pre-scaled in place on the serving path, the caller's tensor with it
        scale = 1.0
    if bug == "inference-drops-causal" and torch.is_inference_mode_enabled():
        causal = False  # a serving fast path that forgets the causal mask
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if bug == "v-sized-by-qk" and v.shape[-1] != q.shape[-1]:  # the output allocated at the query/key head dim
        v = torch.nn.functional.pad(v, (0, q.shape[-1] - v.shape[-1])) if v.shape[-1] < q.shape[-1] \
            else v[..., : q.shape[-1]]
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    visible = _visible(q.shape[2], k.shape[2], causal, window, q.device, bug == "causal-top-left")
    if bug == "prefix-sees-last-key" and visible is not None:
        visible = visible.clone()
        visible[:, -1] = True  # the last key visible to every query: a causal limit off at the end
    if attn_mask is not None:
        mask = attn_mask.expand(scores.shape).clone()
        if bug == "mask-ignored-last-batch":
            mask[-1] = True if mask.dtype == torch.bool else 0.0
        if bug == "mask-of-head-0":
            mask = mask[:, :1].expand(scores.shape)
        if mask.dtype == torch.bool:
            visible = mask if visible is None else visible & mask
        else:
            scores = scores + mask
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    empty = torch.isneginf(scores).all(-1, keepdim=True)
    if bug != "nan-fully-masked":  # the bug takes the softmax of a row of -inf: NaN
        scores = scores.masked_fill(empty, 0.0)
    p = torch.softmax(scores, dim=-1)
    if bug != "nan-fully-masked":
        p = p.masked_fill(empty, 0.0)
    out = torch.matmul(p, v)
    if not return_lse:
        return out
    lse = torch.logsumexp(scores.float(), dim=-1)
    if bug != "lse-finite-empty":  # the bug leaves 0 there, as torch's CPU flash kernel does
        lse = lse.masked_fill(empty[..., 0], float("-inf"))
    else:
        lse = lse.masked_fill(empty[..., 0], 0.0)
    return out, lse


@dataclass(frozen=True)
class Pair:
    """A wrong kernel (``bug-<name>``) and the twin (``twin-axes``); ``cls`` the catalogue class its
    bug lives in, ``row`` the smoke row of that class that catches it, in ``directions``."""

    name: str
    cls: str
    row: str
    bug: str
    directions: tuple[str, ...] = DIRECTIONS

    @property
    def wrong_name(self) -> str:
        return f"bug-{self.name}"

    def kernel(self) -> Kernel:
        return _kernel(self.wrong_name, self.name, f"{self.bug} [{self.cls}]")


def _kernel(name: str, bug: str | None, doc: str) -> Kernel:
    def fn(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None,
           **axes: Any) -> Any:
        return attention(q, k, v, causal=causal, scale=scale, window=window, bug=bug, **axes)

    fn.__doc__ = doc
    fn.__name__ = fn.__qualname__ = name.replace("-", "_")
    return Kernel("softmax", name, fn, description=doc, axes=AXES, tiled=False)  # its scores materialised


TWIN_DOC = ("The twin of every bug-*: softmax over materialised scores in the inputs' dtype, causal lower-right, the "
            "mask applied to every batch entry and head, a row with no visible key 0 with LSE -inf, the caller's "
            "tensors left alone.")


def twin() -> Kernel:
    """The correct kernel, which every wrong kernel differs from by its bug alone."""
    return _kernel("twin-axes", None, TWIN_DOC)


_LSE_EMPTY = "cat-b2-h2-t17-k9-d32-causal-fp32-lse"
_Q_GT_K = "cat-b2-h2-t17-k9-d32-causal-fp32"
_V_DIM = "cat-b1-h2-t20-d48-v32-causal-fp32"
_PADDING = "cat-b3-h2-t20-d32-fp32-mask-padding"
_PER_HEAD = "cat-b1-h4-t20-d32-fp32-mask-per-head"
_FULLY = "cat-b2-h3-t20-d32-fp32-mask-fully-masked"
_PREFIX = "cat-b2-h2-t40-d32-causal-fp32-rel-prefix"
_INFERENCE = "cat-b2-h2-t40-d32-causal-fp32-rel-inference"

BUGS = {
    "lse-finite-empty": "Returns a log-sum-exp of 0, not -inf, for a row with no visible key.",
    "nan-fully-masked": "Takes the softmax of a fully masked row as it is: NaN there.",
    "causal-top-left": "Aligns causal top-left (query i sees keys 0..i) when the lengths differ.",
    "v-sized-by-qk": "Sizes the output by the query/key head dim (the values padded or cut to it).",
    "mask-ignored-last-batch": "Ignores the mask of the last batch entry.",
    "mask-of-head-0": "Applies head 0's mask to every head.",
    "prefix-sees-last-key": "Lets every query see the last key: a prefix's outputs change as tokens are appended.",
    "inference-drops-causal": "Under torch.inference_mode() takes a fast path that drops the causal mask.",
    "inference-writes-input": "With grad disabled, pre-scales the query in place: the caller's q is changed.",
}
"""Each bug, as its wrong kernel's docstring says it."""

# (bug, class, the smoke row of the class that catches it, directions)
_TABLE: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("lse-finite-empty", "lse", _LSE_EMPTY, DIRECTIONS),
    ("nan-fully-masked", "fully-masked", _FULLY, DIRECTIONS),
    ("causal-top-left", "q-gt-k", _Q_GT_K, DIRECTIONS),
    ("v-sized-by-qk", "v-dim", _V_DIM, DIRECTIONS),
    ("mask-ignored-last-batch", "mask", _PADDING, DIRECTIONS),
    ("mask-of-head-0", "mask", _PER_HEAD, DIRECTIONS),
    ("prefix-sees-last-key", "prefix", _PREFIX, ("fwd",)),  # a relation: forward calls
    ("inference-drops-causal", "inference", _INFERENCE, ("fwd",)),
    ("inference-writes-input", "inference", _INFERENCE, ("fwd",)),
)

PAIRS = tuple(Pair(name, cls, row, BUGS[name], directions) for name, cls, row, directions in _TABLE)


def register(registry: KernelRegistry) -> None:
    """Every wrong kernel and the twin."""
    for pair in PAIRS:
        registry.add(pair.kernel())
    registry.add(twin())


def pytest_attnperf_register_kernels(registry: KernelRegistry, config: pytest.Config) -> None:
    """The zoo as a plugin (``-p tests.zoo.axes_softmax``)."""
    register(registry)
