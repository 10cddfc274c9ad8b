"""Why the harness's hot median and triton's do_bench_cudagraph differ on some callables.

    python3 tools/timer_diag.py [--out results.json]

In the noise benchmark's compare stage (inside the suite) do_bench_cudagraph was 5-15% slower
than the harness on small multi-kernel cases, while a first version of this script, run on its
own, found them within 2% of each other. Two differences between the settings are tested here:

- graph length: the suite's callables launch fast eagerly, so do_bench (20 ms over an eager
  5-call estimate) put about ten times more calls in its graph than it did here;
- the profiler: the suite runs ``torch.profiler`` (CUPTI) once per case to see which backend
  ran, before timing, and Kineto may leave CUPTI attached after a profile ends (pytorch issue
  #144455: 10-20% slower training after profiling; ``TEARDOWN_CUPTI=1`` detaches it), which
  would slow every later launch in the process. ``tools/h200.sh diag`` runs this script twice,
  with ``TEARDOWN_CUPTI=0`` and ``=1`` (``markers.profile_names`` sets 1 unless it is set).
  Session 5 on the H200: with 0, do_bench after profiling +8% to +12% on the three small
  cases; with 1, within 1.5%. attnperf now detaches CUPTI by default.

For a few softmax cases (furthest from do_bench in the suite, and one control), on a GPU, it
times the same callable (backend pinned around the whole measurement, as the suite does) with
the harness's ``CudaTimer`` (hot and cold), with ``do_bench_cudagraph`` (median) at rep=20 ms
and 1 ms, and as CUDA graphs of N back-to-back calls (N = the harness's hot choice, and 256,
1024, 4096 while a replay stays under 60 ms), each timed per call once behind a spin kernel
(the harness's way) and once without (do_bench's way), with the graph-pool memory each
capture reserved. All of that for every case, then ``markers.profile_names`` once per case,
then all of it again. A diagnostic, not a test: it prints a table and writes every figure to
``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

from pytest_attnperf.hardware import DetectedDevice  # noqa: E402
from pytest_attnperf.markers import profile_names  # noqa: E402
from pytest_attnperf.timing import SPIN_CYCLES, CudaTimer, SamplingPlan  # noqa: E402
from pytest_attnperf.variants import softmax  # noqa: E402

CASES = [  # (label, kernel, batch, heads, seq, causal)
    ("naive b1-h12-t256 causal", softmax.naive, 1, 12, 256, True),
    ("math b1-h12-t512 causal", None, 1, 12, 512, True),
    ("flash b1-h12-t512 causal", "flash", 1, 12, 512, True),
    ("cudnn b32-h16-t1024 causal", "cudnn", 32, 16, 1024, True),
    ("flash b32-h8-t1024 causal (control)", "flash", 32, 8, 1024, True),
]


def make_fn(kernel, b, h, t, causal):
    q, k, v = (torch.randn(b, h, t, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scale = 64**-0.5
    if callable(kernel):
        return lambda: kernel(q, k, v, causal=causal, scale=scale)
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def pinned(kernel):
    """The SDPA backend context for the whole measurement (per call it costs host time, which
    shrinks do_bench's graph)."""
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    if callable(kernel):
        return nullcontext()
    return sdpa_kernel({None: SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION}[kernel])


def graph_of(fn, calls):
    torch.cuda.synchronize()
    before = torch.cuda.memory_reserved()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return g, (torch.cuda.memory_reserved() - before) / 2**20


def per_call_ms(g, calls, spin, replays=10):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        torch.cuda.synchronize()
        if spin:
            torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def do_bench_n_repeat(fn, rep=20):
    """do_bench_cudagraph's own choice: rep over an eager 5-call estimate."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    est = start.elapsed_time(end) / 5
    return max(1, int(rep / est)) if est > 0 else 1000


def measure_all(timer, phase, label, fn):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    row = {"phase": phase, "case": label}
    hot = timer.measure(fn, SamplingPlan(mode="hot"))
    row["ours_hot_ms"], row["ours_hot_calls"] = hot.median_ms, hot.calls_per_sample
    row["ours_cold_ms"] = timer.measure(fn, SamplingPlan(mode="cold")).median_ms
    with torch.cuda.stream(side):
        row["do_bench_n"] = do_bench_n_repeat(fn)
    row["do_bench_20_ms"] = do_bench_cudagraph(fn, return_mode="median")
    row["do_bench_1_ms"] = do_bench_cudagraph(fn, rep=1, return_mode="median")
    torch.cuda.synchronize()
    # longer graphs only while a replay stays under about 60 ms (and its pool within memory)
    for n in sorted({hot.calls_per_sample} | {n for n in (256, 1024, 4096) if n * hot.median_ms <= 60}):
        g, mib = graph_of(fn, n)
        row[f"graph{n}_spin_ms"] = per_call_ms(g, n, spin=True)
        row[f"graph{n}_nospin_ms"] = per_call_ms(g, n, spin=False)
        row[f"graph{n}_pool_mib"] = mib
        del g
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("timer_diag.json"))
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    device = DetectedDevice("cuda", props.name, (props.major, props.minor), props.multi_processor_count,
                            getattr(props, "L2_cache_size", None))
    timer = CudaTimer(device)
    fns = [(label, kernel, make_fn(kernel, b, h, t, causal)) for label, kernel, b, h, t, causal in CASES]
    rows = []
    for phase in ("fresh", "after profiler"):
        if phase == "after profiler":
            for _, kernel, fn in fns:
                with pinned(kernel):
                    profile_names(fn, device)
        for label, kernel, fn in fns:
            with pinned(kernel):
                rows.append(measure_all(timer, phase, label, fn))
            print(json.dumps(rows[-1]), flush=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"\n{'phase':<15}{'case':<36} {'ours hot':>9} {'cold':>8} {'db20':>8} {'db1':>8} {'dbN':>5}  "
          "graphs (N: spin / nospin us, pool MiB)")
    for r in rows:
        sizes = [k[5:-8] for k in r if k.startswith("graph") and k.endswith("_spin_ms")]
        graphs = "  ".join(f"{n}: {1e3 * r[f'graph{n}_spin_ms']:.1f}/{1e3 * r[f'graph{n}_nospin_ms']:.1f} "
                           f"{r[f'graph{n}_pool_mib']:.0f}M" for n in sizes)
        print(f"{r['phase']:<15}{r['case']:<36} {1e3 * r['ours_hot_ms']:8.1f}u {1e3 * r['ours_cold_ms']:7.1f}u "
              f"{1e3 * r['do_bench_20_ms']:7.1f}u {1e3 * r['do_bench_1_ms']:7.1f}u {r['do_bench_n']:>5}  {graphs}")
    return 0 if all(math.isfinite(r["ours_hot_ms"]) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
