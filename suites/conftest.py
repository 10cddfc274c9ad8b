"""Every suite module declares ``FAMILY`` and ``CASES``; this parametrizes it."""

from __future__ import annotations

import pytest

from pytest_attnperf import suite


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module
    if hasattr(module, "FAMILY") and hasattr(module, "CASES"):
        suite.parametrize(metafunc, module.FAMILY, module.CASES)
