"""--attnperf-processes: short cases timed in pool runs too, their samples pooled.

The units (pooling, the pool runs' file, the choice of cases, a pool run's input and arguments)
on plain values; the whole path under pytester, where the scripted timer gives pool runs other
speeds than the main one, so a test can see the pool runs' samples reach the gate.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from kit import CONFTEST, TESTS, entries, outcomes, set_speed
from kit import PLUGIN_NO_CEILINGS as PLUGIN

from pytest_attnperf.measure.pooling import Taken, pool, read_taken, short_cases, write_taken
from pytest_attnperf.measure.timing import Measurement
from pytest_attnperf.options import Settings, read_settings
from pytest_attnperf.plugins.pool import INPUT_FORMAT, PoolRun, pool_run_args, read_input, write_input


def _m(values: list[float], clock: str = "cuda-graph-nodes", calls: int = 1) -> Measurement:
    return Measurement(tuple(values), clock=clock, mode="cold", calls_per_sample=calls)


def test_pooling_takes_as_many_samples_from_each_process() -> None:
    main = _m([1.0] * 20)
    fast, slow = Taken((0.9,) * 10, "cuda-graph-nodes", "cold", 1), Taken((1.3,) * 40, "cuda-graph-nodes", "cold", 1)
    pooled = pool(main, [fast, slow])
    assert pooled.summary.n_samples == 30
    assert pooled.processes == 3
    assert sorted(pooled.samples_ms) == [0.9] * 10 + [1.0] * 10 + [1.3] * 10
    assert pooled.median_ms == pytest.approx(1.0)  # one process each side: the middle one's
    assert pooled.process_medians_ms == (1.0, 0.9, 1.3)
    assert pooled.notes[-1] == ("3 processes pooled, 10 samples each (medians 1000.00, 900.00, 1300.00 us, "
                                "this one first)")


def test_pool_runs_that_all_time_a_case_apart_from_this_process_are_noted() -> None:
    """Both pool runs 14% slower than this process (as on an H100, pool runs started without
    TEARDOWN_CUPTI=1) or both 10% faster: a note says so. Within the spread between processes,
    one of them within 5%, or one each side: no note."""
    main = _m([27.1e-3] * 10)

    def pooled(*theirs: float) -> Measurement:
        return pool(main, [Taken((v,) * 10, "cuda-graph-nodes", "cold", 1) for v in theirs])

    assert pooled(30.9e-3, 30.8e-3).notes[-1].startswith(
        "every pool run's median is +13.7% to +14.0% from this process's, beyond the spread between processes")
    assert pooled(24.0e-3, 24.5e-3).notes[-1].startswith("every pool run's median is -11.4% to -9.6% from")
    assert pooled(24.0e-3).notes[-1].startswith("every pool run's median is -11.4% from")
    for theirs in ((27.97e-3, 27.87e-3), (28.4e-3, 28.5e-3), (28.6e-3, 25.0e-3)):
        assert not [n for n in pooled(*theirs).notes if "every pool run" in n], theirs


def test_the_share_takes_whole_rounds_spread_through_the_sequence() -> None:
    """Cold samples go round the graphs in turn (sample i: graph i mod 8): a share of 8 from 64
    is one round, and a share of 16 from 32 two rounds, each holding every graph once."""
    graph = [1.0 + k / 100 for k in range(8)]
    main = replace(_m(graph * 8), graphs=8)  # 64 samples, 8 rounds
    pooled = pool(main, [Taken((2.0,) * 8, "cuda-graph-nodes", "cold", 1, graphs=8)])
    assert sorted(pooled.samples_ms) == sorted(graph + [2.0] * 8)
    main = replace(_m(graph * 4), graphs=8)  # 32 samples, 4 rounds; the pool run gives 16
    pooled = pool(main, [Taken((2.0,) * 16, "cuda-graph-nodes", "cold", 1, graphs=8)])
    assert sorted(v for v in pooled.samples_ms if v < 2) == sorted(graph * 2)
    one = pool(_m([1.0, 2.0] * 5), [Taken((1.5,) * 4, "cuda-graph-nodes", "cold", 1)])  # one graph: samples
    assert sorted(one.samples_ms) == [1.0, 1.0, 1.5, 1.5, 1.5, 1.5, 2.0, 2.0]


def test_a_pool_run_that_timed_another_way_is_left_out_and_named() -> None:
    main = _m([1.0] * 10)
    other = Taken((2.0,) * 10, "cuda-events", "cold", 1)
    same = Taken((1.2,) * 10, "cuda-graph-nodes", "cold", 1)
    pooled = pool(main, [other, same])
    assert pooled.processes == 2
    assert max(pooled.samples_ms) == 1.2
    assert any("1 pool-run measurement(s) taken with another clock or mode" in n for n in pooled.notes)
    alone = pool(main, [other])
    assert alone.samples_ms == main.samples_ms
    assert alone.processes == 1
    assert any("not pooled" in n for n in alone.notes)
    hot = Measurement((1.0,) * 10, clock="cuda-graph", mode="hot", calls_per_sample=16)
    other_calls = Taken((1.1,) * 10, "cuda-graph", "hot", 24)  # per-call samples either way: pooled
    assert pool(hot, [other_calls]).processes == 2


def test_a_pool_runs_notes_are_kept_as_its_own() -> None:
    throttled = Taken((1.0,) * 10, "cuda-graph-nodes", "cold", 1, notes=("still throttled: sw-power-cap",))
    pooled = pool(_m([1.0] * 10), [Taken((1.0,) * 10, "cuda-graph-nodes", "cold", 1), throttled])
    assert "pool run 2: still throttled: sw-power-cap" in pooled.notes


def test_the_pool_runs_file_round_trips_and_skips_a_torn_line(tmp_path: Path) -> None:
    out = tmp_path / "w.jsonl"
    write_taken(out, "t.py::a", _m([1.0, 1.1], calls=1))
    write_taken(out, "t.py::b", replace(_m([2.0, 2.2], clock="cuda-graph", calls=64), graphs=2, notes=("n",)))
    with open(out, "a", encoding="utf-8") as f:
        f.write('{"nodeid": "t.py::c", "samples_ms": [1.0')  # a pool run killed mid-write
    got = read_taken(out)
    assert sorted(got) == ["t.py::a", "t.py::b"]
    assert got["t.py::b"] == Taken((2.0, 2.2), "cuda-graph", "cold", 64, 2, ("n",))
    assert got["t.py::a"].median_ms == pytest.approx(1.05)
    assert read_taken(tmp_path / "none.jsonl") == {}


def test_only_cases_with_a_centre_under_the_threshold_are_chosen() -> None:
    centres = {"a": 0.012, "b": 0.049, "c": 0.05, "d": 1.2}
    assert short_cases(["a", "b", "c", "d", "e"], centres, 0.05) == ["a", "b"]  # e: no entry


def test_a_pool_runs_command_line_names_only_what_loads_its_code(pytester: pytest.Pytester) -> None:
    """Plugins, rootdir, ini file and ``-o``, the input and output files, and scratch places for
    what an ini's addopts may write; no other option of the run, attnperf's or not, and no path."""
    pytester.makepyfile(test_t="def test_a(): pass\ndef test_b(): pass\n",
                        fake_timeout="def pytest_addoption(parser):\n    parser.addoption('--timeout')\n")
    pytester.syspathinsert()
    pytester.makeconftest("def pytest_addoption(parser):\n    parser.addoption('--seqlen')\n")
    pytester.makeini("[pytest]\n")
    config = pytester.parseconfig("-p", "pytest_attnperf.plugin", "-p", "fake_timeout", "--timeout=240", "--hw", "h200",
                                  "--attnperf-processes=3", "--attnperf-budget", "0.2", "--update-baselines",
                                  "test_t.py", "--seqlen", "4096", "-k", "a or b", "--junitxml=j.xml", "--lf", "-x",
                                  "-o", "python_functions=test_*", "test_t.py::test_b")
    scratch = pytester.path / "scratch"
    args = pool_run_args(config, Path("/tmp/in.json"), Path("/tmp/w.jsonl"), scratch)
    assert args[-2:] == ["--attnperf-pool-input=/tmp/in.json", "--attnperf-pool-out=/tmp/w.jsonl"]
    assert args[args.index("pytest_attnperf.plugin") - 1] == args[args.index("fake_timeout") - 1] == "-p"
    assert args[args.index("--rootdir") + 1] == str(pytester.path)
    assert args[args.index("-c") + 1] == str(pytester.path / "tox.ini")
    assert args[args.index("python_functions=test_*") - 1] == "-o"
    for gone in ("--hw", "h200", "--attnperf-processes=3", "--attnperf-budget", "--update-baselines", "--timeout=240",
                 "--seqlen", "-k", "--lf", "--junitxml=j.xml", "-x", "test_t.py", "test_t.py::test_b"):
        assert gone not in args, gone
    assert f"--junitxml={scratch / 'junit.xml'}" in args
    assert f"--basetemp={scratch / 'tmp'}" in args


def _settings(pytester: pytest.Pytester, *args: str) -> Settings:
    return read_settings(pytester.parseconfig("-p", "pytest_attnperf.plugin", *args))


def test_the_pool_runs_input_holds_a_format_the_node_ids_and_the_settings(pytester: pytest.Pytester) -> None:
    settings = _settings(pytester, "--hw=h200", "--attnperf-budget=0.2s", "--attnperf-peaks=bf16=990,bw=4800",
                         "--attnperf-suites=softmax", "--update-baselines", "--attnperf-report=rep")
    given = pytester.path / "in.json"
    write_input(given, ["t.py::test_a[x-y]", "sub/t.py::test_b"], settings)
    data = json.loads(given.read_text())
    assert sorted(data) == ["format", "nodeids", "settings"]
    assert data["format"] == INPUT_FORMAT == 1
    assert data["nodeids"] == ["t.py::test_a[x-y]", "sub/t.py::test_b"]
    got = data["settings"]
    assert (got["hw"], got["budget_s"], got["suites"]) == ("h200", 0.2, ["softmax"])
    assert got["baselines_dir"] == str(pytester.path / "baselines")
    assert got["peaks"] == [["bf16", 9.9e14], ["bw", 4.8e12]]
    # what a pool run sets itself is not its parent's to give
    assert not {"update_baselines", "require_baseline", "processes", "report_dir", "pool_out"} & set(got)
    assert read_input(given) == (data["nodeids"], got)


def test_a_pool_run_takes_its_settings_from_its_input_not_its_options(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = _settings(pytester, "--hw=h200", "--attnperf-budget=0.2s", "-o", "attnperf_stdrel=2%",
                       "--attnperf-peaks=bf16=990", "--attnperf-suites=softmax,linear", "--update-baselines")
    given = pytester.path / "in.json"
    write_input(given, ["t.py::test_a"], parent)
    monkeypatch.setenv("ATTNPERF_TOLERANCE", "9%")  # the pool run inherits the environment, which it does not read
    monkeypatch.setenv("ATTNPERF_UPDATE_BASELINES", "1")
    config = pytester.parseconfig("-p", "pytest_attnperf.plugin", "--attnperf-budget=3s", "--attnperf-processes=4",
                                  f"--attnperf-pool-input={given}", "--attnperf-pool-out=w.jsonl")
    run = PoolRun.given(config)
    assert run is not None
    assert run.nodeids == ("t.py::test_a",)
    assert run.settings == replace(parent, update_baselines=False, require_baseline=False, processes=1,
                                   report_dir=None, pool_out=pytester.path / "w.jsonl")


def test_a_pool_run_collects_exactly_its_cases(pytester: pytest.Pytester) -> None:
    """A file's cases by node id; a built-in suite's through its module, the rest of which is
    deselected."""
    pytester.makepyfile(test_t="def test_a(): pass\ndef test_b(): pass\n")
    listed = pytester.runpytest("-p", "pytest_attnperf.plugin", "--attnperf-suites=softmax", "--co", "-q")
    in_suite = [line for line in listed.outlines if line.startswith("pytest_attnperf/families/softmax/suite.py::")]
    assert len(in_suite) > 2
    chosen = ["test_t.py::test_b", in_suite[1]]
    given = pytester.path / "in.json"
    write_input(given, chosen, _settings(pytester, "--attnperf-suites=softmax"))
    result = pytester.runpytest("-p", "pytest_attnperf.plugin", f"--attnperf-pool-input={given}",
                                "--attnperf-pool-out=w.jsonl", "--co", "-q")
    assert sorted(line for line in result.outlines if "::" in line) == sorted(chosen)


@pytest.mark.parametrize(("content", "says"), [
    (None, "cannot be read: No such file or directory"),
    ("{not json", "is not JSON: *"),
    ('{"format": 2, "nodeids": [], "settings": {}}', "is not a pool run's input of format 1 (format: 2; *"),
    ('{"format": 1, "nodeids": "t.py::test_a", "settings": {}}', "'nodeids' is not a list of node ids"),
    ('{"format": 1, "nodeids": [], "settings": {"budget_s": 0.5, "extra": 1}}',
     "settings missing: baselines_dir, *; unknown: extra"),
    ("min_samples=ten", "setting 'min_samples' is 'ten', not of type int"),
], ids=["missing", "not-json", "other-format", "bad-nodeids", "missing-settings", "bad-setting"])
def test_a_pool_run_with_a_missing_or_bad_input_stops_naming_the_file(
        pytester: pytest.Pytester, content: str | None, says: str) -> None:
    given = pytester.path / "in.json"
    if content == "min_samples=ten":
        write_input(given, ["t.py::test_a"], _settings(pytester))
        data = json.loads(given.read_text())
        data["settings"]["min_samples"] = "ten"
        content = json.dumps(data)
    if content is not None:
        given.write_text(content)
    result = pytester.runpytest("-p", "pytest_attnperf.plugin", f"--attnperf-pool-input={given}",
                                "--attnperf-pool-out=w.jsonl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: attnperf: pool run input {given}: {says}"])


def test_a_pool_runs_output_file_alone_is_refused(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "pytest_attnperf.plugin", "--attnperf-pool-out=w.jsonl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: attnperf: --attnperf-pool-out is a pool run's, given with "
                                 "--attnperf-pool-input"])


POOL_RUN_SPEED = '''

class PoolRunAwareTimer(ScriptedTimer):
    """In a pool run, the factor comes from pool_run_speed.json instead of speed.json."""

    def __init__(self, pool_run):
        self.pool_run = pool_run

    def measure(self, fn, plan):
        m = super().measure(fn, plan)
        if not self.pool_run:
            return m
        with open(HERE / "pool_run_cupti.txt", "a") as seen:  # the environment a pool run measures in
            seen.write(os.environ.get("TEARDOWN_CUPTI", "<unset>") + "\\n")
        test = os.environ["PYTEST_CURRENT_TEST"].split("::")[-1].split(" ")[0]
        skipped = HERE / "pool_run_skip.json"
        if skipped.exists() and test in json.loads(skipped.read_text()):
            pytest.skip("skipped in the pool run")
        speeds = [json.loads(p.read_text()).get(test, 1.0) if p.exists() else 1.0
                  for p in (HERE / "speed.json", HERE / "pool_run_speed.json")]
        scale = speeds[1] / speeds[0]
        return Measurement(tuple(v * scale for v in m.samples_ms), clock=m.clock, mode=m.mode,
                           calls_per_sample=m.calls_per_sample)


def pytest_attnperf_make_timer(config, device):
    return PoolRunAwareTimer(config.getoption("attnperf_pool_out") is not None)
'''


def _pool_run_lines(result: pytest.RunResult) -> list[str]:
    """The summary's lines about pool runs and the notes of pooled cases."""
    return [line for line in result.outlines if " pool runs before the tests" in line
            or line.startswith("pool run ") or "processes pooled" in line]


