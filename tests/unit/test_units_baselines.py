"""Unit tests for ``pytest_attnperf.store.baselines``: the per-hardware YAML store."""

from __future__ import annotations

import copy
import math
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_attnperf.measure.summary import Summary
from pytest_attnperf.store import baselines
from pytest_attnperf.store.baselines import BaselineError, BaselineFile, load, merge, rounded, save


def entry(median_ms: float, n_samples: int = 20) -> dict[str, Any]:
    """A well-formed baseline entry around ``median_ms`` (no float needs rounding to 5 digits)."""
    return {
        "median_ms": median_ms,
        "ci_low_ms": round(0.99 * median_ms, 9),
        "ci_high_ms": round(1.01 * median_ms, 9),
        "stdrel": 0.004,
        "n_samples": n_samples,
    }


def sample_file() -> BaselineFile:
    """A small baseline with a metadata header and three entries."""
    return BaselineFile(
        meta={"hardware": "h200", "device": "NVIDIA H200", "torch": "2.13.0", "date": "2025-01-01"},
        entries={
            "suites/test_softmax.py::test_softmax[sdpa-b1-t256]": entry(0.0125),
            "suites/test_softmax.py::test_softmax[sdpa-b4-t4096]": entry(1.5),
            "suites/test_linear.py::test_gla[chunk-b2-t2048]": entry(0.75),
        },
    )


