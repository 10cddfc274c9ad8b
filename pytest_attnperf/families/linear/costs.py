"""Analytic FLOP and byte models of linear attention. Plain numbers in, plain numbers out; no torch.

Per (batch, head), with ``T`` tokens, key width ``K``, value width ``V``, the state ``S`` a
``[K, V]`` matrix, and the chunk form cutting the sequence into chunks of ``C`` tokens (the last
one ``T - (n-1)C`` long, counted at its own length, not padded).

Conventions (those of :mod:`pytest_attnperf.costs`, extended):

* A multiply-add is 2 FLOPs. Only contractions are counted: matrix products, matrix-vector
  products, outer products added into a state, and the triangular inverse of the delta rule.
  Element-wise work (gate exponentials, ``diag(exp g)`` decays of a state or a tile, ``beta``
  scalings, causal masks, ``scale``, the normalisation of ``normalize=True``) is not counted,
  as softmax attention's exponentials are not. So GLA and simple GLA count exactly what plain
  linear attention counts; their gates cost bytes, not FLOPs.
* Intra-chunk products are counted as the dense ``c x c`` tiles a chunk kernel multiplies: the
  causal mask zeroes the upper triangle *after* the product. (fla's ``chunk_gla`` builds its
  scores from 16-wide sub-chunks and skips the blocks above the diagonal, so it executes a
  little less than counted.) This is the price the chunk form pays for tensor-core matmuls:
  when ``C`` divides ``T`` it does ``2C(K+V)`` FLOPs per token more than the recurrent form
  (``C(6K+4V) + (C-1)(C-2)/3`` more for the delta rule).
* Backward is 2x the forward FLOPs: each product ``Y = A B`` has two gradient products of its
  size, ``dA = dY B^T`` and ``dB = A^T dY`` (the recurrent forms' backward recurrences do the
  same: ``8KV`` per token for linear attention). Recomputation (fla recomputes the chunk states
  and, for the delta rule, the WY factors in its backward) is not counted, so forward+backward
  is 3x the forward.
* Bytes are the floor a kernel must move through device memory: every input read once, every
  output written once, nothing intermediate. ``q, k, v`` and the output are in ``dtype``.
  Gates ``g`` are in ``gate_dtype``, fp32 by default: fla's kernels read the gates in whatever
  dtype the caller passes, but take their chunk-local cumulative sum in fp32
  (``fla.ops.utils.cumsum``: ``output_dtype=torch.float``), and ``chunk_gla`` saves that fp32
  sum for its backward when the gates already are fp32 (it recomputes it otherwise); pass
  ``gate_dtype`` to match the caller. ``beta`` is in ``beta_dtype`` (``dtype`` unless given, as
  in ``chunk_gated_delta_rule``'s docstring example). States are fp32 (fla writes its final state as ``torch.float`` and
  ``chunk_gla`` asserts an fp32 initial state): ``initial_state`` and ``final_state`` add one
  ``[B, H, K, V]`` fp32 read or write. The backward reads the forward's inputs and ``dO`` and
  writes one gradient per input (in that input's dtype); it does not need ``O``.

Forward FLOPs per (batch, head); ``sum c^2`` runs over the chunk lengths (``T*C`` when ``C``
divides ``T``):

* Linear attention, GLA and simple GLA, chunk form: ``2(K+V) sum c^2 + 4KVT``. Per chunk of
  ``c`` tokens: the scores ``Q K^T`` (``2c^2 K``), their product with ``V`` (``2c^2 V``), the
  inter-chunk read-out ``Q S`` (``2cKV``) and the state update ``S += K^T V`` (``2cKV``).
* The same, recurrent form: ``4KVT``. Per token: the update ``S += k v^T`` (``2KV``) and the
  read-out ``S^T q`` (``2KV``).
* Gated delta rule, chunk (WY) form: ``(6K+4V) sum c^2 + 6KVT + sum c(c-1)(c-2)/3``. Per chunk:
  the Gram matrix ``(beta K) K^T`` (``2c^2 K``); the inverse ``T`` of the unit lower-triangular
  ``I + A`` (``c(c-1)(c-2)/6`` multiply-adds by forward substitution); ``W = T (beta K)``
  (``2c^2 K``) and ``U = T (beta V)`` (``2c^2 V``); the corrected values ``U - W S``
  (``2cKV``); the scores ``Q K^T`` (``2c^2 K``) and their product with the corrected values
  (``2c^2 V``); the read-out ``Q S`` (``2cKV``) and the state update ``S += K^T U`` (``2cKV``).
* The same, recurrent form: ``6KVT``. Per token: ``S^T k`` (``2KV``), the rank-1 write
  ``S += k u^T`` (``2KV``) and the read-out ``S^T q`` (``2KV``).
"""

from __future__ import annotations

from pytest_attnperf.costs import DTYPE_BYTES, Cost

__all__ = [
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
