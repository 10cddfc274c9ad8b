"""fp64 references for linear attention, written from the recurrences, for clarity rather than speed.

Layout is fla's: ``q, k: [B, T, H, K]``, ``v: [B, T, H, V]``, per-channel gates ``[B, T, H, K]``,
per-head gates and betas ``[B, T, H]``. Every function casts its inputs to float64 (or to
``compute``), loops over time and returns ``[B, T, H, V]``; with ``final_state=True`` also the state
``[B, H, K, V]``, key-first. Every output is a read-out ``o_t = scale * S_t^T q_t`` of the state
*including* token ``t``. The conventions matched to fla 0.6.0 (scale, gates, normalisation,
the delta rule's defaults): docs/families.md, "Linear attention (LA, GLA, simple GLA, Gated
DeltaNet)", **Reference and tolerance**.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, overload

from pytest_attnperf.families.linear.case import value_grouped
from pytest_attnperf.families.linear.gate import gate_gradient

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import Tensor

__all__ = [
    "CHUNK",
    "GLA_CHUNK",
    "L2NORM_EPS",
    "chunk_gated_delta_rule",
    "chunk_gla",
    "chunk_linear_attention",
    "chunk_simple_gla",
    "NORMALIZE_EPS",
    "gated_delta_rule",
    "gla",
    "l2norm",
    "linear_attention",
    "recurrent_gradients",
    "simple_gla",
]

NORMALIZE_EPS = 1e-10
"""Added to the denominator of normalised linear attention, as fla's ``normalize_with_z_state``."""

L2NORM_EPS = 1e-6
"""Added to the squared norm by ``l2norm``, as fla's ``fla.modules.l2norm`` default."""


def _heads_first(x: Tensor, compute: torch.dtype | None = None) -> Tensor:
    """``[B, T, H, ...]`` to ``[B, H, T, ...]`` in ``compute`` (float64 unless given)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    return x.to(compute or torch.float64).transpose(1, 2)


def _check_per_head(name: str, x: Tensor, k: Tensor) -> None:
    """A per-(token, head) input must be ``[B, T, H]``, the keys' shape less the last axis."""
    if x.shape != k.shape[:3]:
        raise ValueError(f"{name} must have shape [B, T, H] = {list(k.shape[:3])}, got {list(x.shape)}")


def _initial(initial_state: Tensor | None, q: Tensor, key_dim: int, value_dim: int) -> Tensor:
    """The state before the first token, ``[B, H, K, V]`` in ``q``'s dtype (zeros unless given)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    batch, heads = q.shape[0], q.shape[1]
    if initial_state is None:
        return torch.zeros(batch, heads, key_dim, value_dim, dtype=q.dtype, device=q.device)
    expected = (batch, heads, key_dim, value_dim)
    if tuple(initial_state.shape) != expected:
        raise ValueError(f"initial_state has shape {tuple(initial_state.shape)}, expected {expected}")
    return initial_state.to(q.dtype)


def _readout(q_t: Tensor, state: Tensor, scale: float) -> Tensor:
    """``scale * S^T q`` for every (batch, head): ``[B, H, K] x [B, H, K, V] -> [B, H, V]``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    return scale * torch.einsum("bhk,bhkv->bhv", q_t, state)


def _outer(k_t: Tensor, v_t: Tensor) -> Tensor:
    """``k v^T`` for every (batch, head): ``[B, H, K], [B, H, V] -> [B, H, K, V]``."""
    return k_t[..., :, None] * v_t[..., None, :]


def _finish(outputs: list[Tensor], state: Tensor, final_state: bool) -> Tensor | tuple[Tensor, Tensor]:
    """Stack per-token ``[B, H, V]`` outputs into ``[B, T, H, V]``; append the state if asked."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    o = torch.stack(outputs, dim=1)
    return (o, state) if final_state else o


def l2norm(x: Tensor, eps: float = L2NORM_EPS) -> Tensor:
    """``x / sqrt(sum(x**2) + eps)`` over the last axis, in float64 (fla's ``l2norm`` formula)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    x = x.double()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


@overload
def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool = ..., normalize: bool = ...,
    initial_state: Tensor | None = ..., final_state: Literal[False] = ..., compute: torch.dtype | None = ...,
) -> Tensor: ...


