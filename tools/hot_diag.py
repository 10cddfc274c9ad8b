"""Why does hot mode read short cuDNN forwards above do_bench_cudagraph?

    python3 tools/hot_diag.py [--out results.json] [--replays 25] [--rounds 2]

Session 13's whole-suite compare (an x2 host, ``--attnperf-processes=3``) put the harness's hot
median 3.3-6.7% above ``do_bench_cudagraph`` (rep 20 ms) on nine 10-35 us cuDNN-backed SDPA
forwards (b1-h12-t512 cudnn: 10.04 us against 9.40), while it agreed with do_bench at rep=1 ms
(10.10) and flash/efficient forwards of the same size agreed at both (within 1%). do_bench had
not moved since session 5 (9.41 us on a single-GPU lease), but the harness had: 9.18 us then. Hot
mode's sampling has not changed since (a graph of up to 64 calls, about 0.5 ms a sample, events
around one replay with a spin kernel first); do_bench replays one graph of about 20 ms of calls
(rep / the eager time of one call), on a side stream, without a spin.

So, per case, in one process, this times the same callable as:

1. ``spin N``: the harness's way: a graph of N back-to-back calls, a spin, an event, the replay,
   an event; per call = the replay's time / N, median over ``--replays`` replays;
2. ``bare N``: the same without the spin (do_bench's way, on the current stream);
3. ``side N``: as 2, on a side stream (do_bench's stream);
4. ``do_bench rep``: ``triton.testing.do_bench_cudagraph`` at rep = 1, 5 and 20 ms (median);
5. ``harness``: ``CudaTimer.measure`` in hot mode, with the calls per sample it chose.

N runs over 1, 8, 64, 256 and 1024 calls, as far as N calls take under 25 ms. If the per-call
time falls with N (1 and 2 alike), the gap is the graph's length, and hot samples want longer
graphs; if 1 is above 2 at the same N, the spin is in it; if 2 is above 3, the stream is; if the
harness is above ``spin N`` at its own N, something else in the timer is. ``bash tools/h200.sh
hot`` runs this and then the suite's compare stage on these shapes with one process and with three
(``--attnperf-processes``), which tells a host effect (both read high) from the workers (only
three does). Prints a table of per-call us, writes every figure to ``--out``. A diagnostic, not a
test.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sdpa_cases  # noqa: E402
import torch  # noqa: E402
from torch.nn.attention import sdpa_kernel  # noqa: E402

from pytest_attnperf import timing  # noqa: E402

CASES = [sdpa_cases.CASES[label] for label in (  # session 13's gaps, and the same shapes' flash as controls
    "cudnn b1-h12-t512 causal", "cudnn b2-h8-t512 fp16", "cudnn b1-h12-t256 causal",
    "sdpa default b1-h12-t256 causal", "flash b1-h12-t512 causal", "flash b2-h8-t512 fp16",
    "efficient b1-h12-t256 causal", "cudnn b32-h16-t1024 causal")]
CALLS = (1, 8, 64, 256, 1024)
LONGEST_MS = 25.0  # no graph of more calls than this lasts
REPS_MS = (1, 5, 20)


def _graph(fn: Callable[[], Any], calls: int) -> Any:
    graph, why = timing._capture(fn, calls)
    if graph is None:
        raise RuntimeError(f"a graph of {calls} calls did not capture: {why}")
    return graph


def _per_call_us(graph: Any, calls: int, replays: int, spin: bool, stream: Any = None) -> float:
    """Median over ``replays`` of (events around one replay) / calls, in us."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        for _ in range(replays):
            if spin:
                torch.cuda._sleep(timing.SPIN_CYCLES)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(1e3 * start.elapsed_time(end) / calls)
    return statistics.median(times)


def run_case(case: tuple, replays: int, rounds: int) -> dict[str, Any]:
    from triton.testing import do_bench_cudagraph

    backend = case[1]
    q, k, v = sdpa_cases.inputs(case, torch.Generator(device="cuda").manual_seed(0))
    fn = sdpa_cases.sdpa(case, q, k, v)
    out: dict[str, Any] = {"calls": [], "rounds": []}
    side = torch.cuda.Stream()
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        out["eager_us"] = 1e3 * timing.CudaTimer._eager_ms(fn)
        one_us = 1e3 * timing._time_replay(_graph(fn, 1).replay)
        calls = [n for n in CALLS if n == 1 or n * one_us / 1e3 <= LONGEST_MS]
        graphs = {n: _graph(fn, n) for n in calls}
        out["calls"] = calls
        for _ in range(rounds):
            row: dict[str, Any] = {}
            for n, graph in graphs.items():
                row[f"spin {n}"] = _per_call_us(graph, n, replays, spin=True)
                row[f"bare {n}"] = _per_call_us(graph, n, replays, spin=False)
                row[f"side {n}"] = _per_call_us(graph, n, replays, spin=False, stream=side)
            for rep in REPS_MS:
                row[f"do_bench {rep}"] = 1e3 * do_bench_cudagraph(fn, rep=rep, return_mode="median")
            measured = sdpa_cases.device_timer().measure(fn, timing.SamplingPlan(mode="hot"))
            row["harness"] = 1e3 * measured.median_ms
            row["harness calls"] = measured.calls_per_sample
            row["sm_mhz"] = timing.read_sm_clock(torch.cuda.current_device())[0]
            out["rounds"].append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--replays", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    report = sdpa_cases.run_all(CASES, lambda case: run_case(case, args.replays, args.rounds), args.out)
    columns = ([f"{way} {n}" for way in ("spin", "bare", "side") for n in CALLS]
               + [f"do_bench {rep}" for rep in REPS_MS] + ["harness"])
    print("per-call us, median over the rounds; harness(N): its calls per sample; '-' not timed")
    print(f"{'case':34}{'eager':>8}" + "".join(f"{c:>12}" for c in columns) + f"{'N':>6}{'MHz':>6}")
    for label, got in report["cases"].items():
        if "error" in got:
            print(f"{label:34} {got['error']}")
            continue
        rounds = got["rounds"]
        cells = [f"{statistics.median(r[c] for r in rounds):12.2f}" if c in rounds[0] else f"{'-':>12}"
                 for c in columns]
        print(f"{label:34}{got['eager_us']:8.1f}" + "".join(cells)
              + f"{rounds[-1]['harness calls']:6d}{min(r['sm_mhz'] or 0 for r in rounds):6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
