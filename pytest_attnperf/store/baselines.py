"""Per-hardware baseline files: ``<folder>/<hw>.yaml`` (a header, then the entries by node id).

A file that cannot be read is never overwritten (``load`` raises ``BaselineError``); it is read
strictly (``yamlstrict``); an entry that fails validation is, with ``keep_unusable``, set aside in
``unusable``: its case fails and the entry is written back as it was. ``save`` writes a temporary
file and renames it over the old one; ``update`` reloads, merges and saves under an exclusive
lock (``locked``). docs/gate.md, "The baseline store".
"""

from __future__ import annotations

import argparse
import errno
import gc
import hashlib
import math
import os
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pytest_attnperf.measure.inventory import kernels_problem
from pytest_attnperf.measure.summary import OLD_OVERHEADS_KEY, OVERHEADS_KEY, Summary
from pytest_attnperf.store.yamlstrict import QUOTE_CHARS, StrictLoader, StrictYAMLError, UnaliasedDumper, cut

try:
    import fcntl
except ImportError:  # not on POSIX: updates are not locked (see ``locked``)
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "FORMAT", "IGNORED", "INTERVAL_RATIO_MAX", "LOCK_TIMEOUT_S", "MAX_FILE_BYTES", "MODES", "BaselineError",
    "ENTRY_KEYS", "BaselineFile", "LockTimeout", "Unusable", "read_regular",
    "ignore_transients", "interval_problem", "load", "lock_path",
    "locked", "merge", "remove_stale_temporaries", "rounded", "save", "save_unsaved", "temporaries", "update",
    "write_atomic",
]

FORMAT = 1
LOCK_TIMEOUT_S = 120.0  # an update waits this long for another run's update of the same file
INTERVAL_RATIO_MAX = 100.0  # an entry whose ci_high_ms / ci_low_ms is above this is unusable
MAX_FILE_BYTES = 2**30  # a baseline or history file larger is refused before it is read (10,000 entries: about 5 MB)
MODES = ("cold", "hot", "host")  # an entry's ``mode``: another (an edit) would leave its case "not compared", ungated
_KNOWN_KEYS = ("format", "meta", "entries")
# the keys this version writes in an entry (``fixture._entry``); a re-recorded entry keeps any other
# key its old entry had (another version's, or a hand-written one), and the write says so
ENTRY_KEYS = frozenset({
    "median_ms", "ci_low_ms", "ci_high_ms", "stdrel", "n_samples", "tflops", "gb_per_s", "clock", "mode", "backend",
    "hot_sample_ms", "peak_mib", "eager_ms", "kernels", "kernels_source", "notes", "run_medians_ms",
    "run_machines", "run_overheads_ms",
})

# libyaml's loader and dumper when PyYAML was built with it (about twice as fast on a large file),
# the loader refusing duplicate keys and aliases, the dumper writing no alias (yamlstrict)
_LOADER: type = StrictLoader
_DUMPER: type = UnaliasedDumper


class BaselineError(Exception):
    """A baseline file that cannot be used; the message names the file and the cause."""


class LockTimeout(BaselineError):
    """Another process held the baseline file's lock for longer than the timeout."""


@dataclass(frozen=True)
class Unusable:
    """An entry that failed validation: written back as it was (``raw``), its case failing with
    ``problem`` (the file, the entry and ``cause``) until ``--update-baselines`` measures it again."""

    raw: Any
    cause: str
    problem: str


