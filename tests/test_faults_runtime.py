"""One bad kernel costs only its own case: memory, global state, time and the garbage collector.

Each fault is injected into one case, and every case after it must pass: an out-of-memory
error, a kernel that leaves torch's grad mode off, a kernel that hangs, references a finished
case would otherwise keep alive, and a collection landing inside the timed calls. The last test
runs them all through the real softmax suite in one run and counts: each fault costs exactly
one case.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import kit
import pytest
import torch

from pytest_attnperf.measure import child as child_run
from pytest_attnperf.measure import isolation, switches, timing
from pytest_attnperf.measure.timing import CudaTimer, HostTimer, SamplingPlan
from pytest_attnperf.plugins import guard

PLUGIN = (*kit.PLUGIN, "-p", "no:cacheprovider", "--attnperf-ceilings=off")

OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
    "1.25 GiB is free. Including non-PyTorch memory, this process has 138.55 GiB memory in use. Of the "
    "allocated memory 130.20 GiB is allocated by PyTorch, and 6.10 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)

# A fake CPU run whose timer calls the callable once (so its faults show) and, like a capture,
# builds a reference cycle around it that only the garbage collector frees.
CONFTEST = kit.conftest("cpu", samples=kit.steps(3)) + '''
import gc
import weakref

TRACKED = []  # weak references to what a case made: none may outlive it


class Graph:
    def __init__(self, fn):
        self.fn, self.me = fn, self  # a cycle, as torch's own objects can make


def pytest_configure(config):
    if os.environ.get("GC_OFF"):
        gc.disable()  # only an explicit collection frees a cycle


def pytest_unconfigure(config):
    gc.enable()


class TrackingTimer(ScriptedTimer):
    def measure(self, fn, plan):
        measured = super().measure(fn, plan)
        TRACKED.append(weakref.ref(Graph(fn)))
        return measured


def pytest_attnperf_make_timer(config, device):
    return TrackingTimer()
'''

COST = "from pytest_attnperf.costs import Cost\nCOST = Cost(flops=1e9, bytes=1e6)\n"


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return kit.make_project(pytester, CONFTEST, addopts="-p no:benchmark")


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    """Each test's outcome by its name (``-rA`` lines)."""
    return {nodeid.split("::")[-1]: outcome for nodeid, outcome in kit.outcomes(result).items()}


class FaultLedger:
    """Faults injected and the cases they cost: each must cost exactly its own."""

    def __init__(self) -> None:
        self.injected: dict[str, str] = {}  # case name -> fault

    def inject(self, case: str, fault: str) -> str:
        self.injected[case] = fault
        return case

    def check(self, result: pytest.RunResult, expected_cases: int) -> None:
        seen = outcomes(result)
        assert len(seen) == expected_cases, seen
        failed = {name for name, outcome in seen.items() if outcome != "PASSED"}
        assert failed == set(self.injected), (failed, self.injected)  # one case per fault, no other


# -- memory --------------------------------------------------------------------------------


