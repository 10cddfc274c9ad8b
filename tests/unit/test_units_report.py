"""Unit tests for ``pytest_attnperf.report.summary``: the summary table's case labels and notes."""

from __future__ import annotations

from pytest_attnperf.outcome import Row
from pytest_attnperf.report.summary import SHARED_NOTE, case_labels, summary_lines


def row(name: str, *notes: str, nodeid: str | None = None) -> Row:
    return Row(nodeid=nodeid or f"t.py::test[{name}]", backend="-", median_ms=0.1, stdrel=0.01, tflops=1.0, mfu=None,
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


# -- case labels ------------------------------------------------------------------------------


def test_unique_cases_show_their_test_and_id_only() -> None:
    assert case_labels(["suites/test_a.py::test_softmax[sdpa-b2]", "suites/test_a.py::test_softmax[naive-b2]",
                        "tests/test_b.py::TestLinear::test_gla[b2]"]) == [
        "test_softmax[sdpa-b2]", "test_softmax[naive-b2]", "test_gla[b2]"]


def test_the_same_test_and_id_in_two_modules_show_the_module() -> None:
    """Two files' ``test_softmax[sdpa-b2]`` get their module; a third, unique row stays short."""
    assert case_labels(["suites/test_a.py::test_softmax[sdpa-b2]", "tests/test_b.py::test_softmax[sdpa-b2]",
                        "tests/test_b.py::test_softmax[naive-b2]"]) == [
        "test_a.py::test_softmax[sdpa-b2]", "test_b.py::test_softmax[sdpa-b2]", "test_softmax[naive-b2]"]


def test_only_the_names_that_differ_are_added() -> None:
    """Same module name in two folders: the folder is added to those two, a third module's row
    stops at its module; a class is the first name added."""
    assert case_labels(["a/x/test_m.py::test_t[p]", "b/x/test_m.py::test_t[p]", "c/test_n.py::test_t[p]",
                        "c/test_n.py::TestK::test_t[p]"]) == [
        "a/x/test_m.py::test_t[p]", "b/x/test_m.py::test_t[p]", "test_n.py::test_t[p]", "TestK::test_t[p]"]


def test_a_parametrize_id_with_separators_is_kept_whole() -> None:
    assert case_labels(["m/t.py::test[a/b::c]", "n/t.py::test[a/b::c]"]) == [
        "m/t.py::test[a/b::c]", "n/t.py::test[a/b::c]"]


def test_the_same_node_id_twice_is_shown_whole() -> None:
    assert case_labels(["d/t.py::test[x]", "d/t.py::test[x]"]) == ["d/t.py::test[x]", "d/t.py::test[x]"]


def test_summary_rows_and_notes_tell_two_modules_cases_apart() -> None:
    rows = [row("", "not graph-capturable (x)", nodeid="suites/test_a.py::test_softmax[sdpa]"),
            row("", nodeid="tests/test_b.py::test_softmax[sdpa]")]
    lines = summary_lines(rows, "h200", [])
    assert [line.split()[0] for line in lines[3:5]] == ["test_a.py::test_softmax[sdpa]",
                                                        "test_b.py::test_softmax[sdpa]"]
    assert "note: test_a.py::test_softmax[sdpa]: not graph-capturable (x)" in lines
