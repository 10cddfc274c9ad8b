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

from pytest_attnperf.store.runs import _outcomes


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester, test_cases=TESTS)


def test_a_recording_gates_the_runs_after_it(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded once, then gated run after run:

    - the recording, made without pytest-benchmark loaded, holds both cases' entries (20 samples,
      the median) with the run's hardware and device;
    - an unchanged rerun passes, each case unchanged;
    - a case 10% slower fails, that case only, naming both medians and saying it was re-measured;
      a case 20% faster passes and is reported as improved;
    - a GPU profile that stopped with TEARDOWN_CUPTI=0 (as torch.compile's CUDA graphs set it) is
      noted on every GPU case, the failing one too, whose notes come from its second measurement;
    - without pytest-benchmark the slower case fails just the same; --benchmark-skip skips every
      case before measuring, and --benchmark-only still gates.
    """
    from pytest_attnperf.measure import profiled

    project.runpytest(*PLUGIN, "--hw=h200", "-p", "no:benchmark", "--update-baselines").assert_outcomes(passed=2)
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

    set_speed(project, a=1.10, b=0.8)
    with monkeypatch.context() as patched:
        patched.setattr(profiled, "AT_STOP", {"backend proof's": "0"})
        result = project.runpytest(*PLUGIN, "--hw=h200")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*test_case?a?: REGRESSED +10.0% against the baseline*"])
    assert "baseline: median 1 ms" in out
    assert "current:  median 1.1 ms" in out
    assert "FAILED test_cases.py::test_case[b]" not in out
    result.stdout.fnmatch_lines(["*test_case[[]b[]]*-20.0% improved*"])
    failure = out[out.index("REGRESSED"):out.index("short test summary")]
    assert "re-measured after a suspected regression" in failure
    assert "TEARDOWN_CUPTI was '0' when the backend proof's profile stopped" in failure
    assert out.count("TEARDOWN_CUPTI was '0'") >= 2  # the summary notes the passing case too

    project.runpytest(*PLUGIN, "-p", "no:benchmark").assert_outcomes(passed=1, failed=1)
    project.runpytest(*PLUGIN, "--benchmark-skip").assert_outcomes(skipped=2)
    project.runpytest(*PLUGIN, "--benchmark-only").assert_outcomes(passed=1, failed=1)


def test_without_baselines_each_case_passes_as_new_and_reports_its_figures(project: pytest.Pytester) -> None:
    """One project, from no baselines folder to a required recording:

    - without a baselines folder every case passes as new, the folder named, not gated;
    - the summary table has every column, each figure from the cost and the card's peaks;
    - the default cold graphs and hot sample reach the timer, and then the flags' values;
    - the benchmark JSON carries the device samples (median, rounds) and the cost's figures;
      without CUDA no sample overhead is timed: null beside every case, and nothing printed;
    - a folder without this card's file: each case passes as new; with
      --attnperf-require-baseline each fails, naming the file; once recorded, both pass.
    """
    set_speed(project, a=2.0)
    ungated = project.runpytest(*PLUGIN, "--benchmark-json=out.json")
    ungated.assert_outcomes(passed=2)
    ungated.stdout.fnmatch_lines(["*attnperf: no baselines folder at *"])  # named, not gated
    ungated.stdout.fnmatch_lines(
        [
            "*attnperf on h200: 2 measured cases*",
            "*case*backend*median*spread*TFLOP/s*MFU %*GB/s*BW %*FLOP/B*bound*roof %*peak MiB*eager*eager vs base"
            "*vs baseline*",
            # 1e9 FLOP in 1 ms = 1 TFLOP/s, 0.1% of the H200's 989.5 dense bf16 peak; 1 GB/s, 0.0%
            # of its 4800; 1e9 FLOP over 1e6 bytes = 1000 FLOP/B, above the H200's ridge (206): compute
            # bound, and 0.1% of the roofline (no CUDA here, so the spec figures are the ceilings)
            "*test_case[[]b[]]*1.000 ms*1.00*0.1*1.0*0.0*1000*cmp*0.1*new*",
        ]
    )
    assert json.loads((project.path / "plan.json").read_text()) == {"cold_graphs": 8, "hot_sample_ms": 20.0}
    bench = {b["name"]: b for b in benchmarks(project, "out.json")}["test_case[a]"]
    assert bench["stats"]["median"] == pytest.approx(2.0e-3, rel=0.01)
    assert bench["stats"]["rounds"] == 20
    assert bench["extra_info"]["tflops"] == pytest.approx(0.5, rel=0.01)
    assert set(bench["extra_info"]) >= {"mfu", "gb_per_s", "bandwidth_frac", "peak_mib", "eager_ms"}
    # no CUDA: no sample overhead is timed, the JSON holds null beside every case and nothing is printed
    assert {b["extra_info"]["attnperf_overhead_ms"] for b in benchmarks(project, "out.json")} == {None}
    assert "sample overhead" not in ungated.stdout.str()

    (project.path / "baselines").mkdir()  # a folder without this card's file: each case has no entry
    project.runpytest(*PLUGIN, "--attnperf-cold-graphs=3", "--attnperf-hot-sample=0.5ms").assert_outcomes(passed=2)
    assert json.loads((project.path / "plan.json").read_text()) == {"cold_graphs": 3, "hot_sample_ms": 0.5}
    result = project.runpytest(*PLUGIN, "--attnperf-require-baseline")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*no entry in *h200.yaml and --attnperf-require-baseline is set*"])
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    project.runpytest(*PLUGIN, "--attnperf-require-baseline").assert_outcomes(passed=2)


def test_an_update_records_only_what_it_measured_and_what_passed(project: pytest.Pytester) -> None:
    """Run after run on one project:

    - a test that measured and then failed is not recorded;
    - an update of one case rewrites that entry only, and the run after gates against it;
    - a case whose fixture fails after its measurement errors, and its entry is not recorded (the
      earlier one is kept); the other case is recorded.
    """
    project.makepyfile(
        test_more='''
        from pytest_attnperf.costs import Cost

        def test_measures_then_fails(attnperf):
            attnperf.measure(lambda: None, cost=Cost(1.0, 1.0), dtype="bf16")
            assert False, "wrong numbers"
        '''
    )
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2, failed=1)
    before = baseline(project)
    assert "test_more.py::test_measures_then_fails" not in before["entries"]

    set_speed(project, a=1.5)
    project.runpytest(*PLUGIN, "--update-baselines", "test_cases.py::test_case[a]").assert_outcomes(passed=1)
    after = baseline(project)["entries"]
    key_a, key_b = "test_cases.py::test_case[a]", "test_cases.py::test_case[b]"
    assert after[key_b] == before["entries"][key_b]
    assert after[key_a]["median_ms"] == pytest.approx(1.5, rel=0.01)
    project.runpytest(*PLUGIN, "test_cases.py").assert_outcomes(passed=2)

    project.makepyfile(test_cases=TESTS.replace(
        '@pytest.mark.parametrize("name", ["a", "b"])\ndef test_case(name, attnperf):',
        "@pytest.fixture\ndef leak_check(name):\n    yield\n    assert name != 'a', 'leaked'\n\n\n"
        '@pytest.mark.parametrize("name", ["a", "b"])\ndef test_case(name, attnperf, leak_check):',
    ))
    set_speed(project, a=0.5, b=0.5)
    result = project.runpytest(*PLUGIN, "--update-baselines", "test_cases.py")
    result.assert_outcomes(passed=2, errors=1)
    kept = baseline(project)["entries"]
    assert kept[key_a] == after[key_a]
    assert kept[key_b]["median_ms"] == pytest.approx(0.5, rel=0.01)


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


def test_a_changed_clock_fails_naming_both_and_a_recording_keeps_its_notes(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded graph-timed, then:

    - timed eager (the kernel stopped being capturable), however slow, the case cannot be gated:
      it fails as CLOCK CHANGED naming both clocks, rather than passing as 'not compared';
    - that message quotes the timer's notes as its reason; a note added after the gate (CUPTI left
      attached) is still shown, under "notes:", and nothing twice;
    - re-recording accepts the new clock, keeping its note (an eager fallback) in the entry, the
      other case's entry without one; the case is then gated again, and a later failure against
      that entry quotes the note.
    """
    from pytest_attnperf.measure import profiled

    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.5)
    set_clocks(project, a=["cuda-events"])
    with monkeypatch.context() as patched:
        patched.setattr(profiled, "AT_STOP", {"backend proof's": "0"})
        result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*test_case[[]a[]]: CLOCK CHANGED: the baseline was timed with the scripted clock, this run with "
        "the cuda-events clock (scripted fallback to cuda-events)*",
    ])
    out = result.stdout.str()
    start = out.index("CLOCK CHANGED")
    failure = out[start:out.index("\n=", start)]  # the failure section, not the summary after it
    assert failure.count("scripted fallback to cuda-events") == 1
    assert failure.count("TEARDOWN_CUPTI was '0'") == 1
    assert "\n  notes: TEARDOWN_CUPTI" in failure

    set_speed(project, a=1.0)
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    entries = baseline(project)["entries"]
    assert entries["test_cases.py::test_case[a]"]["clock"] == "cuda-events"
    assert entries["test_cases.py::test_case[a]"]["notes"] == ["scripted fallback to cuda-events"]
    assert "notes" not in entries["test_cases.py::test_case[b]"]
    set_speed(project, a=1.2)
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*REGRESSED +20.0%*", "*baseline notes: scripted fallback to cuda-events*"])


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
    result = pytester.runpytest(*PLUGIN, "-p", "no:cacheprovider", "--attnperf-budget=0.01", "-rs",
                                "--attnperf-ceilings=off")  # this CPU's matmul and copy ceilings: not the claim
    result.assert_outcomes(passed=1, failed=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*attnperf_sdpa_backend('flash') was pinned but no trace of the 'flash' backend*",
            "*attnperf_sdpa_backend('efficient') cannot run on *: No viable backend*",
        ]
    )


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
    one-element add once, writes it beside every case in the benchmark JSON and prints it.
    (Without CUDA it writes null and prints nothing: the no-baselines test above.)"""
    import torch

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
