"""Bring your own kernel: README's example runs through the softmax suite, and wrong kernels
registered the same way fail."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_conftest() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(# conftest\.py\n.*?)```", text, re.DOTALL)
    assert block, "README.md lost its bring-your-own-kernel example"
    return block.group(1)


@pytest.fixture
def suite_copy(pytester: pytest.Pytester) -> pytest.Pytester:
    # the runs are in this process (torch and the plugin loaded once, not once a run): tests/conftest.py
    # loads torch's lazily imported modules and fla before any run, so their state survives pytester's
    # module resets between runs
    shutil.copytree(ROOT / "suites", pytester.path / "suites")
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    return pytester


# The runs time their cases (a wrong kernel may fail only when timed) but measure no matmul or copy
# ceilings: no claim here reads a roofline, and each test's ceilings cache is a folder of its own
# (tests/conftest.py), so every run would measure them again (most of a run's time on the CPU).
FAST = ("--attnperf-budget=0.01", "--attnperf-ceilings=off", "--benchmark-disable")


def run_cpu_case(
    pytester: pytest.Pytester, name: str, *args: str, case: str = "cpu-b2-h4-t128-d32-causal-fp32",
) -> pytest.RunResult:
    """One CPU case of the softmax suite, for the kernels ``-k`` selects by ``name`` (``my-attention-``)."""
    return pytester.runpytest_inprocess(
        "-p", "pytest_attnperf.plugin", "suites/test_softmax.py", "-k", f"{case} and {name}", *FAST, "-rs", *args,
    )


def test_readme_example_passes(suite_copy: pytest.Pytester) -> None:
    """One run of the example's cases: both directions of the CPU case pass, and both of the
    windowed case (which the example refuses) skip with its message."""
    suite_copy.makeconftest(readme_conftest())
    result = run_cpu_case(suite_copy, "my-attention-", "-rA", case="(cpu-b2-h4-t128-d32-causal-fp32 or w32)")
    result.assert_outcomes(passed=2, skipped=2)
    node = "suites/test_softmax.py::test_softmax[cpu-b2-h4-t128-d32-causal-fp32-my-attention-%s]"
    result.stdout.fnmatch_lines([f"PASSED {node % 'fwd'}", f"PASSED {node % 'fwdbwd'}"], consecutive=False)
    result.stdout.fnmatch_lines(["SKIPPED [[]2[]] *my-attention does not support this case: NotImplementedError*"])


WRONG = '''
import torch
import torch.nn.functional as F


def pytest_attnperf_register_kernels(registry, config):
    @registry.kernel(family="softmax", name="wrong-scale")
    def wrong_scale(q, k, v, *, causal, scale, window=None):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale * 1.05)

    @registry.kernel(family="softmax", name="mask-off-by-one")
    def mask_off_by_one(q, k, v, *, causal, scale, window=None):
        t = q.shape[2]
        hidden = torch.ones(t, t, dtype=torch.bool).triu(2)  # lets each query see one future key
        scores = (q @ k.transpose(-1, -2)) * scale
        return scores.masked_fill(hidden, float("-inf")).softmax(-1) @ v

    @registry.kernel(family="softmax", name="one-nan")
    def one_nan(q, k, v, *, causal, scale, window=None):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        return out.index_put((torch.tensor([0]),) * 4, torch.tensor(float("nan")))

    @registry.kernel(family="softmax", name="writes-into-q")
    def writes_into_q(q, k, v, *, causal, scale, window=None):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        with torch.no_grad():
            q.mul_(2)
        return out

    @registry.kernel(family="softmax", name="writes-into-k-then-refuses")
    def writes_into_k_then_refuses(q, k, v, *, causal, scale, window=None):
        with torch.no_grad():
            k.add_(1)
        raise NotImplementedError("refused, after writing into k")

    @registry.kernel(family="gla", name="dropped-gate")
    def dropped_gate(q, k, v, g, *, scale):
        from pytest_attnperf.families.linear.kernels import la_naive

        return la_naive(q, k, v, scale=scale)

    @registry.kernel(family="softmax", name="zeroed-dq")
    def zeroed_dq(q, k, v, *, causal, scale, window=None):
        q_without_grad = q.detach() + 0 * q  # same values, zero gradient
        return F.scaled_dot_product_attention(q_without_grad, k, v, is_causal=causal, scale=scale)
'''


# each softmax kernel above: its verdicts on the fwd and fwdbwd cases, and a line its failure shows
SOFTMAX_WRONG = {
    "wrong-scale": ("failed", "failed", "*wrong-scale out: max |error|*exceeds*"),
    "mask-off-by-one": ("failed", "failed", "*mask-off-by-one out: max |error|*exceeds*"),
    "one-nan": ("failed", "failed", "*one-nan out: 1 of * elements are not finite (the first at b=*"),
    "zeroed-dq": ("passed", "failed", "*zeroed-dq dq is zero everywhere, the reference's is not*"),
    "writes-into-q": ("failed", "failed", "*the kernel wrote into its input q*"),
    "writes-into-k-then-refuses": ("failed", "failed", "*the kernel wrote into its input k (restored*"),
}


def verdicts(result: pytest.RunResult) -> dict[str, str]:
    """Each test's verdict from a ``-rA`` short summary, by its id's last part (``wrong-scale-fwd``)."""
    found = re.findall(r"^(PASSED|FAILED|SKIPPED|ERROR) \S+?\[cpu-[\w-]+?-fp\d\d-(\S+?)\]", result.stdout.str(), re.M)
    return {name: verdict.lower() for verdict, name in found}


def test_wrong_kernels_fail_each_with_its_message(suite_copy: pytest.Pytester) -> None:
    """One run (one process: each kernel costs its own cases only) of both suites: each wrong
    softmax kernel fails each direction it is wrong in, with its message, and passes the others;
    the linear kernel that drops its gate fails both directions."""
    suite_copy.makeconftest(WRONG)
    softmax = "(" + " or ".join(f"{name}-" for name in SOFTMAX_WRONG) + ")"
    result = suite_copy.runpytest_inprocess(
        "-p", "pytest_attnperf.plugin", "suites/test_softmax.py", "suites/test_linear.py",
        "-k", f"(cpu-b2-h4-t128-d32-causal-fp32 and {softmax}) or (cpu-b2-h2-t33-d16-fp32 and dropped-gate-)",
        *FAST, "-rA",
    )
    got = verdicts(result)
    for name, (fwd, fwdbwd, message) in SOFTMAX_WRONG.items():
        assert (got.get(f"{name}-fwd"), got.get(f"{name}-fwdbwd")) == (fwd, fwdbwd), name
        result.stdout.fnmatch_lines([message])
    assert (got.get("gla-dropped-gate-fwd"), got.get("gla-dropped-gate-fwdbwd")) == ("failed", "failed")
    result.stdout.fnmatch_lines(["*dropped-gate out: normwise relative error*exceeds*"])
    assert len(got) == 2 * len(SOFTMAX_WRONG) + 2


RESEEDS = '''
import pytest
import torch
import torch.nn.functional as F

RECORDED = {}  # each case's global CPU generator state as its call began


def pytest_attnperf_register_kernels(registry, config):
    @registry.kernel(family="softmax", name="reseeds")
    def reseeds(q, k, v, *, causal, scale, window=None):
        torch.manual_seed(123)
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def pytest_runtest_call(item):  # inside attnperf's guard, which wraps the call
    RECORDED[item.name] = torch.get_rng_state()


@pytest.fixture
def recorded():
    return RECORDED
'''

AFTER_RESEED = '''
import torch


def test_after(recorded):
    before = [state for name, state in recorded.items() if "reseeds" in name]
    assert len(before) == 2 and torch.initial_seed() != 123
    assert torch.equal(torch.get_rng_state(), before[-1])
    gen = torch.Generator().manual_seed(0)
    gen.set_state(before[-1])
    assert torch.equal(torch.rand(4), torch.rand(4, generator=gen))  # the draw it would have made
'''


def test_a_kernel_that_reseeds_the_global_generator_is_reported_and_the_next_test_sees_it_unseeded(
    suite_copy: pytest.Pytester,
) -> None:
    suite_copy.makeconftest(RESEEDS)
    suite_copy.makepyfile(test_after=AFTER_RESEED)
    result = suite_copy.runpytest_inprocess(
        "-p", "pytest_attnperf.plugin", "suites/test_softmax.py", "test_after.py",
        "-k", "cpu-b2-h4-t128-d32-causal-fp32 and (reseeds- or sdpa-math-) or test_after", *FAST, "-rA",
    )
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines([
        "*reseeds-fwd]: the case reseeded a global generator (set back now, so later cases draw as they would "
        "have): *CPU generator's seed (torch.manual_seed; torch.initial_seed): * -> 123*",
    ])
    assert "sdpa-math-fwd]: the case reseeded" not in result.stdout.str()
