"""torch functions a kernel can replace: the identity of the module-level functions the suites,
kernels and checks call (``TORCH_FUNCTIONS``) and of every attribute of ``torch.Tensor`` and
``torch._C.TensorBase`` (``TORCH_CLASSES``: the methods the checks call on tensors), and the depth
of torch's function-mode and dispatch-mode stacks. A kernel that monkeypatches one, or leaves a
mode on, is named and the original put back (``snapshot_functions``, ``restore_functions``,
``pop_modes``; ``put_back_functions`` does all three, with the failure's text, right after a
kernel's call and before a check runs).

Only an already imported module is looked at (``flex_attention``'s is not imported to check it).
"""

from __future__ import annotations

import ctypes
import gc
import sys
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = [
    "TORCH_CLASSES",
    "TORCH_FUNCTIONS",
    "Functions",
    "Replaced",
    "CLOCKS",
    "describe_functions",
    "drop_overrides",
    "pop_modes",
    "pop_saved_hooks",
    "put_back_functions",
    "restore_functions",
    "snapshot_functions",
]

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
CLOCKS: tuple[str, ...] = (
    "time.perf_counter", "time.perf_counter_ns", "time.monotonic", "time.monotonic_ns", "time.time", "time.time_ns",
    "time.process_time", "time.sleep", "torch.cuda.Event", "torch.cuda.Event.record",
    "torch.cuda.Event.elapsed_time", "torch.cuda.Event.synchronize", "torch.cuda.Stream.synchronize",
    "torch.cuda.current_stream",
)
"""The clocks and synchronisation the timers read, guarded as the torch functions are: a kernel
that patches one (``time.perf_counter_ns = lambda: real() // 100``) would make every later case
record fast."""
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
    impls: frozenset[str] = frozenset()  # the operator kernels registered through torch.library
    saved_hooks: Any = None  # the saved-tensor hooks on top of autograd's stack (None: none)


def _mode_depths() -> tuple[int, int]:
    """How many torch function modes and dispatch modes are active (``TorchFunctionMode``,
    ``TorchDispatchMode``): a mode left on intercepts every torch call after it, the checks' too."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    return torch._C._len_torch_function_stack(), torch._C._len_torch_dispatch_stack()


def pop_modes(before: tuple[int, int]) -> list[str]:
    """The modes pushed since ``before`` and left on, popped: their class names, innermost first
    (none where torch is not imported: nothing is imported to look)."""
    if "torch" not in sys.modules:
        return []
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up
    from torch.utils._python_dispatch import _pop_mode  # noqa: PLC0415 - torch loads on first use, not at start-up

    popped = []
    for kind, depth, pop, was in (("torch function mode", torch._C._len_torch_function_stack,
                                   torch._C._pop_torch_function_stack, before[0]),
                                  # the dispatch stack's own pop (infra modes too)
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


GUARDED_NAMESPACES = ("aten/",)
"""The operators whose kernels a case may not replace: those every reference and check computes with
(torch's compiler defines operators of its own in ``prims`` mid-run, with their kernels)."""
VALUE_KEYS = frozenset({"CPU", "CUDA", "CompositeImplicitAutograd", "CompositeExplicitAutograd", "Autograd",
                        "AutogradCPU", "AutogradCUDA", "Math", ""})
"""The dispatch keys whose kernels compute values (torch's own lazy imports register Meta, fake and
functionalization kernels, and kernels of operators of their own, mid-run: those are left alone)."""


def _guarded(name: str) -> bool:
    return name.startswith(GUARDED_NAMESPACES) and name.rsplit("/", 1)[-1] in VALUE_KEYS


_last_impls: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
"""The registrations last read, whole, and the guarded ones among them: torch holds two thousand,
and a case reads them around each call."""


def _impls() -> frozenset[str]:
    """The value-computing kernels of ``aten`` operators registered through ``torch.library``
    (``ns/op/dispatch key``). Exact whatever changed since the last read: only the names not read
    then are filtered, the ones gone are dropped."""
    global _last_impls
    library = sys.modules.get("torch.library")
    if library is None:
        return frozenset()
    every = frozenset(getattr(library, "_impls", ()))
    seen, guarded = _last_impls
    if every != seen:
        guarded = (guarded & every) | frozenset(filter(_guarded, every - seen))
        _last_impls = (every, guarded)
    return guarded


def _saved_hooks() -> Any:
    torch = sys.modules.get("torch")
    return torch._C._autograd._top_saved_tensors_default_hooks(True) if torch is not None else None


def drop_overrides(before: frozenset[str]) -> list[str]:
    """The operator kernels registered through ``torch.library`` since ``before`` (an override of
    ``aten::_softmax`` would change what every later fp64 reference computes), each removed by
    destroying the ``Library`` that holds it."""
    added = _impls() - before
    if not added:
        return []
    import torch.library  # noqa: PLC0415 - imported already: _impls found registrations

    for found in gc.get_objects():
        try:
            library = isinstance(found, torch.library.Library)
        except ReferenceError:  # a weak proxy whose object is gone
            continue
        if library and added & set(getattr(found, "_op_impls", ())):
            destroy: Any = found._destroy  # private, untyped: the only way to undo a Library's registrations
            destroy()
    left = _impls() - before
    return [f"torch.library override {name}" + (" (could not be removed)" if name in left else "")
            for name in sorted(added)]


def pop_saved_hooks(before: Any) -> list[str]:
    """Saved-tensor hooks pushed since ``before`` and left on (``saved_tensors_hooks().__enter__()``
    without its exit: every later backward, the fp64 references' too, would go through them), popped."""
    popped: list[str] = []
    while (top := _saved_hooks()) is not None and top != before and len(popped) < 64:
        sys.modules["torch"]._C._autograd._pop_saved_tensors_default_hooks()
        popped.append(f"saved-tensor hooks {getattr(top[0], '__qualname__', type(top[0]).__name__)}")
    return popped


def snapshot_functions(names: tuple[str, ...] = TORCH_FUNCTIONS + CLOCKS,
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
    return Functions(slots, held, _mode_depths() if "torch" in sys.modules else (0, 0), _impls(), _saved_hooks())


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
    kept = drop_overrides(before.impls) + pop_saved_hooks(before.saved_hooks)
    if not replaced and not modes and not kept:
        return None
    what = " and ".join(w for w, found in (("replaced torch functions", replaced), ("left a torch mode on", modes),
                                           ("left saved-tensor hooks or an operator override on", kept)) if found)
    lines = ([describe_functions(replaced)] if replaced else []) + [f"  {mode}: left on" for mode in modes + kept]
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
