"""fp64 references. Written from the definitions, for clarity rather than speed.

Layout is torch SDPA's: ``[batch, heads, seq, head_dim]``; K/V may have fewer heads (GQA),
each serving ``heads // kv_heads`` consecutive query heads, and more positions than the queries
(decode and chunked prefill: ``Tq = q.shape[2]`` new tokens over a cache of ``Tk = k.shape[2]``
keys, the queries being the cache's last ``Tq`` positions). Causal is then aligned to the end of
the cache (lower-right): query ``i`` sees keys ``0 .. Tk - Tq + i``, and a window of ``w`` keeps
the last ``w`` of those. With ``Tq == Tk`` this is the usual causal mask.
"""

from __future__ import annotations

from typing import Any

__all__ = ["attention_mask", "softmax_attention"]


def attention_mask(seq: int, causal: bool, window: int | None, device: Any, kv_seq: int | None = None) -> Any:
    """Boolean ``[seq, kv_seq]`` mask of visible (query, key) pairs (``kv_seq`` defaults to
    ``seq``), causal aligned lower-right; None for full attention."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if not causal:
        return None
    kv_seq = seq if kv_seq is None else kv_seq
    if kv_seq < seq:
        raise ValueError(f"causal attention of {seq} queries needs at least as many keys, got {kv_seq}")
    i = torch.arange(seq, device=device)[:, None] + (kv_seq - seq)  # each query's position in the cache
    j = torch.arange(kv_seq, device=device)[None, :]
    visible = j <= i
    if window is not None:
        visible &= j > i - window
    return visible


def softmax_attention(
    q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None
) -> Any:
    """softmax(q k^T * scale, masked) v, in float64. A GQA group's query heads are stacked
    against their one K/V head (no K/V copies), so a long cache costs one fp64 copy of K and V."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    batch, heads, seq, dim = q.shape
    kv_heads, kv_seq = k.shape[1], k.shape[2]
    group = heads // kv_heads
    q = q.double().reshape(batch, kv_heads, group, seq, dim)
    k, v = k.double()[:, :, None], v.double()[:, :, None]
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    mask = attention_mask(seq, causal, window, q.device, kv_seq)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).reshape(batch, heads, seq, v.shape[-1])
