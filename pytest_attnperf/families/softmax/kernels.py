"""Softmax attention: the case type, the call signature, and the built-in kernels.

Signature of every kernel in the family (torch SDPA layout, K/V may have fewer heads)::

    fn(q, k, v, *, causal: bool, scale: float, window: int | None) -> out  # [B, H, Tq, dv]

A kernel that declares an optional call axis (``Kernel.axes``) also takes ``return_lse=True``
and ``attn_mask=`` (``families.softmax.axes``). Query and key lengths may differ (``Tk >= Tq``,
decode and chunked prefill): ``causal`` is then aligned lower-right, query ``i`` seeing keys
``0 .. Tk - Tq + i``. docs/families.md, "Softmax"; docs/decode.md.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_attnperf.costs import DTYPE_BYTES
from pytest_attnperf.families.checks import (
    ELEMENT_FACTOR,
    ELEMENT_GRAD_FACTOR,
    FACTOR,
    GRAD_FACTOR,
    Answer,
    Checked,
    CheckFailed,
    allowance,
    assert_close,
    assert_elementwise,
    assert_reaches,
    call_checked,
    gradients,
    own_copies,
    plain,
)
from pytest_attnperf.families.draws import timed
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.families.softmax import axes as call_axes
from pytest_attnperf.families.softmax import paging, relations
from pytest_attnperf.families.softmax.builtins import flex_window, sdpa, sdpa_dense_window, sdpa_repeat_kv
from pytest_attnperf.families.softmax.recompute import further, recomputed_gradients, recomputed_output
from pytest_attnperf.families.softmax.reference import attention_mask, masked_scores
from pytest_attnperf.families.softmax.reference import softmax_attention as reference
from pytest_attnperf.families.values import laid_out, softmax_inputs
from pytest_attnperf.hw.detect import memory_gb
from pytest_attnperf.measure.switches import exact_fp32

__all__ = [
    "AXES", "FAMILY", "SIGNATURE", "SoftmaxCase", "TENSORS", "answer", "check_case", "check_elements",
    "check_tensor", "flex_window", "forget", "naive", "register", "run_case", "sdpa", "sdpa_dense_window",
    "sdpa_repeat_kv",
]

FAMILY = "softmax"
SIGNATURE = "fn(q, k, v, *, causal: bool, scale: float, window: int | None) -> out"
AXES = "b h t d"  # every tensor of the family: batch, head, position, channel
HEAD_AXIS = 1


@dataclass(frozen=True)
class SoftmaxCase:
    """One shape of softmax attention; ``id`` names it in test ids and baselines."""

    id: str
    batch: int
    heads: int
    seq: int
    head_dim: int
    dtype: str
    causal: bool
    kv_heads: int | None = None
    window: int | None = None
    gpu: bool = True  # True: the GPU shape table; False: the CPU table
    kv_seq: int | None = None  # keys (the KV cache) when they outnumber the queries: decode
    values: str = "normal"  # how the inputs are drawn (``families.values``: adversarial regimes)
    layout: str = "contiguous"  # how the kernel receives them (``families.values.laid_out``)
    lse: bool = False  # the ``lse`` axis: the kernel returns (out, lse) (``families.softmax.axes``)
    head_dim_v: int | None = None  # the ``v-dim`` axis: the values' head dim where it is not head_dim
    mask: str | None = None  # the ``mask`` axis: an explicit attn_mask (``axes.MASKS``)
    relation: str | None = None  # a metamorphic check instead of the reference (``relations.RELATIONS``)
    inference: bool = False  # forward: also called under torch.inference_mode(), compared with the grad-mode call
    cache: str | None = None  # the kv-cache (and paged) axes: "append" or "paged" (``paging.CACHES``); Tmax = kv_seq
    cache_lengths: tuple[int, ...] | None = None  # with cache: each request's tokens before the call
    page_size: int | None = None  # with cache="paged": the slots of a page

    @property
    def axes(self) -> tuple[str, ...]:
        """The optional call axes the case carries, which a kernel must declare (``Kernel.axes``)."""
        found = (("lse",) if self.lse else ()) + (("q-gt-k",) if self.n_kv_seq < self.seq else ())
        found += (("v-dim",) if self.n_head_dim_v != self.head_dim else ()) + (("mask",) if self.mask else ())
        return found + (("kv-cache",) if self.cache else ()) + (("paged",) if self.cache == "paged" else ())

    @property
    def n_head_dim_v(self) -> int:
        """The values' (and the output's) head dim: ``head_dim_v``, or ``head_dim``."""
        return self.head_dim if self.head_dim_v is None else self.head_dim_v

    def refusal(self, family: str) -> str | None:
        """Why no kernel can take this case (None when one can): an unknown mask or relation, or a
        relation the case's shape cannot carry."""
        return relations.refusal(self) or paging.refusal(self)

    @property
    def n_kv_seq(self) -> int:
        """The key/value positions: ``kv_seq``, or ``seq`` when the lengths are equal."""
        return self.seq if self.kv_seq is None else self.kv_seq

    @property
    def decode(self) -> bool:
        """Whether the queries are the last ``seq`` of ``kv_seq`` positions (decode, chunked prefill)."""
        return self.kv_seq is not None and self.kv_seq != self.seq

    @property
    def n_kv_heads(self) -> int:
        """The key/value heads: ``kv_heads``, or ``heads`` when not grouped."""
        return self.heads if self.kv_heads is None else self.kv_heads

    def backward_refusal(self) -> str | None:
        """Why the case has no fwdbwd direction, or None: with one key, each query's softmax is 1,
        so dq and dk are zero whatever the inputs, and a correct kernel's dq (the rounding of
        ``dp - rowsum(dO o O)``) fails any bound relative to that zero."""
        if self.relation:
            return f"the {self.relation} check compares forward calls"
        if self.cache:
            return "a cache call is a decode step: forward only"
        if self.n_kv_seq == 1:
            return "one key per query: the softmax is 1 and dq, dk are zero, so a backward checks nothing of them"
        return None

    @property
    def scale(self) -> float:
        """The softmax scale, ``head_dim ** -0.5``."""
        scale: float = self.head_dim**-0.5  # int ** negative int: typeshed says Any
        return scale


