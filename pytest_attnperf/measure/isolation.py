"""Case isolation: one bad kernel costs only its own case.

Around the call of each attention case (a test using an ``attnperf*`` fixture), ``CaseGuard``:

- **global state**: snapshots torch's process-wide switches the harness relies on (grad mode,
  default dtype and device, SDPA backends, deterministic algorithms, cuDNN, TF32 and matmul
  precision, autocast, anomaly mode, CPU threads, the current CUDA device and stream) before
  the call and after it, outside the ``attnperf_sdpa_backend`` pin; a case that changed any is failed,
  naming each (before -> after), and they are put back for the cases after it. The global random
  generators' states (the default CPU one, each CUDA device's once CUDA is initialized) are put
  back too: a case that reseeded one (``torch.manual_seed``) is reported (a warning naming it),
  not failed, since a test may seed its own inputs; one that only drew from it is not reported;
- **memory**: an out-of-memory error fails the case with the size it tried to allocate and the
  memory left after the case's objects are released; after every attention case its frames are
  cleared, garbage is collected and the CUDA cache emptied (``release_memory``), so the next
  case starts with the memory the run had before it;
- **time**: the call (warm-up, correctness check, timing) is limited to
  ``--attnperf-case-timeout`` seconds by ``SIGALRM`` on the main thread, which fails the case
  with the stack where it was stuck. A call that never returns to Python (a GPU deadlock inside
  a C call) cannot be interrupted so: ``GRACE_S`` seconds later a watchdog thread writes a
  message and every thread's stack to stderr and ends the process (exit status 3), and should
  the interpreter itself be held, ``faulthandler`` dumps the stacks ("Timeout (h:mm:ss)!") and
  ends it (exit status 1) ``GRACE_S`` after that. Not on platforms without ``SIGALRM`` (Windows:
  the report header says so), under pytest-timeout (``--timeout``, its ini key or
  environment variable, or a ``timeout`` marker: it owns the limit then), or off the main thread.

torch is imported only for attention cases.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

import pytest

__all__ = [
    "GRACE_S",
    "CaseGuard",
    "GlobalSwitch",
    "changed_globals",
    "is_attention_case",
    "is_out_of_memory",
    "oom_request",
    "release_memory",
    "restore_globals",
    "restore_rng",
    "snapshot_globals",
    "snapshot_rng",
    "torch_globals",
]

GRACE_S = 60.0  # after the time limit, how long a call stuck outside Python gets before the process ends
EXIT_STUCK = 3  # pytest's exit status for an internal error: the run was cut short
FAILED_TRACEBACKS = pytest.StashKey[list[TracebackType]]()  # a case's failures, cleared when it ends
CALLED = pytest.StashKey[bool]()  # the case reached its call phase or failed before it


def is_attention_case(item: pytest.Item) -> bool:
    """Whether the test uses one of attnperf's fixtures (the suites' tests all do)."""
    return any(name.startswith("attnperf") for name in getattr(item, "fixturenames", ()))


# -- global state --------------------------------------------------------------------------


@dataclass(frozen=True)
class Unreadable:
    """A switch whose getter raised (torch refuses to read TF32 flags set through both its
    legacy and its new API); equal to another only with the same error."""

    error: str

    def __repr__(self) -> str:
        return f"<unreadable: {self.error}>"


@dataclass(frozen=True)
class GlobalSwitch:
    """One process-wide setting: the name a failure shows, how to read it and to set it back."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None]


