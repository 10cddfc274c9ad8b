"""Running one linear-attention case (``pytest_attnperf.families.linear.kernels.run_case``) on the CPU:
the fp64 reference and the same-dtype yardstick are computed only once a kernel has answered,
once per case, and they are what a kernel's output is held to."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear import reference as reference_linear
from pytest_attnperf.families.registry import Kernel

CASE = linear.LinearCase("unit-b1-h2-t24-d8-fp32", 1, 2, 24, 8, 8, "fp32", gpu=False)
CPU = torch.device("cpu")


@pytest.fixture
def references(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The families whose chunked form (fp64 reference or yardstick) was computed, in order (the
    case cache starts empty)."""
    computed: list[str] = []
    real = linear._chunked_fn

    def counting(family: str) -> Callable[..., Any]:
        fn = real(family)

        def reference(*args: Any, **kwargs: Any) -> Any:
            computed.append(family)
            return fn(*args, **kwargs)

        return reference

    monkeypatch.setattr(linear, "_chunked_fn", counting)
    monkeypatch.setattr(linear, "_cache", {})
    return computed


def exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
    """A kernel that is our fp64 recurrence, rounded back to the input dtype."""
    return reference_linear.linear_attention(q.double(), k.double(), v.double(), scale=scale).to(q.dtype)


def off_by_one_percent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
    return exact(q, k, v, scale=scale) * 1.01


def refuses(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
    raise RuntimeError("backward is not supported with Triton >= 3.4.0 and < 3.7.1 on Hopper (see #640)")


@pytest.mark.parametrize("direction", ["fwd", "fwdbwd"])
def test_a_refusal_skips_without_computing_the_reference(references: list[str], direction: str) -> None:
    kernel = Kernel("linear_attn", "refuses", refuses, unsupported=linear.FLA_REFUSALS)
    with pytest.raises(pytest.skip.Exception, match="refuses does not support this case: RuntimeError"):
        linear.run_case("linear_attn", kernel, CASE, direction, CPU)
    assert references == []


@pytest.mark.parametrize("direction", ["fwd", "fwdbwd"])
def test_the_reference_is_computed_once_for_the_kernels_of_a_case(references: list[str], direction: str) -> None:
    call = linear.run_case("linear_attn", Kernel("linear_attn", "exact", exact), CASE, direction, CPU)
    assert callable(call)
    linear.run_case("linear_attn", Kernel("linear_attn", "exact-again", exact), CASE, direction, CPU)
    # the fp64 reference and the yardstick, once each (with their gradients for fwdbwd)
    assert references == ["linear_attn"] * 2


def test_a_refusal_then_an_answer_still_checks_the_answer(references: list[str]) -> None:
    with pytest.raises(pytest.skip.Exception):
        linear.run_case("linear_attn", Kernel("linear_attn", "refuses", refuses,
                                              unsupported=linear.FLA_REFUSALS), CASE, "fwd", CPU)
    with pytest.raises(AssertionError, match="normwise relative error .* exceeds"):
        linear.run_case("linear_attn", Kernel("linear_attn", "off", off_by_one_percent), CASE, "fwd", CPU)
    assert references == ["linear_attn"] * 2


def writes_into_v_then_refuses(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
    with torch.no_grad():
        v.mul_(2.0)
    raise NotImplementedError("refused after writing into v")


def right_output_wrong_dv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
    """The exact output, plus a term whose value is zero but whose gradient adds 5% of dO to dv."""
    return exact(q, k, v, scale=scale) + 0.05 * (v - v.detach())


def test_a_kernel_that_writes_into_its_inputs_fails_even_when_it_refuses(references: list[str]) -> None:
    writer = Kernel("linear_attn", "writer", writes_into_v_then_refuses)
    try:
        with pytest.raises(AssertionError, match="the kernel wrote into its input v"):
            linear.run_case("linear_attn", writer, CASE, "fwd", CPU)
    except pytest.skip.Exception as exc:  # a skip would hide the write
        pytest.fail(f"skipped instead of failing: {exc}")
    # the case's inputs are put back for its other kernels and for the reference they are held to
    (prepared,) = linear._cache.values()
    clean = linear._inputs("linear_attn", CASE, CPU, backward=False)
    assert all(torch.equal(x, y) for x, y in zip(prepared.inputs, clean, strict=True))
    with pytest.raises(AssertionError, match="normwise relative error"):
        linear.run_case("linear_attn", Kernel("linear_attn", "off", off_by_one_percent), CASE, "fwd", CPU)
    linear.run_case("linear_attn", Kernel("linear_attn", "exact", exact), CASE, "fwd", CPU)


def test_a_wrong_gradient_fails_with_a_right_output(references: list[str]) -> None:
    with pytest.raises(AssertionError, match="wrong-dv dv: normwise relative error"):
        linear.run_case("linear_attn", Kernel("linear_attn", "wrong-dv", right_output_wrong_dv), CASE, "fwdbwd", CPU)
    linear.run_case("linear_attn", Kernel("linear_attn", "wrong-dv", right_output_wrong_dv), CASE, "fwd", CPU)


@pytest.mark.parametrize("family", ["linear_attn", "gla", "simple_gla", "gdn"])
def test_a_recurrent_kernels_yardstick_is_the_token_recurrence_in_float32(
    monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    """A recurrent kernel updates a float32 state token by token, so its yardstick does too: the
    output is the token recurrence in float32 and the gradients a recurrent backward's (GDN's
    from the chunked form); a chunk kernel's yardstick stays the rounded chunked form."""
    monkeypatch.setattr(linear, "_cache", {})
    case = linear.LinearCase("unit-b1-h2-t40-d8-bf16", 1, 2, 40, 8, 16, "bf16", gpu=False)
    p = linear.prepare(family, case, "fwdbwd", CPU)
    _, yard = p.reference("recurrent")
    q, k, v = p.inputs[:3]
    token = linear._recurrence_fn(family)(*p.inputs, scale=p.scale, compute=torch.float32)
    assert torch.equal(yard[0], token)
    if family == "gdn":
        chunked = p._run(torch.float32, None)
        assert all(torch.equal(a, b) for a, b in zip(yard[1:], chunked[1:], strict=True))
    else:
        gate = p.inputs[3] if family != "linear_attn" else None
        grads = reference_linear.recurrent_gradients(q, k, v, gate, p.grad_out, scale=p.scale, compute=torch.float32)
        assert all(torch.equal(a, b) for a, b in zip(yard[1:], grads, strict=True))
    assert len(yard) == len(p.inputs) + 1
    ref, _ = p.reference("chunk")
    for y, r in zip(yard, ref, strict=True):  # float32 throughout: close to the fp64 reference
        assert float((y.double() - r).abs().max() / r.abs().max()) < 1e-5
    _, chunk_yard = p.reference("chunk")
    assert not torch.equal(chunk_yard[0], yard[0])
