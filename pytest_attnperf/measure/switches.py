"""torch's process-wide state around an attention case: what a kernel can leave changed.

- **switches**: grad and inference mode, default dtype and device, SDPA backends, deterministic
  algorithms, cuDNN, oneDNN, TF32 and matmul precision, autocast, anomaly mode, CPU threads,
  flush-denormal, the current CUDA device and stream (``torch_globals``): read before and after
  a case, compared, set back;
- **full float32 products** while references, yardsticks and ceilings are made, whatever TF32
  setting the project made (``exact_fp32``);
- **random generators**: the default CPU one and, once CUDA is initialized, each device's
  (``snapshot_rng``, ``restore_rng``);
- **torch functions**: the identity of the module-level functions the suites, kernels and
  checks call (``TORCH_FUNCTIONS``) and of every attribute of ``torch.Tensor`` and
  ``torch._C.TensorBase`` (``TORCH_CLASSES``: the methods the checks call on tensors), so a
  kernel that monkeypatches one is named and the original put back (``snapshot_functions``,
  ``restore_functions``; ``put_back_functions`` does both, with the failure's text, right after
  a kernel's call and before a check runs).

torch is imported only by the functions that read it, and only an already imported module is
looked at (``flex_attention``'s is not imported to check it).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "TORCH_CLASSES",
    "TORCH_FUNCTIONS",
    "Functions",
    "GlobalSwitch",
    "Replaced",
    "changed_globals",
    "describe_changes",
    "describe_functions",
    "exact_fp32",
    "flushes_denormals",
    "matmul_precisions",
    "pop_modes",
    "put_back_functions",
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
        attr(torch.backends.mkldnn, "enabled", "oneDNN (torch.backends.mkldnn.enabled)"),
        GlobalSwitch("anomaly detection (torch.is_anomaly_enabled)", torch.is_anomaly_enabled,
                     torch.set_anomaly_enabled),
        GlobalSwitch("CPU threads (torch.get_num_threads)", torch.get_num_threads, torch.set_num_threads),
        GlobalSwitch("flush denormal (torch.set_flush_denormal)", flushes_denormals, set_flush_denormal),
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


def flushes_denormals() -> bool:
    """Whether this thread's CPU arithmetic flushes subnormal numbers to zero
    (``torch.set_flush_denormal``, which has no getter): a float32 subnormal times 1.0 comes out 0."""
    import torch

    subnormal = torch.full((1,), 1e-40, dtype=torch.float32, device="cpu")
    return bool((subnormal * 1.0).item() == 0.0)


def set_flush_denormal(enabled: bool) -> None:
    """``torch.set_flush_denormal(enabled)`` (whose result, whether the CPU supports it, the
    switch's read-back says)."""
    import torch

    torch.set_flush_denormal(enabled)


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


def matmul_precisions() -> list[Any]:
    """The settings that say whether torch's float32 matrix products may round (torch 2.9 and
    later: ``fp32_precision`` of ``torch.backends.cuda.matmul``, cuBLAS's, and of
    ``torch.backends.mkldnn.matmul``, oneDNN's on the CPU); empty on an older torch."""
    import torch

    owners = (torch.backends.cuda.matmul, getattr(torch.backends.mkldnn, "matmul", None))
    return [owner for owner in owners if owner is not None and hasattr(owner, "fp32_precision")]


@contextmanager
def exact_fp32() -> Iterator[None]:
    """Inside, torch's float32 matrix products run at full precision (IEEE float32), whatever the
    project set: the references, yardsticks and matmul ceilings are made so. A project that turns
    TF32 on for its own training (``torch.backends.cuda.matmul.allow_tf32``,
    ``set_float32_matmul_precision``, or ``fp32_precision``) would otherwise round the fp32
    yardstick's products to 10 bits, and widen every fp32 bound with them. Each setting is put back
    as it was on the way out. Torch 2.9 and later set through ``fp32_precision``
    (``matmul_precisions``): written there, the project's setting reads back as it was through
    either API (the legacy getters raise once both APIs were written); an older torch through
    ``set_float32_matmul_precision``."""
    import torch

    owners = matmul_precisions()
    if not owners:
        legacy = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision("highest")
        try:
            yield
        finally:
            torch.set_float32_matmul_precision(legacy)
        return
    before = [owner.fp32_precision for owner in owners]
    try:
        for owner in owners:
            owner.fp32_precision = "ieee"
        yield
    finally:
        for owner, value in zip(owners, before, strict=True):
            owner.fp32_precision = value


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
    # what the suites and kernels call
    "torch.nn.functional.scaled_dot_product_attention",
    "torch.nn.functional.softmax",
    "torch.matmul",
    "torch.bmm",
    "torch.softmax",
    "torch.einsum",
    "torch.compile",
    "torch.autograd.grad",
    "torch.nn.attention.flex_attention.flex_attention",
    # what the checks (families.checks, families.draws, measure.verify) and the linear
    # families' references, computed after the kernel's call, call
    "torch.nn.functional.avg_pool1d",
    "torch.maximum",
    "torch.frexp",
    "torch.ldexp",
    "torch.isfinite",
    "torch.equal",
    "torch.where",
    "torch.count_nonzero",
    "torch.finfo",
    "torch.tensor",
    "torch.ones_like",
    "torch.zeros_like",
    "torch.ones",
    "torch.zeros",
    "torch.eye",
    "torch.empty",
    "torch.full",
    "torch.stack",
    "torch.cat",
    "torch.exp",
    "torch.rsqrt",
    "torch.linalg.solve_triangular",
    "torch.no_grad",
    "torch.enable_grad",
    "torch.arange",
    "torch.nn.functional.pad",
    "torch.cuda.synchronize",
)
"""The module-level torch functions whose identity is checked around each case and each
kernel's call: a module's attribute (its module must be imported already). Add a name here to
guard one more. Whole module dicts are not compared: importing torch's compiler legitimately
replaces some of ``torch``'s attributes (``torch.manual_seed``)."""

