"""No two timed calls of a case read the same contents, so a cache keyed on them buys no speed.

Before each timed call, outside the clock's reads, a draw's ``v`` (with its state and output
gradient) has its value columns negated by a pattern no call of the case has read
(``families.draws.Timed.vary``), and the last timed call's own result is checked on the contents
it read (``Replays.check_last``). Timed on a fake clock that only a kernel's work advances (487 us
for the work, 25 us for an answer found in a cache), a cache keyed on the inputs' bytes records
what its honest twin records, every sample; a cache keyed on part of the inputs (``q`` alone, two
sampled values of ``v``) or on their addresses returns an answer to other contents and fails as
the timed computation differing from the checked one. The same holds on cold graphs (the kit's
fake CUDA, whose replays run the captured Python again), where a sample is one call and nothing
of the varying. The accounting is exact: an honest kernel passes forward and backward, with
grouped heads, and a linear decode step with its state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import kit
import pytest
import torch
import torch.nn.functional as F

from pytest_attnperf.families.draws import Timed
from pytest_attnperf.families.linear import decode as linear_decode
from pytest_attnperf.families.linear.decode import LinearDecodeCase
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.kernels import SoftmaxCase
from pytest_attnperf.measure.timing import CudaTimer, HostTimer, SamplingPlan
from pytest_attnperf.measure.verify import TimedDiffers

CPU = torch.device("cpu")
CASE = SoftmaxCase("cpu-b2-h4-t64-d16-causal-fp32", 2, 4, 64, 16, "fp32", True, gpu=False)
GQA = SoftmaxCase("cpu-b2-h4kv2-t32-d16-fp32", 2, 4, 32, 16, "fp32", False, kv_heads=2, gpu=False)
WORK_NS, HIT_NS = 487_000, 25_000
PLAN = SamplingPlan(min_samples=24, max_samples=24, budget_s=60.0, warmup_calls=2)  # 24 samples, whatever the load
LAST = r"the last timed call as it returned, on timed draw \d: the checked inputs with [a-z, ]*value columns"


class Clock:
    """A host clock in ns that only the kernels below advance."""

    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def sdpa(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
    if k.shape[1] != q.shape[1]:  # grouped heads
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


class Honest:
    """Does the work on every call: ``WORK_NS`` on the clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def __call__(self, q: Any, k: Any, v: Any, **opts: Any) -> Any:
        self.clock.ns += WORK_NS
        return sdpa(q, k, v, **opts)


class Cached(Honest):
    """Its honest twin, but an answer found under ``key(q, k, v)`` is returned for ``HIT_NS``."""

    def __init__(self, clock: Clock, key: Callable[[Any, Any, Any], Any]) -> None:
        super().__init__(clock)
        self.key, self.kept, self.hits = key, dict[Any, Any](), 0

    def __call__(self, q: Any, k: Any, v: Any, **opts: Any) -> Any:
        key = self.key(q, k, v)
        if key in self.kept:
            self.hits += 1
            self.clock.ns += HIT_NS
            return self.kept[key].clone()
        out = super().__call__(q, k, v, **opts)
        self.kept[key] = out.detach().clone()
        return out


