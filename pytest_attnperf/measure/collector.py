"""Python's garbage collector held off around the timed calls, and around the calls that check
them (``verify.Replays``), so that a check runs in the state the timed calls ran in."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused(collect: bool = True) -> Iterator[None]:
    """Collect garbage (unless ``collect`` is False), then keep the collector off inside the
    block, back on after it however it ends: a collection pausing one timed call read as a
    slowdown of the kernel. Left off if it was off already. A check times nothing, so it need
    not pay for a collection; it only needs the collector off, as a kernel that watches
    ``gc.isenabled()`` saw it while timed."""
    enabled = gc.isenabled()
    if collect:
        gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