@dataclass
class BaselineFile:
    """A baseline file read: its meta, its valid entries by case and the entries that failed
    validation."""

    meta: dict[str, Any] = field(default_factory=dict)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    unusable: dict[str, Unusable] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # top-level keys besides format, meta and entries: kept
    carried: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)  # re-recorded: old keys kept
    digest: str | None = field(default=None, compare=False)  # sha256 of the bytes it was loaded from
    _summaries: dict[str, Summary] = field(default_factory=dict, init=False, repr=False, compare=False)

    def summary(self, key: str) -> Summary | None:
        """The entry read as a Summary (once; kept for later calls), None for an unknown key."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        summary = self._summaries.get(key)
        if summary is None:
            summary = self._summaries[key] = Summary.from_mapping(entry)
        return summary


def rounded(value: Any, digits: int = 5) -> Any:
    """Floats (also in a list) to ``digits`` significant digits; other values unchanged."""
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value != 0.0:
        return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))
    return value


def interval_problem(entry: Mapping[str, Any]) -> str | None:
    """Why the entry's interval cannot be its median's, None when it can (or a field is missing
    or not a number: ``Summary.from_mapping`` names those): each time positive and finite,
    ``ci_low_ms <= median_ms <= ci_high_ms``, and ``ci_high_ms / ci_low_ms`` at most
    ``INTERVAL_RATIO_MAX``. A hand edit that swaps the bounds or drops a digit would otherwise
    pass the gate, or widen its noise bar without limit."""
    fields = ("median_ms", "ci_low_ms", "ci_high_ms")
    raw = [entry.get(name) for name in fields]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
        return None
    values = [float(v) for v in raw if isinstance(v, (int, float))]
    for name, value in zip(fields, values, strict=True):
        if not (math.isfinite(value) and value > 0):
            return f"ValueError: '{name}' is {value!r}; a time must be positive and finite"
    median, low, high = values
    if not low <= median <= high:
        return (f"ValueError: the interval 'ci_low_ms' {low!r} .. 'ci_high_ms' {high!r} does not hold "
                f"'median_ms' {median!r}")
    if high / low > INTERVAL_RATIO_MAX:
        return (f"ValueError: the interval 'ci_low_ms' {low!r} .. 'ci_high_ms' {high!r} spans "
                f"{high / low:.3g} times; more than {INTERVAL_RATIO_MAX:g} is not a measurement's")
    return None


def entry_problem(entry: Any) -> str | None:
    """Why ``entry`` cannot be gated against, None when it can."""
    if not isinstance(entry, dict):
        return f"not a mapping but {type(entry).__name__} {entry!r:.60}"
    problem = interval_problem(entry)
    if problem is not None:
        return problem
    if "mode" in entry and entry["mode"] not in MODES:
        return (f"ValueError: 'mode' is {entry['mode']!r}, not one of {', '.join(MODES)}: an entry of another mode is "
                "never compared, so its case would go ungated")
    if "kernels" in entry:  # an inventory (measure/inventory.py); entries recorded before have none
        problem = kernels_problem(entry["kernels"])
        if problem is not None:
            return f"ValueError: {problem}"
    try:
        Summary.from_mapping(entry)
    except (KeyError, TypeError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@contextmanager
def _collector_off() -> Iterator[None]:
    """The cyclic garbage collector off for the block: reading or writing a 50 MB file makes
    millions of objects, none of them garbage, and each collection would walk all made so far
    (half the time of a load)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _parse(text: str) -> Any:
    """The YAML document in ``text``."""
    with _collector_off():
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader (yamlstrict.StrictLoader)


