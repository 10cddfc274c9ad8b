"""The device this process measures on, as torch sees it: CUDA device 0, else the CPU."""

from __future__ import annotations

import functools
import os
import platform

from pytest_attnperf.hw.table import DetectedDevice

__all__ = ["detect_device", "memory_gb"]


@functools.cache
def memory_gb(gpu: bool) -> float | None:
    """The memory of the device a case runs on, in GB: the first CUDA device's, or the host's
    physical memory for a CPU case; None where it cannot be read."""
    if gpu:
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

        if not torch.cuda.is_available():
            return None
        return float(torch.cuda.get_device_properties(0).total_memory / 1e9)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9)
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows) or no such name
        return None


def detect_device() -> DetectedDevice:
    """CUDA device 0 when torch sees one, else the CPU (imports torch)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return DetectedDevice(
            kind="cuda",
            name=props.name,
            capability=(props.major, props.minor),
            sm_count=props.multi_processor_count,
            l2_bytes=getattr(props, "L2_cache_size", None),
            extra={"uuid": str(getattr(props, "uuid", "") or "")},
        )
    return DetectedDevice(kind="cpu", name=platform.processor() or platform.machine() or "cpu")
