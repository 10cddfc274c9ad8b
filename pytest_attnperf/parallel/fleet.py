"""The state a pytest-xdist run shares: the controller's fleet of workers, a worker's seat (its
GPU), each case's key and group. No hooks here: ``plugins.xdist`` drives them."""

from __future__ import annotations

import base64
import json
import os
import pickle
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

try:
    import fcntl
except ImportError:  # Windows: no flock; the CPU's turns are not taken there
    fcntl = None  # type: ignore[assignment]

__all__ = ["Fleet", "Seat", "WorkerShare", "case_key", "group_of", "is_controller", "is_worker", "timing_turn",
           "visible_gpus"]


INPUT_KEY = "attnperf"  # in a worker's workerinput: its GPU and the fleet's size



OUTPUT_KEY = "attnperf"  # in a worker's workeroutput: what the controller merges at its end



REPORT_ATTR = "attnperf_case"  # on a teardown report: the case's rows and baseline entry



UNPLANNED = ("this pytest-xdist run gave its workers no GPU each, so they would time on one card at once; name "
             "the run (--hw=..., or any attnperf option or ini key) and pytest-attnperf gives each worker its own GPU")



GROUP_PREFIX = "attnperf:"



def is_worker(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist worker."""
    return hasattr(config, "workerinput")



def is_controller(config: pytest.Config) -> bool:
    """A pytest-xdist run's controller: it starts workers and runs no test itself."""
    option = config.option
    return (not is_worker(config) and bool(getattr(option, "numprocesses", None) or getattr(option, "tx", None))
            and getattr(option, "dist", "no") != "no")



def encode(value: Any) -> str:
    """A payload for xdist's channel, which carries plain data: the plugin's own objects, pickled.
    Both ends run this plugin, so both know its classes."""
    return base64.b64encode(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).decode("ascii")



def decode(text: str) -> Any:
    return pickle.loads(base64.b64decode(text.encode("ascii")))  # noqa: S301 - our own workers' payload



def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries: that variable's own
    list when set, else one index per device NVML (or, without it, the CUDA driver) counts. The
    count does not create a CUDA context, so the controller holds no memory on any card."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [part.strip() for part in listed.split(",") if part.strip() and part.strip() != "-1"]
    try:
        import pynvml  # noqa: PLC0415 - optional (nvidia-ml-py), looked up where used

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML: ask torch, which asks the driver
        pass
    try:
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - no torch or no driver: no GPU
        return []



@dataclass
class WorkerShare:
    """What the controller knows of one worker."""

    gpu: str | None
    cases: int = 0  # measured cases whose results arrived
    device: str | None = None  # the device the worker measured on (its name and UUID)
    finished: dict[str, Any] | None = None  # the worker's end-of-run payload



@dataclass
class Fleet:
    """The controller's view of a pytest-xdist run."""

    gpus: list[str]
    workers: int
    shares: dict[str, WorkerShare] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # shown in the summary
    mixed: str | None = None  # the workers' hardware differs: no baseline is written (the entries are set aside)

    specs: list[str] = field(default_factory=list)  # each worker's execnet spec, gw0 first ("popen" for -n)
    testrunuid: str = ""
    planned: bool = True  # False: workers share whatever GPU they see, and may not time on it
    collected: list[str] = field(default_factory=list)  # the node ids a worker collected (each collects them all)
    reported: set[str] = field(default_factory=set)  # the node ids a report arrived for, from a worker or pytest-xdist
    deaths: dict[str, str | None] = field(default_factory=dict)  # a worker that died -> the case it died in, if any
    not_run: list[str] = field(default_factory=list)  # collected cases no worker ran (``deaths``), reported as errors
    _groups: dict[str, str] = field(default_factory=dict)

    def groups(self) -> dict[str, str]:
        """The workers' node id -> group maps (read once, when the scheduler first asks)."""
        if not self._groups and self.testrunuid:
            for path in Path(tempfile.gettempdir()).glob(f"attnperf-groups-{self.testrunuid}-*.json"):
                try:
                    self._groups.update(json.loads(path.read_text(encoding="utf-8")))
                except (OSError, ValueError):
                    continue
        return self._groups

    def unreported(self) -> list[str]:
        """The collected cases no report arrived for, in collection order."""
        return [nodeid for nodeid in dict.fromkeys(self.collected) if nodeid not in self.reported]

    def death_cause(self) -> str:
        """The workers that died, and the case each died in: "worker gw0 died while running t.py::x"."""
        return "; ".join(f"worker {worker} died " + (f"while running {case}" if case else "outside any case")
                         for worker, case in sorted(self.deaths.items(), key=lambda item: (len(item[0]), item[0])))

    def forget_groups(self) -> None:
        """At the run's end: the workers' group maps and the CPU's timing lock file."""
        if not self.testrunuid:
            return
        folder = Path(tempfile.gettempdir())
        for path in [*folder.glob(f"attnperf-groups-{self.testrunuid}-*.json"),
                     folder / f"attnperf-timing-{self.testrunuid}.lock"]:
            path.unlink(missing_ok=True)

    def _spec(self, worker: str) -> tuple[int, str]:
        """The worker's index (``gwK``: K) and execnet spec."""
        index = int(worker[2:]) if worker[2:].isdigit() else len(self.shares)
        return index, self.specs[index] if index < len(self.specs) else "popen"

    def gpu_for(self, worker: str) -> str | None:
        """The K-th worker on a host gets that host's K-th GPU: on this host the K-th entry of
        ``gpus``, on a host of ``--tx ssh=...`` (whose GPUs the controller cannot see) index K."""
        index, spec = self._spec(worker)
        nth = self.specs[:index].count(spec)
        if not _local(spec):
            return str(nth)
        return self.gpus[nth % len(self.gpus)] if self.gpus else None

    def shares_gpu(self, worker: str) -> bool:
        """Whether the worker's GPU is another local worker's too (more local workers than GPUs)."""
        return _local(self._spec(worker)[1]) and self.shared_gpu

    @property
    def shared_gpu(self) -> bool:
        """Whether more local workers than local GPUs run, so some share a GPU."""
        local = sum(1 for spec in self.specs if _local(spec)) if self.specs else self.workers
        return bool(self.gpus) and local > len(self.gpus)



def _local(spec: str) -> bool:
    """Whether an execnet spec starts its worker on this host."""
    return spec.split("//")[0] == "popen"



def _expanded(specs: list[str]) -> list[str]:
    """``--tx`` specs, one per worker (``3*ssh=host`` is three), without the options after ``//``
    that do not change the host."""
    out = []
    for spec in specs:
        count, star, rest = spec.partition("*")
        repeat = int(count) if star and count.isdigit() else 1
        out += [(rest if star and count.isdigit() else spec).split("//id=")[0]] * repeat
    return out



@dataclass
class Seat:
    """A worker's place in the fleet."""

    worker: str
    gpu: str | None
    gpus: int
    workers: int
    testrunuid: str
    refusal: str | None = None  # why this worker may not time (its GPU is shared, CUDA came up first)
    rows_sent: int = 0
    facts_sent: bool = False
    unplanned: bool = False  # the run gave its workers no GPU each (see planned)

    def why_not_timing(self, sees_gpu: Callable[[], bool]) -> str | None:
        """Why this worker may not time, or None when it may: the run gave its workers no GPU each
        and this one sees a GPU (``sees_gpu`` is asked only then: it looks the device up), or
        ``refusal``."""
        if self.unplanned and sees_gpu():
            return UNPLANNED
        return self.refusal

    @property
    def cpu_turns(self) -> bool:
        """Timing takes turns across the workers (no GPU to give each its own)."""
        return self.gpu is None and self.workers > 1  # a GPU seen by an unplanned worker refuses first



def group_of(item: pytest.Item) -> str | None:
    """A measured case's group under ``--dist loadgroup``: its test function and its case (the
    shape and dtype), without kernel and direction, so one worker compiles and autotunes each
    shape. None for a test without an ``attnperf`` fixture or with a group of its own."""
    theirs = [m for m in item.iter_markers("xdist_group")
              if not str(m.args[0] if m.args else m.kwargs.get("name", "")).startswith(GROUP_PREFIX)]
    if "attnperf" not in getattr(item, "fixturenames", ()) or theirs:
        return None
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("case") if callspec else None
    where = item.nodeid.split("[", 1)[0]
    if case is None:
        return f"{GROUP_PREFIX}{where}"
    label = getattr(case, "id", None) or str(case)
    return f"{GROUP_PREFIX}{where}:{label}"



def case_key(item: Any) -> str:
    """A test's key in the baseline file and the summary: its node id, less the ``@group``
    suffix pytest-xdist adds under ``--dist loadgroup``, so a parallel run reads and writes the
    entries a serial one does."""
    nodeid = str(item.nodeid)
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")}) if hasattr(item, "iter_markers") else []
    suffix = "@" + "_".join(names)
    return nodeid[: -len(suffix)] if names and nodeid.endswith(suffix) else nodeid


@contextmanager
def timing_turn(seat: Seat | None, sees_gpu: Callable[[], bool]) -> Iterator[None]:
    """Around a case's timing in a worker (``seat``): fails the case when the worker may not time
    (``Seat.why_not_timing``: its GPU is shared, say); without a GPU, waits for the other
    workers' timing to end (a lock file per test run). Elsewhere (no seat) it does nothing."""
    if seat is None:
        yield
        return
    refused = seat.why_not_timing(sees_gpu)
    if refused is not None:
        pytest.fail(f"attnperf: not timed: {refused}", pytrace=False)
    if not seat.cpu_turns or fcntl is None:
        yield
        return
    path = Path(tempfile.gettempdir()) / f"attnperf-timing-{seat.testrunuid or os.getppid()}.lock"
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
