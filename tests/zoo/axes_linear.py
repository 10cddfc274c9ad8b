"""A zoo for the linear families' call axes (``state``, ``varlen``) and their metamorphic relations
(``split-state``, ``packed-loop``, ``batch-split``, ``inference``): wrong kernels, each a published
class of recurrent-state bug (a dropped or overwritten initial state, a final state one token short, a
state leaking across packed sequences or batch entries, an off-by-one at a sequence boundary, the
caller's state written on the inference path alone),
each beside one correct twin per family, ``twin-axes``, which differs from it only by the bug.

Every kernel is one token recurrence in float64 (differentiable through autograd), in fla's
conventions: ``[B, T, H, D]`` inputs, ``initial_state`` ``[N, H, K, V]`` in and, with
``output_final_state``, ``(o, final_state)`` out (float32), ``cu_seqlens`` the packed sequences'
offsets (``families.linear.axes``). The family is read from the inputs: ``q, k, v`` linear
attention, a gate ``[B, T, H, K]`` GLA, ``[B, T, H]`` simple GLA, a gate and ``beta`` GDN (its
query/key heads repeated over grouped value heads). ``PAIRS`` names each wrong kernel with its
class, the smoke row of that class that catches it, and the directions its bug lives in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from pytest_attnperf.families.registry import Kernel, KernelRegistry

__all__ = ["BUGS", "PAIRS", "Pair", "pytest_attnperf_register_kernels", "register", "twin"]

AXES = ("state", "varlen")
DIRECTIONS = ("fwd", "fwdbwd")
CHUNK = 64  # the chunk of the bug that takes a chunk's start for a sequence's


def _step(family: str, state: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor | None,
          scale: float, write: bool = True) -> tuple[Tensor, Tensor]:
    """One token of every head: ``(o [H, V], new state [H, K, V])``; ``write`` False leaves the
    token's key and value out of the state (its decay kept)."""
    if family == "gla" and g is not None:
        state = g.exp()[..., None] * state
    elif family in ("simple_gla", "gdn") and g is not None:
        state = g.exp()[:, None, None] * state
    if write:
        if family == "gdn" and beta is not None:
            written = beta[:, None] * (v - torch.einsum("hk,hkv->hv", k, state))
        else:
            written = v
        state = state + k[..., None] * written[:, None, :]
    return scale * torch.einsum("hk,hkv->hv", q, state), state


