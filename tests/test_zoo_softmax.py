"""The softmax zoo (``tests/zoo/softmax.py``) through the softmax suite's CPU table, registered as
a user's plugin: every right kernel passes every case it takes, every wrong kernel fails at
least one, and each failure is a wrong number caught by the checks, never a crash.

The zoo runs once, in one pytester run in this process (``-p tests.zoo.softmax``, correctness
only: torch and the plugin loaded once), and the assertions, one test per kernel, read its JUnit
XML. That run is shared by the module: the first test that asks for it makes it (pytester is per
test), in a folder of its own holding the suite's test on its CPU table, and the others read what
it left. The right kernels run on every case of the table; the wrong ones on the cases that catch
them (``WRONG_CASES``).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kit
import pytest
from zoo import softmax as zoo  # tests/ is on the path, as for every test module here

from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.families.softmax.suite import CASES

CPU_CASES = tuple(c for c in CASES if not c.gpu)
DIRECTIONS = ("fwd", "fwdbwd")
# The kernels run on one CPU thread: these tests run one pytest-xdist worker per core, and two
# torch threads per worker spin against each other (on 2 busy cores the zoo's run took 63 s of CPU
# time with two threads, 10 s with one)
ONE_THREAD = 1


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """The kernel calls made in this process, the zoo's run's among them, on one thread (``ONE_THREAD``)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(ONE_THREAD)
    yield
    torch.set_num_threads(before)

# what the checks say of a wrong number (checks.assert_close, checks.assert_elementwise)
WRONG_NUMBER = re.compile(
    r"zoo-bad-[\w-]+ (out|dq|dk|dv)(: (max \|error\| \S+ against fp64, at b=\d+ h=\d+ t=\d+ d=\d+, exceeds|"
    r"\d+ of \d+ elements outside the elementwise bound|\d+ of \d+ elements are not finite)| is zero everywhere)"
)
# a kernel's own refusal of a case (Kernel.call_or_skip) or of the device (device_kinds)
REFUSAL = re.compile(r"zoo-ok-[\w-]+ (does not support this case: NotImplementedError|runs on cuda only)")


def zoo_kernels() -> dict[str, Kernel]:
    registry = KernelRegistry()
    zoo.register(registry)
    return {k.name: k for k in registry.family("softmax")}


KERNELS = zoo_kernels()
RIGHT = sorted(name for name in KERNELS if name.startswith("zoo-ok-"))
WRONG = sorted(name for name in KERNELS if name.startswith("zoo-bad-"))
# The wrong kernels run on three cases of the table, which between them catch every one (grouped
# queries, the sliding window, fp16 with a partial last block: a wrong number in half precision
# too); the other three only caught them again, at a third of the run's time (16 heads x 8 at d=64
# above all). The right kernels run on all six.
WRONG_CASES = ("cpu-b2-h12-kv3-t64-d32-causal-fp32", "cpu-b1-h4-t256-d32-w32-fp32", "cpu-b2-h4-t200-d32-causal-fp16")
SELECTION = f"cpu- and (zoo-ok- or (zoo-bad- and ({' or '.join(WRONG_CASES)})))"


@dataclass(frozen=True)
class Outcome:
    """One test of the run: ``passed``, ``failed``, ``skipped`` or ``error``, and what it said."""

    outcome: str
    message: str


def parse_junit(path: Path) -> dict[tuple[str, str, str], Outcome]:
    """(kernel, case, direction) -> outcome of every ``test_softmax`` test in a JUnit XML report."""
    ids = {f"{case.id}-{name}-{direction}": (name, case.id, direction)
           for case in CPU_CASES for name in KERNELS for direction in DIRECTIONS}
    found: dict[tuple[str, str, str], Outcome] = {}
    for test in ET.parse(path).getroot().iter("testcase"):
        param = re.fullmatch(r"test_softmax\[(.*)\]", test.get("name", ""))
        if param is None or param.group(1) not in ids:
            continue
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = test.find(tag)
            if element is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = f"{element.get('message', '')}\n{element.text or ''}"
                break
        found[ids[param.group(1)]] = Outcome(outcome, message)
    return found


