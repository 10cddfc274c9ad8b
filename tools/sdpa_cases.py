"""The short SDPA callables the timing diagnostics (cold_check, state_diag, shift_diag) time.

Each case is a row ``(label, backend, batch, heads, seq, causal, dtype)`` in ``CASES``, head
size 64, tensors laid out (B, H, T, D); a diagnostic picks its rows by label. ``None`` as the
backend leaves SDPA's own choice.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.nn.attention import SDPBackend  # noqa: E402

from pytest_attnperf.hardware import DetectedDevice  # noqa: E402
from pytest_attnperf.timing import CudaTimer  # noqa: E402

CASES = {row[0]: row for row in [  # (label, backend, batch, heads, seq, causal, dtype)
    ("cudnn b1-h12-t256 causal", SDPBackend.CUDNN_ATTENTION, 1, 12, 256, True, torch.bfloat16),
    ("cudnn b1-h12-t512 causal", SDPBackend.CUDNN_ATTENTION, 1, 12, 512, True, torch.bfloat16),
    ("flash b1-h12-t256 causal", SDPBackend.FLASH_ATTENTION, 1, 12, 256, True, torch.bfloat16),
    ("flash b1-h12-t512 causal", SDPBackend.FLASH_ATTENTION, 1, 12, 512, True, torch.bfloat16),
    ("efficient b1-h12-t256 causal", SDPBackend.EFFICIENT_ATTENTION, 1, 12, 256, True, torch.bfloat16),
    ("flash b2-h8-t512 fp16", SDPBackend.FLASH_ATTENTION, 2, 8, 512, False, torch.float16),
    ("cudnn b2-h8-t512 fp16", SDPBackend.CUDNN_ATTENTION, 2, 8, 512, False, torch.float16),
    ("sdpa default b1-h12-t256 causal", None, 1, 12, 256, True, torch.bfloat16),
    ("cudnn b32-h16-t1024 causal", SDPBackend.CUDNN_ATTENTION, 32, 16, 1024, True, torch.bfloat16),
    ("flash b32-h8-t1024 causal (control)", SDPBackend.FLASH_ATTENTION, 32, 8, 1024, True, torch.bfloat16),
]}


def inputs(row: tuple, generator: Any = None) -> tuple[Any, Any, Any]:
    """q, k, v for a case, on the GPU (from ``generator`` when given, for repeatable values)."""
    _, _, b, h, t, _, dtype = row
    return tuple(torch.randn(b, h, t, 64, device="cuda", dtype=dtype, generator=generator)  # type: ignore[return-value]
                 for _ in range(3))


def sdpa(row: tuple, q: Any, k: Any, v: Any) -> Callable[[], Any]:
    """One call of SDPA on these inputs, causal as the case says (its backend is pinned by the
    caller, around capture: ``torch.nn.attention.sdpa_kernel(row[1])``)."""
    causal = row[5]
    return lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def device_timer() -> CudaTimer:
    """The harness's timer for CUDA device 0."""
    props = torch.cuda.get_device_properties(0)
    return CudaTimer(DetectedDevice(kind="cuda", name=props.name, l2_bytes=props.L2_cache_size))


def run_all(cases: list[tuple], run_case: Callable[[tuple], dict[str, Any]], out: Path | None,
            first: Callable[[], dict[str, Any]] = dict) -> dict[str, Any]:
    """A diagnostic's run: about a second of spinning (clocks up before anything is timed), then
    ``first()``'s figures (the run's own, such as a floor) and ``run_case(case)`` for each case,
    a case that raises recorded with its error so the others still run; the report (versions,
    the GPU's UUID, the cases by label) is written to ``out`` after each case."""
    props = torch.cuda.get_device_properties(0)
    torch.cuda._sleep(2_000_000_000)
    torch.cuda.synchronize()
    report: dict[str, Any] = {"torch": torch.__version__, "gpu": str(getattr(props, "uuid", "")), **first(),
                              "cases": {}}
    for case in cases:
        try:
            report["cases"][case[0]] = run_case(case)
        except Exception as exc:  # noqa: BLE001 - one case failing must not lose the others
            report["cases"][case[0]] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        if out:
            out.write_text(json.dumps(report, indent=1))
    return report
