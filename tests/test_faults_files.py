"""File faults: each is one clear message naming the file and the cause, costs only what it must,
loses nothing, and never hangs or takes all memory. Units on the store's readers and writers,
in this process; FIFOs, devices and links need a POSIX system."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import yaml

from pytest_attnperf import plugin
from pytest_attnperf.store import baselines as store
from pytest_attnperf.store import history

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and device links are POSIX's")

GOOD = {"median_ms": 1.0, "ci_low_ms": 0.9, "ci_high_ms": 1.1, "stdrel": 0.01, "n_samples": 10, "mode": "cold",
        "clock": "cuda-graph"}


def unreadable(path: Path, cause: str) -> None:
    with pytest.raises(store.BaselineError) as info:
        store.load(path, keep_unusable=True)
    assert str(path) in str(info.value)
    assert cause in str(info.value)


def test_a_fifo_is_refused_without_being_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "h200.yaml")  # no writer: a blocking read would wait for ever
    unreadable(tmp_path / "h200.yaml", "is a FIFO, not a regular file")


def test_a_link_to_a_device_is_refused_without_being_read(tmp_path: Path) -> None:
    (tmp_path / "h200.yaml").symlink_to("/dev/zero")  # never ends: a read would take all memory
    unreadable(tmp_path / "h200.yaml", "is a character device, not a regular file")


def test_a_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "h200.yaml").mkdir()
    unreadable(tmp_path / "h200.yaml", "is a folder, not a regular file")


def test_a_link_loop_is_named(tmp_path: Path) -> None:
    (tmp_path / "h200.yaml").symlink_to(tmp_path / "h200.yaml")
    unreadable(tmp_path / "h200.yaml", "is a symbolic link loop")


def test_a_link_to_nothing_is_no_file(tmp_path: Path) -> None:
    (tmp_path / "h200.yaml").symlink_to(tmp_path / "gone.yaml")
    assert store.load(tmp_path / "h200.yaml") is None


def test_a_number_of_5000_digits_is_named(tmp_path: Path) -> None:
    path = tmp_path / "h200.yaml"
    path.write_text("format: 1\nmeta: {}\nentries:\n  a: {median_ms: 1" + "0" * 5000 + "}\n")
    unreadable(path, "holds a number it cannot read: Exceeds the limit")


def test_deep_nesting_is_named(tmp_path: Path) -> None:
    path = tmp_path / "h200.yaml"
    path.write_text("format: 1\nmeta: {}\nentries:\n  a: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(store.BaselineError) as info:
        store.load(path, keep_unusable=True)
    assert str(path) in str(info.value)


def test_an_edited_mode_makes_its_entry_unusable_instead_of_ungated(tmp_path: Path) -> None:
    path = tmp_path / "h200.yaml"
    path.write_text(yaml.safe_dump({"format": 1, "meta": {}, "entries": {"a": {**GOOD, "mode": "warp"}, "b": GOOD}}))
    loaded = store.load(path, keep_unusable=True)
    assert loaded is not None
    assert list(loaded.entries) == ["b"]
    assert loaded.unusable["a"].cause == ("ValueError: 'mode' is 'warp', not one of cold, hot, host: an entry of "
                                          "another mode is never compared, so its case would go ungated")


def test_unknown_top_level_keys_are_kept_by_an_update(tmp_path: Path) -> None:
    path = tmp_path / "h200.yaml"
    path.write_text(yaml.safe_dump({"format": 1, "meta": {}, "owner": "perf team", "entries": {"a": GOOD}}))
    loaded = store.load(path)
    assert loaded is not None
    assert loaded.extra == {"owner": "perf team"}
    store.save(path, store.merge(loaded, {"b": GOOD}, {"hardware": "h200"}))
    again = yaml.safe_load(path.read_text())
    assert again["owner"] == "perf team"
    assert sorted(again["entries"]) == ["a", "b"]


def record(median: float, case: str = "t[a]") -> str:
    return json.dumps({"schema": 1, "case": case, "mode": "cold", "median_ms": median})


def test_a_nan_median_in_the_history_is_left_out_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "h200.jsonl"
    lines = [record(1.0), record(math.nan), record(-1.0), "[" * 10_000, record(1.2), '{"median_ms": 1' + "0" * 5000]
    path.write_text("\n".join(lines) + "\n")
    read = history.read(path)
    assert [r["median_ms"] for r in read.records] == [1.0, 1.2]  # the NaN hides no shift now
    assert read.unreadable == 4


def test_a_fifo_history_is_named_and_nothing_is_appended_to_it(tmp_path: Path) -> None:
    path = tmp_path / "h200.jsonl"
    os.mkfifo(path)
    with pytest.raises(store.BaselineError, match="history file .* is a FIFO, not a regular file"):
        history.read(path)
    with pytest.raises(OSError, match="No such device or address"):  # no reader: refused at once, never blocked
        history.append(path, json.loads(record(1.0)))


class Config:
    def __init__(self, path: Path) -> None:
        self.path = path

    def getoption(self, name: str, default: object = None) -> object:
        return self.path if name == "benchmark_json" else default


def test_the_benchmark_json_folder_is_made_before_the_run_or_named_at_once(tmp_path: Path) -> None:
    plugin._output_folders(Config(tmp_path / "new" / "deeper" / "run.json"))  # type: ignore[arg-type]
    assert (tmp_path / "new" / "deeper").is_dir()  # the JSON written at the run's end has its folder
    (tmp_path / "file").write_text("")
    with pytest.raises(pytest.UsageError, match=r"--benchmark-json=.*run.json: its folder cannot be made"):
        plugin._output_folders(Config(tmp_path / "file" / "run.json"))  # type: ignore[arg-type]
