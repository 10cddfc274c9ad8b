"""Fault injection for the baseline store: bad files, concurrent writers, interrupted writes,
an unwritable folder and a full disk. The store must lose no entry and name every fault.

The module counts the inputs it tried, the faults it injected and the entries lost, prints them
when its last test is done, and fails that teardown if any entry was lost.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kit
import pytest
import yaml

from pytest_attnperf.store import baselines, journal
from pytest_attnperf.store.baselines import BaselineError, BaselineFile, LockTimeout, load, save, temporaries, update

COMMITTED = kit.ROOT / "baselines" / "h200.yaml"
PLUGIN = kit.PLUGIN
COUNTS: Counter[str] = Counter()  # inputs, faults, entries checked, entries lost (see the fixture below)
# Locked concurrent-writer rounds at the committed size: the unlocked control shows the harness's
# writes overlap (it loses an entry in its first round or so); a few locked rounds then show the
# lock keeps them (more for a longer stress run).
ROUNDS = int(os.environ.get("ATTNPERF_STORE_ROUNDS", "4"))
LARGE_ROUNDS = max(1, ROUNDS // 4)  # at 1.5 MB, where a round takes seconds (a write's window is wider there)
CONTROL_ROUNDS = max(ROUNDS, 20)  # the unlocked control's rounds at most: it stops at its first lost entry
LARGE_MB = 1.5  # the concurrent writers' large file
HUGE_MB = float(os.environ.get("ATTNPERF_STORE_HUGE_MB", str(LARGE_MB)))  # the large file's size (50 for the figure)
HEAD_ENTRIES = 40  # the committed file's entries in HEAD (the cuts and flips, the lock and interrupted writes)


@pytest.fixture(scope="module", autouse=True)
def fault_counts(request: pytest.FixtureRequest) -> Iterator[Counter[str]]:
    """The module's counters; printed once its tests are done, which fail if an entry was lost."""
    yield COUNTS
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    line = (f"store faults: {COUNTS['inputs']} inputs tried, {COUNTS['faults']} faults injected, "
            f"{COUNTS['entries checked']} entries checked after them, {COUNTS['entries lost']} entries lost")
    extra = [f"  {k}: {v}" for k, v in sorted(COUNTS.items()) if k not in ("inputs", "faults", "entries checked",
                                                                            "entries lost")]
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            for text in [line, *extra]:
                reporter.write_line(text)
    assert COUNTS["entries lost"] == 0, line


def entry(median_ms: float, **extra: Any) -> dict[str, Any]:
    """A well-formed entry around ``median_ms``."""
    return {"median_ms": median_ms, "ci_low_ms": round(0.99 * median_ms, 9), "ci_high_ms": round(1.01 * median_ms, 9),
            "stdrel": 0.004, "n_samples": 20, **extra}


def keys_of(path: Path) -> set[str]:
    """Every entry key in the file, usable or not (read without the store's validation)."""
    data = baselines._parse(path.read_text(encoding="utf-8"))
    return {str(k) for k in data["entries"]}


def check_kept(path: Path, expected: set[str], present: set[str] | None = None) -> None:
    """Count the expected keys missing from ``path`` (whose keys are ``present`` where already read)
    as lost, and fail if any is."""
    missing = expected - (keys_of(path) if present is None else present)
    COUNTS["entries checked"] += len(expected)
    COUNTS["entries lost"] += len(missing)
    assert not missing, f"{len(missing)} entries lost from {path}: {sorted(missing)[:5]}"


_SCALED: dict[int, bytes] = {}  # scaled_copy's files by size: each built once a process


def scaled_copy(path: Path, target_bytes: int) -> Path:
    """A baseline file of about ``target_bytes``: the committed file's entries repeated under new keys
    (built and saved once for each size; later copies are its bytes)."""
    if target_bytes in _SCALED:
        path.write_bytes(_SCALED[target_bytes])
        return path
    source = load(COMMITTED)
    assert source is not None
    items = sorted(source.entries.items())
    per_entry = COMMITTED.stat().st_size / len(items)
    count = max(len(items), int(target_bytes / per_entry))
    entries = {f"{key}#{i // len(items)}" if i >= len(items) else key: {
        k: list(v) if isinstance(v, list) else v for k, v in value.items()}
        for i, (key, value) in ((i, items[i % len(items)]) for i in range(count))}
    save(path, BaselineFile(meta=source.meta, entries=entries))
    _SCALED[target_bytes] = path.read_bytes()
    return path


def committed_head(entries: int) -> bytes:
    """The committed file's text up to the end of its first ``entries`` entries: a smaller file of
    the same text (its format, meta and entries as written), whose every cut is one of the whole's."""
    text = COMMITTED.read_bytes()
    body = text.index(b"\nentries:\n") + len(b"\nentries:\n")
    starts = [body + m.start() for m in re.finditer(rb"^  (?:\? |[^:\s])", text[body:], re.MULTILINE)]
    return text[:starts[entries]]