def recurrence(*inputs: Tensor, scale: float, bug: str | None = None, initial_state: Tensor | None = None,
               output_final_state: bool = False, cu_seqlens: Tensor | None = None) -> Any:
    """The linear families' token recurrence in float64 with the optional axes, ``bug`` planted."""
    q, k, v = inputs[:3]
    g = inputs[3] if len(inputs) > 3 else None
    beta = inputs[4] if len(inputs) > 4 else None
    family = ("gdn" if beta is not None else "linear_attn" if g is None
              else "gla" if g.dim() == 4 else "simple_gla")
    batch, seq, heads = v.shape[:3]
    group = heads // q.shape[2]
    qd, kd = (x.double().repeat_interleave(group, dim=2) for x in (q, k))
    vd = v.double()
    gd = None if g is None else g.double()
    bd = None if beta is None else beta.double()
    h0 = initial_state
    if h0 is not None and bug == "no-state-gradient":
        h0 = h0.detach()
    if cu_seqlens is not None:
        offsets = [int(x) for x in cu_seqlens.tolist()]
        if bug == "varlen-boundary-late":  # each sequence taken to start one token after its offset
            offsets = [0] + [min(o + 1, seq) for o in offsets[1:-1]] + [seq]
        runs = [(0, s, e) for s, e in zip(offsets[:-1], offsets[1:], strict=True)]
        if bug == "varlen-last-dropped":  # the loop over sequences stops one short
            runs = runs[:-1]
    else:
        runs = [(b, 0, seq) for b in range(batch)]
    out: list[list[Tensor | None]] = [[None] * seq for _ in range(batch)]
    finals: list[Tensor] = []
    carried: Tensor | None = None
    zero = vd.new_zeros(heads, q.shape[-1], v.shape[-1])
    for n, (b, start, end) in enumerate(runs):
        state = zero if h0 is None else h0[n].double()
        if bug == "drops-initial-state":
            state = zero
        elif bug == "initial-state-of-first" and h0 is not None:
            state = h0[0].double()
        elif bug == "varlen-initial-reversed" and h0 is not None and cu_seqlens is not None:
            state = h0[len(runs) - 1 - n].double()
        late = bug == "initial-state-after-first" and h0 is not None
        if late:
            state = zero
        if carried is not None and ((bug == "varlen-state-leaks" and cu_seqlens is not None)
                                    or (bug == "batch-state-leaks" and cu_seqlens is None)):
            state = state + carried  # the previous sequence's (batch entry's) state not cleared
        before_last = state
        for t in range(start, end):
            if bug == "chunk-start-resets" and t % CHUNK == 0 and t != start:
                state = zero  # a chunk's start taken for a sequence's
            before_last = state
            skip = bug == "boundary-token-unwritten" and cu_seqlens is not None and n > 0 and t == start
            o, state = _step(family, state, qd[b, t], kd[b, t], vd[b, t], None if gd is None else gd[b, t],
                             None if bd is None else bd[b, t], scale, write=not skip)
            if late and h0 is not None and t == start:  # the initial state joins after the first token's read-out
                state = state + h0[n].double()
            out[b][t] = o
        final = before_last if bug == "state-before-last-token" else state
        finals.append(final.transpose(-1, -2) if bug == "state-transposed" else final)
        carried = state
    empty = vd.new_zeros(heads, v.shape[-1])  # a token no run reached (a dropped sequence) reads out nothing
    o = torch.stack([torch.stack([x if x is not None else empty for x in row]) for row in out]).to(q.dtype)
    if not output_final_state:
        return o
    while len(finals) < (len(cu_seqlens) - 1 if cu_seqlens is not None else batch):
        finals.append(zero)
    final_state = torch.stack(finals).float()
    inferring = not torch.is_grad_enabled() or torch.is_inference_mode_enabled()
    if initial_state is not None and (bug == "overwrites-initial-state"
                                      or (bug == "inference-overwrites-state" and inferring)):
        with torch.no_grad():
            initial_state.copy_(final_state)  # the final state written over the caller's initial state
    return o, final_state


@dataclass(frozen=True)
class Pair:
    """A wrong kernel of ``family`` (``bug-<name>``) and its family's twin (``twin-axes``); ``cls``
    the catalogue class its bug lives in, ``row`` the smoke row of that class that catches it, in
    ``directions`` (a relation compares forward calls)."""

    family: str
    name: str
    cls: str
    row: str
    bug: str
    directions: tuple[str, ...] = ("fwd", "fwdbwd")

    @property
    def wrong_name(self) -> str:
        return f"bug-{self.name}"

    def kernel(self) -> Kernel:
        return _kernel(self.family, self.wrong_name, self.name, f"{self.bug} [{self.cls}]")


def _kernel(family: str, name: str, bug: str | None, doc: str) -> Kernel:
    def fn(*inputs: Tensor, scale: float, **axes: Any) -> Any:
        return recurrence(*inputs, scale=scale, bug=bug, **axes)

    fn.__doc__ = doc
    fn.__name__ = fn.__qualname__ = name.replace("-", "_")
    return Kernel(family, name, fn, description=doc, axes=AXES, tiled=False)  # a state kept per token


TWIN_DOC = ("The twin of every bug-* of its family: the token recurrence in float64, each sequence from its own "
            "initial state, the final state after its last token, the caller's tensors left alone.")


def twin(family: str) -> Kernel:
    """The family's correct kernel, which every wrong kernel of it differs from by its bug alone."""
    return _kernel(family, "twin-axes", None, TWIN_DOC)


_STATE = "cat-b2-h1-t12-d16-fp32-state"
_VARLEN = "cat-b1-h1-t24-d16-fp32-lens1x9x14"
_VARLEN_STATE = "cat-b1-h1-t24-d16-fp32-state-lens9x1x14"
_VARLEN_CHUNK = "cat-b1-h1-t138-d16-fp32-lens5x70x63"
_SPLIT = "cat-b2-h1-t12-d16-fp32-state-rel-split-state"
_PACKED = "cat-b1-h1-t24-d16-fp32-lens1x9x14-rel-packed-loop"
_BATCH = "cat-b3-h1-t8-d16-fp32-rel-batch-split"
_INFERENCE = "cat-b2-h2-t10-d16-fp32-state-rel-inference"

