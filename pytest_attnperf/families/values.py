"""Value regimes and input layouts: what a case's inputs hold and how a kernel receives them.

A case's ``values`` names how its inputs are drawn (``normal``: standard normal draws; the rest
are adversarial, each after a class of published attention bugs) and its ``layout`` how the
kernel receives them (``contiguous``, or a strided view with the same values). The fp64
references see the same values; docs/catalogue.md says which bug each regime reaches.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

__all__ = [
    "LAYOUTS", "LINEAR_VALUES", "SOFTMAX_VALUES", "laid_out", "layout_refusal", "linear_gates", "linear_scales",
    "softmax_inputs", "values_refusal",
]

# softmax: the scores q.k * scale (scale = d^-0.5) that each regime reaches
LARGE_LOGIT = 140.0  # past exp's overflow in fp32 and bf16 (88.7) and fp16 (11.1): a max not subtracted overflows
NEGATIVE_LOGIT = -150.0  # every score of a row about this: exp(s) underflows fp32 (below -103), the LSE is -150
SOFTMAX_VALUES = ("normal", "large-logits", "negative-lse", "ties", "onehot")
LINEAR_VALUES = ("normal", "gate-near-zero", "gate-strong", "decay-underflow", "beta-bounds", "large-state")
LAYOUTS = ("contiguous", "transposed", "sliced", "expanded-kv")


def values_refusal(family: str, values: str, known: tuple[str, ...]) -> str | None:
    """Why ``family``, whose value regimes are ``known`` (``SOFTMAX_VALUES``, ``LINEAR_VALUES``),
    has no regime ``values`` (None when it has)."""
    return None if values in known else f"no value regime {values!r} for {family} (known: {', '.join(known)})"


def layout_refusal(layout: str) -> str | None:
    """Why there is no input layout ``layout`` (None when there is; a family may take fewer)."""
    return None if layout in LAYOUTS else f"no layout {layout!r} (known: {', '.join(LAYOUTS)})"


def softmax_inputs(values: str, shape_q: tuple[int, ...], shape_kv: tuple[int, ...], scale: float,
                   draw: Callable[[tuple[int, ...]], Any]) -> tuple[Any, Any, Any]:
    """``q, k, v`` in float32 for the regime ``values``; ``draw(shape)`` gives standard normal
    draws (the case's generator), so ``normal`` is exactly three draws in turn."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    q, k, v = draw(shape_q), draw(shape_kv), draw(shape_kv)
    if values == "normal":
        return q, k, v
    dim = shape_q[-1]
    group = shape_q[1] // shape_kv[1]
    if values == "large-logits":  # scores with a spread of LARGE_LOGIT / 3: rows whose largest is past exp's overflow
        gain = math.sqrt(LARGE_LOGIT / 3.0)
        return q * gain, k * gain, v
    if values == "negative-lse":  # q near u, k near -u: every score about NEGATIVE_LOGIT, spread about 1
        u = draw((shape_kv[0], shape_kv[1], 1, dim))
        u = u / u.norm(dim=-1, keepdim=True) * math.sqrt(-NEGATIVE_LOGIT / scale)
        uq = u.repeat_interleave(group, dim=1)
        return uq + 0.1 * q, -u + 0.1 * k, v
    if values == "ties":  # every key of a head the same: each row's scores tie, its softmax is uniform
        return q, k[:, :, :1].expand(shape_kv).contiguous(), v
    if values == "onehot":  # one-hot queries and keys (scores 0 or 64 * scale), the first batch entry's queries zero
        qi = q.abs().argmax(-1)
        ki = k.abs().argmax(-1)
        q1 = torch.nn.functional.one_hot(qi, dim).to(q.dtype) * 8.0
        k1 = torch.nn.functional.one_hot(ki, dim).to(k.dtype) * 8.0
        q1[0] = 0.0
        return q1, k1, v
    raise ValueError(values_refusal("softmax", values, SOFTMAX_VALUES) or f"no regime {values!r}")


def linear_gates(values: str, draw: Callable[..., Any], *shape: int) -> Any:
    """A linear family's fp32 log decay of ``shape`` for the regime ``values``: ``logsigmoid`` of
    a normal draw, or near 0 (``gate-near-zero``: no decay at all), near -inf (``gate-strong``:
    each token decays by exp(-20) to exp(-60)), or moderate for long (``decay-underflow``: about
    exp(-3) a token, so a chunk of 64 spans exp(-190), past what an fp32 exp(-cumsum) holds)."""
    import torch.nn.functional as F  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    x = draw(*shape)
    if values == "gate-near-zero":
        return F.logsigmoid(x + 12.0)
    if values == "gate-strong":
        return -(20.0 + 40.0 * x.abs().clamp(max=1.0))
    if values == "decay-underflow":
        return -(3.0 + 0.5 * x.abs().clamp(max=2.0))
    return F.logsigmoid(x)


def linear_scales(values: str) -> tuple[float, float]:
    """``(q_gain, kv_gain)``: ``large-state`` grows the state past fp16's range (keys and values
    96x, queries 1/96x, gates near 0: over 24 tokens of 16 channels its entries pass 65504),
    so the output stays representable while the state does not."""
    return (1.0 / 96.0, 96.0) if values == "large-state" else (1.0, 1.0)


def beta_bounds(beta: Any, beta_max: float) -> Any:
    """GDN's beta at its bounds: 0 and ``beta_max`` on alternate tokens (a write of nothing, a full write)."""
    out = beta.clone()
    out[:, 0::2] = 0.0
    out[:, 1::2] = beta_max
    return out


def laid_out(layout: str, tensors: tuple[Any, ...], heads_axis: int, seq_axis: int, kv_heads: int | None = None) -> \
        tuple[Any, ...]:
    """``tensors`` as the kernel receives them in ``layout``: the same values, other strides.
    ``transposed``: each a view of a buffer with the head and sequence axes swapped (SDPA's layout
    read from a ``[B, T, H, D]`` buffer, fla's from ``[B, H, T, D]``); ``sliced``: each the first
    channels of a buffer 8 wider, so rows are not contiguous; ``expanded-kv``: K and V (the second
    and third) of ``kv_heads`` = 1 expanded over the query's heads with stride 0. Differentiable:
    gradients reach the case's own tensors."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if layout == "contiguous":
        return tensors
    if layout == "transposed":
        return tuple(x.transpose(heads_axis, seq_axis).contiguous().transpose(heads_axis, seq_axis) for x in tensors)
    if layout == "sliced":
        out = []
        for x in tensors:
            wide = torch.cat([x, torch.zeros(*x.shape[:-1], 8, dtype=x.dtype, device=x.device)], dim=-1)
            out.append(wide[..., : x.shape[-1]])
        return tuple(out)
    if layout == "expanded-kv":
        q, k, v, *rest = tensors
        if k.shape[heads_axis] != 1:
            raise ValueError("expanded-kv needs a case of one key/value head")
        shape = list(k.shape)
        shape[heads_axis] = q.shape[heads_axis]
        return (q, k.expand(shape), v.expand(shape), *rest)
    raise ValueError(layout_refusal(layout) or layout)
