"""The contended-host signals as pure functions of plain numbers, and the host timer's note.

No load and no sleeps: samples are lists of numbers, the load a fake reader, the clock a fake
that moves by the durations it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pytest_attnperf.measure.contention import (
    CONTENDED,
    HostLoad,
    contention_note,
    overloaded,
    quantised_step_ms,
)
from pytest_attnperf.measure.sampling import HostTimer, SamplingPlan

CALL_MS = 0.05
TICKS = (0, 1, 1, 2, 1, 0, 1, 3, 1, 0)  # a busy 2-core host: most calls wait a tick or more


def ticked(step_ms: float = 8.0, ticks: tuple[int, ...] = TICKS, n: int = 40) -> list[float]:
    """``n`` samples of a short call, each held up by whole ticks of ``step_ms``, with a little jitter."""
    return [CALL_MS * (1 + 0.01 * (i % 3)) + step_ms * ticks[i % len(ticks)] for i in range(n)]


def test_samples_on_whole_ticks_are_quantised_at_the_tick() -> None:
    step = quantised_step_ms(ticked())
    assert step is not None
    assert abs(step - 8.0) < 0.01


def test_an_odd_sample_below_the_tick_does_not_hide_it() -> None:
    assert quantised_step_ms([*ticked(), CALL_MS + 1.3]) is not None


def test_an_idle_hosts_samples_are_not_quantised() -> None:
    assert quantised_step_ms([CALL_MS * (1 + 0.002 * (i % 7)) for i in range(40)]) is None


def test_a_few_preempted_samples_are_not_quantised() -> None:
    assert quantised_step_ms(ticked(ticks=(0,) * 9 + (1,))) is None  # one in ten: the median stands


def test_a_long_call_with_continuous_noise_is_not_quantised() -> None:
    assert quantised_step_ms([20.0 + 0.37 * i for i in range(40)]) is None  # never twice the fastest


def test_stalls_off_any_lattice_are_not_quantised() -> None:
    stalls = [CALL_MS if i % 2 else CALL_MS + 1.0 + 0.61 * i for i in range(40)]
    assert quantised_step_ms(stalls) is None


def test_no_samples_are_not_quantised() -> None:
    assert quantised_step_ms([]) is None


def test_load_above_the_cores_is_overloaded_and_the_heaviest_reading_named() -> None:
    assert overloaded([HostLoad(2.0, 2), HostLoad(5.2, 2)]) == HostLoad(5.2, 2)
    assert overloaded([None, HostLoad(3.1, 2)]) == HostLoad(3.1, 2)


def test_load_within_the_cores_or_unknown_is_not_overloaded() -> None:
    assert overloaded([HostLoad(2.9, 2), HostLoad(11.0, 8)]) is None
    assert overloaded([None, None]) is None


def test_the_note_names_each_signal_that_fired() -> None:
    note = contention_note(ticked(), [HostLoad(1.0, 2), HostLoad(5.2, 2)])
    assert note == f"{CONTENDED}: load 5.2 on 2 cores; samples quantised at 8.0 ms"
    assert contention_note(ticked(), [None]) == f"{CONTENDED}: samples quantised at 8.0 ms"
    assert contention_note([1.0] * 20, [HostLoad(4.0, 1)]) == f"{CONTENDED}: load 4.0 on 1 cores"


def test_an_idle_host_has_no_note() -> None:
    assert contention_note([1.0] * 20, [HostLoad(0.3, 2), HostLoad(0.4, 2)]) is None


def fake_clock(durations_ms: list[float]) -> Callable[[], int]:
    """A nanosecond clock whose every second reading is the next duration after the one before."""
    def ticks() -> Iterator[int]:
        now, turn = 0, 0
        while True:
            yield now
            now += round(1e6 * durations_ms[turn % len(durations_ms)])
            turn += 1
            yield now

    readings = ticks()
    return lambda: next(readings)


def test_the_host_timer_notes_a_contended_host() -> None:
    timer = HostTimer(clock_ns=fake_clock(ticked(n=10)), load=lambda: HostLoad(0.2, 2))
    m = timer.measure(lambda: None, SamplingPlan(min_samples=10, max_samples=40, budget_s=0.01))
    assert f"{CONTENDED}: samples quantised at 8.0 ms" in m.notes


def test_the_host_timer_adds_no_note_on_an_idle_host() -> None:
    timer = HostTimer(clock_ns=fake_clock([CALL_MS]), load=lambda: HostLoad(0.2, 2))
    m = timer.measure(lambda: None, SamplingPlan(min_samples=10, max_samples=40, budget_s=0.01))
    assert not any(note.startswith(CONTENDED) for note in m.notes)


def test_the_host_timer_reads_the_load_before_and_after_sampling() -> None:
    readings = iter([HostLoad(0.5, 2), HostLoad(6.0, 2)])
    timer = HostTimer(clock_ns=fake_clock([CALL_MS]), load=lambda: next(readings))
    m = timer.measure(lambda: None, SamplingPlan(min_samples=10, max_samples=40, budget_s=0.01))
    assert f"{CONTENDED}: load 6.0 on 2 cores" in m.notes
