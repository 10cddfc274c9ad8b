"""The timed draws (``families.draws``) and their verification (``measure.verify``).

The draws rest on one claim: the fp64 answer of a timed draw is draw 0's answer rearranged. It is
tested here by computing the fp64 reference of each timed draw afresh and comparing, for softmax
attention (grouped heads, a window) and for every linear family, forward and backward. The
verification is tested with fake draws whose checks are scripted: a wrong result fails, a
replay that writes nothing leaves NaN behind, a buffer shared by the draws is checked on the
draw that wrote it, and two replays that differ read as not bitwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from pytest_attnperf.families.draws import Timed, Transform
from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear.kernels import LinearCase
from pytest_attnperf.families.softmax.reference import softmax_attention
from pytest_attnperf.measure.verify import Draws, Replays, TimedDiffers


def _grads(out: Any, inputs: tuple[Any, ...], grad_out: Any) -> tuple[Any, ...]:
    return (out.detach(),) + tuple(g.detach() for g in torch.autograd.grad(out, inputs, grad_out))


def _leaves(*shapes: tuple[int, ...], seed: int = 0) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes)


@pytest.mark.parametrize("index", [1, 2, 3])
def test_a_softmax_draws_fp64_answer_is_draw_0s_rearranged(index: int) -> None:
    q, k, v, grad_out = _leaves((3, 6, 16, 8), (3, 2, 16, 8), (3, 2, 16, 8), (3, 6, 16, 8))
    opts: dict[str, Any] = dict(causal=True, scale=8**-0.5, window=5)
    answer0 = _grads(softmax_attention(q, k, v, **opts), (q, k, v), grad_out)
    t = Transform.draw("case", index, batch=3, groups=2, head_axis=1, backward=True)
    moved = tuple(t.apply(n, x.detach()).requires_grad_() for n, x in zip(("q", "k", "v"), (q, k, v), strict=True))
    fresh = _grads(softmax_attention(*moved, **opts), moved, t.apply("grad_out", grad_out.detach()))
    for name, got, want in zip(("out", "dq", "dk", "dv"), fresh, answer0, strict=True):
        torch.testing.assert_close(got, t.apply(name, want), rtol=0, atol=1e-12, msg=name)
    assert t.v_sign == -1  # every timed draw differs from draw 0


@pytest.mark.parametrize("family", linear.FAMILIES)
def test_a_linear_draws_fp64_answer_is_draw_0s_rearranged(family: str) -> None:
    case = LinearCase("draws-b3-h4-t20", 3, 4, 20, 8, 8, "fp32", beta_max=2.0 if family == "gdn" else 1.0)
    inputs = tuple(x.detach().double().requires_grad_() for x in linear._inputs(family, case, "cpu", True))
    names = ("q", "k", "v", "g", "beta")[: len(inputs)]
    grad_out = torch.randn(inputs[2].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    fn = linear._chunked_fn(family)

    def answer(xs: tuple[Any, ...], go: Any) -> tuple[Any, ...]:
        return _grads(fn(*xs, scale=case.scale, compute=torch.float64, store=None), xs, go)

    answer0 = answer(inputs, grad_out)
    t = Transform.draw("case", 2, batch=3, groups=4, head_axis=2, backward=True)
    moved = tuple(t.apply(n, x.detach()).requires_grad_() for n, x in zip(names, inputs, strict=True))
    fresh = answer(moved, t.apply("grad_out", grad_out))
    for name, got, want in zip(("out", *(f"d{n}" for n in names)), fresh, answer0, strict=True):
        torch.testing.assert_close(got, t.apply(name, want), rtol=0, atol=1e-10, msg=name)


def test_the_draws_are_seeded_by_case_and_index_and_differ_from_one_another() -> None:
    draws = [Transform.draw("b4-h8", i, batch=4, groups=8, head_axis=1, backward=True) for i in range(1, 9)]
    assert draws == [Transform.draw("b4-h8", i, batch=4, groups=8, head_axis=1, backward=True) for i in range(1, 9)]
    assert len({(d.batch, d.groups, d.grad_sign) for d in draws}) == len(draws)
    assert Transform.draw("other", 1, 4, 8, 1, True) != draws[0]


class FakeDraws:
    """Draws of a 'kernel' that doubles its input (draw ``i``'s holds ``i``, rewritten in place
    ``100 + i``): ``wrong`` draws answer wrongly, and ``shared`` makes every draw return one
    buffer."""

    def __init__(self, wrong: frozenset[int] = frozenset(), shared: bool = False) -> None:
        self.wrong, self.shared = wrong, shared
        self.buffer = torch.zeros(4)
        self.checked: list[int] = []
        self.inputs: dict[int, torch.Tensor] = {}

    def __call__(self) -> Any:
        return self.draw(0)()

    def draw(self, index: int) -> Any:
        x = self.inputs[index] = torch.full((4,), float(index))

        def call() -> Any:
            out = x * 2 + (1 if index in self.wrong else 0)
            return self.buffer.copy_(out) if self.shared else out

        return call

    @contextlib.contextmanager
    def rewritten(self, index: int) -> Iterator[bool]:
        self.inputs[index].fill_(100.0 + index)
        try:
            yield True
        finally:
            self.inputs[index].fill_(float(index))

    def verify(self, index: int, result: Any) -> float:
        self.checked.append(index)
        want = 2 * float(self.inputs[index][0])
        if not torch.equal(result, torch.full((4,), want)):
            raise AssertionError(f"out: {result.tolist()} is not {want}")
        return 0.0

    def describe(self, index: int) -> str:
        return f"draw {index}"

    def protected(self) -> tuple[Any, ...]:
        return ()


def test_a_wrong_timed_result_fails_naming_where_and_the_draw() -> None:
    replays = Replays(FakeDraws(wrong=frozenset({2})))
    calls = [replays.call(i) for i in (1, 2)]
    for call in calls:
        call()
    replays.check(1, "cold graph 1 of 2", calls[0])
    with pytest.raises(TimedDiffers, match=r"differs from the checked one: cold graph 2 of 2, on timed draw 2, "
                                           r"rewritten in place after the timed calls: out"):
        replays.check(2, "cold graph 2 of 2", calls[1])
    assert replays.verified == 1


def test_a_replay_that_writes_nothing_leaves_nan_behind() -> None:
    replays = Replays(FakeDraws())
    result = replays.call(1)()
    assert isinstance(result, torch.Tensor)
    with pytest.raises(TimedDiffers, match="nan"):
        replays.check(1, "cold graph 1 of 1", lambda: None)  # a "replay" that does no work


def test_one_buffer_for_every_draw_is_checked_on_the_draw_that_wrote_it() -> None:
    fake = FakeDraws(shared=True)
    replays = Replays(fake)
    calls = [replays.call(i) for i in (1, 2, 3)]
    for call in calls:
        call()
    for index, call in enumerate(calls, start=1):
        replays.check(index, "a call", call)
    assert fake.checked == [1, 2, 3]
    assert replays.verified == 3
    replays.compare(1, calls[0])
    assert replays.bitwise is True


def test_a_timed_draw_that_raises_where_the_checked_call_returned_names_the_draw() -> None:
    class Raising(FakeDraws):
        def draw(self, index: int) -> Any:
            def call() -> Any:
                raise RuntimeError("element 0 of tensors does not require grad")
            return call

    with pytest.raises(TimedDiffers, match=r"raised on timed draw 1 where the checked call had returned: "
                                           r"RuntimeError: element 0"):
        Replays(Raising()).call(1)()


def test_replays_that_differ_are_not_bitwise() -> None:
    counter = iter(range(100))
    replays = Replays(lambda: torch.full((3,), float(next(counter))))  # a plain callable: compared, not verified
    call = replays.call(1)
    call()
    replays.compare(1, call)
    assert (replays.bitwise, replays.bitwise_diff) == (False, 1.0)
    assert replays.notes()
    assert not replays.notes(overhead=True)


def test_a_plain_callable_is_timed_as_it_is_and_nothing_is_verified() -> None:
    plain = lambda: torch.ones(2)  # noqa: E731
    replays = Replays(plain)
    assert not isinstance(plain, Draws)
    assert replays.draws is None
    replays.call(1)()
    replays.check(1, "a call", replays.call(1))
    assert replays.verified == 0


def test_the_suites_timed_callable_is_a_draws() -> None:
    timed = Timed(lambda: None, run_on=lambda xs, go: xs, inputs=(torch.zeros(2, 2, 3),), input_names=("q",),
                  grad_out=None, names=("out",), reference=(torch.zeros(2, 2, 3),), yardstick=(torch.zeros(2, 2, 3),),
                  check=lambda *a: 0.0, seed_text="c", head_axis=1, kernel="k")
    assert isinstance(timed, Draws)
    assert "v negated" in timed.describe(1)


def test_a_timed_result_equal_to_the_checked_answer_rearranged_passes_without_the_full_rule() -> None:
    got = torch.randn(2, 3, 4, 5)

    def full_rule(*args: Any) -> float:
        raise AssertionError("the full rule ran")

    timed = Timed(lambda: None, run_on=lambda xs, go: xs, inputs=(got,), input_names=("q",), grad_out=None,
                  names=("out",), reference=(got.double(),), yardstick=(got,), check=full_rule, seed_text="c",
                  head_axis=1, kernel="k", got=(got,))
    t = timed.transform(1)
    assert timed.verify(1, (t.apply("out", got),)) == 0.0
    with pytest.raises(AssertionError, match="the full rule ran"):  # one bit off: the rule decides
        timed.verify(1, (torch.nextafter(t.apply("out", got), torch.tensor(9.0)),))
