"""The tests' kit: fake hardware, a scripted timer, the conftest.py a pytester project gets, and
the small helpers the end-to-end tests share.

A pytester project (``make_project``) runs the plugin against the fake device and the scripted
timer of the text ``conftest()`` returns. The text imports nothing from these tests, so a
subprocess, a pool run or a pytest-xdist worker loads it as it would any conftest.py:

- the device is the one ``FAKE_DEVICE`` names (``h200``, ``cpu``, or ``z9000``: a card the
  hardware table does not list), by default the one ``conftest`` was given;
- ``ScriptedTimer`` calls the callable once and returns 20 per-call samples ``factor * (1 + s)``,
  one for each ``s`` in ``samples`` (``JITTER`` unless given). The factor, in ms, is what
  ``speed.json`` gives the current test (by its name, else its node id, else ``"*"``; the run's
  sample overhead, timed before any test, is ``"floor"``), 1 by default; ``clock.json`` may give a
  test the clocks of its successive measurements (a clock other than the graph ones is noted as
  an eager fallback; ``"cuda-graph x64"``: that clock, 64 calls a sample); ``peak.json`` may give
  a test its peak memory above the inputs in MiB (none by default, as on a CPU). Each measurement
  writes the plan it was given to ``plan.json``.

A project that needs more appends code to the text: a subclass of ``ScriptedTimer`` (overriding
``factor`` or ``peak_mib``, or wrapping ``measure``) and a ``pytest_attnperf_make_timer`` that
returns it; a later definition of a hook replaces the kit's.

``CudaTimer`` itself runs on the CPU through ``fake_cuda``: torch.cuda's streams, events and
graphs replaced by fakes on the clock of a ``FakeGpu`` (whose kernels' names a fake profiler
reads). ``HostClock`` is a host clock that moves only when told to.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import weakref
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_attnperf.hw.table import DetectedDevice
from pytest_attnperf.store.yamlstrict import UnaliasedDumper

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ("-p", "pytest_attnperf.plugin")
# the same, for runs whose tests read no ceilings: the CPU's matmul and copy ceilings are seconds of
# each CPU run (never cached on a busy host), measured where they are tested (test_roofline.py,
# test_faults_ceilings.py)
PLUGIN_NO_CEILINGS = (*PLUGIN, "--attnperf-ceilings=off")
ADDOPTS = "--strict-markers -p no:cacheprovider"  # a project's pytest.ini adds these to its own

# -- fake hardware ---------------------------------------------------------------------------

H200 = DetectedDevice("cuda", "NVIDIA H200", (9, 0), 132, 60 * 2**20)
CPU = DetectedDevice("cpu", "x86_64")

# -- the scripted timer's samples, relative to the factor ------------------------------------

JITTER = tuple(0.002 * (((7 * i) % 11) - 5) / 5 for i in range(20))  # within 0.2% of it, its median on it


def steps(n: int, centred: bool = False) -> tuple[float, ...]:
    """20 samples going up by 0.1% for ``n`` samples, then again: from the factor, or (``centred``)
    from ``n // 2`` steps below it."""
    return tuple(0.001 * (i % n - (n // 2 if centred else 0)) for i in range(20))


# -- the conftest.py of a pytester project ---------------------------------------------------

_CONFTEST_HEAD = '''"""A fake device and a scripted timer (tests/kit.py says what they do)."""

import json
import os
import re
import shlex
import pathlib

import pytest

from pytest_attnperf.hw.table import DetectedDevice
from pytest_attnperf.measure.timing import Measurement

HERE = pathlib.Path(__file__).parent
'''

_CONFTEST_BODY = '''
DEVICES = {
    "h200": DetectedDevice("cuda", "NVIDIA H200", (9, 0), 132, 60 * 2**20),
    "z9000": DetectedDevice("cuda", "NVIDIA Z9000", (12, 0), 100, 32 * 2**20),  # in no hardware table
    "cpu": DetectedDevice("cpu", "x86_64"),
}


def pytest_attnperf_detect_device(config):
    return DEVICES[os.environ.get("FAKE_DEVICE", DEVICE)]


def read_json(name, default):
    path = HERE / name
    return json.loads(path.read_text()) if path.exists() else default


def current_test(plan=None):
    """The current test's name and node id; "floor" for the run's sample overhead."""
    if plan is not None and plan.overhead:
        return "floor", "floor"
    nodeid = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0].split("@")[0]
    return nodeid.split("::")[-1], nodeid


def for_test(table, name, nodeid, default):
    return table.get(name, table.get(nodeid, table.get("*", default)))


class ScriptedTimer:
    """SAMPLES around the factor speed.json gives the test, on the clocks clock.json gives it."""

    calls = {}

    def measure(self, fn, plan):
        fn()
        (HERE / "plan.json").write_text(json.dumps({"cold_graphs": plan.cold_graphs,
                                                    "hot_sample_ms": plan.hot_sample_ms}))
        name, nodeid = current_test(plan)
        factor = self.factor(name, nodeid, fn)
        sequence = for_test(read_json("clock.json", {}), name, nodeid, ["scripted"])
        n = self.calls[name] = self.calls.get(name, -1) + 1
        clock, _, per_sample = sequence[min(n, len(sequence) - 1)].partition(" x")  # "cuda-graph x64"
        notes = () if clock in ("scripted", "cuda-graph", "cuda-graph-nodes") else (f"scripted fallback to {clock}",)
        return Measurement(tuple(factor * (1 + s) for s in SAMPLES), clock=clock, mode=plan.mode, notes=notes,
                           calls_per_sample=int(per_sample or 1), eager_ms=EAGER_MS,
                           peak_mib=self.peak_mib(name, nodeid))

    def factor(self, name, nodeid, fn):
        return for_test(read_json("speed.json", {}), name, nodeid, 1.0)

    def peak_mib(self, name, nodeid):
        return for_test(read_json("peak.json", {}), name, nodeid, None)


def pytest_attnperf_make_timer(config, device):
    return ScriptedTimer()
'''


def conftest(device: str = "h200", *, samples: Sequence[float] = JITTER, eager_ms: float | None = None) -> str:
    """The conftest.py text of a project on the fake ``device`` whose scripted timer gives
    ``samples`` (relative to the test's factor) and ``eager_ms`` as the eager figure."""
    settings = (f"DEVICE = {device!r}  # unless FAKE_DEVICE names another\n"
                f"SAMPLES = {tuple(samples)!r}  # a sample is the test's factor x (1 + s)\n"
                f"EAGER_MS = {eager_ms!r}\n")
    return _CONFTEST_HEAD + settings + _CONFTEST_BODY


CONFTEST = conftest()

TESTS = '''
import pytest

from pytest_attnperf.costs import Cost


@pytest.mark.parametrize("name", ["a", "b"])
def test_case(name, attnperf):
    result = attnperf.measure(lambda: None, cost=Cost(flops=1e9, bytes=1e6), dtype="bf16")
    assert result.median_ms > 0
'''  # two measured cases, test_case[a] and test_case[b]: 1 TFLOP/s at the factor 1 ms, so that a
# factor down to 4 us stays under the H200's peaks (a faster figure is refused as impossible)


FAILING_CASES = '''
import pytest

from pytest_attnperf.costs import Cost

COST = Cost(flops=1e9, bytes=1e6)


def kernel_that_raises():
    raise RuntimeError("kernel launch failed: invalid argument")


@pytest.mark.parametrize("name", ["ok", "wrong", "raises", "after"])
def test_case(name, attnperf):
    if name == "wrong":
        pytest.fail("o: 12 of 4096 elements outside the bound\\nworst element b=1 h=3", pytrace=False)
    attnperf.measure(kernel_that_raises if name == "raises" else lambda: None, cost=COST, dtype="bf16")
    assert name != "after", "failed after it was measured"


def test_not_an_attention_case():
    assert False, "no attnperf fixture"
'''  # ok and after are measured (after then fails); wrong fails its check, raises inside
# attnperf.measure: two correctness failures, and a failing test that is no attention case


def make_project(pytester: pytest.Pytester, conftest: str = CONFTEST, *, addopts: str = "", ini: str = "",
                 **modules: str) -> pytest.Pytester:
    """``pytester``'s folder as a project: ``conftest``, the test modules given by name, and an ini
    file whose addopts are ``ADDOPTS`` and ``addopts``, followed by the lines ``ini``."""
    pytester.makeconftest(conftest)
    if modules:
        pytester.makepyfile(**modules)
    pytester.makeini(f"[pytest]\naddopts = {' '.join(filter(None, (ADDOPTS, addopts)))}\n{ini}")
    return pytester


def _folder(where: pytest.Pytester | Path) -> Path:
    return where.path if isinstance(where, pytest.Pytester) else where


def set_speeds(where: pytest.Pytester | Path, factors: Mapping[str, float]) -> None:
    """The scripted timer's factor for each test named (by name or node id; ``"*"``: any other)."""
    (_folder(where) / "speed.json").write_text(json.dumps(dict(factors)))


def set_speed(where: pytest.Pytester | Path, **factors: float) -> None:
    """The factor of each of ``TESTS``' cases named by its parameter: ``set_speed(p, a=1.1)``."""
    set_speeds(where, {f"test_case[{k}]": v for k, v in factors.items()})


def set_peaks(where: pytest.Pytester | Path, peaks: Mapping[str, float]) -> None:
    """The scripted timer's peak memory above the inputs (MiB) for each test named (by name or node
    id; ``"*"``: any other)."""
    (_folder(where) / "peak.json").write_text(json.dumps(dict(peaks)))


def set_clocks(where: pytest.Pytester | Path, **sequences: list[str]) -> None:
    """The clocks of the successive measurements of each of ``TESTS``' cases named."""
    (_folder(where) / "clock.json").write_text(json.dumps({f"test_case[{k}]": v for k, v in sequences.items()}))


# -- what a run wrote ------------------------------------------------------------------------


def baseline_path(where: pytest.Pytester | Path, hw: str = "h200", folder: str = "baselines") -> Path:
    return _folder(where) / folder / f"{hw}.yaml"


def baseline(where: pytest.Pytester | Path, hw: str = "h200", folder: str = "baselines") -> dict[str, Any]:
    """The project's baseline file for ``hw``, parsed."""
    data: dict[str, Any] = yaml.safe_load(baseline_path(where, hw, folder).read_text())
    return data


def entries(where: pytest.Pytester | Path, hw: str = "h200", folder: str = "baselines") -> dict[str, Any]:
    """The entries of the project's baseline file for ``hw``."""
    found: dict[str, Any] = baseline(where, hw, folder)["entries"]
    return found


@contextlib.contextmanager
def editing_baseline(where: pytest.Pytester | Path, hw: str = "h200") -> Iterator[dict[str, Any]]:
    """The baseline file parsed, and written back as the block left it (as a hand edit would)."""
    data = baseline(where, hw)
    yield data
    baseline_path(where, hw).write_text(yaml.dump(data, Dumper=UnaliasedDumper))  # a person writes no aliases


def benchmarks(where: pytest.Pytester | Path, name: str) -> list[dict[str, Any]]:
    """The benchmarks of the pytest-benchmark JSON file ``name`` in the project."""
    found: list[dict[str, Any]] = json.loads((_folder(where) / name).read_text())["benchmarks"]
    return found


def junit_properties(path: Path) -> dict[str, dict[str, str]]:
    """Each JUnit test case's properties, by the case's name (a name recorded twice is an error)."""
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        pairs = [(p.attrib["name"], p.attrib["value"]) for p in case.iter("property")]
        assert len({name for name, _ in pairs}) == len(pairs), pairs
        found[case.attrib["name"]] = dict(pairs)
    return found


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    """Each test's outcome by its node id, from a ``-rA`` run's short summary."""
    found: dict[str, str] = {}
    for line in result.stdout.lines:
        for word in ("PASSED", "FAILED", "SKIPPED", "ERROR"):
            if line.startswith(word + " "):
                found[line.split()[1]] = word
    return found


# -- a page's code blocks, as a project -------------------------------------------------------

OWN_PROJECT = ROOT / "docs" / "own-project.md"  # the quick start: its blocks are a project's files


def tool(name: str) -> Any:
    """The maintainers' script ``tools/<name>.py`` imported as a module (tools/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"tool_{name}", ROOT / "tools" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page_blocks(page: Path, language: str) -> list[str]:
    """The page's code blocks in ``language``."""
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)


def page_files(page: Path = OWN_PROJECT) -> dict[str, str]:
    """Each python, toml or gitignore block whose first line is ``# <path>``, by path."""
    found = {}
    for block in [b for language in ("python", "toml", "gitignore") for b in page_blocks(page, language)]:
        first, _, _ = block.partition("\n")
        if first.startswith("# "):
            found[first[2:].strip()] = block
    return found


def page_commands(page: Path = OWN_PROJECT, program: str = "pytest") -> list[list[str]]:
    """The page's ``program`` command lines, as arguments after it."""
    lines = [line for block in page_blocks(page, "bash") for line in block.splitlines()
             if line.startswith(f"{program} ")]
    return [shlex.split(line, comments=True)[1:] for line in lines]


def write_files(folder: Path, files: Mapping[str, str]) -> None:
    """Write ``files`` (path: text) under ``folder``."""
    for path, text in files.items():
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


# -- the environment of a run ----------------------------------------------------------------


def pythonpath(monkeypatch: pytest.MonkeyPatch, *also: str | Path) -> None:
    """A subprocess run imports this tree's pytest_attnperf (and what lies in ``also``)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(str(p) for p in (ROOT, *also) if p))


def cuda_available(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch says CUDA is there, and ``torch.zeros`` makes its tensors on the CPU (as the
    sample overhead's one-element add asks for one on CUDA)."""
    import torch

    zeros = torch.zeros
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch, "zeros", lambda *shape, device=None: zeros(*shape))


# -- CudaTimer on the CPU --------------------------------------------------------------------


class FakeGpu:
    """A scripted GPU: a clock in ms that kernel calls, L2 flushes and graph launches advance;
    the graphs made on it, and how many were reset.

    It also keeps the names of the kernels launched on it, for a fake profiler (``profile``): a
    call launches ``kernel_names``, the flush a fill, a replay first ``prologue`` (launched by
    the replay itself, as torch's does) and then what its graph holds, which the profiler sees
    only while ``graph_visible``."""

    FLUSH = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<signed char>>(int)"
    PROLOGUE = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>>(int)",) * 2

    def __init__(self, ms_per_call: float = 0.02, launch_ms: float = 0.0, flush_ms: float = 0.0) -> None:
        self.ms_per_call, self.launch_ms, self.flush_ms = ms_per_call, launch_ms, flush_ms
        self.now_ms, self.replays, self.resets = 0.0, 0, 0
        self.graphs: list[weakref.ref[FakeGraph]] = []
        self.kernel_names: tuple[str, ...] = ("void pytorch_flash::flash_fwd_kernel<Traits<64, 128>, true>(Params)",)
        self.prologue, self.graph_visible = self.PROLOGUE, True
        self.launched: list[str] = []
        self.profiles = 0  # profiles taken
        self._in_graph = False

    def call(self) -> None:
        """One call of the kernel under test."""
        self.now_ms += self.ms_per_call
        self.launch(*self.kernel_names)

    @property
    def replaying(self) -> bool:
        """Whether a graph's replay is running: its captured work, which a kernel that takes
        another path under capture (torch.cuda.is_current_stream_capturing) chose then."""
        return self._in_graph

    def launch(self, *names: str) -> None:
        """Kernels launched (inside a replay, seen by the profiler only while ``graph_visible``)."""
        if self.graph_visible or not self._in_graph:
            self.launched.extend(names)

    def profile(self, fn: Callable[[], Any]) -> list[str]:
        """The fake profiler: the names of the kernels one call of ``fn`` launched."""
        self.profiles += 1
        mark = len(self.launched)
        fn()
        return self.launched[mark:]


class FakeGraph:
    """The captured work, run again at each replay after the graph's launch latency; its memory
    pool is its own unless it was captured into another graph's. ``reset`` drops the work, as
    torch's does."""

    def __init__(self, gpu: FakeGpu, body: Callable[[], Any] = lambda: None, pool: Any = None) -> None:
        self.gpu, self.body = gpu, body
        self._pool = pool if pool is not None else object()
        gpu.graphs.append(weakref.ref(self))

    def pool(self) -> Any:
        return self._pool

    def replay(self) -> None:
        self.gpu.now_ms += self.gpu.launch_ms
        self.gpu.launch(*self.gpu.prologue)
        self.gpu._in_graph = True
        try:
            self.body()
        finally:
            self.gpu._in_graph = False
        self.gpu.replays += 1

    def reset(self) -> None:
        self.gpu.resets += 1
        self.body = lambda: None


class FakeEvent:
    """A CUDA event: reads the fake GPU's clock when recorded (inside a graph: when replayed)."""

    gpu: FakeGpu  # set by fake_cuda

    def __init__(self, enable_timing: bool = False, external: bool = False) -> None:
        self.at_ms = 0.0

    def record(self) -> None:
        self.at_ms = self.gpu.now_ms

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: FakeEvent) -> float:
        return other.at_ms - self.at_ms


