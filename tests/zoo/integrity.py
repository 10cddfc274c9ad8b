"""Timing-integrity kernels: softmax attention that gives the right answer when it is checked and
does less, or nothing, when it is timed; and right kernels that keep state between calls.

Load it as a pytest plugin (``-p zoo.integrity`` with ``tests/`` on the path): it adds each kernel
to the ``softmax`` family. Every ``integrity-bad-*`` kernel answers its first call on a shape
correctly (the harness's checked call) and cheats on later ones in the way its docstring says;
each must fail as "the timed computation differs from the checked one" (or, where a timed draw
makes it raise, with that named). ``integrity-ok-*`` kernels are right on every call and must
pass. Those marked ``cuda`` only cheat where a CUDA graph is captured.

The answer itself is the naive kernel's (``families.softmax.kernels.naive``): materialised
scores in the inputs' dtype, so only the cheating differs from a built-in kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pytest_attnperf.families.registry import KernelRegistry
from pytest_attnperf.families.softmax.kernels import naive

__all__ = ["BAD", "CUDA_ONLY", "FAMILY", "OK", "pytest_attnperf_register_kernels", "register"]

FAMILY = "softmax"
WARM_CALLS = 3  # calls a "partial write after warm-up" kernel writes whole


def _key(q: torch.Tensor, k: torch.Tensor, causal: bool, window: int | None) -> tuple[Any, ...]:
    return (tuple(q.shape), tuple(k.shape), q.dtype, str(q.device), causal, window, q.requires_grad)


class _PerShape:
    """State a kernel keeps per input shape (what a kernel keyed on shapes would keep)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[Any, ...], Any] = {}
        self.calls: dict[tuple[Any, ...], int] = {}

    def count(self, key: tuple[Any, ...]) -> int:
        """The calls made on ``key`` before this one."""
        before = self.calls.get(key, 0)
        self.calls[key] = before + 1
        return before


def cache_by_shape() -> Callable[..., torch.Tensor]:
    """Returns the answer of its first call on a shape for every later input of that shape."""
    state = _PerShape()

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        key = _key(q, k, causal, window)
        if key not in state.seen:
            state.seen[key] = naive(q, k, v, causal=causal, scale=scale, window=window)
        return state.seen[key]

    return fn


def zeros_after_first() -> Callable[..., torch.Tensor]:
    """The right answer on its first call on a shape, zeros (with a graph, so gradients flow) after."""
    state = _PerShape()

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        if state.count(_key(q, k, causal, window)) == 0:
            return naive(q, k, v, causal=causal, scale=scale, window=window)
        return q * 0

    return fn


