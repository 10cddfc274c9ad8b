"""Linear attention families from flash-linear-attention: LA, GLA, simple GLA and Gated DeltaNet.

Inputs in fla's layout ``[B, T, H, D]``; every family reads out ``o = scale * S_t^T q_t``::

    linear_attn: fn(q, k, v, *, scale) -> o                 # S_t = S_{t-1} + k_t v_t^T
    gla:         fn(q, k, v, g, *, scale) -> o              # g: [B, T, H, K] log decay, fp32
    simple_gla:  fn(q, k, v, g, *, scale) -> o              # g: [B, T, H] log decay, fp32
    gdn:         fn(q, k, v, g, beta, *, scale) -> o        # g, beta: [B, T, H]; q, k L2-normed

Held to ``OUT_UNITS``/``GRAD_UNITS`` unit roundoffs: docs/checks.md, "The normwise bound of the linear families"."""

from __future__ import annotations

import contextlib
import importlib
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pytest_attnperf.families import values
from pytest_attnperf.families.checks import Answer, Checked, call_checked, expect_tensor, gradients, own_copies, plain
from pytest_attnperf.families.draws import timed
from pytest_attnperf.families.linear import axes as call_axes
from pytest_attnperf.families.linear import costs as costs_linear
from pytest_attnperf.families.linear import reference as ref
from pytest_attnperf.families.linear import relations
from pytest_attnperf.families.linear.case import LinearCase, value_grouped
from pytest_attnperf.families.linear.gate import gate_gradient
from pytest_attnperf.families.linear.reference import CHUNK, GLA_CHUNK, MAX_LOG_DECAY
from pytest_attnperf.families.linear.rule import (
    check_elements,
    check_tensor,
)
from pytest_attnperf.families.linear.variants import VARIANTS
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.measure.switches import exact_fp32

__all__ = [
    "FAMILIES", "FLA_IMPORTS", "LinearCase", "answer", "check_case", "check_elements", "check_tensor", "cost",
    "forget", "prepare", "register", "run_case",
]

FAMILIES = tuple(VARIANTS)
HEAD_AXIS = 2  # [B, T, H, ...]

# fla 0.6.0 refuses gated chunk backwards on Hopper with triton in [3.4.0, 3.7.1) (fla #640)
FLA_REFUSALS = (r"Triton >= 3\.4\.0 and < 3\.7\.1 on Hopper", r"see #640")


def _first(result: Any) -> Any:
    return result[0] if isinstance(result, tuple) else result


FLA_IMPORTS = ("fla",)  # what fla's kernels import on a first call: seconds, imported ahead (registry.import_ahead)


def _fla(module: str, name: str) -> Callable[..., Any]:

    fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return fn


# -- kernels ------------------------------------------------------------------------------


def _out(result: Any, axes: dict[str, Any], dtype: Any = None) -> Any:
    """``o`` of an fla call (cast to ``dtype`` where given), or ``(o, final_state)`` where the call
    asked for the final state (the ``state`` axis: ``families.linear.axes``)."""
    o = _first(result)
    o = o if dtype is None else o.to(dtype)
    return (o, result[1]) if axes.get("output_final_state") else o


def la_chunk(q: Any, k: Any, v: Any, *, scale: float, **axes: Any) -> Any:
    """fla chunk_linear_attn (normalize=False: plain linear attention)."""
    return _out(_fla("fla.ops.linear_attn", "chunk_linear_attn")(q, k, v, scale=scale, normalize=False, **axes), axes)


def la_fused_chunk(q: Any, k: Any, v: Any, *, scale: float, **axes: Any) -> Any:
    """fla fused_chunk_linear_attn (normalize=False)."""
    fn = _fla("fla.ops.linear_attn", "fused_chunk_linear_attn")
    return _out(fn(q, k, v, scale=scale, normalize=False, **axes), axes)


