"""Order independence: a kernel's result on a catalogue row must not depend on what ran before it.

Each check's result (``Result``: its status, a SHA-256 of every tensor the kernel returned and
its worst ratios) is recorded; a seeded shuffled sample of the checks runs again in this process
(``shuffled``) and in one fresh Python process (``fresh``, the kernel rebuilt from its ``Source``).
A deterministic kernel must give bitwise equal results; on a GPU a kernel not registered
``deterministic`` is compared by status and ratios only. A difference fails, naming the check and
the one that ran just before it. docs/catalogue.md, "Order independence".
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from pytest_attnperf.families import catalogue
from pytest_attnperf.families.checks import CheckFailed
from pytest_attnperf.families.family import family
from pytest_attnperf.families.interpret import autotuners_held
from pytest_attnperf.families.registry import Kernel, KernelRegistry
from pytest_attnperf.markers import pin_backend

__all__ = ["FRESH", "SAMPLE", "Result", "Source", "compare", "fresh", "ordered", "record", "run_one", "shuffled",
           "source_of"]

SAMPLE = 8  # checks of a kernel run again in a shuffled order, in this process
FRESH = 8  # of those, run again in that order in a fresh process
DIRECTIONS = ("fwd", "fwdbwd")


@dataclass(frozen=True)
class Result:
    """One check's result: ``check`` (row id and direction), ``status``, the digest of what the kernel
    returned and the check's ratios (``digest``), and the check's message (a failure's)."""

    check: str
    status: str
    digest: str
    message: str = ""
    ratios: str = ""

    def agrees(self, other: Result, bitwise: bool) -> bool:
        """Whether ``other`` is the same result (``bitwise``: its digest too)."""
        same = self.status == other.status and self.ratios == other.ratios
        return same and (not bitwise or self.digest == other.digest)

    def describe(self) -> str:
        """The result in a few words: status, digest, ratios and the first line of its message."""
        text = f"{self.status} (digest {self.digest[:12]}"
        text += f", ratios {self.ratios})" if self.ratios else ")"
        return text + (f": {self.message.splitlines()[0][:200]}" if self.message else "")


@dataclass(frozen=True)
class Source:
    """Where a fresh process finds a kernel: a module whose ``function(registry)`` registers it
    (``pytest_attnperf_register_kernels(registry, config)`` gets no config there), with the folders to
    put on its path."""

    module: str
    function: str = "register"
    path: tuple[str, ...] = ()


def _digest_into(hasher: Any, value: Any) -> None:
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    if isinstance(value, torch.Tensor):
        flat = value.detach().contiguous().reshape(-1)
        hasher.update(f"{value.dtype}{tuple(value.shape)}".encode())
        hasher.update(flat.cpu().view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    elif isinstance(value, (tuple, list)):
        for item in value:
            _digest_into(hasher, item)
    else:
        hasher.update(repr(type(value)).encode())


def recording(kernel: Kernel, hasher: Any) -> Kernel:
    """``kernel`` whose every return value is added to ``hasher`` (its name, axes and facts kept)."""
    fn = kernel.fn

    def recorded(*args: Any, **kwargs: Any) -> Any:
        value = fn(*args, **kwargs)
        _digest_into(hasher, value)
        return value

    return replace(kernel, fn=recorded)


def run_one(kernel: Kernel, row: catalogue.Row, direction: str, device: Any, seed: int = 0) -> Result:
    """``kernel`` checked on ``row`` in ``direction`` as the catalogue checks it, its result recorded."""
    check = f"{row.id}-{direction}"
    fam = family(kernel.family)
    if why := fam.refusal(kernel, row.case, direction):
        return Result(check, "refused", "", why)
    hasher = hashlib.sha256()
    status, message, ratios = "passed", "", ""
    try:
        pinned = pin_backend(kernel.sdpa_backend) if kernel.sdpa_backend else contextlib.nullcontext()
        with pinned:
            checked = fam.check(recording(kernel, hasher), row.case, direction, device, seed=seed)
        ratios = ", ".join(f"{name} {ratio!r}" for name, ratio in sorted(checked.ratios.items()))
    except CheckFailed as exc:
        status, message = "failed", str(exc)
    except AssertionError as exc:
        status, message = "failed", str(exc)
    except pytest.skip.Exception as exc:
        status, message = "refused", str(exc)
    except Exception as exc:  # noqa: BLE001 - a crash is a result like any other
        status, message = "crashed", f"{type(exc).__name__}: {exc}"
    return Result(check, status, hasher.hexdigest(), message, ratios)


Check = tuple[catalogue.Row, str]


def ordered(kernel: Kernel, checks: Sequence[Check], device: Any, seed: int = 0) -> list[Result]:
    """Every check of ``checks`` in their order, in this process."""
    return [run_one(kernel, row, direction, device, seed) for row, direction in checks]


def shuffle(count: int, sample: int, seed: int) -> list[int]:
    """A seeded sample of ``sample`` of ``count`` indices, in a shuffled order."""
    picked = list(range(count))
    random.Random(seed).shuffle(picked)
    return picked[:sample]


def compare(kernel: Kernel, first: Sequence[Result], again: Sequence[tuple[int, Result]], where: str,
            bitwise: bool, before: Callable[[int], str]) -> list[str]:
    """Each check of ``again`` (index into ``first``, its result there) whose result differs from its
    first, in words naming the checks that ran just before it in each run (``before(position)``)."""
    found = []
    for position, (index, result) in enumerate(again):
        if first[index].agrees(result, bitwise):
            continue
        earlier = first[index - 1].check if index else "nothing (the first check)"
        found.append(f"{kernel.family}/{kernel.name} {result.check}: its result depends on what ran before it: "
                     f"after {earlier} it was {first[index].describe()}; {where}, after {before(position)}, it was "
                     f"{result.describe()}")
    return found


def shuffled(kernel: Kernel, checks: Sequence[Check], first: Sequence[Result], device: Any, *, sample: int = SAMPLE,
             seed: int = 0, shuffle_seed: int = 0, bitwise: bool = True) -> tuple[list[int], list[str]]:
    """A shuffled sample of ``checks`` run again in this process, each compared with ``first`` (their
    results in order); the sample's indices and the differences found."""
    picked = shuffle(len(checks), sample, shuffle_seed)
    again = [(i, run_one(kernel, *checks[i], device, seed)) for i in picked]
    last = first[-1].check if first else "nothing"

    def before(position: int) -> str:
        return checks_name(checks[picked[position - 1]]) if position else f"the whole list in order (last {last})"

    return picked, compare(kernel, first, again, "in a shuffled order", bitwise, before)


def checks_name(check: Check) -> str:
    """A check's name: its row's id and direction."""
    return f"{check[0].id}-{check[1]}"


def fresh(source: Source, kernel: Kernel, checks: Sequence[Check], device: Any, seed: int = 0,
          timeout: float = 600.0) -> list[Result]:
    """``checks`` run in their order in one fresh Python process, the first of them the kernel's first
    call there (their results)."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*source.path, *sys.path])}
    order = {"module": source.module, "function": source.function, "family": kernel.family, "kernel": kernel.name,
             "checks": [[row.id, direction] for row, direction in checks], "device": str(device), "seed": seed,
             "threads": torch.get_num_threads()}
    done = subprocess.run([sys.executable, "-m", "pytest_attnperf.families.order", json.dumps(order)],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(lines) != len(checks):
        raise RuntimeError(f"the fresh process for {kernel.family}/{kernel.name} exited {done.returncode} after "
                           f"{len(lines)} of {len(checks)} checks: {done.stderr.strip()[-600:]}")
    return [Result(**line) for line in lines]


def record(source: Source | None, kernel: Kernel, checks: Sequence[Check], device: Any, *, seed: int = 0,
           sample: int = SAMPLE, fresh_count: int = FRESH, shuffle_seed: int = 0,
           first: Sequence[Result] | None = None) -> list[str]:
    """The whole check for one kernel: ``checks`` in order (or their results ``first`` where the run
    made them already), a shuffled sample of ``sample`` again in this process, and the first
    ``fresh_count`` of that sample in a fresh process, in their shuffled order; every difference in
    words (none: the kernel's results do not depend on what ran before). Without a ``source`` no
    fresh process runs."""
    bitwise = getattr(device, "type", str(device)) == "cpu" or kernel.deterministic
    first = list(first) if first is not None else ordered(kernel, checks, device, seed)
    picked, found = shuffled(kernel, checks, first, device, seed=seed, shuffle_seed=shuffle_seed,
                             bitwise=bitwise)
    chosen = picked[:fresh_count] if source is not None else []
    if source is not None and chosen:
        alone = fresh(source, kernel, [checks[i] for i in chosen], device, seed)

        def before(position: int) -> str:
            return checks_name(checks[chosen[position - 1]]) if position else "nothing (the kernel's first call there)"

        found += compare(kernel, first, list(zip(chosen, alone, strict=True)), "in a fresh process", bitwise, before)
    return found


def source_of(kernel: Kernel) -> Source | None:
    """Where a fresh process finds ``kernel``: the module its function comes from, where that module
    registers it (``register`` or the plugin's hook); None when it does not."""
    module = sys.modules.get(kernel.fn.__module__)
    for name in ("register", "pytest_attnperf_register_kernels"):
        if callable(getattr(module, name, None)):
            return Source(kernel.fn.__module__, name)
    return None


def _main(order: dict[str, Any]) -> None:
    """A fresh process's one check (``fresh``): its result as one JSON line."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up

    torch.set_num_threads(order["threads"])
    registry = KernelRegistry()
    register = getattr(importlib.import_module(order["module"]), order["function"])
    if order["function"] == "pytest_attnperf_register_kernels":
        register(registry, None)
    else:
        register(registry)
    kernel = next(k for k in registry.family(order["family"]) if k.name == order["kernel"])
    rows = {r.id: r for r in family(order["family"]).rows("full", True)}
    held = autotuners_held() if os.environ.get("TRITON_INTERPRET") == "1" else contextlib.nullcontext()
    with held:  # under the interpreter, as the run held them; natively, autotuning as it would
        for row_id, direction in order["checks"]:
            result = run_one(kernel, rows[row_id], direction, torch.device(order["device"]), order["seed"])
            print(json.dumps(result.__dict__), flush=True)


if __name__ == "__main__":
    _main(json.loads(sys.argv[1]))
