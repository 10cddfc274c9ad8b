"""Unit tests for ``pytest_attnperf.store.tally``: what a run did with its baseline file, counted
from plain keys and entries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_attnperf.store.tally import Gated, gated, gating_line, recorded, recording_line, restart_reason

PATH = Path("baselines/h200.yaml")


def entry(*runs: float, clock: str = "cuda-graph-nodes", mode: str = "cold",
          machines: tuple[str, ...] | None = None, **extra: Any) -> dict[str, Any]:
    """An entry whose history holds ``runs`` (on machine A unless ``machines`` says otherwise)."""
    return {"median_ms": runs[-1], "ci_low_ms": 0.99 * runs[-1], "ci_high_ms": 1.01 * runs[-1], "stdrel": 0.004,
            "n_samples": 20, "clock": clock, "mode": mode, "run_medians_ms": list(runs),
            "run_machines": list(machines or ("A",) * len(runs)), "run_overheads_ms": [None] * len(runs), **extra}


def test_gating_counts_matched_new_and_not_run() -> None:
    counts = gated(["t::a", "t::b", "t::c"], ["t::a", "t::b", "t::gone", "t::skipped"])
    assert counts == Gated(matched=2, new=1, not_run=2)


def test_gating_line_names_the_file_and_the_counts() -> None:
    assert gating_line(PATH, Gated(1, 2, 1)) == (
        "gated against baselines/h200.yaml: 1 entry matched, 2 cases new (no entry), 1 entry in the file not run")
    assert gating_line(PATH, Gated(0, 1, 0), exists=False) == (
        "gated against baselines/h200.yaml: no such file; 1 case new (no entry)")


def test_recording_counts_new_continued_and_restarted_entries() -> None:
    before = {"a": entry(1.0, 1.0, 1.0), "b": entry(1.0), "c": entry(1.0), "old": entry(1.0)}
    written = {"a": entry(1.0, 1.0, 1.0, 1.0), "b": entry(1.0, 1.0), "c": entry(1.5), "n": entry(2.0)}
    counts = recorded(before, written)
    assert (counts.written, counts.new, counts.continued) == (4, 1, 2)
    assert counts.restarted == {"judged a real change": 1}
    assert counts.recordings == {1: 2, 2: 1, 4: 1}


def test_an_entry_without_a_history_holds_one_recording() -> None:
    bare = {k: v for k, v in entry(1.0).items() if not k.startswith("run_")}
    assert recorded({}, {"a": bare}).recordings == {1: 1}


def test_the_restart_reason_follows_what_changed() -> None:
    assert restart_reason(entry(1.0, 1.0), entry(1.5)) == "judged a real change"
    assert restart_reason(entry(1.0, 1.0), entry(1.0, clock="cuda-events")) == "measured another way"
    assert restart_reason(entry(1.0, mode="hot"), entry(1.0, mode="cold")) == "measured another way"
    assert restart_reason(entry(1.0, mode="hot", hot_sample_ms=20.0),
                          entry(1.0, mode="hot", hot_sample_ms=0.5)) == "measured another way"
    assert restart_reason(entry(1.0, mode="hot"), entry(1.0, mode="hot", hot_sample_ms=0.5)) == "judged a real change"
    assert restart_reason(entry(1.0, 1.0, clock="cuda-events"), entry(1.0, clock="cuda-events", machines=("B",))) == (
        "events-timed on another machine")
    assert restart_reason(entry(1.0, 1.0, clock="cuda-events"), entry(1.0, clock="cuda-events")) == (
        "judged a real change")
    assert restart_reason({"median_ms": -1}, entry(1.0)) == "the old entry unusable"


def test_recording_line_names_the_file_histories_and_recordings_per_entry() -> None:
    before = {f"k{i}": entry(1.0, 1.0, 1.0) for i in range(17)} | {"x": entry(1.0), "y": entry(1.0, 1.0),
                                                                      "z": entry(1.0, clock="cuda-events")}
    written = {f"k{i}": entry(1.0, 1.0, 1.0, 1.0) for i in range(17)} | {"x": entry(2.0), "y": entry(2.0),
                                                                           "z": entry(1.0), "new": entry(1.0)}
    assert recording_line(PATH, recorded(before, written)) == (
        "recorded into baselines/h200.yaml: 21 entries written, 1 new, 17 continued their history, 3 restarted "
        "it (2 judged a real change, 1 measured another way); 4 entries hold 1 recording, 17 hold 4 recordings")


def test_one_entry_written_reads_in_the_singular() -> None:
    assert recording_line(PATH, recorded({}, {"a": entry(1.0)})) == (
        "recorded into baselines/h200.yaml: 1 entry written, 1 new, 0 continued their history, 0 restarted it; "
        "1 entry holds 1 recording")
