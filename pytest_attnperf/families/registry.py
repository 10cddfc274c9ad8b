"""The kernel registry: which implementations each attention family's suite runs.

A kernel is a plain callable plus a few facts about it. Built-in kernels live in
``pytest_attnperf.families.builtin``; users add theirs from a ``conftest.py`` with the
``pytest_attnperf_register_kernels(registry)`` hook (``@registry.kernel(family=..., name=...)``).
The family fixes the call signature (each family's ``SIGNATURE``); the suite checks, times and
gates a registered kernel like any built-in one. docs/own-project.md, "Your kernels".
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_attnperf.gate.roofline import Floors

__all__ = ["Kernel", "KernelRegistry", "import_ahead"]

Supports = Callable[[Any], "str | None"]


def _always(case: Any) -> str | None:
    return None


def refusal_reason(exc: BaseException, patterns: Sequence[str]) -> str | None:
    """The first line of ``exc`` when it is a refusal (``NotImplementedError``, or a message
    matching one of ``patterns``, regular expressions), else None."""
    text = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, NotImplementedError) or any(re.search(p, text) for p in patterns):
        return text.splitlines()[0][:300]
    return None


@dataclass(frozen=True)
class Kernel:
    """One implementation of an attention family.

    ``supports(case)`` returns None when the kernel handles the case, or the reason it does
    not (the case is then skipped at collection with that reason). ``attnperf_sdpa_backend`` pins
    torch's SDPA dispatch for the test and is proven from profiler records. ``backward``
    says whether gradients are checked and timed. ``device_kinds`` lists where it can run
    at all ('cuda', 'cpu'). ``unsupported`` lists regular expressions of exception messages
    that mean "this kernel refuses this case" (see ``unsupported_reason``). ``form`` tells a
    linear family's cost model which algorithm to count ('chunk' or 'recurrent'). ``floors``
    are its least roofline, MFU or bandwidth fractions, per card or for every card (see
    ``roofline.Floors.parse`` and ``floors.py``). ``deterministic`` makes bitwise equal replays a
    requirement on each of its cases (as the ``attnperf_deterministic`` marker does). ``tiled``
    says the kernel works in tiles, so its peak memory above the inputs is held to its family's
    analytic bound (``families.memory``, docs/memory.md); a kernel that materialises the scores
    (or a per-step state) on purpose is registered with ``tiled=False``. ``imports`` names modules
    its first call imports, which the run imports ahead (``import_ahead``). ``tf32`` says its fp32
    cases run their matrix products in TF32, as Triton's ``tl.dot`` of fp32 operands does by
    default: they are held to a yardstick whose products take TF32 operands (``families.tf32``), in
    a family that has one (``Family.tf32``, softmax; ``family.admit`` refuses it elsewhere: the
    linear families' chunk kernels are so held on a GPU already).
    ``interpreted`` says its Triton code runs on the CPU under Triton's interpreter: a CPU run's
    correctness catalogue checks it there (``families.interpret``); nothing of it is timed on the CPU.
    ``output_types`` names the ``torch.Tensor`` subclasses it may return (any other subclass fails:
    ``checks.plain``); they are compared as plain tensors, never through their own methods.
    ``axes`` names the optional call axes it takes (a linear family's ``state``, ``varlen``:
    docs/families.md); a case that carries an axis the kernel does not name is refused, never passed.
    """

    family: str
    name: str
    fn: Callable[..., Any]
    sdpa_backend: str | None = None
    supports: Supports = _always
    backward: bool = True
    device_kinds: tuple[str, ...] = ("cuda", "cpu")
    description: str = ""
    unsupported: tuple[str, ...] = ()
    form: str | None = None  # linear families: "chunk" or "recurrent", the cost model's form
    floors: Any = None  # roofline/MFU/bandwidth floors (roofline.Floors.parse's shape); see floors.py
    deterministic: bool = False  # replays must be bitwise equal (the attnperf_deterministic marker's rule)
    tiled: bool = True  # held to the family's memory bound (families.memory); False: it materialises scores
    imports: tuple[str, ...] = ()  # modules its first call imports: imported ahead (``import_ahead``)
    tf32: bool = False  # its fp32 products run in TF32 (held to its family's TF32 yardstick: Family.tf32)
    interpreted: bool = False  # Triton code the CPU runs under Triton's interpreter: checked there, never timed
    output_types: tuple[type, ...] = ()  # torch.Tensor subclasses it may return, compared as plain tensors
    axes: tuple[str, ...] = ()  # optional call axes it takes (docs/families.md); a case needing another is refused

    def __post_init__(self) -> None:
        object.__setattr__(self, "axes", (self.axes,) if isinstance(self.axes, str) else tuple(self.axes))
        try:
            object.__setattr__(self, "floors", Floors.parse(self.floors))
        except ValueError as exc:
            raise ValueError(f"kernel '{self.name}' in family '{self.family}': {exc}") from None

    def unsupported_reason(self, exc: BaseException) -> str | None:
        """The kernel's own refusal of a case, or None for a real failure.

        ``NotImplementedError`` is always a refusal; other exceptions count only when their
        message matches one of ``unsupported`` (regular expressions), such as fla's refusal of
        a backward on a given triton version. A refusal skips the case quoting the message;
        anything else, and any wrong number, fails it.
        """
        return refusal_reason(exc, self.unsupported)

    def call_or_skip(self, call: Callable[[], Any]) -> Any:
        """``call()``, with the kernel's own refusal of the case turned into a skip that quotes it."""
        try:
            return call()
        except Exception as exc:
            reason = self.unsupported_reason(exc)
            if reason is None:
                raise
        pytest.skip(f"{self.name} does not support this case: {reason}")


class KernelRegistry:
    """Kernels by family, in registration order; names are unique within a family."""

    def __init__(self) -> None:
        self._kernels: dict[tuple[str, str], Kernel] = {}

    def add(self, kernel: Kernel) -> Kernel:
        """Register ``kernel`` and return it; a second kernel of that name in its family is a
        ValueError."""
        key = (kernel.family, kernel.name)
        if key in self._kernels:
            raise ValueError(f"kernel '{kernel.name}' is already registered in family '{kernel.family}'")
        self._kernels[key] = kernel
        return kernel

    def kernel(
        self,
        *,
        family: str,
        name: str,
        sdpa_backend: str | None = None,
        supports: Supports = _always,
        backward: bool = True,
        device_kinds: tuple[str, ...] = ("cuda", "cpu"),
        unsupported: tuple[str, ...] = (),
        form: str | None = None,
        floors: Any = None,
        deterministic: bool = False,
        tiled: bool = True,
        imports: tuple[str, ...] = (),
        tf32: bool = False,
        output_types: tuple[type, ...] = (),
        axes: tuple[str, ...] = (),
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of ``add``; returns the function unchanged."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.add(Kernel(family, name, fn, sdpa_backend, supports, backward, device_kinds,
                            (fn.__doc__ or "").strip(), unsupported, form, floors, deterministic, tiled,
                            tuple(imports), tf32, output_types=tuple(output_types), axes=tuple(axes)))
            return fn

        return register

    def families(self) -> list[str]:
        """The families that have kernels, in registration order."""
        return list(dict.fromkeys(fam for fam, _ in self._kernels))

    def family(self, family: str) -> list[Kernel]:
        """The kernels of ``family``, in registration order."""
        return [k for (fam, _), k in self._kernels.items() if fam == family]

    def __iter__(self) -> Iterator[Kernel]:
        return iter(self._kernels.values())

    def __len__(self) -> int:
        return len(self._kernels)


def import_ahead(items: Sequence[Any]) -> list[str]:
    """Import the modules that the kernels of ``items`` (collected cases, their kernel a
    parameter) name in ``imports``, each once, in their order; the names of those that failed to
    import (each case that needs one then meets its error itself). The run calls this while
    its pool runs start up (``plugins.pool``), so the time an import takes (flash-linear-attention
    takes seconds) is not spent inside a case. An import must not use the GPU: a pool run may be
    timing there."""
    names = dict.fromkeys(name for item in items
                          for value in getattr(getattr(item, "callspec", None), "params", {}).values()
                          if isinstance(value, Kernel) for name in value.imports)
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except (Exception, SystemExit):  # noqa: BLE001 - the case that needs it reports it
            failed.append(name)
    return failed
