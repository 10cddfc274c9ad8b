"""The plugin's surface: help, option values, the built-in suites in any run, the module-level
shape-table convention, data out (pytest-benchmark JSON, JUnit XML), check-only runs, and the
linear suite without flash-linear-attention."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import kit
import pytest

from pytest_attnperf.options import OPTIONS, read_settings

pytest_plugins = ["pytester"]

PLUGIN = kit.PLUGIN
HELP_MAX = 110  # characters in one option's help


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ATTNPERF_* variable from the calling shell leaks into a test."""
    for opt in OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)


# -- help -------------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("where", ["project", "empty"])
def test_help_lists_every_option(pytester: pytest.Pytester, flag: str, where: str) -> None:
    """--help and -h work with the plugin loaded, in a configured project and in an empty folder, and
    show the tuning options apart from the everyday ones."""
    if where == "project":
        pytester.makeini("[pytest]\nattnperf_tolerance = 3%\n")
        pytester.makeconftest("def pytest_attnperf_register_kernels(registry, config):\n    pass\n")
    result = pytester.runpytest(*PLUGIN, flag)
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    out = result.stdout.str()
    for opt in OPTIONS:
        assert opt.flag in out
        assert opt.ini in out
    assert "slowdown tolerated before a case fails (default 5%)" in re.sub(r"\s+", " ", out)
    # the everyday options in one group, the noise model and sampling in another
    everyday, tuning = out.index("attnperf: attention kernels"), out.index("attnperf tuning:")
    assert everyday < out.index("--attnperf-tolerance") < tuning
    assert out.index("--attnperf-machine-offset") > tuning
    assert out.index("--attnperf-budget") > tuning


def test_each_help_is_one_short_line_ending_with_its_default() -> None:
    """One sentence in user terms, its default last, no measured history (that is in docs/)."""
    for opt in OPTIONS:
        assert len(opt.help) <= HELP_MAX, opt.flag
        assert "\n" not in opt.help
        assert re.search(r"\(default[: ][^()]+\)$", opt.help), opt.flag
        assert not re.search(r"session|H200|measured on|\bwas\b", opt.help), opt.flag


