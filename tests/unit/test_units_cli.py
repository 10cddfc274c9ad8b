"""The ``attnperf`` command: each subcommand hands its arguments to its tool's ``main``, the old
script names are aliases of the same functions, a wrong command is a usage error, and the noise
benchmark, which is not installed, is imported only when ``attnperf noise`` runs."""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

import pytest

from pytest_attnperf import cli
from pytest_attnperf.store import status


def _scripts() -> dict[str, str]:
    """The installed console scripts (pyproject.toml's, as of the last install)."""
    entries = importlib.metadata.distribution("pytest-attnperf").entry_points
    return {entry.name: entry.value for entry in entries if entry.group == "console_scripts"}


def _resolve(target: str) -> object:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_each_command_hands_the_rest_of_the_line_to_its_tool(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def tool(argv: list[str]) -> int:
        seen.append(argv)
        return 7

    monkeypatch.setitem(cli.COMMANDS, name, cli.Command(tool, "a fake"))
    assert cli.main([name, "--runs", "5", "--", "suites/", "-k", "x"]) == 7
    assert seen == [["--runs", "5", "--", "suites/", "-k", "x"]]


def test_the_command_is_a_console_script_and_each_old_name_an_alias_of_its_command() -> None:
    """Every command but noise keeps its old name; noise's module is not installed, so no script names it."""
    scripts = _scripts()
    assert _resolve(scripts.pop("attnperf")) is cli.main
    assert {name.removeprefix("attnperf-"): _resolve(target) for name, target in scripts.items()} == {
        name: command.main for name, command in cli.COMMANDS.items() if name != "noise"}


@pytest.mark.parametrize(("name", "usage"), [
    ("noise", "usage: python -m noise_benchmark.benchmark"),
    *((name, f"usage: attnperf-{name}") for name in ["rejudge", "history", "baselines", "ceilings"])])
def test_a_commands_help_is_its_tools_own(name: str, usage: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main([name, "--help"])
    assert ended.value.code == 0
    assert capsys.readouterr().out.startswith(usage)


def test_the_command_imports_the_noise_benchmark_only_when_noise_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import pytest_attnperf

    for name in [n for n in sys.modules if n.partition(".")[0] == "noise_benchmark"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "pytest_attnperf.cli")
    monkeypatch.setattr(pytest_attnperf, "cli", cli)  # the package's attribute back to this module afterwards
    fresh = importlib.import_module("pytest_attnperf.cli")
    assert fresh is not cli
    assert not [n for n in sys.modules if n.partition(".")[0] == "noise_benchmark"]


@pytest.mark.parametrize("missing", [("noise_benchmark", "noise_benchmark.benchmark"), ("noise_benchmark.benchmark",)])
def test_without_the_repository_noise_says_where_the_benchmark_runs(missing: tuple[str, ...],
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """An installed wheel alone has no noise_benchmark (None in sys.modules: its import fails):
    one line, exit status 2, and nothing run."""
    for name in missing:
        monkeypatch.setitem(sys.modules, name, None)
    assert cli.main(["noise", "--runs", "1", "--", "suites/"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == cli.NO_NOISE_BENCHMARK + "\n"
    assert "\n" not in cli.NO_NOISE_BENCHMARK
    for words in ("checkout of the repository", "python -m noise_benchmark.benchmark", "docs/noise-benchmark.md"):
        assert words in captured.err


def test_the_report_command_prints_its_usage_for_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "--help"]) == 2
    assert capsys.readouterr().err == "usage: attnperf-report REPORT.json OUTDIR\n"


def test_the_run_command_is_the_status_deciding_run() -> None:
    command = [sys.executable, "-c", "raise SystemExit(5)"]  # a pytest that ended with 5, recording nothing
    assert cli.COMMANDS["run"].main is status.main
    assert status.main(["--collect-only"], command=command) == 5


@pytest.mark.parametrize("argv", [["flash"], [], ["--runs", "5"]])
def test_no_known_command_is_a_usage_error_naming_the_known_ones(argv: list[str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(argv)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert "{run,report,history,baselines,ceilings,noise,rejudge}" in err
    if argv == ["flash"]:
        assert "invalid choice: 'flash'" in err


def test_the_commands_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["--help"])
    assert ended.value.code == 0
    out = capsys.readouterr().out
    for name, command in cli.COMMANDS.items():
        assert f"    {name} " in out
        assert command.help.split()[0] in out
