"""Decode: softmax attention over a KV cache (lower-right causal, GQA, window) and linear
attention's recurrent steps from a state, on the CPU: the references against token-by-token fp64
evaluations, the built-in kernels through the family's rule, wrong kernels caught, the cost
models' arithmetic, the report's table."""

from __future__ import annotations

from typing import Any

import kit
import pytest
import torch
from zoo import decode as zoo_decode

from pytest_attnperf import costs
from pytest_attnperf.families.checks import CheckFailed
from pytest_attnperf.families.linear import costs as linear_costs
from pytest_attnperf.families.linear import decode as linear_decode
from pytest_attnperf.families.linear import kernels as linear_kernels
from pytest_attnperf.families.linear import reference as linear_ref
from pytest_attnperf.families.linear.decode import LinearDecodeCase
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.decode import CPU, decode_case
from pytest_attnperf.families.softmax.reference import attention_mask, softmax_attention
from pytest_attnperf.markers import pin_backend
from pytest_attnperf.report import decode as report_decode

CPU_DEVICE = torch.device("cpu")

# -- the softmax reference against a token-by-token evaluation ---------------------------------


def token_by_token(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: int | None) -> Any:
    """Each query alone in fp64: query i sits at cache position Tk - Tq + i and, causal, sees the keys
    at or before it (the last ``window`` of them); query head h reads K/V head h // group."""
    batch, heads, tq, _ = q.shape
    kv_heads, tk = k.shape[1], k.shape[2]
    out = torch.zeros(batch, heads, tq, v.shape[3], dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            g = h // (heads // kv_heads)
            for i in range(tq):
                position = tk - tq + i
                first = max(0, position - window + 1) if causal and window else 0
                last = position if causal else tk - 1
                keys = range(first, last + 1)
                scores = torch.tensor([float(q[b, h, i].double() @ k[b, g, j].double()) * scale for j in keys],
                                      dtype=torch.float64)
                weights = torch.softmax(scores, dim=0)
                out[b, h, i] = sum(w * v[b, g, j].double() for w, j in zip(weights, keys, strict=True))
    return out


SHAPES = [  # batch, heads, kv_heads, queries, keys, causal, window
    pytest.param(2, 4, 4, 1, 37, True, None, id="one-token"),
    pytest.param(1, 6, 2, 5, 19, True, None, id="gqa-chunk"),
    pytest.param(1, 4, 1, 16, 40, True, 7, id="mqa-chunk-window"),
    pytest.param(1, 2, 2, 3, 11, True, 1, id="window-of-one"),
    pytest.param(1, 2, 2, 9, 9, True, None, id="equal-lengths"),
    pytest.param(2, 4, 2, 3, 13, False, None, id="non-causal"),
]


@pytest.mark.parametrize(("batch", "heads", "kv_heads", "tq", "tk", "causal", "window"), SHAPES)
def test_the_reference_is_attention_evaluated_token_by_token(batch: int, heads: int, kv_heads: int, tq: int, tk: int,
                                                             causal: bool, window: int | None) -> None:
    """Lower-right causal, GQA and window: the fp64 reference equals each query's own softmax over
    the keys the rule gives it."""
    gen = torch.Generator().manual_seed(tq * 100 + tk)
    q = torch.randn(batch, heads, tq, 8, generator=gen)
    k, v = torch.randn(batch, kv_heads, tk, 8, generator=gen), torch.randn(batch, kv_heads, tk, 8, generator=gen)
    got = softmax_attention(q, k, v, causal=causal, scale=0.3, window=window)
    assert torch.allclose(got, token_by_token(q, k, v, causal=causal, scale=0.3, window=window), atol=1e-12)


def test_the_mask_is_aligned_to_the_end_of_the_cache() -> None:
    """Three queries over five keys: the last query sees every key, the first all but the last two."""
    mask = attention_mask(3, True, None, "cpu", 5).int().tolist()
    assert mask == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    windowed = attention_mask(3, True, 2, "cpu", 5).int().tolist()
    assert windowed == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    assert attention_mask(4, True, None, "cpu").int().tolist() == torch.ones(4, 4).tril().int().tolist()


def test_fewer_keys_than_queries_leave_the_top_rows_empty() -> None:
    """Lower-right causal with Tk < Tq (the q-gt-k axis): the first Tq - Tk queries see no key."""
    mask = attention_mask(5, True, None, "cpu", 3).int().tolist()
    assert mask == [[0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_a_table_with_fewer_keys_than_queries_carries_the_q_gt_k_axis() -> None:
    """A row whose keys are fewer than its queries is taken at collection; it carries the q-gt-k
    axis, which a kernel that does not declare it refuses."""
    from pytest_attnperf.families.family import common_refusal
    from pytest_attnperf.families.parametrize import check_cases
    from pytest_attnperf.families.registry import Kernel

    short = softmax.SoftmaxCase("b1-h4-t8-d16-causal-fp32", 1, 4, 8, 16, "fp32", True, gpu=False, kv_seq=4)
    check_cases("mine", [short, *CPU])
    assert short.axes == ("q-gt-k",)
    mine = Kernel("softmax", "mine", softmax.naive)
    assert "does not declare the call axis q-gt-k" in str(common_refusal(mine, short, "fwd"))


def test_a_decode_case_names_its_cache_and_draws_a_longer_kv() -> None:
    """``kv_seq`` gives K and V their length; the queries keep ``seq``."""
    case = decode_case(2, 4, 96, heads=4, kv_heads=2, head_dim=16, dtype="fp32", gpu=False)
    assert case.id == "b2-h4-kv2-t4-cache96-d16-causal-fp32"
    assert case.decode
    p = softmax.prepare(case, "fwd", CPU_DEVICE)
    assert tuple(p.q.shape) == (2, 4, 4, 16)
    assert tuple(p.k.shape) == (2, 2, 96, 16)
    assert not decode_case(1, 8, 8, gpu=False).decode


# -- the family's kernels on decode cases -----------------------------------------------------


def registry() -> KernelRegistry:
    reg = KernelRegistry()
    softmax.register(reg)
    zoo_decode.register(reg)
    linear_decode.register(reg)
    return reg


def kernel(name: str, family: str = "softmax") -> Kernel:
    return next(k for k in registry().family(family) if k.name == name)


RIGHT = ["naive", "sdpa", "sdpa-repeat-kv", "zoo-ok-decode-split-kv", "zoo-bad-decode-reads-twice"]


@pytest.mark.parametrize("name", RIGHT)
@pytest.mark.parametrize("case", [c for c in CPU if not c.window], ids=lambda c: c.id)
def test_right_kernels_pass_the_decode_cases(name: str, case: Any) -> None:
    """The built-in kernels (and the zoo's right ones) meet the family's rule on the CPU table."""
    k = kernel(name)
    if k.supports(case):
        pytest.skip(str(k.supports(case)))
    ratios = softmax.check_case(k, case, "fwd", CPU_DEVICE).ratios
    assert 0 <= ratios["out"] <= 1


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_sdpa_backends_take_the_lower_right_mask(backend: str) -> None:
    """Pinned to a backend the CPU has, SDPA with ``causal_lower_right`` meets the rule (GQA included)."""
    case = CPU[1]  # 4 queries over 128 keys, 8 heads over 2
    with pin_backend(backend):
        softmax.check_case(kernel("sdpa"), case, "fwd", CPU_DEVICE)


def test_the_dense_window_kernel_passes_a_windowed_chunk() -> None:
    """Sixteen queries over 64 keys, window 24: the dense-mask kernel is right."""
    softmax.check_case(kernel("sdpa-dense-window"), CPU[2], "fwd", CPU_DEVICE)


@pytest.mark.parametrize("case", [c for c in CPU if c.causal and not c.window], ids=lambda c: c.id)
def test_an_upper_left_mask_fails(case: Any) -> None:
    """SDPA's ``is_causal`` with fewer queries than keys sees the start of the cache: caught."""
    with pytest.raises(CheckFailed):
        softmax.check_case(kernel("zoo-bad-decode-upper-left"), case, "fwd", CPU_DEVICE)


def test_a_kernel_that_keeps_its_first_answer_fails_a_timed_draw() -> None:
    """The timed draws (batch and heads permuted, v negated) stay checkable on decode cases: the
    right kernel's draw passes, a kernel replaying its first answer fails."""
    case = CPU[0]
    timed = softmax.check_case(kernel("naive"), case, "fwd", CPU_DEVICE).call
    assert timed.verify(1, timed.draw(1)()) <= 1
    with pytest.raises(CheckFailed):
        timed.verify(1, timed())


# -- the softmax cost model -----------------------------------------------------------------


def test_one_token_reads_the_whole_cache_for_four_flops_a_key() -> None:
    """B=32, 32 heads over 8, one token over 32K keys of 128: 4 B H Tk d FLOPs, and the bytes are the
    cache (K and V) with the query and the output."""
    cost = costs.softmax_attention(batch=32, heads=32, kv_heads=8, seq=1, head_dim=128, dtype="bf16", causal=True,
                                   kv_seq=32768)
    assert cost.flops == 4 * 32 * 32 * 32768 * 128
    assert cost.bytes == 32 * 8 * 32768 * 128 * 2 * 2 + 2 * 32 * 32 * 1 * 128 * 2
    assert cost.intensity_flop_per_byte < 8  # far below any ridge point: bandwidth bound


@pytest.mark.parametrize(("tq", "tk", "window"), [(1, 100, None), (16, 100, None), (16, 100, 10), (5, 5, 3),
                                                  (4, 50, 60)])
def test_pairs_are_what_the_mask_leaves_visible(tq: int, tk: int, window: int | None) -> None:
    """The cost model counts exactly the reference's visible pairs, and reads only the keys some query sees."""
    mask = attention_mask(tq, True, window, "cpu", tk)
    assert costs.visible_pairs(tq, True, window, tk) == int(mask.sum())
    assert costs.keys_read(tq, True, window, tk) == int(mask.any(dim=0).sum())


def test_a_window_reads_only_its_keys() -> None:
    """Mistral's 4096 window over a 32K cache: the cache read is 4096 keys, not 32K."""
    full = costs.softmax_attention(batch=1, heads=32, kv_heads=8, seq=1, head_dim=128, dtype="bf16", causal=True,
                                   kv_seq=32768)
    windowed = costs.softmax_attention(batch=1, heads=32, kv_heads=8, seq=1, head_dim=128, dtype="bf16", causal=True,
                                       kv_seq=32768, window=4096)
    kv = 8 * 128 * 2 * 2
    assert full.bytes - windowed.bytes == (32768 - 4096) * kv
    assert windowed.flops == 4 * 32 * 4096 * 128


# -- linear decode --------------------------------------------------------------------------

LINEAR_CASE = LinearDecodeCase("cpu-b2-h3-t3-d8-fp32", 2, 3, 3, 8, 6, "fp32", gpu=False)


@pytest.mark.parametrize("family", linear_decode.FAMILIES)
def test_a_step_from_a_state_continues_the_sequence(family: str) -> None:
    """Steps from the state a history left equal the last outputs of the whole sequence, and the new
    state its final state: the decode reference is the recurrence, token by token."""
    base = linear_decode.BASE[family]
    whole = LinearDecodeCase("cpu-b2-h3-t7-d8-fp32", 2, 3, 7, 8, 6, "fp32", gpu=False).whole()
    inputs = [x.detach().double() for x in linear_kernels._inputs(base, whole, CPU_DEVICE, False)]
    fn = {"linear_attn": linear_ref.linear_attention, "gla": linear_ref.gla, "simple_gla": linear_ref.simple_gla,
          "gdn": linear_ref.gated_delta_rule}[base]
    out, final = fn(*inputs, scale=0.4, final_state=True)  # type: ignore[operator]
    history = [x[:, :4] for x in inputs]
    _, state = fn(*history, scale=0.4, final_state=True)  # type: ignore[operator]
    steps, new = fn(*[x[:, 4:] for x in inputs], scale=0.4, initial_state=state, final_state=True)  # type: ignore[operator]
    assert torch.allclose(steps, out[:, 4:], atol=1e-12)
    assert torch.allclose(new, final, atol=1e-12)


TAKEN = [pytest.param(family, case, id=f"{case.id}-{family}") for case in linear_decode.CPU
         for family in linear_decode.FAMILIES if case.refusal(family) is None]  # grouped values: gdn_decode's only


@pytest.mark.parametrize(("family", "case"), TAKEN)
def test_the_recurrent_kernel_passes_output_and_state(family: str, case: LinearDecodeCase) -> None:
    """The fp32 recurrence as a kernel meets the rule on both tensors, and its timed draws (v and
    the state negated, heads permuted on each tensor's own axis) verify."""
    checked = linear_decode.check_case(family, kernel("torch-recurrent", family), case, "fwd", CPU_DEVICE)
    assert set(checked.ratios) == {"out", "ht"}
    timed = checked.call
    for index in (1, 2):
        assert timed.verify(index, timed.draw(index)()) <= 1


def _wrong(family: str, how: str) -> Kernel:
    right = linear_decode.torch_recurrent(family)

    def fn(*inputs: Any, scale: float, initial_state: Any) -> Any:
        if how == "zero-state":
            return right(*inputs, scale=scale, initial_state=torch.zeros_like(initial_state))
        out, new = right(*inputs, scale=scale, initial_state=initial_state)
        return out, initial_state.clone()  # the state not advanced

    return Kernel(family, f"wrong-{how}", fn, backward=False, form="recurrent")


@pytest.mark.parametrize("family", linear_decode.FAMILIES)
@pytest.mark.parametrize(("how", "tensor"), [("zero-state", "out"), ("stale-state", "ht")])
def test_a_step_that_drops_the_state_fails(family: str, how: str, tensor: str) -> None:
    """Starting from zeros fails on the output; returning the old state fails on the new state."""
    with pytest.raises(CheckFailed, match=f"wrong-{how} {tensor}"):
        linear_decode.check_case(family, _wrong(family, how), LINEAR_CASE, "fwd", CPU_DEVICE)


def test_the_step_cost_is_the_state_read_and_written() -> None:
    """GDN, B=32 H=16 128x128, one token: 6KV FLOPs a head; the bytes are the fp32 state twice plus
    the token's q, k, v, o (bf16) and its gate and beta."""
    case = LinearDecodeCase("b32-h16-t1-d128-bf16", 32, 16, 1, 128, 128, "bf16")
    cost = linear_decode.cost("gdn_decode", case)
    state = 32 * 16 * 128 * 128 * 4
    token = 32 * 16 * (128 * 2 + 128 * 2) * 2 + 32 * 16 * (4 + 2)
    assert cost.flops == 32 * 16 * 6 * 128 * 128
    assert cost.bytes == 2 * state + token
    assert cost.bytes == linear_costs.gated_delta_rule(batch=32, heads=16, seq=1, key_dim=128, value_dim=128,
                                                       dtype="bf16", form="recurrent", initial_state=True,
                                                       final_state=True).bytes


# -- the report's decode table --------------------------------------------------------------


def _row(kernel: str, kv_seq: int | None, ms: float, frac: float, family: str = "softmax") -> dict[str, Any]:
    params = {"kernel": kernel, "family": family, "batch": 1, "heads": 32, "kv_heads": 8, "seq": 1, "kv_seq": kv_seq,
              "window": None, "dtype": "bf16", "case": "c", "bytes": 1e6}
    return {"nodeid": f"t[{kernel}-{kv_seq}]", "params": params, "median_ms": ms, "roofline_frac": frac,
            "gb_per_s": 1.0, "status": "new"}


def test_the_report_tabulates_time_and_bandwidth_against_the_cache() -> None:
    """One row per kernel and shape, one column per cache length; the recurrent steps apart; a run
    without decode cases has no section."""
    cases = [_row("sdpa-flash", 32768, 0.0412, 0.61), _row("sdpa-flash", 1024, 0.0081, 0.093),
             _row("naive", 1024, 0.05, 0.01), _row("fla-fused-recurrent", None, 0.012, 0.4, family="gdn_decode"),
             {"nodeid": "other", "params": {"kernel": "naive", "seq": 128}, "median_ms": 1.0}]
    entries = report_decode.rows(cases)
    assert len(entries) == 4
    text = "\n".join(report_decode.markdown(entries))
    assert "| kernel | B | Tq | heads | window | dtype | cache 1K | cache 32K |" in text
    assert "| sdpa-flash | 1 | 1 | 32/8 | - | bf16 | 8.1 us, 9% | 41.2 us, 61% |" in text
    assert "| naive | 1 | 1 | 32/8 | - | bf16 | 50.0 us, 1% |  |" in text
    assert "| gdn_decode | fla-fused-recurrent | 1 | 1 | 32 | bf16 | 12.0 us | 1 | 40 |" in text
    assert report_decode.markdown(report_decode.rows(cases[-1:])) == []


# -- the floors tool ------------------------------------------------------------------------


def test_suggested_floors_sit_below_what_was_measured_on_cases_beyond_the_l2() -> None:
    """70% of the measured fraction, rounded down; cases moving less than the threshold and failed
    cases get none; a slowed kernel is held to its model's floor, not its own."""
    tool = kit.tool("decode_floors")
    entries = [{"kernel": "sdpa-flash", "case": "big", "family": "softmax", "bandwidth_frac": 0.619, "bytes": 2e9,
                "status": "new", "median_ms": 1.0},
               {"kernel": "sdpa-flash", "case": "small", "family": "softmax", "bandwidth_frac": 0.2, "bytes": 1e6,
                "status": "new", "median_ms": 0.01},
               {"kernel": "sdpa-math", "case": "big", "family": "softmax", "bandwidth_frac": 0.5, "bytes": 2e9,
                "status": "failed", "median_ms": 2.0},
               {"kernel": "zoo-bad-decode-reads-twice", "case": "big", "family": "softmax", "bandwidth_frac": 0.31,
                "bytes": 2e9, "status": "new", "median_ms": 2.0}]
    floors = tool.suggested(entries, 0.7, 64 * 2**20)
    assert floors == {"sdpa-flash": {"big": 0.43}, "zoo-bad-decode-reads-twice": {"big": 0.21}}
    data = {"floors": floors, "held_to": {"zoo-bad-decode-reads-twice": "sdpa-flash"}}
    assert tool.floor_for(data, "zoo-bad-decode-reads-twice", "big") == 0.43
    assert tool.floor_for(data, "sdpa-flash", "small") is None
    assert tool.builtin_lines(entries, floors, "h200") == [
        '    ("softmax", "sdpa-flash", "big", "fwd"): {"h200": {"roofline": 0.43}},']


@pytest.mark.parametrize(("memory", "refused"), [(85.0, True), (150.0, False), (None, False)])
def test_sdpa_math_refuses_a_case_that_does_not_fit_the_gpu(monkeypatch: pytest.MonkeyPatch, memory: float | None,
                                                             refused: bool) -> None:
    """The decode table's B=32 over 32K keys: SDPA's math backend (fp32, K and V expanded to the
    32 query heads, 34.5 GB) ran out of memory on an 85 GB H100 and took 60 GB on an H200. It is
    refused, naming the estimate and the card's memory, where its estimate passes 90% of the GPU;
    the other backends and the smaller rows are not; a CPU case never reads the GPU."""
    monkeypatch.setattr(softmax, "memory_gb", lambda gpu: memory if gpu else pytest.fail("read the GPU's memory"))
    registry = KernelRegistry()
    softmax.register(registry)
    named = {k.name: k for k in registry.family("softmax")}
    math, flash = named["sdpa-math"], named["sdpa-flash"]
    big, small = decode_case(32, 1, 32768), decode_case(32, 1, 8192)
    assert 85 < softmax.math_gb(big) < 0.9 * 150
    why = math.supports(big)
    assert (why is not None) == refused
    if refused:
        assert why == ("does not fit this GPU: SDPA's math backend would take about 91 GB here (fp32, K and V "
                       "expanded to the 32 query heads), more than 90% of its 85 GB")
    assert math.supports(small) is None
    assert flash.supports(big) is None
    assert math.supports(decode_case(1, 1, 32768, window=4096)) == ("plain SDPA takes no window "
                                                                      "(the windowed kernels cover it)")
    assert math.supports(CPU[0]) is None
