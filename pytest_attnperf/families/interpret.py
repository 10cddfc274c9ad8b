"""Triton kernels on the CPU: Triton's interpreter (``TRITON_INTERPRET=1``) runs a ``triton.jit``
function on CPU tensors, so a CPU-only run checks real Triton code (fla's fused recurrent kernels),
not only pure-PyTorch references. Check-only: the interpreter runs each program in Python, so its
time says nothing of the kernel's.

The interpreter must be on before the kernels' modules are imported (``triton.jit`` picks the
interpreter at decoration), and an autotuned kernel is held to its first configuration there
(``hold_autotuners``): benchmarking configurations in the interpreter costs seconds and chooses
nothing real.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["INTERPRETED_MAX_TOKENS", "autotuners_held", "enable", "hold_autotuners", "interpreted_refusal",
           "interpreter_refusal"]

VARIABLE = "TRITON_INTERPRET"
# batch x heads x sequence an interpreted kernel takes: its programs run in Python, about 3.6 ms a
# token and head for fla's fused recurrent forward at K=V=16 (docs/catalogue.md)
INTERPRETED_MAX_TOKENS = 48
_held: list[bool] = []


def enable() -> bool:
    """Turn the interpreter on for this process (a CPU-only run), unless the run set the variable
    itself or a Triton kernel module was already imported; whether it is on."""
    if VARIABLE not in os.environ and "fla" not in sys.modules:
        os.environ[VARIABLE] = "1"
    return os.environ.get(VARIABLE) == "1"


def interpreter_refusal() -> str | None:
    """Why this process cannot run Triton kernels on the CPU (None: it can)."""
    if os.environ.get(VARIABLE) != "1":
        return f"a Triton kernel runs on the CPU only under Triton's interpreter ({VARIABLE}=1 before it is imported)"
    try:
        import triton  # noqa: F401, PLC0415 - whether it imports at all, asked only on a CPU run
    except ImportError as exc:
        return f"Triton's interpreter needs triton ({exc})"
    hold_autotuners()
    return None


def interpreted_refusal(case: Any) -> str | None:
    """Why an interpreted kernel does not take ``case`` (too many tokens for the interpreter's pace)."""
    tokens = case.batch * case.heads * case.seq
    if tokens > INTERPRETED_MAX_TOKENS:
        return (f"Triton's interpreter runs {tokens} batch x heads x tokens too slowly for a check "
                f"(it takes up to {INTERPRETED_MAX_TOKENS}); a GPU runs this row")
    return None


def _first_config(run: Callable[..., Any], restore: bool) -> Callable[..., Any]:
    """``Autotuner.run`` that runs the first configuration the device has the resources for (the
    autotuner would skip one that needs more shared memory than the GPU has, and so does this);
    ``restore``: each kernel's configurations are as they were once the call returns."""
    from triton.runtime.errors import OutOfResources  # noqa: PLC0415 - torch loads on first use

    def first_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        configs = self.configs
        candidates = self.__dict__.setdefault("_attnperf_candidates", list(configs)) if not restore else list(configs)
        try:
            while True:
                self.configs = candidates[:1]
                try:
                    return run(self, *args, **kwargs)
                except OutOfResources:
                    if len(candidates) == 1:
                        raise
                    candidates.pop(0)
        finally:
            if restore:
                self.configs = configs

    return first_config


def hold_autotuners() -> None:
    """Hold every ``triton.autotune`` kernel to its first configuration, for good (once per
    process: Triton's interpreter on the CPU)."""
    if _held:
        return
    from triton.runtime.autotuner import Autotuner  # noqa: PLC0415 - torch loads on first use

    Autotuner.run = _first_config(Autotuner.run, restore=False)
    _held.append(True)


@contextlib.contextmanager
def autotuners_held() -> Iterator[None]:
    """Every ``triton.autotune`` kernel held to its first configuration while the block runs: a
    check of numbers chooses nothing by speed, and each new shape would autotune for seconds to
    minutes. With one configuration Triton's autotuner benchmarks and caches nothing, so the
    choices the timed cases make and record are untouched. A no-op where Triton is missing or the
    process holds its autotuners for good already."""
    try:
        from triton.runtime.autotuner import Autotuner  # noqa: PLC0415 - torch loads on first use
    except ImportError:
        Autotuner = None  # noqa: N806 - no Triton, no autotuner to hold
    if _held or Autotuner is None:
        yield
        return
    run = Autotuner.run
    Autotuner.run = _first_config(run, restore=True)
    try:
        yield
    finally:
        Autotuner.run = run
