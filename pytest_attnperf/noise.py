"""The noise benchmark: how steady the harness is, and what its gate catches.

    python -m pytest_attnperf.noise --runs 5 --inject 0.02,0.05,0.10 -- suites/ --hw=h200 -k softmax

1. records fresh baselines for the selected cases into a scratch folder;
2. runs the same cases ``--runs`` times with unchanged code, gating against them: each case's
   run-to-run spread of the reported median, and every (false) regression;
3. for each injected fraction, reruns with that much extra device work added to half of the
   cases (``pytest_attnperf.inject``): how many the gate caught, by kernel size, and how many
   untouched cases it flagged;
4. on a GPU, with ``--compare``, the harness's median against ``triton.testing.do_bench_cudagraph``
   on the same callables (one extra run).

Everything after ``--`` goes to pytest unchanged (tolerance, mode, budget included). A script,
not a test: it takes minutes of device time and asserts nothing; it reports.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from .inject import is_picked

__all__ = ["main"]


def _pytest(args: list[str], env: dict[str, str] | None = None) -> int:
    cmd = [sys.executable, "-m", "pytest", "-p", "pytest_attnperf.inject", "-q", "-p", "no:cacheprovider", *args]
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, check=False).returncode


def _medians_ms(path: Path) -> dict[str, float]:
    data = json.loads(path.read_text())
    return {b["fullname"]: b["stats"]["median"] * 1e3 for b in data["benchmarks"]}


def _regressed(path: Path) -> set[str]:
    """Node ids whose failure message says REGRESSED, from a JUnit XML report."""
    found = set()
    for case in ET.parse(path).getroot().iter("testcase"):
        failure = case.find("failure")
        if failure is not None and "REGRESSED" in (failure.get("message", "") + (failure.text or "")):
            module = case.get("classname", "").replace(".", "/") + ".py"
            found.add(f"{module}::{case.get('name')}")
    return found


def _size_class(ms: float) -> str:
    return ">=50us" if ms >= 0.05 else ">=10us" if ms >= 0.01 else "<10us"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--inject", default="0.02,0.05,0.10", help="fractions of extra work, comma-separated")
    parser.add_argument("--every", type=int, default=2, help="inject into cases with crc32(nodeid) %% EVERY == 0")
    parser.add_argument("--compare", action="store_true", help="also compare with do_bench_cudagraph (GPU)")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    args = [a for a in opts.pytest_args if a != "--"]
    work = opts.workdir or Path(tempfile.mkdtemp(prefix="attnperf-noise-"))
    work.mkdir(parents=True, exist_ok=True)
    gate = [*args, f"--attnperf-baselines={work}"]

    _pytest([*gate, "--update-baselines", "--benchmark-disable"])
    runs: list[dict[str, float]] = []
    false_regressions: list[set[str]] = []
    for i in range(opts.runs):
        _pytest([*gate, f"--benchmark-json={work}/run{i}.json", f"--junitxml={work}/run{i}.xml"])
        runs.append(_medians_ms(work / f"run{i}.json"))
        false_regressions.append(_regressed(work / f"run{i}.xml"))

    lines = [f"noise benchmark: {opts.runs} unchanged runs, pytest {' '.join(args)}", ""]
    lines.append(f"{'case':<78} {'median':>10} {'run-to-run':>10} {'false':>5}")
    for case in sorted(runs[0]):
        values = [r[case] for r in runs if case in r]
        spread = (max(values) - min(values)) / statistics.median(values)
        times_flagged = sum(case in f for f in false_regressions)
        lines.append(f"{case.rsplit('::', 1)[-1][:78]:<78} {statistics.median(values):>8.4f}ms "
                     f"{100 * spread:>9.2f}% {times_flagged:>5}")
    lines.append(f"false regressions over {opts.runs} unchanged runs: {sum(len(f) for f in false_regressions)}")

    base = {case: statistics.median(r[case] for r in runs if case in r) for case in runs[0]}
    for fraction in [float(f) for f in opts.inject.split(",") if f]:
        tag = f"inject{int(round(fraction * 1000))}"
        env = {"ATTNPERF_INJECT": str(fraction), "ATTNPERF_INJECT_EVERY": str(opts.every)}
        _pytest([*gate, "--benchmark-disable", f"--junitxml={work}/{tag}.xml"], env)
        flagged = _regressed(work / f"{tag}.xml")
        picked = {c for c in base if is_picked(c, opts.every)}
        for size in (">=50us", ">=10us", "<10us"):
            group = {c for c in picked if _size_class(base[c]) == size}
            if group:
                lines.append(f"+{100 * fraction:g}% on {len(group)} cases {size}: caught {len(group & flagged)}")
        lines.append(f"+{100 * fraction:g}%: untouched cases flagged: {len(flagged - picked)}")

    if opts.compare:
        compare = work / "compare.jsonl"
        _pytest([*gate, "--benchmark-disable"], {"ATTNPERF_COMPARE_FILE": str(compare)})
        rows = [json.loads(line) for line in compare.read_text().splitlines()] if compare.exists() else []
        ratios = [r["ours_ms"] / r["do_bench_ms"] for r in rows if r["do_bench_ms"] > 0]
        if ratios:
            worst = max(ratios, key=lambda x: abs(x - 1))
            lines.append(f"harness median / do_bench_cudagraph over {len(ratios)} cases: median "
                         f"{statistics.median(ratios):.3f}, worst {worst:.3f}")

    report = "\n".join(lines)
    (work / "report.txt").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
