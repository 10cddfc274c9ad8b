"""The correctness catalogue's plugin: its options, and the coverage report of what each kernel
was vouched for (docs/catalogue.md).

Every catalogue test carries its family, kernel, row and trigger classes as a user property, so
the coverage is read from the tests' reports (under pytest-xdist, in the controller). A kernel's
class is ``failed`` when a row of it failed, ``passed`` when one passed and none failed,
``refused`` when every row of it that reached the kernel was refused, ``skipped`` when they were
skipped for another reason, and ``unreached`` when no row of this run's tier had it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_attnperf.families import catalogue
from pytest_attnperf.families.catalogue_suite import ORDER_KEY, PROPERTY, TIER_KEY, runs_here
from pytest_attnperf.families.family import FAMILIES, classes_of
from pytest_attnperf.families.parametrize import RUN_KEY

__all__ = ["NAME", "Coverage", "add_options", "configure"]

NAME = "attnperf-catalogue"
KEY = pytest.StashKey["Coverage"]()
# a class's status: the first of these any of its rows had (xfailed: a known failure, kept as a strict xfail)
STATUSES = ("failed", "xfailed", "passed", "refused", "skipped")
REFUSED = ("refused: ", "does not support this case")  # a skip that is the kernel's or family's refusal


def add_options(parser: pytest.Parser) -> None:
    """``--attnperf-catalogue``, ``--attnperf-require-class``, ``--attnperf-catalogue-order`` and
    ``--attnperf-coverage-json``."""
    group = parser.getgroup("attnperf")
    group.addoption("--attnperf-catalogue", dest="attnperf_catalogue", default=None, choices=catalogue.TIERS,
                    help="the correctness catalogue's tier this run checks: off, smoke (default: every trigger "
                         "class at least once) or full (nightly, release)")
    parser.addini("attnperf_catalogue", "the catalogue's tier when --attnperf-catalogue is not given", default="smoke")
    group.addoption("--attnperf-require-class", dest="attnperf_require_class", default="",
                    help="comma-separated trigger classes that every catalogue kernel of a family that has them "
                         "must have passed; the run fails otherwise")
    group.addoption("--attnperf-catalogue-order", dest="attnperf_catalogue_order", action="store_true", default=False,
                    help="each kernel's catalogue rows again: a seeded shuffled sample in this process and in a fresh "
                         "one; a check whose result depends on what ran before it fails, naming that check")
    group.addoption("--attnperf-coverage-json", dest="attnperf_coverage_json", default=None, metavar="PATH",
                    help="write the catalogue's coverage (kernel x trigger class) to PATH as JSON")


def _tier(config: pytest.Config) -> str:
    tier = config.getoption("attnperf_catalogue") or str(config.getini("attnperf_catalogue"))
    if tier not in catalogue.TIERS:
        raise pytest.UsageError(f"attnperf: attnperf_catalogue = {tier!r} is none of {', '.join(catalogue.TIERS)}")
    return tier


def _required(config: pytest.Config) -> tuple[str, ...]:
    named = tuple(c.strip() for c in str(config.getoption("attnperf_require_class") or "").split(",") if c.strip())
    unknown = [c for c in named if c not in catalogue.CLASSES]
    if unknown:
        raise pytest.UsageError(f"attnperf: --attnperf-require-class names no trigger class {', '.join(unknown)} "
                                f"(the classes: {', '.join(catalogue.CLASSES)})")
    return named


def configure(config: pytest.Config) -> None:
    """Read the options and register the coverage (a CPU run's catalogue turns Triton's
    interpreter on as it collects: ``catalogue_suite.pytest_generate_tests``)."""
    config.stash[TIER_KEY] = tier = _tier(config)
    config.stash[ORDER_KEY] = bool(config.getoption("attnperf_catalogue_order", False))
    coverage = Coverage(tier, _required(config))
    config.stash[KEY] = coverage
    config.pluginmanager.register(coverage, NAME)


@dataclass(eq=False)  # a plugin object: hashed by identity, as the plugin manager keeps it
class Coverage:
    """The catalogue tests' outcomes, by node id: the plugin object that reads them and reports."""

    tier: str
    required: tuple[str, ...] = ()
    tests: dict[str, tuple[dict[str, Any], str, str]] = field(default_factory=dict)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """Each catalogue test carries what it checks (family, kernel, row, classes) as a property."""
        for item in items:
            check = getattr(getattr(item, "callspec", None), "params", {}).get("check")
            if check is not None and hasattr(check, "info"):
                item.user_properties.append((PROPERTY, check.info()))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep each catalogue test's worst phase: failed over xfailed over passed over refused."""
        info = next((value for name, value in report.user_properties if name == PROPERTY), None)
        if not isinstance(info, dict):
            return
        before = self.tests.get(report.nodeid)
        status, reason = _status(report)
        if status is None or (before is not None and STATUSES.index(before[1]) <= STATUSES.index(status)):
            return  # a passed teardown after a failed call, or nothing to say
        self.tests[report.nodeid] = (dict(info), status, reason)

    def table(self) -> dict[tuple[str, str], dict[str, dict[str, int]]]:
        """(family, kernel) -> class -> status -> how many tests."""
        found: dict[tuple[str, str], dict[str, dict[str, int]]] = {}
        for info, status, _ in self.tests.values():
            per = found.setdefault((info["family"], info["kernel"]), {})
            for cls in info["classes"]:
                counts = per.setdefault(cls, {})
                counts[status] = counts.get(status, 0) + 1
        return found

    def kernels(self, registry: Any, device_kind: str) -> list[dict[str, Any]]:
        """Per kernel of every family: each class's status and counts, the unreached classes, or
        why the kernel has no rows on this device."""
        table = self.table()
        out = []
        for fam in FAMILIES:
            classes = classes_of(fam)
            for kernel in registry.family(fam):
                per = table.get((fam, kernel.name), {})
                entry: dict[str, Any] = {"family": fam, "kernel": kernel.name}
                if (why := runs_here(kernel, device_kind)) is not None and not per:
                    entry["not_run"] = why
                entry["classes"] = {c: {"status": class_status(per[c]), **per[c]} for c in classes if c in per}
                entry["unreached"] = [c for c in classes if c not in per]
                out.append(entry)
        return out

    def missing_required(self, kernels: Iterable[dict[str, Any]]) -> list[str]:
        """``kernel: class (status)`` for each required class that a kernel this run checked, of a
        family that has the class, did not pass."""
        missing = []
        for entry in kernels:
            if not entry["classes"]:  # no catalogue test of it in this run (deselected, or no rows on this device)
                continue
            for cls in self.required:
                if cls not in classes_of(entry["family"]):
                    continue
                status = entry["classes"].get(cls, {}).get("status", "unreached")
                if status != "passed":
                    missing.append(f"{entry['family']}/{entry['kernel']}: {cls} ({status})")
        return missing

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """``--attnperf-require-class``: a class some kernel did not pass fails a run that passed."""
        if not self.required or self.tier == "off" or _worker(session.config):
            return
        run = session.config.stash[RUN_KEY]
        missing = self.missing_required(self.kernels(run.registry, run.device.kind))
        if missing and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        """The coverage, one line per kernel; the JSON and the report's table where asked for."""
        if not (self.tests or self.required) or _worker(config):  # no catalogue test in this run: nothing to say
            return
        run = config.stash[RUN_KEY]
        kernels = self.kernels(run.registry, run.device.kind)
        lines = summary_lines(self.tier, kernels, len(self.tests))
        missing = self.missing_required(kernels)
        if missing:
            lines.append(f"--attnperf-require-class not met, the run fails: {'; '.join(missing)}")
        path = config.getoption("attnperf_coverage_json")
        if path:
            lines.append(_write_json(Path(path), self.tier, kernels))
        report_dir = getattr(run.settings, "report_dir", None)
        if report_dir is not None:
            lines.append(_write_markdown(Path(report_dir), self.tier, kernels))
        terminalreporter.section("attnperf catalogue")
        for line in lines:
            terminalreporter.write_line(line)


