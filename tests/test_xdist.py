"""pytest-xdist runs on the CPU, with fake GPUs: each worker pinned to its own, the cases'
entries merged into one baseline file by the controller, one summary."""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from types import SimpleNamespace
from typing import Any

import kit
import pytest
import yaml

pytest.importorskip("xdist")

PLUGIN = (*kit.PLUGIN, "-p", "no:randomly")

CONFTEST = kit.conftest() + '''
import fcntl
import time

AT_IMPORT = os.environ.get("CUDA_VISIBLE_DEVICES")  # a conftest that touches CUDA while loading sees this


def pytest_attnperf_visible_gpus(config):
    listed = os.environ.get("FAKE_GPUS", "0,1")
    return [g for g in listed.split(",") if g]


def pytest_attnperf_detect_device(config):
    if not os.environ.get("FAKE_GPUS", "0,1"):
        return DEVICES["cpu"]
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "unpinned")
    if gpu == "1" and os.environ.get("FAKE_MIXED"):  # an H100 beside the H200
        return DetectedDevice("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 132, 50 * 2**20, extra={"uuid": "GPU-fake-1"})
    return DetectedDevice("cuda", "NVIDIA H200", (9, 0), 132, 60 * 2**20, extra={"uuid": f"GPU-fake-{gpu}"})


class LoggingTimer(ScriptedTimer):
    """The kit's timer, the same in any process; each measurement appends its test, worker,
    pinned GPU and host-clock interval to seen.jsonl."""

    def measure(self, fn, plan):
        start = time.time()
        time.sleep(float(os.environ.get("FAKE_TIMING_S", "0")))
        measured = super().measure(fn, plan)
        seen = {"test": current_test()[0], "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                "at_import": AT_IMPORT, "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start,
                "end": time.time()}
        with open(HERE / "seen.jsonl", "a") as out:
            fcntl.flock(out, fcntl.LOCK_EX)
            out.write(json.dumps(seen) + "\\n")
        return measured


def pytest_attnperf_make_timer(config, device):
    return LoggingTimer()
'''

TESTS = '''
import os
import signal

import pytest

from pytest_attnperf.costs import Cost


@pytest.mark.parametrize("kernel", ["k0", "k1"])
@pytest.mark.parametrize("case", ["s0", "s1", "s2", "s3"])
def test_case(case, kernel, attnperf):
    attnperf.measure(lambda: None, cost=Cost(flops=1e12, bytes=1e9), dtype="bf16")
    if os.environ.get("FAKE_CRASH") == f"{case}-{kernel}":
        os.kill(os.getpid(), signal.SIGKILL)  # the worker process dies after its measurement (os._exit is refused)


def test_plain():
    assert True
'''

CASES = [f"test_cases.py::test_case[s{s}-k{k}]" for s in range(4) for k in range(2)]  # a shape: a group


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("FAKE_GPUS", raising=False)
    return kit.make_project(pytester, CONFTEST, ini=INI, test_cases=TESTS)


INI = "attnperf_baselines = baselines\n"  # a project that configures attnperf


def seen(pytester: pytest.Pytester) -> list[dict[str, Any]]:
    path = pytester.path / "seen.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return [json.loads(line) for line in lines]


def _xdist_count() -> int:
    """pytest-xdist's own ``-n auto`` count (one worker per CPU, or its environment variable's)."""
    from xdist.plugin import pytest_xdist_auto_num_workers as xdist_count

    return int(xdist_count(SimpleNamespace(option=SimpleNamespace(numprocesses="auto"))))


def table_rows(out: str) -> list[str]:
    """The attnperf summary table's case column."""
    return re.findall(r"^((?:test_cases\.py::)?test_case\[s\d-k\d\]\S*)\s", out, flags=re.M)


