"""A kernel cannot make the check itself lie: an output of a tensor subclass, an operator override
through ``torch.library``, saved-tensor hooks or a patched clock left behind each fail the case
that did it, named, and are undone before any check (or later case) runs with them.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from typing import Any

import kit
import pytest
import torch

from pytest_attnperf.families import checks
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import kernels as softmax

CPU = torch.device("cpu")
CASE = softmax.SoftmaxCase("unit-b1-h2-t16-d8-fp32", 1, 2, 16, 8, "fp32", True, gpu=False)
KEPT: list[Any] = []  # what a hostile kernel keeps alive (a Library whose registrations outlive the call)


class Liar(torch.Tensor):
    """Every subtraction answers zero: an error computed through it is always 0."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in (torch.Tensor.sub, torch.Tensor.__sub__, torch.sub):
            return torch.zeros_like(torch.Tensor.as_subclass(args[0], torch.Tensor))
        return super().__torch_function__(func, types, args, kwargs or {})  # type: ignore[no-untyped-call]


def right(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
    return softmax.naive(q, k, v, causal=causal, scale=scale, window=window)


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    yield
    KEPT.clear()


def check(fn: Any, direction: str = "fwd", **kernel: Any) -> Any:
    return softmax.check_case(Kernel("softmax", "hostile", fn, **kernel), CASE, direction, CPU)


def test_a_tensor_subclass_output_fails_naming_it_and_a_declared_one_is_compared_as_a_plain_tensor() -> None:
    def liar(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
        return torch.zeros_like(q).as_subclass(Liar)

    with pytest.raises(checks.CheckFailed, match=r"returned a .*Liar, a torch.Tensor subclass"):
        check(liar)
    with pytest.raises(checks.CheckFailed, match=r"hostile out: max \|error\|"):
        check(liar, output_types=(Liar,))  # declared: compared as the zeros it holds

    def honest(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
        return right(q, k, v, causal=causal, scale=scale).as_subclass(Liar)

    assert max(check(honest, "fwdbwd", output_types=(Liar,)).ratios.values()) <= 1


def test_a_subclass_returned_only_in_the_timed_calls_fails_there() -> None:
    calls = []

    def later(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
        calls.append(1)
        out = right(q, k, v, causal=causal, scale=scale)
        return out if len(calls) == 1 else torch.zeros_like(out).as_subclass(Liar)

    timed = check(later).call
    with pytest.raises(checks.CheckFailed, match="Liar, a torch.Tensor subclass"):
        timed()


def test_an_operator_override_left_registered_fails_and_is_removed_before_the_references_use_it() -> None:
    def overrides(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
        out = right(q, k, v, causal=causal, scale=scale)
        lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
        lib.impl("_softmax", lambda x, dim, half: torch.full_like(x, 0.5), "CPU")  # type: ignore[no-untyped-call]
        KEPT.append(lib)
        return out

    overridden = pytest.warns(UserWarning, match="Overriding a previously registered kernel")
    with overridden, pytest.raises(checks.CheckFailed, match="torch.library override aten/_softmax/CPU"):
        check(overrides)
    x = torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(torch.softmax(x, 0), torch.exp(x) / torch.exp(x).sum())


def test_an_override_that_takes_the_place_of_a_removed_registration_is_caught() -> None:
    """The registrations are read around every call and remembered between reads: a kernel that
    removes one of its own and registers an override, their number unchanged, fails as well."""
    spare = torch.library.Library("attnperf_spare", "DEF")  # type: ignore[no-untyped-call]
    spare.define("same(Tensor x) -> Tensor")  # type: ignore[no-untyped-call]
    spare.impl("same", lambda x: x, "CPU")  # type: ignore[no-untyped-call]

    def swaps(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
        out = right(q, k, v, causal=causal, scale=scale)
        spare._destroy()  # type: ignore[no-untyped-call]
        lib = torch.library.Library("aten", "IMPL")  # type: ignore[no-untyped-call]
        lib.impl("_softmax", lambda x, dim, half: torch.full_like(x, 0.5), "CPU")  # type: ignore[no-untyped-call]
        KEPT.append(lib)
        return out

    with warnings.catch_warnings():  # torch says "Overriding ..." once a process, maybe above
        warnings.simplefilter("ignore")
        with pytest.raises(checks.CheckFailed, match="torch.library override aten/_softmax/CPU"):
            check(swaps)
    x = torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(torch.softmax(x, 0), torch.exp(x) / torch.exp(x).sum())


def test_saved_tensor_hooks_left_on_fail_and_are_popped() -> None:
    def hooks(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
        torch.autograd.graph.saved_tensors_hooks(lambda x: x * 1.5, lambda x: x).__enter__()  # never left
        return right(q, k, v, causal=causal, scale=scale)

    with pytest.raises(checks.CheckFailed, match="left saved-tensor hooks"):
        check(hooks, "fwdbwd")
    assert torch._C._autograd._top_saved_tensors_default_hooks(True) is None


def test_a_patched_clock_fails_naming_it_and_is_put_back() -> None:
    real = time.perf_counter_ns

    def clock(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
        time.perf_counter_ns = lambda: real() // 100
        return right(q, k, v, causal=causal, scale=scale)

    try:
        with pytest.raises(checks.CheckFailed, match=r"time.perf_counter_ns: replaced by"):
            check(clock)
        assert time.perf_counter_ns is real
    finally:
        time.perf_counter_ns = real


SKIPS_WHEN_TIMED = '''
import pytest

from pytest_attnperf.costs import Cost


@pytest.mark.parametrize("how", ["skip", "xfail", "plain"])
def test_case(how, attnperf):
    def kernel():
        if how != "plain":
            getattr(pytest, how)("only while timed")

    attnperf.measure(kernel, cost=Cost(flops=1e9, bytes=1e6), dtype="bf16")
'''


def test_a_skip_or_xfail_raised_inside_a_timed_call_fails_the_case(pytester: pytest.Pytester) -> None:
    """A kernel that passes its checked call and then skips (or xfails) only while it is timed would
    leave its gate unjudged and the run green."""
    kit.make_project(pytester, test_timed=SKIPS_WHEN_TIMED)
    result = pytester.runpytest_inprocess(*kit.PLUGIN, "--attnperf-baselines=baselines", "--update-baselines")
    result.assert_outcomes(passed=1, failed=2)
    said = "the kernel raised {} (only while timed) inside a timed call*"
    result.stdout.fnmatch_lines([f"*test_case?skip?: {said.format('Skipped')}",
                                 f"*test_case?xfail?: {said.format('XFailed')}"])