def naive(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None, attn_mask: Any = None,
          return_lse: bool = False, **cache: Any) -> Any:
    """Explicit softmax over materialised scores, in the inputs' dtype (every call axis: a row
    with no visible key 0, its LSE -inf; a KV cache, contiguous or paged, gathered per request:
    ``paging.attend``)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if cache:
        return paging.attend(naive, q, k, v, causal=causal, scale=scale, window=window, return_lse=return_lse,
                             **cache)

    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if not _rows_can_be_empty(q.shape[2], k.shape[2], causal, window, attn_mask):
        # every row sees a key: the plain softmax, with no passes over the scores for empty rows
        mask = attention_mask(q.shape[2], causal, window, q.device, k.shape[2])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v)
        return (out, torch.logsumexp(scores.float(), dim=-1)) if return_lse else out
    scores, empty = masked_scores(scores, causal, window, attn_mask)
    out = torch.matmul(torch.softmax(scores, dim=-1).masked_fill(empty, 0.0), v)
    if not return_lse:
        return out
    return out, torch.logsumexp(scores.float(), dim=-1).masked_fill(empty[..., 0], float("-inf"))


def _rows_can_be_empty(seq: int, kv_seq: int, causal: bool, window: int | None, attn_mask: Any = None) -> bool:
    """Whether a query of a call may see no key: with an explicit mask, with no keys, or causal
    with more queries than keys (lower-right, the first rows see none) or a window of no keys.
    Causal with a window of one or more over at least as many keys, each query sees itself."""
    if attn_mask is not None or kv_seq == 0:
        return True
    return causal and (seq > kv_seq or (window is not None and window < 1))


def _plain(case: SoftmaxCase) -> str | None:
    return "plain SDPA takes no window (the windowed kernels cover it)" if case.window else None


# SDPA's math backend computes in fp32 with K and V expanded to the query heads, beside the fp32
# scores: ``math_gb``. With the timed draws' graphs that takes more than the expansion itself: at
# B=32 H=32 over 32K keys of 128 (34.5 GB expanded) it peaked at 60.3 GB above its inputs on an
# H200 and ran out of memory on an 85 GB H100 with 81.8 GB allocated, 2.4 times it (docs/decode.md)
MATH_COPIES = 2.5
MATH_MEMORY_SHARE = 0.9  # the share of the GPU's memory that estimate, with the inputs, may take


def math_gb(case: SoftmaxCase) -> float:
    """What SDPA's math backend takes on ``case``, in GB (estimated, ``MATH_COPIES`` times its fp32
    K, V and scores at the query heads), with the case's bf16/fp16/fp32 inputs and output."""
    width = DTYPE_BYTES[case.dtype]
    expanded = 4.0 * case.batch * case.heads * case.n_kv_seq * (2 * case.head_dim + case.seq)
    inputs = width * case.batch * case.head_dim * (2 * case.heads * case.seq + 2 * case.n_kv_heads * case.n_kv_seq)
    return (MATH_COPIES * expanded + inputs) / 1e9


