"""SDPA's log-sum-exp read from its flash backend (``families.softmax.builtins.sdpa_lse``) off the
CPU: the GPU backend takes fp16 and bf16 only and no mask, so a case with another dtype or a mask
is refused (a skip quoting the reason), never failed. Meta tensors reach the GPU branch here."""

from __future__ import annotations

import pytest
import torch

from pytest_attnperf.families.registry import KernelRegistry
from pytest_attnperf.families.softmax import kernels as softmax
from pytest_attnperf.families.softmax.builtins import sdpa_lse


def inputs(dtype: torch.dtype, kv_heads: int = 4) -> tuple[torch.Tensor, ...]:
    return (torch.empty(2, 4, 16, 32, dtype=dtype, device="meta"),
            *(torch.empty(2, kv_heads, 16, 32, dtype=dtype, device="meta") for _ in range(2)))


def test_fp32_off_the_cpu_is_refused_naming_its_dtype() -> None:
    with pytest.raises(NotImplementedError, match="fp16 and bf16 only.*float32"):
        sdpa_lse(*inputs(torch.float32), causal=True, scale=0.125)


def test_the_refusal_reaches_the_user_as_a_skip_of_the_flash_kernel() -> None:
    registry = KernelRegistry()
    softmax.register(registry)
    kernel = next(kernel for kernel in registry.family(softmax.FAMILY) if kernel.name == "sdpa-flash")
    q, k, v = inputs(torch.float32)
    with pytest.raises(pytest.skip.Exception, match="sdpa-flash does not support this case: NotImplementedError: "
                                                    "SDPA's GPU flash backend takes fp16 and bf16 only: no LSE of "
                                                    "float32 inputs"):
        kernel.call_or_skip(lambda: kernel.fn(q, k, v, causal=True, scale=0.125, return_lse=True))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_mask_off_the_cpu_is_still_refused(dtype: torch.dtype) -> None:
    q, k, v = inputs(dtype)
    mask = torch.ones(1, 1, 16, 16, dtype=torch.bool, device="meta")
    with pytest.raises(NotImplementedError, match="takes no mask"):
        sdpa_lse(q, k, v, causal=False, scale=0.125, attn_mask=mask)
    with pytest.raises(NotImplementedError, match="takes no mask"):  # lower-right causal is a mask too
        sdpa_lse(q, k[:, :, :8], v[:, :, :8], causal=True, scale=0.125)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp16_and_bf16_go_to_the_flash_backend(dtype: torch.dtype) -> None:
    out, lse = sdpa_lse(*inputs(dtype, kv_heads=2), causal=True, scale=0.125)
    assert (out.shape, out.dtype) == ((2, 4, 16, 32), dtype)
    assert lse.shape == (2, 4, 16)
