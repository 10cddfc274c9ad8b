"""What each built-in family declares of itself instead of being told apart by its name: whether a
kernel may declare TF32 products (``Family.tf32``, checked by ``family.admit``), which catalogue its
rows come from (``Family.rows``), and the value regimes and layouts a linear case takes."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from pytest_attnperf.families import catalogue
from pytest_attnperf.families.family import FAMILIES, admit, classes_of
from pytest_attnperf.families.linear.case import LinearCase, linear_layout_refusal, linear_values_refusal
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax.kernels import SoftmaxCase
from pytest_attnperf.families.values import LINEAR_VALUES, SOFTMAX_VALUES, values_refusal

TF32 = {"softmax": True, "linear_attn": False, "gla": False, "simple_gla": False, "gdn": False}


def test_the_built_in_families_are_those_named_here() -> None:
    assert set(FAMILIES) == set(TF32)


@pytest.mark.parametrize(("name", "tf32"), TF32.items())
def test_each_family_says_whether_its_kernels_may_declare_tf32(name: str, tf32: bool) -> None:
    assert FAMILIES[name].tf32 is tf32
    kernel = Kernel(name, "mine", lambda *a, **k: None, tf32=True)
    if tf32:
        assert admit(kernel) is kernel
    else:
        with pytest.raises(ValueError, match=f"kernel 'mine' in family '{name}': tf32=True is the softmax family's"):
            admit(kernel)
    plain = Kernel(name, "plain", lambda *a, **k: None)
    assert admit(plain) is plain  # a kernel that declares no TF32 is every family's


def test_a_family_not_built_in_takes_no_tf32_kernel() -> None:
    with pytest.raises(ValueError, match="kernel 'mine' in family 'mine': tf32=True"):
        admit(Kernel("mine", "mine", lambda *a, **k: None, tf32=True))


@pytest.mark.parametrize(("name", "case_type", "source"), [
    ("softmax", SoftmaxCase, catalogue.softmax_rows),
    *((name, LinearCase, catalogue.linear_rows) for name in ("linear_attn", "gla", "simple_gla", "gdn")),
])
def test_each_family_takes_its_rows_from_its_own_catalogue(name: str, case_type: type,
                                                           source: Callable[[], Iterator[catalogue.Row]]) -> None:
    rows = FAMILIES[name].rows("full", True)
    assert rows
    assert all(isinstance(r.case, case_type) for r in rows)
    ids = {r.id for r in catalogue.rows(name, "full", True, source())}
    assert {r.id for r in rows} == ids
    assert "backward" in classes_of(name)


def test_the_linear_rows_a_family_refuses_are_left_out() -> None:
    every = {r.id for r in catalogue.linear_rows()}
    gdn = {r.id for r in FAMILIES["gdn"].rows("full", True)}
    la = {r.id for r in FAMILIES["linear_attn"].rows("full", True)}
    assert gdn < every
    assert la < every
    assert ("beta-bounds" in classes_of("gdn"), "beta-bounds" in classes_of("linear_attn")) == (True, False)
    assert ("large-state" in classes_of("gdn"), "large-state" in classes_of("linear_attn")) == (False, True)


def test_value_regimes_are_checked_against_the_family_s_own() -> None:
    assert values_refusal("softmax", "ties", SOFTMAX_VALUES) is None
    assert values_refusal("softmax", "gate-strong", SOFTMAX_VALUES) == (
        "no value regime 'gate-strong' for softmax (known: normal, large-logits, negative-lse, ties, onehot)")
    assert linear_values_refusal("gla", "gate-strong") is None
    assert linear_values_refusal("gla", "ties") == (
        f"no value regime 'ties' for gla (known: {', '.join(LINEAR_VALUES)})")
    assert linear_values_refusal("gla", "beta-bounds") == (
        "beta-bounds is a GDN regime (the other linear families have no beta)")
    assert linear_values_refusal("linear_attn", "gate-strong") == (
        "gate-strong is a gated regime; linear attention has no gate")
    assert "large-state needs unnormalised keys" in str(linear_values_refusal("gdn", "large-state"))
    assert linear_values_refusal("mine", "beta-bounds") is not None  # a name with no variant: no beta either


def test_a_linear_family_takes_every_layout_but_expanded_kv() -> None:
    assert [linear_layout_refusal(layout) for layout in ("contiguous", "transposed", "sliced")] == [None] * 3
    assert linear_layout_refusal("expanded-kv") == (
        "expanded-kv (K/V of one head expanded with stride 0) is a softmax layout")
    assert linear_layout_refusal("diagonal") == (
        "no layout 'diagonal' (known: contiguous, transposed, sliced, expanded-kv)")
