"""The device this process measures on, as torch sees it: CUDA device 0, else the CPU."""

from __future__ import annotations

import platform

from pytest_attnperf.hw.table import DetectedDevice

__all__ = ["detect_device"]


def detect_device() -> DetectedDevice:
    """CUDA device 0 when torch sees one, else the CPU (imports torch)."""
    import torch

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
