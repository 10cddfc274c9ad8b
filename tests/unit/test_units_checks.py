"""The elementwise rule's floor and smoothing, the failure messages' locations, and the messages
for a kernel that passes no gradient to an input or has no backward at all."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from pytest_attnperf.families import checks
from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear import rule
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import builtins
from pytest_attnperf.families.softmax import kernels as softmax

CPU = torch.device("cpu")
BF16_ULP_AT_2 = 2.0**-6  # bf16 keeps 8 significant bits: at [2, 4) one ulp is 2^(1 - 7)


def test_ulp_is_the_spacing_of_the_dtype_at_each_magnitude() -> None:
    x = torch.tensor([1.0, 1.5, 2.296875, 0.75, 1e-40, 0.0], dtype=torch.float64)
    got = checks.ulp(x, "bf16")
    assert got[:4].tolist() == [2.0**-7, 2.0**-7, BF16_ULP_AT_2, 2.0**-8]
    # where bf16 has it, the next representable number is one ulp away
    for value, step in zip(x[:4].tolist(), got[:4].tolist(), strict=True):
        above = torch.tensor(value, dtype=torch.bfloat16).double() + step
        assert above.to(torch.bfloat16).double().item() == pytest.approx(value + step)
    assert checks.ulp(torch.tensor([1.0], dtype=torch.float64), "fp32").item() == 2.0**-23
    assert got[4].item() == got[5].item() > 0  # below the smallest normal: the subnormals' spacing


def _flat(values: list[float]) -> Any:
    return torch.tensor(values, dtype=torch.float64).reshape(1, 1, 1, -1)


def _on_the_grid(n: int) -> Any:
    """n bf16 numbers in [2, 4): a reference that PyTorch's yardstick hits exactly."""
    return (2.0 + torch.arange(n, dtype=torch.float64) * 3 * BF16_ULP_AT_2).reshape(1, 1, 1, -1)


def test_an_answer_one_ulp_off_where_the_yardstick_is_exact_passes() -> None:
    """A correct kernel whose result landed across one rounding boundary: the old bound (the unit
    roundoff times |ref|, 0.0090 at 2.3) was below the ulp (0.0156) and failed it."""
    ref = _on_the_grid(32)
    kernel = ref.clone()
    kernel[..., 7] += BF16_ULP_AT_2
    assert checks.assert_elementwise("out", kernel, ref, ref.clone(), dtype="bf16", factor=8.0,
                                     yardstick_name="PyTorch's").worst_ratio == pytest.approx(1.0)
    # the old bound, unit |ref| + factor (...), is below one ulp there
    assert (2.0**-8) * float(ref[..., 7]) < BF16_ULP_AT_2


def test_two_ulps_off_where_the_yardstick_is_exact_fails() -> None:
    ref = _on_the_grid(32)
    kernel = ref.clone()
    kernel[..., 7] += 2 * BF16_ULP_AT_2
    with pytest.raises(checks.CheckFailed, match=r"1 of 32 elements outside"):
        checks.assert_elementwise("out", kernel, ref, ref.clone(), dtype="bf16", factor=8.0, yardstick_name="y")


def test_where_the_yardstick_got_lucky_its_neighbours_stand_in() -> None:
    """The yardstick errs by e everywhere but one element, where it is exact: the kernel may err
    there as it may around it; the same error with no neighbour erring that much fails."""
    ref = _flat([1.0] * 64)
    error = 1e-4
    yardstick = ref + error
    yardstick[..., 30] = 1.0  # exact by luck
    kernel = ref.clone()
    kernel[..., 30] += 0.7 * 8 * error
    checks.assert_elementwise("out", kernel, ref, yardstick, dtype="fp32", factor=8.0, yardstick_name="y")
    assert checks.smoothed((yardstick - ref).abs(), -1)[..., 30].item() > 0.5 * error
    assert checks.smoothed((yardstick - ref).abs(), -1, neighbours=0)[..., 30].item() == 0.0
    quiet = _flat([1.0] * 64)
    quiet[..., 0] += error  # one far element errs; the rms is small, no neighbour errs
    with pytest.raises(checks.CheckFailed, match=r"1 of 64 elements outside"):
        checks.assert_elementwise("out", kernel, ref, quiet, dtype="fp32", factor=8.0, yardstick_name="y")


