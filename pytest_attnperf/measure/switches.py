"""torch's process-wide state around an attention case: what a kernel can leave changed.

- **switches**: grad and inference mode, default dtype and device, SDPA backends, deterministic
  algorithms, cuDNN, TF32 and matmul precision, autocast, anomaly mode, CPU threads, the current
  CUDA device and stream (``torch_globals``): read before and after a case, compared, set back;
- **random generators**: the default CPU one and, once CUDA is initialized, each device's
  (``snapshot_rng``, ``restore_rng``);
- **torch functions**: the identity of the functions the suites and kernels call
  (``TORCH_FUNCTIONS``), so a kernel that monkeypatches one is named and the original put back.

torch is imported only by the functions that read it, and only an already imported module is
looked at (``flex_attention``'s is not imported to check it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TORCH_FUNCTIONS",
    "GlobalSwitch",
    "changed_globals",
    "describe_changes",
    "describe_functions",
    "restore_functions",
    "restore_globals",
    "restore_rng",
    "snapshot_functions",
    "snapshot_globals",
    "snapshot_rng",
    "torch_globals",
]


@dataclass(frozen=True)
class Unreadable:
    """A switch whose getter raised (torch refuses to read TF32 flags set through both its
    legacy and its new API); equal to another only with the same error."""

    error: str

    def __repr__(self) -> str:
        return f"<unreadable: {self.error}>"


@dataclass(frozen=True)
class GlobalSwitch:
    """One process-wide setting: the name a failure shows, how to read it and to set it back."""

    name: str
    get: Callable[[], Any]
    set: Callable[[Any], None]


def torch_globals() -> tuple[GlobalSwitch, ...]:
    """The switches a kernel can leave changed, in the order they are set back (the float32
    matmul precision before the TF32 flags it also sets)."""
    import torch

    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn

    def attr(owner: Any, name: str, label: str) -> GlobalSwitch:
        return GlobalSwitch(label, lambda: getattr(owner, name), lambda value: setattr(owner, name, value))

    def set_grad(value: Any) -> None:
        torch.set_grad_enabled(value)

    switches = [
        GlobalSwitch("inference mode (torch.is_inference_mode_enabled)", torch.is_inference_mode_enabled,
                     set_inference_mode),  # first: setting it sets grad mode too
        GlobalSwitch("grad mode (torch.is_grad_enabled)", torch.is_grad_enabled, set_grad),
        GlobalSwitch("default dtype (torch.get_default_dtype)", torch.get_default_dtype, torch.set_default_dtype),
        GlobalSwitch("SDPA flash backend (torch.backends.cuda.flash_sdp_enabled)",
                     cuda.flash_sdp_enabled, cuda.enable_flash_sdp),
        GlobalSwitch("SDPA memory-efficient backend (torch.backends.cuda.mem_efficient_sdp_enabled)",
                     cuda.mem_efficient_sdp_enabled, cuda.enable_mem_efficient_sdp),
        GlobalSwitch("SDPA math backend (torch.backends.cuda.math_sdp_enabled)",
                     cuda.math_sdp_enabled, cuda.enable_math_sdp),
        GlobalSwitch("deterministic algorithms (torch.are_deterministic_algorithms_enabled)",
                     lambda: (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled()),
                     lambda value: torch.use_deterministic_algorithms(value[0], warn_only=value[1])),
        GlobalSwitch("float32 matmul precision (torch.get_float32_matmul_precision)",
                     torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        attr(cuda.matmul, "allow_tf32", "TF32 matmul (torch.backends.cuda.matmul.allow_tf32)"),
        attr(cudnn, "allow_tf32", "TF32 cuDNN (torch.backends.cudnn.allow_tf32)"),
        attr(cuda.matmul, "allow_fp16_reduced_precision_reduction",
             "fp16 reduced-precision reduction (torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)"),
        attr(cuda.matmul, "allow_bf16_reduced_precision_reduction",
             "bf16 reduced-precision reduction (torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)"),
        attr(cudnn, "enabled", "cuDNN (torch.backends.cudnn.enabled)"),
        attr(cudnn, "benchmark", "cuDNN benchmark (torch.backends.cudnn.benchmark)"),
        attr(cudnn, "deterministic", "cuDNN deterministic (torch.backends.cudnn.deterministic)"),
        GlobalSwitch("anomaly detection (torch.is_anomaly_enabled)", torch.is_anomaly_enabled,
                     torch.set_anomaly_enabled),
        GlobalSwitch("CPU threads (torch.get_num_threads)", torch.get_num_threads, torch.set_num_threads),
    ]
    if hasattr(cuda, "cudnn_sdp_enabled"):
        switches.insert(6, GlobalSwitch("SDPA cuDNN backend (torch.backends.cuda.cudnn_sdp_enabled)",
                                        cuda.cudnn_sdp_enabled, cuda.enable_cudnn_sdp))
    if hasattr(torch, "get_default_device"):
        def set_device(value: Any) -> None:  # None, not "cpu": no device mode left on every op
            torch.set_default_device(None if value == torch.device("cpu") else value)

        switches.insert(3, GlobalSwitch("default device (torch.get_default_device)",
                                        torch.get_default_device, set_device))
    for device in ("cpu", "cuda"):
        switches.append(_autocast(torch, device))
    switches.extend(_cuda_current(torch))
    return tuple(switches)


_HELD_GUARDS: list[Any] = []  # the inference-mode guards ``set_inference_mode`` entered, alive for the run


def set_inference_mode(enabled: bool) -> None:
    """Put inference mode back to ``enabled`` on this thread, also while a guard a kernel entered
    and kept (``torch.inference_mode().__enter__()`` on an object it holds) is alive.

    Inference mode is an RAII guard (``torch._C._InferenceMode``, c10's ``InferenceMode``): its
    constructor saves the thread's autograd state and dispatch keys and sets those of the mode,
    its destructor restores what it saved. ``torch.inference_mode(False).__enter__()`` on a
    temporary object is undone as soon as the temporary is freed, and exiting the kernel's guard
    from here would need the object and the order it was entered in. So a new guard for the wanted
    mode is entered and kept for the process's life: it sets grad mode, inference mode, forward
    gradients and the autograd dispatch keys together, as the mode does. The kernel's guard, when
    it is freed later, restores the state it saved on entering, which is the one before the case.
    """
    import torch

    guard: Any = torch._C._InferenceMode(enabled)  # torch's C guard is unannotated
    guard.__enter__()
    _HELD_GUARDS.append(guard)


def _autocast(torch: Any, device: str) -> GlobalSwitch:
    def get() -> bool:
        return bool(torch.is_autocast_enabled(device))

    def put(value: bool) -> None:
        torch.set_autocast_enabled(device, value)

    return GlobalSwitch(f"{device} autocast (torch.is_autocast_enabled('{device}'))", get, put)


class _NotInUse:
    """CUDA not initialized: nothing to compare (initializing it is no leak)."""

    def __repr__(self) -> str:
        return "<CUDA not initialized>"


NOT_IN_USE = _NotInUse()


def _cuda_current(torch: Any) -> list[GlobalSwitch]:
    """The current CUDA device and stream, read only once CUDA is initialized (a case that
    leaves a side stream current sends every later case's work to it)."""

    def when_initialized(read: Callable[[], Any]) -> Callable[[], Any]:
        return lambda: read() if torch.cuda.is_initialized() else NOT_IN_USE

    return [
        GlobalSwitch("current CUDA device (torch.cuda.current_device)",
                     when_initialized(torch.cuda.current_device), torch.cuda.set_device),
        GlobalSwitch("current CUDA stream (torch.cuda.current_stream)",
                     when_initialized(torch.cuda.current_stream), torch.cuda.set_stream),
    ]


def _read(switch: GlobalSwitch) -> Any:
    try:
        return switch.get()
    except Exception as exc:  # noqa: BLE001 - a switch torch refuses to read is compared as that refusal
        return Unreadable(f"{type(exc).__name__}: {str(exc)[:80]}")


def snapshot_globals(switches: tuple[GlobalSwitch, ...]) -> dict[str, Any]:
    """The current value of each switch, by name (an ``Unreadable`` where torch refuses to read it)."""
    return {s.name: _read(s) for s in switches}


def changed_globals(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(name, before, after)`` for each switch that differs; one not in use on either side
    (CUDA not initialized) is not compared."""
    return [(name, was, after[name]) for name, was in before.items()
            if name in after and NOT_IN_USE not in (was, after[name]) and was != after[name]]


def restore_globals(switches: tuple[GlobalSwitch, ...], before: dict[str, Any]) -> list[str]:
    """Set every switch that differs from ``before`` back to it; the names of those that could
    not be set back (or read back equal)."""
    failed: list[str] = []
    for switch in switches:
        was = before.get(switch.name)
        if isinstance(was, (Unreadable, _NotInUse)) or _read(switch) == was:
            continue
        try:
            switch.set(was)
        except Exception as exc:  # noqa: BLE001 - reported with the case; the run goes on
            failed.append(f"{switch.name} ({type(exc).__name__}: {str(exc)[:80]})")
    failed.extend(name for name, *_ in changed_globals(before, snapshot_globals(switches))
                  if not any(f.startswith(name) for f in failed))
    return failed


def snapshot_rng() -> dict[str, tuple[int, Any]]:
    """The seed and state (a ByteTensor) of the default CPU generator and, only once CUDA is
    initialized (this never initializes it), of every CUDA device's, by generator."""
    import torch

    cuda: Any = torch.cuda
    rng = {"CPU": (torch.initial_seed(), torch.get_rng_state())}
    if cuda.is_initialized():
        for index, state in enumerate(cuda.get_rng_state_all()):
            rng[f"cuda:{index}"] = (cuda.default_generators[index].initial_seed(), state)
    return rng


def restore_rng(before: dict[str, tuple[int, Any]]) -> tuple[list[tuple[str, Any, Any]], list[str]]:
    """Put every generator whose state differs from ``before`` back to it. ``(name, seed before,
    seed after)`` for each the case reseeded (a draw changes the state, not the seed), and the
    generators that could not be set back."""
    import torch

    def differ(now: dict[str, tuple[int, Any]]) -> list[str]:
        return [name for name, (_, state) in before.items() if name in now and not torch.equal(state, now[name][1])]

    after = snapshot_rng()
    reseeded = [(f"{name} generator's seed (torch.manual_seed; torch.initial_seed)", seed, after[name][0])
                for name, (seed, _) in before.items() if name in after and seed != after[name][0]]
    failed: list[str] = []
    changed = differ(after)
    try:
        if "CPU" in changed:
            torch.set_rng_state(before["CPU"][1])
        if any(name != "CPU" for name in changed):
            torch.cuda.set_rng_state_all([state for name, (_, state) in before.items() if name != "CPU"])
    except Exception as exc:  # noqa: BLE001 - reported with the case; the run goes on
        failed.append(f"the global random generators ({type(exc).__name__}: {str(exc)[:80]})")
    if changed and not failed:
        failed.extend(f"{name} generator's state (torch.set_rng_state)" for name in differ(snapshot_rng()))
    return reseeded, failed


def describe_changes(changes: list[tuple[str, Any, Any]], not_restored: list[str]) -> str:
    """One line per change (``name: before -> after``), then what could not be set back."""
    lines = [f"  {name}: {was!r} -> {now!r}" for name, was, now in changes]
    text = "\n".join(lines)
    if not_restored:
        text += "\n  could not be set back: " + "; ".join(not_restored)
    return text


# -- torch functions -----------------------------------------------------------------------

TORCH_FUNCTIONS: tuple[str, ...] = (
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.functional.softmax",
    "torch.matmul",
    "torch.bmm",
    "torch.softmax",
    "torch.einsum",
    "torch.compile",
    "torch.autograd.grad",
    "torch.Tensor.softmax",
    "torch.Tensor.__matmul__",
    "torch.nn.attention.flex_attention.flex_attention",
)
"""The torch functions the suites and kernels call whose identity is checked around each case:
a module's attribute (its module must be imported already) or a class's
(``torch.Tensor.softmax``). Add a name here to guard one more."""

_MISSING = object()  # an attribute the owner's ``__dict__`` does not hold (inherited, or absent)

Slot = tuple[Any, str, Any]  # the owner (module or class), the attribute, what its __dict__ held


def _owner(qualname: str) -> tuple[Any, str] | None:
    """The imported module or class that holds ``qualname``'s last part, and that part; None
    where its module is not imported (nothing is imported to check it)."""
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        owner = sys.modules.get(".".join(parts[:cut]))
        if owner is None:
            continue
        for name in parts[cut:-1]:
            owner = getattr(owner, name, None)
            if owner is None:
                return None
        return owner, parts[-1]
    return None


def snapshot_functions(names: tuple[str, ...] = TORCH_FUNCTIONS) -> dict[str, Slot]:
    """What each owner's ``__dict__`` holds under each name, by qualified name (a class's
    inherited method reads as absent: a kernel that sets it adds an entry)."""
    slots: dict[str, Slot] = {}
    for qualname in names:
        found = _owner(qualname)
        if found is not None:
            owner, attr = found
            slots[qualname] = (owner, attr, vars(owner).get(attr, _MISSING))
    return slots


def restore_functions(before: dict[str, Slot]) -> list[tuple[str, Any, str | None]]:
    """Put back every function that is not the object it was, by identity. ``(qualified name,
    what had replaced it, None or why it could not be put back)`` for each."""
    replaced: list[tuple[str, Any, str | None]] = []
    for qualname, (owner, attr, was) in before.items():
        now = vars(owner).get(attr, _MISSING)
        if now is was:
            continue
        try:
            if was is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, was)
            problem = None
        except Exception as exc:  # noqa: BLE001 - reported with the case; the run goes on
            problem = f"{type(exc).__name__}: {str(exc)[:80]}"
        replaced.append((qualname, now, problem))
    return replaced


def _what(value: Any) -> str:
    """A replacement as a failure names it: a function by its module and qualified name, anything
    else by its repr where that is short."""
    if value is _MISSING:
        return "nothing (deleted)"
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if isinstance(module, str) and isinstance(name, str):
        return f"{module}.{name}"
    text = repr(value)
    return text if len(text) <= 100 else f"a {type(value).__name__} object"


def describe_functions(replaced: list[tuple[str, Any, str | None]]) -> str:
    """One line per replaced function: its name, what replaced it, and any failure to put it back."""
    return "\n".join(f"  {qualname}: replaced by {_what(now)}"
                     + (f" (could not be put back: {problem})" if problem else "")
                     for qualname, now, problem in replaced)
