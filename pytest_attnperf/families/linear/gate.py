"""The gradient of a GLA or simple GLA gate as kernels form it from the queries' and keys'
gradients (``gate_gradient``): fla's recurrent backward over the whole sequence, its chunk
backward within each chunk (docs/checks.md, "Yardsticks"). torch is imported by the function."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["gate_gradient"]


def gate_gradient(q: Tensor, k: Tensor, dq: Tensor, dk: Tensor, *, per_head: bool, chunk: int | None = None,
                  later: Tensor | None = None) -> Tensor:
    """The gradient of a GLA or simple GLA gate from the queries' and keys' gradients, as fla's
    kernels form it::

        dg_t = sum_{s >= t} (q_s dq_s - k_s dk_s)     # over K as well for a per-head gate

    (the output depends on the cumulative log decay only through its differences, so these
    terms sum to zero over the sequence: the first token's gate gradient is zero exactly, and
    the early ones are small differences of large sums). With ``chunk``, as a chunk kernel forms
    it: the sum over the rest of the token's chunk only, plus the gradient at the next chunk's
    first token taken from ``later`` (fla's chunk kernels take that part from the state and its
    gradient). Every tensor ``[B, T, H, K]`` in one dtype, the sums taken in it; returns
    ``[B, T, H, K]``, or ``[B, T, H]`` when ``per_head``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up
    import torch.nn.functional as F  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    terms = q * dq - k * dk
    if per_head:
        terms = terms.sum(-1)
    if chunk is None:
        return terms.flip(1).cumsum(1).flip(1)
    if later is None:
        raise ValueError("a chunk's gate gradient needs the gradient after the chunk (later)")
    seq, tail = terms.shape[1], terms.shape[2:]
    pad = (-seq) % chunk
    padded = F.pad(terms.movedim(1, -1), (0, pad)).movedim(-1, 1)  # [B, T + pad, ...]
    chunks = padded.reshape(padded.shape[0], -1, chunk, *tail)
    local = chunks.flip(2).cumsum(2).flip(2).reshape(padded.shape)[:, :seq]
    nxt = (torch.arange(seq, device=terms.device) // chunk + 1) * chunk
    after = later.index_select(1, nxt.clamp(max=seq - 1))
    inside = (nxt < seq).to(after.dtype).reshape(1, seq, *([1] * len(tail)))
    return local + after * inside
