"""How far each zoo kernel is from the checks' bounds, without pytest.

For every zoo kernel and every case of the family's CPU table (``--device cpu``) or GPU table
(``--device cuda``), both directions, this computes the output and gradients as the suite does
(``prepare`` draws the inputs and the fp64 reference) and prints, per kernel, case, direction and
tensor, the worst ratio of ``|x - ref|`` to the checks' current elementwise allowance
(``checks.assert_elementwise``) and of the largest error to its allowance
(``checks.assert_close``); 1 is the edge, above it the suite fails. Results also go to ``--out``
as JSON lines, one per kernel, case, direction and tensor (``status``: ``pass``, ``fail``,
``nonfinite``; one line per call with ``refused``, ``removed``, ``unsupported`` or ``error``),
each written as soon as it is known.

A kernel that raises is reported, not fatal. The ratios come from the checks' own functions: a
failing tensor's error is shrunk by a power of two until they pass it, which gives the ratio as
long as the allowance depends on the reference and the yardstick only.

    python -m tests.zoo.margins --family softmax --device cuda --seed 0 --out margins.jsonl
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

import torch
from torch import Tensor

from pytest_attnperf.families import checks
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.suite import CASES

__all__ = ["main", "ratio"]

TENSORS = ("out", "dq", "dk", "dv")
SHRINK = (1.0, 2.0**10, 2.0**20, 2.0**30, 2.0**45)


def ratio(check: Callable[[Tensor], float], value: Tensor, reference: Tensor) -> tuple[float, str | None]:
    """``check(value)``'s ratio (it returns the ratio when it passes, raises AssertionError when
    not) and its first failure message; a failing value's error is shrunk until it passes."""
    ref = reference.double()
    error = value.double() - ref
    message = None
    for shrink in SHRINK:
        try:
            return check(ref + error / shrink if shrink != 1.0 else value) * shrink, message
        except AssertionError as exc:
            message = message or str(exc)
    return float("inf"), message


def _prepare(case: softmax.SoftmaxCase, direction: str, device: torch.device, seed: int | None) -> softmax.Prepared:
    """``prepare`` with the seed mixed in where it takes one (else the case id's seed alone)."""
    prepare: Callable[..., softmax.Prepared] = softmax.prepare
    if seed is not None and "seed" in inspect.signature(prepare).parameters:
        return prepare(case, direction, device, seed=seed)
    return prepare(case, direction, device)


def _records(kernel: Kernel, case: softmax.SoftmaxCase, direction: str, device: torch.device,
             seed: int | None) -> Iterator[dict[str, Any]]:
    """The lines of one kernel on one case and direction."""
    if device.type not in kernel.device_kinds:
        yield {"status": "unsupported", "message": f"runs on {', '.join(kernel.device_kinds)} only"}
        return
    why = kernel.supports(case)
    if why is None and direction == "fwdbwd" and not kernel.backward:
        why = "no backward"
    if why is not None:
        yield {"status": "removed", "message": why}
        return
    p = _prepare(case, direction, device, seed)
    opts = dict(causal=case.causal, scale=case.scale, window=case.window)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    held = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    start = time.perf_counter()
    try:
        out = kernel.fn(p.q, p.k, p.v, **opts)
        got = (out,)
        if direction == "fwdbwd":
            got += tuple(torch.autograd.grad(out, (p.q, p.k, p.v), p.grad_out))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:
        reason = kernel.unsupported_reason(exc)
        yield {"status": "refused" if reason else "error", "message": reason or f"{type(exc).__name__}: {exc}"[:500]}
        return
    seconds = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated(device) - held) / 2**20 if device.type == "cuda" else None
    checks.expect_tensor(kernel.name, out, tuple(p.q.shape), p.q.dtype, p.q.device)
    for name, value, ref, mine in zip(TENSORS, got, p.reference, p.torch_value, strict=False):
        yield _tensor_record(kernel.name, case.dtype, name, value.detach(), ref, mine) | {
            "seconds": round(seconds, 4), "peak_mib": None if peak is None else round(peak, 1)}