def _cupti_seen(project: pytest.Pytester) -> list[str]:
    """TEARDOWN_CUPTI as each pool-run measurement saw it (POOL_RUN_SPEED's timer writes it), read once."""
    seen = project.path / "pool_run_cupti.txt"
    found = seen.read_text().split() if seen.exists() else []
    seen.unlink(missing_ok=True)
    return found


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST + POOL_RUN_SPEED)
    pytester.makepyfile(test_cases=TESTS)
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    return pytester


RUN_LOG = '''

def pytest_addoption(parser):
    parser.addoption("--run-log")
    parser.addoption("--label")


def pytest_sessionfinish(session):
    if session.config.getoption("--run-log"):
        with open(session.config.getoption("--run-log"), "a") as log:
            log.write(f"{session.config.getoption('--label')}\\n")
'''

# -- pool runs started together, timed one at a time -------------------------------------------

TURNS = '''
from pathlib import Path

EVENTS = HERE / "turns.log"


def _role(config):
    out = config.getoption("attnperf_pool_out")
    return Path(out).stem if out else "main"  # pool1, pool2 (their samples' files) or main


def _log(event, role):
    with open(EVENTS, "a") as sink:
        sink.write(f"{event} {role}\\n")


def _await(line, limit_s=120.0):
    """Until ``line`` is in the log (a hang guard only: the test's assertions read the order)."""
    import time
    give_up = time.monotonic() + limit_s
    while line not in (EVENTS.read_text().splitlines() if EVENTS.exists() else []):
        if time.monotonic() > give_up:
            raise RuntimeError(f"no {line!r} in {limit_s} s")
        time.sleep(0.05)


ROLE = {}


def pytest_configure(config):
    ROLE["role"] = _role(config)
    _log("start", ROLE["role"])


def pytest_runtest_setup(item):
    role = ROLE["role"]
    if not ROLE.get("tests"):
        ROLE["tests"] = True
        _log("tests", role)
        if role == "pool1":  # its tests run while the second pool run starts up
            _await("start pool2")


def pytest_unconfigure(config):
    role = ROLE["role"]
    if role == "pool2":  # the run's tests begin while the last pool run is still on its way out
        _await("tests main")
    _log("exit", role)


class LoggingTimer(PoolRunAwareTimer):
    def measure(self, fn, plan):
        if not plan.overhead:
            _log("measure", ROLE["role"])
        return super().measure(fn, plan)


def pytest_attnperf_make_timer(config, device):
    return LoggingTimer(config.getoption("attnperf_pool_out") is not None)
'''


