"""The correctness catalogue: its rows reach every class they claim, its value regimes reach the
numbers they are named after (and the fp64 references stay exact there), and its coverage report
never counts a refused or unreached class as passed, end to end through a run.
"""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import kit
import pytest
import torch

from pytest_attnperf.families import catalogue, catalogue_suite, values
from pytest_attnperf.families.catalogue_suite import CatalogueCheck, Known, _marks
from pytest_attnperf.families.family import FAMILIES
from pytest_attnperf.families.interpret import INTERPRETED_MAX_TOKENS, interpreted_refusal
from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.linear import reference as ref
from pytest_attnperf.families.parametrize import check_cases
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.recompute import recomputed_gradients
from pytest_attnperf.plugins.catalogue import class_status, summary_lines

CPU = torch.device("cpu")


def _rows(family: str, tier: str, gpu: bool = False) -> tuple[catalogue.Row, ...]:
    return FAMILIES[family].rows(tier, gpu)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_smoke_tier_reaches_every_class_the_cpu_catalogue_has(family: str) -> None:
    smoke = {c for r in _rows(family, "smoke") for c in r.classes}
    full = {c for r in _rows(family, "full") for c in r.classes}
    assert smoke == full
    assert len(_rows(family, "smoke")) < len(_rows(family, "full")) < len(_rows(family, "full", gpu=True))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_rows_have_unique_ids_that_agree_with_their_fields(family: str) -> None:
    cases = [r.case for r in _rows(family, "full", gpu=True)]
    check_cases(f"the {family} catalogue", cases)  # a usage error names any contradiction or repeated id
    assert all(c.id.startswith("cat-") for c in cases)


def test_a_row_of_an_unknown_class_or_tier_is_refused() -> None:
    case = _rows("softmax", "smoke")[0].case
    with pytest.raises(ValueError, match="unknown class"):
        catalogue.Row(case, ("tile-egde",))
    with pytest.raises(ValueError, match="no catalogue tier 'nightly'"):
        FAMILIES["softmax"].rows("nightly", False)
    assert FAMILIES["gdn"].rows("off", True) == ()


def test_each_family_takes_only_rows_it_can_express() -> None:
    la = {r.id for r in _rows("linear_attn", "full")}
    assert not any("gate" in i or "beta" in i or "hk" in i for i in la)
    assert {r.id for r in _rows("gdn", "full") if "beta-bounds" in r.classes}
    assert not [r for r in _rows("gdn", "full") if "large-state" in r.classes]


# -- the value regimes reach what they are named after -----------------------------------------


def _softmax_case(regime: str) -> softmax.SoftmaxCase:
    case: softmax.SoftmaxCase = next(r.case for r in _rows("softmax", "full") if regime in r.classes)
    return case


def _scores(case: softmax.SoftmaxCase) -> Any:
    p = softmax.prepare(case, "fwd", CPU)
    group = case.heads // case.n_kv_heads
    k = p.k.detach().double().repeat_interleave(group, dim=1)
    return (p.q.detach().double() @ k.transpose(-1, -2)) * case.scale


def test_large_logits_pass_exps_overflow_and_the_reference_stays_finite() -> None:
    case = _softmax_case("large-logits")
    assert float(_scores(case).amax()) > math.log(torch.finfo(torch.float32).max)  # 88.7
    assert torch.isfinite(softmax.prepare(case, "fwdbwd", CPU).reference[0]).all()


def test_negative_lse_rows_have_every_score_far_below_zero() -> None:
    case = _softmax_case("negative-lse")
    lse = torch.logsumexp(_scores(case), dim=-1)
    assert float(lse.amax()) < values.NEGATIVE_LOGIT + 10
    assert float(torch.exp(_scores(case).float()).amax()) == 0.0  # exp without the max underflows fp32


def test_ties_and_onehot_make_tied_rows() -> None:
    k = softmax.prepare(_softmax_case("ties"), "fwd", CPU).k
    assert torch.equal(k, k[:, :, :1].expand_as(k))  # every key of a head the same: its row's scores tie
    onehot = _softmax_case("onehot")
    p = softmax.prepare(onehot, "fwd", CPU)
    assert int((p.q[0] != 0).sum()) == 0
    assert set(p.k.unique().tolist()) == {0.0, 8.0}


def _linear_inputs(family: str, regime: str) -> tuple[catalogue.Row, tuple[Any, ...]]:
    row = next(r for r in _rows(family, "full") if regime in r.classes)
    return row, linear.prepare(family, row.case, "fwd", CPU).inputs


