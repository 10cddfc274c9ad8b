"""Unit tests for ``pytest_attnperf.options``: command line > environment > ini > default.

Each test builds a real config with ``pytester.parseconfig`` (the plugin loaded with ``-p``)
and reads it with ``read_settings``; ``pytest_configure`` is not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_attnperf.options import OPTIONS, TUNING, Settings, read_settings

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ATTNPERF_* variable from the calling shell leaks into a test."""
    for opt in OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)


def settings(pytester: pytest.Pytester, *args: str) -> Settings:
    """Settings of a config parsed from ``args`` in pytester's folder."""
    config = pytester.parseconfig("-p", "pytest_attnperf.plugin", *args)
    return read_settings(config)


def usage_error(pytester: pytest.Pytester, *args: str) -> str:
    """The message of the usage error that reading these arguments raises."""
    with pytest.raises(pytest.UsageError) as info:
        settings(pytester, *args)
    return str(info.value)


def test_defaults(pytester: pytest.Pytester) -> None:
    """Nothing given: 5% tolerance, cold mode, no update, detected hardware, rootdir/baselines."""
    s = settings(pytester)
    assert s.tolerance == 0.05
    assert s.mode == "cold"
    assert s.update_baselines is False
    assert s.hw is None
    assert s.budget_s == 0.5
    assert s.target_stdrel == 0.005
    assert s.min_samples == 10
    assert s.machine_noise == pytest.approx(0.007)
    assert s.machine_offset_ms == pytest.approx(0.002)
    assert s.machine_residual_ms == pytest.approx(0.0005)
    assert s.run_noise_time_ms == pytest.approx(0.0001)
    assert s.cold_graphs == 8
    assert s.hot_sample_ms == 20.0  # do_bench_cudagraph's rep
    assert s.baselines_dir == pytester.path / "baselines"


@pytest.mark.parametrize(("given", "expected"), [("10%", 0.10), ("0.02", 0.02), ("2.5%", 0.025), ("0", 0.0)])
def test_tolerance_as_fraction_or_percentage(pytester: pytest.Pytester, given: str, expected: float) -> None:
    """'10%' and '0.1' mean the same."""
    assert settings(pytester, f"--attnperf-tolerance={given}").tolerance == pytest.approx(expected)