@overload
def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, causal: bool = ..., normalize: bool = ...,
    initial_state: Tensor | None = ..., final_state: Literal[True], compute: torch.dtype | None = ...,
) -> tuple[Tensor, Tensor]: ...


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    scale: float,
    causal: bool = True,
    normalize: bool = False,
    initial_state: Tensor | None = None,
    final_state: bool = False,
    compute: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Linear attention (no feature map, no gate), fla's ``linear_attn`` semantics.

    Causal recurrence, per (batch, head)::

        S_t = S_{t-1} + k_t v_t^T                  # [K, V]
        o_t = scale * S_t^T q_t

    With ``normalize=True`` (the default of fla's ``chunk_linear_attn`` and
    ``fused_chunk_linear_attn``, *not* of ``fused_recurrent_linear_attn`` or the naive
    references) each output is divided by the running key sum::

        z_t = sum_{s <= t} k_s
        o_t = (scale * S_t^T q_t) / (scale * q_t . z_t + 1e-10)

    The key sum starts at zero, as fla's does when ``initial_state`` is a plain tensor rather
    than a ``(kv_state, z_state)`` tuple. With ``causal=False`` every token reads the state after
    the last token, ``S_T`` (and ``z_T``); fla has no non-causal kernel.

    Every recurrence here runs in ``compute`` (default float64); in float32 it is the yardstick
    of a kernel that keeps its state in float32 and updates it token by token.
    """
    q, k, v = _heads_first(q, compute), _heads_first(k, compute), _heads_first(v, compute)
    seq, key_dim, value_dim = q.shape[2], q.shape[3], v.shape[3]
    state = _initial(initial_state, q, key_dim, value_dim)
    key_sum = q.new_zeros(q.shape[0], q.shape[1], key_dim)
    if not causal:
        for t in range(seq):
            state = state + _outer(k[:, :, t], v[:, :, t])
        key_sum = k.sum(dim=2)
    outputs = []
    for t in range(seq):
        if causal:
            state = state + _outer(k[:, :, t], v[:, :, t])
            key_sum = key_sum + k[:, :, t]
        o_t = _readout(q[:, :, t], state, scale)
        if normalize:
            denominator = scale * (q[:, :, t] * key_sum).sum(-1, keepdim=True) + NORMALIZE_EPS
            o_t = o_t / denominator
        outputs.append(o_t)
    return _finish(outputs, state, final_state)


@overload
def gla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, scale: float,
    initial_state: Tensor | None = ..., final_state: Literal[False] = ..., compute: torch.dtype | None = ...,
) -> Tensor: ...


@overload
def gla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, scale: float,
    initial_state: Tensor | None = ..., final_state: Literal[True], compute: torch.dtype | None = ...,
) -> tuple[Tensor, Tensor]: ...


def gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    scale: float,
    initial_state: Tensor | None = None,
    final_state: bool = False,
    compute: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Gated linear attention with a per-key-channel log decay ``g: [B, T, H, K]``.

    fla's ``chunk_gla`` / ``fused_recurrent_gla`` (argument ``gk`` there), per (batch, head)::

        S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T   # row i of S decays by exp(g_t[i])
        o_t = scale * S_t^T q_t
    """
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if g.shape != k.shape:
        raise ValueError(f"g must have the keys' shape [B, T, H, K] = {list(k.shape)}, got {list(g.shape)}")
    q, k, v, g = (_heads_first(x, compute) for x in (q, k, v, g))
    state = _initial(initial_state, q, q.shape[3], v.shape[3])
    outputs = []
    for t in range(q.shape[2]):
        state = torch.exp(g[:, :, t])[..., :, None] * state + _outer(k[:, :, t], v[:, :, t])
        outputs.append(_readout(q[:, :, t], state, scale))
    return _finish(outputs, state, final_state)


@overload
def simple_gla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, scale: float,
    initial_state: Tensor | None = ..., final_state: Literal[False] = ..., compute: torch.dtype | None = ...,
) -> Tensor: ...


@overload
def simple_gla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, scale: float,
    initial_state: Tensor | None = ..., final_state: Literal[True], compute: torch.dtype | None = ...,
) -> tuple[Tensor, Tensor]: ...


