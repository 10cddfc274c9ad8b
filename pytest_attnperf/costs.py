"""Analytic FLOP and byte models of softmax attention. Plain numbers in, plain numbers out; no torch.

The conventions of FlashAttention's papers and ``torch.utils.flop_counter``: a multiply-add is 2
FLOPs, only the matmuls count (``4 * d`` per visible query/key pair forward, ``10 * d`` backward);
bytes are every input read once and every output written once; decode reads the KV cache
(docs/families.md, "Softmax", **Cost**; docs/decode.md, "Softmax attention over a KV cache").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DTYPE_BYTES", "Cost", "Metrics", "keys_read", "metrics", "softmax_attention", "visible_pairs"]

DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}


@dataclass(frozen=True)
class Cost:
    """Work of one call: floating-point operations and the fewest bytes it must move."""

    flops: float
    bytes: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    @property
    def intensity_flop_per_byte(self) -> float:
        """Arithmetic intensity in FLOP/byte; infinite for a cost that moves no bytes."""
        return self.flops / self.bytes if self.bytes else float("inf")


@dataclass(frozen=True)
class Metrics:
    """Rates achieved by one call in ``seconds``; fractions are None where a peak is unknown."""

    tflops: float
    mfu: float | None
    gb_per_s: float
    bandwidth_frac: float | None
    intensity_flop_per_byte: float
    ridge_flop_per_byte: float | None

    @property
    def bound(self) -> str | None:
        """'compute' or 'memory': which side of the ridge point the cost model sits."""
        if self.ridge_flop_per_byte is None:
            return None
        return "compute" if self.intensity_flop_per_byte >= self.ridge_flop_per_byte else "memory"


def _window_sum(n: int, window: int | None) -> int:
    """``sum(min(m, window) for m in 1..n)``: the keys queries at positions ``0 .. n-1`` see."""
    if window is None or window >= n:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def visible_pairs(seq: int, causal: bool, window: int | None = None, seq_k: int | None = None) -> int:
    """Query/key pairs a mask leaves visible, per (batch, head): ``seq`` queries over ``seq_k``
    keys (default ``seq``), causal aligned lower-right, so query ``i`` sees
    ``min(seq_k - seq + i + 1, window)`` keys."""
    seq_k = seq if seq_k is None else seq_k
    if window is not None and not causal:
        raise ValueError("a sliding window is modelled for causal attention only")
    if window is not None and window < 1:
        raise ValueError(f"a window holds at least one key, got {window}")
    if not causal:
        return seq * seq_k
    if seq_k < seq:  # more queries than keys: the first seq - seq_k see none, the rest are keys 0 .. seq_k - 1
        return _window_sum(seq_k, window)
    return _window_sum(seq_k, window) - _window_sum(seq_k - seq, window)


def keys_read(seq: int, causal: bool, window: int | None = None, seq_k: int | None = None) -> int:
    """Key positions some query sees, per (batch, head): all ``seq_k`` keys, but under a causal
    window only the last ``seq + window - 1`` (at most ``seq_k``)."""
    seq_k = seq if seq_k is None else seq_k
    if causal and window is not None:
        return min(seq_k, seq + window - 1)
    return seq_k


def softmax_attention(
    *,
    batch: int,
    heads: int,
    seq: int,
    head_dim: int,
    dtype: str,
    causal: bool,
    kv_heads: int | None = None,
    window: int | None = None,
    backward: bool = False,
    kv_seq: int | None = None,
) -> Cost:
    """Softmax attention, forward or forward+backward (``backward=True``); ``kv_seq`` keys
    (default ``seq``) for decode and chunked prefill."""
    kv_heads = heads if kv_heads is None else kv_heads
    pairs = visible_pairs(seq, causal, window, kv_seq)
    elem = DTYPE_BYTES[dtype]
    q_like = batch * heads * seq * head_dim * elem  # Q, O, dO, dQ
    kv_like = batch * kv_heads * keys_read(seq, causal, window, kv_seq) * head_dim * elem  # K, V, dK, dV
    fwd = Cost(flops=4.0 * batch * heads * pairs * head_dim, bytes=2.0 * q_like + 2.0 * kv_like)
    if not backward:
        return fwd
    bwd = Cost(flops=10.0 * batch * heads * pairs * head_dim, bytes=4.0 * q_like + 4.0 * kv_like)
    return fwd + bwd


def metrics(
    cost: Cost,
    seconds: float,
    peak_flops: float | None,
    peak_bytes_per_s: float | None,
) -> Metrics:
    """TFLOP/s, MFU, GB/s and bandwidth fraction of one call that took ``seconds``."""
    if seconds <= 0:
        raise ValueError(f"a call cannot take {seconds} s")
    flops_per_s = cost.flops / seconds
    bytes_per_s = cost.bytes / seconds
    ridge = peak_flops / peak_bytes_per_s if peak_flops and peak_bytes_per_s else None
    return Metrics(
        tflops=flops_per_s / 1e12,
        mfu=flops_per_s / peak_flops if peak_flops else None,
        gb_per_s=bytes_per_s / 1e9,
        bandwidth_frac=bytes_per_s / peak_bytes_per_s if peak_bytes_per_s else None,
        intensity_flop_per_byte=cost.intensity_flop_per_byte,
        ridge_flop_per_byte=ridge,
    )
