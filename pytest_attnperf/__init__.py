"""pytest-attnperf: correctness and performance checks for attention kernels.

Importing this package imports nothing heavy. The public pieces:

* ``Kernel`` / ``KernelRegistry``: register your own kernel from ``conftest.py`` with the
  ``pytest_attnperf_register_kernels(registry, config)`` hook.
* ``SoftmaxCase`` / ``LinearCase``: one shape of a family. A test module that declares
  ``ATTNPERF_FAMILY`` and ``ATTNPERF_CASES`` is parametrized over the family's kernels, its
  cases and both directions; import a built-in suite's test function
  (``from pytest_attnperf.families.softmax.suite import test_softmax``) to run it on your shapes.
* ``--attnperf-suites=softmax,linear``: the built-in suites join any run.
* ``costs``: analytic FLOP/byte models; ``gate.verdict`` and ``gate.policy``: the regression
  verdict and its rules; ``families.parametrize.parametrize``: the same parametrization, called
  from a conftest.py of your own. The layout: docs/architecture.md.
"""

from __future__ import annotations

from pytest_attnperf.families.linear.case import LinearCase
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.families.softmax.kernels import SoftmaxCase

__all__ = ["Kernel", "KernelRegistry", "LinearCase", "SoftmaxCase", "__version__"]
__version__ = "0.1.0"
