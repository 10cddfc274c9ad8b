"""The kernel inventory: names normalised, the harness's kernels left out, the counts per call,
the diff and its message, and the verdict end to end (recorded, unchanged, changed, opted in to
fail, entries without an inventory).

The timer tests run ``CudaTimer`` on tests/kit.py's fake device, whose fake profiler reads the
kernel names launched on it; the end-to-end ones run a pytester project whose scripted timer
gives each case the inventory ``kernels.json`` names.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from kit import (
    CONFTEST,
    H200,
    PLUGIN,
    TESTS,
    FakeGpu,
    editing_baseline,
    entries,
    fake_cuda,
    junit_properties,
    make_project,
    set_speed,
)

from pytest_attnperf.measure import inventory
from pytest_attnperf.measure.inventory import (
    EAGER,
    GRAPH,
    Harness,
    diff,
    disagreement,
    eager_difference,
    normalise,
    per_call,
    verdict,
)
from pytest_attnperf.measure.timing import CudaTimer, SamplingPlan
from pytest_attnperf.measure.verify import TimedDiffers
from pytest_attnperf.store import baselines

FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, " \
        "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 64, 4, cutlass::bfloat16_t>>, true, false>(Flash_fwd_params)"


# -- names ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "counted"), [
    (FLASH, "pytorch_flash::flash_fwd_kernel"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "std::array<char*, 1ul>>(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
     "at::native::vectorized_elementwise_kernel"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>(float*, float const*, int)",
     "at::native::(anonymous namespace)::cunn_SoftMaxForward"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t>::Params)",
     "fmha_cutlassF_bf16_aligned_64x64_rf_sm80"),
    ("chunk_fwd_kernel_o", "chunk_fwd_kernel_o"),  # Triton: the function's name
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x64_4x1x1_kernel0_0",
     "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x64_4x1x1_kernel0_0"),
    ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD (Device -> Device)"),
    ("Memset (Device)", "Memset (Device)"),
    ("void   kernel_at_0x7f3a2c001000<int>(int)", "kernel_at_0x?"),
])
def test_names_lose_return_type_template_arguments_parameters_and_addresses(raw: str, counted: str) -> None:
    assert normalise(raw) == counted


def test_counts_are_per_call_and_variants_of_one_function_count_together() -> None:
    """Two template instances of one function count under one name; a hot graph of 64 calls
    divides, rounding up (a kernel seen at all counts once)."""
    fills = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<{}>>(int)"
    raw = Counter({fills.format("float"): 64, fills.format("long"): 64, FLASH: 128, "reduce_kernel": 1})
    assert per_call(raw, calls=64) == {"at::native::vectorized_elementwise_kernel": 2,
                                       "pytorch_flash::flash_fwd_kernel": 2, "reduce_kernel": 1}
    assert per_call(Counter({FLASH: 1})) == {"pytorch_flash::flash_fwd_kernel": 1}


# -- the diff -------------------------------------------------------------------------------------


def test_the_diff_names_added_removed_and_recounted_kernels() -> None:
    before = {"flash_fwd": 1, "cast": 1, "fill": 2}
    after = {"fmha_cutlassF": 1, "cast": 2, "fill": 2}
    change = diff(before, after)
    assert change is not None
    assert (change.added, change.removed, change.recounted) == ({"fmha_cutlassF": 1}, {"flash_fwd": 1},
                                                                {"cast": (1, 2)})
    assert change.message() == "kernels changed: added fmha_cutlassF x1; removed flash_fwd x1; count cast 1 -> 2"
    assert diff(before, dict(before)) is None


def test_a_long_diff_is_cut_with_a_count_of_what_is_left_out() -> None:
    change = diff({}, {f"k{i}": 1 for i in range(9)})
    assert change is not None
    assert change.message(limit=3) == "kernels changed: added k0 x1, k1 x1, k2 x1, and 6 more"


def test_the_verdict_compares_only_inventories_read_alike_and_only_where_the_entry_has_one() -> None:
    now = {"fmha_cutlassF": 1}
    assert verdict({"median_ms": 1.0}, now, GRAPH) is None  # an entry recorded before inventories
    assert verdict(None, now, GRAPH) is None  # no entry
    assert verdict({"kernels": {"flash_fwd": 1}}, None, None) is None  # nothing read (a CPU case)
    assert verdict({"kernels": {"flash_fwd": 1}, "kernels_source": EAGER}, now, GRAPH) is None
    assert verdict({"kernels": {"fmha_cutlassF": 1}}, now, GRAPH) is None
    assert verdict({"kernels": {"flash_fwd": 1}}, now, GRAPH) == \
        "kernels changed: added fmha_cutlassF x1; removed flash_fwd x1"


# -- the baseline entry ---------------------------------------------------------------------------

ENTRY: dict[str, object] = {"median_ms": 1.0, "ci_low_ms": 0.99, "ci_high_ms": 1.01, "stdrel": 0.001, "n_samples": 20}


def _write(path: Path, entry: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump({"format": baselines.FORMAT, "meta": {}, "entries": {"t::c": entry}}))
    return path


def test_entries_with_and_without_an_inventory_load(tmp_path: Path) -> None:
    old = baselines.load(_write(tmp_path / "old.yaml", ENTRY))
    new = baselines.load(_write(tmp_path / "new.yaml", {**ENTRY, "kernels": {"flash_fwd": 1}}))
    assert old is not None
    assert new is not None
    assert "kernels" not in old.entries["t::c"]
    assert new.entries["t::c"]["kernels"] == {"flash_fwd": 1}


@pytest.mark.parametrize("bad", [["flash_fwd"], {"flash_fwd": 0}, {"flash_fwd": 1.5}, {"flash_fwd": True}])
def test_an_entry_whose_inventory_is_not_counts_is_unusable(tmp_path: Path, bad: object) -> None:
    with pytest.raises(baselines.BaselineError, match="'kernels'"):
        baselines.load(_write(tmp_path / "bad.yaml", {**ENTRY, "kernels": bad}))
    kept = baselines.load(tmp_path / "bad.yaml", keep_unusable=True)
    assert kept is not None
    assert "t::c" in kept.unusable


# -- the timer reads it ---------------------------------------------------------------------------

PLAN = SamplingPlan(min_samples=10, budget_s=0.05, inventory=True)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    return fake_cuda(monkeypatch)


def test_a_cold_graph_inventory_leaves_out_the_flush_and_what_the_replay_launches_itself(gpu: FakeGpu) -> None:
    """The replay of a cold graph launches two generator fills and the L2 flush beside the kernel:
    only the kernel is counted, read from the graph's replay, after sampling (the samples are the
    call's alone)."""
    gpu.kernel_names = (FLASH, "void at::native::vectorized_elementwise_kernel<4, Cast<bf16>>(int)")
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert m.kernels == {"at::native::vectorized_elementwise_kernel": 1, "pytorch_flash::flash_fwd_kernel": 1}
    assert m.kernels_source == GRAPH
    assert m.median_ms == pytest.approx(0.02)
    assert m.inventory_s >= 0.0


