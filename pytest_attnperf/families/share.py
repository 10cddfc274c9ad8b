"""One GPU shared by several check-only processes (pytest-xdist workers on the catalogue): the
cases that need much of its memory take it alone, the rest share it.

Every case on a GPU takes a lock on it: exclusive when its estimated footprint (``footprint``)
is over a share of the device's memory, shared otherwise. After each case the worker gives its
cached blocks back; a shared case that still runs out of memory is run again alone.
docs/catalogue.md, "On a GPU".
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

try:
    import fcntl
except ImportError:  # not POSIX: no lock, each check runs as it comes
    fcntl = None  # type: ignore[assignment]

__all__ = ["SHARE", "footprint", "run_shared"]

T = TypeVar("T")
# a case over this fraction of the device's memory, divided by the processes on it, runs alone
SHARE = 0.5
FP64 = 8  # bytes of a reference element


def footprint(case: Any, direction: str) -> int:
    """Bytes a check of ``case`` holds at its peak, roughly: the fp64 reference's inputs, outputs
    and (softmax) materialised scores, with their gradients in the backward direction."""
    batch, heads, seq = case.batch, case.heads, case.seq
    if hasattr(case, "head_dim"):  # softmax: the reference materialises the scores and probabilities
        keys = case.n_kv_seq
        elements = batch * heads * ((seq + keys) * case.head_dim + 2 * seq * keys)
    else:  # linear: a state per chunk of 64 tokens
        dims = case.key_dim + case.value_dim
        elements = batch * heads * (2 * seq * dims + -(-seq // 64) * case.key_dim * case.value_dim)
    return int(elements) * FP64 * (3 if direction == "fwdbwd" else 1)


def _lock_path(device: Any, name: str) -> str:
    index = getattr(device, "index", None) or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "_")
    return os.path.join(tempfile.gettempdir(), f"attnperf-gpu-{visible}-{index}.{name}.lock")


@contextlib.contextmanager
def _held(device: Any, exclusive: bool) -> Iterator[None]:
    with open(_lock_path(device, "queue"), "a") as queue, open(_lock_path(device, "use"), "a") as use:
        fcntl.flock(queue, fcntl.LOCK_EX)  # both wait here while an exclusive request waits for `use`
        try:
            fcntl.flock(use, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(queue, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(use, fcntl.LOCK_UN)


def _out_of_memory(exc: BaseException) -> bool:
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def run_shared(check: Callable[[], T], device: Any, nbytes: int, processes: int,
               release: Callable[[], None] = lambda: None) -> T:
    """``check()`` on ``device`` beside ``processes`` check-only processes (itself included): alone
    when ``nbytes`` is over ``SHARE`` of the device's memory per process, else shared, and alone
    again once if it ran out of memory while shared. A case over a quarter of that share calls
    ``release`` after it (the caller drops what it kept of the case, its inputs and references),
    so no idle process holds a large case's tensors while another runs. Off a GPU, or as the only
    process, it just runs."""
    if getattr(device, "type", "cpu") != "cuda" or processes <= 1 or fcntl is None:
        return check()
    import torch  # noqa: PLC0415 - only a GPU run gets here; torch stays out of the plugin's start-up

    share = SHARE * torch.cuda.get_device_properties(device).total_memory / processes

    def attempt(exclusive: bool) -> T:
        with _held(device, exclusive):
            try:
                return check()
            finally:
                if exclusive or nbytes > share / 4:
                    release()
                torch.cuda.empty_cache()

    exclusive = nbytes > share
    try:
        return attempt(exclusive)
    except Exception as exc:
        if exclusive or not _out_of_memory(exc):
            raise
    return attempt(exclusive=True)
