"""A zoo of linear-attention kernels for testing the checks: correct ones that round differently
from the built-ins and from the yardsticks, and ones wrong in known ways.

Load it as a plugin (``pytest -p tests.zoo.linear`` from the repository root) or import its
``pytest_attnperf_register_kernels`` into a ``conftest.py``; ``register(registry)`` adds the same
kernels to any ``KernelRegistry``. Every kernel takes the families' signatures
(``pytest_attnperf.families.linear.kernels``: layout ``[B, T, H, D]``, output shaped like ``v``
in the query's dtype) and is plain PyTorch, differentiable through autograd, on any device.

Correct kernels, ``zoo-ok-<family>-<what>``, eight per family (nine for GLA), all written here
from the recurrences (none calls the package's references):

* ``chunk16-rounded``, ``chunk64-fp32``, ``chunk64-rounded``, ``chunk128-rounded``: the chunked
  form, intermediates in float32 or rounded to the inputs' dtype where a chunk kernel stores
  them (each chunk's scores, the state it reads, the decayed queries and keys of the state's
  products; GDN: the triangular system's inverse or solution and its products); the last chunk
  is as long as the sequence leaves it. GLA's per-channel decay is taken inside a chunk either
  materialised per channel (chunk16, declined beyond ``MATERIALISED_MAX_ELEMENTS`` elements) or
  factored over sub-blocks of 16 tokens around the cumulative decay before each sub-block, so
  that no factor exceeds the decay of 16 tokens. GDN's writes solve each chunk's unit
  lower-triangular system (the UT/WY transform), by its inverse (chunk64) or against the
  right-hand side (chunk16, chunk128).
* ``chunk64-tf32``, ``chunk64-tf32-rne``: ``chunk64-fp32`` with every matrix product's operands
  (forward and backward) rounded to TF32, truncated as a tensor core reads an fp32 tile (Triton's
  ``tl.dot`` default) or rounded half to even; on GPUs only, whose fp32 cases hold a chunk kernel
  to a yardstick with TF32 products (on the CPU, whose yardstick has none, they would fail).
* ``parallel``: the quadratic form, the ``T x T`` decay-masked scores materialised (GDN: one
  triangular solve over the whole sequence; GLA: ``T x T x K``), float32, each decay's exponent
  summed over its own segment (``_segment_decay``); declined beyond
  ``PARALLEL_MAX_TOKENS`` tokens or ``PARALLEL_MAX_ELEMENTS`` elements.
* ``recurrent``: the token recurrence, state in float32 (``form="recurrent"``); declined beyond
  ``RECURRENT_MAX_TOKENS`` tokens on every device (autograd through a Python loop per token).
* GLA's ``chunk64-gate-summed``: ``chunk64-rounded`` with a backward of its own, as fla's chunk
  GLA has: ``dq``, ``dk`` and ``dv`` in float32, the gate's gradient the reverse cumulative sum
  of ``q dq - k dk`` over the sequence (``_GateSummed``); declined beyond
  ``GATE_SUMMED_MAX_TOKENS`` tokens, where that sum's rounding (its error grows as the square root of
  the length) passes the gradients' normwise bound.

Wrong kernels, ``zoo-bad-<family>-<what>``, built on the chunk64-fp32 kernel unless named
otherwise: each gradient scaled by 1.01 on one head of one sequence, on one sequence, or
everywhere (the forward exact); a gate's or beta's gradient dropped; 0.1% of the output
elements times 1.01 or 1.05; the last partial chunk's intra-chunk part or its state dropped
(chunk16); the state carried from one sequence of the batch to the next; the decay one token
late; no scale; and per family: normalised or strictly causal linear attention, the decay
applied after the write, a per-channel gate averaged over the channels, the state read
undecayed across chunks, the delta rule's system undecayed, its correction reading the
undecayed state or leaving beta out, grouped values meeting the wrong key heads.

GDN's kernels take grouped values (queries and keys with fewer heads than the values), repeating
each key head over its group of consecutive value heads as fla does (``grouped``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from pytest_attnperf.families.registry import Kernel, KernelRegistry

from .tf32 import TF32Mode

__all__ = [
    "FAMILIES", "GATE_SUMMED_MAX_TOKENS", "MATERIALISED_MAX_ELEMENTS", "PARALLEL_MAX_ELEMENTS", "PARALLEL_MAX_TOKENS",
    "RECURRENT_MAX_TOKENS",
    "Zoo", "pytest_attnperf_register_kernels", "register", "zoo",
]

FAMILIES = ("linear_attn", "gla", "simple_gla", "gdn")
INPUTS = {"linear_attn": ("q", "k", "v"), "gla": ("q", "k", "v", "g"), "simple_gla": ("q", "k", "v", "g"),
          "gdn": ("q", "k", "v", "g", "beta")}

SUB = 16  # GLA's sub-blocks inside a chunk: no factor of its factored decay exceeds 16 tokens' decay
PARALLEL_MAX_TOKENS = 4096
PARALLEL_MAX_ELEMENTS = 2**30  # B x H x T x T (x K for GLA) of the parallel form's largest tensor
MATERIALISED_MAX_ELEMENTS = 2**30  # B x H x T x C x K of GLA's decay materialised per channel
RECURRENT_MAX_TOKENS = 4096
# the gate-summed kernel's gate gradient sums T terms that cancel: its normwise error in bf16 grows
# as sqrt(T) (2.8 unit roundoffs at T=1024, 5.4 at 4096, past the gradients' bound of 4)
GATE_SUMMED_MAX_TOKENS = 1024
GRAD_FACTOR = 1.01  # a wrong gradient is off by 1%
SPARSE_STRIDE = 997  # every 997th output element (0.1%) is corrupted

Impl = Callable[[Sequence[Tensor], float], Tensor]  # (q, k, v[, g[, beta]]), scale -> output
Bugs = frozenset[str]
NONE: Bugs = frozenset()
BUGS = frozenset({"tail-intra", "tail-state", "inter-undecayed", "solve-undecayed", "delta-undecayed",
                  "beta-value-only"})


# -- shared pieces ----------------------------------------------------------------------------------


def _heads(x: Tensor) -> Tensor:
    """``[B, T, H, ...]`` to ``[B, H, T, ...]`` in float32."""
    return x.transpose(1, 2).float()


Store = bool | torch.dtype  # stored intermediates: rounded to the queries' dtype (True), to this dtype, or not


def _stored(q: Tensor, store: Store) -> torch.dtype | None:
    """The dtype ``store`` rounds a chunk form's stored intermediates to (None: not rounded)."""
    if isinstance(store, torch.dtype):
        return store
    return q.dtype if store else None