def simple_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    *,
    scale: float,
    initial_state: Tensor | None = None,
    final_state: bool = False,
    compute: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Linear attention with one log decay per head and token, ``g: [B, T, H]``.

    fla's ``chunk_simple_gla`` / ``fused_recurrent_simple_gla`` with ``g`` (a data-dependent
    decay; ``g_gamma``, a constant per head, is this with ``g`` broadcast over time)::

        S_t = exp(g_t) S_{t-1} + k_t v_t^T
        o_t = scale * S_t^T q_t
    """
    _check_per_head("g", g, k)
    # one decay for every key channel: GLA with the gate broadcast over K, exactly
    per_key = g[..., None].expand(k.shape)
    if final_state:
        return gla(q, k, v, per_key, scale=scale, initial_state=initial_state, final_state=True, compute=compute)
    return gla(q, k, v, per_key, scale=scale, initial_state=initial_state, compute=compute)


@overload
def gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, l2norm_qk: bool = ...,
    initial_state: Tensor | None = ..., final_state: Literal[False] = ..., compute: torch.dtype | None = ...,
) -> Tensor: ...


@overload
def gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, l2norm_qk: bool = ...,
    initial_state: Tensor | None = ..., final_state: Literal[True], compute: torch.dtype | None = ...,
) -> tuple[Tensor, Tensor]: ...


def gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float,
    l2norm_qk: bool = False,
    initial_state: Tensor | None = None,
    final_state: bool = False,
    compute: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Gated DeltaNet: log decay ``g: [B, T, H]`` and write strength ``beta: [B, T, H]``.

    fla's ``chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule`` (argument order
    ``q, k, v, g, beta``), with ``a_t = exp(g_t)``, in fla's ``[K, V]`` state orientation::

        S_t = (I - beta_t k_t k_t^T) a_t S_{t-1} + beta_t k_t v_t^T
        o_t = scale * S_t^T q_t

    (transposed, in the ``[V, K]`` orientation of the GDN paper:
    ``S_t = a_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T``). The decay comes first,
    then the delta correction reads the *decayed* state; computed in the fused form::

        u_t = beta_t (v_t - a_t S_{t-1}^T k_t)     # what token t writes, a V-vector
        S_t = a_t S_{t-1} + k_t u_t^T

    ``l2norm_qk=True`` first normalises ``q`` and ``k`` with :func:`l2norm`, as fla's
    ``use_qk_l2norm_in_kernel=True`` does (default False: pass normalised keys yourself, or the
    state grows without bound whenever ``beta_t |k_t|^2`` leaves ``(0, 2)``).
    """
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    q, k = value_grouped(q, k, v)  # fewer query/key heads than value heads: grouped (case.value_grouped)
    _check_per_head("g", g, k)
    _check_per_head("beta", beta, k)
    if l2norm_qk:
        q, k = l2norm(q), l2norm(k)
    q, k, v, g, beta = (_heads_first(x, compute) for x in (q, k, v, g, beta))
    state = _initial(initial_state, q, q.shape[3], v.shape[3])
    outputs = []
    for t in range(q.shape[2]):
        k_t = k[:, :, t]
        decayed = torch.exp(g[:, :, t])[..., None, None] * state
        written = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhk,bhkv->bhv", k_t, decayed))
        state = decayed + _outer(k_t, written)
        outputs.append(_readout(q[:, :, t], state, scale))
    return _finish(outputs, state, final_state)


