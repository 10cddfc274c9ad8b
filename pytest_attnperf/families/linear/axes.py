"""The linear families' optional call axes: what the call carries for a case that has them, what
a kernel must return, and the fp64 reference over packed sequences (nothing here imports torch at
import time).

``state`` (``initial_state`` in, ``(o, final_state)`` out, float32, key-first) and ``varlen``
(``cu_seqlens``, sequences packed along T of one batch entry), as keywords after ``scale`` in fla
0.6.0's conventions. A kernel declares the axes it takes (``Kernel.axes``); a case carrying
another is refused (``family.common_refusal``), and no keyword the kernel did not declare is
passed. docs/families.md, "Linear attention (LA, GLA, simple GLA, Gated DeltaNet)".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_attnperf.families.checks import CheckFailed, returned_pair
from pytest_attnperf.families.linear.case import LinearCase
from pytest_attnperf.families.registry import Kernel

__all__ = ["AXES", "STATE_HEAD_AXES", "call_kwargs", "gradients", "per_sequence", "returned", "spans", "state_shape"]

AXES = ("state", "varlen")
"""The linear families' optional call axes (``Kernel.axes``)."""
# the states' heads, on their second axis (``state_shape``): the initial and final states and their gradients
STATE_HEAD_AXES = (("h0", 1), ("ht", 1), ("grad_ht", 1), ("dh0", 1))


def state_shape(case: LinearCase) -> tuple[int, int, int, int]:
    """``[N, H, K, V]``: one ``[K, V]`` state per sequence and value head."""
    return (case.sequences, case.heads, case.key_dim, case.value_dim)


def spans(case: LinearCase) -> list[tuple[int, int]]:
    """Each packed sequence's ``(start, end)`` along T (the whole sequence where none are packed)."""
    offsets = case.cu_seqlens or (0, case.seq)
    return list(zip(offsets[:-1], offsets[1:], strict=True))


def call_kwargs(case: LinearCase, h0: Any, device: Any) -> dict[str, Any]:
    """The keywords a call on ``case`` carries beyond ``scale``: the initial state (``h0``) and the
    request for the final one, and ``cu_seqlens`` (a new tensor each call: a kernel that writes
    into it spoils nothing shared)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    kwargs: dict[str, Any] = {}
    if case.state:
        kwargs.update(initial_state=h0, output_final_state=True)
    if case.cu_seqlens is not None:
        kwargs["cu_seqlens"] = torch.tensor(case.cu_seqlens, dtype=torch.long, device=device)
    return kwargs


def returned(kernel: Kernel, result: Any, case: LinearCase, out_shape: tuple[int, ...], dtype: Any, device: Any,
             check: bool) -> tuple[Any, Any]:
    """``(o, final_state)`` of a kernel's return value (``final_state`` None without the state
    axis), each a plain tensor; with ``check``, failing unless a state call returned a pair and
    each is a tensor of its shape, dtype (the final state float32) and device."""
    return returned_pair(kernel, result, case.state, "output_final_state=True", "final state", state_shape(case),
                         out_shape, dtype, device, check)


def gradients(kernel: str, outputs: tuple[Any, ...], inputs: tuple[Any, ...], names: tuple[str, ...],
              grad_outputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """The gradients of several outputs (the output, the final state) against every input, failing
    where an output has no graph or no gradient reaches an input (``checks.gradients`` for one)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    detached = [name for name, x in zip(("the output", "the final state"), outputs, strict=False)
                if not getattr(x, "requires_grad", False)]
    if detached:
        raise CheckFailed(f"kernel '{kernel}' returned {' and '.join(detached)} without a graph, so no gradient "
                          "through it can be checked (a kernel without a backward is registered with backward=False)")
    grads = torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True)
    missing = [name for name, grad in zip(names, grads, strict=True) if grad is None]
    if missing:
        raise CheckFailed(f"kernel '{kernel}' passes no gradient to its input {', '.join(missing)}: its outputs do not "
                          "depend on it through autograd, while the family differentiates every input")
    return tuple(grads)


def per_sequence(fn: Callable[..., Any], tensors: tuple[Any, ...], h0: Any, case: LinearCase,
                 **kwargs: Any) -> tuple[Any, Any]:
    """``fn`` (a reference of ``families.linear.reference``) on each packed sequence of ``case`` in
    turn, from its own initial state (``h0[i]``, or zeros), its outputs concatenated along T and
    its final states stacked: ``(out [B, T, H, V], final [N, H, K, V])``. Without packed sequences,
    one call on the whole batch."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if case.lengths is None:
        out, final = fn(*tensors, initial_state=h0, final_state=True, **kwargs)
        return out, final
    outs, finals = [], []
    for i, (start, end) in enumerate(spans(case)):
        initial = None if h0 is None else h0[i:i + 1]
        out, final = fn(*(x[:, start:end] for x in tensors), initial_state=initial, final_state=True, **kwargs)
        outs.append(out)
        finals.append(final)
    return torch.cat(outs, dim=1), torch.cat(finals, dim=0)