def test_a_finished_case_keeps_nothing_alive(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the collector off, cycles around each case's callable and inputs are freed after the
    case anyway, also when the case failed (pytest keeps the last failure's frames for
    post-mortem use; their locals are dropped)."""
    monkeypatch.setenv("GC_OFF", "1")
    project.makepyfile(test_refs=COST + '''
import weakref

import pytest

import conftest


class Inputs:
    """Stands for a case's tensors."""


def make_kernel():
    inputs = Inputs()

    def kernel():
        return inputs

    inputs.kernel = kernel  # a cycle: freed only by a collection
    conftest.TRACKED.append(weakref.ref(inputs))
    return kernel


@pytest.mark.parametrize("i", range(3))
def test_case(i, attnperf):
    kernel = make_kernel()
    attnperf.measure(kernel, cost=COST, dtype="fp32")
    assert i != 1, "fails after timing, its frames holding the kernel and its inputs"


@pytest.fixture
def broken_inputs(attnperf):
    kernel = make_kernel()
    raise RuntimeError("setup fails, its frame holding the inputs")


def test_setup_fails(broken_inputs):
    pass


def test_after():
    assert len(conftest.TRACKED) == 7  # 4 inputs, 3 graphs
    alive = [ref() for ref in conftest.TRACKED if ref() is not None]
    assert not alive
''')
    result = project.runpytest(*PLUGIN, "-rA")
    ledger = FaultLedger()
    ledger.inject("test_case[1]", "fails after timing")
    ledger.inject("test_setup_fails", "a fixture fails holding the inputs")
    ledger.check(result, expected_cases=5)
    assert gc.isenabled()


@pytest.mark.parametrize("start", ["nothing frozen", "the interpreter's own frozen"])
def test_what_a_case_imports_for_the_run_is_frozen_after_its_garbage_is_collected(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, start: str) -> None:
    """A run in a process of its own, as a user's is: it freezes what is alive after its collection,
    and a case that leaves 25,000 objects alive for the run (as an import does) and a reference
    cycle of its own has the cycle freed and the objects frozen after it, so later collections skip
    them. The same where the process started with objects of the interpreter's frozen (CPython 3.12:
    375 on 3.12.1; the objects frozen now stand for them): they are no host's."""
    project.makepyfile(test_kept=COST + '''
import gc
import weakref

import conftest

KEPT = []


class Inputs:
    """Stands for a case's tensors."""


def test_a_imports(attnperf):
    KEPT.append(gc.get_freeze_count())
    KEPT.extend(Inputs() for _ in range(25_000))  # objects the collector tracks
    inputs = Inputs()
    inputs.me = inputs  # a cycle: freed only by a collection
    conftest.TRACKED.append(weakref.ref(inputs))
    attnperf.measure(lambda: None, cost=COST, dtype="fp32")


def test_b_after():
    assert conftest.TRACKED and conftest.TRACKED[-1]() is None
    tracked = {id(obj) for obj in gc.get_objects()}
    assert id(conftest.TRACKED) not in tracked  # alive after collection: frozen
    assert id(KEPT[1]) not in tracked and id(KEPT[-1]) not in tracked  # frozen after the case: no longer walked
    assert gc.get_freeze_count() >= KEPT[0] + 25_000
''')
    monkeypatch.setattr(guard.OwnerFreeze, "froze", False)  # a process of its own: no owner seen freezing yet
    if start == "nothing frozen":
        gc.unfreeze()  # tests/conftest.py froze this process's torch and fla
    else:
        monkeypatch.setattr(guard, "INTERPRETER_FROZEN", gc.get_freeze_count())
    try:
        result = project.runpytest(*PLUGIN, "-rA")
        FaultLedger().check(result, expected_cases=2)
        assert gc.get_freeze_count() == 0  # the run's end unfroze what it froze (the process's start's too)
    finally:
        gc.collect()
        gc.freeze()


def test_objects_its_host_froze_stay_frozen_and_the_run_freezes_none_of_its_own(project: pytest.Pytester) -> None:
    """A run inside a process that froze its own objects before it (this test process freezes
    torch and fla once they are loaded): the run neither unfreezes them at its end nor freezes
    its own with them; its cases' garbage is still collected after each case."""
    project.makepyfile(test_host=COST + '''
import gc
import weakref

import conftest

FROZEN = []


class Inputs:
    """Stands for a case's tensors."""


def test_a_case(attnperf):
    FROZEN.append(gc.get_freeze_count())
    inputs = Inputs()
    inputs.me = inputs  # a cycle: freed only by a collection
    conftest.TRACKED.append(weakref.ref(inputs))
    attnperf.measure(lambda: None, cost=COST, dtype="fp32")


def test_b_after():
    assert conftest.TRACKED and conftest.TRACKED[-1]() is None
    assert gc.get_freeze_count() <= FROZEN[0]  # nothing of the run's own frozen (frozen objects may be freed)
''')
    frozen = gc.get_freeze_count()
    assert frozen > 0
    result = project.runpytest(*PLUGIN, "-rA")
    FaultLedger().check(result, expected_cases=2)
    assert frozen // 2 < gc.get_freeze_count() <= frozen  # the host's objects are still frozen


def test_out_of_memory_fails_its_case_with_the_size_and_the_next_cases_pass(project: pytest.Pytester) -> None:
    project.makepyfile(test_oom=COST + f'''
import weakref

import pytest
import torch

import conftest

OOM_TEXT = {OOM_TEXT!r}


class Intermediates:
    """What the kernel had allocated when it ran out."""


def test_a_oom_error(attnperf):
    held = Intermediates()
    conftest.TRACKED.append(weakref.ref(held))

    def kernel():
        _ = held
        raise torch.OutOfMemoryError(OOM_TEXT)

    attnperf.measure(kernel, cost=COST, dtype="fp32")


def test_b_oom_text_only(attnperf):
    def kernel():
        raise RuntimeError("CUDA error: out of memory")

    attnperf.measure(kernel, cost=COST, dtype="fp32")


@pytest.mark.parametrize("i", range(2))
def test_c_after(i, attnperf):
    assert conftest.TRACKED and conftest.TRACKED[0]() is None  # the failed case's objects were freed
    assert attnperf.measure(lambda: None, cost=COST, dtype="fp32").median_ms > 0
''')
    result = project.runpytest(*PLUGIN, "-rA")
    ledger = FaultLedger()
    ledger.inject("test_a_oom_error", "torch.OutOfMemoryError")
    ledger.inject("test_b_oom_text_only", "RuntimeError saying out of memory")
    ledger.check(result, expected_cases=4)
    out = result.stdout.str()
    assert "test_a_oom_error: out of memory: the case tried to allocate 4.00 GiB (OutOfMemoryError)." in out
    assert "at the time: GPU 0 has a total capacity of 139.81 GiB of which 1.25 GiB is free" in out
    assert "PYTORCH_CUDA_ALLOC_CONF" not in out.split("test_a_oom_error: out of memory")[1].split("raised at")[0]
    assert "after its memory was released: CUDA not initialized in this process; the run goes on." in out
    assert ("test_b_oom_text_only: out of memory: the case tried to allocate an amount torch's message does not give"
            in out)


def test_oom_parsing() -> None:
    assert isolation.oom_request(OOM_TEXT) == "4.00 GiB"
    assert isolation.oom_request("CUDA out of memory. Tried to allocate 512.00 MiB.") == "512.00 MiB"
    assert isolation.oom_request("CUDA error: out of memory") is None
    assert isolation.is_out_of_memory(torch.OutOfMemoryError("x"))
    assert isolation.is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not isolation.is_out_of_memory(RuntimeError("out of resource: shared memory"))

    def wrapped_oom() -> None:
        try:
            raise torch.OutOfMemoryError(OOM_TEXT)
        except torch.OutOfMemoryError as exc:
            raise ValueError("wrapped by a library") from exc

    with pytest.raises(ValueError, match="wrapped by a library") as wrapped:
        wrapped_oom()
    assert isolation.is_out_of_memory(wrapped.value)


# -- global state --------------------------------------------------------------------------


def test_a_leaked_global_fails_its_case_by_name_and_later_backward_cases_pass(project: pytest.Pytester) -> None:
    project.makepyfile(test_state=COST + '''
import pytest
import torch


def test_a_turns_grad_off(attnperf):
    torch.set_grad_enabled(False)
    attnperf.measure(lambda: None, cost=COST, dtype="fp32")


def test_b_sets_default_dtype_then_fails(attnperf):
    torch.set_default_dtype(torch.float64)
    assert False, "its own failure"


def backward():
    x = torch.ones(4, requires_grad=True)
    (x * 3).sum().backward()
    assert x.grad is not None and x.dtype == torch.float32


@pytest.mark.parametrize("i", range(2))
def test_c_forward_backward(i, attnperf):
    backward()
    attnperf.measure(backward, cost=COST, dtype="fp32")


@pytest.mark.attnperf_sdpa_backend("math")
def test_d_backend_pin_is_not_a_leak(attnperf):
    assert not torch.backends.cuda.flash_sdp_enabled()  # pinned inside the case
    q = torch.randn(1, 2, 8, 4)
    attnperf.measure(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), cost=COST, dtype="fp32")


