"""fp64 references. Written from the definitions, for clarity rather than speed.

Layout is torch SDPA's: ``[batch, heads, seq, head_dim]``; K/V may have fewer heads (GQA),
each serving ``heads // kv_heads`` consecutive query heads.
"""

from __future__ import annotations

from typing import Any

__all__ = ["attention_mask", "softmax_attention"]


def attention_mask(seq: int, causal: bool, window: int | None, device: Any) -> Any:
    """Boolean [seq, seq] mask of visible (query, key) pairs, or None for full attention."""
    import torch

    if not causal:
        return None
    i = torch.arange(seq, device=device)[:, None]
    j = torch.arange(seq, device=device)[None, :]
    visible = j <= i
    if window is not None:
        visible &= j > i - window
    return visible


def softmax_attention(
    q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None
) -> Any:
    """softmax(q k^T * scale, masked) v, in float64."""
    import torch

    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    mask = attention_mask(q.shape[2], causal, window, q.device)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)
