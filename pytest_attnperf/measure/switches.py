"""torch's process-wide state around an attention case: what a kernel can leave changed.

The switches (``torch_globals``: read before and after a case, compared, set back), full float32
products while references, yardsticks and ceilings are made (``exact_fp32``), and the random
generators (``snapshot_rng``, ``restore_rng``). Replaced torch functions: ``measure.torch_functions``.
docs/isolation.md lists the switches.

torch is imported only by the functions that read it, and only an already imported module is
looked at (``flex_attention``'s is not imported to check it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = [
    "GlobalSwitch",
    "changed_globals",
    "describe_changes",
    "exact_fp32",
    "flushes_denormals",
    "matmul_precisions",
    "restore_globals",
    "restore_rng",
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
    """The switches a kernel can leave changed, in the order they are set back (the legacy float32
    matmul precision, then the TF32 flags it also sets, then each backend's ``fp32_precision``,
    which both write: set last, they hold the values the case found)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn

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
        GlobalSwitch(LEGACY_PRECISION, torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        _attribute(cuda.matmul, "allow_tf32", LEGACY_TF32[0]),
        _attribute(cudnn, "allow_tf32", LEGACY_TF32[1]),
        _attribute(cuda.matmul, "allow_fp16_reduced_precision_reduction",
             "fp16 reduced-precision reduction (torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction)"),
        _attribute(cuda.matmul, "allow_bf16_reduced_precision_reduction",
             "bf16 reduced-precision reduction (torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)"),
        *_fp32_precisions(torch),  # after the legacy settings, which write these too
        _attribute(cudnn, "enabled", "cuDNN (torch.backends.cudnn.enabled)"),
        _attribute(cudnn, "benchmark", "cuDNN benchmark (torch.backends.cudnn.benchmark)"),
        _attribute(cudnn, "deterministic", "cuDNN deterministic (torch.backends.cudnn.deterministic)"),
        _attribute(torch.backends.mkldnn, "enabled", "oneDNN (torch.backends.mkldnn.enabled)"),
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


LEGACY_PRECISION = "float32 matmul precision (torch.get_float32_matmul_precision)"
LEGACY_TF32 = ("TF32 matmul (torch.backends.cuda.matmul.allow_tf32)", "TF32 cuDNN (torch.backends.cudnn.allow_tf32)")
FP32_PRECISION = "float32 precision ({})"  # a backend's fp32_precision, by its qualified name
FP32_PRECISION_OWNERS: tuple[str, ...] = (
    "", "cuda.matmul", "cudnn", "mkldnn", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")
"""Where torch 2.9 and later keep ``fp32_precision`` under ``torch.backends``, each parent before
its children (a parent's value is what a child's ``"none"`` defers to)."""


def _attribute(owner: Any, name: str, label: str) -> GlobalSwitch:
    """The switch that is ``owner.name``."""
    return GlobalSwitch(label, lambda: getattr(owner, name), lambda value: setattr(owner, name, value))


def _precision_owners(torch: Any, paths: tuple[str, ...] = FP32_PRECISION_OWNERS) -> dict[str, Any]:
    """Of ``paths`` under ``torch.backends``, those this torch gives a ``fp32_precision`` (none
    before 2.9), by path."""
    owners = {}
    for path in paths:
        owner = torch.backends
        for part in filter(None, path.split(".")):
            owner = getattr(owner, part, None)
        if owner is not None and hasattr(owner, "fp32_precision"):
            owners[path] = owner
    return owners


def _fp32_precisions(torch: Any) -> list[GlobalSwitch]:
    """Each backend's ``fp32_precision`` this torch has. They are the settings themselves: the
    legacy getters are read through them, cannot see oneDNN's or the generic one, and raise once
    both APIs were written; setting a legacy value back writes other values than the case found
    (``"ieee"`` where it found ``"none"``)."""
    return [_attribute(owner, "fp32_precision",
                       FP32_PRECISION.format(".".join(filter(None, ("torch.backends", path, "fp32_precision")))))
            for path, owner in _precision_owners(torch).items()]


def flushes_denormals() -> bool:
    """Whether this thread's CPU arithmetic flushes subnormal numbers to zero
    (``torch.set_flush_denormal``, which has no getter): a float32 subnormal times 1.0 comes out 0."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    subnormal = torch.full((1,), 1e-40, dtype=torch.float32, device="cpu")
    return bool((subnormal * 1.0).item() == 0.0)


def set_flush_denormal(enabled: bool) -> None:
    """``torch.set_flush_denormal(enabled)`` (whose result, whether the CPU supports it, the
    switch's read-back says)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

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
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

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
    _rewrite_legacy_precision(switches, before)
    failed.extend(name for name, *_ in changed_globals(before, snapshot_globals(switches))
                  if not any(f.startswith(name) for f in failed))
    return failed


def _rewrite_legacy_precision(switches: tuple[GlobalSwitch, ...], before: dict[str, Any]) -> None:
    """Torch 2.9 and later keep the legacy float32 matmul precision apart from the backends'
    ``fp32_precision``, and its getters refuse to read while the two disagree (a project that wrote
    both APIs). A case that writes the legacy setting over such a state leaves it readable: every
    ``fp32_precision`` is put back, the legacy value is not (torch cannot read it). Each of its
    three values is written again, and every ``fp32_precision`` put back after it, until the legacy
    getters read as they did before the case; where none does, the one found (where it could be
    read) is put back."""
    by_name = {s.name: s for s in switches}
    legacy = [by_name[name] for name in (LEGACY_PRECISION, *LEGACY_TF32) if name in by_name]
    precisions = [s for s in switches if s.name.startswith(FP32_PRECISION.split("{")[0])
                  and not isinstance(before.get(s.name), Unreadable)]
    if not legacy or not precisions or all(_read(s) == before.get(s.name) for s in legacy):
        return
    found = _read(legacy[0])
    for value in ("highest", "high", "medium", found):
        if isinstance(value, Unreadable):
            break
        try:
            legacy[0].set(value)
            for switch in precisions:
                switch.set(before[switch.name])
        except Exception:  # noqa: BLE001 - what stays different is named by the caller's read-back
            continue
        if all(_read(s) == before.get(s.name) for s in legacy):
            return


def matmul_precisions() -> list[Any]:
    """The settings that say whether torch's float32 matrix products may round (torch 2.9 and
    later: ``fp32_precision`` of ``torch.backends.cuda.matmul``, cuBLAS's, and of
    ``torch.backends.mkldnn.matmul``, oneDNN's on the CPU); empty on an older torch."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    return list(_precision_owners(torch, ("cuda.matmul", "mkldnn.matmul")).values())


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
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

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
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

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
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

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
