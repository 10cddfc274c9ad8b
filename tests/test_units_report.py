"""Unit tests for ``pytest_attnperf.report.summary``: the summary table's notes."""

from __future__ import annotations

from pytest_attnperf.outcome import Row
from pytest_attnperf.report.summary import SHARED_NOTE, summary_lines


def row(name: str, *notes: str) -> Row:
    return Row(nodeid=f"t.py::test[{name}]", backend="-", median_ms=0.1, stdrel=0.01, tflops=1.0, mfu=None,
               gb_per_s=1.0, bandwidth_frac=None, peak_mib=None, eager_ms=None, intensity=1.0, bound=None,
               status="unchanged", change_pct=0.0, notes=notes)


def test_a_note_most_cases_share_is_printed_once_with_its_count() -> None:
    """Every case says NVML is missing; one also says it was re-measured: the shared note is one
    line with its count, the odd one stays on its case."""
    missing = "SM clock not read (no NVML: pip install nvidia-ml-py); throttling not checked"
    rows = [row(str(i), missing) for i in range(SHARED_NOTE + 2)]
    rows.append(row("odd", missing, "re-measured after a suspected regression (+6.0% first)"))
    notes = [line for line in summary_lines(rows, "h200", []) if line.startswith("note")]
    assert notes == [
        "note: test[odd]: re-measured after a suspected regression (+6.0% first)",
        f"note, {SHARED_NOTE + 3} of {SHARED_NOTE + 3} cases: {missing}",
    ]


def test_notes_on_few_cases_stay_on_their_cases() -> None:
    rows = [row(str(i), "not graph-capturable (x)") for i in range(SHARED_NOTE)]
    notes = [line for line in summary_lines(rows, "h200", []) if line.startswith("note")]
    assert notes == [f"note: test[{i}]: not graph-capturable (x)" for i in range(SHARED_NOTE)]


def test_a_note_on_a_minority_of_cases_keeps_their_names() -> None:
    """Four of ten cases not graph-capturable: more than SHARED_NOTE, but not most, so each is named."""
    rows = [row(str(i), *(["not graph-capturable (x)"] if i < 4 else [])) for i in range(10)]
    notes = [line for line in summary_lines(rows, "h200", []) if line.startswith("note")]
    assert notes == [f"note: test[{i}]: not graph-capturable (x)" for i in range(4)]
