"""A pool run's settings as data: what a parent run hands its pool runs
(``--attnperf-processes``, ``plugins/pool.py``) and how a pool run reads them back, each field
checked against its type in ``options.Settings``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_attnperf.options import Settings

__all__ = ["POOL_RUN_OWN", "settings_data", "settings_from_data"]

# a pool run's own: it records, requires, spawns, appends and reports nothing, and writes its samples where
# its --attnperf-pool-out says; the other settings it takes from its parent (settings_data)
POOL_RUN_OWN: dict[str, Any] = {"update_baselines": False, "require_baseline": False, "processes": 1,
                                "report_dir": None, "pool_out": None, "history_dir": None, "fail_on_drift": False,
                                "pr_comment": None}


def settings_data(settings: Settings) -> dict[str, Any]:
    """The settings a pool run takes from this run, as JSON data (paths as text, tuples as lists);
    ``settings_from_data`` reads them back."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        if f.name not in POOL_RUN_OWN:
            value = getattr(settings, f.name)
            if isinstance(value, Path):
                value = str(value)
            elif isinstance(value, tuple):
                value = [list(v) if isinstance(v, tuple) else v for v in value]
            out[f.name] = value
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


_FROM_DATA: dict[str, tuple[Callable[[Any], bool], Callable[[Any], Any]]] = {  # a field's type: (check, convert)
    "bool": (lambda v: isinstance(v, bool), bool),
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), int),
    "float": (_is_number, float),
    "str": (lambda v: isinstance(v, str), str),
    "str | None": (lambda v: v is None or isinstance(v, str), lambda v: v),
    "Path": (lambda v: isinstance(v, str), Path),
    "tuple[str, ...]": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), tuple),
    "tuple[int, ...]": (lambda v: isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in v), tuple),
    "tuple[tuple[str, float], ...]": (
        lambda v: isinstance(v, list) and all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], str)
                                              and _is_number(x[1]) for x in v),
        lambda v: tuple((str(k), float(x)) for k, x in v)),
}


def settings_from_data(data: Mapping[str, Any], pool_out: Path) -> Settings:
    """A pool run's settings: those ``settings_data`` wrote, each checked (``ValueError`` naming
    the key), and its own (``POOL_RUN_OWN``), its samples going to ``pool_out``."""
    wanted = [f for f in dataclasses.fields(Settings) if f.name not in POOL_RUN_OWN]
    missing = sorted({f.name for f in wanted} - set(data))
    unknown = sorted(set(data) - {f.name for f in wanted})
    problems = [f"missing: {', '.join(missing)}"] if missing else []
    problems += [f"unknown: {', '.join(unknown)}"] if unknown else []
    if problems:
        raise ValueError(f"settings {'; '.join(problems)}")
    values: dict[str, Any] = {}
    for f in wanted:
        check, convert = _FROM_DATA[str(f.type)]
        if not check(data[f.name]):
            raise ValueError(f"setting {f.name!r} is {data[f.name]!r}, not of type {f.type}")
        values[f.name] = convert(data[f.name])
    return Settings(**values, **{**POOL_RUN_OWN, "pool_out": pool_out})
