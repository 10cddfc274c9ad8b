"""Decode: softmax attention over a KV cache (``pytest_attnperf.families.softmax.decode``) and
linear attention's recurrent step from a state (``pytest_attnperf.families.linear.decode``),
forward only. The GPU tables: the cache from 1K to 128K at B=1 and 1K to 32K at B=32, and one
and four recurrent steps; the CPU tables run in seconds. On the CPU, flex-window
is left out (compiling it costs about 20 s a shape; the softmax suite runs it)."""

from __future__ import annotations

import pytest

from pytest_attnperf.families import parametrize as suite
from pytest_attnperf.families.linear import decode as linear_decode
from pytest_attnperf.families.linear.decode import test_linear_decode
from pytest_attnperf.families.softmax import decode as softmax_decode
from pytest_attnperf.families.softmax.decode import test_softmax_decode
from pytest_attnperf.session import get_session

__all__ = ["test_linear_decode", "test_softmax_decode"]

CPU_LEFT_OUT = ("flex-window",)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    session = get_session(metafunc.config)
    name = metafunc.definition.name
    if name == "test_softmax_decode":
        kernels = [k.name for k in session.registry.family("softmax")
                   if session.device.is_gpu or k.name not in CPU_LEFT_OUT]
        suite.check_cases(__name__, softmax_decode.CASES)
        suite.parametrize(metafunc, "softmax", softmax_decode.CASES, softmax_decode.DIRECTIONS, kernels=kernels)
    elif name == "test_linear_decode":
        suite.check_cases(__name__, linear_decode.CASES)
        suite.parametrize(metafunc, linear_decode.FAMILIES, linear_decode.CASES, linear_decode.DIRECTIONS)
