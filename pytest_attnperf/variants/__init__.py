"""Built-in kernels, one module per attention family."""

from __future__ import annotations

from ..registry import KernelRegistry

__all__ = ["register_builtin"]


def register_builtin(registry: KernelRegistry) -> None:
    from . import linear, softmax

    softmax.register(registry)
    linear.register(registry)
