"""Numerical checks against an fp64 reference, with tolerances derived per case.

A kernel's largest error against the fp64 reference may be at most ``factor`` times the largest
error plain PyTorch makes on the same inputs at the same precision, plus one ulp of the output's
dtype at the output's scale (``factor`` 2 for outputs, 3 for gradients, 8 for fp32 gradients:
``GRAD_FACTOR``); every element is also held to its own bound (``assert_elementwise``), never
below one ulp there; NaN and Inf always fail. A wrong answer raises ``CheckFailed`` (an
``AssertionError``) naming the tensor, the worst element, the bound there and how many elements
are outside. The rule, its factors and their evidence: docs/checks.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from pytest_attnperf.measure.torch_functions import put_back_functions, snapshot_functions

if TYPE_CHECKING:
    from pytest_attnperf.families.registry import Kernel

__all__ = [
    "Answer", "CheckFailed", "Checked", "Closeness", "ELEMENT_FACTOR", "ELEMENT_GRAD_FACTOR", "Elementwise", "FACTOR",
    "GRAD_FACTOR",
    "NEIGHBOURS", "PRECISION", "UNIT_ROUNDOFF", "allowance", "assert_close", "assert_elementwise", "assert_finite",
    "assert_reaches",
    "assert_unchanged", "call_checked", "describe", "expect_tensor", "gradients", "max_error", "own_copies", "plain",
    "poison_allocator",
    "reported_plainly", "returned_pair", "smoothed", "snapshots", "ulp", "where",
]

FACTOR = 2.0
GRAD_FACTOR = {"bf16": 3.0, "fp16": 3.0, "fp32": 8.0}  # the largest-error rule's, by the gradient's dtype
# elementwise (assert_elementwise), softmax: outputs per dtype, then gradients; docs/checks.md
ELEMENT_FACTOR = {"bf16": 8.0, "fp16": 8.0, "fp32": 32.0}
ELEMENT_GRAD_FACTOR = 64.0


class CheckFailed(AssertionError):
    """A kernel's answer is wrong: the message says which tensor, where and by how much.

    The suites report it without a traceback (the harness's own frames say nothing about the
    kernel); any other exception from a kernel keeps its traceback. ``ratio`` is the error over
    its bound where a bound was exceeded (NaN for a wrong type, shape or a non-finite value)."""

    def __init__(self, message: str, ratio: float = float("nan")) -> None:
        super().__init__(message)
        self.ratio = ratio


@dataclass(frozen=True)
class Answer:
    """A kernel's checked call on a case: what it returned (out, then dq, dk, dv for fwdbwd)
    with the fp64 reference and the yardstick of each, the zero-argument callable to time, and
    what makes the timed draws (``families.draws.timed``): ``run_on(inputs, grad_out)``, the
    same call on other inputs, and the checked call's inputs by name."""

    names: tuple[str, ...]
    got: tuple[Any, ...]
    reference: tuple[Any, ...]
    yardstick: tuple[Any, ...]
    call: Any
    run_on: Any = None
    inputs: tuple[Any, ...] = ()
    input_names: tuple[str, ...] = ()
    grad_out: Any = None


@dataclass(frozen=True)
class Checked:
    """A case that passed its checks: the callable to time (a ``families.draws.Timed``, whose
    timed draws are checked after sampling), and each tensor's worst error over its bound
    (``out``, ``dq``...; at most 1), what the suites record as the kernel's margin."""

    call: Any
    ratios: dict[str, float]

    def properties(self) -> list[tuple[str, float]]:
        """The ratios as test properties (JUnit XML ``<property>``): ``attnperf_check_<tensor>``."""
        return [(f"attnperf_check_{name}", round(ratio, 4)) for name, ratio in self.ratios.items()]


@dataclass(frozen=True)
class Closeness:
    """One output or gradient held to fp64: its max error, the allowance and PyTorch's own error."""

    name: str
    error: float
    allowed: float
    torch_error: float


def max_error(value: Any, reference: Any) -> float:
    """The largest absolute difference of two tensors, computed in float64."""
    return float((value.double() - reference.double()).abs().max().item())


