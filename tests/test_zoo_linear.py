"""The linear zoo (``tests/zoo/linear.py``) through the linear suite's CPU table, registered as a
user registers kernels: every correct kernel passes every case it takes, every wrong one fails
at least one, and each failure is a correctness check's (not a crash).

One run, in this process, checks the zoo (``--attnperf-check-only``: the checks, nothing timed);
its JUnit report is read once and the assertions are parametrized by kernel. The correct kernels
run on every case of the table; the wrong ones on the cases that catch them (``WRONG_CASES``).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import pytest
from zoo.linear import FAMILIES, Zoo, zoo  # tests/ is on sys.path, as for every test module here

ZOO = zoo()
CORRECT = [entry for entry in ZOO if entry.correct and "cpu" in entry.device_kinds]  # TF32 kernels: GPU only
WRONG = [entry for entry in ZOO if not entry.correct]

CONFTEST = "from tests.zoo.linear import pytest_attnperf_register_kernels  # noqa: F401\n"
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
# The wrong kernels run where they are caught: every one on the case of a chunk and a tail, and the
# grouped-values bug, caught on GDN's grouped-values case only, there too. The other cases only
# caught them again, and the wrong kernels on all four took three quarters of the run's time; the
# failing tests below hold each to a failure where it runs. The correct kernels run on every case.
WRONG_CASES = "cpu-b2-h2-t100-d16-fp32 or (cpu-b2-h4-hk2-t70-d16-fp32 and key-heads)"
SELECTION = f"zoo- and cpu- and (zoo-ok- or {WRONG_CASES})"
# the suite's test on its CPU table alone: the run collects no GPU row only to deselect it (a run in
# this process walks every object it made, its items too, in the collection after each case)
CPU_TABLE = """
from pytest_attnperf.families.linear.suite import CPU, FAMILY, test_linear  # noqa: F401

ATTNPERF_FAMILY = FAMILY
ATTNPERF_CASES = CPU
"""


@dataclass(frozen=True)
class Outcome:
    """One test of the run: ``passed``, ``failed``, ``error`` or ``skipped``, and the first line of
    its failure's message."""

    test_id: str
    status: str
    message: str = ""


@dataclass
class Run:
    """The zoo's run: each kernel's tests, the tests no kernel claimed, the exit code and the
    output's end."""

    by_kernel: dict[str, list[Outcome]] = field(default_factory=dict)
    unclaimed: list[str] = field(default_factory=list)
    exit_code: int = 0
    output: str = ""


def _outcome(case: ET.Element) -> Outcome:
    for tag, status in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
        found = case.find(tag)
        if found is not None:
            text = (found.get("message") or found.text or "").strip()
            return Outcome(case.get("name", ""), status, text.splitlines()[0] if text else "")
    return Outcome(case.get("name", ""), "passed")


def _kernel_of(test_id: str) -> str | None:
    """The zoo kernel a suite test names (``test_linear[<case>-<family>-<kernel>-<direction>]``)."""
    for entry in ZOO:
        if test_id.endswith((f"-{entry.family}-{entry.name}-fwd]", f"-{entry.family}-{entry.name}-fwdbwd]")):
            return entry.name
    return None


_RUNS: dict[str, Run] = {}  # the one run, shared by the module's tests (pytester is per test)


@pytest.fixture
def zoo_run(pytester: pytest.Pytester) -> Run:
    """The zoo on the linear suite's CPU table (``SELECTION``), run on first use, in this process
    (torch and the plugin loaded once; torch on one thread, as tests/conftest.py sets it)."""
    if "zoo" in _RUNS:
        return _RUNS["zoo"]
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    pytester.makeconftest(CONFTEST + FROZEN_AFTER_COLLECTION)
    pytester.makepyfile(test_cpu_table=CPU_TABLE)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_inprocess(  # no:logging: nothing here reads the tests' logs
        "-p", "pytest_attnperf.plugin", "-p", "no:logging", "test_cpu_table.py", "-k", SELECTION,
        "--attnperf-check-only", f"--junitxml={junit}",
    )
    run = Run({entry.name: [] for entry in ZOO}, exit_code=int(result.ret),
              output="\n".join(result.outlines[-20:] + result.errlines[-20:]))
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome = _outcome(case)
        kernel = _kernel_of(outcome.test_id)
        if kernel is None:
            run.unclaimed.append(outcome.test_id)
        else:
            run.by_kernel[kernel].append(outcome)
    _RUNS["zoo"] = run
    return run


def test_the_run_holds_the_zoos_tests_only_and_fails(zoo_run: Run) -> None:
    assert zoo_run.unclaimed == [], zoo_run.unclaimed
    assert zoo_run.exit_code == pytest.ExitCode.TESTS_FAILED, zoo_run.output  # the wrong kernels fail


