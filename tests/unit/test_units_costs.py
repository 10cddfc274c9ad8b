"""Unit tests for ``pytest_attnperf.costs``: visible pairs, FLOP/byte models and metrics.

The FLOP model is checked against ``torch.utils.flop_counter``, the convention it claims to
follow; torch is imported only by those tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_attnperf.costs import DTYPE_BYTES, Cost, metrics, softmax_attention, visible_pairs


@dataclass(frozen=True)
class Shape:
    """One attention shape: batch, query heads, sequence length, head dim, K/V heads."""

    id: str
    batch: int
    heads: int
    seq: int
    head_dim: int
    kv_heads: int | None = None

    @property
    def kv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    def q_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.seq, self.head_dim)

    def kv_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.kv, self.seq, self.head_dim)


SHAPES = (
    Shape("b2-h3-t16-d8", 2, 3, 16, 8),
    Shape("b1-h4-t33-d16", 1, 4, 33, 16),
    Shape("b3-h1-t7-d64", 3, 1, 7, 64),
)
GQA_SHAPES = (
    Shape("b2-h6-kv2-t16-d8", 2, 6, 16, 8, kv_heads=2),
    Shape("b1-h8-kv1-t24-d16", 1, 8, 24, 16, kv_heads=1),
)


def _model(shape: Shape, *, causal: bool = False, window: int | None = None, backward: bool = False,
           dtype: str = "bf16") -> Cost:
    """The plugin's cost model for ``shape``."""
    return softmax_attention(
        batch=shape.batch, heads=shape.heads, seq=shape.seq, head_dim=shape.head_dim, dtype=dtype,
        causal=causal, kv_heads=shape.kv_heads, window=window, backward=backward,
    )


def _brute_pairs(seq: int, window: int) -> int:
    """Visible (query, key) pairs of a causal sliding window, counted one by one."""
    return sum(1 for i in range(seq) for j in range(seq) if j <= i and i - j < window)


# -- visible_pairs --------------------------------------------------------------------------


@pytest.mark.parametrize(("seq", "seq_k"), [(1, 1), (16, 16), (7, 19), (33, 5)], ids=str)
def test_non_causal_pairs_are_the_full_rectangle(seq: int, seq_k: int) -> None:
    """Without a mask every query sees every key."""
    assert visible_pairs(seq, causal=False, seq_k=seq_k) == seq * seq_k


@pytest.mark.parametrize("seq", [1, 2, 7, 16, 49])
def test_causal_pairs_are_the_lower_triangle(seq: int) -> None:
    """Causal: T(T+1)/2 pairs, the diagonal included."""
    brute = sum(1 for i in range(seq) for j in range(seq) if j <= i)
    assert visible_pairs(seq, causal=True) == seq * (seq + 1) // 2 == brute


@pytest.mark.parametrize("seq", [1, 7, 16, 23])
@pytest.mark.parametrize("window", [1, 2, 5, 15, 16, 17, 100])
def test_causal_window_pairs_match_a_brute_force_count(seq: int, window: int) -> None:
    """A causal window of w sees min(i+1, w) keys for query i, also when w >= T."""
    assert visible_pairs(seq, causal=True, window=window) == _brute_pairs(seq, window)


def test_window_at_least_seq_is_plain_causal() -> None:
    """A window as long as the sequence masks nothing more than causality."""
    assert visible_pairs(16, causal=True, window=16) == visible_pairs(16, causal=True)
    assert visible_pairs(16, causal=True, window=10_000) == visible_pairs(16, causal=True)


def test_window_without_causal_is_refused() -> None:
    """A non-causal sliding window is not modelled."""
    with pytest.raises(ValueError, match="causal"):
        visible_pairs(16, causal=False, window=4)


def test_causal_with_fewer_keys_than_queries_counts_only_the_rows_that_see_keys() -> None:
    """Lower-right causal with more queries than keys: the first 16 of 32 queries see no key, the
    rest see 1 .. 16 of them."""
    assert visible_pairs(32, causal=True, seq_k=16) == 16 * 17 // 2
    assert visible_pairs(32, causal=True, seq_k=16, window=4) == 4 * 5 // 2 + 12 * 4