def test_e_after():
    assert torch.is_grad_enabled() and torch.get_default_dtype() == torch.float32
    assert torch.backends.cuda.flash_sdp_enabled()
''')
    result = project.runpytest(*PLUGIN, "-rA")
    ledger = FaultLedger()
    ledger.inject("test_a_turns_grad_off", "torch.set_grad_enabled(False)")
    ledger.inject("test_b_sets_default_dtype_then_fails", "torch.set_default_dtype, then its own failure")
    ledger.check(result, expected_cases=6)
    result.stdout.fnmatch_lines([
        "*test_a_turns_grad_off: the case changed torch's global state, which would carry into every later "
        "case; set back now:",
        "*grad mode (torch.is_grad_enabled): True -> False",
    ])
    out = result.stdout.str()
    assert "its own failure" in out  # a failing case keeps its failure, the leak beside it
    assert "the case also changed torch's global state, set back now:" in out
    assert "default dtype (torch.get_default_dtype): torch.float32 -> torch.float64" in out
    assert "test_d_backend_pin_is_not_a_leak: the case changed" not in out


def test_the_global_generator_is_put_back_after_a_draw_silently_and_after_a_reseed_by_name() -> None:
    before = switches.snapshot_rng()
    seed = torch.initial_seed()
    torch.rand(3)  # a test making its inputs: put back, not reported
    assert switches.restore_rng(before) == ([], [])
    assert torch.equal(torch.get_rng_state(), before["CPU"][1])
    torch.manual_seed(123)
    torch.rand(3)
    assert switches.restore_rng(before) == (
        [("CPU generator's seed (torch.manual_seed; torch.initial_seed)", seed, 123)], [])
    assert torch.initial_seed() == seed
    assert torch.equal(torch.get_rng_state(), before["CPU"][1])
    assert switches.restore_rng(before) == ([], [])


# -- time ----------------------------------------------------------------------------------


HANGS = COST + '''
import time

