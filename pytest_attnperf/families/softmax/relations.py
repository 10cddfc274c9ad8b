"""Checks of the softmax family between a kernel's own calls, which need no reference: ``prefix``
(causal), ``batch-split`` and ``inference``, each a named check (a catalogue row's ``relation``;
forward calls only), and the inference call every catalogue forward makes (``inference_agrees``).

The rule (``relation_bound``): two correct answers may differ per element by
``2 (u_d (1 + 2 a) V_c + ulp)``, times ``RELATION_FACTOR`` (the output rule's 2), with ``u_d`` the
inputs' unit roundoff, ``V_c`` the channel's largest ``|v|`` and ``a`` the row's largest
``scale sum_c |q_c k_jc|``. The derivation: docs/families.md, "Softmax", **Checks between calls**.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from pytest_attnperf.families.checks import (
    PRECISION,
    Checked,
    CheckFailed,
    assert_finite,
    call_checked,
    own_copies,
    ulp,
    where,
)
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import axes as call_axes
from pytest_attnperf.families.values import laid_out

__all__ = ["RELATIONS", "RELATION_FACTOR", "check", "inference_agrees", "prefix_length", "refusal", "relation_bound"]

RELATIONS = {
    "prefix": "causal: appending tokens leaves the earlier outputs as they were (a prefix's call equals the whole "
              "call's first rows)",
    "inference": "the forward under torch.no_grad() and torch.inference_mode() equals the grad-mode call, its inputs "
                 "unchanged",
    "batch-split": "a batch of N equals N calls of one batch entry each (outputs, and LSE with lse)",
}
"""The metamorphic checks a softmax ``relation`` row runs."""
RELATION_FACTOR = 2.0
HEAD_AXIS = 1


def prefix_length(case: Any) -> int:
    """The queries the ``prefix`` relation keeps: a little over half, so the cut falls inside a tile."""
    return int(case.seq) // 2 + 1


def refusal(case: Any) -> str | None:
    """Why no softmax kernel can take ``case`` (None when one can): an unknown mask or relation,
    or a relation the case's shape cannot carry."""
    if case.mask is not None and case.mask not in call_axes.MASKS:
        return f"no mask {case.mask!r} (known: {', '.join(call_axes.MASKS)})"
    if case.relation is None:
        return None
    if case.relation not in RELATIONS:
        return f"no relation {case.relation!r} (known: {', '.join(RELATIONS)})"
    if case.relation == "prefix":
        keys = prefix_length(case) + case.n_kv_seq - case.seq
        if not case.causal or case.mask is not None or case.seq < 2 or keys < 1:
            return ("prefix needs a causal case of two queries or more without an explicit mask, whose prefix sees a "
                    "key")
    if case.relation == "batch-split" and (case.batch < 2 or case.mask is not None):
        return "batch-split needs two batch entries or more and no explicit mask"
    return None


def relation_bound(q: Any, k: Any, v: Any, scale: float, dtype: str, a: Any, b: Any) -> Any:
    """How far two correct outputs ``a``, ``b`` ``[B, H, Tq, dv]`` of these inputs may differ, per
    element (the module's rule)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    group = q.shape[1] // k.shape[1]
    qa, ka = q.detach().double().abs(), k.detach().double().abs().repeat_interleave(group, dim=1)
    span = (torch.matmul(qa[:, :, : a.shape[2]], ka.transpose(-1, -2)) * scale).amax(-1, keepdim=True)
    top = v.detach().double().abs().amax(2, keepdim=True).repeat_interleave(group, dim=1)
    u_d = 2.0 ** -PRECISION[dtype]
    rounding = ulp(torch.maximum(a.double().abs(), b.double().abs()), dtype)
    return RELATION_FACTOR * 2.0 * (u_d * (1.0 + 2.0 * span) * top + rounding)


def _compare(label: str, got: Any, expected: Any, allowed: Any, axes: str) -> float:
    """Fail unless ``got`` is within ``allowed`` of ``expected`` everywhere (equal infinities
    agree); the worst element's difference over its bound."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    same = got.double() == expected.double()
    difference = (got.double() - expected.double()).abs().masked_fill(same, 0.0).nan_to_num(nan=math.inf)
    ratio = difference / allowed.clamp_min(torch.finfo(torch.float64).tiny)
    worst = int(ratio.argmax().item()) if ratio.numel() else 0
    value = float(ratio.flatten()[worst]) if ratio.numel() else 0.0
    if value > 1.0:
        raise CheckFailed(
            f"{label}: {int((ratio > 1).sum())} of {ratio.numel()} elements differ between the two sides; the worst, "
            f"at {where(worst, tuple(ratio.shape), axes)}: {float(got.flatten()[worst]):.7g} against "
            f"{float(expected.flatten()[worst]):.7g} (|difference| {float(difference.flatten()[worst]):.3g} > "
            f"{float(allowed.flatten()[worst]):.3g}, relations.relation_bound)", value)
    return value


