"""The GPU's clocks, power and throttle reasons through NVML (nvidia-ml-py), and the cool-down
before a throttled case is sampled again. Every reader returns None where NVML is missing."""

from __future__ import annotations

import functools
import time
from typing import Any

__all__ = ["COOL_DOWN_MAX_S", "COOL_DOWN_MIN_S", "cool_down", "read_power_w", "read_sm_clock", "read_violation_ns",
           "violation_note"]


_THROTTLE_NAMES = {
    0x4: "sw-power-cap",
    0x8: "hw-slowdown",
    0x20: "sw-thermal",
    0x40: "hw-thermal",
    0x80: "hw-power-brake",
}


def _nvml_handle(pynvml: Any, index: int) -> Any:
    """NVML's handle for torch's CUDA device ``index``: by UUID, since NVML ignores
    CUDA_VISIBLE_DEVICES and its indices need not be torch's."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "") or "")
    if uuid:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception:  # noqa: BLE001 - fall back to the index
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(index)


@functools.cache
def _nvml_device(index: int) -> tuple[Any, Any] | None:
    """``(pynvml, handle)`` for torch's device ``index``, NVML initialised once per process;
    None without NVML (not retried: its absence does not change during a run)."""
    try:
        import pynvml  # noqa: PLC0415 - optional (nvidia-ml-py), looked up where used

        pynvml.nvmlInit()
        return pynvml, _nvml_handle(pynvml, index)
    except Exception:  # noqa: BLE001 - NVML is optional; absence means "not read"
        return None


def read_sm_clock(index: int = 0) -> tuple[float | None, tuple[str, ...]]:
    """SM clock (MHz) and active throttle reasons through NVML, or (None, ()) without it."""
    nvml = _nvml_device(index)
    if nvml is None:
        return None, ()
    pynvml, handle = nvml
    try:
        mhz = float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        read_reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        read_reasons = read_reasons or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons  # older NVML
        reasons = int(read_reasons(handle))
    except Exception:  # noqa: BLE001 - NVML is optional; absence means "not read"
        return None, ()
    return mhz, tuple(name for bit, name in _THROTTLE_NAMES.items() if reasons & bit)


# A throttled case is sampled again once the GPU has idled at least COOL_DOWN_MIN_S, and until no
# throttle reason is set and the board draws under COOL_POWER_SHARE of its enforced limit (NVML's
# power reading is an average over about a second, as the power-cap controller's own is), at most
# COOL_DOWN_MAX_S: a heavy kernel sampled at once after a capped sampling is capped again
# (docs/measurement.md).
COOL_DOWN_MIN_S, COOL_DOWN_MAX_S, COOL_POWER_SHARE = 0.5, 5.0, 0.5


def read_power_w(index: int = 0) -> tuple[float, float] | None:
    """The board's power draw and its enforced power limit in watts through NVML, or None."""
    nvml = _nvml_device(index)
    if nvml is None:
        return None
    pynvml, handle = nvml
    try:
        return (pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1e3)
    except Exception:  # noqa: BLE001 - NVML is optional; absence means "not read"
        return None


def cool_down(index: int = 0, *, max_s: float = COOL_DOWN_MAX_S) -> str:
    """Leave the GPU idle until it may boost again (see COOL_DOWN_MIN_S), at most ``max_s``;
    says how long it waited and what NVML read last, for the case's note."""
    started = time.monotonic()
    time.sleep(COOL_DOWN_MIN_S)
    while True:
        _, reasons = read_sm_clock(index)
        power = read_power_w(index)
        cool = not reasons and (power is None or power[0] < COOL_POWER_SHARE * power[1])
        waited = time.monotonic() - started
        if cool or waited >= max_s:
            break
        time.sleep(0.05)
    drawn = f", the board at {power[0]:.0f} W of {power[1]:.0f} W" if power else ""
    still = f", still {', '.join(reasons)}" if reasons else ""
    return f"the GPU idled {waited:.1f} s{drawn}{still}"


_VIOLATION_POLICIES = (("power", 0), ("thermal", 1))  # NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL


def read_violation_ns(index: int = 0) -> dict[str, int] | None:
    """NVML's violation counters: the nanoseconds, since the driver loaded, that each policy
    (power, thermal) has held the clocks down; None without NVML."""
    nvml = _nvml_device(index)
    if nvml is None:
        return None
    pynvml, handle = nvml
    try:
        return {name: int(pynvml.nvmlDeviceGetViolationStatus(handle, code).violationTime)
                for name, code in _VIOLATION_POLICIES}
    except Exception:  # noqa: BLE001 - an NVML without the counters: "not read"
        return None


def violation_note(before: dict[str, int] | None, after: dict[str, int] | None, elapsed_s: float) -> str | None:
    """A note when a violation counter grew over ``elapsed_s`` seconds of sampling: which policy
    held the clocks down and for what share of the time (reported, not acted on: the re-measure
    follows the clock read after sampling)."""
    if not before or not after or elapsed_s <= 0:
        return None
    held = {name: (after[name] - before[name]) / 1e9 for name in after if after[name] > before.get(name, after[name])}
    if not held:
        return None
    shares = ", ".join(f"{name} {100 * min(1.0, s / elapsed_s):.0f}%" for name, s in held.items())
    return f"clocks held down while sampling ({shares} of {elapsed_s:.2f} s, NVML violation counters)"
