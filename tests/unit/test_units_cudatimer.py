"""``CudaTimer.measure`` on the CPU: torch.cuda's streams, events and graphs replaced by fakes
driven by a scripted device clock, so the sampling path itself (calls per sample, the events
inside a cold graph, the hot mode's graph fallback, the clock check and its notes) is tested
without a GPU.

The fake device (tests/kit.py's ``FakeGpu``) has a clock in ms. A kernel call (``FakeGpu.call``)
advances it by the scripted per-call time, the L2 flush by its own time; a fake graph holds what
was captured and a replay runs it again after a launch latency. Events read the clock when
recorded (or, captured in a graph, when it replays them). The real timer code does the rest:
where the events go, the division by calls, the re-measure after a throttled clock.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
import torch
from kit import H200, FakeEvent, FakeGpu, FakeGraph, HostClock, fake_cuda, host_clock

from pytest_attnperf.measure import nvml, sampling, timing
from pytest_attnperf.measure.timing import CudaTimer, Measurement, SamplingPlan
from pytest_attnperf.measure.verify import UNVERIFIED


def own_notes(m: Measurement) -> tuple[str, ...]:
    """The measurement's notes but the one every plain callable gets (its timed calls not checked)."""
    assert UNVERIFIED in m.notes  # the fakes time plain callables
    return tuple(note for note in m.notes if note != UNVERIFIED)


class OldTorchEvent(FakeEvent):
    """A torch before external events: ``torch.cuda.Event(external=...)`` is a TypeError."""

    def __init__(self, enable_timing: bool = False) -> None:
        super().__init__(enable_timing)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    """A fake device of 0.02 ms per call; graphs of any length capture unless a test says not."""
    return fake_cuda(monkeypatch)


PLAN = SamplingPlan(min_samples=10, budget_s=0.05)


def test_cold_mode_times_one_call_between_events_inside_the_graph(gpu: FakeGpu) -> None:
    """A replay costs a 4 us launch and a 30 us flush before the call; neither is in a sample."""
    gpu.launch_ms, gpu.flush_ms = 0.004, 0.03
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert (m.clock, m.mode, m.calls_per_sample) == ("cuda-graph-nodes", "cold", 1)
    assert m.median_ms == pytest.approx(0.02)
    assert len(m.samples_ms) >= 10
    assert len(m.samples_ms) % 8 == 0  # whole rounds of the eight graphs
    assert gpu.replays == len(m.samples_ms) + 8  # one replay a sample, and one a graph to check its events read
    assert own_notes(m) == ()
    assert m.sm_clock_mhz == 1980.0


