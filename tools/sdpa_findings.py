"""The catalogue's findings on PyTorch SDPA's GPU backends, reproduced outside the harness.

Causal attention aligned lower-right with more queries than keys leaves the top rows with no
visible key; their output should be 0 (FlashAttention's rule, and SDPA's math backend's). Each
line runs one backend on the smallest inputs of the catalogue row that failed and prints how many
of those rows are not 0. Run on a GPU: ``python3 tools/sdpa_findings.py``. docs/catalogue.md
("Known failures of built-in kernels") cites each line.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

DEVICE = "cuda"


def empty_rows(backend: SDPBackend, batch: int, heads: int, queries: int, keys: int, dim: int,
               dtype: torch.dtype) -> str:
    """SDPA pinned to ``backend``, causal lower-right: how many rows with no visible key are not 0."""
    torch.manual_seed(0)
    q = torch.randn(batch, heads, queries, dim, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(batch, heads, keys, dim, device=DEVICE, dtype=dtype) for _ in range(2))
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(queries, keys))
    empty = out[:, :, : queries - keys]  # row i sees keys up to i + keys - queries
    wrong = int((empty.abs().amax(-1) > 0).sum())
    return f"{wrong} of {empty.shape[0] * empty.shape[1] * empty.shape[2]} empty rows not 0"


def main() -> None:
    """Every finding, one line each."""
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for backend, shape, dtype in (
        (SDPBackend.EFFICIENT_ATTENTION, (2, 2, 17, 9, 32), torch.float32),
        (SDPBackend.EFFICIENT_ATTENTION, (2, 4, 1024, 700, 64), torch.bfloat16),
        (SDPBackend.CUDNN_ATTENTION, (2, 4, 1024, 700, 64), torch.bfloat16),
        (SDPBackend.MATH, (2, 4, 1024, 700, 64), torch.bfloat16),  # the control: 0 of them
    ):
        try:
            found = empty_rows(backend, *shape, dtype)
        except RuntimeError as exc:
            found = f"raised: {str(exc).splitlines()[0][:120]}"
        print(f"{backend.name:20s} B,H,Tq,Tk,D={shape} {str(dtype):15s} {found}", flush=True)


if __name__ == "__main__":
    main()