def recurrent_gradients(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, grad_out: Tensor, *, scale: float,
    compute: torch.dtype | None = None,
) -> tuple[Tensor, ...]:
    """The gradients of :func:`linear_attention` (``g`` None, unnormalised), :func:`gla` (``g``
    ``[B, T, H, K]``) or :func:`simple_gla` (``g`` ``[B, T, H]``) given ``grad_out``, computed the
    way a recurrent kernel's backward computes them: token by token in ``compute`` (default
    float64), with no autograd and one state in memory::

        dq_t = scale S_t do_t                                  # forward in time
        dH_t = a_{t+1} dH_{t+1} + scale q_t do_t^T             # backward in time, dH_{T+1} = 0
        dk_t = dH_t v_t,   dv_t = dH_t^T k_t
        dg_t = sum_{s >= t} (q_s dq_s - k_s dk_s)              # over K as well for a per-head gate

    (``a_t = exp(g_t)`` decays the rows of the state). The last line is the identity that fla's
    kernels use for the gate's gradient: a reverse cumulative sum whose terms cancel where the
    gradient is small, so its rounding follows the terms' size rather than the result's.
    Returns ``(dq, dk, dv)``, plus ``dg`` when ``g`` is given, in the inputs' layouts.
    """
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    per_head = g is not None and g.dim() == 3
    if g is not None and per_head:
        _check_per_head("g", g, k)
        g = g[..., None].expand(k.shape)
    elif g is not None and g.shape != k.shape:
        raise ValueError(f"g must have the keys' shape [B, T, H, K] = {list(k.shape)} or [B, T, H], "
                         f"got {list(g.shape)}")
    q, k, v, do = (_heads_first(x, compute) for x in (q, k, v, grad_out))
    decay = None if g is None else torch.exp(_heads_first(g, compute))
    seq = q.shape[2]
    state = _initial(None, q, q.shape[3], v.shape[3])
    dq = []
    for t in range(seq):
        state = state if decay is None else decay[:, :, t][..., :, None] * state
        state = state + _outer(k[:, :, t], v[:, :, t])
        dq.append(scale * torch.einsum("bhkv,bhv->bhk", state, do[:, :, t]))
    d_state = torch.zeros_like(state)
    dk, dv = [], []
    for t in reversed(range(seq)):
        if decay is not None and t + 1 < seq:
            d_state = decay[:, :, t + 1][..., :, None] * d_state
        d_state = d_state + scale * _outer(q[:, :, t], do[:, :, t])
        dk.append(torch.einsum("bhkv,bhv->bhk", d_state, v[:, :, t]))
        dv.append(torch.einsum("bhkv,bhk->bhv", d_state, k[:, :, t]))
    dq_t, dk_t, dv_t = torch.stack(dq, dim=1), torch.stack(dk[::-1], dim=1), torch.stack(dv[::-1], dim=1)
    grads: tuple[Tensor, ...] = (dq_t, dk_t, dv_t)
    if g is None:
        return grads

    return grads + (gate_gradient(q.transpose(1, 2), k.transpose(1, 2), dq_t, dk_t, per_head=per_head),)


# -- chunked forms -------------------------------------------------------------------------------

CHUNK = 64
"""Tokens per chunk of the chunked forms (fla's chunk kernels use 64 too)."""

GLA_CHUNK = 16
"""GLA's chunks below float64: its per-channel decay is factored as ``exp(gamma_r) * exp(-gamma_s)``
inside a chunk, whose second factor grows with the chunk's total log decay (``MAX_LOG_DECAY``);
float64 takes ``CHUNK``, a quarter of the chunk states to keep (8.6 GB fewer at B=4 H=16
T=16384 K=V=128)."""

MAX_LOG_DECAY = {"torch.float64": 600.0, "torch.float32": 80.0}
"""Largest total log decay inside one GLA chunk whose ``exp(-gamma)`` the compute dtype holds."""


def _rounding(store: torch.dtype | None) -> Callable[[Tensor], Tensor]:
    """``x`` rounded to ``store`` and back (what a kernel's stored intermediate holds); identity
    for None. Under autograd its gradient is rounded the same way."""
    if store is None:
        return lambda x: x
    return lambda x: x.to(store).to(x.dtype)


def _to_chunks(x: Tensor, chunk: int, dtype: torch.dtype) -> Tensor:
    """``[B, T, H, ...]`` to ``[B, H, N, C, ...]`` in ``dtype``, the last chunk padded with zeros
    (a zero key, value and beta writes nothing; a zero log gate decays nothing)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    x = x.to(dtype).transpose(1, 2)
    pad = (-x.shape[2]) % chunk
    if pad:
        x = torch.cat([x, x.new_zeros(*x.shape[:2], pad, *x.shape[3:])], dim=2)
    return x.reshape(*x.shape[:2], -1, chunk, *x.shape[3:])


def _from_chunks(o: Tensor, seq: int) -> Tensor:
    """``[B, H, N, C, V]`` back to ``[B, T, H, V]``, the padding dropped."""
    return o.flatten(2, 3)[:, :, :seq].transpose(1, 2)


def _decay_matrix(gamma: Tensor, diagonal: bool) -> Tensor:
    """``exp(gamma_r - gamma_s)`` for ``s <= r`` (``s < r`` without the diagonal), else 0;
    ``gamma [..., C]`` is the cumulative log decay inside each chunk."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    size = gamma.shape[-1]
    visible = torch.ones(size, size, dtype=torch.bool, device=gamma.device).tril(0 if diagonal else -1)
    return (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~visible, float("-inf")).exp()


