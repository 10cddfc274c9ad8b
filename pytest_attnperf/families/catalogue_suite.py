"""The correctness catalogue's suite: every registered kernel of every family on the catalogue's
rows of the run's tier (``--attnperf-catalogue``), forward and backward, checked and never timed.

A test id reads ``test_catalogue[softmax-sdpa-cat-b3-h3-t17-d32-causal-fp32-fwd]`` (family, kernel,
row, direction). A combination the kernel or family refuses is skipped with ``refused:`` and its
reason; the coverage report (``plugins.catalogue``) counts it as not vouched for, never as passed.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_attnperf.families import catalogue, order
from pytest_attnperf.families.checks import CheckFailed, reported_plainly
from pytest_attnperf.families.family import FAMILIES, family
from pytest_attnperf.families.interpret import autotuners_held, enable, interpreted_refusal, interpreter_refusal
from pytest_attnperf.families.linear import kernels as linear_kernels
from pytest_attnperf.families.linear.suite import INSTALL_HINT, fla_missing
from pytest_attnperf.families.parametrize import RUN_KEY
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.share import footprint, run_shared
from pytest_attnperf.families.softmax import kernels as softmax_kernels
from pytest_attnperf.markers import pin_backend

__all__ = ["KNOWN", "ORDER_KEY", "CatalogueCheck", "Known", "TIER_KEY", "checks", "pytest_generate_tests", "runs_here",
           "test_catalogue", "test_catalogue_order"]

TIER_KEY = pytest.StashKey[str]()  # the run's tier, set by the catalogue plugin at configure time
ORDER_KEY = pytest.StashKey[bool]()  # --attnperf-catalogue-order: each kernel's rows again, shuffled and fresh
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
    """Parametrize ``check`` with the run's catalogue tests (none under ``--attnperf-catalogue=off``),
    and ``order_kernel`` with the kernels the order check takes (``--attnperf-catalogue-order``)."""
    if not {"order_kernel", "check"} & set(metafunc.fixturenames):
        return
    session = metafunc.config.stash[RUN_KEY]
    tier = metafunc.config.stash.get(TIER_KEY, "smoke")
    if not session.device.is_gpu and tier != "off":
        enable()  # before fla's kernels are imported: the CPU runs them under Triton's interpreter
    if "order_kernel" in metafunc.fixturenames:
        _order_kernels(metafunc)
    if "check" not in metafunc.fixturenames:
        return
    found = checks(session.registry, tier, session.device.kind, session.device.is_gpu)
    params = [pytest.param(c, id=c.id, marks=_marks(c, session.device.kind)) for c in found]
    if not params:  # no test, said so at collection rather than read as "nothing failed"
        params = [pytest.param(None, id="none", marks=pytest.mark.skip(reason=f"the catalogue is {tier} in this run"))]
    metafunc.parametrize("check", params)


@dataclass(frozen=True)
class Known:
    """A built-in kernel's known failure on catalogue rows: a strict expected failure (it flips to
    a failure when the kernel is fixed), with what was found. A field left None matches any row."""

    family: str
    kernel: str
    reason: str
    direction: str | None = None
    values: str | None = None  # the row's value regime
    row_class: str | None = None  # a trigger class the row carries
    dtype: str | None = None
    row: str | None = None  # the row's id
    device: str | None = None  # the device kind it fails on ("cpu", "cuda")

    def matches(self, check: CatalogueCheck, device_kind: str | None = None) -> bool:
        """Whether ``check`` is this known failure's kernel, and its row, direction and device those
        named."""
        case = check.row.case
        wanted = ((self.direction, check.direction), (self.values, getattr(case, "values", None)),
                  (self.dtype, getattr(case, "dtype", None)), (self.row, check.row.id), (self.device, device_kind))
        return (check.kernel.family, check.kernel.name) == (self.family, self.kernel) \
            and all(want is None or want == got for want, got in wanted) \
            and (self.row_class is None or self.row_class in check.row.classes)


_GRID = ("fla 0.6.0's chunk kernels put batch x heads on a launch grid's second axis (chunk_o.py: grid = (NV * NT, "
         "B * HV)), which CUDA caps at 65535: past it the launch fails with 'Triton Error [CUDA]: invalid argument' "
         "(tools/fla_findings.py: chunk_simple_gla runs at 1092 x 60 = 65520 rows and raises at 1100 x 60); "
         "upstream fla-org/flash-linear-attention#172, closed without a fix; #1077 moved GDN's state kernels only")
_GRID_GDN = _GRID + "; GDN's chunk kernels take 33000 x 2 and 2200 x 32 rows and fail at 1100 x 60"
_FP16_STATE = ("fla 0.6.0's chunk kernels store the state carried between chunks in the inputs' dtype (chunk_h.py: "
               "k.new_empty(..., dtype=k.dtype unless states_in_fp32)): an fp16 state past 65504 is inf from the "
               "second chunk on though the output stays within fp16 (the reference's largest |out| is 3821; "
               "tools/fla_findings.py), where the fused recurrent kernel keeps it in fp32 and passes; upstream fixed "
               "the same class for TTT's dh in fla-org/flash-linear-attention#1214, not for these")
_GLA_DIM4 = ("fla 0.6.0's chunk GLA backward does not compile at head dim 4 (a tl.dot over a value block of 4 needs "
             "K >= 16: CompilationError, seen in the catalogue on an H100 and an H200) though its forward runs; no "
             "upstream issue found in the stored issues; tools/fla_findings.py holds its reproduction, not yet run")
_STATE_ROW = "cat-b1-h2-t100-d16-fp16-large-state"
_LOWER_RIGHT_EFFICIENT = (
    "torch 2.11's CUDA memory-efficient attention, causal aligned lower-right (torch.nn.attention.bias."
    "causal_lower_right, which SDPA's default dispatch and the efficient backend run there) with more queries than "
    "keys: rows that see no key are not 0 (17 queries over 9 keys: all 32 empty rows; 1024 over 700: 32 of the "
    "2,592, in the query block the diagonal crosses; seen on an H100). pytorch/pytorch#193632 names it: the "
    "bottom-right offset is stored unsigned and wraps when the queries outnumber the keys, switching the mask off in "
    "mixed query blocks, and fully masked query blocks are skipped without writing their output (closed; not in "
    "torch 2.11)")
_EMPTY_ROWS_CUDNN = (
    "torch 2.11's cuDNN attention given the lower-right causal mask (CausalBias materialises it as a boolean mask "
    "when neither flash nor efficient attention may run): every row that sees no key is not 0 (2,592 of 2,592 at "
    "1024 queries over 700 keys, bf16, on an H100); no upstream issue found in the stored issues; "
    "tools/sdpa_findings.py holds its reproduction outside the harness, not yet run")
_EMPTY_LSE = ("torch's CPU flash attention (aten._scaled_dot_product_flash_attention_for_cpu, torch 2.13) returns a "
              "log-sum-exp of 0 for a row with no visible key (a fully masked row; the top rows of causal with more "
              "queries than keys), where the log of the empty sum is -inf: merged by their LSE, partial results weigh "
              "its zero output as exp(0 - lse); its output there is 0 and its other rows' LSE within the bound "
              "(the lse rows without empty rows pass)")
KNOWN: tuple[Known, ...] = (
    *(Known(family, "fla-chunk", _GRID, row_class="grid-limit") for family in ("linear_attn", "gla", "simple_gla")),
    Known("gdn", "fla-chunk", _GRID_GDN, row="cat-b1100-h60-t2-d4-fp32"),
    *(Known(family, "fla-chunk", _FP16_STATE, row=_STATE_ROW) for family in ("linear_attn", "gla")),
    Known("linear_attn", "fla-fused-chunk", _FP16_STATE, row=_STATE_ROW),
    Known("simple_gla", "fla-chunk", _FP16_STATE, row=_STATE_ROW, direction="fwd"),
    Known("gla", "fla-chunk", _GLA_DIM4, row="cat-b1-h1-t65600-d4-fp32", direction="fwdbwd"),
    *(Known("softmax", "sdpa-flash", _EMPTY_LSE, row=row, device="cpu") for row in (
        "cat-b2-h2-t17-k9-d32-causal-fp32-lse", "cat-b2-h3-t20-d32-fp32-lse-mask-fully-masked",
        "cat-b1-h2-t70-k65-d32-causal-bf16-lse")),
    *(Known("softmax", name, _LOWER_RIGHT_EFFICIENT, row=row, device="cuda") for name, row in (
        ("sdpa", "cat-b2-h2-t17-k9-d32-causal-fp32"), ("sdpa-efficient", "cat-b2-h2-t17-k9-d32-causal-fp32"),
        ("sdpa-efficient", "cat-b2-h4-t1024-k700-d64-causal-bf16"),
        ("sdpa-repeat-kv", "cat-b1-h4-kv2-t31-k5-d32-causal-fp32"))),
    Known("softmax", "sdpa-cudnn", _EMPTY_ROWS_CUDNN, row="cat-b2-h4-t1024-k700-d64-causal-bf16", device="cuda"),
)
"""Built-in kernels' failures on the catalogue's rows (docs/catalogue.md, "Known failures of
built-in kernels"): on the GPU's rows, fla's and SDPA's rows with no visible key; on the CPU, SDPA's
flash backend's LSE for such rows (on a GPU those rows are refused)."""


def _marks(check: CatalogueCheck, device_kind: str | None = None) -> list[Any]:
    return [pytest.mark.xfail(strict=True, reason=k.reason) for k in KNOWN if k.matches(check, device_kind)]


def _processes() -> int:
    """How many check-only processes share the device: this run's pytest-xdist workers (one GPU
    per run of the catalogue; ``families.share``)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def _forget() -> None:
    """Drop the inputs and references the families keep of the last case (``families.share``)."""
    softmax_kernels.forget()
    linear_kernels.forget()


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
        with reported_plainly(attnperf_seed), _pinned(kernel), autotuners_held():
            checked = run_shared(lambda: fam.check(kernel, case, direction, attnperf_device, seed=attnperf_seed),
                                 attnperf_device, footprint(case, direction), _processes(), _forget)
    except RuntimeError as exc:
        if kernel.sdpa_backend and NO_BACKEND.search(str(exc)):
            pytest.skip(f"refused: {kernel.name}: SDPA's {kernel.sdpa_backend} backend does not take this case")
        raise
    for name, ratio in checked.properties():
        request.node.user_properties.append((name, ratio))


def _order_kernels(metafunc: pytest.Metafunc) -> None:
    """One order check per kernel that runs here (natively, or under Triton's interpreter on the
    CPU), under ``--attnperf-catalogue-order``."""
    session = metafunc.config.stash[RUN_KEY]
    tier = metafunc.config.stash.get(TIER_KEY, "smoke")
    on = metafunc.config.stash.get(ORDER_KEY, False) and tier != "off"
    kind = session.device.kind
    kernels = [k for name in FAMILIES for k in session.registry.family(name) if runs_here(k, kind) is None]
    params = [pytest.param(k, id=f"{k.family}-{k.name}") for k in kernels] if on else []
    if not params:
        params = [pytest.param(None, id="none", marks=pytest.mark.skip(
            reason=f"the order check is off (catalogue {tier}; --attnperf-catalogue-order runs it)"))]
    metafunc.parametrize("order_kernel", params)


def test_catalogue_order(order_kernel: Kernel, attnperf_device: Any, attnperf_seed: int,
                         request: pytest.FixtureRequest) -> None:
    """The kernel's catalogue rows of the run's tier again (``families.order``): in order, then a seeded
    shuffled sample in this process and in a fresh one; fails naming each check whose result depended
    on what ran before it."""
    kernel = order_kernel
    rows = family(kernel.family).rows(request.config.stash.get(TIER_KEY, "smoke"), attnperf_device.type != "cpu")
    interpreted = attnperf_device.type not in kernel.device_kinds
    if interpreted:  # under Triton's interpreter: the rows it takes
        rows = tuple(row for row in rows if interpreted_refusal(row.case) is None)
    if kernel.fn.__module__.startswith("pytest_attnperf.families.linear") and kernel.imports and (why := fla_missing()):
        pytest.skip(f"{kernel.name} needs flash-linear-attention ({why}): {INSTALL_HINT}")
    found_checks = [(row, direction) for row in rows for direction in DIRECTIONS]
    source = order.source_of(kernel)
    # natively, autotuners run as they would: an autotune cache keyed on too little of the shape is
    # what the check is for; under the interpreter they are held, as the catalogue's checks hold them
    with reported_plainly(attnperf_seed), autotuners_held() if interpreted else contextlib.nullcontext():
        first = order.ordered(kernel, found_checks, attnperf_device, attnperf_seed)
        found = order.record(source, kernel, found_checks, attnperf_device, seed=attnperf_seed,
                             shuffle_seed=attnperf_seed, fresh_count=order.FRESH if source else 0, first=first)
    statuses = Counter(result.status for result in first)
    request.node.user_properties.append(("order_checks", ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))))
    if found:
        raise CheckFailed("\n".join(found))
