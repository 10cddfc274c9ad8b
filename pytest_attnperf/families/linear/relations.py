"""Metamorphic relations of the linear families: checks between a kernel's own calls that need no
reference, each a named check (a catalogue row's ``relation``; forward calls only):
``split-state`` (needs ``state``), ``packed-loop`` (needs ``varlen``), ``batch-split`` (every
kernel) and ``inference`` (its row carries a state: the grad-mode call on inputs that require
grad against calls under ``torch.no_grad()`` and ``torch.inference_mode()``, each of which must
leave its inputs, the initial state among them, as they were).

The rule: each side within ``OUT_UNITS`` unit roundoffs of the exact answer normwise, the two
differ by at most twice that per sequence (or batch entry) and head, with one ulp per element of the
slice's largest magnitude below it (docs/families.md, "Linear attention (LA, GLA, simple GLA, Gated DeltaNet)")."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from pytest_attnperf.families import values
from pytest_attnperf.families.checks import Checked, CheckFailed, assert_finite, call_checked, own_copies, ulp
from pytest_attnperf.families.linear.axes import call_kwargs, returned, spans
from pytest_attnperf.families.linear.case import RELATIONS, LinearCase
from pytest_attnperf.families.linear.rule import OUT_UNITS, UNIT_ROUNDOFF
from pytest_attnperf.families.registry import Kernel

__all__ = ["check", "relation_bound"]

HEAD_AXIS = 2  # [B, T, H, ...]


def relation_bound(a: Any, b: Any, dtype: str) -> float:
    """How far two correct answers on one slice may differ (Frobenius norm): twice the normwise
    rule at the larger slice's norm, plus one ulp of ``dtype`` per element at its largest magnitude."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    a, b = a.double(), b.double()
    norm = max(float(a.norm()), float(b.norm()))
    top = max(float(a.abs().max()), float(b.abs().max())) if a.numel() else 0.0
    floor = math.sqrt(a.numel()) * float(ulp(torch.tensor(top), dtype))
    return 2.0 * (OUT_UNITS * UNIT_ROUNDOFF[dtype] * norm + floor)


def _compare(label: str, name: str, got: Any, expected: Any, slices: list[tuple[str, Any]], dtype: str) -> float:
    """Fail unless every slice of ``got`` is within ``relation_bound`` of ``expected``'s; the worst
    slice's difference over its bound."""
    assert_finite(f"{label} {name}", got)
    assert_finite(f"{label} {name}", expected)
    worst = 0.0
    for where, index in slices:
        a, b = got[index], expected[index]
        error, allowed = float((a.double() - b.double()).norm()), relation_bound(a, b, dtype)
        ratio = error / allowed if allowed > 0 else (0.0 if error == 0 else math.inf)
        if ratio > 1.0:
            raise CheckFailed(
                f"{label} {name}, {where}: the two sides of the relation differ by {error:.3g} (Frobenius norm), "
                f"beyond {allowed:.3g} (twice {OUT_UNITS:g} {dtype} unit roundoffs of the slice's norm "
                f"{max(float(a.double().norm()), float(b.double().norm())):.3g}, plus an ulp per element)",
                ratio)
        worst = max(worst, ratio)
    return worst


