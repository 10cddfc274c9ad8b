"""The noise benchmark: its injection (a fixed part of the cases, work that really adds time), and the
script run in stages over two calls on a tiny project."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kit
import pytest
import yaml

from noise_benchmark import compare as noise_compare
from noise_benchmark.benchmark import _stages
from noise_benchmark.inject import InjectingTimer, is_picked
from pytest_attnperf.measure.timing import HostTimer, Measurement, SamplingPlan


def test_picks_a_fixed_part_of_the_cases() -> None:
    ids = [f"suites/test_x.py::test_x[case{i}]" for i in range(400)]
    picked = [i for i in ids if is_picked(i, 2)]
    assert 150 < len(picked) < 250
    assert picked == [i for i in ids if is_picked(i, 2)]
    assert all(is_picked(i, 1) for i in ids)


def test_injected_work_adds_its_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a scripted host clock (each read 1 us later than the last), so the machine's load
    cannot move the figures: 2 ms of work, slowed by 50%, takes 1.5 times as long."""
    reads = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(reads) * 1e-6)
    monkeypatch.setattr(time, "perf_counter_ns", lambda: next(reads) * 1000)

    def work() -> None:
        until = time.perf_counter() + 0.002
        while time.perf_counter() < until:
            pass

    plan = SamplingPlan(min_samples=15, budget_s=0.1, warmup_calls=1)

    def ratios() -> tuple[float, float, tuple[str, ...]]:
        """(slowed / plain, untouched / plain, the slowed measurement's notes), on the host clock."""
        monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::picked (call)")
        plain = HostTimer().measure(work, plan).median_ms
        slowed = InjectingTimer(HostTimer(), kit.CPU, fraction=0.5, every=1, compare=None).measure(work, plan)
        untouched = InjectingTimer(HostTimer(), kit.CPU, fraction=0.5, every=10**9, compare=None)
        monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::other (call)")
        return slowed.median_ms / plain, untouched.measure(work, plan).median_ms / plain, slowed.notes

    slowed_ratio, untouched_ratio, notes = ratios()
    assert slowed_ratio == pytest.approx(1.5, abs=0.01)
    assert untouched_ratio == pytest.approx(1.0, abs=0.005)
    assert any("injected +50%" in note for note in notes)


class Modeled:
    """A scripted device: a callable takes its ``ms`` (the plugin's own least work, no ``ms``: 4 us)
    on its ``clock``; extra work added by the plugin costs 1.2 us more than asked."""

    def __init__(self) -> None:
        self.timed: list[object] = []

    def measure(self, fn: object, plan: SamplingPlan) -> Measurement:
        self.timed.append(fn)
        inner = getattr(fn, "wrapped", fn)
        ms = getattr(inner, "ms", 0.004)
        if hasattr(fn, "extra_s"):
            ms += 0.0012 + 1e3 * fn.extra_s
        return Measurement(samples_ms=(ms,) * 10, clock=getattr(inner, "clock", "cuda-graph-nodes"), mode=plan.mode)


def a_case(ms: float, clock: str = "cuda-graph-nodes") -> Callable[[], None]:
    def case() -> None:
        pass

    case.ms, case.clock = ms, clock  # type: ignore[attr-defined]
    return case


@pytest.mark.parametrize(("fraction", "slowed", "note"), [
    (0.05, 0.05, "injected +5% extra work (base 0.05 ms; the extra work's own 1.20 us taken off)"),
    (0.02, 0.024, "injected +2% extra work asked, +2.4% given: the least extra work, 1.20 us, is more than "
                  "1.00 us (base 0.05 ms)"),
])
def test_injection_takes_off_the_extra_works_own_cost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fraction: float, slowed: float, note: str
) -> None:
    """A spin kernel costs about 1.2 us however short (on the H200 (2026-11-29) a +2% came out +2.7 to +4.5% on
    50-200 us cases): the least extra work is timed and taken off, so a 50 us case slows by 5%
    when asked 5%; asked less than the least, it gets the least and says so. The log has both."""
    log, device, case = tmp_path / "inject.jsonl", Modeled(), a_case(0.05)
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::picked (call)")
    timer = InjectingTimer(device, kit.CPU, fraction=fraction, every=1, compare=None, log=str(log))
    measured = timer.measure(case, SamplingPlan())
    assert len(device.timed) == 4  # the case, the least work bare and with a one-cycle spin, the case slowed
    assert timer.measure(case, SamplingPlan()).median_ms == measured.median_ms
    assert len(device.timed) == 6  # the least is timed once per mode
    timer.measure(case, SamplingPlan(mode="hot"))
    assert len(device.timed) == 10  # and again for another mode
    assert measured.median_ms == pytest.approx(0.05 * (1 + slowed))
    assert measured.notes == (note,)
    row = json.loads(log.read_text().splitlines()[0])
    assert row == {"nodeid": "t.py::picked", "fraction": fraction, "base_ms": 0.05, "least_ms": pytest.approx(0.0012),
                   "extra_ms": pytest.approx(max(0.0, fraction * 0.05 - 0.0012)), "median_ms": measured.median_ms}


def test_injection_keeps_the_least_to_cases_timed_on_its_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A case that cannot be captured (events around eager launches) launches its spin from the
    host, at a cost the graph-timed least does not tell: nothing taken off, and the note says
    so. A case whose base reads no positive time is not injected (the plugin fails it)."""
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::picked (call)")
    timer = InjectingTimer(Modeled(), kit.CPU, fraction=0.05, every=1, compare=None)
    measured = timer.measure(a_case(0.1, "cuda-events"), SamplingPlan())
    assert measured.median_ms == pytest.approx(0.1 + 0.005 + 0.0012)
    assert measured.notes == ("injected +5% extra work (base 0.1 ms; the extra work's own cost not taken off: "
                              "the case is timed on cuda-events, the least on cuda-graph-nodes)",)
    zero = timer.measure(a_case(0.0), SamplingPlan())
    assert zero.median_ms == 0.0
    assert zero.notes == ("not injected: the case read 0.0 ms",)


def test_compare_writes_do_bench_and_clocks_beside_the_median(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cross-check's line per case: our median, do_bench_cudagraph at 20 ms and at the
    harness's graph length, the SM clock after each; a callable do_bench cannot take is written
    with its error, not raised."""
    import torch
    import triton.testing

    from noise_benchmark import inject
    from pytest_attnperf.measure.timing import Measurement

    class Fixed:
        def measure(self, fn: object, plan: SamplingPlan) -> Measurement:
            return Measurement(samples_ms=(0.2, 0.2, 0.2), clock="cuda-graph", mode="hot", sm_clock_mhz=1995.0,
                               calls_per_sample=100, eager_ms=0.5)

    calls: list[float] = []

    def fake_do_bench(fn: object, rep: float = 20, return_mode: str = "mean") -> float:
        assert return_mode == "median"
        calls.append(rep)
        if len(calls) in (4, 5):  # the second case's same-length do_bench, then the third case's 20 ms one
            raise RuntimeError("operation not permitted when stream is capturing")
        return 0.21 if rep == 20 else 0.2

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", fake_do_bench)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(inject, "read_sm_clock", lambda index: (1980.0, ()))
    out = tmp_path / "compare.jsonl"
    timer = InjectingTimer(Fixed(), kit.H200, fraction=0.0, every=2, compare=str(out))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::a (call)")
    assert timer.measure(lambda: None, SamplingPlan()).median_ms == 0.2
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::b (call)")
    timer.measure(lambda: None, SamplingPlan())
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::c (call)")
    timer.measure(lambda: None, SamplingPlan())
    first, second, third = (json.loads(line) for line in out.read_text().splitlines())
    assert first == {"nodeid": "t.py::a", "mode": "hot", "ours_ms": 0.2, "clock_after_ours": 1995.0, "calls": 100,
                     "do_bench_ms": 0.21, "clock_after_do_bench": [1980.0, []], "do_bench_same_rep_ms": 50.0,
                     "do_bench_same_ms": 0.2, "clock_after_do_bench_same": [1980.0, []]}
    assert calls[:2] == [20, 50.0]  # 100 calls of 0.5 ms eager: do_bench's graph of about 100 calls
    # a failed same-length do_bench leaves the 20 ms figure standing
    assert second["do_bench_ms"] == 0.21
    assert second["do_bench_same_ms"] == 0.0
    assert "stream is capturing" in second["error_same"]
    # a failed 20 ms do_bench is recorded, and the same-length one is not tried
    assert third["do_bench_ms"] == 0.0
    assert "stream is capturing" in third["error"]
    assert "do_bench_same_ms" not in third
    assert len(calls) == 5


