"""The plugin end to end under pytester, with fake hardware and a scripted timer.

The scripted timer (tests/kit.py) gives every case 20 per-call samples around
1 ms times a factor read from ``speed.json``, so a test can make one case 10% slower and
check that exactly that test fails, with a readable message.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from kit import (
    H200,
    PLUGIN,
    TESTS,
    baseline,
    benchmarks,
    cuda_available,
    editing_baseline,
    make_project,
    pythonpath,
    set_clocks,
    set_speed,
    set_speeds,
)

from pytest_attnperf.noise.runs import _outcomes

if TYPE_CHECKING:
    from pytest_attnperf.measure.timing import SamplingPlan
    from pytest_attnperf.session import AttnPerfSession


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
    from pytest_attnperf import markers

    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    monkeypatch.setattr(markers, "_cupti_at_stop", "0")
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


def test_baseline_from_another_mode_is_not_compared(project: pytest.Pytester) -> None:
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.5)
    result = project.runpytest(*PLUGIN, "--attnperf-mode=hot")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_case[[]a[]]*not compared*"])


def test_hot_baseline_from_another_sample_length_is_not_compared(project: pytest.Pytester) -> None:
    """A hot entry keeps its sample length; a hot run at another --attnperf-hot-sample is not
    gated against it (however slow), and recording at the new length starts the history afresh.
    At the same length a slowdown still fails."""
    project.runpytest(*PLUGIN, "--attnperf-mode=hot", "--update-baselines").assert_outcomes(passed=2)
    a = next(v for k, v in baseline(project)["entries"].items() if k.endswith("[a]"))
    assert a["mode"] == "hot"
    assert a["hot_sample_ms"] == 20.0  # the default, do_bench_cudagraph's length
    set_speed(project, a=1.5)
    project.runpytest(*PLUGIN, "--attnperf-mode=hot").assert_outcomes(passed=1, failed=1)
    result = project.runpytest(*PLUGIN, "--attnperf-mode=hot", "--attnperf-hot-sample=0.5ms")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_case[[]a[]]*not compared*hot samples lasted about 20 ms, this run's 0.5 ms*"])
    set_speed(project, a=1.0)  # unchanged: only the new sample length can start the history afresh
    project.runpytest(*PLUGIN, "--attnperf-mode=hot", "--attnperf-hot-sample=0.5ms",
                      "--update-baselines").assert_outcomes(passed=2)
    a = next(v for k, v in baseline(project)["entries"].items() if k.endswith("[a]"))
    assert a["hot_sample_ms"] == 0.5
    assert len(a["run_medians_ms"]) == 1
    # an entry written before the option (no hot_sample_ms) was taken at 0.5 ms, the only length
    # then: gated at 0.5 ms, not compared at the default
    with editing_baseline(project) as data:
        for entry in data["entries"].values():
            del entry["hot_sample_ms"]
    set_speed(project, a=1.5)
    project.runpytest(*PLUGIN, "--attnperf-mode=hot", "--attnperf-hot-sample=0.5ms").assert_outcomes(passed=1, failed=1)
    result = project.runpytest(*PLUGIN, "--attnperf-mode=hot")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_case[[]a[]]*not compared*hot samples lasted about 0.5 ms, this run's 20 ms*"])
    set_speed(project, a=1.0)
    # a length the file rounds (to 5 significant digits) is still the same length
    project.runpytest(*PLUGIN, "--attnperf-mode=hot", "--attnperf-hot-sample=0.1234567ms",
                      "--update-baselines").assert_outcomes(passed=2)
    result = project.runpytest(*PLUGIN, "--attnperf-mode=hot", "--attnperf-hot-sample=0.1234567ms")
    result.assert_outcomes(passed=2)
    assert "not compared" not in result.stdout.str()


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
    from pytest_attnperf import markers

    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    monkeypatch.setattr(markers, "_cupti_at_stop", "0")
    set_clocks(project, a=["cuda-events"])
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    start = out.index("CLOCK CHANGED")
    failure = out[start:out.index("\n=", start)]  # the failure section, not the summary after it
    assert failure.count("scripted fallback to cuda-events") == 1
    assert failure.count("TEARDOWN_CUPTI was '0'") == 1
    assert "\n  notes: TEARDOWN_CUPTI" in failure


def test_a_re_measurement_on_another_clock_keeps_the_first_verdict(project: pytest.Pytester) -> None:
    """+10% on the baseline's clock, then the confirming run falls back to another clock: the
    comparable measurement's verdict stands and the message says why."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.1)
    set_clocks(project, a=["scripted", "cuda-events"])
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*REGRESSED +10.0%*",
        "*baseline: median 1 ms*",
        "*notes: re-measuring the suspected regression fell back to the cuda-events clock (scripted "
        "fallback to cuda-events); the scripted measurement's verdict stands*",
    ])


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


