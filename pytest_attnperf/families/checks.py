"""Numerical checks against an fp64 reference, with tolerances derived per case.

The rule (FlashAttention's tests use the same idea): a kernel's largest error against the
fp64 reference may be at most ``factor`` times the largest error that plain PyTorch makes on
the same inputs at the same precision (the unfused, materialised computation in that dtype),
plus one unit of rounding at the output's scale so an exact baseline does not demand an exact
kernel. Where PyTorch's own error is the yardstick the tolerance adapts to dtype, shape and
input scale without magic numbers. NaN and Inf always fail, whatever the tolerance.

On top of that largest-error rule, every element is held to its own bound
(``assert_elementwise``): an error confined to a few elements, which moves neither the largest
error much nor any norm, still fails there. docs/checks.md has the evidence for its factors.

``factor`` is 2 for outputs and 3 for gradients. Gradients sum over the whole sequence in a
kernel-specific tile order, so they drift further from the unfused order than outputs do, and
a correct kernel's gradient can be off by more than twice PyTorch's own error (docs/families.md,
"Softmax").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_attnperf.families.registry import Kernel

__all__ = [
    "ELEMENT_FACTOR", "ELEMENT_GRAD_FACTOR", "FACTOR", "GRAD_FACTOR", "Closeness", "Elementwise",
    "assert_close", "assert_elementwise", "assert_unchanged", "call_checked", "describe", "expect_tensor", "max_error",
    "poison_allocator",
]

FACTOR = 2.0
GRAD_FACTOR = 3.0
# elementwise (assert_elementwise), softmax: outputs per dtype, then gradients; docs/checks.md
ELEMENT_FACTOR = {"bf16": 8.0, "fp16": 8.0, "fp32": 32.0}
ELEMENT_GRAD_FACTOR = 64.0

_EPS = {"bf16": 2.0**-8, "fp16": 2.0**-11, "fp32": 2.0**-24, "fp64": 2.0**-53}


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


def assert_close(
    name: str, value: Any, reference: Any, torch_value: Any, dtype: str, factor: float = FACTOR
) -> Closeness:
    """Fail unless ``value`` is finite, shaped like ``reference`` and within the allowance."""
    import torch

    if tuple(value.shape) != tuple(reference.shape):
        raise AssertionError(f"{name}: shape {tuple(value.shape)}, reference {tuple(reference.shape)}")
    bad = ~torch.isfinite(value)
    if bad.any():
        where = bad.nonzero()[0].tolist()
        raise AssertionError(
            f"{name}: {int(bad.sum())} non-finite elements (first at {where}); "
            "NaN there may also mean an element the kernel never wrote"
        )
    error = max_error(value, reference)
    torch_error = max_error(torch_value, reference)
    scale = float(reference.abs().max().item())
    allowed = factor * torch_error + _EPS[dtype] * max(scale, 1e-30)
    result = Closeness(name, error, allowed, torch_error)
    if not error <= allowed:
        raise AssertionError(
            f"{name}: max |error| {error:.3g} against fp64 exceeds {allowed:.3g} "
            f"(= {factor:g} x PyTorch's own {dtype} error {torch_error:.3g} + one {dtype} ulp "
            f"at scale {scale:.3g})"
        )
    return result


@dataclass(frozen=True)
class Elementwise:
    """The worst element of an elementwise check: its error over its allowance (<= 1 passes)."""

    name: str
    worst_ratio: float
    yardstick_rms: float


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def assert_elementwise(
    name: str, value: Any, reference: Any, yardstick: Any, *, unit: float, factor: float, yardstick_name: str
) -> Elementwise:
    """Fail unless every element's error against the fp64 reference is within its own allowance::

        |x_i - ref_i| <= unit |ref_i| + factor (|y_i - ref_i| + rms(y - ref))

    ``y`` is the yardstick: the same computation done plainly at the kernel's precision.
    ``unit |ref_i|`` is the rounding of the kernel's own output element, which no kernel
    avoids; ``factor`` times the yardstick's error at that element and its RMS error over the
    whole tensor covers the rounding of everything before it, where the element is ill
    conditioned (cancellation) and where it is not. An error confined to a few elements fails
    wherever it exceeds what rounding at that precision makes there."""
    import torch

    ref = reference.double()
    error = (value.double() - ref).abs()
    spread = (yardstick.double() - ref).abs()
    rms = float(spread.pow(2).mean().sqrt().item()) if spread.numel() else 0.0
    allowed = unit * ref.abs() + factor * (spread + rms)
    ratio = error / allowed.clamp_min(torch.finfo(torch.float64).tiny)
    worst = int(ratio.argmax().item()) if ratio.numel() else 0
    result = Elementwise(name, float(ratio.flatten()[worst].item()) if ratio.numel() else 0.0, rms)
    outside = int((error > allowed).sum().item())
    if outside:
        at = _index(worst, tuple(ratio.shape))
        flat_error, flat_allowed = error.flatten(), allowed.flatten()
        raise AssertionError(
            f"{name}: {outside} of {error.numel()} elements outside the elementwise bound; worst at "
            f"{list(at)}: |error| {float(flat_error[worst]):.3g} > {float(flat_allowed[worst]):.3g} "
            f"(= {unit:.3g} x |ref| {float(ref.flatten()[worst].abs()):.3g} + {factor:g} x ({yardstick_name} "
            f"error there {float(spread.flatten()[worst]):.3g} + its RMS error {rms:.3g}))"
        )
    return result


def describe(value: Any) -> str:
    """What a kernel returned, in a few words: ``tuple (len 2)``, ``None``, ``numpy.ndarray``..."""
    import torch

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


def expect_tensor(kernel: str, value: Any, shape: tuple[int, ...], dtype: Any, device: Any) -> None:
    """Fail, saying what came back, unless ``value`` is a tensor of this shape, dtype and device."""
    import torch

    if (isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(shape) and value.dtype == dtype
            and value.device == device):
        return
    raise AssertionError(
        f"kernel '{kernel}' returned {describe(value)}; expected a torch.Tensor of shape {tuple(shape)}, "
        f"dtype {dtype} on {device}"
    )


def poison_allocator(device: Any, sizes: list[int]) -> None:
    """Make the CUDA caching allocator hand out NaN-filled memory for the next blocks of these
    byte sizes (the outputs a kernel is about to allocate), so elements it never writes show
    as NaN (0xFF bytes are NaN in bf16, fp16 and fp32).

    The cache is emptied first, then one block per size is filled and freed: the allocator
    serves a request from the best-fitting free block, which is then one of these. Likely,
    not certain (a kernel may allocate in another order); a no-op on the CPU, whose allocator
    gives no such handle."""
    import torch

    if device.type != "cuda":
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = [torch.empty(n, dtype=torch.uint8, device=device).fill_(0xFF) for n in sizes]
    torch.cuda.synchronize()
    del blocks


def assert_unchanged(names: str, tensors: tuple[Any, ...], snapshots: tuple[Any, ...]) -> None:
    """Fail when a kernel wrote into one of its inputs, after copying the snapshots back into
    them: the case's other kernels share the inputs, and its reference is computed from them."""
    import torch

    changed = [label.strip() for label, now, before in zip(names.split(","), tensors, snapshots, strict=True)
               if not torch.equal(now.detach(), before)]
    if changed:
        with torch.no_grad():
            for now, before in zip(tensors, snapshots, strict=True):
                now.copy_(before)
        raise AssertionError(f"the kernel wrote into its input {', '.join(changed)} (restored for the other kernels)")


def call_checked(kernel: Kernel, call: Callable[[], Any], names: str, inputs: tuple[Any, ...], device: Any) -> Any:
    """``kernel.call_or_skip(call)`` into NaN-poisoned memory (``poison_allocator``, sized as the
    inputs); refusal or not, it fails if the kernel wrote into ``inputs`` (``assert_unchanged``,
    which puts them back for the case's other kernels)."""
    poison_allocator(device, [x.numel() * x.element_size() for x in inputs])
    before = tuple(x.detach().clone() for x in inputs)
    try:
        return kernel.call_or_skip(call)
    finally:
        assert_unchanged(names, inputs, before)