def test_parallel_update_writes_what_a_serial_one_does(project: pytest.Pytester) -> None:
    """Two workers, two (fake) GPUs: every entry of a serial --update-baselines is written by a
    parallel one, under the serial keys, with the same figures; an entry of another test stays.
    The same run's report holds every worker's cases, and each worker appends the cases it
    measured to one history under the run's id (the controller appends none)."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=9)
    serial = kit.entries(project)
    assert sorted(serial) == CASES
    path = kit.baseline_path(project)
    with kit.editing_baseline(project) as data:
        data["entries"] = {"elsewhere.py::test_x": serial[CASES[0]]}
    seen(project)

    result = project.runpytest(*PLUGIN, "--update-baselines", "-n", "2", f"--attnperf-report={project.path / 'report'}",
                               "--attnperf-history=hist")
    result.assert_outcomes(passed=9)
    parallel = kit.entries(project)
    assert sorted(parallel) == sorted([*CASES, "elsewhere.py::test_x"])  # no '@group' suffix in any key
    assert parallel["elsewhere.py::test_x"] == serial[CASES[0]]
    for case in CASES:
        assert parallel[case]["median_ms"] == serial[case]["median_ms"]
        assert parallel[case]["n_samples"] == serial[case]["n_samples"]
    out = result.stdout.str()
    assert f"wrote 8 measured entries to {path} (1 other entries kept)" in out
    assert (f"recorded into {path}: 8 entries written, 8 new, 0 continued their history, 0 restarted it; "
            "8 entries hold 1 recording") in out  # counted against the file as it was, not as written
    assert sorted(table_rows(out)) == [case.split("::")[1] for case in CASES]  # every case once, no '@group'
    assert "loadgroup" not in out
    assert "@attnperf:" not in out
    timed = seen(project)
    assert {t["worker"] for t in timed} == {"gw0", "gw1"}
    assert all(t["gpu"] == t["at_import"] == {"gw0": "0", "gw1": "1"}[t["worker"]] for t in timed)  # pinned from
    # the worker's start, and each on its own GPU
    worker_of = {t["test"]: t["worker"] for t in timed}
    for shape in range(4):  # a shape's cases on one worker: its compiling and autotuning once
        assert worker_of[f"test_case[s{shape}-k0]"] == worker_of[f"test_case[s{shape}-k1]"]
    result.stdout.fnmatch_lines(["*pytest-xdist: 2 workers, one GPU each (CUDA_VISIBLE_DEVICES=0,1)",
                                 "*gw0: GPU 0 (NVIDIA H200, GPU-fake-0): * measured cases",
                                 "*gw1: GPU 1 (NVIDIA H200, GPU-fake-1): * measured cases"])
    counts = [int(n) for n in re.findall(r"gw\d: GPU \d \(.*\): (\d+) measured cases", out)]
    assert sum(counts) == 8

    report = json.loads((project.path / "report" / "report.json").read_text())
    assert sorted(case["nodeid"] for case in report["cases"]) == CASES
    assert report["environment"]["hardware"] == "h200"
    found = [json.loads(line) for line in (project.path / "hist" / "h200.jsonl").read_text().splitlines()]
    assert sorted(r["case"] for r in found) == sorted(CASES)
    assert len({r["run"] for r in found}) == 1
    assert len({r["machine"]["id"] for r in found}) == 2  # each worker's card: GPU-fake-0 and GPU-fake-1


def test_parallel_verdicts_match_the_serial_ones_with_pool_runs_on_each_workers_gpu(project: pytest.Pytester) -> None:
    """One -n 2 run with --attnperf-processes=2 beside the same serial run without it, over two
    shapes (a group each, so one on each worker), one case regressed, several claims:

    - the regressed case fails under -n 2 exactly as it does serially, every other verdict is
      the same, and nothing is written (the scripted timer gives every process the same
      samples, so pooling them changes no verdict);
    - a group's extra process measures its cases on the GPU of the worker that runs them,
      before the first; each case pools its samples.
    """
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=9)
    before = (project.path / "baselines" / "h200.yaml").read_text()
    kit.set_speeds(project, {"test_case[s1-k1]": 1.2})
    serial = project.runpytest(*PLUGIN, "-rA", "-k", "s0 or s1")
    seen(project)
    parallel = project.runpytest(*PLUGIN, "-rA", "-k", "s0 or s1", "-n", "2", "--attnperf-processes=2",
                                 "--attnperf-processes-below=5ms")
    for result in (serial, parallel):
        result.assert_outcomes(passed=3, failed=1)
        result.stdout.fnmatch_lines(["*test_cases.py::test_case[[]s1-k1[]]: REGRESSED +20.0%*"])
        assert "3 unchanged" in result.stdout.str()
    assert kit.outcomes(parallel) == kit.outcomes(serial)
    assert (project.path / "baselines" / "h200.yaml").read_text() == before

    timed = seen(project)
    gpu_of = {t["test"]: t["gpu"] for t in timed if t["worker"] != "main"}
    pooled = [t for t in timed if t["worker"] == "main"]  # the extra processes are no pytest-xdist workers
    assert len(gpu_of) == 4
    assert set(gpu_of.values()) == {"0", "1"}  # a group each
    assert sorted(t["test"] for t in pooled) == sorted(gpu_of)
    assert all(t["gpu"] == gpu_of[t["test"]] for t in pooled)
    parallel.stdout.fnmatch_lines(["*2 cases under 5000 us timed in 2 processes (1 pool runs before each group's "
                                   "first case, * s)"])
    for case in sorted(gpu_of):  # each case's own note: the regressed case's pooled medians differ from the others'
        assert f"note: {case}: 2 processes pooled, 20 samples each" in parallel.stdout.str()


def test_auto_starts_one_worker_per_gpu_whose_failures_reach_the_report(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """One ``-n auto`` run, with a GPU count that pytest-xdist's own count (one per CPU) is not,
    and test_failing.py beside the cases, several claims:

    - it starts one worker per GPU, each pinned to its own;
    - the workers' failed call reports reach the controller, which lists the cases that failed
      before they were measured under their keys (no pytest-xdist group suffix).
    """
    theirs = _xdist_count()
    gpus = ["5"] if theirs != 1 else ["5", "7"]  # the fewest workers that cannot be mistaken for theirs
    monkeypatch.setenv("FAKE_GPUS", ",".join(gpus))
    project.makepyfile(test_failing=kit.FAILING_CASES)
    result = project.runpytest(*PLUGIN, "--update-baselines", "-n", "auto",
                               f"--attnperf-report={project.path / 'report'}")
    result.assert_outcomes(passed=10, failed=4)  # test_cases.py's 9; ok and 4 failures of test_failing.py
    out = result.stdout.str()
    assert f"pytest-xdist: {len(gpus)} workers, one GPU each (CUDA_VISIBLE_DEVICES={','.join(gpus)})" in out
    pinned = {(t["worker"], t["gpu"]) for t in seen(project)}
    assert pinned
    assert pinned <= {(f"gw{i}", gpu) for i, gpu in enumerate(gpus)}

    report = json.loads((project.path / "report" / "report.json").read_text())
    assert [(f["nodeid"], f["message"]) for f in report["failures"]] == [
        ("test_failing.py::test_case[raises]", "RuntimeError: kernel launch failed: invalid argument"),
        ("test_failing.py::test_case[wrong]", "o: 12 of 4096 elements outside the bound"),
    ]


def test_more_workers_than_gpus_is_refused(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers for one GPU. Asked for in so many words (--update-baselines), the run stops at
    start-up; otherwise each timed case fails with the reason and the others run."""
    monkeypatch.setenv("FAKE_GPUS", "0")
    refused = project.runpytest(*PLUGIN, "--update-baselines", "-n", "2")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*2 pytest-xdist workers for 1 GPU(s)*run with -n 1 (or -n auto)"])
    assert not (project.path / "baselines").exists()

    failed = project.runpytest(*PLUGIN, "-n", "2", "-k", "s0 or plain")  # a shape's two timed cases, one untimed
    failed.assert_outcomes(passed=1, failed=2)
    failed.stdout.fnmatch_lines(["*not timed: 2 pytest-xdist workers share 1 GPU(s)*"])
    assert seen(project) == []  # nothing was timed