HEAD = committed_head(HEAD_ENTRIES)  # the file of the tests where its size plays no part


# -- bad files ------------------------------------------------------------------------------

BAD_FILES: dict[str, bytes] = {
    "not-yaml": b"format: 1\nentries: {a: [unclosed\n",
    "tabs": b"format: 1\nentries:\n\ta: 1\n",
    "binary": random.Random(0).randbytes(4096),
    "binary-utf8": bytes(random.Random(1).choice(range(1, 128)) for _ in range(4096)),
    "nul-bytes": b"format: 1\x00\x00\nentries: {}\n",
    "empty": b"",
    "blank": b"\n  \n\n",
    "list": b"- format\n- 1\n",
    "scalar": b"just words\n",
    "format-2": b"format: 2\nmeta: {}\nentries: {}\n",
    "no-format": b"meta: {}\nentries: {}\n",
    "entries-list": b"format: 1\nmeta: {}\nentries: [1, 2]\n",
    "meta-scalar": b"format: 1\nmeta: 3\nentries: {}\n",
    "python-tag": b"format: 1\nmeta: !!python/object/apply:os.system ['true']\nentries: {}\n",
    "latin-1": "format: 1\nmeta: {device: caf\u00e9}\nentries: {}\n".encode("latin-1"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_bad_file_is_one_clear_error_naming_it(tmp_path: Path, name: str) -> None:
    """Whatever the bytes, ``load`` raises only ``BaselineError``, naming the file."""
    path = tmp_path / "h200.yaml"
    path.write_bytes(BAD_FILES[name])
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    with pytest.raises(BaselineError) as info:
        load(path, keep_unusable=True)
    assert str(path) in str(info.value)


def test_a_hand_merged_file_is_refused_by_an_update_and_left_byte_for_byte(tmp_path: Path) -> None:
    """Two entries of one case (a hand-merge) or an alias: an update raises naming the line and
    writes nothing, so the user's file, both copies included, is there to be mended."""
    good = "{median_ms: 1.0, ci_low_ms: 0.9, ci_high_ms: 1.1, stdrel: 0.01, n_samples: 20}"
    files = {"twice": f"format: 1\nmeta: {{}}\nentries:\n  t::a: {good}\n  t::b: {good}\n  t::a: {good}\n",
             "alias": f"format: 1\nmeta: {{}}\nentries:\n  t::a: &e {good}\n  t::b: *e\n"}
    for name, text in files.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        COUNTS["inputs"] += 1
        COUNTS["faults"] += 1
        with pytest.raises(BaselineError, match=r"line \d+: .*nothing was written"):
            update(path, {"t::c": entry(2.0)}, {"date": "today"})
        COUNTS["entries checked"] += 2
        if path.read_text(encoding="utf-8") != text:
            COUNTS["entries lost"] += 2
        assert path.read_text(encoding="utf-8") == text
        assert temporaries(path) == []


def test_truncated_and_corrupted_copies_load_or_fail_cleanly(tmp_path: Path) -> None:
    """Two hundred cuts and byte flips of the committed file's text (its first ``HEAD_ENTRIES``
    entries, which load as they are): each loads (bad entries set aside) or raises
    ``BaselineError``; nothing else escapes, and no usable entry is reported unusable."""
    text = HEAD
    head = tmp_path / "head.yaml"
    head.write_bytes(text)
    whole = load(head)  # no entry set aside before the faults
    assert whole is not None
    assert len(whole.entries) == HEAD_ENTRIES
    rng = random.Random(7)
    path = tmp_path / "h200.yaml"
    outcomes: Counter[str] = Counter()
    for i in range(200):
        if i % 2:
            data = text[:rng.randrange(len(text))]
        else:
            mutated = bytearray(text)
            for _ in range(rng.randrange(1, 8)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            data = bytes(mutated)
        path.write_bytes(data)
        COUNTS["inputs"] += 1
        COUNTS["faults"] += 1
        try:
            loaded = load(path, keep_unusable=True)
        except BaselineError as exc:
            assert str(path) in str(exc)  # noqa: PT017 - either outcome is allowed, so pytest.raises does not fit
            outcomes["error"] += 1
            continue
        assert loaded is not None
        for key, value in loaded.entries.items():
            assert baselines.entry_problem(value) is None, key
        outcomes["loaded"] += 1
    assert outcomes["error"]
    assert outcomes["loaded"]  # both paths were exercised


BAD_ENTRIES: dict[str, dict[str, Any]] = {
    "eager-zero": entry(1.0, eager_ms=0),
    "eager-negative": entry(1.0, eager_ms=-0.5),
    "eager-nan": entry(1.0, eager_ms=math.nan),
    "eager-inf": entry(1.0, eager_ms=math.inf),
    "median-zero": {**entry(1.0), "median_ms": 0.0, "ci_low_ms": 0.0},
    "median-nan": {**entry(1.0), "median_ms": math.nan},
    "median-text": {**entry(1.0), "median_ms": "fast"},
    "ci-low-zero": {**entry(1.0), "ci_low_ms": 0.0},
    "ci-swapped": {**entry(1.0), "ci_low_ms": 1.01, "ci_high_ms": 0.99},
    "ci-too-wide": {**entry(1.0), "ci_low_ms": 0.001, "ci_high_ms": 5.0},
    "stdrel-negative": {**entry(1.0), "stdrel": -0.1},
    "hot-sample-zero": entry(1.0, hot_sample_ms=0),
    "history-zero": entry(1.0, run_medians_ms=[1.0, 0.0]),
    "history-machines-short": entry(1.0, run_medians_ms=[1.0, 1.0], run_machines=["m"]),
    "tflops-negative": entry(1.0, tflops=-3.0),
    "peak-inf": entry(1.0, peak_mib=math.inf),
    "no-median": {k: v for k, v in entry(1.0).items() if k != "median_ms"},
    "samples-float": {**entry(1.0), "n_samples": 2.5},
}


def test_bad_entries_are_set_aside_each_with_its_cause_and_kept_on_save(tmp_path: Path) -> None:
    """Each bad entry costs only itself: the good ones load, each bad one is named with the field
    at fault, and a save writes them back untouched until a measurement replaces one."""
    path = tmp_path / "h200.yaml"
    raw = {"format": 1, "meta": {"hardware": "h200"},
           "entries": {"good": entry(2.0), "not-a-mapping": 1.5, **BAD_ENTRIES}}
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    COUNTS["inputs"] += 1
    COUNTS["faults"] += len(BAD_ENTRIES) + 1
    loaded = load(path, keep_unusable=True)
    assert loaded is not None
    assert list(loaded.entries) == ["good"]
    assert sorted(loaded.unusable) == sorted([*BAD_ENTRIES, "not-a-mapping"])
    for name, bad in loaded.unusable.items():
        field = {"eager": "eager_ms", "median": "median_ms", "ci": "ci_low_ms", "stdrel": "stdrel",
                 "hot": "hot_sample_ms", "history": "run_", "tflops": "tflops", "peak": "peak_mib",
                 "no": "median_ms", "samples": "n_samples", "not": "not a mapping"}[name.split("-")[0]]
        assert field in bad.cause, (name, bad.cause)
        assert str(path) in bad.problem
        assert f"entry '{name}'" in bad.problem
    with pytest.raises(BaselineError, match="entry '"):  # without keep_unusable, the first one raises
        load(path)
    merged, _ = update(path, {"eager-zero": entry(3.0, eager_ms=3.1)}, {"date": "today"})
    COUNTS["inputs"] += 1
    again = load(path, keep_unusable=True)
    assert again is not None
    assert again.entries["eager-zero"]["eager_ms"] == 3.1  # replaced by the measurement
    assert "eager-zero" not in again.unusable
    assert len(again.unusable) == len(BAD_ENTRIES)
    check_kept(path, {"good", "not-a-mapping", *BAD_ENTRIES})


def test_large_file_loads_with_the_c_loader_and_reports_its_time(tmp_path: Path) -> None:
    """A file of ``ATTNPERF_STORE_HUGE_MB`` (1.5 MB here, the concurrent writers' large file,
    built once for both; 50 for the figure) loads, with libyaml's loader where PyYAML has it; the
    time is printed, not asserted."""
    if yaml.__with_libyaml__:
        assert issubclass(baselines._LOADER, yaml.CSafeLoader)
        assert issubclass(baselines._DUMPER, yaml.CSafeDumper)
    path = scaled_copy(tmp_path / "h200.yaml", int(HUGE_MB * 1e6))
    COUNTS["inputs"] += 1
    started = time.perf_counter()
    loaded = load(path, keep_unusable=True)
    seconds = time.perf_counter() - started
    assert loaded is not None
    assert not loaded.unusable
    COUNTS[f"large file: {path.stat().st_size / 1e6:.1f} MB, {len(loaded.entries)} entries, load s"] = round(seconds)
    print(f"{path.stat().st_size / 1e6:.1f} MB, {len(loaded.entries)} entries: loaded in {seconds:.2f} s "
          f"({baselines._LOADER.__name__})")


# -- concurrent writers ---------------------------------------------------------------------

WRITER = r"""
import contextlib, sys, time
from pathlib import Path
from pytest_attnperf.store import baselines, journal
path, key, folder = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
unlocked, rounds = sys.argv[4] == "1", int(sys.argv[5])
if unlocked:  # the control: the update without its lock
    baselines.locked = lambda path, timeout_s=None: contextlib.nullcontext()
for i in range(rounds):  # each round: say ready, wait for the go, update, say done
    (folder / f"ready-{key}-{i}").touch()
    while not (folder / f"go-{i}").exists():
        if (folder / "stop").exists():
            sys.exit(0)
        time.sleep(0.0005)
    baselines.update(path, {f"{key}[{i}]": {"median_ms": 1.0, "ci_low_ms": 0.9, "ci_high_ms": 1.1, "stdrel": 0.01,
                                            "n_samples": 20}}, {"date": str(i)})
    (folder / f"done-{key}-{i}").touch()
"""


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(kit.ROOT), os.environ.get("PYTHONPATH", "")])}