def torch_globals() -> tuple[GlobalSwitch, ...]:
    """The switches a kernel can leave changed, in the order they are set back (the float32
    matmul precision before the TF32 flags it also sets)."""
    import torch

    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn

    def attr(owner: Any, name: str, label: str) -> GlobalSwitch:
        return GlobalSwitch(label, lambda: getattr(owner, name), lambda value: setattr(owner, name, value))

    def set_grad(value: Any) -> None:
        torch.set_grad_enabled(value)

    switches = [
        GlobalSwitch("grad mode (torch.is_grad_enabled)", torch.is_grad_enabled, set_grad),
        GlobalSwitch("default dtype (torch.get_default_dtype)", torch.get_default_dtype, torch.set_default_dtype),
        GlobalSwitch("SDPA flash backend (torch.backends.cuda.flash_sdp_enabled)",
                     cuda.flash_sdp_enabled, cuda.enable_flash_sdp),
        GlobalSwitch("SDPA memory-efficient backend (torch.backends.cuda.mem_efficient_sdp_enabled)",
                     cuda.mem_efficient_sdp_enabled, cuda.enable_mem_efficient_sdp),
        GlobalSwitch("SDPA math backend (torch.backends.cuda.math_sdp_enabled)",
                     cuda.math_sdp_enabled, cuda.enable_math_sdp),
        GlobalSwitch("deterministic algorithms (torch.are_deterministic_algorithms_enabled)",
                     lambda: (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled()),
                     lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1])),
        GlobalSwitch("float32 matmul precision (torch.get_float32_matmul_precision)",
                     torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        attr(cuda.matmul, "allow_tf32", "TF32 matmul (torch.backends.cuda.matmul.allow_tf32)"),
        attr(cudnn, "allow_tf32", "TF32 cuDNN (torch.backends.cudnn.allow_tf32)"),
        attr(cuda.matmul, "allow_fp16_reduced_precision_reduction",
             "fp16 reduced-precision reduction (torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)"),
        attr(cuda.matmul, "allow_bf16_reduced_precision_reduction",
             "bf16 reduced-precision reduction (torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)"),
        attr(cudnn, "enabled", "cuDNN (torch.backends.cudnn.enabled)"),
        attr(cudnn, "benchmark", "cuDNN benchmark (torch.backends.cudnn.benchmark)"),
        attr(cudnn, "deterministic", "cuDNN deterministic (torch.backends.cudnn.deterministic)"),
        GlobalSwitch("anomaly detection (torch.is_anomaly_enabled)", torch.is_anomaly_enabled,
                     torch.set_anomaly_enabled),
        GlobalSwitch("CPU threads (torch.get_num_threads)", torch.get_num_threads, torch.set_num_threads),
    ]
    if hasattr(cuda, "cudnn_sdp_enabled"):
        switches.insert(5, GlobalSwitch("SDPA cuDNN backend (torch.backends.cuda.cudnn_sdp_enabled)",
                                        cuda.cudnn_sdp_enabled, cuda.enable_cudnn_sdp))
    if hasattr(torch, "get_default_device"):
        def set_device(value: Any) -> None:  # None, not "cpu": no device mode left on every op
            torch.set_default_device(None if value == torch.device("cpu") else value)

        switches.insert(2, GlobalSwitch("default device (torch.get_default_device)",
                                        torch.get_default_device, set_device))
    for device in ("cpu", "cuda"):
        switches.append(_autocast(torch, device))
    switches.extend(_cuda_current(torch))
    return tuple(switches)


def _autocast(torch: Any, device: str) -> GlobalSwitch:
    def get() -> bool:
        return bool(torch.is_autocast_enabled(device))

    def put(value: bool) -> None:
        torch.set_autocast_enabled(device, value)

    return GlobalSwitch(f"{device} autocast (torch.is_autocast_enabled('{device}'))", get, put)


class _NotInUse:
    """CUDA not initialized: nothing to compare (initializing it is no leak)."""

    def __repr__(self) -> str:
        return "<CUDA not initialized>"


NOT_IN_USE = _NotInUse()