def test_recordings_build_a_history_and_a_real_change_restarts_it(project: pytest.Pytester) -> None:
    """Re-recording an unchanged case appends its median (the gate's run-to-run spread); a
    change beyond the tolerance (a new kernel) starts the history afresh."""
    key = "test_cases.py::test_case[a]"
    for factor in (1.0, 1.01, 0.99):
        set_speed(project, a=factor)
        project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    runs = baseline(project)["entries"][key]["run_medians_ms"]
    assert runs == pytest.approx([1.0, 1.01, 0.99], rel=1e-3)
    # sigma 1% over 3 recordings: +2.5% is within the bar at a 1% tolerance
    set_speed(project, a=1.025)
    result = project.runpytest(*PLUGIN, "--attnperf-tolerance=1%")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_case[[]a[]]*+2.5% unchanged*"])
    set_speed(project, a=0.5)
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    assert baseline(project)["entries"][key]["run_medians_ms"] == pytest.approx([0.5], rel=1e-3)


def test_a_recording_beyond_the_tolerance_but_within_the_noise_keeps_the_history(project: pytest.Pytester) -> None:
    """At a 1% tolerance, +1.5% on one recording is beyond the tolerance but inside the noise bar
    (0.5% floor: 3 * 0.5% * sqrt(2) = 2.1%), so the gate would call it unchanged and the history
    grows; +5% is a real change and restarts it."""
    key = "test_cases.py::test_case[a]"
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.015)
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-tolerance=1%").assert_outcomes(passed=2)
    assert baseline(project)["entries"][key]["run_medians_ms"] == pytest.approx([1.0, 1.015], rel=1e-3)
    set_speed(project, a=1.06)
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-tolerance=1%").assert_outcomes(passed=2)
    assert baseline(project)["entries"][key]["run_medians_ms"] == pytest.approx([1.06], rel=1e-3)


def test_least_noise_in_time_widens_the_bar_a_sample_holds_once(project: pytest.Pytester) -> None:
    """--attnperf-run-noise-time reaches the gate and the history. One recording of a ~1 ms
    case, +2.5% at a 1.5% tolerance: on the 0.5% floor (bar 2.1%) it regresses, and
    recording it restarts the history; with a 30 us time floor (3% of 1 ms: bar 12.7%) it
    passes, and a recording 2.4% off joins the history."""
    key = "test_cases.py::test_case[a]"
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.025)
    project.runpytest(*PLUGIN, "--attnperf-tolerance=1.5%").assert_outcomes(passed=1, failed=1)
    wide = ("--attnperf-tolerance=1.5%", "--attnperf-run-noise-time=30us")
    passed = project.runpytest(*PLUGIN, *wide, "-rP")
    passed.assert_outcomes(passed=2)
    passed.stdout.fnmatch_lines(["*test_case[[]a[]]*+2.5% unchanged*"])
    project.runpytest(*PLUGIN, "--attnperf-tolerance=1.5%", "--update-baselines").assert_outcomes(passed=2)
    assert baseline(project)["entries"][key]["run_medians_ms"] == pytest.approx([1.025], rel=1e-3)  # restarted
    set_speed(project, a=1.0)  # -2.4%
    project.runpytest(*PLUGIN, *wide, "--update-baselines").assert_outcomes(passed=2)
    assert baseline(project)["entries"][key]["run_medians_ms"] == pytest.approx([1.025, 1.0], rel=1e-3)