@pytest.mark.parametrize(("calls", "eager_ms", "same_rep"), [(1, 0.5, None), (100, None, None), (2560, 0.5, 1000.0)],
                         ids=["one-call-graph", "no-eager-time", "capped"])
def test_compare_times_do_bench_at_the_harness_length_only_where_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, calls: int, eager_ms: float | None, same_rep: float | None
) -> None:
    """No second do_bench for a one-call graph (do_bench's 20 ms graph is as long already) or
    without the eager time to size it by; a rep over 1000 ms is capped (its capture runs that
    long on the host)."""
    import torch
    import triton.testing

    from noise_benchmark import inject
    from pytest_attnperf.measure.timing import Measurement

    class Fixed:
        def measure(self, fn: object, plan: SamplingPlan) -> Measurement:
            return Measurement(samples_ms=(0.2,), clock="cuda-graph", mode="hot", calls_per_sample=calls,
                               eager_ms=eager_ms)

    reps: list[float] = []

    def do_bench_cudagraph(fn: Callable[[], Any], rep: float = 20, return_mode: str = "mean") -> float:
        reps.append(rep)
        return 0.2

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", do_bench_cudagraph)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(inject, "read_sm_clock", lambda index: (1980.0, ()))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::a (call)")
    out = tmp_path / "compare.jsonl"
    InjectingTimer(Fixed(), kit.H200, fraction=0.0, every=2, compare=str(out)).measure(lambda: None, SamplingPlan())
    line = json.loads(out.read_text())
    assert reps == [20] + ([same_rep] if same_rep else [])
    assert line.get("do_bench_same_rep_ms") == same_rep
    assert ("do_bench_same_ms" in line) == (same_rep is not None)