def test_the_default_pool_runs_reach_the_gate_take_turns_and_get_only_what_loads_the_code(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """One run with the default pool runs (no --attnperf-processes), several claims:

    - their samples reach the gate: case a reads +10% in this process and as recorded in the two
      pool runs; alone it regresses, pooled over three processes its median is the pool runs' and
      it passes (the summary, the pooled note, the benchmark JSON's extra info);
    - the default is three processes, and --attnperf-processes=1 turns the pool runs off;
    - a pool run starts with TEARDOWN_CUPTI=1 when its parent has no such variable (started
      without it, a pool run timed short cases slower than its parent);
    - they start together and take the GPU one at a time: the second starts up while the first
      runs its tests (whose first test waits to see it start: run one after the other, it would
      give up); its tests begin only once the first has exited; the run's own tests begin while
      the last pool run is still exiting (which waits to see them begin), and the run times
      nothing until it has exited;
    - addopts that write or select (--lf with the cache on, --benchmark-autosave, from the ini)
      reach them harmlessly: they still measure every case, and only this run's results are
      saved in the project;
    - the run's other options stay out of them: a project option that writes where the run
      writes (a command line filtered by a list of pytest's own options let it through: each pool
      run wrote the run's file too), and one whose value is also a path (such a filter dropped the
      value as a path, and the option took the word after it); they get neither, and measure
      every case.
    """
    project.makeconftest(CONFTEST + POOL_RUN_SPEED + TURNS + RUN_LOG)
    project.runpytest(*PLUGIN, "--hw=h200", "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.10)
    (project.path / "pool_run_speed.json").write_text(json.dumps({"test_case[a]": 1.0}))
    alone = project.runpytest(*PLUGIN, "--hw=h200")
    alone.assert_outcomes(passed=1, failed=1)

    project.makeini("[pytest]\naddopts = --strict-markers --lf --benchmark-autosave\n")  # the cache on
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    events = project.path / "turns.log"
    events.unlink(missing_ok=True)
    pooled = project.runpytest(*PLUGIN, "--hw=h200", "--attnperf-processes-below=5ms", "-rA", "--benchmark-json=b.json",
                               "--run-log=log.txt", "--label", "test_cases.py", "test_cases.py")
    pooled.assert_outcomes(passed=2)
    out = pooled.stdout.str()
    assert "2 cases under 5000 us timed in 3 processes (2 pool runs before the tests" in out
    assert "3 processes pooled, 20 samples each (medians 1100.00, 1000.00, 1000.00 us, this one first)" in out
    assert "every pool run's median is -9.1% from this process's" in out  # both 10% under this one
    assert not [line for line in pooled.outlines if line.startswith("pool run ")]  # each measured both cases
    extra = {b["name"]: b["extra_info"] for b in json.loads((project.path / "b.json").read_text())["benchmarks"]}
    assert extra["test_case[a]"]["attnperf_processes"] == 3
    assert extra["test_case[a]"]["attnperf_process_medians_ms"] == pytest.approx([1.1, 1.0, 1.0])
    assert _cupti_seen(project) == ["1"] * 4  # two pool runs, two cases each
    assert len(list((project.path / ".benchmarks").rglob("*.json"))) == 1  # this run's autosave alone
    assert (project.path / "log.txt").read_text().splitlines() == ["test_cases.py"]  # this run's line alone

    log = events.read_text().splitlines()
    at = {line: log.index(line) for line in log if line.split()[0] != "measure"}
    measured = [i for i, line in enumerate(log) if line == "measure main"]
    assert at["start pool2"] < log.index("measure pool1")  # (before or after pool1's first test began)
    assert at["exit pool1"] < at["tests pool2"]
    assert log.index("measure pool1") < at["exit pool1"] < log.index("measure pool2")
    assert at["tests main"] < at["exit pool2"] < measured[0]

    off = project.runpytest(*PLUGIN, "--hw=h200", "--attnperf-processes-below=5ms", "--attnperf-processes=1")
    off.assert_outcomes(passed=1, failed=1)  # a regresses again, timed here alone
    assert "us timed in" not in off.stdout.str().split("= attnperf =")[-1]  # no pool runs: no line of them
    assert "processes pooled" not in off.stdout.str().split("= attnperf =")[-1]


def test_a_regression_every_process_sees_fails_and_a_case_skipped_in_a_pool_run_does_not(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """One run with one pool run (--attnperf-processes=2), several claims:

    - case a reads +10% in this process and in the pool run: pooled over both, it still fails
      as regressed;
    - case b, skipped in the pool run, is counted ("measured 1 of 2 cases"), not called a
      failure: it passes, timed here alone, and no pool run's log is kept to be read;
    - a parent's TEARDOWN_CUPTI (a user's 0 for torch.compile's CUDA graphs) reaches the pool
      run as it is.
    """
    project.runpytest(*PLUGIN, "--hw=h200", "--update-baselines").assert_outcomes(passed=2)
    set_speed(project, a=1.10)
    (project.path / "pool_run_speed.json").write_text(json.dumps({"test_case[a]": 1.10}))
    (project.path / "pool_run_skip.json").write_text(json.dumps(["test_case[b]"]))
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")
    result = project.runpytest(*PLUGIN, "--hw=h200", "--attnperf-processes=2", "--attnperf-processes-below=5ms", "-rA")
    assert outcomes(result) == {"test_cases.py::test_case[a]": "FAILED", "test_cases.py::test_case[b]": "PASSED"}
    result.stdout.fnmatch_lines(["*test_case?a?: REGRESSED +10.0% against the baseline*"])
    result.stdout.fnmatch_lines(["pool run 1: measured 1 of 2 cases (the rest were skipped or failed there, *"])
    out = result.stdout.str()
    assert "2 processes pooled, 20 samples each (medians 1100.00, 1100.00 us, this one first)" in out  # a's
    assert "log:" not in out
    assert _cupti_seen(project) == ["0", "0"]  # the pool run's two cases (b's before it was skipped)


def test_a_failing_pool_run_is_named_and_the_run_goes_on(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every measurement of the pool run raises: it is named, with its log kept, and the run's
    cases pass, timed here alone. Its parent's TEARDOWN_CUPTI=1 reached it as it is."""
    project.runpytest(*PLUGIN, "--hw=h200", "--update-baselines").assert_outcomes(passed=2)
    (project.path / "pool_run_speed.json").write_text("{not json")  # every pool run's measurement raises
    monkeypatch.setenv("TEARDOWN_CUPTI", "1")
    result = project.runpytest(*PLUGIN, "--hw=h200", "--attnperf-processes=2", "--attnperf-processes-below=5ms")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["pool run 1: measured 0 of 2 cases (the rest were skipped or failed there, and are "
                                 "pooled over fewer processes; log: *pool1.log)"])
    log = Path(result.stdout.str().split("log: ")[-1].split(")")[0])
    assert log.exists()  # kept, to be read
    assert "processes pooled" not in result.stdout.str()
    assert _cupti_seen(project) == ["1", "1"]
    shutil.rmtree(log.parent)  # read: this test's leftovers go


def test_cases_over_the_threshold_or_without_an_entry_are_timed_here_only(project: pytest.Pytester) -> None:
    """By default (3 processes), and asked for explicitly: no pool runs for them."""
    for asked in ((), ("--attnperf-processes=3",)):
        result = project.runpytest(*PLUGIN, "--hw=h200", *asked)  # no baseline file yet
        result.assert_outcomes(passed=2)
        assert not _pool_run_lines(result)
    project.runpytest(*PLUGIN, "--hw=h200", "--update-baselines").assert_outcomes(passed=2)
    (project.path / "pool_run_speed.json").write_text("{not json")  # a pool run would fail and be named
    for asked in ((), ("--attnperf-processes=3",)):
        result = project.runpytest(*PLUGIN, "--hw=h200", *asked)  # 1 ms cases: over 50 us
        result.assert_outcomes(passed=2)
        assert not _pool_run_lines(result)


def test_no_pool_runs_on_a_cpu(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DEVICE", "cpu")
    project.runpytest(*PLUGIN, "--hw=cpu", "--update-baselines").assert_outcomes(passed=2)
    result = project.runpytest(*PLUGIN, "--hw=cpu", "--attnperf-processes-below=5ms")
    result.assert_outcomes(passed=2)
    assert not _pool_run_lines(result)


def test_recording_from_a_subfolder_with_a_pool_run_keeps_the_pooled_figure(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """--update-baselines with one pool run (--attnperf-processes=2), run from a subfolder that
    holds the cases (the ini, the conftest and the baseline folder are above it):

    - the pool run finds the cases and measures both (no line names it);
    - each recorded entry is the pooled figure: 20 samples from each process, a median between
      this process's 1 ms and the pool run's 1.2 ms (neither one's), and the note that says so.
    """
    sub = project.mkdir("sub")
    (project.path / "test_cases.py").rename(sub / "test_cases.py")
    monkeypatch.chdir(sub)
    project.runpytest(*PLUGIN, "--hw=h200", "--update-baselines", "test_cases.py").assert_outcomes(passed=2)
    (project.path / "pool_run_speed.json").write_text(json.dumps({"test_case[a]": 1.2, "test_case[b]": 1.2}))
    result = project.runpytest(*PLUGIN, "--hw=h200", "--update-baselines", "--attnperf-processes=2",
                               "--attnperf-processes-below=5ms", "test_cases.py")
    result.assert_outcomes(passed=2)
    assert not [line for line in result.outlines if line.startswith("pool run ")]
    recorded = entries(project)
    assert sorted(recorded) == ["sub/test_cases.py::test_case[a]", "sub/test_cases.py::test_case[b]"]
    for entry in recorded.values():
        assert entry["n_samples"] == 40
        assert entry["median_ms"] == pytest.approx(1.1, rel=0.01)
        assert any("2 processes pooled" in n for n in entry["notes"])


@pytest.mark.parametrize("pool_run", [False, True])
def test_a_pool_run_injects_like_its_run_but_leaves_the_do_bench_comparison_to_it(
        monkeypatch: pytest.MonkeyPatch, pool_run: bool) -> None:
    from noise_benchmark import inject
    from pytest_attnperf.hw.table import DetectedDevice

    class Config:
        def getoption(self, name: str, default: object = None) -> object:
            return "/tmp/w.jsonl" if pool_run and name == "attnperf_pool_out" else default

    def made(inject_env: str | None) -> object:
        if inject_env is not None:
            monkeypatch.setenv("ATTNPERF_INJECT", inject_env)
        config = cast(pytest.Config, Config())  # the fake has the one method the hook calls
        gen = inject.pytest_attnperf_make_timer(config=config, device=DetectedDevice("cpu", "x86_64"))
        next(gen)
        try:
            gen.send(inner)
        except StopIteration as done:
            return done.value
        raise AssertionError("the hook wrapper did not return")

    inner = object()
    monkeypatch.setenv("ATTNPERF_COMPARE_FILE", "/tmp/compare.jsonl")
    monkeypatch.setenv("ATTNPERF_INJECT_LOG", "/tmp/inject.jsonl")
    compared = made(None)
    if pool_run:
        assert compared is inner
    else:
        assert isinstance(compared, inject.InjectingTimer)
        assert compared.compare == "/tmp/compare.jsonl"
    injecting = made("0.05")
    assert isinstance(injecting, inject.InjectingTimer)
    assert injecting.fraction == pytest.approx(0.05)
    assert injecting.compare == (None if pool_run else "/tmp/compare.jsonl")
    assert injecting.log == (None if pool_run else "/tmp/inject.jsonl")  # the run logs what its own process gave


def test_a_device_that_cannot_be_detected_fails_the_tests_not_the_session(project: pytest.Pytester) -> None:
    project.makeconftest(CONFTEST + POOL_RUN_SPEED + """

@pytest.hookimpl(tryfirst=True)
def pytest_attnperf_detect_device(config):
    raise RuntimeError("CUDA driver initialisation failed (scripted)")
""")
    result = project.runpytest(*PLUGIN)  # detected when a test first needs it (an explicit --hw checks at start-up)
    result.assert_outcomes(failed=2)
    assert "INTERNALERROR" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*CUDA driver initialisation failed (scripted)*"])


def test_a_turn_comes_through_its_pipe_and_a_closed_one_means_none() -> None:
    from pytest_attnperf.plugins.turns import Turn, Turns

    class Running:
        def poll(self) -> None:
            return None

    given = Turns()
    turn = Turn(*(os.dup(fd) for fd in given.child_ends()))  # the pool run's own copies, as after a start
    given.started()
    given.give()
    assert turn.wait() is True
    turn.done()
    given.wait_done(cast(Any, Running()))  # returns: DONE was written
    given.close()

    withheld = Turns()
    turn = Turn(*(os.dup(fd) for fd in withheld.child_ends()))
    withheld.close()  # the parent stopped: no turn
    assert turn.wait() is False
    turn.done()  # nobody to tell: no error


@pytest.mark.parametrize("text", ["7", "a,b", "999990,999991"])
def test_a_turn_that_is_not_two_open_descriptors_is_refused(text: str) -> None:
    from pytest_attnperf.plugins.turns import Turn

    with pytest.raises(ValueError, match="not two open file descriptors GO,DONE"):
        Turn.parse(text)


def test_a_pool_run_whose_turn_never_comes_runs_no_test(pytester: pytest.Pytester) -> None:
    from pytest_attnperf.plugins.turns import Turns

    pytester.makepyfile(test_t="def test_a():\n    open('ran', 'w').close()\n")
    given = pytester.path / "in.json"
    write_input(given, ["test_t.py::test_a"], _settings(pytester))
    turns = Turns()
    child = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "pytest_attnperf.plugin",
                              f"--attnperf-pool-input={given}", "--attnperf-pool-out=w.jsonl", turns.flag()],
                             cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             pass_fds=turns.child_ends())
    turns.started()
    turns.close()  # the parent stops before the turn
    out, _ = child.communicate(timeout=300)
    assert child.returncode == pytest.ExitCode.INTERRUPTED
    assert b"this pool run's parent stopped before its turn came" in out
    assert not (pytester.path / "ran").exists()


def test_modules_named_by_the_selected_kernels_are_imported_ahead(pytester: pytest.Pytester) -> None:
    from pytest_attnperf.families.registry import Kernel, import_ahead

    pytester.makepyfile(ahead_mod="LOADED = True\n", ahead_bad="raise SystemExit('no')\n")
    pytester.syspathinsert()
    sys.modules.pop("ahead_mod", None)

    class Item:
        def __init__(self, **params: Any) -> None:
            self.callspec = type("Spec", (), {"params": params})()

    kernel = Kernel("softmax", "k", lambda: None, imports=("ahead_bad", "ahead_mod"))
    other = Kernel("softmax", "plain", lambda: None)
    failed = import_ahead([Item(kernel=kernel, direction="fwd"), Item(kernel=other), Item(kernel=kernel), object()])
    assert failed == ["ahead_bad"]
    assert sys.modules["ahead_mod"].LOADED is True
