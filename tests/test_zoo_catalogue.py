"""The catalogue zoo (``tests/zoo/catalogue.py``) on the correctness catalogue's smoke tier, checked in
this process on the CPU as the catalogue's suite checks a kernel (``Family.refusal``, then
``Family.check``):

* each wrong kernel fails a smoke row of its trigger class in the direction its bug lives in, with a
  wrong number the checks name (never a crash), and passes a smoke row without that class;
* each twin passes every smoke row of its family that it takes, in both directions (a twin shared by
  several wrong kernels, ``twin-plain``, once), but the rows whose fp64 reference the harness itself
  takes minutes over on a CPU (``slow_reference``: skipped, saying so);
* the earlier zoos' right kernels (``tests/zoo/softmax.py``, ``tests/zoo/linear.py``) pass the smoke
  rows of adversarial values, but where a strict expected failure (``EARLIER_KNOWN``) says what
  was found wrong with the kernel there.

Test ids name the rows: a wrong kernel's the rows of its class (``@every-row`` for ``backward``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from zoo import catalogue as zoo  # tests/ is on the path, as for every test module here
from zoo import linear as linear_zoo
from zoo import softmax as softmax_zoo

from pytest_attnperf.families import catalogue
from pytest_attnperf.families.family import FAMILIES, classes_of
from pytest_attnperf.families.registry import Kernel, KernelRegistry

CPU = torch.device("cpu")
DIRECTIONS = ("fwd", "fwdbwd")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    """One torch thread, as the other zoo tests run theirs (one pytest-xdist worker per core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def smoke(family: str) -> tuple[catalogue.Row, ...]:
    return FAMILIES[family].rows("smoke", False)


def slow_reference(family: str, row: catalogue.Row, direction: str) -> str | None:
    """Why the harness's own fp64 reference makes a smoke row too slow for this module (the kernels
    take it in about a second), or None. Measured on 2 CPU cores, one thread."""
    if family != "softmax" and "grid-limit" in row.classes:
        return ("the linear references pad T=2 to chunks of 64 (reference.CHUNK): 12 s (linear attention) to 160 s "
                "(GDN) a direction on one core, where chunks of 2 take 0.2 s")
    if family == "gdn" and "long-seq" in row.classes and direction == "fwdbwd":
        return ("the fp64 chunked GDN reference's backward takes 44-50 s at T=65600: each of its 1025 chunks is "
                "indexed in a Python loop (u[:, :, n]...), and each index's backward writes a whole zero tensor")
    return None


@dataclass(frozen=True)
class Outcome:
    """A kernel on a row in one direction: ``passed``, ``failed`` (an AssertionError of the checks),
    ``refused`` (the family's or the kernel's refusal) or ``crashed`` (any other exception)."""

    status: str
    message: str = ""


def outcome(kernel: Kernel, row: catalogue.Row, direction: str) -> Outcome:
    """``kernel`` checked on ``row`` in ``direction``, as the catalogue's suite checks it."""
    family = FAMILIES[kernel.family]
    if why := family.refusal(kernel, row.case, direction):
        return Outcome("refused", why)
    try:
        family.check(kernel, row.case, direction, CPU)
    except AssertionError as exc:  # CheckFailed, or another assertion of the checks
        return Outcome("failed", str(exc))
    except pytest.skip.Exception as exc:  # a NotImplementedError of the kernel's
        return Outcome("refused", str(exc))
    except Exception as exc:  # noqa: BLE001 - a crash is what the test reports
        return Outcome("crashed", f"{type(exc).__name__}: {exc}")
    return Outcome("passed")


def size(row: catalogue.Row) -> int:
    case: Any = row.case
    return int(case.batch * case.heads * case.seq * getattr(case, "n_kv_seq", 1))


def short(row: catalogue.Row) -> str:
    return row.id.removeprefix("cat-")


# -- the wrong kernels ---------------------------------------------------------------------------------


def class_rows(pair: zoo.Pair) -> tuple[catalogue.Row, ...]:
    """The smoke rows of the pair's family that carry its class (every row for ``backward``, whose
    class every fwdbwd check carries)."""
    rows = smoke(pair.family)
    return rows if pair.cls == "backward" else tuple(r for r in rows if pair.cls in r.classes)


def wrong_id(pair: zoo.Pair) -> str:
    rows = "every-row" if pair.cls == "backward" else "+".join(short(r) for r in class_rows(pair))
    return f"{pair.family}-{pair.wrong_name}-{pair.cls}@{rows}"


def twins(family: str) -> dict[str, Kernel]:
    """The family's twins by name (a shared twin once)."""
    return {p.twin_name: p.kernel(False) for p in zoo.PAIRS if p.family == family}


def test_the_zoo_is_complete() -> None:
    """At least 25 wrong kernels, each with a twin, a class of the catalogue's and a one-line docstring."""
    assert len(zoo.PAIRS) >= 25
    registry = KernelRegistry()
    zoo.register(registry)
    assert len(registry) == len(zoo.PAIRS) + sum(len(twins(family)) for family in FAMILIES)
    for pair in zoo.PAIRS:
        assert pair.cls in catalogue.CLASSES, pair.name
        assert pair.cls in classes_of(pair.family), (pair.name, pair.family)
        kernels = {k.name: k for k in registry.family(pair.family)}
        for name in (pair.wrong_name, pair.twin_name):
            kernel = kernels[name]
            assert kernel.description, kernel.name
            assert "\n" not in kernel.description, kernel.name
            assert kernel.fn.__doc__ == kernel.description
        assert f"[{pair.cls}]" in pair.kernel(True).description


def catching_row(pair: zoo.Pair, kernel: Kernel, direction: str) -> tuple[str | None, dict[str, str]]:
    """The cheapest smoke row of the pair's class that ``kernel`` fails in ``direction`` (None: none),
    with what it did on the rows tried; a crash fails the test there."""
    tried = {}
    for row in sorted(class_rows(pair), key=size):
        if slow_reference(pair.family, row, direction) is None:
            found = outcome(kernel, row, direction)
            assert found.status != "crashed", f"{kernel.name} crashed the checks on {row.id}: {found.message}"
            tried[row.id] = found.status
            if found.status == "failed":
                assert kernel.name in found.message, found.message  # the checks name the kernel's tensor
                return row.id, tried
    return None, tried


def passing_row(pair: zoo.Pair, kernel: Kernel) -> tuple[str | None, dict[str, list[str]]]:
    """The cheapest smoke row without the pair's class that ``kernel`` passes in the bug's directions
    (a backward bug: in the forward direction, which has no ``backward`` class), a row of one token
    last (it proves little), with what it did on the rows tried; a crash fails the test there."""
    directions = ("fwd",) if pair.cls == "backward" else pair.directions
    others = [r for r in smoke(pair.family) if pair.cls == "backward" or pair.cls not in r.classes]
    tried = {}
    for row in sorted(others, key=lambda r: (r.case.seq == 1, size(r))):
        if any(slow_reference(pair.family, row, d) for d in directions):
            continue
        found = [outcome(kernel, row, d) for d in directions]
        crashed = [o.message for o in found if o.status == "crashed"]
        assert not crashed, f"{kernel.name} crashed the checks on {row.id}: {crashed}"
        tried[row.id] = statuses = [o.status for o in found]
        if "passed" in statuses and set(statuses) <= {"passed", "refused"}:
            return row.id, tried
    return None, tried


@pytest.mark.parametrize("pair", [pytest.param(p, id=wrong_id(p)) for p in zoo.PAIRS])
def test_a_wrong_kernel_fails_on_its_class_and_passes_without_it(pair: zoo.Pair) -> None:
    kernel = pair.kernel(True)
    assert class_rows(pair), f"no smoke row of {pair.family} carries {pair.cls}"
    for direction in pair.directions:
        caught, tried = catching_row(pair, kernel, direction)
        assert caught, f"{kernel.name} passed every {pair.cls} row in {direction}: {tried}"
    passed, others = passing_row(pair, kernel)
    assert passed, f"{kernel.name} passed no smoke row without {pair.cls}: {others}"


# -- the twins -----------------------------------------------------------------------------------------


def twin_params() -> Iterator[Any]:
    for family in FAMILIES:
        pairs = [p for p in zoo.PAIRS if p.family == family]
        for row in smoke(family) if pairs else ():
            for direction in DIRECTIONS:
                why = slow_reference(family, row, direction)
                yield pytest.param(family, row, direction, id=f"{family}-{short(row)}-{direction}",
                                   marks=[pytest.mark.skip(reason=f"the harness's reference: {why}")] if why else [])


@pytest.mark.parametrize(("family", "row", "direction"), list(twin_params()))
def test_every_twin_passes_a_smoke_row(family: str, row: catalogue.Row, direction: str) -> None:
    """Every twin of the family, one after another on one row (the row's reference computed once); a
    twin shared by several wrong kernels (``twin-plain``), once."""
    found = {name: outcome(twin, row, direction) for name, twin in twins(family).items()}
    wrong = {name: o for name, o in found.items() if o.status not in ("passed", "refused")}
    assert not wrong, f"twins wrong on {row.id} {direction}: {wrong}"
    # the twins decline nothing: a refusal is the family's (one key, one token backward), for all of them
    assert len({(o.status, o.message) for o in found.values()}) == 1, found


# -- the earlier zoos on the adversarial values ------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """An earlier zoo's right kernel found wrong on a regime of adversarial values: a strict
    expected failure, which flips when the kernel (or the row) changes."""

    family: str
    kernels: str  # a regular expression of kernel names
    values: str
    directions: tuple[str, ...]
    reason: str

    def matches(self, family: str, kernel: str, values: str, direction: str) -> bool:
        return (family, values) == (self.family, self.values) and direction in self.directions \
            and re.fullmatch(self.kernels, kernel) is not None


_FP16_STATE = ("stores the state it carries between chunks in the inputs' dtype, as fla's chunk kernels store "
               "theirs: on the large-state row that state passes fp16's 65504 and its output is inf/NaN (the "
               "large-state bug class itself, bug-state-in-fp16 here), not a check too tight")
_SUB_BLOCK = ("factors each 16-token sub-block's decay around the decay before it, so exp(ref - G_s) inside the "
              "sub-block reaches exp(16 x 60), past float32's range: its output is NaN on the gate-strong row (the "
              "exp(-cumsum) overflow class, bug-factored-decay here; fla's chunk GLA takes the diagonal "
              "sub-block's decays elementwise)")
EARLIER_KNOWN = (
    *(Known(family, rf"zoo-ok-{family}-chunk16-rounded", "large-state", DIRECTIONS, _FP16_STATE)
      for family in ("linear_attn", "gla", "simple_gla")),
    Known("gla", r"zoo-ok-gla-chunk(64-fp32|64-rounded|128-rounded|64-gate-summed)", "gate-strong", DIRECTIONS,
          _SUB_BLOCK),
)


def earlier_kernels() -> dict[str, list[Kernel]]:
    """The earlier zoos' right kernels that run on the CPU, by family."""
    registry = KernelRegistry()
    softmax_zoo.register(registry)
    linear_zoo.register(registry)
    return {family: [k for k in registry.family(family) if k.name.startswith("zoo-ok-") and "cpu" in k.device_kinds]
            for family in FAMILIES}


EARLIER = earlier_kernels()


def earlier_params() -> Iterator[Any]:
    for family, kernels in EARLIER.items():
        for row in smoke(family):
            values = getattr(row.case, "values", "normal")
            if values == "normal":
                continue
            for direction in DIRECTIONS:
                for kernel in kernels:
                    known = [k.reason for k in EARLIER_KNOWN if k.matches(family, kernel.name, values, direction)]
                    marks = [pytest.mark.xfail(strict=True, reason=known[0])] if known else []
                    yield pytest.param(kernel, row, direction, id=f"{family}-{kernel.name}-{short(row)}-{direction}",
                                       marks=marks)


# (not ``kernel``: the plugin reads a test parameter of that name as a suite's kernel, with its ``case``)
@pytest.mark.parametrize(("right", "row", "direction"), list(earlier_params()))
def test_an_earlier_right_kernel_passes_the_adversarial_values(right: Kernel, row: catalogue.Row,
                                                               direction: str) -> None:
    found = outcome(right, row, direction)
    assert found.status in ("passed", "refused"), f"{right.name} on {row.id} {direction}: {found.message}"
