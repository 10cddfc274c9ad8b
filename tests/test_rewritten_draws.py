"""A timed draw is checked on its inputs rewritten in place, with the collector off as it was timed.

Two kernels answer their timed calls without doing the work and used to pass their checks: one
keeps its answer by its inputs' addresses (a timed draw reuses its tensors for every timed call,
and so did the check), one returns zeros, computing nothing, while ``gc.isenabled()`` is False
(the timed calls run with the collector off; the check ran with it on). Zeros, not
``torch.empty_like``: memory never written may hold an earlier call's right answer, which would
leave the catching check to chance (``tests/zoo/integrity.py``'s lazy output stands for that). Here both fail as "the
timed computation differs from the checked one", on the host timer, on cold graphs (the kit's
fake CUDA, whose replays run the captured Python again) and through the hook on the softmax
suite's CPU case; a graph that captured an answer rather than the work fails too. An honest
kernel, and one with a legitimate cache of something its inputs' values do not change (a causal
mask by sequence length), still pass.
"""

from __future__ import annotations

import gc
import shutil
from typing import Any

import kit
import pytest
import torch
import torch.nn.functional as F

from pytest_attnperf.families.draws import Timed
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.kernels import SoftmaxCase
from pytest_attnperf.measure.timing import CudaTimer, HostTimer, SamplingPlan
from pytest_attnperf.measure.verify import TimedDiffers

CPU = torch.device("cpu")
CASE = SoftmaxCase("cpu-b2-h4-t64-d16-causal-fp32", 2, 4, 64, 16, "fp32", True, gpu=False)
LONE = SoftmaxCase("cpu-b1-h1-t64-d16-fp32", 1, 1, 64, 16, "fp32", False, gpu=False)  # nothing to permute
HOST_PLAN = SamplingPlan(min_samples=4, max_samples=8, budget_s=0.01, warmup_calls=1)
GRAPH_PLAN = SamplingPlan(min_samples=10, budget_s=0.05)
REWRITTEN = r", rewritten in place after the timed calls: mine out"
# caught first by the check of the last timed call's own result, on the contents that call read
LAST = (r", the last timed call as it returned, on timed draw \d: the checked inputs with [a-z, ]*value columns "
        r"[\d, .]+ of \d+ negated \(one timed call's\): mine out")