def _math(case: SoftmaxCase) -> str | None:
    refusal = _plain(case)
    memory = memory_gb(True) if case.gpu and refusal is None else None
    if memory is not None and (need := math_gb(case)) > MATH_MEMORY_SHARE * memory:
        return (f"does not fit this GPU: SDPA's math backend would take about {need:.0f} GB here (fp32, "
                f"K and V expanded to the {case.heads} query heads), more than {MATH_MEMORY_SHARE:.0%} of "
                f"its {memory:.0f} GB")
    return refusal


def _gqa_only(case: SoftmaxCase) -> str | None:
    if case.window:
        return "plain SDPA takes no window"
    return None if case.n_kv_heads != case.heads else "the K/V expansion is a GQA variant; this case has no groups"


def _window_only(case: SoftmaxCase) -> str | None:
    return None if case.window else "a windowed kernel; this case has no window"


CACHE_AXES = ("kv-cache", "paged")  # SDPA over each request's gathered cache (``paging.attend``)
SDPA_AXES = ("q-gt-k", "v-dim", "mask", *CACHE_AXES)
"""The call axes SDPA takes by torch's dispatch: a mask, a value head dim of its own (math and
memory-efficient backends), more queries than keys (lower-right causal), a KV cache gathered per
request."""
BACKEND_AXES = {
    "flash": ("lse", "q-gt-k", "mask", *CACHE_AXES),  # its LSE read through aten; one head dim for q, k, v
    "efficient": SDPA_AXES,
    "cudnn": ("q-gt-k", "mask", *CACHE_AXES),
    "math": SDPA_AXES,
}
"""The call axes each pinned SDPA backend declares (docs/families.md)."""


def register(registry: KernelRegistry) -> None:
    """Add the softmax kernels to ``registry``: naive, SDPA by torch's dispatch and by backend, the GQA
    and window variants. Those that materialise T x T (naive's scores, the math backend's, the
    dense window's mask) are ``tiled=False``: no memory bound (docs/memory.md)."""
    registry.add(Kernel(FAMILY, "naive", naive, description=naive.__doc__ or "", tiled=False,
                        axes=call_axes.AXES + CACHE_AXES))
    registry.add(Kernel(FAMILY, "sdpa", sdpa, supports=_plain, axes=SDPA_AXES,
                        description="SDPA with torch's default dispatch (backend reported); native GQA"))
    for backend in ("flash", "efficient", "cudnn", "math"):
        registry.add(Kernel(FAMILY, f"sdpa-{backend}", sdpa, sdpa_backend=backend,
                            supports=_math if backend == "math" else _plain,
                            description=f"SDPA pinned to the {backend} backend",
                            tiled=backend != "math",  # the math backend materialises the scores
                            axes=BACKEND_AXES[backend]))
    registry.add(Kernel(FAMILY, "sdpa-repeat-kv", sdpa_repeat_kv, supports=_gqa_only, axes=SDPA_AXES[:3],
                        description=sdpa_repeat_kv.__doc__ or ""))
    registry.add(Kernel(FAMILY, "sdpa-dense-window", sdpa_dense_window, supports=_window_only,
                        description=sdpa_dense_window.__doc__ or "", tiled=False,  # its T x T mask
                        axes=("q-gt-k", "v-dim")))
    registry.add(Kernel(FAMILY, "flex-window", flex_window, supports=_window_only,
                        description=flex_window.__doc__ or ""))


