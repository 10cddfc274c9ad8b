"""A project's own mask (``families.softmax.axes.register_mask``): a case names it, and it is drawn,
checked against fp64 and timed with its draws as the built-in masks are; a kernel that ignores it
fails; a maker that raises or makes the wrong thing fails its case naming the mask; names are
never taken twice."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from pytest_attnperf.families.checks import CheckFailed
from pytest_attnperf.families.draws import Timed
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import axes, builtins
from pytest_attnperf.families.softmax import kernels as softmax

CPU = torch.device("cpu")


def documents(case: Any, gen: Any) -> Any:
    """Documents packed into each sequence, of seeded lengths: a query sees its own document's keys."""
    cuts = torch.randint(1, case.seq, (2,), generator=gen).tolist()
    doc = torch.zeros(case.seq, dtype=torch.long)
    for cut in cuts:
        doc[cut:] += 1
    return (doc[:, None] == doc[None, :])[None, None]


@pytest.fixture
def registered() -> Iterator[None]:
    axes.register_mask("documents", "boolean [1, 1, T, T]: documents packed in a sequence, each its own", documents)
    yield
    for name in ("documents", "broken", "raises"):
        axes.MASKS.pop(name, None)
        axes._MADE.pop(name, None)


def case(mask: str, causal: bool = True) -> softmax.SoftmaxCase:
    return softmax.SoftmaxCase(f"mine-{mask}", batch=2, heads=3, seq=24, head_dim=16, dtype="fp32", causal=causal,
                               gpu=False, mask=mask)


def kernel(fn: Any, name: str) -> Kernel:
    return Kernel("softmax", name, fn, axes=("mask",))


@pytest.mark.usefixtures("registered")
@pytest.mark.parametrize("direction", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("name", ["naive", "sdpa"])
def test_a_registered_mask_is_checked_and_timed_as_a_built_in_one(name: str, direction: str) -> None:
    fn = softmax.naive if name == "naive" else builtins.sdpa
    assert case("documents").refusal("softmax") is None
    checked = softmax.check_case(kernel(fn, name), case("documents"), direction, CPU)
    assert checked.ratios["out"] <= 1.0
    assert isinstance(checked.call, Timed)
    call = checked.call.draw(1)
    assert checked.call.verify(1, call()) <= 1.0


@pytest.mark.usefixtures("registered")
def test_a_kernel_that_ignores_the_mask_fails() -> None:
    def unmasked(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        opts.pop("attn_mask", None)
        return softmax.naive(q, k, v, **opts)

    with pytest.raises(CheckFailed, match="out"):
        softmax.check_case(kernel(unmasked, "unmasked"), case("documents", causal=False), "fwd", CPU)


@pytest.mark.usefixtures("registered")
@pytest.mark.parametrize(("make", "said"), [
    (lambda case, gen: torch.ones(3, 24, 24, 2, dtype=torch.bool), r"shape \(3, 24, 24, 2\), torch.bool"),
    (lambda case, gen: torch.ones(24, 24, dtype=torch.int64), r"torch.int64"),
    (lambda case, gen: [[True]], "a list"),
])
def test_a_maker_that_makes_no_mask_fails_its_case_naming_it(make: Any, said: str) -> None:
    axes.register_mask("broken", "a maker's mistake", make)
    with pytest.raises(CheckFailed, match=r"the mask 'broken' on mine-broken: its maker made .*" + said):
        softmax.check_case(kernel(softmax.naive, "naive"), case("broken"), "fwd", CPU)


@pytest.mark.usefixtures("registered")
def test_a_maker_that_raises_fails_its_case_naming_it() -> None:
    def raises(case: Any, gen: Any) -> Any:
        raise KeyError("no such document")

    axes.register_mask("raises", "a maker that raises", raises)
    with pytest.raises(CheckFailed, match=r"the mask 'raises'.s maker raised on mine-raises: KeyError"):
        softmax.check_case(kernel(softmax.naive, "naive"), case("raises"), "fwd", CPU)


@pytest.mark.usefixtures("registered")
def test_a_name_is_taken_once() -> None:
    axes.register_mask("documents", "again, the same maker", documents)  # a conftest imported again: no-op
    with pytest.raises(ValueError, match="registered already"):
        axes.register_mask("documents", "another maker", lambda case, gen: None)
    with pytest.raises(ValueError, match="registered already"):
        axes.register_mask("padding", "a built-in's name", documents)


def test_an_unknown_mask_is_refused_naming_the_known_ones() -> None:
    why = case("nonesuch").refusal("softmax")
    assert why is not None
    assert "no mask 'nonesuch'" in why
    assert "padding" in why