def test_in_hot_mode_the_least_noise_in_time_is_spread_over_the_calls_of_a_sample(project: pytest.Pytester) -> None:
    """A graph of 64 calls a sample: 30 us a sample is 0.47 us a call, 0.05% of 1 ms, under the
    0.5% floor, so +2.5% regresses as without it."""
    set_clocks(project, a=["cuda-graph x64"])
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.025)
    project.runpytest(*PLUGIN, "--attnperf-tolerance=1.5%", "--attnperf-run-noise-time=30us").assert_outcomes(
        passed=1, failed=1)


def test_cold_graphs_and_hot_sample_reach_the_timer(project: pytest.Pytester) -> None:
    project.runpytest(*PLUGIN).assert_outcomes(passed=2)
    assert json.loads((project.path / "plan.json").read_text()) == {"cold_graphs": 8, "hot_sample_ms": 20.0}
    project.runpytest(*PLUGIN, "--attnperf-cold-graphs=3", "--attnperf-hot-sample=0.5ms").assert_outcomes(passed=2)
    assert json.loads((project.path / "plan.json").read_text()) == {"cold_graphs": 3, "hot_sample_ms": 0.5}


def test_a_baseline_from_another_machine_allows_for_the_move_between_machines(project: pytest.Pytester) -> None:
    """Three recordings on machine A; +2.5% at a 1.5% tolerance fails on A (same machine) and
    passes on B, where the between-machines term applies and the message says so. Once the
    history also holds a recording from B, its own spread covers the moves and C gets no extra
    term."""
    key = "test_cases.py::test_case[a]"
    for _ in range(3):
        project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=A").assert_outcomes(passed=2)
    assert baseline(project)["entries"][key]["run_machines"] == ["A", "A", "A"]
    set_speed(project, a=1.025)
    tight = ("--attnperf-tolerance=1.5%", "--attnperf-stdrel=0.05%")
    project.runpytest(*PLUGIN, *tight, "--attnperf-machine=A").assert_outcomes(passed=1, failed=1)
    on_b = project.runpytest(*PLUGIN, *tight, "--attnperf-machine=B")
    on_b.assert_outcomes(passed=2)
    on_b.stdout.fnmatch_lines([
        "test_case[[]a[]]*+2.5% unchanged",
        "note: test_case[[]a[]]: judged against recordings from another machine: the bar includes 0.70% "
        "(--attnperf-machine-noise) and 2 us a sample (--attnperf-machine-offset) between machines",
    ])
    assert "judged against" not in project.runpytest(*PLUGIN, *tight, "--attnperf-machine=A").stdout.str()
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=B").assert_outcomes(passed=2)
    assert baseline(project)["entries"][key]["run_machines"] == ["A", "A", "A", "B"]
    # on C the A+B history's own spread (sd 1.25%: bar 4.2%) judges +5%; a 5% machine term
    # on top (bar 15.6%) would pass it
    set_speed(project, a=1.05)
    on_c = project.runpytest(*PLUGIN, *tight, "--attnperf-machine=C", "--attnperf-machine-noise=5%")
    on_c.assert_outcomes(passed=1, failed=1)
    on_c.stdout.fnmatch_lines(["*1.25% over 4 recordings from 2 machines: beyond its 3-sigma bar of 4.19%*"])


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


