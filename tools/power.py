"""The correctness rule's power: the smallest error it catches, per family, case, direction and tensor.

For each case of a family's table (``--table cpu`` or ``gpu``) the fp64 reference is rounded to
the case's dtype (as right as a kernel can be; its margin is printed too) and then made wrong by
``1 + e`` on every element (dense) or on 0.1% of them (sparse), for ``e`` in ``--errors``. The
smallest ``e`` that the family's rule (``check_tensor``, what the suites run) fails is what it
catches there. Run from the repository root::

    python tools/power.py --table cpu --out power-cpu.jsonl
    python tools/power.py --table gpu --device cuda --cases 'b4-h16-t1024|b32-h16' --out power-gpu.jsonl

Each line of ``--out`` is one (family, case, direction, form, tensor); a Markdown table of the
least caught errors per family, dtype, direction and tensor kind ends the output.

``--kernels`` measures kernels' margins instead: every kernel registered (the built-in ones, and
those of each ``--zoo`` module's ``pytest_attnperf_register_kernels``) is called once per case,
direction and ``--seeds`` seed, and each output's and gradient's worst error over its bound is
written for each ``--neighbours`` count of the elementwise rule's smoothing (over 1 the rule fails)::

    python tools/power.py --kernels --zoo tests.zoo.softmax --table cpu --neighbours 0,1,2 --out margins.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_attnperf.families import checks  # noqa: E402
from pytest_attnperf.families.checks import CheckFailed  # noqa: E402
from pytest_attnperf.families.linear import kernels as linear  # noqa: E402
from pytest_attnperf.families.linear import suite as linear_suite  # noqa: E402
from pytest_attnperf.families.softmax import kernels as softmax  # noqa: E402
from pytest_attnperf.families.softmax import suite as softmax_suite  # noqa: E402

ERRORS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
SPARSE = 1e-3  # the fraction of elements a sparse error touches
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def injected(exact: Any, error: float, sparse: bool) -> Any:
    """``exact`` times ``1 + error``, everywhere or on a fixed 0.1% of its elements (at least one)."""
    if not sparse:
        return (exact.double() * (1 + error)).to(exact.dtype)
    gen = torch.Generator(device=exact.device).manual_seed(11)
    count = max(1, round(SPARSE * exact.numel()))  # at least one element, on small tensors too
    picked = torch.randperm(exact.numel(), generator=gen, device=exact.device)[:count]
    wrong = exact.flatten().clone()
    wrong[picked] = (wrong[picked].double() * (1 + error)).to(exact.dtype)
    return wrong.view_as(exact)


def least_caught(check: Callable[[Any], float], exact: Any, sparse: bool, errors: tuple[float, ...]) -> float | None:
    """The smallest error of ``errors`` that ``check`` fails, or None when it fails none."""
    for error in errors:
        try:
            check(injected(exact, error, sparse))
        except CheckFailed:
            return error
    return None


def tensors(
    family: str, case: Any, direction: str, device: Any, seed: int
) -> Iterator[tuple[str, str, Any, Any, Callable[..., float]]]:
    """(form, tensor name, reference, yardstick, check) for every output and gradient of the case."""
    if family == "softmax":
        p = softmax.prepare(case, direction, device, seed)
        for name, ref, yard in zip(softmax.TENSORS, p.reference, p.torch_value, strict=False):
            yield "-", name, ref, yard, lambda v, n=name, r=ref, y=yard: softmax.check_tensor(n, n, v, r, y, case.dtype)
        return
    lp = linear.prepare(family, case, direction, device, seed)
    names = ("out", *(f"d{n}" for n in lp.names))
    for form in ("chunk", "recurrent"):
        reference, yardstick = lp.reference(form)
        for name, ref, yard in zip(names, reference, yardstick, strict=False):
            yield form, name, ref, yard, (
                lambda v, n=name, r=ref, y=yard: linear.check_tensor(family, n, n, v, r, y, case.dtype))


def cases(family: str, table: str, pattern: str) -> list[Any]:
    """The family's cases of one table whose ids match ``pattern``, less those the family does not
    take (``LinearCase.refusal``: the suite removes them at collection)."""
    rows = softmax_suite.CASES if family == "softmax" else linear_suite.CASES
    return [c for c in rows if c.gpu == (table == "gpu") and re.search(pattern, c.id)
            and (family == "softmax" or c.refusal(family) is None)]


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The injection measurements: a row per family, case, direction, form and tensor."""
    device = torch.device(args.device)
    errors = tuple(float(e) for e in args.errors.split(","))
    rows: list[dict[str, Any]] = []
    with open(args.out, "w") as out:
        for family in args.families.split(","):
            for case in cases(family, args.table, args.cases):
                for direction in ("fwd", "fwdbwd"):
                    started = time.monotonic()
                    for form, name, ref, _yard, check in tensors(family, case, direction, device, args.seed):
                        exact = ref.to(DTYPES[case.dtype])
                        try:
                            margin: float | str = round(check(exact), 4)
                        except CheckFailed as exc:  # the rounded reference itself fails: a defect of the rule
                            margin = f"FAILED: {str(exc).splitlines()[0]}"
                        row = {"family": family, "case": case.id, "dtype": case.dtype, "direction": direction,
                               "form": form, "tensor": name, "exact_margin": margin,
                               "dense": least_caught(check, exact, False, errors),
                               "sparse": least_caught(check, exact, True, errors)}
                        rows.append(row)
                        out.write(json.dumps(row) + "\n")
                        out.flush()
                    print(f"{family} {case.id} {direction}: {time.monotonic() - started:.1f} s", flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The least errors caught, the worst over a group's cases: per family, dtype, direction, form and tensor kind."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        kind = "out" if row["tensor"] == "out" else "grad"
        groups.setdefault((row["family"], row["dtype"], row["direction"], row["form"], kind), []).append(row)

    def worst(values: list[float | None]) -> str:
        return "not caught" if None in values else f"{max(v for v in values if v is not None):.1%}"

    lines = ["| family | dtype | direction | form | tensors | cases | dense caught from | sparse (0.1%) caught from |",
             "|---|---|---|---|---|---|---|---|"]
    for key, group in sorted(groups.items()):
        lines.append(f"| {' | '.join(key)} | {len({r['case'] for r in group})} | "
                     f"{worst([r['dense'] for r in group])} | {worst([r['sparse'] for r in group])} |")
    failed = [r for r in rows if isinstance(r["exact_margin"], str)]
    lines.append(f"\nthe rounded reference failed {len(failed)} of {len(rows)} tensors")
    return "\n".join(lines)


def registry(zoos: list[str]) -> Any:
    """The built-in kernels and those each zoo module registers."""
    import importlib

    from pytest_attnperf.families.builtin import register_builtin
    from pytest_attnperf.families.registry import KernelRegistry

    found = KernelRegistry()
    register_builtin(found)
    for name in zoos:
        importlib.import_module(name).pytest_attnperf_register_kernels(found, None)
    return found


def skip_reason(kernel: Any, case: Any, direction: str, device: Any) -> str | None:
    """Why the suites would not run the kernel on the case (None: they would)."""
    if device.type not in kernel.device_kinds:
        return f"runs on {kernel.device_kinds}"
    if direction == "fwdbwd" and not kernel.backward:
        return "no backward"
    reason: str | None = kernel.supports(case)
    return reason


def margins(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every kernel on every case, direction and seed: a row with each tensor's ratios."""
    import contextlib

    import pytest

    from pytest_attnperf.markers import pin_backend

    device = torch.device(args.device)
    found = registry(args.zoo)
    counts = [int(n) for n in args.neighbours.split(",")]
    rows: list[dict[str, Any]] = []
    with open(args.out, "w") as out:
        for family in args.families.split(","):
            kernels = [k for k in found.family(family) if re.search(args.kernel_pattern, k.name)]
            for case in cases(family, args.table, args.cases):
                for direction in ("fwd", "fwdbwd"):
                    for seed in (int(x) for x in args.seeds.split(",")):
                        for kernel in kernels:
                            row: dict[str, Any] = {"family": family, "kernel": kernel.name, "case": case.id,
                                                   "dtype": case.dtype, "direction": direction, "seed": seed}
                            if skip_reason(kernel, case, direction, device) is not None:
                                continue
                            started = time.monotonic()
                            pin = pin_backend(kernel.sdpa_backend) if kernel.sdpa_backend else contextlib.nullcontext()
                            try:
                                with pin:
                                    if family == "softmax":
                                        a = softmax.answer(kernel, case, direction, device, seed)
                                    else:
                                        a = linear.answer(family, kernel, case, direction, device, seed)
                            except pytest.skip.Exception as exc:
                                row["skipped"] = str(exc)[:200]
                            except Exception as exc:  # a contract failure or a crash: reported, not fatal
                                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                            else:
                                ratios: dict[str, dict[str, float]] = {}
                                for name, value, ref, yard in zip(a.names, a.got, a.reference, a.yardstick,
                                                                  strict=True):
                                    for count in ("rule", *counts):  # the whole rule, then each smoothing
                                        ratios.setdefault(name, {})[str(count)] = ratio_of(
                                            family, name, value, ref, yard, case.dtype, count)
                                row["ratios"] = ratios
                            row["seconds"] = round(time.monotonic() - started, 2)
                            rows.append(row)
                            out.write(json.dumps(row) + "\n")
                            out.flush()
                    print(f"{family} {case.id} {direction}", flush=True)
    return rows


def ratio_of(family: str, name: str, value: Any, ref: Any, yard: Any, dtype: str, count: int | str) -> float:
    """The whole rule's worst ratio (``count`` "rule", at the default smoothing), or the
    elementwise rule's alone with ``count`` neighbours; a failure's ratio is its exceeded bound's."""
    kind = "tensor" if count == "rule" else "elements"
    check = getattr(softmax if family == "softmax" else linear, f"check_{kind}")
    args = (name, name, value, ref, yard, dtype)
    if family != "softmax":
        args = (family, *args)
    saved = checks.NEIGHBOURS
    checks.NEIGHBOURS = saved if count == "rule" else int(count)
    try:
        ratio = float(check(*args))
    except CheckFailed as exc:
        ratio = exc.ratio if exc.ratio == exc.ratio else float("inf")  # NaN: a non-finite value
    finally:
        checks.NEIGHBOURS = saved
    return round(ratio, 4)


def margin_table(rows: list[dict[str, Any]], counts: list[str]) -> str:
    """Per kernel: cases run, and its worst ratio (over every case, seed and tensor) per neighbour count."""
    counts = ["rule", *counts]
    lines = [f"| family | kernel | runs | errors | {' | '.join(f'worst, {c}' for c in counts)} |",
             "|---|---|---|---|" + "---|" * len(counts)]
    by_kernel: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by_kernel.setdefault((row["family"], row["kernel"]), []).append(row)
    for (family, kernel), group in sorted(by_kernel.items()):
        ran = [r for r in group if "ratios" in r]
        worst = [max((t[c] for r in ran for t in r["ratios"].values()), default=float("nan")) for c in counts]
        lines.append(f"| {family} | {kernel} | {len(ran)} | {sum('error' in r for r in group)} | "
                     + " | ".join(f"{w:.3g}" for w in worst) + " |")
    return "\n".join(lines)


class JUnitCase(NamedTuple):
    """A suite case of a JUnit XML report."""

    function: str  # the test function's name less ``test_``
    params: str  # its parametrize id less the direction
    direction: str
    outcome: str  # passed, failed or skipped (an error is a failure)
    first: str  # its failure's first line, or ""
    ratios: dict[str, float]  # its ``attnperf_check_*`` ratios by tensor


def junit_cases(paths: list[str]) -> Iterator[JUnitCase]:
    """Each suite case of JUnit XML reports of suite runs (``--junitxml``)."""
    import xml.etree.ElementTree as ET

    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):
            name = case.get("name", "").split("@", 1)[0]  # under pytest-xdist a case's name ends in @its group
            found = re.match(r"test_(\w+?)\[(.*)-(fwd|fwdbwd)\]$", name)
            if not found:
                continue
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            outcome = "skipped" if case.find("skipped") is not None else "passed" if failure is None else "failed"
            first = "" if failure is None else (failure.get("message") or "").splitlines()[0][:150]
            ratios = {(p.get("name") or "").removeprefix("attnperf_check_"): float(p.get("value") or 0)
                      for p in case.iter("property") if (p.get("name") or "").startswith("attnperf_check_")}
            yield JUnitCase(found.group(1), found.group(2), found.group(3), outcome, first, ratios)


def junit_table(paths: list[str], known: tuple[str, ...]) -> str:
    """Per kernel, over JUnit XML reports of suite runs (``--junitxml``, check-only or not): cases
    passed, failed and skipped, the worst ``attnperf_check_*`` ratio of its passing cases, and its
    first failure's first line; zoo kernels' expectation (``zoo-ok``: no failure; ``zoo-bad``: at
    least one) checked."""
    stats: dict[str, dict[str, Any]] = {}
    for case in junit_cases(paths):
        params = case.params
        kernel = next((k for k in known if f"-{k}-" in f"-{params}-"), params.split("-")[-1])
        for prefix in ("zoo-ok-", "zoo-bad-"):
            if prefix in params:
                kernel = prefix + params.split(prefix, 1)[1]
        entry = stats.setdefault(kernel, {"passed": 0, "failed": 0, "skipped": 0, "worst": 0.0, "first": ""})
        entry[case.outcome] += 1
        if case.outcome == "failed":
            entry["first"] = entry["first"] or case.first
        elif case.outcome == "passed":
            entry["worst"] = max([entry["worst"], *case.ratios.values()])
    lines = ["| kernel | passed | failed | skipped | worst passing ratio | as expected | first failure |",
             "|---|---|---|---|---|---|---|"]
    for kernel, e in sorted(stats.items()):
        expected = ("yes" if e["failed"] == 0 else "NO") if kernel.startswith("zoo-ok") else (
            ("yes" if e["failed"] > 0 else "NO") if kernel.startswith("zoo-bad") else (
                "yes" if e["failed"] == 0 else "NO"))
        lines.append(f"| {kernel} | {e['passed']} | {e['failed']} | {e['skipped']} | {e['worst']:.3g} | {expected} | "
                     f"{e['first']} |")
    return "\n".join(lines)


DTYPES_IN_IDS = ("bf16", "fp16", "fp32")


def junit_margins(paths: list[str]) -> str:
    """Per family, dtype and direction, over JUnit XML reports of suite runs: the correct zoo's and
    the built-in kernels' tests, failures, and worst ``attnperf_check_*`` ratio of their passing
    tests, for the output and for the gradients (a ratio over 1 fails; its distance from 1 is the
    margin; "-" where no passing test had one). Wrong-zoo kernels are left out."""
    groups: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for function, params, direction, outcome, _, ratios in junit_cases(paths):
        tokens = params.split("-")
        at = next((i for i, t in enumerate(tokens) if t in DTYPES_IN_IDS), None)
        if "zoo-bad-" in params or outcome == "skipped" or at is None:
            continue
        family = function if function != "linear" else tokens[at + 1]
        kind = "correct zoo" if "zoo-ok-" in params else "built-in"
        entry = groups.setdefault((family, tokens[at], direction, kind),
                                  {"tests": 0, "failed": 0, "out": None, "grad": None})
        entry["tests"] += 1
        if outcome == "failed":
            entry["failed"] += 1
            continue
        for tensor, ratio in ratios.items():
            side = "out" if tensor == "out" else "grad"
            entry[side] = max(entry[side] or 0.0, ratio)

    def shown(ratio: float | None) -> str:  # "-": no passing test had that tensor
        return "-" if ratio is None else f"{ratio:.3g}"

    lines = ["| family | dtype | direction | kernels | tests | failed | worst ratio, output | worst ratio, gradients |",
             "|---|---|---|---|---|---|---|---|"]
    for (family, dtype, direction, kind), e in sorted(groups.items()):
        lines.append(f"| {family} | {dtype} | {direction} | {kind} | {e['tests']} | {e['failed']} | "
                     f"{shown(e['out'])} | {shown(e['grad'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--families", default=",".join(("softmax", *linear.FAMILIES)))
    parser.add_argument("--cases", default="", help="regular expression over case ids (default: every case)")
    parser.add_argument("--errors", default=",".join(str(e) for e in ERRORS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="power.jsonl")
    parser.add_argument("--kernels", action="store_true", help="measure registered kernels' margins instead")
    parser.add_argument("--zoo", action="append", default=[], help="a module registering more kernels (repeatable)")
    parser.add_argument("--kernel-pattern", default="", help="regular expression over kernel names")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--neighbours", default=str(checks.NEIGHBOURS))
    parser.add_argument("--autotune", default="", help="a baselines' <hw>.autotune folder: its Triton choices are used")
    parser.add_argument("--tf32-products", action="store_true",
                        help="the fp32 chunk yardstick's products take TF32 operands on any device, as on a GPU")
    parser.add_argument("--junit", nargs="+", default=[],
                        help="summarise these JUnit XML reports instead: per kernel, then the margins per dtype")
    args = parser.parse_args(argv)
    if args.junit:
        found = registry(args.zoo)
        known = sorted({k.name for f in args.families.split(",") for k in found.family(f)}, key=len, reverse=True)
        print(junit_table(args.junit, tuple(known)))
        print()
        print(junit_margins(args.junit))
        return 0
    if args.autotune:  # before triton is imported: fla's kernels then skip autotuning
        import os
        import tempfile

        from pytest_attnperf.store.autotune import install

        cache = Path(tempfile.mkdtemp(prefix="power-triton-"))
        choices, problems = install(Path(args.autotune), cache)
        os.environ["TRITON_CACHE_DIR"] = str(cache)
        print(f"{len(choices)} autotune choices installed into {cache}; {len(problems)} problems", flush=True)
    if args.tf32_products:  # what tl.dot does with fp32 tiles on a GPU (docs/checks.md, "TF32 products")
        from pytest_attnperf.families import tf32

        tf32.rounds_products = lambda device: True
    if args.kernels:
        print(margin_table(margins(args), args.neighbours.split(",")))
    else:
        print(table(measure(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
