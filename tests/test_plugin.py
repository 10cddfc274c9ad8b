"""The plugin end to end under pytester, with fake hardware and a scripted timer.

The scripted timer (tests/kit.py) gives every case 20 per-call samples around
1 ms times a factor read from ``speed.json``, so a test can make one case 10% slower and
check that exactly that test fails, with a readable message. One run per verdict and the
plumbing around it; the gate's rules themselves are proven with plain numbers in
tests/unit/test_units_policy.py and tests/unit/test_units_policy_runs.py.
"""

from __future__ import annotations

import json

import pytest
from kit import (
    PLUGIN,
    TESTS,
    baseline,
    benchmarks,
    cuda_available,
    make_project,
    pythonpath,
    set_clocks,
    set_speed,
    set_speeds,
)

from pytest_attnperf.noise.runs import _outcomes


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester, test_cases=TESTS)


def test_update_then_unchanged_rerun_passes(project: pytest.Pytester) -> None:
    project.runpytest(*PLUGIN, "--hw=h200", "--update-baselines").assert_outcomes(passed=2)
    data = baseline(project)
    assert sorted(data["entries"]) == ["test_cases.py::test_case[a]", "test_cases.py::test_case[b]"]
    entry = data["entries"]["test_cases.py::test_case[a]"]
    assert entry["n_samples"] == 20
    assert entry["median_ms"] == pytest.approx(1.0, rel=0.01)
    assert data["meta"]["hardware"] == "h200"
    assert data["meta"]["device"] == "NVIDIA H200"
    rerun = project.runpytest(*PLUGIN, "--hw=h200")
    rerun.assert_outcomes(passed=2)
    assert "unchanged" in rerun.stdout.str()


def test_ten_percent_slower_fails_that_test_only(project: pytest.Pytester) -> None:
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.10)
    result = project.runpytest(*PLUGIN, "--hw=h200")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*test_case?a?: REGRESSED +10.0% against the baseline*"])
    assert "baseline: median 1 ms" in out
    assert "current:  median 1.1 ms" in out
    assert "FAILED test_cases.py::test_case[b]" not in out
    assert "re-measured after a suspected regression" in out


