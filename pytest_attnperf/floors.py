"""Floors on a case's roofline, MFU or bandwidth fraction, and where a test gets them.

A test's floor comes from the first of: the ``attnperf_floor`` marker, ``BUILTIN`` (keyed by the
suite's family, kernel, case id and direction), the kernel's registration; a floor for another
card is not applied. It is judged on the median after timing (``roofline.judge_floor``), with
``--update-baselines`` too, and fails the test, not the session; so does a speed above the
ceilings (``physics.judge``). docs/roofline.md, "Floors" and "Impossible speeds".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from pytest_attnperf.costs import Cost
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.gate import physics
from pytest_attnperf.gate.roofline import FloorOutcome, Floors, Position, judge_floor, median_sigma
from pytest_attnperf.hw.ceilings import Ceilings
from pytest_attnperf.options import Settings
from pytest_attnperf.outcome import PerfResult

__all__ = ["BUILTIN", "FloorOutcome", "applicable", "check", "extra_info", "failure_message", "notes", "position",
           "rate_peaks"]

MARKER = "attnperf_floor"

# Built-in floors of the suites' cases: (family, kernel, case id, direction) -> the floors, in
# the shape Floors.parse reads, e.g.
#   ("softmax", "sdpa-cudnn", "b32-h16-t1024-d64-causal-bf16", "fwd"): {"h200": {"roofline": 0.5}},
# set at about 70% of a measured roofline fraction (docs/roofline.md, "Setting floors").
# The h200 floors' measured fractions and ceilings: docs/roofline.md, "Built-in floors". Decode
# cases' bandwidth floors are roofline floors too (memory bound), from ``bash tools/h200.sh decode``
# (docs/decode.md, "Floors and the report").
BUILTIN: dict[tuple[str, str, str, str | None], Mapping[str, Any]] = {
    ("softmax", "sdpa-cudnn", "b32-h16-t1024-d64-causal-bf16", "fwd"): {"h200": {"roofline": 0.30}},
    ("softmax", "sdpa-cudnn", "b32-h16-t1024-d64-causal-bf16", "fwdbwd"): {"h200": {"roofline": 0.24}},
    ("softmax", "sdpa-flash", "b32-h16-t1024-d64-causal-bf16", "fwd"): {"h200": {"roofline": 0.19}},
    ("softmax", "sdpa-flash", "b32-h16-t1024-d64-causal-bf16", "fwdbwd"): {"h200": {"roofline": 0.15}},
    ("linear_attn", "fla-chunk", "b4-h16-t4096-d128-bf16", "fwd"): {"h200": {"roofline": 0.23}},
    ("gla", "fla-chunk", "b4-h16-t4096-d128-bf16", "fwd"): {"h200": {"roofline": 0.09}},
    ("simple_gla", "fla-chunk", "b4-h16-t4096-d128-bf16", "fwd"): {"h200": {"roofline": 0.21}},
    ("gdn", "fla-chunk", "b4-h16-t4096-d128-bf16", "fwd"): {"h200": {"roofline": 0.10}},
    # decode: 70% of one H200 recording run's bandwidth fractions, cases moving 64 MiB or more
    # (docs/decode.md, "Floors and the report")
    ("simple_gla_decode", "fla-fused-recurrent", "b32-h16-t1-d128-bf16", "fwd"): {"h200": {"roofline": 0.31}},
    ("simple_gla_decode", "fla-fused-recurrent", "b32-h16-t4-d128-bf16", "fwd"): {"h200": {"roofline": 0.17}},
    ("softmax", "naive", "b1-h32-kv8-t1-cache128k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.02}},
    ("softmax", "naive", "b1-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.03}},
    ("softmax", "naive", "b1-h32-kv8-t16-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.02}},
    ("softmax", "naive", "b32-h32-kv8-t1-cache1k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.03}},
    ("softmax", "naive", "b32-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.03}},
    ("softmax", "naive", "b32-h32-kv8-t1-cache8k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.03}},
    ("softmax", "naive", "b32-h32-kv8-t16-cache8k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.02}},
    ("softmax", "sdpa", "b1-h32-kv8-t1-cache128k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.57}},
    ("softmax", "sdpa", "b1-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.39}},
    ("softmax", "sdpa", "b1-h32-kv8-t16-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.16}},
    ("softmax", "sdpa", "b32-h32-kv8-t1-cache1k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.37}},
    ("softmax", "sdpa", "b32-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.46}},
    ("softmax", "sdpa", "b32-h32-kv8-t1-cache8k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.44}},
    ("softmax", "sdpa-cudnn", "b1-h32-kv8-t1-cache128k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.60}},
    ("softmax", "sdpa-cudnn", "b1-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.38}},
    ("softmax", "sdpa-cudnn", "b1-h32-kv8-t16-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.03}},
    ("softmax", "sdpa-cudnn", "b32-h32-kv8-t1-cache1k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.41}},
    ("softmax", "sdpa-cudnn", "b32-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.73}},
    ("softmax", "sdpa-cudnn", "b32-h32-kv8-t1-cache8k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.68}},
    ("softmax", "sdpa-cudnn", "b32-h32-kv8-t16-cache8k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.12}},
    ("softmax", "sdpa-flash", "b1-h32-kv8-t1-cache128k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.57}},
    ("softmax", "sdpa-flash", "b1-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.39}},
    ("softmax", "sdpa-flash", "b1-h32-kv8-t16-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.16}},
    ("softmax", "sdpa-flash", "b32-h32-kv8-t1-cache1k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.37}},
    ("softmax", "sdpa-flash", "b32-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.46}},
    ("softmax", "sdpa-flash", "b32-h32-kv8-t1-cache8k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.44}},
    ("softmax", "sdpa-math", "b1-h32-kv8-t1-cache128k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.01}},
    ("softmax", "sdpa-math", "b1-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.01}},
    ("softmax", "sdpa-math", "b32-h32-kv8-t1-cache1k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.01}},
    ("softmax", "sdpa-math", "b32-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.01}},
    ("softmax", "sdpa-math", "b32-h32-kv8-t1-cache8k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.01}},
    ("softmax", "sdpa-math", "b32-h32-kv8-t16-cache8k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.01}},
    ("softmax", "sdpa-repeat-kv", "b1-h32-kv8-t1-cache128k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.02}},
    ("softmax", "sdpa-repeat-kv", "b1-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.03}},
    ("softmax", "sdpa-repeat-kv", "b1-h32-kv8-t16-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.03}},
    ("softmax", "sdpa-repeat-kv", "b32-h32-kv8-t1-cache1k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.02}},
    ("softmax", "sdpa-repeat-kv", "b32-h32-kv8-t1-cache32k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.03}},
    ("softmax", "sdpa-repeat-kv", "b32-h32-kv8-t1-cache8k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.03}},
    ("softmax", "sdpa-repeat-kv", "b32-h32-kv8-t16-cache8k-d128-causal-bf16", "fwd"): {"h200": {"roofline": 0.03}},
    ("simple_gla_decode", "torch-recurrent", "b32-h16-t1-d128-bf16", "fwd"): {"h200": {"roofline": 0.10}},
    ("simple_gla_decode", "torch-recurrent", "b32-h16-t4-d128-bf16", "fwd"): {"h200": {"roofline": 0.02}},
}


def _marker_floors(item: pytest.Item) -> Floors | None:
    mark = item.get_closest_marker(MARKER)
    if mark is None:
        return None
    if mark.args:
        raise ValueError(f"{item.nodeid}: {MARKER} takes keywords only (roofline=, mfu=, bandwidth=, hw=, or a "
                         f"card name with a dict), got {mark.args!r}")
    return Floors.parse(dict(mark.kwargs), f"{item.nodeid}: {MARKER}: ")


def applicable(item: pytest.Item, hw_name: str) -> tuple[Any, str | None, str] | None:
    """``(floor, card it names or None, where from)`` for this test on ``hw_name``, or None."""
    sources: list[tuple[str, Floors | None]] = [(f"@pytest.mark.{MARKER}", _marker_floors(item))]
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    kernel = params.get("kernel")
    if isinstance(kernel, Kernel):
        case = params.get("case")
        key = (kernel.family, kernel.name, getattr(case, "id", None), params.get("direction"))
        table = BUILTIN.get(key)  # type: ignore[arg-type]
        where = f"the built-in floors of {'/'.join(str(k) for k in key if k is not None)}"
        sources.append((where, None if table is None else Floors.parse(table, f"{where}: ")))
        sources.append((f"the registration of kernel '{kernel.name}'", Floors.parse(kernel.floors)))
    for where, floors in sources:
        found = floors.for_hw(hw_name) if floors is not None else None
        if found is not None:
            return found[0], found[1], where
    return None


def rate_peaks(ceilings: Ceilings, dtype: str) -> tuple[float | None, float | None]:
    """Peak FLOP/s for ``dtype`` and bandwidth for MFU and bandwidth %: user > spec > measured."""
    peak, band = ceilings.rate_peak(dtype), ceilings.rate_bandwidth()
    return (peak.value if peak else None), (band.value if band else None)


def position(ceilings: Ceilings, cost: Cost, dtype: str, seconds: float) -> Position | None:
    """The case on the roofline (user > measured > spec ceilings), or None without both."""
    peak, band = ceilings.roofline_peak(dtype), ceilings.roofline_bandwidth()
    if peak is None or band is None:
        return None
    return Position(cost.flops, cost.bytes, seconds, peak, band)


def check(item: pytest.Item, result: PerfResult, dtype: str, ceilings: Ceilings, settings: Settings, hw_name: str,
          on_gpu: bool) -> PerfResult:
    """``result`` with its roofline position on ``ceilings`` and its floors for the card ``hw_name``
    judged (not in a pool run); JUnit properties set. ``on_gpu``: the run's device is a CUDA GPU."""
    where = position(ceilings, result.cost, dtype, result.median_ms / 1e3)
    outcome = None
    found = applicable(item, hw_name) if settings.pool_out is None else None
    if found is not None:
        floor, hw, source = found
        s = result.measurement.summary
        sigma = median_sigma(s.median_ms, s.ci_low_ms, s.ci_high_ms, settings.run_noise, settings.run_noise_time_ms)
        achieved = {"roofline": where.fraction if where else None, "mfu": result.mfu,
                    "bandwidth": result.bandwidth_frac}
        checks = tuple(judge_floor(metric, achieved[metric], value, sigma) for metric, value in floor.items())
        outcome = FloorOutcome(checks, source, hw)
    speed = None if settings.pool_out is not None else _physics(on_gpu, ceilings, result, dtype)
    item.user_properties.extend([
        ("attnperf_roofline_pct", "" if where is None else f"{100 * where.fraction:.2f}"),
        ("attnperf_bound", "" if where is None else where.bound),
        ("attnperf_ceilings", "none" if where is None else where.sources),
    ])
    if outcome is not None:
        item.user_properties.append(("attnperf_floor", outcome.status))
    if speed is not None:
        item.user_properties.append(("attnperf_physics", speed.status))
    return replace(result, roofline=where, floors=outcome, dtype=dtype, physics=speed)