def assert_finite(name: str, value: Any, axes: str | None = None) -> None:
    """Fail where ``value`` holds NaN or Inf, naming the first such element and how many there are."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    bad = ~torch.isfinite(value)
    if bad.any():
        first = int(bad.flatten().nonzero()[0].item())
        raise CheckFailed(
            f"{name}: {int(bad.sum())} of {bad.numel()} elements are not finite (the first at "
            f"{where(first, tuple(bad.shape), axes)}); NaN there may also mean an element the kernel never wrote"
        )


def assert_close(
    name: str, value: Any, reference: Any, torch_value: Any, dtype: str, factor: float = FACTOR,
    axes: str | None = None,
) -> Closeness:
    """Fail unless ``value`` is finite, shaped like ``reference`` and within the allowance:
    ``factor`` times PyTorch's own largest error plus one ulp of ``dtype`` at the output's scale."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if tuple(value.shape) != tuple(reference.shape):
        raise CheckFailed(f"{name}: shape {tuple(value.shape)}, reference {tuple(reference.shape)}")
    assert_finite(name, value, axes)
    difference = (value.double() - reference.double()).abs()
    error = float(difference.max().item())
    torch_error = max_error(torch_value, reference)
    scale = float(reference.abs().max().item())
    one_ulp = float(ulp(torch.tensor(scale), dtype).item())
    allowed = factor * torch_error + one_ulp
    result = Closeness(name, error, allowed, torch_error)
    if not error <= allowed:
        worst = int(difference.argmax().item())
        raise CheckFailed(
            f"{name}: max |error| {error:.3g} against fp64, at {where(worst, tuple(difference.shape), axes)}, "
            f"exceeds {allowed:.3g} (= {factor:g} x PyTorch's own {dtype} error {torch_error:.3g} + one {dtype} "
            f"ulp {one_ulp:.3g} at the output's scale {scale:.3g}); "
            f"{int((difference > allowed).sum())} elements are beyond it",
            error / allowed,
        )
    return result


@dataclass(frozen=True)
class Elementwise:
    """The worst element of an elementwise check: its error over its allowance (<= 1 passes)."""

    name: str
    worst_ratio: float
    yardstick_rms: float


@contextmanager
def reported_plainly(seed: int = 0) -> Iterator[None]:
    """Turn a ``CheckFailed`` inside into a test failure that shows its message alone: what is
    wrong with the kernel's answer, without the harness's frames around it (with the inputs'
    ``--attnperf-seed`` when it is not the usual one)."""
    try:
        yield
    except CheckFailed as exc:
        message = str(exc) + (f"\n  (inputs drawn with --attnperf-seed={seed})" if seed else "")
        raise pytest.fail.Exception(message, pytrace=False) from None  # the message once, no chain


# precision p of each dtype (with the implicit bit): one ulp at |x| in [2^e, 2^(e+1)) is 2^(e-p+1)
PRECISION = {"bf16": 8, "fp16": 11, "fp32": 24, "fp64": 53}
# the unit roundoff of each format, and of TF32 (10 mantissa bits, truncated: the rounding of an fp32
# operand that a tensor core or Triton's fp32 ``tl.dot`` reads); the one table every rule takes it from
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24, "tf32": 2.0**-10}
# the yardstick's error is smoothed over this many neighbours either side along one axis
NEIGHBOURS = 2


