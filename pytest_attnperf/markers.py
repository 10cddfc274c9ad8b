"""Markers: ``attnperf_sdpa_backend`` pins torch's SDPA dispatch; ``attnperf_requires_hw`` states what a case needs;
``attnperf_floor`` sets the least roofline, MFU or bandwidth fraction it must reach (floors.py).

A pin is proven, not trusted: ``prove_backend`` profiles one call and checks the ATen ops and,
on CUDA, the kernel names that torch.profiler records (``pytorch_flash::flash_fwd_*``,
``fmha_cutlassF_*``, ``cudnn_generated_*sdpa*``), so a silent fallback is
never measured under the wrong name.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pytest_attnperf.gate.roofline import Floors
from pytest_attnperf.hw.table import DetectedDevice
from pytest_attnperf.measure import profiled

__all__ = [
    "BACKENDS",
    "MARKERS",
    "BackendProofError",
    "backends_seen",
    "check_marker_args",
    "check_marker_names",
    "marker_names",
    "pin_backend",
    "prove_backend",
    "requirement_failure",
    "unavailable_reason",
]

BACKENDS = ("flash", "efficient", "cudnn", "math")

MARKERS = (
    "attnperf_sdpa_backend(name): pin torch's scaled_dot_product_attention to one backend "
    "(flash, efficient, cudnn, math) for the test; skips with torch's reason where the card "
    "cannot run it; attnperf.measure proves from profiler records that it ran",
    "attnperf_requires_hw(gpu=True, min_capability=None, names=None): skip unless the run's device is a "
    "GPU (gpu=True), has at least this compute capability ('8.0' or (8, 0)), or is one of names",
    "attnperf_floor(roofline=None, mfu=None, bandwidth=None, hw=None, **cards): fail the test when its "
    "median reaches less than this fraction of the roofline, peak FLOP/s or bandwidth (beyond noise); hw= or "
    "a card name with a dict (h200=dict(roofline=0.6)) limits a floor to that card",
    "attnperf_sweep(name, axis='seq'): the case is a point of sweep `name` along the case parameter "
    "`axis`; --attnperf-report fits and plots the sweep's points",
    "attnperf_deterministic: fail the test unless two replays (calls) of the same timed inputs give the "
    "same bits; a kernel registered with deterministic=True carries it on every case",
)

_OPS = {
    "flash": "aten::_scaled_dot_product_flash_attention",
    "efficient": "aten::_scaled_dot_product_efficient_attention",
    "cudnn": "aten::_scaled_dot_product_cudnn_attention",
    "math": "aten::_scaled_dot_product_attention_math",
}
_CUDA_KERNELS = {
    "flash": re.compile(r"flash_(fwd|bwd)|pytorch_flash", re.IGNORECASE),
    "efficient": re.compile(r"fmha_cutlass|PyTorchMemEff|mem_eff", re.IGNORECASE),
    "cudnn": re.compile(r"cudnn.*(sdpa|fprop|dgrad|flash)|sdpa.*cudnn", re.IGNORECASE),
}


class BackendProofError(AssertionError):
    """The pinned backend is not what ran."""


def _sdp_backend(name: str) -> Any:
    from torch.nn.attention import SDPBackend  # noqa: PLC0415 - torch loads on first use, not at start-up

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]


@contextmanager
def pin_backend(name: str) -> Iterator[None]:
    """Restrict SDPA to one backend inside the block."""
    from torch.nn.attention import sdpa_kernel  # noqa: PLC0415 - torch loads on first use, not at start-up

    with sdpa_kernel([_sdp_backend(name)]):
        yield


_UNAVAILABLE = re.compile(r"No available kernel|No viable backend", re.IGNORECASE)


_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\s*$")
_HEADER = re.compile(r"kernel not used because:?$")


def unavailable_reason(exc: BaseException, warnings_seen: Iterable[str]) -> str | None:
    """torch's reason a pinned backend cannot run, or None when ``exc`` is something else.

    torch warns a header per backend ("Flash attention kernel not used because:") followed by
    one warning per failed check ("Expected query, key and value to all be of dtype ...");
    each header is joined with its checks. A header followed by "... has been runtime
    disabled" is the pin itself switching that backend off, so both are left out."""
    if not isinstance(exc, RuntimeError) or not _UNAVAILABLE.search(str(exc)):
        return None
    parts: list[str] = []
    for raw in warnings_seen:
        message = _TRIGGERED.sub("", str(raw).strip())
        if not message:
            continue
        if "runtime disabled" in message:
            if parts and parts[-1].endswith(":"):
                parts.pop()  # the header of a backend the pin switched off
            continue
        if _HEADER.search(message):
            parts.append(message.rstrip(":") + ":")
        elif parts and parts[-1].endswith(":"):
            parts[-1] += " " + message
        elif re.search(r"not used because|not supported|requires|[Ee]xpected", message):
            parts.append(message)
    parts = [p[:-1] + " (torch named no check)" if p.endswith(":") else p for p in parts]
    first = str(exc).strip().splitlines()[0]
    return "; ".join(dict.fromkeys(parts)) + f" [{first}]" if parts else first


def backends_seen(op_names: Iterable[str], kernel_names: Iterable[str]) -> set[str]:
    """Which SDPA backends left evidence: their ATen op, or on CUDA their kernels."""
    ops = list(op_names)
    kernels = list(kernel_names)
    seen = {b for b, op in _OPS.items() if any(name.startswith(op) for name in ops)}
    seen |= {b for b, pat in _CUDA_KERNELS.items() if any(pat.search(k) for k in kernels)}
    return seen