def wait_for(names: list[Path], writers: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + 120
    while not all(n.exists() for n in names):
        assert time.monotonic() < deadline, f"writers stalled waiting for {names}"
        assert all(w.poll() in (None, 0) for w in writers), "a writer failed"
        time.sleep(0.002)


def round_keys(i: int) -> set[str]:
    """The keys the two writers add in round ``i``."""
    return {f"w.py::a[{i}]", f"w.py::b[{i}]"}


def races(path: Path, folder: Path, rounds: int, unlocked: bool = False) -> Iterator[set[str]]:
    """Two writer processes, each adding one entry a round to ``path`` at the same moment as the
    other; yields, after each round, the keys in the file."""
    folder.mkdir()
    names = ["w.py::a", "w.py::b"]
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, str(folder), "1" if unlocked else "0",
                                 str(rounds)], env=child_env()) for name in names]
    try:
        for i in range(rounds):
            wait_for([folder / f"ready-{n}-{i}" for n in names], writers)
            (folder / f"go-{i}").touch()
            wait_for([folder / f"done-{n}-{i}" for n in names], writers)
            yield keys_of(path)
    finally:
        (folder / "stop").touch()
        for w in writers:
            w.wait(timeout=60)


@pytest.mark.parametrize(("size", "rounds"), [("committed", ROUNDS), (f"{LARGE_MB}MB", LARGE_ROUNDS)])
def test_concurrent_updates_keep_every_entry(tmp_path: Path, size: str, rounds: int) -> None:
    """Two processes update the same file at the same moment, ``rounds`` times: every round
    keeps both new entries and every old one."""
    path = tmp_path / "h200.yaml"
    if size == "committed":
        path.write_bytes(COMMITTED.read_bytes())
    else:
        scaled_copy(path, int(LARGE_MB * 1e6))
    expected, present = keys_of(path), set[str]()
    for i, present in enumerate(races(path, tmp_path / "race", rounds)):
        missing = round_keys(i) - present
        COUNTS["inputs"] += 1
        COUNTS["faults"] += 1
        COUNTS["entries checked"] += 2
        COUNTS["entries lost"] += len(missing)
        assert not missing, f"round {i}: lost {missing}"
        expected |= round_keys(i)
    check_kept(path, expected, present)  # the file as the last round left it
    assert temporaries(path) == []


