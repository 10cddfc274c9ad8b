"""A zoo of softmax-attention kernels: right ones that round differently from PyTorch, and wrong
ones, each wrong in one known way.

Load it as a pytest plugin (``-p tests.zoo.softmax`` from the repository root, or import its hook
into a conftest.py): ``pytest_attnperf_register_kernels`` adds every kernel to the ``softmax``
family, whose suites then check them like any user's kernel. ``zoo-ok-*`` kernels are right and
should pass every case they take; each ``zoo-bad-*`` kernel plants the one bug its docstring
names and should fail at least one case of the CPU table. ``KERNELS`` lists them all.

Every kernel has the family's signature, ``fn(q, k, v, *, causal, scale, window=None) -> out``
(``[B, H, T, d]``, K/V may have fewer heads), runs on any device, and has a backward that
autograd derives from its forward. The work is cut into pieces (a run of batch items times a
tile of queries, with only the keys those queries can see) small enough for the GPU table's
shapes; where there are several, each piece is recomputed in the backward
(``torch.utils.checkpoint``), so autograd holds one piece's intermediates at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from pytest_attnperf.families.registry import KernelRegistry
from pytest_attnperf.families.softmax.kernels import SoftmaxCase

from .tf32 import TF32Mode

__all__ = ["FAMILY", "KERNELS", "ZooKernel", "pytest_attnperf_register_kernels", "register"]

FAMILY = "softmax"
LOG2E = math.log2(math.e)
PIECE_ELEMENTS = 1 << 26  # score elements one piece holds at most (256 MiB in fp32)
MIN_ROWS = 128  # queries a tile keeps at least, before batch items are cut instead
NEG_INF = float("-inf")

# (queries, keys, values, visible pairs or None for all, scale) -> output, in the queries' dtype
Piece = Callable[[Tensor, Tensor, Tensor, "Tensor | None", float], Tensor]
KernelFn = Callable[..., Tensor]


@dataclass(frozen=True)
class ZooKernel:
    """One kernel of the zoo and the registry options it is added with."""

    name: str
    fn: KernelFn
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        """Whether the kernel is meant to pass (``zoo-ok-*``)."""
        return self.name.startswith("zoo-ok-")


KERNELS: list[ZooKernel] = []


def _zoo(name: str, **options: Any) -> Callable[[KernelFn], KernelFn]:
    def add(fn: KernelFn) -> KernelFn:
        KERNELS.append(ZooKernel(name, fn, options))
        return fn

    return add


def _equal_lengths(supports: Callable[[Any], str | None] | None) -> Callable[[Any], str | None]:
    """``supports``, refusing decode cases first: the zoo's masks assume as many keys as queries."""

    def check(case: Any) -> str | None:
        if getattr(case, "decode", False):
            return "the zoo's kernels take equal query and key lengths (tests/zoo/decode.py has decode kernels)"
        return supports(case) if supports is not None else None

    return check


def register(registry: KernelRegistry) -> None:
    """Add every zoo kernel to ``registry`` in family ``softmax`` (decode cases refused)."""
    for kernel in KERNELS:
        options = {"tiled": False, **kernel.options,  # pieces of materialised scores: no memory bound
                   "supports": _equal_lengths(kernel.options.get("supports"))}
        registry.kernel(family=FAMILY, name=kernel.name, **options)(kernel.fn)


def pytest_attnperf_register_kernels(registry: KernelRegistry, config: object) -> None:
    """The plugin hook: the zoo joins the softmax suites."""
    register(registry)


# -- masks and pieces ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Mask:
    """Which keys each query sees. The reference's rule (causal, and a window of ``window`` keys
    when causal) with knobs that plant bugs: ``ahead`` future keys seen, the diagonal missed
    (except by the first query, which would see nothing), the last ``tail`` queries blind to
    the last key."""

    causal: bool
    window: int | None = None
    ahead: int = 0
    diagonal: bool = True
    tail: int = 0

    def keys(self, q0: int, q1: int, seq: int) -> tuple[int, int]:
        """The keys queries ``q0 .. q1 - 1`` can see, as a half-open range."""
        if not self.causal:
            return 0, seq
        first = max(0, q0 - self.window + 1) if self.window is not None else 0
        return first, min(seq, q1 + self.ahead)

    def visible(self, q0: int, q1: int, k0: int, k1: int, seq: int, device: torch.device) -> Tensor | None:
        """Boolean ``[q1 - q0, k1 - k0]`` of visible pairs, or None where every pair is."""
        if not self.causal and not self.tail:
            return None
        i = torch.arange(q0, q1, device=device)[:, None]
        j = torch.arange(k0, k1, device=device)[None, :]
        if self.causal:
            seen = j <= i + self.ahead if self.diagonal else (j < i) | ((i == 0) & (j == 0))
            if self.window is not None:
                seen = seen & (j > i - self.window)
        else:
            seen = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=device)
        if self.tail:
            seen = seen & ~((i >= seq - self.tail) & (j == seq - 1))
        return seen


