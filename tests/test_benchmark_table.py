"""pytest-benchmark's terminal table beside the attnperf summary: without attnperf's cases unless
asked for, a project's own benchmarks kept, and its JSON written either way."""

from __future__ import annotations

import pytest
from kit import PLUGIN, TESTS, benchmarks, make_project

from pytest_attnperf.report.summary import outside_summary

OWN_BENCHMARK = '''
def test_own(benchmark):
    benchmark(sum, range(10))
'''

TABLE = "*benchmark: * tests*"  # pytest-benchmark's title line: "--- benchmark: 2 tests ---"


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester, test_cases=TESTS)


def test_no_benchmark_table_by_default_and_the_json_still_written(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN, "--benchmark-json=out.json")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*attnperf on h200: 2 measured cases*"])
    result.stdout.no_fnmatch_line(TABLE)
    result.stdout.no_fnmatch_line("*OPS (Kops/s)*")
    entries = {b["name"]: b for b in benchmarks(project, "out.json")}
    assert sorted(entries) == ["test_case[a]", "test_case[b]"]
    assert entries["test_case[a]"]["stats"]["rounds"] == 20
    assert len(entries["test_case[a]"]["stats"]["data"]) == 20  # the samples, not only their summary


@pytest.mark.parametrize("asked", [("--attnperf-benchmark-table",), ("-o", "attnperf_benchmark_table=true")])
def test_the_benchmark_table_when_asked_for(project: pytest.Pytester, asked: tuple[str, ...]) -> None:
    result = project.runpytest(*PLUGIN, *asked)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([TABLE, "*test_case[[]a[]]*", "*attnperf on h200: 2 measured cases*"])


def test_a_projects_own_benchmarks_keep_their_table(project: pytest.Pytester) -> None:
    project.makepyfile(test_own=OWN_BENCHMARK)
    result = project.runpytest(*PLUGIN)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*benchmark: 1 tests*", "*test_own*"])
    result.stdout.no_fnmatch_line("*test_case[[]a[]] * 20 *")  # a benchmark row: rounds, iterations last


def test_outside_summary_drops_attnperf_entries_and_empty_groups() -> None:
    ours = {"name": "test_case[a]", "extra_info": {"attnperf_clock": "cuda-graph"}}
    theirs = {"name": "test_own", "extra_info": {}}
    assert outside_summary([("a", [ours]), (None, [ours, theirs])]) == [(None, [theirs])]


def test_a_comparison_keeps_the_table(project: pytest.Pytester) -> None:
    """--benchmark-compare shows its comparison in the table, and --benchmark-compare-fail is checked there."""
    project.runpytest(*PLUGIN, "--benchmark-autosave").assert_outcomes(passed=2)
    result = project.runpytest(*PLUGIN, "--benchmark-compare")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([TABLE, "*test_case[[]a[]] (0001*"])
