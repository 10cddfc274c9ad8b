"""The run history without pytest runs: shifts found in synthetic series with a known answer,
appends that lose nothing when several processes write at once, and ``attnperf-history``."""

from __future__ import annotations

import json
import multiprocessing
import random
import subprocess
import sys
from pathlib import Path

import kit
import pytest
from history_writer import record, write

from pytest_attnperf.gate import drift
from pytest_attnperf.report import drifts
from pytest_attnperf.store import history

pytest.importorskip("ruptures", reason="the optional extra history (ruptures) is not installed")

NOISE = 0.002  # run-to-run spread of a median, relative: about what graph replay gives


def noisy(levels: list[float], seed: int = 0, noise: float = NOISE) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + rng.gauss(0.0, noise)) for level in levels]


def creep(seed: int) -> list[float]:
    """10 steady runs, then 20 runs that each lose 1%."""
    return noisy([1.0] * 10 + [1.01 ** k for k in range(1, 21)], seed)


# -- shifts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_a_one_percent_per_run_creep_is_found_from_its_first_run(seed: int) -> None:
    shifts = drift.find_shifts(creep(seed))
    assert shifts, "a 20% creep went unseen"
    assert shifts[0].index == 10  # last good: run 10 (index 9), first bad: run 11 (index 10)
    assert all(s.slower for s in shifts)
    assert shifts[-1].after_ms / shifts[0].before_ms == pytest.approx(1.01 ** 18, rel=0.03)


@pytest.mark.parametrize("seed", range(5))
def test_the_creeps_range_to_bisect_names_its_commits(seed: int, tmp_path: Path) -> None:
    path = tmp_path / "h200.jsonl"
    for i, median in enumerate(creep(seed)):
        history.append(path, record(median, run=f"r{i:02d}", commit=f"c{i:02d}"))
    (found,) = [drifts.Found(s, tuple(drift.find_shifts(s.medians_ms)))
                for s in drifts.case_series("h200", history.read(path).records)]
    text = drifts.markdown([found], cases=1, skipped=0, window=0)
    first = next(line for line in text.splitlines() if line.startswith("| `case"))
    assert "| 11 | c09 | c10 |" in first  # at run 11: bisect c09..c10


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("at", [3, 15, 28, 29])
def test_a_single_spike_is_no_shift(seed: int, at: int) -> None:
    levels = [1.0] * 30
    levels[at] = 1.10  # one run 10% slower, the next ones as before (the last: none after it)
    assert drift.find_shifts(noisy(levels, seed)) == []


@pytest.mark.parametrize("seed", range(10))
def test_a_three_percent_step_at_run_12_is_found_at_12(seed: int) -> None:
    values = noisy([1.0] * 11 + [1.03] * 19, seed)
    (shift,) = drift.find_shifts(values)
    assert shift.index == 11  # run 12, 1-based
    assert shift.size == pytest.approx(0.03, abs=0.004)
    assert shift.p_value < 1e-6


@pytest.mark.parametrize("seed", range(10))
def test_a_steady_series_has_no_shift(seed: int) -> None:
    assert drift.find_shifts(noisy([1.0] * 30, seed)) == []
    assert drift.find_shifts(noisy([1.0] * 7, seed)) == []


def test_a_shift_counts_only_once_two_runs_stay_shifted() -> None:
    steady = noisy([1.0] * 5, 1)
    assert drift.find_shifts([*steady, 1.03]) == []
    assert drift.find_shifts([*steady, 1.03, 0.999]) == []  # came back: a spike
    (shift,) = drift.find_shifts([*steady, 1.03, 1.031])
    assert shift.index == 5
    assert drift.find_shifts([*steady, 1.03, 1.031], drift.Rule(persist=3)) == []


def test_a_shift_below_the_least_size_does_not_count() -> None:
    values = noisy([1.0] * 10 + [1.006] * 10, 2, noise=0.0005)
    assert drift.find_shifts(values) == []
    assert [s.index for s in drift.find_shifts(values, drift.Rule(min_shift=0.005))] == [10]


def test_drifted_is_the_last_shift_when_it_is_a_slowdown() -> None:
    slower = noisy([1.0] * 6 + [1.03] * 3, 3)
    shift = drift.drifted(slower)
    assert shift is not None
    assert shift.index == 6
    assert drift.drifted(noisy([1.0] * 6 + [0.97] * 3, 3)) is None  # faster: no drift
    assert drift.drifted(noisy([1.0] * 6 + [1.03] * 6 + [1.0] * 3, 3)) is None  # slowed, then fixed


def test_flat_scripted_medians_keep_a_noise_floor() -> None:
    """A fake clock's identical medians: sigma is the floor, and a 2% step still counts."""
    assert drift.noise_sigma([1.0] * 8, 0.002) == 0.002
    (shift,) = drift.find_shifts([1.0] * 5 + [1.02] * 2)
    assert (shift.index, shift.p_value) == (5, 0.0)