# -- running a case -------------------------------------------------------------------------



@dataclass(frozen=True)
class PreparedSoftmax:
    """Inputs of a case with the fp64 reference and PyTorch's own same-dtype answer."""

    q: Any
    k: Any
    v: Any
    grad_out: Any
    reference: tuple[Any, ...]  # out[, dq, dk, dv] in fp64
    torch_value: tuple[Any, ...]  # the same from ``naive`` in the case's dtype
    opts: dict[str, Any]  # causal, scale, window
    mask: Any = None  # the case's explicit mask (the ``mask`` axis), or None
    lse: Any = None  # the fp64 log-sum-exp [B, H, Tq] (a case with call axes), or None
    empty: Any = None  # its rows with no visible key (bool [B, H, Tq]), or None
    _tf32: list[tuple[Any, ...]] = field(default_factory=list)  # the TF32 yardstick, once made (``yardstick``)

    @property
    def masked_opts(self) -> dict[str, Any]:
        """``opts`` with the mask, for the references (a kernel gets its own copy: ``axes.call_kwargs``)."""
        return self.opts if self.mask is None else {**self.opts, "attn_mask": self.mask}

    def yardstick(self, tf32: bool = False) -> tuple[Any, ...]:
        """``torch_value``, or (``tf32``, an fp32 case) ``naive`` with every matrix product's
        operands truncated to TF32 (``families.tf32``), as a tensor core reads fp32 tiles."""
        if not held_to_tf32(tf32, self.q.dtype):
            return self.torch_value
        if not self._tf32:

            from pytest_attnperf.families.tf32 import tf32_products  # noqa: PLC0415 - families.tf32 imports torch: kept out of the plugin's start-up

            with exact_fp32(), tf32_products():
                self._tf32.append(_outputs(naive, (self.q, self.k, self.v), self.grad_out, self.masked_opts))
        return self._tf32[0]