def sdpa(q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


class MemoByAddress:
    """Computes once per set of input addresses (and version counters, with ``versions``), then
    returns a copy of what it kept."""

    def __init__(self, versions: bool = False) -> None:
        self.versions = versions
        self.kept: dict[tuple[tuple[int, int], ...], Any] = {}

    def __call__(self, q: Any, k: Any, v: Any, **opts: Any) -> Any:
        key = tuple((x.data_ptr(), x._version if self.versions else 0) for x in (q, k, v))
        if key not in self.kept:
            self.kept[key] = sdpa(q, k, v, **opts)
        return self.kept[key].clone()


def watches_gc(q: Any, k: Any, v: Any, **opts: Any) -> Any:
    """Does no work while the collector is off, as it is in the timed calls."""
    return torch.zeros_like(q) if not gc.isenabled() else sdpa(q, k, v, **opts)


class KeepsTheCheckedAnswer:
    """Computes its first call (the checked one), then returns a copy of that answer for its shape."""

    def __init__(self) -> None:
        self.kept: Any = None

    def __call__(self, q: Any, k: Any, v: Any, **opts: Any) -> Any:
        if self.kept is None:
            self.kept = sdpa(q, k, v, **opts)
        return self.kept.clone()


class MaskByShape:
    """Naive attention with its causal mask cached by sequence length: nothing of the inputs' values."""

    def __init__(self) -> None:
        self.masks: dict[int, Any] = {}

    def __call__(self, q: Any, k: Any, v: Any, *, causal: bool, scale: float, window: Any = None) -> Any:
        t = q.shape[-2]
        if t not in self.masks:
            self.masks[t] = torch.ones(t, t, dtype=torch.bool).tril()
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        if causal:
            scores = scores.masked_fill(~self.masks[t], float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


class BakedInGraph:
    """Computes outside a graph's replay, keeping the answer by its inputs' addresses; a replay
    returns what was kept (a graph that captured a copy of an answer, not the work)."""

    def __init__(self, gpu: kit.FakeGpu) -> None:
        self.gpu = gpu
        self.kept: dict[tuple[int, ...], Any] = {}

    def __call__(self, q: Any, k: Any, v: Any, **opts: Any) -> Any:
        key = tuple(x.data_ptr() for x in (q, k, v))
        if not self.gpu.replaying:
            self.kept[key] = sdpa(q, k, v, **opts)
        return self.kept[key].clone()


class Seen:
    """``fn``, noting of each call its ``v``'s address and sum and whether the collector was on."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.calls: list[tuple[int, float, bool]] = []

    def __call__(self, q: Any, k: Any, v: Any, **opts: Any) -> Any:
        self.calls.append((v.data_ptr(), float(v.detach().sum()), gc.isenabled()))
        return self.fn(q, k, v, **opts)

    def checked_on_rewritten_data(self) -> None:
        """Every timed draw (every address after the checked call's) was also called on other
        data than its first call's, at the same address, and always with the collector off."""
        first: dict[int, float] = {}
        for address, total, _ in self.calls[1:]:
            first.setdefault(address, total)
        rewritten = [(address, on) for address, total, on in self.calls[1:] if total != first[address]]
        assert {address for address, _ in rewritten} == set(first)
        assert not any(on for _, on in rewritten)


def timed(fn: Any, case: SoftmaxCase = CASE, direction: str = "fwd", gpu: kit.FakeGpu | None = None) -> Timed:
    """``fn`` checked on ``case`` as the suite checks it: the callable the suite times (on the
    fake GPU, each call costs one of its kernel calls)."""

    def kernel(*args: Any, **opts: Any) -> Any:
        if gpu is not None:
            gpu.call()
        return fn(*args, **opts)

    checked: Timed = softmax.check_case(Kernel("softmax", "mine", kernel), case, direction, CPU).call
    return checked


# -- the host timer --------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [MemoByAddress(), MemoByAddress(versions=True), watches_gc],
                         ids=["memo-by-address", "memo-by-address-and-version", "watches-gc"])
def test_a_kernel_that_skips_its_timed_work_fails_on_the_host_naming_the_rewritten_draw(fn: Any) -> None:
    with pytest.raises(TimedDiffers, match=r"the timed computation differs from the checked one: a host-timed call"
                                           + LAST):
        HostTimer().measure(timed(fn), HOST_PLAN)


@pytest.mark.parametrize("direction", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("fn", [sdpa, MaskByShape()], ids=["honest", "caches-its-mask-by-shape"])
def test_a_kernel_that_does_its_work_passes_on_the_host_checked_on_rewritten_inputs(fn: Any, direction: str) -> None:
    seen = Seen(fn)
    m = HostTimer().measure(timed(seen, direction=direction), HOST_PLAN)
    assert (m.verified, m.bitwise) == (2, True)
    seen.checked_on_rewritten_data()


def test_where_nothing_can_be_permuted_an_address_memo_fails_on_the_rewritten_data() -> None:
    with pytest.raises(TimedDiffers, match=r"a host-timed call" + LAST):
        HostTimer().measure(timed(MemoByAddress(), LONE), HOST_PLAN)


def test_where_the_rewrite_is_the_checked_data_an_answer_kept_from_the_checked_call_fails_on_the_draws_own() -> None:
    """One batch entry and one head, forward: the rewritten draw holds the checked call's data,
    so the draw is checked on its own (``v`` negated) as well."""
    with pytest.raises(TimedDiffers, match=r"a host-timed call" + LAST):
        HostTimer().measure(timed(KeepsTheCheckedAnswer(), LONE), HOST_PLAN)


# -- cold graphs on the kit's fake CUDA ------------------------------------------------------


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> kit.FakeGpu:
    """The kit's fake device, its graphs captured by timing's own ``_capture``."""
    return kit.fake_cuda(monkeypatch, real_capture=True)


@pytest.mark.parametrize("fn", [MemoByAddress(), watches_gc], ids=["memo-by-address", "watches-gc"])
def test_a_kernel_that_skips_its_timed_work_fails_on_the_graph_path(gpu: kit.FakeGpu, fn: Any) -> None:
    with pytest.raises(TimedDiffers, match=r"differs from the checked one: .*, on timed draw 1: the checked inputs "
                                           r"with [a-z, ]*" + REWRITTEN):
        CudaTimer(kit.H200).measure(timed(fn, gpu=gpu), GRAPH_PLAN)


def test_a_graph_that_captured_an_answer_fails_once_its_inputs_are_rewritten(gpu: kit.FakeGpu) -> None:
    with pytest.raises(TimedDiffers, match=r"differs from the checked one: cold graph \d+ of \d+" + LAST):
        CudaTimer(kit.H200).measure(timed(BakedInGraph(gpu), gpu=gpu), GRAPH_PLAN)


@pytest.mark.parametrize("fn", [sdpa, MaskByShape()], ids=["honest", "caches-its-mask-by-shape"])
def test_a_kernel_that_does_its_work_passes_on_the_graph_path_checked_on_rewritten_inputs(
    gpu: kit.FakeGpu, fn: Any,
) -> None:
    seen = Seen(fn)
    m = CudaTimer(kit.H200).measure(timed(seen, gpu=gpu), GRAPH_PLAN)
    assert (m.verified, m.bitwise) == (m.graphs + 1, True)  # the eager calls' draw, then each graph's
    seen.checked_on_rewritten_data()


# -- the rewrite itself ----------------------------------------------------------------------


def test_a_rewrite_differs_from_the_draws_own_data_and_where_it_can_from_draw_0s() -> None:
    for case, permutes in ((CASE, True), (LONE, False)):
        draws = timed(sdpa, case)
        for index in range(1, 9):
            own, rewrite = draws.transform(index), draws.rewrite(index)
            assert (own.v_sign, rewrite.v_sign) == (-1, 1)
            assert rewrite.permutes() is permutes


def test_the_rewrite_is_in_place_unseen_by_version_counters_and_put_back() -> None:
    draws = timed(sdpa, LONE, "fwdbwd")
    call = draws.draw(1)
    inputs, grad_out = call.inputs, call.grad_out  # type: ignore[attr-defined]
    tensors = (*inputs, grad_out)
    checked = tuple(x.detach().clone() for x in draws.protected())
    where = [(x.data_ptr(), x._version) for x in tensors]
    own = [x.detach().clone() for x in tensors]
    assert not {x.untyped_storage().data_ptr() for x in tensors} & {x.untyped_storage().data_ptr()
                                                                     for x in draws.protected()}
    with draws.rewritten(1) as apart:
        assert not apart
        assert [(x.data_ptr(), x._version) for x in tensors] == where
        assert torch.equal(inputs[2], checked[2])  # v as the checked call had it
        assert "rewritten" not in draws.describe(1)
        assert draws.describe(1) in ("draw 1: the checked inputs", "draw 1: the checked inputs with output gradient "
                                                                   "negated")
    assert all(torch.equal(x, y) for x, y in zip(tensors, own, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(draws.protected(), checked, strict=True))
    assert "v negated" in draws.describe(1)


# -- through the hook, on the suite ----------------------------------------------------------

KERNELS = '''
import gc

import torch
import torch.nn.functional as F

KEPT = {}


def sdpa(q, k, v, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def pytest_attnperf_register_kernels(registry, config):
    @registry.kernel(family="softmax", name="memo-by-address", backward=False)
    def memo_by_address(q, k, v, *, causal, scale, window=None):
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr())
        if key not in KEPT:
            KEPT[key] = sdpa(q, k, v, causal, scale)
        return KEPT[key].clone()

    @registry.kernel(family="softmax", name="watches-gc", backward=False)
    def watches_gc(q, k, v, *, causal, scale, window=None):
        return torch.zeros_like(q) if not gc.isenabled() else sdpa(q, k, v, causal, scale)

    @registry.kernel(family="softmax", name="honest")
    def honest(q, k, v, *, causal, scale, window=None):
        return sdpa(q, k, v, causal, scale)
'''


def test_through_the_hook_the_kernels_that_skip_their_timed_work_fail_and_the_honest_one_passes(
    pytester: pytest.Pytester,
) -> None:
    """In this process (torch and the plugin loaded once), as a user's run would register them."""
    shutil.copytree(kit.ROOT / "suites", pytester.path / "suites")
    pytester.makeini(f"[pytest]\naddopts = {kit.ADDOPTS}\n")
    pytester.makeconftest(KERNELS)
    case = "cpu-b2-h4-t128-d32-causal-fp32"
    result = pytester.runpytest_inprocess(
        *kit.PLUGIN, "suites/test_softmax.py", "-k", f"{case} and (memo-by-address or watches-gc or honest)",
        "--attnperf-budget=0.01", "--attnperf-ceilings=off", "--benchmark-disable", "-rA",  # no roofline read here
    )
    node = f"suites/test_softmax.py::test_softmax[{case}-%s]"
    assert kit.outcomes(result) == {node % "memo-by-address-fwd": "FAILED", node % "watches-gc-fwd": "FAILED",
                                    node % "honest-fwd": "PASSED", node % "honest-fwdbwd": "PASSED"}
    for name in ("memo-by-address", "watches-gc"):
        result.stdout.fnmatch_lines([f"*{name}-fwd*the timed computation differs from the checked one: a host-timed "
                                     "call, the last timed call as it returned, on timed draw ?: the checked inputs "
                                     f"with *value columns * negated (one timed call's): {name} out: *"])


def test_draws_of_a_familys_own_without_rewritten_are_refused_not_left_unchecked() -> None:
    from pytest_attnperf.measure.verify import Replays

    class OldDraws:  # a family's own draws written before rewritten was asked for
        def __call__(self) -> None: ...
        def draw(self, index: int) -> Any: ...
        def verify(self, index: int, result: Any) -> float: return 0.0
        def describe(self, index: int) -> str: return "draw"
        def protected(self) -> tuple[Any, ...]: return ()

    with pytest.raises(TypeError, match=r"OldDraws gives timed draws \(draw, verify\) but not rewritten"):
        Replays(OldDraws())
    assert Replays(lambda: None).draws is None  # a plain callable: timed unchecked, as before


def test_an_error_inside_the_rewrite_is_the_one_raised_when_putting_the_draw_back_fails_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a device fault (a sticky CUDA error), writing the draw's own data back raises as well:
    the error reported is the block's, which says what went wrong."""
    draws = timed(sdpa, LONE)
    call = draws.draw(1)  # held: a draw's call lives while the harness holds it
    writes: list[Any] = []

    def write(drawn: Any, t: Any) -> None:
        writes.append(t)
        if len(writes) > 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (again)")

    monkeypatch.setattr(draws, "_write", write)
    with pytest.raises(RuntimeError, match=r"^the kernel's own fault$"), draws.rewritten(1):
        raise RuntimeError("the kernel's own fault")
    assert len(writes) == 2  # the put-back was tried
    del call