import pytest


def test_a_hangs(attnperf):
    attnperf.measure(lambda: time.sleep(30), cost=COST, dtype="fp32")


@pytest.mark.parametrize("i", range(2))
def test_b_after(i, attnperf):
    attnperf.measure(lambda: None, cost=COST, dtype="fp32")
'''


def test_a_hanging_case_fails_at_the_limit_and_the_next_cases_pass(project: pytest.Pytester) -> None:
    project.makepyfile(test_hang=HANGS)
    started = time.monotonic()
    result = project.runpytest(*PLUGIN, "-rA", "--attnperf-case-timeout=1")
    assert time.monotonic() - started < 20
    ledger = FaultLedger()
    ledger.inject("test_a_hangs", "time.sleep(30)")
    ledger.check(result, expected_cases=3)
    result.stdout.fnmatch_lines([
        "*test_a_hangs: exceeded the case time limit of 1s (--attnperf-case-timeout)*; it was stuck at:",
        "*test_hang.py*in <lambda>*",
        "*time.sleep(30)*",
    ])


def test_pytest_timeout_owns_the_limit_when_set(project: pytest.Pytester) -> None:
    """A stand-in for pytest-timeout (a plugin named ``timeout`` with ``--timeout``): with its
    limit set, attnperf's is not armed and the slow case runs to its end."""
    project.makeconftest(CONFTEST + '''

