"""docs/own-project.md, run as written: a project of its own (conftest.py registering a softmax
and a linear kernel, test modules with their own shape tables, a pyproject.toml placing its
baselines) runs the built-in suites with its kernels in them, its own shapes, and records into
its own folder.

The page's code blocks are the project's files and its ``pytest`` lines the commands, so the
page cannot drift from what works. Fake hardware and a scripted timer (tests/kit.py's, as the
module ``attnperf_fakes`` loaded with ``-p``, not part of the page) make the runs quick and the
gate deterministic.
"""

from __future__ import annotations

import os

import kit
import pytest

FAKES = kit.conftest("cpu", samples=kit.steps(5, centred=True))

# the runs are in this process (torch, fla and the plugin loaded once, not once a run); the page's
# commands in a process of their own, from the built wheel: tests/test_first_hour.py
HARNESS = ("-p", "pytest_attnperf.plugin", "-p", "attnperf_fakes", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-rA", "-v", "--benchmark-disable")


def blocks(language: str) -> list[str]:
    return kit.page_blocks(kit.OWN_PROJECT, language)


def commands() -> list[list[str]]:
    return kit.page_commands()


@pytest.fixture
def own_project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.syspathinsert()  # the fakes, for -p
    for name in [n for n in os.environ if n.startswith("ATTNPERF_")]:
        monkeypatch.delenv(name)
    kit.write_files(pytester.path, kit.page_files())
    (pytester.path / "attnperf_fakes.py").write_text(FAKES)
    return pytester


def test_the_page_holds_a_whole_project_in_fifty_lines() -> None:
    """conftest.py with a softmax and a linear kernel, two shape modules, pyproject.toml, .gitignore
    and two commands, in at most 50 lines of code."""
    assert set(kit.page_files()) == {"conftest.py", "tests/test_my_shapes.py", "tests/test_my_linear_shapes.py",
                                     "pyproject.toml", ".gitignore"}
    assert [args[:1] for args in commands()] == [["--attnperf-suites=softmax,linear"]] * 2
    assert "--update-baselines" in commands()[0]
    assert "--update-baselines" not in commands()[1]
    code = [line for language in ("python", "toml", "gitignore", "bash") for block in blocks(language)
            for line in block.splitlines() if line.strip()]
    assert len(code) <= 50


def test_the_page_runs_as_written(own_project: pytest.Pytester) -> None:
    """The kernel of the project's conftest.py runs in the built-in suite and on the project's own
    shapes, and --update-baselines writes into the folder its pyproject.toml names."""
    record, check = commands()
    result = own_project.runpytest_inprocess(*record, *HARNESS)
    result.assert_outcomes(passed=15, skipped=40)
    out = result.stdout.str()
    built_in = ("pytest_attnperf/families/softmax/suite.py::"
                "test_softmax[cpu-b2-h4-t128-d32-causal-fp32-my-attention-fwd]")
    own = "tests/test_my_shapes.py::test_softmax[cpu-b1-h4-t64-d32-fp32-my-attention-fwdbwd]"
    assert f"PASSED {built_in}" in out
    assert f"PASSED {own}" in out
    result.stdout.fnmatch_lines(["*my-attention does not support this case: NotImplementedError*sliding window*"])
    gpu_row = "test_my_shapes.py::test_softmax[[]b4-h32-kv8-t4096-d128-causal-bf16-my-attention-fwd[]]"
    result.stdout.fnmatch_lines([f"*{gpu_row} SKIPPED*"])
    assert not (own_project.path / "baselines").exists()
    written = kit.entries(own_project, "cpu", folder="perf/baselines")
    assert len(written) == 15
    assert built_in in written
    assert own in written
    assert "tests/test_my_linear_shapes.py::test_linear[cpu-b1-h2-t64-d16-fp32-my-linear-fwd]" in written
    assert not [key for key in written if "my-linear-fwdbwd" in key]  # backward=False: forward only
    assert all("my-attention" in key or "my-linear" in key for key in written)
    assert not [key for key in written if "beta2" in key]  # GDN's beta rows are not linear attention's
    result.stdout.fnmatch_lines(["*my-linear: beta_max is a GDN input; this family has no beta*"])

    with pytest.MonkeyPatch.context() as mp:  # from a subfolder: the baselines still lie beside pyproject.toml
        mp.chdir(own_project.path / "tests")
        again = own_project.runpytest_inprocess(*check, *HARNESS)
    again.assert_outcomes(passed=15, skipped=40)
    assert "15 measured cases (15 unchanged)" in again.stdout.str()
    assert not (own_project.path / "tests" / "perf").exists()

    kit.set_speeds(own_project, {"tests/test_my_shapes.py::test_softmax[cpu-b1-h4-t64-d32-fp32-my-attention-fwd]": 1.2})
    slower = own_project.runpytest_inprocess(*check, *HARNESS)
    slower.assert_outcomes(passed=14, failed=1, skipped=40)
    # two separate matches: how much of the message the short summary line keeps depends on the terminal's width
    slower.stdout.fnmatch_lines(["*test_my_shapes.py::test_softmax[[]cpu-b1-*-fwd[]]: REGRESSED +20.0%*"])
    slower.stdout.fnmatch_lines(["FAILED tests/test_my_shapes.py::test_softmax[[]cpu-b1-*-my-attention-fwd[]]*"])

