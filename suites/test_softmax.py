"""The built-in softmax suite (``pytest_attnperf.families.softmax.suite``), collected from this checkout."""

from pytest_attnperf.families.softmax.suite import ATTNPERF_CASES, ATTNPERF_FAMILY, CASES, FAMILY, test_softmax

__all__ = ["ATTNPERF_CASES", "ATTNPERF_FAMILY", "CASES", "FAMILY", "test_softmax"]
