"""The studies' report: case parameters, the tables built from cases, the files and their round
trip, and a CPU sweep run end to end with --attnperf-report (fake CPU device, scripted timer)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path
from typing import Any

import kit
import pytest

from pytest_attnperf.costs import Cost
from pytest_attnperf.families.layers.kernels import LadderCase
from pytest_attnperf.families.linear.kernels import LinearCase
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax.kernels import SoftmaxCase
from pytest_attnperf.report import studies as reportgen

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
HARDWARE = {"name": "h200", "peak_tflops": {"bf16": 989.0, "fp32": 67.0}, "hbm_gb_per_s": 4800.0}
ENVIRONMENT = {"device": "NVIDIA H200", "torch": "2.13.0", "date": "2026-01-01"}


def _case(nodeid: str, ms: float, params: dict[str, Any], peak_mib: float | None = None) -> dict[str, Any]:
    return {"nodeid": nodeid, "backend": "-", "median_ms": ms, "stdrel": 0.001, "tflops": 1.0, "mfu": 0.1,
            "gb_per_s": 100.0, "bandwidth_frac": 0.02, "peak_mib": peak_mib, "eager_ms": None,
            "intensity": 200.0, "bound": "compute", "status": "new", "change_pct": None, "notes": [],
            "params": params}


def sweep_cases() -> list[dict[str, Any]]:
    """A softmax kernel at T^2 (memory T), a slower one (memory T^2), and a linear kernel at T
    that meets the faster softmax at T = 4096."""
    cases = []
    for t in SEQS:
        for direction, factor in (("fwd", 1.0), ("fwdbwd", 3.0)):
            base = {"sweep": "seq-b4-h16-bf16", "axis": "seq", "seq": t, "batch": 4, "heads": 16, "dtype": "bf16",
                    "direction": direction}
            soft = {**base, "family": "softmax", "head_dim": 128, "causal": True}
            lin = {**base, "family": "linear_attn", "kernel": "fla-chunk", "form": "chunk", "key_dim": 128,
                   "value_dim": 128}
            softmax_ms = factor * t * t / 4096 / 1000
            cases.append(_case(f"s::flash-{t}-{direction}", softmax_ms, {**soft, "kernel": "sdpa-flash"},
                               peak_mib=t / 64))
            cases.append(_case(f"s::math-{t}-{direction}", 2 * softmax_ms, {**soft, "kernel": "sdpa-math"},
                               peak_mib=t * t / 2**20))
            cases.append(_case(f"l::la-{t}-{direction}", factor * t / 1000, lin, peak_mib=t / 32))
    return cases


def ladder_cases() -> list[dict[str, Any]]:
    cases = []
    for layer, ms in (("attention-flash", 2.0), ("attention-cudnn", 1.6), ("gdn", 3.2)):
        params = {"case": "h512", "batch": 32, "seq": 1024, "hidden": 512, "heads": 8, "head_dim": 64,
                  "dtype": "bf16", "expand_v": 2.0, "gpu": True, "layer": layer, "direction": "fwd"}
        cases.append(_case(f"t::{layer}", ms, params, peak_mib=1000.0))
    return cases


def test_case_params_flattens_kernel_case_and_fills_the_sweep_name() -> None:
    kernel = Kernel("gdn", "fla-chunk", lambda: None, form="chunk")
    case = LinearCase("b4-h16-t512-d128-bf16", 4, 16, 512, 128, 128, "bf16")
    got = reportgen.case_params({"case": case, "kernel": kernel, "direction": "fwdbwd"},
                                ("seq-b{batch}-h{heads}-{dtype}", "seq"), Cost(flops=2.0, bytes=3.0))
    assert got["case"] == case.id
    assert got["seq"] == 512
    assert got["key_dim"] == 128
    assert got["beta_max"] == 1.0
    assert (got["kernel"], got["family"], got["form"], got["direction"]) == ("fla-chunk", "gdn", "chunk", "fwdbwd")
    assert (got["sweep"], got["axis"], got["flops"], got["bytes"]) == ("seq-b4-h16-bf16", "seq", 2.0, 3.0)
    assert "tf32" not in got
    declared = Kernel("softmax", "mine", lambda: None, tf32=True)
    softmax = reportgen.case_params({"case": SoftmaxCase("x", 1, 2, 64, 32, "fp32", True), "kernel": declared},
                                    ("{nope}", "seq"), Cost(1.0, 1.0))
    assert softmax["tf32"] is True  # a kernel held to the TF32 yardstick says so in the report
    assert softmax["sweep"] == "{nope}"  # an unknown field leaves the name
    assert softmax["kv_heads"] is None
    json.dumps(softmax)  # plain data


def test_scaling_fits_the_known_exponents() -> None:
    report = reportgen.build(sweep_cases(), ENVIRONMENT, HARDWARE)
    fits = {(s["kernel"], s["direction"], s["quantity"]): s for s in report["scaling"]}
    for (kernel, quantity), want in {("sdpa-flash", "time_ms"): 2, ("sdpa-math", "time_ms"): 2,
                                     ("fla-chunk", "time_ms"): 1, ("sdpa-flash", "peak_mib"): 1,
                                     ("sdpa-math", "peak_mib"): 2, ("fla-chunk", "peak_mib"): 1}.items():
        fit = fits[(kernel, "fwdbwd", quantity)]
        assert fit["exponent"] == pytest.approx(want, abs=1e-9)
        assert fit["expected"] == want
        assert fit["ci_low"] <= want <= fit["ci_high"]
        assert fit["points"] == 6
    assert fits[("sdpa-flash", "fwd", "time_ms")]["x_min"] == 1024  # 4x the time at 512: the fit starts there


def test_crossover_against_the_fastest_softmax_and_the_cost_models() -> None:
    report = reportgen.build(sweep_cases(), ENVIRONMENT, HARDWARE)
    (fwd,) = [c for c in report["crossover"] if c["direction"] == "fwd"]
    assert fwd["status"] == "crossed"
    assert fwd["measured_t"] == pytest.approx(4096)
    assert {p["softmax_kernel"] for p in fwd["points"]} == {"sdpa-flash"}
    assert fwd["analytic_t"] == 383  # tests/test_studies.py: chunked LA against causal softmax at d=128
    assert fwd["layer_formula_t"] == 4 * 16 * 128 + 3 * 128


def test_crossover_beyond_the_sweep_when_linear_never_wins() -> None:
    cases = [c for c in sweep_cases() if c["params"]["family"] == "softmax" or c["params"]["seq"] <= 2048]
    slow = [dict(c, median_ms=c["median_ms"] * 100) if c["params"]["family"] != "softmax" else c for c in cases]
    report = reportgen.build(slow, ENVIRONMENT, HARDWARE)
    assert {c["status"] for c in report["crossover"]} == {"beyond the sweep"}
    assert all(c["measured_t"] is None for c in report["crossover"])


def test_ladder_rates_and_the_gdn_against_the_faster_attention() -> None:
    (gdn,) = [r for r in reportgen.build(ladder_cases(), ENVIRONMENT, HARDWARE)["ladder"] if r["layer"] == "gdn"]
    assert gdn["tokens_per_s"] == pytest.approx(32 * 1024 / 3.2e-3)
    assert gdn["us_per_token"] == pytest.approx(3.2e3 / (32 * 1024))
    assert gdn["vs_best_attention"] == pytest.approx(1.6 / 3.2)
    assert gdn["peak_gb"] == pytest.approx(1000 * 2**20 / 1e9)
    assert gdn["ridge"] == pytest.approx(989e3 / 4800)
    assert gdn["layer_formula_t"] == 4 * 512 + 3 * 128
    assert gdn["layer_model_t"] is not None
    assert gdn["layer_model_t"] > 0


def test_report_round_trip_regenerates_the_same_markdown(tmp_path: Path) -> None:
    report = reportgen.build(sweep_cases() + ladder_cases(), ENVIRONMENT, HARDWARE, {"sdpa-math: too big": 2})
    written = reportgen.write(report, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "report.json").read_text())
    assert saved["schema"] == reportgen.SCHEMA
    assert saved == json.loads(json.dumps(report))
    assert reportgen.main([str(tmp_path / "run" / "report.json"), str(tmp_path / "again")]) == 0
    md = (tmp_path / "run" / "report.md").read_text()
    assert md == (tmp_path / "again" / "report.md").read_text()
    assert "removed at collection: 2 x sdpa-math: too big" in md
    assert "| seq-b4-h16-bf16 | linear_attn/fla-chunk | fwd | 4096 |" in md
    pngs = sorted(p.name for p in written if p.suffix == ".png")
    if HAS_MATPLOTLIB:
        assert {"roofline.png", "time-seq-b4-h16-bf16-fwd.png", "memory-seq-b4-h16-bf16-fwd.png",
                "crossover-seq-b4-h16-bf16-fwdbwd.png"} <= set(pngs)
        assert all((tmp_path / "again" / name).stat().st_size > 1000 for name in pngs)
    else:
        assert pngs == []
        assert "No plots: matplotlib is not importable" in md


def test_a_report_of_another_schema_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.json").write_text(json.dumps({"schema": 99}))
    assert reportgen.main([str(tmp_path / "old.json"), str(tmp_path / "out")]) == 1
    assert "report schema 99; this version reads schema 1" in capsys.readouterr().err
    assert reportgen.main([]) == 2


SWEEP_CONFTEST = kit.conftest("cpu") + '''
import re


class SweepTimer(ScriptedTimer):
    """Softmax kernels take 1e-5 T^2 ms (naive 1.5x), linear ones 1e-3 T ms: they meet at T=100;
    forward+backward 3x; peak memory T^2 / 1000 MiB for the softmax ones, T / 10 for linear."""

    def factor(self, name, nodeid, fn):
        t = int(re.search(r"-t(\\d+)-", name).group(1))
        ms = (1e-5 * t * t * (1.5 if "-naive-" in name else 1.0)) if "test_sweep_softmax" in name else 1e-3 * t
        return ms * (3.0 if "fwdbwd" in name else 1.0)

    def peak_mib(self, name, nodeid):
        t = int(re.search(r"-t(\\d+)-", name).group(1))
        return t * t / 1000 if "test_sweep_softmax" in name else t / 10


def pytest_attnperf_make_timer(config, device):
    return SweepTimer()
'''


def test_cpu_sweep_writes_the_report(pytester: pytest.Pytester) -> None:
    """The CPU sweep (naive softmax and SDPA math against fla's naive linear attention) through the
    plugin: report.json's studies from the scripted times, report.md, and the PNGs with matplotlib."""
    shutil.copytree(kit.ROOT / "suites", pytester.path / "suites")
    kit.make_project(pytester, SWEEP_CONFTEST)
    result = pytester.runpytest_inprocess(  # in this process: torch, fla and the plugin loaded once
        "-p", "pytest_attnperf.plugin", "suites/test_sweep.py", "-k", "cpu and (softmax or linear_attn) and not t256",
        "--attnperf-report=out", "--benchmark-disable", "--attnperf-budget=0.01")
    result.assert_outcomes(passed=18)
    result.stdout.fnmatch_lines(["report: wrote *report.json, report.md and * plots (18 cases)"])
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    assert report["schema"] == 1
    assert len(report["cases"]) == 18
    assert report["environment"]["device"] == "x86_64"
    fits = {(s["kernel"], s["direction"], s["quantity"]): s for s in report["scaling"]}
    assert fits[("sdpa-math", "fwd", "time_ms")]["exponent"] == pytest.approx(2.0, abs=1e-6)
    assert fits[("fla-naive", "fwdbwd", "time_ms")]["exponent"] == pytest.approx(1.0, abs=1e-6)
    assert fits[("naive", "fwd", "peak_mib")]["exponent"] == pytest.approx(2.0, abs=1e-6)
    crossings = {c["direction"]: c for c in report["crossover"]}
    assert set(crossings) == {"fwd", "fwdbwd"}
    for entry in crossings.values():
        assert entry["sweep"] == "seq-b2-h2-fp32"
        assert entry["status"] == "crossed"
        assert entry["measured_t"] == pytest.approx(100.0)
        assert {p["softmax_kernel"] for p in entry["points"]} == {"sdpa-math"}
        assert isinstance(entry["analytic_t"], int)
        assert not math.isnan(entry["analytic_t"])
    md = (pytester.path / "out" / "report.md").read_text()
    assert "| seq-b2-h2-fp32 | linear_attn/fla-naive | fwd | 100 |" in md
    assert (pytester.path / "out" / "crossover-seq-b2-h2-fp32-fwd.png").exists() == HAS_MATPLOTLIB


def test_report_option_is_a_folder_from_the_invocation_directory(pytester: pytest.Pytester) -> None:
    from pytest_attnperf.options import read_settings

    assert read_settings(pytester.parseconfig("-p", "pytest_attnperf.plugin")).report_dir is None
    got = read_settings(pytester.parseconfig("-p", "pytest_attnperf.plugin", "--attnperf-report=out/r1")).report_dir
    assert got == pytester.path / "out" / "r1"


def test_attention_layer_is_checked_against_its_fp64_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from pytest_attnperf.families.layers import kernels as layers

    case = LadderCase("tiny", 2, 16, 32, 2, 16, "bf16")
    call = layers.run_layer("attention-flash", case, "fwd", torch.device("cpu"))
    assert call().shape == (2, 16, 32)
    grads = layers.run_layer("attention-cudnn", case, "fwdbwd", torch.device("cpu"))()
    assert len(grads) == 1 + 1 + 4  # output, d input, four weights
    assert grads[1].shape == (2, 16, 32)
    exact = layers.attention_reference
    monkeypatch.setattr(layers, "attention_reference", lambda layer, x: 1.05 * exact(layer, x))
    with pytest.raises(AssertionError, match="attention-flash layer output: normwise relative error 0.04"):
        layers.run_layer("attention-flash", case, "fwd", torch.device("cpu"))


def test_gdn_layer_fp64_evaluation_reads_the_fla_layer() -> None:
    """fla's layer runs on a GPU only; here its fp64 evaluation reads a CPU-built layer's weights."""
    import torch

    from pytest_attnperf.families.layers import kernels as layers

    case = LadderCase("tiny", 2, 8, 32, 2, 16, "fp32")
    module = layers.gdn_module(case)
    x = torch.randn(2, 8, 32)
    out = layers.gdn_reference(module, x)
    assert out.dtype == torch.float64
    assert out.shape == (2, 8, 32)
    assert torch.isfinite(out).all()
    with torch.no_grad():
        module.o_proj.weight.mul_(2.0)  # the output projection is read, not a copy made earlier
    assert torch.allclose(layers.gdn_reference(module, x), 2 * out)



def test_the_report_lists_correctness_failures(pytester: pytest.Pytester) -> None:
    """A failed check and a kernel that raised inside attnperf.measure are listed with their first
    line; a case that failed after its measurement is a row instead, and a test without attnperf's
    fixtures is not an attention case."""
    kit.make_project(pytester, test_cases=kit.FAILING_CASES)
    result = pytester.runpytest(*kit.PLUGIN, "--attnperf-report=out")
    result.assert_outcomes(passed=1, failed=4)
    result.stdout.fnmatch_lines(["report: wrote *report.json, report.md and * plots (2 cases, 2 correctness failures)"])
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    assert [(f["nodeid"], f["message"]) for f in report["failures"]] == [
        ("test_cases.py::test_case[raises]", "RuntimeError: kernel launch failed: invalid argument"),
        ("test_cases.py::test_case[wrong]", "o: 12 of 4096 elements outside the bound"),
    ]
    assert report["summary"]["failures"] == 2
    assert sorted(c["nodeid"] for c in report["cases"]) == ["test_cases.py::test_case[after]",
                                                            "test_cases.py::test_case[ok]"]
    md = (pytester.path / "out" / "report.md").read_text()
    assert "## Correctness failures" in md
    assert "- `test_cases.py::test_case[wrong]`: o: 12 of 4096 elements outside the bound" in md
    assert "- `test_cases.py::test_case[raises]`: RuntimeError: kernel launch failed: invalid argument" in md
