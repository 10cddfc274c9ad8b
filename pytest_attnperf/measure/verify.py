"""The timed work is the checked work: what the timed calls returned, checked after sampling.

``Replays.check`` holds each timed draw's result (``Draws``) to the family's rule on rewritten
inputs, after a NaN-filled replay or call; ``Replays.vary`` varies a draw's contents before each
timed call; ``Replays.check_last`` checks the last timed call's own result; ``Replays.compare``
gives the measurement's ``bitwise``. A mismatch raises ``TimedDiffers``. A callable that is not a
``Draws`` is timed as it is and nothing is verified.

docs/measurement.md, "The timed work is the checked work", says what each step catches.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from pytest_attnperf.measure.collector import gc_paused
from pytest_attnperf.measure.isolation import is_out_of_memory
from pytest_attnperf.measure.torch_functions import put_back_functions, snapshot_functions

__all__ = ["UNVERIFIED", "Draws", "Replays", "TimedDiffers", "raised_as_differing", "tensors_of"]

UNVERIFIED = ("timed calls not checked: the callable gives no timed draws (attnperf.measure of a plain "
              "callable; the suites pass their checked case)")


@runtime_checkable
class Draws(Protocol):
    """A callable to time whose work can be checked: calling it runs the checked call; ``draw(i)``
    gives the same call on another draw of inputs (``i`` from 1), inputs of its own;
    ``rewritten(i)`` writes other data over those inputs in place for a block; and
    ``verify(i, result)`` checks what a call of draw ``i`` returned on the data its inputs hold
    now, raising an ``AssertionError`` that says what is wrong, or returning the worst error
    over its bound. ``describe(i)`` says what draw ``i``'s inputs hold now, and ``protected()``
    the tensors that must never be written (inputs other cases share).
    ``families.draws.Timed`` is the suites' one."""

    def __call__(self) -> Any:
        """The checked call."""

    def draw(self, index: int) -> Callable[[], Any]:
        """The same call on timed draw ``index`` (from 1)."""

    def rewritten(self, index: int) -> AbstractContextManager[bool]:
        """Timed draw ``index``'s inputs overwritten in place for the block (the same tensors and
        storage, so a graph captured over them reads the new data) with data its timed calls
        never read, and put back after it; the block gets whether that data also differs from the
        checked call's (where it does not, the draw is checked on its own data too)."""

    def verify(self, index: int, result: Any) -> float:
        """Check what a call of draw ``index`` returned, on the data its inputs hold now."""

    def describe(self, index: int) -> str:
        """Draw ``index`` in words: what its inputs hold now."""

    def protected(self) -> tuple[Any, ...]:
        """Tensors never to be written."""


DRAWS_METHODS = ("draw", "rewritten", "verify", "describe", "protected")  # Draws', besides __call__
# optional: ``vary(i)``, what to call before each timed call of draw ``i`` to give it contents no
# call has read (``families.draws.Timed.vary``); a Draws without it is timed on its draws' own contents;
# ``hot_input(i)``, the input a hot graph varies between its calls (``measure.hot.Varied``)


class TimedDiffers(AssertionError):
    """The timed computation differs from the checked one: the message names the graph (or
    call), the draw and what the check found."""