def _rounder(store: torch.dtype | None) -> Callable[[Tensor], Tensor]:
    """Rounding to ``store`` and back to float32 (what a stored intermediate holds); identity for
    None or float32."""
    if store is None or store == torch.float32:
        return lambda x: x
    return lambda x: x.to(store).float()


def _visible(size: int, device: torch.device, strict: bool = False) -> Tensor:
    """``s <= r`` (``s < r`` when strict) as a ``[size, size]`` boolean mask."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril(-1 if strict else 0)


def _decay(gamma: Tensor, strict: bool = False) -> Tensor:
    """``exp(gamma_r - gamma_s)`` where ``s <= r`` (``s < r`` when strict), 0 elsewhere; ``gamma
    [..., n]`` a cumulative log decay."""
    mask = _visible(gamma.shape[-1], gamma.device, strict)
    return (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~mask, float("-inf")).exp()


def _segment_decay(g: Tensor, strict: bool = False) -> Tensor:
    """``exp(sum_{s < u <= r} g_u)`` where ``s <= r`` (``s < r`` when strict), 0 elsewhere, as
    ``[..., T, T]`` from ``g [..., T]`` (or ``[..., T, T, K]`` from ``g [..., T, K]``, per channel):
    each entry summed over its own segment (Mamba-2's ``segsum``), not as the difference of two
    cumulative sums over the sequence, which loses what their size rounds away (in float32 at
    T=200, the GLA form from such differences failed an fp32 case of 1 to 5 elements)."""
    per_channel = g.dim() == 4  # [B, H, T, K]
    x = g[..., :, None, :] if per_channel else g[..., :, None]  # x[..., u, s(, k)] = g_u
    size = g.shape[-2] if per_channel else g.shape[-1]
    x = x.expand(*g.shape[:-1], size, g.shape[-1]) if per_channel else x.expand(*g.shape, size)
    later = torch.ones(size, size, dtype=torch.bool, device=g.device).tril(-1)  # u > s
    seen = _visible(size, g.device, strict)
    if per_channel:
        later, seen = later[..., None], seen[..., None]
    segments = x.masked_fill(~later, 0.0).cumsum(-3 if per_channel else -2)  # [r, s]: sum over s < u <= r
    return segments.masked_fill(~seen, float("-inf")).exp()


def _out(o: Tensor, like: Tensor) -> Tensor:
    """``[B, H, T, V]`` float32 back to ``[B, T, H, V]`` in ``like``'s dtype."""
    return o.transpose(1, 2).to(like.dtype).contiguous()


def _chunk_output(intra: Tensor, inter: Tensor, partial: bool, bugs: frozenset[str]) -> Tensor:
    """A chunk's output, the intra-chunk and the state's part, less the one a tail bug drops
    from the last, partial chunk."""
    if partial and "tail-intra" in bugs:
        return inter
    if partial and "tail-state" in bugs:
        return intra
    return intra + inter


def _chunks(seq: int, chunk: int) -> list[tuple[int, int, bool]]:
    """``(start, end, partial)`` of each chunk; the last one is as long as ``seq`` leaves it."""
    return [(s, min(s + chunk, seq), min(s + chunk, seq) - s < chunk) for s in range(0, seq, chunk)]


def _check(bugs: Bugs) -> Bugs:
    unknown = bugs - BUGS
    if unknown:
        raise ValueError(f"unknown bugs {sorted(unknown)}")
    return bugs


# -- linear attention and simple GLA: one decay per head and token (none for linear attention) ------


def _scalar_chunked(inputs: Sequence[Tensor], scale: float, chunk: int, store: Store, bugs: Bugs = NONE) -> Tensor:
    """Chunked linear attention with an optional per-head log decay ``g [B, T, H]``::

        o_r = scale * ((q_r Gamma_r)^T S + sum_{s <= r} (Gamma_r / Gamma_s) (q_r . k_s) v_s)
        S' = Gamma_C S + sum_s (Gamma_C / Gamma_s) k_s v_s^T

    ``Gamma`` the decay since the chunk's start; with ``store`` the scores, the state read and
    the decayed queries and keys are rounded to the queries' dtype."""
    q, k, v = inputs[:3]
    g = inputs[3] if len(inputs) > 3 else None
    rnd = _rounder(_stored(q, store))
    qh, kh, vh = _heads(q), _heads(k), _heads(v)
    gh = None if g is None else g.transpose(1, 2).float()  # [B, H, T]
    state = qh.new_zeros(qh.shape[0], qh.shape[1], qh.shape[3], vh.shape[3])
    outputs = []
    for start, end, partial in _chunks(qh.shape[2], chunk):
        qc, kc, vc = qh[:, :, start:end], kh[:, :, start:end], vh[:, :, start:end]
        if gh is None:
            scores = (qc @ kc.mT).masked_fill(~_visible(end - start, q.device), 0.0)
            q_read, k_write, carried = qc, kc, state
        else:
            gamma = gh[:, :, start:end].cumsum(-1)
            scores = (qc @ kc.mT) * _decay(gamma)
            q_read = qc if "inter-undecayed" in bugs else qc * gamma.exp()[..., None]
            k_write = kc * (gamma[..., -1:] - gamma).exp()[..., None]
            carried = gamma[..., -1].exp()[..., None, None] * state
        intra = rnd(scores) @ vc
        inter = rnd(q_read) @ rnd(state)
        outputs.append(scale * _chunk_output(intra, inter, partial, bugs))
        state = carried + rnd(k_write).mT @ vc
    return _out(torch.cat(outputs, dim=2), q)


def _scalar_parallel(inputs: Sequence[Tensor], scale: float) -> Tensor:
    """The quadratic form: ``o = scale * ((Q K^T) . D) V``, ``D_rs = exp(G_r - G_s)`` on ``s <= r``
    (``G`` the cumulative log decay; each exponent summed over its segment: ``_segment_decay``;
    1 without a gate)."""
    q, k, v = inputs[:3]
    qh, kh, vh = _heads(q), _heads(k), _heads(v)
    scores = qh @ kh.mT
    if len(inputs) > 3:
        scores = scores * _segment_decay(inputs[3].transpose(1, 2).float())
    else:
        scores = scores.masked_fill(~_visible(qh.shape[2], q.device), 0.0)
    return _out(scale * (scores @ vh), q)


def _gated_recurrent(inputs: Sequence[Tensor], scale: float) -> Tensor:
    """The token recurrence in float32, ``S_t = diag(a_t) S_{t-1} + k_t v_t^T``, ``o_t = scale S_t^T
    q_t``; ``a_t = exp(g_t)`` per key channel (``g [B, T, H, K]``), per head (``[B, T, H]``) or 1."""
    q, k, v = inputs[:3]
    qh, kh, vh = _heads(q), _heads(k), _heads(v)
    decay = None if len(inputs) < 4 else inputs[3].transpose(1, 2).float().exp()
    if decay is not None and decay.dim() == 3:
        decay = decay[..., None].expand(qh.shape)
    state = qh.new_zeros(qh.shape[0], qh.shape[1], qh.shape[3], vh.shape[3])
    outputs = []
    for t in range(qh.shape[2]):
        if decay is not None:
            state = decay[:, :, t, :, None] * state
        state = state + kh[:, :, t, :, None] * vh[:, :, t, None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", qh[:, :, t], state))
    return _out(torch.stack(outputs, dim=2), q)


# -- GLA: one decay per key channel -------------------------------------------------------------------


def _gla_scores(qc: Tensor, kc: Tensor, gamma: Tensor, direct: bool) -> Tensor:
    """A chunk's causal scores ``A_rs = sum_i q_ri k_si exp(gamma_ri - gamma_si)`` (``s <= r``).

    ``direct``: the decay materialised per channel, ``[c, c, K]``. Otherwise factored over
    sub-blocks of ``SUB`` rows around ``ref``, the cumulative decay before the sub-block: the
    queries' factor ``exp(gamma_r - ref)`` is at most 1, the keys' ``exp(ref - gamma_s)`` at most
    1 before the sub-block and at most its own decay inside it."""
    size = qc.shape[2]
    visible = _visible(size, qc.device)
    if direct:
        diff = (gamma[..., :, None, :] - gamma[..., None, :, :]).masked_fill(~visible[..., None], float("-inf"))
        return (qc[..., :, None, :] * kc[..., None, :, :] * diff.exp()).sum(-1)
    rows = []
    for a in range(0, size, SUB):
        e = min(a + SUB, size)
        ref = gamma[:, :, a - 1: a] if a else torch.zeros_like(gamma[:, :, :1])
        left = qc[:, :, a:e] * (gamma[:, :, a:e] - ref).exp()
        right = kc[:, :, :e] * (ref - gamma[:, :, :e]).exp()
        block = (left @ right.mT).masked_fill(~visible[a:e, :e], 0.0)
        rows.append(torch.nn.functional.pad(block, (0, size - e)))
    return torch.cat(rows, dim=2)


def _gla_chunked(inputs: Sequence[Tensor], scale: float, chunk: int, store: Store, direct: bool,
                 bugs: Bugs = NONE) -> Tensor:
    """Chunked GLA, ``g [B, T, H, K]``: the intra-chunk scores from ``_gla_scores``, the state read
    by ``q_r exp(gamma_r)`` and written by ``k_s exp(gamma_C - gamma_s)`` (both at most 1)."""
    q, k, v, g = inputs[:4]
    rnd = _rounder(_stored(q, store))
    qh, kh, vh, gh = _heads(q), _heads(k), _heads(v), _heads(g)
    state = qh.new_zeros(qh.shape[0], qh.shape[1], qh.shape[3], vh.shape[3])
    outputs = []
    for start, end, partial in _chunks(qh.shape[2], chunk):
        qc, kc, vc = qh[:, :, start:end], kh[:, :, start:end], vh[:, :, start:end]
        gamma = gh[:, :, start:end].cumsum(-2)
        intra = rnd(_gla_scores(qc, kc, gamma, direct)) @ vc
        q_read = qc if "inter-undecayed" in bugs else qc * gamma.exp()
        inter = rnd(q_read) @ rnd(state)
        outputs.append(scale * _chunk_output(intra, inter, partial, bugs))
        last = gamma[:, :, -1:]
        state = last.mT.exp() * state + rnd(kc * (last - gamma).exp()).mT @ vc
    return _out(torch.cat(outputs, dim=2), q)


def _gla_parallel(inputs: Sequence[Tensor], scale: float) -> Tensor:
    """The quadratic form of GLA: ``A_rs = sum_i q_ri k_si exp(G_ri - G_si)`` materialised as
    ``[T, T, K]`` (``G`` the cumulative log decay, each exponent summed over its segment:
    ``_segment_decay``), ``o = scale A V``."""
    q, k, v, g = inputs[:4]
    qh, kh, vh = _heads(q), _heads(k), _heads(v)
    scores = (qh[..., :, None, :] * kh[..., None, :, :] * _segment_decay(_heads(g))).sum(-1)
    return _out(scale * (scores @ vh), q)


# -- Gated DeltaNet ---------------------------------------------------------------------------------


def _gdn_chunked(inputs: Sequence[Tensor], scale: float, chunk: int, store: Store, by_inverse: bool,
                 bugs: Bugs = NONE) -> Tensor:
    """Chunked gated delta rule (UT/WY). With ``Gamma`` the decay since the chunk's start and ``S``
    the state entering it, the chunk's writes ``U`` solve::

        (I + L) U = diag(beta) V - diag(beta Gamma) K S,   L_rs = beta_r (Gamma_r / Gamma_s) k_r . k_s  (s < r)
        o_r = scale * (Gamma_r S^T q_r + sum_{s <= r} (Gamma_r / Gamma_s) (q_r . k_s) u_s)
        S' = Gamma_C S + sum_s (Gamma_C / Gamma_s) k_s u_s^T

    ``by_inverse``: through ``T = (I + L)^-1`` and its products with both right-hand terms (as
    fla's chunk forward stores them), else one triangular solve per chunk against the whole
    right-hand side. With ``store`` the inverse (or the solve's inputs), its products, the
    scores, the state read and the writes are rounded to the queries' dtype."""
    q, k, v, g, beta = inputs[:5]
    rnd = _rounder(_stored(q, store))
    qh, kh, vh = _heads(q), _heads(k), _heads(v)
    gh, bh = g.transpose(1, 2).float(), beta.transpose(1, 2).float()
    state = qh.new_zeros(qh.shape[0], qh.shape[1], qh.shape[3], vh.shape[3])
    outputs = []
    for start, end, partial in _chunks(qh.shape[2], chunk):
        qc, kc, vc = qh[:, :, start:end], kh[:, :, start:end], vh[:, :, start:end]
        gamma, bc = gh[:, :, start:end].cumsum(-1), bh[:, :, start:end]
        strict = (torch.ones_like(gamma[..., None]) * _visible(end - start, q.device, strict=True)
                  if "solve-undecayed" in bugs else _decay(gamma, strict=True))
        lower = bc[..., :, None] * (kc @ kc.mT) * strict  # the unit diagonal is implied
        written = bc[..., None] * vc
        erased = (bc * gamma.exp())[..., None] * kc
        read = rnd(state)
        if by_inverse:
            eye = torch.eye(end - start, device=q.device).expand(lower.shape)
            inverse = rnd(torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True))
            new = rnd(inverse @ rnd(written)) - rnd(inverse @ rnd(erased)) @ read
        else:
            rhs = rnd(written) - rnd(erased) @ read
            new = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
        new = rnd(new)
        intra = rnd((qc @ kc.mT) * _decay(gamma)) @ new
        inter = rnd(qc * gamma.exp()[..., None]) @ read
        outputs.append(scale * _chunk_output(intra, inter, partial, bugs))
        last = gamma[..., -1:]
        state = last[..., None].exp() * state + rnd(kc * (last - gamma).exp()[..., None]).mT @ new
    return _out(torch.cat(outputs, dim=2), q)


def _gdn_parallel(inputs: Sequence[Tensor], scale: float) -> Tensor:
    """The quadratic form of the gated delta rule: the whole sequence as one chunk, its writes
    from one ``T x T`` triangular solve, ``(I + L) U = diag(beta) V``, then
    ``o = scale ((Q K^T) . D) U``."""
    q, k, v, g, beta = inputs[:5]
    qh, kh, vh = _heads(q), _heads(k), _heads(v)
    gh, bh = g.transpose(1, 2).float(), beta.transpose(1, 2).float()
    lower = bh[..., :, None] * (kh @ kh.mT) * _segment_decay(gh, strict=True)
    writes = torch.linalg.solve_triangular(lower, bh[..., None] * vh, upper=False, unitriangular=True)
    return _out(scale * (((qh @ kh.mT) * _segment_decay(gh)) @ writes), q)


def _gdn_recurrent(inputs: Sequence[Tensor], scale: float, bugs: Bugs = NONE) -> Tensor:
    """The token recurrence in float32: ``u_t = beta_t (v_t - a_t S_{t-1}^T k_t)``, ``S_t = a_t
    S_{t-1} + k_t u_t^T``, ``o_t = scale S_t^T q_t``."""
    q, k, v, g, beta = inputs[:5]
    qh, kh, vh = _heads(q), _heads(k), _heads(v)
    decay, bh = g.transpose(1, 2).float().exp(), beta.transpose(1, 2).float()
    state = qh.new_zeros(qh.shape[0], qh.shape[1], qh.shape[3], vh.shape[3])
    outputs = []
    for t in range(qh.shape[2]):
        k_t, b_t = kh[:, :, t], bh[:, :, t, None]
        decayed = decay[:, :, t, None, None] * state
        seen = torch.einsum("bhk,bhkv->bhv", k_t, state if "delta-undecayed" in bugs else decayed)
        u = b_t * vh[:, :, t] - seen if "beta-value-only" in bugs else b_t * (vh[:, :, t] - seen)
        state = decayed + k_t[..., :, None] * u[..., None, :]
        outputs.append(scale * torch.einsum("bhk,bhkv->bhv", qh[:, :, t], state))
    return _out(torch.stack(outputs, dim=2), q)


# -- the forms of each family -------------------------------------------------------------------------


def chunked(family: str, chunk: int, store: Store, *, variant: bool = False, bugs: Bugs = NONE) -> Impl:
    """The chunked form of ``family`` in chunks of ``chunk`` tokens; ``variant`` picks GLA's
    materialised decay (``[chunk, chunk, K]`` a chunk: for small chunks only) and GDN's solve
    against the right-hand side."""
    _check(bugs)

    def impl(inputs: Sequence[Tensor], scale: float) -> Tensor:
        if family == "gla":
            return _gla_chunked(inputs, scale, chunk, store, direct=variant, bugs=bugs)
        if family == "gdn":
            return _gdn_chunked(inputs, scale, chunk, store, by_inverse=not variant, bugs=bugs)
        return _scalar_chunked(inputs, scale, chunk, store, bugs=bugs)

    return impl


def parallel(family: str) -> Impl:
    """The quadratic form of ``family``."""
    return {"gla": _gla_parallel, "gdn": _gdn_parallel}.get(family, _scalar_parallel)


def recurrent(family: str, bugs: Bugs = NONE) -> Impl:
    """The token recurrence of ``family`` in float32."""
    _check(bugs)
    if family == "gdn":
        return lambda inputs, scale: _gdn_recurrent(inputs, scale, bugs)
    if bugs:
        raise ValueError(f"{family}'s recurrence has no bugs {sorted(bugs)}")
    return _gated_recurrent


class _GateSummed(torch.autograd.Function):
    """A chunk kernel with its own backward, as fla's chunk GLA has: ``dq``, ``dk`` and ``dv`` in
    float32 through the chunked form (its stored intermediates rounded to the inputs' dtype, as in
    the forward), then the gate's gradient as the reverse cumulative sum of ``q dq - k dk`` over
    the sequence (over the key channels too for a per-head gate), in float32. fla sums within a
    chunk and takes the rest from the state; summing over the whole sequence errs more where the
    sums cancel (docs/checks.md, "Yardsticks")."""

    @staticmethod
    def forward(ctx: Any, family: str, chunk: int, scale: float, *inputs: Tensor) -> Tensor:
        ctx.save_for_backward(*inputs)
        ctx.family, ctx.chunk, ctx.scale = family, chunk, scale
        with torch.no_grad():
            return chunked(family, chunk, True)(inputs, scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, g = ctx.saved_tensors
        leaves = [x.detach().float().requires_grad_(i < 3) for i, x in enumerate((q, k, v, g))]
        with torch.enable_grad():
            out = chunked(ctx.family, ctx.chunk, q.dtype)(leaves, ctx.scale)
            dq, dk, dv = torch.autograd.grad(out, leaves[:3], grad.float())
        terms = leaves[0].detach() * dq - leaves[1].detach() * dk
        if g.dim() == 3:
            terms = terms.sum(-1)
        dg = terms.flip(1).cumsum(1).flip(1)
        return None, None, None, dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(g.dtype)


def gate_summed(family: str, chunk: int) -> Impl:
    """GLA's (or simple GLA's) chunked form in chunks of ``chunk``, intermediates rounded to the
    inputs' dtype, with ``_GateSummed``'s backward."""

    def impl(inputs: Sequence[Tensor], scale: float) -> Tensor:
        out: Tensor = _GateSummed.apply(family, chunk, scale, *inputs)  # type: ignore[no-untyped-call]
        return out

    return impl


# -- products with TF32 operands, as a Triton chunk kernel's tl.dot of fp32 tiles (zoo.tf32) -----------


def tf32_operands(impl: Impl, nearest: bool = False) -> Impl:
    """``impl`` with its matrix products' operands rounded to TF32 (truncated, as a tensor core
    reads an fp32 tile that nothing rounded; ``nearest``: rounded half to even)."""

    def rounded(inputs: Sequence[Tensor], scale: float) -> Tensor:
        with TF32Mode(nearest):
            return impl(inputs, scale)

    return rounded


# -- what the wrong kernels do to a right one -----------------------------------------------------------


def _scope_weights(x: Tensor, factor: float, scope: str) -> Tensor:
    """``factor`` where ``scope`` says (``all``; ``seq``: the last sequence of the batch;
    ``head``: its last head only), 1 elsewhere, broadcastable to ``x [B, T, H, ...]``."""
    weights = torch.ones(x.shape[0], 1, x.shape[2], *([1] * (x.dim() - 3)), device=x.device)
    if scope == "all":
        weights.fill_(factor)
    elif scope == "seq":
        weights[-1] = factor
    elif scope == "head":
        weights[-1, :, -1] = factor
    else:
        raise ValueError(f"unknown scope {scope!r}")
    return weights


class _ScaledGrad(torch.autograd.Function):
    """``x`` itself forward; its gradient times ``weights`` backward, in float32."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weights: Tensor) -> Tensor:
        ctx.save_for_backward(weights)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (weights,) = ctx.saved_tensors
        return (grad.float() * weights).to(grad.dtype), None


def _grad_scaled(x: Tensor, factor: float, scope: str) -> Tensor:
    """``x`` itself forward; its gradient times ``factor`` where ``scope`` says (in float32)."""
    if not x.requires_grad:
        return x
    scaled: Tensor = _ScaledGrad.apply(x, _scope_weights(x, factor, scope))  # type: ignore[no-untyped-call]
    return scaled


def _grad_dropped(x: Tensor) -> Tensor:
    """``x`` forward, a zero gradient backward (still in the graph)."""
    return x.detach() + 0 * x


def _sparse(out: Tensor, factor: float) -> Tensor:
    """Every ``SPARSE_STRIDE``-th element times ``factor`` (rounded to the output's dtype); the
    gradient untouched."""
    flat = out.detach().reshape(-1)
    picked = flat[::SPARSE_STRIDE]
    delta = torch.zeros_like(flat)
    delta[::SPARSE_STRIDE] = (picked.float() * factor).to(out.dtype) - picked
    return out + delta.reshape(out.shape)


def _replaced(inputs: Sequence[Tensor], index: int, value: Tensor) -> list[Tensor]:
    return [value if i == index else x for i, x in enumerate(inputs)]


def grad_wrong(impl: Impl, index: int, scope: str) -> Impl:
    """``impl`` with the gradient of input ``index`` off by 1% where ``scope`` says."""
    return lambda inputs, scale: impl(_replaced(inputs, index, _grad_scaled(inputs[index], GRAD_FACTOR, scope)),
                                      scale)


def grad_dropped(impl: Impl, index: int) -> Impl:
    """``impl`` with no gradient for input ``index``."""
    return lambda inputs, scale: impl(_replaced(inputs, index, _grad_dropped(inputs[index])), scale)


def sparse(impl: Impl, factor: float) -> Impl:
    """``impl`` with 0.1% of its output elements times ``factor``."""
    return lambda inputs, scale: _sparse(impl(inputs, scale), factor)


def state_leak(impl: Impl) -> Impl:
    """``impl`` with the batch run as one sequence: each sequence starts from the state the one
    before it left."""

    def leaking(inputs: Sequence[Tensor], scale: float) -> Tensor:
        batch, seq = inputs[0].shape[:2]
        joined = [x.reshape(1, batch * seq, *x.shape[2:]) for x in inputs]
        out = impl(joined, scale)
        return out.reshape(batch, seq, *out.shape[2:])

    return leaking


def decay_late(impl: Impl) -> Impl:
    """``impl`` with every token's decay applied one token late (the first token's not at all)."""

    def late(inputs: Sequence[Tensor], scale: float) -> Tensor:
        g = inputs[3]
        shifted = torch.cat([torch.zeros_like(g[:, :1]), g[:, :-1]], dim=1)
        return impl(_replaced(inputs, 3, shifted), scale)

    return late


def no_scale(impl: Impl) -> Impl:
    """``impl`` with the scale left out."""
    return lambda inputs, scale: impl(inputs, 1.0)


def decay_after_write(impl: Impl) -> Impl:
    """``impl`` with each token's decay applied after its own write, ``S_t = a_t (S_{t-1} + k_t
    v_t^T)``: the keys carry their own token's decay."""

    def after(inputs: Sequence[Tensor], scale: float) -> Tensor:
        k, g = inputs[1], inputs[3].float()
        decay = (g if g.dim() == k.dim() else g[..., None]).exp()
        return impl(_replaced(inputs, 1, k.float() * decay), scale)

    return after


def gate_averaged(impl: Impl) -> Impl:
    """``impl`` with GLA's per-channel gate replaced by its mean over the key channels."""
    return lambda inputs, scale: impl(_replaced(inputs, 3, inputs[3].mean(-1, keepdim=True).expand_as(inputs[3])),
                                      scale)


def normalized(impl: Impl) -> Impl:
    """``impl`` divided by ``scale q_t . sum_{s <= t} k_s + 1e-10`` (fla's ``normalize=True``
    default, where plain linear attention was asked for)."""

    def divided(inputs: Sequence[Tensor], scale: float) -> Tensor:
        q, k = inputs[0], inputs[1]
        out = impl(inputs, scale)
        norm = scale * (q.float() * k.float().cumsum(1)).sum(-1, keepdim=True) + 1e-10
        return (out.float() / norm).to(out.dtype)

    return divided


def strictly_causal(impl: Impl) -> Impl:
    """``impl`` less each token's own term: the state read before its token's write."""

    def strict(inputs: Sequence[Tensor], scale: float) -> Tensor:
        q, k, v = (x.float() for x in inputs[:3])
        out = impl(inputs, scale)
        return (out.float() - scale * (q * k).sum(-1, keepdim=True) * v).to(out.dtype)

    return strict


def grouped(inputs: Sequence[Tensor], tiled: bool = False) -> list[Tensor]:
    """GDN's inputs with the queries and keys repeated to the values' heads, value head ``j``
    meeting key head ``j // (HV / H)`` (fla's grouped values); ``tiled``: key head ``j % H``, the
    wrong way round."""
    q, k, v = inputs[:3]
    group = v.shape[2] // k.shape[2]
    if group == 1:
        return list(inputs)
    if tiled:
        return [q.repeat(1, 1, group, 1), k.repeat(1, 1, group, 1), *inputs[2:]]
    return [q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2), *inputs[2:]]


