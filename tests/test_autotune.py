"""Recorded Triton autotune choices: recording, installing, drift, and the warm-up split.

The pure functions run on fake cache folders; the plugin runs under pytester with fake H200
hardware, a scripted timer and a fake kernel that behaves as Triton's ``cache_results``
autotuner does: it reads ``<TRITON_CACHE_DIR>/<hash>/<kernel>.autotune.json`` when present and
otherwise "autotunes" and writes it. The hash each kernel uses comes from ``hashes.json``, so a
test can change it as a new Triton or kernel source would.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import yaml
from kit import CONFTEST, PLUGIN

from pytest_attnperf.store import autotune
from pytest_attnperf.store.autotune import AutotuneError

HASH_A, HASH_B = "A" * 52, "B" * 52


def result_json(best_bt: int, key: list[object] | None = None) -> str:
    """A Triton autotune result: two configs, ``BT=best_bt`` the faster."""
    other = 32 if best_bt != 32 else 64
    return json.dumps({
        "key": key if key is not None else [1024, 128, "torch.bfloat16"],
        "configs_timings": [
            [{"kwargs": {"BT": other}, "num_warps": 4, "num_ctas": 1, "num_stages": 2, "maxnreg": None,
              "pre_hook": None, "ir_override": None}, [0.30, 0.29, 0.31]],
            [{"kwargs": {"BT": best_bt}, "num_warps": 8, "num_ctas": 1, "num_stages": 3, "maxnreg": None,
              "pre_hook": None, "ir_override": None}, [0.20, 0.19, 0.21]],
        ],
    })


def put(cache: Path, hash_dir: str, kernel: str, text: str) -> Path:
    path = cache / hash_dir / f"{kernel}.autotune.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- pure functions ---------------------------------------------------------------------------


def test_chosen_config_is_the_least_timing_and_reads_well() -> None:
    data = json.loads(result_json(128))
    assert autotune.describe_config(autotune.chosen_config(data)) == "BT=128 num_warps=8 num_stages=3 num_ctas=1"
    single = {"configs_timings": [[{"kwargs": {"BK": 64}, "num_warps": 2}, 0.5], [{"kwargs": {"BK": 32}}, 0.4]]}
    assert autotune.describe_config(autotune.chosen_config(single)) == "BK=32"


def test_unreadable_result_names_the_file(tmp_path: Path) -> None:
    path = put(tmp_path, HASH_A, "k", '{"key": []}')
    with pytest.raises(AutotuneError, match=f"{path}.*not a Triton autotune result.*configs_timings"):
        autotune.read_result(path)


def test_record_writes_files_and_a_sorted_manifest_and_merges(tmp_path: Path) -> None:
    cache, folder = tmp_path / "cache", tmp_path / "baselines" / "h200.autotune"
    put(cache, HASH_B, "kern_b", result_json(64))
    put(cache, HASH_A, "kern_a", result_json(128))
    assert autotune.record(folder, cache, {f"{HASH_B}/kern_b.autotune.json": "t::b",
                                           f"{HASH_A}/kern_a.autotune.json": "t::a"}, "3.6.0") == (2, 0, [])
    text = (folder / "manifest.yaml").read_text()
    assert text.index(HASH_A) < text.index(HASH_B)
    assert "format: 1" in text
    manifest = yaml.safe_load(text)
    assert manifest["triton"] == "3.6.0"
    assert manifest["entries"][HASH_A] == {
        "kernel": "kern_a", "file": "kern_a.autotune.json", "key": ["1024", "128", "torch.bfloat16"],
        "chosen": "BT=128 num_warps=8 num_stages=3 num_ctas=1", "source": "t::a", "triton": "3.6.0"}
    assert (folder / f"{HASH_A}.json").read_text() == result_json(128)
    # a later recording of another kernel keeps both earlier entries; the same hash is replaced
    hash_c = "C" * 52
    put(cache, hash_c, "kern_c", result_json(16))
    put(cache, HASH_A, "kern_a", result_json(32))
    written, kept, _ = autotune.record(folder, cache, {f"{hash_c}/kern_c.autotune.json": "t::c",
                                                       f"{HASH_A}/kern_a.autotune.json": "t::a2"}, "3.6.1")
    assert (written, kept) == (2, 1)
    entries = yaml.safe_load((folder / "manifest.yaml").read_text())["entries"]
    assert sorted(entries) == [HASH_A, HASH_B, hash_c]
    assert entries[HASH_A]["source"] == "t::a2"
    assert entries[HASH_A]["chosen"].startswith("BT=32")
    assert entries[HASH_B]["triton"] == "3.6.0"
    assert entries[hash_c]["triton"] == "3.6.1"


def test_record_refuses_an_unreadable_manifest(tmp_path: Path) -> None:
    folder = tmp_path / "h200.autotune"
    folder.mkdir()
    (folder / "manifest.yaml").write_text("entries: [oops\n")
    put(tmp_path / "cache", HASH_A, "kern_a", result_json(64))
    with pytest.raises(AutotuneError, match="manifest.yaml cannot be read"):
        autotune.record(folder, tmp_path / "cache", {f"{HASH_A}/kern_a.autotune.json": "t"}, "3.6.0")
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.yaml"]


def test_install_lays_out_hash_folders_and_drops_other_choices_only(tmp_path: Path) -> None:
    source, folder = tmp_path / "src", tmp_path / "h200.autotune"
    put(source, HASH_A, "kern_a", result_json(128))
    put(source, HASH_B, "kern_b", "not json")
    autotune.record(folder, source, {f"{HASH_A}/kern_a.autotune.json": "t::a"}, "3.6.0")
    manifest = yaml.safe_load((folder / "manifest.yaml").read_text())
    manifest["entries"][HASH_B] = dict(manifest["entries"][HASH_A], kernel="kern_b", file="kern_b.autotune.json")
    (folder / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    (folder / f"{HASH_B}.json").write_text("not json")
    cache = tmp_path / "cache"
    leftover = put(cache, "D" * 52, "kern_d", result_json(64))  # autotuned by an earlier run
    compiled = cache / ("E" * 52) / "kern_a.cubin"
    compiled.parent.mkdir(parents=True)
    compiled.write_bytes(b"\x00")
    installed, problems = autotune.install(folder, cache)
    assert sorted(installed) == [f"{HASH_A}/kern_a.autotune.json"]
    assert (cache / HASH_A / "kern_a.autotune.json").read_text() == result_json(128)
    assert len(problems) == 1
    assert f"{HASH_B}.json is not a Triton autotune result" in problems[0]
    assert not leftover.exists()
    assert compiled.exists()
    assert sorted(autotune.scan(cache)) == [f"{HASH_A}/kern_a.autotune.json"]


# -- the plugin --------------------------------------------------------------------------------

TESTS = '''
import fcntl
import json
import os
import sys
import pathlib
import signal
import time

import pytest

from pytest_attnperf.costs import Cost

HERE = pathlib.Path(__file__).parent


def fake_kernel(name):
    """Triton's cache_results autotuner: use the result on disk, else autotune and write it."""
    seen = {"cache": os.environ.get("TRITON_CACHE_DIR")}
    log = HERE / "log.json"
    with open(HERE / "log.lock", "w") as lock:  # pytest-xdist's workers log too
        fcntl.flock(lock, fcntl.LOCK_EX)
        _tune(name, seen, log)


