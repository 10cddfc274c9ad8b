"""GPU pre-flight for the torch-function guard and the rewritten timed draws (about 1-3 min), what
the CPU tests can only fake: run it on a new GPU, or after a torch or fla upgrade, before a whole run.

Run from the repository root:  python3 tools/device/preflight.py [--full]   (or: bash tools/h200.sh preflight)
(quick by default; --full runs every built-in kernel of Part B. On a CPU it runs a small subset,
with the host timer, to check the script itself.)

Part A: every step that first-touches a CUDA subsystem, compared with the plugin's own guard
(switches.snapshot_functions / restore_functions): any line other than "ok" means a correct
built-in path would read as "replaced torch functions".
Part B: the plugin's real path for a few built-in kernels per family, small shapes: check_case
(call_checked and its guard), then CudaTimer.measure with cold graphs (timed draws checked on
inputs rewritten in place, the guard before each check). Any FAIL/ERROR would also fail the suite.
Part C: controls that must FAIL: a kernel that keeps its answer by input address (caught by the
eager check of draw 1 or by a rewritten draw), and one whose capture records a copy of an answer kept from warm-up (only
the rewrite of cold graph 1's inputs can catch it on a real graph; if it passes, the rewrite does
not reach the graph's inputs).
Exit status: 0 all as expected, 1 otherwise.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.getcwd())  # the checkout's package, uninstalled

import pytest  # noqa: E402
import torch  # noqa: E402

from pytest_attnperf.measure import torch_functions as S  # noqa: E402

CUDA = torch.cuda.is_available()
FULL = "--full" in sys.argv
DEV = torch.device("cuda" if CUDA else "cpu")
BAD: list[str] = []
BASE = S.snapshot_functions()  # before CUDA is initialised, like the first case's


def guard(step: str, fn: Any) -> None:
    """Run ``fn`` (a first use of something), then compare torch's functions with ``BASE``."""
    began = time.perf_counter()
    try:
        fn()
        error = ""
    except Exception as exc:  # noqa: BLE001
        error = f" (step raised {type(exc).__name__}: {str(exc)[:120]})"
    replaced = S.restore_functions(BASE)
    line = "ok" if not replaced else "REPLACED:\n" + S.describe_functions(replaced)
    if replaced:
        BAD.append(f"guard: {step}")
    print(f"[A] {step:44s} {line}{error}  {time.perf_counter() - began:.1f}s", flush=True)


def qkv(b: int = 2, h: int = 4, t: int = 256, d: int = 64, grad: bool = True) -> tuple[Any, ...]:
    """Random q, k, v of one shape (bf16 on a GPU, fp32 on the CPU)."""
    dtype = torch.bfloat16 if CUDA else torch.float32
    return tuple(torch.randn(b, h, t, d, device=DEV, dtype=dtype, requires_grad=grad) for _ in range(3))


def sdpa_backends() -> None:
    """Each SDPA backend once, forward and backward."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        if not CUDA and backend != SDPBackend.MATH:
            continue
        q, k, v = qkv()
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def profiled() -> None:
    """One SDPA call under torch.profiler, CUDA activity included."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    q, k, v = qkv(grad=False)
    with profile(activities=acts) as prof:
        F.scaled_dot_product_attention(q, k, v)
        if CUDA:
            torch.cuda.synchronize()
    prof.events()


def graphs() -> None:
    """Warm-up on a side stream, a CUDA graph with external events, replay, memory statistics."""
    if not CUDA:
        return
    import torch.nn.functional as F

    q, k, v = qkv()
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (fwd and bwd) off the default stream, as the timer does
        warm = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(warm, (q, k, v), torch.ones_like(warm))
    torch.cuda.current_stream().wait_stream(side)
    start, end = (torch.cuda.Event(enable_timing=True, external=True) for _ in range(2))  # type: ignore[no-untyped-call]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        start.record()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
        end.record()
    g.replay()
    end.synchronize()
    start.elapsed_time(end)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.max_memory_allocated()
    torch.cuda.memory_stats()
    del out, grads
    g.reset()


def fla_first_calls() -> None:
    """fla's import and first calls: GDN's recurrent step with a state, GLA's chunk forward and backward."""
    import fla.ops.gated_delta_rule as gdn
    import fla.ops.gla as gla

    if not CUDA:
        return
    B, T, H, D = 2, 256, 4, 64
    x = [torch.randn(B, T, H, D, device=DEV, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    gh = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=DEV)).float()
    beta = torch.rand(B, T, H, device=DEV).bfloat16()
    h0 = torch.randn(B, H, D, D, device=DEV)
    gdn.fused_recurrent_gated_delta_rule(*(t.detach() for t in x), g=gh, beta=beta, scale=D ** -0.5,
                                         initial_state=h0, output_final_state=True)
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device=DEV)).bfloat16().requires_grad_()
    o, _ = gla.chunk_gla(*x, g, scale=D ** -0.5)
    # fla 0.6.0 refuses gated chunk backwards on Hopper with triton 3.6 (fla #640): a raise here is expected
    torch.autograd.grad(o, (*x, g), torch.ones_like(o), allow_unused=True)


