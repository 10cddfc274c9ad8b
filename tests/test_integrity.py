"""The timing-integrity kernels (``tests/zoo/integrity.py``) through the softmax suite's CPU table,
timed (not check-only): each kernel that is right when checked and cheats when timed fails,
saying the timed computation differs from the checked one (or that it raised on a later call
where its checked call returned); the right ones pass, those that keep state between calls
included; a kernel that claims bitwise reproducibility and is not fails by that rule; and the
built-in kernels after them on the same case pass.

One run (grouped GQA case, both directions), in this process, makes every claim; the assertions
read its JUnit XML.
"""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from zoo import integrity  # tests/ is on the path, as for every test module here

ROOT = Path(__file__).resolve().parents[1]
CASE = "cpu-b2-h12-kv3-t64-d32-causal-fp32"
BUILT_IN = ("naive", "sdpa-math")
DIFFERS = "the timed computation differs from the checked one"
RAISED_AGAIN = "the kernel raised when called again on the checked inputs, where its checked call had returned"
# what each wrong kernel's failing cases say, per direction (a direction left out passes)
EXPECTED: dict[str, dict[str, str]] = {
    "integrity-bad-cache-by-shape": {"fwd": DIFFERS, "fwdbwd": RAISED_AGAIN},
    "integrity-bad-zeros-after-first": {"fwd": DIFFERS, "fwdbwd": RAISED_AGAIN},
    "integrity-bad-less-work-later": {"fwd": DIFFERS, "fwdbwd": DIFFERS},
    "integrity-bad-partial-write": {"fwd": DIFFERS},
    "integrity-bad-lazy-output": {"fwd": DIFFERS},
    "integrity-bad-writes-inputs-later": {"fwd": DIFFERS, "fwdbwd": RAISED_AGAIN},
    "integrity-bad-drops-requires-grad": {"fwdbwd": RAISED_AGAIN},  # a forward needs no grad: it passes
    "integrity-bad-claims-deterministic": {"fwd": "attnperf_deterministic: two replays of the same timed draw gave "
                                                  "different bits", "fwdbwd": "attnperf_deterministic: two replays"},
}


Outcomes = dict[tuple[str, str], tuple[str, str, dict[str, str]]]


def _outcomes(path: Path) -> Outcomes:
    """(kernel, direction) -> (outcome, message, JUnit properties) of the case's tests."""
    found = {}
    for test in ET.parse(path).getroot().iter("testcase"):
        match = re.fullmatch(rf"test_softmax\[{CASE}-(.+)-(fwd|fwdbwd)\]", test.get("name", ""))
        if match is None:
            continue
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = test.find(tag)
            if element is not None:
                outcome, message = tag, f"{element.get('message', '')}\n{element.text or ''}"
                break
        props = {p.get("name", ""): p.get("value", "") for p in test.iter("property")}
        found[(match.group(1), match.group(2))] = (outcome, message, props)
    return found


def run(pytester: pytest.Pytester) -> Outcomes:
    """The suite's grouped CPU case for the integrity kernels and the built-in ones, in this process
    (torch, its profiler and the plugin loaded once; each kernel's state is its own, made when the
    run registers it)."""
    shutil.copytree(ROOT / "suites", pytester.path / "suites")
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    names = " or ".join([*integrity.OK, *integrity.BAD, *BUILT_IN])
    result = pytester.runpytest_inprocess(
        "-p", "pytest_attnperf.plugin", "-p", "zoo.integrity", "suites/test_softmax.py", "-k", f"{CASE} and ({names})",
        "--attnperf-budget=0.02s", "--attnperf-min-samples=4",
        "--attnperf-ceilings=off",  # no roofline is read: the machine's matmul and copy ceilings not measured
        f"--junitxml={pytester.path / 'junit.xml'}", "-q", "-p", "no:randomly", "-p", "no:xdist",
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-4000:]  # failures, and nothing worse
    return _outcomes(pytester.path / "junit.xml")


def test_the_integrity_kernels_fail_or_pass_as_they_should(pytester: pytest.Pytester) -> None:
    """One run, every claim:

    - each kernel that cheats when timed fails each direction ``EXPECTED`` names, saying so, and
      passes the others (a forward needs no grad);
    - each right kernel, the built-in ones after them included, passes with its two host-timed
      draws verified;
    - bitwise reproducibility is reported (``attnperf_bitwise``), and not required unless claimed.
    """
    outcomes = run(pytester)
    wrong = []
    for name in sorted(EXPECTED):
        if not any(key[0] == name for key in outcomes):
            wrong.append(f"{name} did not run")
        for direction in ("fwd", "fwdbwd"):
            if (name, direction) not in outcomes:
                continue  # a forward-only kernel
            outcome, message, _ = outcomes[(name, direction)]
            expected = EXPECTED[name].get(direction)
            if expected is None and outcome != "passed":
                wrong.append(f"{name} {direction}: {outcome}, expected to pass\n{message}")
            elif expected is not None and (outcome != "failure" or expected not in message):
                wrong.append(f"{name} {direction}: {outcome}, expected to fail saying {expected!r}\n{message}")
    for name in sorted(set(integrity.OK) | set(BUILT_IN)):
        mine = {key: value for key, value in outcomes.items() if key[0] == name}
        if not mine:
            wrong.append(f"{name} did not run")
        for (_, direction), (outcome, message, props) in mine.items():
            if outcome != "passed" or int(props["attnperf_verified"]) < 2:  # the two host-timed draws, each checked
                wrong.append(f"{name} {direction}: {outcome}, verified {props.get('attnperf_verified')}\n{message}")
    assert wrong == [], "\n\n".join(wrong)
    assert outcomes[("integrity-ok-nondeterministic", "fwd")][2]["attnperf_bitwise"] == "no"
    assert outcomes[("naive", "fwd")][2]["attnperf_bitwise"] == "yes"


def test_the_kernels_are_all_accounted_for() -> None:
    assert set(EXPECTED) == set(integrity.BAD) - integrity.CUDA_ONLY
