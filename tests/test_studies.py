"""The studies' numbers: exponent fits, crossovers, analytic crossovers and the layer cost model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_attnperf import costs
from pytest_attnperf.families.layers import costs as costs_layers
from pytest_attnperf.families.linear import costs as costs_linear
from pytest_attnperf.report import fits as studies

SEQS = [512, 1024, 2048, 4096, 8192, 16384]


@pytest.mark.parametrize(("df", "expected"), [(1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228),
                                              (30, 2.042), (120, 1.980)])
def test_t_quantile_matches_the_tables(df: int, expected: float) -> None:
    assert studies.t_quantile(df) == pytest.approx(expected, abs=6e-4)


def test_t_quantile_at_other_levels() -> None:
    assert studies.t_quantile(4, 0.99) == pytest.approx(4.604, abs=1e-3)
    assert studies.t_quantile(1, 0.5) == pytest.approx(1.0, abs=1e-9)  # the Cauchy's quartile
    with pytest.raises(ValueError, match="at least 1 degree of freedom"):
        studies.t_quantile(0)


def test_noise_free_power_law_gives_its_exponent_exactly() -> None:
    fit = studies.fit_exponent(SEQS, [3e-6 * t**2 for t in SEQS])
    assert fit.exponent == pytest.approx(2.0, abs=1e-12)
    assert fit.ci_low == pytest.approx(2.0, abs=1e-9)
    assert fit.ci_high == pytest.approx(2.0, abs=1e-9)
    assert math.exp(fit.intercept) == pytest.approx(3e-6, rel=1e-9)
    assert (fit.n, fit.x_min, fit.x_max) == (6, 512, 16384)


def test_noisy_fits_cover_the_true_exponent_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(1)
    covered, widths = 0, []
    for _ in range(400):
        ys = [2e-4 * t**1.0 * math.exp(rng.normal(0, 0.05)) for t in SEQS]
        fit = studies.fit_exponent(SEQS, ys)
        covered += fit.ci_low <= 1.0 <= fit.ci_high
        widths.append(fit.ci_high - fit.ci_low)
    assert 0.91 <= covered / 400 <= 0.99  # a z-interval (1.96) would cover ~89% with 4 df
    assert 0 < float(np.median(widths)) < 0.2


def test_two_points_fit_with_an_unbounded_interval_and_bad_input_is_refused() -> None:
    fit = studies.fit_exponent([10, 20], [1.0, 4.0])
    assert fit.exponent == pytest.approx(2.0)
    assert fit.ci_low == -math.inf
    assert fit.ci_high == math.inf
    for xs, ys, message in (([1], [1], "at least 2 points"), ([1, 2], [1, 0], "positive"),
                            ([3, 3], [1, 2], "two different x"), ([1, 2], [1], "2 x values but 1 y")):
        with pytest.raises(ValueError, match=message):
            studies.fit_exponent(xs, ys)


def test_compute_range_drops_the_launch_bound_low_end() -> None:
    # flat at 40 us until the work catches up, then linear
    times = [0.040, 0.041, 0.045, 0.160, 0.320, 0.640]
    assert studies.compute_range(SEQS, times) == [3, 4, 5]
    assert studies.compute_range(SEQS, [0.04, 0.05, 0.06, 0.07, 0.08, 0.1]) == [3, 4, 5]  # too few: the 3 largest
    assert studies.compute_range([4, 1, 2], [4.0, 1.0, 2.0], min_ratio=1.5, min_points=2) == [2, 0]  # in x order
    fit = studies.fit_exponent([SEQS[i] for i in (3, 4, 5)], [times[i] for i in (3, 4, 5)])
    assert fit.exponent == pytest.approx(1.0)


def test_crossover_interpolates_between_the_bracketing_points_on_log_axes() -> None:
    # linear ~ T, softmax ~ T^2 / 4096: equal at T = 4096 exactly
    softmax = [t * t / 4096 for t in SEQS]
    found = studies.crossover(SEQS, [float(t) for t in SEQS], softmax)
    assert found.status == "crossed"
    assert found.x == pytest.approx(4096)
    assert found.crossings == 1
    # equal nowhere on the grid: a ratio 2 at 2048 and 0.5 at 4096 meets 1 at their geometric mean
    found = studies.crossover([2048, 4096], [2.0, 0.5], [1.0, 1.0])
    assert found.x == pytest.approx(math.sqrt(2048 * 4096))


def test_crossover_beyond_below_and_without_data() -> None:
    assert studies.crossover(SEQS, [2.0] * 6, [1.0] * 6).status == "beyond the sweep"
    assert studies.crossover(SEQS, [0.5] * 6, [1.0] * 6).status == "below the sweep"
    assert studies.crossover(SEQS, [0.5, 0.5, 0.5, 0.5, 0.5, 2.0], [1.0] * 6).status == "beyond the sweep"
    assert studies.crossover([512], [1.0], [2.0]).status == "no data"
    noisy = studies.crossover(SEQS, [2, 0.9, 1.1, 0.8, 0.7, 0.6], [1.0] * 6)
    assert noisy.status == "crossed"
    assert noisy.crossings == 3
    assert noisy.x is not None
    assert 2048 < noisy.x < 4096  # the last crossing


def test_analytic_crossover_of_recurrent_linear_attention_matches_the_hand_solution() -> None:
    # causal softmax fwd: 4 d T(T+1)/2 = 256 T(T+1) per head at d=128; recurrent LA: 4 K V T = 65536 T.
    # Equal where T + 1 = 256: T* = 255 exactly.
    def softmax(t: int) -> float:
        return costs.softmax_attention(batch=4, heads=16, seq=t, head_dim=128, dtype="bf16", causal=True).flops

    def linear(t: int) -> float:
        return costs_linear.linear_attention(batch=4, heads=16, seq=t, key_dim=128, value_dim=128, dtype="bf16",
                                             form="recurrent").flops

    assert studies.analytic_crossover(linear, softmax) == 255
    assert linear(255) == softmax(255)
    assert linear(254) > softmax(254)


def test_analytic_crossover_of_chunked_linear_attention() -> None:
    # chunk form, C=64: 2(K+V) sum c^2 + 4KVT; at T=383 (5 chunks of 64 and one of 63) linear is
    # 37,618,176 FLOPs per head against softmax's 256*383*384 = 37,650,432; at T=382, 37,488,640
    # against 37,454,336
    assert costs_linear.linear_attention_flops_per_head(383, 128, 128, "chunk") == 37_618_176
    assert costs_linear.linear_attention_flops_per_head(382, 128, 128, "chunk") == 37_488_640

    def softmax(t: int) -> float:
        return 256.0 * t * (t + 1)

    assert studies.analytic_crossover(lambda t: costs_linear.linear_attention_flops_per_head(t, 128, 128, "chunk"),
                                      softmax) == 383


def test_analytic_crossover_edges() -> None:
    assert studies.analytic_crossover(lambda t: 10.0, lambda t: 1.0, hi=1000) is None  # never
    assert studies.analytic_crossover(lambda t: 1.0, lambda t: 10.0, lo=7) == 7  # from the start


@pytest.mark.parametrize(("hidden", "heads", "head_dim"), [(512, 8, 64), (768, 12, 64), (1024, 8, 128)])
def test_layer_models_cross_where_the_formula_says(hidden: int, heads: int, head_dim: int) -> None:
    # recurrent GDN core: 2 D (T+1) = 8 D^2 + 6 D d_v + 4 D H (the a, b projections the formula leaves
    # out), so T* = 4D + 3 d_v + 2H - 1
    d_v = 2 * head_dim

    def gdn(t: int) -> float:
        return costs_layers.gdn_layer(batch=32, seq=t, hidden=hidden, heads=heads, head_dim=head_dim, dtype="bf16",
                                      form="recurrent").flops

    def attention(t: int) -> float:
        return costs_layers.attention_layer(batch=32, seq=t, hidden=hidden, heads=heads, head_dim=head_dim,
                                            dtype="bf16").flops

    formula = costs_layers.layer_crossover_formula(hidden, d_v)
    assert formula == 4 * hidden + 3 * d_v
    assert studies.analytic_crossover(gdn, attention) == formula + 2 * heads - 1


def test_layer_costs_count_projections_and_cores() -> None:
    tokens, d = 32 * 1024, 512
    attn = costs_layers.attention_layer(batch=32, seq=1024, hidden=d, heads=8, head_dim=64, dtype="bf16")
    core = costs.softmax_attention(batch=32, heads=8, seq=1024, head_dim=64, dtype="bf16", causal=True)
    assert attn.flops == pytest.approx(8 * tokens * d * d + core.flops)
    both = costs_layers.attention_layer(batch=32, seq=1024, hidden=d, heads=8, head_dim=64, dtype="bf16",
                                        backward=True)
    core_both = costs.softmax_attention(batch=32, heads=8, seq=1024, head_dim=64, dtype="bf16", causal=True,
                                        backward=True)
    assert both.flops == pytest.approx(3 * 8 * tokens * d * d + core_both.flops)
    gdn = costs_layers.gdn_layer(batch=32, seq=1024, hidden=d, heads=8, head_dim=64, dtype="bf16")
    gdn_core = costs_linear.gated_delta_rule(batch=32, heads=8, seq=1024, key_dim=64, value_dim=128, dtype="bf16")
    assert gdn.flops == pytest.approx(2 * tokens * d * (d + d + 2 * d + 2 * d + 8 + 8 + 2 * d) + gdn_core.flops)
    assert gdn.bytes > gdn_core.bytes + 7 * d * d * 2  # weights, activations between kernels


def test_a_layer_backward_refused_by_fla_skips_and_any_other_error_fails() -> None:
    from pytest_attnperf.families.layers import kernels as layers

    def refused() -> None:
        raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results for gated "
                           "chunk_bwd_dqkwg (see #640). Please upgrade Triton to >= 3.7.1")

    def broken() -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    calls = []
    layers.first_backward("gdn", lambda: calls.append(1))
    assert calls == [1]
    with pytest.raises(pytest.skip.Exception, match=r"gdn layer's backward is refused on this machine: "
                                                    r"RuntimeError: Triton >= 3\.4\.0 and < 3\.7\.1 on Hopper"):
        layers.first_backward("gdn", refused)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        layers.first_backward("gdn", broken)
