"""Whole layers for the model ladder: an attention layer and fla's Gated DeltaNet layer, each
checked against an fp64 evaluation of the same layer (same weights, same inputs).

The attention layer's fp64 copy is the module in float64 with SDPA's math backend; the GDN
layer's kernels run in no fp64, so its fp64 evaluation is written out here from the layer's
weights, following fla 0.6's forward. Only the output is checked, normwise:
``|out - ref| / |ref| <= LAYER_UNITS * u(dtype)``, about one unit roundoff per rounding stage
(``LAYER_UNITS = 8``, 3.1% for bf16); gradients are timed, not checked. docs/reports.md, "The
suites".
"""

from __future__ import annotations

import copy
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_attnperf.families.checks import UNIT_ROUNDOFF
from pytest_attnperf.families.layers.costs import attention_layer, gdn_layer
from pytest_attnperf.families.linear.kernels import FLA_REFUSALS
from pytest_attnperf.families.linear.reference import gated_delta_rule
from pytest_attnperf.families.registry import refusal_reason

__all__ = ["LAYERS", "LAYER_UNITS", "LadderCase", "cost", "gdn_reference", "run_layer"]

LAYERS = ("attention-flash", "attention-cudnn", "gdn")
LAYER_UNITS = 8.0


@dataclass(frozen=True)
class LadderCase:
    """One rung: ``batch`` sequences of ``seq`` tokens of width ``hidden``, ``heads`` heads of
    ``head_dim`` (the GDN layer's value heads are ``expand_v`` times wider)."""

    id: str
    batch: int
    seq: int
    hidden: int
    heads: int
    head_dim: int
    dtype: str
    expand_v: float = 2.0
    gpu: bool = True


def _torch_dtype(name: str) -> Any:
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}[name]


def attention_module(case: LadderCase) -> Any:
    """q/k/v/o projections around causal SDPA, in float32 on the CPU (cast it where needed)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up
    import torch.nn.functional as F  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    class AttentionLayer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            inner = case.heads * case.head_dim
            self.q_proj = torch.nn.Linear(case.hidden, inner, bias=False)
            self.k_proj = torch.nn.Linear(case.hidden, inner, bias=False)
            self.v_proj = torch.nn.Linear(case.hidden, inner, bias=False)
            self.o_proj = torch.nn.Linear(inner, case.hidden, bias=False)

        def forward(self, x: Any) -> Any:
            b, t, _ = x.shape

            def heads(y: Any) -> Any:
                return y.view(b, t, case.heads, case.head_dim).transpose(1, 2)

            o = F.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)),
                                               is_causal=True)
            return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))

    return AttentionLayer()


def gdn_module(case: LadderCase) -> Any:
    """fla's GatedDeltaNet layer for the case, in float32 on the CPU (cast it where needed)."""
    from fla.layers import GatedDeltaNet  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    return GatedDeltaNet(hidden_size=case.hidden, head_dim=case.head_dim, num_heads=case.heads,
                         expand_v=case.expand_v, mode="chunk")


def gdn_reference(layer: Any, x: Any) -> Any:
    """The GDN layer's output on ``x`` ``[B, T, D]`` in float64 (see the module docstring)."""
    import torch.nn.functional as F  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


    x = x.detach().double()
    b, t, _ = x.shape
    heads, dk, dv = layer.num_heads, layer.head_k_dim, layer.head_v_dim

    def proj(linear: Any, y: Any) -> Any:
        return y @ linear.weight.detach().double().T

    def conv(y: Any, module: Any) -> Any:
        weight = module.weight.detach().double()  # [C, 1, K]
        bias = None if module.bias is None else module.bias.detach().double()
        out = F.conv1d(y.transpose(1, 2), weight, bias, padding=weight.shape[-1] - 1, groups=weight.shape[0])
        return F.silu(out[..., :t].transpose(1, 2))

    q = conv(proj(layer.q_proj, x), layer.q_conv1d).view(b, t, heads, dk)
    k = conv(proj(layer.k_proj, x), layer.k_conv1d).view(b, t, heads, dk)
    v = conv(proj(layer.v_proj, x), layer.v_conv1d).view(b, t, heads, dv)
    beta = proj(layer.b_proj, x).sigmoid() * (2.0 if layer.allow_neg_eigval else 1.0)
    gate = -layer.A_log.detach().double().exp() * F.softplus(proj(layer.a_proj, x) + layer.dt_bias.detach().double())
    o = gated_delta_rule(q, k, v, gate, beta, scale=dk**-0.5, l2norm_qk=True)
    norm = layer.o_norm
    o = o * (o.pow(2).mean(-1, keepdim=True) + norm.eps).rsqrt() * norm.weight.detach().double()
    o = o * F.silu(proj(layer.g_proj, x).view(b, t, heads, dv))
    return proj(layer.o_proj, o.reshape(b, t, heads * dv))


