"""The noise benchmark's injection: a fixed half of the cases, and work that really adds time."""

from __future__ import annotations

import time

import pytest

from pytest_attnperf.hardware import DetectedDevice
from pytest_attnperf.inject import InjectingTimer, is_picked
from pytest_attnperf.timing import HostTimer, SamplingPlan


def test_picks_a_fixed_part_of_the_cases() -> None:
    ids = [f"suites/test_x.py::test_x[case{i}]" for i in range(400)]
    picked = [i for i in ids if is_picked(i, 2)]
    assert 150 < len(picked) < 250
    assert picked == [i for i in ids if is_picked(i, 2)]
    assert all(is_picked(i, 1) for i in ids)


def test_injected_work_adds_its_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    def work() -> None:
        until = time.perf_counter() + 0.002
        while time.perf_counter() < until:
            pass

    plan = SamplingPlan(min_samples=15, budget_s=0.1, warmup_calls=1)
    cpu = DetectedDevice("cpu", "x86_64")
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::picked (call)")
    plain = HostTimer().measure(work, plan).median_ms
    slowed = InjectingTimer(HostTimer(), cpu, fraction=0.5, every=1, compare=None).measure(work, plan)
    assert slowed.median_ms == pytest.approx(1.5 * plain, rel=0.15)
    assert any("injected +50%" in note for note in slowed.notes)
    untouched = InjectingTimer(HostTimer(), cpu, fraction=0.5, every=10**9, compare=None)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::other (call)")
    assert untouched.measure(work, plan).median_ms == pytest.approx(plain, rel=0.15)