def flex_compiled() -> None:
    """flex_attention with a sliding-window block mask through torch.compile, forward and backward."""
    if not CUDA:
        return
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v = qkv(t=512)
    mask = create_block_mask(lambda b, h, i, j: (j <= i) & (i - j < 128), None, None, 512, 512, device=DEV)
    out = torch.compile(flex_attention, dynamic=False)(q, k, v, block_mask=mask)
    torch.autograd.grad(out, (q, k, v), torch.ones_like(out))


def part_a() -> None:
    """Part A: the guard around each first use."""
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, device {DEV}", flush=True)
    guard("CUDA lazy init, current stream, memory stats",
          lambda: CUDA and (torch.cuda.init(), torch.cuda.current_stream(), torch.cuda.memory_allocated()))  # type: ignore[no-untyped-call]
    guard("SDPA flash/efficient/cudnn/math fwd+bwd", sdpa_backends)
    guard("torch.profiler (CPU+CUDA, kineto)", profiled)
    guard("CUDA graph capture, external events", graphs)
    guard("import fla + chunk_gla, GDN recurrent", fla_first_calls)
    guard("flex_attention torch.compile fwd+bwd", flex_compiled)
    guard("copy.copy(tensor) (copyreg __slotnames__)", lambda: copy.copy(torch.ones(2, device=DEV)))


def run_case(label: str, make: Any, timer: Any, plan: Any, expect_fail: str = "", pin: str | None = None) -> None:
    """``make()`` (a family's check_case) then ``timer.measure``: one line of what came of it;
    ``expect_fail``: what the timing's failure must say (a control that must fail)."""
    from contextlib import nullcontext

    from pytest_attnperf.families.checks import CheckFailed
    from pytest_attnperf.markers import pin_backend
    from pytest_attnperf.measure.verify import TimedDiffers

    before = S.snapshot_functions()
    began = time.perf_counter()
    outcome = ""
    try:
        with pin_backend(pin) if pin else nullcontext():
            checked = make()
            m = timer.measure(checked.call, plan)
        outcome = f"passed: verified {m.verified}, clock {m.clock}, notes {list(m.notes)[:2]}"
        ok = not expect_fail
    except TimedDiffers as exc:
        outcome = "TimedDiffers: " + str(exc).splitlines()[0][:220]
        ok = bool(expect_fail) and expect_fail in str(exc)
    except CheckFailed as exc:
        outcome, ok = "CheckFailed (checked call): " + str(exc).splitlines()[0][:200], False
    except pytest.skip.Exception as exc:
        outcome, ok = f"skipped: {str(exc)[:160]}", True
    except Exception as exc:  # noqa: BLE001
        outcome, ok = f"ERROR {type(exc).__name__}: {str(exc)[:200]}", False
        traceback.print_exc(limit=4)
    left = S.restore_functions(before)
    if left:
        ok = False
        outcome += " | left replaced: " + "; ".join(r.name for r in left)
    if not ok:
        BAD.append(label)
    tag = "ok  " if ok else "BAD "
    print(f"[{'C' if expect_fail else 'B'}] {tag}{label:44s} {outcome}  {time.perf_counter() - began:.1f}s", flush=True)


