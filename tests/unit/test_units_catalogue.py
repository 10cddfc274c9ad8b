"""The catalogue's options read from a real config (``pytester.parseconfig``, the plugin loaded
with ``-p``): ``--attnperf-require-class`` takes trigger classes only."""

from __future__ import annotations

import pytest

from pytest_attnperf.families import catalogue
from pytest_attnperf.plugins.catalogue import _required


def test_require_class_takes_the_classes_it_names(pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig("-p", "pytest_attnperf.plugin", "--attnperf-require-class= tile-edge,window-edge")
    assert _required(config) == ("tile-edge", "window-edge")
    assert _required(pytester.parseconfig("-p", "pytest_attnperf.plugin")) == ()


def test_a_required_class_no_catalogue_has_is_a_usage_error_naming_the_classes(pytester: pytest.Pytester) -> None:
    """``--attnperf-require-class=window`` (a class misspelt): the run stops before collecting,
    naming the word and every class there is."""
    config = pytester.parseconfig("-p", "pytest_attnperf.plugin", "--attnperf-require-class=tile-edge,window")
    with pytest.raises(pytest.UsageError, match="names no trigger class window ") as raised:
        _required(config)
    assert f"(the classes: {', '.join(catalogue.CLASSES)})" in str(raised.value)