class StandInTimeout:
    pass


def pytest_addoption(parser):
    parser.addoption("--timeout", default=None)


def pytest_configure(config):
    config.pluginmanager.register(StandInTimeout(), "timeout")
''')
    project.makepyfile(test_slow=COST + '''
import time


def test_slow(attnperf):
    attnperf.measure(lambda: time.sleep(1.5), cost=COST, dtype="fp32")
''')
    project.runpytest(*PLUGIN, "--attnperf-case-timeout=1", "--timeout=100").assert_outcomes(passed=1)
    project.runpytest(*PLUGIN, "--attnperf-case-timeout=1").assert_outcomes(failed=1)


def test_a_case_stuck_outside_python_ends_the_run_with_every_stack(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that swallows the time limit's exception stands in for one stuck in C: after the
    grace period the watchdog writes why, dumps every thread's stack and ends the process."""
    kit.pythonpath(monkeypatch)
    project.makeconftest(CONFTEST + "\nimport pytest_attnperf.measure.isolation\n"
                         "pytest_attnperf.measure.isolation.GRACE_S = 1.0\n")
    project.makepyfile(test_stuck=COST + '''
import time


def stuck():
    while True:
        try:
            time.sleep(60)
        except BaseException:
            pass


def test_stuck(attnperf):
    attnperf.measure(stuck, cost=COST, dtype="fp32")