def test_the_message_names_the_worst_element_by_axis_with_both_values_and_the_count() -> None:
    ref = torch.ones(2, 3, 5, 7, dtype=torch.float64)
    kernel = ref.clone()
    kernel[1, 2, 3, 4] = 1.5
    kernel[0, 0, 0, 0] = 1.25
    with pytest.raises(checks.CheckFailed) as failed:
        checks.assert_elementwise("k dq", kernel, ref, ref.clone(), dtype="fp32", factor=8.0,
                                  yardstick_name="PyTorch's fp32", axes="b h t d")
    message = str(failed.value)
    assert message.startswith("k dq: 2 of 210 elements outside the elementwise bound")
    assert "at b=1 h=2 t=3 d=4: 1.5 where the fp64 reference is 1\n" in message
    assert re.search(r"\|error\| 0\.5 > bound 1\.19e-07 = 1\.19e-07 \(one fp32 ulp there\)", message)
    assert len(message.splitlines()) == 2


def test_the_largest_error_rule_names_where_and_how_many() -> None:
    ref = torch.ones(2, 3, 5, 7, dtype=torch.float64)
    kernel = ref.clone()
    kernel[1, 0, 4, 6] = 3.0
    with pytest.raises(checks.CheckFailed, match=r"at b=1 h=0 t=4 d=6, exceeds .*; 1 elements are beyond it"):
        checks.assert_close("k out", kernel, ref, ref.clone(), "fp32", axes="b h t d")


def test_a_nan_is_placed_too() -> None:
    ref = torch.ones(2, 3, 4, dtype=torch.float64)
    kernel = ref.clone()
    kernel[1, 2, 3] = float("nan")
    with pytest.raises(checks.CheckFailed, match=r"1 of 24 elements are not finite \(the first at b=1 t=2 h=3\)"):
        rule.assert_normwise("k dbeta", kernel, ref, "fp32", 4.0, rule.axes_of("dbeta", 3))


SOFTMAX_CASE = softmax.SoftmaxCase("units-b2-h4-t32-d16-causal-fp32", 2, 4, 32, 16, "fp32", True, gpu=False)
LINEAR_CASE = linear.LinearCase("units-b2-h2-t20-d8-fp32", 2, 2, 20, 8, 8, "fp32", gpu=False)


def _softmax(fn: Any) -> None:
    softmax.run_case(Kernel("softmax", "mine", fn), SOFTMAX_CASE, "fwdbwd", CPU)


