"""The softmax family's decode caches and batch-split relation (``tests/zoo/axes_decode.py``) on the
catalogue's smoke rows, checked in this process on the CPU as the catalogue's suite checks a kernel
(``Family.refusal``, then ``Family.check``, SDPA's backend pinned):

* each wrong kernel fails the smoke row its pair names, a row of its class, with a wrong number or
  a wrong cache the checks name;
* the twin passes every smoke row of the cache classes and of batch-split (their backward refused:
  a decode step and a relation compare forward calls);
* every built-in kernel that declares a row's axes passes it, or is refused it (a pinned backend this
  machine lacks); a kernel that declares no cache axis, or ``kv-cache`` without ``paged``, is refused
  the rows it lacks, never passed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_zoo_catalogue import _one_torch_thread, outcome  # noqa: F401 - tests/ is on the path; its autouse fixture
from zoo import axes_decode as zoo

from pytest_attnperf.families import catalogue, order
from pytest_attnperf.families.catalogue_suite import NO_BACKEND
from pytest_attnperf.families.family import FAMILIES
from pytest_attnperf.families.order import Source
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.markers import pin_backend

CPU = torch.device("cpu")
CLASSES = ("kv-cache", "paged", "cache-ragged", "batch-split")
DIRECTIONS = ("fwd", "fwdbwd")


def decode_rows() -> tuple[catalogue.Row, ...]:
    """The softmax smoke rows of the caches and of batch-split."""
    return tuple(r for r in FAMILIES["softmax"].rows("smoke", False) if set(r.classes) & set(CLASSES))


def row_named(row_id: str) -> catalogue.Row:
    return next(r for r in decode_rows() if r.id == row_id)


def test_the_zoo_is_complete() -> None:
    """A wrong kernel for every class, each caught by a smoke row of its class, and a twin."""
    assert {p.cls for p in zoo.PAIRS} == set(CLASSES)
    registry = KernelRegistry()
    zoo.register(registry)
    assert len(registry) == len(zoo.PAIRS) + 1
    for pair in zoo.PAIRS:
        assert pair.cls in row_named(pair.row).classes, pair
        kernel = pair.kernel()
        assert f"[{pair.cls}]" in kernel.description
        assert kernel.axes == zoo.AXES


@pytest.mark.parametrize("pair", [pytest.param(p, id=f"{p.wrong_name}@{p.row.removeprefix('cat-')}")
                                  for p in zoo.PAIRS])
def test_a_wrong_kernel_fails_the_row_of_its_class(pair: zoo.Pair) -> None:
    kernel, row = pair.kernel(), row_named(pair.row)
    found = outcome(kernel, row, "fwd")
    assert found.status == "failed", f"{kernel.name} on {row.id}: {found}"
    assert kernel.name in found.message, found.message


def test_a_misplaced_write_is_named_in_the_cache() -> None:
    """A token written one slot late fails the cache's check, which names the request, the slot and
    what the call was to do there."""
    pair = next(p for p in zoo.PAIRS if p.name == "write-past-seqlens")
    found = outcome(pair.kernel(), row_named(pair.row), "fwd")
    assert found.status == "failed", found
    assert "left its k_cache wrong after the call" in found.message or "out" in found.message, found
    write_only = Kernel("softmax", "write-only", lambda *a, **kw: _write_late_attend_right(*a, **kw), axes=zoo.AXES)
    found = outcome(write_only, row_named(pair.row), "fwd")
    assert found.status == "failed", found
    assert "left its k_cache wrong after the call" in found.message, found
    assert "where its new token 0 goes" in found.message, found


def _write_late_attend_right(q: Any, k: Any, v: Any, **kw: Any) -> Any:
    """The twin's output, then one more token written a slot late: the output is right, the cache not."""
    out = zoo.attention(q, k, v, **kw)
    cache, lengths = kw["k_cache"], kw["cache_seqlens"]
    cache[0][:, int(lengths[0]) + 1] = cache[0][:, int(lengths[0])].clone()
    cache[0][:, int(lengths[0])] = 0
    return out


@pytest.mark.parametrize(("row", "direction"), [pytest.param(r, d, id=f"{r.id.removeprefix('cat-')}-{d}")
                                                 for r in decode_rows() for d in DIRECTIONS])
