"""TF32 products: the fp32 yardstick of a kernel whose matrix products run on tensor cores (Triton's
``tl.dot`` of fp32 operands, whose default input precision is TF32): a linear family's chunk kernel
on a GPU, a softmax kernel registered with ``tf32=True``.

TF32 keeps float32's sign and 8 exponent bits and the top 10 of its 23 mantissa bits. Inside
:func:`tf32_products` every matrix product of two float32 tensors (``@``, ``torch.matmul``,
``mm``, ``bmm``) takes its operands rounded to TF32, in the forward and, under autograd, in each
product of its backward (the output gradient rounded too), with the result and its accumulation
in float32; nothing else changes. Which rounding, and what it costs the check: docs/checks.md,
"TF32 products".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = ["DROPPED_BITS", "ROUNDINGS", "round_tf32", "rounds_products", "tf32_products"]

DROPPED_BITS = 13  # float32's 23 mantissa bits less TF32's 10
ROUNDINGS = ("truncate", "nearest-even")
"""``truncate``: the dropped bits cleared (toward zero; what a tensor core reads of an fp32 operand
that nothing rounded); ``nearest-even``: IEEE round to nearest, ties to even."""

_KEPT = -(1 << DROPPED_BITS)  # 0xFFFFE000 as an int32: sign, exponent, 10 mantissa bits
_HALF = (1 << (DROPPED_BITS - 1)) - 1  # 0x0FFF: below half of the last kept bit
_EXPONENT = 0x7F800000


def round_tf32(x: Tensor, rounding: str = "truncate") -> Tensor:
    """``x`` (float32) rounded to TF32, still float32. Inf and NaN are returned as they are (a NaN
    whose payload lies in the dropped bits stays NaN); subnormals keep their top 10 mantissa bits
    (TF32 has float32's exponent range); ``nearest-even`` carries into the exponent, up to inf
    beyond TF32's largest finite value. Raises ValueError for another dtype or rounding."""
    if x.dtype != torch.float32:
        raise ValueError(f"round_tf32 takes float32, got {x.dtype}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    bits = x.contiguous().view(torch.int32)
    moved = bits
    if rounding == "nearest-even":
        moved = bits + _HALF + ((bits >> DROPPED_BITS) & 1)  # a tie rounds up only from an odd last bit
    special = (bits & _EXPONENT) == _EXPONENT
    return torch.where(special, bits, moved & _KEPT).view(torch.float32).view(x.shape)


class _Product(torch.autograd.Function):
    """``a @ b`` with both operands rounded to TF32; backward, each gradient's product likewise."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, rounding: str) -> Tensor:
        ra, rb = round_tf32(a, rounding), round_tf32(b, rounding)
        ctx.save_for_backward(ra, rb)
        ctx.rounding = rounding
        ctx.shapes = (a.shape, b.shape)
        return torch.matmul(ra, rb)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        ra, rb = ctx.saved_tensors
        g = round_tf32(grad.contiguous(), ctx.rounding)
        da = (g @ rb.mT).sum_to_size(ctx.shapes[0]) if ctx.needs_input_grad[0] else None
        db = (ra.mT @ g).sum_to_size(ctx.shapes[1]) if ctx.needs_input_grad[1] else None
        return da, db, None


_PRODUCTS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
             torch.bmm, torch.Tensor.bmm}
_UNROUNDED = {torch.einsum, torch.tensordot, torch.Tensor.__rmatmul__, torch.baddbmm, torch.addmm}


class _TF32Products(TorchFunctionMode):
    def __init__(self, rounding: str) -> None:
        super().__init__()
        self.rounding = rounding

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _PRODUCTS and not kwargs and len(args) == 2:
            a, b = args
            if a.dtype == b.dtype == torch.float32 and a.dim() >= 2 and b.dim() >= 2:
                product: Tensor = _Product.apply(a, b, self.rounding)  # type: ignore[no-untyped-call]
                return product
        if func in _PRODUCTS or func in _UNROUNDED:
            if any(isinstance(x, Tensor) and x.dtype == torch.float32 for x in args):
                raise NotImplementedError(f"{getattr(func, '__name__', func)} of float32 operands is not rounded "
                                          "to TF32 here: write the product as a @ b of two matrices (or stacks)")
        return func(*args, **kwargs)


@contextmanager
def tf32_products(rounding: str = "truncate") -> Iterator[None]:
    """Inside, every matrix product of float32 tensors takes TF32 operands (``rounding`` one of
    ``ROUNDINGS``); a product this cannot round (``einsum``, a vector operand, ``out=``) raises
    NotImplementedError rather than running unrounded."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    with _TF32Products(rounding):
        yield


def rounds_products(device: torch.device) -> bool:
    """Whether a chunk kernel's fp32 products on ``device`` take TF32 operands: on a GPU, where
    Triton's ``tl.dot`` of fp32 tiles defaults to TF32; not on the CPU, where neither torch's
    matmul nor Triton's interpreter rounds them."""
    return device.type != "cpu"
