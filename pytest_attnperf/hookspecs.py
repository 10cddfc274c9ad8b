"""Hooks a conftest.py or plugin can implement to adapt pytest-attnperf.

Loaded with ``pytest_addhooks``. Every hook here is optional.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_attnperf.families.registry import KernelRegistry
    from pytest_attnperf.hw.table import DetectedDevice
    from pytest_attnperf.measure.timing import Timer


@pytest.hookspec(firstresult=True)
def pytest_attnperf_detect_device(config: pytest.Config) -> DetectedDevice | None:
    """Return the device this run measures on.

    The built-in implementation asks torch for CUDA device 0 and falls back to the CPU.
    Override it to pick another device, or to fake one in tests.
    """


@pytest.hookspec(firstresult=True)
def pytest_attnperf_make_timer(config: pytest.Config, device: DetectedDevice) -> Timer | None:
    """Return the timer that measures callables on ``device``.

    The built-in one times CUDA devices with device events and graph replay and the CPU with
    a host clock. Tests of the harness return a scripted timer here.
    """


def pytest_attnperf_register_kernels(registry: KernelRegistry, config: pytest.Config) -> None:
    """Add kernels to the registry: ``registry.add(Kernel(...))`` or
    ``registry.kernel(family=..., name=...)`` as a decorator.

    Each registered kernel joins its family's suite and goes through the same correctness
    checks, timing and baselines as the built-in ones.
    """


@pytest.hookspec(firstresult=True)
def pytest_attnperf_visible_gpus(config: pytest.Config) -> list[str] | None:
    """Return the GPUs a pytest-xdist run spreads its workers over, as ``CUDA_VISIBLE_DEVICES``
    entries (worker ``gwK`` gets the K-th).

    The built-in implementation reads ``CUDA_VISIBLE_DEVICES``, else counts the devices with
    NVML (or torch). Tests of the harness return a fixed list here.
    """
