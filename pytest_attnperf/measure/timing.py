"""Timing on the device.

``CudaTimer``: warm-up, then CUDA graphs with event nodes around each call (cold mode: an L2
flush first; hot mode: back-to-back calls), with the eager per-call time beside it; events around
eager launches where a graph cannot be captured. ``HostTimer``: a host clock around each call on
the CPU. Both sample adaptively (``sample_adaptively``) with the garbage collector held off, and
release every graph they captured (``_release_graphs``).

docs/measurement.md says how and why (cold and hot modes, clocks, when sampling stops).
"""

from __future__ import annotations

import math
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Protocol

from pytest_attnperf.measure import child as child_run
from pytest_attnperf.measure import inventory
from pytest_attnperf.measure.hot import Varied, hot_graph
from pytest_attnperf.measure.nvml import cool_down, read_sm_clock, read_violation_ns, violation_note
from pytest_attnperf.measure.sampling import (
    REPLAY_CLOCK,
    HostTimer,
    Measurement,
    ReplayClock,
    SamplingPlan,
    Timer,
    gc_paused,
    sample_adaptively,
    warm_up,
)
from pytest_attnperf.measure.verify import Replays, TimedDiffers

__all__ = [
    "REPLAY_CLOCK",
    "CudaTimer",
    "Device",
    "HostTimer",
    "Measurement",
    "ReplayClock",
    "SamplingPlan",
    "Timer",
    "gc_paused",
    "hot_graph",
    "interrupt_held",
    "one_element_add",
    "sample_adaptively",
]


SPIN_CYCLES = 200_000  # about 100 us at the H200's 1980 MHz boost clock

def one_element_add() -> Callable[[], Any]:
    """The least work a CUDA case can be: adding 1 to a one-element tensor on the current device
    (the run's sample overhead, and what the noise benchmark's injected work is set after to time
    its own least cost)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    one = torch.zeros(1, device="cuda")
    return lambda: one.add_(1)


class Device(Protocol):
    """What the timers read of the device (``hw.table.DetectedDevice`` has it)."""

    @property
    def is_gpu(self) -> bool:
        """Whether it is a CUDA GPU."""

    @property
    def l2_bytes(self) -> int | None:
        """Its L2 cache's size, where known."""


