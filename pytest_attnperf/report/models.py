"""The report's model tables: prefill, training and decode of each configured model's layers. Pure.

A model case is one the models suite ran (``--attnperf-model``, docs/models.md): its id names the
model, the layer kind, the tensor-parallel degree and the phase (``families.models.cases.case_name``).
Each row has the case's MFU (against the spec sheet's peak, as the summary's) and its roofline
fraction: achieved over attainable at the case's FLOP/byte, from the ceilings measured on the
machine wherever they were measured (docs/roofline.md), so a compute-bound prefill reads as a share
of the measured peak and a memory-bound decode as a share of the measured bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_attnperf.families.models.cases import case_name
from pytest_attnperf.report.cells import ms, num, pct, table

__all__ = ["markdown", "rows"]

PHASES = ("prefill", "train", "decode")


def rows(cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per measured case of the models suite, by model, degree, layer kind, phase and shape."""
    out = []
    for c in cases:
        p = c.get("params") or {}
        name = case_name(str(p.get("case", "")))
        if name is None or "::test_models_" not in str(c.get("nodeid", "")) or not c.get("median_ms"):
            continue
        out.append({
            "nodeid": c["nodeid"], "model": name.model, "kind": name.kind, "tp": name.tp, "phase": name.phase,
            "shape": name.shape, "family": p.get("family"), "kernel": p.get("kernel"),
            "direction": p.get("direction"), "dtype": p.get("dtype"), "median_ms": float(c["median_ms"]),
            "tflops": c.get("tflops"), "mfu": c.get("mfu"), "gb_per_s": c.get("gb_per_s"), "bound": c.get("bound"),
            "roofline_frac": c.get("roofline_frac"), "status": c.get("status"),
        })
    out.sort(key=lambda r: (r["model"], r["tp"], r["kind"], PHASES.index(r["phase"]), _shape_key(r["shape"]),
                            str(r["kernel"]), str(r["direction"])))
    return out


def _shape_key(shape: str) -> tuple[int, ...]:
    """``b32-cache8k`` as (32, 8192): shapes in numeric order."""
    numbers = []
    for part in shape.split("-"):
        digits = part.lstrip("abcdefghijklmnopqrstuvwxyz")
        scale = 1024 if digits.endswith("k") else 1
        digits = digits.rstrip("k")
        numbers.append(int(digits) * scale if digits.isdigit() else 0)
    return tuple(numbers)


def markdown(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The models section: one table per model; nothing without model cases."""
    if not entries:
        return []
    lines = ["## Models", "",
             "Each configured model's attention layers as one rank of its tensor-parallel degree runs them "
             "(docs/models.md). MFU is against the spec sheet's peak; `roofline %` is achieved over attainable "
             "at the case's FLOP/byte, from the measured ceilings (`bound`: `cmp` against the peak, `mem` "
             "against the bandwidth).", ""]
    header = ["layer", "TP", "phase", "shape", "kernel", "direction", "time", "TFLOP/s", "MFU %", "GB/s", "bound",
              "roofline %", "status"]
    for model in dict.fromkeys(r["model"] for r in entries):
        lines += [f"### {model}", ""]
        lines += table(header, [
            [str(r["kind"]), str(r["tp"]), str(r["phase"]), str(r["shape"]), str(r["kernel"]), str(r["direction"]),
             ms(r["median_ms"]), num(r["tflops"], ".1f"), pct(r["mfu"]), num(r["gb_per_s"], ".0f"),
             str(r["bound"] or "-"), pct(r["roofline_frac"]), str(r["status"] or "-")]
            for r in entries if r["model"] == model])
    return lines
