"""The memory gate's evidence: peaks above the inputs against the analytic bounds, and their spread.

Three uses, from the repository root:

    python tools/memory.py baseline baselines/h200.yaml        # recorded peaks over their bounds (CPU)
    python tools/memory.py junit run.xml [--out table.md]      # a run's cases: peak, bound, verdict
    python tools/memory.py noise --repeats 20 --out a.json     # on a GPU: the peak of one call, repeated
    python tools/memory.py noise-table a.json b.json           # two processes' peaks compared

``baseline`` reads each softmax and linear suite entry's ``peak_mib`` and prints it over the bound
its kernel and case get (``families.memory``), tiled or not: the margin of the tiled kernels and
the power over those that materialise scores. ``junit`` reads the properties a run wrote
(``attnperf_peak_mib``, ``attnperf_memory_bound_mib``, ``attnperf_memory``) and each case's
outcome. ``noise`` takes the CUDA timer's peak (``CudaTimer._peak_mib``, what a run records) of
the built-in softmax kernels on ``--cases``, ``--repeats`` times in one process after warm-up;
``noise-table`` prints, per case, the distinct peaks seen in each process and the spread in bytes.
Each prints a short Markdown table last.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_attnperf.families.builtin import register_builtin  # noqa: E402
from pytest_attnperf.families.linear.memory import memory_bound as linear_bound  # noqa: E402
from pytest_attnperf.families.linear.suite import CASES as LINEAR_CASES  # noqa: E402
from pytest_attnperf.families.registry import Kernel, KernelRegistry  # noqa: E402
from pytest_attnperf.families.softmax.memory import memory_bound as softmax_bound  # noqa: E402
from pytest_attnperf.families.softmax.suite import CASES as SOFTMAX_CASES  # noqa: E402

NODE = re.compile(r"test_(?:sweep\.py::test_sweep_)?(softmax|linear)(?:\.py::test_\w+)?"
                  r"\[(?P<params>.+)-(?P<direction>fwd|fwdbwd)\]$")  # the softmax, linear and sweep suites' ids
NOISE_CASES = "b32-h16-t1024-d64-causal-bf16,b1-h12-t2048-d64-causal-bf16,b2-h12-kv3-t1024-d64-causal-bf16"


def builtin() -> KernelRegistry:
    """The built-in kernels."""
    registry = KernelRegistry()
    register_builtin(registry)
    return registry


def parse_node(nodeid: str, registry: KernelRegistry) -> tuple[str, str, Any, str, Kernel | None] | None:
    """``(family, kernel name, case, direction, the kernel if registered)`` of a suite's node id."""
    match = NODE.search(nodeid)
    if match is None:
        return None
    params, direction = match["params"], match["direction"]
    softmax = match.group(1) == "softmax"
    cases = (SOFTMAX_CASES if softmax else LINEAR_CASES) + _sweep_cases(softmax)
    case = max((c for c in cases if params.startswith(c.id + "-")), key=lambda c: len(c.id), default=None)
    if case is None:
        return None
    name = params[len(case.id) + 1:]
    family = "softmax"
    if not softmax:
        family, _, name = name.partition("-")
    kernel = next((k for k in registry if k.family == family and k.name == name), None)
    return family, name, case, direction, kernel


@functools.cache
def _sweep_cases(softmax: bool) -> tuple[Any, ...]:
    """The sweep suite's case tables (``suites/test_sweep.py``), read from its file."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "suites" / "test_sweep.py"
    spec = importlib.util.spec_from_file_location("sweep", path)
    if spec is None or spec.loader is None:
        return ()
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.SOFTMAX if softmax else module.LINEAR)


def bound_mib(family: str, case: Any, direction: str) -> float:
    """The family's bound on the case, whether the kernel is tiled or not."""
    return (softmax_bound(case, direction) if family == "softmax" else linear_bound(case, direction)).mib


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def from_baseline(path: Path) -> list[str]:
    """Each recorded peak over its bound, and the tiled kernels' worst."""
    import yaml

    registry, rows, worst = builtin(), [], 0.0
    least_untiled: dict[str, float] = {}  # per case, the exempt kernels' least peak over the bound
    for nodeid, entry in sorted(yaml.safe_load(path.read_text())["entries"].items()):
        parsed = parse_node(nodeid, registry)
        if parsed is None or not isinstance(entry.get("peak_mib"), (int, float)):
            continue
        family, name, case, direction, kernel = parsed
        tiled = kernel.tiled if kernel is not None else True
        bound = bound_mib(family, case, direction)
        ratio = entry["peak_mib"] / bound
        rows.append((f"{family}/{name}", case.id, direction, f"{entry['peak_mib']:.1f}", f"{bound:.1f}",
                     f"{ratio:.3f}", "tiled" if tiled else "exempt", "OVER" if ratio > 1 else "within"))
        if tiled:
            worst = max(worst, ratio)
        else:
            least_untiled[case.id] = min(least_untiled.get(case.id, ratio), ratio)
    lines = table(("kernel", "case", "dir", "peak MiB", "bound MiB", "peak / bound", "kernel is", "verdict"), rows)
    caught = sum(1 for r in least_untiled.values() if r > 1)
    exempt = [r for r in rows if r[6] == "exempt"]
    lines.append("")
    over = sum(1 for r in exempt if r[7] == "OVER")
    lines.append(f"{len(rows)} entries; tiled kernels' worst peak / bound {worst:.3f}; exempt entries over the bound "
                 f"{over} of {len(exempt)}; cases where every exempt kernel is over it: {caught} of "
                 f"{len(least_untiled)}")
    return lines


