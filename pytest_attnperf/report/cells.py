"""Markdown cells and tables of the report's sections (pure): a missing figure is "-"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ms", "num", "pct", "table"]


def num(value: Any, fmt: str = ".3g") -> str:
    """``value`` in ``fmt``."""
    return "-" if value is None else format(value, fmt)


def pct(frac: Any) -> str:
    """A fraction as a percentage, one decimal."""
    return "-" if frac is None else f"{100 * frac:.1f}"


def ms(value: Any) -> str:
    """A time in milliseconds, in us below 1 ms."""
    if value is None:
        return "-"
    return f"{value * 1e3:.1f} us" if value < 1.0 else f"{value:.3f} ms"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A markdown table and the blank line after it."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows] + [""]