_RUNS: dict[str, dict[tuple[str, str, str], Outcome]] = {}  # the one run, shared by the module's tests
# What the plugin does after collecting in a run of its own: what is alive then is frozen, so the
# full collection after each case walks only what the cases made. In this process the plugin
# leaves the freezing to the process's owner (tests/conftest.py froze torch and fla), and the
# zoo's run, hundreds of cases each followed by that collection, spent seconds walking its own items.
FROZEN_AFTER_COLLECTION = """
import gc

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()
"""
# the suite's test on its CPU table alone: the run collects no GPU row only to deselect it (a run in
# this process walks every object it made, its items too, in the collection after each case)
CPU_TABLE = """
from pytest_attnperf.families.softmax.suite import CASES, FAMILY, test_softmax  # noqa: F401

ATTNPERF_FAMILY = FAMILY
ATTNPERF_CASES = tuple(case for case in CASES if not case.gpu)
"""


@pytest.fixture
def zoo_run(pytester: pytest.Pytester) -> dict[tuple[str, str, str], Outcome]:
    """The zoo through the softmax suite's CPU table (``SELECTION``), run on first use: its JUnit XML
    report, parsed."""
    if "zoo" not in _RUNS:
        pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
        pytester.makeconftest(FROZEN_AFTER_COLLECTION)
        pytester.makepyfile(test_cpu_table=CPU_TABLE)
        junit = pytester.path / "junit.xml"
        run = pytester.runpytest_inprocess(  # no:logging: nothing here reads the tests' logs
            "-p", "pytest_attnperf.plugin", "-p", "tests.zoo.softmax", "-p", "no:logging", "test_cpu_table.py",
            "-k", SELECTION, "--attnperf-check-only", f"--junitxml={junit}", "-q", "-p", "no:randomly",
        )
        broke = f"the zoo's run broke (exit {run.ret}):\n{run.stdout.str()[-4000:]}\n{run.stderr.str()[-4000:]}"
        assert run.ret in (0, 1), broke
        assert junit.exists(), broke
        _RUNS["zoo"] = parse_junit(junit)
    return _RUNS["zoo"]


def runs_of(found: dict[tuple[str, str, str], Outcome], name: str) -> dict[tuple[str, str], Outcome]:
    return {(case, direction): outcome for (kernel, case, direction), outcome in found.items() if kernel == name}


def expected_runs(kernel: Kernel) -> set[tuple[str, str]]:
    """The kernel's tests on the CPU table: those its ``supports`` and ``backward`` keep, of a
    wrong kernel on ``WRONG_CASES`` only."""
    cases = CPU_CASES if kernel.name in RIGHT else [c for c in CPU_CASES if c.id in WRONG_CASES]
    return {(case.id, direction) for case in cases for direction in DIRECTIONS
            if kernel.supports(case) is None and (direction == "fwd" or kernel.backward)}


def test_the_zoo_is_complete() -> None:
    """Enough kernels of each kind, named by kind, each with a one-line description."""
    assert len(RIGHT) >= 8, RIGHT
    assert len(WRONG) >= 10, WRONG
    assert set(KERNELS) == set(RIGHT) | set(WRONG)
    for name, kernel in KERNELS.items():
        assert kernel.description, name
        assert "\n" not in kernel.description, name


@pytest.mark.parametrize("name", RIGHT)
def test_a_right_kernel_passes_every_case_it_takes(zoo_run: dict[tuple[str, str, str], Outcome], name: str) -> None:
    runs = runs_of(zoo_run, name)
    assert set(runs) == expected_runs(KERNELS[name])
    for (case, direction), outcome in sorted(runs.items()):
        if outcome.outcome == "skipped":
            assert REFUSAL.search(outcome.message), (case, direction, outcome.message)
        else:
            assert outcome.outcome == "passed", f"{name} on {case} {direction}: {outcome.message}"
    if "cpu" in KERNELS[name].device_kinds:
        assert any(o.outcome == "passed" for o in runs.values()), f"{name} passed no case: {runs}"


@pytest.mark.parametrize("name", WRONG)
def test_a_wrong_kernel_fails_with_a_wrong_number(zoo_run: dict[tuple[str, str, str], Outcome], name: str) -> None:
    runs = runs_of(zoo_run, name)
    assert set(runs) == expected_runs(KERNELS[name])
    failures = {key: o for key, o in runs.items() if o.outcome != "passed"}
    assert failures, f"{name} passed every case of the CPU table"
    for (case, direction), outcome in sorted(failures.items()):
        assert outcome.outcome == "failed", (case, direction, outcome)
        assert WRONG_NUMBER.search(outcome.message), (case, direction, outcome.message)


