"""The check of a decode call with a KV cache (the ``kv-cache`` and ``paged`` axes; the layout and
the call: ``families.softmax.paging``): the output against the fp64 reference over each request's
visible keys, and the cache after the call.

The draw is seeded by the case's id; every slot a request should not attend holds stale data
(keys twice as large, values shifted by 4). The output is held to the family's rule
(``kernels.check_tensor``), the cache bit for bit; the kernel may write into the caches only
(``checks.call_checked``). docs/decode.md, "Decode into a KV cache (the `kv-cache` and `paged`
axes)".
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from pytest_attnperf.families.checks import Answer, Checked, CheckFailed, call_checked, own_copies
from pytest_attnperf.families.draws import timed
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import paging
from pytest_attnperf.families.softmax.axes import check_lse, lse_bound, returned
from pytest_attnperf.families.softmax.kernels import HEAD_AXIS, SoftmaxCase, check_tensor, naive
from pytest_attnperf.families.softmax.recompute import further, recomputed_output
from pytest_attnperf.families.softmax.reference import softmax_attention as reference
from pytest_attnperf.measure.switches import exact_fp32

__all__ = ["SPARE_PAGES", "STALE_KEY_SCALE", "STALE_VALUE_SHIFT", "Drawn", "check", "draw", "expected_caches"]

STALE_KEY_SCALE = 2.0
STALE_VALUE_SHIFT = 4.0
SPARE_PAGES = 2


@dataclass(frozen=True)
class Drawn:
    """A cache case's inputs, what the call must leave in the caches, and the references."""

    q: Any
    k: Any
    v: Any
    k_cache: Any  # as the kernel receives it (a pool with ``paged``)
    v_cache: Any
    cache_seqlens: Any  # int32 [B]
    block_table: Any  # int32 [B, max_blocks], or None
    expected_k: Any  # the caches after a correct call
    expected_v: Any
    reference: Any  # fp64 out [B, H, Tq, D]
    yardstick: Any  # the same in the case's dtype (``naive``, and the flash-style emulation's further)
    opts: dict[str, Any]
    lse: Any = None  # with the lse axis: fp64 [B, H, Tq] over each request's positions
    lse_allowed: Any = None  # and each row's bound (``axes.lse_bound``)


_last: dict[tuple[SoftmaxCase, str, int], Drawn] = {}


def _seed(text: str) -> int:
    return zlib.crc32(text.encode())