def _tune(name, seen, log):
    entries = json.loads(log.read_text()) if log.exists() else []
    if seen["cache"] is not None:
        hashes = json.loads((HERE / "hashes.json").read_text())
        path = pathlib.Path(seen["cache"]) / hashes[name] / f"kern_{name}.autotune.json"
        seen["found"] = path.exists()
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"key": [1024, name], "configs_timings": [
                [{"kwargs": {"BT": 64}, "num_warps": 4, "num_stages": 2}, [0.2, 0.1, 0.3]],
                [{"kwargs": {"BT": 32}, "num_warps": 4, "num_stages": 2}, [0.4, 0.3, 0.5]]]}))
    entries.append([name, seen])
    log.write_text(json.dumps(entries))


@pytest.mark.parametrize("name", ["a", "b"])
def test_case(name, attnperf):
    if name == os.environ.get("DIE_CASE"):
        os.kill(os.getpid(), signal.SIGKILL)  # the run ends here, as a machine taken back would end it
    fake_kernel(name)
    time.sleep(0.1)  # the checks before the measurement
    attnperf.measure(lambda: None, cost=Cost(flops=1e12, bytes=1e9), dtype="bf16")
    assert name != os.environ.get("FAIL_CASE")
'''

REFUSED = '''
import pytest
from test_cases import fake_kernel