def test_the_harness_is_profiled_once_per_timer_and_each_case_once(gpu: FakeGpu) -> None:
    """Without the backend proof's names, one eager checked call is profiled too; with them, none."""
    timer = CudaTimer(H200)
    timer.measure(gpu.call, PLAN)
    assert gpu.profiles == 5  # the flush graph's replay, the flush, the first graph, the others, the checked call
    timer.measure(gpu.call, PLAN)
    assert gpu.profiles == 8
    timer.measure(gpu.call, replace(PLAN, checked_kernels=gpu.kernel_names))
    assert gpu.profiles == 10


def test_no_inventory_unless_the_plan_asks(gpu: FakeGpu) -> None:
    m = CudaTimer(H200).measure(gpu.call, SamplingPlan(min_samples=10, budget_s=0.05))
    assert (m.kernels, m.kernels_source, gpu.profiles) == (None, None, 0)


def test_where_the_profiler_cannot_see_a_graph_one_eager_call_is_read(gpu: FakeGpu) -> None:
    """The flush graph's replay shows no flush: the graph's kernels are invisible to the profiler,
    so one eager call of the first timed draw is profiled, with nothing to subtract."""
    gpu.graph_visible = False
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert m.kernels == {"pytorch_flash::flash_fwd_kernel": 1}
    assert m.kernels_source == EAGER