def _chunk_initial(initial_state: Tensor | None, q: Tensor, key_dim: int, value_dim: int) -> Tensor:
    """The state before the first chunk, ``[B, H, K, V]`` in ``q``'s dtype (chunked layout)."""
    return _initial(initial_state, q, key_dim, value_dim).to(q.dtype)


def _chunk_scan(
    q: Tensor, k: Tensor, v: Tensor, gamma: Tensor, *, scale: float, initial_state: Tensor | None,
    final_state: bool, seq: int, store: torch.dtype | None,
) -> Tensor | tuple[Tensor, Tensor]:
    """Chunked linear attention with a cumulative log decay per channel ``gamma [B, H, N, C, K]``
    (zeros: none; broadcast over K: one per head), in ``q``'s dtype.

    Inside a chunk, token ``r`` reads token ``s <= r`` through ``sum_i q_ri k_si
    exp(gamma_ri - gamma_si)``, factored as ``(q exp(gamma))_r . (k exp(-gamma))_s``; across
    chunks through the state ``S_n`` entering chunk ``n``::

        o_r = scale * ((q_r exp(gamma_r))^T S_n + sum_{s <= r} A_rs v_s)
        S_{n+1} = exp(gamma_C) * S_n + sum_s (k_s exp(gamma_C - gamma_s)) v_s^T

    ``store`` rounds what a chunk kernel stores between its products, as fla's do: the
    intra-chunk scores (computed from unrounded factors), the decayed queries and keys of the
    state's products, and each chunk's state; the running state stays in ``q``'s dtype.
    """
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    r = _rounding(store)
    size = q.shape[3]
    visible = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    q_decayed = q * gamma.exp()
    scores = r((q_decayed @ (k * (-gamma).exp()).transpose(-1, -2)).masked_fill(~visible, 0.0))
    last = gamma[..., -1:, :]  # [B, H, N, 1, K]
    writes = r(k * (last - gamma).exp()).transpose(-1, -2) @ v  # [B, H, N, K, V]
    state = _chunk_initial(initial_state, q[:, :, 0], q.shape[-1], v.shape[-1])
    entering = []
    for n in range(q.shape[2]):
        entering.append(state)
        state = last[:, :, n, 0, :, None].exp() * state + writes[:, :, n]
    o = scale * (r(q_decayed) @ r(torch.stack(entering, dim=2)) + scores @ v)
    o = _from_chunks(o, seq)
    return (o, state) if final_state else o


def _chunk_setup(
    tensors: tuple[Tensor, ...], chunk: int, compute: torch.dtype
) -> tuple[Tensor, ...]:
    return tuple(_to_chunks(x, chunk, compute) for x in tensors)


