"""A zoo for the correctness catalogue: wrong kernels, each tied to one trigger class of
``families.catalogue.CLASSES`` and written after a published class of attention-kernel bugs
(FlashAttention, flash-linear-attention, PyTorch SDPA / FlexAttention / cuDNN, xformers, FlashInfer,
vLLM), each beside a correct twin that differs from it only by the bug.

A wrong kernel, ``bug-<name>``, is its family's plain kernel with one knob turned: the bug planted on
one code path. Where that path does nothing in the plain kernel (a mask, a maximum, an index), the
twin is the plain kernel itself, ``twin-plain`` (the linear families': ``twin-plain-c<chunk>``, per
chunk size), shared by every such bug; where the path is the pair's own (a decode path, folded heads,
a backward of its own, a copy of a strided input), the twin, ``twin-<name>``, takes it without the
bug. ``PAIRS`` lists them, each with its class and the directions its bug lives in (a backward
bug: ``fwdbwd`` only); ``register(registry)`` adds every wrong kernel and twin
(``-p tests.zoo.catalogue`` as a plugin).

Softmax kernels (``fn(q, k, v, *, causal, scale, window=None)``, ``[B, H, T, d]``) compute plainly in
float32 (scores materialised, the row maximum subtracted, the sum divided last), as real kernels do,
so a bug that lives in float32's range (an exp past 88, a sum of exp(-150)) shows. The linear
families' kernels (fla's layout ``[B, T, H, D]``) are one chunked form in float64: a chunk's decays
materialised (``exp(G_r - G_s)``, masked before the exp), the state carried across chunks by a scan
(GDN's chunk by chunk, its writes from each chunk's triangular system); float64 keeps the gate's
gradient exact where strong gates make float32's cancel. Both are differentiable through autograd,
but for the pairs whose bug lives in a backward of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from pytest_attnperf.families.registry import Kernel, KernelRegistry

__all__ = ["PAIRS", "Pair", "pytest_attnperf_register_kernels", "register"]

NEG_INF = float("-inf")
TILE = 16  # the softmax kernels' key block (their tile-edge bugs)
GRID_ROWS = 65535  # a CUDA grid's y and z limit: batch x heads rows one launch takes
INDEX_16 = 1 << 16  # what a 16-bit index or count holds
KernelFn = Callable[..., Tensor]


PLAIN = "plain"  # the feature of the plain kernel: no knob turned


@dataclass(frozen=True)
class Pair:
    """A wrong kernel and its twin. ``feature`` names the code path of the bug; ``twin`` says what the
    twin does on that path where it is the pair's own (None: the twin is the plain kernel)."""

    family: str
    name: str
    cls: str  # the catalogue's trigger class the bug lives in
    bug: str  # the published bug class it models (the wrong kernel's docstring)
    feature: str
    twin: str | None = None
    chunk: int = 64  # the linear families' chunk (softmax: unused)
    directions: tuple[str, ...] = ("fwd", "fwdbwd")

    @property
    def wrong_name(self) -> str:
        return f"bug-{self.name}"

    @property
    def twin_name(self) -> str:
        if self.twin is not None:
            return f"twin-{self.name}"
        return f"twin-{PLAIN}" if self.family == "softmax" else f"twin-{PLAIN}-c{self.chunk}"

    def make(self, bad: bool) -> KernelFn:
        """The kernel's function: the bug planted (``bad``), or the twin."""
        feature = self.feature if bad or self.twin is not None else PLAIN
        if self.family == "softmax":
            return _softmax_kernel(feature, bad)
        return _linear_kernel(feature, bad, self.chunk)

    def kernel(self, bad: bool) -> Kernel:
        """The registry's kernel: the wrong one (``bad``) or the twin, its docstring one line."""
        fn = self.make(bad)
        if bad:
            doc = f"{self.bug} [{self.cls}]"
        elif self.twin is not None:
            doc = f"Twin of {self.wrong_name}: {self.twin}"
        else:
            doc = PLAIN_DOCS["softmax" if self.family == "softmax" else "linear"].format(chunk=self.chunk)
        name = self.wrong_name if bad else self.twin_name
        fn.__doc__ = doc
        fn.__name__ = fn.__qualname__ = name.replace("-", "_")
        return Kernel(self.family, name, fn, description=doc,
                      tiled=False)  # scores and decays materialised: no memory bound