def _worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _status(report: pytest.TestReport) -> tuple[str | None, str]:
    if report.failed:
        return "failed", str(report.longrepr)[-300:]
    if hasattr(report, "wasxfail"):
        return ("xfailed", str(report.wasxfail)) if report.skipped else ("failed", "passed a strict xfail")
    if report.skipped:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        return ("refused" if any(mark in reason for mark in REFUSED) else "skipped"), reason
    if report.when == "call":
        return "passed", ""
    return None, ""


def class_status(counts: dict[str, int]) -> str:
    """A class's status from its tests' counts: the first of ``STATUSES`` any of them had."""
    return next(s for s in STATUSES if counts.get(s))


def summary_lines(tier: str, kernels: list[dict[str, Any]], tests: int) -> list[str]:
    """One line per kernel: the classes it passed, failed, refused and did not reach."""
    lines = [f"catalogue tier {tier}: {tests} checks; per kernel, the trigger classes it was vouched for"]
    idle = []
    for entry in kernels:
        name = f"{entry['family']}/{entry['kernel']}"
        if "not_run" in entry:
            lines.append(f"  {name}: not checked here ({entry['not_run']})")
            continue
        if not entry["classes"]:
            idle.append(name)
            continue
        by: dict[str, list[str]] = {s: [] for s in STATUSES}
        for cls, counts in entry["classes"].items():
            by[counts["status"]].append(cls)
        parts = [f"{len(by['passed'])} passed"]
        parts += [f"{s} {', '.join(by[s])}" for s in ("failed", "xfailed", "refused", "skipped") if by[s]]
        parts += [f"unreached {', '.join(entry['unreached'])}"] if entry["unreached"] else []
        lines.append(f"  {name}: " + "; ".join(parts))
    if idle:
        lines.append(f"  no catalogue test of {len(idle)} kernel{'s' if len(idle) > 1 else ''} ran (deselected): "
                     + ", ".join(idle))
    return lines


def _write_json(path: Path, tier: str, kernels: list[dict[str, Any]]) -> str:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"tier": tier, "classes": catalogue.CLASSES, "kernels": kernels}, indent=1))
    except OSError as exc:
        return f"coverage NOT written to {path}: {exc}"
    return f"coverage written to {path}"


def _write_markdown(folder: Path, tier: str, kernels: list[dict[str, Any]]) -> str:
    classes = [c for c in catalogue.CLASSES if any(c in e["classes"] or c in e["unreached"] for e in kernels)]
    head = "| kernel | " + " | ".join(classes) + " |"
    rows = [head, "|" + "---|" * (len(classes) + 1)]
    for e in kernels:
        cells = [e["classes"][c]["status"] if c in e["classes"] else ("-" if c in e["unreached"] else "n/a")
                 for c in classes]
        rows.append(f"| {e['family']}/{e['kernel']} | " + " | ".join(cells) + " |")
    path = folder / "coverage.md"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Catalogue coverage ({tier} tier)\n\n" + "\n".join(rows) + "\n")
    except OSError as exc:
        return f"coverage NOT written to {path}: {exc}"
    return f"coverage written to {path}"