def chunk_linear_attention(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float, initial_state: Tensor | None = None,
    final_state: bool = False, chunk: int = CHUNK, compute: torch.dtype | None = None,
    store: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`linear_attention` (causal, unnormalised) in the chunked form, computed in
    ``compute`` (default float64) with the intermediates a chunk kernel stores rounded to
    ``store`` (default: not rounded). Returns ``[B, T, H, V]`` in ``compute``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    compute = compute or torch.float64
    cq, ck, cv = _chunk_setup((q, k, v), chunk, compute)
    gamma = cq.new_zeros(*cq.shape[:4], 1).expand(cq.shape)
    return _chunk_scan(cq, ck, cv, gamma, scale=scale, initial_state=initial_state, final_state=final_state,
                       seq=q.shape[1], store=store)


def chunk_simple_gla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, scale: float, initial_state: Tensor | None = None,
    final_state: bool = False, chunk: int = CHUNK, compute: torch.dtype | None = None,
    store: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`simple_gla` in the chunked form (arguments as :func:`chunk_linear_attention`)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    _check_per_head("g", g, k)
    compute = compute or torch.float64
    cq, ck, cv, cg = _chunk_setup((q, k, v, g), chunk, compute)
    gamma = cg.cumsum(-1)[..., None].expand(cq.shape)
    return _chunk_scan(cq, ck, cv, gamma, scale=scale, initial_state=initial_state, final_state=final_state,
                       seq=q.shape[1], store=store)


def chunk_gla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, scale: float, initial_state: Tensor | None = None,
    final_state: bool = False, chunk: int | None = None, compute: torch.dtype | None = None,
    store: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`gla` in the chunked form (arguments as :func:`chunk_linear_attention`; ``chunk``
    defaults to ``CHUNK`` in float64, ``GLA_CHUNK`` below); raises ValueError when a chunk decays
    by more than ``MAX_LOG_DECAY`` (its ``exp(-gamma)`` would overflow): use a smaller ``chunk``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if g.shape != k.shape:
        raise ValueError(f"g must have the keys' shape [B, T, H, K] = {list(k.shape)}, got {list(g.shape)}")
    compute = compute or torch.float64
    chunk = chunk or (CHUNK if compute == torch.float64 else GLA_CHUNK)
    cq, ck, cv, cg = _chunk_setup((q, k, v, g), chunk, compute)
    gamma = cg.cumsum(-2)
    limit = MAX_LOG_DECAY.get(str(compute), 10.0)
    deepest = float(-gamma[..., -1, :].detach().min())
    if deepest > limit:
        raise ValueError(f"a chunk of {chunk} tokens decays by exp(-{deepest:.3g}), beyond what {compute} "
                         f"holds in the factored form (exp(-{limit:g})): use a smaller chunk")
    return _chunk_scan(cq, ck, cv, gamma, scale=scale, initial_state=initial_state, final_state=final_state,
                       seq=q.shape[1], store=store)


def chunk_gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, l2norm_qk: bool = False,
    initial_state: Tensor | None = None, final_state: bool = False, chunk: int = CHUNK,
    compute: torch.dtype | None = None, store: torch.dtype | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`gated_delta_rule` in the chunked (WY/UT) form (other arguments as
    :func:`chunk_linear_attention`).

    Inside a chunk, with ``Gamma_r = exp(gamma_r)`` the decay since the chunk's start and
    ``S`` the state entering it, the recurrence's writes ``U`` (``u_t`` of the token form) solve
    a unit lower-triangular system::

        (I + L) U = diag(beta) V - diag(beta Gamma) K S,   L_rs = beta_r (Gamma_r / Gamma_s) k_r.k_s  (s < r)
        U = T diag(beta) V - T diag(beta Gamma) K S,        T = (I + L)^-1
        o_r = scale * (Gamma_r S^T q_r + sum_{s <= r} (Gamma_r / Gamma_s) (q_r.k_s) u_s)
        S' = Gamma_C S + sum_s (Gamma_C / Gamma_s) k_s u_s^T

    With ``store`` given (a yardstick), it rounds where a chunk kernel stores: ``T``,
    ``diag(beta) V`` and ``diag(beta Gamma) K`` and their products with ``T``, the scores, the
    state, the writes ``U``, and the writes decayed to the chunk's end (the decay applied to the
    unrounded writes, the keys left as given), as fla's chunk forward does.
    """
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    q, k = value_grouped(q, k, v)  # fewer query/key heads than value heads: grouped (case.value_grouped)
    _check_per_head("g", g, k)
    _check_per_head("beta", beta, k)
    if l2norm_qk:
        q, k = l2norm(q), l2norm(k)
    r = _rounding(store)
    compute = compute or torch.float64
    cq, ck, cv, cg, cb = _chunk_setup((q, k, v, g, beta), chunk, compute)
    gamma = cg.cumsum(-1)  # [B, H, N, C]
    kk = ck @ ck.transpose(-1, -2)
    lower = cb[..., :, None] * kk * _decay_matrix(gamma, diagonal=False)
    eye = torch.eye(chunk, dtype=compute, device=cq.device).expand(lower.shape)
    inverse = r(torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True))
    u = r(inverse @ r(cb[..., None] * cv))
    w = r(inverse @ r((cb * gamma.exp())[..., None] * ck))
    scores = r((cq @ ck.transpose(-1, -2)) * _decay_matrix(gamma, diagonal=True))
    last = gamma[..., -1:]  # [B, H, N, 1]
    decay = (last - gamma).exp()[..., None]  # to the chunk's end, [B, H, N, C, 1]
    q_decayed = cq * gamma.exp()[..., None]
    state = _chunk_initial(initial_state, cq[:, :, 0], cq.shape[-1], cv.shape[-1])
    outputs = []
    for n in range(cq.shape[2]):
        stored = r(state)
        new = u[:, :, n] - w[:, :, n] @ stored
        outputs.append(q_decayed[:, :, n] @ stored + scores[:, :, n] @ r(new))
        state = last[:, :, n, :, None].exp() * state + ck[:, :, n].transpose(-1, -2) @ r(new * decay[:, :, n])
    o = _from_chunks(scale * torch.stack(outputs, dim=2), q.shape[1])
    return (o, state) if final_state else o
