"""A hostile kernel costs only its own case: what it does to torch or the process is named and
undone, and the correct kernel after it on the same case passes.

The first test runs the real softmax suite on one CPU case with the hostile kernels registered
through ``pytest_attnperf_register_kernels``, then ``good``: naive attention through ``torch.matmul`` and
``torch.softmax``, forward and backward, which a patched function, inference mode left on or a
stolen ``SIGALRM`` would break. A hostile kernel misbehaves once only (on its first call), so
its case's later calls and the cases after it would run clean but for what it left.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kit
import pytest
import torch

from pytest_attnperf.measure import switches, torch_functions
from pytest_attnperf.options import user_cache

CASE = "cpu-b2-h4-t128-d32-causal-fp32"

HOSTILE_KERNELS = '''
import os
import pathlib
import signal
import subprocess
import sys
import time
import weakref

import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).parent
DONE = set()  # the kernels that have misbehaved: once each
HELD = []  # what a kernel keeps alive
KEPT = []  # weak references to a kernel's outputs


def once(name):
    first = name not in DONE
    DONE.add(name)
    return first


def sdpa(q, k, v, causal, scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def blind_abs(real):
    """Tensor.abs reading every float64 tensor as 0: the checks' |error| is 0 wherever they look."""
    def abs(self):
        return torch.zeros_like(self) if self.dtype == torch.float64 else real(self)

    return abs


def into_tensorbase(name, value):
    """Past setattr's refusal of the C type: straight into its dict."""
    import ctypes
    import gc

    gc.get_referents(vars(torch._C.TensorBase))[0][name] = value
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(torch._C.TensorBase))


def shadow_abs(on):
    """torch.Tensor.abs blind (on) or torch's own again (off)."""
    if on and "abs" not in vars(torch.Tensor):
        torch.Tensor.abs = blind_abs(torch._C.TensorBase.abs)
    elif not on and "abs" in vars(torch.Tensor):
        del torch.Tensor.abs