''')
    started = time.monotonic()
    result = project.runpytest_subprocess(*PLUGIN, "--attnperf-case-timeout=1", timeout=120)
    assert time.monotonic() - started < 110
    assert result.ret == isolation.EXIT_STUCK
    err = result.stderr.str()
    assert "test_stuck.py::test_stuck exceeded the case time limit of 1s and has not returned to Python 1s later" in err
    assert "Current thread" in err
    assert "in stuck" in err


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "soon"])
def test_a_bad_time_limit_is_a_usage_error(project: pytest.Pytester, value: str) -> None:
    project.makepyfile(test_x="def test_x():\n    pass\n")
    result = project.runpytest(*PLUGIN, f"--attnperf-case-timeout={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*bad value '{value}' from --attnperf-case-timeout*"])


# -- the garbage collector in the timed region ---------------------------------------------


def gc_watcher(fail_on: int | None = None) -> tuple[Callable[[], None], list[bool]]:
    seen: list[bool] = []

    def call() -> None:
        seen.append(gc.isenabled())
        if fail_on is not None and len(seen) == fail_on:
            raise RuntimeError("the kernel failed mid-sampling")

    return call, seen


def test_host_timer_holds_the_collector_off_while_timing() -> None:
    plan = SamplingPlan(min_samples=5, max_samples=5, budget_s=0.01, warmup_calls=2)
    call, seen = gc_watcher()
    m = HostTimer().measure(call, plan)
    assert seen[:2] == [True, True]  # warm-up, untimed
    assert seen[2:7] == [False] * len(m.samples_ms)
    assert seen[7:] == []  # a callable returning no tensors: nothing to compare bit for bit, no more calls
    assert len(m.samples_ms) == 5
    assert gc.isenabled()
    failing, seen = gc_watcher(fail_on=4)
    with pytest.raises(RuntimeError, match="mid-sampling"):
        HostTimer().measure(failing, plan)
    assert seen[-1] is False
    assert gc.isenabled()


def test_gc_paused_leaves_a_collector_that_was_off_off() -> None:
    gc.disable()
    try:
        with timing.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- CudaTimer on fakes: the collector, and the graphs released --------------------------


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[kit.FakeGpu]:
    """A fake GPU whose graphs timing's own ``_capture`` makes (registered for release), its
    callables' eager figure timed on its events; the collector off while it is in use."""
    fake = kit.fake_cuda(monkeypatch, real_capture=True, eager_ms=None)
    gc.disable()
    try:
        yield fake
    finally:
        gc.enable()


@pytest.mark.parametrize("mode", ["cold", "hot"])
def test_cuda_timer_times_with_the_collector_off_and_releases_its_graphs(gpu: kit.FakeGpu, mode: str) -> None:
    seen: list[bool] = []

    def call() -> None:
        seen.append(gc.isenabled())
        gpu.call()

    plan = SamplingPlan(mode=mode, min_samples=10, budget_s=0.05, warmup_calls=2, hot_sample_ms=0.2)
    m = CudaTimer(kit.H200).measure(call, plan)
    assert m.median_ms == pytest.approx(0.02)
    assert m.clock in ("cuda-graph-nodes", "cuda-graph")
    assert m.eager_ms == pytest.approx(0.02)
    assert seen[:2] == [False, False]  # warm-up: the collector was left off by the fixture
    assert gpu.graphs
    assert gpu.resets == len(gpu.graphs)  # every graph reset
    assert all(ref() is None for ref in gpu.graphs)  # and none referenced once measured
    assert timing._captured is None


def test_cuda_timer_collector_is_off_in_the_timed_calls_only(gpu: kit.FakeGpu) -> None:
    gc.enable()  # the fixture turned it off; here it is on, as in a run
    seen: list[bool] = []
    timed: list[bool] = []

    def call() -> None:
        seen.append(gc.isenabled())
        gpu.call()

    def sampled(take_ms: Callable[[], float], plan: SamplingPlan, rounds_of: int = 1) -> list[float]:
        timed.append(gc.isenabled())
        return real_sample(take_ms, plan, rounds_of)

    real_sample = timing.sample_adaptively
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(timing, "sample_adaptively", sampled)
        CudaTimer(kit.H200).measure(call, SamplingPlan(min_samples=10, budget_s=0.05, warmup_calls=2))
    assert seen[:2] == [True, True]
    assert timed == [False]
    assert gc.isenabled()
    assert False in seen  # the eager calls timed by _eager_ms ran with it off


def test_cuda_timer_that_fails_mid_sampling_releases_its_graphs_and_the_collector(gpu: kit.FakeGpu) -> None:
    gc.enable()
    calls = [0]

    def call() -> None:
        calls[0] += 1
        gpu.call()
        if calls[0] == 40:
            raise RuntimeError("the kernel failed mid-sampling")

    with pytest.raises(RuntimeError, match="mid-sampling"):
        CudaTimer(kit.H200).measure(call, SamplingPlan(min_samples=200, max_samples=400, budget_s=0.05))
    assert gc.isenabled()
    assert timing._captured is None
    assert gpu.graphs
    assert gpu.resets == len(gpu.graphs)


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """SIGINT handled by Python (KeyboardInterrupt), whatever this process inherited (a run
    under nohup, or started in the background, ignores it), and put back after."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled on the main thread only")
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def test_an_interrupt_during_a_graph_capture_is_raised_once_the_capture_has_ended(
    gpu: kit.FakeGpu, python_sigint: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or `timeout -s INT`) while a graph is being captured: raised inside the capture,
    it would leave the stream capturing; held, it is raised after the capture ends, the graph is
    released with the measurement, and the run stops as an interrupted run does."""
    events: list[str] = []

    @contextlib.contextmanager
    def graph(g: Any, pool: Any = None) -> Iterator[None]:
        events.append("capture begins")
        try:
            yield
        finally:
            events.append("capture ends")

    monkeypatch.setattr(torch.cuda, "graph", graph)

    def call() -> None:
        gpu.call()
        if events and events[-1] == "capture begins":
            signal.raise_signal(signal.SIGINT)
            events.append("call after the interrupt")

    with pytest.raises(KeyboardInterrupt):
        CudaTimer(kit.H200).measure(call, SamplingPlan(min_samples=10, budget_s=0.05, warmup_calls=2))
    assert events[:3] == ["capture begins", "call after the interrupt", "capture ends"]
    assert len(events) == 3  # raised there: no second capture
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert gpu.graphs
    assert gpu.resets == len(gpu.graphs)


def test_a_second_interrupt_during_a_held_one_goes_through_at_once(
    python_sigint: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture stuck in Python code can still be stopped: the second Ctrl-C raises inside.
    The same interrupt arriving twice at once (`timeout` signals the command, then its group) is
    still held until the block ends."""
    reached: list[str] = []
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012 - the held block is under test; `reached` says how far it ran
        with timing.interrupt_held():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)  # the echo
            reached.append("held")
    assert reached == ["held"]
    monkeypatch.setattr(child_run, "ECHO_S", 0.0)  # every later one is pressed again
    reached.clear()
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012 - the held block is under test; `reached` says how far it ran
        with timing.interrupt_held():
            signal.raise_signal(signal.SIGINT)
            reached.append("held")
            signal.raise_signal(signal.SIGINT)
            reached.append("not reached")
    assert reached == ["held"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with timing.interrupt_held():
        pass  # nothing held, nothing delivered

# -- all of it through the real suite, counted --------------------------------------------

FAULTY_KERNELS = f'''
import time