def test_the_twin_passes_every_row_of_the_caches(row: catalogue.Row, direction: str) -> None:
    found = outcome(zoo.twin(), row, direction)
    if direction == "fwdbwd":
        assert found.status == "refused", found
        assert "forward only" in found.message or "compares forward calls" in found.message, found
    else:
        assert found.status == "passed", f"twin-decode on {row.id}: {found}"


def builtin_params() -> Iterator[Any]:
    registry = KernelRegistry()
    softmax.register(registry)
    for kernel in registry.family("softmax"):
        for row in decode_rows():
            yield pytest.param(kernel, row, id=f"{kernel.name}-{row.id.removeprefix('cat-')}")


# (not ``kernel``: the plugin reads a test parameter of that name as a suite's kernel, with its ``case``)
@pytest.mark.parametrize(("builtin", "row"), list(builtin_params()))
def test_a_builtin_that_declares_the_axes_passes(builtin: Kernel, row: catalogue.Row) -> None:
    undeclared = [a for a in row.case.axes if a not in builtin.axes]
    pinned = pin_backend(builtin.sdpa_backend) if builtin.sdpa_backend else contextlib.nullcontext()
    with pinned:
        found = outcome(builtin, row, "fwd")
    if undeclared:
        assert found.status == "refused", found
        assert f"does not declare the call axis {', '.join(undeclared)}" in found.message, found
    elif found.status == "crashed" and NO_BACKEND.search(found.message):
        assert builtin.sdpa_backend in ("efficient", "cudnn"), found  # backends the CPU lacks
    elif found.status == "refused":
        assert builtin.supports(row.case), found
    else:
        assert found.status == "passed", f"{builtin.name} on {row.id}: {found}"


def test_naive_and_sdpa_declare_both_caches() -> None:
    registry = KernelRegistry()
    softmax.register(registry)
    for name in ("naive", "sdpa", "sdpa-math", "sdpa-flash"):
        assert {"kv-cache", "paged"} <= set(next(k for k in registry.family("softmax") if k.name == name).axes)


def test_a_kernel_that_declares_no_cache_is_refused_their_rows_never_passed() -> None:
    plain = Kernel("softmax", "plain", zoo.twin().fn)
    appended = Kernel("softmax", "append-only", zoo.twin().fn, axes=("kv-cache",))
    for row in decode_rows():
        for kernel in (plain, appended):
            undeclared = [a for a in row.case.axes if a not in kernel.axes]
            found = outcome(kernel, row, "fwd")
            if undeclared:
                assert found.status == "refused", (kernel.name, row.id, found)
                assert f"does not declare the call axis {', '.join(undeclared)}" in found.message
            else:
                assert found.status == "passed", (kernel.name, row.id, found)


# -- order independence (``families.order``) -------------------------------------------------------

TESTS = str(Path(__file__).parent)
ORDER = Source("zoo.axes_decode", "register_order", (TESTS,))


def order_kernels() -> dict[str, Kernel]:
    registry = KernelRegistry()
    zoo.register_order(registry)  # forgets the stateful kernel's launches: each test starts it fresh
    return {k.name: k for k in registry}


def order_checks() -> list[tuple[catalogue.Row, str]]:
    """The softmax smoke rows a kernel that declares no axis takes, forward, but the two largest (the order
    check's list)."""
    large = {"grid-limit", "long-keys"}
    return [(r, "fwd") for r in FAMILIES["softmax"].rows("smoke", False)
            if not r.case.axes and not r.case.window and not large & set(r.classes)]


def test_a_kernel_that_keeps_state_between_calls_fails_naming_the_check_before() -> None:
    """bug-stale-launch keeps the key tiles of its first call of each batch size: run in a shuffled order
    in a fresh process, where another check of a batch size comes first, a result differs from the
    catalogue order's, and the finding names the check that ran before it in each."""
    kernel = order_kernels()["bug-stale-launch"]
    found = order.record(ORDER, kernel, order_checks(), CPU, sample=8, fresh_count=8)
    assert found, "the stateful kernel's results did not depend on order"
    assert all("its result depends on what ran before it" in f for f in found), found
    assert any("in a fresh process, after cat-" in f for f in found), found
    assert all(f.startswith("softmax/bug-stale-launch cat-") for f in found), found