def part_b_c() -> None:
    """Parts B and C: built-ins through the real path, then the controls that must fail."""
    from pytest_attnperf.families.builtin import register_builtin
    from pytest_attnperf.families.linear import decode as dec
    from pytest_attnperf.families.linear import kernels as lin
    from pytest_attnperf.families.linear.case import LinearCase
    from pytest_attnperf.families.registry import Kernel, KernelRegistry
    from pytest_attnperf.families.softmax import kernels as sm
    from pytest_attnperf.families.softmax.kernels import SoftmaxCase
    from pytest_attnperf.hw.detect import detect_device
    from pytest_attnperf.measure.timing import CudaTimer, HostTimer, SamplingPlan

    reg = KernelRegistry()
    register_builtin(reg)
    kernels = {(k.family, k.name): k for k in reg}
    dt = "bf16" if CUDA else "fp32"
    timer = CudaTimer(detect_device()) if CUDA else HostTimer()
    plan = SamplingPlan(mode="cold" if CUDA else "host", min_samples=4, max_samples=8, budget_s=0.05,
                        warmup_calls=2, cold_graphs=3)
    gqa = SoftmaxCase(f"pf-b2-h4-kv2-t256-d64-causal-{dt}", 2, 4, 256, 64, dt, True, kv_heads=2, gpu=CUDA)
    win = SoftmaxCase(f"pf-b2-h4-t512-d64-w128-{dt}", 2, 4, 512, 64, dt, True, window=128, gpu=CUDA)
    lone = SoftmaxCase(f"pf-b1-h1-t256-d64-{dt}", 1, 1, 256, 64, dt, False, gpu=CUDA)  # rewrite cannot permute
    soft = ["sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "naive"] if CUDA else ["sdpa-math", "naive"]
    if CUDA and not FULL:
        soft = ["sdpa-flash", "sdpa-cudnn", "sdpa-efficient"]
    for direction in ("fwd", "fwdbwd"):
        for name in soft:
            k = kernels[("softmax", name)]
            for case in (gqa, lone) if FULL or not CUDA or direction == "fwdbwd" else (gqa,):
                run_case(f"softmax {name} {case.id} {direction}",
                         lambda k=k, case=case, d=direction: sm.check_case(k, case, d, DEV), timer, plan,
                         pin=k.sdpa_backend)
        if CUDA:
            k = kernels[("softmax", "flex-window")]
            run_case(f"softmax flex-window {win.id} {direction}",
                     lambda k=k, d=direction: sm.check_case(k, win, d, DEV), timer, plan)
    lcase = LinearCase(f"pf-b2-h4-t256-d64-{dt}", 2, 4, 256, 64, 64, dt, gpu=CUDA)
    linear = (["fla-chunk", "fla-fused-recurrent"] if CUDA else []) + (["fla-naive"] if FULL or not CUDA else [])
    for family in ("linear_attn", "gla", "simple_gla", "gdn") if FULL or not CUDA else ("linear_attn", "gdn"):
        for name in linear:
            found = kernels.get((family, name))
            if found is None:
                continue
            k = found
            for direction in ("fwd", "fwdbwd"):
                run_case(f"{family} {name} {direction}",
                         lambda k=k, f=family, d=direction: lin.check_case(f, k, lcase, d, DEV), timer, plan)
    if CUDA:
        dcase = dec.LinearDecodeCase("pf-b2-h4-t1-d64-bf16", 2, 4, 1, 64, 64, "bf16")
        decoders = ("linear_attn_decode", "gla_decode", "simple_gla_decode", "gdn_decode") if FULL else ("gdn_decode",)
        for family in decoders:
            k = kernels[(family, "fla-fused-recurrent")]
            run_case(f"{family} fla-fused-recurrent fwd",
                     lambda k=k, f=family: dec.check_case(f, k, dcase, "fwd", DEV), timer, plan)

    if CUDA:  # hot mode: a graph of many back-to-back calls, its last result checked on rewritten inputs
        k = kernels[("softmax", "sdpa-flash")]
        run_case("softmax sdpa-flash hot fwdbwd", lambda: sm.check_case(k, gqa, "fwdbwd", DEV), timer,
                 SamplingPlan(mode="hot", min_samples=4, max_samples=8, budget_s=0.05, warmup_calls=2,
                              hot_sample_ms=1.0), pin="flash")

    # C: must fail -- an answer kept by the inputs' addresses (a graph that captured an answer fails too)
    kept: dict[Any, Any] = {}

    def memo(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        key = tuple(x.data_ptr() for x in (q, k, v))
        if key not in kept:
            kept[key] = sm.sdpa(q, k, v, **opts).detach()
        return kept[key].clone()

    bad = Kernel("softmax", "memo-by-address", memo, backward=False)
    run_case("control: memo-by-address (must fail)", lambda: sm.check_case(bad, gqa, "fwd", DEV), timer, plan,
             expect_fail="the timed computation differs from the checked one")
    if not CUDA:
        return
    # C2: must fail on a real graph only -- eager calls do the work, a capture records a copy of an
    # answer kept from the warm-up: only the rewrite of graph 1's inputs can tell
    kept2: dict[Any, Any] = {}

    def captured(q: Any, k: Any, v: Any, **opts: Any) -> Any:
        key = tuple(x.data_ptr() for x in (q, k, v))
        capturing = torch.cuda.is_current_stream_capturing()
        if capturing and key in kept2:
            return kept2[key].clone()
        out = sm.sdpa(q, k, v, **opts)
        if not capturing:
            kept2[key] = out.detach().clone()
        return out

    bad2 = Kernel("softmax", "graph-captures-answer", captured, backward=False)
    run_case("control: graph captures an answer (must fail)", lambda: sm.check_case(bad2, gqa, "fwd", DEV), timer,
             plan, expect_fail="rewritten in place")


if __name__ == "__main__":
    part_a()
    part_b_c()
    print("\nPRE-FLIGHT", "OK" if not BAD else "PROBLEMS:\n  " + "\n  ".join(BAD))
    sys.exit(1 if BAD else 0)