def profile_names(fn: Callable[[], Any], device: DetectedDevice) -> tuple[list[str], list[str]]:
    """ATen op names and CUDA kernel names recorded while ``fn`` ran once (``measure.profiled.profile``,
    which owns ``TEARDOWN_CUPTI``)."""
    return profiled.profile(fn, cuda=device.is_gpu, who="backend proof's")


def prove_backend(fn: Callable[[], Any], backend: str, device: DetectedDevice) -> tuple[set[str], list[str]]:
    """Run ``fn`` once under the profiler; raise ``BackendProofError`` unless only ``backend``
    left evidence (and, on CUDA, its own kernels ran). Returns the backends seen and the CUDA
    kernels' raw names (the kernel inventory compares its graph's with them)."""
    ops, kernels = profile_names(fn, device)
    seen = backends_seen(ops, kernels)
    problems = []
    if backend not in seen:
        problems.append(f"no trace of the '{backend}' backend")
    if seen - {backend}:
        problems.append(f"other backends ran: {', '.join(sorted(seen - {backend}))}")
    if device.is_gpu and backend in _CUDA_KERNELS and not any(_CUDA_KERNELS[backend].search(k) for k in kernels):
        problems.append(f"none of the CUDA kernels matches '{_CUDA_KERNELS[backend].pattern}'")
    if problems:
        shown = sorted({k for k in kernels})[:8] or sorted({o for o in ops if "attention" in o})[:8]
        raise BackendProofError(
            f"attnperf_sdpa_backend('{backend}') was pinned but {'; '.join(problems)}. Seen: {shown}"
        )
    return seen, kernels


def _capability(value: object) -> tuple[int, int]:
    if isinstance(value, str):
        major, _, minor = value.partition(".")
        return int(major), int(minor or 0)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return int(value[0]), int(value[1])
    raise ValueError(f"min_capability must be '8.0' or (8, 0), not {value!r}")


def requirement_failure(marker: pytest.Mark, device: DetectedDevice, hw_name: str) -> str | None:
    """Why ``attnperf_requires_hw`` is not met on this device, or None."""
    gpu = marker.kwargs.get("gpu", True)
    if gpu and not device.is_gpu:
        return "needs a CUDA GPU; this run has only the CPU (torch.cuda.is_available() is False)"
    minimum = marker.kwargs.get("min_capability")
    if minimum is not None:
        want = _capability(minimum)
        if device.capability is None or device.capability < want:
            have = "none" if device.capability is None else "{}.{}".format(*device.capability)
            return f"needs compute capability >= {want[0]}.{want[1]}; '{device.name}' has {have}"
    names = marker.kwargs.get("names")
    if names and hw_name not in names:
        return f"runs only on {', '.join(names)}; this is {hw_name}"
    return None


def marker_names() -> tuple[str, ...]:
    """The attnperf markers' names, from ``MARKERS``."""
    return tuple(line.split("(", 1)[0].split(":", 1)[0] for line in MARKERS)


def check_marker_names(item: pytest.Item) -> None:
    """A usage error for an ``attnperf_*`` mark that is none of the plugin's, or an unregistered mark
    that is one of them without its prefix (``floor``, ``sdpa_bakend``): a typo would otherwise only
    warn, and the floor or pin it meant would not apply. The message names the closest."""
    known = marker_names()
    bare = {name.removeprefix("attnperf_"): name for name in known}
    registered: set[str] | None = None
    for mark in item.iter_markers():
        if mark.name.startswith("attnperf") and mark.name not in known:
            close = difflib.get_close_matches(mark.name, known, n=1)
        elif mark.name in bare or difflib.get_close_matches(mark.name, bare, n=1, cutoff=0.8):
            # ``sdpa_bakend`` or ``floor``: attnperf's marker without its prefix, unless the project registered it
            if registered is None:
                registered = {line.split("(", 1)[0].split(":", 1)[0].strip() for line in item.config.getini("markers")}
            if mark.name in registered:
                continue
            close = [bare[name] for name in difflib.get_close_matches(mark.name, bare, n=1, cutoff=0.8)]
        else:
            continue
        hint = f"; did you mean {close[0]}?" if close else ""
        raise pytest.UsageError(f"{item.nodeid}: unknown marker {mark.name}{hint} (attnperf's markers: "
                                f"{', '.join(known)})")


def check_marker_args(item: pytest.Item) -> None:
    """Usage errors for markers with bad arguments, at collection."""
    check_marker_names(item)
    for mark in item.iter_markers("attnperf_sdpa_backend"):
        if len(mark.args) != 1 or mark.args[0] not in BACKENDS:
            raise pytest.UsageError(
                f"{item.nodeid}: attnperf_sdpa_backend{mark.args!r} must name one of {', '.join(BACKENDS)}"
            )
    for mark in item.iter_markers("attnperf_floor"):
        try:
            if mark.args:
                raise ValueError(f"takes keywords only (roofline=, mfu=, bandwidth=, hw=, or a card name with a "
                                 f"dict), got {mark.args!r}")
            Floors.parse(dict(mark.kwargs))
        except ValueError as exc:
            raise pytest.UsageError(f"{item.nodeid}: attnperf_floor: {exc}") from None
    for mark in item.iter_markers("attnperf_requires_hw"):
        unknown = set(mark.kwargs) - {"gpu", "min_capability", "names"}
        if mark.args or unknown:
            raise pytest.UsageError(
                f"{item.nodeid}: attnperf_requires_hw takes keywords gpu, min_capability, names; got "
                f"{mark.args!r} {sorted(unknown)}"
            )
        if "min_capability" in mark.kwargs:
            try:
                _capability(mark.kwargs["min_capability"])
            except ValueError as exc:
                raise pytest.UsageError(f"{item.nodeid}: {exc}") from None
