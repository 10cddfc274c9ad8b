"""The Family protocol: what a suite, the catalogue and the reports need of an attention family.

One object per family (``FAMILIES``) answers for its cases: which kernel x case x direction it
cannot take (``refusal``), the check against its fp64 reference (``check``), the analytic cost
(``cost``), its correctness catalogue (``rows``), its memory bound (``memory_bound``) and whether
its kernels may declare TF32 products (``tf32``). A new family, trigger class or call axis is
added here, in one place. docs/families.md describes each family's call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pytest_attnperf import costs
from pytest_attnperf.families import catalogue
from pytest_attnperf.families.checks import Checked
from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear.memory import memory_bound as linear_bound
from pytest_attnperf.families.linear.variants import VARIANTS
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import cache
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.memory import memory_bound as softmax_bound
from pytest_attnperf.gate.memory import Bound

__all__ = ["FAMILIES", "Family", "LinearFamily", "SoftmaxFamily", "admit", "classes_of", "common_refusal", "family",
           "refusal"]


class Family(Protocol):
    """An attention family: its name, the cases it refuses, its check, cost, catalogue, memory
    bound and whether its kernels may declare TF32 products."""

    @property
    def name(self) -> str:
        """The family's name, as kernels are registered in it."""
        ...

    @property
    def tf32(self) -> bool:
        """Whether a kernel of the family may be registered with ``tf32=True``: its check then holds
        the kernel's fp32 cases to a yardstick whose products take TF32 operands (``families.tf32``)."""
        ...

    def refusal(self, kernel: Kernel, case: Any, direction: str) -> str | None:
        """Why ``kernel`` cannot take ``case`` in ``direction`` (None: it can)."""
        ...

    def check(self, kernel: Kernel, case: Any, direction: str, device: Any, seed: int = 0) -> Checked:
        """Call ``kernel`` on ``case`` and check it against the fp64 reference (``CheckFailed``)."""
        ...

    def cost(self, kernel: Kernel, case: Any, direction: str) -> Any:
        """The analytic FLOPs and bytes of the call (``costs.Cost``)."""
        ...

    def rows(self, tier: str, gpu: bool) -> tuple[catalogue.Row, ...]:
        """The correctness catalogue's rows of ``tier`` (``catalogue.rows``)."""
        ...

    def memory_bound(self, case: Any, direction: str) -> Bound | None:
        """The analytic peak-memory bound a tiled kernel is held to on ``case`` (None: none, or a
        case of a type the family does not know; docs/memory.md)."""
        ...


def refusal(kernel: Kernel, case: Any, direction: str) -> str | None:
    """Why ``kernel`` cannot take ``case`` in ``direction`` (None: it can): the family's own rule
    (``Family.refusal``) for a built-in family, else ``common_refusal``."""
    known = FAMILIES.get(kernel.family)
    return known.refusal(kernel, case, direction) if known is not None else common_refusal(kernel, case, direction)


def common_refusal(kernel: Kernel, case: Any, direction: str) -> str | None:
    """What every family refuses: a backward of a forward-only kernel or of a case whose gradients
    say nothing (``backward_refusal``), a case no kernel of the family takes (``case.refusal``), a
    case carrying a call axis (``case.axes``) the kernel did not declare (``Kernel.axes``), and what
    the kernel's ``supports`` declines."""
    if direction == "fwdbwd" and not kernel.backward:
        return f"{kernel.name} has no backward"
    backward_refusal = getattr(case, "backward_refusal", None)
    if direction == "fwdbwd" and callable(backward_refusal) and (why := backward_refusal()):
        return str(why)
    refused = getattr(case, "refusal", None)  # a case no kernel of a family can take (LinearCase's key_heads)
    if callable(refused) and (why := refused(kernel.family)):
        return str(why)
    undeclared = [axis for axis in getattr(case, "axes", ()) if axis not in kernel.axes]
    if case is not None and undeclared:  # an optional call axis the kernel did not declare (Kernel.axes)
        return f"the kernel does not declare the call axis {', '.join(undeclared)} (Kernel.axes)"
    return kernel.supports(case) if case is not None else None