def test_its_stateless_twin_gives_the_same_results_in_every_order() -> None:
    kernel = order_kernels()["twin-launch"]
    checks = order_checks()
    first = order.ordered(kernel, checks, CPU)
    assert {r.status for r in first} == {"passed"}, [r for r in first if r.status != "passed"]
    assert order.record(ORDER, kernel, checks, CPU, sample=8, fresh_count=8, first=first) == []


def test_a_builtin_gives_the_same_results_in_every_order() -> None:
    """naive on the cache rows and its other smoke rows: shuffled and in a fresh process, bit for bit."""
    registry = KernelRegistry()
    softmax.register(registry)
    naive = next(k for k in registry.family("softmax") if k.name == "naive")
    checks = [(r, "fwd") for r in FAMILIES["softmax"].rows("smoke", False)
              if r.case.cache or r.case.relation == "batch-split" or r.id.startswith("cat-b2-h2-t17")]
    source = Source("pytest_attnperf.families.softmax.kernels")
    assert order.record(source, naive, checks, CPU, sample=6, fresh_count=6) == []


# -- timed draws of the cache cases ------------------------------------------------------------------


CACHE_ROWS = ("cat-b3-h4-kv2-t1-k32-d32-causal-fp32-append-lens5x0x17",
              "cat-b2-h2-t3-k24-d32-causal-fp32-append-lens1x20",
              "cat-b3-h4-kv2-t1-k32-d32-causal-fp32-paged8-lens9x0x23",
              "cat-b2-h2-t3-k32-d32-causal-fp32-paged4-lens7x2")


def cache_timed(kernel: Kernel, row_id: str) -> Any:
    from pytest_attnperf.families.softmax import cache

    return cache.check(kernel, row_named(row_id).case, "fwd", CPU).call


@pytest.mark.parametrize("row_id", CACHE_ROWS)
@pytest.mark.parametrize("name", ["naive", "sdpa-math", "twin"])
def test_a_cache_case_is_timed_with_checked_draws(name: str, row_id: str) -> None:
    """Each draw holds its own caches, ``v`` and ``v_cache`` negated and their value columns varied
    together (no request moves): the honest kernels pass every draw, before and after a varying,
    and on the data the check after sampling writes in."""
    from pytest_attnperf.families.draws import Timed

    registry = KernelRegistry()
    softmax.register(registry)
    kernel = zoo.twin() if name == "twin" else next(k for k in registry.family("softmax") if k.name == name)
    timed = cache_timed(kernel, row_id)
    assert isinstance(timed, Timed)
    calls = {index: timed.draw(index) for index in (1, 2)}
    for index, call in calls.items():
        vary = timed.vary(index)
        assert timed.verify(index, call()) <= 1.0
        vary()
        assert timed.verify(index, call()) <= 1.0
        assert "v negated" in timed.describe(index)
    with timed.rewritten(1):
        assert timed.verify(1, calls[1]()) <= 1.0


def test_a_cache_kernel_that_answers_from_a_content_cache_misses_on_a_varied_call() -> None:
    """Keyed on the bytes of q, k, v and the caches: after each varying nothing is found."""
    kept: dict[bytes, Any] = {}
    hits = [0]
    twin = zoo.twin()

    def cached(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        key = b"".join(x.contiguous().numpy().tobytes() for x in (q, k, v, kw["k_cache"], kw["v_cache"]))
        if key in kept:
            hits[0] += 1
            return kept[key].clone()
        kept[key] = out = twin.fn(q, k, v, **kw)
        return out

    timed = cache_timed(Kernel("softmax", "cached", cached, axes=twin.axes), CACHE_ROWS[2])
    call, vary = timed.draw(1), timed.vary(1)
    call()
    before = hits[0]
    for _ in range(4):
        vary()
        assert timed.verify(1, call()) <= 1.0
    assert hits[0] == before


def test_a_cache_kernel_that_stops_reading_the_cache_after_its_first_call_fails_a_timed_draw() -> None:
    """Right on the checked call; later it answers each shape with the first answer it gave."""
    from pytest_attnperf.families.checks import CheckFailed

    first: dict[tuple[int, ...], Any] = {}
    twin = zoo.twin()

    def stale(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        out = twin.fn(q, k, v, **kw)
        return first.setdefault(tuple(q.shape), out).clone()

    timed = cache_timed(Kernel("softmax", "stale", stale, axes=twin.axes), CACHE_ROWS[0])
    with pytest.raises(CheckFailed):
        timed.verify(1, timed.draw(1)())
