"""``CudaTimer.measure`` on the CPU: torch.cuda's streams, events and graphs replaced by fakes
driven by a scripted device clock, so the sampling path itself (calls per sample, the hot
mode's graph fallback, the clock check and its notes) is tested without a GPU.

The fake device clock advances only when a fake graph is replayed, by the scripted per-call
time times the calls in that graph; events read it when recorded. The real timer code does the
rest: the events around a replay, the division by calls, the re-measure after a throttled clock.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from pytest_attnperf import timing
from pytest_attnperf.hardware import DetectedDevice
from pytest_attnperf.timing import CudaTimer, SamplingPlan

H200 = DetectedDevice("cuda", "NVIDIA H200", (9, 0), 132, 60 * 2**20)


class Device:
    """The scripted GPU: a clock in ms that graph replays advance."""

    def __init__(self, ms_per_call: float) -> None:
        self.ms_per_call, self.now_ms, self.replays = ms_per_call, 0.0, 0


class FakeGraph:
    def __init__(self, device: Device, calls: int) -> None:
        self.device, self.calls = device, calls

    def replay(self) -> None:
        self.device.now_ms += self.device.ms_per_call * self.calls
        self.device.replays += 1


class FakeEvent:
    device: Device

    def __init__(self, enable_timing: bool = False) -> None:
        self.at_ms = 0.0

    def record(self) -> None:
        self.at_ms = self.device.now_ms

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: FakeEvent) -> float:
        return other.at_ms - self.at_ms


class FakeStream:
    def wait_stream(self, other: Any) -> None:
        pass


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Device:
    """A fake device of 0.02 ms per call; graphs of any length capture unless a test says not."""
    device = Device(0.02)
    FakeEvent.device = device
    for name, value in {
        "Stream": FakeStream, "current_stream": FakeStream, "stream": lambda s: contextlib.nullcontext(),
        "synchronize": lambda: None, "Event": FakeEvent, "_sleep": lambda cycles: None,
        "current_device": lambda: 0,
    }.items():
        monkeypatch.setattr(torch.cuda, name, value, raising=False)
    monkeypatch.setattr(timing, "_capture", lambda fn, calls: (FakeGraph(device, calls), None))
    monkeypatch.setattr(timing, "_time_replay", lambda replay: device.ms_per_call)
    monkeypatch.setattr(CudaTimer, "_eager_ms", staticmethod(lambda fn, calls=10, budget_s=0.5: 0.05))
    monkeypatch.setattr(CudaTimer, "_peak_mib", staticmethod(lambda fn: 1.0))
    monkeypatch.setattr(CudaTimer, "_flush_buffer", lambda self: torch.zeros(4))
    monkeypatch.setattr(timing, "read_sm_clock", lambda index: (1980.0, ()))
    monkeypatch.setattr(timing, "read_violation_ns", lambda index: {"power": 0, "thermal": 0})
    return device


PLAN = SamplingPlan(min_samples=10, budget_s=0.05)


def test_cold_mode_times_one_call_per_replay(gpu: Device) -> None:
    m = CudaTimer(H200).measure(lambda: None, PLAN)
    assert (m.clock, m.mode, m.calls_per_sample) == ("cuda-graph", "cold", 1)
    assert m.median_ms == pytest.approx(0.02) and len(m.samples_ms) >= 10
    assert m.notes == () and m.sm_clock_mhz == 1980.0


def test_hot_mode_divides_a_long_graph_by_its_calls(gpu: Device) -> None:
    """0.5 ms samples of 0.02 ms calls: graphs of 25 calls, one replay per sample."""
    m = CudaTimer(H200).measure(lambda: None, SamplingPlan(mode="hot", min_samples=10, budget_s=0.05))
    assert (m.clock, m.calls_per_sample) == ("cuda-graph", 25)
    assert m.median_ms == pytest.approx(0.02)
    assert gpu.replays == len(m.samples_ms)


def test_hot_mode_replays_the_one_call_graph_when_the_long_capture_fails(
    gpu: Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    def capture(fn: Any, calls: int) -> tuple[Any, str | None]:
        return (FakeGraph(gpu, 1), None) if calls == 1 else (None, "OutOfMemoryError: pool")

    monkeypatch.setattr(timing, "_capture", capture)
    m = CudaTimer(H200).measure(lambda: None, SamplingPlan(mode="hot", min_samples=10, budget_s=0.05))
    assert (m.clock, m.calls_per_sample) == ("cuda-graph-replays", 25)
    assert m.median_ms == pytest.approx(0.02)  # 25 replays of one call, divided by 25
    assert gpu.replays == 25 * len(m.samples_ms)
    assert m.notes == ("a graph of 25 calls failed (OutOfMemoryError: pool); each sample replays the one-call "
                       "graph 25 times",)


def test_a_callable_that_cannot_be_captured_is_timed_eagerly_and_says_so(
    gpu: Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    def call() -> None:
        gpu.now_ms += 0.03  # an eager call advances the clock itself

    monkeypatch.setattr(timing, "_capture", lambda fn, calls: (None, "RuntimeError: capture"))
    m = CudaTimer(H200).measure(call, PLAN)
    assert m.clock == "cuda-events" and m.median_ms == pytest.approx(0.03)
    assert m.notes[0].startswith("not graph-capturable (RuntimeError: capture)")


def test_a_throttled_case_is_measured_again(gpu: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first sampling ran throttled (0.03 ms per call) and the clock read after it says so;
    the throttle has lifted for the second (0.02 ms): one re-measure, noted, and the samples
    kept are the second sampling's."""
    reads = iter([(1700.0, ("sw-power-cap",)), (1980.0, ())])

    def clock(index: int) -> tuple[float, tuple[str, ...]]:
        gpu.ms_per_call = 0.02  # whatever follows this read runs at full clock
        return next(reads)

    gpu.ms_per_call = 0.03
    monkeypatch.setattr(timing, "read_sm_clock", clock)
    m = CudaTimer(H200).measure(lambda: None, PLAN)
    assert m.notes == ("clock throttled (sw-power-cap) at 1700.0 MHz; re-measured",)
    assert m.sm_clock_mhz == 1980.0
    assert m.median_ms == pytest.approx(0.02) and max(m.samples_ms) == pytest.approx(0.02)


