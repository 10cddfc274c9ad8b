"""A kernel author's first hour, from docs/own-project.md: the page's project, then each mistake a
new user makes in it (a misspelt family, a marker typo, a bad case row, a shape module with the
wrong names, a mistyped folder, a bad baseline file, an option out of range), each answered with
one clear message naming the fix, no frames of the plugin, in a few lines. Then the same page
followed from the built wheel in a fresh virtual environment.

The project is the page's code blocks (``kit.page_files``) and the runs its check command, so a
page that drifts from what the plugin says fails here. Fake hardware and a scripted timer (the
kit's, as the module ``attnperf_fakes``) keep the timed runs quick and steady.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import kit
import pytest
from packaging.requirements import Requirement

FAKES = kit.conftest("cpu", samples=kit.steps(5, centred=True))
# the runs are in this process (torch and the plugin loaded once, not once a run); the warning that
# the already-loaded plugin cannot be assertion-rewritten is this harness's, no user's (a user's run is
# a process of its own: the wheel's quick start below runs so)
HARNESS = ("-p", "attnperf_fakes", "-p", "no:randomly", "-p", "no:cacheprovider", "--benchmark-disable",
           "--attnperf-ceilings=off", "-W", "ignore::pytest.PytestAssertRewriteWarning")
ONE_CASE = "my-attention and cpu-b1-h4-t64-d32-fp32"  # a case of the page's own CPU row: each mistake shows in it
CPU_ONLY = ("-k", f"{ONE_CASE} and fwd]")
MOST_LINES = 60  # a mistake's whole output: header, message, the removed combinations, summary

Files = dict[str, str]


def edit(path: str, old: str, new: str) -> Callable[[Files], None]:
    """A change to one of the page's files; the page must still hold ``old``."""
    def change(files: Files) -> None:
        assert old in files[path], f"docs/own-project.md's {path} no longer holds {old!r}"
        files[path] = files[path].replace(old, new, 1)
    return change


def add(path: str, text: str) -> Callable[[Files], None]:
    def change(files: Files) -> None:
        files[path] = files.get(path, "") + text
    return change


ROW = 'SoftmaxCase("cpu-b1-h4-t64-d32-fp32", 1, 4, 64, 32, "fp32", False, gpu=False),'
ENTRY = ("{median_ms: 1.0, ci_low_ms: 0.99, ci_high_ms: %s, stdrel: 0.004, n_samples: 20}")
KEY = "tests/test_my_shapes.py::test_softmax[cpu-b1-h4-t64-d32-fp32-my-attention-fwd]"


def baseline_file(body: str) -> Callable[[Files], None]:
    return add("perf/baselines/cpu.yaml", f"format: 1\nmeta: {{}}\nentries:\n{body}")