def test_cupti_left_attached_is_noted_on_the_re_measured_failure(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU profile that stopped with TEARDOWN_CUPTI=0 (as torch.compile's CUDA graphs set it):
    every GPU case says so, the failing one too, whose notes come from its second measurement."""
    from pytest_attnperf.measure import profiled

    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    monkeypatch.setattr(profiled, "AT_STOP", {"backend proof's": "0"})
    set_speed(project, a=1.10)
    result = project.runpytest(*PLUGIN, "--hw=h200")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    failure = out[out.index("REGRESSED"):out.index("short test summary")]
    assert "re-measured after a suspected regression" in failure
    assert "TEARDOWN_CUPTI was '0' when the backend proof's profile stopped" in failure
    assert out.count("TEARDOWN_CUPTI was '0'") >= 2  # the summary notes the passing case too


def test_missing_entry_passes_as_new_unless_required(project: pytest.Pytester) -> None:
    ungated = project.runpytest(*PLUGIN)
    ungated.assert_outcomes(passed=2)
    ungated.stdout.fnmatch_lines(["*attnperf: no baselines folder at *"])  # named, not gated
    (project.path / "baselines").mkdir()  # a folder without this card's file: each case has no entry
    project.runpytest(*PLUGIN).assert_outcomes(passed=2)
    result = project.runpytest(*PLUGIN, "--attnperf-require-baseline")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*no entry in *h200.yaml and --attnperf-require-baseline is set*"])
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    project.runpytest(*PLUGIN, "--attnperf-require-baseline").assert_outcomes(passed=2)


def test_faster_case_passes_and_is_reported(project: pytest.Pytester) -> None:
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, b=0.8)
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_case[[]b[]]*-20.0% improved*"])


def test_update_rewrites_only_what_it_measured(project: pytest.Pytester) -> None:
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    before = baseline(project)
    set_speed(project, a=1.5)
    project.runpytest(*PLUGIN, "--update-baselines", "test_cases.py::test_case[a]").assert_outcomes(passed=1)
    after = baseline(project)
    key_a, key_b = "test_cases.py::test_case[a]", "test_cases.py::test_case[b]"
    assert after["entries"][key_b] == before["entries"][key_b]
    assert after["entries"][key_a]["median_ms"] == pytest.approx(1.5, rel=0.01)
    project.runpytest(*PLUGIN).assert_outcomes(passed=2)


def test_failed_test_is_not_recorded(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_more='''
        from pytest_attnperf.costs import Cost

        def test_measures_then_fails(attnperf):
            attnperf.measure(lambda: None, cost=Cost(1.0, 1.0), dtype="bf16")
            assert False, "wrong numbers"
        '''
    )
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2, failed=1)
    assert "test_more.py::test_measures_then_fails" not in baseline(project)["entries"]


def test_hw_mismatch_is_a_usage_error(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN, "--hw=h100")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*hardware 'h100' does not match the device present: 'NVIDIA H200'*is 'h200'*"
                                 "(the name from --hw)*"])


def test_unknown_hw_name_lists_known_ones(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN, "--hw=h300")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown hardware 'h300': known names are a100, a6000, cpu, gb10, h100, h200*"])


def test_misspelt_marker_fails_under_strict_markers(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_marker='''
        import pytest

        @pytest.mark.sdpa_backnd("flash")
        def test_x():
            pass
        '''
    )
    result = project.runpytest(*PLUGIN, "test_marker.py")
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*'sdpa_backnd' not found in `markers` configuration option*"])


def test_bad_backend_name_is_a_usage_error(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_marker='''
        import pytest

        @pytest.mark.attnperf_sdpa_backend("flsh")
        def test_x():
            pass
        '''
    )
    result = project.runpytest(*PLUGIN, "test_marker.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*attnperf_sdpa_backend('flsh',) must name one of flash, efficient, cudnn, math*"])


def test_corrupt_baseline_fails_loudly_and_is_never_overwritten(project: pytest.Pytester) -> None:
    folder = project.path / "baselines"
    folder.mkdir()
    corrupt = "format: 1\nentries: {test_cases.py::test_case[a]: [unclosed\n"
    (folder / "h200.yaml").write_text(corrupt)
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*baseline file *h200.yaml is not valid YAML*"])
    assert "During handling" not in result.stdout.str()
    result = project.runpytest(*PLUGIN, "--update-baselines")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*Nothing was written; fix or remove the file.*"])
    assert (folder / "h200.yaml").read_text() == corrupt


def test_summary_table_has_every_column(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN)
    result.stdout.fnmatch_lines(
        [
            "*attnperf on h200: 2 measured cases*",
            "*case*backend*median*spread*TFLOP/s*MFU %*GB/s*BW %*FLOP/B*bound*roof %*peak MiB*eager*eager vs base"
            "*vs baseline*",
            # 1e9 FLOP in 1 ms = 1 TFLOP/s, 0.1% of the H200's 989.5 dense bf16 peak; 1 GB/s, 0.0%
            # of its 4800; 1e9 FLOP over 1e6 bytes = 1000 FLOP/B, above the H200's ridge (206): compute
            # bound, and 0.1% of the roofline (no CUDA here, so the spec figures are the ceilings)
            "*test_case[[]a[]]*1.000 ms*1.00*0.1*1.0*0.0*1000*cmp*0.1*new*",
        ]
    )


def test_benchmark_json_carries_device_samples(project: pytest.Pytester) -> None:
    set_speed(project, a=2.0)
    project.runpytest(*PLUGIN, "--benchmark-json=out.json").assert_outcomes(passed=2)
    bench = {b["name"]: b for b in benchmarks(project, "out.json")}["test_case[a]"]
    assert bench["stats"]["median"] == pytest.approx(2.0e-3, rel=0.01)
    assert bench["stats"]["rounds"] == 20
    assert bench["extra_info"]["tflops"] == pytest.approx(0.5, rel=0.01)
    assert set(bench["extra_info"]) >= {"mfu", "gb_per_s", "bandwidth_frac", "peak_mib", "eager_ms"}


def test_benchmark_skip_skips_before_measuring(project: pytest.Pytester) -> None:
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.5)
    project.runpytest(*PLUGIN, "--benchmark-skip").assert_outcomes(skipped=2)
    project.runpytest(*PLUGIN, "--benchmark-only").assert_outcomes(passed=1, failed=1)


def test_runs_without_pytest_benchmark(project: pytest.Pytester) -> None:
    project.runpytest(*PLUGIN, "-p", "no:benchmark", "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.5)
    project.runpytest(*PLUGIN, "-p", "no:benchmark").assert_outcomes(passed=1, failed=1)


def test_a_case_whose_clock_changed_fails_naming_both(project: pytest.Pytester) -> None:
    """Baseline graph-timed, this run eager (the kernel stopped being capturable): however
    slow, it cannot be gated, so it fails instead of passing as 'not compared'."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.5)
    set_clocks(project, a=["cuda-events"])
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_case[[]a[]]: CLOCK CHANGED: the baseline was timed with the scripted clock, this run with "
        "the cuda-events clock (scripted fallback to cuda-events)*",
    ])
    set_speed(project, a=1.0)  # re-recording accepts the new clock; then it gates again
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    assert baseline(project)["entries"]["test_cases.py::test_case[a]"]["clock"] == "cuda-events"
    project.runpytest(*PLUGIN).assert_outcomes(passed=2)


