"""The run history end to end under pytester (fake device, scripted timer): gating and recording
runs append records, ``drifted`` fails a case only when asked, failed cases print a line that
re-runs them alone, and the pull-request comment lists what moved."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest
from kit import CONFTEST, FAILING_CASES, PLUGIN, TESTS, conftest, make_project, outcomes, set_speed, set_speeds

PEAK_MIB = '''

class PeakTimer(ScriptedTimer):
    """The scripted timer with a peak memory per test from peak.json (MiB)."""

    def peak_mib(self, name, nodeid):
        return for_test(read_json("peak.json", {}), name, nodeid, 10.0)


def pytest_attnperf_make_timer(config, device):
    return PeakTimer()
'''


@pytest.fixture(autouse=True, scope="module")
def _history_extra_loaded_once() -> None:
    """The optional history extra (ruptures, scipy.stats) imported in this process before the runs:
    pytester takes out after each run the modules it imported, so each run that reads a history
    would import them again."""
    try:
        import ruptures  # noqa: F401
        import scipy.stats  # noqa: F401
    except ImportError:
        pass


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester, CONFTEST + PEAK_MIB, test_cases=TESTS)


def records(project: pytest.Pytester, folder: str = "hist") -> list[dict[str, Any]]:
    path = project.path / folder / "h200.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_runs_append_their_records_and_a_clean_run_writes_a_comment_that_says_so(project: pytest.Pytester) -> None:
    """Three runs into one history:

    - a recording run appends one record per case, verdict recorded;
    - a check-only run appends none;
    - a gating run appends one record per measured case, of a run of its own: its commit, the
      machine and software, the median within its interval, the samples, the peak memory, the
      verdict and the change against the baseline, and no drift; its pull-request comment says
      the run was clean.
    """
    (project.path / "peak.json").write_text(json.dumps({"test_case[b]": 12.5}))
    project.runpytest(*PLUGIN, "--hw=h200", "--update-baselines", "--attnperf-history=hist").assert_outcomes(passed=2)
    assert [r["verdict"] for r in records(project)] == ["recorded", "recorded"]
    first_run = records(project)[0]["run"]
    project.runpytest(*PLUGIN, "--attnperf-check-only", "--attnperf-history=hist")  # measure() returns None
    assert len(records(project)) == 2
    result = project.runpytest(*PLUGIN, "--hw=h200", "--attnperf-history=hist", "--attnperf-commit=abc123",
                               "--attnperf-pr-comment=pr.md")
    result.assert_outcomes(passed=2)
    assert "history: appended 2 records to" in result.stdout.str()
    later = records(project)
    assert len(later) == 4
    a, b = later[2:]
    assert [a["case"], b["case"]] == ["test_cases.py::test_case[a]", "test_cases.py::test_case[b]"]
    assert a["run"] == b["run"]
    assert a["run"] != first_run
    assert len(a["run"]) == 32
    assert a["schema"] == 1
    assert a["commit"] == "abc123"
    assert a["machine"]["hw"] == "h200"
    assert a["machine"]["device"] == "NVIDIA H200"
    assert a["machine"]["host"]
    assert set(a["software"]) == {"torch", "triton", "fla", "cuda", "driver", "python"}
    assert a["median_ms"] == pytest.approx(1.0, rel=0.01)
    assert a["ci_low_ms"] <= a["median_ms"] <= a["ci_high_ms"]
    assert a["n_samples"] == 20
    assert a["stdrel"] > 0
    assert (a["peak_mib"], b["peak_mib"]) == (10.0, 12.5)
    assert a["verdict"] == "unchanged"
    assert a["change_pct"] == pytest.approx(0.0, abs=0.5)
    assert a["mode"] == "cold"
    assert a["drift_pct"] is None
    text = Path(project.path / "pr.md").read_text()
    assert "2 measured cases (2 unchanged)" in text
    assert "No regression, improvement, drift or memory change." in text
    assert "Re-run" not in text


def test_the_folder_comes_from_the_environment_or_the_ini_relative_to_the_ini_file(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project = make_project(pytester, test_cases=TESTS, ini="attnperf_history = runs/ini")
    sub = project.path / "sub"
    sub.mkdir()
    monkeypatch.chdir(sub)  # relative to the ini file's folder, not to where pytest starts
    project.runpytest(*PLUGIN, str(project.path)).assert_outcomes(passed=2)
    assert len(records(project, "runs/ini")) == 2
    monkeypatch.setenv("ATTNPERF_HISTORY", "runs/env")
    project.runpytest(*PLUGIN, str(project.path)).assert_outcomes(passed=2)
    assert len(records(project, "runs/env")) == 2


def test_fail_on_drift_needs_a_history(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN, "--attnperf-fail-on-drift")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "give --attnperf-history=DIR too" in result.stderr.str()


def _runs(project: pytest.Pytester, speeds: list[float], *extra: str, start: int = 0) -> pytest.RunResult:
    result = None
    for i, speed in enumerate(speeds, start):
        set_speed(project, a=speed)
        result = project.runpytest(*PLUGIN, "--hw=h200", "--attnperf-history=hist", f"--attnperf-commit=c{i}", *extra)
    assert result is not None
    return result


def test_drift_is_a_note_fails_only_with_the_opt_in_and_a_recording_accepts_a_new_level(
        project: pytest.Pytester) -> None:
    """Recorded, five runs at the recorded speed, then two histories that share those five:

    - one run 3% slower is no drift, even with --attnperf-fail-on-drift; the case recorded again
      at a new level (2% slower), two runs at it are no drift either;
    - two runs 2% slower (within the gate's 5%) are a shift on the history: a note names the last
      good and the first bad commit, the record keeps the drift and the verdict unchanged; with
      --attnperf-fail-on-drift the case fails as DRIFTED, that case only, and the summary counts
      it; back at its speed it passes again.
    """
    pytest.importorskip("ruptures", reason="the optional extra history (ruptures) is not installed")
    project.runpytest(*PLUGIN, "--hw=h200", "--update-baselines").assert_outcomes(passed=2)
    _runs(project, [1.0] * 5).assert_outcomes(passed=2)
    shared = project.path / "shared"  # the history and the baselines after the five runs
    for folder in ("hist", "baselines"):
        shutil.copytree(project.path / folder, shared / folder)

    one = _runs(project, [1.03], "--attnperf-fail-on-drift", start=5)
    one.assert_outcomes(passed=2)
    assert "drifted" not in one.stdout.str()
    set_speed(project, a=1.02)
    project.runpytest(*PLUGIN, "--update-baselines", "--attnperf-history=hist").assert_outcomes(passed=2)
    after = _runs(project, [1.02, 1.02], "--attnperf-fail-on-drift", start=7)
    after.assert_outcomes(passed=2)
    assert "drifted" not in after.stdout.str()

    for folder in ("hist", "baselines"):  # the other history, from the five runs
        shutil.rmtree(project.path / folder)
        shutil.copytree(shared / folder, project.path / folder)
    last = _runs(project, [1.02, 1.02], start=5)  # 2% slower: within the gate's 5%, a shift on the history
    last.assert_outcomes(passed=2)
    last.stdout.fnmatch_lines(["*note: test_case?a?: drifted +2.0% on its history (last good c4, first bad c5*"])
    assert records(project)[-2]["drift_pct"] == pytest.approx(2.0, abs=0.1)
    assert records(project)[-2]["verdict"] == "unchanged"

    opted = _runs(project, [1.02], "--attnperf-fail-on-drift", start=7)
    opted.assert_outcomes(passed=1, failed=1)
    opted.stdout.fnmatch_lines(["*test_case?a?: DRIFTED +2.0% on its history (--attnperf-fail-on-drift): "
                                "last good c4, first bad c5*"])
    assert "FAILED test_cases.py::test_case[b]" not in opted.stdout.str()
    assert [r["verdict"] for r in records(project)[-2:]] == ["drifted", "unchanged"]
    assert "1 drifted" in opted.stdout.str()
    fixed = _runs(project, [1.0, 1.0], "--attnperf-fail-on-drift", start=8)  # back to its speed: passes again
    fixed.assert_outcomes(passed=2)


def _rerun_lines(result: pytest.RunResult) -> dict[str, list[str]]:
    out = result.stdout.lines
    start = next(i for i, line in enumerate(out) if line.startswith("re-run a failed case alone"))
    lines = [line.strip() for line in out[start + 1:] if line.startswith("  pytest ")]
    found = {}
    for line in lines:
        args = shlex.split(line)
        assert args[0] == "pytest"
        node = next(a for a in args if "::" in a)
        found[node] = args[1:]
    return found


def test_failed_cases_print_lines_that_re_run_them_and_the_pr_comment_lists_what_moved(
        pytester: pytest.Pytester) -> None:
    """One gating run after a recording, a case 10% slower, one whose peak memory doubled, and
    failing tests beside them:

    - each failed case prints a line that re-runs it alone (keeping the hardware, the baselines
      and the seed, not the mode), and each line, run, fails that case alone;
    - the pull-request comment lists the regression with both medians, the memory change, a
      failure with its message and the line that re-runs it, and not what is unchanged.
    """
    project = make_project(pytester, CONFTEST + PEAK_MIB, test_cases=TESTS, test_failing=FAILING_CASES)
    project.runpytest(*PLUGIN, "--hw=h200", "--update-baselines")
    set_speeds(project, {"test_case[a]": 1.10})
    (project.path / "peak.json").write_text(json.dumps({"test_case[b]": 20.0}))
    result = project.runpytest(*PLUGIN, "--hw=h200", "--attnperf-mode=cold", "--attnperf-seed=3", "-rA",
                               "--attnperf-pr-comment=out/pr.md")
    lines = _rerun_lines(result)
    assert sorted(lines) == ["test_cases.py::test_case[a]", "test_cases.py::test_case[b]",
                             "test_failing.py::test_case[after]", "test_failing.py::test_case[raises]",
                             "test_failing.py::test_case[wrong]"]  # b: its memory regressed
    regressed = lines["test_cases.py::test_case[a]"]
    assert "--hw=h200" in regressed
    assert "--attnperf-baselines=baselines" in regressed
    assert "--attnperf-seed=3" in regressed
    assert not any(a.startswith("--attnperf-mode") for a in regressed)
    for node, args in lines.items():
        again = project.runpytest(*args, "-rA")
        assert outcomes(again) == {node: "FAILED"}, again.stdout.str()

    assert "pull-request comment: wrote" in result.stdout.str()
    text = (project.path / "out" / "pr.md").read_text()
    assert text.startswith("### attnperf on h200: ")
    row_a = next(line for line in text.splitlines() if line.startswith("| `test_case[a]`"))
    assert "| regressed | +10.0% | 1.100 ms | 1.000 ms |" in row_a
    row_b = next(line for line in text.splitlines() if line.startswith("| `test_case[b]`"))
    assert "20.0 (+100.0%)" in row_b
    assert "- `test_failing.py::test_case[wrong]`: o: 12 of 4096 elements outside the bound" in text
    assert "pytest -p pytest_attnperf.plugin 'test_cases.py::test_case[a]' --hw=h200" in text
    assert "test_case[ok]" not in text  # unchanged and the same memory: not listed


def test_a_suite_case_is_re_run_by_its_suite_and_exact_name(pytester: pytest.Pytester) -> None:
    from pytest_attnperf.options import read_settings
    from pytest_attnperf.report.triage import rerun_args

    project = make_project(pytester, conftest("cpu"), test_cases=TESTS)
    settings = read_settings(project.parseconfig(*PLUGIN))
    node = "pytest_attnperf/families/softmax/suite.py::test_softmax[cpu-b2-h4-t128-d32-causal-fp32-sdpa-fwd]"
    args = rerun_args(node, settings, "cpu", project.path, plugin_flag=True)
    assert args[2:5] == ["--attnperf-suites=softmax", "-k", node.rsplit("::", 1)[1]]
    collected = project.runpytest(*args, "--collect-only", "-q")
    assert [line for line in collected.stdout.lines if "::" in line] == [node]


def test_a_model_case_is_re_run_with_the_models_degrees_and_shapes_of_its_run(pytester: pytest.Pytester) -> None:
    pytest.importorskip("transformers", reason="the optional extra models (transformers) is not installed")
    from pytest_attnperf.options import read_settings
    from pytest_attnperf.report.triage import rerun_args

    project = make_project(pytester, conftest("cpu"), test_cases=TESTS)
    run = ("--attnperf-model=llama3-8b", "--attnperf-tp=1,8", "--attnperf-model-prefill=64",
           "--attnperf-model-train=none", "--attnperf-model-decode=none")
    settings = read_settings(project.parseconfig(*PLUGIN, *run))
    node = "pytest_attnperf/families/models/suite.py::test_models_softmax[llama3-8b.full.tp8.prefill-t64-sdpa-fwd]"
    args = rerun_args(node, settings, "cpu", project.path, plugin_flag=True)
    assert "--attnperf-suites=models" not in args
    assert {"--attnperf-model=llama3-8b", "--attnperf-tp=1,8", "--attnperf-model-prefill=64"} <= set(args)
    collected = project.runpytest(*args, "--collect-only", "-q")
    assert [line for line in collected.stdout.lines if "::" in line] == [node]