PLAIN_DOCS = {
    "softmax": "The plain kernel, the twin of every bug-* without a path of its own: float32 scores, the row maximum "
               "subtracted, lower-right causal, K/V head h // group.",
    "linear": "The plain kernel, the twin of every bug-* of chunk {chunk} without a path of its own: the chunked form "
              "in float64, decays exp(G_r - G_s) masked before the exp, the state carried in float64.",
}


# -- pieces both families use ------------------------------------------------------------------------


def _read_as_contiguous(x: Tensor, bad: bool) -> Tensor:
    """``x`` itself (copied contiguous), or, wrongly, its storage read with a contiguous tensor's
    strides from its offset (``as_strided``: what ``.view`` of a raw pointer reads)."""
    if not bad:
        return x.contiguous()
    strides: list[int] = []
    step = 1
    for size in reversed(x.shape):
        strides.insert(0, step)
        step *= size
    return x.as_strided(tuple(x.shape), tuple(strides), x.storage_offset())


class _Gradient(torch.autograd.Function):
    """``x`` forward; backward, its gradient as ``edit(grad, x's strides)`` leaves it."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, edit: Callable[[Tensor, tuple[int, ...]], Tensor]) -> Tensor:
        ctx.edit, ctx.strides = edit, tuple(x.stride())
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.edit(grad, ctx.strides), None


def _grad_edited(x: Tensor, edit: Callable[[Tensor, tuple[int, ...]], Tensor]) -> Tensor:
    edited: Tensor = _Gradient.apply(x, edit)  # type: ignore[no-untyped-call]
    return edited


def _kept(grad: Tensor, strides: tuple[int, ...]) -> Tensor:
    return grad


# -- softmax ------------------------------------------------------------------------------------------


def _tail_dropped(grad: Tensor, strides: tuple[int, ...]) -> Tensor:
    """A gradient ``[B, H, Tk, d]`` whose keys past the last full tile were never written (zero)."""
    full = grad.shape[2] // TILE * TILE
    return torch.cat([grad[:, :, :full], torch.zeros_like(grad[:, :, full:])], dim=2)


def _stride0_overwritten(grad: Tensor, strides: tuple[int, ...]) -> Tensor:
    """A gradient ``[B, H, Tk, d]`` written per head into a buffer of the input's strides: where the
    heads' stride is 0 they share memory, and the last head's write is all that is left."""
    if strides[1] != 0 or grad.shape[1] == 1:
        return grad
    return grad[:, -1:].expand_as(grad).contiguous()


class _Attention(torch.autograd.Function):
    """Softmax attention in float32 with a backward of its own, flash-style: ``dS = P o (dP - D)``,
    ``D = rowsum(dO o O)`` (``delta``), or, wrongly, without ``D``."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, seen: Tensor, scale: float, delta: bool) -> Tensor:
        s = ((q @ k.mT) * scale).masked_fill(~seen, NEG_INF)
        m = s.amax(-1, keepdim=True)
        p = torch.exp(s - m.masked_fill(m == NEG_INF, 0.0))
        p = p / p.sum(-1, keepdim=True)
        out = p @ v
        ctx.save_for_backward(q, k, v, p, out)
        ctx.scale, ctx.delta = scale, delta
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, p, out = ctx.saved_tensors
        dp = grad @ v.mT
        ds = p * (dp - (grad * out).sum(-1, keepdim=True)) if ctx.delta else p * dp
        return ds @ k * ctx.scale, ds.mT @ q * ctx.scale, p.mT @ grad, None, None, None


