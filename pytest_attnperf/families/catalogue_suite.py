"""The correctness catalogue's suite: every registered kernel of every family on the catalogue's
rows of the run's tier (``--attnperf-catalogue``), forward and backward, checked and never timed.

A test id reads ``test_catalogue[softmax-sdpa-cat-b3-h3-t17-d32-causal-fp32-fwd]`` (family, kernel,
row, direction). A combination the kernel or family refuses is skipped with ``refused:`` and its
reason; the coverage report (``plugins.catalogue``) counts it as not vouched for, never as passed.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_attnperf.families import catalogue
from pytest_attnperf.families.checks import reported_plainly
from pytest_attnperf.families.family import FAMILIES, family
from pytest_attnperf.families.interpret import enable, interpreted_refusal, interpreter_refusal
from pytest_attnperf.families.linear.suite import INSTALL_HINT, fla_missing
from pytest_attnperf.families.parametrize import RUN_KEY
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.markers import pin_backend

__all__ = ["KNOWN", "CatalogueCheck", "Known", "TIER_KEY", "checks", "pytest_generate_tests", "runs_here",
           "test_catalogue"]

TIER_KEY = pytest.StashKey[str]()  # the run's tier, set by the catalogue plugin at configure time
DIRECTIONS = ("fwd", "fwdbwd")
PROPERTY = "attnperf_catalogue"  # the user property each catalogue test carries: what coverage reads
# SDPA pinned to one backend that cannot take a case raises this (torch's message)
NO_BACKEND = re.compile(r"No available kernel|No viable backend", re.IGNORECASE)


@dataclass(frozen=True)
class CatalogueCheck:
    """One test of the catalogue: a kernel on a row in one direction."""

    kernel: Kernel
    row: catalogue.Row
    direction: str

    @property
    def id(self) -> str:
        """The test id: family, kernel, row, direction."""
        return f"{self.kernel.family}-{self.kernel.name}-{self.row.id}-{self.direction}"

    @property
    def classes(self) -> tuple[str, ...]:
        """The row's classes, and ``backward`` in the backward direction."""
        return self.row.classes + (("backward",) if self.direction == "fwdbwd" else ())

    def info(self) -> dict[str, Any]:
        """What the coverage report needs, as plain data (it travels in reports under pytest-xdist)."""
        return {"family": self.kernel.family, "kernel": self.kernel.name, "row": self.row.id,
                "direction": self.direction, "classes": list(self.classes)}


def runs_here(kernel: Kernel, device_kind: str) -> str | None:
    """Why ``kernel`` has no catalogue rows on ``device_kind`` (None: it runs there, natively or,
    an ``interpreted`` kernel on the CPU, under Triton's interpreter)."""
    if device_kind in kernel.device_kinds:
        return None
    if device_kind == "cpu" and kernel.interpreted:
        return interpreter_refusal()
    return f"runs on {', '.join(kernel.device_kinds)} only"


def checks(registry: Any, tier: str, device_kind: str, gpu: bool) -> list[CatalogueCheck]:
    """Every catalogue test of a run: each family's kernels that run on this device, on each of
    the family's rows of ``tier``, in both directions, row by row."""
    found = []
    for name, fam in FAMILIES.items():  # row by row: a case's inputs and references are made once for its kernels
        kernels = [k for k in registry.family(name) if runs_here(k, device_kind) is None]
        found += [CatalogueCheck(k, row, d) for row in fam.rows(tier, gpu) for k in kernels for d in DIRECTIONS]
    return found


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``check`` with the run's catalogue tests (none under ``--attnperf-catalogue=off``)."""
    if "check" not in metafunc.fixturenames:
        return
    session = metafunc.config.stash[RUN_KEY]
    tier = metafunc.config.stash.get(TIER_KEY, "smoke")
    if not session.device.is_gpu and tier != "off":
        enable()  # before fla's kernels are imported: the CPU runs them under Triton's interpreter
    found = checks(session.registry, tier, session.device.kind, session.device.is_gpu)
    params = [pytest.param(c, id=c.id, marks=_marks(c)) for c in found]
    if not params:  # no test, said so at collection rather than read as "nothing failed"
        params = [pytest.param(None, id="none", marks=pytest.mark.skip(reason=f"the catalogue is {tier} in this run"))]
    metafunc.parametrize("check", params)


@dataclass(frozen=True)
class Known:
    """A built-in kernel's known failure on catalogue rows: a strict expected failure (it flips to
    a failure when the kernel is fixed), with what was found."""

    family: str
    kernel: str
    values: str
    direction: str
    reason: str

    def matches(self, check: CatalogueCheck) -> bool:
        """Whether ``check`` is this known failure's kernel, regime and direction."""
        return (check.kernel.family, check.kernel.name, check.direction) == (self.family, self.kernel, self.direction) \
            and getattr(check.row.case, "values", None) == self.values


KNOWN: tuple[Known, ...] = ()
"""None on the CPU today (docs/catalogue.md, "Known failures of built-in kernels")."""


def _marks(check: CatalogueCheck) -> list[Any]:
    return [pytest.mark.xfail(strict=True, reason=k.reason) for k in KNOWN if k.matches(check)]


def _pinned(kernel: Kernel) -> Any:
    return pin_backend(kernel.sdpa_backend) if kernel.sdpa_backend else contextlib.nullcontext()


def test_catalogue(check: CatalogueCheck, attnperf_device: Any, attnperf_seed: int,
                   request: pytest.FixtureRequest) -> None:
    """The kernel's output (and gradients in the backward direction) against the fp64 reference on
    one catalogue row; nothing timed."""
    kernel, case, direction = check.kernel, check.row.case, check.direction
    fam = family(kernel.family)
    if why := fam.refusal(kernel, case, direction):
        pytest.skip(f"refused: {kernel.name}: {why}")
    interpreted = attnperf_device.type not in kernel.device_kinds  # runs_here let it in: Triton's interpreter
    if interpreted and (why := interpreted_refusal(case)):
        pytest.skip(f"refused: {kernel.name}: {why}")
    if kernel.fn.__module__.startswith("pytest_attnperf.families.linear") and kernel.imports:

        if why := fla_missing():
            pytest.skip(f"{kernel.name} needs flash-linear-attention ({why}): {INSTALL_HINT}")
    try:
        with reported_plainly(attnperf_seed), _pinned(kernel):
            checked = fam.check(kernel, case, direction, attnperf_device, seed=attnperf_seed)
    except RuntimeError as exc:
        if kernel.sdpa_backend and NO_BACKEND.search(str(exc)):
            pytest.skip(f"refused: {kernel.name}: SDPA's {kernel.sdpa_backend} backend does not take this case")
        raise
    for name, ratio in checked.properties():
        request.node.user_properties.append((name, ratio))