def test_the_sample_floor_is_neither_injected_nor_compared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor is timed within the run's first case (on the H200 (2026-11-30) its cold row read 5.3 us
    against do_bench's 1.2 us, in the hot compare stage; injected, it would move every cold
    case's floor shift): the wrapping timer hands it to the run's timer as it is."""
    from pytest_attnperf.measure.timing import Measurement

    seen: list[object] = []

    class Recording:
        def measure(self, fn: object, plan: SamplingPlan) -> Measurement:
            seen.append(fn)
            return Measurement(samples_ms=(0.005,) * 3, clock="cuda-graph-nodes", mode="cold")

    def add() -> None:
        pass

    out = tmp_path / "compare.jsonl"
    timer = InjectingTimer(Recording(), kit.H200, fraction=0.5, every=1, compare=str(out))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "t.py::first (call)")
    measured = timer.measure(add, SamplingPlan(overhead=True))
    assert seen == [add]
    assert measured.notes == ()
    assert not out.exists()



# -- the script, end to end on a tiny project: fake CPU device, scripted timer -------------------

CONFTEST = kit.conftest("cpu") + '''
MS = {"big": 1.0, "mid": 0.02, "small": 0.005}


class SizedTimer(ScriptedTimer):
    """Around the case's time; slower by the extra work the inject plugin wrapped the callable
    with, plus 1 us (as a spin kernel's own launch costs about that), so a gate that works
    catches every injected case."""

    def factor(self, name, nodeid, fn):
        case = name.split("[")[1].split("]")[0]
        return MS[case] + (1e3 * fn.extra_s + 0.001 if hasattr(fn, "extra_s") else 0)


def pytest_attnperf_make_timer(config, device):
    return SizedTimer()
'''

CASES = '''
import pytest

from pytest_attnperf.costs import Cost


@pytest.mark.parametrize("size", ["big", "mid", "small"])
def test_case(size, attnperf):
    attnperf.measure(lambda: None, cost=Cost(flops=1e9, bytes=1e6), dtype="fp32")


def test_skipped(attnperf):
    pytest.skip("measures nothing: not a picked case")
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    # the benchmark's pytest runs load no plugin the tiny project does not use (each run is a process)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:randomly -p no:xdist -p no:anyio\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_cases.py").write_text(CASES)
    return tmp_path


def noise(project: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``python -m noise_benchmark.benchmark OPTIONS -- <the tiny project's tests>``, in the project."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(kit.ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "noise_benchmark.benchmark", "--workdir", "work", *options,
           "--", *kit.PLUGIN_NO_CEILINGS, "--hw=cpu", "test_cases.py"]
    return subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("existing", [None, "/elsewhere"])
def test_its_pytest_runs_load_the_inject_plugin_from_the_checkout_in_any_folder(
        existing: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's pytest is started with ``-p noise_benchmark.inject`` and the folder holding
    noise_benchmark first on PYTHONPATH (an existing value kept after it): a run in another working
    folder imports the plugin."""
    from noise_benchmark import benchmark as noise
    from pytest_attnperf.measure import child as child_run

    if existing is None:
        monkeypatch.delenv("PYTHONPATH", raising=False)
    else:
        monkeypatch.setenv("PYTHONPATH", existing)
    started: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(child_run, "start", lambda cmd, env: started.append((cmd, env)))
    monkeypatch.setattr(child_run, "wait_for", lambda child: 0)
    assert noise._pytest(["x.py"], {"ATTNPERF_INJECT": "0.05"}) == 0
    [(cmd, env)] = started
    assert cmd[cmd.index("-p") + 1] == "noise_benchmark.inject"
    assert env["ATTNPERF_INJECT"] == "0.05"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(kit.ROOT), *([existing] if existing else [])]
    where = subprocess.run([sys.executable, "-c", "import noise_benchmark.inject as i; print(i.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()) == kit.ROOT / "noise_benchmark" / "inject.py"


def test_compare_flag_adds_the_compare_stage_to_named_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from noise_benchmark import benchmark as noise

    ran: list[dict[str, str] | None] = []

    def fake_pytest(args: list[str], env: dict[str, str] | None = None) -> int:
        ran.append(env)
        return 0

    monkeypatch.setattr(noise, "_pytest", fake_pytest)
    assert noise.main(["--workdir", str(tmp_path), "--stages", "steady", "--runs", "1", "--compare", "--", "x.py"]) == 0
    assert ran[0] is None
    assert ran[1] is not None
    assert "ATTNPERF_COMPARE_FILE" in ran[1]
    assert len(ran) == 2
    assert (tmp_path / "report-steady-compare.txt").exists()


def test_stages_parse_as_named_and_run_in_order() -> None:
    assert _stages("steady") == ("steady",)
    assert _stages("inject") == ("inject",)
    assert _stages("compare, steady") == ("steady", "compare")
    assert _stages("record,steady,inject,compare") == ("record", "steady", "inject", "compare")
    with pytest.raises(argparse.ArgumentTypeError, match="subset of record,steady,inject,compare"):
        _stages("steady,injcet")


def test_the_stages_over_two_calls_of_the_command(project: Path) -> None:
    """The command line on the tiny project, its stages split over two calls sharing the work folder:

    1. ``record,steady``: an earlier call's runs are deleted; the recording writes the baseline file,
       whose entries hold its one median (the steady run records nothing); the steady table counts
       the call's run, judged against the recording (no false regression, no injected line), and
       says that one run has no spread;
    2. ``inject``: the steady table of the earlier call, read back from the folder, gives the size
       classes; +10% is caught on each size class, slowed by what was asked (the spin's own 1 us
       taken off), a case too short for 10% given the least extra work and said so; untouched cases
       are not flagged, the skipped test is no picked case, the injected run records nothing, and
       there is no compare stage unless named.

    Elsewhere, on pytest runs faked in this process: with no steady run the size classes come from
    the baseline file (``test_inject_without_steady_runs_sizes_from_the_baseline``); ``--keep-runs``
    numbers a call's runs after the folder's (``test_a_cut_steady_run_is_set_aside``); ``--records``
    runs one recording each (``test_time_limit_stops_before_a_run_that_would_pass_it``); the spread
    of several runs' medians (``test_steady_table_reports_range_and_sd_of_the_run_medians``).
    """
    work = project / "work"
    work.mkdir()
    (work / "run7.json").write_text("{}")  # an earlier call's run: not one of this call's runs
    first = noise(project, "--stages", "record,steady", "--runs", "1", "--records", "1")
    assert first.returncode == 0, first.stdout + first.stderr
    assert not (work / "run7.json").exists()
    assert (work / "cpu.yaml").exists()
    assert [p.name for p in sorted(work.glob("run*.json"))] == ["run0.json"]
    entries = yaml.safe_load((work / "cpu.yaml").read_text())["entries"]
    assert {len(e["run_medians_ms"]) for e in entries.values()} == {1}  # the recording's; gating recorded nothing
    steady = (work / "report-record-steady.txt").read_text()
    assert steady in first.stdout
    assert "1 unchanged runs" in steady
    assert "false regressions over 1 unchanged runs: 0 in 3 judgements" in steady
    assert "run-to-run spread: no case of 10 us or more has two runs in this folder" in steady
    assert "+10%" not in steady
    row = next(line for line in steady.splitlines() if line.startswith("test_case[small]"))
    assert row.split()[-2:] == ["1", "0"]  # in the run, not flagged

    second = noise(project, "--stages", "inject", "--inject", "0.1", "--every", "1")
    assert second.returncode == 0, second.stdout + second.stderr
    entries = yaml.safe_load((work / "cpu.yaml").read_text())["entries"]
    assert {len(e["run_medians_ms"]) for e in entries.values()} == {1}
    report = (work / "report-inject.txt").read_text()
    assert report in second.stdout
    assert "1 unchanged runs" in report  # the earlier call's steady table, read back from the folder
    assert "size classes from the medians of 1 steady runs" in report
    assert "do_bench" not in report  # compare runs only when named
    given = "in the run's own process"
    for size in (">=50us", ">=10us"):  # the spin's own 1 us taken off: slowed by what was asked
        assert f"+10% on 1 cases {size}: caught 1; slowed by median +10.00% (+10.00 to +10.00%) {given}\n" in report
    assert (f"+10% on 1 cases <10us: caught 1; slowed by median +20.00% (+20.00 to +20.00%) {given}; "
            "1 given more than asked (the least extra work), caught 1\n") in report  # 0.5 us asked, 1 us least
    assert "+10%: untouched cases flagged: 0" in report
    assert "without a median" not in report  # the skipped test is no picked case


BASELINE_ENTRY = "{median_ms: %s, ci_low_ms: %s, ci_high_ms: %s, stdrel: 0.002, n_samples: 20}"


def test_inject_without_steady_runs_sizes_from_the_baseline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``record,inject`` in one call, no steady run in the work folder: the size classes come from
    the medians of the baseline file the recording wrote, each picked case counted in its own. The
    command's own function, on pytest runs faked here (the command line runs above)."""
    from noise_benchmark import benchmark as noise

    medians = {"t.py::test_case[big]": 1.0, "t.py::test_case[mid]": 0.02, "t.py::test_case[small]": 0.005}
    runs: list[list[str]] = []

    def fake_pytest(args: list[str], env: dict[str, str] | None = None) -> int:
        runs.append(args)
        if "--update-baselines" in args:  # the recording: the baseline file
            (tmp_path / "cpu.yaml").write_text("format: 1\nmeta: {}\nentries:\n" + "".join(
                f"  '{case}': {BASELINE_ENTRY % (ms, ms, ms)}\n" for case, ms in medians.items()))
        else:  # the injected run: every case picked and caught
            body = "".join(f'<testcase classname="t" name="{case.split("::")[1]}" file="t.py">'
                           '<failure message="REGRESSED +50.0% against the baseline"/></testcase>' for case in medians)
            (tmp_path / "inject500.xml").write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
        return 0

    monkeypatch.setattr(noise, "_pytest", fake_pytest)
    assert noise.main(["--workdir", str(tmp_path), "--stages", "record,inject", "--records", "1", "--inject", "0.5",
                       "--every", "1", "--", "x.py", "--hw=cpu"]) == 0
    assert ["--update-baselines" in args for args in runs] == [True, False]
    report = (tmp_path / "report-record-inject.txt").read_text()
    assert "no steady runs in" in report
    assert "size classes from the medians in cpu.yaml" in report
    for size in (">=50us", ">=10us", "<10us"):
        assert f"+50% on 1 cases {size}: caught 1\n" in report
    assert "+50%: untouched cases flagged: 0" in report


def test_inject_on_an_empty_workdir_names_the_missing_baseline(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """The command's own function, in this process (the module's command line runs in the tests above)."""
    from noise_benchmark import benchmark

    monkeypatch.chdir(project)
    monkeypatch.setattr(benchmark, "_pytest", lambda *a, **k: pytest.fail("a pytest run started"))
    status = benchmark.main(["--workdir", "work", "--stages", "inject",
                             "--", "-p", "pytest_attnperf.plugin", "--hw=cpu", "test_cases.py"])
    assert status != 0
    assert f"no cpu.yaml in {(project / 'work').resolve()}" in capsys.readouterr().err


def test_compare_report_counts_each_size_class_and_failed_captures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The do_bench cross-check: ratios per size class, how many lie within 3%, the worst one,
    and callables do_bench_cudagraph could not capture counted, not averaged in."""
    from noise_benchmark import benchmark as noise

    rows = [
        {"nodeid": "a", "ours_ms": 0.100, "do_bench_ms": 0.101, "do_bench_same_ms": 0.100, "calls": 200},  # >=50us
        {"nodeid": "b", "ours_ms": 0.090, "do_bench_ms": 0.100, "do_bench_same_ms": 0.091, "calls": 222,  # 10% fast
         "clock_after_ours": 1980.0, "clock_after_do_bench": [1860.0, ["sw-power-cap"]]},
        {"nodeid": "c", "ours_ms": 0.020, "do_bench_ms": 0.020},  # 10-50us, equal
        {"nodeid": "f", "ours_ms": 0.104, "do_bench_ms": 0.100, "do_bench_same_ms": 0.0, "calls": 192,  # 4% slow
         "clock_after_ours": 1725.0, "clock_after_do_bench": [1905.0, ["sw-power-cap"]], "error_same": "OOM"},
        {"nodeid": "d", "ours_ms": 0.200, "do_bench_ms": 0.0, "error": "RuntimeError('capture')"},
        {"nodeid": "e", "mode": "cold", "ours_ms": 0.0053, "do_bench_ms": 0.0012},  # a case marked cold
    ]
    (tmp_path / "compare.jsonl").write_text("stale line from an earlier call\n")

    def fake_pytest(args: list[str], env: dict[str, str] | None = None) -> int:
        assert env is not None
        path = Path(env["ATTNPERF_COMPARE_FILE"])
        with path.open("a") as out:
            out.writelines(f"{json.dumps(r)}\n" for r in rows)
        return 0

    monkeypatch.setattr(noise, "_pytest", fake_pytest)
    lines = noise._compare_lines(["suites/"], tmp_path)
    assert lines[0].startswith("harness / do_bench_cudagraph, 3 cases >=50us: median ratio 0.990, worst 0.900")
    # the same-length figure where it was timed: a (1.000) and b (0.989), not f (failed)
    assert lines[0].endswith("within 3%: 1; at the harness's calls a graph (2 cases): median 0.995, within 3%: 2")
    assert lines[1] == "harness / do_bench_cudagraph, 1 cases >=10us: median ratio 1.000, worst 1.000, within 3%: 1"
    assert lines[2] == ("outside 3%: 2 cases; the SM clocks after each differed in 2"
                        "; do_bench lower in 1 (do_bench 1860-1860 MHz, harness 1980-1980 MHz; do_bench's throttle "
                        "reasons: sw-power-cap)"
                        "; the harness lower in 1 (do_bench 1905-1905 MHz, harness 1725-1725 MHz; do_bench's "
                        "throttle reasons: sw-power-cap)")
    assert lines[3] == ("  b: harness 90.00 us, do_bench 100.00 us (x0.900), at the harness's 222 calls a graph "
                        "91.00 us (x0.989); do_bench at 1860 MHz (sw-power-cap), harness 1980")
    assert lines[4] == ("  f: harness 104.00 us, do_bench 100.00 us (x1.040); do_bench at 1905 MHz (sw-power-cap), "
                        "harness 1725")
    assert lines[5] == "at the harness's graph length, do_bench failed on 1 cases (first: OOM)"
    assert lines[6] == f"compare: do_bench_cudagraph failed on 1 cases (see {tmp_path / 'compare.jsonl'})"
    assert lines[7] == "compare: 1 cases not timed hot (cold) left out: do_bench_cudagraph does not flush the L2"
    assert len(lines) == 8
    rows[:] = rows[-1:]  # nothing hot to set beside do_bench
    assert noise._compare_lines(["suites/"], tmp_path) == [
        f"compare: no do_bench_cudagraph timings of hot cases in {tmp_path / 'compare.jsonl'} (it needs a GPU)",
        lines[7]]


def test_compare_report_names_cases_outside_at_the_harness_graph_length() -> None:
    """do_bench at the harness's graph length: the cases outside 3% of it are named with both
    clocks where they were more than 1% apart (a 15 MHz step is not a gap), and a rep capped at
    1000 ms is named by its rep, since do_bench's graph then held fewer calls."""
    rows = [
        {"nodeid": "t::a", "ours_ms": 0.2, "do_bench_ms": 0.2, "do_bench_same_ms": 0.19, "calls": 104,
         "clock_after_ours": 1815.0, "clock_after_do_bench_same": [1620.0, ["sw-power-cap"]]},
        {"nodeid": "t::b", "ours_ms": 0.1, "do_bench_ms": 0.1, "do_bench_same_ms": 0.096, "calls": 2560,
         "do_bench_same_rep_ms": 1000.0, "clock_after_ours": 1980.0, "clock_after_do_bench_same": [1965.0, []]},
        {"nodeid": "t::c", "ours_ms": 0.1, "do_bench_ms": 0.1, "do_bench_same_ms": 0.1, "calls": 200},
    ]
    assert noise_compare._same_outside_lines(rows) == [
        "at the harness's graph length, outside 3%: 2 cases",
        "  a: harness 200.00 us, do_bench at the harness's 104 calls a graph 190.00 us (x1.053); "
        "do_bench at 1620 MHz (sw-power-cap), harness 1815",
        "  b: harness 100.00 us, do_bench at rep 1000 ms (capped; fewer calls than the harness's 2560) 96.00 us "
        "(x1.042)"]
    assert noise_compare._same_outside_lines(rows[2:]) == []
    # the 20 ms figure's clocks: 1965 against 1980 is one 15 MHz step, not a gap
    assert noise_compare._clock_gap({"clock_after_ours": 1980.0, "clock_after_do_bench": [1965.0, []]}) is None


def test_compare_report_says_when_no_clock_explains_the_gap() -> None:
    """Outside 3% with do_bench at the harness's clock (or no clock read): counted, not explained."""
    rows: list[dict[str, Any]] = [
        {"ours_ms": 0.09, "do_bench_ms": 0.1, "clock_after_ours": 1980.0, "clock_after_do_bench": [1980.0, []]},
        {"ours_ms": 0.09, "do_bench_ms": 0.1, "clock_after_ours": None, "clock_after_do_bench": [None, []]},
        {"ours_ms": 0.1, "do_bench_ms": 0.1}]
    assert noise_compare._outside_lines(rows) == [
        "outside 3%: 2 cases; the SM clocks after each differed in 0",
        "  ?: harness 90.00 us, do_bench 100.00 us (x0.900)", "  ?: harness 90.00 us, do_bench 100.00 us (x0.900)"]
    assert noise_compare._outside_lines(rows[2:]) == []


def test_compare_report_names_at_most_twenty_cases_outside() -> None:
    """Each case outside 3% a line with its node id's test part, the twenty furthest from
    do_bench first (fast or slow alike); the rest counted."""
    rows = [{"nodeid": f"suites/test_softmax.py::test_softmax[c{i}]", "ours_ms": 0.0104 + 0.00001 * i,
             "do_bench_ms": 0.01, "do_bench_same_ms": 0.0106, "calls": 900} for i in range(23)]
    rows.insert(5, {"nodeid": "x::test_softmax[fast]", "ours_ms": 0.009, "do_bench_ms": 0.01})  # -10%: furthest
    lines = noise_compare._outside_lines(rows)
    assert lines[0] == "outside 3%: 24 cases; the SM clocks after each differed in 0"
    assert lines[1] == "  test_softmax[fast]: harness 9.00 us, do_bench 10.00 us (x0.900)"
    assert lines[2] == ("  test_softmax[c22]: harness 10.62 us, do_bench 10.00 us (x1.062), "
                        "at the harness's 900 calls a graph 10.60 us (x1.002)")
    assert len(lines) == 22
    assert lines[20].startswith("  test_softmax[c4]:")
    assert lines[21] == "  ... and 4 more in compare.jsonl"


def test_steady_table_reports_range_and_sd_of_the_run_medians(tmp_path: Path) -> None:
    """One odd run among five moves the range past 1% while the sd stays under it; the table
    counts each by its own definition."""
    from noise_benchmark.benchmark import _steady_lines

    medians = {"t.py::odd": [1.0, 1.02, 1.0, 1.0, 1.0], "t.py::steady": [0.05, 0.05, 0.05, 0.05, 0.05],
               "t.py::wild": [0.02, 0.021, 0.019, 0.02, 0.021]}
    for i in range(5):
        runs = [{"fullname": case, "stats": {"median": values[i] / 1e3}} for case, values in medians.items()]
        (tmp_path / f"run{i}.json").write_text(json.dumps({"benchmarks": runs}))
    lines = _steady_lines(tmp_path)
    assert not any(line.startswith("machines:") for line in lines)  # runs without machine names
    row = {line.split()[0]: line.split()[2:4] for line in lines if line.split()[:1] in (["odd"], ["steady"], ["wild"])}
    assert row == {"odd": ["2.00%", "0.89%"], "steady": ["0.00%", "0.00%"], "wild": ["10.00%", "4.14%"]}
    assert lines[-1] == "cases >= 10 us with run-to-run range > 1%: 2 of 3; with sd > 1%: 1 of 3"


def test_steady_table_names_failures_that_are_not_regressions(tmp_path: Path) -> None:
    """A changed clock or a crash in an unchanged run is listed apart from false regressions."""
    from noise_benchmark.benchmark import _steady_lines

    verdicts = {"slow": "regressed", "clock": "clock changed", "fine": "unchanged"}  # crash: none written
    runs = [{"fullname": f"t.py::{c}", "stats": {"median": 1e-4},
             "extra_info": {"attnperf_machine": "gpu-1/boot-2", "attnperf_floor_ms": 0.00612,
                            **({"verdict": verdicts[c]} if c in verdicts else {})}}
            for c in ("slow", "clock", "crash", "fine")]
    (tmp_path / "run0.json").write_text(json.dumps({"benchmarks": runs}))
    (tmp_path / "run0.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="t" name="slow"><failure message="t.py::slow: REGRESSED +3.0%"/></testcase>'
        '<testcase classname="t" name="clock"><failure message="t.py::clock: CLOCK CHANGED: ..."/></testcase>'
        '<testcase classname="t" name="crash"><error message="RuntimeError: CUDA error"/></testcase>'
        '<testcase classname="t" name="fine"/>'
        "</testsuite></testsuites>"
    )
    lines = _steady_lines(tmp_path)
    assert "false regressions over 1 unchanged runs: 1 in 2 judgements (not judged: 1 clock changed)" in lines
    assert "cases that failed for another reason in some run: 2 (clock, crash)" in lines
    assert "machines: run0 on gpu-1/boot-2" in lines
    assert "sample overhead: run0 6.12 us" in lines


def test_steady_runs_without_a_baseline_say_nothing_was_gated(tmp_path: Path) -> None:
    """A steady run in a work folder without a baseline file reported "0 false
    regressions" with every case 'new' once. The line now counts the judgements and says so."""
    from noise_benchmark.benchmark import _steady_lines

    runs: list[dict[str, Any]] = [
        {"fullname": f"t.py::{c}", "stats": {"median": 1e-4}, "extra_info": {"verdict": "new"}} for c in "ab"]
    (tmp_path / "run0.json").write_text(json.dumps({"benchmarks": runs}))
    line = next(line for line in _steady_lines(tmp_path) if line.startswith("false regressions"))
    assert line.startswith("false regressions over 1 unchanged runs: 0 in 0 judgements (not judged: 2 new); "
                           "NOTHING WAS GATED: no case had a baseline entry")
    runs[1]["extra_info"]["verdict"] = "not compared"  # another reason: not blamed on the baseline
    (tmp_path / "run0.json").write_text(json.dumps({"benchmarks": runs}))
    line = next(line for line in _steady_lines(tmp_path) if line.startswith("false regressions"))
    assert line.endswith("(not judged: 1 new, 1 not compared); NOTHING WAS GATED: see 'not judged'")


class FakeClock:
    """A clock that each fake pytest run moves on by the next of ``durations`` seconds."""

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations = 1000.0, list(durations)
        self.runs: list[list[str]] = []

    def __call__(self) -> float:
        return self.now

    def run_pytest(self, args: list[str], env: dict[str, str] | None = None) -> int:
        self.runs.append(args)
        self.now += self.durations.pop(0)
        return 0

    @classmethod
    def installed(cls, monkeypatch: pytest.MonkeyPatch, durations: list[float]) -> FakeClock:
        """A clock that the noise module reads, and its pytest runs."""
        from noise_benchmark import benchmark as noise

        clock = cls(durations)
        monkeypatch.setattr(noise, "_now", clock)
        monkeypatch.setattr(noise, "_pytest", clock.run_pytest)
        return clock


def test_time_limit_stops_before_a_run_that_would_pass_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from noise_benchmark import benchmark as noise

    clock = FakeClock.installed(monkeypatch, [90, 100, 80])
    code = noise.main(["--workdir", str(tmp_path), "--stages", "record,steady", "--records", "2", "--runs", "3",
                       "--time-limit", "300", "--", "x.py"])
    # recordings 90 s and 100 s (190 s used; a first steady run is taken as 2 x 100 s: 390 > 300)
    assert code == 3
    assert len(clock.runs) == 2
    assert all("--update-baselines" in run for run in clock.runs)
    message = ("stopped before steady run0: 190 s of the 300 s time limit used, and it would take about 200 s "
               "(twice the longest run in this call, no steady run yet); the report covers the runs that finished")
    assert message in capsys.readouterr().out
    assert message in (tmp_path / "report-record-steady.txt").read_text()


def test_time_limit_always_runs_the_first_and_none_without_a_limit(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from noise_benchmark import benchmark as noise

    clock = FakeClock.installed(monkeypatch, [500, 500])
    noise.main(["--workdir", str(tmp_path), "--stages", "steady", "--runs", "2", "--time-limit", "10", "--", "x.py"])
    assert len(clock.runs) == 1  # the first run has no longer run before it to go by
    clock = FakeClock.installed(monkeypatch, [500, 500])
    noise.main(["--workdir", str(tmp_path), "--stages", "steady", "--runs", "2", "--", "x.py"])
    assert len(clock.runs) == 2


def test_without_pytest_benchmark_it_names_the_extra_and_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    from noise_benchmark import benchmark as noise

    found = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "pytest_benchmark" else found(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(noise, "_pytest", lambda *a, **k: pytest.fail("a run started"))
    assert noise.main(["--workdir", str(tmp_path / "work"), "--stages", "steady", "--runs", "1", "--", "x.py"]) == 2
    assert capsys.readouterr().err == ("noise benchmark: needs pytest-benchmark: "
                                       "pip install -e '.[benchmark]' in the checkout\n")
    assert not (tmp_path / "work").exists()


@pytest.mark.parametrize("text", ["0", "-5", "ten", "nan"])
def test_time_limit_must_be_a_positive_number(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    from noise_benchmark import benchmark as noise

    with pytest.raises(SystemExit):
        noise.main(["--stages", "steady", "--time-limit", text, "--", "x.py"])
    assert "must be a positive number of seconds" in capsys.readouterr().err


def test_time_limit_goes_by_the_longest_run_of_the_same_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from noise_benchmark import benchmark as noise

    clock = FakeClock.installed(monkeypatch, [60, 70, 65])
    code = noise.main(["--workdir", str(tmp_path), "--stages", "steady", "--runs", "5", "--time-limit", "250",
                       "--", "x.py"])
    # 60 + 70 + 65 = 195 s used; the next steady run is taken as 70 s: 265 > 250
    assert code == 3
    assert len(clock.runs) == 3
    assert "stopped before steady run3: 195 s of the 250 s time limit used, and it would take about 70 s " \
           "(the longest steady run in this call)" in capsys.readouterr().out


def test_time_limit_keeps_the_earlier_runs_when_no_steady_run_can_start(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from noise_benchmark import benchmark as noise

    (tmp_path / "run0.json").write_text("{}")  # an earlier call's run
    clock = FakeClock.installed(monkeypatch, [200])
    code = noise.main(["--workdir", str(tmp_path), "--stages", "record,steady", "--records", "1", "--runs", "2",
                       "--time-limit", "300", "--", "x.py"])
    assert code == 3
    assert len(clock.runs) == 1
    assert (tmp_path / "run0.json").exists()  # not deleted for runs that never started


def test_time_limit_stops_inject_before_its_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from noise_benchmark import benchmark as noise

    (tmp_path / "h200.yaml").write_text("format: 1\nmeta: {}\nentries: {}\n")
    clock = FakeClock.installed(monkeypatch, [100, 100])
    code = noise.main(["--workdir", str(tmp_path), "--stages", "steady,inject,compare", "--runs", "2",
                       "--time-limit", "350", "--", "x.py", "--hw=h200"])
    report = (tmp_path / "report-steady-inject-compare.txt").read_text()
    assert code == 3
    assert len(clock.runs) == 2
    assert "stopped before the +2% injected run: 200 s of the 350 s time limit used" in report
    assert "injected work" not in report


def test_steady_table_sets_apart_the_cases_timed_with_events(tmp_path: Path) -> None:
    """A host-bound callable (no graph) is marked, and counted on a line of its own."""
    from noise_benchmark.benchmark import _steady_lines

    medians = {"t.py::graphed": [1.0, 1.0, 1.0], "t.py::loop": [300.0, 290.0, 310.0], "t.py::tiny": [0.005] * 3}
    for i in range(3):
        runs = [{"fullname": case, "stats": {"median": values[i] / 1e3},
                 "extra_info": {"attnperf_clock": "cuda-events" if case != "t.py::graphed" else "cuda-graph"}}
                for case, values in medians.items()]
        (tmp_path / f"run{i}.json").write_text(json.dumps({"benchmarks": runs}))
    lines = _steady_lines(tmp_path)
    rows = {line.split()[0]: line.split()[-1] for line in lines if line.split()[:1] in (["graphed"], ["loop"])}
    assert rows == {"graphed": "0", "loop": "events"}
    assert lines[-2] == "cases >= 10 us with run-to-run range > 1%: 1 of 2; with sd > 1%: 1 of 2"
    assert lines[-1] == ("  of them timed with events around eager launches ('events': not graph-capturable, "
                         "launch and host overhead included): 1, range > 1%: 1, sd > 1%: 1")


CHILD = """
import signal, sys, time
from pathlib import Path
out, mode = Path(sys.argv[1]), sys.argv[2]
got = []
def count(*_):
    got.append(1)
    out.write_text(str(len(got)))
signal.signal(signal.SIGINT, count)
out.with_suffix(".ready").write_text("")
while not got:
    time.sleep(0.01)
if mode == "writes":  # pytest printing failures and writing its reports
    time.sleep(1.5)
    sys.exit(2)
while True:  # a pytest that does not stop
    time.sleep(0.1)
"""

DRIVER = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from pytest_attnperf.measure import child as child_run
signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the test runner's shell set
child_run.INTERRUPT_GRACE_S = float(sys.argv[5])
child = child_run.start([sys.executable, "-c", sys.argv[2], sys.argv[3], sys.argv[4]], dict(os.environ))
try:
    child_run.wait_for(child)
    print("returned")
except KeyboardInterrupt:
    print("interrupted", child.returncode, flush=True)
"""


@pytest.mark.parametrize(
    ("mode", "gaps", "grace", "exit_status"),
    [
        ("writes", [0.3], 20.0, 2),  # stops and writes its reports inside the grace period
        ("writes", [0.3, 0.1], 20.0, 2),  # `timeout`'s echo of the same interrupt is not a second one
        ("hangs", [0.3], 0.5, -9),  # does not stop: killed when the grace period ends
        ("hangs", [0.3, 1.5], 20.0, -9),  # a second interrupt: killed then
    ],
)
def test_an_interrupted_run_gets_one_sigint_and_time_to_write_its_reports(
    tmp_path: Path, mode: str, gaps: list[float], grace: float, exit_status: int
) -> None:
    """A real pytest stand-in in its own session, as the benchmark starts pytest, under a driver
    process (this test process is never signalled): interrupting the driver passes the child one
    SIGINT and waits for it (subprocess.run killed it after 0.25 s); a child that does not stop is
    killed after the grace period, or at a second interrupt."""
    import signal

    out = tmp_path / "child.txt"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(kit.ROOT), CHILD, str(out), mode, str(grace)],
                              stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not out.with_suffix(".ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        began = time.monotonic()
        for gap in gaps:
            time.sleep(gap)
            driver.send_signal(signal.SIGINT)
        said, _ = driver.communicate(timeout=30)
    finally:
        driver.kill()
    assert said.split() == ["interrupted", str(exit_status)]
    assert out.read_text() == "1"  # the child got exactly one SIGINT
    assert time.monotonic() - began < 5


SLOW_TEST = """
import os, time
def test_slow():
    with open("pid.tmp", "w") as f:  # renamed whole: the test never reads a half-written file
        f.write(str(os.getpid()))
    os.replace("pid.tmp", "pid")
    deadline = time.monotonic() + 60
    while not os.path.exists("go") and time.monotonic() < deadline:
        time.sleep(0.05)
"""


@pytest.mark.parametrize("nohup", [False, True])
def test_sigterm_stops_a_call_like_ctrl_c_and_an_ignored_sighup_stays_ignored(tmp_path: Path, nohup: bool) -> None:
    """The benchmark's own process over a real pytest: SIGTERM reaches pytest as one SIGINT, its
    reports are written and set aside as a cut run, the report says so, the exit status is 130,
    and no pytest is left running. Under nohup (SIGHUP ignored) a SIGHUP changes nothing."""
    import signal

    (tmp_path / "test_slow.py").write_text(SLOW_TEST)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(kit.ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "noise_benchmark.benchmark",
           "--workdir", "work", "--stages", "steady", "--runs", "1",
           "--", "-p", "pytest_attnperf.plugin", "test_slow.py"]
    ignore_hup = (lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)) if nohup else None
    bench = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             preexec_fn=ignore_hup)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "pid").exists() and time.monotonic() < deadline and bench.poll() is None:
            time.sleep(0.05)
        assert (tmp_path / "pid").exists(), bench.communicate(timeout=60)[0]
        pid = int((tmp_path / "pid").read_text())
        if nohup:
            bench.send_signal(signal.SIGHUP)
            time.sleep(0.5)
            assert bench.poll() is None
            (tmp_path / "go").write_text("")
        else:
            bench.send_signal(signal.SIGTERM)
        said, _ = bench.communicate(timeout=60)
    finally:
        bench.kill()
    work = tmp_path / "work"
    if nohup:
        assert bench.returncode == 0, said
        assert (work / "run0.xml").exists()
        assert "interrupted" not in said
    else:
        assert bench.returncode == 130, said
        assert "interrupted during steady run0" in said
        assert (work / "run0.cut0.xml").exists()
        assert not (work / "run0.xml").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_an_interrupted_inject_run_counts_the_cases_it_finished(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the H200 (2026-11-29) `timeout -s INT` stopped an injected run, and its counts were lost.
    Now the cases in its report are counted, marked as a part, and the later runs do not start;
    a picked case the plugin did not compare (its verdict in the report) is not counted as missed."""
    from noise_benchmark import benchmark as noise

    entry = "{median_ms: 0.1, ci_low_ms: 0.099, ci_high_ms: 0.101, stdrel: 0.002, n_samples: 20}"
    names = [f"t.py::test_k[{i}]" for i in range(40)]
    picked = [n for n in names if is_picked(n, 2)][:3]
    untouched = [n for n in names if not is_picked(n, 2)][:1]
    (tmp_path / "h200.yaml").write_text(
        "format: 1\nmeta: {}\nentries:\n" + "".join(f"  '{n}': {entry}\n" for n in [*picked, *untouched]))
    (tmp_path / "inject50.xml").write_text("<testsuites/>")  # an earlier call's: not this run's
    runs: list[dict[str, str] | None] = []

    def interrupted_pytest(args: list[str], env: dict[str, str] | None = None) -> int:
        runs.append(env)
        cases = [(picked[0], '<failure message="REGRESSED +5.1% against the baseline"/>'), (untouched[0], ""),
                 (picked[2], '<properties><property name="attnperf_verdict" value="not compared"/></properties>')]
        body = "".join(f'<testcase classname="t" name="{n.split("::")[1]}" file="t.py">{f}</testcase>'
                       for n, f in cases)
        (tmp_path / "inject50.xml").write_text(f"<testsuites><testsuite>{body}</testsuite></testsuites>")
        raise KeyboardInterrupt

    monkeypatch.setattr(noise, "_pytest", interrupted_pytest)
    noise.main(["--workdir", str(tmp_path), "--stages", "inject", "--inject", "0.05,0.1", "--", "x.py", "--hw=h200"])
    report = (tmp_path / "report-inject.txt").read_text()
    assert len(runs) == 1  # the +10% run never started
    assert "+5% on 1 cases >=50us: caught 1" in report  # neither the case it never reached nor
    assert "+5%: 1 picked cases not compared with their baseline (not counted" in report  # this one
    assert "+5%: untouched cases flagged: 0" in report
    assert "+5%: interrupted; the counts cover the 3 cases it finished" in report
    assert "interrupted during the +5% injected run" in report


def test_recordings_report_their_spread_and_the_histories_cut_short(tmp_path: Path) -> None:
    """Each recording is one process, so three recordings are three processes' medians: the
    report counts the cases of 10 us or more whose recordings spread above 1%, names the worst,
    and lists a case left with fewer recordings than the rest (2026-11-29: an 11.8 us case
    whose every recording was judged a change against the one before)."""
    from noise_benchmark.benchmark import _recording_lines
    from pytest_attnperf.store import baselines

    def entry(runs: list[float]) -> dict[str, Any]:
        return {"median_ms": runs[-1], "ci_low_ms": runs[-1], "ci_high_ms": runs[-1], "stdrel": 0.001,
                "n_samples": 100, "run_medians_ms": runs}

    assert _recording_lines(tmp_path, "h200") == []  # no baseline file: nothing to say
    baselines.save(tmp_path / "h200.yaml", baselines.BaselineFile(entries={
        "t.py::test[moving]": entry([0.0273, 0.0279, 0.0281]), "t.py::test[steady]": entry([0.2, 0.2002, 0.1999]),
        "t.py::test[cut]": entry([0.0118]), "t.py::test[tiny]": entry([0.005, 0.006, 0.005])}))
    lines = _recording_lines(tmp_path, "h200")
    assert lines[0] == ("recordings in h200.yaml (one process each): cases >= 10 us with range > 1%: 1 of 2; "
                        "with sd > 1%: 1 of 2 (test[moving] 1.50%)")
    assert lines[1].startswith("  1 case(s) with fewer than 3 recordings")
    assert lines[1].endswith(": test[cut]")
    baselines.save(tmp_path / "h200.yaml", baselines.BaselineFile(entries={"t.py::test[cut]": entry([0.0118])}))
    assert _recording_lines(tmp_path, "h200") == ["recordings: at most one per case in h200.yaml, no spread"]
    (tmp_path / "h200.yaml").write_text("entries: [")
    assert _recording_lines(tmp_path, "h200")[0].startswith("recordings: h200.yaml unreadable (")


def test_one_run_reports_no_spread(tmp_path: Path) -> None:
    """A case with one steady run (e.g. one run a folder on each GPU) has no run-to-run
    spread: the table shows none, the count leaves it out, and a folder of such cases says so
    instead of "range > 1%: 0 of N"."""
    from noise_benchmark.benchmark import _steady_lines

    runs = [{"fullname": "t.py::long", "stats": {"median": 1.0 / 1e3}, "extra_info": {"verdict": "unchanged"}}]
    (tmp_path / "run0.json").write_text(json.dumps({"benchmarks": runs}))
    lines = _steady_lines(tmp_path)
    assert next(line for line in lines if line.startswith("long")).split()[1:4] == ["1.0000ms", "-", "-"]
    assert not any("range > 1%" in line for line in lines)
    assert "run-to-run spread: no case of 10 us or more has two runs in this folder" in lines[-1]
    # beside cases with two runs, a case with one is left out of the count
    other = {"fullname": "t.py::other", "stats": {"median": 2.0 / 1e3}, "extra_info": {"verdict": "unchanged"}}
    (tmp_path / "run0.json").write_text(json.dumps({"benchmarks": [*runs, other]}))
    (tmp_path / "run1.json").write_text(json.dumps({"benchmarks": [{**other, "stats": {"median": 2.1 / 1e3}}]}))
    assert _steady_lines(tmp_path)[-1] == "cases >= 10 us with run-to-run range > 1%: 1 of 1; with sd > 1%: 1 of 1"


def test_an_injected_run_cut_before_its_report_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier call's report of the same run is deleted first, so it is not counted as this one's."""
    from noise_benchmark import benchmark as noise

    (tmp_path / "h200.yaml").write_text("format: 1\nmeta: {}\nentries: {}\n")
    stale = '<testsuites><testsuite><testcase classname="t" name="test_k[0]"/></testsuite></testsuites>'
    (tmp_path / "inject50.xml").write_text(stale)

    def cut(args: list[str], env: dict[str, str] | None = None) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(noise, "_pytest", cut)
    noise.main(["--workdir", str(tmp_path), "--stages", "inject", "--inject", "0.05", "--", "x.py", "--hw=h200"])
    report = (tmp_path / "report-inject.txt").read_text()
    assert "+5%: interrupted before pytest wrote inject50.xml" in report
    assert "caught" not in report


def test_an_unjudged_case_counts_as_not_compared(tmp_path: Path) -> None:
    """A CPU case timed on a contended host was judged against nothing: no catch and no miss."""
    from pytest_attnperf.store.runs import _outcomes

    verdict = '<properties><property name="attnperf_verdict" value="unjudged"/></properties>'
    (tmp_path / "a.xml").write_text(f'<testsuites><testsuite><testcase classname="t" name="test_k[0]">{verdict}'
                                    '</testcase></testsuite></testsuites>')
    assert _outcomes(tmp_path / "a.xml") == {"t.py::test_k[0]": "not compared"}


def test_junit_reports_of_cut_runs(tmp_path: Path) -> None:
    """A run cut by SIGINT writes a nameless testcase for the test it stopped: not a case. A run
    killed while writing leaves a file that is not XML: named, and its counts not taken."""
    from noise_benchmark.benchmark import _inject_counts, _steady_lines
    from pytest_attnperf.store.runs import BadReport, _outcomes

    (tmp_path / "a.xml").write_text('<testsuites><testsuite><testcase classname="t" name="test_k[0]"/>'
                                    '<testcase time="0.000"/></testsuite></testsuites>')
    assert _outcomes(tmp_path / "a.xml") == {"t.py::test_k[0]": "passed"}
    (tmp_path / "inject50.xml").write_text('<testsuites><testsuite><testcase classname="t" na')
    with pytest.raises(BadReport, match="inject50.xml is unreadable"):
        _outcomes(tmp_path / "inject50.xml")
    assert _inject_counts(tmp_path, "inject50", 0.05, 2, {}, 0)[0].startswith("+5%: inject50.xml is unreadable")
    runs = [{"fullname": "t.py::test_k[0]", "stats": {"median": 1e-3}, "extra_info": {"verdict": "unchanged"}}]
    (tmp_path / "run0.json").write_text(json.dumps({"benchmarks": runs}))
    (tmp_path / "run0.xml").write_text("<testsuites><testsuite>")
    lines = _steady_lines(tmp_path)
    assert any("run0.xml is unreadable" in line and "failed for another reason are not listed" in line
               for line in lines)


def test_a_cut_steady_run_is_set_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pytest-benchmark writes its JSON also when interrupted: that part of a run is kept as
    run<i>.cut<k>.json, out of the run count and of the next call's numbering, and a run cut
    again under the same number does not overwrite it. A ``--keep-runs`` call's runs are numbered
    after the folder's, which it keeps and counts with its own."""
    from noise_benchmark import benchmark as noise

    runs = [{"fullname": "t.py::a", "stats": {"median": 1e-3}, "extra_info": {"verdict": "unchanged"}}]
    cut = {"run1.json"}  # the runs interrupted

    def steady(args: list[str], env: dict[str, str] | None = None) -> int:
        target = next(a.split("=", 1)[1] for a in args if a.startswith("--benchmark-json="))
        Path(target).write_text(json.dumps({"benchmarks": runs}))
        if Path(target).name in cut:
            raise KeyboardInterrupt
        return 0

    monkeypatch.setattr(noise, "_pytest", steady)
    assert noise.main(["--workdir", str(tmp_path), "--stages", "steady", "--runs", "3", "--", "x.py"]) == 130
    report = (tmp_path / "report-steady.txt").read_text()
    assert sorted(p.name for p in tmp_path.glob("run*.json")) == ["run0.json", "run1.cut0.json"]
    assert "1 unchanged runs" in report
    assert "interrupted during steady run1" in report
    assert [p.name for p in noise.run_files(tmp_path)] == ["run0.json"]
    # the next call's run takes the cut run's number (1); cut again, it is kept beside the first
    assert noise.main(["--workdir", str(tmp_path), "--stages", "steady", "--keep-runs", "--runs", "1", "--",
                       "x.py"]) == 130
    assert sorted(p.name for p in tmp_path.glob("run*.json")) == ["run0.json", "run1.cut0.json", "run1.cut1.json"]
    # a call's run that finishes is added after the folder's, and the table counts both
    cut.clear()
    assert noise.main(["--workdir", str(tmp_path), "--stages", "steady", "--keep-runs", "--runs", "1", "--",
                       "x.py"]) == 0
    assert [p.name for p in noise.run_files(tmp_path)] == ["run0.json", "run1.json"]
    assert "2 unchanged runs" in (tmp_path / "report-steady.txt").read_text()


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_pytest_dies_with_a_killed_benchmark(tmp_path: Path) -> None:
    """In a session of its own, pytest would outlive a benchmark killed with SIGKILL (no finally
    runs) and hold the GPU: it is started to die with its parent."""
    import signal

    driver_code = (
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(kit.ROOT)!r})\n"
        "from pytest_attnperf.measure import child as child_run\n"
        "child = child_run.start([sys.executable, '-c', sys.argv[1], sys.argv[2], 'hangs'], dict(os.environ))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n")
    out = tmp_path / "child.txt"
    driver = subprocess.Popen([sys.executable, "-c", driver_code, CHILD, str(out)], stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        assert driver.stdout is not None
        pid = int(driver.stdout.readline())
        deadline = time.monotonic() + 30
        while not out.with_suffix(".ready").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        driver.send_signal(signal.SIGKILL)
        driver.wait()

        def alive() -> bool:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                return False
            return state != "Z"

        deadline = time.monotonic() + 5
        while alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive()
    finally:
        driver.kill()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_child_takes_sigint_where_this_process_ignores_it(tmp_path: Path) -> None:
    """A test runner's worker or a shell's background job starts with SIGINT ignored, and a child
    inherits that: the child started here gets SIGINT back, so the one SIGINT an interrupted
    benchmark sends it stops it and it writes its reports."""
    import signal

    from pytest_attnperf.measure import child as child_run

    out = tmp_path / "handler.txt"
    code = "import signal, sys; open(sys.argv[1], 'w').write(repr(signal.getsignal(signal.SIGINT)))"
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = child_run.start([sys.executable, "-c", code, str(out)], dict(os.environ))
        assert child.wait(timeout=60) == 0
    finally:
        signal.signal(signal.SIGINT, before)
    assert "default_int_handler" in out.read_text()