def pytest_attnperf_register_kernels(registry, config):
    @registry.kernel(family="softmax", name="patches-torch", backward=False)
    def patches_torch(q, k, v, *, causal, scale, window=None):
        out = sdpa(q, k, v, causal, scale)
        if once("patches-torch"):
            real_matmul, real_softmax = torch.matmul, torch.softmax

            def doubled_matmul(a, b, **kwargs):
                return 2 * real_matmul(a, b, **kwargs)

            torch.matmul = doubled_matmul
            torch.softmax = lambda x, dim, **kwargs: real_softmax(x, dim=dim, **kwargs)
            torch.Tensor.__matmul__ = lambda a, b: doubled_matmul(a, b)
        return out

    @registry.kernel(family="softmax", name="keeps-inference-mode", backward=False)
    def keeps_inference_mode(q, k, v, *, causal, scale, window=None):
        out = sdpa(q, k, v, causal, scale)
        if once("keeps-inference-mode"):
            HELD.append(torch.inference_mode())
            HELD[-1].__enter__()  # never left: the guard lives in HELD
            HELD.append(torch.autograd.grad_mode._enter_inference_mode(True))
        return out

    @registry.kernel(family="softmax", name="calls-os-exit", backward=False)
    def calls_os_exit(q, k, v, *, causal, scale, window=None):
        os._exit(0)

    @registry.kernel(family="softmax", name="exits-in-c", backward=False)
    def exits_in_c(q, k, v, *, causal, scale, window=None):
        import ctypes

        ctypes.CDLL(None)._exit(0)  # past Python: nothing in the process can stop it

    @registry.kernel(family="softmax", name="leaves-children", backward=False)
    def leaves_children(q, k, v, *, causal, scale, window=None):
        if once("leaves-children"):
            sleeper = [sys.executable, "-c", "import time; time.sleep(600)  # hostile-sleeper"]
            child = subprocess.Popen(sleeper, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            HELD.append(child)
            forked = os.fork()
            if forked == 0:  # the forked copy sleeps, then leaves without running pytest's exit
                time.sleep(600)
                os._exit(0)
            (HERE / "children.txt").write_text(f"{child.pid} {forked}")
        return sdpa(q, k, v, causal, scale)

    @registry.kernel(family="softmax", name="takes-sigalrm", backward=False)
    def takes_sigalrm(q, k, v, *, causal, scale, window=None):
        if once("takes-sigalrm"):
            def own_alarm(signum, frame):
                pass

            signal.signal(signal.SIGALRM, own_alarm)
        return sdpa(q, k, v, causal, scale)

    @registry.kernel(family="softmax", name="cancels-alarm", backward=False)
    def cancels_alarm(q, k, v, *, causal, scale, window=None):
        if once("cancels-alarm"):
            signal.alarm(0)
        return sdpa(q, k, v, causal, scale)

    @registry.kernel(family="softmax", name="ignores-sigterm", backward=False)
    def ignores_sigterm(q, k, v, *, causal, scale, window=None):
        if once("ignores-sigterm"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return sdpa(q, k, v, causal, scale)

    @registry.kernel(family="softmax", name="patches-tensorbase-abs", backward=False)
    def patches_tensorbase_abs(q, k, v, *, causal, scale, window=None):
        if once("patches-tensorbase-abs"):
            into_tensorbase("abs", blind_abs(torch._C.TensorBase.abs))
        return sdpa(q, k, v, causal, scale) * 1.05

    @registry.kernel(family="softmax", name="shadows-abs", backward=False)
    def shadows_abs(q, k, v, *, causal, scale, window=None):
        if once("shadows-abs"):
            shadow_abs(True)
        return sdpa(q, k, v, causal, scale) * 1.05

    @registry.kernel(family="softmax", name="five-percent-off", backward=False)
    def five_percent_off(q, k, v, *, causal, scale, window=None):
        return sdpa(q, k, v, causal, scale) * 1.05

    @registry.kernel(family="softmax", name="blinds-checks-briefly", backward=False)
    def blinds_checks_briefly(q, k, v, *, causal, scale, window=None):
        first = once("blinds-checks-briefly")  # wrong with the checks blind; right, and torch's own, after
        shadow_abs(first)
        return sdpa(q, k, v, causal, scale) * (1.05 if first else 1.0)

    @registry.kernel(family="softmax", name="blinds-timed-checks", backward=False)
    def blinds_timed_checks(q, k, v, *, causal, scale, window=None):
        kept = [out for out in (ref() for ref in KEPT) if out is not None]  # the results the harness holds
        checked = any(bool(out.isnan().all()) for out in kept)  # it poisons one it is about to check
        shadow_abs(checked)
        out = sdpa(q, k, v, causal, scale) * (1.05 if checked else 1.0)
        KEPT[:] = [weakref.ref(x) for x in kept + [out]]
        return out

    @registry.kernel(family="softmax", name="flushes-denormals", backward=False)
    def flushes_denormals(q, k, v, *, causal, scale, window=None):
        if once("flushes-denormals"):
            torch.set_flush_denormal(True)
            torch.backends.mkldnn.enabled = False
            if hasattr(torch.backends.mkldnn, "matmul"):  # torch 2.9 and later: oneDNN's products in bf16
                torch.backends.mkldnn.matmul.fp32_precision = "bf16"
        return sdpa(q, k, v, causal, scale)

    @registry.kernel(family="softmax", name="good")
    def good(q, k, v, *, causal, scale, window=None):
        if once("good"):  # what the cases after the hostile ones run with
            flushed = (torch.full((1,), 1e-40) * 1.0).item() == 0.0
            one = torch.tensor([-1.0], dtype=torch.float64).abs().item()
            products = getattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision", "-")
            (HERE / "good-saw.txt").write_text(f"flush denormal: {flushed}; oneDNN: {torch.backends.mkldnn.enabled}; "
                                               f"oneDNN fp32 products: {products}; |-1.0| = {one}")
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        if causal:
            t = q.shape[-2]
            keep = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~keep, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v
'''


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """The softmax suite with the hostile kernels and ``good`` registered."""
    kit.pythonpath(monkeypatch)
    shutil.copytree(kit.ROOT / "suites", pytester.path / "suites")
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    pytester.makeconftest(HOSTILE_KERNELS)
    return pytester


def run(suite: pytest.Pytester, selection: str) -> pytest.RunResult:
    """The cases of ``CASE`` that ``selection`` picks (-k), in registration order: the hostile
    kernels, then ``good`` (forward, then forward and backward)."""
    return suite.runpytest_subprocess(
        "-p", "pytest_attnperf.plugin", "suites/test_softmax.py", "-k", f"{CASE} and ({selection})",
        "--attnperf-budget=0.01", "--attnperf-ceilings=off", "--benchmark-disable", "--attnperf-case-timeout=300",
        "-v", "-rA", "--junitxml=junit.xml", timeout=300,
    )


def ran(result: pytest.RunResult) -> list[tuple[str, str]]:
    """The cases in the order they ran (``-v`` lines), each with its outcome."""
    order = []
    for line in result.outlines:
        if line.startswith("suites/test_softmax.py::") and ("PASSED" in line or "FAILED" in line):
            nodeid, outcome = line.split()[:2]
            order.append((nodeid.split("[", 1)[1].rstrip("]").removeprefix(f"{CASE}-"), outcome))
    return order


def cost_only_their_own_case(result: pytest.RunResult, *hostile: str) -> None:
    """Each hostile case failed; ``good`` ran after them and passed, forward and backward; the
    run ended with its summary and exit status 1."""
    order = ran(result)
    assert order == [(f"{name}-fwd", "FAILED") for name in hostile] + [
        ("good-fwd", "PASSED"), ("good-fwdbwd", "PASSED")], (order, result.ret, result.stdout.str()[-3000:])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"*{len(hostile)} failed, 2 passed*"])


BLIND_ABS = "conftest.blind_abs.<locals>.abs"
ONEDNN_PRODUCTS = "none" if hasattr(torch.backends.mkldnn, "matmul") else "-"
# what ``good`` saw, first called
TORCHS_OWN = f"flush denormal: False; oneDNN: True; oneDNN fp32 products: {ONEDNN_PRODUCTS}; |-1.0| = 1.0"
CHECKS_BLIND = "replaced torch functions, put back now; its checks would otherwise have run with them:"
# every kernel of HOSTILE_KERNELS that leaves the run going, in their registration order (the cases' order)
HOSTILE = ("patches-torch", "keeps-inference-mode", "calls-os-exit", "leaves-children", "takes-sigalrm",
           "cancels-alarm", "ignores-sigterm", "patches-tensorbase-abs", "shadows-abs", "five-percent-off",
           "blinds-checks-briefly", "blinds-timed-checks", "flushes-denormals")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2][:3]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="child processes are read from /proc")
def test_each_hostile_kernel_costs_only_its_own_case_and_a_run_dead_past_python_is_named_by_the_next(
    suite: pytest.Pytester,
) -> None:
    """Two runs of the suite on one case.

    The first: a kernel exits past Python (``ctypes``' C ``_exit(0)``), which cannot be refused:
    the run ends with exit status 0, no summary and no JUnit file, and leaves its marker naming
    the case it died in.

    The second: every other hostile kernel, then ``good``; each hostile one fails its own case,
    named, and ``good`` after them passes, forward and backward, seeing torch's own (denormals,
    oneDNN, ``abs``); the run ends with its summary, its JUnit file and exit status 1; and it
    names the dead first run with the case it died in:

    - torch functions replaced (``torch.matmul``, ``torch.softmax``, ``torch.Tensor.__matmul__``):
      each named, put back before the checks;
    - ``abs`` written into ``torch._C.TensorBase``'s dict, or set on ``torch.Tensor`` over it,
      reading the checks' every float64 error as 0 (the kernels are 5% off): named, put back
      before the checks; an honest kernel 5% off after them fails its check, so they ran with
      torch's own;
    - a patch that undoes itself after fooling the checks of its checked call, or those of its
      timed calls (it sees the NaN the harness writes over a result it is about to check), putting
      torch's own ``abs`` back on its next call, so nothing is left replaced at the case's end;
    - inference mode left on (the backward case after it passes), denormals flushed and oneDNN
      changed: named as torch's global state changed, and set back;
    - ``os._exit(0)``: refused, named with where it was called, the run goes on to its summary;
    - child processes left running (one started, one forked): named and killed;
    - ``SIGALRM`` taken, the alarm cancelled, ``SIGTERM`` ignored: named and set back.

    After the second, no marker is left in the folder the runs read them from (the second named
    the dead run's from there and removed it; its own went at its end): a later run has none to
    name, so the dead run is named once (a marker once named is not named again: test_faults_store.py's
    ``test_a_dead_runs_marker_under_this_processs_pid_is_named_and_this_runs_own_is_not``)."""
    runs = user_cache("pytest-attnperf", "runs")  # the run markers (this test's own $XDG_CACHE_HOME)
    died = run(suite, "exits-in-c")
    assert died.ret == 0
    assert not (suite.path / "junit.xml").exists()
    (marker,) = runs.glob("*.json")
    assert json.loads(marker.read_text())["case"] == f"suites/test_softmax.py::test_softmax[{CASE}-exits-in-c-fwd]"

    try:
        result = run(suite, " or ".join((*HOSTILE, "good")))
    finally:
        pids = [int(pid) for pid in (suite.path / "children.txt").read_text().split()]
        alive = [pid for pid in pids if _alive(pid)]
        for pid in alive:  # without the check, they would outlive the test
            os.kill(pid, signal.SIGKILL)
    cost_only_their_own_case(result, *HOSTILE)
    assert (suite.path / "junit.xml").exists()
    assert (suite.path / "good-saw.txt").read_text() == TORCHS_OWN
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "attnperf: an earlier run on this host ended without its summary or reports (pid *, started * in *: "
        "pytest * -p pytest_attnperf.plugin suites/test_softmax.py *), during "
        f"suites/test_softmax.py::test_softmax?{CASE}-exits-in-c-fwd?: ended where Python cannot stop it (a C-level "
        "exit, a kill), so its exit status, 0 included, is no pass",
    ])

    # torch functions and tensor methods replaced
    local = "conftest.pytest_attnperf_register_kernels.<locals>.patches_torch.<locals>"
    result.stdout.fnmatch_lines([
        "kernel 'patches-torch' replaced torch functions, put back now; its checks would otherwise have run with "
        "them:",
        f"  torch.matmul: replaced by {local}.doubled_matmul",
        f"  torch.softmax: replaced by {local}.<lambda>",
        f"  torch.Tensor.__matmul__: replaced by {local}.<lambda>",
    ], consecutive=True)
    result.stdout.fnmatch_lines([f"kernel 'patches-tensorbase-abs' {CHECKS_BLIND}",
                                 f"  torch._C.TensorBase.abs: replaced by {BLIND_ABS}"], consecutive=True)
    result.stdout.fnmatch_lines([f"kernel 'shadows-abs' {CHECKS_BLIND}",
                                 f"  torch.Tensor.abs: replaced by {BLIND_ABS}"], consecutive=True)
    result.stdout.fnmatch_lines(["five-percent-off out: max |error| * against fp64, at *, exceeds *"])
    result.stdout.fnmatch_lines([f"kernel 'blinds-checks-briefly' {CHECKS_BLIND}",
                                 f"  torch.Tensor.abs: replaced by {BLIND_ABS}"], consecutive=True)
    result.stdout.fnmatch_lines([
        "*blinds-timed-checks-fwd*: the kernel's timed calls replaced torch functions, put back now; the check of "
        "their results would otherwise have run with them:",
        f"  torch.Tensor.abs: replaced by {BLIND_ABS}"], consecutive=True)

    # torch's global state
    result.stdout.fnmatch_lines([
        "*keeps-inference-mode-fwd]: the case changed torch's global state, which would carry into every later "
        "case; set back now:",
        "*inference mode (torch.is_inference_mode_enabled): False -> True",
        "*grad mode (torch.is_grad_enabled): True -> False",
    ])
    result.stdout.fnmatch_lines([
        "*flushes-denormals-fwd]: the case changed torch's global state, which would carry into every later case; "
        "set back now:",
        *(["*float32 precision (torch.backends.mkldnn.matmul.fp32_precision): 'none' -> 'bf16'"]
          if hasattr(torch.backends.mkldnn, "matmul") else []),
        "*oneDNN (torch.backends.mkldnn.enabled): True -> False",
        "*flush denormal (torch.set_flush_denormal): False -> True",
    ])

    # the process: os._exit, child processes
    result.stdout.fnmatch_lines([
        "*calls-os-exit-fwd]: the case called os._exit(0) at conftest.py:* in calls_os_exit, which would end the "
        "run at once with no summary, JUnit file or baselines, and an exit status CI can read as a pass; refused*",
    ])
    assert alive == []
    result.stdout.fnmatch_lines([
        "*leaves-children-fwd]: the case left child processes running, which could hang the run or hold its "
        "memory and devices; killed (SIGKILL) now:",
    ])
    popened, forked = pids
    assert "import time; time.sleep(600)  # hostile-sleeper (killed)" in out
    assert f"  pid {forked}: " in out

    # signal handling
    head = ("the case changed signal handling, which would switch off the case time limit (SIGALRM) or keep an "
            "interrupt (SIGINT, SIGTERM) from ending the run with its summary; set back now:")
    result.stdout.fnmatch_lines([
        f"*takes-sigalrm-fwd]: {head}",
        "*SIGALRM handler (signal.signal): the case time limit's -> "
        "conftest.pytest_attnperf_register_kernels.<locals>.takes_sigalrm.<locals>.own_alarm",
    ])
    result.stdout.fnmatch_lines([
        f"*cancels-alarm-fwd]: {head}",
        "*the case time limit's timer (signal.setitimer(signal.ITIMER_REAL)): cancelled*",
    ])
    result.stdout.fnmatch_lines([
        f"*ignores-sigterm-fwd]: {head}",
        "*SIGTERM handler (signal.signal): SIG_DFL (the default action) -> SIG_IGN (ignored)",
    ])

    assert list(runs.iterdir()) == []  # named once: nothing left for a later run to name


# -- torch's tensor methods, in this process -------------------------------------------------


def _into_tensorbase(name: str, value: object) -> None:
    """What setattr refuses: a value written into the C type's dict, its method cache invalidated."""
    import ctypes
    import gc

    gc.get_referents(vars(torch._C.TensorBase))[0][name] = value
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(torch._C.TensorBase))


def test_every_tensor_method_is_guarded_whether_set_over_an_inherited_one_deleted_or_written_into_tensorbase() -> None:
    tensor: Any = torch.Tensor  # its methods' stubs refuse other callables
    real_norm, real_neg = vars(tensor)["norm"], vars(torch._C.TensorBase)["neg"]
    before = torch_functions.snapshot_functions()
    try:
        tensor.abs = lambda self: self  # over torch._C.TensorBase.abs
        del tensor.norm
        _into_tensorbase("neg", lambda self: self)
        replaced = torch_functions.restore_functions(before)
    finally:  # torch's own, whatever happened
        if "abs" in vars(tensor):
            del tensor.abs
        if "norm" not in vars(tensor):
            tensor.norm = real_norm
        if vars(torch._C.TensorBase)["neg"] is not real_neg:
            _into_tensorbase("neg", real_neg)
    assert [(r.name, r.problem) for r in replaced] == [
        ("torch.Tensor.norm", None), ("torch.Tensor.abs", None), ("torch._C.TensorBase.neg", None)]
    first = torch_functions.describe_functions(replaced).splitlines()[0]
    assert first == "  torch.Tensor.norm: replaced by nothing (deleted)"
    assert torch.tensor([-2.0]).abs().item() == 2.0
    assert torch.tensor([2.0]).neg().item() == -2.0
    assert vars(torch.Tensor)["norm"] is real_norm


def test_a_name_added_to_tensor_that_shadows_nothing_is_no_replacement_and_stays() -> None:
    """Python's copyreg adds ``__slotnames__`` to ``torch.Tensor`` the first time a tensor is
    copied or pickled: a correct kernel that copies one must not fail, nor lose it for later cases."""
    import copy

    tensor: Any = torch.Tensor
    had = "__slotnames__" in vars(tensor)
    before = torch_functions.snapshot_functions()
    saved = vars(tensor).get("__slotnames__")
    try:
        if had:
            del tensor.__slotnames__
            before = torch_functions.snapshot_functions()
        copy.copy(torch.ones(2))
        assert "__slotnames__" in vars(tensor)  # what copyreg did
        assert torch_functions.restore_functions(before) == []
        assert "__slotnames__" in vars(tensor)
    finally:
        if had:
            tensor.__slotnames__ = saved


# -- inference mode, in this process --------------------------------------------------------


def _enter_python_guard(held: list[object]) -> None:
    mode = torch.inference_mode()
    mode.__enter__()
    held.append(mode)


def _enter_c_guard(held: list[object]) -> None:
    guard: Any = torch._C._InferenceMode(True)  # torch's C guard is unannotated
    guard.__enter__()
    held.append(guard)


def _enter_helper_guard(held: list[object]) -> None:
    enter: Any = torch.autograd.grad_mode._enter_inference_mode  # unannotated in torch
    held.append(enter(True))


@pytest.mark.parametrize("leak", [_enter_python_guard, _enter_c_guard, _enter_helper_guard],
                         ids=["inference_mode", "_InferenceMode", "_enter_inference_mode"])
def test_inference_mode_set_back_holds_while_the_kernels_guard_lives_and_after_it_is_freed(
    leak: Callable[[list[object]], None],
) -> None:
    """Set back with a kept guard of its own: off at once, a new tensor differentiable, and still
    off once the kernel's guard is freed (it restores what it saved: off)."""
    held: list[object] = []
    leak(held)
    assert torch.is_inference_mode_enabled()
    assert not torch.is_grad_enabled()
    switches.set_inference_mode(False)
    for _ in range(2):
        assert not torch.is_inference_mode_enabled()
        assert torch.is_grad_enabled()
        x = torch.ones(3, requires_grad=True)
        (grad,) = torch.autograd.grad((x * x).sum(), x)
        assert torch.equal(grad, torch.full((3,), 2.0))
        assert not x.is_inference()
        held.clear()  # the kernel's guard freed


def test_a_temporary_inference_mode_false_is_not_enough_while_a_guard_lives() -> None:
    """Why a guard is kept: ``torch.inference_mode(False).__enter__()`` on a temporary is undone
    as soon as the temporary is freed."""
    held: list[object] = []
    _enter_python_guard(held)
    torch.inference_mode(False).__enter__()
    assert torch.is_inference_mode_enabled()
    switches.set_inference_mode(False)
    held.clear()
    assert not torch.is_inference_mode_enabled()