def _cuda_current(torch: Any) -> list[GlobalSwitch]:
    """The current CUDA device and stream, read only once CUDA is initialized (a case that
    leaves a side stream current sends every later case's work to it)."""

    def when_initialized(read: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: read() if torch.cuda.is_initialized() else NOT_IN_USE

    return [
        GlobalSwitch("current CUDA device (torch.cuda.current_device)",
                     when_initialized(torch.cuda.current_device), torch.cuda.set_device),
        GlobalSwitch("current CUDA stream (torch.cuda.current_stream)",
                     when_initialized(torch.cuda.current_stream), torch.cuda.set_stream),
    ]


def _read(switch: GlobalSwitch) -> Any:
    try:
        return switch.get()
    except Exception as exc:  # noqa: BLE001 - a switch torch refuses to read is compared as that refusal
        return Unreadable(f"{type(exc).__name__}: {str(exc)[:80]}")


def snapshot_globals(switches: tuple[GlobalSwitch, ...]) -> dict[str, Any]:
    """The current value of each switch, by name (an ``Unreadable`` where torch refuses to read it)."""
    return {s.name: _read(s) for s in switches}


def changed_globals(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(name, before, after)`` for each switch that differs; one not in use on either side
    (CUDA not initialized) is not compared."""
    return [(name, was, after[name]) for name, was in before.items()
            if name in after and NOT_IN_USE not in (was, after[name]) and was != after[name]]


def restore_globals(switches: tuple[GlobalSwitch, ...], before: dict[str, Any]) -> list[str]:
    """Set every switch that differs from ``before`` back to it; the names of those that could
    not be set back (or read back equal)."""
    failed: list[str] = []
    for switch in switches:
        was = before.get(switch.name)
        if isinstance(was, (Unreadable, _NotInUse)) or _read(switch) == was:
            continue
        try:
            switch.set(was)
        except Exception as exc:  # noqa: BLE001 - reported with the case; the run goes on
            failed.append(f"{switch.name} ({type(exc).__name__}: {str(exc)[:80]})")
    failed.extend(name for name, *_ in changed_globals(before, snapshot_globals(switches))
                  if not any(f.startswith(name) for f in failed))
    return failed


def snapshot_rng() -> dict[str, tuple[int, Any]]:
    """The seed and state (a ByteTensor) of the default CPU generator and, only once CUDA is
    initialized (this never initializes it), of every CUDA device's, by generator."""
    import torch

    cuda: Any = torch.cuda
    rng = {"CPU": (torch.initial_seed(), torch.get_rng_state())}
    if cuda.is_initialized():
        for index, state in enumerate(cuda.get_rng_state_all()):
            rng[f"cuda:{index}"] = (cuda.default_generators[index].initial_seed(), state)
    return rng


def restore_rng(before: dict[str, tuple[int, Any]]) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """Put every generator whose state differs from ``before`` back to it. ``(name, seed before,
    seed after)`` for each the case reseeded (a draw changes the state, not the seed), and the
    generators that could not be set back."""
    import torch

    def differ(now: dict[str, tuple[int, Any]]) -> list[str]:
        return [name for name, (_, state) in before.items() if name in now and not torch.equal(state, now[name][1])]

    after = snapshot_rng()
    reseeded = [(f"{name} generator's seed (torch.manual_seed; torch.initial_seed)", seed, after[name][0])
                for name, (seed, _) in before.items() if name in after and seed != after[name][0]]
    failed: list[str] = []
    changed = differ(after)
    try:
        if "CPU" in changed:
            torch.set_rng_state(before["CPU"][1])
        if any(name != "CPU" for name in changed):
            torch.cuda.set_rng_state_all([state for name, (_, state) in before.items() if name != "CPU"])
    except Exception as exc:  # noqa: BLE001 - reported with the case; the run goes on
        failed.append(f"the global random generators ({type(exc).__name__}: {str(exc)[:80]})")
    if changed and not failed:
        failed.extend(f"{name} generator's state (torch.set_rng_state)" for name in differ(snapshot_rng()))
    return reseeded, failed


def describe_changes(changes: list[tuple[str, Any, Any]], not_restored: list[str]) -> str:
    lines = [f"  {name}: {was!r} -> {now!r}" for name, was, now in changes]
    text = "\n".join(lines)
    if not_restored:
        text += "\n  could not be set back: " + "; ".join(not_restored)
    return text


# -- memory --------------------------------------------------------------------------------

_OOM_TEXT = re.compile(r"out of memory", re.IGNORECASE)
_TRIED = re.compile(r"Tried to allocate ([\d.]+ ?[KMGTP]?i?B)", re.IGNORECASE)
_STATE = re.compile(r"(GPU \d+ has a total capacity.*?)(?:If reserved but unallocated|See documentation|$)",
                    re.IGNORECASE | re.DOTALL)


def is_out_of_memory(exc: BaseException | None) -> bool:
    """torch's ``OutOfMemoryError``, or any error whose message (or one it was raised from)
    says CUDA ran out of memory."""
    seen = 0
    while exc is not None and seen < 8:
        if type(exc).__name__ == "OutOfMemoryError" or (
                isinstance(exc, (RuntimeError, MemoryError)) and _OOM_TEXT.search(str(exc))):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def oom_request(message: str) -> str | None:
    """The size in torch's out-of-memory message ("Tried to allocate 2.00 GiB"), or None."""
    found = _TRIED.search(message)
    return found.group(1) if found else None


def oom_state(message: str) -> str | None:
    """The memory state torch's message gives (capacity, free, in use), without its advice."""
    found = _STATE.search(message)
    return " ".join(found.group(1).split())[:400] if found else None


def memory_state() -> str:
    """CUDA memory now, from the caching allocator and the driver; what is known without it."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return "CUDA not initialized in this process"
    gib = 2**30
    text = (f"{torch.cuda.memory_allocated() / gib:.2f} GiB allocated, "
            f"{torch.cuda.memory_reserved() / gib:.2f} GiB reserved by PyTorch")
    try:
        free, total = torch.cuda.mem_get_info()
        text += f", {free / gib:.2f} of {total / gib:.2f} GiB free on the device"
    except Exception:  # noqa: BLE001 - the allocator's figures stand on their own
        pass
    return text


def clear_traceback(tb: TracebackType | None) -> None:
    """Drop the local variables of a finished case's frames (its inputs, outputs, callables and
    graphs), keeping the traceback itself for its report."""
    while tb is not None:
        frame = tb.tb_frame
        try:
            frame.clear()
        except RuntimeError:  # a frame still running (the caller's own)
            pass
        else:
            _ = frame.f_locals  # before Python 3.13, clear() keeps a dict copy of the locals; reading empties it
        tb = tb.tb_next


REFREEZE_OBJECTS = 20_000
"""New objects surviving a case's collection from which they are frozen (``CaseGuard._refreeze``)."""


def release_memory() -> None:
    """Collect garbage and, where CUDA is in use, hand the allocator's cached blocks (graph pools
    no longer used included) back to the device."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _failures_cleared(tracebacks: list[TracebackType]) -> None:
    """A failed case's frames hold its tensors wherever its traceback is kept (pytest's call
    record, ``sys.last_traceback`` for post-mortem tools): their locals are dropped, once the
    report and any debugger are done with them."""
    for tb in tracebacks:
        clear_traceback(tb)
    clear_traceback(getattr(sys, "last_traceback", None))
    last = getattr(sys, "last_exc", None)
    if last is not None:
        clear_traceback(last.__traceback__)


# -- time ----------------------------------------------------------------------------------


def time_limit_unavailable() -> str | None:
    """Why the case time limit cannot be enforced here, or None."""
    if not hasattr(signal, "SIGALRM") or not hasattr(signal, "setitimer"):
        return f"no SIGALRM on {sys.platform}"
    if threading.current_thread() is not threading.main_thread():
        return "tests do not run on the main thread"
    return None


def pytest_timeout_owns(item: pytest.Item) -> bool:
    """Whether pytest-timeout limits this test (then it owns SIGALRM and the limit)."""
    config = item.config
    if not config.pluginmanager.hasplugin("timeout"):
        return False
    if item.get_closest_marker("timeout") is not None:
        return True
    values: list[Any] = [config.getoption("timeout", None), os.environ.get("PYTEST_TIMEOUT")]
    try:
        values.append(config.getini("timeout"))
    except ValueError:
        pass
    for value in values:
        try:
            if value not in (None, "") and float(value) > 0:
                return True
        except (TypeError, ValueError):
            continue
    return False


def _seconds(value: float) -> str:
    return f"{value:g}s"


class CaseClock:
    """The time limit of one case's call: ``SIGALRM`` after ``limit_s`` raises a failure in the
    main thread; a watchdog thread ends the process ``GRACE_S`` later if the call is still
    stuck; ``faulthandler`` does the same ``GRACE_S`` after that, should the interpreter be held
    too (unless pytest's own ``faulthandler_timeout`` uses it). Both write to ``stderr_fd``, the
    terminal's stderr as it was before pytest captured output."""

    def __init__(self, nodeid: str, limit_s: float, stderr_fd: int, use_faulthandler: bool) -> None:
        self.nodeid, self.limit_s, self.stderr_fd = nodeid, limit_s, stderr_fd
        self.use_faulthandler = use_faulthandler
        self._previous: Any = None
        self._watchdog: threading.Timer | None = None
        self._finished = False  # set first on exit: a late alarm or watchdog then does nothing

    def __enter__(self) -> CaseClock:
        self._previous = signal.signal(signal.SIGALRM, self._expired)
        signal.setitimer(signal.ITIMER_REAL, self.limit_s)
        self._watchdog = threading.Timer(self.limit_s + GRACE_S, self._stuck)
        self._watchdog.daemon = True
        self._watchdog.start()
        if self.use_faulthandler:
            faulthandler.dump_traceback_later(self.limit_s + 2 * GRACE_S, exit=True, file=self.stderr_fd)
        return self

    def __exit__(self, *exc: object) -> None:
        self._finished = True
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, self._previous)
            if self._watchdog is not None:
                self._watchdog.cancel()
            if self.use_faulthandler:
                faulthandler.cancel_dump_traceback_later()

    def _expired(self, signum: int, frame: FrameType | None) -> None:
        if self._finished:
            return
        stack = "".join(traceback.format_stack(frame)[-12:]) if frame is not None else "  (no frame)\n"
        raise pytest.fail.Exception(
            f"{self.nodeid}: exceeded the case time limit of {_seconds(self.limit_s)} "
            f"(--attnperf-case-timeout) in warm-up, correctness check or timing; it was stuck at:\n{stack}"
            "The run goes on with the next case.",
            pytrace=False,
        )

    def _stuck(self) -> None:
        if self._finished:
            return
        message = (
            f"\n\nattnperf: {self.nodeid} exceeded the case time limit of {_seconds(self.limit_s)} and has not "
            f"returned to Python {_seconds(GRACE_S)} later (stuck inside a C call: a GPU deadlock, say), so it "
            f"cannot be failed on its own. Every thread's stack follows; the process ends now (exit status "
            f"{EXIT_STUCK}).\n\n"
        )
        try:
            os.write(self.stderr_fd, message.encode())
            faulthandler.dump_traceback(file=self.stderr_fd, all_threads=True)
        finally:
            os._exit(EXIT_STUCK)


