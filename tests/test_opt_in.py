"""Opt-in rows of the built-in tables (``--attnperf-opt-in``): the linear GPU table's fp16 and
fp32 rows are collected only when the run names their group, by option or ini key; an unknown
group is a usage error that lists the known ones."""

from __future__ import annotations

import kit
import pytest

from pytest_attnperf.families.linear.suite import GPU
from pytest_attnperf.options import OPT_IN

pytest_plugins = ["pytester"]

PRECISION = [c for c in GPU if c.opt_in == "precision"]


def _collected_rows(result: pytest.RunResult) -> set[str]:
    ids = [line.split("[", 1)[1] for line in result.outlines if "::test_linear[" in line]
    return {case.id for case in GPU for test in ids if test.startswith(f"{case.id}-")}


def test_the_precision_rows_are_fp16_and_fp32_rows_of_the_gpu_table() -> None:
    assert {c.dtype for c in PRECISION} == {"fp16", "fp32"}
    assert all(c.gpu for c in PRECISION)
    assert set(OPT_IN) == {c.opt_in for c in GPU if c.opt_in}  # every group named is a known one


@pytest.mark.parametrize("how", ["none", "option", "ini"])
def test_opt_in_rows_are_collected_only_when_named(pytester: pytest.Pytester, how: str) -> None:
    kit.make_project(pytester, kit.conftest("h200"), ini="attnperf_opt_in = precision" if how == "ini" else "")
    args = ["--attnperf-opt-in=precision"] if how == "option" else []
    result = pytester.runpytest(*kit.PLUGIN, "--attnperf-suites=linear", "--collect-only", "-q", *args)
    rows = _collected_rows(result)
    always = {c.id for c in GPU if c.opt_in is None}
    assert always <= rows  # the fake H200 collects the GPU table
    named = [line for line in result.outlines if "opt-in row" in line and "not collected" in line]
    if how == "none":
        assert rows == always
        # the summary names what was left out and the option that adds it
        assert named == [f"{len(PRECISION)} opt-in rows not collected ({', '.join(sorted(c.id for c in PRECISION))}): "
                         "--attnperf-opt-in=precision adds them"]
    else:
        assert rows == always | {c.id for c in PRECISION}
        assert named == []


def test_on_the_cpu_the_summary_offers_no_gpu_rows(pytester: pytest.Pytester) -> None:
    """The precision rows are GPU rows: a CPU run would collect them only to skip them, so its
    summary does not offer them; named, they are collected and skipped with the GPU table."""
    kit.make_project(pytester, kit.conftest("cpu"))
    result = pytester.runpytest(*kit.PLUGIN, "--attnperf-suites=linear", "--collect-only", "-q")
    assert {c.id for c in GPU if c.opt_in is None} <= _collected_rows(result)  # collected, to be skipped
    assert not [line for line in result.outlines if "opt-in row" in line]
    named = pytester.runpytest(*kit.PLUGIN, "--attnperf-suites=linear", "--collect-only", "-q",
                               "--attnperf-opt-in=precision")
    assert _collected_rows(named) == _collected_rows(result) | {c.id for c in PRECISION}


def test_an_unknown_group_is_refused_with_the_known_ones(pytester: pytest.Pytester) -> None:
    kit.make_project(pytester, kit.conftest("h200"))
    result = pytester.runpytest(*kit.PLUGIN, "--attnperf-suites=linear", "--collect-only", "--attnperf-opt-in=fp64")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad value 'fp64' from --attnperf-opt-in: unknown opt-in row group fp64: "
                                 "choose from precision (the linear GPU table*"])


def test_a_pytest_xdist_run_names_the_rows_its_workers_left_out(pytester: pytest.Pytester) -> None:
    """Under pytest-xdist only the workers collect: the controller's summary has the line from them."""
    pytest.importorskip("xdist")
    kit.make_project(pytester, kit.conftest("h200") + "\n\ndef pytest_attnperf_visible_gpus(config):\n"
                                                       "    return ['0', '1']\n")
    result = pytester.runpytest(*kit.PLUGIN, "--attnperf-suites=linear", "-n", "2", "-k", "no_case_is_named_so")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    result.stdout.fnmatch_lines(
        [f"{len(PRECISION)} opt-in rows not collected (*): --attnperf-opt-in=precision adds them"])
