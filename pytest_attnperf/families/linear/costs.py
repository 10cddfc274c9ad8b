"""Analytic FLOP and byte models of linear attention. Plain numbers in, plain numbers out; no torch.

Per (batch, head): contractions only, a multiply-add 2 FLOPs, intra-chunk products as dense
tiles, backward 2x the forward FLOPs, bytes the floor a kernel must move (gates in
``gate_dtype``, fp32 by default; states fp32). The chunk and recurrent forms of linear attention,
GLA, simple GLA and the gated delta rule.

docs/families.md, "Linear attention", states each convention and formula.
"""

from __future__ import annotations

from pytest_attnperf.costs import DTYPE_BYTES, Cost

__all__ = [
    "MODELS",
    "BACKWARD_FLOP_FACTOR",
    "FORMS",
    "STATE_DTYPE",
    "chunk_lengths",
    "delta_rule_flops_per_head",
    "gated_delta_rule",
    "gla",
    "linear_attention",
    "linear_attention_flops_per_head",
    "simple_gla",
    "triangular_inverse_flops",
]

FORMS = ("chunk", "recurrent")
"""The two ways a kernel can run the recurrence: chunkwise (matmuls) or token by token."""

STATE_DTYPE = "fp32"
"""fla keeps initial and final states in fp32 whatever the inputs' dtype."""

BACKWARD_FLOP_FACTOR = 2.0
"""Backward FLOPs per forward FLOP: two gradient products per product, no recomputation."""


