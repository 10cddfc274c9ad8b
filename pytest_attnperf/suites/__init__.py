"""The built-in suites, one module per family: each holds ``ATTNPERF_FAMILY``, ``ATTNPERF_CASES``
and its test function, which the plugin parametrizes (``suite.generate``).

``--attnperf-suites=softmax,linear`` (or ``all``) adds them to any run, so a project's own
kernels (``pytest_attnperf_register_kernels`` in its conftest.py) run through them; a project's
own test module can import a suite's test function and declare shapes of its own.
"""

from __future__ import annotations

__all__ = ["SUITES"]

SUITES = ("softmax", "linear")  # module names in this package, in the order they run