def from_junit(paths: Sequence[Path]) -> list[str]:
    """Each case of a run's JUnit files: peak, bound, memory checks and outcome."""
    registry, rows = builtin(), []
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            props = {p.attrib["name"]: p.attrib["value"] for p in case.iter("property")}
            nodeid = f"{case.attrib.get('classname', '').replace('.', '/')}.py::{case.attrib['name']}"
            parsed = parse_node(nodeid, registry)
            if parsed is None:
                continue
            family, name, spec, direction, _ = parsed
            failure = case.find("failure")
            text = (failure.attrib.get("message", "") + (failure.text or "")) if failure is not None else ""
            outcome = "skipped" if case.find("skipped") is not None else "failed" if failure is not None else "passed"
            why = ("over the memory bound" if "over the memory bound" in text else
                   "memory regressed" if "memory regressed" in text else "other" if failure is not None else "")
            bound = props.get("attnperf_memory_bound_mib") or f"({bound_mib(family, spec, direction):.1f} exempt)"
            rows.append((name, spec.id, direction, props.get("attnperf_peak_mib", "-"), bound,
                         props.get("attnperf_memory", "-"), f"{outcome} {why}".strip()))
    return table(("kernel", "case", "dir", "peak above inputs MiB", "bound MiB", "memory", "outcome"), rows)


def noise(cases: Sequence[str], repeats: int, out: Path) -> list[str]:
    """The built-in softmax kernels' peaks, ``repeats`` times each, written to ``out``."""
    import torch

    from pytest_attnperf.families.softmax.kernels import check_case
    from pytest_attnperf.markers import pin_backend
    from pytest_attnperf.measure.timing import CudaTimer

    registry, device, found = builtin(), torch.device("cuda"), []
    for case in (c for c in SOFTMAX_CASES if c.id in cases):
        for kernel in registry.family("softmax"):
            if kernel.supports(case) is not None or "cuda" not in kernel.device_kinds:
                continue
            for direction in ("fwd", "fwdbwd") if kernel.backward else ("fwd",):
                with pin_backend(kernel.sdpa_backend) if kernel.sdpa_backend else _nothing():
                    try:
                        call = check_case(kernel, case, direction, device).call.draw(1)
                        for _ in range(3):
                            call()
                        peaks = [CudaTimer._peak_mib(call) for _ in range(repeats)]
                    except Exception as exc:  # noqa: BLE001 - a kernel that cannot run this case: noted
                        found.append({"kernel": kernel.name, "case": case.id, "direction": direction,
                                      "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
                        continue
                found.append({"kernel": kernel.name, "case": case.id, "direction": direction,
                              "peaks_bytes": [round(p * 2**20) for p in peaks]})
                out.write_text(json.dumps(found, indent=1))  # after each, so a run stopped early keeps its cases
                torch.cuda.empty_cache()
    out.write_text(json.dumps(found, indent=1))
    return noise_table([out])


def _nothing() -> Any:
    from contextlib import nullcontext

    return nullcontext()


def noise_table(paths: Sequence[Path]) -> list[str]:
    """The peaks of ``noise`` runs (one file a process) compared, case by case."""
    runs = [json.loads(p.read_text()) for p in paths]
    keyed: dict[tuple[str, str, str], list[list[int] | str]] = {}
    for run in runs:
        for r in run:
            keyed.setdefault((r["kernel"], r["case"], r["direction"]), []).append(r.get("peaks_bytes") or r["error"])
    rows, worst = [], 0
    for (kernel, case, direction), seen in sorted(keyed.items()):
        peaks = [p for s in seen if isinstance(s, list) for p in s]
        if not peaks:
            rows.append((kernel, case, direction, "-", "-", "-", str(seen[0])[:60]))
            continue
        within = max(max(s) - min(s) for s in seen if isinstance(s, list))
        between = max(peaks) - min(peaks)
        worst = max(worst, between)
        rows.append((kernel, case, direction, f"{min(peaks) / 2**20:.3f}", str(len(set(peaks))),
                     f"{within}", f"{between}"))
    lines = table(("kernel", "case", "dir", "peak MiB", "distinct peaks", "spread in a process (bytes)",
                   f"spread over {len(runs)} processes (bytes)"), rows)
    return [*lines, "", f"largest spread: {worst} bytes ({worst / 2**20:.3f} MiB)"]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="use", required=True)
    sub.add_parser("baseline").add_argument("file", type=Path)
    junit = sub.add_parser("junit")
    junit.add_argument("files", type=Path, nargs="+")
    taken = sub.add_parser("noise")
    taken.add_argument("--cases", default=NOISE_CASES)
    taken.add_argument("--repeats", type=int, default=20)
    taken.add_argument("--out", type=Path, required=True)
    sub.add_parser("noise-table").add_argument("files", type=Path, nargs="+")
    for each in sub.choices.values():
        each.add_argument("--table-out", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    if args.use == "baseline":
        lines = from_baseline(args.file)
    elif args.use == "junit":
        lines = from_junit(args.files)
    elif args.use == "noise":
        lines = noise(args.cases.split(","), args.repeats, args.out)
    else:
        lines = noise_table(args.files)
    text = "\n".join(lines) + "\n"
    if args.table_out:
        args.table_out.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
