"""The call-axis cases timed on a GPU with their checked draws: every built-in kernel on the
catalogue's GPU rows of the masks, KV caches, states, packed sequences, LSE and shapes, checked,
then timed cold and hot (small sampling budgets) and each timed call verified after sampling.
A correct kernel must never fail here; a row's kernel that fails is printed with the message.

    python3 tools/axes_timed.py [--tier smoke] [--budget-s 420] [--out axes_timed.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import pytest
import torch

from pytest_attnperf.families.builtin import register_builtin
from pytest_attnperf.families.catalogue_suite import NO_BACKEND
from pytest_attnperf.families.draws import Timed
from pytest_attnperf.families.family import FAMILIES
from pytest_attnperf.families.interpret import autotuners_held
from pytest_attnperf.families.registry import KernelRegistry
from pytest_attnperf.hw.table import DetectedDevice
from pytest_attnperf.markers import pin_backend
from pytest_attnperf.measure.timing import CudaTimer, SamplingPlan

AXES = {"mask", "kv-cache", "paged", "state", "varlen", "lse", "q-gt-k", "v-dim"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", default="smoke")
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    device = DetectedDevice("cuda", props.name, (props.major, props.minor), props.multi_processor_count,
                            getattr(props, "L2_cache_size", 50 * 2**20))
    registry = KernelRegistry()
    register_builtin(registry)
    plans = {"cold": SamplingPlan(mode="cold", min_samples=5, max_samples=30, budget_s=0.2, cold_graphs=2),
             "hot": SamplingPlan(mode="hot", min_samples=5, max_samples=30, budget_s=0.2, hot_sample_ms=2.0)}
    rows_out: list[dict[str, Any]] = []
    deadline = time.monotonic() + args.budget_s
    for name, family in FAMILIES.items():
        rows = [r for r in family.rows(args.tier, True)
                if set(getattr(r.case, "axes", ())) & AXES and not getattr(r.case, "relation", None)]
        for row in rows:
            for kernel in registry.family(name):
                for direction in ("fwd", "fwdbwd"):
                    if time.monotonic() > deadline:
                        break
                    if family.refusal(kernel, row.case, direction):
                        continue
                    found: dict[str, Any] = {"family": name, "row": row.id, "kernel": kernel.name,
                                             "direction": direction}
                    pinned = pin_backend(kernel.sdpa_backend) if kernel.sdpa_backend else None
                    try:
                        if pinned is not None:
                            pinned.__enter__()
                        with autotuners_held():
                            checked = family.check(kernel, row.case, direction, torch.device("cuda", 0))
                            if not isinstance(checked.call, Timed):
                                found["status"] = "timed unchecked"
                            else:
                                for mode, plan in plans.items():
                                    m = CudaTimer(device).measure(checked.call, plan)
                                    found[mode] = {"us": round(1e3 * m.median_ms, 2), "verified": m.verified,
                                                   "bitwise": m.bitwise, "clock": m.clock}
                                found["status"] = "timed, verified"
                    except pytest.skip.Exception as exc:
                        found["status"] = f"refused: {str(exc)[:100]}"
                    except AssertionError as exc:
                        found["status"] = f"FAILED: {type(exc).__name__}: {str(exc)[:300]}"
                    except Exception as exc:  # noqa: BLE001 - reported
                        if kernel.sdpa_backend and NO_BACKEND.search(str(exc)):
                            found["status"] = f"refused: SDPA's {kernel.sdpa_backend} backend does not take this case"
                        else:
                            found["status"] = f"CRASHED: {type(exc).__name__}: {str(exc)[:300]}"
                    finally:
                        if pinned is not None:
                            pinned.__exit__(None, None, None)
                    rows_out.append(found)
                    print(json.dumps(found), flush=True)
    counts: dict[str, int] = {}
    for r in rows_out:
        key = r["status"].split(":")[0]
        counts[key] = counts.get(key, 0) + 1
    print(f"\n{props.name}, torch {torch.__version__}: {len(rows_out)} kernel x row x direction")
    for key, n in sorted(counts.items()):
        print(f"  {key}: {n}")
    by_kernel: dict[str, list[int]] = {}
    for r in rows_out:
        tally = by_kernel.setdefault(f"{r['family']}/{r['kernel']}", [0, 0, 0])
        tally[0 if r["status"].startswith("timed, verified") else 1 if r["status"].startswith("refused") else 2] += 1
    print("  kernel: timed and verified / refused / failed or unchecked")
    for name, (ok, refused, bad) in by_kernel.items():
        print(f"  {name}: {ok} / {refused} / {bad}")
    for r in rows_out:
        if r["status"].startswith(("FAILED", "CRASHED", "timed unchecked")):
            print(f"  {r['kernel']} {r['row']} {r['direction']}: {r['status'][:240]}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows_out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
