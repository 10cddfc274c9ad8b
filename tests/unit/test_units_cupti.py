"""CUPTI after the backend proof's profile: attnperf asks Kineto to detach it (``TEARDOWN_CUPTI=1``)
unless the user has chosen otherwise, and then every GPU case timed after a profile says so.
On the H200 an attached CUPTI slowed later launches (2026-11-29, see docs/evidence.md: do_bench_cudagraph up to
+12%, a graph of 1024 short calls +32%)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch.profiler
from kit import CPU, H200

from pytest_attnperf import markers
from pytest_attnperf.measure import profiled


class FakeProfile:
    """torch.profiler.profile without a profiler: records the activities and the environment
    Kineto would read when the profile stops."""

    seen: list[tuple[list[Any], str | None]] = []

    def __init__(self, activities: list[Any]) -> None:
        self.activities = activities

    def __enter__(self) -> FakeProfile:
        return self

    def __exit__(self, *exc: object) -> None:
        FakeProfile.seen.append((self.activities, os.environ.get(profiled.CUPTI_ENV)))

    def events(self) -> list[Any]:
        return []


@pytest.fixture
def fake_profiler(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[Any], str | None]]:
    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(profiled, "AT_STOP", {})
    monkeypatch.setenv(profiled.CUPTI_ENV, "x")  # so that monkeypatch restores what was there,
    monkeypatch.delenv(profiled.CUPTI_ENV)  # including the "1" profile_names sets
    monkeypatch.setattr("torch.cuda.synchronize", lambda: None)
    FakeProfile.seen = []
    return FakeProfile.seen


def test_a_gpu_profile_detaches_cupti_when_it_stops(fake_profiler: list[Any]) -> None:
    assert profiled.cupti_attached_note() is None  # nothing profiled yet
    markers.profile_names(lambda: None, H200)
    (activities, env_at_stop), = fake_profiler
    assert torch.profiler.ProfilerActivity.CUDA in activities
    assert env_at_stop == "1"
    assert profiled.cupti_attached_note() is None


def test_the_users_choice_is_kept_and_every_later_case_says_so(
        fake_profiler: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(profiled.CUPTI_ENV, "0")  # e.g. torch.compile's CUDA graphs need it attached
    assert profiled.cupti_attached_note() is None  # no profile yet: nothing attached
    markers.profile_names(lambda: None, H200)
    assert fake_profiler[0][1] == "0"
    note = profiled.cupti_attached_note()
    assert note is not None
    assert "TEARDOWN_CUPTI was '0'" in note
    assert "stayed attached" in note


def test_an_empty_setting_is_kept_and_noted(fake_profiler: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Kineto tears down only on exactly "1"; an empty value is the user's, and leaves CUPTI attached."""
    monkeypatch.setenv(profiled.CUPTI_ENV, "")
    markers.profile_names(lambda: None, H200)
    assert fake_profiler[0][1] == ""
    assert "TEARDOWN_CUPTI was ''" in (profiled.cupti_attached_note() or "")


def test_a_setting_changed_while_profiling_is_what_counts(fake_profiler: list[Any]) -> None:
    """torch.compile with CUDA graphs sets TEARDOWN_CUPTI=0 itself, possibly inside the profiled
    call: the note follows the value Kineto read when the profile stopped, and a later profile
    under "1" clears it."""
    markers.profile_names(lambda: os.environ.__setitem__(profiled.CUPTI_ENV, "0"), H200)
    assert fake_profiler[0][1] == "0"
    assert profiled.cupti_attached_note() is not None
    os.environ[profiled.CUPTI_ENV] = "1"
    markers.profile_names(lambda: None, H200)
    assert profiled.cupti_attached_note() is None


def test_a_cpu_profile_leaves_the_environment_alone(fake_profiler: list[Any]) -> None:
    markers.profile_names(lambda: None, CPU)
    (activities, env_at_stop), = fake_profiler
    assert activities == [torch.profiler.ProfilerActivity.CPU]
    assert env_at_stop is None
    assert profiled.CUPTI_ENV not in os.environ
    assert profiled.cupti_attached_note() is None
