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

import os
import sys
from typing import Any

__all__ = ["INTERPRETED_MAX_TOKENS", "enable", "hold_autotuners", "interpreted_refusal", "interpreter_refusal"]

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


def hold_autotuners() -> None:
    """Hold every ``triton.autotune`` kernel to its first configuration (once per process), or
    on a GPU to the first one the device has the resources for: the autotuner would skip a
    configuration that needs more shared memory than the GPU has, and so does this."""
    if _held:
        return
    from triton.runtime.autotuner import Autotuner  # noqa: PLC0415 - torch loads on first use
    from triton.runtime.errors import OutOfResources  # noqa: PLC0415 - as above

    run = Autotuner.run

    def first_config(self: Any, *args: Any, **kwargs: Any) -> Any:
        candidates = self.__dict__.setdefault("_attnperf_candidates", list(self.configs))
        while True:
            self.configs = candidates[:1]
            try:
                return run(self, *args, **kwargs)
            except OutOfResources:
                if len(candidates) == 1:
                    raise
                candidates.pop(0)

    Autotuner.run = first_config
    _held.append(True)