PIECED_CASES = ("cpu-b2-h12-kv3-t64-d32-causal-fp32", "cpu-b1-h4-t256-d32-w32-fp32", "cpu-b2-h4-t128-d32-bf16")


@pytest.mark.parametrize("name", [name for name in RIGHT if "cpu" in KERNELS[name].device_kinds])
def test_a_right_kernel_cut_into_small_pieces_passes_too(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The GPU table's shapes are cut into pieces (runs of batch items, tiles of queries with
    the keys they see, each recomputed in the backward); the CPU table's only with a tiny
    budget, given here: tiles of 64 queries, one batch item at a time."""
    import torch

    from pytest_attnperf.families.softmax.kernels import run_case

    pieces = []
    run_piece = zoo._run_piece

    def counted(*args: Any) -> Any:
        pieces.append(args[3])
        return run_piece(*args)

    monkeypatch.setattr(zoo, "PIECE_ELEMENTS", 1 << 12)
    monkeypatch.setattr(zoo, "MIN_ROWS", 64)
    monkeypatch.setattr(zoo, "_run_piece", counted)
    kernel = KERNELS[name]
    for case in (c for c in CPU_CASES if c.id in PIECED_CASES and kernel.supports(c) is None):
        pieces.clear()
        run_case(kernel, case, "fwdbwd", torch.device("cpu"))
        assert len(pieces) >= 4, (case.id, pieces)  # two pieces at least, each run again in the backward


CONFTEST = "from tests.zoo.softmax import pytest_attnperf_register_kernels  # noqa: F401\n"
SHAPES = """
from pytest_attnperf import SoftmaxCase
from pytest_attnperf.families.softmax.suite import test_softmax  # noqa: F401

ATTNPERF_FAMILY = "softmax"
ATTNPERF_CASES = (SoftmaxCase("cpu-b2-h3-t24-d16-fp32", 2, 3, 24, 16, "fp32", False, gpu=False),)
"""


def test_the_zoo_registers_from_a_conftest(pytester: pytest.Pytester) -> None:
    """A project's conftest.py that imports the zoo's hook runs it, as ``-p tests.zoo.softmax``
    does: its kernels join a test module of the project's own shapes."""
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_shapes=SHAPES)
    result = pytester.runpytest_inprocess(
        "-p", "pytest_attnperf.plugin", "-p", "no:logging", "-k", "zoo-ok-fp32- or zoo-bad-dq-all-",
        "--attnperf-check-only",
    )
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["zoo-bad-dq-all dq: max |error| * against fp64, at b=*, exceeds*"])


def test_the_power_tool_reports_each_tensors_margin(tmp_path: Path) -> None:
    """``tools/power.py --kernels`` writes each tensor's worst error over its bound: a right
    kernel within the bounds, a wrong one beyond them where it is wrong, a kernel for another
    device left out."""
    import json

    power = kit.tool("power")
    out = tmp_path / "margins.jsonl"
    power.main(["--kernels", "--zoo", "zoo.softmax", "--families", "softmax", "--cases", "cpu-b16-h8-t32-d64-fp32",
                "--kernel-pattern", "^zoo-(ok-fp32|bad-dv-all|ok-compile-static)$", "--neighbours", "0,2",
                "--seeds", "3", "--out", str(out)])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    by = {(x["kernel"], x["direction"]): x["ratios"] for x in lines}
    assert set(by) == {(k, d) for k in ("zoo-ok-fp32", "zoo-bad-dv-all") for d in ("fwd", "fwdbwd")}
    assert max(r for t in by[("zoo-ok-fp32", "fwdbwd")].values() for r in t.values()) < 1
    assert by[("zoo-bad-dv-all", "fwdbwd")]["dv"]["rule"] > 1
    assert by[("zoo-bad-dv-all", "fwdbwd")]["dv"]["0"] > 1
    assert by[("zoo-bad-dv-all", "fwdbwd")]["out"]["rule"] <= 1
