"""Whether the process's owner froze objects of its own (``plugins.guard.OwnerFreeze``): read from
``gc.get_freeze_count`` at each run until an owner's freeze is seen, then taken as lasting. A
counted stand-in for the count; no pytest run."""

from __future__ import annotations

import gc

import pytest

from pytest_attnperf.plugins import guard


def counted(monkeypatch: pytest.MonkeyPatch, counts: list[int]) -> list[int]:
    """``gc.get_freeze_count`` giving ``counts`` in turn; the list of those it gave."""
    given: list[int] = []

    def freeze_count() -> int:
        given.append(counts[len(given)])
        return given[-1]

    monkeypatch.setattr(gc, "get_freeze_count", freeze_count)
    monkeypatch.setattr(guard, "INTERPRETER_FROZEN", 0)
    monkeypatch.setattr(guard.OwnerFreeze, "froze", False)
    return given


def test_nothing_frozen_is_read_again_at_each_run(monkeypatch: pytest.MonkeyPatch) -> None:
    given = counted(monkeypatch, [0, 0, 0])
    assert [guard.OwnerFreeze.seen() for _ in range(3)] == [False, False, False]
    assert given == [0, 0, 0]


def test_an_owners_freeze_is_read_once_and_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    given = counted(monkeypatch, [0, 500_000, 0])
    assert [guard.OwnerFreeze.seen() for _ in range(3)] == [False, True, True]
    assert given == [0, 500_000]  # the walk of the permanent generation is not made again


def test_the_interpreters_own_frozen_objects_are_no_owners(monkeypatch: pytest.MonkeyPatch) -> None:
    given = counted(monkeypatch, [375, 376])
    monkeypatch.setattr(guard, "INTERPRETER_FROZEN", 375)  # CPython 3.12.1's at its start
    assert guard.OwnerFreeze.seen() is False
    assert guard.OwnerFreeze.seen() is True
    assert given == [375, 376]
