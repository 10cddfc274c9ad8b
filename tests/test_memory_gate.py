"""The memory gate: a case's peak memory above its inputs against its baseline's (its own
tolerance) and against its family's analytic bound for a tiled kernel, each failing the case apart
from its time; the peak as the CUDA timer takes it, and the option that turns the comparison off."""

from __future__ import annotations

import functools
import math
from typing import Any

import kit
import pytest

from pytest_attnperf.families.linear.kernels import LinearCase
from pytest_attnperf.families.linear.memory import memory_bound as linear_bound
from pytest_attnperf.families.memory import bound_for
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.families.softmax.kernels import SoftmaxCase
from pytest_attnperf.families.softmax.memory import memory_bound as softmax_bound
from pytest_attnperf.families.softmax.suite import CASES as SOFTMAX_CASES
from pytest_attnperf.gate.memory import MIB, Bound, Tolerance, against_baseline, against_bound
from pytest_attnperf.measure.sampling import HostTimer, SamplingPlan
from pytest_attnperf.measure.timing import CudaTimer

pytest_plugins = ["pytester"]

DEFAULT = Tolerance()  # 4 MiB + 1%


# -- against the baseline ---------------------------------------------------------------------


def test_an_unchanged_peak_passes() -> None:
    check = against_baseline(100.0, 100.0, DEFAULT)
    assert check is not None
    assert not check.failed
    assert check.status == "unchanged"
    assert check.ratio == 1.0


def test_a_peak_grown_beyond_the_tolerance_fails_with_both_figures() -> None:
    check = against_baseline(105.1, 100.0, DEFAULT)  # allowed: 100 x 1.01 + 4 = 105 MiB
    assert check is not None
    assert check.failed
    assert check.status == "memory regressed"
    assert check.message.startswith("memory regressed: peak above the inputs 105.10 MiB, baseline 100.00 MiB (+5.1%)")
    assert "allowed 105.00 MiB (--attnperf-memory-tolerance 4MiB+1%)" in check.message
    assert check.limit_mib == pytest.approx(105.0)
    assert not check.of_bound


def test_a_peak_within_the_tolerance_passes() -> None:
    check = against_baseline(104.9, 100.0, DEFAULT)
    assert check is not None
    assert not check.failed
    assert check.status == "unchanged"


def test_the_floor_holds_small_peaks_and_only_the_floor() -> None:
    tiny = against_baseline(4.1, 0.2, DEFAULT)  # allowed 4.202: a small workspace's MiB is no share
    assert tiny is not None
    assert not tiny.failed
    grown = against_baseline(4.3, 0.2, DEFAULT)
    assert grown is not None
    assert grown.failed


@pytest.mark.parametrize(("recorded", "gated"),
                         [(15.001, 17.0015), (26.189, 28.189), (2167.9, 2171.625), (52.122, 53.247)])
def test_the_growths_seen_between_h200_runs_pass_the_default(recorded: float, gated: float) -> None:
    """docs/memory.md, "Tolerance": what moved between fresh H200 machines and the recordings."""
    check = against_baseline(gated, recorded, DEFAULT)
    assert check is not None
    assert not check.failed


def test_a_peak_that_shrank_is_smaller_and_passes() -> None:
    check = against_baseline(50.0, 100.0, DEFAULT)
    assert check is not None
    assert not check.failed
    assert check.status == "smaller"


@pytest.mark.parametrize("recorded", [None, "100", True, math.nan, math.inf, -1.0])
def test_no_usable_baseline_figure_compares_nothing(recorded: Any) -> None:
    assert against_baseline(100.0, recorded, DEFAULT) is None


def test_no_peak_or_the_tolerance_off_compares_nothing() -> None:
    assert against_baseline(None, 100.0, DEFAULT) is None
    assert against_baseline(1000.0, 100.0, Tolerance.parse("off")) is None