def tensors_of(result: Any) -> list[Any]:
    """The tensors in a call's result (a tensor, or a tuple or list of them and other things)."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [x for x in items if hasattr(x, "is_floating_point") and hasattr(x, "untyped_storage")]


def raised_as_differing(call: Callable[[], Any], what: str) -> Any:
    """``call()``; an exception from it (not running out of memory, which case isolation reports)
    raised again as a ``TimedDiffers`` saying ``what``: the kernel raised where its checked call
    returned."""
    try:
        return call()
    except Exception as exc:
        if is_out_of_memory(exc) or isinstance(exc, TimedDiffers):
            raise
        raise TimedDiffers(f"{what}: {type(exc).__name__}: {str(exc)[:300]}") from exc


def _capturing() -> bool:
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


class Replays:
    """The timed draws of one measurement and what each one's calls last returned."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.draws: Draws | None = fn if isinstance(fn, Draws) else None
        lacking = [name for name in DRAWS_METHODS if not callable(getattr(fn, name, None))]
        if self.draws is None and not {"draw", "verify"} & set(lacking):
            raise TypeError(f"{type(fn).__name__} gives timed draws (draw, verify) but not {', '.join(lacking)} "
                            "(measure.verify.Draws): its timed calls would go unchecked")
        self.results: dict[int, Any] = {}
        self._varies: dict[int, Callable[[], None]] = {}
        self._calls: dict[int, Callable[[], Any]] = {}
        self._bases: dict[int, Callable[[], Any]] = {}
        self.verified = 0
        self.bitwise: bool | None = None
        self.bitwise_diff: float | None = None
        self.seconds = 0.0  # host time spent checking and comparing (the harness's cost, for the timeline)
        # torch's functions as the timing begins (the checked call's replacements already put back):
        # what the timed calls replace is put back before their results are checked
        self._functions = snapshot_functions() if self.draws is not None else None

    def release(self) -> None:
        """Drop the timed draws and what they returned now (a graph's outputs hold its memory
        pool; the calls hold their inputs), not when the collector finds them: the draws' calls
        and this object refer to each other."""
        self.results.clear()
        self._varies.clear()
        self._calls.clear()
        self._bases.clear()

    def notes(self, overhead: bool = False) -> tuple[str, ...]:
        """What the measurement's notes say of its verification: that there was none, for a
        plain callable (not for the run's sample overhead, ``overhead``)."""
        return (UNVERIFIED,) if self.draws is None and not overhead else ()

    def call(self, index: int) -> Callable[[], Any]:
        """The callable of timed draw ``index`` (from 1); its calls' results are kept as the
        draw's last. A plain callable is the same work for every index. An exception from a
        timed draw's first call outside a capture (its warm-up, where the checked call had
        returned) fails as ``TimedDiffers`` naming the draw; in a capture it stays a capture
        failure, for the timer to fall back on."""
        if index in self._calls:
            return self._calls[index]
        base = self.draws.draw(index) if self.draws is not None else self.fn
        called = [False]

        def recorded() -> Any:
            if called[0] or self.draws is None or _capturing():
                out = base()
            else:
                out = self._first(base, index)
            called[0] = True
            self.results[index] = out
            return out

        self._calls[index], self._bases[index] = recorded, base
        return recorded

    def bare(self, index: int) -> Callable[[], Any]:
        """Timed draw ``index``'s call without the recording around it, for a host-timed loop
        (nothing of the harness between the clock's two reads); its results are not kept, so a
        draw is called through ``call`` at least once first, and checked through it after."""
        self.call(index)
        return self._bases[index]

    def vary(self, index: int) -> Callable[[], None]:
        """What a timer calls before each timed call (or replay) of draw ``index``, outside the
        timed region: the draw's contents varied in place (``Draws``'s optional ``vary``); nothing
        for a plain callable or a ``Draws`` without it."""
        if index not in self._varies:
            self.call(index)  # the draw made, its inputs with it
            vary = getattr(self.draws, "vary", None) if self.draws is not None else None
            self._varies[index] = vary(index) if callable(vary) else _nothing
        return self._varies[index]

    def hot_input(self, index: int) -> Any:
        """The input of timed draw ``index`` a hot graph varies between its calls
        (``Draws``'s optional ``hot_input``); None for a plain callable or a ``Draws`` without it."""
        self.call(index)  # the draw made, its inputs with it
        hot_input = getattr(self.draws, "hot_input", None) if self.draws is not None else None
        return hot_input(index) if callable(hot_input) else None

    def check_last(self, index: int, where: str, result: Any = None) -> None:
        """Hold the last timed call's result, ``result`` (by default timed draw ``index``'s last
        recorded one: a graph's outputs, as its last replay wrote them), to the family's rule on
        the contents that call read, calling nothing: a kernel that answered it from a cache
        keyed on part of its inputs, or on their addresses, answered other contents. Before any
        other check, which calls the kernel again. ``where`` names the graph or call."""
        if self.draws is None or (result is None and index not in self.results):
            return
        began = time.perf_counter()
        try:
            self._verify(index, self.results[index] if result is None else result,
                         f"{where}, the last timed call as it returned, on timed {self.draws.describe(index)}")
        finally:
            self.seconds += time.perf_counter() - began

    def _first(self, base: Callable[[], Any], index: int) -> Any:
        assert self.draws is not None
        return raised_as_differing(base, f"the timed computation differs from the checked one: the kernel raised on "
                                         f"timed {self.draws.describe(index)} where the checked call had returned")

    def check(self, index: int, where: str, again: Callable[[], Any]) -> None:
        """Hold timed draw ``index``'s result to the family's rule after ``again`` (one more
        replay of its graph, or one more call) has run, the collector off, over its last result
        overwritten with NaN and on its inputs rewritten in place (``Draws.rewritten``): what is
        checked is what that replay or call wrote from data the timed calls never read. Where the
        rewritten data is the checked call's, the draw is checked again on its own data. ``where``
        names the graph or call in the message ("cold graph 3 of 8")."""
        if self.draws is None or index not in self.results:
            return
        began = time.perf_counter()
        try:
            self._check(index, where, again)
        finally:
            self.seconds += time.perf_counter() - began

    def _check(self, index: int, where: str, again: Callable[[], Any]) -> None:
        assert self.draws is not None
        draws = self.draws
        self._poison(self.results[index])  # before the rewrite: a result may be a view of the draw's inputs
        with draws.rewritten(index) as apart:
            self._again_and_verify(index, again, f"{where}, on timed {draws.describe(index)}, rewritten in place "
                                                 "after the timed calls")
        if not apart:  # the rewritten data is the checked call's: an answer kept from that call would match it
            self._poison(self.results[index])
            self._again_and_verify(index, again, f"{where}, on timed {draws.describe(index)}")
        self.verified += 1

    def _again_and_verify(self, index: int, again: Callable[[], Any], where: str) -> None:
        """``again()`` with the collector off, as the timed calls ran, then the draw's result
        verified; a failure is a ``TimedDiffers`` naming ``where``."""
        assert self.draws is not None
        with gc_paused(collect=False):
            again()
        self._verify(index, self.results[index], where)  # a call's new result; a graph's same tensors, rewritten

    def _verify(self, index: int, result: Any, where: str) -> None:
        """``result`` of timed draw ``index`` verified on the data its inputs hold now, the torch
        functions the kernel's calls replaced put back first; a failure is a ``TimedDiffers``
        naming ``where``."""
        assert self.draws is not None
        _synchronize(result)
        assert self._functions is not None  # taken with the draws
        replaced = put_back_functions(self._functions, "the kernel's timed calls", "the check of their results")
        if replaced is not None:  # after the kernel's last call, before the check calls torch
            raise TimedDiffers(replaced)
        try:
            self.draws.verify(index, result)
        except AssertionError as exc:
            raise TimedDiffers(f"the timed computation differs from the checked one: {where}: {exc}") from None

    def _poison(self, result: Any) -> None:
        """NaN into the floating-point tensors of ``result``, but never into memory the case's
        other kernels share (a result that is a view of draw 0's inputs)."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

        shared = {x.untyped_storage().data_ptr() for x in tensors_of(self.draws.protected() if self.draws else ())}
        with torch.no_grad():
            for x in tensors_of(result):
                if x.is_floating_point() and x.untyped_storage().data_ptr() not in shared:
                    x.detach().fill_(math.nan)

    def compare(self, index: int, again: Callable[[], Any]) -> None:
        """Whether two runs of ``again`` (a replay of the draw's graph, or a call) leave timed
        draw ``index``'s result with the same bits: ``bitwise``, and where not, ``bitwise_diff``,
        the largest difference. Both runs are made here, back to back: a result that is one
        buffer for every draw (a kernel's own) holds the last draw's answer before the first."""
        if index not in self.results or not tensors_of(self.results[index]):
            return  # nothing to compare (a callable that returns no tensors)
        began = time.perf_counter()
        try:
            self._compare(index, again)
        finally:
            self.seconds += time.perf_counter() - began

    def _compare(self, index: int, again: Callable[[], Any]) -> None:
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

        # after the check, not between its rewrite and the putting back: both runs read the
        # draw's own inputs, the data its timed calls read, so "bitwise" is said of the timed
        # computation, and only once the check has shown that computation done afresh on data
        # rewritten under it (an answer kept by address compares equal with itself and proves
        # nothing; the check, made first, fails it). Collector off, as in the timed calls.
        with gc_paused(collect=False):
            again()
        _synchronize(self.results[index])
        before = [x.detach().clone() for x in tensors_of(self.results[index])]
        with gc_paused(collect=False):
            again()
        after = tensors_of(self.results[index])
        _synchronize(self.results[index])
        if not before or len(before) != len(after):
            return
        equal = all(a.shape == b.shape and torch.equal(a, b.detach()) for a, b in zip(before, after, strict=True))
        self.bitwise = equal
        if not equal:
            diffs = [float((a.double() - b.detach().double()).abs().max()) for a, b in zip(before, after, strict=True)
                     if a.shape == b.shape and a.numel()]
            self.bitwise_diff = max(diffs) if diffs else None


def _nothing() -> None:
    """``Replays.vary`` where the draws are not varied."""


def _synchronize(result: Any) -> None:
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    if any(x.is_cuda for x in tensors_of(result)):
        torch.cuda.synchronize()