# (id, change to the page's project, extra arguments, extra environment, exit status, message)
MISTAKES: list[tuple[str, Callable[[Files], None] | None, tuple[str, ...], dict[str, str], int, str]] = [
    ("family-misspelt", edit("conftest.py", 'family="linear_attn"', 'family="linear"'), (), {},
     pytest.ExitCode.USAGE_ERROR, "*kernel my-linear is registered in family 'linear', which no suite of this run "
     "declares; did you mean 'linear_attn'?*"),
    ("signature", edit("conftest.py", "causal, scale, window=None):", "causal, scale):"), (), {},
     pytest.ExitCode.INTERRUPTED, "attnperf: kernel 'my-attention' in family 'softmax' cannot take the family's call "
     "fn(q, k, v, *, causal, scale, window): got an unexpected keyword argument 'window'*"),
    ("table-without-test", edit("tests/test_my_linear_shapes.py",
                                "from pytest_attnperf.families.linear.suite import test_linear\n", ""), (), {},
     pytest.ExitCode.INTERRUPTED, "*tests/test_my_linear_shapes.py declares ATTNPERF_CASES but holds no test to run "
     "them: import the family's test function*"),
    ("suite-names", lambda f: f.update({"tests/test_my_shapes.py": f["tests/test_my_shapes.py"].replace(
        "ATTNPERF_", "")}), (), {},
     pytest.ExitCode.INTERRUPTED, "attnperf: test_my_shapes declares FAMILY and CASES; the plugin parametrizes a "
     "module that declares ATTNPERF_FAMILY and ATTNPERF_CASES"),
    ("marker-typo", add("tests/test_my_shapes.py", "import pytest\npytestmark = pytest.mark.attnperf_flor(mfu=0.3)\n"),
     (), {}, pytest.ExitCode.USAGE_ERROR, "*unknown marker attnperf_flor; did you mean attnperf_floor?*"),
    ("marker-unprefixed",
     add("tests/test_my_shapes.py", "import pytest\npytestmark = pytest.mark.sdpa_bakend('math')\n"), (), {},
     pytest.ExitCode.USAGE_ERROR, "*unknown marker sdpa_bakend; did you mean attnperf_sdpa_backend?*"),
    ("dtype-name", edit("tests/test_my_shapes.py", '"bf16", True, kv_heads=8', '"bfloat16", True, kv_heads=8'),
     (), {}, pytest.ExitCode.INTERRUPTED, "*dtype 'bfloat16' is none of bf16, fp16, fp32 (write 'bf16')*"),
    ("kv-heads", edit("tests/test_my_shapes.py", "kv_heads=8", "kv_heads=5"), (), {},
     pytest.ExitCode.INTERRUPTED, "*32 heads cannot share 5 key/value heads*"),
    ("duplicate-id", edit("tests/test_my_shapes.py", ROW, ROW + "\n    " + ROW), (), {},
     pytest.ExitCode.INTERRUPTED, "*'cpu-b1-h4-t64-d32-fp32': two rows have this id*"),
    ("id-contradicts", edit("tests/test_my_shapes.py", "1, 4, 64, 32,", "1, 4, 32, 32,"), (), {},
     pytest.ExitCode.INTERRUPTED, "*the id says 't64' but seq=32*"),
    ("baselines-folder", None, ("--attnperf-baselines=perf/baseline", "--attnperf-require-baseline"), {},
     pytest.ExitCode.USAGE_ERROR, "*no baselines folder at */perf/baseline *--attnperf-require-baseline needs its "
     "entries*"),
    ("hw-from-environment", None, (), {"ATTNPERF_HW": "h100"}, pytest.ExitCode.USAGE_ERROR,
     "*hardware 'h100' does not match the device present: * (the name from environment variable ATTNPERF_HW)"),
    ("case-timeout", None, ("--attnperf-case-timeout=1e10",), {}, pytest.ExitCode.USAGE_ERROR,
     "*bad value '1e10' from --attnperf-case-timeout: must be a time below 1e+06s*"),
    ("processes", None, ("--attnperf-processes=1000",), {}, pytest.ExitCode.USAGE_ERROR,
     "*bad value '1000' from --attnperf-processes: must be from 1 to 32"),
    ("collected-twice", None, ("--keep-duplicates", "tests/test_my_shapes.py", "tests/test_my_shapes.py"), {},
     pytest.ExitCode.USAGE_ERROR, "*tests collected twice under one node id (tests/test_my_shapes.py::*; each "
     "measured case needs its own baseline key*"),
    ("baseline-alias", baseline_file(f'  "{KEY}": &e {ENTRY % 1.01}\n  other.py::test_x: *e\n'), (), {},
     pytest.ExitCode.TESTS_FAILED, "attnperf: baseline file */perf/baselines/cpu.yaml, line 5: the value of key "
     "'other.py::test_x' is an alias (*) of the node anchored (&) at line 4; aliases are not allowed*"),
    ("baseline-doubled-key", baseline_file(f'  "{KEY}": {ENTRY % 1.01}\n  "{KEY}": {ENTRY % 1.01}\n'), (), {},
     pytest.ExitCode.TESTS_FAILED, "attnperf: baseline file */perf/baselines/cpu.yaml, line 5: *twice*"),
    ("baseline-interval", baseline_file(f'  "{KEY}": {ENTRY % "1.0e+300"}\n'), (), {},
     pytest.ExitCode.TESTS_FAILED, "*cpu.yaml, entry '*my-attention-fwd]': *ci_high_ms*"),
]


