"""The timed draws of a case: the checked call's inputs, rearranged so that the answer is known.

A case is checked on draw 0; each timed draw is draw 0 with batch entries and heads permuted
(a GQA group, or GDN's grouped value heads, moving as one) and ``v`` negated, under which every
family's exact answer moves exactly, so draw 0's fp64 reference serves every draw
(``Transform.apply``). ``Timed.rewritten`` writes another arrangement over a draw's inputs in
place before it is checked; ``Timed.vary`` gives each timed call a sign pattern over the value
axis no other call read. Aimed at stale answers, not at a kernel that recognises these moves.

docs/measurement.md, "The timed work is the checked work", gives the reasoning in full.
"""

from __future__ import annotations

import random
import weakref
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pytest_attnperf.families.checks import CheckFailed

if TYPE_CHECKING:
    from pytest_attnperf.families.checks import Answer

__all__ = ["FLIPPED_WITH_V", "NEGATED_BY_GRAD", "NEGATED_BY_V", "Timed", "Transform", "timed"]

# which tensors change sign when v is negated, and when the output gradient is
# (``grad_ht``: the final state's gradient, an input of a linear backward with a state, which moves
# as the output gradient does; ``dh0``, the initial state's gradient, follows the gradients alone;
# ``v_cache``: a decode call's cache of values, which moves with ``v``)
NEGATED_BY_V = frozenset({"v", "v_cache", "out", "dq", "dk", "dg", "dbeta", "h0", "ht"})
NEGATED_BY_GRAD = frozenset({"grad_out", "grad_ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"})
# which tensors' value columns (last axis) change sign with v's, the state's and the output
# gradient's together (``Transform.flips``); the inputs among them are what ``Timed.vary`` writes
FLIPPED_WITH_V = frozenset({"v", "v_cache", "h0", "grad_out", "grad_ht", "out", "ht", "dv", "dh0"})
VARIED_INPUTS = frozenset({"v", "v_cache", "h0", "grad_ht"})