def test_gate_regimes_decay_as_named() -> None:
    _, near = _linear_inputs("simple_gla", "gate-near-zero")
    assert float(near[3].amin()) > -1e-3
    _, strong = _linear_inputs("gla", "gate-strong")
    assert float(strong[3].amax()) <= -20.0
    row, under = _linear_inputs("simple_gla", "decay-underflow")
    assert linear._deepest_chunk(under[3].double(), 64) > ref.MAX_LOG_DECAY["torch.float32"]
    _, bounds = _linear_inputs("gdn", "beta-bounds")
    assert set(bounds[4].unique().tolist()) == {0.0, 2.0}


def test_large_state_passes_fp16s_range_while_the_output_does_not() -> None:
    row, (q, k, v) = _linear_inputs("linear_attn", "large-state")
    state = torch.einsum("btk,btv->bkv", k[:, :, 0].double(), v[:, :, 0].double())
    out = ref.linear_attention(q.double(), k.double(), v.double(), scale=row.case.scale)
    assert float(state.abs().amax()) > torch.finfo(torch.float16).max > float(out.abs().amax())


@pytest.mark.parametrize("family", ["gla", "simple_gla"])
def test_the_fp64_reference_is_the_recurrence_under_gates_that_overflow_the_factored_form(family: str) -> None:
    row = next(r for r in _rows(family, "full") if "gate-strong" in r.classes and r.case.dtype == "fp32")
    p = linear.prepare(family, row.case, "fwd", CPU)
    assert p._chunking(torch.float64)  # a smaller chunk than the default
    exact, _ = p.reference("recurrent")
    recurrence = {"gla": ref.gla, "simple_gla": ref.simple_gla}[family]
    token = recurrence(*(x.detach().double() for x in p.inputs), scale=row.case.scale)
    assert torch.isfinite(exact[0]).all()
    torch.testing.assert_close(exact[0], token, rtol=1e-10, atol=1e-12)


def test_layouts_keep_the_values_and_change_the_strides() -> None:
    x = torch.randn(2, 3, 5, 4)
    (t,) = values.laid_out("transposed", (x,), 1, 2)
    (s,) = values.laid_out("sliced", (x,), 1, 2)
    assert torch.equal(t, x)
    assert torch.equal(s, x)
    assert not t.is_contiguous()
    assert not s.is_contiguous()
    q, k, v = values.laid_out("expanded-kv", (x, x[:, :1], x[:, :1]), 1, 2)
    assert k.shape == x.shape
    assert k.stride(1) == 0
    assert v.stride(1) == 0
    with pytest.raises(ValueError, match="one key/value head"):
        values.laid_out("expanded-kv", (x, x, x), 1, 2)