# -- FLOPs against torch.utils.flop_counter ------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.id)
def test_forward_flops_equal_flop_counter_on_math_sdpa(shape: Shape) -> None:
    """What FlopCounterMode counts for a math-backend SDPA forward is 4*B*H*T*T*d, the model's figure."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    q, k, v = (torch.randn(*shape.q_shape()) for _ in range(3))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        torch.nn.functional.scaled_dot_product_attention(q, k, v)
    counted = counter.get_total_flops()
    b, h, t, d = shape.q_shape()
    assert counted == 4 * b * h * t * t * d
    assert _model(shape).flops == counted


@pytest.mark.parametrize("shape", SHAPES + GQA_SHAPES, ids=lambda s: s.id)
def test_forward_flops_equal_sdpa_flop_count(shape: Shape) -> None:
    """The forward model equals flop_counter's SDPA formula, grouped-query shapes included."""
    flop_counter = pytest.importorskip("torch.utils.flop_counter")
    if not hasattr(flop_counter, "sdpa_flop_count"):
        pytest.skip("this torch has no sdpa_flop_count")
    expected = flop_counter.sdpa_flop_count(shape.q_shape(), shape.kv_shape(), shape.kv_shape())
    assert _model(shape).flops == expected


@pytest.mark.parametrize("shape", SHAPES + GQA_SHAPES, ids=lambda s: s.id)
def test_backward_flops_equal_sdpa_backward_flop_count(shape: Shape) -> None:
    """The backward part (10*B*H*pairs*d) equals flop_counter's fused SDPA backward count."""
    flop_counter = pytest.importorskip("torch.utils.flop_counter")
    expected = flop_counter.sdpa_backward_flop_count(
        shape.q_shape(), shape.q_shape(), shape.kv_shape(), shape.kv_shape()
    )
    backward_part = _model(shape, backward=True).flops - _model(shape).flops
    assert backward_part == expected
    assert backward_part == 2.5 * _model(shape).flops


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("window", [None, 1, 5, 16, 40], ids=lambda w: f"window{w}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.id)
def test_causal_flops_scale_with_visible_pairs(shape: Shape, window: int | None, backward: bool) -> None:
    """Causal FLOPs are the non-causal figure times pairs / (T*T)."""
    pairs = visible_pairs(shape.seq, causal=True, window=window)
    full = _model(shape, backward=backward).flops
    causal = _model(shape, causal=True, window=window, backward=backward).flops
    assert causal == pytest.approx(full * pairs / (shape.seq * shape.seq), rel=1e-12)
    assert causal < full or shape.seq == 1


# -- bytes ----------------------------------------------------------------------------------


def test_forward_bytes_read_q_k_v_and_write_o_once() -> None:
    """Forward bytes: Q, K, V read and O written, each B*H*T*d elements."""
    cost = softmax_attention(batch=2, heads=4, seq=128, head_dim=64, dtype="bf16", causal=False)
    assert cost.bytes == 4 * (2 * 4 * 128 * 64) * 2
    fp32 = softmax_attention(batch=2, heads=4, seq=128, head_dim=64, dtype="fp32", causal=False)
    assert fp32.bytes == 2 * cost.bytes


def test_backward_bytes_add_do_dq_dk_dv_and_reread() -> None:
    """Forward+backward bytes: the forward's four tensors plus eight in the backward."""
    one = 2 * 4 * 128 * 64 * DTYPE_BYTES["fp16"]
    cost = softmax_attention(batch=2, heads=4, seq=128, head_dim=64, dtype="fp16", causal=False,
                             backward=True)
    assert cost.bytes == (4 + 8) * one


@pytest.mark.parametrize("causal", [False, True])
def test_bytes_do_not_depend_on_the_mask(causal: bool) -> None:
    """A mask changes the work, not the tensors that must move."""
    shape = SHAPES[0]
    assert _model(shape, causal=causal).bytes == _model(shape).bytes


@pytest.mark.parametrize(("backward", "kv_tensors"), [(False, 2), (True, 6)], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("shape", GQA_SHAPES, ids=lambda s: s.id)
def test_gqa_bytes_are_smaller_by_exactly_the_kv_share(shape: Shape, backward: bool, kv_tensors: int) -> None:
    """With kv_heads < heads, bytes shrink by the K/V tensors of the missing heads, no more."""
    mha = Shape(shape.id, shape.batch, shape.heads, shape.seq, shape.head_dim)
    elem = DTYPE_BYTES["bf16"]
    missing = shape.batch * (shape.heads - shape.kv) * shape.seq * shape.head_dim * elem
    assert _model(mha, backward=backward).bytes - _model(shape, backward=backward).bytes == kv_tensors * missing
    assert _model(shape, backward=backward).flops == _model(mha, backward=backward).flops


# -- Cost and metrics -----------------------------------------------------------------------


def test_cost_adds_and_reports_intensity() -> None:
    """Costs add field by field; intensity is FLOPs per byte, infinite without bytes."""
    total = Cost(10.0, 4.0) + Cost(6.0, 4.0)
    assert total == Cost(16.0, 8.0)
    assert total.intensity_flop_per_byte == 2.0
    assert Cost(1.0, 0.0).intensity_flop_per_byte == float("inf")


def test_metrics_of_a_compute_bound_call() -> None:
    """2 TFLOP and 1 GB in 10 ms on a 1 PFLOP/s, 1 TB/s part."""
    m = metrics(Cost(flops=2e12, bytes=1e9), 0.01, peak_flops=1e15, peak_bytes_per_s=1e12)
    assert m.tflops == pytest.approx(200.0)
    assert m.mfu == pytest.approx(0.2)
    assert m.gb_per_s == pytest.approx(100.0)
    assert m.bandwidth_frac == pytest.approx(0.1)
    assert m.intensity_flop_per_byte == pytest.approx(2000.0)
    assert m.ridge_flop_per_byte == pytest.approx(1000.0)
    assert m.bound == "compute"


def test_metrics_of_a_memory_bound_call() -> None:
    """1 FLOP per byte sits far below a ridge of 1000."""
    m = metrics(Cost(flops=1e9, bytes=1e9), 0.002, peak_flops=1e15, peak_bytes_per_s=1e12)
    assert m.tflops == pytest.approx(0.5)
    assert m.gb_per_s == pytest.approx(500.0)
    assert m.bandwidth_frac == pytest.approx(0.5)
    assert m.mfu == pytest.approx(0.0005)
    assert m.bound == "memory"


def test_metrics_at_the_ridge_is_compute_bound() -> None:
    """Intensity equal to the ridge counts as compute bound."""
    m = metrics(Cost(flops=1000.0, bytes=1.0), 1.0, peak_flops=1e15, peak_bytes_per_s=1e12)
    assert m.bound == "compute"


@pytest.mark.parametrize(
    ("peak_flops", "peak_bytes_per_s"),
    [(None, None), (1e15, None), (None, 1e12)],
    ids=["no-peaks", "no-bandwidth", "no-flops"],
)
def test_metrics_without_peaks_report_no_fractions(peak_flops: float | None, peak_bytes_per_s: float | None) -> None:
    """An unknown peak gives None for its fraction, the ridge and the bound; rates still come."""
    m = metrics(Cost(flops=2e12, bytes=1e9), 0.01, peak_flops=peak_flops, peak_bytes_per_s=peak_bytes_per_s)
    assert m.tflops == pytest.approx(200.0)
    assert m.gb_per_s == pytest.approx(100.0)
    assert (m.mfu is None) == (peak_flops is None)
    assert (m.bandwidth_frac is None) == (peak_bytes_per_s is None)
    assert m.ridge_flop_per_byte is None
    assert m.bound is None


@pytest.mark.parametrize("seconds", [0.0, -1e-3])
def test_metrics_refuse_a_non_positive_time(seconds: float) -> None:
    """A call cannot take zero or negative time."""
    with pytest.raises(ValueError, match="cannot take"):
        metrics(Cost(1.0, 1.0), seconds, peak_flops=1e15, peak_bytes_per_s=1e12)
