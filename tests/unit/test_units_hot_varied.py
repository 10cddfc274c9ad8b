"""Hot mode's graph of many calls: no two calls of a sample read the same contents.

Before each call the graph overwrites the first elements of one input with a row no call read
(``measure.hot.Varied``), and puts them back before the last call, whose result the checks
after sampling hold to the draw's own contents. So a cache the kernel keeps across the calls of
one replay (compare the inputs with the last call's, skip the work when equal: on a GPU, a
device-side flag) misses on every call and records what its honest twin records; before, it hit
on all but the first call of each replay. The copies' own time is timed alone and subtracted, and
their kernels are left out of the case's inventory. On the kit's fake CUDA, whose replays run the
captured Python again.
"""

from __future__ import annotations

import gc
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

import kit
import pytest
import torch
from test_units_hostile_cache import PLAN, Cached, Clock, Honest, OnGpu, by_bytes, timed

from pytest_attnperf.measure import inventory, timing
from pytest_attnperf.measure.hot import Varied
from pytest_attnperf.measure.timing import CudaTimer

HOT = PLAN.__class__(**{**PLAN.__dict__, "mode": "hot", "hot_sample_ms": 0.5})  # 25 calls of 0.02 ms a sample


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> kit.FakeGpu:
    """The kit's fake device; one replay timed on its clock (the copies advance it by nothing)."""
    gpu = kit.fake_cuda(monkeypatch, real_capture=True)

    def time_replay(replay: Callable[[], Any]) -> float:
        before = gpu.now_ms
        replay()
        ms: float = gpu.now_ms - before
        return ms

    monkeypatch.setattr(timing, "_time_replay", time_replay)
    return gpu


def test_a_cache_kept_across_a_hot_replay_records_what_its_honest_twin_records(gpu: kit.FakeGpu) -> None:
    honest = CudaTimer(kit.H200).measure(timed(OnGpu(gpu, Honest(Clock()))), HOT)
    cache = Cached(Clock(), by_bytes)
    cached = CudaTimer(kit.H200).measure(timed(OnGpu(gpu, cache)), HOT)
    assert honest.clock == cached.clock == "cuda-graph"
    assert honest.calls_per_sample == 25  # the cache's sizing replay hit: 64 calls, the most for 0 ms
    every_call = pytest.approx([gpu.ms_per_call] * HOT.max_samples, rel=1e-9)  # the fake clock sums floats
    assert list(honest.samples_ms) == every_call
    assert list(cached.samples_ms) == every_call  # on one pattern a replay it recorded 0.02 / 64 ms a call
    assert (cached.verified, cached.bitwise) == (2, True)
    assert any(f"each of a hot sample's {cached.calls_per_sample} calls read contents no other call of the sample "
               "read (2 elements of (2, 4, 64, 16) float32 overwritten before each; the copies alone, 0.00 us a call, "
               "subtracted)" in n for n in cached.notes)


def test_each_call_of_a_replay_reads_its_own_contents_and_the_last_the_draws(gpu: kit.FakeGpu) -> None:
    seen: list[tuple[float, ...]] = []
    honest = Honest(Clock())

    def watching(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        if gpu.replaying:
            seen.append(tuple(q.detach().flatten()[:2].tolist()))
        return OnGpu(gpu, honest)(q, k, v, **opts)

    CudaTimer(kit.H200).measure(timed(watching), HOT)
    first, second = seen[:25], seen[25:50]
    assert len(set(first)) == 25  # every call of one replay on contents of its own
    assert first == second  # the same rows each replay (the samples vary v between them, outside)
    own = first[-1]  # put back before the last call: the draw's own, which it is checked on
    assert own not in first[:-1]


def test_the_copies_are_timed_alone_and_subtracted(gpu: kit.FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """Copies that cost 0.004 ms a call on the device: a sample is the call's 0.02 ms alone."""
    copy_ = Varied.around

    def costly(self: Varied, fn: Callable[[], Any], calls: int) -> Callable[[], None]:
        def each() -> None:
            gpu.now_ms += 0.004
            fn()
        return copy_(self, each, calls)

    monkeypatch.setattr(Varied, "around", costly)
    m = CudaTimer(kit.H200).measure(timed(OnGpu(gpu, Honest(Clock()))), HOT)
    assert list(m.samples_ms) == pytest.approx([gpu.ms_per_call] * HOT.max_samples, rel=1e-6)
    assert any("the copies alone, 4.00 us a call, subtracted" in n for n in m.notes)


def test_a_plain_callable_has_nothing_to_vary_and_says_so(gpu: kit.FakeGpu) -> None:
    m = CudaTimer(kit.H200).measure(gpu.call, HOT)
    assert m.calls_per_sample == 25
    said = "a hot sample's 25 calls read the same contents (the callable gives no input to vary between them)"
    assert said in m.notes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 3, 5, 8), (7, 1), (3,), ()])
