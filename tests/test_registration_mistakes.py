"""A new user's mistakes are caught at collection with a message that names the fix: a mistyped
marker, a case row the run cannot use, a shape module with the wrong names or no test, a
baselines folder that does not exist."""

from __future__ import annotations

import kit
import pytest

SHAPES = '''
from pytest_attnperf import SoftmaxCase
from pytest_attnperf.families.softmax.suite import test_softmax

ATTNPERF_FAMILY = "softmax"
ATTNPERF_CASES = ({rows},)
'''
GOOD_ROW = 'SoftmaxCase("cpu-b1-h2-t16-d8-fp32", 1, 2, 16, 8, "fp32", False, gpu=False)'


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    kit.pythonpath(monkeypatch)
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\n")
    return pytester


def run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    return project.runpytest_subprocess("-p", "pytest_attnperf.plugin", "--attnperf-check-only", *args)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ('SoftmaxCase("cpu-b1-h2-t16-d8-bf16", 1, 2, 16, 8, "bfloat16", False, gpu=False)',
         "dtype 'bfloat16' is none of bf16, fp16, fp32 (write 'bf16')"),
        ('SoftmaxCase("cpu-b1-h6-t16-d8-fp32", 1, 6, 16, 8, "fp32", False, kv_heads=4, gpu=False)',
         "6 heads cannot share 4 key/value heads"),
        ('SoftmaxCase("cpu-b1-h2-t128-d8-fp32", 1, 2, 64, 8, "fp32", False, gpu=False)',
         "the id says 't128' but seq=64"),
        ('SoftmaxCase("cpu-b1-h2-t16-d8-causal-fp32", 1, 2, 16, 8, "fp32", False, gpu=False)',
         "the id says 'causal' but causal=False"),
        (f"{GOOD_ROW}, {GOOD_ROW}", "two rows have this id"),
    ],
    ids=["dtype-name", "kv-heads", "id-seq", "id-causal", "duplicate-id"],
)
def test_a_case_row_the_run_cannot_use_is_a_collection_error_naming_it(
    project: pytest.Pytester, row: str, message: str
) -> None:
    project.makepyfile(test_shapes=SHAPES.format(rows=row))
    result = run(project)
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error stops the run
    result.stdout.fnmatch_lines([f"*attnperf: test_shapes's ATTNPERF_CASES: *{message}*"])


def test_the_built_in_tables_pass_the_check(project: pytest.Pytester) -> None:
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW))
    result = run(project, "-k", "naive")
    result.assert_outcomes(passed=2)


def test_a_mistyped_attnperf_marker_is_a_usage_error_naming_the_closest(project: pytest.Pytester) -> None:
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW) + '''
import pytest

pytestmark = pytest.mark.attnperf_flor(mfu=0.3)
''')
    result = run(project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown marker attnperf_flor; did you mean attnperf_floor?*"])


def test_the_suites_own_names_in_a_shape_module_are_refused_with_the_right_ones(project: pytest.Pytester) -> None:
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW).replace("ATTNPERF_", ""))
    result = run(project)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*declares FAMILY and CASES; the plugin parametrizes a module that declares "
                                 "ATTNPERF_FAMILY and ATTNPERF_CASES*"])


def test_a_shape_module_without_a_test_fails_its_collection_saying_what_to_import(project: pytest.Pytester) -> None:
    shapes = SHAPES.format(rows=GOOD_ROW).replace("from pytest_attnperf.families.softmax.suite import test_softmax\n",
                                                  "")
    project.makepyfile(test_shapes=shapes)
    result = run(project)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*test_shapes.py declares ATTNPERF_CASES but holds no test to run them: import the "
                                 "family's test function*"])


def test_a_missing_baselines_folder_is_named_and_refused_when_baselines_are_required(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    project.makeconftest(kit.conftest("cpu"))
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW))
    gated = project.runpytest_subprocess("-p", "pytest_attnperf.plugin", "-k", "naive-fwd]", "--benchmark-disable",
                                         "--attnperf-baselines=perf/baseline")
    gated.assert_outcomes(passed=1)
    folder = project.path / "perf" / "baseline"
    gated.stdout.fnmatch_lines([f"*attnperf: no baselines folder at {folder} *every measured case is new and passes "
                                "ungated*"])
    required = project.runpytest_subprocess("-p", "pytest_attnperf.plugin", "-k", "naive-fwd]", "--benchmark-disable",
                                            "--attnperf-baselines=perf/baseline", "--attnperf-require-baseline")
    assert required.ret == pytest.ExitCode.USAGE_ERROR
    required.stderr.fnmatch_lines([f"*no baselines folder at {folder} *--attnperf-require-baseline needs its entries*"])


def test_a_kernel_that_cannot_take_its_familys_call_is_a_usage_error_at_start(project: pytest.Pytester) -> None:
    project.makeconftest('''
def pytest_attnperf_register_kernels(registry, config):
    @registry.kernel(family="softmax", name="no-window")
    def no_window(q, k, v, *, causal, scale):
        return q

    @registry.kernel(family="gdn", name="no-beta")
    def no_beta(q, k, v, g, *, scale):
        return v
''')
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW))
    result = run(project)  # the registry is built as collection needs it: conftests below the root may add kernels
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines([
        "*kernel 'no-window' in family 'softmax' cannot take the family's call fn(q, k, v, *, causal, scale, window): "
        "got an unexpected keyword argument 'window' (its signature is no-window(q, k, v, *, causal, scale))",
        "*kernel 'no-beta' in family 'gdn' cannot take the family's call fn(q, k, v, g, beta, *, scale): *",
    ])


def test_a_kernel_in_a_misspelt_family_is_a_usage_error_naming_the_family_meant(project: pytest.Pytester) -> None:
    project.makeconftest('''
def pytest_attnperf_register_kernels(registry, config):
    @registry.kernel(family="linear", name="mine")
    def mine(q, k, v, *, scale):
        return v
''')
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW))
    result = run(project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*kernel mine is registered in family 'linear', which no suite of this run declares; "
                                 "did you mean 'linear_attn'*"])


def test_a_projects_own_family_is_left_alone(project: pytest.Pytester) -> None:
    project.makeconftest('''
def pytest_attnperf_register_kernels(registry, config):
    @registry.kernel(family="toy", name="mine")
    def mine(x):
        return x
''')
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW))
    run(project, "-k", "naive").assert_outcomes(passed=2)


def test_an_attnperf_marker_without_its_prefix_is_a_usage_error_unless_the_project_registered_it(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW) + """
import pytest

pytestmark = pytest.mark.sdpa_bakend("math")
""")
    result = run(project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown marker sdpa_bakend; did you mean attnperf_sdpa_backend?*"])
    project.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\n"
                    "markers =\n    sdpa_bakend: the project's own\n")
    run(project, "-k", "naive").assert_outcomes(passed=2)
