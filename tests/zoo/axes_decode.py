"""A zoo for the softmax family's decode caches (``kv-cache``, ``paged``), its ``batch-split`` relation
and the order independence of a kernel's results: wrong kernels, each a published class of decode bug
(a new token written one slot late or over position 0, a request's cache length ignored or taken from
another request, a block table read with the wrong stride or page size, a page of another request
read, batch entries mixed, a launch parameter cached on too little of the shape), each beside its
correct twin, which differs from it only by the bug.

Every kernel is softmax attention over materialised scores in the inputs' dtype, in the family's
call; with a cache (``families.softmax.paging``: the layout and the call) it writes the new tokens
into the cache in place, then attends each request's own positions, gathered by its own code (not
the harness's). ``PAIRS`` names each wrong kernel with its class, the smoke row that catches it and
its twin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from pytest_attnperf.families.registry import Kernel, KernelRegistry

__all__ = ["AXES", "BUGS", "PAIRS", "Pair", "attention", "pytest_attnperf_register_kernels", "register",
           "register_order", "stateful", "stateless", "twin"]

AXES = ("kv-cache", "paged", "lse")
ASSUMED_PAGE = 16  # the page size the page-size bug assumes
TILE = 16  # keys per tile of the stateful kernel's cached launch


def _plain(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, window: int | None,
           visible_keys: int | None = None) -> Tensor:
    """Softmax attention in the inputs' dtype, causal lower-right; keys past ``visible_keys`` dropped."""
    return _with_lse(q, k, v, causal, scale, window, visible_keys)[0]