@pytest.fixture
def first_hour(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    kit.pythonpath(monkeypatch, pytester.path)
    for name in [n for n in os.environ if n.startswith("ATTNPERF_")]:
        monkeypatch.delenv(name)
    (pytester.path / "attnperf_fakes.py").write_text(FAKES)
    pytester.syspathinsert()  # the fakes, for -p in this process's runs
    return pytester


def check_command() -> list[str]:
    record, check = kit.page_commands()
    assert "--update-baselines" in record
    assert "--update-baselines" not in check
    return check


@pytest.mark.parametrize(("change", "args", "env", "status", "message"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_each_first_hour_mistake_is_one_clear_message_naming_the_fix(
    first_hour: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, change: Callable[[Files], None] | None,
    args: tuple[str, ...], env: dict[str, str], status: int, message: str,
) -> None:
    files = kit.page_files()
    if change is not None:
        change(files)
    kit.write_files(first_hour.path, files)
    (first_hour.path / "perf" / "baselines").mkdir(parents=True, exist_ok=True)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = first_hour.runpytest_inprocess(*check_command(), *HARNESS, *CPU_ONLY, *args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == status, out
    (result.stderr if status == pytest.ExitCode.USAGE_ERROR else result.stdout).fnmatch_lines([message])
    assert "Traceback" not in out
    assert "pytest_attnperf/" not in out.replace("pytest_attnperf/families/", "")  # no frame of the plugin's
    assert len(out.splitlines()) <= MOST_LINES, out


def test_the_page_as_written_passes_before_any_mistake(first_hour: pytest.Pytester) -> None:
    """The control: the page's project, unchanged, runs the same selection and passes."""
    kit.write_files(first_hour.path, kit.page_files())
    first_hour.runpytest_inprocess(*check_command(), *HARNESS, *CPU_ONLY).assert_outcomes(passed=1)


def test_a_kernel_without_a_backward_is_told_about_backward_false(first_hour: pytest.Pytester) -> None:
    files = kit.page_files()
    edit("conftest.py", "is_causal=causal, scale=scale)", "is_causal=causal, scale=scale).detach()")(files)
    kit.write_files(first_hour.path, files)
    result = first_hour.runpytest_inprocess(*check_command(), *HARNESS, "-k", f"{ONE_CASE} and fwdbwd")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["kernel 'my-attention' returned an output that does not require grad, so no gradient "
                                 "can be checked: a kernel without a backward is registered with backward=False*"])
    assert "Traceback" not in result.stdout.str()


def test_a_kernel_that_reseeds_torch_is_named_and_set_back(first_hour: pytest.Pytester) -> None:
    files = kit.page_files()
    reseeds = "        torch.manual_seed(1234)\n        if window is not None:"
    edit("conftest.py", "        if window is not None:", reseeds)(files)
    files["tests/test_zz_after.py"] = ("import torch\n\n\ndef test_the_seed_is_back():\n"
                                       "    assert torch.initial_seed() != 1234\n")
    kit.write_files(first_hour.path, files)
    result = first_hour.runpytest_inprocess(*check_command(), *HARNESS, "-k", f"{ONE_CASE} and fwd] or seed_is_back",
                                             "--update-baselines")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*my-attention-fwd]: the case reseeded a global generator (set back now*"])


def test_a_family_no_test_declares_is_named_with_the_built_in_ones(first_hour: pytest.Pytester) -> None:
    files = kit.page_files()
    edit("conftest.py", 'family="linear_attn"', 'family="mamba"')(files)
    kit.write_files(first_hour.path, files)
    result = first_hour.runpytest_inprocess(*check_command(), *HARNESS, *CPU_ONLY, "-W",
                                             "error::pytest.PytestConfigWarning")
    assert result.ret != pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*kernel my-linear is registered in family 'mamba', which no test of this run "
                                 "parametrizes, so it runs in none (the built-in families: softmax, linear_attn*"])


def test_relative_report_and_baselines_folders_share_the_ini_files_folder(first_hour: pytest.Pytester) -> None:
    """Run from a subfolder: the baselines and the report both land beside pyproject.toml."""
    kit.write_files(first_hour.path, kit.page_files())
    record, check = kit.page_commands()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(first_hour.path / "tests")
        result = first_hour.runpytest_inprocess(*record, *HARNESS, *CPU_ONLY, "--attnperf-report=perf/report")
    result.assert_outcomes(passed=1)
    assert (first_hour.path / "perf" / "baselines" / "cpu.yaml").exists()
    assert (first_hour.path / "perf" / "report" / "report.json").exists()
    assert not (first_hour.path / "tests" / "perf").exists()


# -- the quick start from the built wheel, in a fresh virtual environment ------------------------

TORCH = "torch"  # with what it needs, taken from this environment (_link_torch)
SOURCE = ("pyproject.toml", "MANIFEST.in", "README.md", "CHANGELOG.md", "docs", "pytest_attnperf")
STEP_S = 300  # a step that takes longer is stuck: a safety net, not a measurement (the times are printed)


def _run(args: list[str], cwd: Path, env: dict[str, str], timings: dict[str, float], step: str,
         ) -> subprocess.CompletedProcess[str]:
    start = time.monotonic()
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=STEP_S)
    timings[step] = round(time.monotonic() - start, 1)
    assert done.returncode == 0, f"{step}: {' '.join(args)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _isolation() -> list[str]:
    """pip's build isolation off where this environment has pyproject.toml's setuptools (no index
    needed, and quicker); on, to fetch it, where it has an older one (a fresh venv's)."""
    try:
        import setuptools
    except ImportError:
        return []
    return ["--no-build-isolation"] if int(setuptools.__version__.split(".")[0]) >= 69 else []


