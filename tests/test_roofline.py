"""The roofline: pure functions with known answers, measured and cached ceilings, and floors
judged end to end under pytester with fake hardware and a scripted timer.

The scripted timer (tests/kit.py's) gives a case 20 samples around 1 ms times the factor
``speed.json`` gives its test; here, a ceiling's workload (``fn.ceiling``) takes the time its
work needs at the rate ``rates.json`` gives it (bf16 and fp16 100 TFLOP/s, fp32 10, copy
1 TB/s by default), and every ceiling it times is counted in ``ceiling_calls.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import kit
import pytest

from pytest_attnperf import floors
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.gate.physics import judge
from pytest_attnperf.gate.roofline import (
    Ceiling,
    Floor,
    Floors,
    Position,
    attainable_flops,
    bound,
    intensity,
    judge_floor,
    median_sigma,
    ridge,
    roofline_fraction,
)
from pytest_attnperf.hw import ceilings
from pytest_attnperf.hw.ceilings import Ceilings, Measured, cpu_matmul_side
from pytest_attnperf.hw.table import TABLE, DetectedDevice, unlisted_spec
from pytest_attnperf.options import peaks, user_cache

PLUGIN = (*kit.PLUGIN, "-p", "no:randomly")

CONFTEST = kit.conftest("cpu") + '''
RATES = {"matmul-bf16": 100e12, "matmul-fp16": 100e12, "matmul-fp32": 10e12, "copy": 1e12}


class RooflineTimer(ScriptedTimer):
    """The ceilings' callables are never called (nothing is allocated): each is timed at RATES
    (or rates.json's), and counted in ceiling_calls.json."""

    def measure(self, fn, plan):
        ceiling = getattr(fn, "ceiling", None)
        if ceiling is None:
            return super().measure(fn, plan)
        calls = read_json("ceiling_calls.json", {})
        calls[ceiling] = calls.get(ceiling, 0) + 1
        (HERE / "ceiling_calls.json").write_text(json.dumps(calls))
        ms = 1e3 * (fn.flops or fn.bytes) / {**RATES, **read_json("rates.json", {})}[ceiling]
        return Measurement((ms,) * plan.min_samples, clock="scripted", mode=plan.mode)


def pytest_attnperf_make_timer(config, device):
    return RooflineTimer()
'''

# 1e11 FLOP and 1e8 bytes (1000 FLOP/B) in 1 ms: 100 TFLOP/s, 100 GB/s. Against the scripted
# ceilings (bf16 100 TFLOP/s, 1 TB/s: ridge 100 FLOP/B) it is compute bound and on the roofline,
# so its roofline fraction is 1 / its speed factor.
TESTS = '''
import pytest

from pytest_attnperf.costs import Cost

COST = Cost(flops=1e11, bytes=1e8)


@pytest.mark.attnperf_floor(roofline=0.5)
def test_floor(attnperf):
    attnperf.measure(lambda: None, cost=COST, dtype="bf16")


@pytest.mark.attnperf_floor(h200=dict(roofline=0.99), z9000=dict(mfu=0.99))
def test_other_cards(attnperf):
    attnperf.measure(lambda: None, cost=COST, dtype="bf16")


@pytest.mark.attnperf_floor(roofline=0.99, hw="h200")
def test_hw_keyword(attnperf):
    attnperf.measure(lambda: None, cost=COST, dtype="bf16")


@pytest.mark.attnperf_floor(cpu=dict(roofline=0.9), roofline=0.1)
def test_own_card_first(attnperf):
    attnperf.measure(lambda: None, cost=COST, dtype="bf16")


def test_plain(attnperf):
    attnperf.measure(lambda: None, cost=Cost(flops=1e9, bytes=1e8), dtype="fp32")
'''


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setattr(ceilings, "CPU_MATMUL_N", (64,))  # no probe calls on this machine's CPU
    return kit.make_project(pytester, CONFTEST, test_cases=TESTS)


def set_speed(pytester: pytest.Pytester, **factors: float) -> None:
    kit.set_speeds(pytester, {f"test_{k}": v for k, v in factors.items()})


def ceiling_calls(pytester: pytest.Pytester) -> dict[str, int]:
    path = pytester.path / "ceiling_calls.json"
    return json.loads(path.read_text()) if path.exists() else {}


def cache_files() -> list[Path]:
    return sorted(user_cache(*ceilings.CACHE_FOLDER).glob("*.json"))


def failure(result: pytest.RunResult, test: str) -> str:
    out = result.stdout.str()
    start = out.index(f"_ {test} _")
    return out[start:out.index("\n_", start + 1) if "\n_" in out[start + 1:] else len(out)]


# -- pure functions --------------------------------------------------------------------------


def test_intensity_attainable_ridge_and_bound_have_known_answers() -> None:
    assert intensity(4e12, 1e9) == 4000.0
    assert math.isinf(intensity(1.0, 0.0))
    assert ridge(1000e12, 4e12) == 250.0
    assert attainable_flops(100.0, 1000e12, 4e12) == 400e12  # under the ridge: bandwidth x intensity
    assert attainable_flops(500.0, 1000e12, 4e12) == 1000e12  # over it: the peak
    assert attainable_flops(math.inf, 1000e12, 4e12) == 1000e12
    assert bound(250.0, 250.0) == "compute"
    assert bound(249.9, 250.0) == "memory"


def test_roofline_fraction_is_achieved_over_attainable() -> None:
    # memory bound: 100 FLOP/B, 2e11 FLOP and 2e9 bytes in 1 ms = 2 TB/s of 4: 50%
    assert roofline_fraction(2e11, 2e9, 1e-3, 1000e12, 4e12) == pytest.approx(0.5)
    # compute bound: 500 FLOP/B, 5e11 FLOP in 1 ms = 500 TFLOP/s of 1000: 50%
    assert roofline_fraction(5e11, 1e9, 1e-3, 1000e12, 4e12) == pytest.approx(0.5)
    # a copy (no FLOPs) is judged on its bandwidth
    assert roofline_fraction(0.0, 4e9, 1e-3, 1000e12, 4e12) == pytest.approx(1.0)
    where = Position(2e11, 2e9, 1e-3, Ceiling(1000e12, "measured"), Ceiling(4e12, "spec"))
    assert where.fraction == pytest.approx(2e11 / 1e-3 / where.attainable_flops)
    assert (where.bound, where.sources) == ("memory", "peak measured, bandwidth spec")
    with pytest.raises(ValueError, match="cannot take"):
        roofline_fraction(1.0, 1.0, 0.0, 1.0, 1.0)


def test_median_sigma_combines_the_interval_and_the_gate_noise_floor() -> None:
    # a 95% interval 1.96 us wide around 1 ms: a half width of 0.98 us is 0.05% sd, with the 0.5% floor
    assert median_sigma(1.0, 0.99902, 1.00098, 0.005, 0.0) == pytest.approx(math.hypot(0.0005, 0.005), rel=1e-3)
    # a 10 us median: 0.1 us of --attnperf-run-noise-time is 1%, over the 0.5% floor
    assert median_sigma(0.01, 0.01, 0.01, 0.005, 0.0001) == pytest.approx(0.01)


def test_judge_floor_fails_only_beyond_the_noise() -> None:
    assert judge_floor("roofline", 0.6, 0.5, 0.005).status == "passed"
    assert judge_floor("roofline", 0.495, 0.5, 0.005).status == "within noise"  # 0.495 x 1.015 >= 0.5
    assert judge_floor("roofline", 0.49, 0.5, 0.005).status == "failed"  # 0.49 x 1.015 < 0.5
    check = judge_floor("mfu", None, 0.5, 0.005)
    assert check.status == "no ceiling"
    assert check.failed


def test_floors_parse_one_shape_for_marker_and_registration() -> None:
    assert Floors.parse({"roofline": 0.5}).for_hw("gb10") == (Floor(roofline=0.5), None)
    per_card = Floors.parse({"h200": {"roofline": 0.6}, "gb10": {"roofline": "30%"}})
    assert per_card.for_hw("h200") == (Floor(roofline=0.6), "h200")
    assert per_card.for_hw("GB10") == (Floor(roofline=0.3), "gb10")
    assert per_card.for_hw("a100") is None
    limited = Floors.parse({"mfu": 0.4, "hw": ["h200", "h100"]})
    assert limited.for_hw("h100") == (Floor(mfu=0.4), "h100")
    assert limited.for_hw("a100") is None
    assert Floors.parse(per_card) is per_card
    assert Floors.parse(None) == Floors()
    for bad, message in (
        ({"roofine": 0.5}, "'roofine' is neither a floor metric"),
        ({"roofline": 1.5}, "must be above 0 and at most 1"),
        ({"roofline": "half"}, "is not a fraction"),
        ({"h200": {"roofline": 0.5, "flops": 1}}, "unknown floor metric flops"),
        ({"hw": "h200"}, "without a floor metric"),
        (0.5, "must be a mapping"),
    ):
        with pytest.raises(ValueError, match=message):
            Floors.parse(bad)


def test_a_kernel_with_bad_floors_is_refused_at_registration() -> None:
    with pytest.raises(ValueError, match="kernel 'k' in family 'f': .*must be above 0"):
        Kernel("f", "k", lambda: None, floors={"h200": {"roofline": 2}})
    assert Kernel("f", "k", lambda: None, floors={"roofline": 0.5}).floors == Floors(Floor(roofline=0.5))


def test_cpu_matmul_side_grows_while_a_call_stays_short() -> None:
    fast = {256: 0.001, 512: 0.008, 1024: 0.064}
    assert cpu_matmul_side(fast.__getitem__, (256, 512, 1024)) == 1024
    slow_bf16 = {256: 0.05}  # 8 x 0.05 s is over 0.2 s: the next side is not tried
    assert cpu_matmul_side(slow_bf16.__getitem__, (256, 512, 1024)) == 256


def test_the_impossible_speed_limits_are_the_higher_of_measured_and_spec_unless_the_user_gives_one() -> None:
    measured = Measured((("bf16", 700e12), ("fp16", None), ("fp32", 80e12)), 4243e9, "2026-01-01")
    h200 = Ceilings(TABLE["h200"], measured, user=(("fp16", 900e12),))
    assert h200.limit_bandwidth() == Ceiling(4800e9, "spec")  # a read stream may beat the measured copy
    assert h200.roofline_bandwidth() == Ceiling(4243e9, "measured")  # the roofline keeps the measured one
    assert h200.limit_peak("bf16") == Ceiling(989.5e12, "spec")
    assert h200.limit_peak("fp32") == Ceiling(80e12, "measured")  # measured above the spec's 66.9
    assert h200.limit_peak("fp16") == Ceiling(900e12, "user")
    unlisted = Ceilings(unlisted_spec(DetectedDevice("cuda", "NVIDIA Z9000", (12, 0))), measured)
    assert unlisted.limit_bandwidth() == Ceiling(4243e9, "measured")
    # a decode kernel reading 4.29 GB in 971 us (the H200's cuDNN at B=32 over a 32K cache): 104% of
    # the copy ceiling, possible against the card's memory; the same bytes in a third of the time are not
    kv = 2 * 32 * 8 * 32768 * 128 * 2
    assert judge(0.0, kv, 971e-6, "bf16", None, h200.limit_bandwidth()).status == "possible"
    assert judge(0.0, kv, 971e-6, "bf16", None, h200.roofline_bandwidth()).fraction == pytest.approx(1.043, abs=1e-3)
    assert judge(0.0, kv, 971e-6 / 3, "bf16", None, h200.limit_bandwidth()).status == "impossible"


def test_ceilings_order_user_then_measured_then_spec_for_the_roofline() -> None:
    measured = Measured((("bf16", 700e12), ("fp16", None), ("fp32", 50e12)), 4000e9, "2026-01-01")
    h200 = Ceilings(TABLE["h200"], measured, user=(("fp32", 60e12),))
    assert h200.roofline_peak("bf16") == Ceiling(700e12, "measured")
    assert h200.rate_peak("bf16") == Ceiling(989.5e12, "spec")  # a card in the table keeps its MFU peak
    assert h200.roofline_peak("fp16") == Ceiling(989.5e12, "spec")  # not measured: the spec's
    assert h200.roofline_peak("fp32") == h200.rate_peak("fp32") == Ceiling(60e12, "user")
    assert h200.roofline_bandwidth() == Ceiling(4000e9, "measured")
    unlisted = Ceilings(unlisted_spec(DetectedDevice("cuda", "NVIDIA Z9000", (12, 0))), measured)
    assert unlisted.rate_peak("bf16") == Ceiling(700e12, "measured")
    assert unlisted.rate_peak("fp16") is None


def test_a_cache_file_is_read_only_for_its_own_stack() -> None:
    stack = {"device": "NVIDIA H200", "torch": "2.13.0", "cuda": "13.0", "driver": "580"}
    measured = Measured((("bf16", 772e12), ("fp16", 770e12), ("fp32", None)), 4220e9, "2026-01-01",
                        (("bf16", "8192^3"),), ("fp32 not measured: x",))
    data = json.loads(json.dumps(measured.to_json(stack)))
    assert Measured.from_json(data, stack) == dataclasses.replace(measured, cached=True)
    assert Measured.from_json(data, {**stack, "torch": "2.14.0"}) is None
    assert Measured.from_json({**data, "format": 0}, stack) is None
    assert Measured.from_json({**data, "gb_per_s": -1}, stack) is None


def test_peaks_option_parses_units_and_refuses_bad_keys() -> None:
    assert peaks("bf16=990, bw=4800") == (("bf16", 990e12), ("bw", 4800e9))
    assert peaks("") == ()
    for bad, message in (("bf16", "is not KEY=NUMBER"), ("tf32=10", "is not KEY=NUMBER"),
                         ("bw=-1", "a peak must be a positive number"), ("fp16=x", "could not convert")):
        with pytest.raises(ValueError, match=message):
            peaks(bad)


# -- end to end ------------------------------------------------------------------------------


def test_a_case_below_its_floor_fails_with_achieved_floor_ceiling_and_bound_and_is_not_recorded(
        project: pytest.Pytester) -> None:
    """One recording run: the case below its floor fails, its message naming what it achieved, the
    floor, the ceiling and the bound; floors are checked when recording, and the recording below
    its floor is not written (the other case's is)."""
    set_speed(project, floor=2.5)  # 40% of the roofline, floor 50%
    result = project.runpytest(*PLUGIN, "--update-baselines", "test_cases.py::test_floor", "test_cases.py::test_plain")
    result.assert_outcomes(passed=1, failed=1)
    text = failure(result, "test_floor")
    assert "BELOW FLOOR (the floor for every card, from @pytest.mark.attnperf_floor):" in text
    assert "roofline: achieved 40.0% against floor 50.0%, below it by more than the noise" in text
    assert "attainable 100.00 TFLOP/s = bf16 peak 100.0 TFLOP/s (measured)" in text
    assert "the case is compute bound (1000.0 FLOP/B >= ridge 100.0 FLOP/B)" in text
    assert "bound: compute; this run: median 2.5 ms" in text
    assert sorted(kit.entries(project, "cpu")) == ["test_cases.py::test_plain"]


def test_cases_above_their_floors_pass_and_show_their_roofline_and_a_floor_is_for_its_own_card(
        project: pytest.Pytester) -> None:
    """One run of every case of ``TESTS``:

    - a case above its floor passes, and the summary shows its roofline, the ceilings and the ridge;
    - the benchmark JSON carries the roofline: fraction, bound, ceilings, ridge, the floor's check;
    - a floor for another card is not applied (per-card floors, the hw keyword), and a card's own
      floor comes before the floor for every card.
    """
    set_speed(project, floor=1.25, other_cards=5.0, hw_keyword=5.0, own_card_first=1.25)  # 80%, 20%, 20%, 80%
    result = project.runpytest(*PLUGIN, "test_cases.py", "--benchmark-json=out.json")
    result.assert_outcomes(passed=4, failed=1)  # own_card_first: the cpu's own floor (0.9) wins over the any-card 0.1
    assert "BELOW FLOOR (the cpu floor, from @pytest.mark.attnperf_floor)" in failure(result, "test_own_card_first")
    # test_floor: 80 TFLOP/s = 80% of the measured bf16 peak and of the roofline;
    # test_plain: 1e9 FLOP over 1e8 bytes = 10 FLOP/B, at fp32's ridge (10e12 / 1e12 = 10 FLOP/B):
    # compute bound, 1 TFLOP/s of 10 = 10%
    result.stdout.fnmatch_lines([
        "*test_floor*80.0*80.0*1000*cmp*80.0*new*",
        "*test_plain*1.00*10.0*10*cmp*10.0*new*",
        "ceilings (measured *; TFLOP/s, fp32 without TF32): bf16 100.0 measured, fp16 100.0 measured, "
        "fp32 10.0 measured, copy (GB/s) 1000.0 measured",
        "roofline ridge (bf16): 100.0 FLOP/B from the measured peak and measured bandwidth",
    ])
    info = {b["name"]: b for b in kit.benchmarks(project, "out.json")}["test_floor"]["extra_info"]
    assert info["roofline_frac"] == pytest.approx(0.8, rel=1e-3)
    assert info["roofline_bound"] == "compute"
    assert info["roofline_peak_tflops"] == pytest.approx(100.0)
    assert info["roofline_gb_per_s"] == pytest.approx(1000.0)
    assert info["roofline_ceilings"] == "measured"
    assert info["roofline_ridge_flop_per_byte"] == pytest.approx(100.0)
    assert info["floor_checks"][0]["status"] == "passed"
    assert info["floor_checks"][0]["floor"] == 0.5
    assert info["mfu"] == pytest.approx(0.8, rel=1e-3)  # the CPU has no spec peak: measured


def test_a_case_within_noise_of_its_floor_passes_with_a_note(project: pytest.Pytester) -> None:
    set_speed(project, floor=2.02)  # 49.5%: 0.495 x (1 + 3 x 0.5%) >= 0.5
    result = project.runpytest(*PLUGIN, "test_cases.py::test_floor")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["note: test_floor: roofline 49.5% is below its floor 50.0% within noise*passed"])
    set_speed(project, floor=2.1)  # 47.6%: beyond the noise
    project.runpytest(*PLUGIN, "test_cases.py::test_floor").assert_outcomes(failed=1)


def test_a_user_peak_overrides_measured_and_spec(project: pytest.Pytester) -> None:
    set_speed(project, floor=1.25)  # 80 TFLOP/s: 40% of a user's 200
    result = project.runpytest(*PLUGIN, "test_cases.py::test_floor", "--attnperf-peaks=bf16=200,bw=2000")
    result.assert_outcomes(failed=1)
    text = failure(result, "test_floor")
    assert "roofline: achieved 40.0% against floor 50.0%" in text
    assert "bf16 peak 200.0 TFLOP/s (user)" in text
    result.stdout.fnmatch_lines(["*bf16 200.0 user / 100.0 measured*copy (GB/s) 2000.0 user / 1000.0 measured*"])


def test_the_spec_is_the_ceiling_where_nothing_is_measured(project: pytest.Pytester,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake H200 with no CUDA here: the ceilings cannot be measured, and the message names the
    spec figure it used."""
    monkeypatch.setenv("FAKE_DEVICE", "h200")
    (project.path / "test_h200.py").write_text(
        "import pytest\nfrom pytest_attnperf.costs import Cost\n\n\n"
        "@pytest.mark.attnperf_floor(h200=dict(roofline=0.6))\ndef test_h(attnperf):\n"
        "    attnperf.measure(lambda: None, cost=Cost(flops=4.9475e11, bytes=1e8), dtype='bf16')\n")
    result = project.runpytest(*PLUGIN, "test_h200.py", "--hw=h200")
    result.assert_outcomes(failed=1)
    text = failure(result, "test_h")
    assert "roofline: achieved 50.0% against floor 60.0%" in text
    assert "bf16 peak 989.5 TFLOP/s (spec)" in text
    assert "ceilings (not measured: RuntimeError: no CUDA device" in result.stdout.str()
    assert ceiling_calls(project) == {}


def test_a_floor_with_nothing_to_judge_against_fails(project: pytest.Pytester) -> None:
    result = project.runpytest(*PLUGIN, "test_cases.py::test_floor", "--attnperf-ceilings=off")
    result.assert_outcomes(failed=1)
    text = failure(result, "test_floor")
    assert "roofline: floor 50.0% cannot be judged: no roofline: not measured (--attnperf-ceilings=off)" in text
    assert ceiling_calls(project) == {}


def test_the_cache_is_used_on_the_second_run_and_invalidated_by_another_stack(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    # a quiet host, whatever this machine's load: ceilings taken on a contended one are not cached
    # (tests/test_faults_ceilings.py), and this test is about the cache's key
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    args = (*PLUGIN, "test_cases.py::test_plain", "--attnperf-machine=box")
    project.runpytest(*args).assert_outcomes(passed=1)
    assert ceiling_calls(project) == {"matmul-bf16": 1, "matmul-fp16": 1, "matmul-fp32": 1, "copy": 1}
    (first,) = cache_files()
    assert first.name == f"box-torch{torch.__version__}-cudanone.json"
    again = project.runpytest(*args)
    again.assert_outcomes(passed=1)
    assert set(ceiling_calls(project).values()) == {1}  # not measured again
    assert ", from the cache" in again.stdout.str()
    project.runpytest(*args, "--attnperf-ceilings=refresh").assert_outcomes(passed=1)
    assert set(ceiling_calls(project).values()) == {2}
    version = torch.__version__
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    project.runpytest(*args).assert_outcomes(passed=1)
    assert set(ceiling_calls(project).values()) == {3}
    assert [p.name for p in cache_files()] == [first.name, "box-torch9.9.9-cudanone.json"]
    monkeypatch.setattr(torch, "__version__", version)
    first.write_text(first.read_text().replace('"format": 1', '"format": 0'))  # a stale format: measured again
    project.runpytest(*args).assert_outcomes(passed=1)
    assert set(ceiling_calls(project).values()) == {4}


def test_a_bad_floor_marker_is_a_usage_error(project: pytest.Pytester) -> None:
    project.makepyfile(test_bad="import pytest\n\n\n@pytest.mark.attnperf_floor(roofine=0.5)\ndef test_x():\n"
                                "    pass\n")
    result = project.runpytest(*PLUGIN, "test_bad.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_x: attnperf_floor: 'roofine' is neither a floor metric*"])


KERNEL_TESTS = '''
from types import SimpleNamespace

import pytest

from pytest_attnperf.costs import Cost
from pytest_attnperf.families.registry import Kernel

STRICT = Kernel("fam", "strict", lambda: None, floors={"cpu": {"roofline": 0.9}})
CASE = SimpleNamespace(id="c1")


@pytest.mark.parametrize("case", [CASE], ids=["c1"])
@pytest.mark.parametrize("kernel", [STRICT], ids=["strict"])
def test_kernel(kernel, case, attnperf):
    attnperf.measure(lambda: None, cost=Cost(flops=1e11, bytes=1e8), dtype="bf16")


@pytest.mark.attnperf_floor(roofline=0.1)
@pytest.mark.parametrize("case", [CASE], ids=["c1"])
@pytest.mark.parametrize("kernel", [STRICT], ids=["strict"])
def test_marked(kernel, case, attnperf):
    attnperf.measure(lambda: None, cost=Cost(flops=1e11, bytes=1e8), dtype="bf16")
'''


def test_registration_floors_apply_and_the_built_in_table_and_a_marker_come_first(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    project.makepyfile(test_kernels=KERNEL_TESTS)
    kit.set_speeds(project, {"test_kernel[strict-c1]": 1.25, "test_marked[strict-c1]": 1.25})  # 80%
    result = project.runpytest(*PLUGIN, "test_kernels.py")
    result.assert_outcomes(passed=1, failed=1)  # the marker (10%) beats the registration (90%)
    assert "from the registration of kernel 'strict'" in failure(result, "test_kernel[strict-c1]")
    monkeypatch.setitem(floors.BUILTIN, ("fam", "strict", "c1", None), {"roofline": 0.7})
    project.runpytest(*PLUGIN, "test_kernels.py").assert_outcomes(passed=2)
    monkeypatch.setitem(floors.BUILTIN, ("fam", "strict", "c1", None), {"cpu": {"roofline": 0.85}})
    result = project.runpytest(*PLUGIN, "test_kernels.py")
    result.assert_outcomes(passed=1, failed=1)
    assert "(the cpu floor, from the built-in floors of fam/strict/c1)" in failure(result, "test_kernel[strict-c1]")


def test_a_failing_ceiling_costs_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """A timer that fails the fp16 matmul: the other ceilings are measured, fp16's reason kept."""
    from pytest_attnperf.measure.timing import Measurement, SamplingPlan

    class Timer:
        def measure(self, fn: Any, plan: SamplingPlan) -> Measurement:
            if fn.ceiling == "matmul-fp16":
                raise RuntimeError("no fp16 here")
            return Measurement((1.0,) * plan.min_samples, clock="scripted", mode=plan.mode)

    monkeypatch.setattr(ceilings, "CPU_MATMUL_N", (64,))
    got = ceilings.measure(Timer(), SamplingPlan(), kit.CPU)
    assert dict(got.flops) == {"bf16": pytest.approx(2 * 64**3 / 1e-3), "fp16": None,
                               "fp32": pytest.approx(2 * 64**3 / 1e-3)}
    assert got.bytes_per_s == pytest.approx(2 * ceilings.CPU_COPY_BYTES / 1e-3)
    assert got.notes == ("fp16 not measured: RuntimeError: no fp16 here",)


def test_floor_lookup_reads_the_callspec() -> None:
    kernel = Kernel("fam", "k", lambda: None, floors={"h200": {"mfu": 0.4}})
    # a stand-in for a pytest.Item with only what applicable() reads
    item = cast(pytest.Item, SimpleNamespace(
        get_closest_marker=lambda name: None, nodeid="t::x",
        callspec=SimpleNamespace(params={"kernel": kernel, "case": SimpleNamespace(id="c")})))
    assert floors.applicable(item, "h200") == (Floor(mfu=0.4), "h200", "the registration of kernel 'k'")
    assert floors.applicable(item, "gb10") is None


def test_the_summary_shows_bound_and_roofline_and_the_ceilings_once() -> None:
    from pytest_attnperf.outcome import Row
    from pytest_attnperf.report.summary import summary_lines

    ceilings_ = Ceilings(TABLE["h200"], why="not measured (--attnperf-ceilings=off)")

    def row(name: str, bound_: str | None, frac: float | None) -> Row:
        return Row(nodeid=f"t.py::test[{name}]", backend="-", median_ms=0.1, stdrel=0.01, tflops=1.0, mfu=None,
                   gb_per_s=1.0, bandwidth_frac=None, peak_mib=None, eager_ms=None, intensity=12.0, bound=bound_,
                   status="new", change_pct=None, roofline_frac=frac, ceilings=ceilings_)

    lines = summary_lines([row("m", "memory", 0.625), row("u", None, None)], "h200")
    header = lines[1].split()
    assert header[header.index("FLOP/B") + 1:header.index("FLOP/B") + 4] == ["bound", "roof", "%"]
    assert lines[3].split()[9:12] == ["12", "mem", "62.5"]
    assert lines[4].split()[9:12] == ["12", "-", "-"]
    assert lines[5:] == [
        "ceilings (not measured (--attnperf-ceilings=off); TFLOP/s, fp32 without TF32): bf16 989.5 spec, "
        "fp16 989.5 spec, fp32 66.9 spec, copy (GB/s) 4800.0 spec",
        "roofline ridge (bf16): 206.1 FLOP/B from the spec peak and spec bandwidth",
    ]


# -- impossible speeds -----------------------------------------------------------------------

# at the factor 1 ms, on the scripted ceilings: test_cached at the bf16 matmul ceiling (100
# TFLOP/s), test_streaming at the copy bandwidth (1 TB/s), test_honest likewise compute bound
PHYSICS_TESTS = '''
from pytest_attnperf.costs import Cost


def test_cached(attnperf):
    attnperf.measure(lambda: None, cost=Cost(flops=1e11, bytes=1e8), dtype="bf16")


def test_streaming(attnperf):
    attnperf.measure(lambda: None, cost=Cost(flops=1e9, bytes=1e9), dtype="bf16")


def test_honest(attnperf):
    attnperf.measure(lambda: None, cost=Cost(flops=1e11, bytes=1e8), dtype="bf16")
'''


@pytest.fixture
def physics(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """The project on an unlisted GPU, whose ceilings are measured (scripted), with the cases of
    ``PHYSICS_TESTS``: the first two at twice their ceiling, the third at 80% of it."""
    import torch

    monkeypatch.setenv("FAKE_DEVICE", "z9000")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the scripted timer allocates nothing
    project.makepyfile(test_physics=PHYSICS_TESTS)
    kit.set_speeds(project, {"test_cached": 0.5, "test_streaming": 0.5, "test_honest": 1.25})
    return project


def test_an_unlisted_card_gets_measured_ceilings_and_a_speed_above_them_fails_and_is_never_recorded(
        physics: pytest.Pytester) -> None:
    """One recording run on the unlisted card, of ``PHYSICS_TESTS`` and ``test_plain``:

    - the card's ceilings are measured, once each, and a case gets every percentage (MFU,
      bandwidth, roofline) against them, in the summary and the JUnit XML;
    - a speed above the measured ceilings fails as a wrong cost model or timer, naming the
      achieved rates against each ceiling and the roofline time; the JUnit XML says which cases'
      speeds were possible;
    - an impossible speed is never recorded (the possible ones are).
    """
    result = physics.runpytest(*PLUGIN, "test_physics.py", "test_cases.py::test_plain", "--attnperf-processes=1",
                               "--junitxml=j.xml", "--update-baselines")
    result.assert_outcomes(passed=2, failed=2)
    # test_plain: 1 TFLOP/s of fp32's measured 10: MFU 10%; 100 GB/s of 1 TB/s: 10%; roofline 10%
    result.stdout.fnmatch_lines(["attnperf on z9000: 4 measured cases*",
                                 "*test_plain*1.00*10.0*100.0*10.0*10*cmp*10.0*"])
    properties = kit.junit_properties(physics.path / "j.xml")
    assert properties["test_plain"]["attnperf_roofline_pct"] == "10.00"
    assert properties["test_plain"]["attnperf_bound"] == "compute"
    assert properties["test_plain"]["attnperf_ceilings"] == "measured"
    assert ceiling_calls(physics) == {"matmul-bf16": 1, "matmul-fp16": 1, "matmul-fp32": 1, "copy": 1}

    cached = failure(result, "test_cached")
    assert "IMPOSSIBLE SPEED: the cost model or the timer is wrong: 200.0% of the roofline, above the 105%" in cached
    assert "compute: achieved 200.00 TFLOP/s against the bf16 matmul ceiling 100.0 TFLOP/s (measured): 200.0%" in cached
    assert "memory: achieved 200.0 GB/s against the copy bandwidth ceiling 1000.0 GB/s (measured): 20.0%" in cached
    assert "cost model: 1e+11 FLOP, 1e+08 bytes; the roofline time is 1 ms, the median 0.5 ms" in cached
    assert "this run: median 0.5 ms" in cached
    streaming = failure(result, "test_streaming")
    assert "IMPOSSIBLE SPEED" in streaming
    assert "memory: achieved 2000.0 GB/s against the copy bandwidth ceiling 1000.0 GB/s (measured): 200.0%" in streaming
    assert properties["test_honest"]["attnperf_physics"] == "possible"
    assert properties["test_cached"]["attnperf_physics"] == "impossible"
    assert sorted(kit.entries(physics, "z9000")) == ["test_cases.py::test_plain", "test_physics.py::test_honest"]


def test_hot_mode_refuses_a_speed_above_the_matmul_ceiling_only(physics: pytest.Pytester) -> None:
    """Back-to-back calls may read their inputs from the L2, faster than the copy bandwidth."""
    result = physics.runpytest(*PLUGIN, "test_physics.py", "--attnperf-processes=1", "--attnperf-mode=hot")
    result.assert_outcomes(passed=2, failed=1)
    text = failure(result, "test_cached")
    assert "IMPOSSIBLE SPEED" in text
    assert "  memory:" not in text


def test_a_speed_above_the_vendor_peak_fails_where_nothing_is_measured(project: pytest.Pytester,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_DEVICE", "h200")  # no CUDA here: the spec's figures
    project.makepyfile(test_physics=PHYSICS_TESTS)
    kit.set_speeds(project, {"test_cached": 0.05, "test_streaming": 0.05})  # 2000 TFLOP/s; 20 TB/s
    result = project.runpytest(*PLUGIN, "test_physics.py", "--hw=h200")
    result.assert_outcomes(passed=1, failed=2)
    assert "against the bf16 matmul peak 989.5 TFLOP/s (vendor spec): 202.1%" in failure(result, "test_cached")
    assert "against the memory bandwidth peak 4800.0 GB/s (vendor spec): 416.7%" in failure(result, "test_streaming")


def test_on_the_cpu_the_check_does_not_run_and_the_summary_says_so(project: pytest.Pytester) -> None:
    project.makepyfile(test_physics=PHYSICS_TESTS)
    kit.set_speeds(project, {"test_cached": 0.5, "test_streaming": 0.5})
    result = project.runpytest(*PLUGIN, "test_physics.py")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["note: test_cached: impossible-speed check not run: the CPU's measured ceilings "
                                 "bound no case*"])
