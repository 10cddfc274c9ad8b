"""The report's decode tables: time and bandwidth against the KV cache's length, per kernel. Pure.

A softmax decode case is one whose params have ``kv_seq`` (``Tq`` queries over a cache of
``kv_seq`` keys); a linear one is a case of a ``*_decode`` family (recurrent steps from a
state). Bandwidth is the case's roofline fraction: decode sits far below the ridge point (at
most ``heads / kv_heads x Tq`` FLOP per byte), where the roofline fraction is the achieved bytes/s
over the roofline's bandwidth ceiling, the measured copy ceiling wherever it was measured
(docs/roofline.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_attnperf.report.cells import table as _table

__all__ = ["markdown", "rows"]


def _is_decode(params: Mapping[str, Any]) -> bool:
    return params.get("kv_seq") is not None or str(params.get("family", "")).endswith("_decode")


def rows(cases: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per measured decode case, in the table's order."""
    out = []
    for c in cases:
        p = c.get("params") or {}
        if not _is_decode(p) or not c.get("median_ms"):
            continue
        out.append({
            "nodeid": c["nodeid"], "case": p.get("case"), "family": p.get("family"), "kernel": p.get("kernel"),
            "backend": c.get("backend"), "bytes": p.get("bytes"),
            "batch": p.get("batch"), "heads": p.get("heads"), "kv_heads": p.get("kv_heads"), "queries": p.get("seq"),
            "kv_seq": p.get("kv_seq"), "window": p.get("window"), "dtype": p.get("dtype"),
            "median_ms": float(c["median_ms"]), "gb_per_s": c.get("gb_per_s"), "bandwidth_frac": c.get("roofline_frac"),
            "status": c.get("status"),
        })
    out.sort(key=lambda r: (str(r["family"]), str(r["kernel"]), r["batch"] or 0, r["queries"] or 0,
                            r["window"] or 0, r["kv_seq"] or 0))
    return out


def _cell(r: Mapping[str, Any]) -> str:
    us = 1e3 * r["median_ms"]
    pct = "-" if r["bandwidth_frac"] is None else f"{100 * r['bandwidth_frac']:.0f}%"
    return f"{us:.1f} us, {pct}"


def _cache(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def markdown(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The decode section: softmax cases with one column per cache length (time, bandwidth %),
    then the recurrent steps; nothing without decode cases."""
    if not entries:
        return []
    softmax = [r for r in entries if r.get("kv_seq") is not None]
    steps = [r for r in entries if r.get("kv_seq") is None]
    lines = ["## Decode", "",
             "Device time and bandwidth (% of the roofline's bandwidth ceiling: decode is memory bound) against the "
             "KV cache's length; `Tq` new tokens, causal aligned to the end of the cache.", ""]
    if softmax:
        lengths = sorted({int(r["kv_seq"]) for r in softmax})
        grouped: dict[tuple[Any, ...], dict[int, Mapping[str, Any]]] = {}
        for r in softmax:
            key = (r["kernel"], r["batch"], r["queries"], r["heads"], r["kv_heads"], r["window"], r["dtype"])
            grouped.setdefault(key, {})[int(r["kv_seq"])] = r
        header = ["kernel", "B", "Tq", "heads", "window", "dtype", *(f"cache {_cache(n)}" for n in lengths)]
        body = [[str(k[0]), str(k[1]), str(k[2]), f"{k[3]}/{k[4]}", str(k[5] or "-"), str(k[6]),
                 *(_cell(by[n]) if n in by else "" for n in lengths)] for k, by in grouped.items()]
        lines += _table(header, body)
    if steps:
        lines += ["Recurrent steps from a state (bytes: the fp32 state read and written, and the new tokens):", ""]
        lines += _table(["family", "kernel", "B", "tokens", "heads", "dtype", "time", "GB/s", "BW %"],
                        [[str(r["family"]), str(r["kernel"]), str(r["batch"]), str(r["queries"]), str(r["heads"]),
                          str(r["dtype"]), f"{1e3 * r['median_ms']:.1f} us",
                          "-" if r["gb_per_s"] is None else f"{r['gb_per_s']:.0f}",
                          "-" if r["bandwidth_frac"] is None else f"{100 * r['bandwidth_frac']:.0f}"] for r in steps])
    return lines