def ulp(magnitude: Any, dtype: str) -> Any:
    """One unit in the last place of ``dtype`` at each element's magnitude (float64 tensor).

    Below the smallest normal number the spacing is the subnormals' (fp16 and bf16 have them,
    so a kernel is never asked for more than its format holds)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    tiny = {"bf16": torch.finfo(torch.bfloat16).tiny, "fp16": torch.finfo(torch.float16).tiny,
            "fp32": torch.finfo(torch.float32).tiny, "fp64": torch.finfo(torch.float64).tiny}[dtype]
    size = magnitude.double().abs().clamp_min(tiny)
    _, exponent = torch.frexp(size)  # size = m 2^exponent, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(size), exponent - PRECISION[dtype])


def smoothed(spread: Any, axis: int, neighbours: int | None = None) -> Any:
    """Each element's error, or the RMS of the errors of its neighbourhood (``neighbours``
    either side along ``axis``), whichever is larger: where the yardstick happened to land on
    the exact answer, its neighbours' errors stand in for what rounding makes there."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up
    import torch.nn.functional as F  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    neighbours = NEIGHBOURS if neighbours is None else neighbours
    if spread.ndim == 0 or neighbours <= 0:
        return spread
    moved = spread.movedim(axis, -1)
    rows = moved.reshape(-1, 1, moved.shape[-1]).pow(2)
    local = F.avg_pool1d(rows, 2 * neighbours + 1, 1, neighbours, count_include_pad=False).sqrt()
    return torch.maximum(spread, local.reshape(moved.shape).movedim(-1, axis))


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def where(flat: int, shape: tuple[int, ...], axes: str | None) -> str:
    """An element's place, named by axis when ``axes`` has a letter per dimension: ``b=1 h=3 t=517 d=12``."""
    at = _index(flat, shape)
    names = axes.split() if axes else []
    if len(names) != len(at):
        return str(list(at))
    return " ".join(f"{axis}={i}" for axis, i in zip(names, at, strict=True))


def allowance(reference: Any, yardstick: Any, *, dtype: str, factor: float, unit: float = 0.0,
              axis: int = -1) -> tuple[Any, Any, Any, float]:
    """``assert_elementwise``'s bound per element, with its parts: ``(allowed, rounding, near, rms)``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    ref = reference.double()
    spread = (yardstick.double() - ref).abs()
    rms = float(spread.pow(2).mean().sqrt().item()) if spread.numel() else 0.0
    rounding = torch.maximum(ulp(ref, dtype), unit * ref.abs())
    near = smoothed(spread, axis)
    return rounding + factor * (near + rms), rounding, near, rms


def assert_elementwise(
    name: str, value: Any, reference: Any, yardstick: Any, *, dtype: str, factor: float, yardstick_name: str,
    unit: float = 0.0, axes: str | None = None, axis: int = -1,
) -> Elementwise:
    """Fail unless every element's error against the fp64 reference is within its own allowance::

        |x_i - ref_i| <= max(ulp(ref_i), unit |ref_i|) + factor (s_i + rms(y - ref))
        s_i = max(|y_i - ref_i|, rms of |y - ref| over i's neighbours along ``axis``)

    ``y`` is the yardstick: the same computation done plainly at the kernel's precision.
    ``ulp(ref_i)`` is one unit in the last place of the output's ``dtype`` at that element: a
    correct kernel whose result lands across one rounding boundary from the yardstick's is off
    by that much, so no bound is ever below it (``unit`` raises it where a kernel may compute
    at a lower precision than it stores, TF32 behind fp32). ``factor`` times the yardstick's
    error near the element, and its RMS error over the whole tensor, covers the rounding of
    everything before the output, where the element is ill conditioned (cancellation) and
    where it is not; the neighbourhood keeps that term from shrinking where the yardstick got
    lucky (``NEIGHBOURS``). ``axes`` names the dimensions for the message (``"b h t d"``)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    ref = reference.double()
    error = (value.double() - ref).abs()
    allowed, rounding, near, rms = allowance(ref, yardstick, dtype=dtype, factor=factor, unit=unit, axis=axis)
    ratio = error / allowed.clamp_min(torch.finfo(torch.float64).tiny)
    worst = int(ratio.argmax().item()) if ratio.numel() else 0
    result = Elementwise(name, float(ratio.flatten()[worst].item()) if ratio.numel() else 0.0, rms)
    outside = int((error > allowed).sum().item())
    if outside:
        def at(t: Any) -> float:
            return float(t.flatten()[worst])

        rounded = f"one {dtype} ulp there" if at(rounding) <= at(ulp(ref, dtype)) else f"{unit:.3g} x |ref|"

        raise CheckFailed(
            f"{name}: {outside} of {error.numel()} elements outside the elementwise bound; the worst, at "
            f"{where(worst, tuple(ratio.shape), axes)}: {at(value.double()):.6g} where the fp64 reference is "
            f"{at(ref):.6g}\n"
            f"  |error| {at(error):.3g} > bound {at(allowed):.3g} = {at(rounding):.3g} ({rounded}) + "
            f"{factor:g} x ({yardstick_name} error near there {at(near):.3g} + its RMS error {rms:.3g})",
            result.worst_ratio,
        )
    return result


def describe(value: Any) -> str:
    """What a kernel returned, in a few words: ``tuple (len 2)``, ``None``, ``numpy.ndarray``..."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a torch.Tensor of shape {tuple(value.shape)}, dtype {value.dtype} on {value.device}"
    kind = type(value)
    label = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    if isinstance(value, (tuple, list)):
        return f"{label} (len {len(value)})"
    shape = getattr(value, "shape", None)
    return f"{label} of shape {tuple(shape)}" if shape is not None else label


def returned_pair(kernel: Any, result: Any, paired: bool, call: str, second: str, second_shape: tuple[int, ...],
                  out_shape: tuple[int, ...], dtype: Any, device: Any, check: bool) -> tuple[Any, Any]:
    """``(out, second)`` of a kernel's return value, each a plain tensor (``second`` None unless
    ``paired``: the kernel was called with ``call``, e.g. ``return_lse=True``, and returns a pair);
    with ``check``, failing unless ``out`` is of ``out_shape`` and ``dtype`` and ``second`` a float32
    tensor of ``second_shape``, both on ``device``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if not paired:
        out = plain(kernel, result)
        if check:
            expect_tensor(kernel.name, out, out_shape, dtype, device)
        return out, None
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise CheckFailed(f"kernel '{kernel.name}' was called with {call} and returned {describe(result)}; "
                          f"expected (out, {second})")
    out, extra = plain(kernel, result[0]), plain(kernel, result[1])
    if check:
        expect_tensor(kernel.name, out, out_shape, dtype, device)
        if not (isinstance(extra, torch.Tensor) and tuple(extra.shape) == second_shape
                and extra.dtype == torch.float32 and extra.device == device):
            raise CheckFailed(f"kernel '{kernel.name}' returned as its {second} {describe(extra)}; expected a "
                              f"torch.Tensor of shape {second_shape}, dtype torch.float32 on {device}")
    return out, extra