def test_a_recomputing_backward_is_autograds_up_to_fp32_rounding() -> None:
    case = softmax.SoftmaxCase("t", 2, 4, 9, 8, "fp32", True, kv_heads=2, kv_seq=13)
    xs = [torch.randn(s, dtype=torch.float64, requires_grad=True)
          for s in ((2, 4, 9, 8), (2, 2, 13, 8), (2, 2, 13, 8))]
    grad_out = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    opts: dict[str, Any] = {"causal": True, "scale": case.scale, "window": None}
    auto = torch.autograd.grad(softmax.naive(*xs, **opts), xs, grad_out)
    q, k, v = xs
    for got, want in zip(recomputed_gradients(q, k, v, grad_out, opts), auto, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # it computes in fp32, as a kernel does


# -- the catalogue's tests and their coverage ------------------------------------------------------


def test_the_known_failure_marks_only_its_kernel_regime_and_direction(monkeypatch: pytest.MonkeyPatch) -> None:
    known = Known("gla", "fla-fused-recurrent", "a finding", direction="fwdbwd", values="gate-strong")
    monkeypatch.setattr(catalogue_suite, "KNOWN", (known,))
    kernel = Kernel(known.family, known.kernel, lambda *a, **k: None)
    row = next(r for r in _rows(known.family, "smoke") if "gate-strong" in r.classes)
    assert _marks(CatalogueCheck(kernel, row, "fwdbwd"))
    assert not _marks(CatalogueCheck(kernel, row, "fwd"))
    other = Kernel(known.family, "other", lambda *a, **k: None)
    assert not _marks(CatalogueCheck(other, row, "fwdbwd"))


def test_a_known_failure_named_by_class_marks_that_class_in_both_directions(monkeypatch: pytest.MonkeyPatch) -> None:
    known = Known("gla", "fla-fused-recurrent", "a finding", row_class="grid-limit")
    monkeypatch.setattr(catalogue_suite, "KNOWN", (known,))
    kernel = Kernel(known.family, known.kernel, lambda *a, **k: None)
    rows = _rows(known.family, "smoke")
    grid = next(r for r in rows if "grid-limit" in r.classes)
    assert all(_marks(CatalogueCheck(kernel, grid, d)) for d in ("fwd", "fwdbwd"))
    assert not _marks(CatalogueCheck(kernel, next(r for r in rows if "grid-limit" not in r.classes), "fwd"))


def test_a_known_failure_named_for_one_device_marks_it_there_only(monkeypatch: pytest.MonkeyPatch) -> None:
    known = Known("gla", "fla-fused-recurrent", "a GPU finding", row_class="grid-limit", device="cuda")
    monkeypatch.setattr(catalogue_suite, "KNOWN", (known,))
    kernel = Kernel(known.family, known.kernel, lambda *a, **k: None)
    grid = next(r for r in _rows(known.family, "smoke") if "grid-limit" in r.classes)
    assert _marks(CatalogueCheck(kernel, grid, "fwd"), "cuda")
    assert not _marks(CatalogueCheck(kernel, grid, "fwd"), "cpu")


def test_interpreted_kernels_take_small_rows_only() -> None:
    small = next(r.case for r in _rows("gla", "smoke") if "tile-edge" in r.classes)
    big = next(r.case for r in _rows("gla", "smoke") if "long-seq" in r.classes)
    assert small.batch * small.heads * small.seq <= INTERPRETED_MAX_TOKENS
    assert interpreted_refusal(small) is None
    assert "interpreter" in str(interpreted_refusal(big))


def test_a_class_is_passed_only_when_a_row_passed_and_none_failed() -> None:
    assert class_status({"passed": 3, "failed": 1}) == "failed"
    assert class_status({"passed": 3, "refused": 9}) == "passed"
    assert class_status({"refused": 2, "skipped": 1}) == "refused"
    assert class_status({"xfailed": 1, "passed": 1}) == "xfailed"
    entry = {"family": "softmax", "kernel": "k", "unreached": ["long-keys"],
             "classes": {"ties": {"status": "refused", "refused": 2}, "gqa": {"status": "passed", "passed": 1}}}
    line = summary_lines("smoke", [entry], 3)[1]
    assert line == "  softmax/k: 1 passed; refused ties; unreached long-keys"


PROJECT_CONFTEST = textwrap.dedent('''
    import torch
    from pytest_attnperf.families.softmax.kernels import naive

    def started_at_zero(q, k, v, *, causal, scale, window=None):
        """The running maximum starts at 0 instead of -inf: a row whose scores are all far below 0 underflows."""
        s = (q.double() @ k.double().repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(-1, -2)) * scale
        if causal:
            i = torch.arange(s.shape[-2])[:, None] + s.shape[-1] - s.shape[-2]
            s = s.masked_fill(torch.arange(s.shape[-1])[None, :] > i, float("-inf"))
        top = s.amax(-1, keepdim=True).clamp_min(0.0)
        p = torch.exp((s - top).float())
        p = p / p.sum(-1, keepdim=True)
        return (p.double() @ v.double().repeat_interleave(q.shape[1] // k.shape[1], 1)).to(q.dtype)

    def pytest_attnperf_register_kernels(registry):
        windowless = lambda c: "no windows" if c.window else None
        registry.kernel(family="softmax", name="mine-ok", supports=windowless)(naive)
        registry.kernel(family="softmax", name="mine-zero-max", supports=windowless, backward=False)(started_at_zero)
''')

SELECT = "mine and (negative-lse or t17-d32 or w1)"


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A project of two kernels of its own on the catalogue's CPU rows, its runs in this process
    (torch and the plugin loaded once). Triton's interpreter stays off there (set so, the catalogue
    leaves it: ``interpret.enable``), as no kernel these runs select needs it and it would stay on
    for this process's later tests; fla's kernels under the interpreter run in a process of their
    own below."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kit.make_project(pytester, kit.conftest("cpu") + PROJECT_CONFTEST)
    # (not test_catalogue.py: in this process that name is this module's, imported already)
    pytester.makepyfile(test_rows="from pytest_attnperf.families.catalogue_suite import "
                                       "pytest_generate_tests, test_catalogue\n")
    return pytester