def test_an_eager_timed_case_keeps_a_history_per_machine(project: pytest.Pytester) -> None:
    """Recording an eager-timed case on B after A starts B's own history instead of joining
    A's (a history from two hosts would let a third compare against their mixed centre); then
    B gates it and A does not."""
    key = "test_cases.py::test_case[a]"
    set_clocks(project, a=["cuda-events"])
    for machine in ("A", "A", "A", "B"):
        project.runpytest(*PLUGIN, "--update-baselines", f"--attnperf-machine={machine}").assert_outcomes(passed=2)
    assert baseline(project)["entries"][key]["run_machines"] == ["B"]
    set_speed(project, a=1.2)
    on_b = project.runpytest(*PLUGIN, "--attnperf-machine=B")
    on_b.assert_outcomes(passed=1, failed=1)
    on_b.stdout.fnmatch_lines(["*test_case[[]a[]]: REGRESSED +20.0%*"])
    on_a = project.runpytest(*PLUGIN, "--attnperf-machine=A")
    on_a.assert_outcomes(passed=2)
    on_a.stdout.fnmatch_lines(["attnperf on h200: 2 measured cases (1 not compared, 1 unchanged)"])


@pytest.mark.parametrize(("clock", "status"), [("cuda-graph", "unchanged"), ("cuda-graph x64", "REGRESSED")])
def test_the_machine_offset_is_per_sample(project: pytest.Pytester, clock: str, status: str) -> None:
    """A 10 us case 25% slower on another machine: one call a sample (cold), the 2 us offset is
    20% of the case and the bar about 61%; 64 calls a sample (hot mode's graphs), it is 0.03 us
    a call and the bar about 3%."""
    set_clocks(project, a=[clock], b=[clock])
    set_speed(project, a=0.01, b=0.01)
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=A").assert_outcomes(passed=2)
    set_speed(project, a=0.0125, b=0.01)
    result = project.runpytest(*PLUGIN, "--attnperf-machine=B")
    expected = "*REGRESSED +25.0%*" if status == "REGRESSED" else "test_case[[]a[]]*+25.0% unchanged"
    result.stdout.fnmatch_lines([expected])


