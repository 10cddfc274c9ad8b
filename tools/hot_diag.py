"""Why does hot mode read short cuDNN forwards above do_bench_cudagraph?

    python3 tools/hot_diag.py [--out results.json] [--replays 25] [--rounds 2]

Session 13's whole-suite compare (an x2 host, ``--attnperf-processes=3``) put the harness's hot
median 3.3-6.7% above ``do_bench_cudagraph`` (rep 20 ms) on nine 10-35 us cuDNN-backed SDPA
cases, seven forwards (four cudnn, three SDPA default) and two cudnn forward-backwards
(b1-h12-t512 cudnn forward: 10.04 us against 9.40), while it agreed with do_bench at rep=1 ms
(10.10) and flash/efficient forwards of the same size agreed at both (within 1%). do_bench had
not moved since session 5 (9.41 us on a single-GPU lease), but the harness had: 9.18 us then. Hot
mode's sampling has not changed since (a graph of up to 64 calls, about 0.5 ms a sample, events
around one replay with a spin kernel first); do_bench replays one graph of about 20 ms of calls
(rep / the eager time of one call), on a side stream, without a spin.

So, per case, in one process, this times the same callable as:

1. ``spin N``: the harness's way: a graph of N back-to-back calls, a spin, an event, the replay,
   an event; per call = the replay's time / N, median over ``--replays`` replays;
2. ``bare N``: the same without the spin (do_bench's way, on the current stream): the GPU is
   idle when the start event is recorded, so the graph's launch is inside each sample, about
   (bare 1 - spin 1) / N per call: compare 2 with 1 only at N of 256 and more;
3. ``side N``: as 2, on a side stream (do_bench's stream);
4. ``do_bench rep``: ``triton.testing.do_bench_cudagraph`` at rep = 1, 5 and 20 ms (median);
5. ``harness``: ``CudaTimer.measure`` in hot mode, with the calls per sample it chose, its
   clock and notes.

N runs over 1, 8, 64, 256 and 1024 calls, the harness's own N (its rule, ``timing.hot_graph``)
and about do_bench's N at 20 ms (20 ms over the eager time of one call, as do_bench estimates
it), as far as N calls take under 25 ms. If ``spin N`` falls with N and meets do_bench at
do_bench's N, the gap is the graph's length, and hot samples want longer graphs
(``--attnperf-hot-sample``); if ``spin N`` is above ``bare N`` at large N, the spin is in it; if
``bare N`` is above ``side N``, the stream is; if the harness is above ``spin N`` at its own N,
something else in the timer is. Each figure is taken on its own: one that fails is recorded with
its error and the others stand. ``bash tools/h200.sh hot`` runs this, then the suite's compare
stage on one of these shapes with one process, with three (``--attnperf-processes``: the
workers run before the tests; the compare's harness figure is this process's own median, so
this tests what the workers leave behind on the GPU) and with one at session 13's 0.5 ms
samples (the default is 20 ms since session 14). Prints a
block of per-call us per case, writes every figure to ``--out``. A diagnostic, not a test.

Session 14 ran it (README, session 14): ``spin N`` fell with N on the cuDNN cases (10.24 us at
39 calls, 9.57 at 613) and met do_bench at its N; flash and efficient stayed within 2%. Hot
samples are 20 ms since, so "the harness's own N" is now 20 ms over the device time of one
call: more calls than do_bench's 20 ms over the eager time (1167-1912 against 409-715 on the
seven short callables, session 14's fourth call).
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
WAYS = ("spin", "bare", "side")


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


def _take(row: dict[str, Any], key: str, figure: Callable[[], Any]) -> None:
    """``row[key] = figure()``, or its error under ``key + " error"``: one failure loses nothing else."""
    try:
        row[key] = figure()
    except Exception as exc:  # noqa: BLE001 - a diagnostic: recorded, the rest still run
        row[f"{key} error"] = f"{type(exc).__name__}: {str(exc)[:200]}"


def _harness(fn: Callable[[], Any]) -> dict[str, Any]:
    measured = sdpa_cases.device_timer().measure(fn, timing.SamplingPlan(mode="hot"))
    return {"us": 1e3 * measured.median_ms, "calls": measured.calls_per_sample, "clock": measured.clock,
            "notes": list(measured.notes)}


def _do_bench_us(fn: Callable[[], Any], rep: float) -> float:
    from triton.testing import do_bench_cudagraph

    return 1e3 * do_bench_cudagraph(fn, rep=rep, return_mode="median")


def run_case(case: tuple, replays: int, rounds: int) -> dict[str, Any]:
    backend = case[1]
    q, k, v = sdpa_cases.inputs(case, torch.Generator(device="cuda").manual_seed(0))
    fn = sdpa_cases.sdpa(case, q, k, v)
    out: dict[str, Any] = {"calls": [], "graph errors": {}, "rounds": []}
    side = torch.cuda.Stream()
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        eager_ms = timing.CudaTimer._eager_ms(fn)
        one_ms = timing._time_replay(_graph(fn, 1).replay)
        harness_n = timing.hot_graph(fn, None, one_ms, timing.SamplingPlan().hot_sample_ms,
                                     capture=lambda _, n: (n, None))[1]
        do_bench_n = max(1, int(REPS_MS[-1] / eager_ms))  # do_bench_cudagraph's own estimate, near enough
        out.update(eager_us=1e3 * eager_ms, one_us=1e3 * one_ms, harness_n=harness_n, do_bench_n=do_bench_n)
        graphs = {}
        for n in sorted({*CALLS, harness_n, do_bench_n}):
            if n == 1 or n * one_ms <= LONGEST_MS:
                try:
                    graphs[n] = _graph(fn, n)
                except Exception as exc:  # noqa: BLE001 - the other lengths still run
                    out["graph errors"][n] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out["calls"] = list(graphs)
        for _ in range(rounds):
            row: dict[str, Any] = {}
            for n, graph in graphs.items():
                _take(row, f"spin {n}", lambda graph=graph, n=n: _per_call_us(graph, n, replays, spin=True))
                _take(row, f"bare {n}", lambda graph=graph, n=n: _per_call_us(graph, n, replays, spin=False))
                _take(row, f"side {n}", lambda graph=graph, n=n: _per_call_us(graph, n, replays, spin=False,
                                                                           stream=side))
            for rep in REPS_MS:
                _take(row, f"do_bench {rep}", lambda rep=rep: _do_bench_us(fn, rep))
            _take(row, "harness", lambda: _harness(fn))
            row["sm_mhz"] = timing.read_sm_clock(torch.cuda.current_device())[0]
            out["rounds"].append(row)
    return out


def _median(rounds: list[dict[str, Any]], key: str) -> str:
    """The median over the rounds that have ``key``, as a cell; '-' where none has it."""
    got = [r[key]["us"] if key == "harness" else r[key] for r in rounds if key in r]
    return f"{statistics.median(got):9.2f}" if got else f"{'-':>9}"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--replays", type=_positive, default=25)
    parser.add_argument("--rounds", type=_positive, default=2)
    args = parser.parse_args()
    import triton

    report = sdpa_cases.run_all(CASES, lambda case: run_case(case, args.replays, args.rounds), args.out,
                                first=lambda: {"triton": triton.__version__,
                                               "cudnn": torch.backends.cudnn.version()})
    print("per-call us, the median over the rounds ('-': not timed; errors in the JSON)")
    for label, got in report["cases"].items():
        if "error" in got:
            print(f"{label}: {got['error']}")
            continue
        rounds = got["rounds"]
        clocks = [r["sm_mhz"] for r in rounds if r.get("sm_mhz") is not None]
        harness = next((r["harness"] for r in rounds if "harness" in r), None)
        sm = f"; SM {min(clocks):g} MHz" if clocks else ""
        print(f"{label}: eager {got['eager_us']:.1f}, harness {_median(rounds, 'harness').strip()} "
              f"(N={got['harness_n']}{', ' + harness['clock'] if harness else ''}), do_bench "
              + ", ".join(f"{rep} ms {_median(rounds, f'do_bench {rep}').strip()}" for rep in REPS_MS)
              + f" (N about {got['do_bench_n']} at 20 ms){sm}")
        print(f"  {'N':>6}" + "".join(f"{way:>9}" for way in WAYS))
        for n in got["calls"]:
            print(f"  {n:>6}" + "".join(_median(rounds, f"{way} {n}") for way in WAYS))
        if got["graph errors"]:
            print(f"  graphs not captured: {', '.join(str(n) for n in got['graph errors'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
