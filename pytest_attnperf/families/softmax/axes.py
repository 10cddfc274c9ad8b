"""The softmax family's optional call axes: what the call carries for a case that has them, what a
kernel must return, the explicit masks the catalogue draws, and the rule for the log-sum-exp
(nothing here imports torch at import time).

``lse``, ``q-gt-k``, ``v-dim`` and ``mask``: a kernel declares the axes it takes (``Kernel.axes``);
a case carrying another is refused (``family.common_refusal``), never passed. A row with no
visible key has output 0 and log-sum-exp ``-inf``, exactly (``check_empty_rows``). The axes, the
masks (``MASKS``) and ``lse_bound``: docs/families.md, "Softmax".
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

from pytest_attnperf.families.checks import PRECISION, CheckFailed, returned_pair, where
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax.reference import masked_scores

__all__ = ["AXES", "LSE_BLOCK", "LSE_FACTOR", "MASKS", "MaskMaker", "call_kwargs", "check_empty_rows", "check_lse",
           "draw_mask", "lse_bound", "register_mask", "returned"]

AXES = ("lse", "q-gt-k", "v-dim", "mask")
"""The softmax family's optional call axes (``Kernel.axes``)."""

MASKS = {
    "padding": "boolean [B, 1, 1, Tk]: batch entry b sees its first lengths[b] keys (the last sees one)",
    "padding-additive": "the padding mask as an additive float mask in the inputs' dtype: 0 or -inf",
    "per-head": "boolean [1, H, Tq, Tk]: each head its own random pattern, a quarter of the pairs hidden",
    "fully-masked": "boolean [B, H, Tq, Tk]: random, with whole rows hidden (query 0 of every head of batch 0, "
                    "every query of the last head of the last batch entry)",
    "alibi": "additive float [1, H, Tq, Tk] in the inputs' dtype: -slope_h |i - j| (ALiBi's per-head slopes)",
}
"""The explicit masks a case may carry (``SoftmaxCase.mask``); a project adds its own (``register_mask``)."""

MaskMaker = Callable[[Any, Any], Any]
"""A project's mask: ``make(case, generator)`` -> a boolean (True: visible) or floating (additive)
CPU tensor broadcastable to ``[B, H, Tq, Tk]``, from ``case``'s sizes and the CPU generator seeded by
the case's id (the same mask for every kernel and direction)."""
_MADE: dict[str, MaskMaker] = {}


def register_mask(name: str, description: str, make: MaskMaker) -> None:
    """Add a mask a case may name (``SoftmaxCase(..., mask=name)``), made by ``make`` (``MaskMaker``):
    a project's own pattern (documents packed together, a block-sparse layout, a score bias) checked
    and timed as the built-in masks are. A name already taken by another maker is a ``ValueError``;
    the same maker again is a no-op (a conftest.py imported in every pytest-xdist worker)."""
    if not name or not callable(make):
        raise ValueError(f"register_mask needs a name and a callable maker (got {name!r}, {make!r})")
    if name in MASKS and _MADE.get(name) is not make:
        raise ValueError(f"a mask named {name!r} is registered already ({MASKS[name]})")
    MASKS[name], _MADE[name] = description, make

LSE_FACTOR = 2.0  # the rule's factor over a correct kernel's worst rounding, as the output's (checks.FACTOR)
LSE_BLOCK = 64  # keys per block of a flash-style sum: a tree inside a block, a running sum across blocks


def call_kwargs(case: Any, mask: Any) -> dict[str, Any]:
    """The keywords a call on ``case`` carries beyond ``causal, scale, window``: ``attn_mask`` (a
    new tensor each call: a kernel that writes into it spoils nothing shared) and ``return_lse``."""
    kwargs: dict[str, Any] = {}
    if mask is not None:
        kwargs["attn_mask"] = mask.clone()
    if case.lse:
        kwargs["return_lse"] = True
    return kwargs


def returned(kernel: Kernel, result: Any, case: Any, out_shape: tuple[int, ...], dtype: Any, device: Any,
             check: bool) -> tuple[Any, Any]:
    """``(out, lse)`` of a kernel's return value (``lse`` None without the axis), each a plain
    tensor; with ``check``, failing unless an ``lse`` call returned a pair, ``out`` of
    ``out_shape`` and ``dtype``, ``lse`` float32 ``[B, H, Tq]``, both on ``device``."""
    return returned_pair(kernel, result, case.lse, "return_lse=True", "lse", out_shape[:3], out_shape, dtype, device,
                         check)