def la_fused_recurrent(q: Any, k: Any, v: Any, *, scale: float, **axes: Any) -> Any:
    """fla fused_recurrent_linear_attn."""
    fn = _fla("fla.ops.linear_attn", "fused_recurrent_linear_attn")
    return _out(fn(q, k, v, scale=scale, normalize=False, **axes), axes)


def la_naive(q: Any, k: Any, v: Any, *, scale: float, **axes: Any) -> Any:
    """fla's pure-PyTorch naive_recurrent_linear_attn (fp32 inside)."""
    fn = _fla("fla.ops.linear_attn.naive", "naive_recurrent_linear_attn")
    return _out(fn(q, k, v, scale=scale, normalize=False, **axes), axes)


def gla_chunk(q: Any, k: Any, v: Any, g: Any, *, scale: float, **axes: Any) -> Any:
    """fla chunk_gla."""
    return _out(_fla("fla.ops.gla", "chunk_gla")(q, k, v, g, scale=scale, **axes), axes)


def gla_fused_recurrent(q: Any, k: Any, v: Any, g: Any, *, scale: float, **axes: Any) -> Any:
    """fla fused_recurrent_gla (per-key gates as gk)."""
    return _out(_fla("fla.ops.gla", "fused_recurrent_gla")(q, k, v, gk=g, scale=scale, **axes), axes)


def gla_naive(q: Any, k: Any, v: Any, g: Any, *, scale: float, **axes: Any) -> Any:
    """fla's pure-PyTorch naive_recurrent_gla (fp32 inside; its scale is fixed at K^-0.5)."""
    if abs(scale - q.shape[-1] ** -0.5) > 1e-12:
        raise NotImplementedError("naive_recurrent_gla has no scale argument (always K^-0.5)")
    return _out(_fla("fla.ops.gla.naive", "naive_recurrent_gla")(q, k, v, g, **axes), axes, q.dtype)


def simple_gla_chunk(q: Any, k: Any, v: Any, g: Any, *, scale: float, **axes: Any) -> Any:
    """fla chunk_simple_gla (one gate per head and token)."""
    return _out(_fla("fla.ops.simple_gla", "chunk_simple_gla")(q, k, v, g=g, scale=scale, **axes), axes)


def simple_gla_naive(q: Any, k: Any, v: Any, g: Any, *, scale: float, **axes: Any) -> Any:
    """fla's pure-PyTorch naive_recurrent_simple_gla (fp32 inside)."""
    fn = _fla("fla.ops.simple_gla.naive", "naive_recurrent_simple_gla")
    return _out(fn(q, k, v, g, scale=scale, **{"output_final_state": False, **axes}), axes, q.dtype)


def gdn_chunk(q: Any, k: Any, v: Any, g: Any, beta: Any, *, scale: float, **axes: Any) -> Any:
    """fla chunk_gated_delta_rule."""
    return _out(_fla("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")(q, k, v, g, beta, scale=scale, **axes),
                axes)


def gdn_fused_recurrent(q: Any, k: Any, v: Any, g: Any, beta: Any, *, scale: float, **axes: Any) -> Any:
    """fla fused_recurrent_gated_delta_rule."""
    fn = _fla("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule")
    return _out(fn(q, k, v, g=g, beta=beta, scale=scale, **axes), axes)