class FakeStream:
    def wait_stream(self, other: Any) -> None:
        pass


class FakeFlush:
    """The L2 flush buffer: zeroing it costs the GPU its flush time."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu

    def zero_(self) -> None:
        self.gpu.now_ms += self.gpu.flush_ms
        self.gpu.launch(self.gpu.FLUSH)


def fake_cuda(monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu | None = None, *, real_capture: bool = False,
              eager_ms: float | None = 0.05) -> FakeGpu:
    """torch.cuda's streams, events and graphs, and what ``CudaTimer`` reads of the device, faked
    on ``gpu`` (by default one of 0.02 ms a call), which is returned. A graph of any length captures:
    made by a stand-in for timing's ``_capture``, or with ``real_capture`` by ``_capture`` itself
    (the callable runs while torch.cuda.graph is faked), which registers it for release. The SM
    clock reads 1980 MHz, unthrottled; ``CudaTimer._eager_ms`` gives ``eager_ms`` (None: it times
    on the fake events)."""
    import torch

    from pytest_attnperf.measure import timing
    from pytest_attnperf.measure.timing import CudaTimer

    gpu = gpu if gpu is not None else FakeGpu()
    monkeypatch.setattr(FakeEvent, "gpu", gpu, raising=False)
    for name, value in {
        "Stream": FakeStream, "current_stream": FakeStream, "stream": lambda s: contextlib.nullcontext(),
        "synchronize": lambda: None, "Event": FakeEvent, "_sleep": lambda cycles: None,
        "current_device": lambda: 0, "set_stream": lambda s: None,
        "CUDAGraph": lambda: FakeGraph(gpu), "graph": lambda graph, pool=None: contextlib.nullcontext(),
    }.items():
        monkeypatch.setattr(torch.cuda, name, value, raising=False)
    real = timing._capture

    def capture(fn: Callable[[], Any], calls: int, pool: Any = None) -> tuple[Any, str | None]:
        graph, why = real(fn, calls, pool) if real_capture else (FakeGraph(gpu, pool=pool), None)
        if graph is not None:
            graph.body = lambda: [fn() for _ in range(calls)]
        return graph, why

    monkeypatch.setattr(timing, "_capture", capture)
    monkeypatch.setattr(timing, "_time_replay", lambda replay: gpu.ms_per_call)
    if eager_ms is not None:
        monkeypatch.setattr(CudaTimer, "_eager_ms", staticmethod(lambda fn, calls=10, budget_s=0.5: eager_ms))
    monkeypatch.setattr(CudaTimer, "_peak_mib", staticmethod(lambda fn: 1.0))
    monkeypatch.setattr(CudaTimer, "_flush_buffer", lambda self: FakeFlush(gpu))
    monkeypatch.setattr(CudaTimer, "kernels_of", staticmethod(gpu.profile))
    monkeypatch.setattr(timing, "read_sm_clock", lambda index: (1980.0, ()))
    monkeypatch.setattr(timing, "read_violation_ns", lambda index: {"power": 0, "thermal": 0})
    monkeypatch.setattr(timing, "cool_down", lambda index: "the GPU idled 0.5 s")
    return gpu


class FakeAllocator:
    """torch.cuda's allocator statistics on a scripted allocator: ``hold`` and ``free`` move the
    bytes allocated, and the high-water mark follows until ``reset_peak_memory_stats``."""

    def __init__(self, allocated_bytes: int = 0) -> None:
        self.allocated, self.peak = allocated_bytes, allocated_bytes

    def hold(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes

    def reset_peak(self) -> None:
        self.peak = self.allocated


def fake_allocator(monkeypatch: pytest.MonkeyPatch, allocated_bytes: int = 0) -> FakeAllocator:
    """``torch.cuda.memory_allocated``, ``max_memory_allocated``, ``reset_peak_memory_stats`` and
    ``synchronize`` read and reset a new ``FakeAllocator`` holding ``allocated_bytes``, returned."""
    import torch

    allocator = FakeAllocator(allocated_bytes)
    for name, value in {"memory_allocated": lambda device=None: allocator.allocated,
                        "max_memory_allocated": lambda device=None: allocator.peak,
                        "reset_peak_memory_stats": lambda device=None: allocator.reset_peak(),
                        "synchronize": lambda device=None: None}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    return allocator


class HostClock:
    """A host's monotonic clock that moves only when told to, and its sleeps, which take exactly
    what they ask."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def monotonic(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def host_clock(monkeypatch: pytest.MonkeyPatch) -> HostClock:
    """``time.monotonic`` and ``time.sleep`` replaced by a new ``HostClock``'s, returned."""
    clock = HostClock()
    monkeypatch.setattr("time.monotonic", clock.monotonic)
    monkeypatch.setattr("time.sleep", clock.sleep)
    return clock
