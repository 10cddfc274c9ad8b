"""How far each kernel of the linear zoo sits from the checks' bounds, without pytest::

    python -m tests.zoo.linear_margins --device cpu --out margins.jsonl [--seed N] [--match TEXT] [--case TEXT]

For every zoo kernel (``tests.zoo.linear``) and every case of the linear suite's CPU table (the
GPU table with ``--device cuda``), the output and the gradient of every input are computed on
the suite's inputs (``kernels.prepare``; ``--seed`` draws other inputs of the same shapes) and
compared with the fp64 reference and the yardstick of the kernel's form
(``Prepared.reference``). One JSON line per kernel, case and tensor:

* ``worst_ratio``: the largest ``|x_i - ref_i|`` over the elementwise allowance
  ``u |ref_i| + k (|y_i - ref_i| + rms(y - ref))``, the formula of
  ``checks.assert_elementwise`` as written when this script was (above 1 fails), with
  ``worst_index``, ``outside`` (elements beyond it) and ``k_needed`` (the least ``k`` that passes
  every element: ``max (|x_i - ref_i| - u |ref_i|) / (|y_i - ref_i| + rms)``, and
  ``k_without_own_rounding``, the same without the ``u |ref_i|`` term);
* ``normwise``: ``|x - ref| / |ref|`` and ``normwise_allowed``;
* ``check``: ``"passed"`` or the failure message of the checks as the installed package has them
  (``kernels.assert_checked``), which may have moved on from the formula above.

A kernel that declines a case (``supports``), refuses it (``NotImplementedError``) or raises
gets one line saying so, and the run goes on. Lines are written as they come, so a run cut
short keeps what it measured. ``--match`` and ``--case`` keep the kernels and cases whose names
hold the text, to split a long run (the whole GPU table takes several of a GPU's minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

import torch
from torch import Tensor

from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear.kernels import LinearCase
from pytest_attnperf.families.linear.suite import CPU, GPU

from .linear import Zoo, zoo

__all__ = ["main", "margins"]


def margins(value: Tensor, reference: Tensor, yardstick: Tensor, *, unit: float, factor: float,
            units: float) -> dict[str, Any]:
    """The elementwise and normwise margins of ``value`` against ``reference``, the bound's
    terms taken from ``yardstick``."""
    ref = reference.double()
    error = (value.detach().double() - ref).abs()
    spread = (yardstick.double() - ref).abs()
    rms = float(spread.pow(2).mean().sqrt()) if spread.numel() else 0.0
    own = unit * ref.abs()
    allowed = own + factor * (spread + rms)
    ratio = error / allowed.clamp_min(torch.finfo(torch.float64).tiny)
    terms = (spread + rms).clamp_min(torch.finfo(torch.float64).tiny)
    needed, raw = (error - own).clamp_min(0.0) / terms, error / terms
    worst = int(ratio.argmax()) if ratio.numel() else 0
    index = list(_index(worst, tuple(ratio.shape)))
    del allowed, own
    norm = float(ref.norm())
    return {
        "worst_ratio": float(ratio.flatten()[worst]) if ratio.numel() else 0.0,
        "worst_index": index,
        "worst_error": float(error.flatten()[worst]) if error.numel() else 0.0,
        "worst_ref": float(ref.flatten()[worst]) if ref.numel() else 0.0,
        "outside": int((ratio > 1.0).sum()),
        "elements": int(ratio.numel()),
        "k_needed": float(needed.max()) if needed.numel() else 0.0,
        "k_without_own_rounding": float(raw.max()) if raw.numel() else 0.0,
        "factor": factor,
        "unit": unit,
        "yardstick_rms": rms,
        "yardstick_max": float(spread.max()) if spread.numel() else 0.0,
        "normwise": float(error.norm()) / norm if norm > 0 else float(error.norm()),
        "normwise_allowed": units * unit,
        "finite": bool(torch.isfinite(value).all()),
    }


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _check(name: str, value: Tensor, reference: Tensor, yardstick: Tensor, dtype: str, units: float,
           factor: float) -> str:
    """``"passed"``, or the message of the package's checks failing ``value``."""
    try:
        linear.assert_checked(name, value.detach(), reference, yardstick, dtype, units, factor)
    except AssertionError as exc:
        return str(exc)
    return "passed"


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_kernel(entry: Zoo, case: LinearCase, device: torch.device) -> list[dict[str, Any]]:
    """The lines of one kernel on one case."""
    kernel = entry.kernel()
    prepared = linear.prepare(entry.family, case, "fwdbwd", device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    out = kernel.fn(*prepared.inputs, scale=case.scale)
    v = prepared.inputs[2]
    if not isinstance(out, Tensor) or tuple(out.shape) != tuple(v.shape) or out.dtype != prepared.inputs[0].dtype:
        raise TypeError(f"returned {type(out).__name__} {getattr(out, 'shape', '')} {getattr(out, 'dtype', '')}; "
                        f"expected {tuple(v.shape)} {prepared.inputs[0].dtype}")
    grads = torch.autograd.grad(out, prepared.inputs, prepared.grad_out)
    _synchronize(device)
    seconds = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    values = (out.detach(),) + tuple(g.detach() for g in grads)
    del out, grads
    reference, yardstick = prepared.reference(entry.form)
    unit = linear.UNIT_ROUNDOFF[case.dtype]
    lines = []
    for i, (name, value, ref, yard) in enumerate(zip(("out",) + tuple(f"d{n}" for n in prepared.names), values,
                                                     reference, yardstick, strict=True)):
        factor = linear.FAMILY_OUT_FACTOR.get(entry.family, linear.OUT_FACTOR) if i == 0 else linear.GRAD_FACTOR
        units = linear.OUT_UNITS if i == 0 else linear.GRAD_UNITS
        line = {"tensor": name, "status": "ok", "seconds": seconds, "peak_mib": peak}
        line.update(margins(value, ref, yard, unit=unit, factor=factor, units=units))
        line["check"] = _check(f"{entry.name} {name}", value, ref, yard, case.dtype, units, factor)
        lines.append(line)
    return lines


def _write(stream: IO[str], line: dict[str, Any]) -> None:
    stream.write(json.dumps(line) + "\n")
    stream.flush()


def run(device: torch.device, stream: IO[str], seed: int | None = None, match: str | None = None,
        table: Sequence[LinearCase] | None = None, case_match: str | None = None) -> int:
    """Every zoo kernel (whose name holds ``match``) on every case of ``table`` (default: the linear
    suite's table for the device; those whose id holds ``case_match``); returns the number of
    lines written."""
    if table is None:
        table = GPU if device.type == "cuda" else CPU
    table = [c for c in table if case_match is None or case_match in c.id]
    entries = [e for e in zoo() if match is None or match in e.name]
    written = 0
    for base in table:
        case = base if seed is None else dataclasses.replace(base, id=f"{base.id}-seed{seed}")
        for entry in entries:
            head = {"kernel": entry.name, "family": entry.family, "form": entry.form, "correct": entry.correct,
                    "case": base.id, "seed": seed, "device": str(device), "dtype": case.dtype}
            declined = entry.supports(case)
            if declined is not None:
                _write(stream, {**head, "tensor": None, "status": "declined", "error": declined})
                written += 1
                continue
            print(f"{case.id} {entry.name}", file=sys.stderr, flush=True)
            try:
                lines = _run_kernel(entry, case, device)
            except Exception as exc:  # reported, not fatal
                status = "refused" if isinstance(exc, NotImplementedError) else "error"
                lines = [{"tensor": None, "status": status, "error": f"{type(exc).__name__}: {exc}"[:2000]}]
            for line in lines:
                _write(stream, {**head, **line})
                written += 1
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--device cpu|cuda --out FILE [--seed N] [--match TEXT] [--case TEXT]``."""
    parser = argparse.ArgumentParser(prog="python -m tests.zoo.linear_margins",
                                     description="Margins of the linear zoo against the checks' bounds.")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--out", required=True, help="file of JSON lines to write")
    parser.add_argument("--seed", type=int, default=None, help="other inputs of the same shapes")
    parser.add_argument("--match", default=None, help="only the kernels whose name holds this text")
    parser.add_argument("--case", default=None, help="only the cases whose id holds this text")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    with open(args.out, "w") as stream:
        written = run(device, stream, args.seed, args.match, case_match=args.case)
    print(f"{written} lines in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
