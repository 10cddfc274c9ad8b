"""Import torch, and the torch modules the plugin imports lazily, once in each process that runs
the tests (not in a pytest-xdist controller, which runs none).

pytester's in-process runs restore ``sys.modules`` after each run, so a module first imported
inside a run is imported again by the next user; torch's C-backed modules abort the process
when that happens. Importing them here keeps them loaded for the whole session.
"""

import gc
import os
import sys
import warnings
from pathlib import Path

# One thread per process: the tests' tensors are tiny, and under -n auto each core already runs a
# worker, whose pytester runs and subprocesses inherit this (set before torch starts its pool;
# torch.set_num_threads below where a plugin imported torch first). Several threads a process
# made the same tests 10-17% slower on a 2-core machine. Another value the caller set is theirs:
# torch reads it itself (it may be a list, "4,2", which set_num_threads does not take).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from pytest_attnperf.parallel import fleet  # noqa: E402


def _load_torch() -> None:
    """torch, and a tiny run of what the plugin and the tests run (profiler, flop counter, SDPA
    pins), so every module torch imports on first use is loaded before any pytester snapshot."""
    import torch  # noqa: PLC0415 - in the processes that run tests only
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
    from torch.utils.flop_counter import FlopCounterMode  # noqa: PLC0415

    q = torch.randn(1, 1, 4, 4, requires_grad=True)
    with torch.profiler.profile(), FlopCounterMode(display=False), sdpa_kernel([SDPBackend.MATH]):
        torch.autograd.backward(torch.nn.functional.scaled_dot_product_attention(q, q, q).sum())
    if os.environ["OMP_NUM_THREADS"] == "1":
        torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not fleet.is_controller(config):  # a pytest-xdist controller runs no test
        _load_torch()


def _load_fla() -> None:
    """fla's kernels, when installed: importing them starts torch.compile's machinery (its
    activations are compiled at import); first loaded inside a pytester run and imported again
    after it, dynamo and inductor register their backends twice and the second import fails
    ("duplicate name: eager"). Its layers and models (transformers: 2.7 s more a worker) are held back
    for the import, as fla does when they are not installed; a test that uses them imports them."""
    held = [name for name in ("fla.layers", "fla.models") if name not in sys.modules]
    for name in held:
        sys.modules[name] = None  # type: ignore[assignment]  # import fails: fla's __init__ skips it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # fla's "Triton is not supported on current platform" on a CPU
            import fla.ops  # noqa: F401, PLC0415
    except ImportError:
        pass
    finally:
        for name in held:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Before any test runs, and only where a test runs pytest inside pytest (the pure tests of
    tests/unit load fla themselves where they use it, and skip its ten seconds of start-up)."""
    if any("pytester" in getattr(item, "fixturenames", ()) for item in session.items):
        _load_fla()


@pytest.fixture(autouse=True)
def _earlier_tests_frozen(request: pytest.FixtureRequest) -> None:
    """A run inside a test collects garbage after each of its cases (the plugin's guard): what is
    alive before the test (torch's and fla's modules, 0.9 s a collection, and what earlier tests
    left, 86,000 objects and 40 ms a collection) is frozen first, so those collections walk only
    what this test makes. The plugin leaves objects frozen by its host alone."""
    if "pytester" in request.fixturenames:
        gc.collect()
        gc.freeze()


@pytest.fixture(autouse=True)
def _ceilings_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured ceilings are cached under $XDG_CACHE_HOME: a test's runs keep theirs in a folder
    of the test's own, never in the user's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))


@pytest.fixture(autouse=True)
def _terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs under test print for an 80-column terminal, whatever terminal (or CI log) runs the tests:
    pytest cuts its short summary lines to that width, except on a CI service (``CI`` or
    ``BUILD_NUMBER`` set), so the runs under test are told they are on none."""
    monkeypatch.setenv("COLUMNS", "80")
    for name in ("CI", "BUILD_NUMBER"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _not_a_worker_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """When these tests run under pytest-xdist, the runs they start are no workers of it:
    pytest-benchmark (which disables itself in a worker) reads the worker's environment."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


def pytest_attnperf_visible_gpus(config: pytest.Config) -> list[str]:
    """These tests time on fake hardware only: the host's GPUs are none of their business, and the
    pytest-xdist controller need not load torch to count them."""
    return []


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``pytest tests/ -n auto``: these tests time nothing on a device, so one worker per CPU
    (the plugin's own rule, one per GPU, is for the suites)."""
    return max(1, os.cpu_count() or 1)


UNIT = Path(__file__).parent / "unit"
_RUNS = ("runpytest", "runpytest_inprocess", "runpytest_subprocess", "inline_run", "inline_runsource",
         "inline_genitems", "runitem", "spawn_pytest", "runpython")


def _no_run_here(*args: object, **kwargs: object) -> None:
    pytest.fail("tests/unit runs no pytest inside pytest: an end-to-end test belongs in tests/", pytrace=False)


@pytest.fixture(autouse=True)
def _unit_tests_run_no_pytest(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/unit is the fast subset: a test there that starts a run inside its own fails
    (``pytester.parseconfig`` builds a real config without running one)."""
    if UNIT in request.node.path.parents:
        for name in _RUNS:
            monkeypatch.setattr(pytest.Pytester, name, _no_run_here)


# Modules whose tests share one expensive run (a module-scoped fixture, or a run cached per
# process): under -n each is sent whole to one worker, so the run happens once, not once a worker.
SHARED_RUNS = {"test_checks_faults.py", "test_faults_store.py", "test_integrity.py", "test_reference_linear.py",
               "test_zoo_catalogue.py", "test_zoo_linear.py", "test_zoo_softmax.py"}


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``pytest tests/ -n auto``: each test its own unit of work, as under ``--dist load``, except
    the modules of ``SHARED_RUNS``, one unit each (these tests measure nothing themselves: the
    plugin's grouping of a shape's cases is for the suites)."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunsTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if Path(module).name in SHARED_RUNS else nodeid

    return SharedRunsTogether(config, log)
