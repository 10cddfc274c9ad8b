"""The catalogue's findings on fla's GPU kernels, reproduced outside the harness in a few lines each.

Each finding runs fla's kernel on the smallest inputs that show it and prints one line: what was
run, what happened and, where numbers are compared, the error against an fp64 recurrence written
here. Run on a GPU with flash-linear-attention installed: ``python3 tools/fla_findings.py``.
docs/catalogue.md ("Known failures of built-in kernels") cites each line.
"""

from __future__ import annotations

from collections.abc import Callable

import fla.ops.linear_attn as la
import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
from fla.ops.gla import chunk_gla
from fla.ops.simple_gla import chunk_simple_gla

DEVICE = "cuda"


def linear_fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal linear attention ``o_t = scale q_t S_t``, ``S_t = S_{t-1} + k_t v_t^T``, in fp64 ((B, T, H, D) layout)."""
    q, k, v = (x.double() for x in (q, k, v))
    state = torch.zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3], dtype=torch.float64, device=q.device)
    out = torch.empty(v.shape, dtype=torch.float64, device=q.device)
    for t in range(q.shape[1]):
        state = state + k[:, t, :, :, None] * v[:, t, :, None, :]
        out[:, t] = scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state)
    return out


def attempt(name: str, run: Callable[[], str]) -> None:
    """Print ``name`` and what ``run`` found, or the exception it raised (type and first line)."""
    try:
        found = run()
    except Exception as exc:  # noqa: BLE001 - the finding is the exception, printed
        lines = [line for line in str(exc).splitlines() if line.strip()]
        found = f"raised {type(exc).__name__}: {(lines[-1] if lines else '')[:160]}"
    print(f"{name:60s} {found}", flush=True)


def grid_limit(batch: int, heads: int) -> Callable[[], str]:
    """fla's chunk simple GLA forward at ``batch x heads`` rows (two tokens, head dim 4)."""
    def run() -> str:
        q, k, v = (torch.randn(batch, 2, heads, 4, device=DEVICE) for _ in range(3))
        g = -torch.rand(batch, 2, heads, device=DEVICE)
        out, _ = chunk_simple_gla(q, k, v, g=g, scale=0.5)
        torch.cuda.synchronize()
        return f"ran: out finite {bool(torch.isfinite(out).all())}"
    return run


def fp16_state(fn_name: str) -> Callable[[], str]:
    """fla's linear attention in fp16 where the state passes fp16's range but the output does not:
    keys and values 96x, queries 1/96x, 100 tokens of 16 channels."""
    def run() -> str:
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        q = torch.randn(1, 100, 2, 16, device=DEVICE, generator=gen) / 96
        k, v = (torch.randn(1, 100, 2, 16, device=DEVICE, generator=gen) * 96 for _ in range(2))
        exact = linear_fp64(q, k, v, 0.25)
        out = getattr(la, fn_name)(q.half(), k.half(), v.half(), scale=0.25, normalize=False)[0]
        bad = (~torch.isfinite(out)).nonzero()
        first = f", first at t={int(bad[0, 1])}" if len(bad) else ""
        return (f"reference |out| max {float(exact.abs().max()):.4g} (fp16 max 65504); kernel non-finite "
                f"{len(bad)} of {out.numel()}{first}")
    return run


def head_dim_256_fp32() -> str:
    """fla's chunk simple GLA at head dim 256 in fp32, autotuned as fla ships it."""
    q, k, v = (torch.randn(1, 33, 1, 256, device=DEVICE) for _ in range(3))
    g = -torch.rand(1, 33, 1, device=DEVICE)
    out, _ = chunk_simple_gla(q, k, v, g=g, scale=256**-0.5)
    torch.cuda.synchronize()
    return f"ran: out finite {bool(torch.isfinite(out).all())}"


def gla_backward_dim4() -> str:
    """fla's chunk GLA forward and backward at head dim 4 (65 tokens: two chunks)."""
    q, k, v = (torch.randn(1, 65, 1, 4, device=DEVICE, requires_grad=True) for _ in range(3))
    g = (-torch.rand(1, 65, 1, 4, device=DEVICE)).requires_grad_()
    out, _ = chunk_gla(q, k, v, g, scale=0.5)
    torch.cuda.synchronize()
    forward = "forward ran"
    out.sum().backward()
    return forward + ", backward ran"


def gdn_tokens(tokens: int) -> Callable[[], str]:
    """fla's chunk and fused recurrent gated delta rule in fp32 at ``tokens`` tokens against fp64."""
    def run() -> str:
        gen = torch.Generator(device=DEVICE).manual_seed(0)
        b, h, d = 1, 2, 16
        q = torch.randn(b, tokens, h, d, device=DEVICE, generator=gen)
        k = torch.nn.functional.normalize(torch.randn(b, tokens, h, d, device=DEVICE, generator=gen), dim=-1)
        v = torch.randn(b, tokens, h, d, device=DEVICE, generator=gen)
        g = -torch.rand(b, tokens, h, device=DEVICE, generator=gen)
        beta = torch.rand(b, tokens, h, device=DEVICE, generator=gen)
        exact = gdn_fp64(q, k, v, g, beta, d**-0.5)
        errors = []
        for fn in (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule):
            out = fn(q, k, v, g=g, beta=beta, scale=d**-0.5)[0]
            errors.append(float((out.double() - exact).norm() / exact.norm()))
        return f"normwise error chunk {errors[0]:.3g}, fused recurrent {errors[1]:.3g}"
    return run


def gdn_fp64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             scale: float) -> torch.Tensor:
    """The gated delta rule in fp64: ``S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T``,
    ``a_t = exp(g_t)``."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    state = torch.zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[3], dtype=torch.float64, device=q.device)
    out = torch.empty(v.shape, dtype=torch.float64, device=q.device)
    for t in range(q.shape[1]):
        state = state * g[:, t, :, None, None].exp()
        delta = v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        state = state + beta[:, t, :, None, None] * k[:, t, :, :, None] * delta[:, :, None, :]
        out[:, t] = scale * torch.einsum("bhk,bhkv->bhv", q[:, t], state)
    return out


def main() -> None:
    """Every finding, one line each."""
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    attempt("grid: chunk_simple_gla B=1092 x H=60 = 65520 rows", grid_limit(1092, 60))
    attempt("grid: chunk_simple_gla B=1100 x H=60 = 66000 rows", grid_limit(1100, 60))
    attempt("fp16 state: chunk_linear_attn", fp16_state("chunk_linear_attn"))
    attempt("fp16 state: fused_chunk_linear_attn", fp16_state("fused_chunk_linear_attn"))
    attempt("fp16 state: fused_recurrent_linear_attn", fp16_state("fused_recurrent_linear_attn"))
    attempt("head dim 256 fp32: chunk_simple_gla, autotuned", head_dim_256_fp32)
    attempt("head dim 4: chunk_gla forward then backward", gla_backward_dim4)
    for tokens in (1, 2, 17, 64):
        attempt(f"gdn fp32 T={tokens}: chunk vs fused recurrent", gdn_tokens(tokens))


if __name__ == "__main__":
    main()