@pytest.mark.parametrize(("text", "floor", "share"), [
    ("1MiB+1%", 1.0, 0.01), ("5%", 0.0, 0.05), ("2MiB", 2.0, 0.0), (" 0.5 MiB + 2.5 % ", 0.5, 0.025),
    ("3%+4MiB", 4.0, 0.03),
])
def test_the_tolerance_reads_a_floor_and_a_share(text: str, floor: float, share: float) -> None:
    tolerance = Tolerance.parse(text)
    assert tolerance.floor_mib == pytest.approx(floor)
    assert tolerance.share == pytest.approx(share)
    assert not tolerance.off
    assert Tolerance.parse(tolerance.describe()) == tolerance


@pytest.mark.parametrize("text", ["", "1", "1GiB", "1MiB+2MiB", "x%", "1%+", "inf%", "-1%"])
def test_a_bad_tolerance_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected off|give each of MiB and % once"):
        Tolerance.parse(text)


def test_off_reads_in_any_case() -> None:
    assert Tolerance.parse("OFF").off
    assert Tolerance.parse("off").describe() == "off"


# -- the analytic bound -----------------------------------------------------------------------


def _terms(bound: Bound) -> dict[str, float]:
    return dict(bound.terms)


def test_the_softmax_forward_bound_is_the_output_and_row_statistics_doubled_plus_the_fixed_part() -> None:
    case = SoftmaxCase("c", 2, 4, 200, 64, "bf16", True)  # 200 rows padded to 256
    bound = softmax_bound(case, "fwd")
    assert _terms(bound) == {"output": 2 * 4 * 200 * 64 * 2, "row statistics": 2 * (2 * 4 * 256) * 4}
    assert bound.bytes == 2 * (2 * 4 * 200 * 64 * 2 + 2 * 2 * 4 * 256 * 4) + 16 * MIB
    assert bound.mib == pytest.approx(bound.bytes / 2**20)


def test_the_softmax_backward_bound_adds_the_gradients_and_an_fp32_dq_accumulator() -> None:
    case = SoftmaxCase("c", 1, 2, 128, 32, "fp32", False)
    terms = _terms(softmax_bound(case, "fwdbwd"))
    assert terms == {"output": 1 * 2 * 128 * 32 * 4, "row statistics": 3 * 256 * 4,
                     "gradients": 3 * 2 * 128 * 32 * 4, "fp32 dq accumulator": 256 * 32 * 4}


def test_grouped_kv_may_be_expanded_to_the_query_heads() -> None:
    case = SoftmaxCase("c", 2, 12, 1024, 64, "bf16", True, kv_heads=3)
    forward, both = _terms(softmax_bound(case, "fwd")), _terms(softmax_bound(case, "fwdbwd"))
    assert forward["K/V expanded to the query heads"] == 2 * 2 * 12 * 1024 * 64 * 2
    assert both["gradients"] == (2 * 12 + 2 * 2 * 3) * 1024 * 64 * 2
    assert both["per-query-head fp32 dk, dv"] == 2 * (2 * 12 * 1024) * 64 * 4


@pytest.mark.parametrize("case_id", ["b32-h16-t1024-d64-causal-bf16", "b1-h12-t2048-d64-causal-bf16",
                                     "b2-h12-kv3-t1024-d64-causal-bf16", "b1-h12-t4096-d64-w512-bf16"])
@pytest.mark.parametrize("direction", ["fwd", "fwdbwd"])
def test_one_score_matrix_is_over_the_bound_on_the_long_gpu_cases(case_id: str, direction: str) -> None:
    """A kernel that materialises the B x H x T x T scores in the case's dtype is caught: once in a
    forward, twice in a backward (the probabilities autograd keeps and their gradient)."""
    case = next(c for c in SOFTMAX_CASES if c.id == case_id)
    scores = (1 if direction == "fwd" else 2) * case.batch * case.heads * case.seq**2 * 2
    assert scores > softmax_bound(case, direction).bytes