@pytest.mark.parametrize("entry", CORRECT, ids=lambda e: e.name)
def test_a_correct_kernel_passes_every_case_it_takes(zoo_run: Run, entry: Zoo) -> None:
    outcomes = zoo_run.by_kernel[entry.name]
    assert outcomes, f"{entry.name} ran no test: {zoo_run.output}"
    other = [o for o in outcomes if o.status != "passed"]
    assert other == [], f"{entry.name}: {len(other)} of {len(outcomes)} tests did not pass: {other}"


@pytest.mark.parametrize("entry", WRONG, ids=lambda e: e.name)
def test_a_wrong_kernel_fails_a_correctness_check(zoo_run: Run, entry: Zoo) -> None:
    outcomes = zoo_run.by_kernel[entry.name]
    assert outcomes, f"{entry.name} ran no test: {zoo_run.output}"
    failed = [o for o in outcomes if o.status == "failed"]
    assert failed, f"{entry.name} failed none of its {len(outcomes)} tests: {outcomes}"
    checked = f"Failed: {entry.name} "  # a check's failure: its message alone, naming the kernel and tensor
    crashed = [o for o in outcomes if o.status == "error"
               or (o.status == "failed" and not o.message.startswith(checked))]
    assert crashed == [], f"{entry.name}: failures that are no check's: {crashed}"


def test_the_zoo_has_three_correct_and_two_wrong_kernels_a_family_at_least() -> None:
    for family in FAMILIES:
        assert sum(e.correct for e in ZOO if e.family == family) >= 3, family
        assert sum(not e.correct for e in ZOO if e.family == family) >= 2, family
    assert len({e.name for e in ZOO}) == len(ZOO)
    assert all(e.name.startswith((f"zoo-ok-{e.family}-", f"zoo-bad-{e.family}-")) for e in ZOO)


def test_the_tf32_kernels_take_fp32_cases_only() -> None:
    """TF32 operands are what a tensor core reads of fp32 tiles: the zoo's TF32 kernels decline an
    fp16 or bf16 case (on the H200 they failed fp16 cases normwise, 0.00113-0.00115 against
    2 x 2^-11: truncating float32 intermediates to 10 bits is coarser than an fp16 kernel's
    rounding) and take an fp32 one."""
    from pytest_attnperf.families.linear.case import LinearCase

    tf32 = [e for e in zoo() if "tf32" in e.name]
    assert {e.family for e in tf32} == set(FAMILIES)
    assert all(e.correct for e in tf32)
    for dtype in ("fp16", "bf16", "fp32"):
        case = LinearCase(f"b2-h8-t1024-d64-{dtype}", 2, 8, 1024, 64, 64, dtype)
        for entry in tf32:
            why = entry.supports(case)
            assert (why is None) == (dtype == "fp32"), (entry.name, dtype, why)
            if why:
                assert "TF32 operands come from fp32 tiles" in why
    others = [e for e in zoo() if "tf32" not in e.name and e.limit is None]
    assert all(e.supports(LinearCase("x-fp16", 2, 2, 64, 16, 16, "fp16")) is None for e in others)


KEPT_CONFTEST = """
from tests.zoo.linear import zoo

KEPT = {kept!r}


def pytest_attnperf_register_kernels(registry, config):
    for entry in zoo():
        if entry.name in KEPT:
            registry.add(entry.kernel())
"""

CASE_MODULE = """
from pytest_attnperf import LinearCase
from pytest_attnperf.families.linear.suite import test_linear  # noqa: F401

ATTNPERF_FAMILY = {family!r}
ATTNPERF_CASES = (LinearCase({case!r}, {shape}, gpu=False),)
"""


def _zoo_project(pytester: pytest.Pytester, kept: list[str], families: tuple[str, ...], case: str,
                 shape: str) -> None:
    """A project whose conftest registers the zoo kernels ``kept`` and whose test modules, one a
    family, run the linear suite's test on one case (``shape``: its arguments after the id); its
    runs are in this process, as the zoo's."""
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makeconftest(KEPT_CONFTEST.format(kept=kept))
    pytester.makepyfile(**{f"test_{family}": CASE_MODULE.format(family=family, case=case, shape=shape)
                           for family in families})