def check(family: str, kernel: Kernel, case: LinearCase, prepared: Any, device: Any) -> Checked:
    """Check ``kernel`` on ``case``'s relation, from the case's inputs (``prepared``, a
    ``kernels.PreparedLinear`` of the forward direction); a ``checks.Checked`` with the whole call (timed
    unchecked) and the worst slice's ratio of the output and the final state."""
    inputs = own_copies(prepared.inputs)
    names = ", ".join(prepared.names)
    relation = case.relation or ""
    label = f"{kernel.name} ({relation}: {RELATIONS.get(relation, '?')})"

    def call(sub: LinearCase, tensors: tuple[Any, ...], h0: Any) -> tuple[Any, Any]:
        """``kernel`` on ``sub`` (its axes) with these inputs, its contract and writes checked."""
        xs = tensors + (() if h0 is None else (h0,))
        v = tensors[2]

        def run() -> Any:
            result = kernel.fn(*values.laid_out(case.layout, tensors, HEAD_AXIS, 1), scale=case.scale,
                               **call_kwargs(sub, h0, device))
            return returned(kernel, result, sub, tuple(v.shape), v.dtype, device, True)

        found: tuple[Any, Any] = call_checked(kernel, run, names, xs, device)
        return found[0].detach(), None if found[1] is None else found[1].detach()

    def part(tensors: tuple[Any, ...], start: int, end: int, axis: int) -> tuple[Any, ...]:
        return tuple(x.narrow(axis, start, end - start).contiguous() for x in tensors)

    tensors, h0 = prepared.split(inputs)
    if relation == "inference":  # the grad-mode side on inputs that require grad, as training calls it
        tensors, h0 = prepared.split(tuple(x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs))
    whole, whole_state = call(replace(case, relation=None), tensors, h0)
    heads = range(case.heads)
    if relation == "inference":
        return _inference(kernel, call, label, case, prepared, whole, whole_state)
    if relation == "split-state":
        cut = max(1, case.seq // 2 - 1)
        first, state = call(replace(case, seq=cut, relation=None), part(tensors, 0, cut, 1), h0)
        second, final = call(replace(case, seq=case.seq - cut, relation=None), part(tensors, cut, case.seq, 1),
                             state.clone())
        other, other_state = _cat([first, second], 1), final
        out_slices = [(f"b={b} h={h}", (b, slice(None), h)) for b in range(case.batch) for h in heads]
        state_slices = [(f"b={b} h={h}", (b, h)) for b in range(case.batch) for h in heads]
    elif relation == "packed-loop":
        outs, finals = [], []
        for i, (start, end) in enumerate(spans(case)):
            sub = replace(case, seq=end - start, lengths=None, relation=None)
            o, f = call(sub, part(tensors, start, end, 1), None if h0 is None else h0[i:i + 1].clone())
            outs.append(o)
            finals.append(f)
        other, other_state = _cat(outs, 1), (None if h0 is None else _cat(finals, 0))
        out_slices = [(f"sequence {i} (tokens {s}:{e}) h={h}", (0, slice(s, e), h))
                      for i, (s, e) in enumerate(spans(case)) for h in heads]
        state_slices = [(f"sequence {i} h={h}", (i, h)) for i in range(case.sequences) for h in heads]
    else:  # batch-split
        outs, finals = [], []
        for b in range(case.batch):
            o, f = call(replace(case, batch=1, relation=None), part(tensors, b, b + 1, 0),
                        None if h0 is None else h0[b:b + 1].clone())
            outs.append(o)
            finals.append(f)
        other, other_state = _cat(outs, 0), (None if h0 is None else _cat(finals, 0))
        out_slices = [(f"b={b} h={h}", (b, slice(None), h)) for b in range(case.batch) for h in heads]
        state_slices = [(f"b={b} h={h}", (b, h)) for b in range(case.batch) for h in heads]
    ratios = {"out": _compare(label, "out", whole, other, out_slices, case.dtype)}
    if whole_state is not None and other_state is not None:
        ratios["ht"] = _compare(label, "final state", whole_state, other_state, state_slices, case.dtype)

    def timed_call() -> Any:
        return kernel.fn(*values.laid_out(case.layout, tensors, HEAD_AXIS, 1), scale=case.scale,
                         **call_kwargs(replace(case, relation=None), h0, device))

    return Checked(timed_call, ratios)


def _inference(kernel: Kernel, call: Any, label: str, case: LinearCase, prepared: Any, whole: Any,
               whole_state: Any) -> Checked:
    """The ``inference`` relation: the forward under ``torch.no_grad()`` and under
    ``torch.inference_mode()``, each on its own copies of the inputs (which ``call`` checks it
    leaves as they were: a kernel that writes the final state into the caller's initial state on
    the inference path fails there), against the grad-mode call ``whole`` (and its final state)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    sub = replace(case, relation=None)
    out_slices = [(f"b={b} h={h}", (b, slice(None), h)) for b in range(case.batch) for h in range(case.heads)]
    state_slices = [(f"b={b} h={h}", (b, h)) for b in range(case.sequences) for h in range(case.heads)]
    ratios = {"out": 0.0}
    for mode, named in ((torch.no_grad, "torch.no_grad()"), (torch.inference_mode, "torch.inference_mode()")):
        tensors, h0 = prepared.split(tuple(x.detach().clone() for x in prepared.inputs))
        try:
            with mode():
                out, state = call(sub, tensors, h0)
        except CheckFailed as exc:
            raise CheckFailed(f"{label}, under {named}: {exc}", exc.ratio) from None
        where = f"{label} under {named} against its grad-mode call"
        ratios["out"] = max(ratios["out"], _compare(where, "out", out.clone(), whole, out_slices, case.dtype))
        if state is not None and whole_state is not None:
            ratios["ht"] = max(ratios.get("ht", 0.0),
                               _compare(where, "final state", state.clone(), whole_state, state_slices, case.dtype))
    tensors, h0 = prepared.split(own_copies(prepared.inputs))
    device = tensors[0].device

    def timed_call() -> Any:
        return kernel.fn(*values.laid_out(case.layout, tensors, HEAD_AXIS, 1), scale=case.scale,
                         **call_kwargs(sub, h0, device))

    return Checked(timed_call, ratios)


def _cat(parts: list[Any], axis: int) -> Any:
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    return torch.cat(parts, dim=axis)
