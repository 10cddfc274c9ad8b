"""The fp32 yardstick of a kernel whose products take TF32 operands (``families.tf32``): a linear
chunk kernel on a GPU, a softmax kernel registered with ``tf32=True``. Its rounding bit for bit,
the mode's products and gradients, and the rule with it: a TF32 kernel passes against it and
fails against the plain float32 computation; a 1% error still fails."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from zoo.linear import zoo  # tests/ is on sys.path

from pytest_attnperf.families import tf32
from pytest_attnperf.families.checks import CheckFailed
from pytest_attnperf.families.family import admit
from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear import rule
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.tf32 import round_tf32, tf32_products
from pytest_attnperf.measure import switches

CPU = torch.device("cpu")
CASE = linear.LinearCase("unit-b1-h2-t128-d32-fp32", 1, 2, 128, 32, 32, "fp32", gpu=False)
ZOO = {e.name: e for e in zoo()}

# input bits -> (truncated, nearest-even)
PATTERNS = {
    0x3F800000: (0x3F800000, 0x3F800000),  # 1.0, exact
    0x3F800FFF: (0x3F800000, 0x3F800000),  # just below half of the last kept bit
    0x3F801000: (0x3F800000, 0x3F800000),  # a tie, last kept bit even: stays
    0x3F803000: (0x3F802000, 0x3F804000),  # a tie, last kept bit odd: up to even
    0x3F801001: (0x3F800000, 0x3F802000),  # just above a tie
    0xBF803000: (0xBF802000, 0xBF804000),  # negative: the magnitude rounds
    0x3FFFFFFF: (0x3FFFE000, 0x40000000),  # largest mantissa: carries into the exponent
    0x7F7FFFFF: (0x7F7FE000, 0x7F800000),  # largest finite float32: rounds to inf
    0x7F7FE000: (0x7F7FE000, 0x7F7FE000),  # largest finite TF32
    0x00000001: (0x00000000, 0x00000000),  # smallest subnormal
    0x00003000: (0x00002000, 0x00004000),  # a subnormal tie, odd
    0x007FFFFF: (0x007FE000, 0x00800000),  # largest subnormal: up to the smallest normal
    0x80000000: (0x80000000, 0x80000000),  # -0
    0x7F800000: (0x7F800000, 0x7F800000),  # inf
    0xFF800000: (0xFF800000, 0xFF800000),  # -inf
    0x7FC00000: (0x7FC00000, 0x7FC00000),  # quiet NaN
    0x7F800001: (0x7F800001, 0x7F800001),  # a NaN whose payload lies in the dropped bits stays NaN
    0xFFFFFFFF: (0xFFFFFFFF, 0xFFFFFFFF),
}


def _bits(values: list[int]) -> torch.Tensor:
    return torch.tensor([v - (1 << 32) if v >= 1 << 31 else v for v in values], dtype=torch.int32).view(torch.float32)


@pytest.mark.parametrize("rounding", tf32.ROUNDINGS)
def test_round_tf32_bit_for_bit(rounding: str) -> None:
    column = tf32.ROUNDINGS.index(rounding)
    got = round_tf32(_bits(list(PATTERNS)), rounding).view(torch.int32).tolist()
    want = _bits([pair[column] for pair in PATTERNS.values()]).view(torch.int32).tolist()
    assert [hex(g & 0xFFFFFFFF) for g in got] == [hex(w & 0xFFFFFFFF) for w in want]


def test_round_tf32_refuses_another_dtype_or_rounding() -> None:
    with pytest.raises(ValueError, match="float32"):
        round_tf32(torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="rounding"):
        round_tf32(torch.ones(2), "up")


def test_inside_the_mode_products_and_their_gradients_take_tf32_operands() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(3, 8, 16, generator=gen, requires_grad=True)
    b = torch.randn(3, 16, 4, generator=gen, requires_grad=True)
    g = torch.randn(3, 8, 4, generator=gen)
    with tf32_products():
        c = a @ b
    (da, db) = torch.autograd.grad(c, (a, b), g)
    ra, rb, rg = (round_tf32(x.detach()) for x in (a, b, g))
    assert torch.equal(c, ra @ rb)
    assert not torch.equal(c, a @ b)
    assert torch.equal(da, rg @ rb.mT)
    assert torch.equal(db, ra.mT @ rg)
    with tf32_products():
        assert torch.equal(a.double() @ b.double(), (a.double() @ b.double()))  # float64: untouched
        with pytest.raises(NotImplementedError, match="einsum"):
            torch.einsum("bij,bjk->bik", a, b)


def _check(family: str, name: str, direction: str = "fwd") -> float:
    return float(max(linear.check_case(family, ZOO[name].kernel(), CASE, direction, CPU).ratios.values()))


@pytest.fixture
def gpu_yardstick(monkeypatch: pytest.MonkeyPatch) -> None:
    """The yardstick of a GPU's fp32 cases, on the CPU."""
    monkeypatch.setattr(linear, "_cache", {})
    monkeypatch.setattr(tf32, "rounds_products", lambda device: True)


