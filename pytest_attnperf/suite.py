"""Parametrizing a family's suite: kernels, cases and directions as separate axes.

``parametrize(metafunc, family, cases)`` is what ``suites/conftest.py`` calls; a user's own
suite can call it the same way. Cases carry ``gpu`` (GPU shape table) and are skipped, with
the reason, on a machine without one; combinations a kernel cannot handle
(``Kernel.supports``) or a forward-only kernel in the backward direction are removed at
collection, and the terminal summary lists why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from .registry import Kernel
from .session import get_session

__all__ = ["DIRECTIONS", "parametrize", "remove_invalid"]

DIRECTIONS = ("fwd", "fwdbwd")
REMOVED_KEY = pytest.StashKey[list[str]]()


def _case_param(case: Any) -> Any:
    marks = [pytest.mark.requires_hw(gpu=True)] if case.gpu else []
    return pytest.param(case, id=case.id, marks=marks)


def _kernel_param(kernel: Kernel, device_kind: str, with_family: bool) -> Any:
    marks: list[Any] = []
    if kernel.sdpa_backend:
        marks.append(pytest.mark.sdpa_backend(kernel.sdpa_backend))
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
    on the CPU the GPU table stays in and is skipped with its reason.
    """
    session = get_session(metafunc.config)
    device = session.device
    if "case" in metafunc.fixturenames:
        chosen = [c for c in cases if c.gpu or not device.is_gpu]
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


def invalid_reason(params: dict[str, Any]) -> str | None:
    kernel, case = params.get("kernel"), params.get("case")
    if not isinstance(kernel, Kernel):
        return None
    if params.get("direction") == "fwdbwd" and not kernel.backward:
        return f"{kernel.name} has no backward"
    return kernel.supports(case) if case is not None else None


def remove_invalid(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect kernel x case combinations the kernel cannot take; remember why."""
    keep, drop, reasons = [], [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        why = invalid_reason(callspec.params) if callspec else None
        if callspec is not None and why:
            drop.append(item)
            reasons.append(f"{callspec.params['kernel'].name}: {why}")
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
        config.stash[REMOVED_KEY] = reasons


def removed(config: pytest.Config) -> list[str]:
    return config.stash.get(REMOVED_KEY, [])


def count_reasons(reasons: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    return counts