def _requirements(name: str) -> set[str]:
    """The distribution ``name`` and those it needs (no extras), by their normalised names."""
    found: set[str] = set()
    todo = [name]
    while todo:
        key = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if key in found:
            continue
        found.add(key)
        for line in importlib.metadata.requires(key) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


def _link_torch(venv: Path, folder: Path) -> str:
    """Torch and the distributions it needs, from this environment, linked into ``folder``, which a
    .pth file puts on the new venv's path: pip then finds torch installed, as after the README's
    ``pip install torch==...`` (the step CI's own install runs), and installs the wheel's other
    dependencies into the venv (installing torch's wheel again would be most of this test's
    time). Returns torch's version."""
    folder.mkdir()
    for name in _requirements(TORCH):
        dist = importlib.metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or ()} - {"..", "__pycache__"}:
            source = Path(str(dist.locate_file(top)))
            if not top.endswith(".pth") and source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    (site,) = (venv / "lib").glob("python*/site-packages")
    (site / "torch_of_the_tests.pth").write_text(f"{folder}\n")
    return importlib.metadata.version(TORCH)


# the page's two commands from the wheel on five of its cases: its own softmax row both ways, its own
# linear row, and a row of each built-in suite (--attnperf-suites) with its kernels; all 15 cases of
# the commands run from this checkout in tests/test_own_project.py::test_the_page_runs_as_written
WHEEL_CASES = ("my- and (cpu-b1-h4-t64-d32-fp32 or cpu-b1-h2-t64-d16 or cpu-b2-h2-t33 "
               "or cpu-b2-h4-t128-d32-causal-fp32-my-attention-fwd])")
# what the venv's own interpreter finds installed (as pip show -f and pip list read it: each
# distribution's metadata on its path, the linked torch's too), printed as JSON
INSTALLED = """
import importlib.metadata as metadata, json
ours = metadata.distribution("pytest-attnperf")
print(json.dumps({"files": [str(f) for f in ours.files or ()],
                  "installed": [f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()]}))
"""


