"""The softmax family's call axes and checks between calls (``tests/zoo/axes_softmax.py``) on the
catalogue's smoke rows, checked in this process on the CPU as the catalogue's suite checks a kernel
(``Family.refusal``, then ``Family.check``, SDPA's backend pinned):

* each wrong kernel fails the smoke row its pair names, a row of its class, in every direction its
  bug lives in, with a wrong number or a broken contract the checks name;
* the twin passes every smoke row of the axes and checks, in both directions (a relation's
  backward is refused: it compares forward calls);
* every built-in kernel that declares a row's axes passes it, or is refused it (a pinned backend
  this machine lacks; a case its ``supports`` declines); SDPA's flash backend's LSE of 0 on rows
  with no visible key is its known failure (``catalogue_suite.KNOWN``); a kernel that declares no
  axis is refused every row that carries one, never passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from test_zoo_catalogue import _one_torch_thread, outcome  # noqa: F401 - tests/ is on the path; its autouse fixture
from zoo import axes_softmax as zoo

from pytest_attnperf.families import catalogue
from pytest_attnperf.families.catalogue_suite import KNOWN, NO_BACKEND, CatalogueCheck
from pytest_attnperf.families.family import FAMILIES
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.relations import RELATIONS
from pytest_attnperf.markers import pin_backend

# batch-split's wrong kernel and twin are the decode zoo's (tests/zoo/axes_decode.py)
CLASSES = ("lse", "q-gt-k", "v-dim", "mask", "fully-masked", *(r for r in RELATIONS if r != "batch-split"))
DIRECTIONS = ("fwd", "fwdbwd")


def axis_rows() -> tuple[catalogue.Row, ...]:
    """The softmax smoke rows of the call axes and checks between calls (a cache row, an LSE one
    included, is the decode zoo's: tests/test_zoo_axes_decode.py)."""
    return tuple(r for r in FAMILIES["softmax"].rows("smoke", False)
                 if set(r.classes) & set(CLASSES) and not r.case.cache)


def row_named(row_id: str) -> catalogue.Row:
    return next(r for r in axis_rows() if r.id == row_id)


def test_the_zoo_is_complete() -> None:
    """A wrong kernel for every axis and check, each caught by a smoke row of its class, and a twin."""
    assert {p.cls for p in zoo.PAIRS} == set(CLASSES)
    registry = KernelRegistry()
    zoo.register(registry)
    assert len(registry) == len(zoo.PAIRS) + 1
    for pair in zoo.PAIRS:
        assert pair.cls in row_named(pair.row).classes, pair
        kernel = pair.kernel()
        assert f"[{pair.cls}]" in kernel.description
        assert kernel.axes == zoo.AXES


@pytest.mark.parametrize("pair", [pytest.param(p, id=f"{p.wrong_name}@{p.row.removeprefix('cat-')}")
                                  for p in zoo.PAIRS])
def test_a_wrong_kernel_fails_the_row_of_its_class(pair: zoo.Pair) -> None:
    kernel, row = pair.kernel(), row_named(pair.row)
    for direction in pair.directions:
        found = outcome(kernel, row, direction)
        assert found.status == "failed", f"{kernel.name} on {row.id} {direction}: {found}"
        # the checks name the kernel, or the input it wrote into (their write check names no kernel)
        assert kernel.name in found.message or "wrote into its input q" in found.message, found.message


def test_the_inference_write_is_caught_by_every_smoke_forward() -> None:
    """A kernel that writes into its input only with grad disabled fails an ordinary smoke row's
    forward too (its one more call under inference_mode), and passes that row's backward."""
    kernel = next(p for p in zoo.PAIRS if p.name == "inference-writes-input").kernel()
    row = next(r for r in FAMILIES["softmax"].rows("smoke", False) if r.id == "cat-b3-h3-t17-d32-causal-fp32")
    assert row.case.inference
    found = outcome(kernel, row, "fwd")
    assert found.status == "failed", found
    assert "wrote into its input q" in found.message, found
    assert outcome(kernel, row, "fwdbwd").status == "passed"


@pytest.mark.parametrize(("row", "direction"), [pytest.param(r, d, id=f"{r.id.removeprefix('cat-')}-{d}")
                                                 for r in axis_rows() for d in DIRECTIONS])
def test_the_twin_passes_every_row_of_the_axes(row: catalogue.Row, direction: str) -> None:
    found = outcome(zoo.twin(), row, direction)
    if row.case.relation and direction == "fwdbwd":
        assert found.status == "refused", found
        assert "compares forward calls" in found.message, found
    else:
        assert found.status == "passed", f"twin-axes on {row.id} {direction}: {found}"


def builtin_params() -> Iterator[Any]:
    registry = KernelRegistry()
    softmax.register(registry)
    for kernel in registry.family("softmax"):
        if kernel.name == "flex-window":  # takes window rows only, none of these
            continue
        for row in axis_rows():
            for direction in DIRECTIONS:
                yield pytest.param(kernel, row, direction,
                                   id=f"{kernel.name}-{row.id.removeprefix('cat-')}-{direction}")


# (not ``kernel``: the plugin reads a test parameter of that name as a suite's kernel, with its ``case``)
@pytest.mark.parametrize(("builtin", "row", "direction"), list(builtin_params()))
def test_a_builtin_that_declares_the_axes_passes(builtin: Kernel, row: catalogue.Row, direction: str) -> None:
    undeclared = [a for a in row.case.axes if a not in builtin.axes]
    pinned = pin_backend(builtin.sdpa_backend) if builtin.sdpa_backend else contextlib.nullcontext()
    with pinned:
        found = outcome(builtin, row, direction)
    if undeclared:
        assert found.status == "refused", found
        assert f"does not declare the call axis {', '.join(undeclared)}" in found.message, found
    elif any(k.matches(CatalogueCheck(builtin, row, direction), "cpu") for k in KNOWN):  # these tests run on the CPU
        assert found.status == "failed", found
        assert "rows with no visible key have a log-sum-exp of 0.0" in found.message, found
    elif found.status == "crashed" and NO_BACKEND.search(found.message):
        assert builtin.sdpa_backend in ("efficient", "cudnn"), found  # backends the CPU lacks
    elif found.status == "refused":
        assert builtin.supports(row.case) or row.case.relation, found
    else:
        assert found.status == "passed", f"{builtin.name} on {row.id} {direction}: {found}"


def test_a_kernel_that_declares_no_axis_is_refused_their_rows_never_passed() -> None:
    plain = Kernel("softmax", "plain", zoo.twin().fn)
    lse_only = Kernel("softmax", "lse-only", zoo.twin().fn, axes=("lse",))
    for row in axis_rows():
        for kernel in (plain, lse_only):
            undeclared = [a for a in row.case.axes if a not in kernel.axes]
            found = outcome(kernel, row, "fwd")
            if undeclared:
                assert found.status == "refused", (kernel.name, row.id, found)
                assert f"does not declare the call axis {', '.join(undeclared)}" in found.message
            else:
                assert found.status == "passed", (kernel.name, row.id, found)
