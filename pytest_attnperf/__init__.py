"""pytest-attnperf: correctness and performance checks for attention kernels.

Importing this package imports nothing heavy. The public pieces:

* ``Kernel`` / ``KernelRegistry``: register your own kernel from ``conftest.py`` with the
  ``pytest_attnperf_register_kernels(registry, config)`` hook.
* ``costs``: analytic FLOP/byte models; ``gate``: the regression verdict.
* ``suite.parametrize``: parametrize a suite of your own over a family's kernels and cases.
"""

from __future__ import annotations

from .registry import Kernel, KernelRegistry

__all__ = ["Kernel", "KernelRegistry", "__version__"]
__version__ = "0.1.0"
