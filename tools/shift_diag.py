"""What moves a short kernel's cold median from one process to the next?

    python3 tools/shift_diag.py [--out results.json] [--blocks 8] [--samples 200]

Sessions 8 and 9 found the medians of a few cold cases (12-20 us, and one 209 us cudnn forward)
moving 1-3.5% between processes on one GPU, the whole distribution at once (quartiles move with
the median), while within a process their samples agree to a fraction of that. A process differs
from the next in what it allocated where and in the graphs it instantiated. This script takes
some of those callables and, in one process, times blocks of cold samples (the harness's cold
graph, ``timing._capture_cold``: flush, event, call, event) five ways, one block of each way in
turn for ``--blocks`` rounds (so drift over the process's life falls on every way alike):

1. ``same``: one graph captured at the start, replayed for every block (nothing changed);
2. ``recapture``: a new graph each block, the previous one freed first (its pool likely reused);
3. ``new-pool``: a new graph each block, every earlier one kept (new outputs and workspace);
4. ``new-inputs``: copies of the inputs (same values, new addresses: the old ones are kept),
   captured anew;
5. ``new-flush``: a new flush buffer each block (the old ones kept), captured anew;
6. ``eight``: the harness's cold sampler, new each block: 8 graphs, the later ones in the
   first one's memory pool, sampled in turn (if sharing the pool took away the captures'
   variety, its blocks would spread as ``recapture``'s do, not about sqrt(8) times less).

If a way moves the block medians as much as processes do while ``same`` does not, that is where
the shift lives, and the harness can average over it within a run. (Session 10: new captures
did, 0.3-1.6% sd, and new inputs or flush buffers no more than new captures alone, so cold mode
now samples 8 captures in turn; averaged over 28 captures, the processes still differed by
0.4-0.5%.) ``bash tools/h200.sh shift`` runs it in three processes (``PROCS=6`` for six).
Prints, per case and way, the mean of the block medians, their standard deviation and range as
a share of the mean; writes every block median, the SM clock read after each block (and the
GPU's temperature and power draw), the one-element add's cold floor, versions and the GPU's
UUID to ``--out`` after each case (a failing case is recorded as such and the rest still run). A
diagnostic, not a test.
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

CASES = [sdpa_cases.CASES[label] for label in (  # session 9's cases with sd > 1%, as far as SDPA
    "sdpa default b1-h12-t256 causal", "flash b1-h12-t256 causal", "cudnn b2-h8-t512 fp16",
    "cudnn b32-h16-t1024 causal")]
WAYS = ("same", "recapture", "new-pool", "new-inputs", "new-flush", "eight")


def _flush(l2_bytes: int) -> Any:
    return torch.empty(2 * l2_bytes, dtype=torch.int8, device="cuda")


def _capture(fn: Callable[[], Any], flush: Any, graphs: int = 1) -> Callable[[], float]:
    take_ms, why = timing._capture_cold(fn, flush, graphs)
    if take_ms is None:
        raise RuntimeError(f"cold graph with events inside did not capture: {why}")
    return take_ms


def _block_us(take_ms: Callable[[], float], samples: int) -> float:
    return 1e3 * statistics.median(take_ms() for _ in range(samples))


def run_case(case: tuple, l2_bytes: int, blocks: int, samples: int) -> dict[str, Any]:
    backend = case[1]
    kept: list[Any] = []  # tensors and graphs kept alive, so what comes next lands elsewhere
    q0, k0, v0 = sdpa_cases.inputs(case, torch.Generator(device="cuda").manual_seed(0))
    fn, flush = sdpa_cases.sdpa(case, q0, k0, v0), _flush(l2_bytes)
    out: dict[str, Any] = {way: [] for way in WAYS}
    out["sm_mhz"], out["gpu_c"], out["power_w"] = [], [], []
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        same = _capture(fn, flush)
        for _ in range(blocks):
            out["same"].append(_block_us(same, samples))
            out["recapture"].append(_block_us(_capture(fn, flush), samples))
            kept.append(taken := _capture(fn, flush))
            out["new-pool"].append(_block_us(taken, samples))
            copies = [x.clone() for x in (q0, k0, v0)]
            kept.extend(copies)
            moved = sdpa_cases.sdpa(case, *copies)
            moved()
            out["new-inputs"].append(_block_us(_capture(moved, flush), samples))
            kept.append(other := _flush(l2_bytes))
            out["new-flush"].append(_block_us(_capture(fn, other), samples))
            out["eight"].append(_block_us(_capture(fn, flush, 8), samples))
            out["sm_mhz"].append(timing.read_sm_clock(torch.cuda.current_device())[0])
            celsius, watts = _thermals()
            out["gpu_c"].append(celsius)
            out["power_w"].append(watts)
    return out


def _thermals() -> tuple[float | None, float | None]:
    """The GPU's temperature (C) and power draw (W) through NVML, None where not read: a
    process-wide shift could follow the card's warmth (the first process of a lease starts on
    an idle, cool GPU)."""
    nvml = timing._nvml_device(torch.cuda.current_device())
    if nvml is None:
        return None, None
    pynvml, handle = nvml
    try:
        return (float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
                pynvml.nvmlDeviceGetPowerUsage(handle) / 1e3)
    except Exception:  # noqa: BLE001 - a diagnostic: not read
        return None, None


def _floor_us(l2_bytes: int, samples: int) -> float:
    one = torch.zeros(1, device="cuda")
    take = _capture(lambda: one.add_(1), _flush(l2_bytes))
    return _block_us(take, samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    report = sdpa_cases.run_all(CASES, lambda case: run_case(case, l2_bytes, args.blocks, args.samples), args.out,
                                first=lambda: {"floor_us": _floor_us(l2_bytes, args.samples)})
    print(f"floor {report['floor_us']:.2f} us; per case and way: mean of block medians us, sd %, range %")
    print(f"{'case':34}" + "".join(f"{w:>24}" for w in WAYS))
    for label, ways in report["cases"].items():
        if "error" in ways:
            print(f"{label:34} {ways['error']}")
            continue
        cells = []
        for way in WAYS:
            m = ways[way]
            mean = statistics.fmean(m)
            cells.append(f"{mean:9.2f} {100 * statistics.stdev(m) / mean:5.2f} {100 * (max(m) - min(m)) / mean:5.2f}")
        print(f"{label:34}" + "".join(f"{c:>24}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
