"""pytest-attnperf: correctness and performance checks for attention kernels.

Importing this package imports nothing heavy. The public pieces: ``Kernel`` / ``KernelRegistry``
(register a kernel with the ``pytest_attnperf_register_kernels(registry, config)`` hook);
``SoftmaxCase`` / ``LinearCase`` (one shape of a family: a module declaring ``ATTNPERF_FAMILY`` and
``ATTNPERF_CASES`` is parametrized over its kernels, cases and directions); ``costs``;
``gate.verdict`` and ``gate.policy``; ``families.parametrize.parametrize``. Using them:
docs/own-project.md; the layout: docs/architecture.md.
"""

from __future__ import annotations

from pytest_attnperf.families.linear.case import LinearCase
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.families.softmax.kernels import SoftmaxCase

__all__ = ["Kernel", "KernelRegistry", "LinearCase", "SoftmaxCase", "__version__"]
__version__ = "0.1.0"