def draw_mask(case: Any, device: Any, dtype: Any) -> Any:
    """The case's explicit mask (``MASKS``), drawn from its id (the same for every kernel and
    direction), boolean or in ``dtype`` (additive); None without one."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    kind = case.mask
    if kind is None:
        return None
    batch, heads, seq, keys = case.batch, case.heads, case.seq, case.n_kv_seq
    gen = torch.Generator(device="cpu").manual_seed(zlib.crc32(f"mask:{case.id}".encode()))
    if kind in ("padding", "padding-additive"):  # lengths from all the keys down to one
        lengths = [max(1, keys - (keys * b) // max(1, batch - 1)) for b in range(batch)]
        visible = torch.arange(keys)[None, :] < torch.tensor(lengths)[:, None]
        mask = visible[:, None, None, :]
        if kind == "padding":
            return mask.to(device)
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf")).to(device)
    if kind == "per-head":
        return (torch.rand((1, heads, seq, keys), generator=gen) >= 0.25).to(device)
    if kind == "fully-masked":
        mask = torch.rand((batch, heads, seq, keys), generator=gen) >= 0.3
        mask[0, :, 0] = False
        mask[-1, -1] = False
        return mask.to(device)
    if kind == "alibi":
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
        i = torch.arange(seq)[:, None] + (keys - seq)
        j = torch.arange(keys)[None, :]
        return (-slopes[:, None, None] * (i - j).abs()).to(dtype)[None].to(device)
    if kind in _MADE:
        return _made(kind, case, gen, (batch, heads, seq, keys), device, dtype)
    raise ValueError(f"no mask {kind!r} (known: {', '.join(MASKS)})")


def _made(kind: str, case: Any, gen: Any, shape: tuple[int, ...], device: Any, dtype: Any) -> Any:
    """A project's mask ``kind`` for ``case``: boolean as made, floating in the inputs' dtype; a
    maker that raises or makes something else fails naming the mask and what it made."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    try:
        mask = _MADE[kind](case, gen)
    except Exception as exc:
        raise CheckFailed(f"the mask {kind!r}'s maker raised on {case.id}: {type(exc).__name__}: {exc}") from exc
    made = f"a {type(mask).__name__}" if not isinstance(mask, torch.Tensor) else \
        f"a tensor of shape {tuple(mask.shape)}, {mask.dtype}"
    ok = isinstance(mask, torch.Tensor) and (mask.dtype == torch.bool or mask.is_floating_point())
    if ok:  # broadcastable: at most 4 axes, each from the right 1 or the case's
        dims = tuple(mask.shape)
        ok = len(dims) <= 4 and all(d in (1, t) for d, t in zip(dims[::-1], shape[::-1], strict=False))
    if not ok:
        raise CheckFailed(f"the mask {kind!r} on {case.id}: its maker made {made}; a mask is a boolean (True: "
                          f"visible) or floating (additive) tensor broadcastable to [B, H, Tq, Tk] = {list(shape)}")
    return (mask if mask.dtype == torch.bool else mask.to(dtype)).to(device)