def _coverage(project: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    result = project.runpytest_inprocess(*kit.PLUGIN, "-k", SELECT, "--benchmark-disable",
                                         "--attnperf-coverage-json=cov.json", *args)
    data = json.loads(Path(project.path, "cov.json").read_text())
    return result, {e["kernel"]: e for e in data["kernels"]}


def test_coverage_names_what_each_kernel_failed_refused_and_never_reached(project: pytest.Pytester) -> None:
    result, kernels = _coverage(project)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*attnperf catalogue*", "  softmax/mine-ok: 4 passed; refused window-edge, lse; "
                                 "unreached *", "  softmax/mine-zero-max: * failed negative-lse*"])
    ok, bad = kernels["mine-ok"]["classes"], kernels["mine-zero-max"]["classes"]
    assert ok["window-edge"]["status"] == "refused"
    assert ok["lse"]["status"] == "refused"  # an axis the kernel does not declare: refused, never passed
    assert ok["negative-lse"]["status"] == "passed"
    assert bad["negative-lse"]["status"] == "failed"
    assert bad["tile-edge"]["status"] == "passed"
    assert bad["backward"]["status"] == "refused"  # forward-only: the backward is not vouched for
    assert "long-keys" in kernels["mine-ok"]["unreached"]
    assert "gqa" in kernels["mine-ok"]["unreached"]


def test_a_required_class_a_kernel_refused_fails_a_run_whose_tests_passed(project: pytest.Pytester) -> None:
    """A required class every kernel passed leaves the run passed; one a kernel refused fails it,
    named with its status (a class no catalogue has is a usage error: tests/unit/test_units_catalogue.py)."""
    select = ("-k", "mine-ok and (t17-d32 or w1)")
    passed = project.runpytest_inprocess(*kit.PLUGIN, *select, "--attnperf-require-class=tile-edge")
    assert passed.ret == pytest.ExitCode.OK
    refused = project.runpytest_inprocess(*kit.PLUGIN, *select, "--attnperf-require-class=window-edge")
    assert refused.ret == pytest.ExitCode.TESTS_FAILED
    refused.stdout.fnmatch_lines(["*--attnperf-require-class not met, the run fails: *softmax/mine-ok: "
                                  "window-edge (refused)*"])


def test_the_catalogue_off_collects_one_skipped_test_that_says_so(project: pytest.Pytester) -> None:
    result = project.runpytest_inprocess(*kit.PLUGIN, "--attnperf-catalogue=off", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*the catalogue is off in this run*"])


def test_fla_fused_recurrent_kernels_run_under_triton_interpreter_on_the_cpu(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU run turns the interpreter on before fla is imported, so the real Triton kernels are
    checked: GLA's forward and backward, and GDN's forward (its fused recurrent backward raises
    NotImplementedError: refused). ``--attnperf-catalogue-order`` takes GLA's kernel too: its
    rows the interpreter takes, in order, a shuffled sample again and part of it in a fresh
    process (the interpreter on there as well, its autotuner held to one configuration as here),
    every result the same. One run for both (fla loaded under the interpreter once)."""
    pytest.importorskip("fla")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kit.make_project(pytester, kit.conftest("cpu"))
    kit.pythonpath(monkeypatch)
    pytester.makepyfile(test_catalogue="from pytest_attnperf.families.catalogue_suite import "
                                       "pytest_generate_tests, test_catalogue, test_catalogue_order\n")
    selected = ("(fla-fused-recurrent and b1-h2-t17-d16 and not linear_attn) "
                "or test_catalogue_order and gla-fla-fused-recurrent")
    result = pytester.runpytest_subprocess(*kit.PLUGIN, "--attnperf-catalogue-order", "-k", selected,
                                           "--benchmark-disable", "-rs", "-W", "ignore", "--junitxml=order.xml")
    result.assert_outcomes(passed=4, skipped=1)
    result.stdout.fnmatch_lines(["  gla/fla-fused-recurrent: 2 passed; unreached *",
                                 "  gdn/fla-fused-recurrent: 1 passed; refused backward; unreached *",
                                 "*fla-fused-recurrent does not support this case: NotImplementedError: Backward*"])
    checks = ElementTree.parse(pytester.path / "order.xml").find(".//property[@name='order_checks']")
    assert checks is not None
    counts = {status: int(n) for n, status in (part.split() for part in checks.get("value", "").split(", "))}
    assert counts.get("passed", 0) >= 4, counts  # the interpreter ran the kernel: checks passed, not all refused