def test_a_check_only_run_may_share_a_gpu_among_its_workers(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is timed there, so two workers on one GPU are not refused and every case passes
    unmeasured; the same workers asked to time are refused (above)."""
    monkeypatch.setenv("FAKE_GPUS", "0")
    result = project.runpytest(*PLUGIN, "--hw=h200", "--attnperf-check-only", "-n", "2", "-k", "s0 or plain")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=3)
    assert seen(project) == []  # nothing timed
    assert not (project.path / "baselines").exists()

    refused = project.runpytest(*PLUGIN, "--hw=h200", "-n", "2")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR


def test_without_a_gpu_timing_takes_turns_and_a_worker_that_dies_keeps_the_entries_it_sent(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """One CPU-only ``--update-baselines -n 2`` run in which the worker that measures s2-k0 is
    killed right after (SIGKILL), several claims:

    - the workers' timed intervals never overlap, and the summary says the CPU was shared;
    - the lock file and the group maps are removed at the end;
    - every case that finished, on either worker, is recorded and reported passed; the one the
      worker died in fails, named in pytest-xdist's message; the run ends (no replacement worker
      by default).
    """
    monkeypatch.setenv("FAKE_GPUS", "")
    monkeypatch.setenv("FAKE_TIMING_S", "0.15")
    monkeypatch.setenv("FAKE_CRASH", "s2-k0")
    scratch = project.path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # the workers' temporary folder
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # the controller's (here, in this process)
    result = project.runpytest(*PLUGIN, "--update-baselines", "-n", "2", "-rA")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    timed = sorted(seen(project), key=lambda t: t["start"])
    assert {t["worker"] for t in timed} == {"gw0", "gw1"}  # (the CPU's ceilings are timed too, in turn)
    cases = {case.split("::")[1] for case in CASES}
    # the rest is each worker's preparation (the ceilings), before its first case: no test is
    # current then, and the scripted timer reads the name this test's process left in the environment
    assert {t["test"] for t in timed} - cases <= {request.node.name}
    assert all(later["start"] >= earlier["end"] for earlier, later in itertools.pairwise(timed))
    assert "no GPU: timing took turns on a lock" in result.stdout.str()
    assert not list(scratch.glob("attnperf-*"))  # the lock file and the group maps, removed at the end

    result.stdout.fnmatch_lines(["*worker 'gw?' crashed while running*s2-k0*"])
    crashed = "test_cases.py::test_case[s2-k0]"
    assert kit.outcomes(result)[crashed] == "FAILED"
    passed = {nodeid for nodeid, outcome in kit.outcomes(result).items() if outcome == "PASSED"}
    finished = {f"test_cases.py::{t['test']}" for t in timed if t["test"] in cases} - {crashed}
    assert len(finished) >= 4
    assert sorted(kit.entries(project, "cpu")) == sorted(finished)
    assert finished <= passed  # each finished case reported as passed, and recorded


def test_workers_of_each_host_take_its_gpus_in_turn() -> None:
    """--tx over hosts: the K-th worker on a host gets that host's K-th GPU; this host's come
    from its visible list, another host's by index (the controller cannot see them)."""
    from pytest_attnperf.parallel.fleet import Fleet, _expanded

    specs = _expanded(["2*popen", "2*ssh=gpu-a//python=python3", "ssh=gpu-b"])
    fleet = Fleet(gpus=["3", "4"], workers=len(specs), specs=specs)
    assert [fleet.gpu_for(f"gw{i}") for i in range(5)] == ["3", "4", "0", "1", "0"]
    assert not fleet.shared_gpu
    assert not fleet.shares_gpu("gw1")
    crowded = Fleet(gpus=["0"], workers=3, specs=_expanded(["2*popen", "ssh=gpu-a"]))
    assert crowded.shared_gpu
    assert crowded.shares_gpu("gw0")
    assert not crowded.shares_gpu("gw2")