def attention_reference(layer: Any, x: Any) -> Any:
    """The attention layer's output on ``x`` in float64: a float64 copy through SDPA's math."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415 - torch loads on first use

    exact = copy.deepcopy(layer).double()
    with sdpa_kernel([SDPBackend.MATH]):
        return exact(x.detach().double()).detach()


def normwise_error(value: Any, reference: Any) -> float:
    ref = reference.double()
    return float((value.double() - ref).norm() / ref.norm().clamp_min(1e-300))


def run_layer(layer: str, case: LadderCase, direction: str, device: Any) -> Callable[[], Any]:
    """Build the layer (seeded by the case), check its output against its fp64 evaluation and
    return the zero-argument callable to time: a forward without autograd, or forward and
    the gradients of the input and every weight."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}; expected one of {LAYERS}")
    gdn = layer == "gdn"
    # the weights' draw, seeded, leaves every global generator as it was (manual_seed seeds the
    # CUDA ones too, so they are forked as well: case isolation fails a case that reseeds one)
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(zlib.crc32(f"{layer}:{case.id}".encode()))
        module = gdn_module(case) if gdn else attention_module(case)
    module = module.to(device=device, dtype=_torch_dtype(case.dtype))
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(case.id.encode()))
    x = torch.randn(case.batch, case.seq, case.hidden, generator=gen, device=device).to(_torch_dtype(case.dtype))
    backward = direction == "fwdbwd"
    module.train(backward)

    def forward(inputs: Any) -> Any:
        out = module(inputs)
        return out[0] if isinstance(out, tuple) else out

    with torch.no_grad():
        got = forward(x)
    reference = gdn_reference(module, x) if gdn else attention_reference(module, x)
    error, allowed = normwise_error(got, reference), LAYER_UNITS * UNIT_ROUNDOFF[case.dtype]
    if not torch.isfinite(got).all() or not error <= allowed:
        raise AssertionError(f"{layer} layer output: normwise relative error {error:.3g} against its fp64 "
                             f"evaluation exceeds {allowed:.3g} (= {LAYER_UNITS:g} x the {case.dtype} unit roundoff)")
    if not backward:
        def call() -> Any:
            with torch.no_grad():
                return forward(x)

        return call
    leaf = x.detach().requires_grad_(True)
    weights = [p for p in module.parameters() if p.requires_grad]
    grad_out = torch.randn(got.shape, generator=gen, device=device).to(got.dtype)

    def call_bwd() -> Any:
        out = forward(leaf)
        return (out,) + tuple(torch.autograd.grad(out, [leaf, *weights], grad_out))

    first_backward(layer, call_bwd)
    return call_bwd


def first_backward(layer: str, call_bwd: Callable[[], Any]) -> None:
    """Run the layer's backward once before it is timed: a refusal (a ``NotImplementedError``,
    or fla's message refusing its Hopper backward with a Triton older than 3.7.1) skips the case
    quoting it; any other error fails it."""
    try:
        call_bwd()
    except Exception as exc:
        reason = refusal_reason(exc, FLA_REFUSALS)
        if reason is None:
            raise
    else:
        return
    pytest.skip(f"the {layer} layer's backward is refused on this machine: {reason}")


def cost(layer: str, case: LadderCase, direction: str) -> Any:
    """The layer's analytic cost (``costs_layers``)."""
    shape: dict[str, Any] = dict(batch=case.batch, seq=case.seq, hidden=case.hidden, heads=case.heads,
                                 head_dim=case.head_dim, dtype=case.dtype, backward=direction == "fwdbwd")
    if layer == "gdn":
        return gdn_layer(expand_v=case.expand_v, **shape)
    return attention_layer(**shape)
