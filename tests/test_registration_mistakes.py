"""A new user's mistakes are caught at collection with a message that names the fix: a mistyped
marker, a case row the run cannot use, a shape module with the wrong names or no test, a
baselines folder that does not exist. The runs are in this process: each mistake is caught
before any kernel runs (the check-only runs), or the kernels are the scripted timer's."""

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
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\n")
    return pytester


def run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A check-only run, in this process (the mistakes are caught before any kernel runs)."""
    return project.runpytest_inprocess("-p", "pytest_attnperf.plugin", "--attnperf-check-only", *args)


BAD_ROWS = {  # a module each: its one row, and what its collection error says
    "test_dtype_name": ('SoftmaxCase("cpu-b1-h2-t16-d8-bf16", 1, 2, 16, 8, "bfloat16", False, gpu=False)',
                        "dtype 'bfloat16' is none of bf16, fp16, fp32 (write 'bf16')"),
    "test_kv_heads": ('SoftmaxCase("cpu-b1-h6-t16-d8-fp32", 1, 6, 16, 8, "fp32", False, kv_heads=4, gpu=False)',
                      "6 heads cannot share 4 key/value heads"),
    "test_id_seq": ('SoftmaxCase("cpu-b1-h2-t128-d8-fp32", 1, 2, 64, 8, "fp32", False, gpu=False)',
                    "the id says 't128' but seq=64"),
    "test_id_causal": ('SoftmaxCase("cpu-b1-h2-t16-d8-causal-fp32", 1, 2, 16, 8, "fp32", False, gpu=False)',
                       "the id says 'causal' but causal=False"),
    "test_duplicate_id": (f"{GOOD_ROW}, {GOOD_ROW}", "two rows have this id"),
}


def test_shape_modules_the_run_cannot_use_are_collection_errors_each_naming_its_fix(project: pytest.Pytester) -> None:
    """One run, seven shape modules, each a collection error of its own naming the fix (the run
    stops after collection):

    - a case row with a dtype name torch spells (``bfloat16``): write ``bf16``;
    - heads the key/value heads do not divide;
    - an id whose ``t128`` contradicts ``seq=64``; one saying ``causal`` of a row with ``causal=False``;
    - two rows of one id;
    - a module declaring the suites' own names (``FAMILY``, ``CASES``): the right ones named;
    - a module declaring its cases without a test: what to import named."""
    project.makepyfile(**{name: SHAPES.format(rows=row) for name, (row, _) in BAD_ROWS.items()})
    project.makepyfile(test_own_names=SHAPES.format(rows=GOOD_ROW).replace("ATTNPERF_", ""),
                       test_no_test=SHAPES.format(rows=GOOD_ROW).replace(
                           "from pytest_attnperf.families.softmax.suite import test_softmax\n", ""))
    result = run(project)
    assert result.ret == pytest.ExitCode.INTERRUPTED  # a collection error stops the run
    result.stdout.fnmatch_lines(["*Interrupted: 7 errors during collection*"])  # one a module, none other
    for name, (_, message) in BAD_ROWS.items():
        result.stdout.fnmatch_lines([f"*attnperf: {name}'s ATTNPERF_CASES: *{message}*"])
    result.stdout.fnmatch_lines(["*attnperf: test_own_names declares FAMILY and CASES; the plugin parametrizes a "
                                 "module that declares ATTNPERF_FAMILY and ATTNPERF_CASES*"])
    result.stdout.fnmatch_lines(["*test_no_test.py declares ATTNPERF_CASES but holds no test to run them: import the "
                                 "family's test function*"])


def test_the_built_in_tables_pass_the_check_beside_a_projects_own_family_and_marker(project: pytest.Pytester) -> None:
    """One run proving three claims: the built-in table's row and kernels pass the check; a
    kernel the project registers in a family of its own is left alone; an unprefixed attnperf
    marker name (``sdpa_bakend``) the project registered itself is the project's, not refused
    (``test_an_attnperf_marker_without_its_prefix_is_a_usage_error`` refuses it unregistered)."""
    project.makeini("[pytest]\naddopts = -p no:cacheprovider -p no:randomly\n"
                    "markers =\n    sdpa_bakend: the project's own\n")
    project.makeconftest('''
def pytest_attnperf_register_kernels(registry, config):
    @registry.kernel(family="toy", name="mine")
    def mine(x):
        return x
''')
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW) + """
import pytest

pytestmark = pytest.mark.sdpa_bakend("math")
""")
    run(project, "-k", "naive").assert_outcomes(passed=2)


def test_a_mistyped_attnperf_marker_is_a_usage_error_naming_the_closest(project: pytest.Pytester) -> None:
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW) + '''
import pytest

pytestmark = pytest.mark.attnperf_flor(mfu=0.3)
''')
    result = run(project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown marker attnperf_flor; did you mean attnperf_floor?*"])


def test_a_missing_baselines_folder_is_named_and_refused_when_baselines_are_required(project: pytest.Pytester) -> None:
    project.makeconftest(kit.conftest("cpu"))
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW))
    gated = project.runpytest_inprocess("-p", "pytest_attnperf.plugin", "-k", "naive-fwd]", "--benchmark-disable",
                                        "--attnperf-baselines=perf/baseline")
    gated.assert_outcomes(passed=1)
    folder = project.path / "perf" / "baseline"
    gated.stdout.fnmatch_lines([f"*attnperf: no baselines folder at {folder} *every measured case is new and passes "
                                "ungated*"])
    required = project.runpytest_inprocess("-p", "pytest_attnperf.plugin", "-k", "naive-fwd]", "--benchmark-disable",
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


def test_an_attnperf_marker_without_its_prefix_is_a_usage_error(project: pytest.Pytester) -> None:
    """``sdpa_bakend`` unregistered: refused naming ``attnperf_sdpa_backend`` (registered by the
    project, it is left alone: ``test_the_built_in_tables_pass_the_check_beside_a_projects_own_family_and_marker``)."""
    project.makepyfile(test_shapes=SHAPES.format(rows=GOOD_ROW) + """
import pytest

pytestmark = pytest.mark.sdpa_bakend("math")
""")
    result = run(project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown marker sdpa_bakend; did you mean attnperf_sdpa_backend?*"])