@dataclass(frozen=True)
class Transform:
    """One timed draw's rearrangement of draw 0: ``batch[i]`` is the batch entry that lands at
    ``i``, ``groups[j]`` the key/value head whose group lands at group ``j``; ``v_sign`` and
    ``grad_sign`` are each 1 or -1."""

    batch: tuple[int, ...]
    groups: tuple[int, ...]
    v_sign: int
    grad_sign: int
    head_axis: int
    axes: tuple[tuple[str, int], ...] = ()  # tensors whose heads are on another axis than head_axis
    flips: tuple[int, ...] = ()  # a timed call's signs over the value columns (``Timed.vary``); () for none

    def axis(self, name: str) -> int:
        """The head axis of tensor ``name``."""
        return dict(self.axes).get(name, self.head_axis)

    @classmethod
    def draw(cls, seed_text: str, index: int, batch: int, groups: int, head_axis: int, backward: bool,
             permute: bool = True, axes: tuple[tuple[str, int], ...] = ()) -> Transform:
        """Timed draw ``index`` (1 and up) of a case of ``batch`` entries and ``groups``
        key/value heads, seeded by ``seed_text`` (the case) and the index; signs only where
        ``permute`` is False."""
        rng = random.Random(zlib.crc32(f"{seed_text}:{index}".encode()))
        order_b, order_g = list(range(batch)), list(range(groups))
        if permute:
            rng.shuffle(order_b)
            rng.shuffle(order_g)
        grad_sign = rng.choice((1, -1)) if backward else 1
        return cls(tuple(order_b), tuple(order_g), -1, grad_sign, head_axis, axes)

    def permutes(self) -> bool:
        """Whether batch entries or heads move: then every tensor of the draw differs from draw
        0's (a case of one batch entry and one key/value head, or a sign-only draw, has signs
        only)."""
        return list(self.batch) != sorted(self.batch) or list(self.groups) != sorted(self.groups)

    def rotated(self) -> Transform:
        """The draw with its batch entries (or, for one batch entry, its groups) moved on by one
        more place: a permutation where this one is none, if the case has room for one."""
        if len(self.batch) > 1:
            return replace(self, batch=self.batch[1:] + self.batch[:1])
        return replace(self, groups=self.groups[1:] + self.groups[:1])

    def describe(self) -> str:
        """What this draw did to draw 0, in words ("" for nothing)."""
        done = []
        if list(self.batch) != sorted(self.batch):
            done.append("batch entries permuted")
        if list(self.groups) != sorted(self.groups):
            done.append("heads permuted")
        if self.v_sign < 0:
            done.append("v negated")
        if self.grad_sign < 0:
            done.append("output gradient negated")
        if -1 in self.flips:
            done.append(f"value columns {_columns(self.flips)} negated (one timed call's)")
        return ", ".join(done)

    def sign(self, name: str) -> int:
        """The sign tensor ``name`` takes (``q``, ``v``, ``grad_out``, ``out``, ``dv``...)."""
        return (self.v_sign if name in NEGATED_BY_V else 1) * (self.grad_sign if name in NEGATED_BY_GRAD else 1)

    def apply(self, name: str, x: Any) -> Any:
        """``x`` (tensor ``name`` of draw 0) as it is in this draw: a new tensor, or ``x`` itself
        where the draw leaves it as it is."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

        device, out, axis = x.device, x, self.axis(name)
        if list(self.batch) != sorted(self.batch):
            out = out.index_select(0, torch.tensor(self.batch, device=device))
        if x.ndim > axis and list(self.groups) != sorted(self.groups):
            heads = x.shape[axis]
            group = heads // len(self.groups)
            order = [g * group + j for g in self.groups for j in range(group)]
            out = out.index_select(axis, torch.tensor(order, device=device))
        out = -out if self.sign(name) < 0 else out
        if -1 in self.flips and name in FLIPPED_WITH_V:
            if x.shape[-1] != len(self.flips):
                raise ValueError(f"{name} has {x.shape[-1]} value columns; the call's signs are for {len(self.flips)}")
            out = out * torch.tensor(self.flips, dtype=out.dtype, device=device)
        return out


def _columns(flips: tuple[int, ...]) -> str:
    """The negated columns of ``flips``, in words: "0, 3, 5 of 16", the first eight only."""
    negated = [str(c) for c, sign in enumerate(flips) if sign < 0]
    shown = ", ".join(negated[:8]) + (", ..." if len(negated) > 8 else "")
    return f"{shown} of {len(flips)}"


class _Drawn:
    """One timed draw's call and the inputs it owns (``Timed.draw``)."""

    __slots__ = ("__weakref__", "grad_out", "inputs", "run_on")

    def __init__(self, run_on: Callable[[tuple[Any, ...], Any], Any], inputs: tuple[Any, ...], grad_out: Any) -> None:
        self.run_on, self.inputs, self.grad_out = run_on, inputs, grad_out

    def __call__(self) -> Any:
        return self.run_on(self.inputs, self.grad_out)


def _unvaried() -> None:
    """``Timed.vary`` where a case has nothing to vary."""


def _own(y: Any, x: Any) -> Any:
    """``y``, or a copy of it where it is ``x``'s memory (a draw that leaves a tensor as it is):
    a timed draw's inputs are its own, to be rewritten in place (``Timed.rewritten``)."""
    return y.clone() if y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() else y