def gdn_naive(q: Any, k: Any, v: Any, g: Any, beta: Any, *, scale: float, **axes: Any) -> Any:
    """fla's pure-PyTorch naive_recurrent_gated_delta_rule (fp32 inside; note its q, k, v,
    beta, g argument order), called with the inputs' device as torch's default device: it makes
    its output and state with ``torch.zeros(...).to(v)``, on the host and then copied over, and
    a copy from pageable host memory cannot be captured in a CUDA graph, so it was timed with
    events around eager launches, its ~10 launches per token paced by the host (docs/evidence.md,
    "The fla naive GDN recurrence on the device"). Made on the device, the zeros are one fill
    kernel each and the whole recurrence is graph-timed like fla's other naive references."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    fn = _fla("fla.ops.gated_delta_rule.naive", "naive_recurrent_gated_delta_rule")
    q, k = value_grouped(q, k, v)  # it has one head count: grouped values get their key heads repeated
    with torch.device(q.device):
        return _out(fn(q, k, v, beta, g, scale=scale, **axes), axes, q.dtype)


# batch x heads x sequence: the CPU table's rows and small model cases, none of the GPU table's
# (what they cost there: docs/evidence.md, "Where a whole-suite run's time went")
NAIVE_MAX_TOKENS = 8192


def _supports(name: str) -> Callable[[LinearCase], str | None]:
    """fla's naive recurrences loop over T in Python, several launches and a saved state per
    token (docs/families.md, "Linear attention"), so they take cases up to ``NAIVE_MAX_TOKENS``
    (batch x heads x sequence) only. (A case no kernel of a family takes: ``LinearCase.refusal``.)"""

    def supports(case: LinearCase) -> str | None:
        if name == "fla-naive" and case.batch * case.heads * case.seq > NAIVE_MAX_TOKENS:
            return ("fla's naive recurrence loops over T in Python: run at batch x heads x seq "
                    f"<= {NAIVE_MAX_TOKENS} only")
        return None

    return supports


def register(registry: KernelRegistry) -> None:
    """Add fla's linear-attention kernels, one per family and form, to ``registry``."""
    gpu = ("cuda",)
    for family, name, fn, form, kinds in (
        ("linear_attn", "fla-chunk", la_chunk, "chunk", gpu),
        ("linear_attn", "fla-fused-chunk", la_fused_chunk, "chunk", gpu),
        ("linear_attn", "fla-fused-recurrent", la_fused_recurrent, "recurrent", gpu),
        ("linear_attn", "fla-naive", la_naive, "recurrent", ("cuda", "cpu")),
        ("gla", "fla-chunk", gla_chunk, "chunk", gpu),
        ("gla", "fla-fused-recurrent", gla_fused_recurrent, "recurrent", gpu),
        ("gla", "fla-naive", gla_naive, "recurrent", ("cuda", "cpu")),
        ("simple_gla", "fla-chunk", simple_gla_chunk, "chunk", gpu),
        ("simple_gla", "fla-naive", simple_gla_naive, "recurrent", ("cuda", "cpu")),
        ("gdn", "fla-chunk", gdn_chunk, "chunk", gpu),
        ("gdn", "fla-fused-recurrent", gdn_fused_recurrent, "recurrent", gpu),
        ("gdn", "fla-naive", gdn_naive, "recurrent", ("cuda", "cpu")),
    ):
        registry.add(Kernel(family, name, fn, device_kinds=kinds, form=form, unsupported=FLA_REFUSALS,
                            supports=_supports(name), description=(fn.__doc__ or "").strip(),
                            tiled=name != "fla-naive",  # a torch loop keeps every step's state for autograd
                            imports=FLA_IMPORTS,
                            interpreted=name == "fla-fused-recurrent",  # Triton's interpreter runs it on a CPU
                            # fla's naive recurrences take an initial state and return the final one, not cu_seqlens
                            axes=("state",) if name == "fla-naive" else ("state", "varlen")))


# -- running a case -----------------------------------------------------------------------


