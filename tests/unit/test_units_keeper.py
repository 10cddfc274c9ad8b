"""``store.keeper.BaselineKeeper``, one run's hold on a baseline file, with plain files: what a
gating run reads and says, what a recording journals, writes, keeps and saves aside."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_attnperf.options import Settings
from pytest_attnperf.store import baselines, journal
from pytest_attnperf.store.keeper import BaselineKeeper

ENV: dict[str, str | None] = {"hardware": "h200", "device": "NVIDIA H200", "torch": "2.13.0", "date": "2026-01-01"}
A, B = "suites/t.py::test_a", "suites/t.py::test_b"


def entry(median_ms: float) -> dict[str, Any]:
    """A well-formed entry around ``median_ms``."""
    return {"median_ms": median_ms, "ci_low_ms": round(0.99 * median_ms, 9),
            "ci_high_ms": round(1.01 * median_ms, 9), "stdrel": 0.004, "n_samples": 20}


def settings(folder: Path, **changes: Any) -> Settings:
    """The defaults a run without attnperf options gets, the baselines in ``folder``."""
    plain = Settings(hw=None, update_baselines=False, require_baseline=False, baselines_dir=folder, tolerance=0.05,
                     run_noise=0.01, run_noise_time_ms=0.0, machine_noise=0.0, machine_offset_ms=0.0,
                     machine_residual_ms=0.0, machine=None, mode="cold", budget_s=0.5, target_stdrel=0.005,
                     min_samples=10, cold_graphs=8)
    return dataclasses.replace(plain, **changes)


def keeper(folder: Path, parallel: bool = False, **changes: Any) -> BaselineKeeper:
    return BaselineKeeper(settings(folder, **changes), lambda: "h200", lambda: dict(ENV), lambda: parallel)


def written(folder: Path) -> dict[str, Any]:
    entries: dict[str, Any] = yaml.safe_load((folder / "h200.yaml").read_text())["entries"]
    return entries


@pytest.fixture
def aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temporary folder entries that cannot be written are saved into."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_gating_run_reads_the_file_once_and_says_what_it_matched(tmp_path: Path) -> None:
    baselines.save(tmp_path / "h200.yaml", baselines.BaselineFile(meta=dict(ENV), entries={A: entry(1.0)}))
    k = keeper(tmp_path)
    assert k.path == tmp_path / "h200.yaml"
    assert k.startup_lines() == []
    assert k.file is not None
    assert set(k.file.entries) == {A}
    (tmp_path / "h200.yaml").unlink()
    assert k.file is not None  # read once: the run judges against what it read
    note = k.gating_note([A, B])
    assert note is not None
    assert "1 entry matched, 1 case new (no entry)" in note
    assert k.gating_note([]) is None  # nothing measured, nothing to say
    assert keeper(tmp_path, update_baselines=True).gating_note([A]) is None  # a recording says what it wrote


def test_unusable_entries_and_a_missing_folder_are_named_at_start_up(tmp_path: Path) -> None:
    text = yaml.safe_dump({"format": 1, "meta": dict(ENV), "entries": {A: entry(1.0), B: {"median_ms": "fast"}}})
    (tmp_path / "h200.yaml").write_text(text)
    lines = keeper(tmp_path).startup_lines()
    assert lines[0].startswith(f"attnperf: {tmp_path / 'h200.yaml'}: 1 unusable entry;")
    assert lines[1].startswith(f"  {B}: ")
    with pytest.warns(pytest.PytestConfigWarning, match="no baselines folder"):
        lines = keeper(tmp_path / "missing").startup_lines()
    assert any("every measured case is new and passes ungated" in line for line in lines)
    with pytest.raises(pytest.UsageError, match="--attnperf-require-baseline needs its entries"):
        keeper(tmp_path / "missing", require_baseline=True).startup_lines()


def test_a_recording_journals_each_entry_writes_them_and_keeps_the_others(tmp_path: Path) -> None:
    baselines.save(tmp_path / "h200.yaml", baselines.BaselineFile(meta=dict(ENV), entries={A: entry(1.0)}))
    k = keeper(tmp_path, update_baselines=True)
    k.commit(B, entry(2.0))
    assert k.journal is not None
    assert journal.read(k.journal.path) == {B: entry(2.0)}
    k.write()
    assert written(tmp_path) == {A: entry(1.0), B: entry(2.0)}
    assert k.write_note is not None
    assert k.write_note.startswith(f"wrote 1 measured entries to {tmp_path / 'h200.yaml'}"
                                                                " (1 other entries kept)")
    assert not k.failed
    assert not k.journal.path.exists()  # the entries are safe: the journal goes
    assert k.record_note is not None
    assert "1 new" in k.record_note


def test_a_re_recording_says_which_keys_of_the_old_entries_it_kept(tmp_path: Path) -> None:
    baselines.save(tmp_path / "h200.yaml",
                   baselines.BaselineFile(meta=dict(ENV), entries={A: {**entry(1.0), "owner": "me"}}))
    k = keeper(tmp_path, update_baselines=True)
    k.commit(A, entry(2.0))
    k.write()
    assert written(tmp_path) == {A: {**entry(2.0), "owner": "me"}}
    assert k.write_note is not None
    assert k.write_note.endswith("; 1 re-recorded entry kept key this version does not write: owner")


def test_under_pytest_xdist_no_journal_is_kept(tmp_path: Path) -> None:
    k = keeper(tmp_path, parallel=True, update_baselines=True)
    k.commit(A, entry(1.0))
    assert k.journal is None
    assert list(tmp_path.iterdir()) == []


def test_a_dead_recordings_journal_is_named_and_merged_by_the_next_recording(tmp_path: Path) -> None:
    dead = keeper(tmp_path, update_baselines=True)
    dead.commit(A, entry(1.0))
    assert dead.journal is not None
    # the run dies: its journal stays, under a run id no live process has (this pid, another token)
    left = dead.journal.path.with_name(dead.journal.path.name.replace(journal.run_id(), f"{journal.run_id()}x"))
    dead.journal.path.rename(left)
    gating = keeper(tmp_path).startup_lines()
    assert any(f"1 recording journal with 1 measured entries, left by runs that ended before writing them: {left}"
               in line for line in gating)
    later = keeper(tmp_path, update_baselines=True)
    later.commit(B, entry(2.0))
    later.write()
    assert written(tmp_path) == {A: entry(1.0), B: entry(2.0)}
    assert later.write_note is not None
    assert "with them 1 entries that 1 recording ended before writing" in later.write_note
    assert not left.exists()


def test_a_file_that_cannot_be_read_is_left_as_it_was_and_the_entries_saved_aside(tmp_path: Path, aside: Path) -> None:
    path = tmp_path / "h200.yaml"
    path.write_text("entries: [unclosed\n")
    k = keeper(tmp_path, update_baselines=True)
    k.commit(A, entry(1.0))
    k.write()
    assert path.read_text() == "entries: [unclosed\n"
    assert k.failed
    assert k.write_note is not None
    assert k.write_note.startswith("ERROR, NOT written: ")
    saved = list(aside.glob("attnperf-h200-unsaved-*.yaml"))
    assert len(saved) == 1
    assert f"measured entries are in {saved[0]}" in k.write_note
    loaded = baselines.load(saved[0])
    assert loaded is not None
    assert loaded.entries == {A: entry(1.0)}
    assert k.journal is not None
    assert not k.journal.path.exists()


def test_a_fleet_on_mixed_cards_writes_nothing_and_says_why(tmp_path: Path, aside: Path) -> None:
    k = keeper(tmp_path, parallel=True, update_baselines=True)
    k.commit(A, entry(1.0))
    k.write(mixed="workers on different cards")
    assert not (tmp_path / "h200.yaml").exists()
    assert k.failed
    assert k.write_note is not None
    assert "workers on different cards" in k.write_note
    assert len(list(aside.glob("attnperf-h200-unsaved-*.yaml"))) == 1
    nothing = keeper(tmp_path, parallel=True, update_baselines=True)
    nothing.write(mixed="workers on different cards")
    assert not nothing.failed
    assert nothing.write_note is None


def test_a_gating_run_writes_nothing(tmp_path: Path) -> None:
    k = keeper(tmp_path)
    k.commit(A, entry(1.0))
    k.write()
    assert k.journal is None
    assert list(tmp_path.iterdir()) == []
    assert k.write_note is None