@pytest.mark.parametrize("family", linear.FAMILIES)
def test_a_tf32_chunk_kernel_passes_the_tf32_yardstick_and_fails_the_plain_one(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(linear, "_cache", {})
    name = f"zoo-ok-{family}-chunk64-tf32"
    with pytest.raises(CheckFailed, match="outside the elementwise bound"):
        _check(family, name)  # the CPU's yardstick: float32 products
    monkeypatch.setattr(linear, "_cache", {})
    monkeypatch.setattr(tf32, "rounds_products", lambda device: True)
    assert _check(family, name) < 1
    assert _check(family, f"zoo-ok-{family}-chunk64-tf32-rne") < 1


def test_the_tf32_chunk_kernels_gradients_pass(gpu_yardstick: None) -> None:
    assert _check("gla", "zoo-ok-gla-chunk64-tf32", "fwdbwd") < 1


def test_a_truncating_kernel_needs_truncations_unit_roundoff(gpu_yardstick: None) -> None:
    """Truncation biases every product the same way: the output's normwise error is beyond 2 x
    2^-11 (round to nearest's unit roundoff) and within 2 x 2^-10 (truncation's)."""
    a = linear.answer("linear_attn", ZOO["zoo-ok-linear_attn-chunk64-tf32"].kernel(), CASE, "fwd", CPU)
    error = float((a.got[0].double() - a.reference[0]).norm() / a.reference[0].norm())
    assert 2 * 2.0**-11 < error <= 2 * rule.UNIT_ROUNDOFF["fp32"]


@pytest.mark.parametrize("family", ["linear_attn", "gdn"])
def test_a_gradient_one_percent_off_still_fails_at_fp32(gpu_yardstick: None, family: str) -> None:
    with pytest.raises(CheckFailed, match="normwise"):
        _check(family, f"zoo-bad-{family}-dv-1pct-all", "fwdbwd")


def test_the_cpu_keeps_float32_products() -> None:
    assert not tf32.rounds_products(CPU)
    assert tf32.rounds_products(torch.device("cuda"))


# -- softmax kernels registered with tf32=True ------------------------------------------------------


def _softmax_zoo() -> dict[str, object]:
    from zoo import softmax as softmax_zoo

    return {k.name: k.fn for k in softmax_zoo.KERNELS}


SOFTMAX_FP32 = softmax.SoftmaxCase("unit-b2-h4-t128-d32-causal-fp32", 2, 4, 128, 32, "fp32", True, gpu=False)


def _softmax_ratios(name: str, *, declared: bool) -> dict[str, float]:
    """A softmax zoo kernel's ratios on the fp32 case, registered with ``tf32=declared``."""
    kernel = Kernel("softmax", name, _softmax_zoo()[name], tf32=declared)  # type: ignore[arg-type]
    return dict(softmax.check_case(kernel, SOFTMAX_FP32, "fwdbwd", CPU).ratios)


def test_a_softmax_kernel_with_tf32_products_passes_declared_and_fails_undeclared_with_the_hint() -> None:
    ratios = _softmax_ratios("zoo-ok-tf32-online-b64", declared=True)
    assert set(ratios) == {"out", "dq", "dk", "dv"}
    assert max(ratios.values()) < 0.6  # 0.43 measured
    with pytest.raises(CheckFailed) as failed:
        _softmax_ratios("zoo-ok-tf32-online-b64", declared=False)
    assert "out: max |error|" in str(failed.value)
    assert failed.value.ratio > 100  # about 1,700 times the bound
    assert softmax.TF32_HINT in str(failed.value)


@pytest.mark.parametrize("name", ["zoo-bad-dense-3pct", "zoo-bad-sparse-1pct", "zoo-bad-dq-head", "zoo-bad-dk-all",
                                  "zoo-bad-dv-all"])
def test_a_wrong_fp32_kernel_gets_no_tf32_hint(name: str) -> None:
    """Wrong by 1% where TF32's looser bound would pass it: the hint would have it declare TF32 and
    pass (a gradient 1% off passes every declared fp32 case): only most of the output outside its
    fp32 bound, as TF32 products leave it, earns the hint."""
    with pytest.raises(CheckFailed) as wrong:
        _softmax_ratios(name, declared=False)
    assert softmax.TF32_HINT not in str(wrong.value)


def test_a_declared_one_percent_error_still_fails() -> None:
    with pytest.raises(CheckFailed) as declared:
        _softmax_ratios("zoo-bad-tf32-dense-1pct", declared=True)
    assert "out: max |error|" in str(declared.value)
    assert softmax.TF32_HINT not in str(declared.value)


def test_the_tf32_yardstick_rounds_fp32_products_only() -> None:
    prepared = softmax.prepare(SOFTMAX_FP32, "fwdbwd", CPU)
    rounded = prepared.yardstick(True)
    assert all(not torch.equal(a, b) for a, b in zip(rounded, prepared.torch_value, strict=True))
    assert prepared.yardstick(True) is rounded  # made once
    bf16 = softmax.SoftmaxCase("unit-b2-h4-t128-d32-causal-bf16", 2, 4, 128, 32, "bf16", True, gpu=False)
    half = softmax.prepare(bf16, "fwd", CPU)
    assert half.yardstick(True) is half.torch_value


def test_tf32_is_refused_outside_the_softmax_family() -> None:
    with pytest.raises(ValueError, match="kernel 'mine' in family 'gla': tf32=True is the softmax family's"):
        admit(Kernel("gla", "mine", lambda *a, **k: None, tf32=True))
    with pytest.raises(ValueError, match="kernel 'mine' in family 'mine': tf32=True is the softmax family's"):
        admit(Kernel("mine", "mine", lambda *a, **k: None, tf32=True))  # a family not built in has no yardstick
    declared = Kernel("softmax", "mine", lambda *a, **k: None, tf32=True)
    assert admit(declared) is declared


def test_the_sliced_check_of_large_cases_holds_a_declared_kernel_to_the_tf32_yardstick() -> None:
    """A case too large for whole-tensor references is checked on two head slices (``sliced``): a
    kernel registered with ``tf32=True`` is held to the TF32 yardstick there too."""
    from pytest_attnperf.families.softmax.sliced import run_sliced

    fn = _softmax_zoo()["zoo-ok-tf32-online-b64"]
    case = softmax.SoftmaxCase("unit-b1-h4-kv2-t64-d32-causal-fp32", 1, 4, 64, 32, "fp32", True, kv_heads=2, gpu=False)
    run_sliced(Kernel("softmax", "declared", fn, tf32=True), case, "fwdbwd", CPU, "unit")  # type: ignore[arg-type]
    with pytest.raises(CheckFailed, match="out: max [|]error[|]"):
        run_sliced(Kernel("softmax", "undeclared", fn), case, "fwdbwd", CPU, "unit")  # type: ignore[arg-type]


def _precisions() -> list[str]:
    """What torch's float32 matmuls may do now: each backend's ``fp32_precision`` (or, on a torch
    before 2.9, the legacy setting)."""
    owners = switches.matmul_precisions()
    return [owner.fp32_precision for owner in owners] if owners else [torch.get_float32_matmul_precision()]


def _project_turns_tf32_on(how: str) -> None:
    if how == "legacy":
        torch.backends.cuda.matmul.allow_tf32 = True  # as set_float32_matmul_precision("high")
    elif switches.matmul_precisions():
        torch.backends.cuda.matmul.fp32_precision = "tf32"
    else:
        pytest.skip("this torch has no fp32_precision setting")


@pytest.mark.parametrize("how", ["legacy", "fp32_precision"])
def test_the_yardsticks_take_full_fp32_products_whatever_the_project_set(monkeypatch: pytest.MonkeyPatch,
                                                                         how: str) -> None:
    """A project that turns TF32 on for its own training (``allow_tf32``, or torch 2.9's
    ``fp32_precision``) leaves it on for the checks too: each family's fp32 yardstick would take
    10-bit products on a GPU, and every fp32 bound widen with them. Each yardstick (softmax's, its
    TF32 one and the sliced check's, the linear chunk form's, the decode recurrence's) is made at
    full precision, and the project's setting is put back as it was."""
    from pytest_attnperf.families.linear import decode
    from pytest_attnperf.families.softmax import sliced

    seen: list[list[str]] = []

    def recording(fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            seen.append(_precisions())
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(softmax, "naive", recording(softmax.naive))
    chunked, recurrence = linear._chunked_fn, linear._recurrence_fn
    monkeypatch.setattr(linear, "_chunked_fn", lambda family: recording(chunked(family)))
    monkeypatch.setattr(linear, "_recurrence_fn", lambda family: recording(recurrence(family)))
    owners = switches.matmul_precisions()
    before = [owner.fp32_precision for owner in owners]
    legacy = torch.get_float32_matmul_precision()
    try:
        _project_turns_tf32_on(how)
        project = _precisions()
        softmax._cache.clear()
        case = softmax.SoftmaxCase("unit-b1-h2-t16-d8-causal-fp32", 1, 2, 16, 8, "fp32", True, gpu=False)
        softmax.prepare(case, "fwdbwd", CPU).yardstick(tf32=True)
        fn = _softmax_zoo()["zoo-ok-tf32-online-b64"]
        sliced.run_sliced(Kernel("softmax", "declared", fn, tf32=True), case, "fwd", CPU, "unit")  # type: ignore[arg-type]
        linear_case = linear.LinearCase("unit-b1-h2-t16-d8-fp32", 1, 2, 16, 8, 8, "fp32", gpu=False)
        linear._cache.clear()
        linear.prepare("gla", linear_case, "fwdbwd", CPU).reference("chunk")
        decode._cache.clear()
        decode.prepare("gla_decode", decode.LinearDecodeCase("unit-b1-h2-s1-d8-fp32", 1, 2, 1, 8, 8, "fp32"), CPU)
        assert _precisions() == project
    finally:
        for owner, value in zip(owners, before, strict=True):
            owner.fp32_precision = value
        if not owners:
            torch.set_float32_matmul_precision(legacy)
    assert "tf32" in project or "high" in project, project
    assert len(seen) >= 6, seen  # softmax: prepare, TF32 yardstick, sliced; linear: fp64, fp32; decode: both
    full = [["ieee"] * len(owners)] if owners else [["highest"]]
    assert all(s in full for s in seen), seen