def write(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` and return it."""
    path.write_text(text, encoding="utf-8")
    return path


# -- save and load --------------------------------------------------------------------------


def test_save_then_load_round_trips(tmp_path: Path) -> None:
    """What is saved loads back equal, metadata and entries alike."""
    path = tmp_path / "h200.yaml"
    original = sample_file()
    save(path, original)
    assert load(path) == original


def test_a_file_written_before_the_overheads_key_was_settled_loads_and_saves_under_the_new_key(tmp_path: Path) -> None:
    """An entry's sample overheads stored as ``run_floors_ms`` (files recorded before the name was
    settled) are read as ``run_overheads_ms``; a save of the loaded file writes the new key only."""
    old = {**entry(1.0), "run_medians_ms": [1.0, 1.0], "run_floors_ms": [0.0033, None]}
    path = tmp_path / "h200.yaml"
    path.write_text(yaml.safe_dump({"format": baselines.FORMAT, "meta": {}, "entries": {"t.py::a": old}}))
    loaded = load(path)
    assert loaded is not None
    assert loaded.entries["t.py::a"]["run_overheads_ms"] == [0.0033, None]
    assert "run_floors_ms" not in loaded.entries["t.py::a"]
    assert Summary.from_mapping(loaded.entries["t.py::a"]).run_overheads_ms == (0.0033, None)
    save(path, loaded)
    assert "run_floors_ms" not in path.read_text()
    assert yaml.safe_load(path.read_text())["entries"]["t.py::a"]["run_overheads_ms"] == [0.0033, None]


def test_save_creates_the_folder(tmp_path: Path) -> None:
    """A missing baselines folder is created."""
    path = tmp_path / "deep" / "er" / "gb10.yaml"
    save(path, sample_file())
    assert load(path) == sample_file()


def test_load_of_a_missing_file_is_none(tmp_path: Path) -> None:
    """No file yet: None, not an error."""
    assert load(tmp_path / "nothing.yaml") is None


def test_saved_file_starts_with_its_header_and_is_sorted_below_it(tmp_path: Path) -> None:
    """``format`` and ``meta`` come first, then ``entries``; keys are sorted at every level below,
    so the text order of entries is sorted."""
    path = tmp_path / "h200.yaml"
    save(path, sample_file())
    lines = path.read_text(encoding="utf-8").splitlines()
    top = [line.split(":")[0] for line in lines if line and not line.startswith(" ")]
    assert top == ["format", "meta", "entries"]
    assert [line.strip().split(":")[0] for line in lines[2:6]] == sorted(sample_file().meta)
    keys = [line.strip().rsplit(":", 1)[0] for line in lines if line.startswith("  suites/")]
    assert keys == sorted(sample_file().entries)
    assert len(keys) == 3
    fields = [line.strip().split(":")[0] for line in lines if line.startswith("    ")]
    assert fields[:5] == sorted(entry(1.0))
    assert "format: 1" in lines


def test_a_file_with_its_entries_first_still_loads(tmp_path: Path) -> None:
    """Files written before the header came first (every key sorted: entries, format, meta) load
    as they did, and the same as the file saved now."""
    original = sample_file()
    old = write(tmp_path / "old.yaml", yaml.safe_dump(
        {"format": 1, "meta": original.meta, "entries": original.entries}, sort_keys=True))
    assert old.read_text(encoding="utf-8").startswith("entries:")
    save(tmp_path / "new.yaml", original)
    assert load(old) == load(tmp_path / "new.yaml") == original


def test_a_gitignore_for_the_stores_own_files_is_written_once(tmp_path: Path) -> None:
    """The lock, temporaries and journals are named in a ``.gitignore`` the folder did not have;
    one that exists (the user's) is left alone."""
    written = baselines.ignore_transients(tmp_path)
    assert written == tmp_path / ".gitignore"
    lines = written.read_text(encoding="utf-8").splitlines()
    assert {".*.lock", ".*.tmp", ".*.recording-*.jsonl"} <= set(lines)
    assert baselines.lock_path(tmp_path / "h200.yaml").name == ".h200.yaml.lock"  # what ".*.lock" names
    written.write_text("mine\n", encoding="utf-8")
    assert baselines.ignore_transients(tmp_path) is None
    assert written.read_text(encoding="utf-8") == "mine\n"


def test_baseline_file_summary() -> None:
    """``summary`` reads an entry into a Summary, None for an unknown key."""
    f = sample_file()
    key = "suites/test_softmax.py::test_softmax[sdpa-b4-t4096]"
    s = f.summary(key)
    assert isinstance(s, Summary)
    assert s.median_ms == 1.5
    assert s.n_samples == 20
    assert f.summary("suites/test_softmax.py::test_softmax[nope]") is None


# -- unusable files -------------------------------------------------------------------------


GOOD_ENTRY = "{median_ms: 1.0, ci_low_ms: 0.9, ci_high_ms: 1.1, stdrel: 0.01, n_samples: 20}"
BAD_FILES = {
    "corrupt-yaml": "format: 1\nentries: [unclosed\n",
    "yaml-list": "- format\n- 1\n",
    "yaml-scalar": "just words\n",
    "format-2": f"format: 2\nmeta: {{}}\nentries:\n  a: {GOOD_ENTRY}\n",
    "no-format": f"meta: {{}}\nentries:\n  a: {GOOD_ENTRY}\n",
    "entries-list": "format: 1\nmeta: {}\nentries: [1, 2]\n",
    "meta-list": "format: 1\nmeta: [a]\nentries: {}\n",
    "entry-missing-median": "format: 1\nmeta: {}\nentries:\n"
                            "  a: {ci_low_ms: 0.9, ci_high_ms: 1.1, stdrel: 0.01, n_samples: 20}\n",
    "entry-median-text": "format: 1\nmeta: {}\nentries:\n"
                         "  a: {median_ms: fast, ci_low_ms: 0.9, ci_high_ms: 1.1, stdrel: 0.01, n_samples: 20}\n",
    "entry-not-mapping": "format: 1\nmeta: {}\nentries:\n  a: 1.0\n",
    "entry-hot-sample-zero": "format: 1\nmeta: {}\nentries:\n  a: {median_ms: 1.0, ci_low_ms: 0.9, "
                             "ci_high_ms: 1.1, stdrel: 0.01, n_samples: 20, hot_sample_ms: 0}\n",
    "entry-hot-sample-text": "format: 1\nmeta: {}\nentries:\n  a: {median_ms: 1.0, ci_low_ms: 0.9, "
                             "ci_high_ms: 1.1, stdrel: 0.01, n_samples: 20, hot_sample_ms: long}\n",
}


@pytest.mark.parametrize("text", list(BAD_FILES.values()), ids=list(BAD_FILES))
def test_unusable_file_raises_naming_the_file(tmp_path: Path, text: str) -> None:
    """Every unusable file is a BaselineError whose message contains the file's path."""
    path = write(tmp_path / "h200.yaml", text)
    with pytest.raises(BaselineError) as info:
        load(path)
    assert str(path) in str(info.value)


def test_entry_errors_name_the_entry_and_field(tmp_path: Path) -> None:
    """A malformed entry is named, and so is the field it lacks."""
    path = write(tmp_path / "h200.yaml", BAD_FILES["entry-missing-median"])
    with pytest.raises(BaselineError, match=r"entry 'a'.*median_ms"):
        load(path)


INTERVAL_FAULTS = {
    "swapped": ({"ci_low_ms": 1.1, "ci_high_ms": 0.9}, ["'ci_low_ms' 1.1", "'ci_high_ms' 0.9", "'median_ms' 1.0"]),
    "above-median": ({"ci_low_ms": 1.05, "ci_high_ms": 1.1}, ["'ci_low_ms' 1.05", "does not hold 'median_ms' 1.0"]),
    "too-wide": ({"ci_low_ms": 0.005, "ci_high_ms": 1.1}, ["'ci_low_ms' 0.005", "'ci_high_ms' 1.1", "220 times"]),
    "high-inf": ({"ci_high_ms": math.inf}, ["'ci_high_ms' is inf"]),
    "low-negative": ({"ci_low_ms": -0.9}, ["'ci_low_ms' is -0.9"]),
}


@pytest.mark.parametrize("name", list(INTERVAL_FAULTS))
def test_an_interval_that_cannot_be_the_medians_makes_only_its_entry_unusable(tmp_path: Path, name: str) -> None:
    """An interval that does not bracket its median, is not positive and finite, or spans more
    than 100 times: that entry is set aside, its message naming the fields and their values; the
    others load, and a save writes it back as it was."""
    change, expected = INTERVAL_FAULTS[name]
    bad = {**entry(1.0), "ci_low_ms": 0.9, "ci_high_ms": 1.1, **change}
    path = tmp_path / "h200.yaml"
    save(path, BaselineFile(entries={"t::good": entry(2.0)}))
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["entries"]["t::bad"] = bad
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    loaded = load(path, keep_unusable=True)
    assert loaded is not None
    assert list(loaded.entries) == ["t::good"]
    assert list(loaded.unusable) == ["t::bad"]
    for text in expected:
        assert text in loaded.unusable["t::bad"].problem, loaded.unusable["t::bad"].problem
    save(path, loaded)
    again = load(path, keep_unusable=True)
    assert again is not None
    assert again.unusable["t::bad"].raw == bad


def test_an_interval_up_to_the_bound_is_usable() -> None:
    """A wide interval (a CPU's) within ``INTERVAL_RATIO_MAX`` is a measurement's."""
    assert baselines.interval_problem({"ci_low_ms": 0.5, "median_ms": 1.0, "ci_high_ms": 49.0}) is None
    assert baselines.entry_problem({**entry(1.0), "ci_low_ms": 0.5, "ci_high_ms": 49.0}) is None


# -- the strict loader: duplicate keys and aliases ------------------------------------------

HAND_MERGED = {
    "entry-twice": (f"format: 1\nmeta: {{}}\nentries:\n  t::a: {GOOD_ENTRY}\n  t::b: {GOOD_ENTRY}\n"
                    f"  t::a: {GOOD_ENTRY}\n", 6, "'t::a'", "first at line 4"),
    "median-twice": ("format: 1\nmeta: {}\nentries:\n  t::a:\n    median_ms: 1.0\n    ci_low_ms: 0.9\n"
                     "    median_ms: 1.05\n    ci_high_ms: 1.1\n    stdrel: 0.01\n    n_samples: 20\n",
                     7, "'median_ms'", "first at line 5"),
    "median-twice-flow": ("format: 1\nmeta: {}\nentries:\n  t::a: {median_ms: 1.0, ci_low_ms: 0.9, "
                          "ci_high_ms: 1.1, stdrel: 0.01, n_samples: 20, median_ms: 1.05}\n", 4, "'median_ms'",
                          "first at line 4"),
}


@pytest.mark.parametrize("name", list(HAND_MERGED))
def test_a_key_twice_is_refused_naming_the_file_the_line_and_the_key(tmp_path: Path, name: str) -> None:
    """PyYAML keeps the last of two equal keys silently; the store refuses the file, naming the
    file, the line of the second key, the key, the first one's line, and that nothing was written."""
    text, line, key, first = HAND_MERGED[name]
    path = write(tmp_path / "h200.yaml", text)
    assert yaml.safe_load(text)["entries"]["t::a"]  # plain PyYAML reads it without a word
    with pytest.raises(BaselineError) as info:
        load(path, keep_unusable=True)
    message = str(info.value)
    assert f"baseline file {path}, line {line}: key {key} appears twice" in message
    assert first in message
    assert "nothing was written" in message


ALIASED = {
    "shared-entry": (f"format: 1\nmeta: {{}}\nentries:\n  t::a: &e {GOOD_ENTRY}\n  t::b: *e\n", 5, "'t::b'"),
    "shared-value": ("format: 1\nmeta: {}\nentries:\n  t::a: {median_ms: &m 1.0, ci_low_ms: 0.9, ci_high_ms: 1.1,"
                     " stdrel: 0.01, n_samples: 20}\n  t::b: {median_ms: *m, ci_low_ms: 0.9, ci_high_ms: 1.1,"
                     " stdrel: 0.01, n_samples: 20}\n", 5, "'median_ms'"),
    "billion-laughs": ("format: 1\nentries: {}\nmeta:\n  a: &a [x, x, x, x, x, x, x, x, x]\n"
                       "  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
                       "  d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
                       "  f: [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n", 5, "item 0 of the list"),
}


@pytest.mark.parametrize("name", list(ALIASED))
def test_an_alias_is_refused_naming_the_file_and_the_line(tmp_path: Path, name: str) -> None:
    """An alias makes two places one object (an entry changed through one changes the other) and
    nests into billions of nodes; the store writes neither, and refuses a file that has one."""
    text, line, where = ALIASED[name]
    path = write(tmp_path / "h200.yaml", text)
    with pytest.raises(BaselineError) as info:
        load(path, keep_unusable=True)
    message = str(info.value)
    assert f"baseline file {path}, line {line}: " in message
    assert where in message
    assert "is an alias (*)" in message
    assert "nothing was written" in message


def test_a_list_shared_by_two_entries_is_saved_twice_and_loads(tmp_path: Path) -> None:
    """PyYAML's dumper writes an object met twice as an anchor and an alias; the store's writes
    it out twice, so a file it saves is a file it loads."""
    runs = [1.0, 1.01]
    path = tmp_path / "h200.yaml"
    save(path, BaselineFile(entries={"t::a": {**entry(1.0), "run_medians_ms": runs},
                                     "t::b": {**entry(1.0), "run_medians_ms": runs}}))
    assert "&" not in path.read_text(encoding="utf-8")
    loaded = load(path)
    assert loaded is not None
    assert loaded.entries["t::a"]["run_medians_ms"] == loaded.entries["t::b"]["run_medians_ms"] == runs


def test_an_anchor_nothing_refers_to_loads(tmp_path: Path) -> None:
    """An anchor alone makes nothing shared: the file loads."""
    path = write(tmp_path / "h200.yaml", f"format: 1\nmeta: {{}}\nentries:\n  t::a: &e {GOOD_ENTRY}\n")
    loaded = load(path)
    assert loaded is not None
    assert list(loaded.entries) == ["t::a"]


def test_a_refusal_quotes_at_most_a_bounded_part_of_the_file(tmp_path: Path) -> None:
    """A key of a thousand characters, twice: the message names it cut to 200 characters."""
    key = "t::" + "x" * 1_000
    path = write(tmp_path / "h200.yaml", f"format: 1\nmeta: {{}}\nentries:\n  {key}: 1\n  {key}: 2\n")
    with pytest.raises(BaselineError) as info:
        load(path)
    assert "appears twice" in str(info.value)
    assert len(str(info.value)) < 600


def test_a_bad_entry_with_a_long_key_is_named_cut_short(tmp_path: Path) -> None:
    """An unusable entry's message quotes its key and its values bounded, not whole."""
    key = "t::" + "x" * 1_000
    runs = ", ".join(["0"] * 5_000)
    path = write(tmp_path / "h200.yaml", "format: 1\nmeta: {}\nentries:\n"
                 f"  {key}: {{median_ms: 1.0, ci_low_ms: 0.9, ci_high_ms: 1.1, stdrel: 0.01, n_samples: 20, "
                 f"run_medians_ms: [{runs}]}}\n")
    loaded = load(path, keep_unusable=True)
    assert loaded is not None
    assert list(loaded.unusable) == [key]  # the entry keeps its whole key
    assert "run_medians_ms" in loaded.unusable[key].problem
    assert len(loaded.unusable[key].problem) < 1000


# -- merge and rounding ---------------------------------------------------------------------


def test_merge_replaces_only_measured_keys() -> None:
    """Measured entries replace or add; every other entry and the old file stay untouched."""
    existing = sample_file()
    before = copy.deepcopy(existing)
    replaced = "suites/test_softmax.py::test_softmax[sdpa-b1-t256]"
    added = "suites/test_softmax.py::test_softmax[sdpa-b8-t8192]"
    measured = {replaced: entry(0.02), added: entry(3.0)}
    merged = merge(existing, measured, {"torch": "2.14.0", "date": "2025-02-02"})

    expected_entries = copy.deepcopy(before.entries)
    expected_entries[replaced] = entry(0.02)
    expected_entries[added] = entry(3.0)
    assert merged.entries == expected_entries
    assert merged.meta == {**before.meta, "torch": "2.14.0", "date": "2025-02-02"}
    assert existing == before


def test_a_re_recorded_entry_keeps_the_keys_this_version_does_not_write() -> None:
    """A key another version or a person wrote into an entry survives its re-recording (named in
    ``carried``); a key this version writes is the new measurement's, or absent with it."""
    key = "suites/test_softmax.py::test_softmax[sdpa-b1-t256]"
    old = {**entry(1.0), "eager_ms": 1.5, "owner": "kernels team", "future_field": [1, 2]}
    existing = BaselineFile(meta={"hardware": "h200"}, entries={key: old})
    merged = merge(existing, {key: entry(2.0), "other": entry(3.0)}, {})
    assert merged.entries[key] == {**entry(2.0), "owner": "kernels team", "future_field": [1, 2]}
    assert merged.carried == {key: ("future_field", "owner")}
    assert merged.entries["other"] == entry(3.0)


def test_merge_into_nothing() -> None:
    """Merging into no file gives just the measured entries and the metadata."""
    merged = merge(None, {"k": entry(1.0)}, {"hardware": "cpu"})
    assert merged == BaselineFile(meta={"hardware": "cpu"}, entries={"k": entry(1.0)})


def test_merge_rounds_measured_values_only() -> None:
    """Measured floats are rounded to 5 significant digits; kept entries are not rewritten."""
    existing = BaselineFile(entries={"old": {**entry(1.0), "median_ms": 1.23456789}})
    merged = merge(existing, {"new": {**entry(1.0), "median_ms": 9.87654321, "n_samples": 33}}, {})
    assert merged.entries["new"]["median_ms"] == 9.8765
    assert merged.entries["new"]["n_samples"] == 33
    assert merged.entries["old"]["median_ms"] == 1.23456789


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.23456789, 1.2346),
        (123456.789, 123460.0),
        (0.000123456789, 0.00012346),
        (-9.87654321, -9.8765),
        (99999.5, 100000.0),
        (1.0, 1.0),
        (0.0, 0.0),
    ],
    ids=str,
)
def test_rounded_keeps_five_significant_digits(value: float, expected: float) -> None:
    """Floats keep 5 significant digits whatever their magnitude."""
    assert rounded(value) == expected


@pytest.mark.parametrize("value", [20, True, "1.23456789", None, float("inf")], ids=repr)
def test_rounded_leaves_other_values_alone(value: object) -> None:
    """Ints, bools, strings, None and non-finite floats pass through unchanged."""
    assert rounded(value) is value


def test_rounded_leaves_nan_alone() -> None:
    """NaN is not finite and is returned as it came."""
    nan = float("nan")
    assert rounded(nan) is nan


# -- atomic save ----------------------------------------------------------------------------


def test_failed_save_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the final rename fails, the old file is intact and the folder holds nothing else."""
    path = tmp_path / "h200.yaml"
    save(path, sample_file())
    old_text = path.read_text(encoding="utf-8")

    def refuse(src: str, dst: str) -> None:
        raise OSError("disk said no")

    monkeypatch.setattr("pytest_attnperf.store.baselines.os.replace", refuse)
    changed = merge(load(path), {"k": entry(9.0)}, {"date": "2030-01-01"})
    with pytest.raises(OSError, match="disk said no"):
        save(path, changed)
    assert path.read_text(encoding="utf-8") == old_text
    assert sorted(os.listdir(tmp_path)) == ["h200.yaml"]


def test_successful_save_leaves_no_temporary(tmp_path: Path) -> None:
    """A save over an existing file leaves only the file itself."""
    path = tmp_path / "h200.yaml"
    save(path, sample_file())
    save(path, merge(load(path), {"k": entry(9.0)}, {}))
    assert sorted(os.listdir(tmp_path)) == ["h200.yaml"]
    loaded = load(path)
    assert loaded is not None
    assert loaded.entries["k"] == entry(9.0)


def test_save_keeps_the_old_files_permissions_and_gives_new_ones_the_umasks(tmp_path: Path) -> None:
    import os
    import stat

    from pytest_attnperf.store.baselines import BaselineFile, save

    fresh = tmp_path / "new.yaml"
    save(fresh, BaselineFile())
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask
    old = tmp_path / "old.yaml"
    old.write_text("format: 1\n")
    old.chmod(0o640)
    save(old, BaselineFile())
    assert stat.S_IMODE(old.stat().st_mode) == 0o640


def test_writing_through_a_symlink_replaces_the_file_it_names_and_keeps_the_link(tmp_path: Path) -> None:
    """A baselines folder whose file is a symlink (to a shared checkout, say): ``save`` and
    ``update`` replace the target, under the target's lock, and leave the link a link."""
    target = tmp_path / "shared" / "h200.yaml"
    save(target, BaselineFile(entries={"t::a": entry(1.0)}))
    (tmp_path / "baselines").mkdir()
    link = tmp_path / "baselines" / "h200.yaml"
    link.symlink_to(target)
    baselines.update(link, {"t::b": entry(2.0)}, {"hardware": "h200"})
    assert link.is_symlink()
    assert link.resolve() == target.resolve()
    written = load(target)
    assert written is not None
    assert sorted(written.entries) == ["t::a", "t::b"]
    assert (target.parent / ".h200.yaml.lock").exists()
    assert not (link.parent / ".h200.yaml.lock").exists()
    save(link, merge(written, {"t::c": entry(3.0)}, {}))
    assert link.is_symlink()
    again = load(target)
    assert again is not None
    assert sorted(again.entries) == ["t::a", "t::b", "t::c"]
    assert [p.name for p in link.parent.iterdir()] == ["h200.yaml"]  # no temporary left beside the link


def test_merge_since_takes_only_what_another_host_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two hosts update copies of the committed file, each on its own cases; merging each copy
    with --since the committed file keeps both hosts' new entries and nothing stale."""
    meta = {"hardware": "h200"}
    committed = tmp_path / "h200.yaml"
    save(committed, merge(None, {"t::a": entry(1.0), "t::b": entry(2.0), "t::c": entry(3.0)}, meta))
    host_a, host_b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    save(host_a, merge(load(committed), {"t::a": entry(1.1)}, meta))
    save(host_b, merge(load(committed), {"t::b": entry(2.2), "t::d": entry(4.0)}, meta))
    into = tmp_path / "merged.yaml"
    into.write_bytes(committed.read_bytes())
    assert baselines.main(["merge", str(host_a), str(into), "--since", str(committed)]) == 0
    assert baselines.main(["merge", str(host_b), str(into), "--since", str(committed)]) == 0
    merged = load(into)
    assert merged is not None
    medians = {k: v["median_ms"] for k, v in merged.entries.items()}
    assert medians == {"t::a": 1.1, "t::b": 2.2, "t::c": 3.0, "t::d": 4.0}
    assert "merged 1 entries" in capsys.readouterr().out.splitlines()[0]
    # without --since, host A's stale copy of t::b would have undone host B's
    assert baselines.main(["merge", str(host_a), str(into)]) == 0
    again = load(into)
    assert again is not None
    assert again.entries["t::b"]["median_ms"] == 2.0
