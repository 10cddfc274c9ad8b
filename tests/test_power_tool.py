"""``tools/power.py --junit``: the margins table per family, dtype and direction, read from the
JUnit reports of suite runs (what docs/checks.md's H200 margins come from)."""

from __future__ import annotations

from pathlib import Path

import kit

CASE = '<testcase classname="suites.test_{fn}" name="test_{fn}[{params}]{suffix}">{body}</testcase>'


def _props(**ratios: float) -> str:
    items = "".join(f'<property name="attnperf_check_{k}" value="{v}"/>' for k, v in ratios.items())
    return f"<properties>{items}<property name=\"attnperf_verdict\" value=\"checked only\"/></properties>"


def test_margins_are_the_worst_passing_ratios_by_family_dtype_direction_and_kind(tmp_path: Path) -> None:
    cases = [
        ("linear", "b2-h8-t1024-d64-fp16-gla-zoo-ok-gla-parallel-fwdbwd", "@gw0", _props(out=0.4, dq=0.2, dg=0.7)),
        ("linear", "b2-h8-t1024-d64-fp16-gla-zoo-ok-gla-recurrent-fwdbwd", "", _props(out=0.5, dk=0.3)),
        ("linear", "b2-h8-t1024-d64-fp16-gla-zoo-bad-gla-dg-1pct-all-fwdbwd", "", _props(out=0.1, dg=0.9)),
        ("linear", "b2-h8-t1024-d64-fp16-gla-fla-chunk-fwdbwd", "", '<failure message="dq: 2 of 9 outside"/>'),
        ("linear", "b2-h8-t1024-d64-fp16-gla-fla-chunk-fwd", "", '<skipped message="fla refuses"/>'),
        ("linear", "b2-h8-t1024-d64-fp32-simple_gla-fla-chunk-fwd", "", _props(out=0.75)),
        ("softmax", "b2-h12-kv3-t1024-d64-causal-bf16-sdpa-flash-fwd", "", _props(out=0.47)),
    ]
    xml = "".join(CASE.format(fn=fn, params=p, suffix=s, body=b) for fn, p, s, b in cases)
    path = tmp_path / "junit.xml"
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{xml}</testsuite></testsuites>')
    rows = kit.tool("power").junit_margins([str(path)]).splitlines()[2:]
    assert rows == [
        "| gla | fp16 | fwdbwd | built-in | 1 | 1 | - | - |",  # failed: counted, no ratio; skipped: left out
        "| gla | fp16 | fwdbwd | correct zoo | 2 | 0 | 0.5 | 0.7 |",  # the wrong zoo's 0.9 is left out
        "| simple_gla | fp32 | fwd | built-in | 1 | 0 | 0.75 | - |",
        "| softmax | bf16 | fwd | built-in | 1 | 0 | 0.47 | - |",
    ]


def test_a_family_is_measured_only_on_the_cases_it_takes() -> None:
    """GDN's grouped-value and beta-range rows are not linear attention's (its suite removes them)."""
    cases = kit.tool("power").cases
    grouped = "b2-h8-hk4-t1024-d64-fp16"
    assert [c.id for c in cases("gdn", "gpu", grouped)] == [grouped]
    assert cases("linear_attn", "gpu", grouped) == []
    beta = [c.id for c in cases("gdn", "gpu", ".") if c.beta_max != 1.0]
    assert beta
    assert not {c.id for c in cases("gla", "gpu", ".")} & set(beta)
    assert {c.id for c in cases("gla", "gpu", "b2-h8")} == {"b2-h8-t1024-d64-fp16", "b2-h8-t1024-d64-fp32"}