def by_bytes(q: Any, k: Any, v: Any) -> str:
    digest = hashlib.sha1()
    for x in (q, k, v):
        digest.update(x.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def by_q(q: Any, k: Any, v: Any) -> str:
    return hashlib.sha1(q.detach().contiguous().numpy().tobytes()).hexdigest()


def by_two_values(q: Any, k: Any, v: Any) -> tuple[float, ...]:
    return tuple(v.detach().flatten()[:2].tolist())


def by_address(q: Any, k: Any, v: Any) -> tuple[int, ...]:
    return (q.data_ptr(), k.data_ptr(), v.data_ptr())


def timed(fn: Any, case: SoftmaxCase = CASE, direction: str = "fwd", gpu: kit.FakeGpu | None = None) -> Timed:
    """``fn`` checked on ``case`` as the suite checks it: the callable the suite times (on the fake
    GPU, each call that does the work costs one of its kernel calls)."""

    def kernel(*args: Any, **opts: Any) -> Any:
        return fn(*args, **opts)

    checked: Timed = softmax.check_case(Kernel("softmax", "mine", kernel), case, direction, CPU).call
    return checked


# -- the host timer --------------------------------------------------------------------------


def test_a_cache_keyed_on_the_inputs_bytes_records_what_its_honest_twin_records() -> None:
    honest_clock, cached_clock = Clock(), Clock()
    honest = HostTimer(clock_ns=honest_clock).measure(timed(Honest(honest_clock)), PLAN)
    cache = Cached(cached_clock, by_bytes)
    cached = HostTimer(clock_ns=cached_clock).measure(timed(cache), PLAN)
    assert honest.samples_ms == cached.samples_ms == (WORK_NS / 1e6,) * PLAN.max_samples  # no timed call hit
    assert cached.median_ms == honest.median_ms
    assert (cached.verified, cached.bitwise) == (2, True)


@pytest.mark.parametrize(("key", "hits"), [(by_q, "q alone"), (by_two_values, "two values of v"),
                                           (by_address, "the inputs' addresses")])
def test_a_cache_keyed_on_part_of_the_inputs_or_their_addresses_fails_on_its_last_timed_call(
    key: Callable[[Any, Any, Any], Any], hits: str,
) -> None:
    clock = Clock()
    cache = Cached(clock, key)
    with pytest.raises(TimedDiffers, match=r"the timed computation differs from the checked one: a host-timed call, "
                                           + LAST + r"[\d, .]+ of 16 negated \(one timed call's\): mine out"):
        HostTimer(clock_ns=clock).measure(timed(cache), PLAN)
    assert cache.hits, f"a cache keyed on {hits} found nothing: the test proves nothing"


@pytest.mark.parametrize(("case", "direction"), [(CASE, "fwdbwd"), (GQA, "fwd"), (GQA, "fwdbwd")],
                         ids=["causal-fwdbwd", "gqa-fwd", "gqa-fwdbwd"])
def test_the_varied_contents_are_accounted_for_exactly(case: SoftmaxCase, direction: str) -> None:
    """Every timed call reads contents of its own (the column sums of ``v`` the kernel sees differ
    from call to call), and the honest kernel's last timed result, its output and gradients,
    matches the draw's reference with those value columns negated."""
    seen: list[tuple[float, ...]] = []

    def honest(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        seen.append(tuple(v.detach()[..., c].sum().item() for c in range(v.shape[-1])))
        return sdpa(q, k, v, **opts)

    m = HostTimer().measure(timed(honest, case, direction), PLAN)
    assert (m.verified, m.bitwise) == (2, True)
    assert len(set(seen)) >= PLAN.max_samples  # unvaried: two draws, their rewrites and the checked call

def test_a_decode_step_from_a_state_varies_the_state_with_v_and_is_accounted_for() -> None:
    reg = KernelRegistry()
    linear_decode.register(reg)
    kernel = next(k for k in reg.family("gla_decode") if k.name == "torch-recurrent")
    case = LinearDecodeCase("cpu-b2-h3-t3-d8-fp32", 2, 3, 3, 8, 6, "fp32", gpu=False)
    draws: Timed = linear_decode.check_case("gla_decode", kernel, case, "fwd", CPU).call
    call, vary = draws.draw(1), draws.vary(1)
    states = set()
    for _ in range(6):
        vary()
        states.add(tuple(call.inputs[-1].sum(dim=(0, 1, 2)).tolist()))  # type: ignore[attr-defined]
        assert draws.verify(1, call()) <= 1  # output and new state, on the contents just written
    assert len(states) == 6
    assert "value columns" in draws.describe(1)


def test_a_kernel_that_cannot_vary_is_refused_nothing_and_two_columns_come_round() -> None:
    """One value column: nothing to vary (a sign of all of ``v`` is a draw's own, or draw 0's); two:
    the two patterns that are neither, in turn."""
    for width, patterns in ((1, 0), (2, 2)):
        shape = (1, 1, 4, width)
        zeros = torch.zeros(shape)
        draws = Timed(lambda: None, run_on=lambda xs, go: xs[0], inputs=(torch.randn(shape),), input_names=("v",),
                      grad_out=None, names=("out",), reference=(zeros,), yardstick=(zeros,), check=lambda *a: 0.0,
                      seed_text="c", head_axis=1, kernel="k")
        call, vary = draws.draw(1), draws.vary(1)
        seen = set()
        for _ in range(6):
            vary()
            seen.add(tuple(call.inputs[0].flatten().tolist()))  # type: ignore[attr-defined]
        assert len(seen) == max(patterns, 1)


# -- cold graphs on the kit's fake CUDA ------------------------------------------------------


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> kit.FakeGpu:
    """The kit's fake device, its graphs captured by timing's own ``_capture``."""
    return kit.fake_cuda(monkeypatch, real_capture=True)


class OnGpu:
    """``inner`` (an ``Honest`` or a ``Cached``) whose work costs one fake kernel call; a hit costs nothing."""

    def __init__(self, gpu: kit.FakeGpu, inner: Honest) -> None:
        self.gpu, self.inner = gpu, inner

    def __call__(self, *args: Any, **opts: Any) -> Any:
        before = self.inner.clock.ns
        out = self.inner(*args, **opts)
        if self.inner.clock.ns - before == WORK_NS:
            self.gpu.call()
        return out


def test_on_cold_graphs_a_cache_keyed_on_the_bytes_times_as_its_honest_twin_and_nothing_else(
    gpu: kit.FakeGpu,
) -> None:
    honest = CudaTimer(kit.H200).measure(timed(OnGpu(gpu, Honest(Clock()))), PLAN)
    cached = CudaTimer(kit.H200).measure(timed(OnGpu(gpu, Cached(Clock(), by_bytes))), PLAN)
    assert honest.clock == cached.clock == "cuda-graph-nodes"
    # a sample is one call's work: the varying ran before the flush and the first event
    one_call = pytest.approx([gpu.ms_per_call] * PLAN.max_samples, rel=1e-9)  # the fake clock sums floats
    assert list(honest.samples_ms) == one_call
    assert list(cached.samples_ms) == one_call


def test_on_cold_graphs_a_cache_keyed_on_q_fails_on_the_last_replay(gpu: kit.FakeGpu) -> None:
    cache = Cached(Clock(), by_q)
    with pytest.raises(TimedDiffers, match=r"differs from the checked one: cold graph 8 of 8, " + LAST):
        CudaTimer(kit.H200).measure(timed(OnGpu(gpu, cache)), PLAN)
    assert cache.hits
