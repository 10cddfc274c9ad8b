"""One GPU shared by check-only processes (``families.share``): which cases take it alone, the lock
each takes, the retry alone after running out of memory, and what a large case gives back."""

from __future__ import annotations

import fcntl
import tempfile
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from pytest_attnperf.families import share
from pytest_attnperf.families.linear.case import LinearCase
from pytest_attnperf.families.softmax.kernels import SoftmaxCase

GPU = SimpleNamespace(type="cuda", index=0)
TOTAL = 80 * 2**30


@pytest.fixture
def card(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """An 80 GiB card as far as ``run_shared`` asks, with its locks in a temporary folder."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=TOTAL))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))


def held(exclusive: bool) -> bool:
    """Whether another open file could take the card's lock now (shared or exclusively)."""
    with open(share._lock_path(GPU, "use"), "a") as other:
        try:
            fcntl.flock(other, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(other, fcntl.LOCK_UN)
        return False


def test_the_footprint_grows_with_the_scores_and_the_backward() -> None:
    small = SoftmaxCase("s", 1, 1, 64, 64, "bf16", True)
    wide = SoftmaxCase("w", 4200, 16, 64, 64, "bf16", False)
    assert share.footprint(small, "fwd") < share.footprint(wide, "fwd") < share.footprint(wide, "fwdbwd")
    assert share.footprint(wide, "fwd") > 8 * 2**30  # its fp64 scores alone: 4200 x 16 x 64 x 64 x 8 x 2 bytes
    linear = LinearCase("l", 2200, 32, 64, 64, 64, "bf16")
    assert share.footprint(linear, "fwdbwd") == 3 * share.footprint(linear, "fwd")


@pytest.mark.usefixtures("card")
def test_a_small_case_shares_the_card_and_a_large_one_takes_it_alone() -> None:
    seen = []
    share.run_shared(lambda: seen.append((held(exclusive=True), held(exclusive=False))), GPU, 2**20, 6)
    share.run_shared(lambda: seen.append((held(exclusive=True), held(exclusive=False))), GPU, TOTAL // 6, 6)
    assert seen == [(True, False), (True, True)]  # shared: others may share; alone: nobody may
    assert not held(exclusive=True)  # both released


@pytest.mark.usefixtures("card")
def test_a_shared_case_that_runs_out_of_memory_runs_again_alone() -> None:
    calls = []

    def check() -> str:
        calls.append(held(exclusive=False))
        if len(calls) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return "checked"

    assert share.run_shared(check, GPU, 2**20, 6) == "checked"
    assert calls == [False, True]  # the retry held the card alone


@pytest.mark.usefixtures("card")
def test_a_case_alone_that_runs_out_of_memory_fails_and_other_errors_are_not_retried() -> None:
    def out_of_memory() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.OutOfMemoryError):
        share.run_shared(out_of_memory, GPU, TOTAL, 6)
    calls = []

    def wrong() -> None:
        calls.append(1)
        raise AssertionError("a wrong answer")

    with pytest.raises(AssertionError):
        share.run_shared(wrong, GPU, 2**20, 6)
    assert calls == [1]


@pytest.mark.usefixtures("card")
def test_a_large_case_releases_what_its_process_kept_and_a_small_one_keeps_it() -> None:
    released = []
    share.run_shared(lambda: None, GPU, 2**20, 6, release=lambda: released.append("small"))
    share.run_shared(lambda: None, GPU, TOTAL // 40, 6, release=lambda: released.append("large"))
    assert released == ["large"]


def test_off_a_gpu_or_alone_the_check_just_runs() -> None:
    assert share.run_shared(lambda: 1, SimpleNamespace(type="cpu"), TOTAL, 6) == 1
    assert share.run_shared(lambda: 2, GPU, TOTAL, 1) == 2


def test_without_flock_the_check_runs_unlocked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(share, "fcntl", None)  # not POSIX
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: pytest.fail("no share to size"))
    assert share.run_shared(lambda: 3, GPU, TOTAL, 6) == 3


def test_the_catalogue_releases_what_both_families_kept_of_a_case() -> None:
    from pytest_attnperf.families import catalogue_suite
    from pytest_attnperf.families.linear import kernels as linear_kernels
    from pytest_attnperf.families.softmax import kernels as softmax_kernels

    softmax_kernels.prepare(SoftmaxCase("kept", 1, 1, 4, 8, "fp32", True), "fwd", torch.device("cpu"))
    linear_kernels.prepare("linear_attn", LinearCase("kept", 1, 1, 4, 8, 8, "fp32"), "fwd", torch.device("cpu"))
    assert softmax_kernels._cache
    assert linear_kernels._cache
    catalogue_suite._forget()
    assert not softmax_kernels._cache
    assert not linear_kernels._cache