def _attention(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None = None) -> Any:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def test_a_kernel_that_detaches_an_input_is_told_which() -> None:
    def detached_k(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        return _attention(q, k.detach(), v, **opts)

    with pytest.raises(checks.CheckFailed, match=r"kernel 'mine' passes no gradient to its input k: "):
        _softmax(detached_k)


def test_a_kernel_whose_output_ignores_an_input_is_told_which() -> None:
    def ignores_v(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        return _attention(q, k, v.detach(), **opts) + 0 * v  # right, but not through autograd

    with pytest.raises(checks.CheckFailed, match=r"mine dv is zero everywhere, the reference's is not"):
        _softmax(ignores_v)


def test_a_kernel_without_a_backward_is_told_about_backward_false() -> None:
    def forward_only(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        with torch.no_grad():
            return _attention(q, k, v, **opts)

    with pytest.raises(checks.CheckFailed, match=r"does not require grad.*register.* with backward=False"):
        _softmax(forward_only)


@pytest.mark.parametrize("dropped", ["g", "beta"])
def test_a_gdn_kernel_that_drops_a_gate_gradient_is_told_which(dropped: str) -> None:
    exact = linear._chunked_fn("gdn")

    def kernel(q: Any, k: Any, v: Any, g: Any, beta: Any, *, scale: float) -> Any:
        g, beta = (g.detach(), beta) if dropped == "g" else (g, beta.detach())
        return exact(q, k, v, g, beta, scale=scale).to(q.dtype)

    with pytest.raises(checks.CheckFailed, match=rf"passes no gradient to its input {dropped}: "):
        linear.run_case("gdn", Kernel("gdn", "mine", kernel), LINEAR_CASE, "fwdbwd", CPU)


def test_a_seed_draws_other_inputs_and_zero_draws_the_usual_ones() -> None:
    usual = softmax.prepare(SOFTMAX_CASE, "fwd", CPU)
    again = softmax.prepare(SOFTMAX_CASE, "fwd", CPU, seed=0)
    other = softmax.prepare(SOFTMAX_CASE, "fwd", CPU, seed=3)
    assert torch.equal(usual.q, again.q)
    assert not torch.equal(usual.q, other.q)
    lin = linear.prepare("gla", LINEAR_CASE, "fwd", CPU, seed=3).inputs[0]
    assert not torch.equal(linear.prepare("gla", LINEAR_CASE, "fwd", CPU).inputs[0], lin)


def test_the_inputs_copies_are_made_before_the_allocator_is_poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    """``poison_allocator`` frees NaN-filled blocks sized as the inputs for the kernel's outputs to
    take: copies of the inputs made after it would take them instead (CUDA's caching allocator
    serves the best-fitting free block), and an element a kernel never writes would not show."""
    events: list[str] = []
    made = checks.snapshots

    def copies(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        events.append("copies")
        return made(inputs)

    def call() -> int:
        events.append("call")
        return 7

    monkeypatch.setattr(checks, "snapshots", copies)
    monkeypatch.setattr(checks, "poison_allocator", lambda device, sizes: events.append(f"poison {sizes}"))
    kernel = Kernel("softmax", "mine", lambda: None)
    assert checks.call_checked(kernel, call, "x", (torch.ones(2, 3),), torch.device("cpu")) == 7
    assert events == ["copies", "poison [24]", "call"]


def test_flex_window_compiles_past_dynamos_default_limit_of_eight(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every shape, direction and mask is a compilation of flex_attention's one frame; past dynamo's
    default limit of 8 (the GPU tables and a model's window layers take more in one run), it would
    run unfused, materialising the scores. On the CPU, 9 shapes gave torch's warning "flex_attention
    called without torch.compile()" at the 9th before; none now. Here the limit in force as the
    compiled call runs is read, without compiling."""
    import torch._dynamo
    import torch.nn.attention.flex_attention as flex

    seen: list[int] = []
    default = torch._dynamo.config.recompile_limit

    def compiled(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch._dynamo.config.recompile_limit)
        return args[0]

    monkeypatch.setattr(torch, "compile", lambda fn, **options: compiled)
    monkeypatch.setattr(flex, "create_block_mask", lambda *args, **kwargs: None)
    monkeypatch.setattr(builtins, "_flex", {})
    q = torch.zeros(1, 2, 8, 4)
    builtins.flex_window(q, q, q, causal=True, scale=0.5, window=4)
    assert seen == [builtins.FLEX_RECOMPILES]
    assert builtins.FLEX_RECOMPILES > default
    assert torch._dynamo.config.recompile_limit == default  # put back


def test_a_kernel_that_leaves_a_torch_mode_on_fails_naming_it_and_the_mode_is_popped() -> None:
    """A torch function mode left on intercepts the checks' own torch calls: one that turns every
    subtraction into zero makes any answer's error zero. It is popped before the checks run."""
    from torch.overrides import TorchFunctionMode

    class NoDifferences(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func in (torch.Tensor.__sub__, torch.sub):
                return torch.zeros_like(args[0])
            return func(*args, **(kwargs or {}))

    def wrong(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
        out = softmax.naive(q, k, v, causal=causal, scale=scale, window=window) * 1.5
        NoDifferences().__enter__()  # type: ignore[no-untyped-call]  # never left
        return out

    case = softmax.SoftmaxCase("unit-b1-h2-t16-d8-fp32", 1, 2, 16, 8, "fp32", True, gpu=False)
    depths = (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack())
    named = r"(?s)left a torch mode on.*torch function mode .*NoDifferences: left on"
    with pytest.raises(checks.CheckFailed, match=named):
        softmax.check_case(Kernel("softmax", "wrong", wrong), case, "fwd", torch.device("cpu"))
    assert (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()) == depths


def test_a_case_that_leaves_a_torch_mode_on_is_named_and_the_mode_popped_for_the_next_case() -> None:
    """Outside any kernel call (a fixture, a test's own code): the case's isolation finds the mode
    left on once the case is over, pops it, and says so."""
    from torch.utils.flop_counter import FlopCounterMode

    from pytest_attnperf.measure import isolation, process

    before = isolation.CaseState.take()
    depths = (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack())
    FlopCounterMode(display=False).__enter__()  # type: ignore[no-untyped-call]  # never left
    findings = isolation.undo(before, None, process.ExitRefusal())
    assert [f.what for f in findings] == ["left a torch mode on"]
    assert "mode" in findings[0].lines
    assert (torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()) == depths