class Timed:
    """A checked case's callable to time (``measure.verify.Draws``): calling it runs the
    checked call on draw 0; ``draw(i)`` gives the same call on timed draw ``i``, on inputs of
    its own; ``rewritten(i)`` writes another rearrangement of draw 0 over them in place for a
    block; and ``verify(i, result)`` holds what a call of draw ``i`` returned to the family's
    rule against draw 0's reference and yardstick, rearranged as draw ``i``'s inputs are now.

    ``run_on(inputs, grad_out)`` is the family's call on given inputs (the kernel, and the
    gradients for fwdbwd); ``check(label, name, value, reference, yardstick)`` the family's rule
    for one tensor, returning its worst error over its bound or raising ``CheckFailed``."""

    def __init__(
        self, call: Callable[[], Any], *, run_on: Callable[[tuple[Any, ...], Any], Any],
        inputs: tuple[Any, ...], input_names: tuple[str, ...], grad_out: Any,
        names: tuple[str, ...], reference: tuple[Any, ...], yardstick: tuple[Any, ...],
        check: Callable[[str, str, Any, Any, Any], float], seed_text: str, head_axis: int, kernel: str,
        shapes: tuple[tuple[int, ...], ...] = (), permute: bool = True, got: tuple[Any, ...] = (),
        head_axes: tuple[tuple[str, int], ...] = (),
    ) -> None:
        self._call, self._run_on, self._check = call, run_on, check
        self._inputs, self._input_names, self._grad_out = inputs, input_names, grad_out
        self._names, self._reference, self._yardstick = names, reference, yardstick
        self._seed_text, self._head_axis, self.kernel = seed_text, head_axis, kernel
        self._shapes, self._permute, self._got = shapes, permute, got
        self._head_axes = head_axes
        # the value-column sign patterns the case's timed calls have read (``vary``), as bits
        self._patterns: set[int] = set()
        self._pattern_rng = random.Random(zlib.crc32(f"{seed_text}:calls".encode()))
        self._transforms: dict[int, Transform] = {}
        self._now: dict[int, Transform] = {}  # a draw's arrangement while rewritten
        # each draw's call, weakly: its inputs go with the harness's last reference to it (Replays.release)
        self._drawn: weakref.WeakValueDictionary[int, _Drawn] = weakref.WeakValueDictionary()

    def __call__(self) -> Any:
        """The checked call, on draw 0."""
        return self._call()

    def transform(self, index: int) -> Transform:
        """Timed draw ``index``'s rearrangement (the same for the same case and index)."""
        if index not in self._transforms:
            self._transforms[index] = self._arrangement(index)
        return self._transforms[index]

    def _arrangement(self, seed_index: int) -> Transform:
        x, axes = self._inputs[0], dict(self._head_axes)
        heads = {t.shape[axes.get(n, self._head_axis)] for n, t in zip(self._input_names, self._inputs, strict=True)
                 if t.ndim > axes.get(n, self._head_axis)}
        kv = min(heads, default=1)
        if any(h % kv for h in heads):  # no grouping every tensor shares: heads stay where they are
            kv = 1
        backward = bool(getattr(x, "requires_grad", False))
        return Transform.draw(self._seed_text, seed_index, x.shape[0], kv, self._head_axis, backward, self._permute,
                              self._head_axes)

    def rewrite(self, index: int) -> Transform:
        """The arrangement ``rewritten(index)`` writes over timed draw ``index``'s inputs: seeded
        by the index negated (no timed draw's), ``v`` not negated where the draw's own negates it
        (so it differs from what the draw's timed calls read), and permuted where the case has
        room (so it differs from draw 0's data too; ``Transform.permutes``)."""
        t = self._arrangement(-index)
        if self._permute and not t.permutes():
            t = t.rotated()
        return replace(t, v_sign=-self.transform(index).v_sign)

    def draw(self, index: int) -> Callable[[], Any]:
        """The call on timed draw ``index`` (1 and up), its inputs made now (leaves, requiring
        grad where draw 0's do), its own memory (never draw 0's: ``rewritten`` writes into it)."""
        t = self.transform(index)
        inputs = tuple(_own(t.apply(name, x.detach()), x).requires_grad_(x.requires_grad)
                       for name, x in zip(self._input_names, self._inputs, strict=True))
        grad_out = _own(t.apply("grad_out", self._grad_out), self._grad_out) if self._grad_out is not None else None
        self._now.pop(index, None)
        drawn = self._drawn[index] = _Drawn(self._run_on, inputs, grad_out)
        return drawn

    def vary(self, index: int) -> Callable[[], None]:
        """What to call before each timed call of draw ``index``, outside the timed region: the
        draw's ``v``, state, output gradient and final state's gradient multiplied in place by the
        signs that take their value columns from the pattern they hold to the next one (a pattern
        no call of the case has read: module docstring), and ``verify`` holding a result to that
        pattern. Exact in floating point, and one pass over those tensors. A case without ``v``,
        or with one value column, is not varied."""
        drawn = self._drawn.get(index)
        if drawn is None:
            raise LookupError(f"timed draw {index} has no call to vary: draw({index}) makes it")
        names = dict(zip(self._input_names, self._inputs, strict=True))
        width = int(names["v"].shape[-1]) if "v" in names and names["v"].ndim else 0
        if width < 2:
            return _unvaried

        def step() -> None:
            held = self._holding(index)
            new = self._next_pattern(width)
            old = held.flips or (1,) * width
            self._flip(drawn, tuple(a * b for a, b in zip(old, new, strict=True)), width)
            self._now[index] = replace(held, flips=new)

        return step

    def hot_input(self, index: int) -> Any:
        """The tensor of timed draw ``index`` whose first elements a graph of many calls may
        overwrite before each call, putting them back before its last (``measure.hot.Varied``):
        the first floating-point input, as ``.data`` (its version counter left alone), or None."""
        drawn = self._drawn.get(index)
        if drawn is None:
            raise LookupError(f"timed draw {index} has no inputs yet: draw({index}) makes them")
        return next((x.data for x in drawn.inputs if x.is_floating_point() and x.numel()), None)

    def _next_pattern(self, width: int) -> tuple[int, ...]:
        """Signs over ``width`` value columns that no timed call of the case has read, neither all
        kept nor all flipped; once all have been read, they come round again."""
        full = (1 << width) - 1
        if len(self._patterns) >= full - 1:
            self._patterns.clear()
        bits = 0
        while bits in (0, full) or bits in self._patterns:
            bits = self._pattern_rng.getrandbits(width)
        self._patterns.add(bits)
        return tuple(-1 if bits >> c & 1 else 1 for c in range(width))

    def _flip(self, drawn: _Drawn, delta: tuple[int, ...], width: int) -> None:
        """``delta`` multiplied into the value columns of ``drawn``'s ``v``, state and output
        gradient, in place through ``.data`` (as ``_write``: version counters left alone)."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

        varied = [x for name, x in zip(self._input_names, drawn.inputs, strict=True) if name in VARIED_INPUTS]
        varied += [drawn.grad_out] if drawn.grad_out is not None else []
        with torch.no_grad():
            for x in varied:
                if x.ndim and x.shape[-1] == width:
                    x.data.mul_(torch.tensor(delta, dtype=x.dtype, device=x.device))

    @contextmanager
    def rewritten(self, index: int) -> Iterator[bool]:
        """Timed draw ``index``'s inputs (and output gradient) overwritten in place with draw 0's
        as ``rewrite(index)`` arranges them for the block, and ``verify(index, ...)`` holding a
        call to that arrangement; the draw's own put back after it. The block gets whether the
        new data differs from draw 0's as well (``Transform.permutes``)."""
        drawn = self._drawn.get(index)
        if drawn is None:
            raise LookupError(f"timed draw {index} has no call to rewrite: draw({index}) makes it, and it is "
                              "held only while the harness holds it")
        t = self.rewrite(index)
        self._write(drawn, t)
        self._now[index] = t
        try:
            yield t.permutes()
        except BaseException:
            self._now.pop(index, None)
            # the block's error is the one to report: after a device fault (a sticky CUDA error)
            # putting the draw back raises too, and would stand in its place
            with suppress(Exception):
                self._write(drawn, self.transform(index))
            raise
        self._now.pop(index, None)
        self._write(drawn, self.transform(index))

    def _write(self, drawn: _Drawn, t: Transform) -> None:
        """Draw 0's inputs and output gradient as ``t`` arranges them, copied into ``drawn``'s own
        tensors through ``.data``: the same storage, and the tensors' version counters left as
        they were (a kernel cannot tell the rewrite from ``_version``)."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

        with torch.no_grad():
            for name, x0, x in zip(self._input_names, self._inputs, drawn.inputs, strict=True):
                x.data.copy_(t.apply(name, x0.detach()))
            if drawn.grad_out is not None:
                drawn.grad_out.data.copy_(t.apply("grad_out", self._grad_out))

    def _holding(self, index: int) -> Transform:
        """The arrangement timed draw ``index``'s inputs hold now."""
        return self._now[index] if index in self._now else self.transform(index)

    def verify(self, index: int, result: Any) -> float:
        """Hold ``result`` (what a call of draw ``index`` returned) to the family's rule, on the
        arrangement the draw's inputs hold now (inside ``rewritten``, the rewritten one): the
        worst tensor's error over its bound, or ``CheckFailed`` naming the tensor."""
        got = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        if len(got) != len(self._names):
            raise CheckFailed(f"{self.kernel}: returned {len(got)} tensors on a timed call, {len(self._names)} "
                              "on the checked one")
        t = self._holding(index)
        worst = 0.0
        shapes = self._shapes or tuple(tuple(r.shape) for r in self._reference)
        for name, value, ref, yard, shape in zip(self._names, got, self._reference, self._yardstick, shapes,
                                                 strict=True):
            if not hasattr(value, "detach") or tuple(value.shape) != tuple(shape):
                found = tuple(value.shape) if hasattr(value, "shape") else type(value).__name__
                raise CheckFailed(f"{self.kernel} {name}: a timed call returned {found}, the checked call "
                                  f"{tuple(shape)}")
            value = value.detach()
            if self._same_as_checked(t, name, value):
                continue  # the checked answer, rearranged: exactly as close to this draw's reference
            worst = max(worst, self._check(f"{self.kernel} {name}", name, value, t.apply(name, ref),
                                           t.apply(name, yard)))
        return worst

    def _same_as_checked(self, t: Transform, name: str, value: Any) -> bool:
        """Whether ``value`` is bit for bit the checked call's answer for ``name``, rearranged
        as draw ``t`` rearranges the inputs. Its error against the draw's reference is then the
        checked answer's error, element for element in another order and sign, and the rule's
        bound moves the same way (the yardstick is rearranged alike; neither permutation
        reorders the axis the bound smooths along), so it passes as the checked answer did: the
        full rule is needed only where the bits differ (a kernel with atomics, say)."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

        index = self._names.index(name)
        if index >= len(self._got):
            return False
        checked = self._got[index]
        return bool(checked.shape == value.shape and checked.dtype == value.dtype
                    and torch.equal(t.apply(name, checked), value))

    def describe(self, index: int) -> str:
        """Timed draw ``index`` in words (what its inputs now hold: the checked inputs, rearranged)."""
        done = self._holding(index).describe()
        return f"draw {index}: the checked inputs with {done}" if done else f"draw {index}: the checked inputs"

    def protected(self) -> tuple[Any, ...]:
        """Draw 0's inputs, which the case's other kernels share: never to be written."""
        return self._inputs


def timed(answer: Answer, kernel: str, check: Callable[[str, str, Any, Any, Any], float], seed_text: str,
          head_axis: int, permute: bool = True, head_axes: tuple[tuple[str, int], ...] = ()) -> Timed:
    """The callable to time for a checked ``answer`` (``checks.Answer``): its call, with the timed
    draws and their ``check`` (``permute`` False: signs only, for a reference of a slice of the case;
    ``head_axes``: tensors by name whose heads are not on ``head_axis``, a recurrent state's)."""
    return Timed(answer.call, run_on=answer.run_on, inputs=answer.inputs, input_names=answer.input_names,
                 grad_out=answer.grad_out, names=answer.names, reference=answer.reference,
                 yardstick=answer.yardstick, check=check, seed_text=seed_text, head_axis=head_axis, kernel=kernel,
                 shapes=tuple(tuple(x.shape) for x in answer.got), permute=permute, got=answer.got,
                 head_axes=head_axes)
