"""The recorder never writes an entry its own reader refuses: ``--update-baselines`` holds each
entry to the reader's rules (``store.baselines.entry_problem``), measures a case again with more
samples when its interval is too wide to be a baseline's, and refuses to record it, saying so,
when every try is; a file that already holds such entries is re-recorded in one run.

The timer is scripted (the project's conftest.py): the first ``NOISY_TRIES`` measurements of
each case are a busy host's, half the samples 0.01 ms and half 5 ms, whose 95% interval spans
500 times at any count; later ones are steady.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kit import PLUGIN_NO_CEILINGS as PLUGIN
from kit import TESTS, baseline_path, conftest, make_project

from pytest_attnperf.store import baselines as store

NOISY_TIMER = '''

SEEN = {}


class NoisyTimer:
    def measure(self, fn, plan):
        fn()
        name, _ = current_test(plan)
        SEEN[name] = SEEN.get(name, 0) + 1
        if SEEN[name] <= int(os.environ.get("NOISY_TRIES", "0")):  # a busy host's: 0.01 to 5 ms
            samples = tuple((0.01, 5.0)[i % 2] for i in range(plan.min_samples))
        else:
            samples = tuple(1.0 + 0.001 * (i % 3) for i in range(plan.min_samples))
        with open(HERE / "samples.txt", "a") as out:
            out.write(f"{name} {len(samples)}\\n")
        return Measurement(samples, clock="host", mode="host")


def pytest_attnperf_make_timer(config, device):
    return NoisyTimer()
'''

UNUSABLE = {"median_ms": 1.0, "ci_low_ms": 0.01, "ci_high_ms": 8.46, "stdrel": 0.9, "n_samples": 10,
            "mode": "host", "clock": "host"}  # what a busy host's recording once wrote: 846 times


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester, conftest("cpu") + NOISY_TIMER, test_cases=TESTS)


def read_back(project: pytest.Pytester) -> store.BaselineFile:
    loaded = store.load(baseline_path(project, "cpu"), keep_unusable=True)
    assert loaded is not None
    return loaded


def samples_taken(project: pytest.Pytester) -> list[str]:
    lines = (project.path / "samples.txt").read_text().splitlines()
    return [line for line in lines if line.startswith("test_case")]  # not the ceilings' measurements


def test_a_noisy_recording_is_measured_again_with_more_samples_and_the_reader_takes_its_entry(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOISY_TRIES", "1")
    project.runpytest(*PLUGIN, "--hw=cpu", "--update-baselines").assert_outcomes(passed=2)
    assert samples_taken(project) == ["test_case[a] 10", "test_case[a] 20", "test_case[b] 10", "test_case[b] 20"]
    loaded = read_back(project)
    assert loaded.unusable == {}
    assert sorted(loaded.entries) == ["test_cases.py::test_case[a]", "test_cases.py::test_case[b]"]
    notes = loaded.entries["test_cases.py::test_case[a]"]["notes"]
    assert notes[0].startswith("re-measured for the recording (2 of at most 3, 2x the samples): the baseline reader "
                               "refuses the first: ValueError: the interval 'ci_low_ms' 0.01 .. 'ci_high_ms' 5.0 "
                               "spans 500 times")
    monkeypatch.setenv("NOISY_TRIES", "0")
    project.runpytest(*PLUGIN, "--hw=cpu", "--attnperf-require-baseline").assert_outcomes(passed=2)


def test_a_recording_too_noisy_on_every_try_is_refused_per_case_and_keeps_the_files_entry(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project.runpytest(*PLUGIN, "--hw=cpu", "--update-baselines").assert_outcomes(passed=2)
    before = baseline_path(project, "cpu").read_bytes()
    monkeypatch.setenv("NOISY_TRIES", "99")
    result = project.runpytest(*PLUGIN, "--hw=cpu", "--update-baselines")
    result.assert_outcomes(failed=2)
    for case in ("a", "b"):
        result.stdout.fnmatch_lines([f"*test_case[[]{case}[]]: NOT RECORDED: measured 3 times, each too noisy to be a "
                                     "baseline: the baseline reader would refuse the entry (ValueError: the interval "
                                     "'ci_low_ms' 0.01 .. 'ci_high_ms' 5.0 spans 500 times*; last: median 2.505 ms*"
                                     "keeps what it had for this case; record it on an idle host"])
    assert baseline_path(project, "cpu").read_bytes() == before
    assert samples_taken(project)[2:5] == ["test_case[a] 10", "test_case[a] 20", "test_case[a] 40"]  # 2x, then 4x


def test_a_file_holding_entries_the_reader_refuses_is_re_recorded_in_one_run(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    path: Path = baseline_path(project, "cpu")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"format": store.FORMAT, "meta": {"hardware": "cpu"},
                                    "entries": {f"test_cases.py::test_case[{c}]": dict(UNUSABLE) for c in "ab"}}))
    assert len(read_back(project).unusable) == 2
    gated = project.runpytest(*PLUGIN, "--hw=cpu")
    gated.assert_outcomes(failed=2)  # each unusable entry fails its case
    monkeypatch.setenv("NOISY_TRIES", "1")  # and the busy host is still busy for the first try
    project.runpytest(*PLUGIN, "--hw=cpu", "--update-baselines").assert_outcomes(passed=2)
    loaded = read_back(project)
    assert loaded.unusable == {}
    assert len(loaded.entries) == 2
    monkeypatch.setenv("NOISY_TRIES", "0")
    project.runpytest(*PLUGIN, "--hw=cpu", "--attnperf-require-baseline").assert_outcomes(passed=2)