def test_the_table_rows_are_distinct_and_none_the_inputs_own(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    varied = Varied(x)
    varied.view.copy_(varied.values[3])  # the input holds a value of the table's own: its row is left out
    rows = varied.table(2559)
    width = 2 if shape and shape[-1] >= 2 else 1
    assert rows.shape == (2559, width)
    assert rows.dtype == dtype
    as_tuples = [tuple(r) for r in rows.float().tolist()]
    # distinct while the dtype has values enough in [-2, 2] (one element of bf16: 1,280, then round again)
    assert len(set(as_tuples)) == min(2559, len(varied.values) ** width - 1)
    assert tuple(varied.view.float().reshape(-1).tolist()) not in as_tuples
    assert varied.view.data_ptr() == x.data_ptr()  # a view: writes land in the input


def test_the_copies_kernels_are_left_out_of_the_inventory() -> None:
    """A replay of the timed graph launches the call's kernels and the copies; a replay of the
    copies' own graph, the copies: the case's inventory holds the call's alone, once per call."""
    prologue = Counter({"fill": 2})
    harness = inventory.Harness(prologue + Counter({"flush": 1}), Counter({"flush": 1}))
    graphs = {"timed": ["fill", "fill"] + ["copy", "flash_fwd"] * 4 + ["copy"],
              "copies": ["fill", "fill"] + ["copy"] * 5}
    taken = inventory.take(lambda fn: graphs[fn()], harness, lambda: "timed", lambda: "eager",
                           holds_flush=False, calls=4, besides=lambda: "copies")
    assert taken.kernels == {"flash_fwd": 1}
    without = inventory.take(lambda fn: graphs[fn()], harness, lambda: "timed", lambda: "eager",
                             holds_flush=False, calls=4)
    assert without.kernels == {"copy": 2, "flash_fwd": 1}  # 5 copies over 4 calls, rounded up


def test_the_tables_and_the_saved_elements_live_as_long_as_the_graphs(gpu: kit.FakeGpu) -> None:
    """A CUDA graph holds raw addresses, not tensors: the varying keeps every table it captured a
    graph over, and the sampler keeps the varying, so no replay reads or writes freed memory."""
    from pytest_attnperf.measure.verify import Replays

    replays = Replays(timed(OnGpu(gpu, Honest(Clock()))))
    sampler, clock, calls = CudaTimer(kit.H200)._sampler(replays, HOT, [])
    varied = sampler.keeps
    assert isinstance(varied, Varied)
    assert list(varied.tables) == [calls]  # one table, which the timed graph and the copies' own share
    assert varied.tables[calls].shape == (calls - 1, 2)
    tables = [weakref.ref(table) for table in varied.tables.values()]
    del varied
    gc.collect()
    assert all(table() is not None for table in tables)
    replays.release()


@pytest.mark.parametrize(("dtype", "shape", "calls", "distinct"), [
    (torch.bfloat16, (4, 2), 2560, 2560), (torch.bfloat16, (4, 1), 2560, 1280), (torch.float32, (), 2560, 2560)])
def test_the_distinct_contents_a_replay_reads(dtype: torch.dtype, shape: tuple[int, ...], calls: int,
                                              distinct: int) -> None:
    assert Varied(torch.zeros(shape, dtype=dtype)).distinct(calls) == distinct
