"""A kernel that changes torch's float32 precision, through either of torch's APIs, fails naming
the setting, and the project's setting is put back as the project made it.

Torch 2.9 and later keep a ``fp32_precision`` per backend (cuBLAS's and oneDNN's matmul, cuDNN's
convolutions and RNNs, a generic one their ``"none"`` defers to) beside the legacy settings
(``set_float32_matmul_precision``, ``allow_tf32``), which write through to them and refuse to
read once a project wrote both. For every pair below of what a project set and what a kernel then
did: the change is seen exactly when one of torch's settings, read through either API, differs;
after the set-back every one of them reads as it did, and nothing is reported as not set back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from pytest_attnperf.measure import switches


def _owner(path: str) -> Any:
    owner: Any = torch.backends
    for part in filter(None, path.split(".")):
        owner = getattr(owner, part, None)
    return owner if owner is not None and hasattr(owner, "fp32_precision") else None


OWNERS = {path or "generic": owner for path in switches.FP32_PRECISION_OWNERS if (owner := _owner(path)) is not None}
pytestmark = pytest.mark.skipif(not OWNERS, reason="this torch has no fp32_precision settings (before 2.9)")


def _set(path: str, value: str) -> Callable[[], None]:
    return lambda: setattr(_owner(path), "fp32_precision", value)


def _allow_tf32(owner: Any, value: bool) -> Callable[[], None]:
    return lambda: setattr(owner, "allow_tf32", value)


def _legacy(value: str) -> Callable[[], None]:
    return lambda: torch.set_float32_matmul_precision(value)


PROJECTS: dict[str, Callable[[], None]] = {
    "untouched": lambda: None,
    "legacy-high": _legacy("high"),
    "allow_tf32": _allow_tf32(torch.backends.cuda.matmul, True),
    "cublas-tf32": _set("cuda.matmul", "tf32"),  # both APIs written: the legacy getters refuse to read
    "generic-tf32": _set("", "tf32"),
    "onednn-bf16": _set("mkldnn.matmul", "bf16"),
}
KERNELS: dict[str, Callable[[], None]] = {
    "cublas-tf32": _set("cuda.matmul", "tf32"),
    "cublas-ieee": _set("cuda.matmul", "ieee"),
    "onednn-bf16": _set("mkldnn.matmul", "bf16"),
    "onednn-generic-bf16": _set("mkldnn", "bf16"),
    "generic-tf32": _set("", "tf32"),
    "generic-ieee": _set("", "ieee"),
    "cudnn-conv-ieee": _set("cudnn.conv", "ieee"),
    "legacy-high": _legacy("high"),
    "legacy-medium": _legacy("medium"),
    "allow_tf32": _allow_tf32(torch.backends.cuda.matmul, True),
    "cudnn-tf32-off": _allow_tf32(torch.backends.cudnn, False),
}


def _read(get: Callable[[], Any]) -> Any:
    try:
        return get()
    except RuntimeError as exc:  # torch refuses to read a legacy setting after both APIs were written
        return f"refused: {str(exc)[:60]}"


def _settings() -> dict[str, Any]:
    """Every float32 precision setting, read through both APIs."""
    return {
        "get_float32_matmul_precision": _read(torch.get_float32_matmul_precision),
        "cuda.matmul.allow_tf32": _read(lambda: torch.backends.cuda.matmul.allow_tf32),
        "cudnn.allow_tf32": _read(lambda: torch.backends.cudnn.allow_tf32),
        **{path: owner.fp32_precision for path, owner in OWNERS.items()},
    }


@pytest.fixture
def project_setting() -> Iterator[None]:
    """Around the test: torch's settings put back as this worker had them (written here through
    torch's own setters, not the code under test), and checked to read so."""
    start = _settings()
    legacy = start["get_float32_matmul_precision"]
    assert not str(legacy).startswith("refused"), start
    yield
    torch.set_float32_matmul_precision(legacy)
    for path, owner in OWNERS.items():  # each parent before its children
        owner.fp32_precision = start[path]
    assert _settings() == start


@pytest.mark.usefixtures("project_setting")
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("project", PROJECTS)
def test_a_precision_change_is_seen_and_set_back_through_either_api(project: str, kernel: str) -> None:
    PROJECTS[project]()
    found = _settings()
    guarded = switches.torch_globals()
    before = switches.snapshot_globals(guarded)
    KERNELS[kernel]()
    changed = _settings() != found
    seen = switches.changed_globals(before, switches.snapshot_globals(guarded))
    assert bool(seen) == changed, (found, _settings(), seen)
    assert switches.restore_globals(guarded, before) == []
    assert _settings() == found


@pytest.mark.usefixtures("project_setting")
def test_onednn_set_to_bf16_in_a_project_on_the_new_api_is_named() -> None:
    """The legacy getters cannot see oneDNN's setting, and refuse to read in such a project: only
    the backend's own ``fp32_precision`` shows the change."""
    PROJECTS["cublas-tf32"]()
    guarded = switches.torch_globals()
    before = switches.snapshot_globals(guarded)
    KERNELS["onednn-bf16"]()
    changes = switches.changed_globals(before, switches.snapshot_globals(guarded))
    assert switches.describe_changes(changes, []) == (
        "  float32 precision (torch.backends.mkldnn.matmul.fp32_precision): 'none' -> 'bf16'")
    assert switches.restore_globals(guarded, before) == []
    assert OWNERS["mkldnn.matmul"].fp32_precision == "none"