def test_the_overheads_difference_moves_the_centre_on_another_machine(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two H200 hosts (2026-11-29) in small: recorded on A (floor 3.26 us), a 60 us case reads 1.84 us longer on
    B (floor 5.10 us). Each recording keeps its floor; on B the centre is moved by the floors'
    difference, the bar takes the 0.5 us residual instead of the 2 us offset, and +5% of real
    work is caught at a 1.5% tolerance (with the offset alone its bar is about 10%: it passes,
    as it does when B's floor is not measured)."""
    from pytest_attnperf.session import AttnPerfSession

    floor: list[float | None] = [0.00326]
    monkeypatch.setattr(AttnPerfSession, "_overhead", lambda self: ((floor[0], "scripted"), floor[0]))
    set_clocks(project, a=["cuda-graph-nodes"], b=["cuda-graph-nodes"])
    set_speed(project, a=0.060, b=0.060)
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=A").assert_outcomes(passed=2)
    assert baseline(project)["entries"]["test_cases.py::test_case[a]"]["run_floors_ms"] == [0.00326]
    floor[0] = 0.0051
    tight = ("--attnperf-tolerance=1.5%", "--attnperf-machine=B")
    set_speed(project, a=0.060 + 0.00184, b=0.060 * 1.05 + 0.00184)
    on_b = project.runpytest(*PLUGIN, *tight)
    on_b.assert_outcomes(passed=1, failed=1)
    on_b.stdout.fnmatch_lines([
        "*test_case[[]b[]]: REGRESSED +4.9% against the baseline*",
        "*centre moved +1.84 us to 0.06184 ms*(+8.1% unmoved)*",
        "note: test_case[[]a[]]: judged against recordings from another machine: centre moved by this machine's "
        "sample overhead less the recordings'; the bar includes 0.70% (--attnperf-machine-noise) and 0.5 us a sample "
        "(--attnperf-machine-residual) between machines",
    ])
    floor[0] = None  # B's floor not measured: the 2 us offset, and the +5% passes inside its bar
    project.runpytest(*PLUGIN, *tight).assert_outcomes(passed=2)
    floor[0] = 0.0051  # a history holding a recording without a floor behind the centre: the offset
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=A").assert_outcomes(passed=2)
    floor[0] = None
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=A").assert_outcomes(passed=2)
    assert baseline(project)["entries"]["test_cases.py::test_case[a]"]["run_floors_ms"] == [0.00326, 0.0051, None]
    floor[0] = 0.0051
    project.runpytest(*PLUGIN, *tight).assert_outcomes(passed=2)


def session_timing_overhead(monkeypatch: pytest.MonkeyPatch, median_ms: float, clock: str = "cuda-graph-nodes",
                         notes: tuple[str, ...] = (), plans: list[SamplingPlan] | None = None) -> AttnPerfSession:
    """An ``AttnPerfSession`` on a (faked) CUDA device whose timer gives every measurement,
    the floor's included, these figures (and appends each plan it is given to ``plans``)."""
    from pytest_attnperf.measure.timing import Measurement, SamplingPlan
    from pytest_attnperf.session import AttnPerfSession

    seen = plans if plans is not None else []

    class Timer:
        def measure(self, fn: object, plan: SamplingPlan) -> Measurement:
            seen.append(plan)
            m = Measurement((1.0,) * 10, clock=clock, mode="cold", notes=notes)
            object.__setattr__(m.summary, "median_ms", median_ms)  # NaN and 0 too, which samples cannot give
            return m

    cuda_available(monkeypatch)
    session = AttnPerfSession.__new__(AttnPerfSession)
    session.overhead = None
    session.__dict__.update(device=H200, timer=Timer(),
                            plan=lambda mode=None: SamplingPlan(mode=mode or "cold"))
    return session


@pytest.mark.parametrize(("median_ms", "clock", "notes", "gate_ms", "how"), [
    (0.00326, "cuda-graph-nodes", (), 0.00326, "one-element add, cold"),
    (0.00358, "cuda-graph", ("no timing events inside the graph (...)",), None,
     "one-element add, cold; not used by the gate: clock cuda-graph"),
    (0.004, "cuda-graph-nodes", ("still throttled (sw-power-cap) after re-measuring",), None,
     "one-element add, cold; not used by the gate: still throttled (sw-power-cap) after re-measuring"),
    (0.004, "cuda-graph-nodes", ("clock throttled (sw-power-cap) at 1700.0 MHz; re-measured",), 0.004,
     "one-element add, cold"),  # re-measured and no longer throttled: fine
    (0.004, "cuda-graph-nodes", ("clocks held down while sampling (power 31% of 0.50 s, NVML violation counters)",),
     None, "one-element add, cold; not used by the gate: clocks held down while sampling (power 31% of 0.50 s, "
     "NVML violation counters)"),
])
def test_which_overheads_the_gate_may_use(monkeypatch: pytest.MonkeyPatch, median_ms: float, clock: str,
                                       notes: tuple[str, ...], gate_ms: float | None, how: str) -> None:
    """Only a floor timed as cold cases are (events inside the graph) and not at a held-down
    clock is kept with recordings and moves centres; every floor is still reported."""
    session = session_timing_overhead(monkeypatch, median_ms, clock, notes)
    assert session.gate_overhead_ms() == gate_ms
    assert session.measure_overhead() == (median_ms, how)


def test_the_overhead_is_timed_cold_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the run's mode, and marked so that a wrapping timer (the noise benchmark's
    injection, do_bench comparison) can tell it from the case it is timed in."""
    from pytest_attnperf.measure.timing import SamplingPlan

    plans: list[SamplingPlan] = []
    session = session_timing_overhead(monkeypatch, 0.00326, plans=plans)
    session.__dict__["plan"] = lambda mode=None: SamplingPlan(mode=mode or "hot")
    session.measure_overhead()
    session.measure_overhead()  # once per run
    assert [(p.mode, p.overhead) for p in plans] == [("cold", True)]
    assert not SamplingPlan().overhead


@pytest.mark.parametrize("bad", [0.0, float("nan"), float("inf")])
def test_an_overhead_that_is_not_a_positive_time_is_not_kept(monkeypatch: pytest.MonkeyPatch, bad: float) -> None:
    """A zero, NaN or infinite floor would make the baseline file unloadable once written into
    ``run_floors_ms``: it is reported as not measured and kept out."""
    session = session_timing_overhead(monkeypatch, bad)
    assert session.gate_overhead_ms() is None
    assert session.measure_overhead() == (None, f"one-element add, cold read {bad!r} ms")


@pytest.mark.parametrize(("clock", "case_ms", "floor_a", "floor_b", "usable", "moved", "refused"), [
    ("cuda-graph-nodes", 0.060, 0.00326, 0.0051, True, True, None),
    ("cuda-graph", 0.060, 0.00326, 0.0051, True, False, None),  # the fallback clock: launch inside its samples
    ("cuda-graph-nodes", 0.060, 0.00326, 0.0051, False, False, None),  # B's floor not usable (timed otherwise)
    ("cuda-graph-nodes", 0.060, 0.00326, 0.05, True, False, "more than 6 us apart"),  # a floor gone wrong
    ("cuda-graph-nodes", 0.004, 0.0099, 0.0051, True, False, "would empty a case's centre"),
    ("cuda-graph-nodes", 0.060, 0.00326, 0.00326, True, True, None),  # equal floors: moved by zero, residual
])
def test_the_centre_moves_only_for_a_plausible_shift_on_the_overheads_clock(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, clock: str, case_ms: float, floor_a: float,
        floor_b: float, usable: bool, moved: bool, refused: str | None) -> None:
    """A case recorded on A and run 5% slower on B plus B's floor less A's: caught where the
    centre moves, inside the 2 us offset's bar (about 10% at 60 us) where it does not. The note
    says which term the bar used; a difference not used for being implausible is reported once
    under the summary. Only a usable floor (``AttnPerfSession.gate_overhead_ms``) is written or
    used."""
    from pytest_attnperf.session import AttnPerfSession

    floor = [floor_a, True]
    monkeypatch.setattr(AttnPerfSession, "_overhead",
                        lambda self: ((floor[0], "scripted"), floor[0] if floor[1] else None))
    set_clocks(project, a=[clock], b=[clock])
    set_speed(project, a=case_ms, b=case_ms)
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=A").assert_outcomes(passed=2)
    floor[:] = [floor_b, usable]
    set_speed(project, a=case_ms * 1.05 + (floor_b - floor_a if moved else 0.0), b=case_ms)
    result = project.runpytest(*PLUGIN, "--attnperf-tolerance=1.5%", "--attnperf-machine=B")
    out = result.stdout.str()
    if moved:
        result.assert_outcomes(passed=1, failed=1)
        assert "--attnperf-machine-residual" in out
        assert "--attnperf-machine-offset" not in out
    else:
        result.assert_outcomes(passed=2)
        assert "2 us a sample (--attnperf-machine-offset)" in out
        assert "centre moved" not in out
    assert ("sample overheads not used:" in out) == bool(refused)
    assert (refused or "") in out


def test_a_floor_the_gate_may_not_use_is_not_recorded(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded while the floor was timed on another clock (or at a held-down clock): the run
    reports it, the entry keeps no floor for that recording."""
    from pytest_attnperf.session import AttnPerfSession

    monkeypatch.setattr(AttnPerfSession, "_overhead", lambda self: ((0.0036, "one-element add, cold; not used by the "
                                                                  "gate: clock cuda-graph"), None))
    result = project.runpytest(*PLUGIN, "--update-baselines")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["sample overhead (one-element add, cold; not used by the gate: clock cuda-graph): 3.60 us"])
    assert baseline(project)["entries"]["test_cases.py::test_case[a]"]["run_floors_ms"] == [None]


