"""The hardware's baseline file over one run: read once, its problems named at start-up, each
measured entry journaled as its case ends, all of them merged into the file at the end (or saved
aside, never lost), and the summary's lines about what was gated and written.

Plain files and plain values in and out: the plugin gives it the settings, the hardware's name
and the environment header when asked, and writes its lines (docs/gate.md, "What the summary
says of the file" and "The baseline store").
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

from pytest_attnperf.options import Settings
from pytest_attnperf.store import baselines as store
from pytest_attnperf.store import envinfo, tally
from pytest_attnperf.store import journal as journals
from pytest_attnperf.store.yamlstrict import cut

__all__ = ["FREEZE_ENTRIES", "STARTUP_LISTED", "BaselineKeeper"]

FREEZE_ENTRIES = 10_000  # a baseline this large (about 5 MB) is frozen out of the collector once read
STARTUP_LISTED = 20  # unusable entries named at start-up, the rest counted


@dataclass
class BaselineKeeper:
    """One run's hold on ``<baselines dir>/<hardware>.yaml``. ``hardware`` and ``environment``
    are asked for on first need (the device lookup behind them may fail: its cases say so), and
    so is ``parallel``, true under pytest-xdist, where entries travel to the controller instead of
    a journal."""

    settings: Settings
    hardware: Callable[[], str]
    environment: Callable[[], dict[str, str | None]]
    parallel: Callable[[], bool] = lambda: False
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    journal_refused: dict[str, str] = field(default_factory=dict)  # dead runs' journal entries left out, their problem
    write_note: str | None = None
    record_note: str | None = None  # what a recording did with each entry's history (store.tally)
    ignore_note: str | None = None  # the .gitignore a recording wrote into the baselines folder
    failed: bool = False  # the entries could not be written: the run's exit status is a failure

    @property
    def path(self) -> Path:
        """``<baselines dir>/<hw>.yaml``."""
        return self.settings.baselines_dir / f"{self.hardware()}.yaml"

    @cached_property
    def file(self) -> store.BaselineFile | None:
        """The hardware's baseline file (None if absent), read once a run; raises
        ``BaselineError`` if unusable as a whole, and sets bad entries aside (``unusable``)."""
        loaded = store.load(self.path, keep_unusable=True)
        if loaded is not None and len(loaded.entries) >= FREEZE_ENTRIES:
            # keep the collector from walking the file's millions of objects in later collections,
            # which would land as pauses in timed calls
            gc.collect()
            gc.freeze()
        return loaded

    @cached_property
    def journal(self) -> journals.Journal | None:
        """The journal of this recording (``store.journal``); None unless recording, and under
        pytest-xdist (its workers send each entry to the controller as their case ends, and one
        journal cannot hold the entries of workers on different cards)."""
        if not self.settings.update_baselines or self.parallel():
            return None
        try:
            return journals.Journal(self.settings.baselines_dir, self.hardware())
        except Exception:  # noqa: BLE001 - no hardware to name it by: the run's end reports that anyway
            return None

    def commit(self, key: str, entry: dict[str, Any]) -> None:
        """A measured case's entry, to be written at the run's end; journaled at once."""
        self.pending[key] = entry
        if self.journal is not None:
            self.journal.add(key, entry)

    def drift(self) -> list[str]:
        """``'<name> <baseline's> -> <now>'`` for each compared version that moved since the baseline;
        empty without a usable baseline."""
        try:
            baseline = self.file
        except store.BaselineError:
            return []
        return envinfo.drift(baseline.meta, self.environment()) if baseline else []

    # -- start-up ----------------------------------------------------------------------------
    def startup_lines(self) -> list[str]:
        """Before anything is measured: the file's problems (a file that cannot be used, each
        unusable entry), a missing folder, and journals dead recordings left. Their cases fail
        when measured; the others are gated."""
        missing = self._check_folder()
        try:
            baseline = self.file
        except store.BaselineError as exc:
            lines = [f"attnperf: {exc}", "  every measured case fails; --update-baselines will not overwrite it"]
        else:
            bad = baseline.unusable if baseline else {}
            lines = [f"attnperf: {self.path}: {len(bad)} unusable entr{'y' if len(bad) == 1 else 'ies'}; each one's "
                     "case fails until --update-baselines records it again:"] if bad else []
            shown = sorted(bad)[:STARTUP_LISTED]
            lines += [f"  {key}: {bad[key].cause}" for key in shown]
            if len(bad) > len(shown):
                lines.append(f"  ... and {len(bad) - len(shown)} more")
        lines += [missing] if missing else []
        if not self.settings.update_baselines:
            left, entries = self._left_behind()
            if left:
                lines.append(f"attnperf: {len(left)} recording journal{'s' if len(left) > 1 else ''} with "
                             f"{len(entries)} measured entries, left by runs that ended before writing them: "
                             f"{', '.join(str(p) for p in left)}; the next --update-baselines for "
                             f"{self.hardware()} on this host merges them")
        return lines

    def _check_folder(self) -> str | None:
        """A gating run whose baselines folder does not exist (a mistyped ``--attnperf-baselines``)
        gates nothing: every case would pass as new. Returns the warning, naming the resolved
        path (also issued as a ``PytestConfigWarning``); under ``--attnperf-require-baseline`` it
        is a usage error."""
        s = self.settings
        if s.update_baselines or s.check_only or s.pool_out is not None or s.baselines_dir.is_dir():
            return None
        text = (f"attnperf: no baselines folder at {s.baselines_dir} (--attnperf-baselines, ATTNPERF_BASELINES or "
                "the ini's attnperf_baselines, relative to the ini file's folder)")
        if s.require_baseline:
            raise pytest.UsageError(f"{text}; --attnperf-require-baseline needs its entries")
        text += ": every measured case is new and passes ungated; --update-baselines records them"
        warnings.warn(pytest.PytestConfigWarning(text), stacklevel=2)
        return text

    # -- the run's end -----------------------------------------------------------------------
    def gating_note(self, nodeids: Iterable[str]) -> str | None:
        """For the summary of a gating run that measured the cases ``nodeids``: the file it read,
        the entries its cases matched, the cases without one and the entries it did not run (None
        when recording, in a pool run, when nothing was measured, or when the file could not be
        read: its cases said so)."""
        s = self.settings
        measured = list(nodeids)
        if s.update_baselines or s.pool_out is not None or not measured:
            return None
        try:
            baseline = self.file
        except store.BaselineError:
            return None
        keys = [*baseline.entries, *baseline.unusable] if baseline is not None else []
        return tally.gating_line(self.path, tally.gated(measured, keys), exists=baseline is not None)

    def write(self, mixed: str | None = None) -> None:
        """Merge the passed, measured entries into the file, under its lock; never touch an
        unreadable file. When the file cannot be written (unreadable, locked too long, folder
        not writable, disk full, or ``mixed``: why a pytest-xdist fleet's entries cannot share
        one file) the measured entries go to a file of their own in the temporary folder,
        ``write_note`` names both and ``failed`` is set."""
        if not self.settings.update_baselines:
            return
        if mixed is not None:
            if self.pending:
                self._not_written(mixed)
            return
        left, recovered = self._left_behind()
        recovered = {k: v for k, v in recovered.items() if k not in self.pending}  # this run's own win
        if not self.pending and not recovered:
            return
        measured = {**recovered, **self.pending}
        path = self.path
        before = self._entries_read()  # as the run read it (a pytest-xdist controller reads it here), not as written
        try:
            merged, removed = store.update(path, measured, self.environment(), known=self.__dict__.get("file"))
        except store.LockTimeout as exc:
            self._not_written(f"{exc}", measured, left)
            return
        except store.BaselineError as exc:
            self._not_written(f"{exc}. The file was left as it was", measured, left)
            return
        except OSError as exc:
            self._not_written(f"cannot write {path}: {exc}", measured, left)
            return
        self._journals_done(left)
        self.record_note = tally.recording_line(path, tally.recorded(before, measured))
        ignored = store.ignore_transients(path.parent)
        if ignored is not None:
            self.ignore_note = f"wrote {ignored}, which keeps the store's lock and temporary files out of git"
        kept = len(merged.entries) + len(merged.unusable) - len(measured)
        unusable = f", {len(merged.unusable)} of them unusable and left as they were" if merged.unusable else ""
        stale = (f"; removed {len(removed)} temporary file{'s' if len(removed) > 1 else ''} an interrupted "
                 "write had left" if removed else "")
        many = len(left) > 1
        from_journals = (f"; with them {len(recovered)} entries that {len(left)} recording{'s' if many else ''} "
                         f"ended before writing had left in {'their' if many else 'its'} journal"
                         f"{'s' if many else ''}" if recovered else "")
        self.write_note = (
            f"wrote {len(self.pending)} measured entries to {path} ({kept} other entries kept{unusable}){from_journals}"
            f"{self._refused_note()}{stale}"
        )
        if merged.carried:
            names = sorted({name for keys in merged.carried.values() for name in keys})
            many = len(merged.carried) > 1
            self.write_note += (f"; {len(merged.carried)} re-recorded entr{'ies' if many else 'y'} kept "
                                f"key{'s' if len(names) > 1 else ''} this version does not write: {', '.join(names)}")
        if self.journal is not None and self.journal.problem is not None:
            self.write_note += f"; {self.journal.problem}"

    # -- journals ----------------------------------------------------------------------------
    def _left_behind(self) -> tuple[list[Path], dict[str, dict[str, Any]]]:
        """Journals that dead recordings on this host left for this hardware, and their entries
        that pass the check a baseline file's entries pass; the others are kept, with their
        problem, in ``journal_refused`` (a bad line must not replace a good entry)."""
        paths = journals.left_behind(self.settings.baselines_dir, self.hardware())
        entries: dict[str, dict[str, Any]] = {}
        readable = []
        for path in paths:
            try:
                entries.update(journals.read(path))
            except OSError:
                continue
            readable.append(path)
        problems = {key: store.entry_problem(entry) for key, entry in entries.items()}
        self.journal_refused = {key: problem for key, problem in problems.items() if problem is not None}
        return readable, {key: entry for key, entry in entries.items() if problems[key] is None}

    def _refused_note(self) -> str:
        """The journal entries left out of the merge, named with their problem (cut short)."""
        refused = self.journal_refused
        if not refused:
            return ""
        shown = [f"{cut(key)}: {cut(refused[key])}" for key in sorted(refused)[:3]]
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        return (f"; left out {len(refused)} journal entr{'y' if len(refused) == 1 else 'ies'} that "
                f"{'is' if len(refused) == 1 else 'are'} no usable baseline entry ({'; '.join(shown)}{more})")

    def _entries_read(self) -> dict[str, Any]:
        """The baseline file's entries as this run read them (unusable ones as they were); empty
        without a file or when it could not be read."""
        try:
            baseline = self.file
        except store.BaselineError:
            return {}
        if baseline is None:
            return {}
        return {**{key: u.raw for key, u in baseline.unusable.items()}, **baseline.entries}

    def _journals_done(self, left: list[Path]) -> None:
        """The entries are safe (written, or saved aside): this run's journal and those it merged go."""
        for path in left:
            path.unlink(missing_ok=True)
        if self.journal is not None:
            self.journal.remove()

    def _not_written(self, cause: str, measured: dict[str, Any] | None = None, left: list[Path] | None = None) -> None:
        """The one summary line of an update that could not write, with where its entries went."""
        measured = self.pending if measured is None else measured
        hardware = self.hardware()
        try:
            aside = store.save_unsaved(hardware, measured, self.environment())
        except OSError as exc:
            own = [self.journal.path] if self.journal is not None and self.journal.problem is None else []
            holders = [path for path in own + (left or []) if path.exists()]
            if holders and (own or not self.pending):
                kept = (f"saving them aside failed too ({exc}): the {len(measured)} measured entries stay in the "
                        f"journal{'s' if len(holders) > 1 else ''} {', '.join(str(p) for p in holders)}, which the "
                        f"next --update-baselines for {hardware} merges")
            else:
                kept = f"saving them aside failed too ({exc}): the {len(measured)} measured entries are lost"
        else:
            self._journals_done(left or [])
            kept = (f"the {len(measured)} measured entries are in {aside}; merge them with "
                    f"'attnperf-baselines merge {aside} {self.path}'")
        self.write_note = f"ERROR, NOT written: {cause}. {kept}"
        self.failed = True