def _expand(x: Tensor, heads: int, interleave: bool = True) -> Tensor:
    """K or V with one head per query head: each K/V head serves ``heads // kv_heads``
    consecutive query heads (``interleave``), or, wrongly, the heads cycle."""
    group = heads // x.shape[1]
    if group == 1:
        return x
    return x.repeat_interleave(group, dim=1) if interleave else x.repeat(1, group, 1, 1)


def _floor_pow2(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def _run_piece(piece: Piece, mask: Mask, scale: float, span: tuple[int, int, int, int], seq: int,
               q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    q0, q1, k0, k1 = span
    return piece(q, k, v, mask.visible(q0, q1, k0, k1, seq, q.device), scale)


def attend(q: Tensor, k: Tensor, v: Tensor, piece: Piece, mask: Mask, scale: float, *, align: int = 1,
           expand: bool = True) -> Tensor:
    """``piece`` over the whole problem, one run of batch items and tile of queries at a time.

    Each tile sees the keys its queries can see, from a multiple of ``align`` (a blocked
    kernel's key blocks then sit where a kernel's would); ``expand`` gives K/V one head per
    query head first (GQA). With several pieces and gradients wanted, each piece is
    recomputed in the backward, so that autograd keeps one piece's intermediates at a time."""
    from torch.utils.checkpoint import checkpoint

    batch, heads, seq, _ = q.shape
    if expand:
        k, v = _expand(k, heads), _expand(v, heads)
    rows = seq
    if batch * heads * seq * seq > PIECE_ELEMENTS:
        rows = max(min(seq, MIN_ROWS), _floor_pow2(PIECE_ELEMENTS // (batch * heads * seq)))
    items = batch if batch * heads * rows * seq <= PIECE_ELEMENTS else max(1, PIECE_ELEMENTS // (heads * rows * seq))
    several = rows < seq or items < batch
    recompute = several and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    runs = []
    for b0 in range(0, batch, items):
        tiles = []
        for q0 in range(0, seq, rows):
            q1 = min(seq, q0 + rows)
            k0, k1 = mask.keys(q0, q1, seq)
            k0 -= k0 % align
            args = (q[b0:b0 + items, :, q0:q1], k[b0:b0 + items, :, k0:k1], v[b0:b0 + items, :, k0:k1])

            def run(qt: Tensor, kt: Tensor, vt: Tensor, span: tuple[int, int, int, int] = (q0, q1, k0, k1)) -> Tensor:
                return _run_piece(piece, mask, scale, span, seq, qt, kt, vt)

            out = checkpoint(run, *args, use_reentrant=False, preserve_rng_state=False) if recompute else run(*args)
            tiles.append(out)
        runs.append(torch.cat(tiles, dim=2) if len(tiles) > 1 else tiles[0])
    return torch.cat(runs, dim=0) if len(runs) > 1 else runs[0]


def _masked(s: Tensor, seen: Tensor | None) -> Tensor:
    return s if seen is None else s.masked_fill(~seen, NEG_INF)


def _safe(m: Tensor) -> Tensor:
    """A running max with rows that saw no key yet (-inf) at 0, so that exp(-inf - 0) = 0."""
    return m.masked_fill(m == NEG_INF, 0.0)


def _in(dtype: torch.dtype) -> Piece:
    """The plain algorithm in ``dtype``: materialised scores, softmax, P @ V."""

    def piece(q: Tensor, k: Tensor, v: Tensor, seen: Tensor | None, scale: float) -> Tensor:
        s = _masked((q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale, seen)
        return (torch.softmax(s, dim=-1) @ v.to(dtype)).to(q.dtype)

    return piece


def _online(block: int, *, p_fp32: bool = False, exp2: bool = False, reverse: bool = False,
            max_grad: bool = False) -> Piece:
    """Online softmax over key blocks of ``block``: fp32 running max, sum and accumulator,
    each block's P rounded to the input dtype before P @ V (``p_fp32``: kept in fp32)."""

    def piece(q: Tensor, k: Tensor, v: Tensor, seen: Tensor | None, scale: float) -> Tensor:
        low = q.dtype
        q32, k32, v32 = q.float(), k.float(), v.float()
        fold = scale * LOG2E if exp2 else scale
        power = torch.exp2 if exp2 else torch.exp
        m = q32.new_full(q.shape[:-1], NEG_INF)
        total = q32.new_zeros(q.shape[:-1])
        acc = q32.new_zeros(q.shape)
        starts = list(range(0, k.shape[2], block))
        for j0 in reversed(starts) if reverse else starts:
            j1 = min(j0 + block, k.shape[2])
            s = (q32 @ k32[:, :, j0:j1].transpose(-1, -2)) * fold
            s = _masked(s, None if seen is None else seen[:, j0:j1])
            top = s.amax(dim=-1) if max_grad else s.detach().amax(dim=-1)
            m_new = torch.maximum(m, top)
            base = _safe(m_new)
            alpha = power(m - base)
            p = power(s - base[..., None])
            total = total * alpha + p.sum(dim=-1)
            pv = (p if p_fp32 else p.to(low).float()) @ v32[:, :, j0:j1]
            acc = acc * alpha[..., None] + pv
            m = m_new
        return (acc / total[..., None]).to(low)

    return piece


def _two_pass(block: int) -> Piece:
    """Two passes over key blocks: the row max and sum first (fp32), then the normalised P,
    rounded to the input dtype, times V, accumulated in fp32."""

    def piece(q: Tensor, k: Tensor, v: Tensor, seen: Tensor | None, scale: float) -> Tensor:
        q32, k32, v32 = q.float(), k.float(), v.float()
        spans = [(j0, min(j0 + block, k.shape[2])) for j0 in range(0, k.shape[2], block)]
        scores = [_masked((q32 @ k32[:, :, a:b].transpose(-1, -2)) * scale, None if seen is None else seen[:, a:b])
                  for a, b in spans]
        m = torch.stack([s.detach().amax(dim=-1) for s in scores]).amax(dim=0)[..., None]
        total = sum((torch.exp(s - m).sum(dim=-1, keepdim=True) for s in scores), torch.zeros_like(m))
        out = q32.new_zeros(q.shape)
        for (a, b), s in zip(spans, scores, strict=True):
            out = out + (torch.exp(s - m) / total).to(q.dtype).float() @ v32[:, :, a:b]
        return out.to(q.dtype)

    return piece


def _split_kv(splits: int) -> Piece:
    """Flash-decoding's split-KV: softmax over each of ``splits`` runs of keys, the partial
    outputs (fp32) merged with log-sum-exp weights."""

    def piece(q: Tensor, k: Tensor, v: Tensor, seen: Tensor | None, scale: float) -> Tensor:
        q32, k32, v32 = q.float(), k.float(), v.float()
        keys = k.shape[2]
        edges = [keys * i // splits for i in range(splits + 1)]
        outs, lses = [], []
        for a, b in zip(edges, edges[1:], strict=False):
            if a == b:
                continue
            s = _masked((q32 @ k32[:, :, a:b].transpose(-1, -2)) * scale, None if seen is None else seen[:, a:b])
            m = _safe(s.detach().amax(dim=-1, keepdim=True))
            p = torch.exp(s - m)
            total = p.sum(dim=-1, keepdim=True)
            some = total > 0
            total_safe = torch.where(some, total, torch.ones_like(total))
            outs.append((p.to(q.dtype).float() @ v32[:, :, a:b]) / total_safe)
            lses.append(torch.where(some, m + torch.log(total_safe), torch.full_like(total, NEG_INF)))
        weights = torch.softmax(torch.stack(lses), dim=0)
        return (weights * torch.stack(outs)).sum(dim=0).to(q.dtype)

    return piece


def _lse_fp32(q: Tensor, k: Tensor, v: Tensor, seen: Tensor | None, scale: float) -> Tensor:
    s = _masked((q.float() @ k.float().transpose(-1, -2)) * scale, seen)
    p = torch.exp(s - torch.logsumexp(s, dim=-1, keepdim=True))
    return (p @ v.float()).to(q.dtype)


def _prescaled(q: Tensor, k: Tensor, v: Tensor, seen: Tensor | None, scale: float) -> Tensor:
    s = _masked((q * scale) @ k.transpose(-1, -2), seen)
    return torch.softmax(s, dim=-1) @ v


def _grouped(q: Tensor, k: Tensor, v: Tensor, seen: Tensor | None, scale: float) -> Tensor:
    """K/V heads not expanded: each K/V head's group of query heads stacked into its rows."""
    batch, heads, rows, dim = q.shape
    group = heads // k.shape[1]
    qg = q.float().reshape(batch, k.shape[1], group * rows, dim)
    s = _masked((qg @ k.float().transpose(-1, -2)) * scale, None if seen is None else seen.repeat(group, 1))
    out = torch.softmax(s, dim=-1).to(q.dtype).float() @ v.float()
    return out.reshape(batch, heads, rows, dim).to(q.dtype)


def _rowsum_detached(q: Tensor, k: Tensor, v: Tensor, seen: Tensor | None, scale: float) -> Tensor:
    s = _masked((q.float() @ k.float().transpose(-1, -2)) * scale, seen)
    p = torch.exp(s - s.detach().amax(dim=-1, keepdim=True))
    return ((p @ v.float()) / p.sum(dim=-1, keepdim=True).detach()).to(q.dtype)


def _fp32(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None,
          **mask: Any) -> Tensor:
    """The plain algorithm in fp32, the base of most wrong kernels."""
    return attend(q, k, v, _in(torch.float32), Mask(causal, window, **mask), scale)


# -- right kernels -------------------------------------------------------------------------------


@_zoo("zoo-ok-online-b32")
def ok_online_b32(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
    """Online softmax over key blocks of 32 (fp32 max, sum, accumulator; P rounded to the input dtype)."""
    return attend(q, k, v, _online(32), Mask(causal, window), scale, align=32)


@_zoo("zoo-ok-online-b64")
def ok_online_b64(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
    """Online softmax over key blocks of 64 (fp32 max, sum, accumulator; P rounded to the input dtype)."""
    return attend(q, k, v, _online(64), Mask(causal, window), scale, align=64)


@_zoo("zoo-ok-online-b128")
def ok_online_b128(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                   window: int | None = None) -> Tensor:
    """Online softmax over key blocks of 128 (fp32 max, sum, accumulator; P rounded to the input dtype)."""
    return attend(q, k, v, _online(128), Mask(causal, window), scale, align=128)


@_zoo("zoo-ok-online-b64-pfp32")
def ok_online_b64_pfp32(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                        window: int | None = None) -> Tensor:
    """Online softmax over key blocks of 64 with P kept in fp32 for P @ V."""
    return attend(q, k, v, _online(64, p_fp32=True), Mask(causal, window), scale, align=64)


@_zoo("zoo-ok-online-exp2-b64")
def ok_online_exp2_b64(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                       window: int | None = None) -> Tensor:
    """Online softmax over key blocks of 64 in base 2: exp2 with log2(e) * scale folded into the scores."""
    return attend(q, k, v, _online(64, exp2=True), Mask(causal, window), scale, align=64)


@_zoo("zoo-ok-online-reverse-b64")
def ok_online_reverse_b64(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                          window: int | None = None) -> Tensor:
    """Online softmax over key blocks of 64, the last block first (the diagonal's, under a causal mask)."""
    return attend(q, k, v, _online(64, reverse=True), Mask(causal, window), scale, align=64)


@_zoo("zoo-ok-online-maxgrad-b32")
def ok_online_maxgrad_b32(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                          window: int | None = None) -> Tensor:
    """Online softmax over key blocks of 32 whose gradient also flows through the running max (it cancels)."""
    return attend(q, k, v, _online(32, max_grad=True), Mask(causal, window), scale, align=32)


@_zoo("zoo-ok-two-pass-b64")
def ok_two_pass_b64(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                    window: int | None = None) -> Tensor:
    """Two passes over key blocks of 64: max and sum first, then normalised P (input dtype) @ V in fp32."""
    return attend(q, k, v, _two_pass(64), Mask(causal, window), scale, align=64)


@_zoo("zoo-ok-split-kv2")
def ok_split_kv2(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
    """Split-KV: softmax over 2 runs of keys, partial outputs merged with log-sum-exp weights."""
    return attend(q, k, v, _split_kv(2), Mask(causal, window), scale)


@_zoo("zoo-ok-split-kv3")
def ok_split_kv3(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
    """Split-KV: softmax over 3 uneven runs of keys, partial outputs merged with log-sum-exp weights."""
    return attend(q, k, v, _split_kv(3), Mask(causal, window), scale)


@_zoo("zoo-ok-split-kv4")
def ok_split_kv4(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
    """Split-KV: softmax over 4 runs of keys, partial outputs merged with log-sum-exp weights."""
    return attend(q, k, v, _split_kv(4), Mask(causal, window), scale)


@_zoo("zoo-ok-fp32")
def ok_fp32(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
    """The plain algorithm in fp32 throughout: upcast, compute, round the output to the input dtype."""
    return _fp32(q, k, v, causal=causal, scale=scale, window=window)


@_zoo("zoo-ok-lse-fp32")
def ok_lse_fp32(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
    """Softmax as exp(s - logsumexp(s)) in fp32, no division by the row sum."""
    return attend(q, k, v, _lse_fp32, Mask(causal, window), scale)


@_zoo("zoo-ok-prescaled-q")
def ok_prescaled_q(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                   window: int | None = None) -> Tensor:
    """The plain algorithm in the input dtype with the scale applied to q (rounded) instead of the scores."""
    return attend(q, k, v, _prescaled, Mask(causal, window), scale)


@_zoo("zoo-ok-gqa-grouped")
def ok_gqa_grouped(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                   window: int | None = None) -> Tensor:
    """GQA without expanding K/V: a K/V head's query heads stacked as rows (fp32 scores, P in input dtype)."""
    return attend(q, k, v, _grouped, Mask(causal, window), scale, expand=False)


def _tf32(piece: Piece, nearest: bool = False) -> Piece:
    """``piece`` with every fp32 matrix product's operands rounded to TF32, forward and backward:
    truncated, as Triton's ``tl.dot`` reads fp32 tiles by default, or (``nearest``) rounded half to
    even, as a kernel that rounds them first; bf16 and fp16 lose nothing to it. Entered in the
    piece, so a recomputed piece (checkpoint) rounds alike."""

    def rounded(q: Tensor, k: Tensor, v: Tensor, seen: Tensor | None, scale: float) -> Tensor:
        with TF32Mode(nearest):
            return piece(q, k, v, seen, scale)

    return rounded


@_zoo("zoo-ok-tf32-online-b64", tf32=True)
def ok_tf32_online_b64(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                       window: int | None = None) -> Tensor:
    """Online softmax over key blocks of 64 with TF32 products (fp32 P), registered with tf32=True."""
    return attend(q, k, v, _tf32(_online(64, p_fp32=True)), Mask(causal, window), scale, align=64)


@_zoo("zoo-ok-tf32-rne-online-b128", tf32=True)
def ok_tf32_rne_online_b128(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                            window: int | None = None) -> Tensor:
    """Online softmax over key blocks of 128, TF32 products rounded half to even, registered with tf32=True."""
    return attend(q, k, v, _tf32(_online(128), nearest=True), Mask(causal, window), scale, align=128)


def _bf16_only(case: SoftmaxCase) -> str | None:
    return None if case.dtype == "bf16" else "computes bf16 inputs in fp16; this case is not bf16"


@_zoo("zoo-ok-fp16-in-bf16", supports=_bf16_only)
def ok_fp16_in_bf16(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                    window: int | None = None) -> Tensor:
    """bf16 inputs computed plainly in fp16 (3 more mantissa bits); declines inputs whose scores could overflow fp16."""
    if q.dtype != torch.bfloat16:
        raise NotImplementedError(f"computes bf16 inputs in fp16; these are {q.dtype}")
    bound = float(q.detach().abs().amax()) * float(k.detach().abs().amax()) * q.shape[-1]
    if not bound < 2.0**15 or not float(v.detach().abs().amax()) < 2.0**15:
        raise NotImplementedError(f"scores up to {bound:.3g} or values could overflow fp16")
    return attend(q, k, v, _in(torch.float16), Mask(causal, window), scale)


def _plain(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, window: int | None) -> Tensor:
    """The plain algorithm in the input dtype, whole, for torch.compile."""
    heads, seq = q.shape[1], q.shape[2]
    k, v = _expand(k, heads), _expand(v, heads)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(seq, device=q.device)[:, None]
        j = torch.arange(seq, device=q.device)[None, :]
        seen = j <= i
        if window is not None:
            seen = seen & (j > i - window)
        s = s.masked_fill(~seen, NEG_INF)
    return torch.softmax(s, dim=-1) @ v


_compiled: dict[bool, Callable[..., Tensor]] = {}


def _compile(dynamic: bool) -> Callable[..., Tensor]:
    if dynamic not in _compiled:
        _compiled[dynamic] = torch.compile(_plain, dynamic=dynamic, fullgraph=True)
    return _compiled[dynamic]


def _run_compiled(dynamic: bool, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float,
                  window: int | None) -> Tensor:
    import torch._dynamo

    # one compiled graph per shape, dtype, mask and grad mode of the GPU table: more than
    # dynamo's default of 8 recompilations of one function, after which it runs eagerly
    with torch._dynamo.config.patch(recompile_limit=64):
        out: Tensor = _compile(dynamic)(q, k, v, causal, scale, window)
    return out


# torch.compile on the CPU takes 1-7 s per shape and direction (18 s over the CPU table static,
# 59 s dynamic, 2 cores): too slow for the CPU tests, so these two run on CUDA only
@_zoo("zoo-ok-compile-static", device_kinds=("cuda",))
def ok_compile_static(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                      window: int | None = None) -> Tensor:
    """torch.compile (inductor, static shapes) of the plain algorithm in the input dtype."""
    return _run_compiled(False, q, k, v, causal, scale, window)


@_zoo("zoo-ok-compile-dynamic", device_kinds=("cuda",))
def ok_compile_dynamic(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                       window: int | None = None) -> Tensor:
    """torch.compile (inductor, dynamic shapes) of the plain algorithm in the input dtype."""
    return _run_compiled(True, q, k, v, causal, scale, window)


# -- wrong kernels -------------------------------------------------------------------------------


def _sparse(out: Tensor, factor: float) -> Tensor:
    """``out`` with one element in a thousand times ``factor``: in row r (of the flattened
    leading dimensions) column (601 r) mod 1000, where that is a column at all."""
    dim = out.shape[-1]
    rows = torch.arange(out.numel() // dim, device=out.device)
    column = (rows * 601) % 1000
    picked = (torch.arange(dim, device=out.device)[None, :] == column[:, None]).reshape(out.shape)
    return torch.where(picked, (out.float() * factor).to(out.dtype), out)


@_zoo("zoo-bad-sparse-1pct")
def bad_sparse_1pct(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                    window: int | None = None) -> Tensor:
    """Right in fp32, then 0.1% of the output elements (a fixed pattern) times 1.01."""
    return _sparse(_fp32(q, k, v, causal=causal, scale=scale, window=window), 1.01)


@_zoo("zoo-bad-sparse-5pct")
def bad_sparse_5pct(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                    window: int | None = None) -> Tensor:
    """Right in fp32, then 0.1% of the output elements (a fixed pattern) times 1.05."""
    return _sparse(_fp32(q, k, v, causal=causal, scale=scale, window=window), 1.05)


@_zoo("zoo-bad-dense-3pct")
def bad_dense_3pct(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                   window: int | None = None) -> Tensor:
    """Right in fp32, then every output element times 1 + 2^-5."""
    return (_fp32(q, k, v, causal=causal, scale=scale, window=window).float() * (1 + 2.0**-5)).to(q.dtype)


@_zoo("zoo-bad-causal-sees-next")
def bad_causal_sees_next(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                         window: int | None = None) -> Tensor:
    """Causal mask off by one: each query also sees the next key."""
    return _fp32(q, k, v, causal=causal, scale=scale, window=window, ahead=1)


@_zoo("zoo-bad-causal-no-diagonal")
def bad_causal_no_diagonal(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                           window: int | None = None) -> Tensor:
    """Causal mask off by one: each query misses its own key (the first query, alone, keeps it)."""
    return _fp32(q, k, v, causal=causal, scale=scale, window=window, diagonal=False)


@_zoo("zoo-bad-window-wide")
def bad_window_wide(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                    window: int | None = None) -> Tensor:
    """Sliding window off by one: each query sees window + 1 keys."""
    return _fp32(q, k, v, causal=causal, scale=scale, window=None if window is None else window + 1)


@_zoo("zoo-bad-window-narrow")
def bad_window_narrow(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                      window: int | None = None) -> Tensor:
    """Sliding window off by one: each query sees window - 1 keys."""
    return _fp32(q, k, v, causal=causal, scale=scale, window=None if window is None else max(1, window - 1))


@_zoo("zoo-bad-scale-inv-d")
def bad_scale_inv_d(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                    window: int | None = None) -> Tensor:
    """Wrong scale: 1/d instead of the given 1/sqrt(d)."""
    return _fp32(q, k, v, causal=causal, scale=1.0 / q.shape[-1], window=window)


@_zoo("zoo-bad-tail-last-key")
def bad_tail_last_key(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                      window: int | None = None) -> Tensor:
    """A tail bug: the last 16 queries miss the last key (under a causal mask only the last query sees it)."""
    return _fp32(q, k, v, causal=causal, scale=scale, window=window, tail=16)


@_zoo("zoo-bad-gqa-cycled")
def bad_gqa_cycled(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                   window: int | None = None) -> Tensor:
    """GQA heads mapped wrongly: K/V heads cycled (repeat) instead of grouped (repeat_interleave)."""
    heads = q.shape[1]
    k, v = _expand(k, heads, interleave=False), _expand(v, heads, interleave=False)
    return _fp32(q, k, v, causal=causal, scale=scale, window=window)


@_zoo("zoo-bad-rowsum-detached")
def bad_rowsum_detached(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                        window: int | None = None) -> Tensor:
    """Forward right; the backward treats the softmax's row sum as a constant (dq and dk wrong)."""
    return attend(q, k, v, _rowsum_detached, Mask(causal, window), scale)


@_zoo("zoo-bad-drops-dk")
def bad_drops_dk(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                 window: int | None = None) -> Tensor:
    """Forward right; k's gradient dropped (k detached, kept in the graph with a zero gradient)."""
    # a k left out of the graph altogether would make autograd.grad raise, not give a wrong number
    return _fp32(q, k.detach() + 0 * k, v, causal=causal, scale=scale, window=window)


@_zoo("zoo-bad-tf32-dense-1pct", tf32=True)
def bad_tf32_dense_1pct(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float,
                        window: int | None = None) -> Tensor:
    """TF32 products, registered with tf32=True, then every output element times 1.01."""
    out = attend(q, k, v, _tf32(_online(64, p_fp32=True)), Mask(causal, window), scale, align=64)
    return (out.float() * 1.01).to(out.dtype)


def _grad_times(x: Tensor, factor: float, where: str) -> Tensor:
    """``x``, same values, whose gradient is multiplied by ``factor`` on head 1 (``head``), on
    batch item 1 (``batch``; the last where there are fewer) or everywhere (``all``)."""
    if where == "all":
        return x + (factor - 1) * (x - x.detach())
    weight = torch.zeros(x.shape[0], x.shape[1], 1, 1, dtype=x.dtype, device=x.device)
    if where == "head":
        weight[:, min(1, x.shape[1] - 1)] = factor - 1
    else:
        weight[min(1, x.shape[0] - 1)] = factor - 1
    return x + weight * (x - x.detach())


def _wrong_grad(which: str, where: str, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float,
                window: int | None) -> Tensor:
    inputs = {"q": q, "k": k, "v": v}
    inputs[which] = _grad_times(inputs[which], 1.01, where)
    return _fp32(inputs["q"], inputs["k"], inputs["v"], causal=causal, scale=scale, window=window)


def _wrong_grad_kernel(which: str, where: str) -> KernelFn:
    """The kernel of ``_wrong_grad(which, where, ...)``: forward right, d``which`` times 1.01 at ``where``."""

    def kernel(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
        return _wrong_grad(which, where, q, k, v, causal, scale, window)

    places = {"head": "on head 1 only" if which == "q" else "on K/V head 1 only", "batch": "on batch item 1 only",
              "all": "everywhere"}
    kernel.__doc__ = f"Forward right; d{which} times 1.01 {places[where]}."
    return kernel


for _which in "qkv":
    for _where in ("head", "batch", "all"):
        _zoo(f"zoo-bad-d{_which}-{_where}")(_wrong_grad_kernel(_which, _where))