def _tensor_record(kernel: str, dtype: str, name: str, value: Tensor, ref: Tensor, mine: Tensor) -> dict[str, Any]:
    """One tensor against both of the checks' rules, as ``run_case`` applies them."""
    bad = ~torch.isfinite(value)
    if bool(bad.any()):
        return {"tensor": name, "status": "nonfinite", "nonfinite": int(bad.sum()),
                "message": f"first at {bad.nonzero()[0].tolist()}"}
    label = f"{kernel} {name}"
    factor = checks.FACTOR if name == "out" else checks.GRAD_FACTOR
    element_factor = checks.ELEMENT_FACTOR[dtype] if name == "out" else checks.ELEMENT_GRAD_FACTOR

    def closeness(x: Tensor) -> float:
        c = checks.assert_close(label, x, ref, mine, dtype, factor)
        return c.error / c.allowed if c.allowed > 0 else (0.0 if c.error == 0 else float("inf"))

    def elementwise(x: Tensor) -> float:
        return checks.assert_elementwise(label, x, ref, mine, unit=checks._EPS[dtype], factor=element_factor,
                                         yardstick_name=f"PyTorch's {dtype}").worst_ratio

    max_ratio, max_message = ratio(closeness, value, ref)
    element_ratio, element_message = ratio(elementwise, value, ref)
    outside = re.search(r"(\d+) of \d+ elements outside", element_message or "")
    worst = re.search(r"worst at (\[[\d, ]*\])", element_message or "")
    return {
        "tensor": name, "status": "fail" if max_message or element_message else "pass",
        "elementwise_ratio": element_ratio, "max_error_ratio": max_ratio,
        "outside": int(outside.group(1)) if outside else 0, "worst_at": json.loads(worst.group(1)) if worst else None,
        "message": element_message or max_message,
    }


def _zoo(family: str) -> list[Kernel]:
    registry = KernelRegistry()
    if family != "softmax":
        raise SystemExit(f"no zoo for family {family!r}; there is one for softmax")
    from . import softmax as zoo

    zoo.register(registry)
    return registry.family(family)


def _write(stream: IO[str] | None, line: dict[str, Any]) -> None:
    if stream is not None:
        stream.write(json.dumps(line) + "\n")
        stream.flush()


def _show(line: dict[str, Any]) -> str:
    head = f"{line['kernel']:28} {line['case']:36} {line['direction']:6} {line.get('tensor', '-'):3}"
    if "elementwise_ratio" in line:
        return (f"{head} elementwise {line['elementwise_ratio']:9.3g}  max-error {line['max_error_ratio']:9.3g}  "
                f"{line['status']}" + (f" ({line['outside']} outside)" if line["outside"] else ""))
    return f"{head} {line['status']}: {line.get('message', '')}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the zoo over the table; print one line per tensor and write JSON lines to ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m tests.zoo.margins", description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="softmax")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seed", type=int, default=None, help="mixed into the inputs' draw where prepare takes it")
    parser.add_argument("--out", default=None, help="JSON lines file (default: none)")
    parser.add_argument("--kernels", default="", help="regular expression the kernel names must match")
    parser.add_argument("--cases", default="", help="regular expression the case ids must match")
    parser.add_argument("--directions", default="fwd,fwdbwd")
    parser.add_argument("--table", choices=("cpu", "gpu"), default=None,
                        help="the shape table (default: the device's; --table gpu --device cpu previews GPU cases)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    kernels = [k for k in _zoo(args.family) if re.search(args.kernels, k.name)]
    table = args.table or ("gpu" if device.type == "cuda" else "cpu")
    cases = [c for c in CASES if c.gpu == (table == "gpu") and re.search(args.cases, c.id)]
    seeded = args.seed is not None and "seed" in inspect.signature(softmax.prepare).parameters
    stream = open(args.out, "w") if args.out else None
    failed_right = 0
    try:
        for case in cases:  # case-major: prepare's cache holds the case's two directions
            for direction in args.directions.split(","):
                for kernel in kernels:
                    base = {"kernel": kernel.name, "case": case.id, "direction": direction, "device": str(device),
                            "seed": args.seed if seeded else None}
                    try:
                        lines = list(_records(kernel, case, direction, device, args.seed))
                    except Exception as exc:  # the harness's part, not the kernel's: report and go on
                        lines = [{"status": "error", "message": f"{type(exc).__name__}: {exc}"[:500]}]
                    for line in lines:
                        line = base | line
                        failed_right += kernel.name.startswith("zoo-ok-") and line["status"] in (
                            "fail", "nonfinite", "error")
                        print(_show(line), flush=True)
                        _write(stream, line)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
    finally:
        if stream is not None:
            stream.close()
    print(f"{failed_right} tensor(s) of right kernels failed or raised", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
