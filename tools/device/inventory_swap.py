"""A maintainers' plugin for ``tools/device/inventory.py``: changes the kernels of chosen cases, keeping
their node ids and their answers, so a gating run against their recorded inventories shows
``kernels changed``.

``ATTNPERF_SWAP="[<case id>]=efficient;[<case id>]=copy"`` (each matched as the end of a node id), loaded with ``-p
inventory_swap`` (``tools/device/`` on ``PYTHONPATH``):

- ``efficient``: the case's kernel runs inside ``sdpa_kernel([EFFICIENT_ATTENTION])``, so an
  SDPA kernel that is not pinned (``sdpa``, torch's own dispatch) runs the efficient backend
  instead of the one it chose (a pinned kernel would fail its backend proof instead);
- ``copy``: the kernel's first input is copied (``clone``) inside the call: one more copy kernel
  in every timed call, the answer the same.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

import pytest


def _swaps() -> list[tuple[str, str]]:
    text = os.environ.get("ATTNPERF_SWAP", "")
    pairs = [part.rpartition("=") for part in text.split(";") if part.strip()]
    return [(where.strip(), how.strip()) for where, _, how in pairs]


def _efficient(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def swapped(*args: Any, **kwargs: Any) -> Any:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return fn(*args, **kwargs)

    return swapped


def _copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def copied(first: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(first.clone(), *args, **kwargs)

    return copied


WRAPS = {"efficient": _efficient, "copy": _copy}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each chosen case's ``kernel`` parameter replaced by its kernel with the function wrapped."""
    swaps = _swaps()
    for item in items:
        callspec = getattr(item, "callspec", None)
        kernel = callspec.params.get("kernel") if callspec else None
        for where, how in swaps:
            if callspec is not None and kernel is not None and item.nodeid.endswith(where):
                callspec.params["kernel"] = dataclasses.replace(kernel, fn=WRAPS[how](kernel.fn))
                print(f"inventory_swap: {item.nodeid}: {how}")
