"""FLOP and byte models of whole layers: an attention layer and a Gated DeltaNet layer. No torch.

``B`` sequences of ``T`` tokens, hidden size ``D``, ``H`` heads of key width ``d_k`` and value width
``d_v``. The attention layer is its ``q, k, v, o`` projections around causal SDPA; the GDN layer is
``fla.layers.GatedDeltaNet``'s (projections, short convolutions, the gated delta rule, a gated RMS
norm). The kernel models' conventions: only contractions count, a projection costs
``2 * tokens * in * out`` FLOPs forward and twice that backward, and bytes count each operation
as the separate kernel that runs it. The layer-level crossover ``T* = 4D + 3 d_v``
(``layer_crossover_formula``): docs/reports.md, "The suites" and "The studies".
"""

from __future__ import annotations

from pytest_attnperf import costs
from pytest_attnperf.costs import DTYPE_BYTES, Cost
from pytest_attnperf.families.linear import costs as costs_linear

__all__ = ["attention_layer", "gdn_layer", "layer_crossover_formula", "projection"]


def projection(*, tokens: int, d_in: int, d_out: int, dtype: str, backward: bool = False) -> Cost:
    """``Y = X W`` for ``tokens`` rows: forward, or forward and backward."""
    elem = DTYPE_BYTES[dtype]
    x, w, y = tokens * d_in * elem, d_in * d_out * elem, tokens * d_out * elem
    fwd = Cost(flops=2.0 * tokens * d_in * d_out, bytes=float(x + w + y))
    if not backward:
        return fwd
    return fwd + Cost(flops=2.0 * fwd.flops, bytes=float(y + x + w + x + w))  # read dY, X, W; write dX, dW


def _elementwise(*, elements_in: int, elements_out: int, dtype: str, backward: bool) -> Cost:
    """Bytes of an element-wise operation (no FLOPs counted): read its inputs, write its outputs;
    backward reads the inputs and the output's gradient and writes the inputs' gradients."""
    elem = DTYPE_BYTES[dtype]
    fwd = Cost(flops=0.0, bytes=float((elements_in + elements_out) * elem))
    if not backward:
        return fwd
    return fwd + Cost(flops=0.0, bytes=float((2 * elements_in + elements_out) * elem))


def attention_layer(
    *, batch: int, seq: int, hidden: int, heads: int, head_dim: int, dtype: str, causal: bool = True,
    backward: bool = False,
) -> Cost:
    """q/k/v/o projections and SDPA over ``heads`` heads of ``head_dim``."""
    tokens, inner = batch * seq, heads * head_dim
    proj = projection(tokens=tokens, d_in=hidden, d_out=inner, dtype=dtype, backward=backward)
    out = projection(tokens=tokens, d_in=inner, d_out=hidden, dtype=dtype, backward=backward)
    core = costs.softmax_attention(batch=batch, heads=heads, seq=seq, head_dim=head_dim, dtype=dtype,
                                   causal=causal, backward=backward)
    return proj + proj + proj + core + out


def gdn_layer(
    *, batch: int, seq: int, hidden: int, heads: int, head_dim: int, dtype: str, expand_v: float = 2.0,
    form: str = "chunk", backward: bool = False,
) -> Cost:
    """``fla.layers.GatedDeltaNet(hidden, head_dim=head_dim, num_heads=heads, expand_v=expand_v)``."""
    tokens = batch * seq
    key_width, value_dim = heads * head_dim, int(head_dim * expand_v)
    value_width = heads * value_dim

    def proj(d_in: int, d_out: int) -> Cost:
        return projection(tokens=tokens, d_in=d_in, d_out=d_out, dtype=dtype, backward=backward)

    projections = proj(hidden, key_width) + proj(hidden, key_width) + proj(hidden, value_width)
    projections += proj(hidden, value_width) + proj(hidden, heads) + proj(hidden, heads) + proj(value_width, hidden)
    conv_channels = 2 * key_width + value_width
    conv = _elementwise(elements_in=tokens * conv_channels, elements_out=tokens * conv_channels, dtype=dtype,
                        backward=backward)
    norm = _elementwise(elements_in=2 * tokens * value_width, elements_out=tokens * value_width, dtype=dtype,
                        backward=backward)
    core = costs_linear.gated_delta_rule(batch=batch, heads=heads, seq=seq, key_dim=head_dim, value_dim=value_dim,
                                         dtype=dtype, form=form, gate_dtype=dtype, backward=backward)
    return projections + conv + core + norm


def layer_crossover_formula(hidden: int, value_head_dim: int) -> int:
    """``T* = 4 D + 3 d_v``: the sequence length from which a GDN layer does fewer FLOPs than an
    attention layer (see the module docstring for the assumptions)."""
    return 4 * hidden + 3 * value_head_dim