def test_a_hot_graph_of_many_calls_is_counted_per_call(gpu: FakeGpu) -> None:
    """Hot mode's graph holds the calls of a 0.5 ms sample: 25 of 0.02 ms, no flush inside; each
    call launches two kernels, and the replay's own fills are left out."""
    gpu.kernel_names = (FLASH, "softmax_reduce")
    m = CudaTimer(H200).measure(gpu.call, SamplingPlan(mode="hot", min_samples=10, budget_s=0.05,
                                                       hot_sample_ms=0.5, inventory=True))
    assert m.calls_per_sample == 25
    assert m.kernels == {"pytorch_flash::flash_fwd_kernel": 1, "softmax_reduce": 1}
    assert m.kernels_source == GRAPH


def test_a_profile_that_fails_leaves_the_case_without_an_inventory_and_says_why(
        gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    def busy(fn: object) -> list[str]:
        raise RuntimeError("Profiler is already enabled on this thread")

    monkeypatch.setattr(CudaTimer, "kernels_of", staticmethod(busy))
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert m.kernels is None
    assert "kernel inventory not read (RuntimeError: Profiler is already enabled on this thread)" in m.notes
    assert m.median_ms == pytest.approx(0.02)


def test_an_extra_kernel_in_the_timed_graph_shows_in_its_inventory(gpu: FakeGpu) -> None:
    """A kernel that adds a copy to its calls once warm (the graph holds it; the checked call
    did not): the inventory, read from the graph, counts it."""
    calls = [0]

    def warming() -> None:
        calls[0] += 1
        gpu.call()
        if calls[0] > 1:
            gpu.launch("Memcpy DtoD (Device -> Device)")

    m = CudaTimer(H200).measure(warming, PLAN)
    assert m.kernels == {"Memcpy DtoD (Device -> Device)": 1, "pytorch_flash::flash_fwd_kernel": 1}


class Drifting:
    """A case's callable whose timed draw ``odd`` launches one more kernel than the others (a
    kernel that takes another path on some inputs, or does less work once it has seen them)."""

    def __init__(self, gpu: FakeGpu, odd: int) -> None:
        self.gpu, self.odd = gpu, odd

    def __call__(self) -> Any:
        return self.draw(0)()

    def draw(self, index: int) -> Callable[[], Any]:
        def call() -> Any:
            self.gpu.call()
            if index == self.odd:
                self.gpu.launch("void at::native::vectorized_elementwise_kernel<4, CopyFunctor>(int)")
            return None
        return call

    def rewritten(self, index: int) -> AbstractContextManager[bool]:
        return nullcontext(True)  # no inputs to rewrite

    def verify(self, index: int, result: Any) -> float:
        return 0.0

    def describe(self, index: int) -> str:
        return f"draw {index}"

    def protected(self) -> tuple[Any, ...]:
        return ()


def test_timed_graphs_that_launch_other_kernels_fail_the_measurement(gpu: FakeGpu) -> None:
    """Graph 5 of the eight (over draw 5) launches a copy the first graph does not: what was
    timed is not one computation, so the measurement fails, naming the kernel and the counts."""
    expected = (r"the case's 8 timed graphs launch different kernels: over the other 7, "
                r"at::native::vectorized_elementwise_kernel 1 where 7 x the first's would be 0")
    with pytest.raises(TimedDiffers, match=expected):
        CudaTimer(H200).measure(Drifting(gpu, odd=5), PLAN)


def test_timed_graphs_that_agree_pass_and_the_first_draw_differing_is_seen_too(gpu: FakeGpu) -> None:
    m = CudaTimer(H200).measure(Drifting(gpu, odd=99), PLAN)
    assert m.kernels == {"pytorch_flash::flash_fwd_kernel": 1}
    with pytest.raises(TimedDiffers, match="would be 7"):  # the first graph's extra kernel is missing from the others
        CudaTimer(H200).measure(Drifting(gpu, odd=1), PLAN)


def test_a_graph_of_more_launches_than_the_profiler_may_keep_is_not_compared(
        gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inventory, "AGREE_MAX_LAUNCHES", 0)
    m = CudaTimer(H200).measure(Drifting(gpu, odd=5), PLAN)
    assert m.kernels == {"pytorch_flash::flash_fwd_kernel": 1}


def test_a_profile_that_recorded_none_of_the_other_graphs_kernels_compares_nothing_and_says_so(
        gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """The profiler's records of the other graphs' replays lost (each replay's result had passed
    its check): not a disagreement, a note. A graph that really launched nothing is caught by the
    check of its results before the inventory is read."""
    real = CudaTimer.kernels_of

    def losing(fn: Callable[[], Any]) -> list[str]:
        return [] if getattr(fn, "__name__", "") == "each_once" else real(fn)

    monkeypatch.setattr(CudaTimer, "kernels_of", staticmethod(losing))
    m = CudaTimer(H200).measure(Drifting(gpu, odd=99), PLAN)
    assert m.kernels == {"pytorch_flash::flash_fwd_kernel": 1}
    assert any(n.startswith("kernel inventory: the profile of the other 7 timed graphs' replays recorded none of "
                            "their kernels") for n in m.notes)


def test_the_disagreement_counts_by_normalised_name() -> None:
    first = Counter({"void f<1>(int)": 1, "g": 2})
    assert disagreement(first, Counter({"void f<2>(int)": 3, "g": 6}), 3) is None  # variants of f count as one
    text = disagreement(first, Counter({"f": 3, "g": 5}), 3)
    assert text == ("the case's 4 timed graphs launch different kernels: over the other 3, "
                    "g 5 where 3 x the first's would be 6")


# -- against the eager checked call ---------------------------------------------------------------

COPY = "Memcpy DtoD (Device -> Device)"
SPLIT = "void pytorch_flash::flash_fwd_splitkv_kernel<Traits<64>, true>(Params)"


class Captured:
    """A kernel that launches other kernels eagerly than under capture (a library choosing its
    engine by whether the stream is capturing): eagerly a split kernel twice, two device copies and
    a host-to-device copy of its host-side parameters; in a graph the split kernel once and a
    combine kernel."""

    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu

    def __call__(self) -> None:
        self.gpu.now_ms += self.gpu.ms_per_call
        if self.gpu.replaying:
            self.gpu.launch(SPLIT, "void combine_kernel<4>(int)")
        else:
            self.gpu.launch(SPLIT, SPLIT, COPY, COPY, "Memcpy HtoD (Pageable -> Device)")


def test_eager_and_graph_that_agree_give_no_note(gpu: FakeGpu) -> None:
    """The checked call is profiled once after sampling (the harness's flush and fills are in the
    graph's replay only, and left out of it)."""
    m = CudaTimer(H200).measure(gpu.call, PLAN)
    assert m.kernels == {"pytorch_flash::flash_fwd_kernel": 1}
    assert m.kernels_vs_eager is None
    assert gpu.profiles == 5


def test_a_kernel_that_launches_other_kernels_eagerly_than_under_capture_is_noted(gpu: FakeGpu) -> None:
    """The note names each kernel only one side launched, and each count that differs; the
    host-to-device copy only the eager call makes is left out (no graph can hold one). The
    measurement stands: the inventory is the graph's."""
    m = CudaTimer(H200).measure(Captured(gpu), PLAN)
    assert m.kernels == {"combine_kernel": 1, "pytorch_flash::flash_fwd_splitkv_kernel": 1}
    assert m.kernels_vs_eager == (
        "the eager checked call launches other kernels than the timed graph: only eager "
        "Memcpy DtoD (Device -> Device) x2; only in the graph combine_kernel x1; "
        "count pytorch_flash::flash_fwd_splitkv_kernel 1 in the graph, 2 eager")
    assert m.median_ms == pytest.approx(0.02)


def test_the_backend_proofs_profile_is_compared_and_nothing_is_profiled_again(gpu: FakeGpu) -> None:
    proof = (gpu.kernel_names[0], COPY)  # the names the proof's profile of the checked call recorded
    m = CudaTimer(H200).measure(gpu.call, replace(PLAN, checked_kernels=proof))
    assert m.kernels_vs_eager == ("the eager checked call launches other kernels than the timed graph: "
                                  "only eager Memcpy DtoD (Device -> Device) x1")
    assert gpu.profiles == 4  # the harness's two, the first graph's, the other graphs': no eager call
    agreeing = CudaTimer(H200).measure(gpu.call, replace(PLAN, checked_kernels=gpu.kernel_names))
    assert agreeing.kernels_vs_eager is None


def test_an_inventory_read_from_an_eager_call_is_not_compared_with_one(gpu: FakeGpu) -> None:
    """Where the profiler cannot see a graph, the inventory is an eager call's already: nothing
    is compared, even with the proof's names of another call, and nothing more is profiled."""
    gpu.graph_visible = False
    m = CudaTimer(H200).measure(Captured(gpu), replace(PLAN, checked_kernels=(COPY,)))
    assert (m.kernels_source, m.kernels_vs_eager) == (EAGER, None)
    assert gpu.profiles == 3  # the harness's two, the eager call's


def test_an_eager_profile_that_fails_is_a_note_and_the_inventory_stays(
        gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch) -> None:
    case = Captured(gpu)

    def profile(fn: Callable[[], Any]) -> list[str]:
        if fn is case:
            raise RuntimeError("Profiler is already enabled on this thread")
        return gpu.profile(fn)

    monkeypatch.setattr(CudaTimer, "kernels_of", staticmethod(profile))
    m = CudaTimer(H200).measure(case, PLAN)
    assert m.kernels == {"combine_kernel": 1, "pytorch_flash::flash_fwd_splitkv_kernel": 1}
    assert m.kernels_vs_eager is None
    assert ("eager checked call's kernels not read (RuntimeError: Profiler is already enabled on this thread)"
            in m.notes)


def test_only_eager_copies_from_or_to_pageable_host_memory_are_left_out() -> None:
    graph = {"flash_fwd": 1}
    host = Counter({"flash_fwd": 1, "Memcpy HtoD (Pageable -> Device)": 3, "Memcpy DtoH (Device -> Pageable)": 1})
    assert eager_difference(graph, host) is None
    pinned = eager_difference(graph, Counter({"flash_fwd": 1, "Memcpy HtoD (Pinned -> Device)": 1}))
    assert pinned == ("the eager checked call launches other kernels than the timed graph: "
                      "only eager Memcpy HtoD (Pinned -> Device) x1")  # a graph can hold a pinned copy
    fills = eager_difference({}, Counter({f"fill_{i}": 1 for i in range(6)}), limit=2)
    assert fills == "the eager checked call launches other kernels than the timed graph: only eager " \
                    "fill_0 x1, fill_1 x1, and 4 more"


# -- the verdict, end to end ----------------------------------------------------------------------

INVENTORY_CONFTEST = CONFTEST + '''

import dataclasses


class InventoryTimer(ScriptedTimer):
    """The scripted timer, with the inventory kernels.json gives the test (none where it gives
    none), the difference from the eager checked call vs_eager.json gives it, and 1.25 s of
    profiling; each plan's inventory flag is appended to plans.json, and the checked call's
    kernels it carries (the backend proof's) are written to checked.json by test."""

    def measure(self, fn, plan):
        m = super().measure(fn, plan)
        asked = read_json("plans.json", [])
        (HERE / "plans.json").write_text(json.dumps(asked + [plan.inventory]))
        name, nodeid = current_test(plan)
        checked = read_json("checked.json", {})
        checked[name] = None if plan.checked_kernels is None else list(plan.checked_kernels)
        (HERE / "checked.json").write_text(json.dumps(checked))
        kernels = for_test(read_json("kernels.json", {}), name, nodeid, None)
        if kernels is None or plan.overhead:
            return m
        vs_eager = for_test(read_json("vs_eager.json", {}), name, nodeid, None)
        return dataclasses.replace(m, kernels=kernels, kernels_source="graph replay", inventory_s=1.25,
                                   kernels_vs_eager=vs_eager)


def pytest_attnperf_make_timer(config, device):
    return InventoryTimer()
'''

FLASH_CASE = {"pytorch_flash::flash_fwd_kernel": 1}
VS_EAGER = ("the eager checked call launches other kernels than the timed graph: only eager "
            "Memcpy DtoD (Device -> Device) x1")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    made = make_project(pytester, INVENTORY_CONFTEST, test_cases=TESTS)
    _kernels(made, FLASH_CASE)
    return made


def _kernels(project: pytest.Pytester, a: dict[str, int], b: dict[str, int] | None = None) -> None:
    """The inventories the scripted timer gives case a and case b (b: a's unless given)."""
    table = {"test_case[a]": a, "test_case[b]": FLASH_CASE if b is None else b}
    (project.path / "kernels.json").write_text(json.dumps(table))


def test_a_recording_writes_the_inventory_and_a_recording_again_replaces_it(project: pytest.Pytester) -> None:
    """One project, recorded and recorded again:

    - the main run asks the timer for the inventory of each case (not of the run's sample overhead),
      and its time counts as checking time;
    - the recording writes the inventory into the entry (a graph's replay, the usual source, not
      named), and an unchanged inventory passes with --attnperf-fail-on-kernel-change;
    - recording again replaces the inventory, and the new one passes with the opt-in;
    - entries without an inventory (as recorded before inventories) gate as before: another
      inventory is neither reported nor failed, even with the opt-in.
    """
    result = project.runpytest(*PLUGIN, "--update-baselines", "-p", "no:xdist")
    result.assert_outcomes(passed=2)
    asked = json.loads((project.path / "plans.json").read_text())
    assert asked.count(True) == 2  # the two cases; not the run's sample overhead
    result.stdout.fnmatch_lines(["*2.5 s of it checking what the timed calls computed*"])
    entry = entries(project)["test_cases.py::test_case[a]"]
    assert entry["kernels"] == FLASH_CASE
    assert "kernels_source" not in entry  # a graph's replay, the usual source
    rerun = project.runpytest(*PLUGIN, "--attnperf-fail-on-kernel-change")
    rerun.assert_outcomes(passed=2)
    assert "kernels changed" not in rerun.stdout.str()

    _kernels(project, {"fmha_cutlassF": 1})
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    assert entries(project)["test_cases.py::test_case[a]"]["kernels"] == {"fmha_cutlassF": 1}
    project.runpytest(*PLUGIN, "--attnperf-fail-on-kernel-change").assert_outcomes(passed=2)

    with editing_baseline(project) as data:  # as recorded before inventories
        for entry in data["entries"].values():
            del entry["kernels"]
    _kernels(project, FLASH_CASE)  # not the inventory recorded last
    result = project.runpytest(*PLUGIN, "--attnperf-fail-on-kernel-change")
    result.assert_outcomes(passed=2)
    assert "kernels changed" not in result.stdout.str()
    assert "unchanged" in result.stdout.str()


def test_a_changed_inventory_is_reported_and_fails_only_with_the_opt_in(project: pytest.Pytester) -> None:
    """One project recorded with case a's eager checked call launching a copy the timed graph does
    not, then gated run after run:

    - that difference from the eager call is a note (the case's notes, report.json, the JUnit XML),
      not kept in the entry, and never fails the case, even with --attnperf-fail-on-kernel-change;
    - a changed inventory is reported (the note, the summary's count, report.json, the JUnit XML)
      and passes without the opt-in;
    - a regression names the changed kernels too, and how the eager call's differ from the graph's;
    - with --attnperf-fail-on-kernel-change, or its ini setting, a changed inventory fails that
      case, and only that.
    """
    (project.path / "vs_eager.json").write_text(json.dumps({"test_case[a]": VS_EAGER}))
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    assert VS_EAGER not in json.dumps(entries(project)["test_cases.py::test_case[a]"])
    result = project.runpytest(*PLUGIN, "--attnperf-fail-on-kernel-change", "--attnperf-report=eager",
                               "--junitxml=eager.xml")
    result.assert_outcomes(passed=2)
    assert f"note: test_case[a]: {VS_EAGER}" in result.stdout.str()
    by_case = {row["nodeid"]: row for row in json.loads((project.path / "eager" / "report.json").read_text())["cases"]}
    assert by_case["test_cases.py::test_case[a]"]["kernels_vs_eager"] == VS_EAGER
    assert by_case["test_cases.py::test_case[b]"]["kernels_vs_eager"] is None
    properties = junit_properties(project.path / "eager.xml")
    assert properties["test_case[a]"]["attnperf_kernels_vs_eager"] == VS_EAGER
    assert "attnperf_kernels_vs_eager" not in properties["test_case[b]"]

    _kernels(project, {"fmha_cutlassF_bf16_aligned_64x64_rf_sm80": 1, "Memcpy DtoD (Device -> Device)": 1})
    result = project.runpytest(*PLUGIN, "--attnperf-report=out", "--junitxml=junit.xml")
    result.assert_outcomes(passed=2)
    message = ("kernels changed: added Memcpy DtoD (Device -> Device) x1, fmha_cutlassF_bf16_aligned_64x64_rf_sm80 x1; "
               "removed pytorch_flash::flash_fwd_kernel x1")
    out = result.stdout.str()
    assert f"note: test_case[a]: {message}" in out
    assert "kernels changed in 1 of 2 cases against their baseline entries" in out
    report = json.loads((project.path / "out" / "report.json").read_text())
    by_case = {row["nodeid"]: row for row in report["cases"]}
    assert by_case["test_cases.py::test_case[a]"]["kernels_changed"] == message
    assert by_case["test_cases.py::test_case[b]"]["kernels_changed"] is None
    assert by_case["test_cases.py::test_case[b]"]["kernels"] == FLASH_CASE
    properties = junit_properties(project.path / "junit.xml")
    assert properties["test_case[a]"]["attnperf_kernels_changed"] == message
    assert "attnperf_kernels_changed" not in properties["test_case[b]"]

    set_speed(project, a=1.2)
    _kernels(project, {"fmha_cutlassF": 1})
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    failure = out[out.index("REGRESSED"):out.index("short test summary")]
    assert "kernels changed: added fmha_cutlassF x1; removed pytorch_flash::flash_fwd_kernel x1" in failure
    assert VS_EAGER in failure[:failure.index("= attnperf =")]  # and how the eager call's differ from the graph's

    set_speed(project, a=1.0)
    _kernels(project, FLASH_CASE, {"pytorch_flash::flash_fwd_kernel": 2})
    opted = ["*test_case?b?: kernels changed: count pytorch_flash::flash_fwd_kernel 1 -> 2 "
             "(against *h200.yaml; --attnperf-fail-on-kernel-change is set)"]
    flag = project.runpytest(*PLUGIN, "--attnperf-fail-on-kernel-change")
    flag.assert_outcomes(passed=1, failed=1)
    flag.stdout.fnmatch_lines(opted)
    ini = project.path / "tox.ini"
    ini.write_text(ini.read_text().rstrip("\n") + "\nattnperf_fail_on_kernel_change = true\n")
    from_ini = project.runpytest(*PLUGIN)
    from_ini.assert_outcomes(passed=1, failed=1)
    from_ini.stdout.fnmatch_lines(opted)


def test_the_profiler_sets_teardown_cupti_and_notes_a_profile_that_left_it_attached(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The inventory's profile, like the backend proof's, is noted when it stopped with CUPTI
    left attached."""
    from pytest_attnperf.measure import profiled

    monkeypatch.setattr(profiled, "AT_STOP", {"kernel inventory's": "1"})
    assert profiled.cupti_attached_note() is None
    profiled.AT_STOP["kernel inventory's"] = "0"
    note = profiled.cupti_attached_note() or ""
    assert "TEARDOWN_CUPTI was '0' when the kernel inventory's profile stopped" in note


def test_the_harness_part_of_a_replay() -> None:
    flush, fill = Counter({"fill<i8>": 1}), Counter({"fill<long>": 2})
    harness = Harness(flush + fill, flush)
    assert harness.visible
    assert harness.of_replay(holds_flush=True) == flush + fill
    assert harness.of_replay(holds_flush=False) == fill
    assert not Harness(fill, flush).visible  # the flush graph's replay showed no flush


PROOF_CONFTEST = INVENTORY_CONFTEST + '''

PROFILED = (["aten::_scaled_dot_product_flash_attention"],
            ["void pytorch_flash::flash_fwd_kernel<Traits<64>>(Params)", "Memcpy DtoD (Device -> Device)"])


@pytest.fixture(autouse=True)
def profiled(monkeypatch):
    """The backend proof's profile on the fake GPU: the flash op, a flash kernel and a copy."""
    from pytest_attnperf import fixture, markers

    def names(fn, device):
        fn()
        return PROFILED

    monkeypatch.setattr(markers, "profile_names", names)
    monkeypatch.setattr(fixture, "profile_names", names)
'''

PROOF_TESTS = '''
import pytest

from pytest_attnperf.costs import Cost

COST = Cost(flops=1e9, bytes=1e6)


@pytest.mark.attnperf_sdpa_backend("flash")
def test_pinned(attnperf):
    attnperf.measure(lambda: None, cost=COST, dtype="bf16")


def test_detected(attnperf):
    assert attnperf.measure(lambda: None, cost=COST, dtype="bf16", detect_backend=True).backend == "flash"


def test_plain(attnperf):
    attnperf.measure(lambda: None, cost=COST, dtype="bf16")
'''


def test_the_backend_proofs_profile_of_the_checked_call_is_handed_to_the_timer(pytester: pytest.Pytester) -> None:
    """A pinned or detected backend's proof profiled the checked call: its kernels go to the timer
    in the plan, for the inventory to compare with; a case with no proof gets none (the timer
    profiles one eager call itself)."""
    project = make_project(pytester, PROOF_CONFTEST, test_proof=PROOF_TESTS)
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=3)
    kernels = ["void pytorch_flash::flash_fwd_kernel<Traits<64>>(Params)", "Memcpy DtoD (Device -> Device)"]
    assert json.loads((project.path / "checked.json").read_text()) == {
        "test_pinned": kernels, "test_detected": kernels, "test_plain": None}

