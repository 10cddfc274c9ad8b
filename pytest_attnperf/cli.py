"""``attnperf COMMAND [ARGS]``: the package's one console command (docs/cli.md).

Each subcommand hands the rest of its command line, unread, to its tool's ``main``; the older
``attnperf-<command>`` scripts are aliases of the same functions, kept for one release. ``noise``
is the maintainers' noise benchmark, which is not installed: it runs where the repository's
``noise_benchmark`` folder can be imported, and is imported only when the subcommand runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from pytest_attnperf.hw import ceilings
from pytest_attnperf.report import drifts, rejudge, studies
from pytest_attnperf.store import baselines, status

__all__ = ["COMMANDS", "NO_NOISE_BENCHMARK", "Command", "main", "noise", "parser"]

NO_NOISE_BENCHMARK = ("attnperf noise: the noise benchmark is not installed with the package; it runs from a "
                      "checkout of the repository: python -m noise_benchmark.benchmark (docs/noise-benchmark.md)")


def noise(argv: list[str]) -> int:
    """``attnperf noise``: the noise benchmark's ``main`` where the repository's ``noise_benchmark``
    can be imported; elsewhere (an installed wheel alone) a usage error, exit status 2, that says
    where it runs."""
    try:
        import noise_benchmark.benchmark as benchmark  # noqa: PLC0415 - not installed: imported when the command runs
    except ModuleNotFoundError as exc:
        if exc.name not in ("noise_benchmark", "noise_benchmark.benchmark"):
            raise  # the benchmark is there and one of its own imports is missing: that error says which
        print(NO_NOISE_BENCHMARK, file=sys.stderr)
        return 2
    return benchmark.main(argv)


class Command(NamedTuple):
    """A subcommand: the tool's ``main`` (it takes the arguments after the subcommand's name) and
    the line ``attnperf --help`` shows for it."""

    main: Callable[[list[str]], int]
    help: str


COMMANDS: dict[str, Command] = {
    "run": Command(status.main, "pytest in a child process, its exit status decided from what the run recorded"),
    "report": Command(studies.main, "write report.md and the plots again from a report.json"),
    "history": Command(drifts.main, "a run history's lasting shifts per case (extra: history)"),
    "baselines": Command(baselines.main, "merge a baseline file an update saved aside into another"),
    "ceilings": Command(ceilings.main, "measure this machine's ceilings and print them beside its spec"),
    "noise": Command(noise, "the noise benchmark, from a checkout: repeated runs, injected slowdowns"),
    "rejudge": Command(rejudge.main, "judge a noise benchmark's saved runs again with this gate"),
}


def parser() -> argparse.ArgumentParser:
    """The command's parser: one subparser a command, each taking no options of its own (its
    arguments go to its tool, whose ``--help`` says what it takes)."""
    top = argparse.ArgumentParser(prog="attnperf", description="attention kernels' checks and timings, "
                                  "outside a pytest run; 'attnperf COMMAND --help' for a command's arguments")
    commands = top.add_subparsers(dest="command", required=True)  # its usage names every command
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.help, add_help=False)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """``attnperf COMMAND [ARGS]``: run COMMAND's tool on ARGS; its exit status is the command's.
    No command, or an unknown one, is a usage error (exit status 2) that names the known ones."""
    args = list(sys.argv[1:] if argv is None else argv)
    chosen = parser().parse_args(args[:1])  # the command alone: everything after it is its tool's
    return COMMANDS[chosen.command].main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