def test_help_from_an_unrelated_folder_through_the_entry_point(tmp_path: Path) -> None:
    """``python -m pytest --help`` in a folder with no project, the plugin loaded by its entry
    point (this checkout's code first on the path)."""
    names = {ep.value for ep in importlib.metadata.entry_points(group="pytest11")}
    if "pytest_attnperf.plugin" not in names:
        pytest.skip("pytest-attnperf is not installed in this interpreter (no pytest11 entry point)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNPERF_", "PYTEST_"))}
    env["PYTHONPATH"] = str(kit.ROOT)
    done = subprocess.run([sys.executable, "-m", "pytest", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "--attnperf-tolerance" in done.stdout
    assert "(default 5%)" in done.stdout


# -- option values ----------------------------------------------------------------------------


def usage_error(pytester: pytest.Pytester, *args: str) -> str:
    with pytest.raises(pytest.UsageError) as info:
        read_settings(pytester.parseconfig(*PLUGIN, *args))
    return str(info.value)


@pytest.mark.parametrize("flag", ["--attnperf-tolerance", "--attnperf-run-noise", "--attnperf-machine-noise",
                                  "--attnperf-stdrel"])
def test_a_percentage_without_its_sign_is_refused(pytester: pytest.Pytester, flag: str) -> None:
    """'5' is not 500%: the error says what was probably meant."""
    assert usage_error(pytester, f"{flag}=5") == (
        f"attnperf: bad value '5' from {flag}: did you mean 5%? (write 5% or 0.05)")
    assert "did you mean 1.5%? (write 1.5% or 0.015)" in usage_error(pytester, f"{flag}=1.5")


@pytest.mark.parametrize(("given", "expected"), [("5%", 0.05), ("0.05", 0.05), ("0.999", 0.999), ("150%", 1.5)])
def test_a_percentage_or_a_fraction_below_one(pytester: pytest.Pytester, given: str, expected: float) -> None:
    settings = read_settings(pytester.parseconfig(*PLUGIN, f"--attnperf-tolerance={given}"))
    assert settings.tolerance == pytest.approx(expected)


@pytest.mark.parametrize("flag", ["--attnperf-budget", "--attnperf-tolerance", "--attnperf-stdrel",
                                  "--attnperf-machine-offset", "--attnperf-hot-sample", "--attnperf-run-noise-time"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN%"])
def test_a_float_must_be_finite(pytester: pytest.Pytester, flag: str, value: str) -> None:
    message = usage_error(pytester, f"{flag}={value}")
    assert flag in message
    assert repr(value) in message


def test_a_non_finite_budget_says_so(pytester: pytest.Pytester) -> None:
    assert usage_error(pytester, "--attnperf-budget=nan") == (
        "attnperf: bad value 'nan' from --attnperf-budget: must be a finite number")


@pytest.mark.parametrize(("given", "expected"), [("softmax", ("softmax",)), ("linear, softmax", ("softmax", "linear")),
                                                 ("all", ("softmax", "linear")), ("", ())])
def test_suites_are_named_or_all(pytester: pytest.Pytester, given: str, expected: tuple[str, ...]) -> None:
    assert read_settings(pytester.parseconfig(*PLUGIN, f"--attnperf-suites={given}")).suites == expected


def test_an_unknown_suite_is_a_usage_error(pytester: pytest.Pytester) -> None:
    assert "unknown suite flash: choose from softmax, linear or all" in usage_error(pytester, "--attnperf-suites=flash")


def test_check_only_and_update_baselines_exclude_each_other(pytester: pytest.Pytester) -> None:
    assert "--attnperf-check-only times nothing" in usage_error(pytester, "--attnperf-check-only", "--update-baselines")


def test_baselines_lie_beside_the_ini_file(pytester: pytest.Pytester) -> None:
    """Relative to the folder of the ini file, wherever pytest starts."""
    pytester.makepyprojecttoml("[tool.pytest.ini_options]\nattnperf_baselines = 'perf/base'\n")
    sub = pytester.mkdir("tests")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(sub)
        config = pytester.parseconfig(*PLUGIN, str(sub))
        assert read_settings(config).baselines_dir == pytester.path / "perf" / "base"


def test_without_an_ini_file_baselines_lie_where_pytest_runs(pytester: pytest.Pytester) -> None:
    """No ini file: the folder pytest was started in, not the rootdir worked out from the arguments."""
    sub = pytester.mkdir("work")
    (pytester.path / "other").mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(sub)
        config = pytester.parseconfig(*PLUGIN, str(pytester.path / "other"))
        assert config.inipath is None
        assert read_settings(config).baselines_dir == sub / "baselines"


# -- the built-in suites in any run -----------------------------------------------------------


def collected(result: pytest.RunResult) -> list[str]:
    return [line for line in result.stdout.lines if "::" in line]


def test_suites_option_adds_the_built_in_suite_to_any_run(pytester: pytest.Pytester) -> None:
    """In a folder of its own, --attnperf-suites=softmax collects the package's softmax suite,
    named by its place in the package."""
    pytester.makepyfile(test_mine="def test_mine():\n    pass\n")
    result = pytester.runpytest(*PLUGIN, "--attnperf-suites=softmax", "--collect-only", "-q")
    ids = collected(result)
    assert "test_mine.py::test_mine" in ids
    suite_ids = [i for i in ids if i.startswith("pytest_attnperf/families/softmax/suite.py::test_softmax[")]
    assert len(suite_ids) > 100
    assert len(suite_ids) == len(ids) - 1
    assert ("pytest_attnperf/families/softmax/suite.py::test_softmax[cpu-b2-h4-t128-d32-causal-fp32-sdpa-math-fwd]"
            in ids)
    assert not any("linear" in i for i in ids)
    both = collected(pytester.runpytest(*PLUGIN, "--attnperf-suites=all", "--collect-only", "-q"))
    assert any(i.startswith("pytest_attnperf/families/linear/suite.py::test_linear[") for i in both)


def test_a_suite_file_given_on_the_command_line_is_not_collected_twice(pytester: pytest.Pytester) -> None:
    import pytest_attnperf.families.softmax.suite as softmax

    alone = collected(pytester.runpytest(*PLUGIN, softmax.__file__, "--collect-only", "-q"))
    again = collected(pytester.runpytest(*PLUGIN, softmax.__file__, "--attnperf-suites=softmax", "--co", "-q"))
    assert len(again) == len(alone) > 100


# -- a shape table of one's own, data out, check-only ------------------------------------------

TOY_CONFTEST = kit.conftest(samples=kit.steps(5, centred=True)) + '''

class CheckingTimer(ScriptedTimer):
    def measure(self, fn, plan):
        if os.environ.get("TIMER_FORBIDDEN"):
            raise AssertionError("timed under --attnperf-check-only")
        return super().measure(fn, plan)


def pytest_attnperf_make_timer(config, device):
    return CheckingTimer()


def pytest_attnperf_register_kernels(registry, config):
    registry.kernel(family="toy", name="fast")(lambda x: x)
    registry.kernel(family="toy", name="fwd-only", backward=False)(lambda x: x)
    registry.kernel(family="toy", name="wrong")(lambda x: -x)
'''

TOY_TESTS = '''
from dataclasses import dataclass

from pytest_attnperf.costs import Cost


@dataclass(frozen=True)
class ToyCase:
    id: str
    size: int
    dtype: str = "bf16"
    gpu: bool = True


ATTNPERF_FAMILY = "toy"
ATTNPERF_CASES = (ToyCase("n8", 8), ToyCase("n16", 16))


def test_toy(case, kernel, direction, attnperf):
    assert kernel.fn(case.size) == case.size, f"{kernel.name} is wrong"  # the correctness check
    attnperf.measure(lambda: None, cost=Cost(flops=1e11, bytes=1e9), dtype=case.dtype)
'''


@pytest.fixture
def toy(pytester: pytest.Pytester) -> pytest.Pytester:
    return kit.make_project(pytester, TOY_CONFTEST, addopts="-p no:randomly", test_toy=TOY_TESTS)


def test_a_module_level_shape_table_needs_no_conftest_code(toy: pytest.Pytester) -> None:
    """ATTNPERF_FAMILY and ATTNPERF_CASES: kernels x cases x directions, less the combinations
    a kernel cannot take, which the summary reports as removed, not as deselected."""
    result = toy.runpytest(*PLUGIN, "-v")
    result.assert_outcomes(passed=6, failed=4)  # fast: 2 x 2, fwd-only: 2, wrong: 4 failing its check
    out = result.stdout.str()
    assert "test_toy.py::test_toy[n8-fast-fwdbwd] PASSED" in out
    assert "test_toy.py::test_toy[n16-fwd-only-fwd] PASSED" in out
    assert "fwd-only-fwdbwd" not in out
    result.stdout.fnmatch_lines(["2 kernel x case combinations removed at collection:",
                                 "*2 x fwd-only: fwd-only has no backward"])
    assert "deselected" not in out
    assert "collected 10 items" in out  # the 2 removed are never counted


def test_a_half_declared_shape_table_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_half="ATTNPERF_FAMILY = 'softmax'\n\ndef test_x(case):\n    pass\n")
    result = pytester.runpytest(*PLUGIN)
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*declares only one of ATTNPERF_FAMILY and ATTNPERF_CASES*"])


def test_benchmark_json_and_junit_xml_carry_each_cases_figures(toy: pytest.Pytester) -> None:
    """One gating run after a recording writes both:

    - the benchmark JSON holds plain data: parameters as the case's fields, the kernel's name and
      the direction; the timer by its clock; the cost and the baseline comparison in extra_info;
    - the JUnit XML carries each case's figures as properties: median, baseline, change, rate,
      MFU, verdict, roofline, bound, ceilings, physics and the timed draws verified.
    """
    toy.runpytest(*PLUGIN, "--update-baselines", "-k", "not wrong").assert_outcomes(passed=6)
    kit.set_speeds(toy, {"*": 1.02})
    gated = toy.runpytest(*PLUGIN, "-k", "not wrong", "--benchmark-json=out.json", "--junitxml=out.xml")
    gated.assert_outcomes(passed=6)
    text = (toy.path / "out.json").read_text()
    assert "UNSERIALIZABLE" not in text
    assert " object at 0x" not in text
    bench = {b["fullname"]: b for b in json.loads(text)["benchmarks"]}["test_toy.py::test_toy[n16-fast-fwdbwd]"]
    assert bench["params"] == {"case": {"id": "n16", "size": 16, "dtype": "bf16", "gpu": True},
                               "kernel": "fast", "direction": "fwdbwd"}
    assert bench["options"]["timer"] == "attnperf scripted clock"
    extra = bench["extra_info"]
    assert extra["flops"] == 1e11
    assert extra["bytes"] == 1e9
    assert extra["family"] == "toy"
    assert extra["baseline_ms"] == pytest.approx(1.0, rel=1e-3)
    assert extra["change_pct"] == pytest.approx(2.0, abs=0.05)

    props = kit.junit_properties(toy.path / "out.xml")["test_toy[n8-fast-fwd]"]
    assert set(props) == {"attnperf_median_ms", "attnperf_baseline_ms", "attnperf_change_pct", "attnperf_tflops",
                          "attnperf_mfu", "attnperf_verdict", "attnperf_roofline_pct", "attnperf_bound",
                          "attnperf_ceilings", "attnperf_physics", "attnperf_verified"}
    assert props["attnperf_physics"] == "possible"
    assert props["attnperf_verified"] == "0"  # a scripted timer checks no timed draws
    assert float(props["attnperf_median_ms"]) == pytest.approx(1.02, rel=1e-3)
    assert float(props["attnperf_baseline_ms"]) == pytest.approx(1.0, rel=1e-3)
    assert float(props["attnperf_change_pct"]) == pytest.approx(2.0, abs=0.05)
    assert float(props["attnperf_tflops"]) == pytest.approx(1e11 / 1.02e-3 / 1e12, rel=1e-3)
    assert 0 < float(props["attnperf_mfu"]) < 1
    assert props["attnperf_verdict"] == "unchanged"


def test_check_only_checks_everything_and_times_nothing(toy: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every check runs (the wrong kernel still fails), nothing is timed, gated or written."""
    monkeypatch.setenv("TIMER_FORBIDDEN", "1")
    result = toy.runpytest(*PLUGIN, "--attnperf-check-only", "--junitxml=out.xml")
    result.assert_outcomes(passed=6, failed=4)
    result.stdout.fnmatch_lines(["6 cases checked only (--attnperf-check-only): correctness checked; nothing timed, "
                                 "gated or recorded"])
    assert "measured cases" not in result.stdout.str()
    assert not (toy.path / "baselines").exists()
    verdicts = {p.get("value") for p in ET.parse(toy.path / "out.xml").getroot().iter("property")}
    assert verdicts == {"checked only"}


# -- the linear suite without flash-linear-attention -------------------------------------------


def test_linear_suite_without_fla_skips_with_the_install_hint(pytester: pytest.Pytester) -> None:
    """fla's kernels skip naming the extra to install; nothing fails. The run is in this process:
    its conftest.py blocks ``import fla`` (the suite's test of whether fla is there) for the run,
    and pytester puts the modules back after it."""
    pytester.makeconftest("import sys\n\nsys.modules['fla'] = None  # import fla now fails\n")
    result = pytester.runpytest_inprocess(*PLUGIN, "--attnperf-suites=linear", "-k", "cpu-b2-h2-t33-d16-fp32",
                                          "--attnperf-ceilings=off",  # nothing is timed: no ceiling is read
                                          "--benchmark-disable", "-p", "no:randomly", "-rs")
    result.assert_outcomes(skipped=24)  # 8 of fla's naive kernels on the CPU, 16 of its GPU kernels
    result.stdout.fnmatch_lines(["SKIPPED [[]8[]] *fla-naive needs flash-linear-attention (ModuleNotFoundError: "
                                 "*fla*): pip install pytest-attnperf[[]linear[]]"])
    import fla  # noqa: F401 - and back after the run
