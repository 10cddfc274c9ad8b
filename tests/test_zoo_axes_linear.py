"""The linear families' call axes and relations (``tests/zoo/axes_linear.py``) on the catalogue's
smoke rows, checked in this process on the CPU as the catalogue's suite checks a kernel
(``Family.refusal``, then ``Family.check``):

* each wrong kernel fails the smoke row its pair names, a row of its class, in every direction its
  bug lives in, with a wrong number or a broken contract the checks name;
* each family's twin passes every smoke row of the axes and relations, in both directions (a
  relation's backward is refused: it compares forward calls);
* fla's naive references, which declare ``state``, pass those rows and refuse the packed ones; a
  kernel that declares no axis is refused every row that carries one, never passed.

fla's fused recurrent kernels (``families.interpret``) take these rows under Triton's interpreter
in the catalogue's own run (``pytest suites/``), where any failure fails the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from test_zoo_catalogue import _one_torch_thread, outcome  # noqa: F401 - tests/ is on the path; its autouse fixture
from zoo import axes_linear as zoo

from pytest_attnperf.families import catalogue
from pytest_attnperf.families.family import FAMILIES
from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear.case import RELATIONS
from pytest_attnperf.families.registry import Kernel, KernelRegistry

CLASSES = ("state", "varlen", *RELATIONS)
DIRECTIONS = ("fwd", "fwdbwd")


def axis_rows(family: str) -> tuple[catalogue.Row, ...]:
    """The family's smoke rows of the call axes and relations."""
    return tuple(r for r in FAMILIES[family].rows("smoke", False) if set(r.classes) & set(CLASSES))


def row_named(family: str, row_id: str) -> catalogue.Row:
    return next(r for r in axis_rows(family) if r.id == row_id)


def test_the_zoo_is_complete() -> None:
    """A wrong kernel for every axis and relation, each caught by a smoke row of its class, one twin a family."""
    assert {p.cls for p in zoo.PAIRS} == set(CLASSES)
    registry = KernelRegistry()
    zoo.register(registry)
    families = {p.family for p in zoo.PAIRS}
    assert len(registry) == len(zoo.PAIRS) + len(families)
    for pair in zoo.PAIRS:
        assert pair.cls in row_named(pair.family, pair.row).classes, pair
        kernel = pair.kernel()
        assert f"[{pair.cls}]" in kernel.description
        assert kernel.axes == zoo.AXES


@pytest.mark.parametrize("pair", [pytest.param(p, id=f"{p.family}-{p.wrong_name}@{p.row.removeprefix('cat-')}")
                                  for p in zoo.PAIRS])
def test_a_wrong_kernel_fails_the_row_of_its_class(pair: zoo.Pair) -> None:
    kernel, row = pair.kernel(), row_named(pair.family, pair.row)
    for direction in pair.directions:
        found = outcome(kernel, row, direction)
        assert found.status == "failed", f"{kernel.name} on {row.id} {direction}: {found}"
        # the checks name the kernel, or the input it wrote into (their write check names no kernel)
        assert kernel.name in found.message or "wrote into its input h0" in found.message, found.message


def twin_params() -> Iterator[Any]:
    for family in dict.fromkeys(p.family for p in zoo.PAIRS):
        for row in axis_rows(family):
            for direction in DIRECTIONS:
                yield pytest.param(family, row, direction, id=f"{family}-{row.id.removeprefix('cat-')}-{direction}")


@pytest.mark.parametrize(("family", "row", "direction"), list(twin_params()))
def test_the_twin_passes_every_row_of_the_axes(family: str, row: catalogue.Row, direction: str) -> None:
    found = outcome(zoo.twin(family), row, direction)
    if row.case.relation and direction == "fwdbwd":
        assert found.status == "refused", found
        assert "compares forward calls" in found.message, found
    else:
        assert found.status == "passed", f"twin-axes on {row.id} {direction}: {found}"


def naive_params() -> Iterator[Any]:
    registry = KernelRegistry()
    linear.register(registry)
    for family in FAMILIES:
        for kernel in (k for k in registry.family(family) if k.name == "fla-naive"):
            for row in axis_rows(family):
                for direction in DIRECTIONS:
                    yield pytest.param(kernel, row, direction,
                                       id=f"{family}-{row.id.removeprefix('cat-')}-{direction}")


# (not ``kernel``: the plugin reads a test parameter of that name as a suite's kernel, with its ``case``)
@pytest.mark.parametrize(("builtin", "row", "direction"), list(naive_params()))
def test_fla_naive_passes_the_state_rows_and_refuses_the_packed(builtin: Kernel, row: catalogue.Row,
                                                               direction: str) -> None:
    pytest.importorskip("fla")
    found = outcome(builtin, row, direction)
    if row.case.lengths is not None:
        assert found.status == "refused", found
        assert "varlen" in found.message or "forward calls" in found.message, found
    elif row.case.relation and direction == "fwdbwd":
        assert found.status == "refused", found
    else:
        assert found.status == "passed", f"{builtin.family}/fla-naive on {row.id} {direction}: {found}"