def test_the_bound_cannot_tell_scores_from_the_output_where_t_is_below_d() -> None:
    """b1000-h80-t32: the scores are half the output, within the slack (docs/memory.md)."""
    case = next(c for c in SOFTMAX_CASES if c.id == "b1000-h80-t32-d64-fp16")
    assert case.batch * case.heads * case.seq**2 * 2 < softmax_bound(case, "fwd").bytes


def test_the_linear_bound_counts_tokens_chunk_matrices_and_chunk_states() -> None:
    case = LinearCase("c", 2, 4, 100, 16, 32, "bf16")  # 100 tokens: 2 chunks of 64
    tokens, states = 2 * 100 * 4, 2 * 4 * 2 * 16 * 32 * 4
    forward = _terms(linear_bound(case, "fwd"))
    assert forward == {"output": tokens * 32 * 2, "per-token intermediates": 4 * tokens * 32 * 4,
                       "intra-chunk matrices": 2 * tokens * 64 * 4, "chunk states": states}
    both = _terms(linear_bound(case, "fwdbwd"))
    assert both["chunk states recomputed and their gradients"] == 2 * states
    assert linear_bound(case, "fwdbwd").bytes == 2 * sum(both.values()) + 16 * MIB


def test_a_state_per_token_is_over_the_linear_bound_at_the_gpu_shape() -> None:
    """A torch loop under autograd keeps a K x V state per token: C times the chunk states."""
    case = LinearCase("c", 4, 16, 1024, 128, 128, "bf16")
    per_token_states = 4 * 16 * 1024 * 128 * 128 * 4
    assert per_token_states > linear_bound(case, "fwdbwd").bytes


def test_a_peak_over_the_bound_fails_with_both_figures_and_a_way_out() -> None:
    bound = Bound((("output", 4 * MIB),), 2.0, 16 * MIB)  # 24 MiB
    check = against_bound(100.0, bound, "kernel 'k'")
    assert check is not None
    assert check.failed
    assert check.status == "over the memory bound"
    assert check.message.startswith("over the memory bound: peak above the inputs 100.00 MiB, bound 24.00 MiB "
                                    "= 2 x (output 4.0 MiB) + 16 MiB; kernel 'k' is registered as tiled")
    assert "tiled=False" in check.message
    assert check.of_bound
    within = against_bound(24.0, bound)
    assert within is not None
    assert not within.failed
    assert within.ratio == 1.0
    assert against_bound(None, bound) is None
    assert against_bound(1.0, None) is None


def _kernel(family: str = "softmax", **options: Any) -> Kernel:
    return Kernel(family, "k", lambda *a, **k: None, **options)


def test_a_tiled_kernel_is_held_to_its_familys_bound_and_an_untiled_one_is_not() -> None:
    case = SoftmaxCase("c", 1, 1, 64, 16, "bf16", False)
    assert bound_for(_kernel(), case, "fwd") == softmax_bound(case, "fwd")
    assert bound_for(_kernel(tiled=False), case, "fwd") is None
    linear = LinearCase("c", 1, 64, 1, 16, 16, "bf16")
    assert bound_for(_kernel("gla"), linear, "fwdbwd") == linear_bound(linear, "fwdbwd")


@pytest.mark.parametrize(("family", "case", "direction"), [
    ("toy", SoftmaxCase("c", 1, 1, 64, 16, "bf16", False), "fwd"),  # a family without a bound
    ("softmax", LinearCase("c", 1, 64, 1, 16, 16, "bf16"), "fwd"),  # a case its family does not know
    ("softmax", SoftmaxCase("c", 1, 1, 64, 16, "bf16", False), "bwd"),  # no such direction
    ("softmax", None, None),  # a test without the suites' parameters
])
def test_no_bound_where_the_family_case_or_direction_has_none(family: str, case: Any, direction: Any) -> None:
    assert bound_for(_kernel(family), case, direction) is None


