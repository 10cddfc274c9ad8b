"""The names a profile recorded, read from the profiler's raw results (measure/profiled.py):
the same as ``profile.events()`` gives, without building its event tree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from pytest_attnperf.measure import profiled


@dataclass
class RawEvent:
    """A raw profiler event as ``kineto_results.events()`` lists it."""

    raw: str
    device: str
    start: int
    end: int
    hidden: bool = False

    def name(self) -> str:
        return self.raw

    def device_type(self) -> str:
        return f"DeviceType.{self.device}"

    def start_ns(self) -> int:
        return self.start

    def end_ns(self) -> int:
        return self.end

    def is_hidden_event(self) -> bool:
        return self.hidden


def finished(*events: RawEvent) -> Any:
    """A finished profile whose raw results hold ``events``; its ``events()`` must not be read."""
    def built() -> None:
        raise AssertionError("profile.events() was built")

    results = SimpleNamespace(events=lambda: list(events))
    return SimpleNamespace(profiler=SimpleNamespace(kineto_results=results), events=built)


def test_device_activity_is_split_from_the_operators_demangled_and_in_start_order() -> None:
    ops, device = profiled.names(finished(
        RawEvent("_ZN2at6native6kernelEv", "CUDA", 30, 40),
        RawEvent("aten::add", "CPU", 10, 50),
        RawEvent("Memcpy DtoD (Device -> Device)", "CUDA", 20, 25),
        RawEvent("aten::empty", "CPU", 10, 12),
    ))
    assert ops == ["aten::add", "aten::empty"]  # the longer of two that start together first
    assert device == ["Memcpy DtoD (Device -> Device)", "at::native::kernel()"]


def test_bookkeeping_and_hidden_events_are_left_out() -> None:
    ops, device = profiled.names(finished(
        RawEvent("[memory]", "CUDA", 1, 2),
        RawEvent("profiler::_record_function_enter_new", "CPU", 1, 2),
        RawEvent("aten::is_leaf", "CPU", 1, 2),
        RawEvent("hidden_kernel", "CUDA", 3, 4, hidden=True),
        RawEvent("gemm_kernel", "CUDA", 5, 6),
        RawEvent("x", "CPU", 7, 8),  # one character: kept as it is (not demangled)
    ))
    assert ops == ["x"]
    assert device == ["gemm_kernel"]


def test_a_profile_without_raw_results_is_read_from_its_events() -> None:
    events = [SimpleNamespace(name="aten::mm", device_type="DeviceType.CPU"),
              SimpleNamespace(name="sm90_gemm", device_type="DeviceType.CUDA")]
    assert profiled.names(SimpleNamespace(events=lambda: events)) == (["aten::mm"], ["sm90_gemm"])


@pytest.mark.parametrize("call", ["sdpa", "loop", "backward"])
def test_a_real_profile_names_what_its_events_name(call: str) -> None:
    """On this CPU: the operators that ran are those ``profile.events()`` lists, and so is the
    device activity (none here)."""
    q = torch.randn(2, 4, 64, 32, requires_grad=call == "backward")
    calls: dict[str, Callable[[], object]] = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
        "loop": lambda: [torch.cumsum(q, 1) for _ in range(20)],
        "backward": lambda: torch.autograd.grad((q * 2).exp().sum(), q),
    }
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        calls[call]()
    ops, device = profiled.names(prof)
    expected = prof.events()
    assert set(ops) == {e.name for e in expected}
    assert device == [e.name for e in expected if str(e.device_type).endswith("CUDA")]
    assert len(ops) >= len(expected)  # an operator nested in one of its name is merged by events() only
