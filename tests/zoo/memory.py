"""Memory-gate kernels: right answers whose memory is wrong for what they claim.

Load it as a pytest plugin (``-p zoo.memory`` with ``tests/`` on the path): it adds each kernel to
the ``softmax`` family. ``memory-bad-dense-scores`` is the naive kernel (``B x H x T x T`` scores
materialised in the inputs' dtype) registered as tiled, as a kernel that falls back silently to
dense scores would be: its numbers pass every check, and on a GPU case whose scores outweigh the
bound (``families.softmax.memory``) it must fail as ``over the memory bound``. On the CPU no peak
is measured, so it passes there.
"""

from __future__ import annotations

from pytest_attnperf.families.registry import KernelRegistry
from pytest_attnperf.families.softmax.kernels import naive

__all__ = ["BAD", "FAMILY", "pytest_attnperf_register_kernels", "register"]

FAMILY = "softmax"
BAD = ("memory-bad-dense-scores",)


def register(registry: KernelRegistry) -> None:
    """Add the kernels to ``registry``'s softmax family, each claiming to be tiled."""
    registry.kernel(family=FAMILY, name="memory-bad-dense-scores", tiled=True)(naive)


def pytest_attnperf_register_kernels(registry: KernelRegistry) -> None:
    """The plugin hook: the memory kernels join the softmax family."""
    register(registry)