def test_the_unlocked_control_loses_entries(tmp_path: Path) -> None:
    """The same race without the lock, on the committed file's size, until it loses an entry
    (at most ``CONTROL_ROUNDS`` rounds): proof that the race test above can see a lost entry. The
    losses here are the control's and are counted apart."""
    path = tmp_path / "h200.yaml"
    path.write_bytes(COMMITTED.read_bytes())
    rounds, missing = 0, set()
    for i, present in enumerate(races(path, tmp_path / "race", CONTROL_ROUNDS, unlocked=True)):
        COUNTS["inputs"] += 1
        rounds += 1
        missing = round_keys(i) - present
        if missing:
            break
    COUNTS["unlocked control: rounds until an entry was lost"] = rounds
    assert missing, f"{CONTROL_ROUNDS} unlocked rounds lost nothing: the race does not overlap the writes"


def test_a_writer_waits_for_the_lock_and_then_sees_the_holders_entry(tmp_path: Path) -> None:
    """While this process holds the lock, another's update waits; once released, it reloads and
    keeps this process's entry beside its own."""
    path = tmp_path / "h200.yaml"
    path.write_bytes(HEAD)
    before = keys_of(path)
    COUNTS["inputs"] += 1
    with baselines.locked(path):
        folder = tmp_path / "race"
        folder.mkdir()
        (folder / "go-0").touch()
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "theirs", str(folder), "0", "1"],
                                  env=child_env())
        time.sleep(1.0)
        assert writer.poll() is None, "the writer did not wait for the lock"
        save(path, baselines.merge(load(path), {"mine": entry(1.0)}, {}))
    assert writer.wait(timeout=60) == 0
    check_kept(path, before | {"mine", "theirs[0]"})