CPU_REASON = ("the CPU's measured ceilings bound no case (its caches are not flushed between samples, and a busy "
              "host measures them low), and it has no vendor figures")
HOT_REASON = "no {dtype} matmul ceiling known (hot mode's data may sit in the L2, so the copy bandwidth bounds nothing)"


def _physics(on_gpu: bool, ceilings: Ceilings, result: PerfResult, dtype: str) -> physics.PhysicsCheck:
    """The case's speed against the ceilings no kernel beats (user, else the higher of measured
    and spec: ``Ceilings.limit_peak``): on a GPU only, and in hot mode against the matmul ceiling
    only (back-to-back calls may read from the L2)."""
    if not on_gpu:
        return physics.not_run(CPU_REASON)
    peak = ceilings.limit_peak(dtype)
    hot = result.measurement.mode == "hot"
    if hot and peak is None:
        return physics.not_run(HOT_REASON.format(dtype=dtype))
    band = None if hot else ceilings.limit_bandwidth()
    speed = physics.judge(result.cost.flops, result.cost.bytes, result.median_ms / 1e3, dtype, peak, band)
    if speed.status == "not run" and ceilings.why:
        return physics.not_run(f"no ceilings: {ceilings.why}")
    return speed


def _ceiling_text(metric: str, result: PerfResult, ceilings: Ceilings) -> str:
    dtype = result.dtype or "?"
    if metric == "roofline":
        if result.roofline is None:
            return f"no roofline: {ceilings.why or 'no peak or bandwidth known'}"
        return result.roofline.describe(dtype)
    if metric == "mfu":
        peak = ceilings.rate_peak(dtype)
        return f"{dtype} peak {peak.value / 1e12:.1f} TFLOP/s ({peak.source})" if peak else f"no {dtype} peak known"
    band = ceilings.rate_bandwidth()
    return f"bandwidth {band.value / 1e9:.0f} GB/s ({band.source})" if band else "no bandwidth known"


