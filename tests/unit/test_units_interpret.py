"""Autotuners held to one configuration for the length of a block (the catalogue's checks)."""

from __future__ import annotations

from typing import Any

import pytest

triton_autotuner = pytest.importorskip("triton.runtime.autotuner")
from triton.runtime.errors import OutOfResources  # noqa: E402 - after the skip when Triton is missing

from pytest_attnperf.families import interpret  # noqa: E402


class Tuned:
    """Stands for a ``triton.autotune`` kernel: its configurations, nothing else."""

    def __init__(self, configs: list[str]) -> None:
        self.configs = configs


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The configurations each call of the (stubbed) autotuner was left to choose from; a call
    given configuration "big" runs out of shared memory, as a real one would."""
    calls: list[list[str]] = []

    def run(self: Tuned, *args: Any, **kwargs: Any) -> str:
        calls.append(list(self.configs))
        if self.configs[0] == "big":
            raise OutOfResources(1 << 20, 1 << 16, "shared memory")
        return self.configs[0]

    monkeypatch.setattr(triton_autotuner.Autotuner, "run", run)
    monkeypatch.setattr(interpret, "_held", [])
    return calls


def test_inside_the_block_each_call_runs_the_first_configuration_and_the_choices_are_left_as_they_were(
        seen: list[list[str]]) -> None:
    kernel = Tuned(["a", "b", "c"])
    stub = triton_autotuner.Autotuner.run
    with interpret.autotuners_held():
        assert triton_autotuner.Autotuner.run(kernel) == "a"
        assert kernel.configs == ["a", "b", "c"]
    assert seen == [["a"]]
    assert triton_autotuner.Autotuner.run is stub  # after the block, the autotuner as it was
    assert triton_autotuner.Autotuner.run(kernel) == "a"
    assert seen[-1] == ["a", "b", "c"]


def test_a_first_configuration_the_device_cannot_hold_gives_way_to_the_next(seen: list[list[str]]) -> None:
    kernel = Tuned(["big", "small"])
    with interpret.autotuners_held():
        assert triton_autotuner.Autotuner.run(kernel) == "small"
    assert seen == [["big"], ["small"]]
    assert kernel.configs == ["big", "small"]


def test_a_process_holding_its_autotuners_for_good_is_left_alone(seen: list[list[str]],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(interpret, "_held", [True])
    stub = triton_autotuner.Autotuner.run
    with interpret.autotuners_held():
        assert triton_autotuner.Autotuner.run is stub