def test_refused_after_autotuning():
    fake_kernel("r")  # the kernel autotunes its first stage, then refuses the case
    pytest.skip("does not support this case: RuntimeError: backward refused")
'''


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("ATTNPERF_TRITON_CACHE", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_cases=TESTS)
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider -p no:benchmark\n")
    set_hashes(pytester, a=HASH_A, b=HASH_B)
    return pytester


def set_hashes(pytester: pytest.Pytester, **hashes: str) -> None:
    (pytester.path / "hashes.json").write_text(json.dumps(hashes))


def run(pytester: pytest.Pytester, cache: str, *args: str) -> pytest.RunResult:
    (pytester.path / "log.json").unlink(missing_ok=True)
    return pytester.runpytest(*PLUGIN, "--hw=h200", f"--attnperf-triton-cache={pytester.path / cache}", *args)


def log(pytester: pytest.Pytester) -> dict[str, dict[str, object]]:
    return dict(json.loads((pytester.path / "log.json").read_text()))


def manifest(pytester: pytest.Pytester) -> dict[str, object]:
    return dict(yaml.safe_load((pytester.path / "baselines" / "h200.autotune" / "manifest.yaml").read_text()))


def test_recording_writes_the_choices_then_a_gating_run_installs_them_and_off_leaves_triton_alone(
        project: pytest.Pytester) -> None:
    """One recording, then the runs after it:

    - the recording writes the choices its run made (each kernel's file and a manifest entry naming
      its test, kernel, key and choice), says so, and sets TRITON_CACHE_DIR back after the run;
    - a gating run on a fresh cache installs the recorded choices before the tests (its kernels
      find them and autotune nothing; no drift);
    - ``--attnperf-triton-cache=off`` leaves Triton's cache alone.
    """
    result = run(project, "cache1", "--update-baselines")
    result.assert_outcomes(passed=2)
    assert os.environ.get("TRITON_CACHE_DIR") is None  # restored after the run
    assert log(project)["a"] == {"cache": str(project.path / "cache1" / "h200"), "found": False}
    data = manifest(project)
    entries = data["entries"]
    assert isinstance(entries, dict)
    assert sorted(entries) == [HASH_A, HASH_B]
    assert entries[HASH_A]["source"] == "test_cases.py::test_case[a]"
    assert entries[HASH_A]["kernel"] == "kern_a"
    assert entries[HASH_A]["chosen"] == "BT=64 num_warps=4 num_stages=2"
    assert entries[HASH_A]["key"] == ["1024", "a"]
    folder = project.path / "baselines" / "h200.autotune"
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{HASH_A}.json", f"{HASH_B}.json", "manifest.yaml"])
    result.stdout.fnmatch_lines(["*autotune choices: wrote 2 autotune choices to *h200.autotune (0 other entries kept)"
                                 ])
    assert "autotuned in this run" not in result.stdout.str()  # autotuning is what a recording records

    result = run(project, "fresh-cache")
    result.assert_outcomes(passed=2)
    fresh = project.path / "fresh-cache" / "h200"
    assert log(project) == {"a": {"cache": str(fresh), "found": True}, "b": {"cache": str(fresh), "found": True}}
    assert (fresh / HASH_A / "kern_a.autotune.json").read_text() == (folder / f"{HASH_A}.json").read_text()
    out = result.stdout.str()
    assert f"autotune choices: 2 installed from h200.autotune into {fresh}" in out
    assert "autotuned in this run" not in out
    assert "drift" not in out

    project.runpytest(*PLUGIN, "--hw=h200", "--attnperf-triton-cache=off").assert_outcomes(passed=2)
    assert log(project)["a"] == {"cache": None}


def test_recording_keeps_others_and_leaves_out_failed_tests(project: pytest.Pytester,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    run(project, "cache1", "--update-baselines").assert_outcomes(passed=2)
    new_a, new_b = "N" * 52, "M" * 52
    set_hashes(project, a=new_a, b=new_b)
    monkeypatch.setenv("FAIL_CASE", "b")
    run(project, "cache1", "--update-baselines").assert_outcomes(passed=1, failed=1)
    entries = manifest(project)["entries"]
    assert isinstance(entries, dict)
    assert sorted(entries) == sorted([HASH_A, HASH_B, new_a])  # new_b: failed


def test_a_case_skipped_after_autotuning_has_its_choices_recorded(project: pytest.Pytester) -> None:
    set_hashes(project, a=HASH_A, b=HASH_B, r="R" * 52)
    project.makepyfile(test_refused=REFUSED)
    run(project, "cache1", "--update-baselines").assert_outcomes(passed=2, skipped=1)
    entries = manifest(project)["entries"]
    assert isinstance(entries, dict)
    assert "R" * 52 in entries
    result = run(project, "fresh-cache")
    result.assert_outcomes(passed=2, skipped=1)
    assert log(project)["r"]["found"] is True  # the gating run meets the recorded choice, autotunes nothing
    assert "autotuned in this run" not in result.stdout.str()


def test_a_recording_that_dies_leaves_its_entries_with_their_choices(project: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case's choices are written as it ends, its entry journaled: a recording killed in its
    second case leaves the first case's choice, a collect-only update merges the entry, and a
    gating run on a fresh cache times the recorded configuration instead of autotuning anew."""
    monkeypatch.setenv("DIE_CASE", "b")
    died = project.runpytest_subprocess("--hw=h200", f"--attnperf-triton-cache={project.path / 'c1'}",
                                        "--update-baselines")
    assert died.ret == -signal.SIGKILL
    folder = project.path / "baselines"
    assert not (folder / "h200.yaml").exists()  # the run never reached its end
    journal = [p.name for p in folder.glob(".h200.recording-*.jsonl")]
    assert len(journal) == 1
    assert "test_case[a]" in (folder / journal[0]).read_text()
    entries = manifest(project)["entries"]
    assert isinstance(entries, dict)
    assert sorted(entries) == [HASH_A]
    assert entries[HASH_A]["source"] == "test_cases.py::test_case[a]"

    monkeypatch.delenv("DIE_CASE")
    merged = run(project, "c2", "--update-baselines", "--collect-only")  # merges the journal, measures nothing
    assert merged.ret == 0
    assert sorted(yaml.safe_load((folder / "h200.yaml").read_text())["entries"]) == ["test_cases.py::test_case[a]"]
    assert not list(folder.glob(".h200.recording-*.jsonl"))
    assert not (project.path / "log.json").exists()  # no kernel ran
    run(project, "c2", "--update-baselines", "-k", "b").assert_outcomes(passed=1)
    recorded = yaml.safe_load((folder / "h200.yaml").read_text())["entries"]
    assert sorted(recorded) == ["test_cases.py::test_case[a]", "test_cases.py::test_case[b]"]
    entries = manifest(project)["entries"]
    assert isinstance(entries, dict)
    assert sorted(entries) == [HASH_A, HASH_B]
    result = run(project, "fresh")
    result.assert_outcomes(passed=2)
    assert log(project)["a"]["found"] is True  # the configuration a's entry was timed with
    assert "autotuned in this run" not in result.stdout.str()


def test_default_cache_folder_is_per_user_and_per_hardware(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under $XDG_CACHE_HOME, as the measured ceilings are; under ~/.cache without it."""
    run(project, "c", "--update-baselines").assert_outcomes(passed=2)
    (project.path / "log.json").unlink()
    monkeypatch.setenv("XDG_CACHE_HOME", str(project.path / "xdg"))
    project.runpytest(*PLUGIN, "--hw=h200").assert_outcomes(passed=2)
    assert log(project)["a"] == {"cache": str(project.path / "xdg" / "pytest-attnperf" / "triton" / "h200"),
                                 "found": True}
    (project.path / "log.json").unlink()
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # not absolute: ignored (the XDG specification)
    project.runpytest(*PLUGIN, "--hw=h200").assert_outcomes(passed=2)  # pytester's HOME is its folder
    assert log(project)["a"] == {"cache": os.path.expanduser("~/.cache/pytest-attnperf/triton/h200"), "found": True}
    (project.path / "log.json").unlink()
    monkeypatch.delenv("XDG_CACHE_HOME")
    project.runpytest(*PLUGIN, "--hw=h200", "--attnperf-triton-cache=$XDG_CACHE_HOME/mine").assert_outcomes(passed=2)
    assert log(project)["a"] == {"cache": os.path.expanduser("~/.cache/mine/h200"), "found": True}


def test_a_choice_that_no_longer_applies_is_noted_on_its_case_and_as_drift(project: pytest.Pytester) -> None:
    run(project, "rec", "--update-baselines").assert_outcomes(passed=2)
    set_hashes(project, a="Z" * 52, b=HASH_B)  # kernel a's source changed: another Triton cache key
    for _ in range(2):  # an earlier run's own autotuning is not kept: it would hide the drift
        result = run(project, "gate")
        result.assert_outcomes(passed=2)
        assert log(project)["a"]["found"] is False
        assert log(project)["b"]["found"] is True
        out = result.stdout.str()
        assert "note: test_case[a]: autotuned in this run: kern_a (no recorded choice in h200.autotune applied)" in out
        assert "test_case[b]: autotuned" not in out
        result.stdout.fnmatch_lines([
            "autotuned in this run (no recorded choice applied): 1 kernels (kern_a) - environment drift vs "
            "h200.autotune (triton * recorded, * here); re-record with --update-baselines"])


def test_another_triton_version_is_reported_as_drift(project: pytest.Pytester) -> None:
    run(project, "rec", "--update-baselines").assert_outcomes(passed=2)
    path = project.path / "baselines" / "h200.autotune" / "manifest.yaml"
    path.write_text(path.read_text().replace(f"triton: {autotune._triton_version()}", "triton: 0.0.1"))
    result = run(project, "gate")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["drift: h200.autotune was recorded with triton 0.0.1, * here: *"])


def test_bad_manifest_costs_the_choices_only(project: pytest.Pytester) -> None:
    folder = project.path / "baselines" / "h200.autotune"
    folder.mkdir(parents=True)
    (folder / "manifest.yaml").write_text("format: 7\n")
    result = run(project, "gate")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["autotune: no recorded choices installed: *manifest.yaml is not an attnperf "
                                 "autotune manifest*"])


def test_no_folder_leaves_triton_alone(project: pytest.Pytester) -> None:
    result = run(project, "gate")
    result.assert_outcomes(passed=2)
    assert log(project)["a"] == {"cache": None}
    assert not (project.path / "gate").exists()
    assert "autotune" not in result.stdout.str()


def test_cpu_run_does_nothing_and_writes_nothing(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    run(project, "rec", "--update-baselines").assert_outcomes(passed=2)
    monkeypatch.setenv("FAKE_DEVICE", "cpu")
    before = sorted(p.name for p in (project.path / "baselines").iterdir())
    for args in ((), ("--update-baselines",)):
        result = project.runpytest(*PLUGIN, f"--attnperf-triton-cache={project.path / 'cpu-cache'}",
                                   "--attnperf-ceilings=off", *args)  # no CPU ceilings measured: not this test's
        result.assert_outcomes(passed=2)
        assert log(project)["a"] == {"cache": None}
        assert "autotune" not in result.stdout.str()
    assert not (project.path / "cpu-cache").exists()
    added = sorted(set(p.name for p in (project.path / "baselines").iterdir()) - set(before))
    assert added == [".cpu.yaml.lock", "cpu.yaml"]  # the CPU entries and the store's lock, no autotune folder


def test_summary_splits_warm_up_from_measuring(project: pytest.Pytester) -> None:
    result = run(project, "gate")
    result.assert_outcomes(passed=2)
    line = next(x for x in result.stdout.lines if x.startswith("time in 2 measured tests:"))
    before_s = float(line.split(": ")[1].split(" s before")[0])
    in_s = float(line.split("), ")[1].split(" s in it")[0])
    assert 0.2 <= before_s < 2.0  # two tests sleep 0.1 s each before measuring
    assert in_s < before_s


def test_parallel_recording_writes_once_and_a_parallel_gating_run_installs(project: pytest.Pytester) -> None:
    """Under pytest-xdist each worker autotunes in a cache folder of its own; the controller
    records both workers' choices once, and a parallel gating run installs them in each worker's folder."""
    pytest.importorskip("xdist")
    project.makeconftest(CONFTEST + "\n\ndef pytest_attnperf_visible_gpus(config):\n    return ['0', '1']\n")
    result = run(project, "cache1", "--update-baselines", "-n", "2")
    result.assert_outcomes(passed=2)
    entries = manifest(project)["entries"]
    assert isinstance(entries, dict)
    assert sorted(entries) == [HASH_A, HASH_B]
    assert {entries[HASH_A]["source"], entries[HASH_B]["source"]} == {
        "test_cases.py::test_case[a]", "test_cases.py::test_case[b]"}  # no pytest-xdist '@group' suffix
    result.stdout.fnmatch_lines(
        ["*autotune choices: wrote 2 autotune choices to *h200.autotune (0 other entries kept)"])
    caches = {seen["cache"] for seen in log(project).values()}
    assert caches <= {str(project.path / "cache1" / "h200" / w) for w in ("gw0", "gw1")}

    gating = run(project, "fresh", "-n", "2")
    gating.assert_outcomes(passed=2)
    assert all(seen["found"] for seen in log(project).values())
    out = gating.stdout.str()
    assert "autotune choices: 2 installed from h200.autotune" in out
    assert "autotuned in this run" not in out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the process's start is read from /proc")
def test_summary_says_where_the_runs_wall_time_went(project: pytest.Pytester) -> None:
    """The run's own process: a conftest that takes 0.4 s to import counts as start-up, and the
    tests' 0.1 s before measuring count as tests."""
    project.makeconftest(CONFTEST + "\nimport time as _t\n_t.sleep(0.4)\n")
    result = project.runpytest_subprocess("--hw=h200", f"--attnperf-triton-cache={project.path / 'c'}")
    result.assert_outcomes(passed=2)
    line = next(x for x in result.stdout.lines if x.startswith("wall time "))
    figures = [float(part.split(" s ")[0].split()[-1]) for part in line.split(": ", 1)[1].split(", ")
               if " s " in part]
    assert "since the process started" in line
    startup, _, in_tests, _, _ = figures
    assert startup >= 0.4
    assert in_tests >= 0.2
    assert "(setup, call and teardown; 2 called)" in line


def test_a_recording_in_turns_measures_only_the_cases_without_an_entry() -> None:
    """``tools/missing.py`` (``tools/h200.sh record-linear`` with ``MISSING=1``): of the collected
    node ids, those the committed file lacks, in collection order; pytest's other lines dropped."""
    import kit

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where PyYAML has it: the file is large
    committed = yaml.load((kit.ROOT / "baselines" / "h200.yaml").read_text(), Loader=loader)["entries"]
    have = next(k for k in committed if k.startswith("suites/test_linear.py::"))
    new = "suites/test_linear.py::test_linear[b2-h8-t1024-d64-fp16-gla-never-recorded-fwd]"
    assert new not in committed
    lines = [have, new, new, "", "2/136 tests collected (134 deselected) in 0.05s", "<Module test_linear.py>",
             "  UserWarning: c10::Half is not supported here"]
    assert kit.tool("missing").missing(lines, committed) == [new]
    assert kit.tool("missing").missing(lines, {}) == [have, new]


def test_seeding_a_card_copies_only_the_hash_folders_it_lacks(tmp_path: Path) -> None:
    """``tools/seed_choices.py`` (``tools/h200.sh record`` with ``SEED=h200``): another card's
    choices are copied for the hash folders this card lacks, its own are never replaced, each copy
    names the card it was chosen on, and ``--skip-source`` leaves out the choices of those tests."""
    import kit

    cache, theirs, ours = tmp_path / "cache", tmp_path / "h200.autotune", tmp_path / "h100.autotune"
    hash_c = "C" * 52
    put(cache, HASH_A, "kern_a", result_json(128))
    put(cache, HASH_B, "kern_b", result_json(64))
    put(cache, hash_c, "kern_c", result_json(16))
    autotune.record(theirs, cache, {f"{HASH_A}/kern_a.autotune.json": "suites/t.py::a",
                                    f"{HASH_B}/kern_b.autotune.json": "suites/t.py::b",
                                    f"{hash_c}/kern_c.autotune.json": "families/models/suite.py::c"}, "3.6.0")
    put(cache, HASH_B, "kern_b", result_json(32))  # this card chose otherwise for B
    autotune.record(ours, cache, {f"{HASH_B}/kern_b.autotune.json": "suites/t.py::b"}, "3.6.0")
    seed = kit.tool("seed_choices").seed
    assert seed(theirs, ours, ("families/models/",)) == (1, 1, [])
    entries = yaml.safe_load((ours / "manifest.yaml").read_text())["entries"]
    assert sorted(entries) == [HASH_A, HASH_B]
    assert entries[HASH_A]["source"] == "suites/t.py::a (chosen on h200)"
    assert (ours / f"{HASH_A}.json").read_text() == result_json(128)
    assert entries[HASH_B]["chosen"].startswith("BT=32")
    assert entries[HASH_B]["source"] == "suites/t.py::b"
    assert seed(theirs, ours) == (1, 2, [])  # the model test's choice, once not skipped
    assert seed(theirs, ours) == (0, 3, [])