def test_still_throttled_and_held_clocks_are_noted(gpu: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "read_sm_clock", lambda index: (1890.0, ("sw-power-cap",)))
    counters = iter([{"power": 0}, {"power": 10**10}, {"power": 10**10}, {"power": 2 * 10**10}])
    monkeypatch.setattr(timing, "read_violation_ns", lambda index: next(counters))
    m = CudaTimer(H200).measure(lambda: None, PLAN)
    assert m.notes[:2] == ("clock throttled (sw-power-cap) at 1890.0 MHz; re-measured",
                           "still throttled (sw-power-cap) after re-measuring")
    assert m.notes[2].startswith("clocks held down while sampling (power 100% of ")


def test_without_nvml_the_result_says_the_clock_was_not_checked(gpu: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "read_sm_clock", lambda index: (None, ()))
    monkeypatch.setattr(timing, "read_violation_ns", lambda index: None)
    m = CudaTimer(H200).measure(lambda: None, PLAN)
    assert m.notes == ("SM clock not read (no NVML: pip install nvidia-ml-py); throttling not checked",)


def test_warm_up_stops_after_the_first_call_once_the_budget_is_spent(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(timing.time, "monotonic", lambda: now[0])

    def slow() -> None:  # a host-bound call of 0.3 s
        now[0] += 0.3

    plan = SamplingPlan(budget_s=0.5, warmup_calls=3)
    assert timing.warm_up(slow, plan) == 2  # 0.3 s, then 0.6 s: past the budget
    assert timing.warm_up(lambda: None, plan) == 3  # quick calls: all three
    now[0] = 0.0
    assert timing.warm_up(lambda: now.__setitem__(0, now[0] + 5.0), plan) == 1  # at least one
    assert timing.warm_up(slow, SamplingPlan(warmup_calls=0)) == 0


def test_measure_warms_up_before_sampling(gpu: Device, monkeypatch: pytest.MonkeyPatch) -> None:
    warmed: list[int] = []
    real = timing.warm_up
    monkeypatch.setattr(timing, "warm_up", lambda fn, plan: warmed.append(real(fn, plan)))
    CudaTimer(H200).measure(lambda: None, PLAN)
    timing.HostTimer().measure(lambda: None, SamplingPlan(min_samples=3, budget_s=0.01))
    assert warmed == [3, 3]
