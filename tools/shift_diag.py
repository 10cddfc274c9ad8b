"""What moves a short kernel's cold median from one process to the next?

    python3 tools/shift_diag.py [--out results.json] [--blocks 8] [--samples 200]

Sessions 8 and 9 found the medians of a few short cold cases (12-20 us) moving 1-3.5% between
processes on one GPU, the whole distribution at once (quartiles move with the median), while
within a process their samples agree to a fraction of that. A process differs from the next in
what it allocated where and in the graphs it instantiated. This script takes some of those
callables and, in one process, times blocks of cold samples (the harness's cold graph:
``timing._capture_cold``: flush, event, call, event) four ways:

1. ``same``: one captured graph, ``--blocks`` blocks of ``--samples`` samples (the baseline:
   how much a block's median moves with nothing changed);
2. ``recapture``: a new graph for each block, same inputs, same flush buffer;
3. ``new-inputs``: new input tensors for each block (the old ones kept alive, so the allocator
   gives new addresses), captured anew;
4. ``new-flush``: a new flush buffer for each block (the old ones kept), captured anew.

If ``new-inputs`` (or ``new-flush``, or ``recapture``) moves the block medians as much as
processes do and ``same`` does not, that is where the shift lives, and the harness can average
over it within a run. Run it in three processes to compare with the between-process moves.
Prints, per case and way, the mean of the block medians and their range (max - min) / mean;
writes every block median to ``--out``. A diagnostic, not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

from pytest_attnperf import timing  # noqa: E402

CASES = [  # (label, backend, batch, heads, seq, causal, dtype): session 9's cases with sd > 1%
    ("sdpa default b1-h12-t256 causal", None, 1, 12, 256, True, torch.bfloat16),
    ("flash b1-h12-t256 causal", SDPBackend.FLASH_ATTENTION, 1, 12, 256, True, torch.bfloat16),
    ("cudnn b2-h8-t512 fp16", SDPBackend.CUDNN_ATTENTION, 2, 8, 512, False, torch.float16),
    ("cudnn b32-h16-t1024 causal", SDPBackend.CUDNN_ATTENTION, 32, 16, 1024, True, torch.bfloat16),
]
WAYS = ("same", "recapture", "new-inputs", "new-flush")


def _flush(l2_bytes: int) -> Any:
    return torch.empty(2 * l2_bytes, dtype=torch.int8, device="cuda")


def _block(take_ms: Callable[[], float], samples: int) -> float:
    return statistics.median(take_ms() for _ in range(samples))


def _capture(fn: Callable[[], Any], flush: Any) -> Callable[[], float]:
    take_ms, why = timing._capture_cold(fn, flush)
    if take_ms is None:
        raise RuntimeError(f"cold graph with events inside did not capture: {why}")
    return take_ms


def run_case(case: tuple, l2_bytes: int, blocks: int, samples: int) -> dict[str, list[float]]:
    _, backend, b, h, t, causal, dtype = case
    kept: list[Any] = []  # every tensor made stays alive, so each new one lands elsewhere

    def make() -> Callable[[], Any]:
        q, k, v = (torch.randn(b, h, t, 64, device="cuda", dtype=dtype) for _ in range(3))
        kept.extend((q, k, v))
        return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    out: dict[str, list[float]] = {}
    with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
        fn, flush = make(), _flush(l2_bytes)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        same = _capture(fn, flush)
        out["same"] = [1e3 * _block(same, samples) for _ in range(blocks)]
        out["recapture"] = [1e3 * _block(_capture(fn, flush), samples) for _ in range(blocks)]
        medians = []
        for _ in range(blocks):
            fresh = make()
            fresh()
            medians.append(1e3 * _block(_capture(fresh, flush), samples))
        out["new-inputs"] = medians
        medians = []
        for _ in range(blocks):
            kept.append(other := _flush(l2_bytes))
            medians.append(1e3 * _block(_capture(fn, other), samples))
        out["new-flush"] = medians
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    results = {case[0]: run_case(case, props.L2_cache_size, args.blocks, args.samples) for case in CASES}
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    print(f"{'case: mean of block medians us (range %)':40}" + "".join(f"{w:>20}" for w in WAYS))
    for label, ways in results.items():
        cells = []
        for way in WAYS:
            m = ways[way]
            mean = statistics.fmean(m)
            cells.append(f"{mean:>11.2f} ({100 * (max(m) - min(m)) / mean:4.2f}%)")
        print(f"{label:40}" + "".join(f"{c:>20}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
