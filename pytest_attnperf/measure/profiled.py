"""What one profiled call ran: the names of its operators and of its device activity (kernels,
copies, fills), read from ``torch.profiler``'s raw results (``kineto_results``) as ``events()``
would give them, without building its ``FunctionEvent`` tree (docs/measurement.md, "The kernel
inventory"). An operator nested in one of its own name as its only child is named twice here.

``profile`` runs a call under the profiler for the backend proof and the kernel inventory alike,
and owns ``TEARDOWN_CUPTI`` and the note when CUPTI stayed attached (docs/measurement.md, "CUPTI").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

__all__ = ["AT_STOP", "CUPTI_ENV", "cupti_attached_note", "names", "profile"]

CUPTI_ENV = "TEARDOWN_CUPTI"
# TEARDOWN_CUPTI as it was when each profiler's last GPU profile in this process stopped, by its
# name in the note ("backend proof's", "kernel inventory's"); absent: no GPU profile of it yet
AT_STOP: dict[str, str] = {}

# the records profile.events() leaves out by name (torch.autograd.profiler_util._filter_name)
_LEFT_OUT = frozenset({
    "[memory]", "[OutOfMemory]", "profiler::_record_function_enter", "profiler::_record_function_enter_new",
    "profiler::_record_function_exit", "aten::is_leaf", "aten::output_nr", "aten::_version",
})


def names(prof: Any) -> tuple[list[str], list[str]]:
    """``(operators, device activity)``: the names of a finished ``torch.profiler.profile``'s
    events by start time, the second those on a CUDA device. Where the raw results are
    not there (another profiler class, a torch without them), read from ``prof.events()``."""
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    ops: list[str] = []
    device: list[str] = []
    if results is None:
        for event in prof.events():
            (device if str(event.device_type).endswith("CUDA") else ops).append(event.name)
        return ops, device
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    demangled: dict[str, str] = {}
    # in profile.events()'s order: by start, the longer of two that start together first
    for event in sorted(results.events(), key=lambda e: (e.start_ns(), -e.end_ns())):
        raw = event.name()
        if raw in _LEFT_OUT or getattr(event, "is_hidden_event", lambda: False)():
            continue
        name = demangled.get(raw)
        if name is None:  # as profile.events() names it (StringTable: names of one character kept)
            name = demangled[raw] = torch._C._demangle(raw) if len(raw) > 1 else raw
            if name.startswith("ProfilerStep#"):
                name = "ProfilerStep*"
        (device if str(event.device_type()).endswith("CUDA") else ops).append(name)
    return ops, device


def profile(fn: Callable[[], Any], *, cuda: bool, who: str) -> tuple[list[str], list[str]]:
    """``names`` of what ``fn`` ran once under ``torch.profiler``, with the CUDA activity when
    ``cuda``. Then ``TEARDOWN_CUPTI`` is set to 1 first unless it is set (by the user, or by
    torch.compile, which sets it to 0 for its CUDA graphs; it applies to the whole process, the
    user's own profiles included), and the value Kineto read at the stop is kept under ``who``
    for ``cupti_attached_note``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up
    from torch.profiler import ProfilerActivity  # noqa: PLC0415 - torch loads on first use, not at start-up

    activities = [ProfilerActivity.CPU]
    if cuda:
        activities.append(ProfilerActivity.CUDA)
        os.environ.setdefault(CUPTI_ENV, "1")
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    if cuda:  # what Kineto read as the profile stopped
        AT_STOP[who] = os.environ.get(CUPTI_ENV, "")
    return names(prof)


def cupti_attached_note() -> str | None:
    """A note for a case timed after a GPU profile that left CUPTI attached (the variable was
    not "1" when the profile stopped); None otherwise."""
    stopped = [(value, who) for who, value in AT_STOP.items() if value != "1"]
    if not stopped:
        return None
    value, who = stopped[0]
    return (f"{CUPTI_ENV} was {value!r} when the {who} profile stopped (set by you, "
            "or by torch.compile's CUDA graphs), so CUPTI stayed attached and later launches in this "
            "process may run slower (docs/measurement.md, \"CUPTI\", gives the slowdowns measured)")
