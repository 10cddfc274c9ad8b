"""The built-in correctness catalogue (``pytest_attnperf.families.catalogue_suite``): every kernel of
every family on the trigger-class rows of ``--attnperf-catalogue`` (default smoke), check-only."""

from pytest_attnperf.families.catalogue_suite import pytest_generate_tests, test_catalogue, test_catalogue_order

__all__ = ["pytest_generate_tests", "test_catalogue", "test_catalogue_order"]