# -- the zoo ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Zoo:
    """One kernel of the zoo: ``correct`` says which way the checks should judge it."""

    family: str
    name: str
    impl: Impl
    doc: str
    form: str = "chunk"
    limit: str | None = None  # "parallel", "recurrent", "materialised" or "summed": the size it declines beyond
    tiled_heads: bool = False  # GDN's grouped values meet key head j % H (wrong), not j // (HV / H)
    fp32_only: bool = False  # TF32 operands: what a tensor core reads of fp32 tiles, not of fp16 or bf16 ones
    device_kinds: tuple[str, ...] = ("cuda", "cpu")

    @property
    def correct(self) -> bool:
        """Whether the kernel is right (``zoo-ok-*``) or wrong in a known way (``zoo-bad-*``)."""
        return self.name.startswith("zoo-ok-")

    def supports(self, case: Any) -> str | None:
        """None when the kernel takes ``case`` (a ``LinearCase``; the cases no kernel of its family
        takes are the case's ``refusal``), else why not."""
        if self.fp32_only and case.dtype != "fp32":
            return (f"TF32 operands come from fp32 tiles; a {case.dtype} kernel's products take {case.dtype} operands "
                    "(TF32 truncation keeps 10 mantissa bits, coarser than fp16's rounding to nearest)")
        elements = case.batch * case.heads * case.seq * case.seq * (case.key_dim if self.family == "gla" else 1)
        if self.limit == "parallel" and (case.seq > PARALLEL_MAX_TOKENS or elements > PARALLEL_MAX_ELEMENTS):
            return (f"the parallel form materialises B x H x T x T{' x K' if self.family == 'gla' else ''} = "
                    f"{elements} elements: at most T={PARALLEL_MAX_TOKENS} and {PARALLEL_MAX_ELEMENTS}")
        if self.limit == "recurrent" and case.seq > RECURRENT_MAX_TOKENS:
            return f"autograd through a token loop: at most T={RECURRENT_MAX_TOKENS}"
        if self.limit == "summed" and case.seq > GATE_SUMMED_MAX_TOKENS:
            return (f"the gate's gradient summed over the whole sequence errs as sqrt(T) (in bf16, past the "
                    f"normwise bound at T=4096): at most T={GATE_SUMMED_MAX_TOKENS}")
        per_channel = case.batch * case.heads * case.seq * SUB * case.key_dim
        if self.limit == "materialised" and per_channel > MATERIALISED_MAX_ELEMENTS:
            return (f"the decay materialised per channel is B x H x T x {SUB} x K = {per_channel} elements: "
                    f"at most {MATERIALISED_MAX_ELEMENTS}")
        return None

    def kernel(self) -> Kernel:
        """The registry's ``Kernel`` of this zoo entry, its function documented with ``doc``; a GDN
        kernel takes grouped values (``grouped``)."""
        impl, family, tiled = self.impl, self.family, self.tiled_heads

        def fn(*inputs: Tensor, scale: float) -> Tensor:
            return impl(grouped(inputs, tiled) if family == "gdn" else inputs, scale)

        fn.__doc__ = self.doc
        fn.__name__ = fn.__qualname__ = self.name.replace("-", "_")
        return Kernel(self.family, self.name, fn, supports=self.supports, form=self.form, description=self.doc,
                      device_kinds=self.device_kinds,
                      tiled=False)  # torch loops and dense chunk products: no memory bound


