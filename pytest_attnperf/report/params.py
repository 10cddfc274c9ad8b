"""A measured case's parameters as plain JSON data, for its summary row and the studies report."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, cast

from pytest_attnperf.families.registry import Kernel

__all__ = ["case_params"]


def _plain(value: Any) -> Any:
    """JSON-safe copy: tuples as lists, non-finite floats as None, anything else as its text."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def case_params(params: Mapping[str, Any], sweep: tuple[str, str] | None, cost: Any) -> dict[str, Any]:
    """A test's parameters as plain data: a kernel as ``kernel``, ``family`` and ``form`` (and
    ``sdpa_backend``, ``tf32`` where set); a case
    object (a dataclass) as its fields plus ``case`` (its id); plain values as they are; the
    sweep's ``(name, axis)``; the cost model's ``flops`` and ``bytes``."""
    out: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, Kernel):
            out.update(kernel=value.name, family=value.family, form=value.form)
            if value.sdpa_backend:
                out["sdpa_backend"] = value.sdpa_backend
            if value.tf32:  # its fp32 cases are held to a TF32 yardstick: the report says so
                out["tf32"] = True
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            out.update({k: v for k, v in fields.items() if k != "id"})
            out[name] = fields.get("id", str(value))
        else:
            out[name] = value
    if sweep is not None:
        out["sweep"], out["axis"] = _sweep_name(sweep[0], out), sweep[1]
    out["flops"], out["bytes"] = float(cost.flops), float(cost.bytes)
    return cast("dict[str, Any]", _plain(out))


def _sweep_name(name: str, params: Mapping[str, Any]) -> str:
    """The marker's name with ``{field}`` filled from the case (``seq-b{batch}-h{heads}``)."""
    try:
        return name.format(**params)
    except (KeyError, IndexError, ValueError, AttributeError):
        return name