def draw(case: SoftmaxCase, device: Any, seed: int = 0) -> Drawn:
    """The case's inputs and references (the module's draw; the last case's kept for its other kernels)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    key = (case, str(device), seed)
    if key in _last:
        return _last[key]
    _last.clear()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
    gen = torch.Generator(device="cpu").manual_seed(_seed(f"cache:{case.id}" + (f":{seed}" if seed else "")))
    batch, heads, kv_heads, tq, dim, slots = case.batch, case.heads, case.n_kv_heads, case.seq, case.head_dim, \
        case.n_kv_seq
    lengths = list(case.cache_lengths or ())
    q = torch.randn((batch, heads, tq, dim), generator=gen)
    k, v = (torch.randn((batch, kv_heads, tq, dim), generator=gen) for _ in range(2))
    held = torch.arange(slots)[None, None, :, None] < torch.tensor(lengths)[:, None, None, None]
    k_rows = torch.randn((batch, kv_heads, slots, dim), generator=gen)
    v_rows = torch.randn((batch, kv_heads, slots, dim), generator=gen)
    k_rows = torch.where(held, k_rows, STALE_KEY_SCALE * k_rows)
    v_rows = torch.where(held, v_rows, v_rows + STALE_VALUE_SHIFT)
    q, k, v, k_rows, v_rows = (x.to(dtype) for x in (q, k, v, k_rows, v_rows))
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    table = None
    k_cache, v_cache = k_rows, v_rows
    if case.cache == "paged":
        page = int(case.page_size or 1)
        per_request = slots // page
        pages = batch * per_request + SPARE_PAGES
        order = torch.randperm(pages, generator=gen)
        table = order[: batch * per_request].reshape(batch, per_request).to(torch.int32)
        k_cache = (STALE_KEY_SCALE * torch.randn((pages, page, kv_heads, dim), generator=gen)).to(dtype)
        v_cache = (torch.randn((pages, page, kv_heads, dim), generator=gen) + STALE_VALUE_SHIFT).to(dtype)
        for b in range(batch):  # request b's slots into its pages
            paged = k_rows[b].transpose(0, 1).reshape(per_request, page, kv_heads, dim)
            k_cache[table[b].long()] = paged
            v_cache[table[b].long()] = v_rows[b].transpose(0, 1).reshape(per_request, page, kv_heads, dim)
    expected_k, expected_v = expected_caches(k_cache, v_cache, k, v, seqlens, table)
    opts: dict[str, Any] = {"causal": case.causal, "scale": case.scale, "window": case.window}
    references, yardsticks, lses, allowed = [], [], [], []
    with exact_fp32():
        for b, n in enumerate(lengths):
            keys = paging.gather(expected_k, b, n + tq, table)
            values = paging.gather(expected_v, b, n + tq, table)
            exact, lse = reference(q[b : b + 1], keys, values, **opts, return_lse=True)
            mine = naive(q[b : b + 1], keys, values, **opts)
            references.append(exact)
            yardsticks.append(further(mine, recomputed_output(q[b : b + 1], keys, values, opts, exact), exact))
            if case.lse:
                lses.append(lse)
                allowed.append(lse_bound(q[b : b + 1], keys, opts, None, lse, case.dtype))
    q, k, v, k_cache, v_cache, seqlens, expected_k, expected_v = (
        x.to(device) for x in (q, k, v, k_cache, v_cache, seqlens, expected_k, expected_v))
    found = Drawn(q, k, v, k_cache, v_cache, seqlens, None if table is None else table.to(device), expected_k,
                  expected_v, torch.cat(references).to(device), torch.cat(yardsticks).to(device), opts,
                  torch.cat(lses).to(device) if lses else None, torch.cat(allowed).to(device) if allowed else None)
    _last[key] = found
    return found


def expected_caches(k_cache: Any, v_cache: Any, k: Any, v: Any, cache_seqlens: Any,
                    block_table: Any) -> tuple[Any, Any]:
    """The caches as a correct call leaves them: copies with the new tokens written (``paging.write``)."""
    k_after, v_after = k_cache.clone(), v_cache.clone()
    paging.write(k_after, v_after, k, v, cache_seqlens, block_table)
    return k_after, v_after


def _place(case: SoftmaxCase, index: tuple[int, ...], block_table: Any, lengths: list[int]) -> str:
    """Where a differing element of a cache lies, in words: its request, position and whether the call
    was to write it."""
    if block_table is None:
        b, h, t = index[0], index[1], index[2]
        owner, position = b, t
    else:
        page, slot, h = index[0], index[1], index[2]
        rows = (block_table == page).nonzero()
        if not len(rows):
            return f"page {page} slot {slot} head {h}, a spare page no request owns"
        owner, column = int(rows[0][0]), int(rows[0][1])
        position = column * int(case.page_size or 1) + slot
        where = f"page {page} slot {slot} head {h} (request {owner}'s position {position})"
        return where + _role(position, lengths[owner], case.seq)
    return f"request {owner} head {h} position {position}" + _role(position, lengths[owner], case.seq)


def _role(position: int, held: int, new: int) -> str:
    if position < held:
        return f", inside its cached prefix of {held}: the call must leave it"
    if position < held + new:
        return f", where its new token {position - held} goes"
    return f", past its {held} cached and {new} new tokens: the call must leave it"


def _check_cache(kernel: Kernel, case: SoftmaxCase, name: str, got: Any, expected: Any, before: Any,
                 block_table: Any) -> None:
    """Fail unless the cache ``got`` after the call equals ``expected`` bit for bit, naming the first
    slot that differs and whether the call was to write it."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if tuple(got.shape) != tuple(expected.shape) or got.dtype != expected.dtype:
        raise CheckFailed(f"kernel '{kernel.name}' left its {name} of shape {tuple(got.shape)}, {got.dtype}; it was "
                          f"{tuple(expected.shape)}, {expected.dtype}")
    same = (got == expected) | (torch.isnan(got) & torch.isnan(expected))
    if bool(same.all()):
        return
    wrong = (~same).any(-1)
    first = tuple(int(x) for x in wrong.nonzero()[0])
    lengths = [int(n) for n in case.cache_lengths or ()]
    written = int((~same & (expected != before)).any(-1).sum())
    untouched = int((~same & (expected == before)).any(-1).sum())
    raise CheckFailed(
        f"kernel '{kernel.name}' left its {name} wrong after the call at {int(wrong.sum())} slots x heads "
        f"({written} where a new token should have been written, {untouched} it should have left as they were); the "
        f"first at {_place(case, first, block_table, lengths)}: {got[first][:3].tolist()}... where "
        f"{expected[first][:3].tolist()}... (the cache is compared bit for bit: a write is a copy)")