def _outputs(fn: Any, xs: tuple[Any, ...], grad_out: Any, opts: dict[str, Any]) -> tuple[Any, ...]:
    """``fn``'s output on ``xs``, and its gradients against each where they require grad."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    out = fn(*xs, **opts)
    if not xs[0].requires_grad:
        return (out.detach(),)
    grads = torch.autograd.grad(out, xs, grad_out.to(out.dtype))
    return (out.detach(),) + tuple(g.detach() for g in grads)


def _seed(text: str) -> int:

    return zlib.crc32(text.encode())


_cache: dict[tuple[SoftmaxCase, str, str, int], PreparedSoftmax] = {}


def forget() -> None:
    """Drop the inputs and references kept of the last case (``prepare``'s cache)."""
    _cache.clear()


def prepare(case: SoftmaxCase, direction: str, device: Any, seed: int = 0) -> PreparedSoftmax:
    """Fresh random inputs for the case (seeded by its id, and by ``seed`` when not 0) and both
    yardsticks; the last two (the case's two directions) are cached, since every kernel runs on
    the same case in turn. The ``naive`` kernel is itself the same-dtype yardstick: for it only
    shape and finiteness are really checked."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


    key = (case, direction, str(device), seed)
    if key in _cache:
        return _cache[key]
    while len(_cache) >= 2:  # both directions of the case in hand; older cases dropped
        _cache.pop(next(iter(_cache)))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
    gen = torch.Generator(device=device).manual_seed(_seed(case.id if not seed else f"{case.id}:{seed}"))
    shape_q = (case.batch, case.heads, case.seq, case.head_dim)
    shape_kv = (case.batch, case.n_kv_heads, case.n_kv_seq, case.head_dim)
    shape_out = shape_q[:3] + (case.n_head_dim_v,)
    backward = direction == "fwdbwd"

    def draw(shape: tuple[int, ...]) -> Any:
        return torch.randn(shape, generator=gen, device=device)

    drawn = softmax_inputs(case.values, shape_q, shape_kv, case.scale, draw)
    if case.n_head_dim_v != case.head_dim:  # the ``v-dim`` axis: values of their own head dim
        drawn = drawn[:2] + (draw(shape_kv[:3] + (case.n_head_dim_v,)),)
    q, k, v = (x.to(dtype).requires_grad_(backward) for x in drawn)
    del drawn  # the fp32 draws, which over a long cache would stay held through the references
    grad_out = torch.randn(shape_out, generator=gen, device=device).to(dtype)
    opts = dict(causal=case.causal, scale=case.scale, window=case.window)
    mask = call_axes.draw_mask(case, device, dtype)
    masked = opts if mask is None else {**opts, "attn_mask": mask}
    leaves64 = tuple(x.detach().double().requires_grad_(backward) for x in (q, k, v))
    with exact_fp32():  # fp32 yardsticks at full precision, whatever TF32 setting the project made
        exact = _outputs(reference, leaves64, grad_out, masked)
        plain = _outputs(naive, (q, k, v), grad_out, masked)
        # each output element: the further of PyTorch's and a flash-style forward's (``recompute``)
        plain = (further(plain[0], recomputed_output(q, k, v, masked, exact[0]), exact[0]),) + plain[1:]
        if backward:  # each gradient element: the further of autograd's and a recomputing backward's
            recomputed = recomputed_gradients(q, k, v, grad_out, masked)
            plain = plain[:1] + tuple(further(a, b, r)
                                      for a, b, r in zip(plain[1:], recomputed, exact[1:], strict=True))
        lse = empty = None
        if case.axes:  # the rows with no visible key, and the log-sum-exp the lse axis is held to
            with torch.no_grad():
                lse = reference(*(x.detach() for x in leaves64), **masked, return_lse=True)[1]
            empty = torch.isneginf(lse)
        prepared = PreparedSoftmax(q, k, v, grad_out, exact, plain, opts, mask, lse, empty)
    _cache[key] = prepared
    return prepared


TENSORS = ("out", "dq", "dk", "dv")


# what TF32 keeps of an fp32 operand: 10 mantissa bits, truncated (``families.tf32``)
TF32_UNIT = 2.0**-10


def held_to_tf32(tf32: bool, dtype: Any) -> bool:
    """Whether a case of ``dtype`` (``"fp32"`` or a torch dtype) of a kernel registered with
    ``tf32`` is held to the TF32 yardstick: its fp32 cases only (TF32 rounds no bf16 or fp16 bit)."""
    return tf32 and str(dtype) in ("fp32", "torch.float32")


def check_tensor(label: str, name: str, value: Any, reference: Any, yardstick: Any, dtype: str,
                 tf32: bool = False) -> float:
    """The family's rule for one output or gradient (``name`` in ``TENSORS``): a gradient reaches
    its input, the largest error (``checks.assert_close``) and every element
    (``check_elements``) against the fp64 reference, PyTorch's own answer in the case's dtype as
    the yardstick (``tf32``: with TF32 products, ``PreparedSoftmax.yardstick``). Returns the worst error
    over its bound (at most 1: it raises ``CheckFailed`` above)."""
    output = name == "out"
    if not output:
        assert_reaches(label, value, reference)
    factor = FACTOR if output else GRAD_FACTOR[dtype]
    largest = assert_close(label, value, reference, yardstick, dtype, factor, axes=AXES)
    return max(largest.error / largest.allowed,
               check_elements(label, name, value, reference, yardstick, dtype, tf32))


def check_elements(label: str, name: str, value: Any, reference: Any, yardstick: Any, dtype: str,
                   tf32: bool = False) -> float:
    """The elementwise part of ``check_tensor`` alone; returns the worst element's error over its
    bound. With ``tf32`` (fp32), no element's bound is below TF32's unit times its magnitude."""
    factor = ELEMENT_FACTOR[dtype] if name == "out" else ELEMENT_GRAD_FACTOR
    held = held_to_tf32(tf32, dtype)
    return assert_elementwise(label, value, reference, yardstick, dtype=dtype, factor=factor,
                              yardstick_name=f"PyTorch's {dtype}" + (" with TF32 products" if held else ""),
                              unit=TF32_UNIT if held else 0.0, axes=AXES).worst_ratio


def answer(kernel: Kernel, case: SoftmaxCase, direction: str, device: Any, seed: int = 0) -> Any:
    """Call ``kernel`` on ``case`` once, checking its contract (a tensor of the query's shape,
    dtype and device; a gradient for every input; no writes into the inputs), not its numbers.
    The kernel gets its own copies of the case's inputs (``checks.own_copies``)."""
    return _answer(kernel, case, direction, device, seed)[0]


def _answer(kernel: Kernel, case: SoftmaxCase, direction: str, device: Any, seed: int = 0) -> tuple[Any, Any]:
    """``answer``, and the ``lse`` the kernel returned (the ``lse`` axis; None without it)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    p = prepare(case, direction, device, seed)
    opts = p.opts
    backward = direction == "fwdbwd"
    expected = tuple(p.q.shape[:3]) + (case.n_head_dim_v,)

    def run_on(xs: tuple[Any, ...], grad_out: Any, check: bool = False) -> Any:
        result = kernel.fn(*laid_out(case.layout, xs, HEAD_AXIS, 2), **opts, **call_axes.call_kwargs(case, p.mask))
        out, lse = call_axes.returned(kernel, result, case, expected, xs[0].dtype, xs[0].device, check)
        outs = (out,) if lse is None else (out, lse)
        if not backward:
            return outs
        if check:
            return outs + tuple(plain(kernel, g) for g in gradients(kernel.name, out, xs, ("q", "k", "v"), grad_out))
        return outs + tuple(plain(kernel, g) for g in torch.autograd.grad(out, xs, grad_out))

    inputs, grad_out = own_copies((p.q, p.k, p.v)), p.grad_out.clone()

    def call() -> Any:
        return run_on(inputs, grad_out)

    got = tuple(x.detach() for x in call_checked(kernel, lambda: run_on(inputs, grad_out, True), "q, k, v",
                                                 inputs, device))
    lse = None
    if case.lse:
        lse, got = got[1], got[:1] + got[2:]
    n = len(got)
    return Answer(TENSORS[:n], got, p.reference[:n], p.yardstick(kernel.tf32)[:n], call, run_on=run_on, inputs=inputs,
                  input_names=("q", "k", "v"), grad_out=grad_out if backward else None), lse


def check_case(kernel: Kernel, case: SoftmaxCase, direction: str, device: Any, seed: int = 0) -> Any:
    """Check ``kernel`` on ``case`` against the fp64 reference (outputs, and gradients for
    ``fwdbwd``): its return value first (``answer``), then each tensor (``check_tensor``);
    return a ``checks.Checked``: the callable to time and each tensor's worst error over its bound.

    A case with call axes (``families.softmax.axes``) is held first to the rule for rows with no
    visible key (output 0, LSE -inf), its ``lse`` to ``axes.lse_bound``; it is timed with its
    timed draws (``DRAWN_AXES``; a masked case's of signs only, ``SIGNED_AXES``; a KV-cache case's are
    ``families.softmax.cache``'s); a ``relation`` row checks
    its metamorphic relation instead of the reference; an
    ``inference`` case's forward is also called under ``torch.inference_mode()``
    (``families.softmax.relations``)."""
    if case.relation:
        return relations.check(kernel, case, prepare(case, "fwd", device, seed), device)
    a, lse = _answer(kernel, case, direction, device, seed)
    p = prepare(case, direction, device, seed)
    if p.empty is not None:
        call_axes.check_empty_rows(kernel.name, a.got[0], lse, p.empty)

    def check(label: str, name: str, value: Any, reference: Any, yardstick: Any) -> float:
        return check_tensor(label, name, value, reference, yardstick, case.dtype, kernel.tf32)

    try:
        ratios = {name: check(f"{kernel.name} {name}", name, value, ref, mine)
                  for name, value, ref, mine in zip(a.names, a.got, a.reference, a.yardstick, strict=True)}
    except CheckFailed as exc:
        if case.dtype != "fp32" or kernel.tf32 or not _passes_tf32(a, prepare(case, direction, device, seed)):
            raise
        raise CheckFailed(f"{exc}\n  {TF32_HINT}", exc.ratio) from None
    if lse is not None:
        allowed = call_axes.lse_bound(p.q, p.k, p.opts, p.mask, p.lse, case.dtype)
        ratios["lse"] = call_axes.check_lse(f"{kernel.name} lse", lse, p.lse, allowed)
    if case.inference and direction == "fwd":
        relations.inference_agrees(kernel, case, p, a.got[0], device)
    if not set(case.axes) <= DRAWN_AXES | SIGNED_AXES:
        return Checked(a.call, ratios)
    if case.lse:  # its timed calls held to the output and gradients (the LSE is checked on draw 0)
        a = replace(a, call=_without_lse(a.call), run_on=_without_lse(a.run_on))
    permute = set(case.axes) <= DRAWN_AXES  # a mask stays where it is: signs only
    return Checked(timed(a, kernel.name, check, f"{case.id}:{direction}:{seed}", HEAD_AXIS, permute=permute), ratios)


# the call axes whose cases' timed draws rearrange as a plain case's do (batch entries and heads
# permuted, v negated): a shape (more queries than keys, a value head dim of its own) or a returned
# LSE; a mask (per batch entry and head) would have to move with them, so a masked case's draws
# move signs only (v negated, its value columns varied, the output gradient negated), the mask
# where it is (a KV-cache case's draws are families.softmax.cache's, signs only too)
DRAWN_AXES = frozenset({"lse", "q-gt-k", "v-dim"})
SIGNED_AXES = frozenset({"mask"})


def _without_lse(call: Any) -> Any:
    """``call`` returning its results without the LSE (the second): what a timed draw is held to."""
    def stripped(*args: Any) -> Any:
        got = call(*args)
        return got[:1] + got[2:]

    return stripped


TF32_HINT = ("held to PyTorch's fp32 with TF32 products, every tensor passes: a kernel whose fp32 matrix products "
             "run in TF32 (Triton's tl.dot of fp32 operands does by default) is registered with tf32=True")


# the share of an fp32 output's elements outside its plain fp32 bound above which a failure reads as
# TF32's: TF32 products put 96-99% of them outside on the CPU table's fp32 rows; a wrong fp32
# kernel's sparse error 0.1%, and a wrong gradient none (its output passes)
TF32_SHARE = 0.5


def _passes_tf32(a: Any, p: PreparedSoftmax) -> bool:
    """Whether an fp32 answer fails as TF32 products make it fail: most of its output's elements
    outside their plain fp32 bound (``TF32_SHARE``), and every tensor within the TF32 yardstick's."""
    out, ref, plain = a.got[0], a.reference[0], p.torch_value[0]
    allowed = allowance(ref, plain, dtype="fp32", factor=ELEMENT_FACTOR["fp32"])[0]
    outside = float(((out.double() - ref.double()).abs() > allowed).double().mean().item())
    if not outside > TF32_SHARE:
        return False
    try:
        for name, value, ref, mine in zip(a.names, a.got, a.reference, p.yardstick(True), strict=False):
            check_tensor(name, name, value, ref, mine, "fp32", True)
    except CheckFailed:
        return False
    return True


def run_case(kernel: Kernel, case: SoftmaxCase, direction: str, device: Any, seed: int = 0) -> Any:
    """``check_case``, returning the zero-argument callable to time."""
    return check_case(kernel, case, direction, device, seed).call
