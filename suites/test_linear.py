"""The built-in linear-attention suite (``pytest_attnperf.families.linear.suite``), collected from this checkout."""

from pytest_attnperf.families.linear.suite import ATTNPERF_CASES, ATTNPERF_FAMILY, CASES, FAMILY, test_linear

__all__ = ["ATTNPERF_CASES", "ATTNPERF_FAMILY", "CASES", "FAMILY", "test_linear"]