def lse_bound(q: Any, k: Any, opts: dict[str, Any], mask: Any, lse: Any, dtype: str) -> Any:
    """Each row's allowed absolute error of a correct kernel's log-sum-exp (float64 ``[B, H, Tq]``).

    A kernel forms ``s_j = scale q.k_j (+ bias_j)`` and ``lse = m + log(sum_j exp(s_j - m))`` in
    float32 (``u = 2^-24`` its unit roundoff; ``u_d`` the inputs' dtype's). With
    ``a = max_j (scale sum_c |q_c k_jc| + |bias_j|)`` over the row's visible keys (``a >= |s_j|``):

    * the scores rounded to the dtype (a materialised kernel) move each ``s_j`` by ``u_d a`` at
      most, and ``lse`` by the probability-weighted mean of those: ``u_d a``;
    * the dot products over ``d`` channels, accumulated in float32: ``d u a``;
    * ``s_j - m``, the exponentials and the logarithm: ``2 u a + 4 u`` (a few ulps each);
    * the sum of the ``n`` visible exponentials, a tree inside blocks of ``LSE_BLOCK`` and a running
      sum across them: a relative error of ``(log2 LSE_BLOCK + n / LSE_BLOCK) u``, absolute in log
      space;
    * the final ``m + log(...)``: one ulp of ``|lse|``, ``u |lse|``.

    The bound is ``LSE_FACTOR`` times their sum, as the output's rule allows twice PyTorch's
    error. A bf16 row of scores up to 10 is allowed about 0.08, an fp32 one about 2e-5; a
    log-sum-exp in base 2, without the scale or of another row is off by far more."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    group = q.shape[1] // k.shape[1]
    qa, ka = q.detach().double().abs(), k.detach().double().abs().repeat_interleave(group, dim=1)
    magnitude = torch.matmul(qa, ka.transpose(-1, -2)) * opts["scale"]
    bias = None
    if mask is not None and mask.dtype != torch.bool:
        bias = mask.double().expand(magnitude.shape)
        magnitude = magnitude + bias.abs().nan_to_num(posinf=0.0)
    hidden, _ = masked_scores(torch.zeros_like(magnitude), opts["causal"], opts["window"],
                              mask if mask is None or mask.dtype == torch.bool else bias)
    visible = ~torch.isneginf(hidden)
    if bias is not None:
        visible &= ~torch.isneginf(bias)
    a = magnitude.masked_fill(~visible, 0.0).amax(-1)
    n = visible.sum(-1).double()
    u, u_d = 2.0**-PRECISION["fp32"], 2.0**-PRECISION[dtype]
    dim = q.shape[-1]
    rounding = (u_d + dim * u + 2 * u) * a + (4 + math.log2(LSE_BLOCK) + n / LSE_BLOCK) * u
    return LSE_FACTOR * (rounding + u * lse.double().abs().nan_to_num(posinf=0.0, neginf=0.0))


def check_lse(label: str, got: Any, reference: Any, allowed: Any) -> float:
    """Fail unless ``got`` (a kernel's ``lse``) is finite where ``reference`` is, ``-inf`` where it
    is (``check_empty_rows``), and within ``allowed`` of it elsewhere; the worst row's error over
    its bound."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    empty = torch.isneginf(reference)
    value = got.double()
    bad = ~torch.isfinite(value) & ~empty
    if bad.any():
        first = int(bad.flatten().nonzero()[0].item())
        raise CheckFailed(f"{label}: {int(bad.sum())} rows with visible keys have a log-sum-exp that is not finite "
                          f"(the first at {where(first, tuple(bad.shape), 'b h t')}: {float(value.flatten()[first])})")
    error = (value - reference).abs().masked_fill(empty, 0.0)
    ratio = error / allowed.clamp_min(torch.finfo(torch.float64).tiny)
    worst = int(ratio.argmax().item()) if ratio.numel() else 0
    if ratio.numel() and float(ratio.flatten()[worst]) > 1.0:
        raise CheckFailed(
            f"{label}: {int((ratio > 1).sum())} of {ratio.numel()} rows' log-sum-exp outside its bound; the worst, at "
            f"{where(worst, tuple(ratio.shape), 'b h t')}: {float(value.flatten()[worst]):.7g} where the fp64 "
            f"reference is {float(reference.flatten()[worst]):.7g} (|error| {float(error.flatten()[worst]):.3g} > "
            f"{float(allowed.flatten()[worst]):.3g}, axes.lse_bound)", float(ratio.flatten()[worst]))
    return float(ratio.flatten()[worst]) if ratio.numel() else 0.0


def check_empty_rows(label: str, out: Any, lse: Any, empty: Any) -> None:
    """The rule for rows with no visible key (``empty``, ``[B, H, Tq]``): output exactly 0 and, where
    the kernel returned one, log-sum-exp ``-inf``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if not bool(empty.any()):
        return
    rows = out.double()[empty]
    wrong = ~(rows == 0).all(-1)
    if bool(wrong.any()):
        places = empty.nonzero()
        first = tuple(int(x) for x in places[int(wrong.nonzero()[0])])
        raise CheckFailed(f"{label} out: {int(wrong.sum())} of {int(empty.sum())} rows with no visible key are not 0 "
                          f"(the first at b={first[0]} h={first[1]} t={first[2]}: {rows[int(wrong.nonzero()[0])][:4]}"
                          "...); a row that sees no key has output 0")
    if lse is None:
        return
    values = lse.double()[empty]
    finite = ~torch.isneginf(values)
    if bool(finite.any()):
        places = empty.nonzero()
        first = tuple(int(x) for x in places[int(finite.nonzero()[0])])
        raise CheckFailed(f"{label} lse: {int(finite.sum())} of {int(empty.sum())} rows with no visible key have a "
                          f"log-sum-exp of {float(values[int(finite.nonzero()[0])])} (the first at b={first[0]} "
                          f"h={first[1]} t={first[2]}), not -inf: the log of an empty sum")