def _correct(family: str) -> list[Zoo]:
    variant_how = {"gla": " (decay materialised per channel)", "gdn": " (solved against the right-hand side)"}
    factored = {"gla": " (decay factored per 16-token sub-block)", "gdn": " (through the inverse)"}
    chunk128 = {"gla": factored["gla"], "gdn": variant_how["gdn"]}
    ok = f"zoo-ok-{family}"
    return [
        Zoo(family, f"{ok}-chunk16-rounded", chunked(family, 16, True, variant=True),
            f"Chunks of 16, stored intermediates rounded to the inputs' dtype{variant_how.get(family, '')}.",
            limit="materialised" if family == "gla" else None),
        Zoo(family, f"{ok}-chunk64-fp32", chunked(family, 64, False),
            f"Chunks of 64, every intermediate in float32{factored.get(family, '')}."),
        Zoo(family, f"{ok}-chunk64-tf32", tf32_operands(chunked(family, 64, False)),
            f"Chunks of 64, float32, every product's operands truncated to TF32{factored.get(family, '')}.",
            device_kinds=("cuda",), fp32_only=True),
        Zoo(family, f"{ok}-chunk64-tf32-rne", tf32_operands(chunked(family, 64, False), nearest=True),
            f"Chunks of 64, float32, every product's operands rounded to TF32, ties to even{factored.get(family, '')}.",
            device_kinds=("cuda",), fp32_only=True),
        Zoo(family, f"{ok}-chunk64-rounded", chunked(family, 64, True),
            f"Chunks of 64, stored intermediates rounded to the inputs' dtype{factored.get(family, '')}."),
        Zoo(family, f"{ok}-chunk128-rounded", chunked(family, 128, True, variant=family != "gla"),
            f"Chunks of 128, stored intermediates rounded to the inputs' dtype{chunk128.get(family, '')}."),
        Zoo(family, f"{ok}-parallel", parallel(family),
            "The quadratic form, decay-masked T x T scores materialised, in float32.", limit="parallel"),
        Zoo(family, f"{ok}-recurrent", recurrent(family),
            "The token recurrence, state in float32.", form="recurrent", limit="recurrent"),
    ] + ([Zoo(family, f"{ok}-chunk64-gate-summed", gate_summed(family, 64),
              "Chunks of 64, stored intermediates rounded to the inputs' dtype; its own backward: dq, dk and dv "
              "in float32, the gate's gradient the reverse cumulative sum of q dq - k dk over the sequence.",
              limit="summed")]
         if family == "gla" else [])