def failure_message(result: PerfResult, ceilings: Ceilings) -> str | None:
    """Why the case's speed is impossible, or it is below a floor, or both; None when neither."""
    speed = result.physics
    impossible = f"{speed.message}\n  this run: {result.measurement.summary.describe()}" \
        if speed is not None and speed.failed else None
    below = _below_message(result, ceilings)
    return "\n".join(m for m in (impossible, below) if m) or None


def _below_message(result: PerfResult, ceilings: Ceilings) -> str | None:
    """Why the case is below a floor, or None."""
    outcome = result.floors
    if outcome is None or not outcome.failed:
        return None
    card = f"the {outcome.hw} floor" if outcome.hw else "the floor for every card"
    lines = [f"BELOW FLOOR ({card}, from {outcome.source}):"]
    for c in outcome.checks:
        ceiling = _ceiling_text(c.metric, result, ceilings)
        if c.achieved is None:
            lines.append(f"  {c.metric}: floor {100 * c.floor:.1f}% cannot be judged: {ceiling}; give "
                         "--attnperf-peaks or let the ceilings be measured (--attnperf-ceilings)")
            continue
        verdict = ("below it by more than the noise" if c.status == "failed"
                   else "within noise" if c.status == "within noise" else "met")
        lines.append(f"  {c.metric}: achieved {100 * c.achieved:.1f}% against floor {100 * c.floor:.1f}%, {verdict} "
                     f"(x (1 + {c.margin:.4f}) = {100 * c.achieved * (1 + c.margin):.1f}%); {ceiling}")
    bound = result.roofline.bound if result.roofline else "unknown"
    lines.append(f"  bound: {bound}; this run: {result.measurement.summary.describe()}")
    return "\n".join(lines)