def _visible(positions: Tensor, keys: int, offset: int, causal: bool, window: int | None) -> Tensor:
    """``[queries, keys]``: which keys each query (at ``positions``, aligned ``offset`` keys on) sees."""
    i = positions[:, None] + offset
    j = torch.arange(keys, device=positions.device)[None, :]
    seen = torch.ones(len(positions), keys, dtype=torch.bool, device=positions.device)
    if causal:
        seen = seen & (j <= i)
        if window is not None:
            seen = seen & (j > i - window)
    return seen


def _scores_softmax(q: Tensor, k: Tensor, v: Tensor, seen: Tensor, scale: float, feature: str, bad: bool) -> Tensor:
    """The plain algorithm in float32 on ``[R, X, Tq, d]`` queries and their keys; ``feature`` and
    ``bad`` pick one bug's code path."""
    if feature == "backward":
        out: Tensor = _Attention.apply(q, k, v, seen, scale, not bad)  # type: ignore[no-untyped-call]
        return out
    dim = q.shape[-1]
    used = 1 << (dim.bit_length() - 1) if feature == "head-dim" and bad else dim  # 96 run as 64
    s = ((q[..., :used] @ k[..., :used].mT) * scale).masked_fill(~seen, NEG_INF)
    if s.shape[-1]:
        m = s.detach().amax(-1, keepdim=True)
    else:  # no key at all: the sums stay 0, and the output 0/0
        m = s.new_full((*s.shape[:-1], 1), NEG_INF)
    if feature == "large-logits" and bad:
        m = torch.zeros_like(m)
    if feature == "negative-lse" and bad:
        m = m.clamp_min(0.0)
    m = m.masked_fill(m == NEG_INF, 0.0)  # a row that sees no key: exp(-inf - 0) = 0
    p = torch.exp(s - m)
    if feature == "ties" and bad:  # the maximum's own term, at its (first) index, and the terms below it
        top = p.gather(-1, s.detach().argmax(-1, keepdim=True))
        total = top + torch.where(s < m, p, torch.zeros_like(p)).sum(-1, keepdim=True)
    else:
        total = p.sum(-1, keepdim=True)
    out = (p @ v) / total
    if feature == "onehot" and bad:
        out = out.masked_fill((q == 0).all(-1, keepdim=True), 0.0)
    return out


