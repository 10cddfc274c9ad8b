"""The built-in kernels and suites: one folder per attention family, each with its kernels
(``kernels.py``) and its suite (``suite.py``: ``ATTNPERF_FAMILY``, ``ATTNPERF_CASES`` and the test
function the plugin parametrizes).

``--attnperf-suites=softmax,linear`` (or ``all``) adds the suites to any run, so a project's own
kernels (``pytest_attnperf_register_kernels`` in its conftest.py) run through them; a project's
own test module can import a suite's test function and declare shapes of its own.
"""

from __future__ import annotations

from pytest_attnperf.families.registry import KernelRegistry

__all__ = ["SUITES", "register_builtin"]

SUITES = ("softmax", "linear")  # families with a built-in suite (families/<name>/suite.py), in the order they run


def register_builtin(registry: KernelRegistry) -> None:
    """Register every built-in kernel of every family."""
    from pytest_attnperf.families.linear import kernels as linear
    from pytest_attnperf.families.softmax import kernels as softmax

    softmax.register(registry)
    linear.register(registry)