def test_the_builtin_kernels_that_materialise_scores_are_declared_untiled() -> None:
    from pytest_attnperf.families.builtin import register_builtin

    registry = KernelRegistry()
    register_builtin(registry)
    untiled = {(k.family, k.name) for k in registry if not k.tiled}
    assert untiled == {("softmax", "naive"), ("softmax", "sdpa-math"), ("softmax", "sdpa-dense-window"),
                       *((family, "fla-naive") for family in ("linear_attn", "gla", "simple_gla", "gdn"))}


def test_a_registered_kernel_is_tiled_unless_it_says_not() -> None:
    registry = KernelRegistry()
    registry.kernel(family="softmax", name="mine")(lambda q, k, v, *, causal, scale, window=None: q)
    registry.kernel(family="softmax", name="dense", tiled=False)(lambda q, k, v, *, causal, scale, window=None: q)
    assert {k.name: k.tiled for k in registry} == {"mine": True, "dense": False}


# -- the peak as it is taken ------------------------------------------------------------------


def test_the_cuda_peak_is_what_one_call_holds_above_what_was_allocated_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inputs of 300 MiB held before; the call holds a 40 MiB workspace beside its 8 MiB output,
    frees the workspace and returns: 48 MiB, whatever the inputs and earlier peaks were."""
    allocator = kit.fake_allocator(monkeypatch, 300 * 2**20)
    allocator.hold(500 * 2**20)  # an earlier case's peak, gone before this one
    allocator.free(500 * 2**20)

    def call() -> str:
        allocator.hold(8 * 2**20)
        allocator.hold(40 * 2**20)
        allocator.free(40 * 2**20)
        return "output"

    assert CudaTimer._peak_mib(call) == 48.0


def test_the_host_timer_measures_no_peak() -> None:
    """No allocator statistics on the CPU: no figure, so no memory gate (docs/memory.md)."""
    m = HostTimer().measure(lambda: None, SamplingPlan(min_samples=3, max_samples=3, budget_s=0.01))
    assert m.peak_mib is None


# -- through the plugin -----------------------------------------------------------------------

TILED_TESTS = '''
from pytest_attnperf.costs import Cost
from pytest_attnperf.families.softmax.kernels import SoftmaxCase

ATTNPERF_FAMILY = "softmax"
ATTNPERF_CASES = (SoftmaxCase("b32-h16-t1024-d64-causal-bf16", 32, 16, 1024, 64, "bf16", True),)


def test_memory(case, kernel, direction, attnperf):
    attnperf.measure(lambda: None, cost=Cost(flops=1e9, bytes=1e6), dtype=case.dtype)
'''

MY_KERNELS = kit.CONFTEST + '''

def pytest_attnperf_register_kernels(registry, config):
    def attention(q, k, v, *, causal, scale, window=None):
        return q

    registry.kernel(family="softmax", name="mine-tiled", backward=False)(attention)
    registry.kernel(family="softmax", name="mine-dense", backward=False, tiled=False)(attention)
'''


def test_a_kernel_claiming_tiled_whose_peak_exceeds_the_bound_fails(pytester: pytest.Pytester) -> None:
    """The fake H200 reports 2048 MiB above the inputs (the case's bf16 scores are 1 GiB) for
    both kernels: the one registered as tiled fails over its bound of 152 MiB, with both figures;
    the one registered with tiled=False passes; a tiled peak under the bound passes."""
    kit.make_project(pytester, MY_KERNELS, test_memory=TILED_TESTS)
    kit.set_peaks(pytester, {"*": 2048.0})
    result = pytester.runpytest(*kit.PLUGIN, "-k", "mine", "-rA", "--benchmark-disable")
    assert kit.outcomes(result) == {
        "test_memory.py::test_memory[b32-h16-t1024-d64-causal-bf16-mine-tiled-fwd]": "FAILED",
        "test_memory.py::test_memory[b32-h16-t1024-d64-causal-bf16-mine-dense-fwd]": "PASSED",
    }
    result.stdout.fnmatch_lines(["*over the memory bound: peak above the inputs 2048.00 MiB, bound 152.00 MiB = 2 x "
                                 "(output 64.0 MiB + row statistics 4.0 MiB) + 16 MiB; kernel 'mine-tiled'*"])
    result.stdout.fnmatch_lines(["attnperf on h200: 2 measured cases (2 new; 1 over the memory bound)"])
    result.stdout.fnmatch_lines(["*mine-tiled-fwd]*2048.0*-*1347 OVER*new*"])  # the summary's row

    kit.set_peaks(pytester, {"*": 100.0})
    result = pytester.runpytest(*kit.PLUGIN, "-k", "mine", "-rA", "--benchmark-disable")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*mine-tiled-fwd]*100.0*-*66 within*new*"])


def test_a_recording_over_the_bound_fails_and_writes_no_entry(pytester: pytest.Pytester) -> None:
    kit.make_project(pytester, MY_KERNELS, test_memory=TILED_TESTS)
    kit.set_peaks(pytester, {"*": 2048.0})
    result = pytester.runpytest(*kit.PLUGIN, "-k", "mine", "--update-baselines", "--benchmark-disable")
    result.assert_outcomes(passed=1, failed=1)
    assert [key.split("[")[1] for key in kit.entries(pytester)] == ["b32-h16-t1024-d64-causal-bf16-mine-dense-fwd]"]


def test_a_peak_grown_beyond_its_tolerance_fails_apart_from_the_time(pytester: pytest.Pytester) -> None:
    """Recorded at 100 MiB a case, then gated run after run:

    - at 100 (a) and 150 (b): b fails as memory regressed with both figures, its time unchanged;
      a passes; the summary says which of the two regressed;
    - time and memory are judged apart: both at 150 and a 20% slower, a fails with both, and the
      memory alone fails b, whose time is unchanged;
    - --attnperf-memory-tolerance=off turns the comparison off; the tolerance reads from the ini
      (60% passes 150 over 100, 40% fails both, allowing 140 MiB).
    """
    kit.make_project(pytester, test_cases=kit.TESTS)
    kit.set_peaks(pytester, {"*": 100.0})
    pytester.runpytest(*kit.PLUGIN, "--update-baselines", "--benchmark-disable").assert_outcomes(passed=2)
    assert {e["peak_mib"] for e in kit.entries(pytester).values()} == {100.0}

    kit.set_peaks(pytester, {"test_case[a]": 100.0, "test_case[b]": 150.0})
    result = pytester.runpytest(*kit.PLUGIN, "--benchmark-disable", "-rA")
    assert kit.outcomes(result) == {"test_cases.py::test_case[a]": "PASSED", "test_cases.py::test_case[b]": "FAILED"}
    result.stdout.fnmatch_lines([
        "*::test_case?b?: memory regressed: peak above the inputs 150.00 MiB, baseline 100.00 MiB (+50.0%); "
        "allowed 105.00 MiB (--attnperf-memory-tolerance 4MiB+1%)",
    ])
    result.stdout.fnmatch_lines(["attnperf on h200: 2 measured cases (2 unchanged; 1 memory regressed)"])
    result.stdout.fnmatch_lines(["test_case?a?*100.0*+0.0% unchanged*+0.0% unchanged",
                                 "test_case?b?*150.0*+50.0% REGRESSED*+0.0% unchanged"])
    assert "REGRESSED +" not in result.stdout.str()  # the time did not regress

    kit.set_peaks(pytester, {"*": 150.0})
    kit.set_speed(pytester, a=1.2)
    result = pytester.runpytest(*kit.PLUGIN, "--benchmark-disable", "-rA")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "test_case[a]: REGRESSED +20.0%" in out
    start = out.index("= FAILURES =")
    failures = out[start:out.index("\n=", start + 1)]  # the summary after it repeats as much as the terminal allows
    assert failures.count("memory regressed: peak above the inputs 150.00 MiB, baseline 100.00 MiB") == 2

    kit.set_speed(pytester, a=1.0)
    pytester.runpytest(*kit.PLUGIN, "--benchmark-disable", "--attnperf-memory-tolerance=off").assert_outcomes(passed=2)
    pytester.makeini(f"[pytest]\naddopts = {kit.ADDOPTS}\nattnperf_memory_tolerance = 60%\n")
    pytester.runpytest(*kit.PLUGIN, "--benchmark-disable").assert_outcomes(passed=2)
    pytester.makeini(f"[pytest]\naddopts = {kit.ADDOPTS}\nattnperf_memory_tolerance = 40%\n")
    result = pytester.runpytest(*kit.PLUGIN, "--benchmark-disable")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*allowed 140.00 MiB (--attnperf-memory-tolerance 0MiB+40%)*"])


def test_a_bad_memory_tolerance_is_a_usage_error_naming_its_source(pytester: pytest.Pytester) -> None:
    kit.make_project(pytester, test_cases=kit.TESTS)
    result = pytester.runpytest(*kit.PLUGIN, "--attnperf-memory-tolerance=lots")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value 'lots' from --attnperf-memory-tolerance*"])


def test_the_memory_zoo_kernel_materialises_scores_while_claiming_to_be_tiled() -> None:
    """Its registration says tiled; its answer is naive's, so a GPU run can only fail it on memory."""
    from zoo import memory as zoo

    registry = KernelRegistry()
    zoo.register(registry)
    (kernel,) = list(registry)
    case = next(c for c in SOFTMAX_CASES if c.id == "b32-h16-t1024-d64-causal-bf16")
    assert kernel.name in zoo.BAD
    assert kernel.tiled
    assert bound_for(kernel, case, "fwd") == softmax_bound(case, "fwd")
    import torch

    from pytest_attnperf.families.softmax.kernels import naive

    q = torch.randn(1, 2, 8, 4)
    assert torch.equal(kernel.fn(q, q, q, causal=True, scale=0.5), naive(q, q, q, causal=True, scale=0.5))


def test_report_md_shows_each_cases_memory_checks() -> None:
    from dataclasses import asdict

    from pytest_attnperf.report.studies import build, render_md

    grown = against_baseline(150.0, 100.0, DEFAULT)
    assert grown is not None
    case = {"nodeid": "t.py::test_x[a]", "backend": "-", "median_ms": 1.0, "stdrel": 0.0, "tflops": 1.0,
            "mfu": None, "gb_per_s": 1.0, "bandwidth_frac": None, "peak_mib": 150.0, "status": "unchanged",
            "params": {}, "memory": [asdict(grown)]}
    md = render_md(build([case, {**case, "nodeid": "t.py::test_x[b]", "memory": []}], {}, {}))
    assert "| peak MiB | memory | status |" in md
    assert "| 150.0 | memory regressed | unchanged |" in md
    assert "| 150.0 | - | unchanged |" in md


@functools.cache
def _recorded_peaks() -> list[tuple[Kernel, Any, str, float]]:
    """The committed H200 recordings of the built-in suites: ``(kernel, case, direction, peak_mib)``,
    read once a process (libyaml's safe loader where it is there: the file's 400 kB take the
    pure-Python one seconds)."""
    import re

    import yaml

    from pytest_attnperf.families.builtin import register_builtin
    from pytest_attnperf.families.linear.suite import CASES as LINEAR_CASES

    registry = KernelRegistry()
    register_builtin(registry)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    entries = yaml.load((kit.ROOT / "baselines" / "h200.yaml").read_text(), Loader=loader)["entries"]
    found = []
    for nodeid, entry in entries.items():
        match = re.search(r"test_(softmax|linear)\.py::test_\w+\[(.+)-(fwd|fwdbwd)\]$", nodeid)
        if match is None or "peak_mib" not in entry:
            continue
        softmax, params, direction = match[1] == "softmax", match[2], match[3]
        case = max((c for c in (SOFTMAX_CASES if softmax else LINEAR_CASES) if params.startswith(f"{c.id}-")),
                   key=lambda c: len(c.id))
        family, name = ("softmax", params[len(case.id) + 1:]) if softmax else params[len(case.id) + 1:].split("-", 1)
        kernel = next(k for k in registry if (k.family, k.name) == (family, name))
        found.append((kernel, case, direction, float(entry["peak_mib"])))
    return found


def test_the_committed_h200_peaks_of_the_builtin_tiled_kernels_are_within_their_bounds() -> None:
    """The margin: every recorded peak of a tiled built-in kernel (flash, efficient, cuDNN, flex,
    fla's chunk and fused kernels) is within its bound, by a quarter at least."""
    tiled = [(k, c, d, peak) for k, c, d, peak in _recorded_peaks() if k.tiled]
    assert len(tiled) >= 150
    worst = max(peak / softmax_or_linear(k, c, d) for k, c, d, peak in tiled)
    assert worst < 0.75


def test_the_committed_h200_peaks_of_materialised_scores_are_over_the_bound_from_t1024() -> None:
    """The power: naive's and the math backend's recorded peaks on every case of T >= 1024 are over
    the bound a tiled kernel would be held to, by 2.5 times at least."""
    dense = [(k, c, d, peak) for k, c, d, peak in _recorded_peaks()
             if k.name in ("naive", "sdpa-math") and k.family == "softmax" and c.seq >= 1024]
    assert len(dense) >= 30
    assert min(peak / softmax_or_linear(k, c, d) for k, c, d, peak in dense) > 2.5


def softmax_or_linear(kernel: Kernel, case: Any, direction: str) -> float:
    """The bound in MiB the family gives the case, whether the kernel is tiled or not."""
    bound = softmax_bound(case, direction) if kernel.family == "softmax" else linear_bound(case, direction)
    return bound.mib


def test_the_memory_tool_reads_the_committed_peaks_against_their_bounds() -> None:
    lines = kit.tool("memory").from_baseline(kit.ROOT / "baselines" / "h200.yaml")
    assert lines[0] == "| kernel | case | dir | peak MiB | bound MiB | peak / bound | kernel is | verdict |"
    assert "| softmax/naive | b32-h16-t1024-d64-causal-bf16 | fwd | 2113.0 | 152.0 | 13.901 | exempt | OVER |" in lines
    assert "tiled kernels' worst peak / bound 0.716" in lines[-1]


def test_the_memory_tool_tables_a_runs_junit_and_the_noise_runs(tmp_path: Any) -> None:
    tool, node = kit.tool("memory"), "test_softmax[b32-h16-t1024-d64-causal-bf16-{}-fwd]"
    (tmp_path / "run.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        f'<testcase classname="suites.test_softmax" name="{node.format("memory-bad-dense-scores")}"><properties>'
        '<property name="attnperf_peak_mib" value="2113"/><property name="attnperf_memory_bound_mib" value="152"/>'
        '<property name="attnperf_memory" value="over the memory bound"/></properties>'
        '<failure message="...: over the memory bound: peak above the inputs">x</failure></testcase>'
        f'<testcase classname="suites.test_softmax" name="{node.format("naive")}"><properties>'
        '<property name="attnperf_peak_mib" value="2113"/></properties></testcase>'
        '</testsuite></testsuites>')
    rows = tool.from_junit([tmp_path / "run.xml"])
    assert rows[2:] == [
        "| memory-bad-dense-scores | b32-h16-t1024-d64-causal-bf16 | fwd | 2113 | 152 | over the memory bound | "
        "failed over the memory bound |",
        "| naive | b32-h16-t1024-d64-causal-bf16 | fwd | 2113 | (152.0 exempt) | - | passed |",
    ]
    for name, peaks in (("a", [4096, 4096]), ("b", [4096, 4608])):
        (tmp_path / f"{name}.json").write_text(
            f'[{{"kernel": "sdpa", "case": "c", "direction": "fwd", "peaks_bytes": {peaks}}}]')
    table = tool.noise_table([tmp_path / "a.json", tmp_path / "b.json"])
    assert table[2] == "| sdpa | c | fwd | 0.004 | 2 | 512 | 512 |"
    assert table[-1] == "largest spread: 512 bytes (0.000 MiB)"