def test_a_kernel_that_declares_no_axis_is_refused_their_rows_never_passed() -> None:
    plain = Kernel("linear_attn", "plain", zoo.twin("linear_attn").fn)
    state_only = Kernel("linear_attn", "state-only", zoo.twin("linear_attn").fn, axes=("state",))
    for row in axis_rows("linear_attn"):
        case = row.case
        for kernel in (plain, state_only):
            undeclared = [a for a in case.axes if a not in kernel.axes]
            found = outcome(kernel, row, "fwd")
            if undeclared:
                assert found.status == "refused", (kernel.name, row.id, found)
                assert f"does not declare the call axis {', '.join(undeclared)}" in found.message
            else:
                assert found.status == "passed", (kernel.name, row.id, found)
    assert plain.axes == ()
    assert Kernel("gla", "one", plain.fn, axes="state").axes == ("state",)  # type: ignore[arg-type]


# -- timed draws of the axes' cases ----------------------------------------------------------------


@pytest.mark.parametrize(("row_id", "direction"), [("cat-b2-h1-t12-d16-fp32-state", "fwd"),
                                                   ("cat-b1-h1-t24-d16-fp32-lens1x9x14", "fwd"),
                                                   ("cat-b1-h1-t24-d16-fp32-lens1x9x14", "fwdbwd"),
                                                   ("cat-b1-h1-t24-d16-fp32-state-lens9x1x14", "fwd")])
def test_a_state_or_packed_case_is_timed_with_checked_draws_and_a_stale_answer_fails_them(
        row_id: str, direction: str) -> None:
    from pytest_attnperf.families.checks import CheckFailed
    from pytest_attnperf.families.draws import Timed

    case = row_named("linear_attn", row_id).case
    twin = zoo.twin("linear_attn")
    timed = linear.check_case("linear_attn", twin, case, direction, torch.device("cpu")).call
    assert isinstance(timed, Timed)
    assert timed.verify(1, timed.draw(1)()) <= 1.0
    first: dict[str, Any] = {}

    def stale(*args: Any, **opts: Any) -> Any:  # the twin's first answer, whatever the inputs
        if "answer" not in first:
            first["answer"] = twin.fn(*args, **opts)
        return first["answer"]

    stale_timed = linear.check_case("linear_attn", Kernel("linear_attn", "stale", stale, axes=twin.axes), case,
                                    "fwd", torch.device("cpu")).call
    assert isinstance(stale_timed, Timed)
    with pytest.raises(CheckFailed):
        stale_timed.verify(1, stale_timed.draw(1)())


def full_row(family: str, row_id: str) -> catalogue.Row:
    return next(r for r in FAMILIES[family].rows("full", False) if r.id == row_id)


STATE_BACKWARDS = [("linear_attn", "cat-b2-h1-t12-d16-fp32-state"), ("gla", "cat-b1-h2-t70-d16-fp32-state"),
                   ("gdn", "cat-b1-h4-hk2-t12-d16-fp32-state"), ("gla", "cat-b1-h1-t24-d16-fp32-state-lens9x1x14"),
                   ("linear_attn", "b2-h3")]


@pytest.mark.parametrize(("family", "row_id"), STATE_BACKWARDS)
def test_a_backward_with_the_state_axis_is_timed_with_checked_draws(family: str, row_id: str) -> None:
    """The final state's gradient is an input of the draw, moved with the output gradient (heads
    permuted, negated with it, its value columns varied with v's): the twin's output, final state
    and every gradient (the initial state's too) pass each draw, before and after a varying."""
    from pytest_attnperf.families.draws import Timed

    if row_id == "b2-h3":  # batch entries and heads to permute
        case = dataclasses.replace(full_row(family, "cat-b2-h1-t12-d16-fp32-state").case, heads=3)
    else:
        case = full_row(family, row_id).case
    timed = linear.check_case(family, zoo.twin(family), case, "fwdbwd", torch.device("cpu")).call
    assert isinstance(timed, Timed)
    calls = {index: timed.draw(index) for index in (1, 2, 3)}
    for index, call in calls.items():
        vary = timed.vary(index)
        assert timed.verify(index, call()) <= 1.0
        vary()
        assert timed.verify(index, call()) <= 1.0
    with timed.rewritten(1):  # the check after sampling: other data written into the same tensors
        assert timed.verify(1, calls[1]()) <= 1.0


def test_a_backward_that_keeps_its_first_state_gradient_fails_a_timed_draw() -> None:
    """Right on the checked call; on later calls it answers the initial state's gradient from
    the first call (a cache keyed on the shapes): the draw's dh0 is checked, and differs."""
    from pytest_attnperf.families.checks import CheckFailed
    from pytest_attnperf.families.draws import Timed

    twin = zoo.twin("linear_attn")
    kept: dict[str, Any] = {}

    class KeepsFirst(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, h0: Any) -> Any:
            return h0.view_as(h0)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            if "dh0" not in kept:
                kept["dh0"] = grad.clone()
            return kept["dh0"]

    def keeps_first(*args: Any, initial_state: Any = None, **opts: Any) -> Any:
        if initial_state is not None:
            initial_state = KeepsFirst.apply(initial_state)  # type: ignore[no-untyped-call]
        return twin.fn(*args, initial_state=initial_state, **opts)

    case = dataclasses.replace(full_row("linear_attn", "cat-b2-h1-t12-d16-fp32-state").case, heads=3)
    kernel = Kernel("linear_attn", "keeps-first", keeps_first, axes=twin.axes)
    timed = linear.check_case("linear_attn", kernel, case, "fwdbwd", torch.device("cpu")).call
    assert isinstance(timed, Timed)
    with pytest.raises(CheckFailed, match="dh0"):
        timed.verify(1, timed.draw(1)())
