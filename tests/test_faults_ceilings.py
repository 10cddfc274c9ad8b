"""Ceilings taken on a busy host are used for their run only, never cached for later runs, and an
MFU or bandwidth above 100% of a measured ceiling is named as impossible. Fake timers and fake
load readings: nothing here depends on this machine's load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_attnperf.gate import physics
from pytest_attnperf.gate.roofline import Ceiling
from pytest_attnperf.hw import ceilings
from pytest_attnperf.hw.table import DetectedDevice, unlisted_spec
from pytest_attnperf.measure.contention import HostLoad
from pytest_attnperf.measure.sampling import Measurement, SamplingPlan

CPU = DetectedDevice("cpu", "x86_64")
STACK = {"device": "x86_64", "torch": "2.13.0", "cuda": None, "driver": None}


class FakeTimer:
    """Every workload timed at ``samples_ms``, its callable never called (no tensors made)."""

    def __init__(self, samples_ms: tuple[float, ...]) -> None:
        self.samples_ms = samples_ms

    def measure(self, fn: Callable[[], Any], plan: SamplingPlan) -> Measurement:
        return Measurement(self.samples_ms, clock="host", mode="host")


def measured(monkeypatch: pytest.MonkeyPatch, samples_ms: tuple[float, ...], load: float) -> ceilings.Measured:
    monkeypatch.setattr(ceilings, "cpu_matmul_side", lambda *a, **k: 256)  # no matmul timed to choose a side
    return ceilings.measure(FakeTimer(samples_ms), SamplingPlan(), CPU, load=lambda: HostLoad(load, 2))


def obtained(tmp_path: Path, figures: ceilings.Measured) -> ceilings.Ceilings:
    return ceilings.obtain(unlisted_spec(CPU), "cache", (), pool_run=False, environment=lambda: STACK,
                           machine="box", folder=tmp_path, measure_now=lambda: figures)


STEADY = (10.0, 10.01, 10.02, 10.0, 10.01)


def test_ceilings_taken_on_an_idle_host_are_cached_and_read_back(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    figures = measured(monkeypatch, STEADY, load=0.5)
    assert figures.doubts == ()
    first = obtained(tmp_path, figures)
    assert first.cache_note is not None
    assert first.cache_note.startswith("cached in ")
    again = obtained(tmp_path, measured(monkeypatch, (99.0,) * 5, load=0.5))
    assert again.measured is not None
    assert again.measured.cached  # read back, not measured again
    assert again.measured.peak("fp32") == pytest.approx(figures.peak("fp32"), rel=1e-9)


def test_ceilings_taken_on_a_contended_host_are_not_cached_and_say_so(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    figures = measured(monkeypatch, STEADY, load=8.0)  # 4 runnable per core
    assert figures.doubts[0] == "bf16: host contended: load 8.0 on 2 cores"
    used = obtained(tmp_path, figures)
    assert used.measured is figures  # this run's figures all the same
    assert list(tmp_path.iterdir()) == []
    assert used.cache_note is not None
    assert used.cache_note.startswith("NOT cached, not plausible enough to keep for later runs (bf16: host "
                                      "contended: load 8.0 on 2 cores;")
    assert any(line.startswith("ceilings NOT cached") for line in used.lines())
    quiet = obtained(tmp_path, measured(monkeypatch, STEADY, load=0.5))  # the next run measures again
    assert quiet.measured is not None
    assert not quiet.measured.cached


def test_ceilings_whose_samples_spread_widely_are_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = measured(monkeypatch, (0.1, 0.1, 0.2, 0.4, 0.4), load=0.5)  # under a tick: no lattice
    assert figures.doubts
    assert "more than 1.5 times (no steady figure)" in figures.doubts[0]
    obtained(tmp_path, figures)
    assert list(tmp_path.iterdir()) == []


def test_an_mfu_or_bandwidth_above_a_measured_ceiling_is_named_impossible() -> None:
    peak, band = Ceiling(0.0336e12, "measured"), Ceiling(536e9, "measured")
    named = physics.above_measured(2.276, 1.2, peak, band, "bf16")
    assert named == (
        "IMPOSSIBLE MFU 227.6%: above 100% of the measured bf16 matmul ceiling (0.0336 TFLOP/s); the ceiling was "
        "measured low (a busy host: --attnperf-ceilings=measure on an idle one) or the cost model or the timer is "
        "wrong",
        "IMPOSSIBLE bandwidth 120.0%: above 100% of the measured copy bandwidth (536 GB/s); the ceiling was "
        "measured low (a busy host: --attnperf-ceilings=measure on an idle one) or the cost model or the timer is "
        "wrong")
    assert physics.above_measured(0.9, 0.99, peak, band, "bf16") == ()
    assert physics.above_measured(2.0, None, Ceiling(989e12, "spec"), None, "bf16") == ()  # the physics check's