TORCH_CLASSES: tuple[str, ...] = ("torch.Tensor", "torch._C.TensorBase")
"""The classes whose every attribute is guarded (their ``__dict__``, by identity): the methods
and operators the checks call on tensors (``abs``, ``__sub__``, ``max``, ``norm``...). A name
set on ``torch.Tensor`` over one it inherits from ``torch._C.TensorBase`` is a replacement too."""

_MISSING = object()  # an attribute the owner's ``__dict__`` does not hold (inherited, or absent)

Slot = tuple[Any, str, Any]  # the owner (module or class), the attribute, what its __dict__ held


@dataclass(frozen=True)
class Functions:
    """The guarded torch functions at one moment: what each owner's ``__dict__`` held under each
    of ``TORCH_FUNCTIONS``, by qualified name, and a copy of each of ``TORCH_CLASSES``'
    ``__dict__``, by the class's qualified name."""

    slots: dict[str, Slot]
    classes: dict[str, tuple[type, dict[str, Any]]]
    modes: tuple[int, int] = (0, 0)  # how deep torch's function-mode and dispatch-mode stacks were


def _mode_depths() -> tuple[int, int]:
    """How many torch function modes and dispatch modes are active (``TorchFunctionMode``,
    ``TorchDispatchMode``): a mode left on intercepts every torch call after it, the checks' too."""
    import torch

    return torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()


def pop_modes(before: tuple[int, int]) -> list[str]:
    """The modes pushed since ``before`` and left on, popped: their class names, innermost first
    (none where torch is not imported: nothing is imported to look)."""
    if "torch" not in sys.modules:
        return []
    import torch
    from torch.utils._python_dispatch import _pop_mode  # the dispatch stack's own pop (infra modes too)

    popped = []
    for kind, depth, pop, was in (("torch function mode", torch._C._len_torch_function_stack,
                                   torch._C._pop_torch_function_stack, before[0]),
                                  ("dispatch mode", torch._C._len_torch_dispatch_stack, _pop_mode, before[1])):
        while depth() > was:
            try:
                mode = pop()
            except Exception as exc:  # noqa: BLE001 - named, and the rest left: popping must end
                popped.append(f"{kind}s: {depth() - was} could not be popped ({type(exc).__name__}: {exc})")
                break
            popped.append(f"{kind} {type(mode).__qualname__}")
    return popped


class Replaced(NamedTuple):
    """A guarded torch function that was not the object it had been."""

    name: str  # qualified: torch.matmul, torch.Tensor.abs
    now: Any  # what replaced it (``_MISSING``: deleted)
    problem: str | None  # why it could not be put back; None: it was


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


def _class(qualname: str) -> type | None:
    """The class ``qualname`` names, where its module is imported."""
    found = _owner(qualname)
    cls = getattr(found[0], found[1], None) if found is not None else None
    return cls if isinstance(cls, type) else None