def test_a_changed_clock_failure_quotes_each_note_once(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLOCK CHANGED message quotes the timer's notes as its reason; a note added after the
    gate (CUPTI left attached) is still shown, under "notes:", and nothing twice."""
    from pytest_attnperf.measure import profiled

    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    monkeypatch.setattr(profiled, "AT_STOP", {"backend proof's": "0"})
    set_clocks(project, a=["cuda-events"])
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    start = out.index("CLOCK CHANGED")
    failure = out[start:out.index("\n=", start)]  # the failure section, not the summary after it
    assert failure.count("scripted fallback to cuda-events") == 1
    assert failure.count("TEARDOWN_CUPTI was '0'") == 1
    assert "\n  notes: TEARDOWN_CUPTI" in failure


def test_notes_are_recorded_with_the_entry_and_shown_when_it_fails(project: pytest.Pytester) -> None:
    """A figure recorded with a note (here an eager fallback) keeps it in the baseline file,
    and a later failure against that entry quotes it."""
    set_clocks(project, a=["cuda-events"])
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    entries = baseline(project)["entries"]
    assert entries["test_cases.py::test_case[a]"]["notes"] == ["scripted fallback to cuda-events"]
    assert "notes" not in entries["test_cases.py::test_case[b]"]
    set_speed(project, a=1.2)
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*REGRESSED +20.0%*", "*baseline notes: scripted fallback to cuda-events*"])


def test_a_teardown_error_keeps_the_entry_out_of_the_baseline(project: pytest.Pytester) -> None:
    """The measurement passed but a fixture failed afterwards: the test errors, and its entry
    is not recorded (the earlier one is kept); the other case is recorded."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    before = baseline(project)["entries"]
    project.makepyfile(test_cases=TESTS.replace(
        '@pytest.mark.parametrize("name", ["a", "b"])\ndef test_case(name, attnperf):',
        "@pytest.fixture\ndef leak_check(name):\n    yield\n    assert name != 'a', 'leaked'\n\n\n"
        '@pytest.mark.parametrize("name", ["a", "b"])\ndef test_case(name, attnperf, leak_check):',
    ))
    set_speed(project, a=0.5, b=0.5)
    result = project.runpytest(*PLUGIN, "--update-baselines")
    result.assert_outcomes(passed=2, errors=1)
    after = baseline(project)["entries"]
    assert after["test_cases.py::test_case[a]"] == before["test_cases.py::test_case[a]"]
    assert after["test_cases.py::test_case[b]"]["median_ms"] == pytest.approx(0.5, rel=0.01)


def test_requires_hw_skips_with_reason_on_cpu(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DEVICE", "cpu")
    project.makepyfile(
        test_gpu='''
        import pytest

        @pytest.mark.attnperf_requires_hw(gpu=True, min_capability="8.0")
        def test_needs_gpu():
            pass
        '''
    )
    result = project.runpytest(*PLUGIN, "test_gpu.py", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a CUDA GPU; this run has only the CPU*"])


def test_min_capability_skips_older_cards(project: pytest.Pytester) -> None:
    project.makepyfile(
        test_gpu='''
        import pytest

        @pytest.mark.attnperf_requires_hw(min_capability="10.0")
        def test_needs_blackwell():
            pass

        @pytest.mark.attnperf_requires_hw(min_capability=(9, 0))
        def test_needs_hopper():
            pass
        '''
    )
    result = project.runpytest(*PLUGIN, "test_gpu.py", "-rs")
    result.assert_outcomes(skipped=1, passed=1)
    result.stdout.fnmatch_lines(["*needs compute capability >= 10.0; 'NVIDIA H200' has 9.0*"])


def test_plugin_imports_nothing_heavy_and_writes_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pythonpath(monkeypatch)
    pytester.makepyfile(
        test_plain='''
        import sys

        def test_plain():
            assert "torch" not in sys.modules
        '''
    )
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:cacheprovider", "-p", "no:benchmark")
    result.assert_outcomes(passed=1)
    pytesters_own = {"runpytest-0", "runpytest-current", "stdout", "stderr", "__pycache__"}  # and Python's
    assert sorted(p.name for p in pytester.path.iterdir() if p.name not in pytesters_own) == ["test_plain.py"]


def test_fixtures_are_documented(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN, "--fixtures")
    out = result.stdout.str()
    for name in ("attnperf", "attnperf_device", "attnperf_gpu", "attnperf_hw", "attnperf_registry"):
        assert f"{name} " in out or f"{name} [" in out, name
    assert "Times a callable on the device" in out


# -- backend pins, with real torch on the CPU ----------------------------------------------

PINNED = '''
import pytest
import torch
import torch.nn.functional as F

from pytest_attnperf.costs import Cost

q = torch.randn(1, 2, 16, 8)


def sdpa():
    return F.scaled_dot_product_attention(q, q, q)


def matmul_only():
    return torch.softmax(q @ q.transpose(-1, -2), -1) @ q


@pytest.mark.attnperf_sdpa_backend("math")
def test_math_really_ran(attnperf):
    assert attnperf.measure(sdpa, cost=Cost(1.0, 1.0), dtype="fp32").backend == "math"


@pytest.mark.attnperf_sdpa_backend("flash")
def test_flash_pinned_but_not_called(attnperf):
    attnperf.measure(matmul_only, cost=Cost(1.0, 1.0), dtype="fp32")


@pytest.mark.attnperf_sdpa_backend("efficient")
def test_efficient_cannot_run_on_cpu(attnperf):
    attnperf.measure(sdpa, cost=Cost(1.0, 1.0), dtype="fp32")
'''


def test_backend_pin_is_proven_from_the_profiler(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_pinned=PINNED)
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", "--attnperf-budget=0.01", "-rs")
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*attnperf_sdpa_backend('flash') was pinned but no trace of the 'flash' backend*",
            "*attnperf_sdpa_backend('efficient') cannot run on *: No viable backend*",
        ]
    )


def test_cold_graphs_and_hot_sample_reach_the_timer(project: pytest.Pytester) -> None:
    project.runpytest(*PLUGIN).assert_outcomes(passed=2)
    assert json.loads((project.path / "plan.json").read_text()) == {"cold_graphs": 8, "hot_sample_ms": 20.0}
    project.runpytest(*PLUGIN, "--attnperf-cold-graphs=3", "--attnperf-hot-sample=0.5ms").assert_outcomes(passed=2)
    assert json.loads((project.path / "plan.json").read_text()) == {"cold_graphs": 3, "hot_sample_ms": 0.5}


def test_an_eager_timed_case_is_not_compared_against_another_machines_recordings(project: pytest.Pytester) -> None:
    """A case timed with events around eager launches has the host's speed in its figure (fla's
    naive GDN on the H200 moved -22% to +78% between hosts, 2026-11-29): recorded on A, 20%
    slower on B it passes as 'not compared', saying why; on A the same slowdown fails."""
    set_clocks(project, a=["cuda-events"])
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=A").assert_outcomes(passed=2)
    set_speed(project, a=1.2, b=1.2)
    on_b = project.runpytest(*PLUGIN, "--attnperf-machine=B", "--junitxml=b.xml")
    on_b.assert_outcomes(passed=1, failed=1)  # b, graph-timed, is still judged (and regressed)
    # the verdict travels in the JUnit report, so the noise benchmark does not count a as missed
    assert sorted(_outcomes(project.path / "b.xml").values()) == ["not compared", "regressed"]
    on_b.stdout.fnmatch_lines([
        "test_case[[]a[]]*+20.0% not compared",
        "note: test_case[[]a[]]: not compared: timed with events around eager launches (not "
        "graph-capturable), so the host's speed is in the figure, and the baseline's recordings come "
        "from another machine*record this machine (--update-baselines) to gate it here",
    ])
    assert "REGRESSED +20.0%" in on_b.stdout.str()
    assert "test_case[b]" in on_b.stdout.str()
    on_a = project.runpytest(*PLUGIN, "--attnperf-machine=A")
    on_a.assert_outcomes(passed=0, failed=2)
    on_a.stdout.fnmatch_lines(["*test_case[[]a[]]: REGRESSED +20.0%*"])


def test_the_overheads_reach_the_recordings_and_the_gate_and_a_refusal_is_reported(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's usable sample overhead (``AttnPerfSession.gate_overhead_ms``) is kept with each
    recording; on another machine a cold case's centre moves by the overheads' difference, and a
    difference not used for being implausible is reported under the summary. (Which differences
    move a centre, and by what: tests/unit/test_units_policy_runs.py.)"""
    from pytest_attnperf.measure.overhead import SampleOverhead

    floor = [0.00326]
    monkeypatch.setattr(SampleOverhead, "_time", lambda self: ((floor[0], "scripted"), floor[0]))
    set_clocks(project, a=["cuda-graph-nodes"], b=["cuda-graph-nodes"])
    set_speed(project, a=0.060, b=0.060)
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=A").assert_outcomes(passed=2)
    assert baseline(project)["entries"]["test_cases.py::test_case[a]"]["run_overheads_ms"] == [0.00326]
    floor[0] = 0.0051
    set_speed(project, a=0.060 * 1.05 + 0.00184, b=0.060)
    moved = project.runpytest(*PLUGIN, "--attnperf-tolerance=1.5%", "--attnperf-machine=B")
    moved.assert_outcomes(passed=1, failed=1)
    moved.stdout.fnmatch_lines(["*test_case[[]a[]]: REGRESSED +4.9% against the baseline*",
                                "*centre moved +1.84 us to 0.06184 ms*"])
    assert "sample overheads not used:" not in moved.stdout.str()
    floor[0] = 0.05  # an overhead gone wrong: the difference is refused, the 2 us offset's bar holds +5%
    refused = project.runpytest(*PLUGIN, "--attnperf-tolerance=1.5%", "--attnperf-machine=B")
    refused.assert_outcomes(passed=2)
    out = refused.stdout.str()
    assert "sample overheads not used:" in out
    assert "more than 6 us apart" in out
    assert "2 us a sample (--attnperf-machine-offset)" in out


def test_the_sample_overhead_is_measured_once_and_reported(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA (faked here: the scripted timer times a CPU tensor), the run times a
    one-element add once, writes it beside every case in the benchmark JSON and prints it;
    without CUDA it writes null and prints nothing."""
    import torch

    plain = project.runpytest(*PLUGIN, "--benchmark-json=plain.json")
    plain.assert_outcomes(passed=2)
    assert "sample overhead" not in plain.stdout.str()
    assert {b["extra_info"]["attnperf_overhead_ms"] for b in benchmarks(project, "plain.json")} == {None}
    cuda_available(monkeypatch)
    set_speeds(project, {"floor": 0.004})  # timed before any test: 4 us
    result = project.runpytest(*PLUGIN, "--benchmark-json=out.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["sample overhead (one-element add, cold; not used by the gate: clock scripted): 4.00 us"])
    floors = [b["extra_info"]["attnperf_overhead_ms"] for b in benchmarks(project, "out.json")]
    assert floors == [pytest.approx(0.004), pytest.approx(0.004)]
    # measured without pytest-benchmark too; a failure is named, not raised
    project.runpytest(*PLUGIN, "-p", "no:benchmark").stdout.fnmatch_lines(
        ["sample overhead (one-element add, cold; not used by the gate: clock scripted): 4.00 us"])

    def broken(*shape: int, device: object = None) -> torch.Tensor:
        raise RuntimeError("CUDA error: an illegal memory access")

    monkeypatch.setattr(torch, "zeros", broken)
    failed = project.runpytest(*PLUGIN)
    failed.assert_outcomes(passed=2)
    failed.stdout.fnmatch_lines(
        ["sample overhead not measured: one-element add, cold failed: RuntimeError: CUDA error*"])
