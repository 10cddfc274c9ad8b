"""Matrix products with TF32 operands, as a Triton kernel's ``tl.dot`` reads fp32 tiles: the zoos'
own emulation, written apart from the harness's yardstick (``pytest_attnperf.families.tf32``: bit
masks), so that a zoo kernel checked against that yardstick does not share its code."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["TF32Mode"]


def _tf32(x: Tensor, nearest: bool) -> Tensor:
    """``x`` with 11 significant bits (TF32's 10 stored and the implicit one): its frexp mantissa
    scaled by 2^11 and truncated (toward zero) or rounded half to even, then scaled back."""
    mantissa, exponent = torch.frexp(x)
    scaled = mantissa * 2.0**11
    kept = torch.round(scaled) if nearest else torch.trunc(scaled)
    return torch.ldexp(kept / 2.0**11, exponent).to(x.dtype)


class _TF32Matmul(torch.autograd.Function):
    """``a @ b`` of TF32-rounded operands; backward, both gradients' products likewise."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, b: Tensor, nearest: bool) -> Tensor:
        ra, rb = _tf32(a, nearest), _tf32(b, nearest)
        ctx.save_for_backward(ra, rb)
        ctx.nearest = nearest
        return torch.matmul(ra, rb)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        ra, rb = ctx.saved_tensors
        g = _tf32(grad, ctx.nearest)
        return torch.matmul(g, rb.mT), torch.matmul(ra.mT, g), None


class TF32Mode(torch.overrides.TorchFunctionMode):
    """Every ``@`` of two float32 matrices (or stacks of the same batch shape) through ``_TF32Matmul``."""

    def __init__(self, nearest: bool) -> None:
        super().__init__()
        self.nearest = nearest

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.Tensor.matmul, torch.matmul) and len(args) == 2 and not kwargs:
            a, b = args
            if a.dtype == b.dtype == torch.float32 and a.dim() == b.dim() >= 2 and a.shape[:-2] == b.shape[:-2]:
                matmul: Tensor = _TF32Matmul.apply(a, b, self.nearest)  # type: ignore[no-untyped-call]
                return matmul
        return func(*args, **(kwargs or {}))