class CudaTimer:
    """Device events around CUDA-graph replays, L2 flushed per sample in cold mode."""

    kernels_of: inventory.Profile = staticmethod(inventory.device_kernels)  # the profiler, for the inventory

    def __init__(self, device: Device) -> None:
        self.device = device
        self._flush: Any = None
        self._harness: inventory.Harness | None = None  # what the harness launches in a replay (measured once)

    def _flush_buffer(self) -> Any:
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

        if self._flush is None:
            l2 = self.device.l2_bytes or 64 * 1024 * 1024
            self._flush = torch.empty(2 * l2, dtype=torch.int8, device="cuda")
        return self._flush

    def measure(self, fn: Callable[[], Any], plan: SamplingPlan) -> Measurement:
        """Time ``fn`` on the device as ``plan`` says; the graphs captured for it are released after."""
        global _captured
        outer, _captured = _captured, []
        replays = Replays(fn)
        try:
            return self._measure(replays, plan)
        finally:
            made, _captured = _captured, outer
            replays.release()  # the graphs' outputs first, so their pools can go back with the graphs
            _release_graphs(made)

    def _measure(self, replays: Replays, plan: SamplingPlan) -> Measurement:
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up
        cuda: Any = torch.cuda  # torch.cuda's Stream, Event and _sleep are unannotated

        notes: list[str] = []
        fn = replays.call(1)  # the first timed draw: warm-up, eager time, peak memory, the first graph
        side = cuda.Stream()
        side.wait_stream(cuda.current_stream())
        with cuda.stream(side):  # warm-up off the default stream, as graph capture wants
            warm_up(fn, plan)
        cuda.current_stream().wait_stream(side)
        cuda.synchronize()

        eager_ms = self._eager_ms(fn, budget_s=plan.budget_s)
        replays.check(1, "an eager call as timed for eager_ms", fn)
        peak_mib = self._peak_mib(fn)
        take_ms, clock, calls = self._sampler(replays, plan, notes)
        rounds_of = getattr(take_ms, "graphs", 1)
        index = cuda.current_device()

        def watched() -> tuple[list[float], str | None]:
            """Samples, and a note when NVML's violation counters grew while they were taken
            (this also catches a throttle that has lifted by the time the clock is read)."""
            before, started = read_violation_ns(index), time.monotonic()
            with gc_paused():
                taken = sample_adaptively(take_ms, plan, rounds_of)
            elapsed = time.monotonic() - started  # before the second NVML read
            return taken, violation_note(before, read_violation_ns(index), elapsed)

        samples, held = watched()
        mhz, throttled = read_sm_clock(index)
        if mhz is None:
            notes.append("SM clock not read (no NVML: pip install nvidia-ml-py); throttling not checked")
        if throttled:
            idled = cool_down(index)
            notes.append(f"clock throttled ({', '.join(throttled)}) at {mhz} MHz; re-measured after {idled}")
            samples, held = watched()
            mhz, throttled = read_sm_clock(index)
            if throttled:
                notes.append(f"still throttled ({', '.join(throttled)}) after re-measuring")
        notes.extend([held] if held else [])
        take_ms.verify(replays)
        notes.extend(replays.notes(plan.overhead))
        kernels = self._inventory(take_ms, replays, notes, plan.checked_kernels) \
            if plan.inventory and not plan.overhead else None

        return Measurement(
            tuple(samples),
            clock=clock,
            mode=plan.mode,
            calls_per_sample=calls,
            eager_ms=eager_ms,
            peak_mib=peak_mib,
            notes=tuple(notes),
            sm_clock_mhz=mhz,
            graphs=rounds_of,
            verified=replays.verified,
            bitwise=replays.bitwise,
            bitwise_diff=replays.bitwise_diff,
            verify_s=replays.seconds,
            kernels=kernels.kernels if kernels else None,
            kernels_source=kernels.source if kernels else None,
            inventory_s=kernels.seconds if kernels else 0.0,
            kernels_vs_eager=kernels.vs_eager if kernels else None,
        )

    def _inventory(self, sampler: Sampler, replays: Replays, notes: list[str],
                   checked: tuple[str, ...] | None = None) -> inventory.Inventory | None:
        """The kernels one timed call launched: one replay of the graph the first timed draw was
        sampled on, profiled, less what the harness launches itself (``inventory.take``); the
        harness's part is measured on this timer's first case, and its seconds are the case's. A
        profile that fails (another profiler running, say) leaves the case without an inventory,
        and a note says why. Then compared with the eager checked call's kernels, ``checked`` (the
        backend proof's) or one call profiled (``inventory.against_checked``)."""
        began = time.perf_counter()
        _, _, again = sampler.timed[0]
        others = [replay for _, _, replay in sampler.timed[1:]] if sampler.graphed else []
        try:
            if self._harness is None:
                self._harness = self._harness_kernels()
            taken = inventory.take(self.kernels_of, self._harness, again if sampler.graphed else None,
                                   replays.call(1), holds_flush=sampler.holds_flush, calls=sampler.calls_per_replay,
                                   others=others, besides=sampler.harness_replay)
        except Exception as exc:  # noqa: BLE001 - the inventory is a report; its failure is not the case's
            notes.append(f"kernel inventory not read ({type(exc).__name__}: {str(exc)[:120]})")
            return None
        if taken.disagrees:  # one graph of the case does other work than another: not what was checked
            raise TimedDiffers(taken.disagrees)
        notes.extend([taken.note] if taken.note else [])
        vs_eager = inventory.against_checked(self.kernels_of, taken, checked, replays.fn, notes)
        return replace(taken, seconds=time.perf_counter() - began, vs_eager=vs_eager)

    def _harness_kernels(self) -> inventory.Harness:
        """The raw names a replay of a graph holding only the L2 flush launches, and the flush's
        own (``inventory.Harness``); the graph is released with the measurement."""
        flush = self._flush_buffer()
        graph, _ = _capture(flush.zero_, 1)
        replayed = Counter(self.kernels_of(graph.replay)) if graph is not None else Counter()
        return inventory.Harness(replayed, Counter(self.kernels_of(flush.zero_)))

    def _sampler(
        self, replays: Replays, plan: SamplingPlan, notes: list[str],
    ) -> tuple[Sampler, str, int]:
        """``(take one sample in ms per call, clock name, calls per sample)`` for ``plan``'s
        mode, the graph captured here; why a better clock could not be used goes to ``notes``.

        The clocks are never compared with one another by the gate ("clock changed"): events
        inside a graph leave out its launch (``cuda-graph-nodes``); events around the replay of
        a one-call graph hold it (``cuda-graph``); replays of a one-call graph leave launch gaps
        that a graph of many calls does not (``cuda-graph-replays``); eager launches hold the
        host's overhead too (``cuda-events``)."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up
        cuda: Any = torch.cuda  # torch.cuda's Stream, Event and _sleep are unannotated

        fn = replays.call(1)
        flush = self._flush_buffer() if plan.mode == "cold" else None
        if flush is not None:
            nodes, failure = _capture_cold(replays.call, flush, plan.cold_graphs, capture_s=plan.budget_s / 2,
                                           vary_for=replays.vary)
            if nodes is not None:
                if nodes.failure is not None:
                    notes.append(f"{nodes.graphs} of {plan.cold_graphs} cold graphs usable ({nodes.failure}); "
                                 "samples from those")
                return nodes, "cuda-graph-nodes", 1
        # a callable that cannot be captured has failed one capture already (the cold one):
        # this second attempt tells "the events cannot be in a graph" from "the call cannot"
        graph, capture_failure = _capture(fn, 1)
        if flush is not None and graph is not None:  # the call captures; the events did not
            notes.append(f"no timing events inside the graph ({failure}); events around the replay "
                         "instead, the graph's launch included")
        calls, replays_per = 1, 1  # calls per sample; replays of the graph per sample
        copies_ms, copies, varied = 0.0, None, None  # hot mode's varying: per call, its graph alone, the object
        if graph is not None and plan.mode == "hot":
            # calls per graph from the device time of one replay, not the eager (host) time
            one_call, kept = graph, replays.results.get(1)
            varied = Varied.of(replays.hot_input(1))
            graph, calls, replays_per, note = hot_graph(fn, graph, _time_replay(graph.replay), plan.hot_sample_ms,
                                                        _capture, varied)
            if graph is one_call and kept is not None:  # a failed longer capture's outputs are not the graph's
                replays.results[1] = kept
            notes.extend([note] if note else [])
            if varied is not None and replays_per == 1 and calls > 1:
                copies, why = _capture(varied.around(_nothing, calls), 1)
                read = (f"each of a hot sample's {calls} calls read contents no other call of the sample read"
                        if varied.distinct(calls) >= calls else
                        f"a hot sample's {calls} calls read {varied.distinct(calls)} distinct contents")
                if copies is not None:
                    copies_ms = _time_replay(copies.replay) / calls
                cost = (f"the copies alone, {copies_ms * 1e3:.2f} us a call, subtracted" if copies is not None else
                        f"the copies' own graph failed ({why}), so their time is in the samples")
                notes.append(f"{read} ({varied.width} elements of {varied.name} overwritten before each; {cost})")
            elif replays_per == 1 and calls > 1:
                notes.append(f"a hot sample's {calls} calls read the same contents (the callable gives no input "
                             "to vary between them)")
        if capture_failure:
            notes.append(f"not graph-capturable ({capture_failure}); timed with events around eager "
                         "launches, launch overhead included")

        run: Callable[[], Any]
        if graph is None:
            eager = replays.bare(1)  # nothing of the harness between the events
            run = lambda: [eager() for _ in range(calls)]  # noqa: E731
        else:
            run = graph.replay if replays_per == 1 else (lambda: [graph.replay() for _ in range(replays_per)])
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        spin = getattr(cuda, "_sleep", None)
        vary = replays.vary(1)

        def take_ms() -> float:
            vary()  # before the flush, the spin and the first event: outside the sample
            if flush is not None:
                flush.zero_()
            if spin is not None:
                spin(SPIN_CYCLES)  # keeps the GPU busy while the host enqueues the replay
            start.record()
            run()
            end.record()
            end.synchronize()
            ms: float = start.elapsed_time(end) / calls - copies_ms
            return ms

        clock = "cuda-events" if graph is None else "cuda-graph" if replays_per == 1 else "cuda-graph-replays"
        where = "an eager call as timed" if graph is None else f"the {plan.mode} graph"
        sampler = Sampler([take_ms], [(1, where, graph.replay if graph is not None else fn)])
        sampler.graphed, sampler.calls_per_replay = graph is not None, calls // replays_per
        sampler.keeps_results = graph is not None  # eager calls timed bare: their results are not kept
        sampler.harness_replay = copies.replay if copies is not None else None
        sampler.keeps = varied  # the graphs read its tables and write its saved elements: alive while they are
        return sampler, clock, calls

    @staticmethod
    def _eager_ms(fn: Callable[[], Any], calls: int = 10, budget_s: float = 0.5) -> float:
        """Median of events around single eager calls, launched back to back: ``calls`` of
        them, or at least 3 once the host has spent ``budget_s`` launching (a slow, host-bound
        callable, such as a Python loop over tokens, need not run ten times)."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up
        cuda: Any = torch.cuda  # torch.cuda's Stream, Event and _sleep are unannotated

        events = [cuda.Event(enable_timing=True) for _ in range(calls + 1)]
        cuda.synchronize()
        with gc_paused():
            deadline = time.monotonic() + budget_s
            events[0].record()
            made = 0
            while made < calls:
                fn()
                made += 1
                events[made].record()
                if made >= 3 and time.monotonic() >= deadline:
                    break
            cuda.synchronize()
        ms: float = statistics.median(events[i].elapsed_time(events[i + 1]) for i in range(made))
        return ms

    @staticmethod
    def _peak_mib(fn: Callable[[], Any]) -> float:
        """The peak memory above the inputs of one eager call, outside any graph capture, in MiB:
        the caching allocator's high-water mark during the call (``max_memory_allocated``, after
        ``reset_peak_memory_stats``) less what was allocated before it. What was allocated before
        is the inputs, the flush buffer, the draw's previous result (the harness keeps it until
        the call returns) and what warm-up left (autotuning, cuBLAS's workspace); what is left is
        the call's outputs and its workspace, the figure the memory gate judges (docs/memory.md).
        Memory a library allocates outside torch's allocator is not seen."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        result = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        del result
        return peak / 2**20


class Sampler:
    """Takes one sample (ms per call) per call, going round its graphs in turn (``graphs`` of
    them: cold mode's captures, or one), and knows what each one timed: ``(timed draw, where,
    the graph's replay or, timed eagerly, the call)``, to verify them after sampling."""

    def __init__(self, takes: list[Callable[[], float]], timed: list[tuple[int, str, Callable[[], Any]]],
                 failure: str | None = None, holds_flush: bool = False) -> None:
        self.takes, self.timed, self.failure, self.next = takes, timed, failure, 0
        # for the kernel inventory: whether the timed ones are graph replays, each replay's calls, and
        # whether a replay holds the L2 flush (cold mode's graphs)
        self.graphed, self.calls_per_replay, self.holds_flush = True, 1, holds_flush
        # whether the draws' recorded results are what the last samples wrote (a graph's outputs)
        self.keeps_results = True
        # a replay of what the harness put into the timed graph besides the calls (hot mode's
        # varying), for the inventory to leave out
        self.harness_replay: Callable[[], Any] | None = None
        self.keeps: Any = None  # what the graphs read or write besides the draws (hot mode's Varied)

    @property
    def graphs(self) -> int:
        return len(self.takes)

    def __call__(self) -> float:
        take = self.takes[self.next]
        self.next = (self.next + 1) % len(self.takes)
        return take()

    def verify(self, replays: Replays) -> None:
        """The last sample's result checked as its replay wrote it, on the contents it read;
        then each timed draw's result checked after one more replay (or call) over NaN, then one
        more replay (or call) of the first compared bit for bit (``verify.Replays``)."""
        if self.keeps_results:
            index, where, _ = self.timed[(self.next - 1) % len(self.takes)]
            replays.check_last(index, where)
        for index, where, again in self.timed:
            replays.check(index, where, again)
        index, _, again = self.timed[0]
        replays.compare(index, again)


def _capture_cold(
    call_for: Callable[[int], Callable[[], Any]], flush: Any, graphs: int = 1, capture_s: float = math.inf,
    vary_for: Callable[[int], Callable[[], None]] | None = None,
) -> tuple[Sampler | None, str | None]:
    """Cold mode's sampler: a graph of an L2 flush, a timing event, one call and a second
    event, the events recorded as nodes of the graph (``torch.cuda.Event(external=True)``), so
    a sample is the call alone: the replay's launch and the flush come before the first event.
    Returns ``(take one sample in ms, None)``, or ``(None, why)`` when this torch has no such
    events, the capture fails, or the events of a first replay cannot be read.

    ``graphs`` such graphs are captured (the later ones in the first one's memory pool: they
    are replayed one at a time, never together), graph ``i`` over timed draw ``i + 1``
    (``call_for(i + 1)``: its own inputs, so no graph can return another's answer), and the
    sampler goes round them, one sample each in turn. Each capture of the same call has its own
    median, further apart for a short kernel than one graph's samples over the same time (docs/evidence.md,
    "--attnperf-cold-graphs 8"). A run of one graph draws one of those medians; the median over
    ``graphs`` captures averages that part. What remains moves only from one process to the
    next, which a run averages only by timing the case in more processes
    (``--attnperf-processes``, pool.py). No graph is begun once ``capture_s`` seconds have
    gone on capturing: a host-bound call (fla's naive recurrences, a Python loop over tokens) is
    captured once, and its long kernels did not move between processes anyway. When a later
    capture fails (memory, say) the graphs captured so far are kept; ``.failure`` says why.
    Before each replay, ``vary_for(i + 1)`` (``Replays.vary``) gives graph ``i``'s inputs contents
    no replay has read: its kernels run on the stream before the replay's flush and first
    event, outside the sample."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up
    cuda: Any = torch.cuda  # torch.cuda's Stream, Event and _sleep are unannotated

    takes: list[Callable[[], float]] = []
    timed: list[tuple[int, str, Callable[[], Any]]] = []
    pool: Any = None
    deadline = time.monotonic() + capture_s
    while len(takes) < max(1, graphs) and (not takes or time.monotonic() < deadline):
        try:
            start, end = (cuda.Event(enable_timing=True, external=True) for _ in range(2))
        except TypeError:
            return None, f"torch {torch.__version__} has no external CUDA events (torch.cuda.Event(external=True))"
        index = len(takes) + 1
        taken, replay, pool, failure = _one_cold_graph(call_for(index), flush, start, end, pool,
                                                       vary_for(index) if vary_for is not None else None)
        if taken is None or replay is None:
            if not takes:
                return None, failure
            return _named(Sampler(takes, timed, failure, holds_flush=True)), None
        takes.append(taken)
        timed.append((index, "cold graph", replay))
    return _named(Sampler(takes, timed, None, holds_flush=True)), None


def _named(sampler: Sampler) -> Sampler:
    """The cold graphs named for messages: "cold graph 3 of 8"."""
    sampler.timed = [(index, f"cold graph {index} of {sampler.graphs}", replay)
                     for index, _, replay in sampler.timed]
    return sampler


def _one_cold_graph(
    fn: Callable[[], Any], flush: Any, start: Any, end: Any, pool: Any, vary: Callable[[], None] | None = None,
) -> tuple[Callable[[], float] | None, Callable[[], Any] | None, Any, str | None]:
    """One cold graph, in ``pool`` when given: ``(take one sample, its replay, its pool, None)``
    or ``(None, None, pool, why)``; a sample calls ``vary`` before the replay."""
    before = vary or _nothing

    def body() -> None:
        flush.zero_()
        start.record()
        fn()
        end.record()

    graph, failure = _capture(body, 1, pool=pool)
    if graph is None:
        return None, None, pool, failure

    def replayed_ms() -> float:
        graph.replay()
        end.synchronize()
        ms: float = start.elapsed_time(end)
        return ms

    def take_ms() -> float:
        before()  # before the graph's flush and its first event: outside the sample
        return replayed_ms()

    try:
        replayed_ms()
    except Exception as exc:  # noqa: BLE001 - events a graph recorded but torch cannot read: use another clock
        return None, None, pool, f"{type(exc).__name__}: {str(exc)[:120]}"
    return take_ms, graph.replay, graph.pool() if pool is None else pool, None


def _nothing() -> None:
    """No contents to vary before a replay."""


_captured: list[Any] | None = None  # the graphs of the measurement under way (CudaTimer.measure)


def _release_graphs(graphs: list[Any]) -> None:
    """Reset each graph (``CUDAGraph.reset``): its memory pool is given back to the caching
    allocator now, even where a reference to the graph outlives the measurement (after the
    device has finished with them: a measurement stopped mid-replay leaves one in flight)."""
    if graphs:
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

        torch.cuda.synchronize()
    for graph in graphs:
        reset = getattr(graph, "reset", None)
        if reset is not None:
            reset()
    graphs.clear()


@contextmanager
def interrupt_held() -> Iterator[None]:
    """Ctrl-C (SIGINT, also ``timeout -s INT``) held while the block runs and delivered to its
    handler when the block ends. A graph capture must end before an interrupt raises: raised
    inside the capture, it leaves the stream capturing, and the run can die there without its
    failures, its JUnit file or its baseline write. A second SIGINT while one is held is
    delivered at once (a capture stuck in Python code can still be stopped), unless it came
    within ``child_run.ECHO_S`` of the first: ``timeout`` signals the command and then its
    group, so one interrupt can arrive twice. Only the main thread handles signals; elsewhere,
    or with SIGINT ignored or not Python's, nothing is held. The case's time limit (SIGALRM) is
    not held: its watchdog must still see a stuck capture."""
    handler = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or handler in (signal.SIG_IGN, signal.SIG_DFL, None):
        yield
        return
    held: list[float] = []  # when the first one came

    def hold(signum: int, frame: Any) -> None:
        if not held:
            held.append(time.monotonic())
        elif time.monotonic() - held[0] >= child_run.ECHO_S:  # pressed again: let it through now
            signal.signal(signal.SIGINT, handler)
            signal.raise_signal(signal.SIGINT)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        restored = signal.getsignal(signal.SIGINT) is handler
        signal.signal(signal.SIGINT, handler)
        if held and not restored:
            signal.raise_signal(signal.SIGINT)


def _capture(fn: Callable[[], Any], calls: int, pool: Any = None) -> tuple[Any, str | None]:
    """A CUDA graph of ``calls`` back-to-back calls, or (None, why) when capture fails;
    in memory pool ``pool`` when given (another graph's ``.pool()``). Inside
    ``CudaTimer.measure``, the graph is reset when the measurement ends.

    An interrupt arriving during the capture is held until the capture has ended and the
    graph is registered for release (``interrupt_held``). A failed capture can leave the
    capture stream current (torch leaves its stream context only after ending the capture,
    which is what raised): the previous stream is restored, also when the case is stopped
    mid-capture (its time limit, or a second interrupt)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    previous = torch.cuda.current_stream()
    graph = torch.cuda.CUDAGraph()
    with interrupt_held():
        try:
            with torch.cuda.graph(graph, pool=pool):
                for _ in range(calls):
                    fn()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - any capture failure means: time eagerly
            torch.cuda.set_stream(previous)
            torch.cuda.synchronize()
            return None, f"{type(exc).__name__}: {str(exc)[:120]}"
        except BaseException:
            torch.cuda.set_stream(previous)
            raise
        if _captured is not None:
            _captured.append(graph)
    return graph, None


def _time_replay(replay: Callable[[], Any]) -> float:
    """Device ms of one replay (median of 5), launch latency kept out by a spin kernel."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up
    cuda: Any = torch.cuda  # torch.cuda's Stream, Event and _sleep are unannotated

    spin = getattr(cuda, "_sleep", None)
    start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
    times: list[float] = []
    for _ in range(5):
        if spin is not None:
            spin(SPIN_CYCLES)
        start.record()
        replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def default_timer(device: Device) -> Timer:
    return CudaTimer(device) if device.is_gpu else HostTimer()