def _wrong(family: str) -> list[Zoo]:
    bad = f"zoo-bad-{family}"
    base = chunked(family, 64, False)
    names = INPUTS[family]
    scopes = {"all": "everywhere", "seq": "on the batch's last sequence", "head": "on one head of one sequence"}
    zoo = [Zoo(family, f"{bad}-d{name}-1pct-{scope}", grad_wrong(base, i, scope),
               f"d{name} 1% too large {where}; the forward exact.")
           for i, name in enumerate(names) for scope, where in scopes.items()]
    zoo += [Zoo(family, f"{bad}-d{name}-dropped", grad_dropped(base, i), f"d{name} zero: {name} detached.")
            for i, name in enumerate(names) if name in ("g", "beta")]
    zoo += [
        Zoo(family, f"{bad}-sparse-1pct", sparse(base, 1.01), "0.1% of the output elements 1% too large."),
        Zoo(family, f"{bad}-sparse-5pct", sparse(base, 1.05), "0.1% of the output elements 5% too large."),
        Zoo(family, f"{bad}-sparse-1pct-recurrent", sparse(recurrent(family), 1.01),
            "The token recurrence with 0.1% of its output elements 1% too large.", form="recurrent",
            limit="recurrent"),
        Zoo(family, f"{bad}-tail-intra-dropped", chunked(family, 16, False, bugs=frozenset({"tail-intra"})),
            "Chunks of 16; the last partial chunk reads the state only, not its own tokens."),
        Zoo(family, f"{bad}-tail-state-dropped", chunked(family, 16, False, bugs=frozenset({"tail-state"})),
            "Chunks of 16; the last partial chunk reads its own tokens only, not the state."),
        Zoo(family, f"{bad}-state-leak", state_leak(base),
            "The state carried from each sequence of the batch into the next."),
        Zoo(family, f"{bad}-no-scale", no_scale(base), "The scale left out."),
    ]
    if family != "linear_attn":
        zoo.append(Zoo(family, f"{bad}-decay-off-by-one", decay_late(base),
                       "Each token's decay applied one token late."))
    if family == "linear_attn":
        zoo += [
            Zoo(family, f"{bad}-normalized", normalized(base), "Divided by the running key sum (normalize=True)."),
            Zoo(family, f"{bad}-strictly-causal", strictly_causal(base), "Each token misses its own key and value."),
        ]
    if family in ("gla", "simple_gla"):
        zoo += [
            Zoo(family, f"{bad}-decay-after-write", decay_after_write(base),
                "Each token's decay applied after its own write too."),
            Zoo(family, f"{bad}-inter-undecayed", chunked(family, 16, False, bugs=frozenset({"inter-undecayed"})),
                "Chunks of 16; the state read by a chunk's queries without their decay since its start."),
        ]
    if family == "gla":
        zoo.append(Zoo(family, f"{bad}-gate-averaged", gate_averaged(base),
                       "The per-channel gate averaged over the key channels."))
    if family == "gdn":
        zoo += [
            Zoo(family, f"{bad}-solve-undecayed", chunked(family, 64, False, bugs=frozenset({"solve-undecayed"})),
                "The chunk's triangular system without the decay between its tokens."),
            Zoo(family, f"{bad}-delta-undecayed", recurrent(family, frozenset({"delta-undecayed"})),
                "The token recurrence; the delta correction reads the state before its decay.",
                form="recurrent", limit="recurrent"),
            Zoo(family, f"{bad}-beta-value-only", recurrent(family, frozenset({"beta-value-only"})),
                "The token recurrence; beta scales the value but not the correction.", form="recurrent",
                limit="recurrent"),
            Zoo(family, f"{bad}-key-heads-tiled", base,
                "Grouped values: value head j reads key head j % H, not j // (HV / H).", tiled_heads=True),
        ]
    return zoo


def zoo() -> list[Zoo]:
    """Every kernel of the zoo, correct ones first in each family."""
    return [entry for family in FAMILIES for entry in _correct(family) + _wrong(family)]


def register(registry: KernelRegistry) -> None:
    """Add every zoo kernel to ``registry``."""
    for entry in zoo():
        registry.add(entry.kernel())


def pytest_attnperf_register_kernels(registry: KernelRegistry, config: pytest.Config) -> None:
    """The attnperf hook: the zoo joins the linear families' suites."""
    register(registry)