def _softmax(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, window: int | None, feature: str,
             bad: bool) -> Tensor:
    """Softmax attention in float32, lower-right causal, GQA by consecutive query heads; ``feature``
    names the one code path where the pair differs, ``bad`` plants its bug there."""
    batch, heads, seq, dim = q.shape
    if feature == "layout-strided":
        q = _read_as_contiguous(q, bad)
    if feature == "layout-stride0":
        k, v = (_grad_edited(x, _stride0_overwritten if bad else _kept) for x in (k, v))
    if feature == "tile-edge-backward":
        k, v = (_grad_edited(x, _tail_dropped if bad else _kept) for x in (k, v))
    if feature == "tiny-seq" and seq == 1 and window is None:  # decode: one query at the end sees every key
        causal = False
        if bad:
            k, v = k[:, :, :-1], v[:, :, :-1]
    if feature == "long-keys" and bad:  # the key count in 16 bits
        keys = k.shape[2] % INDEX_16
        k, v = k[:, :, :keys], v[:, :, :keys]
    if feature == "batch-heads" and bad:
        items = torch.arange(batch, device=q.device) % 2
        k, v = k[items], v[items]
    keys, kv_heads = k.shape[2], k.shape[1]
    offset = 0 if feature == "q-lt-k" and bad else keys - seq
    width = window + 1 if window is not None and feature == "window-edge" and bad else window
    positions = torch.arange(seq, device=q.device)
    if feature == "mqa" and kv_heads == 1 and heads > 1:  # the query heads folded into the rows
        rows = torch.arange(heads * seq, device=q.device)
        seen = _visible(rows if bad else rows % seq, keys, offset, causal, width)
        q32 = q.float().reshape(batch, 1, heads * seq, dim)
        out = _scores_softmax(q32, k.float(), v.float(), seen, scale, feature, bad)
        return out.reshape(batch, heads, seq, dim).to(q.dtype)
    group = heads // kv_heads
    index = torch.arange(heads, device=q.device)
    index = index % kv_heads if feature == "gqa" and bad else index // group
    seen = _visible(positions, keys, offset, causal, width)
    if feature == "tile-edge" and bad:
        seen = seen & (torch.arange(keys, device=q.device) < keys // TILE * TILE)
    q32, k32, v32 = (x.float().reshape(1, batch * heads, -1, dim) for x in (q, k[:, index], v[:, index]))
    pieces = []
    launches = range(0, min(batch * heads, GRID_ROWS) if feature == "grid-limit" and bad else batch * heads,
                     GRID_ROWS)
    for start in launches:
        part = slice(start, start + GRID_ROWS)
        pieces.append(_scores_softmax(q32[:, part], k32[:, part], v32[:, part], seen, scale, feature, bad))
    done = sum(piece.shape[1] for piece in pieces)
    if done < batch * heads:  # rows no launch reached: never written
        pieces.append(torch.zeros_like(q32[:, done:]))
    return torch.cat(pieces, dim=1).reshape(batch, heads, seq, dim).to(q.dtype)


def _softmax_kernel(feature: str, bad: bool) -> KernelFn:
    def kernel(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None) -> Tensor:
        return _softmax(q, k, v, causal, scale, window, feature, bad)

    return kernel


# -- the linear families ------------------------------------------------------------------------------


def _chunks(x: Tensor, chunk: int, dtype: torch.dtype) -> Tensor:
    """``[B, T, H, ...]`` to ``[B, H, N, C, ...]`` in ``dtype``, the last chunk padded with zeros (a zero
    key, value or beta writes nothing; a zero log gate decays nothing)."""
    x = x.to(dtype).transpose(1, 2)
    pad = (-x.shape[2]) % chunk
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], dim=2)
    return x.reshape(*x.shape[:2], -1, chunk, *x.shape[3:])


def _intra_decay(gamma: Tensor, feature: str, bad: bool, strict: bool = False) -> Tensor:
    """``exp(G_r - G_s)`` for ``s <= r`` (``s < r``: ``strict``) inside each chunk, else 0, as
    ``[B, H, N, C, C, Kg]`` from the cumulative log decay ``gamma [B, H, N, C, Kg]``: the difference
    masked before its exp; wrongly, factored as ``exp(G_r) exp(-G_s)`` (``gate-strong``) or as the
    ratio of float32 ``exp(G)`` (``decay-underflow``)."""
    size = gamma.shape[-2]
    seen = torch.ones(size, size, dtype=torch.bool, device=gamma.device).tril(-1 if strict else 0)[..., None]
    if bad and feature == "gate-strong":
        return (gamma.exp()[..., :, None, :] * (-gamma).exp()[..., None, :, :]).masked_fill(~seen, 0.0)
    exact = (gamma[..., :, None, :] - gamma[..., None, :, :]).masked_fill(~seen, NEG_INF).exp()
    if bad and feature == "decay-underflow":  # a forward bug: the gradient stays the exact form's
        stored = gamma.detach().float().exp()
        ratio = (stored[..., :, None, :] / stored[..., None, :, :]).to(gamma.dtype).masked_fill(~seen, 0.0)
        return exact + (ratio - exact).detach()
    return exact


def _products(qc: Tensor, kc: Tensor, decay: Tensor) -> Tensor:
    """``sum_i q_ri k_si decay_rsi``: a chunk's decayed scores ``[B, H, N, C, C]``."""
    if decay.shape[-1] == 1:
        return (qc @ kc.mT) * decay[..., 0]
    return torch.einsum("bhnri,bhnsi,bhnrsi->bhnrs", qc, kc, decay)


