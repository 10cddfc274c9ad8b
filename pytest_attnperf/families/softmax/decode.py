"""Softmax decode and chunked prefill: ``Tq`` new query tokens (1 to 16) over a KV cache of ``Tk``
keys, causal aligned to the end of the cache (lower-right), forward only.

The cases are ordinary ``SoftmaxCase`` rows with ``kv_seq`` set, so every softmax kernel runs on
them with the family's call; the GPU table is Llama-3-8B's attention. The test is the softmax
suite's own (``test_softmax``, under the name ``test_softmax_decode``). docs/decode.md, "Softmax
attention over a KV cache".
"""

from __future__ import annotations

from pytest_attnperf.families.softmax.kernels import SoftmaxCase
from pytest_attnperf.families.softmax.suite import test_softmax as test_softmax_decode

__all__ = ["ATTNPERF_CASES", "ATTNPERF_DIRECTIONS", "ATTNPERF_FAMILY", "CASES", "CPU", "DIRECTIONS", "FAMILY", "GPU",
           "cache_label", "decode_case", "test_softmax_decode"]

FAMILY = "softmax"
DIRECTIONS = ("fwd",)  # serving runs no backward


def cache_label(tokens: int) -> str:
    """A cache length as ids write it: ``32k`` for 32768, ``100`` for 100."""
    return f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)


def decode_case(batch: int, queries: int, cache: int, *, heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
                dtype: str = "bf16", causal: bool = True, window: int | None = None, gpu: bool = True,
                prefix: str = "") -> SoftmaxCase:
    """A decode row with a readable id: ``b32-h32-kv8-t1-cache32k-d128-causal-bf16``."""
    parts = [prefix + f"b{batch}", f"h{heads}", f"kv{kv_heads}", f"t{queries}", f"cache{cache_label(cache)}",
             f"d{head_dim}"]
    parts += [f"w{window}"] if window else []
    parts += ["causal"] if causal and not window else []
    return SoftmaxCase("-".join(parts + [dtype]), batch, heads, queries, head_dim, dtype, causal, kv_heads=kv_heads,
                       window=window, gpu=gpu, kv_seq=cache)


GPU = (
    # one token, B=1, the cache from 1K to 128K (8K left out: its 34 MB of cache sit in the L2)
    *(decode_case(1, 1, cache) for cache in (1024, 32768, 131072)),
    # one token, a batch of 32 requests, 1K to 32K (32 x 8 x 32K x 128 x 2 x 2 bytes: 4.3 GB of cache)
    *(decode_case(32, 1, cache) for cache in (1024, 8192, 32768)),
    # chunked prefill: 16 tokens at once
    decode_case(1, 16, 32768),
    decode_case(32, 16, 8192),
    # Mistral's window: the last 4096 keys of a 32K cache
    decode_case(1, 1, 32768, window=4096),
)

CPU = (
    decode_case(2, 1, 256, heads=8, kv_heads=2, head_dim=32, dtype="fp32", gpu=False, prefix="cpu-"),
    decode_case(2, 4, 128, heads=8, kv_heads=2, head_dim=32, dtype="fp32", gpu=False, prefix="cpu-"),
    decode_case(1, 16, 64, heads=4, kv_heads=4, head_dim=32, dtype="fp32", window=24, gpu=False, prefix="cpu-"),
    decode_case(1, 2, 64, heads=4, kv_heads=4, head_dim=32, dtype="fp32", causal=False, gpu=False, prefix="cpu-"),
    decode_case(2, 1, 512, heads=4, kv_heads=1, head_dim=64, dtype="bf16", gpu=False, prefix="cpu-"),
)

CASES = GPU + CPU

ATTNPERF_FAMILY, ATTNPERF_CASES, ATTNPERF_DIRECTIONS = FAMILY, CASES, DIRECTIONS  # what the plugin parametrizes