@dataclass
class PreparedLinear:
    """A case's inputs, and its fp64 reference and same-dtype yardstick once a kernel has
    returned something to check."""

    inputs: tuple[Any, ...]  # q, k, v[, g[, beta]] as the kernel takes them
    grad_out: Any
    names: tuple[str, ...]
    family: str
    scale: float
    dtype: str
    backward: bool  # fwdbwd: the reference carries the gradient of each input
    case: LinearCase | None = None  # its call axes (state, packed sequences: ``families.linear.axes``)
    grad_state: Any = None  # the final state's gradient (the state axis, fwdbwd)
    _computed: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    @property
    def axes(self) -> tuple[str, ...]:
        """The call axes of the case (``LinearCase.axes``)."""
        return () if self.case is None else self.case.axes

    def split(self, tensors: Any) -> tuple[tuple[Any, ...], Any]:
        """``(q, k, v[, g[, beta]])`` and the initial state (None without the state axis)."""
        tensors = tuple(tensors)
        return (tensors[:-1], tensors[-1]) if "state" in self.axes else (tensors, None)

    def _forward(self, fn: Callable[..., Any], tensors: tuple[Any, ...], **kwargs: Any) -> tuple[Any, ...]:
        """``(out,)``, or ``(out, final_state)`` with the state axis: ``fn`` on each packed sequence
        from its own initial state where the case has them (``axes.per_sequence``)."""
        if not self.axes:
            return (fn(*tensors, **kwargs),)
        plain_tensors, h0 = self.split(tensors)
        assert self.case is not None
        out, final = call_axes.per_sequence(fn, plain_tensors, h0, self.case, **kwargs)
        return (out, final) if "state" in self.axes else (out,)

    def reference(self, form: str | None = None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """``(reference, yardstick)``: out, then the gradient of every input (fwdbwd), of every
        batch and head.

        The reference is the chunked form in float64 on the case's device (algebraically the
        token recurrence; tests hold them together to 1e-10). The yardstick is the same
        computation done plainly at the kernel's precision, in float32 with its output not
        rounded, and for a chunk kernel (``form`` "chunk", or None: a user's kernel) with every
        intermediate that a chunk kernel stores rounded to the case's dtype (the scores of each
        chunk, each chunk's state, the decayed queries and keys of its products, and for GDN the
        points ``reference_linear.chunk_gated_delta_rule`` names). In an fp32 case on a GPU
        (``tf32.rounds_products``) a chunk kernel's yardstick instead takes every matrix product's
        operands truncated to TF32, as Triton's ``tl.dot`` reads fp32 tiles there, in its backward
        too (``tf32.tf32_products``; docs/checks.md, "TF32 products"). A recurrent kernel (``form``
        "recurrent") keeps its state in float32 and updates it token by token, so its output's
        yardstick is the token recurrence in float32: its state's rounding error grows with the
        sequence as the kernel's does (the chunked form updates the state once per 64 tokens; at
        T=16384, fla's fused recurrent kernel erred by 20 times that form's RMS error at its
        worst element), and its gradients are a recurrent backward's in float32, the gate's from
        the reverse cumulative sum that fla's ``fused_recurrent`` backward uses (GDN's from the
        chunked form). fla's ``naive`` kernels take their gradients by autograd through their
        recurrence, more accurately than that sum, so the bound holds them more loosely. A chunk
        kernel's gradients come through autograd, which rounds them at the same points.

        Each is computed on first use, not before: a kernel that refuses the case (fla's Hopper
        backward, say) is skipped without paying for it.
        """
        import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


        rounded = self.dtype != "fp32"
        from pytest_attnperf.families import tf32  # noqa: PLC0415 - families.tf32 imports torch: kept out of the plugin's start-up

        products = not rounded and tf32.rounds_products(self.inputs[0].device)
        key = "recurrent" if form == "recurrent" else "chunk" if rounded else "tf32" if products else "fp32"
        with exact_fp32():  # TF32 only where the yardstick rounds to it itself, whatever the project set
            if "fp64" not in self._computed:
                self._computed["fp64"] = self._run(torch.float64, None)
            if key not in self._computed:
                self._computed[key] = (self._recurrent() if key == "recurrent"
                                       else self._run(torch.float32, torch_dtype(self.dtype) if rounded else None,
                                                      tf32=products))
        return self._computed["fp64"], self._computed[key]

    def _recurrent(self) -> tuple[Any, ...]:
        """A recurrent kernel's yardstick: the token recurrence in float32, output and (but for
        GDN, whose gradients come from the chunked form) gradients as a recurrent backward
        computes them (``reference_linear.recurrent_gradients``)."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


        with torch.no_grad():
            outs = self._forward(_recurrence_fn(self.family), self.inputs, scale=self.scale, compute=torch.float32)
            if not self.backward:
                return outs
        # the delta rule's, and with a state or packed sequences: the chunked form's, by autograd
        if VARIANTS[self.family].delta_rule or self.axes:
            if "fp32" not in self._computed:
                self._computed["fp32"] = self._run(torch.float32, None)
            return outs + self._computed["fp32"][len(outs):]
        out = outs[0]
        with torch.no_grad():
            q, k, v = self.inputs[:3]
            gate = self.inputs[3] if VARIANTS[self.family].factored_gate else None
            grads = ref.recurrent_gradients(q, k, v, gate, self.grad_out, scale=self.scale, compute=torch.float32)
        return (out,) + tuple(grads)

    def _run(self, compute: Any, store: Any, tf32: bool = False) -> tuple[Any, ...]:
        """The chunked form in ``compute``, ``store`` rounding what a chunk kernel stores; ``tf32``:
        every product's operands rounded to TF32 (``families.tf32``), forward and backward."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


        fn = _chunked_fn(self.family)
        leaves = [x.detach().to(compute).requires_grad_(self.backward) for x in self.inputs]
        # grouped values (GDN): a kernel forms a key head's dq and dk from each value head of its
        # group and may store those in the case's dtype before it sums them, so away from fp64 the
        # yardstick does the same (docs/checks.md, "Yardsticks"); the fp64 reference sums exactly
        split = self.backward and compute != torch.float64 and self.inputs[2].shape[2] != self.inputs[0].shape[2]
        taken = list(leaves)
        if split:
            expanded = value_grouped(leaves[0], leaves[1], leaves[2])
            taken[0], taken[1] = (x.detach().requires_grad_(True) for x in expanded)
        with torch.enable_grad() if self.backward else torch.no_grad():
            from pytest_attnperf.families.tf32 import tf32_products  # noqa: PLC0415 - families.tf32 imports torch: kept out of the plugin's start-up

            with tf32_products() if tf32 else contextlib.nullcontext():
                outs = self._forward(fn, tuple(taken), scale=self.scale, compute=compute, store=store,
                                     **self._chunking(compute))
            if not self.backward:
                return outs
            grad_outs = (self.grad_out.to(compute),) + (() if len(outs) == 1 else (self.grad_state.to(compute),))
            grads = list(torch.autograd.grad(outs, taken, grad_outs))
        if split:
            kept = torch_dtype(self.dtype) if self.dtype != "fp32" else compute
            heads = self.inputs[0].shape[2]
            for i in (0, 1):
                b, t, hv, d = grads[i].shape
                grads[i] = grads[i].to(kept).to(compute).view(b, t, heads, hv // heads, d).sum(3)
        if VARIANTS[self.family].factored_gate and compute != torch.float64 and not self.axes:
            grads[3] = self._gate_yardstick(leaves, grads)  # (its sum over a chunk starts from a zero state)
        return tuple(o.detach() for o in outs) + tuple(g.detach() for g in grads)

    def _chunking(self, compute: Any) -> dict[str, int]:
        """The chunk for the factored form (LA, simple GLA, GLA: ``exp(-gamma)`` inside a chunk) where
        its default would overflow ``compute`` on these gates (``reference.MAX_LOG_DECAY``): the
        largest power of two whose chunks all decay less, so a strong gate's reference stays exact
        (empty: the default)."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


        if not VARIANTS[self.family].factored_gate:
            return {}
        gate = self.inputs[3].detach().double()
        default = CHUNK if compute == torch.float64 or VARIANTS[self.family].gate == "head" else GLA_CHUNK
        limit, chunk = MAX_LOG_DECAY.get(str(compute), 80.0), default
        while chunk > 1 and _deepest_chunk(gate, chunk) > limit:
            chunk //= 2
        return {} if chunk == default else {"chunk": chunk}

    def _gate_yardstick(self, leaves: list[Any], grads: list[Any]) -> Any:
        """A GLA or simple GLA gate's gradient as chunk kernels form it, element by element the
        one further from the fp64 reference: through autograd (``grads[3]``), or as fla's chunk
        backward does, the reverse cumulative sum of ``q dq - k dk`` over the rest of each chunk
        of ``reference.CHUNK`` tokens from the float32 ``dq`` and ``dk``, plus what follows the
        chunk (``gate.gate_gradient``): at a chunk's first token that sum is longest, and the
        gradient there a small difference of large sums (the first token's is zero exactly;
        docs/checks.md, "Yardsticks")."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


        q, k = (x.detach() for x in leaves[:2])
        autograd = grads[3].detach()
        per_head = VARIANTS[self.family].gate == "head"
        summed = gate_gradient(q, k, grads[0].detach(), grads[1].detach(), per_head=per_head, chunk=CHUNK,
                               later=autograd)
        ref = self._computed["fp64"][4].double()
        return torch.where((summed.double() - ref).abs() > (autograd.double() - ref).abs(), summed, autograd)


def _deepest_chunk(gate: Any, chunk: int) -> float:
    """The largest total log decay (``-sum g``) inside one chunk of ``chunk`` tokens, over every
    sequence, head and channel (``gate`` ``[B, T, H(, K)]``)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    pad = (-gate.shape[1]) % chunk
    if pad:
        gate = torch.cat([gate, gate.new_zeros(gate.shape[0], pad, *gate.shape[2:])], dim=1)
    sums = gate.reshape(gate.shape[0], -1, chunk, *gate.shape[2:]).sum(2)
    return float(-sums.min())


def torch_dtype(name: str) -> Any:
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _inputs(family: str, case: LinearCase, device: Any, backward: bool, seed: int = 0) -> tuple[Any, ...]:

    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up
    import torch.nn.functional as F  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if why := case.refusal(family):
        raise ValueError(why)
    dtype = torch_dtype(case.dtype)
    label = f"{family}:{case.id}" + (f":{seed}" if seed else "")
    gen = torch.Generator(device=device).manual_seed(zlib.crc32(label.encode()))
    b, t, h, kd, vd = case.batch, case.seq, case.heads, case.key_dim, case.value_dim

    def draw(*shape: int) -> Any:
        return torch.randn(shape, generator=gen, device=device)

    hk = case.n_key_heads  # GDN's queries and keys may have fewer heads than its values (case.py)
    q, k, v = draw(b, t, hk, kd), draw(b, t, hk, kd), draw(b, t, h, vd)
    variant = VARIANTS[family]
    if variant.normalised_keys:  # GDN's keys and queries are L2-normalised, as in the layer
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    q_gain, kv_gain = values.linear_scales(case.values)
    tensors = [(q * q_gain).to(dtype), (k * kv_gain).to(dtype), (v * kv_gain).to(dtype)]
    regime = "gate-near-zero" if case.values == "large-state" else case.values
    if variant.gate == "channel":
        tensors.append(values.linear_gates(regime, draw, b, t, h, kd))  # fp32 log decay, as fla recommends
    elif variant.gate == "head":
        tensors.append(values.linear_gates(regime, draw, b, t, h))
    if variant.beta:
        beta = torch.sigmoid(draw(b, t, h)) * case.beta_max
        if case.values == "beta-bounds":
            beta = values.beta_bounds(beta, case.beta_max)
        tensors.append(beta.to(dtype))
    if case.state:  # fla keeps its states in float32
        tensors.append(draw(*call_axes.state_shape(case)))
    return tuple(x.requires_grad_(backward) for x in tensors)


def _references(family: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The family's chunked form and its token recurrence (``reference_linear``)."""
    forms: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
        "linear_attn": (ref.chunk_linear_attention, ref.linear_attention), "gla": (ref.chunk_gla, ref.gla),
        "simple_gla": (ref.chunk_simple_gla, ref.simple_gla), "gdn": (ref.chunk_gated_delta_rule, ref.gated_delta_rule),
    }
    return forms[family]


def _chunked_fn(family: str) -> Callable[..., Any]:
    return _references(family)[0]


def _recurrence_fn(family: str) -> Callable[..., Any]:
    return _references(family)[1]


_cache: dict[tuple[str, LinearCase, str, str, int], PreparedLinear] = {}


def forget() -> None:
    """Drop the inputs and references kept of the last case (``prepare``'s cache)."""
    _cache.clear()


def prepare(family: str, case: LinearCase, direction: str, device: Any, seed: int = 0) -> PreparedLinear:
    """The case's inputs (cached for the case, which every kernel shares, with its reference
    once computed: see ``PreparedLinear.reference``)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    key = (family, case, direction, str(device), seed)
    if key in _cache:
        return _cache[key]
    while len(_cache) >= 2:  # both directions of the case in hand; older cases dropped
        _cache.pop(next(iter(_cache)))
    inputs = _inputs(family, case, device, direction == "fwdbwd", seed)
    gen = torch.Generator(device=device).manual_seed(7 + seed)
    # large-state's gradient scaled as its queries are: dq = scale S dO stays within fp16 where S does not
    gain = values.linear_scales(case.values)[0]
    grad_out = (torch.randn(inputs[2].shape, generator=gen, device=device) * gain).to(inputs[0].dtype)
    grad_state = torch.randn(call_axes.state_shape(case), generator=gen, device=device) if case.state else None
    names = ("q", "k", "v", "g", "beta")[: len(inputs) - case.state] + (("h0",) if case.state else ())
    prepared = PreparedLinear(inputs, grad_out, names, family, case.scale, case.dtype, direction == "fwdbwd", case,
                        grad_state)
    _cache[key] = prepared
    return prepared


def answer(family: str, kernel: Kernel, case: LinearCase, direction: str, device: Any, seed: int = 0) -> Any:
    """Call ``kernel`` on ``case`` once, checking its contract (a tensor of ``v``'s shape, the
    query's dtype and the inputs' device; a gradient for every input; no writes into the
    inputs), not its numbers: a ``checks.Answer`` with the reference and yardstick of
    the kernel's form. The kernel gets its own copies of the case's inputs (``checks.own_copies``)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up


    p = prepare(family, case, direction, device, seed)
    backward = direction == "fwdbwd"
    q, v = p.inputs[0], p.inputs[2]
    expected = tuple(v.shape)

    def run_on(xs: tuple[Any, ...], grad_out: Any, check: bool = False) -> Any:
        if case.axes:
            return run_axes(xs, grad_out, check)
        out = plain(kernel, kernel.fn(*values.laid_out(case.layout, xs, HEAD_AXIS, 1), scale=case.scale))
        if check:
            expect_tensor(kernel.name, out, expected, q.dtype, q.device)
        if not backward:
            return (out,)
        if check:
            return (out,) + tuple(plain(kernel, g) for g in gradients(kernel.name, out, xs, p.names, grad_out))
        return (out,) + tuple(plain(kernel, g) for g in torch.autograd.grad(out, xs, grad_out))

    # a backward with a state: the final state's gradient is the last input, so a timed draw moves it
    # with the output gradient (``draws.NEGATED_BY_GRAD``); it is not differentiated
    grad_state_input = backward and case.state

    def run_axes(xs: tuple[Any, ...], grad_out: Any, check: bool) -> Any:
        xs, grad_state = (xs[:-1], xs[-1]) if grad_state_input else (xs, None)
        tensors, h0 = p.split(xs)
        result = kernel.fn(*values.laid_out(case.layout, tensors, HEAD_AXIS, 1), scale=case.scale,
                           **call_axes.call_kwargs(case, h0, q.device))
        outs = tuple(x for x in call_axes.returned(kernel, result, case, expected, q.dtype, q.device, check)
                     if x is not None)
        if not backward:
            return outs
        grad_outs = (grad_out,) + ((grad_state,) if case.state else ())
        grads = (call_axes.gradients(kernel.name, outs, xs, p.names, grad_outs) if check
                 else torch.autograd.grad(outs, xs, grad_outs))
        return outs + tuple(plain(kernel, g) for g in grads)

    inputs, grad_out = own_copies(p.inputs), p.grad_out.clone()
    input_names = p.names + (("grad_ht",) if grad_state_input else ())
    if grad_state_input:
        inputs += (p.grad_state.clone(),)

    def call() -> Any:
        return run_on(inputs, grad_out)

    got = call_checked(kernel, lambda: run_on(inputs, grad_out, True), ", ".join(input_names), inputs,
                       device)  # a refusal skips here
    reference, yardstick = p.reference(kernel.form)  # only now: a refused case never pays for it
    names = ("out", *(("ht",) if case.state else ()), *(f"d{n}" for n in p.names))[: len(got)]
    return Answer(names, tuple(x.detach() for x in got), reference[: len(got)], yardstick[: len(got)], call,
                  run_on=run_on, inputs=inputs, input_names=input_names, grad_out=grad_out if backward else None)


def check_case(family: str, kernel: Kernel, case: LinearCase, direction: str, device: Any, seed: int = 0) -> Any:
    """Check ``kernel`` against the fp64 chunked form (output; gradients of every input for
    ``fwdbwd``; every batch and head); return a ``checks.Checked``: the callable to time and
    each tensor's worst error over its bound. A ``relation`` row checks its metamorphic relation
    instead (``families.linear.relations``). A case with call axes is timed with its timed draws
    (an initial state, the final state's gradient and packed sequences move with them: heads
    permuted, values negated)."""
    if case.relation:
        return relations.check(family, kernel, case, prepare(family, case, "fwd", device, seed), device)
    a = answer(family, kernel, case, direction, device, seed)
    ratios = {name: check_tensor(family, f"{kernel.name} {name}", name, value, ref, yard, case.dtype)
              for name, value, ref, yard in zip(a.names, a.got, a.reference, a.yardstick, strict=True)}

    def check(label: str, name: str, value: Any, reference: Any, yardstick: Any) -> float:
        return check_tensor(family, label, name, value, reference, yardstick, case.dtype)

    heads = call_axes.STATE_HEAD_AXES if case.state else ()
    return Checked(timed(a, kernel.name, check, f"{family}:{case.id}:{direction}:{seed}", HEAD_AXIS,
                         head_axes=heads), ratios)


def run_case(
    family: str, kernel: Kernel, case: LinearCase, direction: str, device: Any, seed: int = 0
) -> Callable[[], Any]:
    """``check_case``, returning the zero-argument callable to time."""
    call: Callable[[], Any] = check_case(family, kernel, case, direction, device, seed).call
    return call


def cost(family: str, kernel: Kernel, case: LinearCase, direction: str) -> Any:
    """The analytic cost of the kernel's form (chunk or recurrent) on the case."""
    model = costs_linear.MODELS[family]
    grouped: dict[str, Any] = {"key_heads": case.n_key_heads} if VARIANTS[family].grouped_values else {}
    return model(batch=case.batch, heads=case.heads, seq=case.seq, key_dim=case.key_dim,
                 value_dim=case.value_dim, dtype=case.dtype, form=kernel.form or "chunk",
                 backward=direction == "fwdbwd", **grouped)
