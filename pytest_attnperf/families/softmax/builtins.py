"""The built-in softmax kernels beside ``naive``: SDPA (default, pinned backends, with its
log-sum-exp), SDPA over repeated K/V, the dense window and flex attention's window. Registered
by ``softmax.kernels.register``; docs/families.md describes each."""

from __future__ import annotations

from typing import Any

from pytest_attnperf.families.softmax import paging
from pytest_attnperf.families.softmax.reference import attention_mask

__all__ = ["FLEX_RECOMPILES", "flex_window", "sdpa", "sdpa_dense_window", "sdpa_lse", "sdpa_repeat_kv"]


def sdpa(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None, attn_mask: Any = None,
         return_lse: bool = False, **cache: Any) -> Any:
    """torch.nn.functional.scaled_dot_product_attention with ``is_causal`` (GQA native); with
    another number of queries than keys, causal goes as ``causal_lower_right`` (``is_causal`` would
    align it upper-left), which torch runs on flash or efficient where they take it and otherwise
    as a materialised mask; an ``attn_mask`` is passed as it is (with causal, joined with the
    lower-right mask). ``return_lse``: the flash backend's own log-sum-exp (``sdpa_lse``). A KV
    cache (contiguous or paged): SDPA on each request's gathered keys (``paging.attend``)."""
    import torch.nn.functional as F  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if window is not None:
        raise ValueError("plain SDPA has no sliding window")
    if cache:
        return paging.attend(sdpa, q, k, v, causal=causal, scale=scale, window=window, return_lse=return_lse,
                             **cache)
    if return_lse:
        return sdpa_lse(q, k, v, causal=causal, scale=scale, attn_mask=attn_mask)
    gqa = q.shape[1] != k.shape[1]
    if attn_mask is not None:
        mask = _joined(q, k, causal, attn_mask) if causal else attn_mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    if causal and q.shape[2] != k.shape[2]:
        from torch.nn.attention.bias import causal_lower_right  # noqa: PLC0415 - torch loads on first use

        mask = causal_lower_right(q.shape[2], k.shape[2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)


def _joined(q: Any, k: Any, causal: bool, attn_mask: Any) -> Any:
    """``attn_mask`` with the lower-right causal mask applied: boolean, or additive in its dtype."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    visible = attention_mask(q.shape[2], causal, None, q.device, k.shape[2])
    if visible is None:
        return attn_mask
    if attn_mask is None:
        return visible
    if attn_mask.dtype == torch.bool:
        return attn_mask & visible
    return attn_mask.masked_fill(~visible, float("-inf"))


def sdpa_lse(q: Any, k: Any, v: Any, *, causal: bool, scale: float, attn_mask: Any = None) -> Any:
    """``(out, lse)`` from SDPA's flash backend, which keeps the log-sum-exp for its backward: on
    the CPU ``aten._scaled_dot_product_flash_attention_for_cpu`` (an additive mask joining the
    causal one and ``attn_mask``; K/V expanded over a GQA group); on a GPU
    ``aten._scaled_dot_product_flash_attention`` (fp16 and bf16 only, no mask: a case with another
    dtype or a mask is refused)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    aligned = q.shape[2] == k.shape[2]
    if q.device.type != "cpu":
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise NotImplementedError(f"SDPA's GPU flash backend takes fp16 and bf16 only: no LSE of "
                                      f"{str(q.dtype).removeprefix('torch.')} inputs")
        if attn_mask is not None or (causal and not aligned):
            raise NotImplementedError("SDPA's GPU flash backend takes no mask: its LSE is read without one only")
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    if q.device.type != "cpu":
        found = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return found[0], found[1]
    mask = _joined(q, k, causal and not (aligned and attn_mask is None), attn_mask)
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
    if mask is not None:
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2]).contiguous()
    is_causal = causal and aligned and attn_mask is None
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, attn_mask=mask,
                                                                          scale=scale)
    return out, lse


def sdpa_repeat_kv(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None,
                   attn_mask: Any = None) -> Any:
    """GQA the old way: K/V heads expanded with ``repeat_interleave``, then plain SDPA."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return sdpa(q, k, v, causal=causal, scale=scale, window=window, attn_mask=attn_mask)


def sdpa_dense_window(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
    """Sliding window as simple profilers do it: a dense T x T boolean mask through SDPA."""
    import torch.nn.functional as F  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


    mask = attention_mask(q.shape[2], causal, window, q.device, k.shape[2])
    gqa = q.shape[1] != k.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)


_flex: dict[tuple[int, int, int, str], Any] = {}
FLEX_RECOMPILES = 256  # compilations of flex_attention a run may make (dynamo's default: 8)


def flex_window(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
    """True sliding window: compiled flex_attention with a block mask, so only the blocks
    inside the window are computed (the block mask is built once per shape)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up
    import torch._dynamo  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: PLC0415 - torch loads on first use

    seq, kv_seq = q.shape[2], k.shape[2]
    key = (seq, kv_seq, int(window or kv_seq), str(q.device))
    if key not in _flex:
        width, offset = key[2], kv_seq - seq  # lower-right: query i sits at position offset + i

        def in_window(b: Any, h: Any, qi: Any, ki: Any) -> Any:
            return (ki <= qi + offset) & (qi + offset - ki < width)

        block_mask = create_block_mask(in_window, None, None, seq, kv_seq, device=q.device)
        _flex[key] = (torch.compile(flex_attention, dynamic=False), block_mask)
    compiled, block_mask = _flex[key]
    gqa = q.shape[1] != k.shape[1]
    # every shape, direction and mask is a compilation of flex_attention's one frame: the GPU tables,
    # the decode table and a model's window layers take more than dynamo's default limit of 8, past
    # which flex_attention runs eagerly, materialising the scores
    # (``cache_size_limit``: the older name, which later torch keeps as an alias of ``recompile_limit``)
    with torch._dynamo.config.patch(cache_size_limit=FLEX_RECOMPILES):
        return compiled(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=gqa)
