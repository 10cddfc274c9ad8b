"""The built-in softmax suite (``pytest_attnperf.suites.softmax``), collected from this checkout."""

from pytest_attnperf.suites.softmax import ATTNPERF_CASES, ATTNPERF_FAMILY, CASES, FAMILY, test_softmax

__all__ = ["ATTNPERF_CASES", "ATTNPERF_FAMILY", "CASES", "FAMILY", "test_softmax"]