def _chunked(inputs: Sequence[Tensor], scale: float, chunk: int, feature: str, bad: bool) -> Tensor:
    """The chunked form of every linear family in float64 (LA: no gate; simple GLA and GDN: one log
    decay per head and token; GLA: one per key channel; GDN: ``beta``, the delta rule's writes from
    each chunk's unit lower-triangular system); ``[B, T, H, V]`` in float64."""
    q, k, v = inputs[:3]
    g = inputs[3] if len(inputs) > 3 else None
    beta = inputs[4] if len(inputs) > 4 else None
    f64 = torch.float64
    seq = q.shape[1]
    qc, kc, vc = (_chunks(x, chunk, f64) for x in (q, k, v))
    if g is None:
        gamma = qc.new_zeros(*qc.shape[:-1], 1)
    else:
        taken = q.dtype if feature == "low-precision" and bad else torch.float32  # where its cumsum is taken
        gate = g.to(taken) if g.dim() == 4 else g.to(taken)[..., None]
        gamma = _chunks(gate, chunk, taken).cumsum(-2).to(f64)
    decay = _intra_decay(gamma, feature, bad)
    scores = _products(qc, kc, decay)
    last = gamma[..., -1:, :]
    q_read, k_written = qc * gamma.exp(), kc * (last - gamma).exp()
    fades = last.exp().mT  # [B, H, N, Kg, 1]: each chunk's decay of the state's rows
    if beta is None:
        writes = k_written.mT @ vc  # [B, H, N, K, V]
        after = writes if feature == "gate-near-zero" and bad else _scan(fades, writes)  # the state after each chunk
        entering = torch.cat([torch.zeros_like(after[:, :, :1]), after[:, :, :-1]], dim=2)
        if feature == "large-state" and bad:
            entering = entering.to(q.dtype).to(f64)
        out = q_read @ entering + scores @ vc
    else:
        bc = _chunks(beta, chunk, f64)
        lower = bc[..., :, None] * (kc @ kc.mT) * _intra_decay(gamma, feature, False, strict=True)[..., 0]
        eye = torch.eye(chunk, dtype=f64, device=q.device).expand(lower.shape)
        inverse = torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True)
        u = inverse @ (bc[..., None] * vc)
        w = inverse @ (bc[..., None] * kc * gamma.exp())
        state = qc.new_zeros(qc.shape[0], qc.shape[1], qc.shape[-1], vc.shape[-1])
        outputs = []
        count, partial = qc.shape[2], seq % chunk != 0
        # chunk by chunk through unbind: indexing one chunk at a time costs a whole zero tensor per chunk backward
        per_chunk = (x.unbind(2) for x in (u, w, scores, q_read, fades, k_written))
        for n, (u_n, w_n, scores_n, read_n, fade_n, k_n) in enumerate(zip(*per_chunk, strict=True)):
            new = u_n - w_n @ state
            intra = scores_n @ new
            if feature == "tile-edge" and bad and partial and 1 < count == n + 1:  # a multi-chunk sequence's tail
                intra = torch.zeros_like(intra)
            outputs.append(read_n @ state + intra)
            state = fade_n * state + k_n.mT @ new
        out = torch.stack(outputs, dim=2)
    out = scale * out
    return out.flatten(2, 3)[:, :, :seq].transpose(1, 2)


def _scan(fades: Tensor, writes: Tensor) -> Tensor:
    """``S_n = fades_n * S_{n-1} + writes_n`` (``S_-1 = 0``) along axis 2, by doubling: log2(N) steps
    of whole-tensor products and sums, not N small ones."""
    step = 1
    while step < writes.shape[2]:
        writes = torch.cat([writes[:, :, :step], writes[:, :, step:] + fades[:, :, step:] * writes[:, :, :-step]], 2)
        fades = torch.cat([fades[:, :, :step], fades[:, :, step:] * fades[:, :, :-step]], 2)
        step *= 2
    return writes