def check(kernel: Kernel, case: SoftmaxCase, direction: str, device: Any, seed: int = 0) -> Checked:
    """Call ``kernel`` on the cache case and check its output (and LSE) and caches (the module's
    rule); a ``checks.Checked`` with the call to time on its timed draws (``_timed``) and the worst
    ratios."""
    if direction != "fwd":
        raise CheckFailed(f"{case.id}: a cache call is a decode step, forward only")
    d = draw(case, device, seed)
    inputs = own_copies((d.q, d.k, d.v))
    fixed = (d.cache_seqlens.clone(),) + (() if d.block_table is None else (d.block_table.clone(),))
    k_cache, v_cache = d.k_cache.clone(), d.v_cache.clone()  # the kernel's own: it writes into them
    names = "q, k, v, cache_seqlens" + (", block_table" if len(fixed) > 1 else "")
    shape = (case.batch, case.heads, case.seq, case.n_head_dim_v)

    def run() -> Any:
        result = kernel.fn(*inputs, **d.opts, **_keywords(case, k_cache, v_cache, fixed))
        return returned(kernel, result, case, shape, d.q.dtype, d.q.device, True)

    out, lse = call_checked(kernel, run, names, inputs + fixed, device)
    out = out.detach()
    ratio = check_tensor(f"{kernel.name} out", "out", out, d.reference, d.yardstick, case.dtype, kernel.tf32)
    ratios = {"out": ratio}
    if case.lse:  # every row sees a key (its request's new tokens): none is -inf
        ratios["lse"] = check_lse(f"{kernel.name} lse", lse.detach(), d.lse, d.lse_allowed)
    _check_cache(kernel, case, "k_cache", k_cache, d.expected_k, d.k_cache, d.block_table)
    _check_cache(kernel, case, "v_cache", v_cache, d.expected_v, d.v_cache, d.block_table)

    return Checked(_timed(kernel, case, d, inputs + (k_cache, v_cache), fixed, out, shape, seed), ratios)


def _keywords(case: SoftmaxCase, k_cache: Any, v_cache: Any, fixed: tuple[Any, ...]) -> dict[str, Any]:
    """A cache call's keywords: the caches, the lengths and block table (``fixed``), and
    ``return_lse`` with the lse axis."""
    return {"k_cache": k_cache, "v_cache": v_cache, "cache_seqlens": fixed[0],
            **({"block_table": fixed[1]} if len(fixed) > 1 else {}), **({"return_lse": True} if case.lse else {})}


def _timed(kernel: Kernel, case: SoftmaxCase, d: Drawn, inputs: tuple[Any, ...], fixed: tuple[Any, ...], out: Any,
           shape: tuple[int, ...], seed: int) -> Any:
    """The call to time, with its timed draws (``families.draws.Timed``): each draw holds its own
    ``q, k, v`` and caches (``inputs``: the checked call's, its caches as it left them), the
    lengths and block table fixed; a draw moves signs only (``v`` and ``v_cache`` negated and their
    value columns varied together, so the output moves with them), since every request's
    slots and pages stay where they are. The new tokens' writes land where they did on the checked
    call, each time with the values the draw holds then."""

    def run_on(xs: tuple[Any, ...], grad_out: Any) -> Any:
        q, k, v, k_cache, v_cache = xs
        result = kernel.fn(q, k, v, **d.opts, **_keywords(case, k_cache, v_cache, fixed))
        return returned(kernel, result, case, shape, q.dtype, q.device, False)[:1]  # the LSE: checked on draw 0

    answer = Answer(("out",), (out,), (d.reference,), (d.yardstick,), lambda: run_on(inputs, None), run_on=run_on,
                    inputs=inputs, input_names=("q", "k", "v", "k_cache", "v_cache"))

    def check_out(label: str, name: str, value: Any, reference: Any, yardstick: Any) -> float:
        return check_tensor(label, name, value, reference, yardstick, case.dtype, kernel.tf32)

    return timed(answer, kernel.name, check_out, f"{case.id}:fwd:{seed}", HEAD_AXIS, permute=False)