def _elem_bytes(dtype: str, what: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown {what} {dtype!r}; expected one of {sorted(DTYPE_BYTES)}") from None


def _check_form(form: str, chunk: int) -> None:
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    if chunk < 1:
        raise ValueError(f"chunk must be a positive number of tokens, got {chunk}")


def chunk_lengths(seq: int, chunk: int) -> list[int]:
    """Lengths of the chunks a sequence of ``seq`` tokens is cut into; the last may be shorter."""
    if seq < 0 or chunk < 1:
        raise ValueError(f"cannot cut {seq} tokens into chunks of {chunk}")
    full, rest = divmod(seq, chunk)
    return [chunk] * full + ([rest] if rest else [])


def triangular_inverse_flops(n: int) -> float:
    """FLOPs to invert an ``n x n`` unit lower-triangular matrix by forward substitution.

    Entry ``(i, j)``, ``i > j``, of the inverse needs ``i - j - 1`` multiply-adds (the diagonal
    is one and needs none), ``n(n-1)(n-2)/6`` in all: ``n^3/3`` FLOPs for large ``n``.
    """
    return 2.0 * n * (n - 1) * (n - 2) / 6


def linear_attention_flops_per_head(seq: int, key_dim: int, value_dim: int, form: str, chunk: int = 64) -> float:
    """Forward FLOPs of (gated) linear attention for one (batch, head); see the module table."""
    _check_form(form, chunk)
    state_flops = 4.0 * key_dim * value_dim * seq  # update k v^T and read-out S^T q, every token
    if form == "recurrent":
        return state_flops
    intra = sum(2.0 * c * c * key_dim + 2.0 * c * c * value_dim for c in chunk_lengths(seq, chunk))
    return intra + state_flops


def delta_rule_flops_per_head(seq: int, key_dim: int, value_dim: int, form: str, chunk: int = 64) -> float:
    """Forward FLOPs of the (gated) delta rule for one (batch, head); see the module table."""
    _check_form(form, chunk)
    state_flops = 6.0 * key_dim * value_dim * seq  # S^T k, the rank-1 write and the read-out
    if form == "recurrent":
        return state_flops
    intra = 0.0
    for c in chunk_lengths(seq, chunk):
        intra += 2.0 * c * c * key_dim  # Gram matrix (beta K) K^T
        intra += triangular_inverse_flops(c)  # T = (I + A)^-1
        intra += 2.0 * c * c * key_dim + 2.0 * c * c * value_dim  # W = T (beta K), U = T (beta V)
        intra += 2.0 * c * c * key_dim + 2.0 * c * c * value_dim  # scores Q K^T, their product with U - W S
    return intra + state_flops


def _key_heads(heads: int, key_heads: int | None) -> int:
    """The query/key heads, ``heads`` unless given; ValueError unless they divide the value heads."""
    if key_heads is None:
        return heads
    if key_heads < 1 or heads % key_heads:
        raise ValueError(f"{heads} value heads cannot share {key_heads} query/key heads (it must divide them)")
    return key_heads


def _cost(
    *,
    flops_per_head: float,
    batch: int,
    heads: int,
    seq: int,
    key_dim: int,
    value_dim: int,
    dtype: str,
    extra_input_bytes: float,
    initial_state: bool,
    final_state: bool,
    backward: bool,
    key_heads: int | None = None,
) -> Cost:
    """Assemble a Cost from per-head FLOPs and the bytes common to every variant; ``heads`` are
    the value heads (one state each), ``key_heads`` the query/key heads (``heads`` unless given)."""
    elem = _elem_bytes(dtype, "dtype")
    tokens = batch * seq * heads
    qk_bytes = 2.0 * batch * seq * _key_heads(heads, key_heads) * key_dim * elem
    v_bytes = tokens * value_dim * elem  # V, and equally O, dO, dV
    state_bytes = float(batch * heads * key_dim * value_dim * DTYPE_BYTES[STATE_DTYPE])
    inputs = qk_bytes + v_bytes + extra_input_bytes + (state_bytes if initial_state else 0.0)
    fwd = Cost(
        flops=batch * heads * flops_per_head,
        bytes=inputs + v_bytes + (state_bytes if final_state else 0.0),
    )
    if not backward:
        return fwd
    # read every input and dO (plus d(final state)), write one gradient per input
    bwd = Cost(
        flops=BACKWARD_FLOP_FACTOR * fwd.flops,
        bytes=2.0 * inputs + v_bytes + (state_bytes if final_state else 0.0),
    )
    return fwd + bwd


def linear_attention(
    *,
    batch: int,
    heads: int,
    seq: int,
    key_dim: int,
    value_dim: int,
    dtype: str,
    form: str = "chunk",
    chunk: int = 64,
    initial_state: bool = False,
    final_state: bool = False,
    backward: bool = False,
) -> Cost:
    """Causal linear attention (fla's ``chunk_linear_attn`` / ``fused_recurrent_linear_attn``).

    The ``normalize=True`` division (a running key sum and one ``q . z`` per token) is
    element-wise work and not counted.
    """
    return _cost(
        flops_per_head=linear_attention_flops_per_head(seq, key_dim, value_dim, form, chunk),
        batch=batch, heads=heads, seq=seq, key_dim=key_dim, value_dim=value_dim, dtype=dtype,
        extra_input_bytes=0.0, initial_state=initial_state, final_state=final_state, backward=backward,
    )


def _gated_linear(
    *, gates_per_token: int, batch: int, heads: int, seq: int, key_dim: int, value_dim: int, dtype: str,
    form: str, chunk: int, gate_dtype: str, initial_state: bool, final_state: bool, backward: bool,
) -> Cost:
    """Linear attention's FLOPs (gates are element-wise) plus the gates' bytes."""
    gate_bytes = float(batch * seq * heads * gates_per_token * _elem_bytes(gate_dtype, "gate_dtype"))
    return _cost(
        flops_per_head=linear_attention_flops_per_head(seq, key_dim, value_dim, form, chunk),
        batch=batch, heads=heads, seq=seq, key_dim=key_dim, value_dim=value_dim, dtype=dtype,
        extra_input_bytes=gate_bytes, initial_state=initial_state, final_state=final_state, backward=backward,
    )


def gla(
    *,
    batch: int,
    heads: int,
    seq: int,
    key_dim: int,
    value_dim: int,
    dtype: str,
    form: str = "chunk",
    chunk: int = 64,
    gate_dtype: str = "fp32",
    initial_state: bool = False,
    final_state: bool = False,
    backward: bool = False,
) -> Cost:
    """Gated linear attention, per-key-channel gates ``g: [B, T, H, K]`` (fla's ``chunk_gla``)."""
    return _gated_linear(
        gates_per_token=key_dim, batch=batch, heads=heads, seq=seq, key_dim=key_dim, value_dim=value_dim,
        dtype=dtype, form=form, chunk=chunk, gate_dtype=gate_dtype, initial_state=initial_state,
        final_state=final_state, backward=backward,
    )


def simple_gla(
    *,
    batch: int,
    heads: int,
    seq: int,
    key_dim: int,
    value_dim: int,
    dtype: str,
    form: str = "chunk",
    chunk: int = 64,
    gate_dtype: str = "fp32",
    initial_state: bool = False,
    final_state: bool = False,
    backward: bool = False,
) -> Cost:
    """Linear attention with one gate per (token, head), ``g: [B, T, H]`` (fla's ``chunk_simple_gla``)."""
    return _gated_linear(
        gates_per_token=1, batch=batch, heads=heads, seq=seq, key_dim=key_dim, value_dim=value_dim,
        dtype=dtype, form=form, chunk=chunk, gate_dtype=gate_dtype, initial_state=initial_state,
        final_state=final_state, backward=backward,
    )


def gated_delta_rule(
    *,
    batch: int,
    heads: int,
    seq: int,
    key_dim: int,
    value_dim: int,
    dtype: str,
    form: str = "chunk",
    chunk: int = 64,
    gate_dtype: str = "fp32",
    beta_dtype: str | None = None,
    initial_state: bool = False,
    final_state: bool = False,
    backward: bool = False,
    key_heads: int | None = None,
) -> Cost:
    """Gated DeltaNet, ``g, beta: [B, T, H]`` (fla's ``chunk_gated_delta_rule``).

    In-kernel extras (``use_qk_l2norm_in_kernel``, ``use_beta_sigmoid_in_kernel``,
    ``use_gate_in_kernel``) are element-wise and not counted. Grouped values (``key_heads``
    query/key heads under ``heads`` value heads, fla's ``HV > H``): the FLOPs are every value
    head's, as each has its own state, gates and beta, and fla's kernels run one program per
    value head (the scores ``Q K^T`` of a key head are recomputed for each of its value heads);
    the queries and keys are read, and their gradients written, once per key head.
    """
    beta_dtype = dtype if beta_dtype is None else beta_dtype
    per_token = _elem_bytes(gate_dtype, "gate_dtype") + _elem_bytes(beta_dtype, "beta_dtype")
    return _cost(
        flops_per_head=delta_rule_flops_per_head(seq, key_dim, value_dim, form, chunk),
        batch=batch, heads=heads, seq=seq, key_dim=key_dim, value_dim=value_dim, dtype=dtype,
        extra_input_bytes=float(batch * seq * heads * per_token),
        initial_state=initial_state, final_state=final_state, backward=backward, key_heads=key_heads,
    )


MODELS = {"linear_attn": linear_attention, "gla": gla, "simple_gla": simple_gla, "gdn": gated_delta_rule}
"""Each linear family's cost model, by the family's name."""
