"""The built-in linear-attention suite (``pytest_attnperf.suites.linear``), collected from this checkout."""

from pytest_attnperf.suites.linear import ATTNPERF_CASES, ATTNPERF_FAMILY, CASES, FAMILY, test_linear

__all__ = ["ATTNPERF_CASES", "ATTNPERF_FAMILY", "CASES", "FAMILY", "test_linear"]