def _caller(kernel: Kernel, case: Any, p: Any, device: Any) -> Any:
    """A checked forward call of ``kernel`` on given inputs: ``(out, lse)``, detached."""

    def call(xs: tuple[Any, ...], sub: Any, mode: Any = None) -> tuple[Any, Any]:
        def run() -> Any:
            result = kernel.fn(*laid_out(case.layout, xs, HEAD_AXIS, 2), **p.opts,
                               **call_axes.call_kwargs(sub, p.mask))
            shape = tuple(xs[0].shape[:3]) + (case.n_head_dim_v,)
            return call_axes.returned(kernel, result, sub, shape, xs[0].dtype, device, True)

        if mode is None:
            found = call_checked(kernel, run, "q, k, v", xs, device)
        else:
            with mode():
                found = call_checked(kernel, run, "q, k, v", xs, device)
        return found[0].detach(), None if found[1] is None else found[1].detach()

    return call


def _agree(label: str, case: Any, p: Any, sides: tuple[tuple[Any, Any], tuple[Any, Any]], q: Any, k: Any,
           v: Any) -> dict[str, float]:
    """Both sides' outputs (and LSEs) within the rule of each other; their worst ratios."""
    (out, lse), (other, other_lse) = sides
    assert_finite(f"{label} out", out)
    assert_finite(f"{label} out", other)
    ratios = {"out": _compare(f"{label} out", other, out,
                              relation_bound(q, k, v, case.scale, case.dtype, out, other), "b h t d")}
    if lse is not None and other_lse is not None:
        allowed = 2.0 * call_axes.lse_bound(q[:, :, : lse.shape[2]], k, p.opts, p.mask, lse, case.dtype)
        ratios["lse"] = _compare(f"{label} lse", other_lse, lse, allowed, "b h t")
    return ratios


def check(kernel: Kernel, case: Any, p: Any, device: Any) -> Checked:
    """Check ``kernel`` on ``case``'s relation from the case's forward inputs (``p``, a
    ``kernels.PreparedSoftmax``); a ``checks.Checked`` with the whole call (timed unchecked) and the worst
    ratio of each compared tensor."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    relation = case.relation or ""
    label = f"{kernel.name} ({relation}: {RELATIONS.get(relation, '?')})"
    call = _caller(kernel, case, p, device)
    plain_case = replace(case, relation=None)
    if relation == "prefix":
        inputs = own_copies((p.q, p.k, p.v))
        whole = call(inputs, plain_case)
        cut = prefix_length(case)
        keys = cut + case.n_kv_seq - case.seq
        q, k, v = inputs
        part = call((q[:, :, :cut].contiguous(), k[:, :, :keys].contiguous(), v[:, :, :keys].contiguous()),
                    replace(plain_case, seq=cut, kv_seq=keys))
        first = (whole[0][:, :, :cut], None if whole[1] is None else whole[1][:, :, :cut])
        ratios = _agree(label, case, p, (first, part), q, k[:, :, :keys], v[:, :, :keys])
    elif relation == "batch-split":
        inputs = own_copies((p.q, p.k, p.v))
        whole = call(inputs, plain_case)
        ratios = {}
        for b in range(case.batch):
            one = tuple(x[b : b + 1].contiguous() for x in inputs)
            alone = call(one, replace(plain_case, batch=1))
            side = (whole[0][b : b + 1], None if whole[1] is None else whole[1][b : b + 1])
            found = _agree(f"{label}, batch entry {b} alone", case, p, (side, alone), *one)
            ratios = {name: max(ratio, ratios.get(name, 0.0)) for name, ratio in found.items()}
    else:  # inference: the same inputs, requiring grad as in training, in each grad mode
        inputs = tuple(x.detach().clone().requires_grad_(True) for x in (p.q, p.k, p.v))
        trained = call(inputs, plain_case)
        ratios = {}
        for mode in (torch.no_grad, torch.inference_mode):
            other = call(inputs, plain_case, mode)
            found = _agree(f"{label}, under torch.{mode.__name__}()", case, p, (trained, other), *inputs)
            ratios = {name: max(ratio, ratios.get(name, 0.0)) for name, ratio in found.items()}
    timed_inputs = own_copies((p.q, p.k, p.v))

    def timed_call() -> Any:
        return kernel.fn(*laid_out(case.layout, timed_inputs, HEAD_AXIS, 2), **p.opts,
                         **call_axes.call_kwargs(plain_case, p.mask))

    return Checked(timed_call, ratios)


def inference_agrees(kernel: Kernel, case: Any, p: Any, out: Any, device: Any) -> float:
    """One more forward of ``kernel`` on ``case`` under ``torch.inference_mode()`` on its own copies
    of the inputs: unchanged by it, its output within the rule of ``out``, the grad-mode call's."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    inputs = own_copies((p.q, p.k, p.v))
    found = _caller(kernel, case, p, device)(inputs, case, torch.inference_mode)
    label = f"{kernel.name} under torch.inference_mode() against its grad-mode call"
    return _agree(label, case, p, ((out, None), (found[0], None)), *inputs)["out"]