def snapshot_functions(names: tuple[str, ...] = TORCH_FUNCTIONS,
                       classes: tuple[str, ...] = TORCH_CLASSES) -> Functions:
    """What each owner's ``__dict__`` holds under each of ``names`` (a class's inherited method
    reads as absent: a kernel that sets it adds an entry), and each of ``classes``' whole
    ``__dict__``; only for modules already imported."""
    slots: dict[str, Slot] = {}
    for qualname in names:
        found = _owner(qualname)
        if found is not None:
            owner, attr = found
            slots[qualname] = (owner, attr, vars(owner).get(attr, _MISSING))
    held = {qualname: (cls, dict(vars(cls))) for qualname in classes if (cls := _class(qualname)) is not None}
    return Functions(slots, held, _mode_depths() if "torch" in sys.modules else (0, 0))


def _put(owner: Any, attr: str, value: Any) -> None:
    """Set ``owner.attr`` to ``value`` (delete it for ``_MISSING``). A C type refuses ``setattr``
    (``torch._C.TensorBase``); what a kernel wrote into its dict anyway (through
    ``gc.get_referents``) is put back the same way, and the type's method cache invalidated."""
    try:
        if value is _MISSING:
            delattr(owner, attr)
        else:
            setattr(owner, attr, value)
    except TypeError:
        if not isinstance(owner, type):
            raise
        import ctypes
        import gc

        (contents,) = [d for d in gc.get_referents(vars(owner)) if isinstance(d, dict)]
        if value is _MISSING:
            contents.pop(attr, None)
        else:
            contents[attr] = value
        ctypes.pythonapi.PyType_Modified(ctypes.py_object(owner))


def _put_back(qualname: str, owner: Any, attr: str, was: Any, now: Any) -> Replaced:
    try:
        _put(owner, attr, was)
        problem = None
    except Exception as exc:  # noqa: BLE001 - reported with the case; the run goes on
        problem = f"{type(exc).__name__}: {str(exc)[:80]}"
    return Replaced(qualname, now, problem)


def restore_functions(before: Functions) -> list[Replaced]:
    """Put back every guarded function that is not the object it was, by identity (a class
    attribute the kernel added over an inherited one is deleted, one it deleted set again; one
    that shadows nothing is left): each, with what had replaced it and whether it could be put
    back."""
    replaced: list[Replaced] = []
    for qualname, (owner, attr, was) in before.slots.items():
        now = vars(owner).get(attr, _MISSING)
        if now is not was:
            replaced.append(_put_back(qualname, owner, attr, was, now))
    for prefix, (cls, held) in before.classes.items():
        contents = dict(vars(cls))
        added = [name for name in contents if name not in held and _inherited(cls, name)]
        for attr in [*held, *added]:
            was, now = held.get(attr, _MISSING), contents.get(attr, _MISSING)
            if now is not was:
                replaced.append(_put_back(f"{prefix}.{attr}", cls, attr, was, now))
    return replaced


def _inherited(cls: type, name: str) -> bool:
    """Whether one of ``cls``'s bases holds ``name``: a name added to ``cls`` then shadows it (a
    replacement), while a name no base holds changes nothing the checks call (Python's
    ``copyreg`` adds ``__slotnames__`` to ``torch.Tensor`` the first time a tensor is copied or
    pickled)."""
    return any(name in vars(base) for base in cls.__mro__[1:])


def put_back_functions(before: Functions, who: str, checks: str) -> str | None:
    """After a kernel's call and before ``checks`` run: every guarded function replaced since
    ``before`` put back, and every torch function or dispatch mode pushed since and left on popped,
    and a failure's message naming each (``who`` replaced... / left a torch mode on); None where
    nothing was."""
    replaced, modes = restore_functions(before), pop_modes(before.modes)
    if not replaced and not modes:
        return None
    what = " and ".join(w for w, found in (("replaced torch functions", replaced), ("left a torch mode on", modes))
                        if found)
    lines = ([describe_functions(replaced)] if replaced else []) + [f"  {mode}: left on" for mode in modes]
    return f"{who} {what}, put back now; {checks} would otherwise have run with them:\n" + "\n".join(lines)


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


def describe_functions(replaced: list[Replaced]) -> str:
    """One line per replaced function: its name, what replaced it, and any failure to put it back."""
    return "\n".join(f"  {r.name}: replaced by {_what(r.now)}"
                     + (f" (could not be put back: {r.problem})" if r.problem else "")
                     for r in replaced)