def test_with_two_recordings_the_machine_term_follows_the_latest(project: pytest.Pytester) -> None:
    """Below three recordings the centre is the latest one: recorded on A then B, a run on A
    is judged against B's recording, so the between-machines term applies; on B it does not."""
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=A").assert_outcomes(passed=2)
    set_speed(project, a=0.985)
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=B").assert_outcomes(passed=2)
    assert baseline(project)["entries"]["test_cases.py::test_case[a]"]["run_machines"] == ["A", "B"]
    set_speed(project, a=1.01)  # +2.5% against B's 0.985
    tight = ("--attnperf-tolerance=1.5%", "--attnperf-stdrel=0.05%")
    project.runpytest(*PLUGIN, *tight, "--attnperf-machine=A").assert_outcomes(passed=2)
    project.runpytest(*PLUGIN, *tight, "--attnperf-machine=B").assert_outcomes(passed=1, failed=1)


@pytest.mark.parametrize("machines", [[None, None, None], [None, "A", "A"]])
def test_recordings_of_unknown_machine_do_not_count_as_a_second_machine(
    project: pytest.Pytester, machines: list[str | None]
) -> None:
    """Histories from before machines were noted (all or partly unknown) are likely from one
    box: on B, +2.5% at a 1.5% tolerance still gets the between-machines term and passes."""
    for _ in range(3):
        project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-machine=A").assert_outcomes(passed=2)
    with editing_baseline(project) as data:
        for entry in data["entries"].values():
            entry["run_machines"] = machines
    set_speed(project, a=1.025)
    result = project.runpytest(*PLUGIN, "--attnperf-tolerance=1.5%", "--attnperf-stdrel=0.05%", "--attnperf-machine=B")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["note: test_case[[]a[]]: judged against recordings from another machine*"])


