"""The linear families' case type: one shape, its heads and widths; the grouped heads' mapping
(nothing here imports torch).

``heads`` counts the value heads. Gated DeltaNet may have fewer query/key heads (``key_heads``,
grouped value attention): value head ``j`` reads query/key head ``j // (heads // key_heads)``, as
fla 0.6.0's GDN kernels index their keys; the other families refuse such a case (``refusal``).
The optional call axes ``state`` and ``varlen`` and a ``relation`` row are described in
docs/families.md, "Linear attention (LA, GLA, simple GLA, Gated DeltaNet)".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_attnperf.families.linear.variants import VARIANTS
from pytest_attnperf.families.values import LINEAR_VALUES, layout_refusal, values_refusal

__all__ = ["BETA_FAMILIES", "GROUPED_FAMILIES", "RELATIONS", "LinearCase", "key_head_of", "key_heads_refusal",
           "linear_layout_refusal", "linear_values_refusal", "value_grouped"]

GROUPED_FAMILIES = frozenset(name for name, variant in VARIANTS.items() if variant.grouped_values)
"""The linear families whose queries and keys may have fewer heads than their values."""
BETA_FAMILIES = frozenset(name for name, variant in VARIANTS.items() if variant.beta)
"""The linear families with a beta input (the delta rule's write strength)."""
RELATIONS = {
    "split-state": "the sequence run as two calls, the first's final state the second's initial state, equals "
                   "one call on the whole",
    "packed-loop": "the sequences packed with cu_seqlens equal one call per sequence",
    "batch-split": "a batch of N equals N calls of one batch entry each",
    "inference": "the forward under torch.no_grad() and torch.inference_mode() equals the grad-mode call, its "
                 "inputs and initial state unchanged",
}
"""The metamorphic relations a ``relation`` row checks (``families.linear.relations``)."""


def key_heads_refusal(family: str, key_heads: int | None) -> str | None:
    """Why ``family`` cannot take a case of ``key_heads`` query/key heads (None when it can: the
    case has one head count, or the family groups its values)."""
    if key_heads is None or family in GROUPED_FAMILIES:
        return None
    return (f"key_heads is a grouped-value input of {', '.join(sorted(GROUPED_FAMILIES))} only (fewer query/key "
            f"heads than value heads); {family} has one head count")


def linear_values_refusal(family: str, values: str) -> str | None:
    """Why the linear family ``family`` has no value regime ``values`` (None when it has): one of
    ``LINEAR_VALUES`` that its variant's inputs can carry (``VARIANTS``)."""
    variant = VARIANTS.get(family)
    if values == "beta-bounds" and not (variant and variant.beta):
        return "beta-bounds is a GDN regime (the other linear families have no beta)"
    if values in ("gate-near-zero", "gate-strong", "decay-underflow") and variant and variant.gate is None:
        return f"{values} is a gated regime; linear attention has no gate"
    if values == "large-state" and variant and variant.normalised_keys:
        return "large-state needs unnormalised keys; GDN's are L2-normalised (its state stays bounded)"
    return values_refusal(family, values, LINEAR_VALUES)


def linear_layout_refusal(layout: str) -> str | None:
    """Why a linear family has no input layout ``layout`` (None when it has): each of ``LAYOUTS``
    but ``expanded-kv``, whose K and V share one head."""
    if why := layout_refusal(layout):
        return why
    if layout == "expanded-kv":
        return "expanded-kv (K/V of one head expanded with stride 0) is a softmax layout"
    return None


@dataclass(frozen=True)
class LinearCase:
    """One shape of a linear-attention family; ``beta_max`` 2 allows negative eigenvalues;
    ``key_heads`` (GDN only) the query/key heads when fewer than the ``heads`` value heads."""

    id: str
    batch: int
    heads: int
    seq: int
    key_dim: int
    value_dim: int
    dtype: str
    beta_max: float = 1.0
    gpu: bool = True
    key_heads: int | None = None
    opt_in: str | None = None  # a row group collected only when --attnperf-opt-in names it (options.OPT_IN)
    values: str = "normal"  # how the inputs are drawn (``families.values``: adversarial regimes)
    layout: str = "contiguous"  # how the kernel receives them (``families.values.laid_out``)
    state: bool = False  # the ``state`` axis: an initial state in, the final state out
    lengths: tuple[int, ...] | None = None  # the ``varlen`` axis: packed sequences' lengths (batch 1, seq their sum)
    relation: str | None = None  # a metamorphic relation checked instead of the reference (``RELATIONS``)

    @property
    def axes(self) -> tuple[str, ...]:
        """The optional call axes the case carries, which a kernel must declare (``Kernel.axes``)."""
        return (("state",) if self.state else ()) + (("varlen",) if self.lengths is not None else ())

    @property
    def cu_seqlens(self) -> tuple[int, ...] | None:
        """fla's ``cu_seqlens``: the packed sequences' offsets, ``0`` first and ``seq`` last."""
        if self.lengths is None:
            return None
        offsets = [0]
        for length in self.lengths:
            offsets.append(offsets[-1] + length)
        return tuple(offsets)

    @property
    def sequences(self) -> int:
        """How many sequences (and states): the packed ones, else the batch entries."""
        return len(self.lengths) if self.lengths is not None else self.batch

    def backward_refusal(self) -> str | None:
        """Why the case has no ``fwdbwd`` check: a relation compares forward calls."""
        return f"the {self.relation} relation compares forward calls" if self.relation else None

    @property
    def scale(self) -> float:
        """The attention scale, ``key_dim ** -0.5``."""
        scale: float = self.key_dim**-0.5  # int ** negative int: typeshed says Any
        return scale

    @property
    def n_key_heads(self) -> int:
        """The query/key heads: ``key_heads``, or ``heads`` when not grouped."""
        return self.heads if self.key_heads is None else self.key_heads

    def refusal(self, family: str) -> str | None:
        """Why a kernel of ``family`` cannot take this case whatever the kernel (None when it can):
        the parametrizing removes such combinations at collection with this reason. Grouped values
        and a beta range are GDN's inputs."""
        if self.beta_max != 1.0 and family not in BETA_FAMILIES:
            return "beta_max is a GDN input; this family has no beta"
        if why := self._axes_refusal():
            return why
        return (key_heads_refusal(family, self.key_heads) or linear_values_refusal(family, self.values)
                or linear_layout_refusal(self.layout))


    def _axes_refusal(self) -> str | None:
        if self.lengths is not None and (self.batch != 1 or sum(self.lengths) != self.seq
                                         or min(self.lengths, default=0) < 1):
            return (f"lengths {self.lengths} pack sequences of at least one token into one batch entry: batch must "
                    f"be 1 (it is {self.batch}) and seq their sum (it is {self.seq})")
        if self.relation is not None and self.relation not in RELATIONS:
            return f"no relation {self.relation!r} (known: {', '.join(RELATIONS)})"
        if self.relation == "split-state" and (not self.state or self.lengths is not None or self.seq < 2):
            return "split-state needs the state axis, one sequence per batch entry and two tokens at least"
        if self.relation == "packed-loop" and self.lengths is None:
            return "packed-loop needs packed sequences (lengths)"
        return None


def key_head_of(value_head: int, value_heads: int, key_heads: int) -> int:
    """The query/key head that value head ``value_head`` reads: ``value_head // (value_heads //
    key_heads)``; ValueError unless ``key_heads`` divides ``value_heads``."""
    if key_heads < 1 or value_heads % key_heads:
        raise ValueError(f"{value_heads} value heads cannot share {key_heads} query/key heads (it must divide them)")
    return value_head // (value_heads // key_heads)


def value_grouped(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """Queries and keys ``[B, T, H, K]`` (tensors) repeated to the values' ``HV`` heads, so that
    value head ``j`` meets head ``key_head_of(j, HV, H)``; ``(q, k)`` themselves when ``H == HV``.
    ValueError unless ``H`` divides ``HV``. The repeat is differentiable: a key head's gradient
    sums over its group."""
    heads, value_heads = k.shape[2], v.shape[2]
    if q.shape[2] != heads:
        raise ValueError(f"q has {q.shape[2]} heads and k {heads}: queries and keys share their heads")
    if value_heads == heads:
        return q, k
    key_head_of(0, value_heads, heads)  # the check
    group = value_heads // heads
    return q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