# -- the file ----------------------------------------------------------------------------------


def test_concurrent_appends_lose_nothing_and_every_line_parses(tmp_path: Path) -> None:
    path, writers, count = tmp_path / "h200.jsonl", 4, 150
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=write, args=(str(path), w, count)) for w in range(writers)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=300)
        assert p.exitcode == 0
    lines = path.read_text().splitlines()
    assert len(lines) == writers * count
    parsed = [json.loads(line) for line in lines]
    assert sorted(r["case"] for r in parsed) == sorted(f"w{w}-{i}" for w in range(writers) for i in range(count))
    for w in range(writers):  # each writer's records in its own order
        mine = [int(r["case"].split("-")[1]) for r in parsed if r["run"] == f"w{w}"]
        assert mine == list(range(count))
    assert history.read(path).unreadable == 0


def test_read_skips_a_torn_line_and_a_later_schema(tmp_path: Path) -> None:
    path = tmp_path / "h200.jsonl"
    history.append(path, record(1.0))
    with path.open("a") as handle:
        handle.write('{"schema": 1, "case": "x", "med')  # a writer killed mid-line
        handle.write("\n" + json.dumps({**record(1.0), "schema": history.SCHEMA + 1}) + "\n")
    history.append(path, record(2.0))
    read = history.read(path)
    assert [r["median_ms"] for r in read.records] == [1.0, 2.0]
    assert (read.unreadable, read.newer) == (1, 1)
    assert history.read(tmp_path / "none.jsonl").records == ()


def test_the_commit_is_git_head_in_a_checkout_else_none(tmp_path: Path) -> None:
    assert history.git_commit(tmp_path) is None
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "f").write_text("x")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert history.git_commit(tmp_path) == head


def test_a_series_keeps_a_runs_last_record_per_case_and_mode() -> None:
    records = [record(1.0, run="r1"), record(1.5, run="r1"), record(2.0, run="r2"), record(9.0, run="r1", mode="hot")]
    by_case = {(s.case, s.mode): s.medians_ms for s in drifts.case_series("h200", records)}
    assert by_case == {("case[a]", "cold"): [1.5, 2.0], ("case[a]", "hot"): [9.0]}


# -- the console script ------------------------------------------------------------------------


def _step_history(tmp_path: Path) -> Path:
    path = tmp_path / "h200.jsonl"
    for i, median in enumerate(noisy([1.0] * 11 + [1.03] * 9, 4)):
        commit = f"{i:02d}" + "0123456789abcdef" * 2 + "012345"  # 40 characters; shown: the first 12
        history.append(path, record(median, run=f"r{i}", commit=commit))
        history.append(path, record(0.5, run=f"r{i}", commit=commit, case="steady"))
    return path


def test_the_command_reports_the_step_with_its_range(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _step_history(tmp_path)
    assert drifts.main([str(tmp_path), "--out", str(tmp_path / "drift.md")]) == 0
    out = capsys.readouterr().out
    assert out == (tmp_path / "drift.md").read_text()
    assert "1 of 2 cases" in out
    (row,) = [line for line in out.splitlines() if line.startswith("| `case[a]`")]
    assert "| 12 | 100123456789 | 110123456789 |" in row
    assert "+3.0% slower" in row
    assert "`steady`" not in out
    assert path.exists()


def test_the_command_without_the_library_says_how_to_install_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _step_history(tmp_path)
    monkeypatch.setitem(sys.modules, "ruptures", None)  # import ruptures raises ImportError
    assert drifts.main([str(tmp_path)]) == 2
    assert "pip install 'pytest-attnperf[history]'" in capsys.readouterr().err


def test_plots_without_matplotlib_say_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _step_history(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert drifts.main([str(tmp_path), "--plot", str(tmp_path / "plots")]) == 0
    assert "No plots: matplotlib is not installed" in capsys.readouterr().out
    assert not (tmp_path / "plots").exists()


def test_a_plot_per_shifted_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    _step_history(tmp_path)
    assert drifts.main([str(tmp_path), "--plot", str(tmp_path / "plots")]) == 0
    (png,) = (tmp_path / "plots").glob("*.png")
    assert "case_a" in png.name
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_the_command_refuses_a_missing_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert drifts.main([str(tmp_path / "none.jsonl")]) == 2
    assert "no history" in capsys.readouterr().err


def test_the_plugin_and_the_command_import_without_the_library() -> None:
    code = ("import sys; sys.modules['ruptures'] = None; sys.modules['scipy'] = None\n"
            "import pytest_attnperf.plugin, pytest_attnperf.report.drifts\n"
            "from pytest_attnperf.gate import drift\n"
            "assert drift.available() is not None\n")
    env = {"PYTHONPATH": str(kit.ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = subprocess.run([sys.executable, "-c", "import sys, pytest_attnperf.plugin; "
                             "print('ruptures' in sys.modules, 'scipy' in sys.modules)"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert loaded.stdout.split() == ["False", "False"], loaded.stderr
