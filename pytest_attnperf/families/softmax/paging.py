"""The KV cache of a decode call, as the ``kv-cache`` and ``paged`` axes lay it out: where a new
token is written and which keys a request sees (nothing here imports torch at import time).

FlashAttention's ``flash_attn_with_kvcache`` convention in this family's head-major layout:
``k_cache``, ``v_cache`` ``[B, Hkv, Tmax, D]`` (``kv-cache``) or a pool of pages ``[num_blocks,
page_size, Hkv, D]`` named by ``block_table`` (``paged``); ``cache_seqlens`` counts each request's
tokens before the call. The kernel writes the new ``k``, ``v`` at positions ``cache_seqlens[b] ..``
in place, and query ``i`` attends positions up to ``cache_seqlens[b] + i`` of its own cache.
docs/decode.md, "Decode into a KV cache (the `kv-cache` and `paged` axes)".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["KEYWORDS", "attend", "gather", "positions", "write"]

KEYWORDS = ("k_cache", "v_cache", "cache_seqlens", "block_table")
"""The keywords a cache call carries (``block_table`` with ``paged`` only)."""


def positions(cache_seqlens: Any, block_table: Any, b: int, start: int, count: int, page_size: int) -> Any:
    """``(page, slot)`` of request ``b``'s positions ``start .. start + count - 1`` in a pool (each an
    int64 tensor ``[count]``); ``page`` is None for a contiguous cache (the slot is the position)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    device = cache_seqlens.device
    where = torch.arange(start, start + count, device=device)
    if block_table is None:
        return None, where
    return block_table[b].long()[where // page_size], where % page_size


def write(k_cache: Any, v_cache: Any, k: Any, v: Any, cache_seqlens: Any, block_table: Any = None) -> None:
    """Write the new tokens ``k``, ``v`` ``[B, Hkv, Tq, D]`` into the cache in place, request ``b``'s
    at its positions ``cache_seqlens[b] ..``."""
    lengths = [int(n) for n in cache_seqlens.tolist()]
    page_size = k_cache.shape[1] if block_table is not None else 0
    for b, start in enumerate(lengths):
        page, slot = positions(cache_seqlens, block_table, b, start, k.shape[2], page_size)
        if page is None:
            k_cache[b][:, slot] = k[b]
            v_cache[b][:, slot] = v[b]
        else:
            k_cache[page, slot] = k[b].transpose(0, 1)
            v_cache[page, slot] = v[b].transpose(0, 1)


def gather(cache: Any, b: int, count: int, block_table: Any = None) -> Any:
    """Request ``b``'s first ``count`` positions of ``cache`` as ``[1, Hkv, count, D]``."""
    if block_table is None:
        return cache[b : b + 1, :, :count]
    page_size = cache.shape[1]
    pages = block_table[b, : -(-count // page_size)].long()
    flat = cache[pages].reshape(-1, cache.shape[2], cache.shape[3])[:count]
    return flat.transpose(0, 1)[None]


def attend(fn: Callable[..., Any], q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None,
           k_cache: Any, v_cache: Any, cache_seqlens: Any, block_table: Any = None, return_lse: bool = False) -> Any:
    """A cache call made of a plain attention ``fn(q, k, v, *, causal, scale, window)``: the new
    tokens written (``write``), then ``fn`` on each request's gathered keys (``gather``), the
    outputs stacked over the batch; with ``return_lse``, ``fn``'s ``(out, lse)`` each stacked."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    write(k_cache, v_cache, k, v, cache_seqlens, block_table)
    found = []
    for b, held in enumerate(int(n) for n in cache_seqlens.tolist()):
        count = held + q.shape[2]
        keys, values = gather(k_cache, b, count, block_table), gather(v_cache, b, count, block_table)
        lse = {"return_lse": True} if return_lse else {}
        found.append(fn(q[b : b + 1], keys, values, causal=causal, scale=scale, window=window, **lse))
    if return_lse:
        return torch.cat([out for out, _ in found], dim=0), torch.cat([lse for _, lse in found], dim=0)
    return torch.cat(found, dim=0)


CACHES = {
    "append": "the kv-cache axis: a contiguous cache [B, Hkv, Tmax, D], new tokens written at cache_seqlens",
    "paged": "the kv-cache and paged axes: a pool of pages [num_blocks, page_size, Hkv, D] and a block table",
}
"""The caches a case may carry (``SoftmaxCase.cache``)."""


def refusal(case: Any) -> str | None:
    """Why no kernel can take a cache case (None when one can, or the case has no cache): an unknown
    cache, lengths that are not one per request or that overflow the cache, a paged case without a
    page size, or another axis or check beside the cache (a cache call carries an LSE alone)."""
    if case.cache is None:
        return None
    if case.cache not in CACHES:
        return f"no cache {case.cache!r} (known: {', '.join(CACHES)})"
    lengths = case.cache_lengths or ()
    if len(lengths) != case.batch or min(lengths) < 0 or max(lengths) + case.seq > case.n_kv_seq:
        return (f"a cache case needs one length per request ({case.batch}), each at least 0 and at most the cache's "
                f"{case.n_kv_seq} slots less the {case.seq} new tokens: {lengths}")
    if case.cache == "paged" and not (case.page_size and case.n_kv_seq % case.page_size == 0):
        return f"a paged case needs a page size dividing its {case.n_kv_seq} slots: {case.page_size}"
    if case.mask or case.relation or case.layout != "contiguous" or case.values != "normal" \
            or case.n_head_dim_v != case.head_dim:
        return "a cache call carries no other axis but lse, nor a layout, value regime or check between calls"
    return None