@dataclass(frozen=True)
class SoftmaxFamily:
    """Softmax attention (``families.softmax``)."""

    name: str = softmax.FAMILY
    tf32: bool = True  # a kernel declares TF32 products (tf32=True) and is held to the TF32 yardstick

    def refusal(self, kernel: Kernel, case: Any, direction: str) -> str | None:
        """See ``Family.refusal``."""
        return common_refusal(kernel, case, direction)

    def check(self, kernel: Kernel, case: Any, direction: str, device: Any, seed: int = 0) -> Checked:
        """See ``Family.check``; a case with a KV cache is checked by ``softmax.cache``."""
        if getattr(case, "cache", None):
            return cache.check(kernel, case, direction, device, seed=seed)
        checked: Checked = softmax.check_case(kernel, case, direction, device, seed=seed)
        return checked

    def cost(self, kernel: Kernel, case: Any, direction: str) -> Any:
        """See ``Family.cost``."""
        return costs.softmax_attention(
            batch=case.batch, heads=case.heads, kv_heads=case.kv_heads, seq=case.seq, head_dim=case.head_dim,
            dtype=case.dtype, causal=case.causal, window=case.window, backward=direction == "fwdbwd",
            kv_seq=case.kv_seq)

    def rows(self, tier: str, gpu: bool) -> tuple[catalogue.Row, ...]:
        """See ``Family.rows``: ``catalogue.softmax_rows``."""
        return catalogue.rows(self.name, tier, gpu, catalogue.softmax_rows())

    def memory_bound(self, case: Any, direction: str) -> Bound | None:
        """See ``Family.memory_bound``."""
        return softmax_bound(case, direction) if isinstance(case, softmax.SoftmaxCase) else None


@dataclass(frozen=True)
class LinearFamily:
    """One of the linear families (``families.linear``: LA, GLA, simple GLA, GDN)."""

    name: str
    tf32: bool = False  # no kernel declares TF32 products: a chunk kernel is held to them on a GPU already

    def refusal(self, kernel: Kernel, case: Any, direction: str) -> str | None:
        """See ``Family.refusal``."""
        if direction == "fwdbwd" and case.seq == 1 and VARIANTS[self.name].gate is not None:
            return ("one token: its gate decays only the empty initial state, so dg is zero whatever the inputs "
                    "and a bound relative to it checks rounding noise")
        return common_refusal(kernel, case, direction)

    def check(self, kernel: Kernel, case: Any, direction: str, device: Any, seed: int = 0) -> Checked:
        """See ``Family.check``."""
        checked: Checked = linear.check_case(self.name, kernel, case, direction, device, seed=seed)
        return checked

    def cost(self, kernel: Kernel, case: Any, direction: str) -> Any:
        """See ``Family.cost``."""
        return linear.cost(self.name, kernel, case, direction)

    def rows(self, tier: str, gpu: bool) -> tuple[catalogue.Row, ...]:
        """See ``Family.rows``: those of ``catalogue.linear_rows`` the family takes."""
        return catalogue.rows(self.name, tier, gpu, catalogue.linear_rows())

    def memory_bound(self, case: Any, direction: str) -> Bound | None:
        """See ``Family.memory_bound``."""
        return linear_bound(case, direction) if isinstance(case, linear.LinearCase) else None


FAMILIES: dict[str, Family] = {
    softmax.FAMILY: SoftmaxFamily(),
    **{name: LinearFamily(name) for name in linear.FAMILIES},
}


def family(name: str) -> Family:
    """The family called ``name``; KeyError naming the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"no family {name!r} (known: {', '.join(FAMILIES)})") from None


def classes_of(name: str) -> tuple[str, ...]:
    """Every class that the family ``name``'s full catalogue (GPU rows included) reaches, and ``backward``."""
    return catalogue.classes_of(family(name).rows("full", True))


def admit(kernel: Kernel) -> Kernel:
    """``kernel``, once its family takes what it declares: a ValueError for ``tf32=True`` in a family
    without a TF32 yardstick (``Family.tf32``; a family not built in has none)."""
    known = FAMILIES.get(kernel.family)
    if kernel.tf32 and not (known is not None and known.tf32):
        raise ValueError(f"kernel '{kernel.name}' in family '{kernel.family}': tf32=True is the softmax family's "
                         "(a linear family's chunk kernel is held to TF32 products on a GPU already)")
    return kernel
