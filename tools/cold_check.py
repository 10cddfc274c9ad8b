"""Cold samples with the timing events inside the graph, against events around its replay.

    python3 tools/cold_check.py [--out results.json]

Times a one-element add (the least a sample can hold), a few short SDPA kernels (the cases
whose medians moved 1-2.7% between processes in session 8) and a long control with the
harness's ``CudaTimer``, three ways in one process: cold with the events as nodes of the graph
(``cuda-graph-nodes``, the default since session 9), cold with events around the replay of a
one-call graph (``cuda-graph``, the fallback and the clock before), and hot. Also checks that
fla's naive GDN recurrence, called as the suite calls it, is now graph-timed. Prints a table;
exits 1 when the cold clock is not ``cuda-graph-nodes`` (a torch whose graphs cannot hold
timing events), so a device call can stop before re-recording baselines with the wrong clock.
A diagnostic, not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sdpa_cases  # noqa: E402
import torch  # noqa: E402
from torch.nn.attention import sdpa_kernel  # noqa: E402

from pytest_attnperf import timing  # noqa: E402
from pytest_attnperf.timing import CudaTimer, SamplingPlan  # noqa: E402

CASES = [sdpa_cases.CASES[label] for label in (
    "cudnn b1-h12-t256 causal", "cudnn b1-h12-t512 causal", "flash b1-h12-t512 causal", "flash b2-h8-t512 fp16",
    "flash b32-h8-t1024 causal (control)")]
WAYS = ("cold", "cold-around", "hot")


def _without_nodes() -> None:
    timing._capture_cold = lambda *args, **kwargs: (None, "turned off by cold_check")  # type: ignore[assignment]


def measure(timer: CudaTimer, fn: object, way: str) -> dict[str, object]:
    real = timing._capture_cold
    if way == "cold-around":
        _without_nodes()
    try:
        m = timer.measure(fn, SamplingPlan(mode="hot" if way == "hot" else "cold"))  # type: ignore[arg-type]
    finally:
        timing._capture_cold = real
    return {"us": 1e3 * m.median_ms, "clock": m.clock, "stdrel": m.summary.stdrel, "n": len(m.samples_ms)}


def naive_gdn(timer: CudaTimer) -> dict[str, object]:
    from pytest_attnperf.variants.linear import gdn_naive

    b, t, h, d = 1, 256, 4, 64
    q, k, v = (torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = torch.nn.functional.logsigmoid(torch.randn(b, t, h, device="cuda"))
    beta = torch.rand(b, t, h, device="cuda")
    m = timer.measure(lambda: gdn_naive(q, k, v, g, beta, scale=d**-0.5), SamplingPlan())
    return {"us": 1e3 * m.median_ms, "clock": m.clock, "notes": list(m.notes)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    timer = sdpa_cases.device_timer()
    one = torch.zeros(1, device="cuda")
    results: dict[str, dict[str, object]] = {
        "floor: one-element add": {way: measure(timer, lambda: one.add_(1), way) for way in WAYS}}
    for row in CASES:
        fn = sdpa_cases.sdpa(row, *sdpa_cases.inputs(row))
        with sdpa_kernel(row[1]):
            results[row[0]] = {way: measure(timer, fn, way) for way in WAYS}
    try:
        gdn = naive_gdn(timer)
    except Exception as exc:  # noqa: BLE001 - reported, and a failure of the check
        gdn = {"us": float("nan"), "clock": f"failed: {type(exc).__name__}: {str(exc)[:200]}"}
    if args.out:
        args.out.write_text(json.dumps({"cases": results, "naive_gdn": gdn}, indent=1))
    print(f"torch {torch.__version__}, {props.name}")
    print(f"{'case (median us)':38}" + "".join(f"{w:>22}" for w in WAYS))
    for label, row in results.items():
        print(f"{label:38}" + "".join(f"{row[w]['us']:>8.2f} {row[w]['clock']:>13}" for w in WAYS))
    print(f"fla naive GDN B=1 T=256 H=4 D=64, cold: {gdn['us']:.1f} us, clock {gdn['clock']}")
    cold_clocks = {row["cold"]["clock"] for row in results.values()}
    ok = cold_clocks == {"cuda-graph-nodes"} and gdn["clock"] == "cuda-graph-nodes"
    print("cold clock check:", "ok" if ok else f"FAILED (cold clocks {sorted(cold_clocks)}, naive GDN {gdn['clock']})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