import torch
import torch.nn.functional as F

OOM_TEXT = {OOM_TEXT!r}
leaked = []


def pytest_attnperf_register_kernels(registry, config):
    @registry.kernel(family="softmax", name="warm", backward=False)
    def warm(q, k, v, *, causal, scale, window=None):  # first: a first case's start-up lands here
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    @registry.kernel(family="softmax", name="oom", backward=False)
    def oom(q, k, v, *, causal, scale, window=None):
        raise torch.OutOfMemoryError(OOM_TEXT)

    @registry.kernel(family="softmax", name="leaks-grad")
    def leaks_grad(q, k, v, *, causal, scale, window=None):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        if not leaked:  # once: the cases after it, its own backward included, run clean
            leaked.append(True)
            torch.set_grad_enabled(False)
        return out

    @registry.kernel(family="softmax", name="hangs", backward=False)
    def hangs(q, k, v, *, causal, scale, window=None):
        time.sleep(600)

    @registry.kernel(family="softmax", name="good")
    def good(q, k, v, *, causal, scale, window=None):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
'''


def test_each_fault_costs_exactly_its_own_case_in_the_softmax_suite(pytester: pytest.Pytester) -> None:
    # in this process, where torch and its profiler are loaded: each other case takes a fraction of a
    # second, far inside the 5 s that the hanging one waits for
    shutil.copytree(kit.ROOT / "suites", pytester.path / "suites")
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    pytester.makeconftest(FAULTY_KERNELS)
    case = "cpu-b2-h4-t128-d32-causal-fp32"
    result = pytester.runpytest_inprocess(
        "-p", "pytest_attnperf.plugin", "suites/test_softmax.py",
        "-k", f"{case} and (warm or oom or leaks or hangs or good)",
        "--attnperf-budget=0.01", "--attnperf-ceilings=off", "--benchmark-disable", "--attnperf-case-timeout=5", "-rA",
    )
    ledger = FaultLedger()
    ledger.inject(f"test_softmax[{case}-oom-fwd]", "out of memory")
    ledger.inject(f"test_softmax[{case}-leaks-grad-fwd]", "grad mode left off")
    ledger.inject(f"test_softmax[{case}-hangs-fwd]", "hangs")
    ledger.check(result, expected_cases=7)  # warm-fwd, leaks-grad-fwdbwd, good-fwd and good-fwdbwd pass
    out = result.stdout.str()
    assert "oom-fwd]: out of memory: the case tried to allocate 4.00 GiB" in out
    assert "grad mode (torch.is_grad_enabled): True -> False" in out
    assert "hangs-fwd]: exceeded the case time limit of 5s" in out