def test_cold_samples_go_round_graphs_of_their_own_medians(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each capture of the same call runs at a speed of its own (the H200's short kernels:
    up to 5% apart): four graphs at +0, +1, +2, +3% are sampled in turn, one sample each,
    whole rounds only, so the median lies between them rather than on whichever was captured;
    the later graphs go in the first one's memory pool."""
    captured: list[FakeGraph] = []

    def capture(fn: Callable[[], Any], calls: int, pool: Any = None) -> tuple[FakeGraph, None]:
        extra = 0.0002 * len(captured)  # each capture's call 1% of 0.02 ms slower than the one before
        graph = FakeGraph(gpu, lambda: slowed(fn, extra), pool)
        captured.append(graph)
        return graph, None

    def slowed(fn: Callable[[], Any], extra: float) -> None:
        gpu.ms_per_call += extra
        try:
            fn()
        finally:
            gpu.ms_per_call -= extra

    monkeypatch.setattr(timing, "_capture", capture)
    plan = SamplingPlan(min_samples=10, budget_s=0.05, cold_graphs=4)
    m = CudaTimer(H200).measure(gpu.call, plan)
    assert len(captured) == 4
    assert len({id(g.pool()) for g in captured}) == 1
    assert len(m.samples_ms) % 4 == 0
    assert len(m.samples_ms) >= 12
    assert m.samples_ms[:4] == pytest.approx((0.02, 0.0202, 0.0204, 0.0206))
    assert m.samples_ms[4:8] == pytest.approx(m.samples_ms[:4])
    assert 0.0202 <= m.median_ms <= 0.0204
    assert own_notes(m) == ()
    assert m.graphs == 4


def test_a_slow_capture_is_made_once(gpu: FakeGpu, host: HostClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host-bound call whose capture takes 0.4 s: past half the 0.5 s budget, so no second
    graph is begun (and no note: the graphs are a means, not a promise)."""
    made: list[int] = []

    def capture(fn: Callable[[], Any], calls: int, pool: Any = None) -> tuple[FakeGraph, None]:
        host.sleep(0.4)
        made.append(calls)
        return FakeGraph(gpu, fn, pool), None

    monkeypatch.setattr(timing, "_capture", capture)
    m = CudaTimer(H200).measure(gpu.call, SamplingPlan(min_samples=10, budget_s=0.5, cold_graphs=8))
    assert made == [1]
    assert m.graphs == 1
    assert own_notes(m) == ()
    assert m.clock == "cuda-graph-nodes"
    assert len(m.samples_ms) >= 10


def test_a_later_cold_capture_that_fails_keeps_the_graphs_before_it(
    gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[int] = []

    def capture(fn: Callable[[], Any], calls: int, pool: Any = None) -> tuple[FakeGraph | None, str | None]:
        if len(made) == 3:
            return None, "OutOfMemoryError: CUDA out of memory"
        made.append(calls)
        return FakeGraph(gpu, fn, pool), None

    monkeypatch.setattr(timing, "_capture", capture)
    m = CudaTimer(H200).measure(gpu.call, SamplingPlan(min_samples=10, budget_s=0.05, cold_graphs=8))
    assert m.clock == "cuda-graph-nodes"
    assert m.median_ms == pytest.approx(0.02)
    assert len(m.samples_ms) % 3 == 0
    assert m.graphs == 3
    assert own_notes(m) == ("3 of 8 cold graphs usable (OutOfMemoryError: CUDA out of memory); samples from those",)


def test_without_external_events_cold_samples_hold_the_launch_and_say_so(
    gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events around the replay of a one-call graph: the flush and spin run before the start
    event, the launch lands inside it; another clock, so the gate never mixes the two."""
    gpu.launch_ms, gpu.flush_ms = 0.004, 0.03
    monkeypatch.setattr(torch.cuda, "Event", OldTorchEvent)
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert (m.clock, m.calls_per_sample) == ("cuda-graph", 1)
    assert m.median_ms == pytest.approx(0.024)
    assert own_notes(m) == (f"no timing events inside the graph (torch {torch.__version__} has no external CUDA "
                       "events (torch.cuda.Event(external=True))); events around the replay instead, the "
                       "graph's launch included",)


def test_events_a_graph_recorded_but_torch_cannot_read_fall_back_too(
    gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    class InsideUnreadable(FakeEvent):
        def __init__(self, enable_timing: bool = False, external: bool = False) -> None:
            super().__init__(enable_timing, external)
            self.external = external

        def elapsed_time(self, other: FakeEvent) -> float:
            if self.external:
                raise RuntimeError("Both events must be recorded before calculating elapsed time.")
            return super().elapsed_time(other)

    gpu.launch_ms = 0.004
    monkeypatch.setattr(torch.cuda, "Event", InsideUnreadable)
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert m.clock == "cuda-graph"
    assert m.median_ms == pytest.approx(0.024)
    assert own_notes(m) == ("no timing events inside the graph (RuntimeError: Both events must be recorded before "
                       "calculating elapsed time.); events around the replay instead, the graph's launch "
                       "included",)


def test_events_that_cannot_be_captured_leave_the_call_captured_alone(
    gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The capture runs the body once, as torch's does; recording an external event there
    fails (a driver without event record nodes), the call alone captures: events around the
    replay, noted with the capture's error."""

    class NoEventNodes(FakeEvent):
        def __init__(self, enable_timing: bool = False, external: bool = False) -> None:
            super().__init__(enable_timing, external)
            self.external = external

        def record(self) -> None:
            if self.external:
                raise RuntimeError("operation not permitted when stream is capturing")
            super().record()

    def capture(fn: Callable[[], Any], calls: int, pool: Any = None) -> tuple[FakeGraph | None, str | None]:
        try:
            fn()
        except RuntimeError as exc:
            return None, f"RuntimeError: {exc}"
        return FakeGraph(gpu, lambda: [fn() for _ in range(calls)]), None

    gpu.launch_ms = 0.004
    monkeypatch.setattr(torch.cuda, "Event", NoEventNodes)
    monkeypatch.setattr(timing, "_capture", capture)
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert m.clock == "cuda-graph"
    assert m.median_ms == pytest.approx(0.024)
    assert own_notes(m) == ("no timing events inside the graph (RuntimeError: operation not permitted when stream is "
                       "capturing); events around the replay instead, the graph's launch included",)


def test_a_call_that_cannot_be_captured_gets_one_note_not_two(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "_capture", lambda fn, calls, pool=None: (None, "RuntimeError: capture"))
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert m.clock == "cuda-events"
    assert [n for n in m.notes if "graph" in n] == [
        "not graph-capturable (RuntimeError: capture); timed with events around eager launches, launch "
        "overhead included"]


def test_hot_mode_divides_a_long_graph_by_its_calls(gpu: FakeGpu) -> None:
    """20 ms samples (the default: do_bench_cudagraph's length) of 0.02 ms calls: graphs of 1000
    calls, one replay per sample."""
    m = CudaTimer(H200).measure(gpu.call, SamplingPlan(mode="hot", min_samples=10, budget_s=0.05))
    assert (m.clock, m.calls_per_sample) == ("cuda-graph", 1000)
    assert m.median_ms == pytest.approx(0.02)
    assert gpu.replays == len(m.samples_ms)


def test_hot_mode_replays_the_one_call_graph_when_the_long_capture_fails(
    gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    def capture(fn: Any, calls: int, pool: Any = None) -> tuple[Any, str | None]:
        return (FakeGraph(gpu, fn), None) if calls == 1 else (None, "OutOfMemoryError: pool")

    monkeypatch.setattr(timing, "_capture", capture)
    plan = SamplingPlan(mode="hot", min_samples=10, budget_s=0.05, hot_sample_ms=0.5)  # 25 calls a sample
    m = CudaTimer(H200).measure(gpu.call, plan)
    assert (m.clock, m.calls_per_sample) == ("cuda-graph-replays", 25)
    assert m.median_ms == pytest.approx(0.02)  # 25 replays of one call, divided by 25
    assert gpu.replays == 25 * len(m.samples_ms)
    assert own_notes(m) == ("a graph of 25 calls failed (OutOfMemoryError: pool); each sample replays the one-call "
                       "graph 25 times",)


def test_a_callable_that_cannot_be_captured_is_timed_eagerly_and_says_so(
    gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch
) -> None:
    def call() -> None:
        gpu.now_ms += 0.03  # an eager call advances the clock itself

    monkeypatch.setattr(timing, "_capture", lambda fn, calls, pool=None: (None, "RuntimeError: capture"))
    m = CudaTimer(H200).measure(call, PLAN)
    assert m.clock == "cuda-events"
    assert m.median_ms == pytest.approx(0.03)
    assert m.notes[0].startswith("not graph-capturable (RuntimeError: capture)")


def test_a_throttled_case_is_measured_again(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first sampling ran throttled (0.03 ms per call) and the clock read after it says so;
    the GPU idles, the throttle lifts, and the second sampling runs at 0.02 ms: one re-measure
    after the idle, noted, and the samples kept are the second sampling's."""
    reads = iter([(1700.0, ("sw-power-cap",)), (1980.0, ())])
    idles = []

    def idle(index: int) -> str:
        idles.append(index)
        gpu.ms_per_call = 0.02  # whatever runs after the idle runs at full clock
        return "the GPU idled 1.2 s"

    gpu.ms_per_call = 0.03
    monkeypatch.setattr(timing, "read_sm_clock", lambda index: next(reads))
    monkeypatch.setattr(timing, "cool_down", idle)
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert idles == [0]
    assert own_notes(m) == ("clock throttled (sw-power-cap) at 1700.0 MHz; re-measured after the GPU idled 1.2 s",)
    assert m.sm_clock_mhz == 1980.0
    assert m.median_ms == pytest.approx(0.02)
    assert max(m.samples_ms) == pytest.approx(0.02)


def test_still_throttled_and_held_clocks_are_noted(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "read_sm_clock", lambda index: (1890.0, ("sw-power-cap",)))
    counters = iter([{"power": 0}, {"power": 10**10}, {"power": 10**10}, {"power": 2 * 10**10}])
    monkeypatch.setattr(timing, "read_violation_ns", lambda index: next(counters))
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert m.notes[:2] == ("clock throttled (sw-power-cap) at 1890.0 MHz; re-measured after the GPU idled 0.5 s",
                           "still throttled (sw-power-cap) after re-measuring")
    assert m.notes[2].startswith("clocks held down while sampling (power 100% of ")


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> HostClock:
    """time.monotonic and time.sleep of a host whose sleeps take exactly what they ask."""
    return host_clock(monkeypatch)


def test_cool_down_waits_until_the_cap_lifts_and_the_board_draws_under_half_its_limit(
    host: HostClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Capped for the first 1.0 s of idling; the board's (averaged) power falls 100 W every
    0.25 s from 700 W: the wait ends at the first read that finds both, not before."""
    monkeypatch.setattr(nvml, "read_sm_clock",
                        lambda index: (1980.0, ("sw-power-cap",) if host.now_s < 1.0 else ()))
    monkeypatch.setattr(nvml, "read_power_w", lambda index: (700.0 - 400.0 * host.now_s, 700.0))
    note = nvml.cool_down(0)
    assert 1.0 <= host.now_s < 1.0 + 0.06  # power under 350 W from 0.875 s, the cap lifted at 1.0 s
    assert note == "the GPU idled 1.0 s, the board at 300 W of 700 W"


def test_cool_down_waits_its_least_and_stops_at_its_most(host: HostClock, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "read_sm_clock", lambda index: (1980.0, ()))
    monkeypatch.setattr(nvml, "read_power_w", lambda index: (90.0, 700.0))
    assert nvml.cool_down(0) == "the GPU idled 0.5 s, the board at 90 W of 700 W"
    assert host.now_s == nvml.COOL_DOWN_MIN_S  # cool at once: the least wait only

    host.now_s = 0.0
    monkeypatch.setattr(nvml, "read_sm_clock", lambda index: (1700.0, ("hw-thermal",)))
    note = nvml.cool_down(0, max_s=2.0)
    assert 2.0 <= host.now_s < 2.06
    assert note == "the GPU idled 2.0 s, the board at 90 W of 700 W, still hw-thermal"

    host.now_s = 0.0  # without NVML: nothing to wait for beyond the least
    monkeypatch.setattr(nvml, "read_sm_clock", lambda index: (None, ()))
    monkeypatch.setattr(nvml, "read_power_w", lambda index: None)
    assert nvml.cool_down(0) == "the GPU idled 0.5 s"


def test_without_nvml_the_result_says_the_clock_was_not_checked(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timing, "read_sm_clock", lambda index: (None, ()))
    monkeypatch.setattr(timing, "read_violation_ns", lambda index: None)
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert own_notes(m) == ("SM clock not read (no NVML: pip install nvidia-ml-py); throttling not checked",)


def test_warm_up_stops_after_the_first_call_once_the_budget_is_spent(host: HostClock) -> None:
    def slow() -> None:  # a host-bound call of 0.3 s
        host.sleep(0.3)

    plan = SamplingPlan(budget_s=0.5, warmup_calls=3)
    assert sampling.warm_up(slow, plan) == 2  # 0.3 s, then 0.6 s: past the budget
    assert sampling.warm_up(lambda: None, plan) == 3  # quick calls: all three
    host.now_s = 0.0
    assert sampling.warm_up(lambda: host.sleep(5.0), plan) == 1  # at least one
    assert sampling.warm_up(slow, SamplingPlan(warmup_calls=0)) == 0


def test_measure_warms_up_before_sampling(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    warmed: list[int] = []
    real = sampling.warm_up
    for module in (timing, sampling):  # the CUDA timer's and the host timer's
        monkeypatch.setattr(module, "warm_up", lambda fn, plan: warmed.append(real(fn, plan)))
    CudaTimer(H200).measure(gpu.call, PLAN)
    timing.HostTimer().measure(lambda: None, SamplingPlan(min_samples=3, budget_s=0.01))
    assert warmed == [3, 3]


class Draws:
    """A checked case's callable on the fake GPU: draw ``i``'s call costs one kernel call and
    returns ``i``; ``verify`` notes what it was given and refuses draw ``wrong``."""

    def __init__(self, gpu: FakeGpu, wrong: int | None = None) -> None:
        self.gpu, self.wrong = gpu, wrong
        self.checked: list[tuple[int, float]] = []

    def __call__(self) -> Any:
        return self.draw(0)()

    def draw(self, index: int) -> Callable[[], Any]:
        def call() -> Any:
            self.gpu.call()
            return (torch.full((2,), float(index)),)
        return call

    def rewritten(self, index: int) -> AbstractContextManager[bool]:
        return nullcontext(True)  # no inputs to rewrite: draw i's answer is i

    def verify(self, index: int, result: Any) -> float:
        self.checked.append((index, float(result[0][0])))
        if index == self.wrong:
            raise AssertionError("out: wrong")
        return 0.0

    def describe(self, index: int) -> str:
        return f"draw {index}"

    def protected(self) -> tuple[Any, ...]:
        return ()


def test_each_cold_graph_times_a_draw_of_its_own_checked_after_sampling(gpu: FakeGpu) -> None:
    draws = Draws(gpu)
    m = CudaTimer(H200).measure(draws, PLAN)
    checked_graphs = draws.checked[2:]  # the first: the eager calls timed for eager_ms, on draw 1
    assert draws.checked[0] == (1, 1.0)
    assert draws.checked[1] == (8, 8.0)  # the last sample's result, as graph 8's last replay wrote it
    assert checked_graphs == [(i, float(i)) for i in range(1, 9)]  # graph i wrote draw i's answer
    assert m.verified == 9
    assert m.bitwise is True
    assert UNVERIFIED not in m.notes


def test_a_graph_whose_timed_result_fails_its_check_fails_the_measurement_and_is_released(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_attnperf.measure.verify import TimedDiffers

    gpu = fake_cuda(monkeypatch, real_capture=True)  # graphs registered for release, as on a GPU

    with pytest.raises(TimedDiffers, match=r"differs from the checked one: cold graph 3 of 8, on timed draw 3, "
                                           r"rewritten in place after the timed calls: out"):
        CudaTimer(H200).measure(Draws(gpu, wrong=3), PLAN)
    assert gpu.resets == 8  # every graph captured, reset all the same