# -- the plugin ----------------------------------------------------------------------------


class CaseGuard:
    """Registered by ``pytest_configure``: state, memory and time isolation of attention cases."""

    def __init__(self, config: pytest.Config, limit_s: float) -> None:
        self.config, self.limit_s = config, limit_s
        self.stderr_fd: int | None = None  # a copy of stderr as it is now, before any test's capture
        self.froze = False  # objects alive after collection moved out of the collector's reach
        if limit_s > 0:
            try:
                self.stderr_fd = os.dup(2)
            except OSError:
                pass

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """At the run's end: the copy of stderr closed, the objects frozen after collection
        unfrozen."""
        if self.stderr_fd is not None:
            os.close(self.stderr_fd)
            self.stderr_fd = None
        if self.froze:
            gc.unfreeze()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Once the cases are collected (torch imported, the items made): what is alive now lives
        for the run, so the collector's full pass after each case need not walk it again. The
        pass then costs microseconds where it cost 0.4 s with torch and fla loaded."""
        if any(is_attention_case(item) for item in session.items):
            gc.collect()
            gc.freeze()
            self.froze = True

    def _faulthandler_free(self) -> bool:
        try:
            return not float(self.config.getini("faulthandler_timeout") or 0) > 0
        except (TypeError, ValueError):  # pytest's faulthandler plugin not loaded
            return True

    def _clock(self, item: pytest.Item) -> CaseClock | None:
        if self.limit_s <= 0 or self.stderr_fd is None or time_limit_unavailable() or pytest_timeout_owns(item):
            return None
        return CaseClock(item.nodeid, self.limit_s, self.stderr_fd, self._faulthandler_free())

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: outside the attnperf_sdpa_backend pin
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        """Around an attention case's call: the case time limit, torch's global switches and random
        generators set back and checked, an out-of-memory error reported with the memory state after release."""
        if not is_attention_case(item):
            return (yield)
        switches = torch_globals()
        before, rng_before = snapshot_globals(switches), snapshot_rng()
        clock = self._clock(item)
        failure: BaseException | None = None
        try:
            if clock is None:
                result = yield
            else:
                with clock:
                    result = yield
        except BaseException as exc:  # noqa: BLE001 - re-raised below, or replaced by a clearer failure
            failure = exc
        changes = changed_globals(before, snapshot_globals(switches))
        not_restored = restore_globals(switches, before) if changes else []
        reseeded, rng_not_restored = restore_rng(rng_before)
        if failure is not None and is_out_of_memory(failure):
            raise self._oom_failure(item, failure) from None
        if reseeded or rng_not_restored:  # put back: reported, not failed (a test may seed its own inputs)
            seeds = describe_changes(reseeded, rng_not_restored).strip()
            item.warn(pytest.PytestWarning(f"{item.nodeid}: the case reseeded a global generator (set back now, so "
                                           f"later cases draw as they would have): {seeds}"))
        if changes:
            described = describe_changes(changes, not_restored)
            if failure is None or isinstance(failure, pytest.skip.Exception):
                pytest.fail(
                    f"{item.nodeid}: the case changed torch's global state, which would carry into every "
                    f"later case; set back now:\n{described}", pytrace=False)
            item.add_report_section("call", "attnperf", f"the case also changed torch's global state, "
                                                        f"set back now:\n{described}")
        if failure is not None:
            raise failure
        return result

    def _oom_failure(self, item: pytest.Item, exc: BaseException) -> BaseException:
        """The case's failure for an out-of-memory error, after its frames are cleared and
        memory released (so the state it reports is what the next case gets)."""
        text = str(exc)
        where = traceback.extract_tb(exc.__traceback__)[-3:]
        clear_traceback(exc.__traceback__)
        exc.__traceback__ = None
        size = oom_request(text)
        said = oom_state(text)
        release_memory()
        lines = [
            f"{item.nodeid}: out of memory: the case tried to allocate "
            + (size if size else "an amount torch's message does not give")
            + f" ({type(exc).__name__}).",
        ]
        if said:
            lines.append(f"  at the time: {said}")
        lines.append(f"  after its memory was released: {memory_state()}; the run goes on.")
        lines.extend(f"  raised at {frame.filename}:{frame.lineno} in {frame.name}" for frame in where[-1:])
        return pytest.fail.Exception("\n".join(lines), pytrace=False)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        """Note that the case reached its call (or failed before it), and keep an attention case's
        failure tracebacks to clear at its end."""
        report = yield
        if call.when == "call" or (call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception)):
            item.stash[CALLED] = True  # it ran, or failed holding what it made
        if call.excinfo is not None and is_attention_case(item):
            item.stash.setdefault(FAILED_TRACEBACKS, []).append(call.excinfo.tb)
        return report

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        """After an attention case: its failures' frames cleared and, when it ran, its memory
        released and what it left alive frozen once that is much."""
        attention = is_attention_case(item)  # read now: pytest drops the item's fixtures at its end
        result = yield
        if attention:
            _failures_cleared(item.stash.get(FAILED_TRACEBACKS, []))
            item.stash[FAILED_TRACEBACKS] = []
            if item.stash.get(CALLED, False):  # a case skipped before its call made nothing to release,
                release_memory()  # and a collection costs 0.4 s with torch and fla loaded
                self._refreeze()
        return result

    def _refreeze(self) -> None:
        """After a case's full collection: when the modules a case imported for the run (torch's
        compiler stack for flex attention, Triton's JIT) left ``REFREEZE_OBJECTS`` or more new
        objects, freeze those survivors too, so the pass after each later case does not walk
        them (it took 70-100 ms a case once they were there, on the CPU). The case's own garbage
        went in the collection just made; frozen objects are still freed by reference counting,
        and only a reference cycle among them that dies later waits for the run's end."""
        if self.froze and len(gc.get_objects()) >= REFREEZE_OBJECTS:
            gc.freeze()

    def pytest_report_header(self, config: pytest.Config) -> str | None:
        """A header line when ``--attnperf-case-timeout`` cannot be enforced, and why."""
        why = time_limit_unavailable() if self.limit_s > 0 else None
        return f"attnperf: --attnperf-case-timeout is not enforced ({why})" if why else None