def test_the_history_keeps_five_recordings_and_their_machines(project: pytest.Pytester) -> None:
    """Six recordings (the sixth on another machine): the oldest drops out of both lists."""
    key = "test_cases.py::test_case[a]"
    for machine in "AAAAAB":
        project.runpytest(*PLUGIN, "--update-baselines", f"--attnperf-machine={machine}").assert_outcomes(passed=2)
    entry = baseline(project)["entries"][key]
    assert entry["run_machines"] == ["A", "A", "A", "A", "B"]
    assert len(entry["run_medians_ms"]) == 5
    project.runpytest(*PLUGIN).assert_outcomes(passed=2)  # and the file still loads


def test_run_noise_floor_is_an_option(project: pytest.Pytester) -> None:
    """One recording, 1% slower at a 0.5% tolerance: within the default 0.5% floor's bar
    (2.12%), a regression once the floor is 0."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.01)
    project.runpytest(*PLUGIN, "--attnperf-tolerance=0.5%").assert_outcomes(passed=2)
    failed = project.runpytest(*PLUGIN, "--attnperf-tolerance=0.5%", "--attnperf-run-noise=0")
    failed.assert_outcomes(passed=1, failed=1)
    bad = project.runpytest(*PLUGIN, "--attnperf-run-noise=lots")
    bad.stderr.fnmatch_lines(["*bad value 'lots' from --attnperf-run-noise*"])


def test_the_sample_overhead_is_measured_once_and_reported(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """With CUDA (faked here: the scripted timer times a CPU tensor), the run times a
    one-element add once, writes it beside every case in the benchmark JSON and prints it;
    without CUDA it writes null and prints nothing."""
    import torch

    plain = project.runpytest(*PLUGIN, "--benchmark-json=plain.json")
    plain.assert_outcomes(passed=2)
    assert "sample overhead" not in plain.stdout.str()
    assert {b["extra_info"]["attnperf_floor_ms"] for b in benchmarks(project, "plain.json")} == {None}
    cuda_available(monkeypatch)
    set_speeds(project, {"floor": 0.004})  # timed before any test: 4 us
    result = project.runpytest(*PLUGIN, "--benchmark-json=out.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["sample overhead (one-element add, cold; not used by the gate: clock scripted): 4.00 us"])
    floors = [b["extra_info"]["attnperf_floor_ms"] for b in benchmarks(project, "out.json")]
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
