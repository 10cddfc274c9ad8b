"""The four linear-attention families as data: what each takes beside q, k, v and how its state
decays, so the code asks a family's traits, not its name (docs/families.md)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["VARIANTS", "Variant"]


@dataclass(frozen=True)
class Variant:
    """One family's traits."""

    gate: str | None  # the log decay input: None, "channel" (one per key channel) or "head" (one per head)
    beta: bool = False  # the delta rule's write strength, a beta input
    normalised_keys: bool = False  # queries and keys L2-normalised, as in the layer: the state stays bounded
    grouped_values: bool = False  # queries and keys may have fewer heads than the values

    @property
    def factored_gate(self) -> bool:
        """A gate folded into the chunked form's factors (``exp(-gamma)`` inside a chunk), whose
        gradient is a sum over the chunk: GLA's and simple GLA's, not the delta rule's."""
        return self.gate is not None and not self.beta

    @property
    def delta_rule(self) -> bool:
        """The state is corrected, not only added to: no closed-form recurrent backward, so the
        fp32 gradients come from the chunked form by autograd."""
        return self.beta


VARIANTS = {
    "linear_attn": Variant(gate=None),
    "gla": Variant(gate="channel"),
    "simple_gla": Variant(gate="head"),
    "gdn": Variant(gate="head", beta=True, normalised_keys=True, grouped_values=True),
}