def test_the_quick_start_from_the_built_wheel_in_a_fresh_venv(tmp_path: Path) -> None:
    """Build the wheel, install it into a new venv (no site packages; torch linked from this
    environment), write the page's project and run its two commands there; the docs are reachable
    from the installed metadata. It runs with the others, in CI too."""
    timings: dict[str, float] = {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNPERF_", "PYTHON", "VIRTUAL_ENV"))}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    source = tmp_path / "source"  # what the build reads, copied: the build's own folders stay out of the tree
    source.mkdir()
    for name in SOURCE:
        if (kit.ROOT / name).is_dir():
            shutil.copytree(kit.ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(kit.ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *_isolation(), "-q", "-w", str(wheels), str(source)],
         tmp_path, env, timings, "build the wheel")
    (wheel,) = wheels.glob("pytest_attnperf-*.whl")
    if _isolation():  # this environment's setuptools builds the sdist too: it carries the docs
        _run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(wheels)!r})"],
             source, env, timings, "build the sdist")
        (sdist,) = wheels.glob("pytest_attnperf-*.tar.gz")
        with tarfile.open(sdist) as archive:
            names = {Path(name).relative_to(Path(name).parts[0]).as_posix() for name in archive.getnames()}
        assert {f"docs/{page.name}" for page in (kit.ROOT / "docs").glob("*.md")} <= names
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, env, timings, "make the venv")
    python = str(venv / "bin" / "python")
    torch_version = _link_torch(venv, tmp_path / "torch")
    pip = [sys.executable, "-m", "pip", "--python", python]  # this environment's pip, on the venv
    # --no-compile: the runs below compile what they import (pip compiling all of numpy was a third of the step)
    _run([*pip, "install", "-q", "--no-compile", str(wheel)], tmp_path, env, timings, "install the wheel")
    installed = json.loads(_run([python, "-c", INSTALLED], tmp_path, env, timings, "what is installed").stdout)
    assert "pytest_attnperf/families/softmax/suite.py" in installed["files"]
    assert "pytest_attnperf/py.typed" in installed["files"]  # the package's types hold for its users' checkers
    assert (venv / "bin" / "attnperf").exists()
    # torch found where the link put it, nothing else of this environment's (the wheel's own
    # dependencies were installed into the venv)
    listed = installed["installed"]
    assert f"torch=={torch_version}" in listed
    assert any(d.startswith("pytest-attnperf==") for d in listed)
    assert not {"pytest-benchmark", "pytest-xdist"} & {d.split("==")[0] for d in listed}
    metadata = next((venv / "lib").glob("python*/site-packages/pytest_attnperf-*.dist-info/METADATA")).read_text()
    page = "https://github.com/pytest-attnperf/pytest-attnperf/blob/main/docs/own-project.md"
    assert f"Project-URL: Quick start, {page}" in metadata
    assert f"]({page})" in metadata  # the README's link, as the description

    project = tmp_path / "project"
    kit.write_files(project, kit.page_files())
    # the kit's fake CPU and scripted timer, written beside the project (it imports only pytest and
    # the installed plugin): the verdicts are the commands', not a loaded host's clock
    (project / "attnperf_fakes.py").write_text(kit.conftest("cpu", samples=kit.steps(5, centred=True)))
    env = {**env, "PYTHONPATH": str(project)}
    record, check = kit.page_commands()
    pytest_exe = str(venv / "bin" / "pytest")
    # pytest-benchmark and pytest-xdist are extras, not installed here: the quick start runs without them
    quick = ["-p", "attnperf_fakes", "-p", "no:randomly", "-p", "no:cacheprovider", "-k", WHEEL_CASES]
    recorded = _run([pytest_exe, *record, *quick], project, env, timings, "record").stdout
    assert "passed" in recorded
    assert "failed" not in recorded
    assert (project / "perf" / "baselines" / "cpu.yaml").exists()
    assert shutil.which("git") is None or (project / "perf" / "baselines" / ".gitignore").exists()
    gated = _run([pytest_exe, *check, *quick], project, env, timings, "check").stdout
    assert "baselines: gated against" in gated
    assert "5 measured cases (5 unchanged)" in gated
    print("quick start from the wheel (s): " + ", ".join(f"{step} {s}" for step, s in timings.items()))