def read_regular(path: Path, what: str = "baseline file") -> bytes | None:
    """The bytes of the regular file at ``path``, None when there is none (a link to nothing
    included); ``BaselineError`` naming ``what``, the path and the cause for what cannot be read
    as one without hanging or filling memory: a FIFO or socket (opened without blocking), a device
    (``/dev/zero`` never ends), a folder, a link loop, a file over ``MAX_FILE_BYTES``."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise BaselineError(f"{what} {path} is a symbolic link loop (it leads back to itself): replace it with "
                                "the file or a link to one") from None
        raise BaselineError(f"{what} {path} cannot be read: {exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
                else "a block device" if stat.S_ISBLK(mode) else "a folder" if stat.S_ISDIR(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise BaselineError(f"{what} {path} is {kind}, not a regular file: it was not read (reading it could "
                            "hang or never end), and nothing is written over it")
    with os.fdopen(fd, "rb") as handle:
        raw = handle.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise BaselineError(f"{what} {path} is larger than {MAX_FILE_BYTES / 2**20:.0f} MiB: not read")
    return raw


def load(path: Path, *, keep_unusable: bool = False) -> BaselineFile | None:
    """The file's contents, None when it does not exist; ``BaselineError`` when unusable.

    An entry that fails validation raises too, naming it, unless ``keep_unusable``: then it is
    set aside in ``unusable`` with its cause, and the others load. Top-level keys besides
    ``format``, ``meta`` and ``entries`` are kept (``extra``) and written back."""
    raw = read_regular(path)
    if raw is None:
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BaselineError(f"baseline file {path} cannot be read: {exc}") from None
    if not text.strip():
        raise BaselineError(f"baseline file {path} is empty; remove it or restore it from version control")
    try:
        data = _parse(text)
    except StrictYAMLError as exc:
        raise BaselineError(
            f"baseline file {path}, line {exc.line}: {exc.what}; the file was not used and nothing was written"
        ) from None
    except yaml.YAMLError as exc:
        raise BaselineError(f"baseline file {path} is not valid YAML: {cut(str(exc), 2 * QUOTE_CHARS)}") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise BaselineError(f"baseline file {path} holds a number it cannot read: {cut(str(exc))}") from None
    except RecursionError:
        raise BaselineError(f"baseline file {path} is nested too deeply to read") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BaselineError(
            f"baseline file {path} is not an attnperf baseline (expected a mapping with "
            f"'format: {FORMAT}', 'meta' and 'entries')"
        )
    meta, entries = data.get("meta") or {}, data.get("entries") or {}
    if not isinstance(meta, dict) or not isinstance(entries, dict):
        raise BaselineError(f"baseline file {path}: 'meta' and 'entries' must be mappings")
    extra = {str(key): value for key, value in data.items() if key not in _KNOWN_KEYS}
    loaded = BaselineFile(meta=meta, digest=hashlib.sha256(raw).hexdigest(), extra=extra)
    for key, entry in entries.items():
        entry = _renamed(entry)
        problem = entry_problem(entry)
        if problem is None:
            loaded.entries[str(key)] = entry
            continue
        where = f"baseline file {path}, entry '{cut(str(key))}': {cut(problem, 2 * QUOTE_CHARS)}"
        if not keep_unusable:
            raise BaselineError(where)
        loaded.unusable[str(key)] = Unusable(entry, problem, where)
    return loaded


def _renamed(entry: Any) -> Any:
    """An entry as this version writes it: the sample overheads of a file written before their key
    was settled (``run_floors_ms``) under ``run_overheads_ms``, so a save writes the new key only."""
    if isinstance(entry, dict) and OLD_OVERHEADS_KEY in entry and OVERHEADS_KEY not in entry:
        return {(OVERHEADS_KEY if k == OLD_OVERHEADS_KEY else k): v for k, v in entry.items()}
    return entry


def merge(
    existing: BaselineFile | None, measured: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any]
) -> BaselineFile:
    """Existing entries, with those in ``measured`` replaced or added; ``meta`` updated.

    Unusable entries are kept as they were, except those measured now; a measured entry keeps the
    keys of its old entry that this version does not write (``ENTRY_KEYS``), named in ``carried``.
    ``existing`` is not changed; its entries are shared, not copied (no one changes an entry in
    place)."""
    merged = BaselineFile(
        meta={**(existing.meta if existing else {}), **meta},
        entries=dict(existing.entries) if existing else {},
        unusable={k: v for k, v in existing.unusable.items() if k not in measured} if existing else {},
        extra=dict(existing.extra) if existing else {},
    )
    for key, entry in measured.items():
        merged.entries[key] = {k: rounded(v) for k, v in entry.items()}
        old = _old_entry(existing, key)
        if kept := {k: v for k, v in old.items() if k not in ENTRY_KEYS and k not in entry}:
            merged.entries[key].update(kept)
            merged.carried[key] = tuple(sorted(map(str, kept)))
    return merged


def _old_entry(existing: BaselineFile | None, key: str) -> dict[str, Any]:
    """The entry ``key`` had in ``existing`` (usable or not) as a mapping, else empty."""
    if existing is None:
        return {}
    old = existing.entries.get(key) if key in existing.entries else getattr(existing.unusable.get(key), "raw", None)
    return old if isinstance(old, dict) else {}


def _file_mode(path: Path) -> int:
    """The old file's permissions, or what the umask gives a new file (mkstemp makes 0600)."""
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def save(path: Path, baseline: BaselineFile) -> None:
    """Write atomically: temporary file in the same folder, fsync, rename. Unusable entries are
    written back as they were. Not locked: ``update`` is the read-merge-write that is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = {**{k: u.raw for k, u in baseline.unusable.items()}, **baseline.entries}
    with _collector_off():
        text = (_dumped({"format": FORMAT, "meta": baseline.meta}) + (_dumped(baseline.extra) if baseline.extra else "")
                + _dumped({"entries": entries}))
    write_atomic(path, text)


def _dumped(data: Mapping[str, Any]) -> str:
    """``data`` as YAML with its keys sorted at every level. ``save`` dumps the header and the
    entries apart so the header (format, meta) comes first, where a reader looks for it; ``load``
    reads the keys in any order, so files written with ``entries`` first still load."""
    text: str = yaml.dump(dict(data), Dumper=_DUMPER, sort_keys=True, default_flow_style=False, width=120)
    return text


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file in the same folder, fsync and rename, so a
    reader sees the old file or the new one, never half of one; the old file's permissions kept.
    A symlink is followed (``resolve``): the file it names is replaced, and the link stays."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# -- updates: the lock, left-over temporaries, the fallback file ----------------------------


def lock_path(path: Path) -> Path:
    """The lock file beside ``path``: ``<folder>/.<hw>.yaml.lock`` (left in place: removing it
    would let a waiting process lock a file that a newcomer no longer sees)."""
    return path.with_name(f".{path.name}.lock")


IGNORED = (".*.lock", ".*.tmp", ".*.recording-*.jsonl")  # lock_path, temporaries, journal.Journal
IGNORE_TEXT = ("# pytest-attnperf's lock, interrupted writes' temporary files and recording journals:\n"
               "# they belong to one machine's runs, not to the baselines\n" + "".join(f"{p}\n" for p in IGNORED))


def ignore_transients(folder: Path) -> Path | None:
    """Write ``<folder>/.gitignore`` naming the store's own files (the lock, which stays, and what
    a killed run leaves: temporaries, journals), so committing the baselines folder commits only
    baselines. Only where the folder has no ``.gitignore`` (one there is the user's); returns the
    file written, None when none was (one exists, or it cannot be written: the baselines are
    written, and that is what matters)."""
    ignore = folder / ".gitignore"
    try:
        with open(ignore, "x", encoding="utf-8") as handle:
            handle.write(IGNORE_TEXT)
    except OSError:
        return None
    return ignore


def temporaries(path: Path) -> list[Path]:
    """``save``'s temporary files of ``path`` in its folder (``.<hw>.yaml.<random>.tmp``)."""
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except OSError:
        return []
    return sorted(path.parent / n for n in names if n.startswith(prefix) and n.endswith(".tmp"))


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporaries of ``path`` that a killed writer left; call under ``locked``,
    where no other writer can be half-way (every writer holds the lock while it writes one)."""
    removed = []
    for tmp in temporaries(path):
        try:
            tmp.unlink()
        except FileNotFoundError:
            continue
        removed.append(tmp)
    return removed


def _holder(lock: Path) -> str:
    try:
        pid = lock.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (process {pid})" if pid.isdigit() else ""


@contextmanager
def locked(path: Path, timeout_s: float | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path(path)`` for the block.

    Two runs ending together each read the file, merge their entries and rename a new file over
    it; without the lock the later rename drops the entries of the earlier one. The lock is on a
    sibling file, not the baseline itself, because ``save`` replaces the baseline's inode: a lock
    on the old one would not be seen by a process opening the new one. The kernel releases it
    when the holder dies, so a killed run never blocks the next. Waits up to ``timeout_s``
    (``LOCK_TIMEOUT_S`` by default), then raises ``LockTimeout``; an ``OSError`` (unwritable
    folder) passes through. Without ``fcntl`` (not POSIX) nothing is locked."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fcntl is None:
        yield
        return
    lock, timeout_s = lock_path(path), LOCK_TIMEOUT_S if timeout_s is None else timeout_s
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"baseline file {path}: another update held {lock}{_holder(lock)} for more than "
                        f"{timeout_s:g} s"
                    ) from None
                time.sleep(0.02)
        try:  # who holds it, for the message of a process that times out waiting
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError:
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


def update(
    path: Path, measured: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any],
    timeout_s: float | None = None, known: BaselineFile | None = None,
) -> tuple[BaselineFile, list[Path]]:
    """Merge ``measured`` into the file at ``path`` under its lock: remove stale temporaries,
    reload (another run may have written since this one read it; ``known``, the file as this run
    read it, is used instead when the bytes are still the same), merge, save. Returns the merged
    file and the temporaries removed. ``BaselineError`` (unreadable file: nothing is written;
    ``LockTimeout``) and ``OSError`` (cannot write) pass through. A symlinked ``path`` is
    resolved first, so the lock, the temporaries and the rename are those of the file it names,
    and two links to one file share one lock."""
    path = path.resolve()
    with locked(path, timeout_s):
        removed = remove_stale_temporaries(path)
        if known is None or known.digest is None or known.digest != _digest(path):
            known = load(path, keep_unusable=True)
        merged = merge(known, measured, meta)
        save(path, merged)
    return merged, removed


def _digest(path: Path) -> str | None:
    """sha256 of the file's bytes, None when it cannot be read."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def save_unsaved(hw: str, measured: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any],
                 folder: Path | None = None) -> Path:
    """Write ``measured`` as a baseline file of its own, ``attnperf-<hw>-unsaved-<time>-<pid>.yaml``
    in ``folder`` (the system's temporary folder by default), for an update that could not write
    the real one; ``attnperf-baselines merge`` merges it in later."""
    folder = Path(tempfile.gettempdir()) if folder is None else folder
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = folder / f"attnperf-{hw}-unsaved-{stamp}-{os.getpid()}.yaml"
    save(path, merge(None, measured, meta))
    return path


