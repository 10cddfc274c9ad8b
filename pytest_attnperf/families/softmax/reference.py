"""fp64 references. Written from the definitions, for clarity rather than speed.

Layout is torch SDPA's: ``[batch, heads, seq, head_dim]``; K/V may have fewer heads (GQA, each
serving ``heads // kv_heads`` consecutive query heads) and more positions than the queries
(``Tq`` new tokens over ``Tk`` keys): causal is aligned lower-right, query ``i`` seeing keys
``0 .. Tk - Tq + i``. An explicit mask is boolean or additive, applied with the causal one; a row
with no visible key has output 0 and log-sum-exp ``-inf``. docs/families.md, "Softmax";
docs/decode.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["attention_mask", "masked_scores", "softmax_attention"]


def attention_mask(seq: int, causal: bool, window: int | None, device: Any, kv_seq: int | None = None) -> Any:
    """Boolean ``[seq, kv_seq]`` mask of visible (query, key) pairs (``kv_seq`` defaults to
    ``seq``), causal aligned lower-right (with fewer keys than queries, the first ``seq - kv_seq``
    rows are empty); None for full attention."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if not causal:
        return None
    kv_seq = seq if kv_seq is None else kv_seq
    i = torch.arange(seq, device=device)[:, None] + (kv_seq - seq)  # each query's position in the cache
    j = torch.arange(kv_seq, device=device)[None, :]
    visible = j <= i
    if window is not None:
        visible &= j > i - window
    return visible


def masked_scores(scores: Any, causal: bool, window: int | None, attn_mask: Any = None) -> tuple[Any, Any]:
    """``(scores, empty)``: the scaled scores ``[..., Tq, Tk]`` with the causal (window) mask and
    ``attn_mask`` applied (hidden keys ``-inf``), and the rows with no visible key (``[..., Tq, 1]``,
    True there), whose scores are set to 0 so that a softmax over them stays finite (its
    probabilities are then zeroed by the caller: ``0`` output, no NaN in a gradient)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    mask = attention_mask(scores.shape[-2], causal, window, scores.device, scores.shape[-1])
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            mask = attn_mask if mask is None else mask & attn_mask
        else:
            scores = scores + attn_mask.to(scores.dtype)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    empty = torch.isneginf(scores).all(-1, keepdim=True)
    return scores.masked_fill(empty, 0.0), empty


def softmax_attention(
    q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None, attn_mask: Any = None,
    return_lse: bool = False,
) -> Any:
    """softmax(q k^T * scale, masked) v, in float64. A GQA group's query heads are stacked
    against their one K/V head (no K/V copies), so a long cache costs one fp64 copy of K and V.
    ``v`` may have its own head dim (the ``v-dim`` axis). A row with no visible key is 0; with
    ``return_lse``, ``(out, lse)``, ``lse`` ``[B, H, Tq]`` the natural log of each row's sum of
    ``exp(scores)`` (``-inf`` for a row with no visible key)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    batch, heads, seq, dim = q.shape
    kv_heads, kv_seq = k.shape[1], k.shape[2]
    group = heads // kv_heads
    # each group's query heads as rows of one product with their K/V head: torch.matmul copies an
    # operand it broadcasts over a batch dim, which here would be K and V at the query heads
    q = q.double().reshape(batch, kv_heads, group * seq, dim)
    k, v = k.double(), v.double()
    scores = (torch.matmul(q, k.transpose(-1, -2)) * scale).view(batch, kv_heads, group, seq, kv_seq)
    mask = None
    if attn_mask is not None:  # [B|1, H|1, Tq|1, Tk] as the query heads' groups
        mask = attn_mask.expand(batch, heads, seq, kv_seq).reshape(batch, kv_heads, group, seq, kv_seq)
        mask = mask if mask.dtype == torch.bool else mask.double()
    scores, empty = masked_scores(scores, causal, window, mask)
    probabilities = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
    out = torch.matmul(probabilities.reshape(batch, kv_heads, group * seq, kv_seq), v)
    out = out.reshape(batch, heads, seq, v.shape[-1])
    if not return_lse:
        return out
    lse = torch.logsumexp(scores, dim=-1).masked_fill(empty[..., 0], float("-inf"))
    return out, lse.reshape(batch, heads, seq)
