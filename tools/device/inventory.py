"""The kernel inventory on a GPU (``bash tools/h200.sh inventory``), from the repo root.

1. **Probe**: what ``torch.profiler`` reports for one replay of a CUDA graph (SDPA by each backend
   and fla's chunk GLA, where fla is installed), raw names beside normalised ones, the harness's
   part (a replay of a graph holding only the L2 flush, and the flush alone), whether the graph's
   kernels are visible, and what one profile costs.
2. **Record** a few softmax and linear cases into a baseline file of its own (not the committed
   one), and print case -> kernels with the profiling time of each case.
3. **Gate** them again with two cases changed (``tools/device/inventory_swap.py``: torch's own SDPA
   dispatch made to run the efficient backend, and an extra copy in fla's chunk GLA): those two
   say ``kernels changed``, the others not; then the two alone under
   ``--attnperf-fail-on-kernel-change``, which fails them.

Everything goes under ``$OUT/inventory``; the last lines printed are the table.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("OUT", "/tmp/attnperf-out")) / "inventory"
SOFTMAX = "suites/test_softmax.py::test_softmax[b1-h12-t512-d64-causal-bf16-{}]"
LINEAR = "suites/test_linear.py::test_linear[b4-h16-t1024-d128-bf16-{}]"
CASES = [SOFTMAX.format(k) for k in ("naive-fwd", "sdpa-fwd", "sdpa-fwdbwd", "sdpa-flash-fwd", "sdpa-efficient-fwd",
                                    "sdpa-cudnn-fwd")] + \
        [LINEAR.format(k) for k in ("linear_attn-fla-chunk-fwd", "gla-fla-chunk-fwd", "gla-fla-chunk-fwdbwd")]
SWAPS = {SOFTMAX.format("sdpa-fwd"): "efficient", LINEAR.format("gla-fla-chunk-fwd"): "copy"}


def probe() -> list[str]:
    """Profile one replay of graphs of known kernels; the lines to print."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from pytest_attnperf.measure import inventory

    lines: list[str] = []
    record: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    q, k, v = (torch.randn(1, 12, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flush = torch.empty(2 * 60 * 2**20, dtype=torch.int8, device="cuda")
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION}
    calls: dict[str, Callable[[], Any]] = {f"sdpa-{name}": functools.partial(_pinned, sdpa_kernel, b, F, q, k, v)
                                           for name, b in backends.items()}
    try:
        from fla.ops.gla import chunk_gla

        ql, kl, vl = (torch.randn(4, 1024, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        g = -torch.rand(4, 1024, 16, 128, device="cuda", dtype=torch.float32)
        calls["fla-chunk-gla"] = lambda: chunk_gla(ql, kl, vl, g, scale=128 ** -0.5)[0]
    except ImportError as exc:
        lines.append(f"probe: fla not importable ({exc}); its kernels left out")
    began = time.perf_counter()
    flush_graph = _graph(flush.zero_)
    harness = inventory.Harness(_counted(inventory.device_kernels(flush_graph.replay)),
                                _counted(inventory.device_kernels(flush.zero_)))
    record["harness_s"] = time.perf_counter() - began
    record["harness_replayed"], record["harness_flush"] = dict(harness.replayed), dict(harness.flush)
    lines.append(f"probe: graph kernels visible to torch.profiler: {harness.visible} (flush graph's replay: "
                 f"{sum(harness.replayed.values())} launches, the flush alone {sum(harness.flush.values())}); "
                 f"harness profiled in {record['harness_s']:.2f} s")
    for name, call in calls.items():
        for _ in range(3):
            call()  # warm-up (autotuning) before capture
        graph = _graph(call)
        started = time.perf_counter()
        raw = inventory.device_kernels(graph.replay)
        seconds = time.perf_counter() - started
        eager = inventory.device_kernels(call)
        counted = inventory.per_call(_counted(raw) - harness.of_replay(False))
        record[name] = {"raw_replay": raw, "raw_eager": eager, "inventory": counted, "profile_s": seconds}
        lines.append(f"probe: {name}: replay {len(raw)} launches, eager {len(eager)}; inventory {counted}; "
                     f"one profile {1e3 * seconds:.0f} ms")
    (OUT / "probe.json").write_text(json.dumps(record, indent=1))
    return lines


def _pinned(sdpa_kernel: Any, backend: Any, F: Any, q: Any, k: Any, v: Any) -> Any:
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _graph(call: Any) -> Any:
    import torch

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    torch.cuda.synchronize()
    return graph


def _counted(names: list[str]) -> Any:
    from collections import Counter

    return Counter(names)


def pytest_run(name: str, cases: list[str], *extra: str, swap: dict[str, str] | None = None) -> tuple[float, int]:
    """One pytest run of ``cases`` into its own folder; (wall seconds, exit status)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tools" / "device"), env.get("PYTHONPATH", "")]))
    if swap:
        env["ATTNPERF_SWAP"] = ";".join(f"[{case.split('[', 1)[1]}={how}" for case, how in swap.items())
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "--hw=h200",
               f"--attnperf-baselines={OUT / 'baselines'}", "--attnperf-processes=1",
               f"--attnperf-report={OUT / name}", "--benchmark-disable", *(["-p", "inventory_swap"] if swap else []),
               *extra, *cases]
    began = time.perf_counter()
    with open(OUT / f"{name}.log", "w") as log:
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    return time.perf_counter() - began, done.returncode


def rows(name: str) -> dict[str, dict[str, Any]]:
    """The cases of run ``name``'s report.json, by node id."""
    path = OUT / name / "report.json"
    if not path.exists():
        return {}
    return {row["nodeid"]: row for row in json.loads(path.read_text())["cases"]}


def short(nodeid: str) -> str:
    """A case's parametrize id."""
    return nodeid.split("[", 1)[1].rstrip("]") if "[" in nodeid else nodeid


def main() -> int:
    """Probe, record, gate with the swaps; print the table."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "baselines").mkdir(exist_ok=True)
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    lines = probe()
    record_s, record_rc = pytest_run("record", CASES, "--update-baselines")
    recorded = rows("record")
    gate_s, gate_rc = pytest_run("gate", CASES, swap=SWAPS)
    gated = rows("gate")
    fail_s, fail_rc = pytest_run("fail", list(SWAPS), "--attnperf-fail-on-kernel-change", swap=SWAPS)
    log = (OUT / "fail.log").read_text()
    alone = log.count("--attnperf-fail-on-kernel-change is set")
    failed = f"{log.count(chr(10) + 'FAILED ')} failed, {alone} on kernels alone"
    lines.append(f"record: {record_s:.0f} s (exit {record_rc}); gate with swaps: {gate_s:.0f} s (exit {gate_rc}); "
                 f"the swapped alone with --attnperf-fail-on-kernel-change: {fail_s:.0f} s (exit {fail_rc}, "
                 f"{failed})")
    lines.append("case | source | profiling s | kernels recorded | backend, time verdict, kernels after the swaps")
    for case in CASES:
        row, again = recorded.get(case, {}), gated.get(case, {})
        kernels = ", ".join(f"{k} x{n}" for k, n in (row.get("kernels") or {}).items()) or "-"
        verdict = again.get("kernels_changed") or ("same" if again.get("kernels") else "none read" if again
                                                   else "not gated")
        swapped = f" [{SWAPS[case]}]" if case in SWAPS else ""
        gated_as = f"{again.get('backend', '-')}, {again.get('status', '-')}, " if again else ""
        lines.append(f"{short(case)}{swapped} | {row.get('kernels_source') or '-'} | "
                     f"{row.get('inventory_s', 0.0):.3f} | {kernels} | {gated_as}{verdict}")
    total = sum(row.get("inventory_s", 0.0) for row in recorded.values())
    lines.append(f"profiling: {total:.2f} s over {len(recorded)} recorded cases "
                 "(the first holds the harness's two profiles)")
    print("\n".join(lines))
    (OUT / "table.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