# -- command line: merge a saved-aside file -------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``attnperf-baselines merge FROM INTO``: merge the entries of FROM (a file
    an update could not write, saved aside) into INTO, under INTO's lock."""
    parser = argparse.ArgumentParser(prog="attnperf-baselines")
    commands = parser.add_subparsers(dest="command", required=True)
    merging = commands.add_parser("merge", help="merge FROM's entries into INTO (FROM's replace INTO's)")
    merging.add_argument("source", type=Path, metavar="FROM")
    merging.add_argument("target", type=Path, metavar="INTO")
    merging.add_argument("--since", type=Path, metavar="BASE",
                         help="merge only FROM's entries that differ from BASE's (FROM: a copy of BASE that a run "
                              "on another host updated)")
    args = parser.parse_args(argv)
    try:
        source = load(args.source)
        if source is None:
            raise BaselineError(f"baseline file {args.source} does not exist")
        entries = source.entries
        if args.since is not None:
            base = load(args.since)
            if base is None:
                raise BaselineError(f"baseline file {args.since} (--since) does not exist")
            before = base.entries
            entries = {key: entry for key, entry in entries.items() if before.get(key) != entry}
        merged, _ = update(args.target, entries, source.meta)
    except (BaselineError, OSError) as exc:
        print(f"not merged: {exc}", file=sys.stderr)
        return 1
    print(f"merged {len(entries)} entries from {args.source} into {args.target} "
          f"({len(merged.entries) + len(merged.unusable)} in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