def test_a_gate_gradient_summed_over_the_sequence_passes_in_fp16_and_a_wrong_one_fails(
        pytester: pytest.Pytester) -> None:
    """fla's chunk GLA forms the gate's gradient as reverse cumulative sums of ``q dq - k dk``: its
    first elements are differences of sums over many tokens, zero exactly in fp64. The zoo's
    kernel that sums over the whole sequence from float32 ``dq`` and ``dk`` with fp16
    intermediates failed the rule while its yardstick took the gate's gradient through autograd
    only (``dg``: 5 elements at t=0 outside the elementwise bound, as fla's chunk GLA on the H200
    at d=128). It passes now, and the zoo's wrong gate gradients still fail on the same case, in
    GLA and simple GLA."""
    kept = ["zoo-ok-gla-chunk64-gate-summed", "zoo-bad-gla-dg-1pct-all", "zoo-bad-gla-dg-1pct-head",
            "zoo-bad-gla-dg-dropped", "zoo-bad-simple_gla-dg-1pct-all", "zoo-bad-simple_gla-dg-1pct-head",
            "zoo-bad-simple_gla-dg-dropped"]
    _zoo_project(pytester, kept, ("gla", "simple_gla"), "b1-h4-t1024-d64-fp16", '1, 4, 1024, 64, 64, "fp16"')
    junit = pytester.path / "junit.xml"
    pytester.runpytest_inprocess("-p", "pytest_attnperf.plugin", "-p", "no:logging", "-k", "zoo- and fwdbwd",
                                 "--attnperf-check-only", f"--junitxml={junit}")
    found = list(map(_outcome, ET.parse(junit).getroot().iter("testcase")))
    outcomes = {name: o for o in found for name in kept if o.test_id.endswith(f"-{name}-fwdbwd]")}
    assert sorted(outcomes) == sorted(kept), found
    assert len(found) == len(kept), found
    for name, outcome in outcomes.items():
        expected = "passed" if name.startswith("zoo-ok-") else "failed"
        assert outcome.status == expected, (name, outcome)
        if expected == "failed":
            assert outcome.message.startswith(f"Failed: {name} dg"), outcome


def test_the_quadratic_forms_pass_a_longer_fp32_case(pytester: pytest.Pytester) -> None:
    """The zoo's quadratic forms sum each decay's exponent over its own segment: formed as the
    difference of two cumulative sums over the sequence (about 160 at T=200) in float32, GLA's
    and GDN's failed this case by 1 to 5 elements (each decay then off by float32's rounding of
    160, about 1e-5 of itself, where cancelling terms leave an output element far smaller)."""
    kept = [f"zoo-ok-{family}-parallel" for family in FAMILIES]
    _zoo_project(pytester, kept, FAMILIES, "b2-h4-t200-d32-fp32", '2, 4, 200, 32, 32, "fp32"')
    result = pytester.runpytest_inprocess("-p", "pytest_attnperf.plugin", "-p", "no:logging", "-k", "zoo-",
                                          "--attnperf-check-only")
    result.assert_outcomes(passed=2 * len(FAMILIES))


def test_a_gate_gradient_summed_over_the_whole_sequence_is_declined_where_the_rule_fails_it() -> None:
    """The gate-summed kernel's gate gradient is a reverse cumulative sum over the sequence of terms
    that cancel: in bf16 its normwise error grows as the square root of the length (the H200
    failed it at T=4096, ``dg`` 0.0215 normwise against 4 unit roundoffs, 0.0156). The rule
    fails that form at T=4096 and passes it at T=1024, where the zoo stops taking cases; the
    chunk-local form of the same kernel passes both."""
    import torch
    from zoo.linear import GATE_SUMMED_MAX_TOKENS

    from pytest_attnperf.families.checks import CheckFailed
    from pytest_attnperf.families.linear.case import LinearCase
    from pytest_attnperf.families.linear.kernels import answer, check_tensor

    entries = {entry.name: entry for entry in ZOO}
    summed, local = entries["zoo-ok-gla-chunk64-gate-summed"], entries["zoo-ok-gla-chunk64-rounded"]

    def dg_ratio(entry: Zoo, seq: int) -> float:
        case = LinearCase(f"b1-h2-t{seq}-d32-bf16", 1, 2, seq, 32, 32, "bf16")
        a = answer("gla", entry.kernel(), case, "fwdbwd", torch.device("cpu"), seed=1)
        i = a.names.index("dg")
        return check_tensor("gla", f"{entry.name} dg", "dg", a.got[i], a.reference[i], a.yardstick[i], "bf16")

    short, long = GATE_SUMMED_MAX_TOKENS, 4 * GATE_SUMMED_MAX_TOKENS
    assert summed.supports(LinearCase("short", 1, 4, short, 64, 64, "bf16")) is None
    assert "sqrt(T)" in (summed.supports(LinearCase("long", 1, 4, short + 1, 64, 64, "bf16")) or "")
    assert dg_ratio(summed, short) <= 1
    with pytest.raises(CheckFailed, match=r"dg: normwise relative error"):
        dg_ratio(summed, long)
    assert dg_ratio(local, long) <= 1