class _Grouped(torch.autograd.Function):
    """GDN's queries or keys ``[B, T, H, K]`` repeated over each key head's group of consecutive value
    heads; backward, the group's gradients summed, or, wrongly (``first``), its first head's taken."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: int, first: bool) -> Tensor:
        ctx.group, ctx.first = group, first
        return x.repeat_interleave(group, dim=2)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        b, t, heads, d = grad.shape
        split = grad.reshape(b, t, heads // ctx.group, ctx.group, d)
        return (split[:, :, :, 0] if ctx.first else split.sum(3)), None, None


class _GateGradient(torch.autograd.Function):
    """``fn(inputs)`` with a backward of its own: the inputs' gradients recomputed through autograd,
    the gate's (the fourth input's) moved one token later, wrongly, where ``late``."""

    @staticmethod
    def forward(ctx: Any, fn: Callable[[Sequence[Tensor]], Tensor], late: bool, *inputs: Tensor) -> Tensor:
        ctx.fn, ctx.late = fn, late
        ctx.save_for_backward(*inputs)
        with torch.no_grad():
            return fn(inputs)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        leaves = [x.detach().requires_grad_(True) for x in ctx.saved_tensors]
        with torch.enable_grad():
            grads = list(torch.autograd.grad(ctx.fn(leaves), leaves, grad))
        if ctx.late:
            dg = grads[3]
            grads[3] = torch.cat([torch.zeros_like(dg[:, :1]), dg[:, :-1]], dim=1)
        return (None, None, *grads)


def _linear(inputs: Sequence[Tensor], scale: float, chunk: int, feature: str, bad: bool) -> Tensor:
    """A linear family's kernel (the family by its inputs: q, k, v[, g[, beta]]); ``feature`` names
    the code path where the pair differs, ``bad`` plants its bug there."""
    q, k, v, *rest = inputs
    heads, key_dim, value_dim = v.shape[2], k.shape[-1], v.shape[-1]
    if feature == "layout-strided":
        q = _read_as_contiguous(q, bad)
    if feature == "tiny-seq" and q.shape[1] == 1 and bad:  # the one-token decode path
        scale = 1.0
    if feature == "head-dim" and bad:  # one block of 64 key channels
        q, k = q[..., :64], k[..., :64]
    if feature == "asym-dim" and bad:  # the value width taken from the key's
        v = v[..., :key_dim]
    if feature == "beta-bounds" and bad:
        rest[1] = rest[1].clamp(0.0, 1.0)
    if feature == "batch-heads" and bad:
        rest[0] = rest[0][:, :, torch.arange(heads, device=q.device) % 2]
    if len(rest) == 2:  # GDN: each key head serves its group of value heads
        group, first = heads // k.shape[2], feature == "gqa" and bad
        q, k = (_Grouped.apply(x, group, first) for x in (q, k))  # type: ignore[no-untyped-call]
    taken = [q, k, v, *rest]
    if feature == "backward":
        out: Tensor = _GateGradient.apply(  # type: ignore[no-untyped-call]
            lambda xs: _chunked(xs, scale, chunk, feature, bad), bad, *taken)
    else:
        out = _chunked(taken, scale, chunk, feature, bad)
    if out.shape[-1] < value_dim:  # channels never written
        out = torch.cat([out, out.new_zeros(*out.shape[:-1], value_dim - out.shape[-1])], dim=-1)
    if feature == "long-seq" and bad:  # each token's output row at its index in 16 bits: the last write stays
        seq = out.shape[1]
        at = torch.arange(seq, device=out.device)
        source = at + (seq - 1 - at) // INDEX_16 * INDEX_16
        out = out[:, source] * (at < INDEX_16)[None, :, None, None]
    return out.to(q.dtype)


def _linear_kernel(feature: str, bad: bool, chunk: int) -> KernelFn:
    def kernel(*inputs: Tensor, scale: float) -> Tensor:
        return _linear(inputs, scale, chunk, feature, bad)

    return kernel


# -- the pairs -----------------------------------------------------------------------------------------

BOTH, FWD, BWD = ("fwd", "fwdbwd"), ("fwd",), ("fwdbwd",)


def _s(name: str, cls: str, bug: str, twin: str | None = None, feature: str | None = None,
       directions: tuple[str, ...] = BOTH) -> Pair:
    return Pair("softmax", name, cls, bug, feature or cls, twin, directions=directions)


def _l(family: str, name: str, cls: str, bug: str, twin: str | None = None, chunk: int = 64,
       directions: tuple[str, ...] = BOTH) -> Pair:
    return Pair(family, name, cls, bug, cls, twin, chunk, directions)


PAIRS: tuple[Pair, ...] = (
    _s("no-max-subtraction", "large-logits",
       "exp of the raw scores, the row maximum never subtracted: past 88.7 it overflows to inf/inf (the fused-softmax "
       "overflow class of FlashAttention and Triton kernels)."),
    _s("max-init-zero", "negative-lse",
       "the running maximum started at 0, not -inf: rows whose scores are all near -150 underflow to 0/0 (online-"
       "softmax initialisation bugs of FlashAttention-style kernels)."),
    _s("tail-keys-dropped", "tile-edge",
       "the key loop bounded by floor(Tk / 16): the last partial block of keys never read (FlashAttention's seqlen "
       "not a multiple of the block size)."),
    _s("tail-dkdv-dropped", "tile-edge",
       "backward: dK and dV of the last partial key block never written (the backward's tail-tile class of "
       "FlashAttention and xformers).",
       "dK and dV written for every key.", "tile-edge-backward", BWD),
    _s("decode-drops-last-key", "tiny-seq",
       "the one-query decode path reads kv_len - 1 keys, the new token's own key left out (vLLM / FlashInfer "
       "context-length off by one).",
       "the one-query decode path reads every cached key."),
    _s("causal-upper-left", "q-lt-k",
       "causal aligned upper-left when q_len < k_len: query i sees keys 0..i (PyTorch SDPA's is_causal, FlashAttention "
       "before 2.1)."),
    _s("head-dim-pow2", "head-dim",
       "scores over the largest power of two of the head dim, the channels past it dropped (96 run as 64: the head-dim "
       "specialisation class of FlashAttention and xformers)."),
    _s("gqa-head-modulo", "gqa",
       "query head h reads K/V head h % kv_heads, not h // group (the GQA head-mapping class of FlashAttention and "
       "vLLM)."),
    _s("mqa-folded-mask", "mqa",
       "MQA's query heads folded into the query axis (FlashAttention's seqlenq_ngroups_swapped) with the causal mask "
       "built on the folded row, not the token.",
       "MQA's query heads folded into the query axis, the causal mask on each row's token."),
    _s("batch-offset-mod2", "batch-heads",
       "the K/V batch offset wraps at 2: sequence b reads sequence b % 2's keys (a per-batch offset bug that B <= 2 "
       "never shows)."),
    _s("window-off-by-one", "window-edge",
       "a sliding window one key too wide (< for <= at its left edge: FlashAttention window_size and FlexAttention "
       "sliding-window masks)."),
    _s("q-assumed-contiguous", "layout-strided",
       "q's storage read with a contiguous tensor's strides (as_strided / .view of a strided input: the stride "
       "assumptions of SDPA backends and xformers).",
       "q made contiguous before it is read."),
    _s("stride0-dkdv", "layout-stride0",
       "backward: dK and dV of K/V expanded with stride 0 written through that stride, the last head's write left "
       "(expanded-input gradients of SDPA's fused backends).",
       "dK and dV per query head, summed over the heads that share them.", directions=BWD),
    _s("grid-rows-65535", "grid-limit",
       "one launch of at most 65535 batch x head rows, the rows past it never computed (the CUDA grid y/z limit of "
       "FlashAttention and xformers)."),
    _s("keys-16bit", "long-keys",
       "the key count held in 16 bits: past 65536 keys only Tk mod 65536 are read (16-bit index overflow)."),
    _s("tied-max-dropped", "ties",
       "the softmax denominator as the row maximum's term plus the keys strictly below it: tied maxima dropped (an "
       "argmax-is-unique assumption)."),
    _s("zero-query-padding", "onehot",
       "an all-zero query row taken for padding and written as zeros (the fully-masked-row handling of cuDNN and "
       "SDPA's padding paths)."),
    _s("backward-no-delta", "backward",
       "backward: dS = P o dP, the rowsum(dO o O) term left out (FlashAttention's backward preprocessing class); the "
       "forward is right.",
       "its own backward, dS = P o (dP - rowsum(dO o O)).", directions=BWD),
    _l("gla", "factored-decay", "gate-strong",
       "the intra-chunk decay factored as exp(G_r) * exp(-G_s): exp(-cumsum) overflows under strong gates (fla chunk "
       "GLA before its sub-chunking).", chunk=16),
    _l("simple_gla", "decay-ratio-fp32", "decay-underflow",
       "decays as the ratio exp(G_r) / exp(G_s) of float32 cumulative decays: past exp(-103) in a chunk of 64 both "
       "underflow to 0/0 (fla's stored exp(cumsum) class)."),
    _l("gla", "state-not-carried", "gate-near-zero",
       "each chunk starts from the previous chunk's writes only, the older state dropped: unseen while gates forget "
       "within a chunk (fla's inter-chunk state propagation class).", chunk=16),
    _l("gdn", "beta-clamped", "beta-bounds",
       "beta clamped to [0, 1], a sigmoid's range (fla GDN's allow_neg_eigval beta runs to 2)."),
    _l("linear_attn", "state-in-fp16", "large-state",
       "the state carried between chunks stored in the inputs' dtype: fp16 overflows past 65504 (fla's chunk states "
       "kept in k.dtype).", chunk=16),
    _l("linear_attn", "value-dim-from-key", "asym-dim",
       "the value head dim taken from the key's: only K value channels computed (fla kernels that assume K == V)."),
    _l("gdn", "key-dim-64", "head-dim",
       "key channels past 64 dropped: one block of 64 (the head-dim limits of fla's kernels)."),
    _l("gdn", "gva-grad-first-head", "gqa",
       "backward: a key head's dq and dk taken from its group's first value head, not summed over the group (the GQA "
       "backward reduction class of FlashAttention and fla's grouped values).", directions=BWD),
    _l("simple_gla", "gate-head-mod2", "batch-heads",
       "head h's gate read at head h % 2 (a per-head offset bug that H <= 2 never shows)."),
    _l("gla", "q-assumed-contiguous", "layout-strided",
       "q's storage read with a contiguous [B, T, H, K] tensor's strides (fla kernels assuming contiguous inputs).",
       "q made contiguous before it is read.", chunk=16),
    _l("linear_attn", "positions-16bit", "long-seq",
       "each token's output row indexed in 16 bits: tokens past 65536 written over the first ones (16-bit index "
       "overflow)."),
    _l("gdn", "one-token-no-scale", "tiny-seq",
       "the one-token (decode) path leaves the scale out.", directions=FWD),  # GDN's one-token rows: no backward
    _l("gla", "dg-one-token-late", "backward",
       "backward: the gate's gradient attributed one token late (fla chunk GLA's dg reverse-cumsum class); the forward "
       "is right.",
       "its own backward, the inputs' gradients recomputed through autograd.", chunk=16, directions=BWD),
    _l("simple_gla", "gate-cumsum-in-dtype", "low-precision",
       "the log gate's cumulative sum taken in the inputs' dtype, not float32 (fla's chunk_local_cumsum in fp32)."),
    _l("gdn", "tail-intra-dropped", "tile-edge",
       "the last partial chunk of a sequence of several chunks loses its intra-chunk term (fla's last-chunk class "
       "when T is not a multiple of the chunk).", chunk=16),
)


def register(registry: KernelRegistry) -> None:
    """Add every wrong kernel and twin to ``registry`` (a shared twin once)."""
    added = set()
    for pair in PAIRS:
        for bad in (True, False):
            kernel = pair.kernel(bad)
            if (kernel.family, kernel.name) not in added:
                added.add((kernel.family, kernel.name))
                registry.add(kernel)


def pytest_attnperf_register_kernels(registry: KernelRegistry, config: pytest.Config) -> None:
    """The attnperf hook: the zoo joins its families' suites and the catalogue."""
    register(registry)
