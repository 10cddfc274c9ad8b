"""Bandwidth floors for the decode suite, from a measured run.

``python3 tools/decode_floors.py suggest REPORT_JSON --out FLOORS_JSON`` reads a run's
``report.json`` (``--attnperf-report``), keeps the decode cases whose cost model moves at least
``--min-mib`` (default 64 MiB: beyond the L2, so the cache read comes from HBM), and suggests
floors at ``--margin`` (default 0.7) of each case's measured roofline fraction, which for these
memory-bound cases is the bandwidth fraction against the roofline's bandwidth ceiling. It writes
``FLOORS_JSON`` and prints the lines for ``pytest_attnperf/floors.py``'s ``BUILTIN``, then a table of every
decode case (kernel, case, time, bandwidth %) last.

Loaded as a pytest plugin (``-p decode_floors`` with ``tools/`` on the path) with
``ATTNPERF_DECODE_FLOORS=FLOORS_JSON`` set, it gives every test whose kernel and case have a floor
there an ``attnperf_floor`` marker for the card (``--hw``); ``--hold SLOW=MODEL`` (at ``suggest``)
holds kernel ``SLOW`` to ``MODEL``'s floors, so that a deliberately slowed copy of a built-in
must fail the built-in's floors.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ENV = "ATTNPERF_DECODE_FLOORS"


def suggested(entries: Sequence[Mapping[str, Any]], margin: float, min_bytes: float) -> dict[str, dict[str, float]]:
    """Floors ``{kernel: {case: fraction}}``: ``margin`` x the measured fraction, rounded down to
    a hundredth, for the cases moving at least ``min_bytes``."""
    floors: dict[str, dict[str, float]] = {}
    for e in entries:
        frac = e.get("bandwidth_frac")
        if frac is None or (e.get("bytes") or 0) < min_bytes or str(e.get("status")) == "failed":
            continue
        value = math.floor(100 * margin * float(frac)) / 100
        if value > 0:
            floors.setdefault(str(e["kernel"]), {})[str(e["case"])] = value
    return floors


def builtin_lines(entries: Sequence[Mapping[str, Any]], floors: Mapping[str, Mapping[str, float]],
                  hw: str) -> list[str]:
    """``pytest_attnperf/floors.py`` ``BUILTIN`` lines for the built-in kernels' floors."""
    families = {(str(e["kernel"]), str(e["case"])): str(e["family"]) for e in entries}
    return [f'    ("{families[(k, c)]}", "{k}", "{c}", "fwd"): {{"{hw}": {{"roofline": {v:.2f}}}}},'
            for k, by in sorted(floors.items()) for c, v in sorted(by.items()) if not k.startswith("zoo-")]


def table(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """kernel, case, time in us, bandwidth %: one line per decode case."""
    lines = [f"{'kernel':<34} {'case':<44} {'time us':>10} {'BW %':>6}"]
    for e in entries:
        frac = e.get("bandwidth_frac")
        pct = "-" if frac is None else f"{100 * frac:.1f}"
        lines.append(f"{e['family'] + '/' + e['kernel']:<34} {e['case']:<44} {1e3 * e['median_ms']:>10.1f} {pct:>6}")
    return lines


def suggest(argv: Sequence[str]) -> int:
    """The ``suggest`` command: write the floors file, print the BUILTIN lines and the table."""
    parser = argparse.ArgumentParser(prog="decode_floors.py suggest")
    parser.add_argument("report", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--margin", type=float, default=0.7)
    parser.add_argument("--min-mib", type=float, default=64.0)
    parser.add_argument("--hold", action="append", default=[], metavar="SLOW=MODEL")
    parser.add_argument("--hw", default="h200")
    args = parser.parse_args(argv)
    entries = json.loads(args.report.read_text()).get("decode") or []
    floors = suggested(entries, args.margin, args.min_mib * 2**20)
    held = dict(h.split("=", 1) for h in args.hold)
    args.out.write_text(json.dumps({"hw": args.hw, "floors": floors, "held_to": held}, indent=1, sort_keys=True))
    print(f"# floors at {args.margin:g} x the measured fraction, cases moving >= {args.min_mib:g} MiB "
          f"({sum(len(v) for v in floors.values())} floors); for BUILTIN in pytest_attnperf/floors.py:")
    print("\n".join(builtin_lines(entries, floors, args.hw)))
    print()
    print("\n".join(table(entries)))
    return 0


def floor_for(data: Mapping[str, Any], kernel: str, case: str) -> float | None:
    """The floor of ``kernel`` on ``case``: that of the kernel it is held to, if any, else its own."""
    floors = data.get("floors") or {}
    kernel = (data.get("held_to") or {}).get(kernel, kernel)
    found = (floors.get(kernel) or {}).get(case)
    return None if found is None else float(found)


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Mark each test whose kernel and case have a floor in ``$ATTNPERF_DECODE_FLOORS``."""
    import pytest

    path = os.environ.get(ENV)
    if not path:
        return
    data = json.loads(Path(path).read_text())
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        kernel, case = params.get("kernel"), params.get("case")
        if kernel is None or case is None:
            continue
        value = floor_for(data, getattr(kernel, "name", ""), getattr(case, "id", ""))
        if value is not None:
            item.add_marker(pytest.mark.attnperf_floor(**{data.get("hw", "h200"): {"roofline": value}}))


if __name__ == "__main__":
    if sys.argv[1:2] != ["suggest"]:
        sys.exit("usage: decode_floors.py suggest REPORT_JSON --out FLOORS_JSON [--hold SLOW=MODEL]")
    sys.exit(suggest(sys.argv[2:]))
