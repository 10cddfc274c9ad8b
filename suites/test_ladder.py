"""Model ladder: an attention layer against fla's Gated DeltaNet layer at hidden 512, 768 and
1024, B=32 T=1024 bf16, forward and forward+backward (GPU only).

Heads: head dim 64 at hidden 512 and 768 (8 and 12 heads), 128 at 1024 (8 heads), so that heads
x head dim = hidden, as the layer-level crossover ``T* = 4D + 3 d_v`` assumes; the GDN layer's
value heads are twice as wide (fla's ``expand_v=2``). The attention layer runs once per fast SDPA
backend (flash, cuDNN) and the report compares GDN with the faster. Each layer's output is
checked against an fp64 evaluation of the same layer (``pytest_attnperf.families.layers.kernels``). The report's
ladder table takes the cases whose parameters name a ``layer``.

fla autotunes the GDN kernels once per (heads, key width, value width): three new tunings on a
fresh machine (minutes each); run this file after the sweep, as docs/reports.md does.
"""

from __future__ import annotations

import pytest

from pytest_attnperf.families.layers import kernels as layers
from pytest_attnperf.families.layers.kernels import LadderCase

CASES = (
    LadderCase("h512-b32-t1024-8x64-bf16", 32, 1024, 512, 8, 64, "bf16"),
    LadderCase("h768-b32-t1024-12x64-bf16", 32, 1024, 768, 12, 64, "bf16"),
    LadderCase("h1024-b32-t1024-8x128-bf16", 32, 1024, 1024, 8, 128, "bf16"),
)
LAYER_PARAMS = [
    pytest.param(name, id=name, marks=[pytest.mark.attnperf_sdpa_backend(name.split("-")[1])] if "-" in name else [])
    for name in layers.LAYERS
]


@pytest.mark.attnperf_requires_hw(gpu=True)
@pytest.mark.parametrize("direction", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("layer", LAYER_PARAMS)
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_ladder(case, layer, direction, attnperf_device, attnperf):
    """The layer's output against its fp64 evaluation, then its device time."""
    timed = layers.run_layer(layer, case, direction, attnperf_device)
    attnperf.measure(timed, cost=layers.cost(layer, case, direction), dtype=case.dtype)