def expect_tensor(kernel: str, value: Any, shape: tuple[int, ...], dtype: Any, device: Any) -> None:
    """Fail, saying what came back, unless ``value`` is a tensor of this shape, dtype and device."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if (isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(shape) and value.dtype == dtype
            and value.device == device):
        return
    raise CheckFailed(
        f"kernel '{kernel}' returned {describe(value)}; expected a torch.Tensor of shape {tuple(shape)}, "
        f"dtype {dtype} on {device}"
    )


def plain(kernel: Kernel, value: Any) -> Any:
    """``value`` as a plain ``torch.Tensor``, so no check dispatches through a kernel's own class.
    A tensor subclass fails (its ``__torch_function__`` could answer every comparison: an all-zero
    output whose subtraction always returned zero passed every check), unless the kernel declared
    it (``Kernel.output_types``): that one is viewed as a plain tensor, its data and graph kept.
    Anything not a tensor is returned as it is, for ``expect_tensor`` to name."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    kind = type(value)
    if kind is torch.Tensor or not isinstance(value, torch.Tensor):
        return value
    if kind in kernel.output_types:
        with torch._C.DisableTorchFunctionSubclass():
            return torch.Tensor.as_subclass(value, torch.Tensor)
    raise CheckFailed(
        f"kernel '{kernel.name}' returned a {kind.__module__}.{kind.__qualname__}, a torch.Tensor subclass whose own "
        "methods could answer the checks: return a plain torch.Tensor, or register the kernel with "
        f"output_types=({kind.__qualname__},) to have it compared as one"
    )


