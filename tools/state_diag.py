"""Does what ran earlier in a process move the harness's figures for small kernels?

    python3 tools/state_diag.py [--out results.json]

Session 7's first full runs of ``suites/`` (linear suite first, then softmax, in one pytest
process) on an nvidia-h200-x2 found 30 small softmax cases (9-37 us) 1.5-2.6 us slower than the
committed baselines, which came from softmax-only processes. This script times a few of those
callables with the harness's ``CudaTimer`` (cold and hot) in one process, after each step that
a full run takes before its softmax cases:

1. ``fresh``: nothing else has run;
2. ``reserved``: 40 GiB allocated in 1 GiB tensors and freed (the caching allocator keeps it);
3. ``emptied``: after ``torch.cuda.empty_cache()``;
4. ``after-fla``: fla's Triton kernels (chunk GLA, GDN, fused recurrent) run forward and
   backward at the linear suite's largest shape (B=4 H=16 T=16384 D=128);
5. ``after-fla-emptied``: after ``empty_cache()`` again.

A floor case (a one-element add, the least a sample can hold) is timed beside them: run on two
hosts, it shows whether a host's cold samples carry a fixed cost of their own. A diagnostic, not
a test: it prints a table and writes every figure to ``--out``.
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

from pytest_attnperf.timing import CudaTimer, SamplingPlan  # noqa: E402

CASES = [sdpa_cases.CASES[label] for label in (
    "cudnn b1-h12-t256 causal", "flash b1-h12-t512 causal", "efficient b1-h12-t256 causal", "flash b2-h8-t512 fp16",
    "flash b32-h8-t1024 causal (control)")]


def measure_all(timer: CudaTimer) -> dict[str, dict[str, float]]:
    one = torch.zeros(1, device="cuda")
    # the floor: one tiny kernel, timed the same way; if a host's cold samples carry a fixed
    # cost, it moves this by as much as the short attention kernels (compare hosts next)
    figures = {"floor: one-element add": {
        mode: 1e3 * timer.measure(lambda: one.add_(1), SamplingPlan(mode=mode)).median_ms for mode in ("cold", "hot")}}
    for row in CASES:
        fn = sdpa_cases.sdpa(row, *sdpa_cases.inputs(row))
        with sdpa_kernel(row[1]):
            figures[row[0]] = {mode: 1e3 * timer.measure(fn, SamplingPlan(mode=mode)).median_ms
                               for mode in ("cold", "hot")}
    return figures


def run_fla() -> None:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.gla import chunk_gla, fused_recurrent_gla

    b, h, t, d = 4, 16, 16384, 128
    make = lambda *s: torch.randn(*s, device="cuda", dtype=torch.bfloat16, requires_grad=True)  # noqa: E731
    q, k, v = make(b, t, h, d), make(b, t, h, d), make(b, t, h, d)
    g = torch.nn.functional.logsigmoid(torch.randn(b, t, h, d, device="cuda")).bfloat16().requires_grad_()
    for op in (chunk_gla, fused_recurrent_gla):
        out = op(q, k, v, g)[0]
        out.sum().backward()
    qn = torch.nn.functional.normalize(q.detach().float(), dim=-1).bfloat16()
    kn = torch.nn.functional.normalize(k.detach().float(), dim=-1).bfloat16()
    gs = torch.nn.functional.logsigmoid(torch.randn(b, t, h, device="cuda")).float()
    beta = torch.rand(b, t, h, device="cuda").bfloat16()
    chunk_gated_delta_rule(qn, kn, v.detach(), gs, beta)
    torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    timer = sdpa_cases.device_timer()
    phases: dict[str, dict[str, dict[str, float]]] = {}
    phases["fresh"] = measure_all(timer)
    held = [torch.empty(2**30, dtype=torch.int8, device="cuda") for _ in range(40)]
    del held
    phases["reserved"] = measure_all(timer)
    torch.cuda.empty_cache()
    phases["emptied"] = measure_all(timer)
    run_fla()
    phases["after-fla"] = measure_all(timer)
    torch.cuda.empty_cache()
    phases["after-fla-emptied"] = measure_all(timer)
    if args.out:
        args.out.write_text(json.dumps(phases, indent=1))
    names = list(phases)
    print(f"{'case (median us, cold/hot)':38}" + "".join(f"{n:>20}" for n in names))
    for label in phases["fresh"]:
        print(f"{label:38}" + "".join(f"{phases[n][label]['cold']:>9.2f}/{phases[n][label]['hot']:<9.2f} "
                                      for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
