"""The baseline file's lines in the run's summary, its ``.gitignore`` and its layout, end to end
under pytester with the fake H200 and the scripted timer (tests/kit.py)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from kit import PLUGIN, TESTS, baseline_path, editing_baseline, entries, make_project, set_speed


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester, test_cases=TESTS)


def test_a_gating_run_names_its_file_and_how_its_cases_met_the_entries(project: pytest.Pytester) -> None:
    """One case with an entry, one without, and an entry of a case this run does not have."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    with editing_baseline(project) as data:
        data["entries"]["test_gone.py::test_gone"] = data["entries"].pop("test_cases.py::test_case[b]")
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        f"baselines: gated against {baseline_path(project)}: 1 entry matched, 1 case new (no entry), "
        "1 entry in the file not run",
    ])


def test_a_gating_run_without_a_file_says_so(project: pytest.Pytester) -> None:
    (project.path / "baselines").mkdir()
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"baselines: gated against {baseline_path(project)}: no such file; 2 cases new*"])


def test_a_recording_counts_histories_continued_and_restarted(project: pytest.Pytester) -> None:
    """Recorded twice, the second time with case a 50% slower: a's history restarts (the gate
    calls the change real), b's continues, and the summary says so with the recordings each holds."""
    first = project.runpytest(*PLUGIN, "--update-baselines")
    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines([
        f"baselines: recorded into {baseline_path(project)}: 2 entries written, 2 new, 0 continued their history, "
        "0 restarted it; 2 entries hold 1 recording",
    ])
    set_speed(project, a=1.5)
    second = project.runpytest(*PLUGIN, "--update-baselines")
    second.assert_outcomes(passed=2)
    second.stdout.fnmatch_lines([
        f"baselines: recorded into {baseline_path(project)}: 2 entries written, 0 new, 1 continued their history, "
        "1 restarted it (1 judged a real change); 1 entry holds 1 recording, 1 holds 2 recordings",
    ])
    assert [len(e["run_medians_ms"]) for _, e in sorted(entries(project).items())] == [1, 2]


def test_a_recording_writes_a_gitignore_for_the_lock_and_temporaries(project: pytest.Pytester) -> None:
    """The folder users commit gets a .gitignore naming the store's lock and temporary files,
    announced in the summary; git then leaves the lock out; a .gitignore already there stays."""
    result = project.runpytest(*PLUGIN, "--update-baselines")
    result.assert_outcomes(passed=2)
    ignore = project.path / "baselines" / ".gitignore"
    result.stdout.fnmatch_lines([f"baselines: wrote {ignore}, which keeps the store's lock and temporary files out "
                                 "of git"])
    assert {".*.lock", ".*.tmp"} <= set(ignore.read_text().splitlines())
    assert (project.path / "baselines" / ".h200.yaml.lock").exists()
    git = shutil.which("git")
    if git is not None:
        subprocess.run([git, "init", "-q"], cwd=project.path, check=True)
        ignored = subprocess.run([git, "check-ignore", "-q", "baselines/.h200.yaml.lock"], cwd=project.path)
        assert ignored.returncode == 0
        assert subprocess.run([git, "check-ignore", "-q", "baselines/h200.yaml"], cwd=project.path).returncode == 1
    ignore.write_text("mine\n")
    again = project.runpytest(*PLUGIN, "--update-baselines")
    assert ignore.read_text() == "mine\n"
    assert ".gitignore" not in again.stdout.str()


def test_the_written_file_starts_with_its_header(project: pytest.Pytester) -> None:
    """format and meta, then entries: a reader meets the versions first."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    lines = baseline_path(project).read_text().splitlines()
    assert [line.split(":")[0] for line in lines if line and not line.startswith(" ")] == ["format", "meta", "entries"]