def test_an_update_rereads_a_file_another_run_changed_since_it_was_read(tmp_path: Path) -> None:
    """The file as this run read it is merged into only if its bytes are unchanged: another
    run's entry written in between is kept."""
    path = tmp_path / "h200.yaml"
    path.write_bytes(HEAD)
    before = keys_of(path)
    COUNTS["inputs"] += 1
    read_at_start = load(path, keep_unusable=True)
    update(path, {"theirs": entry(1.0)}, {})
    update(path, {"mine": entry(2.0)}, {}, known=read_at_start)
    check_kept(path, before | {"theirs", "mine"})


def test_a_lock_held_too_long_is_a_clear_timeout(tmp_path: Path) -> None:
    """Another holder past the timeout: ``LockTimeout`` names the lock file and the holder's pid."""
    path = tmp_path / "h200.yaml"
    path.write_bytes(HEAD)
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    with baselines.locked(path), pytest.raises(LockTimeout) as info:
        update(path, {"k": entry(1.0)}, {}, timeout_s=0.2)
    assert str(baselines.lock_path(path)) in str(info.value)
    assert f"process {os.getpid()}" in str(info.value)
    assert path.read_bytes() == HEAD


# -- interrupted writes ---------------------------------------------------------------------

STUCK_WRITER = r"""
import os, sys, time
from pathlib import Path
from pytest_attnperf.store import baselines, journal
path, hold_lock = Path(sys.argv[1]), sys.argv[2] == "1"
def stuck(fd):  # the temporary is written, not yet renamed: wait here to be killed
    print("writing", flush=True)
    time.sleep(600)
baselines.os.fsync = stuck
if hold_lock:
    baselines.update(path, {"killed": {"median_ms": 1.0}}, {})
else:
    baselines.save(path, baselines.BaselineFile(entries={"killed": {"median_ms": 1.0}}))
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_writer_killed_mid_write_leaves_the_file_intact_and_the_next_update_cleans_up(
        tmp_path: Path, sig: signal.Signals) -> None:
    """Killed between writing its temporary and the rename (holding the lock): the file is as it
    was, the temporary is left, the lock is free again, and the next update removes the
    temporary and keeps every entry."""
    path = tmp_path / "h200.yaml"
    path.write_bytes(HEAD)
    before = keys_of(path)
    writer = subprocess.Popen([sys.executable, "-c", STUCK_WRITER, str(path), "1"], env=child_env(),
                              stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    assert writer.stdout.readline().strip() == "writing"
    writer.send_signal(sig)
    writer.wait(timeout=30)
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    assert path.read_bytes() == HEAD
    left = temporaries(path)
    assert len(left) == 1
    merged, removed = update(path, {"next": entry(1.0)}, {}, timeout_s=5)
    assert removed == left
    assert temporaries(path) == []
    check_kept(path, before | {"next"})


def test_a_run_cleans_left_temporaries_and_says_so(project: pytest.Pytester) -> None:
    """A temporary left by a killed writer is removed by the next ``--update-baselines`` run."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    stale = project.path / "baselines" / ".h200.yaml.abc123.tmp"
    stale.write_text("entries: {half")
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    result = project.runpytest(*PLUGIN, "--update-baselines")
    result.assert_outcomes(passed=2)
    assert "removed 1 temporary file an interrupted write had left" in result.stdout.str()
    assert not stale.exists()
    check_kept(project.path / "baselines" / "h200.yaml", {"test_cases.py::test_case[a]", "test_cases.py::test_case[b]"})


# -- the plugin: start-up check, bad entries, unwritable folder, full disk ----------------

CONFTEST = kit.conftest(samples=kit.steps(5), eager_ms=1.2)  # a fake H200, a steady scripted timer

CASES = {"test_cases.py::test_case[a]", "test_cases.py::test_case[b]"}