def gradients(kernel: str, out: Any, inputs: tuple[Any, ...], names: tuple[str, ...], grad_out: Any) -> tuple[Any, ...]:
    """The gradients of ``out`` against every input, failing with the input's name where none
    reaches it (and with the hint ``backward=False`` where the output has no graph at all)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if not getattr(out, "requires_grad", False):
        raise CheckFailed(
            f"kernel '{kernel}' returned an output that does not require grad, so no gradient can be checked: "
            "a kernel without a backward is registered with backward=False (its forward is then checked and "
            "timed, its fwdbwd cases skipped)"
        )
    grads = torch.autograd.grad(out, inputs, grad_out, allow_unused=True)
    missing = [name for name, grad in zip(names, grads, strict=True) if grad is None]
    if missing:
        raise CheckFailed(
            f"kernel '{kernel}' passes no gradient to its input {', '.join(missing)}: its output does not depend "
            "on it through autograd (detached, or computed outside the graph), while the family differentiates "
            "every input"
        )
    return tuple(grads)


def assert_reaches(name: str, grad: Any, reference: Any) -> None:
    """Fail when a gradient is identically zero where the reference's is not: the kernel's output
    does not depend on that input."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if not bool(torch.count_nonzero(grad)) and bool(torch.count_nonzero(reference)):
        raise CheckFailed(f"{name} is zero everywhere, the reference's is not: the kernel's output does not depend "
                          "on that input")


def poison_allocator(device: Any, sizes: list[int]) -> None:
    """Make the CUDA caching allocator hand out NaN-filled memory for the next blocks of these
    byte sizes (the outputs a kernel is about to allocate), so elements it never writes show
    as NaN (0xFF bytes are NaN in bf16, fp16 and fp32).

    The cache is emptied first, then one block per size is filled and freed: the allocator
    serves a request from the best-fitting free block, which is then one of these. Likely,
    not certain (a kernel may allocate in another order); a no-op on the CPU, whose allocator
    gives no such handle."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if device.type != "cuda":
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = [torch.empty(n, dtype=torch.uint8, device=device).fill_(0xFF) for n in sizes]
    torch.cuda.synchronize()
    del blocks


def snapshots(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """Copies of ``inputs`` as they are now, for ``assert_unchanged``."""
    return tuple(x.detach().clone() for x in inputs)


def assert_unchanged(names: str, tensors: tuple[Any, ...], snapshots: tuple[Any, ...]) -> None:
    """Fail when a kernel wrote into one of its inputs, after copying the snapshots back into
    them: the case's other kernels share the inputs, and its reference is computed from them."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    changed = [label.strip() for label, now, before in zip(names.split(","), tensors, snapshots, strict=True)
               if not torch.equal(now.detach(), before)]
    if changed:
        with torch.no_grad():
            for now, before in zip(tensors, snapshots, strict=True):
                now.copy_(before)
        raise CheckFailed(f"the kernel wrote into its input {', '.join(changed)} (restored for the other kernels)")


def own_copies(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """Copies of a case's shared inputs for one kernel: leaves, requiring grad as the originals
    do. Whatever a kernel does to its inputs (writes in a timed call or from a thread after
    returning, ``requires_grad_(False)``, a resize), the next kernel on the case starts from the
    case's own draw; a write in the checked call still fails it (``call_checked``)."""
    return tuple(x.detach().clone().requires_grad_(x.requires_grad) for x in inputs)


def call_checked(kernel: Kernel, call: Callable[[], Any], names: str, inputs: tuple[Any, ...], device: Any) -> Any:
    """``kernel.call_or_skip(call)`` into NaN-poisoned memory (``poison_allocator``, sized as the
    inputs); refusal or not, it fails if the kernel replaced a torch function (put back at once,
    before any check runs with it: ``torch_functions.put_back_functions``) or wrote into ``inputs``
    (``assert_unchanged``, which puts them back for the case's other kernels)."""
    before = snapshots(inputs)  # first: copies made after the poisoning would take its blocks
    poison_allocator(device, [x.numel() * x.element_size() for x in inputs])
    functions = snapshot_functions()
    try:
        return kernel.call_or_skip(call)
    finally:
        replaced = put_back_functions(functions, f"kernel '{kernel.name}'", "its checks")  # first: they call torch
        try:
            assert_unchanged(names, inputs, before)
        finally:
            if replaced is not None:
                raise CheckFailed(replaced)
