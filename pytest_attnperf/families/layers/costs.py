"""FLOP and byte models of whole layers: an attention layer and a Gated DeltaNet layer. No torch.

``B`` sequences of ``T`` tokens, hidden size ``D``, ``H`` heads of key width ``d_k`` (``H * d_k``
need not equal ``D``) and value width ``d_v``.

* Attention layer: projections ``q, k, v: D -> H d_k`` and ``o: H d_k -> D``, then causal SDPA
  (``costs.softmax_attention``). Per token: ``8 D H d_k`` projection FLOPs plus the core.
* GDN layer, as ``fla.layers.GatedDeltaNet`` builds it (``use_gate=True``, short convolutions):
  projections ``q, k: D -> H d_k``, ``v, g: D -> H d_v``, ``a, b: D -> H`` (gate and beta
  logits), ``o: H d_v -> D``; a 4-tap depthwise causal convolution with SiLU on ``q, k, v``; the
  gated delta rule (``costs_linear.gated_delta_rule``, chunk form by default); a gated RMS norm
  of the output by ``g``.

Conventions are those of the kernel models: a multiply-add is 2 FLOPs and only contractions
count (the depthwise convolution, a 4-tap filter per channel, the norm and the gates are
element-wise: bytes only). A projection ``X W`` costs ``2 * tokens * in * out`` FLOPs forward and
twice that backward (``dX = dY W^T``, ``dW = X^T dY``). Bytes count each operation as the
separate kernel that runs it: its inputs read once, its outputs written once (the layer's
intermediates, ``q, k, v`` and the core's output, go through memory between kernels).

The layer-level crossover ``T* = 4D + 3 d_v`` (``layer_crossover_formula``) follows from these
counts with ``H d_k = D`` and ``d_v = 2 d_k`` (fla's default ``expand_v=2``), the recurrent count
of the delta rule (``6 d_k d_v`` per token and head) and a causal forward's ``2 T D`` per token
for attention, leaving out the small ``a, b`` projections: the GDN layer's projections cost
``16 D^2`` per token against attention's ``8 D^2``, and ``2 T D = 8 D^2 + 6 D d_v``.
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
