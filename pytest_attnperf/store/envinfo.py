"""Versions that a measurement depends on, for baseline headers and drift warnings."""

from __future__ import annotations

import datetime as _dt
import platform
from importlib import metadata

from pytest_attnperf.hw.table import DetectedDevice

__all__ = ["drift", "environment"]

COMPARED = ("torch", "triton", "fla", "cuda", "driver")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _driver() -> str | None:
    try:
        import pynvml  # noqa: PLC0415 - optional (nvidia-ml-py), looked up where used

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # noqa: BLE001 - NVML is optional
        return None


def environment(device: DetectedDevice, hw_name: str) -> dict[str, str | None]:
    """The header of a baseline file measured now."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    found = {
        "hardware": hw_name,
        "device": device.name,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "fla": _version("flash-linear-attention") or _version("fla-core"),
        "cuda": torch.version.cuda,
        "driver": _driver() if device.is_gpu else None,
        "python": platform.python_version(),
        "date": _dt.date.today().isoformat(),
    }
    return {key: None if value is None else str(value) for key, value in found.items()}


def drift(baseline_meta: dict[str, object], now: dict[str, str | None]) -> list[str]:
    """'torch 2.11.0 -> 2.12.0' for each compared version that differs."""
    return [
        f"{key} {baseline_meta.get(key)} -> {now.get(key)}"
        for key in COMPARED
        if key in baseline_meta and str(baseline_meta.get(key)) != str(now.get(key))
    ]