def test_environment_is_used_without_a_flag(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """ATTNPERF_TOLERANCE applies when the command line says nothing."""
    monkeypatch.setenv("ATTNPERF_TOLERANCE", "7%")
    assert settings(pytester).tolerance == pytest.approx(0.07)


def test_command_line_beats_environment(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The flag wins over the variable."""
    monkeypatch.setenv("ATTNPERF_TOLERANCE", "7%")
    assert settings(pytester, "--attnperf-tolerance=0.02").tolerance == pytest.approx(0.02)


def test_ini_is_used_and_environment_beats_it(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ini key applies below the environment."""
    pytester.makeini("[pytest]\nattnperf_tolerance = 3%\nattnperf_mode = hot\n")
    s = settings(pytester)
    assert s.tolerance == pytest.approx(0.03)
    assert s.mode == "hot"
    monkeypatch.setenv("ATTNPERF_TOLERANCE", "0.08")
    assert settings(pytester).tolerance == pytest.approx(0.08)


def test_tuning_options_take_no_environment_variable(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The everyday options each have a variable; the tuning ones (but the Triton cache's folder)
    are flags and ini keys only: a stray variable of their name changes nothing, and
    PYTEST_ADDOPTS carries them in the environment."""
    tuning = [opt for opt in OPTIONS if opt.dest in TUNING]
    assert [opt.dest for opt in tuning if opt.env] == ["triton_cache"]
    assert all(opt.env == f"ATTNPERF_{opt.dest.upper()}" for opt in OPTIONS if opt.dest not in TUNING)
    monkeypatch.setenv("ATTNPERF_BUDGET", "9s")
    monkeypatch.setenv("ATTNPERF_MIN_SAMPLES", "77")
    plain = settings(pytester)
    assert (plain.budget_s, plain.min_samples) == (0.5, 10)
    assert settings(pytester, "--attnperf-budget=2s").budget_s == 2.0
    pytester.makeini("[pytest]\nattnperf_min_samples = 33\n")
    assert settings(pytester).min_samples == 33


@pytest.mark.parametrize(("given", "expected_ms"),
                         [("2us", 0.002), ("0.5 us", 0.0005), ("0.003ms", 0.003), ("0.000002s", 0.002), ("0", 0.0)])
def test_machine_offset_takes_a_time_with_its_unit(
        pytester: pytest.Pytester, given: str, expected_ms: float) -> None:
    """'2us', '0.003ms', '0.000002s', or a bare 0."""
    assert settings(pytester, f"--attnperf-machine-offset={given}").machine_offset_ms == pytest.approx(expected_ms)


@pytest.mark.parametrize(
    ("args", "source"),
    [
        (("--attnperf-machine-offset=-1us",), "--attnperf-machine-offset"),
        (("--attnperf-machine-offset=fast",), "--attnperf-machine-offset"),
        (("--attnperf-machine-offset=nan",), "--attnperf-machine-offset"),
        (("--attnperf-machine-residual=-0.5us",), "--attnperf-machine-residual"),
        (("--attnperf-mode=warm",), "--attnperf-mode"),
        (("--attnperf-tolerance=abc",), "--attnperf-tolerance"),
        (("--attnperf-tolerance=-5%",), "--attnperf-tolerance"),
        (("--attnperf-tolerance=1000%",), "--attnperf-tolerance"),
        (("--attnperf-budget=0",), "--attnperf-budget"),
        (("--attnperf-min-samples=0",), "--attnperf-min-samples"),
        (("--attnperf-min-samples=2.5",), "--attnperf-min-samples"),
        (("--attnperf-hot-sample=0ms",), "--attnperf-hot-sample"),
        (("--attnperf-hot-sample=101ms",), "--attnperf-hot-sample"),
        (("--attnperf-case-timeout=1e10",), "--attnperf-case-timeout"),
        (("--attnperf-min-samples=100001",), "--attnperf-min-samples"),
        (("--attnperf-cold-graphs=257",), "--attnperf-cold-graphs"),
        (("--attnperf-processes=33",), "--attnperf-processes"),
    ],
    ids=["offset-negative", "offset-word", "offset-nan", "residual-negative", "mode-warm", "tolerance-abc",
         "tolerance-negative", "tolerance-huge", "budget-zero", "min-samples-zero", "min-samples-float",
         "hot-sample-zero", "hot-sample-over-100ms", "case-timeout-1e10", "min-samples-over", "cold-graphs-over",
         "processes-over"],
)
def test_bad_flag_is_a_usage_error_naming_it(pytester: pytest.Pytester, args: tuple[str, ...], source: str) -> None:
    """A bad value on the command line is refused at start-up, naming the flag and the value."""
    message = usage_error(pytester, *args)
    assert source in message
    assert args[0].split("=", 1)[1] in message


def test_bad_environment_value_names_the_variable(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad ATTNPERF_TOLERANCE is blamed on the variable, not on a flag."""
    monkeypatch.setenv("ATTNPERF_TOLERANCE", "abc")
    message = usage_error(pytester)
    assert "ATTNPERF_TOLERANCE" in message
    assert "--attnperf-tolerance" not in message


def test_bad_ini_value_names_the_key(pytester: pytest.Pytester) -> None:
    """A bad ini value is blamed on the ini key."""
    pytester.makeini("[pytest]\nattnperf_mode = lukewarm\n")
    message = usage_error(pytester)
    assert "attnperf_mode" in message
    assert "lukewarm" in message


def test_update_baselines_from_flag_and_environment(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """--update-baselines or ATTNPERF_UPDATE_BASELINES=1 switch recording on."""
    assert settings(pytester, "--update-baselines").update_baselines is True
    monkeypatch.setenv("ATTNPERF_UPDATE_BASELINES", "1")
    assert settings(pytester).update_baselines is True
    monkeypatch.setenv("ATTNPERF_UPDATE_BASELINES", "maybe")
    assert "ATTNPERF_UPDATE_BASELINES" in usage_error(pytester)


def test_hw_is_lower_cased(pytester: pytest.Pytester) -> None:
    """--hw=H200 names the h200 row."""
    assert settings(pytester, "--hw=H200").hw == "h200"


def test_relative_baselines_dir_is_resolved_against_rootdir(pytester: pytest.Pytester) -> None:
    """A relative folder lies under the rootdir, not under wherever pytest was started."""
    pytester.makeini("[pytest]\n")
    sub = pytester.mkdir("sub")
    config = pytester.parseconfig("-p", "pytest_attnperf.plugin", "--attnperf-baselines=store/hw")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(sub)
        folder = read_settings(config).baselines_dir
    assert config.rootpath == pytester.path
    assert folder == pytester.path / "store" / "hw"


def test_absolute_baselines_dir_is_kept(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """An absolute folder is used as given."""
    target = tmp_path / "elsewhere"
    assert settings(pytester, f"--attnperf-baselines={target}").baselines_dir == target


@pytest.mark.parametrize(("given", "expected"), [("20ms", 20.0), ("250us", 0.25), ("0.1s", 100.0)])
def test_hot_sample_is_a_time(pytester: pytest.Pytester, given: str, expected: float) -> None:
    """'20ms', '250us' or '0.1s'."""
    assert settings(pytester, f"--attnperf-hot-sample={given}").hot_sample_ms == pytest.approx(expected)


@pytest.mark.parametrize("flag", ["--attnperf-machine-offset", "--attnperf-machine-residual",
                                  "--attnperf-run-noise-time", "--attnperf-processes-below", "--attnperf-hot-sample"])
def test_a_bare_number_is_refused_where_a_unit_is_needed(pytester: pytest.Pytester, flag: str) -> None:
    """A bare '2' could be 2 us or 2 s: refused, with the units to choose from."""
    message = usage_error(pytester, f"{flag}=2")
    assert flag in message
    assert "a time needs its unit: 2us, 2ms or 2s" in message


@pytest.mark.parametrize(("given", "expected_s"), [("0.5", 0.5), ("0.5s", 0.5), ("500ms", 0.5), ("250000us", 0.25)])
def test_a_bare_number_is_seconds_where_the_option_counts_seconds(
        pytester: pytest.Pytester, given: str, expected_s: float) -> None:
    """--attnperf-budget and --attnperf-case-timeout take seconds bare, and any unit."""
    assert settings(pytester, f"--attnperf-budget={given}").budget_s == pytest.approx(expected_s)
    assert settings(pytester, f"--attnperf-case-timeout={given}").case_timeout_s == pytest.approx(expected_s)


def test_counts_and_times_are_taken_up_to_their_bounds(pytester: pytest.Pytester) -> None:
    """The largest accepted values (a bound refuses only what the timers or the machine cannot take)."""
    got = settings(pytester, "--attnperf-case-timeout=999999s", "--attnperf-min-samples=100000",
                   "--attnperf-cold-graphs=256", "--attnperf-processes=32")
    assert (got.case_timeout_s, got.min_samples, got.cold_graphs, got.processes) == (999999.0, 100000, 256, 32)
    message = usage_error(pytester, "--attnperf-case-timeout=1e10")
    assert "must be a time below 1e+06s" in message


def test_a_relative_report_folder_is_resolved_against_the_ini_files_folder(pytester: pytest.Pytester) -> None:
    """As the baselines folder: started in a subfolder, the report still lies beside the ini file."""
    pytester.makeini("[pytest]\n")
    sub = pytester.mkdir("sub")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(sub)
        config = pytester.parseconfig("-p", "pytest_attnperf.plugin", "--attnperf-report=out/report")
        got = read_settings(config)
    assert got.report_dir == pytester.path / "out" / "report"
    assert got.baselines_dir == pytester.path / "baselines"
