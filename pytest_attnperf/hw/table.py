"""The hardware table and the matching of a present device against it.

Every figure in ``TABLE`` is a vendor figure with its source; none is measured here. A device
matches a spec when its normalised name starts with one of the spec's tokens and its compute
capability agrees; variants and look-alikes run as unlisted GPUs with measured ceilings only.
docs/roofline.md, "The spec table".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "TABLE",
    "DetectedDevice",
    "HardwareSpec",
    "machine_id",
    "match",
    "normalise",
    "resolve",
]


@dataclass(frozen=True)
class HardwareSpec:
    """Vendor figures for one card. Rates in FLOP/s, bandwidth in bytes/s, L2 in bytes."""

    name: str
    tokens: tuple[str, ...]
    capability: tuple[int, int] | None
    sm_count: int | None
    peak_flops: Mapping[str, float | None]
    hbm_bytes_per_s: float | None
    l2_bytes: int | None
    source: str
    measured_only: bool = False

    def peak_flops_for(self, dtype: str) -> float | None:
        """Peak dense FLOP/s for a dtype name ('bf16', 'fp16', 'fp32'), or None."""
        return self.peak_flops.get(dtype)

    @property
    def ridge_flop_per_byte(self) -> float | None:
        """Arithmetic intensity (bf16 peak over bandwidth) above which a kernel is compute bound."""
        peak = self.peak_flops.get("bf16") or self.peak_flops.get("fp16")
        if peak is None or not self.hbm_bytes_per_s:
            return None
        return peak / self.hbm_bytes_per_s


@dataclass(frozen=True)
class DetectedDevice:
    """What the process can see: a CUDA device (``kind='cuda'``) or only the CPU."""

    kind: str  # "cuda" or "cpu"
    name: str
    capability: tuple[int, int] | None = None
    sm_count: int | None = None
    l2_bytes: int | None = None
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_gpu(self) -> bool:
        """Whether the device is a CUDA GPU."""
        return self.kind == "cuda"


_T = 1e12
_G = 1e9
_MB = 1024 * 1024

TABLE: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        HardwareSpec(
            name="h200",
            tokens=("h200",),
            capability=(9, 0),
            sm_count=132,
            peak_flops={"bf16": 989.5 * _T, "fp16": 989.5 * _T, "fp32": 66.9 * _T},
            hbm_bytes_per_s=4800 * _G,
            l2_bytes=60 * _MB,
            source="NVIDIA H200 Tensor Core GPU datasheet (SXM, 2024): 1979 TFLOP/s bf16/fp16 "
            "with sparsity (989.5 dense), 67 TFLOP/s fp32, 4.8 TB/s; SMs and L2 as "
            "torch.cuda.get_device_properties reports on the part",
        ),
        HardwareSpec(
            name="h100",
            tokens=("h100",),
            capability=(9, 0),
            sm_count=132,
            peak_flops={"bf16": 989.4 * _T, "fp16": 989.4 * _T, "fp32": 66.9 * _T},
            hbm_bytes_per_s=3350 * _G,
            l2_bytes=50 * _MB,
            source="NVIDIA H100 Tensor Core GPU datasheet, SXM5 80GB: 1979 TFLOP/s bf16 sparse "
            "(989.4 dense), 67 TFLOP/s fp32, 3.35 TB/s; NVIDIA Hopper architecture whitepaper: "
            "132 SMs, 50 MB L2",
        ),
        HardwareSpec(
            name="a100",
            tokens=("a100",),
            capability=(8, 0),
            sm_count=108,
            peak_flops={"bf16": 312 * _T, "fp16": 312 * _T, "fp32": 19.5 * _T},
            hbm_bytes_per_s=2039 * _G,
            l2_bytes=40 * _MB,
            source="NVIDIA A100 Tensor Core GPU datasheet, SXM4 80GB: 312 TFLOP/s bf16/fp16 dense, "
            "19.5 TFLOP/s fp32, 2039 GB/s; NVIDIA Ampere GA100 whitepaper: 108 SMs, 40 MB L2",
        ),
        HardwareSpec(
            name="gb10",
            tokens=("gb10",),
            capability=(12, 1),
            sm_count=48,
            peak_flops={"bf16": 118.8 * _T, "fp16": 118.8 * _T, "fp32": None},
            hbm_bytes_per_s=273 * _G,
            l2_bytes=None,
            source="NVIDIA DGX Spark (GB10) specifications: 273 GB/s LPDDR5x, 6144 CUDA cores "
            "(48 SMs); bf16 dense 118.8 TFLOP/s, a theoretical figure from GB10 benchmark write-ups, not checked "
            "against an NVIDIA datasheet; NVIDIA publishes "
            "no fp32 rate or L2 size for GB10",
        ),
        HardwareSpec(
            name="rtx4090",
            tokens=("rtx4090",),
            capability=(8, 9),
            sm_count=128,
            peak_flops={"bf16": 165.2 * _T, "fp16": 165.2 * _T, "fp32": 82.6 * _T},
            hbm_bytes_per_s=1008 * _G,
            l2_bytes=72 * _MB,
            source="NVIDIA Ada Lovelace (AD102) architecture whitepaper, GeForce RTX 4090: 165.2 "
            "TFLOP/s fp16/bf16 tensor with fp32 accumulate (dense), 82.6 TFLOP/s fp32, "
            "1008 GB/s, 128 SMs, 72 MB L2",
        ),
        HardwareSpec(
            name="rtx2070",
            tokens=("rtx2070",),
            capability=(7, 5),
            sm_count=36,
            peak_flops={"bf16": None, "fp16": 29.9 * _T, "fp32": 7.5 * _T},
            hbm_bytes_per_s=448 * _G,
            l2_bytes=4 * _MB,
            source="NVIDIA Turing architecture whitepaper, GeForce RTX 2070 (reference boost "
            "1620 MHz): 59.7 TFLOP/s fp16 tensor with fp16 accumulate, half that (29.9) with "
            "fp32 accumulate, 7.5 TFLOP/s fp32, 448 GB/s, 36 SMs, 4 MB L2; Turing has no bf16 "
            "tensor cores",
        ),
        HardwareSpec(
            name="a6000",
            tokens=("rtxa6000",),
            capability=(8, 6),
            sm_count=84,
            peak_flops={"bf16": 154.8 * _T, "fp16": 154.8 * _T, "fp32": 38.7 * _T},
            hbm_bytes_per_s=768 * _G,
            l2_bytes=6 * _MB,
            source="NVIDIA RTX A6000 datasheet: 309.7 TFLOP/s tensor with sparsity (154.8 dense), "
            "38.7 TFLOP/s fp32, 768 GB/s; GA102 whitepaper: 84 SMs, 6 MB L2",
        ),
        HardwareSpec(
            name="cpu",
            tokens=("cpu",),
            capability=None,
            sm_count=None,
            peak_flops={"bf16": None, "fp16": None, "fp32": None},
            hbm_bytes_per_s=None,
            l2_bytes=None,
            source="no vendor figures: CPUs vary too much for one row; times only",
        ),
    )
}


_OTHER_VARIANTS = ("pcie", "nvl", "laptop", "mobile", "maxq")


def normalise(device_name: str) -> str:
    """Lower-case a device string and drop vendor words and punctuation.

    >>> normalise("NVIDIA GeForce RTX 4090")
    'rtx4090'
    >>> normalise("NVIDIA H100 80GB HBM3")
    'h10080gbhbm3'
    """
    name = device_name.lower()
    for word in ("nvidia", "geforce", "tesla"):
        name = name.replace(word, "")
    return re.sub(r"[^a-z0-9]", "", name)


def match(device: DetectedDevice) -> HardwareSpec | None:
    """The table row for a device: a token of the row in the normalised name and the same
    compute capability. ``None`` for a GPU the table does not know."""
    if not device.is_gpu:
        return TABLE["cpu"]
    normal = normalise(device.name)
    if any(word in normal for word in _OTHER_VARIANTS):
        return None
    for spec in TABLE.values():
        if spec.capability is None or spec.capability != device.capability:
            continue
        if any(normal.startswith(token) for token in spec.tokens):
            return spec
    return None


def unlisted_spec(device: DetectedDevice) -> HardwareSpec:
    """A spec for a GPU missing from the table: no vendor peaks (measured ceilings only)."""
    name = normalise(device.name) or "unknown-gpu"
    if name in TABLE:  # a name the table uses for another card: keep the baselines apart
        name += "-cc{}{}".format(*device.capability) if device.capability else "-unlisted"
    return HardwareSpec(
        name=name,
        tokens=(normalise(device.name),),
        capability=device.capability,
        sm_count=device.sm_count,
        peak_flops={"bf16": None, "fp16": None, "fp32": None},
        hbm_bytes_per_s=None,
        l2_bytes=device.l2_bytes,
        source=f"not in the table: '{device.name}' runs with measured ceilings only",
        measured_only=True,
    )


class HardwareMismatch(ValueError):
    """--hw names a card that is not the one present, or a name nobody knows."""


def resolve(requested: str | None, device: DetectedDevice) -> HardwareSpec:
    """The spec to use for this run.

    ``requested`` is the ``--hw`` value (None: detect). A name from the table must match the
    device present; a name outside the table is accepted only when it is the normalised
    name of the present, unlisted GPU (so ``--hw=NEW --update-baselines`` records a new card).
    """
    detected = match(device)
    if detected is None:
        detected = unlisted_spec(device)
    if requested is None:
        return detected
    name = requested.strip().lower()
    if name == detected.name:
        return detected
    shown = f"'{device.name}'" + (
        f" (compute capability {device.capability[0]}.{device.capability[1]})"
        if device.capability
        else ""
    )
    if name not in TABLE:
        known = ", ".join(sorted(TABLE))
        raise HardwareMismatch(
            f"unknown hardware '{requested}': known names are {known}; "
            f"the device present is {shown}, which runs as '{detected.name}'"
        )
    raise HardwareMismatch(
        f"hardware '{requested}' does not match the device present: {shown} is '{detected.name}', "
        f"not '{name}'"
    )


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def machine_id(device: DetectedDevice, boot_id: Path = BOOT_ID) -> str:
    """A short name for this machine as it runs now, for a baseline's recording history: the
    GPU's UUID (``device.extra['uuid']``; the device name without one) and the kernel's boot id
    (the same card, booted again, can move a case's median), e.g.
    ``gpu-1a2b3c4d/boot-5e6f7a8b``. ``--attnperf-machine`` overrides it."""
    uuid = re.sub(r"[^0-9a-f]", "", str(device.extra.get("uuid", "")).lower())
    card = f"gpu-{uuid[:8]}" if uuid else normalise(device.name) or device.kind
    try:
        boot = re.sub(r"[^0-9a-f]", "", boot_id.read_text().lower())[:8]
    except OSError:
        boot = ""
    return f"{card}/boot-{boot}" if boot else card