def less_work_later() -> Callable[..., torch.Tensor]:
    """After its first call on a shape, computes the first half of the heads only (the rest zero)."""
    state = _PerShape()

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        if state.count(_key(q, k, causal, window)) == 0:
            return naive(q, k, v, causal=causal, scale=scale, window=window)
        group = q.shape[1] // k.shape[1]
        kept = max(1, k.shape[1] // 2)
        half = naive(q[:, : kept * group], k[:, :kept], v[:, :kept], causal=causal, scale=scale, window=window)
        return torch.cat([half, q[:, kept * group:] * 0], dim=1)

    return fn


def partial_write() -> Callable[..., torch.Tensor]:
    """Writes into one output buffer per shape; after ``WARM_CALLS`` calls only its first half of
    positions (the rest keeps what an earlier call wrote). Forward only."""
    state = _PerShape()

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        key = _key(q, k, causal, window)
        made = state.count(key)
        out = naive(q, k, v, causal=causal, scale=scale, window=window)
        if key not in state.seen:
            state.seen[key] = torch.empty_like(out)
        buffer = state.seen[key]
        if made < WARM_CALLS:
            buffer.copy_(out)
        else:
            half = q.shape[2] // 2
            buffer[:, :, :half].copy_(out[:, :, :half])
        return buffer

    return fn


def lazy_output() -> Callable[..., torch.Tensor]:
    """The right answer on its first call on a shape; after, an output allocated and never
    written (memory the allocator may hand back holding an earlier answer). Forward only."""
    state = _PerShape()

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        if state.count(_key(q, k, causal, window)) == 0:
            return naive(q, k, v, causal=causal, scale=scale, window=window)
        return torch.empty_like(q)

    return fn


def capture_aware() -> Callable[..., torch.Tensor]:
    """Right when called eagerly; inside a CUDA graph capture it returns the answer of its last
    eager call on the shape and launches nothing, so a replay does no work. Forward only: a
    backward through that eager answer inside a capture fails the capture, and the case is then
    timed eagerly, where the kernel does its work (and passes, rightly)."""
    last: dict[tuple[Any, ...], Any] = {}

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        key = _key(q, k, causal, window)
        if q.is_cuda and torch.cuda.is_current_stream_capturing() and key in last:
            return last[key]
        last[key] = naive(q, k, v, causal=causal, scale=scale, window=window)
        return last[key]

    return fn


def side_stream() -> Callable[..., torch.Tensor]:
    """Does its work on a stream of its own. Eagerly the caller's stream waits for it, so the
    answer is right; inside a capture it does not, so the work runs once, at capture, and never
    in a replay. Forward only."""
    streams: dict[str, Any] = {}

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        if not q.is_cuda:
            return naive(q, k, v, causal=causal, scale=scale, window=window)
        cuda: Any = torch.cuda  # torch.cuda.Stream is unannotated
        side = streams.setdefault(str(q.device), cuda.Stream(q.device))
        capturing = torch.cuda.is_current_stream_capturing()
        if not capturing:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = naive(q, k, v, causal=causal, scale=scale, window=window)
        if not capturing:
            torch.cuda.current_stream().wait_stream(side)
        return out

    return fn


def persistent_output() -> Callable[..., torch.Tensor]:
    """Right: writes its whole answer into one output buffer per shape on every call and
    returns that buffer. Forward only."""
    buffers: dict[tuple[Any, ...], Any] = {}

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        out = naive(q, k, v, causal=causal, scale=scale, window=window)
        buffer = buffers.setdefault(_key(q, k, causal, window), torch.empty_like(out))
        return buffer.copy_(out)

    return fn


def shape_state() -> Callable[..., torch.Tensor]:
    """Right: keeps per-shape state that is not the answer (the causal mask, built once per
    shape, as compiled kernels keep block masks)."""
    masks: dict[tuple[Any, ...], Any] = {}

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        from pytest_attnperf.families.softmax.reference import attention_mask

        key = _key(q, k, causal, window)
        if key not in masks:
            masks[key] = attention_mask(q.shape[2], causal, window, q.device)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * scale
        if masks[key] is not None:
            scores = scores.masked_fill(~masks[key], float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v)

    return fn


def writes_inputs_later() -> Callable[..., torch.Tensor]:
    """The right answer, then, from its second call on a shape, adds 1 to its ``q`` after
    computing: its own later calls go wrong, and so would another kernel's sharing that ``q``."""
    state = _PerShape()

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        out = naive(q, k, v, causal=causal, scale=scale, window=window)
        if state.count(_key(q, k, causal, window)) > 0:
            with torch.no_grad():
                q.add_(1)
        return out

    return fn


def drops_requires_grad() -> Callable[..., torch.Tensor]:
    """The right answer, then, from its second call on a shape, turns off ``requires_grad`` on
    its ``k`` (a leaf) after computing."""
    state = _PerShape()

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        out = naive(q, k, v, causal=causal, scale=scale, window=window)
        if state.count(_key(q, k, causal, window)) > 0 and k.is_leaf:
            k.requires_grad_(False)
        return out

    return fn


def nudged() -> Callable[..., torch.Tensor]:
    """The right answer with one element, a different one on each call, moved by one ulp:
    correct, and not bitwise reproducible."""
    calls = [0]

    def fn(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
        out = naive(q, k, v, causal=causal, scale=scale, window=window)
        calls[0] += 1
        flat = torch.zeros(out.numel(), dtype=out.dtype, device=out.device)
        flat[(calls[0] * 7919) % out.numel()] = 1
        step = torch.nextafter(out.detach(), torch.full_like(out.detach(), float("inf"))) - out.detach()
        return out + step * flat.view_as(out)

    return fn


FORWARD_ONLY = {"backward": False}
ON_CUDA = {"device_kinds": ("cuda",)}
BAD: dict[str, tuple[Callable[[], Callable[..., Any]], dict[str, Any]]] = {
    "integrity-bad-cache-by-shape": (cache_by_shape, {}),
    "integrity-bad-zeros-after-first": (zeros_after_first, {}),
    "integrity-bad-less-work-later": (less_work_later, {}),
    "integrity-bad-partial-write": (partial_write, FORWARD_ONLY),
    "integrity-bad-lazy-output": (lazy_output, FORWARD_ONLY),
    "integrity-bad-capture-aware": (capture_aware, {**FORWARD_ONLY, **ON_CUDA}),
    "integrity-bad-side-stream": (side_stream, {**FORWARD_ONLY, **ON_CUDA}),
    "integrity-bad-writes-inputs-later": (writes_inputs_later, {}),
    "integrity-bad-drops-requires-grad": (drops_requires_grad, {}),
    "integrity-bad-claims-deterministic": (nudged, {"deterministic": True}),
}
OK: dict[str, tuple[Callable[[], Callable[..., Any]], dict[str, Any]]] = {
    "integrity-ok-persistent-output": (persistent_output, FORWARD_ONLY),
    "integrity-ok-shape-state": (shape_state, {}),
    "integrity-ok-nondeterministic": (nudged, {}),
}
CUDA_ONLY = frozenset(name for name, (_, options) in {**BAD, **OK}.items() if options.get("device_kinds"))


def register(registry: KernelRegistry) -> None:
    """Add every kernel of this module to ``registry``'s softmax family, each with its own state."""
    for name, (make, options) in {**BAD, **OK}.items():
        fn = make()
        registry.kernel(family=FAMILY, name=name, tiled=False, **options)(fn)  # naive's scores: no memory bound


def pytest_attnperf_register_kernels(registry: KernelRegistry) -> None:
    """The plugin hook: the integrity kernels join the softmax family."""
    register(registry)