def notes(result: PerfResult) -> tuple[str, ...]:
    """For the summary: a floor met only within noise, and why the speed was not checked."""
    speed = result.physics
    unchecked = (speed.message,) if speed is not None and speed.status == "not run" else ()
    outcome = result.floors
    if outcome is None:
        return unchecked
    return unchecked + tuple(f"{c.metric} {100 * c.achieved:.1f}% is below its floor {100 * c.floor:.1f}% within noise "
                 f"(margin {100 * c.margin:.2f}%): passed" for c in outcome.checks
                 if c.status == "within noise" and c.achieved is not None)


def extra_info(result: PerfResult) -> dict[str, Any]:
    """The roofline's keys in the benchmark JSON's ``extra_info``."""
    where, outcome = result.roofline, result.floors
    info: dict[str, Any] = {"roofline_frac": None, "roofline_bound": None, "roofline_ceilings": None}
    if where is not None:
        info.update({
            "roofline_frac": where.fraction,
            "roofline_bound": where.bound,
            "roofline_attainable_tflops": where.attainable_flops / 1e12,
            "roofline_peak_tflops": where.peak.value / 1e12,
            "roofline_gb_per_s": where.bandwidth.value / 1e9,
            "roofline_ridge_flop_per_byte": where.ridge,
            "roofline_ceilings": where.sources,
        })
    info["physics_check"] = None if result.physics is None else result.physics.status
    info["floor_checks"] = None if outcome is None else [
        {"metric": c.metric, "floor": c.floor, "achieved": c.achieved, "margin": c.margin, "status": c.status}
        for c in outcome.checks]
    return info
