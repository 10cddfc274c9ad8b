"""The timing-integrity kernels (``tests/zoo/integrity.py``) through the softmax suite's CPU table,
timed (not check-only): each kernel that is right when checked and cheats when timed fails,
saying the timed computation differs from the checked one (or that it raised on a later call
where its checked call returned); the right ones pass, those that keep state between calls
included; a kernel that claims bitwise reproducibility and is not fails by that rule; and the
built-in kernels after them on the same case pass.

One pytest subprocess makes the run (grouped GQA case, both directions), shared by the module;
the assertions read its JUnit XML.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
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


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    where = tmp_path_factory.mktemp("integrity")
    shutil.copytree(ROOT / "suites", where / "suites")
    (where / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYTEST_ADDOPTS", "TOX_ENV_DIR") and not name.startswith("PYTEST_XDIST_")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), HOME=str(where),
               XDG_CACHE_HOME=str(where / "cache"), PY_COLORS="0", OMP_NUM_THREADS="1")
    names = " or ".join([*integrity.OK, *integrity.BAD, *BUILT_IN])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "pytest_attnperf.plugin", "-p", "zoo.integrity",
         "suites/test_softmax.py", "-k", f"{CASE} and ({names})", "--attnperf-budget=0.02s", "--attnperf-min-samples=4",
         "--junitxml=junit.xml", "-q", "-p", "no:randomly", "-p", "no:xdist"],
        cwd=where, env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    broke = f"the run broke (exit {done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert done.returncode == 1, broke  # failures, and nothing worse
    return _outcomes(where / "junit.xml")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_kernel_that_cheats_when_timed_fails_saying_so(run: Outcomes, name: str) -> None:
    for direction in ("fwd", "fwdbwd"):
        if (name, direction) not in run:
            continue  # a forward-only kernel
        outcome, message, _ = run[(name, direction)]
        expected = EXPECTED[name].get(direction)
        if expected is None:
            assert outcome == "passed", message
        else:
            assert outcome == "failure", f"{name} {direction}: {outcome}\n{message}"
            assert expected in message, f"{name} {direction}: {message}"


@pytest.mark.parametrize("name", sorted(set(integrity.OK) | set(BUILT_IN)))
def test_a_right_kernel_passes_with_its_timed_draws_verified(run: Outcomes, name: str) -> None:
    mine = {key: value for key, value in run.items() if key[0] == name}
    assert mine, f"{name} did not run"
    for (_, direction), (outcome, message, props) in mine.items():
        assert outcome == "passed", f"{name} {direction}: {message}"
        assert int(props["attnperf_verified"]) >= 2  # the two host-timed draws, each checked


def test_the_kernels_are_all_accounted_for() -> None:
    assert set(EXPECTED) == set(integrity.BAD) - integrity.CUDA_ONLY


def test_bitwise_reproducibility_is_reported_and_not_required_unless_claimed(run: Outcomes) -> None:
    assert run[("integrity-ok-nondeterministic", "fwd")][2]["attnperf_bitwise"] == "no"
    assert run[("naive", "fwd")][2]["attnperf_bitwise"] == "yes"
