"""What one profiled call ran: the names of its operators and of its device activity (kernels,
copies, fills), read from ``torch.profiler``'s raw results.

The raw results (``profile.profiler.kineto_results``) are read as ``events()`` would give them
(the same events left out, names demangled the same way, in the same order) without building
its tree of ``FunctionEvent``, which took seconds over an eager call of thousands of launches.
An operator nested in one of its own name as its only child is named twice here.
"""

from __future__ import annotations

from typing import Any

__all__ = ["names"]

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