def _with_lse(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, window: int | None,
              visible_keys: int | None = None, lse_keys: int | None = None) -> tuple[Tensor, Tensor]:
    """``_plain`` and its log-sum-exp (float32 ``[B, H, Tq]``, -inf for a row that sees no key) over
    the keys before ``lse_keys`` (None: the same keys as the output's)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    tq, tk = q.shape[2], k.shape[2]
    i = torch.arange(tq, device=q.device)[:, None] + (tk - tq)
    j = torch.arange(tk, device=q.device)[None, :]
    visible = (j <= i) if causal else torch.ones((tq, tk), dtype=torch.bool, device=q.device)
    if window is not None:
        visible = visible & (j > i - window)
    if visible_keys is not None:
        visible = visible & (j < visible_keys)
    scores = scores.masked_fill(~visible, float("-inf"))
    empty = torch.isneginf(scores).all(-1, keepdim=True)
    p = torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    seen = scores if lse_keys is None else scores.masked_fill(torch.arange(tk, device=q.device) >= lse_keys,
                                                              float("-inf"))
    return torch.matmul(p, v), torch.logsumexp(seen.float(), dim=-1)


def _slots(table: Tensor | None, b: int, start: int, count: int, page: int, bug: str | None,
           batch: int) -> tuple[Tensor | None, Tensor]:
    """``(page, slot)`` of request ``b``'s positions ``start ..`` (``page`` None: a contiguous cache)."""
    where = torch.arange(start, start + count)
    if table is None:
        return None, where
    size = ASSUMED_PAGE if bug == "page-size-16" else page
    if bug == "page-size-16":  # the pool addressed as flat memory with the assumed page size
        address = table.long()[b][where // size] * page + where % size
        return address // page, address % page
    if bug == "table-stride-page-size":  # the flattened table read with the page size as its row stride
        flat = table.flatten().long()
        return flat[(b * page + where // size) % flat.numel()], where % size
    rows = table.long()
    index = rows[b][where // size]
    if bug == "reads-next-request-page" and batch > 1:  # the last page read from the next request's row
        last = (where // size) == (start + count - 1) // size
        index = torch.where(last & (where // size > 0), rows[(b + 1) % batch][where // size], index)
    return index, where % size


def _cached(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float, window: int | None, k_cache: Tensor,
            v_cache: Tensor, cache_seqlens: Tensor, block_table: Tensor | None, bug: str | None,
            return_lse: bool = False) -> Any:
    batch, new = q.shape[0], q.shape[2]
    lengths = [int(n) for n in cache_seqlens.tolist()]
    if bug == "seqlens-of-request-0":  # every request's length read from the first request's
        lengths = [lengths[0]] * batch
    page = k_cache.shape[1] if block_table is not None else 0
    outs, lses = [], []
    for b, held in enumerate(lengths):
        start = held + 1 if bug == "write-past-seqlens" else 0 if bug == "write-at-zero" else held
        pages, slots = _slots(block_table, b, start, new, page, bug, batch)
        if pages is None:
            k_cache[b][:, slots], v_cache[b][:, slots] = k[b], v[b]
        else:
            k_cache[pages, slots], v_cache[pages, slots] = k[b].transpose(0, 1), v[b].transpose(0, 1)
        count = held + new
        if bug == "ignores-seqlens-last-request" and b == batch - 1:  # attends every slot of the cache
            count = k_cache.shape[2] if block_table is None else block_table.shape[1] * page
        pages, slots = _slots(block_table, b, 0, count, page, None if bug == "write-past-seqlens" else bug, batch)
        if pages is None:
            keys, values = k_cache[b : b + 1, :, slots], v_cache[b : b + 1, :, slots]
        else:
            keys, values = k_cache[pages, slots].transpose(0, 1)[None], v_cache[pages, slots].transpose(0, 1)[None]
        lse_keys = held if bug == "lse-of-cached-prefix" else None  # the new tokens left out of the sum
        out, lse = _with_lse(q[b : b + 1], keys, values, causal, scale, window, lse_keys=lse_keys)
        outs.append(out)
        lses.append(lse)
    return (torch.cat(outs), torch.cat(lses)) if return_lse else torch.cat(outs)


def attention(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None,
              k_cache: Tensor | None = None, v_cache: Tensor | None = None, cache_seqlens: Tensor | None = None,
              block_table: Tensor | None = None, bug: str | None = None, return_lse: bool = False) -> Any:
    """Softmax attention (with a KV cache where the call carries one) with ``bug`` planted (None:
    correct); with ``return_lse`` (a cache call), ``(out, lse)``."""
    if cache_seqlens is not None and k_cache is not None and v_cache is not None:
        return _cached(q, k, v, causal, scale, window, k_cache, v_cache, cache_seqlens, block_table, bug, return_lse)
    if bug == "batch-mixing" and q.shape[0] > 1:  # every entry but the first reads the previous entry's values
        v = torch.cat([v[:1], v[:-1]])
    return _plain(q, k, v, causal, scale, window)


_launches: dict[int, int] = {}


def stateful(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None,
             **cache: Any) -> Tensor:
    """An autotune-like cache keyed on too little: the number of key tiles its launch covers, chosen at
    the first call of each batch size and kept, so a later call of that batch with more keys drops
    the keys past the first call's tiles (its result depends on what ran before)."""
    tiles = _launches.setdefault(q.shape[0], math.ceil(k.shape[2] / TILE))
    return _plain(q, k, v, causal, scale, window, visible_keys=tiles * TILE)


def stateless(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None,
              **cache: Any) -> Tensor:
    """The stateful kernel's twin: the tiles chosen from each call's own shape."""
    tiles = math.ceil(k.shape[2] / TILE)
    return _plain(q, k, v, causal, scale, window, visible_keys=tiles * TILE)


@dataclass(frozen=True)
class Pair:
    """A wrong kernel (``bug-<name>``) and the twin (``twin-decode``); ``cls`` the catalogue class its
    bug lives in, ``row`` the smoke row of that class that catches it (forward: a decode step)."""

    name: str
    cls: str
    row: str
    bug: str

    @property
    def wrong_name(self) -> str:
        return f"bug-{self.name}"

    def kernel(self) -> Kernel:
        return _kernel(self.wrong_name, self.name, f"{self.bug} [{self.cls}]")


def _kernel(name: str, bug: str | None, doc: str) -> Kernel:
    def fn(q: Tensor, k: Tensor, v: Tensor, *, causal: bool, scale: float, window: int | None = None,
           **cache: Any) -> Any:
        return attention(q, k, v, causal=causal, scale=scale, window=window, bug=bug, **cache)

    fn.__doc__ = doc
    fn.__name__ = fn.__qualname__ = name.replace("-", "_")
    return Kernel("softmax", name, fn, description=doc, axes=AXES, tiled=False)  # its scores materialised


TWIN_DOC = ("The twin of every bug-*: softmax over materialised scores in the inputs' dtype, causal lower-right; the "
            "new tokens written at each request's cache_seqlens, each request attending its own positions through "
            "its own row of the block table at the pool's page size; batch entries apart.")


def twin() -> Kernel:
    """The correct kernel, which every wrong kernel differs from by its bug alone."""
    return _kernel("twin-decode", None, TWIN_DOC)


def register_order(registry: KernelRegistry) -> None:
    """The kernel whose results depend on what ran before it (``bug-stale-launch``, its launches
    forgotten) and its stateless twin (``twin-launch``): the order check's pair (``families.order``)."""
    _launches.clear()
    registry.add(Kernel("softmax", "bug-stale-launch", stateful, description=stateful.__doc__ or "", tiled=False))
    registry.add(Kernel("softmax", "twin-launch", stateless, description=stateless.__doc__ or "", tiled=False))


_APPEND = "cat-b3-h4-kv2-t1-k32-d32-causal-fp32-append-lens5x0x17"
_CHUNK = "cat-b2-h2-t3-k24-d32-causal-fp32-append-lens1x20"
_PAGED = "cat-b3-h4-kv2-t1-k32-d32-causal-fp32-paged8-lens9x0x23"
_PAGED_CHUNK = "cat-b2-h2-t3-k32-d32-causal-fp32-paged4-lens7x2"
_SPLIT = "cat-b4-h2-t20-d32-causal-fp32-rel-batch-split"
_PAGED_LSE = "cat-b2-h4-kv2-t2-k32-d32-causal-fp32-lse-paged8-lens0x21"

BUGS = {
    "write-past-seqlens": "Writes the new tokens one slot late, at cache_seqlens + 1.",
    "write-at-zero": "Writes the new tokens over the start of the cache, position 0.",
    "ignores-seqlens-last-request": "Attends every slot of the last request's cache, ignoring its cache_seqlens.",
    "seqlens-of-request-0": "Takes every request's cache length from the first request's.",
    "table-stride-page-size": "Reads the flattened block table with the page size as its row stride.",
    "page-size-16": "Assumes pages of 16 slots whatever the pool's page size.",
    "reads-next-request-page": "Reads a request's last page from the next request's row of the block table.",
    "batch-mixing": "Reads the previous batch entry's values for every entry but the first.",
    "lse-of-cached-prefix": "Returns the log-sum-exp over the cached prefix alone, the new tokens' keys left out "
                            "(a split-KV merge's partial taken for the whole).",
}
"""Each bug, as its wrong kernel's docstring says it."""

_TABLE: tuple[tuple[str, str, str], ...] = (
    ("write-past-seqlens", "kv-cache", _APPEND),
    ("write-at-zero", "kv-cache", _CHUNK),
    ("ignores-seqlens-last-request", "kv-cache", _APPEND),
    ("seqlens-of-request-0", "cache-ragged", _APPEND),
    ("table-stride-page-size", "paged", _PAGED),
    ("page-size-16", "paged", _PAGED),
    ("reads-next-request-page", "paged", _PAGED_CHUNK),
    ("batch-mixing", "batch-split", _SPLIT),
    ("lse-of-cached-prefix", "kv-cache", _PAGED_LSE),
)

PAIRS = tuple(Pair(name, cls, row, BUGS[name]) for name, cls, row in _TABLE)


def register(registry: KernelRegistry) -> None:
    """Every wrong kernel and the twin."""
    for pair in PAIRS:
        registry.add(pair.kernel())
    registry.add(twin())


def pytest_attnperf_register_kernels(registry: KernelRegistry, config: pytest.Config) -> None:
    """The zoo as a plugin (``-p tests.zoo.axes_decode``)."""
    register(registry)
