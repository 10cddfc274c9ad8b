"""Parametrizing a family's suite: kernels, cases and directions as separate axes.

A test module that declares ``ATTNPERF_FAMILY`` and ``ATTNPERF_CASES`` (and optionally
``ATTNPERF_DIRECTIONS``) is parametrized by the plugin (``generate``); a conftest.py can call
``parametrize(metafunc, family, cases)`` itself. Combinations a kernel cannot take are removed at
collection with the reason; ``--attnperf-suites`` adds the built-in suite modules
(``suite_modules``). docs/families.md and docs/own-project.md, "Your shapes".
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest

from pytest_attnperf.families.family import refusal
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.hw.table import DetectedDevice

__all__ = [
    "DIRECTIONS", "DTYPES", "check_cases", "check_families", "check_unique", "generate", "parametrize", "plain_params",
    "remove_invalid", "suite_modules",
]

DIRECTIONS = ("fwd", "fwdbwd")
REMOVED_KEY = pytest.StashKey[list[str]]()
USED_KEY = pytest.StashKey[set[str]]()  # the families this run parametrized
OPTED_OUT_KEY = pytest.StashKey[dict[str, set[str]]]()  # opt-in rows not collected: case ids by group


class RunKernels(Protocol):
    """What parametrizing needs of the run (the plugin's session): its device, its kernels, and its
    settings (``options.Settings``: the models' suite reads its models and shapes there)."""

    @property
    def device(self) -> DetectedDevice: ...

    @property
    def registry(self) -> KernelRegistry: ...

    @property
    def settings(self) -> Any: ...


RUN_KEY = pytest.StashKey[RunKernels]()  # set by the plugin at configure time


def _case_param(case: Any) -> Any:
    marks = [pytest.mark.attnperf_requires_hw(gpu=True)] if case.gpu else []
    return pytest.param(case, id=case.id, marks=marks)


def _kernel_param(kernel: Kernel, device_kind: str, with_family: bool) -> Any:
    marks: list[Any] = []
    if kernel.sdpa_backend:
        marks.append(pytest.mark.attnperf_sdpa_backend(kernel.sdpa_backend))
    if device_kind not in kernel.device_kinds:
        marks.append(pytest.mark.skip(reason=f"{kernel.name} runs on {', '.join(kernel.device_kinds)} only"))
    name = f"{kernel.family}-{kernel.name}" if with_family else kernel.name
    return pytest.param(kernel, id=name, marks=marks)


def parametrize(
    metafunc: pytest.Metafunc,
    family: str | Sequence[str],
    cases: Sequence[Any],
    directions: Sequence[str] = DIRECTIONS,
    kernels: Sequence[str | Kernel] | None = None,
) -> None:
    """Parametrize ``case``, ``kernel`` and ``direction`` (those the test asks for).

    ``family`` may name several families sharing one case type; kernel ids then carry the
    family (``gdn-fla-chunk``). ``kernels`` limits the run to these kernels instead of every
    registered one: a name picks the kernel of that name in each family, a ``Kernel`` is taken
    as given.

    On a GPU the CPU table is left out (it exists so CPU-only machines run something real);
    on the CPU the GPU table stays in and is skipped with its reason. A case whose ``opt_in``
    names a row group is collected only when ``--attnperf-opt-in`` names that group.
    """
    session = metafunc.config.stash[RUN_KEY]
    device = session.device
    metafunc.config.stash.setdefault(USED_KEY, set()).update([family] if isinstance(family, str) else family)
    if "case" in metafunc.fixturenames:
        opted = session.settings.opt_in
        chosen, left_out = [], metafunc.config.stash.setdefault(OPTED_OUT_KEY, {})
        for c in (c for c in cases if c.gpu or not device.is_gpu):
            group = getattr(c, "opt_in", None)
            if group in (None, *opted):
                chosen.append(c)
            elif c.gpu == device.is_gpu:  # named in the summary where it would run (a GPU row on the CPU would skip)
                left_out.setdefault(str(group), set()).add(c.id)
        metafunc.parametrize("case", [_case_param(c) for c in chosen])
    if "kernel" in metafunc.fixturenames:
        families = [family] if isinstance(family, str) else list(family)
        picked = _picked(session.registry, families, kernels)
        params = [_kernel_param(k, device.kind, len(families) > 1) for k in picked]
        metafunc.parametrize("kernel", params)
    if "direction" in metafunc.fixturenames:
        metafunc.parametrize("direction", list(directions))


def _picked(registry: Any, families: list[str], kernels: Sequence[str | Kernel] | None) -> list[Kernel]:
    registered = [k for fam in families for k in registry.family(fam)]
    if not registered:
        raise pytest.UsageError(f"attnperf: no kernels registered in family {' or '.join(map(repr, families))}")
    if kernels is None:
        return registered
    names = {k.name for k in registered}
    wanted = {k for k in kernels if isinstance(k, str)}
    if wanted - names:
        raise pytest.UsageError(f"attnperf: no kernel {', '.join(sorted(wanted - names))} in {families!r}; "
                                f"registered: {', '.join(sorted(names))}")
    return [k for k in registered if k.name in wanted] + [k for k in kernels if isinstance(k, Kernel)]


def generate(metafunc: pytest.Metafunc) -> None:
    """Parametrize a test of a module that declares ``ATTNPERF_FAMILY`` and ``ATTNPERF_CASES``
    (its table checked first: ``check_cases``)."""
    module = metafunc.module
    family, cases = getattr(module, "ATTNPERF_FAMILY", None), getattr(module, "ATTNPERF_CASES", None)
    if family is None and cases is None:
        if {"case", "kernel"} & set(metafunc.fixturenames) and hasattr(module, "FAMILY") and hasattr(module, "CASES"):
            raise pytest.UsageError(f"attnperf: {module.__name__} declares FAMILY and CASES; the plugin parametrizes "
                                    "a module that declares ATTNPERF_FAMILY and ATTNPERF_CASES")
        return
    if family is None or cases is None:
        raise pytest.UsageError(f"attnperf: {module.__name__} declares only one of ATTNPERF_FAMILY and "
                                "ATTNPERF_CASES; a suite needs both")
    check_cases(module.__name__, cases)
    parametrize(metafunc, family, cases, getattr(module, "ATTNPERF_DIRECTIONS", DIRECTIONS))


DTYPES = ("bf16", "fp16", "fp32")
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
                "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}
# an id's tokens that state a field: b4 (batch), h16 (heads), t1024 (seq), d64 (head or key dim),
# kv2 (key/value heads), hk2 (a linear case's query/key heads), w128 (window); checked where the
# letter appears once in the id
_ID_FIELDS = {"b": ("batch",), "h": ("heads",), "t": ("seq",), "d": ("head_dim", "key_dim"), "kv": ("kv_heads",),
              "hk": ("n_key_heads",), "w": ("window",)}


def _id_contradictions(case: Any) -> list[str]:

    found: dict[str, list[int]] = {}
    tokens = str(case.id).split("-")
    for token in tokens:
        match = re.fullmatch(r"(kv|hk|[bhtdw])(\d+)", token)
        if match:
            found.setdefault(match.group(1), []).append(int(match.group(2)))
    wrong = []
    for letter, values in found.items():
        field = next((f for f in _ID_FIELDS[letter] if hasattr(case, f)), None)
        if field is None or len(values) != 1 or not isinstance(getattr(case, field), int):
            continue
        if getattr(case, field) != values[0]:
            wrong.append(f"'{letter}{values[0]}' but {field}={getattr(case, field)}")
    dtype = getattr(case, "dtype", None)
    named = [t for t in tokens if t in DTYPES]
    if dtype in DTYPES and len(named) == 1 and named[0] != dtype:
        wrong.append(f"'{named[0]}' but dtype={dtype!r}")
    if "causal" in tokens and getattr(case, "causal", True) is False:
        wrong.append("'causal' but causal=False")
    return wrong


def check_cases(where: str, cases: Sequence[Any]) -> None:
    """A usage error, naming each row and the fix, for a table with rows a run cannot use: a
    dtype other than bf16, fp16 or fp32, heads that the key/value heads (or a linear case's
    query/key heads) do not divide, two rows
    of one id (pytest would rename them ``_0``, ``_1`` and their baseline keys would follow the
    table's order), an id whose tokens contradict the row's fields. Fewer keys (``kv_seq``) than
    queries is a case of the ``q-gt-k`` call axis, refused by each kernel that does not declare it."""
    problems, seen = [], set()
    for case in cases:
        label = repr(getattr(case, "id", case))
        if label in seen:
            problems.append(f"{label}: two rows have this id (each row needs its own: its baseline key)")
        seen.add(label)
        dtype = getattr(case, "dtype", None)
        if dtype is not None and dtype not in DTYPES:
            fix = f" (write {_DTYPE_NAMES[str(dtype)]!r})" if str(dtype) in _DTYPE_NAMES else ""
            problems.append(f"{label}: dtype {dtype!r} is none of {', '.join(DTYPES)}{fix}")
        heads, groups = getattr(case, "heads", None), getattr(case, "n_kv_heads", None)
        if isinstance(heads, int) and isinstance(groups, int) and (groups < 1 or heads % groups):
            problems.append(f"{label}: {heads} heads cannot share {groups} key/value heads (it must divide them)")
        key_heads = getattr(case, "n_key_heads", None)
        if isinstance(heads, int) and isinstance(key_heads, int) and (key_heads < 1 or heads % key_heads):
            problems.append(f"{label}: {heads} value heads cannot share {key_heads} query/key heads (key_heads must "
                            "be at least 1 and divide them)")
        problems += [f"{label}: the id says {wrong}" for wrong in _id_contradictions(case)]
    if problems:
        raise pytest.UsageError(f"attnperf: {where}'s ATTNPERF_CASES: " + "; ".join(problems))


def suite_modules(session: pytest.Session, names: Sequence[str]) -> list[pytest.Module]:
    """The built-in suite modules ``names`` as collectors of ``session``, found where the package
    is installed. Their node ids are the files' paths inside the package
    (``pytest_attnperf/families/softmax/suite.py::test_softmax[...]``), the same on every install, so
    baseline entries recorded with them hold wherever the package lives. A file the run already
    collects (given on the command line) is not added twice."""
    modules = []
    for name in names:
        path = Path(importlib.import_module(f"pytest_attnperf.families.{name}.suite").__file__ or "")
        if session.isinitpath(path):
            continue
        nodeid = f"pytest_attnperf/families/{name}/{path.name}"
        modules.append(pytest.Module.from_parent(session, path=path, name=nodeid, nodeid=nodeid))
    return modules


def _plain(value: Any) -> Any:
    """A parameter as JSON data: a case as its fields, a kernel as its name, plain values as
    they are, anything else as its text."""
    if isinstance(value, Kernel):
        return value.name
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def plain_params(params: dict[str, Any]) -> dict[str, Any]:
    """A test's parameters (``callspec.params``) as plain data, for pytest-benchmark's JSON."""
    return {name: _plain(value) for name, value in params.items()}


def invalid_reason(params: dict[str, Any]) -> str | None:
    """Why a test's kernel cannot take its case in its direction (``family.refusal``), or None."""
    kernel = params.get("kernel")
    if not isinstance(kernel, Kernel):
        return None
    return refusal(kernel, params.get("case"), str(params.get("direction", "fwd")))


def remove_invalid(config: pytest.Config, items: list[Any]) -> list[Any]:
    """``items`` without the kernel x case combinations the kernel cannot take; the reasons are
    kept for the attnperf summary, which reports them as removed (not as pytest's deselected:
    nobody chose to leave them out, and pytest never counts them as collected)."""
    keep, reasons = [], config.stash.setdefault(REMOVED_KEY, [])
    for item in items:
        callspec = getattr(item, "callspec", None)
        why = invalid_reason(callspec.params) if callspec else None
        if callspec is not None and why:
            reasons.append(f"{callspec.params['kernel'].name}: {why}")
        else:
            keep.append(item)
    return keep


def removed(config: pytest.Config) -> list[str]:
    return config.stash.get(REMOVED_KEY, [])


def count_reasons(reasons: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def opted_out_lines(config: pytest.Config) -> list[str]:
    """The summary's line for each opt-in row group this run did not collect, with the option
    that adds it (a ``-k`` that matches nothing must not leave the user guessing)."""
    groups = config.stash.get(OPTED_OUT_KEY, {})
    return [f"{len(ids)} opt-in row{'s' if len(ids) > 1 else ''} not collected ({', '.join(sorted(ids))}): "
            f"--attnperf-opt-in={group} adds {'them' if len(ids) > 1 else 'it'}"
            for group, ids in sorted(groups.items())]


def check_families(config: pytest.Config, registry: KernelRegistry, builtin: Sequence[str]) -> None:
    """A usage error for a kernel registered in a family that is not built in, that no test of
    this run parametrized, and whose name is close to a built-in one's (``linear`` for
    ``linear_attn``, ``softmx``): it would join nothing, silently. A project's own family (one
    its own suite declares) is left alone."""
    used = config.stash.get(USED_KEY, set())
    wrong = []
    for family in registry.families():
        if family in builtin or family in used:
            continue
        close = difflib.get_close_matches(family, builtin, n=3, cutoff=0.5)
        if close:
            names = ", ".join(k.name for k in registry.family(family))
            wrong.append(f"kernel {names} is registered in family {family!r}, which no suite of this run declares; "
                         f"did you mean {' or '.join(map(repr, close))}? (the built-in families: {', '.join(builtin)})")
        elif registry.family(family):

            names = ", ".join(k.name for k in registry.family(family))
            warnings.warn(pytest.PytestConfigWarning(
                f"attnperf: kernel {names} is registered in family {family!r}, which no test of this run "
                f"parametrizes, so it runs in none (the built-in families: {', '.join(builtin)}; a project's own "
                "family is declared by its module's ATTNPERF_FAMILY)"), stacklevel=2)
    if wrong:
        raise pytest.UsageError("attnperf: " + "\n  ".join(wrong))


def check_unique(items: Sequence[pytest.Item]) -> None:
    """A usage error for an attnperf test collected twice in one run (a file given twice with
    ``--keep-duplicates``): both would measure under one node id, and the last would replace the
    other's entry without a word."""
    seen: set[str] = set()
    twice: set[str] = set()
    for item in items:
        if "attnperf" in getattr(item, "fixturenames", ()):
            (twice if item.nodeid in seen else seen).add(item.nodeid)
    if twice:
        shown = ", ".join(sorted(twice)[:3]) + (f" and {len(twice) - 3} more" if len(twice) > 3 else "")
        raise pytest.UsageError(f"attnperf: {len(twice)} test{'s' if len(twice) > 1 else ''} collected twice under "
                                f"one node id ({shown}); each measured case needs its own baseline key: give each "
                                "file once (without --keep-duplicates)")