BUGS = {
    "drops-initial-state": "Starts every sequence from a zero state, whatever initial_state holds.",
    "state-before-last-token": "Returns the state before the last token was written as the final state.",
    "overwrites-initial-state": "Writes the final state over the caller's initial_state tensor in place.",
    "state-transposed": "Returns the final state [V, K] where [K, V] is asked for (a state_v_first layout).",
    "initial-state-of-first": "Starts every batch entry from the first entry's initial state.",
    "no-state-gradient": "Detaches the initial state: no gradient reaches it.",
    "varlen-state-leaks": "Ignores the cu_seqlens boundaries for the state: each sequence starts from the previous "
                          "one's.",
    "varlen-boundary-late": "Takes each packed sequence to start one token after its offset (an off-by-one at the "
                            "boundary).",
    "varlen-last-dropped": "Its loop over the packed sequences stops one short: the last sequence is never computed.",
    "varlen-initial-reversed": "Gives packed sequence i the initial state of sequence N-1-i.",
    "chunk-start-resets": "Clears the state at every chunk of 64 tokens, as if each chunk started a sequence.",
    "initial-state-after-first": "Adds the initial state after the first token's read-out: a resumed call's first "
                                 "output misses it.",
    "boundary-token-unwritten": "Writes nothing of a packed sequence's first token but the first sequence's into the "
                                "state.",
    "batch-state-leaks": "Starts each batch entry from the previous entry's final state (a state buffer not cleared).",
    "inference-overwrites-state": "With grad disabled (a serving path), writes the final state over the caller's "
                                  "initial_state in place; right when training.",
}
"""Each bug, as its wrong kernel's docstring says it."""

# (family, bug, class, the smoke row of the class that catches it, directions)
_TABLE: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    ("linear_attn", "drops-initial-state", "state", _STATE, DIRECTIONS),
    ("linear_attn", "state-before-last-token", "state", _STATE, DIRECTIONS),
    ("linear_attn", "overwrites-initial-state", "state", _STATE, DIRECTIONS),
    ("linear_attn", "state-transposed", "state", _STATE, DIRECTIONS),
    ("linear_attn", "initial-state-of-first", "state", _STATE, DIRECTIONS),
    ("linear_attn", "no-state-gradient", "state", _STATE, ("fwdbwd",)),
    ("linear_attn", "varlen-state-leaks", "varlen", _VARLEN, DIRECTIONS),
    ("linear_attn", "varlen-boundary-late", "varlen", _VARLEN, DIRECTIONS),
    ("linear_attn", "varlen-last-dropped", "varlen", _VARLEN, DIRECTIONS),
    ("linear_attn", "varlen-initial-reversed", "varlen", _VARLEN_STATE, DIRECTIONS),
    ("linear_attn", "chunk-start-resets", "varlen", _VARLEN_CHUNK, DIRECTIONS),
    ("linear_attn", "initial-state-after-first", "split-state", _SPLIT, ("fwd",)),  # a relation: forward calls
    ("linear_attn", "boundary-token-unwritten", "packed-loop", _PACKED, ("fwd",)),
    ("linear_attn", "batch-state-leaks", "batch-split", _BATCH, ("fwd",)),
    ("gla", "inference-overwrites-state", "inference", _INFERENCE, ("fwd",)),
    # the gated families: the same bugs through a decay (GLA) and the delta rule (GDN)
    ("gla", "drops-initial-state", "state", _STATE, DIRECTIONS),
    ("gla", "varlen-state-leaks", "varlen", _VARLEN, DIRECTIONS),
    ("gdn", "state-before-last-token", "state", _STATE, DIRECTIONS),
    ("gdn", "varlen-boundary-late", "varlen", _VARLEN, DIRECTIONS),
)

PAIRS = tuple(Pair(family, name, cls, row, BUGS[name], directions) for family, name, cls, row, directions in _TABLE)


def register(registry: KernelRegistry) -> None:
    """Every wrong kernel and each family's twin."""
    for pair in PAIRS:
        registry.add(pair.kernel())
    for family in dict.fromkeys(p.family for p in PAIRS):
        registry.add(twin(family))


def pytest_attnperf_register_kernels(registry: KernelRegistry, config: pytest.Config) -> None:
    """The zoo as a plugin (``-p tests.zoo.axes_linear``)."""
    register(registry)