def test_workers_on_different_cards_write_no_baseline_and_lose_nothing(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """An H100 worker beside an H200 one: one file cannot hold both, so neither is written; the
    measured entries are saved aside and the run fails, naming both cards."""
    aside = tmp_path_factory.mktemp("aside")
    monkeypatch.setattr(tempfile, "tempdir", str(aside))  # where the controller saves what it cannot write
    monkeypatch.setenv("TMPDIR", str(aside))  # and where the workers leave their group maps, for it to remove
    monkeypatch.setenv("FAKE_MIXED", "1")
    result = project.runpytest(*PLUGIN, "--update-baselines", "-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "the workers measured on different hardware (h" in out
    assert "h100" in out
    assert "h200" in out
    assert "ERROR, NOT written" in out
    assert not (project.path / "baselines").exists()
    saved = list(aside.glob("attnperf-*-unsaved-*.yaml"))
    assert len(saved) == 1
    assert not list(aside.glob("attnperf-groups-*"))  # the workers' group maps, removed at the end
    assert sorted(yaml.safe_load(saved[0].read_text())["entries"]) == CASES


def test_a_project_that_does_not_configure_attnperf_keeps_xdist_as_it_is(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """No attnperf option anywhere: -n auto counts CPUs (pytest-xdist's own count, though more
    GPUs are visible) and pins no worker; a timed case on a GPU fails saying why, and the untimed
    test runs."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=TESTS)
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    theirs = _xdist_count()
    monkeypatch.setenv("FAKE_GPUS", ",".join(str(i) for i in range(theirs + 3)))  # not to be mistaken for theirs
    result = pytester.runpytest(*PLUGIN, "-n", "auto", "-k", "plain or (s0 and k0)")  # one timed case, one untimed
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*not timed: this pytest-xdist run gave its workers no GPU each*"])
    assert not (pytester.path / "seen.jsonl").exists()  # refused before anything was timed
    assert f"created: {theirs}/{theirs} worker" in result.stdout.str()


def test_dist_each_is_refused(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN, "-n", "2", "--dist", "each")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--dist each runs every case on every worker*"])


def test_one_predicate_says_why_a_worker_may_not_time() -> None:
    """``Seat.why_not_timing`` serves both the preparation (skipped) and a case's timing (failed);
    the device is looked up only for a worker the run gave no GPU."""
    from pytest_attnperf.parallel.fleet import UNPLANNED, Seat

    def no_lookup() -> bool:
        raise AssertionError("the device was looked up")

    seat = Seat(worker="gw0", gpu="0", gpus=2, workers=2, testrunuid="t")
    assert seat.why_not_timing(no_lookup) is None
    seat.refusal = "3 pytest-xdist workers share 2 GPU(s)"
    assert seat.why_not_timing(no_lookup) == "3 pytest-xdist workers share 2 GPU(s)"
    unplanned = Seat(worker="gw1", gpu=None, gpus=0, workers=2, testrunuid="t", unplanned=True)
    assert unplanned.why_not_timing(lambda: True) == UNPLANNED
    assert unplanned.why_not_timing(lambda: False) is None