@pytest.fixture
def project(pytester: pytest.Pytester, tmp_path_factory: pytest.TempPathFactory,
            monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """Two measured cases on a fake H200 with a steady scripted timer; the temporary folder (where
    an update that cannot write saves its entries) is a fresh one."""
    kit.make_project(pytester, CONFTEST, addopts="--hw=h200", test_cases=kit.TESTS)
    spare = tmp_path_factory.mktemp("systemp")
    monkeypatch.setattr(tempfile, "tempdir", str(spare))
    monkeypatch.setenv("TMPDIR", str(spare))
    return pytester


def test_bad_entries_are_named_at_start_up_and_cost_only_their_own_case(project: pytest.Pytester) -> None:
    """An ``eager_ms: 0`` entry and a bad entry of a test not in the run: both named once, before
    any case runs; the case with the bad entry fails with its cause, the other is gated; an
    update re-records the bad entry and keeps the unrelated one as it was."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    path = kit.baseline_path(project)
    with kit.editing_baseline(project) as data:
        data["entries"]["test_cases.py::test_case[b]"]["eager_ms"] = 0
        data["entries"]["elsewhere.py::test_x"] = {"median_ms": "soon"}
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 2
    result = project.runpytest(*PLUGIN, "-v")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    header = "unusable entries; each one's case fails until --update-baselines records it again"
    assert out.count(header) == 1
    assert out.index(header) < out.index("test_cases.py::test_case[a]")  # named before any case ran
    result.stdout.fnmatch_lines(["*elsewhere.py::test_x: TypeError: 'median_ms' is 'soon'*",
                                 "*test_case?b?: ValueError: 'eager_ms' is 0; a time must be positive*"])
    assert "entry 'test_cases.py::test_case[b]': ValueError: 'eager_ms' is 0" in out[out.index("= FAILURES ="):]
    assert "ZeroDivisionError" not in out
    assert "Traceback" not in out
    update_run = project.runpytest(*PLUGIN, "--update-baselines")
    update_run.assert_outcomes(passed=2)
    assert "1 of them unusable and left as they were" in update_run.stdout.str()
    after = kit.entries(project)
    assert after["test_cases.py::test_case[b]"]["eager_ms"] == 1.2
    assert after["elsewhere.py::test_x"] == {"median_ms": "soon"}
    project.runpytest(*PLUGIN).assert_outcomes(passed=2, failed=0)
    check_kept(path, CASES | {"elsewhere.py::test_x"})


def test_a_case_whose_entry_is_unusable_fails_before_it_is_timed(project: pytest.Pytester) -> None:
    """A gating run fails the case of a bad entry without timing it (its figure could not be judged);
    a recording run times and records it."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    with kit.editing_baseline(project) as data:
        data["entries"]["test_cases.py::test_case[b]"]["median_ms"] = -1
    (project.path / "plan.json").unlink()
    result = project.runpytest(*PLUGIN, "test_cases.py::test_case[b]")
    result.assert_outcomes(failed=1)
    assert "Record the case again with --update-baselines, or fix the entry." in result.stdout.str()
    assert not (project.path / "plan.json").exists()  # the scripted timer writes it when it is called
    project.runpytest(*PLUGIN, "test_cases.py::test_case[b]", "--update-baselines").assert_outcomes(passed=1)
    assert (project.path / "plan.json").exists()
    assert kit.entries(project)["test_cases.py::test_case[b]"]["median_ms"] > 0


def test_a_file_that_is_not_yaml_is_named_at_start_up_and_fails_each_case(project: pytest.Pytester) -> None:
    """Binary junk in place of the file: named before any case, every measured case fails with
    the cause, and an update leaves the file as it was."""
    folder = project.path / "baselines"
    folder.mkdir()
    junk = BAD_FILES["binary"]
    (folder / "h200.yaml").write_bytes(junk)
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    result = project.runpytest(*PLUGIN, "-v")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert out.index("every measured case fails; --update-baselines will not overwrite it") < out.index(
        "test_cases.py::test_case[a]")
    failures = out[:out.index("short test summary info")]  # the summary repeats as much as the terminal's width allows
    assert failures.count("Nothing was written; fix or remove the file.") == 2  # each case fails with the cause
    assert not (project.path / "plan.json").exists()  # failed before the timer was called: no time spent timing
    result = project.runpytest(*PLUGIN, "--update-baselines")
    result.assert_outcomes(failed=2)
    assert result.ret != 0
    assert (folder / "h200.yaml").read_bytes() == junk


def test_the_file_is_read_once_a_run(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run parses the file once, at start-up: an update finding the same bytes under the lock
    merges into what it read then."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    parsed: list[int] = []
    real = baselines._parse

    def counting(text: str) -> Any:
        parsed.append(len(text))
        return real(text)

    monkeypatch.setattr(baselines, "_parse", counting)
    project.runpytest(*PLUGIN).assert_outcomes(passed=2)
    assert len(parsed) == 1
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    assert len(parsed) == 2


def no_space(real: Any, folder: Path) -> Any:
    """``save`` failing with ENOSPC for files in ``folder``, as a full disk does."""
    def save(path: Path, baseline: BaselineFile) -> None:
        if path.parent == folder:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, baseline)
    return save


def assert_saved_aside(project: pytest.Pytester, result: pytest.RunResult, cause: str) -> Path:
    """The run failed with one summary line naming ``cause`` and a file holding both entries."""
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "Traceback" not in out
    assert "INTERNALERROR" not in out
    lines = [line for line in out.splitlines() if line.startswith("baselines: ERROR, NOT written:")]
    assert len(lines) == 1, out[-2000:]
    assert cause in lines[0], out[-2000:]
    aside = Path(lines[0].split("measured entries are in ")[1].split(";")[0])
    assert aside.parent == Path(tempfile.gettempdir())
    assert aside.name.startswith("attnperf-h200-unsaved-")
    saved = load(aside)
    assert saved is not None
    assert set(saved.entries) == CASES
    return aside


def test_a_full_disk_fails_the_run_with_one_line_and_saves_the_entries_aside(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while writing: exit status 1, one summary line naming the cause and the file the
    entries went to; merging that file later restores them."""
    folder = project.path / "baselines"
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    old = (folder / "h200.yaml").read_bytes()
    monkeypatch.setattr(baselines, "save", no_space(baselines.save, folder))
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    result = project.runpytest(*PLUGIN, "--update-baselines")
    result.assert_outcomes(passed=2)
    aside = assert_saved_aside(project, result, "No space left on device")
    assert (folder / "h200.yaml").read_bytes() == old
    assert temporaries(folder / "h200.yaml") == []
    monkeypatch.undo()
    fresh = folder / "other.yaml"
    assert baselines.main(["merge", str(aside), str(fresh)]) == 0
    check_kept(fresh, CASES)


FULL_DISK = """
import errno
import json
import os

from pytest_attnperf.store import baselines, journal


def save(path, baseline):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


baselines.save = save  # every folder full: the baseline file's and the temporary one
"""

KILLED = """
import os
import signal


def test_zz_the_process_dies():
    os.kill(os.getpid(), signal.SIGKILL)  # no session end: nothing written the usual way
"""


def test_a_killed_recording_leaves_a_journal_a_gating_run_names_and_the_next_update_merges(
        project: pytest.Pytester) -> None:
    """SIGKILL after two measured cases: the baseline file was never written, the journal holds
    both entries; a gating run names it at start-up and leaves it; the next update merges it."""
    folder = project.path / "baselines"
    project.makepyfile(test_zz_killed=KILLED)
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    killed = project.runpytest_subprocess("--update-baselines")
    assert killed.ret == -signal.SIGKILL
    assert not (folder / "h200.yaml").exists()
    journals = list(folder.glob(".h200.recording-*.jsonl"))
    assert len(journals) == 1
    assert len(journals[0].read_text().splitlines()) == 2
    (project.path / "test_zz_killed.py").unlink()
    gate = project.runpytest(*PLUGIN)
    gate.assert_outcomes(passed=2)
    gate.stdout.fnmatch_lines(["attnperf: 1 recording journal with 2 measured entries, left by runs that ended "
                               "before writing them: *.jsonl; the next --update-baselines for h200 on this host "
                               "merges them"])
    assert journals[0].exists()
    again = project.runpytest(*PLUGIN, "--update-baselines", "test_cases.py::test_case[b]")
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["baselines: wrote 1 measured entries to *h200.yaml (0 other entries kept); with "
                                "them 1 entries that 1 recording ended before writing had left in its journal"])
    assert not journals[0].exists()
    assert not list(folder.glob(".h200.recording-*"))
    check_kept(folder / "h200.yaml", CASES)


def test_a_full_disk_everywhere_keeps_the_entries_in_the_journal_for_the_next_update(
        project: pytest.Pytester) -> None:
    """When the temporary folder cannot take them either, the line says so (and the run fails);
    the recording's journal still holds them, and the next update merges it and removes it."""
    folder = project.path / "baselines"
    project.makepyfile(full_disk=FULL_DISK)
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 2
    result = project.runpytest_subprocess("--update-baselines", "-p", "full_disk")  # its own process, gone after
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["baselines: ERROR, NOT written: cannot write *No space left on device*"
                                 "saving them aside failed too*: the 2 measured entries stay in the journal *"
                                 ".h200.recording-*.jsonl, which the next --update-baselines for h200 merges"])
    journals = list(folder.glob(".h200.recording-*.jsonl"))
    assert len(journals) == 1
    assert not (folder / "h200.yaml").exists()
    (project.path / "full_disk.py").unlink()
    again = project.runpytest(*PLUGIN, "--update-baselines", "test_cases.py::test_case[a]")
    again.assert_outcomes(passed=1)
    again.stdout.fnmatch_lines(["baselines: wrote 1 measured entries to *h200.yaml (0 other entries kept); with "
                                "them 1 entries that 1 recording ended before writing had left in its journal"])
    assert not journals[0].exists()
    check_kept(folder / "h200.yaml", CASES)
    COUNTS["double faults kept in the journal"] += 1


def test_a_lock_timeout_fails_the_run_and_saves_the_entries_aside(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another update holding the lock past the timeout: the entries are saved aside."""
    monkeypatch.setattr(baselines, "LOCK_TIMEOUT_S", 0.2)
    path = project.path / "baselines" / "h200.yaml"
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    with baselines.locked(path):
        result = project.runpytest(*PLUGIN, "--update-baselines")
    result.assert_outcomes(passed=2)
    assert_saved_aside(project, result, "for more than 0.2 s")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder; the ENOSPC tests inject it")
def test_a_read_only_folder_fails_the_run_and_saves_the_entries_aside(project: pytest.Pytester) -> None:
    """A folder the user cannot write to (chmod 555): the same one line and the entries aside."""
    folder = project.path / "baselines"
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    old = (folder / "h200.yaml").read_bytes()
    folder.chmod(0o555)
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    try:
        result = project.runpytest(*PLUGIN, "--update-baselines")
    finally:
        folder.chmod(0o755)
    result.assert_outcomes(passed=2)
    assert_saved_aside(project, result, "Permission denied")
    assert (folder / "h200.yaml").read_bytes() == old


def dead_journal(project: pytest.Pytester, run: str, entries: dict[str, dict[str, Any]]) -> Path:
    """A journal as a recording that died left it, named with ``run`` (``<pid>-<token>`` or a bare pid)."""
    path = project.path / "baselines" / f".h200.recording-{journal._host()}-{run}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"key": k, "entry": e}) + "\n" for k, e in entries.items()))
    return path


@pytest.mark.parametrize("run", ["pid-other-token", "bare-pid"])
def test_a_dead_runs_journal_under_this_runs_pid_is_merged_not_deleted(project: pytest.Pytester, run: str) -> None:
    """A reused pid: the dead run's journal carries this process's pid (this run is in-process) but
    another token, or the bare pid of an older name; the update merges it, then removes it."""
    name = f"{os.getpid()}-0badc0de" if run == "pid-other-token" else str(os.getpid())
    path = dead_journal(project, name, {"elsewhere.py::test_x": entry(2.0)})
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    result = project.runpytest(*PLUGIN, "--update-baselines")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*with them 1 entries that 1 recording ended before writing had left in its journal*"])
    assert not path.exists()
    assert kit.entries(project)["elsewhere.py::test_x"]["median_ms"] == 2.0
    check_kept(kit.baseline_path(project), CASES | {"elsewhere.py::test_x"})


def test_a_dead_runs_journal_entries_are_checked_before_merging(project: pytest.Pytester) -> None:
    """A journal line whose interval switches the gate off (``ci_high_ms: 1e300``) or that is no
    entry does not replace the good entry of its case; the summary names each one left out."""
    project.runpytest(*PLUGIN, "--update-baselines").assert_outcomes(passed=2)
    good = kit.entries(project)["test_cases.py::test_case[a]"]
    dead_journal(project, "999999999-0badc0de", {"test_cases.py::test_case[a]": entry(1.0, ci_high_ms=1e300),
                                                 "elsewhere.py::test_y": {"median_ms": "x" * 5000},
                                                 "elsewhere.py::test_x": entry(2.0)})
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 2
    result = project.runpytest(*PLUGIN, "--update-baselines", "test_cases.py::test_case[b]")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*with them 1 entries that 1 recording*left out 2 journal entries that are no "
                                 "usable baseline entry (elsewhere.py::test_y: TypeError*; "
                                 "test_cases.py::test_case[[]a[]]: *ci_high_ms*"])
    assert len(result.stdout.str()) < 20_000  # the 5000-character value is quoted cut short
    after = kit.entries(project)
    assert after["test_cases.py::test_case[a]"] == good
    assert "elsewhere.py::test_y" not in after
    check_kept(kit.baseline_path(project), CASES | {"elsewhere.py::test_x"})


def test_a_file_collected_twice_is_refused_before_anything_is_measured(project: pytest.Pytester) -> None:
    """``--keep-duplicates`` with a file given twice: one node id would be measured twice and the
    last entry would replace the other's; the run refuses it and writes nothing."""
    COUNTS["inputs"] += 1
    COUNTS["faults"] += 1
    result = project.runpytest(*PLUGIN, "--update-baselines", "--keep-duplicates", "test_cases.py", "test_cases.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*attnperf: 2 tests collected twice under one node id "
                                 "(test_cases.py::test_case[[]a[]], test_cases.py::test_case[[]b[]]); each measured "
                                 "case needs its own baseline key*"])
    assert not kit.baseline_path(project).exists()


def test_a_dead_runs_marker_under_this_processs_pid_is_named_and_this_runs_own_is_not(tmp_path: Path) -> None:
    """Run markers are named by pid and token too: a marker with this pid and another token is a
    dead run's (named once, then removed); this run's own marker is not."""
    dead = tmp_path / f"{journal._host()}-{os.getpid()}-0badc0de.json"
    dead.write_text(json.dumps({"pid": os.getpid(), "case": "test_x.py::test_y"}))
    own = journal.RunMarker(tmp_path, ["pytest"])
    own.write("test_a.py::test_b")
    assert own.path != dead
    assert [r["case"] for r in own.dead_runs()] == ["test_x.py::test_y"]
    assert not dead.exists()
    assert own.path.exists()
    assert own.dead_runs() == []
