"""The machine's ceilings: measured matmul throughput per dtype and copy bandwidth, cached.

Measured once per run on first need, with the run's own timer and sampling plan; kept in
``$XDG_CACHE_HOME/pytest-attnperf/ceilings`` per machine and software stack and reused while they
match. Figures that are not plausible (``Measured.doubts``) serve this run only and are never
cached. ``Ceilings`` puts them beside the spec table and ``--attnperf-peaks``; ``attnperf-ceilings``
measures and prints them. docs/roofline.md, "Ceilings".
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_attnperf.gate.roofline import Ceiling, ridge
from pytest_attnperf.hw.detect import detect_device
from pytest_attnperf.hw.table import DetectedDevice, HardwareSpec, match, unlisted_spec
from pytest_attnperf.measure.contention import HostLoad, contention_note, host_load
from pytest_attnperf.measure.switches import exact_fp32
from pytest_attnperf.measure.timing import SamplingPlan, Timer, default_timer

__all__ = ["CACHE_FOLDER", "DTYPES", "FORMAT", "Ceilings", "Measured", "Workload", "measure", "obtain"]

DTYPES = ("bf16", "fp16", "fp32")
FORMAT = 1  # of the cache file; raised when the workloads change, so older files are measured again
GPU_MATMUL_N = 8192
GPU_COPY_BYTES = 2**30
CPU_MATMUL_N = (256, 512, 1024)  # the first, then larger while a call takes at most CPU_CALL_S
CPU_CALL_S = 0.2
CPU_COPY_BYTES = 2**28
PLAUSIBLE_SPREAD = 1.5  # a ceiling's 95% interval spanning more than this many times is not a steady figure
CEILINGS_MIN_SAMPLES = 5  # a ceiling is a steady large call: five samples (a round of cold graphs on a GPU)
_TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


class Workload:
    """One ceiling's callable: its tensors are made on the first call (a timer that never calls
    it, such as a scripted one in tests, allocates nothing). ``ceiling`` names it."""

    def __init__(self, ceiling: str, device: str, n: int, dtype: str | None = None) -> None:
        self.ceiling, self.device, self.n, self.dtype = ceiling, device, n, dtype
        self._tensors: tuple[Any, ...] = ()

    @property
    def flops(self) -> float:
        """A matmul's FLOP per call (``2 n^3``); 0 for the copy."""
        return 0.0 if self.dtype is None else 2.0 * self.n**3

    @property
    def bytes(self) -> float:
        """A copy's bytes read plus written (a matmul's are not used)."""
        return 2.0 * self.n if self.dtype is None else 0.0

    @property
    def shape(self) -> str:
        """How the summary names the workload: the matmul's side, or the copy's MiB."""
        return f"{self.n}^3" if self.dtype else f"{self.n / 2**20:g} MiB"

    def __call__(self) -> Any:
        """One call: the matmul, or the copy (an elementwise kernel); the tensors are made on the
        first."""
        import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

        if not self._tensors:
            if self.dtype is None:
                src = torch.ones(self.n // 4, dtype=torch.float32, device=self.device)
                self._tensors = (src, torch.empty_like(src))
            else:
                dtype = getattr(torch, _TORCH_DTYPES[self.dtype])
                gen = torch.Generator(device=self.device).manual_seed(0)  # not the global generator
                a, b = (torch.randn(self.n, self.n, generator=gen, device=self.device).to(dtype) for _ in range(2))
                self._tensors = (a, b, torch.empty_like(a))
        if self.dtype is None:
            # an elementwise kernel, not ``dst.copy_(src)``: a device-to-device copy is a memcpy,
            # which a CUDA graph runs on the copy engines, slower than the SMs reach
            src, dst = self._tensors
            return torch.neg(src, out=dst)
        a, b, c = self._tensors
        return torch.matmul(a, b, out=c)

    def release(self) -> None:
        """Drop the tensors, so that their memory is free for the next workload."""
        self._tensors = ()


def cpu_matmul_side(seconds_at: Callable[[int], float], sides: tuple[int, ...] | None = None,
                    most_s: float = CPU_CALL_S) -> int:
    """The largest side whose call should take at most ``most_s``: from the first, grow while
    eight times the last call's time (the next side's, at twice the side) stays within it.
    ``sides`` defaults to ``CPU_MATMUL_N``."""
    sides = sides or CPU_MATMUL_N
    chosen = sides[0]
    for side in sides[1:]:
        if 8 * seconds_at(chosen) > most_s:
            break
        chosen = side
    return chosen


def _eager_seconds(workload_of: Callable[[int], Workload]) -> Callable[[int], float]:
    def seconds_at(n: int) -> float:
        work = workload_of(n)
        work()  # the tensors, and one call's lazy set-up
        took = []
        for _ in range(2):  # the faster of two: a busy host delays one call more than a lasting change
            start = time.perf_counter()
            work()
            took.append(time.perf_counter() - start)
        work.release()
        return min(took)

    return seconds_at


@dataclass(frozen=True)
class Measured:
    """Measured ceilings: FLOP/s per dtype (None: not measured, see ``notes``), bytes/s."""

    flops: tuple[tuple[str, float | None], ...]
    bytes_per_s: float | None
    date: str
    shapes: tuple[tuple[str, str], ...] = ()
    notes: tuple[str, ...] = ()
    cached: bool = False  # read from the cache file, not measured in this run
    doubts: tuple[str, ...] = ()  # why the figures are not plausible enough to cache (a contended host, a wide spread)

    def peak(self, dtype: str) -> float | None:
        """The measured FLOP/s of ``dtype``; None when not measured."""
        return dict(self.flops).get(dtype)

    def to_json(self, stack: Mapping[str, str | None]) -> dict[str, Any]:
        """The cache file's content: the format, ``stack`` (what the figures were measured under), the
        date, TFLOP/s per dtype, GB/s, the shapes and the notes."""
        return {"format": FORMAT, **stack, "date": self.date, "tflops": {k: v and v / 1e12 for k, v in self.flops},
                "gb_per_s": self.bytes_per_s and self.bytes_per_s / 1e9, "shapes": dict(self.shapes),
                "notes": list(self.notes)}

    @classmethod
    def from_json(cls, data: Any, stack: Mapping[str, str | None]) -> Measured | None:
        """The cached figures, or None when the file is of another format or stack, or malformed."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        if any(data.get(key) != value for key, value in stack.items()):
            return None

        def rate(value: Any, unit: float) -> float | None:
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(value)
            return float(value) * unit

        try:
            tflops = data["tflops"]
            flops = tuple((d, rate(tflops.get(d), 1e12)) for d in DTYPES)
            return cls(flops, rate(data["gb_per_s"], 1e9), str(data["date"]),
                       tuple(sorted((str(k), str(v)) for k, v in dict(data.get("shapes", {})).items())),
                       tuple(str(n) for n in data.get("notes", [])), cached=True)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def _rate(work: Workload, timer: Timer, plan: SamplingPlan,
          load: Callable[[], HostLoad | None] | None) -> tuple[float, tuple[str, ...], str | None]:
    """Work a second of one workload, the timer's notes (a throttled clock, say), and why the
    figure is not plausible (None: it is): the host contended while it was sampled, where
    ``load`` reads the host's load (the CPU), or samples spread over more than ``PLAUSIBLE_SPREAD``."""
    before = load() if load is not None else None
    m = timer.measure(work, plan)
    seconds = m.median_ms / 1e3
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"the {m.clock} clock read a median of {m.median_ms!r} ms")
    doubt = contention_note(m.samples_ms, [before, load()]) if load is not None else None
    s = m.summary
    if doubt is None and s.ci_low_ms > 0 and s.ci_high_ms / s.ci_low_ms > PLAUSIBLE_SPREAD:
        doubt = (f"samples spread {s.ci_low_ms:.4g}..{s.ci_high_ms:.4g} ms, more than {PLAUSIBLE_SPREAD:g} times "
                 "(no steady figure)")
    return (work.flops or work.bytes) / seconds, m.notes, doubt


def measure(timer: Timer, plan: SamplingPlan, device: DetectedDevice,
            load: Callable[[], HostLoad | None] = host_load) -> Measured:
    """Time the matmuls and the copy on ``device`` with ``timer``. A workload that fails is
    left out with its reason in ``notes``; one whose figure is not plausible (a contended host,
    read with ``load`` on the CPU; a wide spread) is kept for the run and named in ``doubts``,
    so it is not cached. No CUDA where ``device`` is a GPU raises ``RuntimeError``."""
    import torch  # noqa: PLC0415 - torch loads on first use, not at start-up

    if device.is_gpu and not torch.cuda.is_available():
        raise RuntimeError("no CUDA device (torch.cuda.is_available() is False)")
    where = "cuda" if device.is_gpu else "cpu"
    plan = replace(plan, overhead=True, min_samples=min(plan.min_samples, CEILINGS_MIN_SAMPLES))  # not a case
    flops: dict[str, float | None] = {}
    shapes: dict[str, str] = {}
    notes: list[str] = []
    doubts: list[str] = []

    def timed(name: str, work: Workload) -> float | None:
        try:
            value, said, doubt = _rate(work, timer, plan, None if device.is_gpu else load)
        except Exception as exc:  # noqa: BLE001 - one ceiling's failure costs only that ceiling
            notes.append(f"{name} not measured: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
            return None
        finally:
            work.release()
        shapes[name] = work.shape
        notes.extend(f"{name}: {n}" for n in said)
        doubts.extend([f"{name}: {doubt}"] if doubt else [])
        return value

    with exact_fp32():  # fp32 matmul without TF32 (torch's default, and how the checks run)
        for dtype in DTYPES:
            def make(n: int, dtype: str = dtype) -> Workload:
                return Workload(f"matmul-{dtype}", where, n, dtype)
            try:
                n = GPU_MATMUL_N if device.is_gpu else cpu_matmul_side(_eager_seconds(make))
            except Exception as exc:  # noqa: BLE001 - e.g. no such dtype on this device
                notes.append(f"{dtype} not measured: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
                flops[dtype] = None
                continue
            flops[dtype] = timed(dtype, make(n))
    copy = Workload("copy", where, GPU_COPY_BYTES if device.is_gpu else CPU_COPY_BYTES)
    bytes_per_s = timed("copy", copy)
    if device.is_gpu:
        torch.cuda.empty_cache()  # give the ceilings' buffers back before the next case
    return Measured(tuple(flops.items()), bytes_per_s, _dt.datetime.now().isoformat(timespec="seconds"),
                    tuple(sorted(shapes.items())), tuple(notes), doubts=tuple(doubts))


# -- the cache ------------------------------------------------------------------------------


def cache_path(folder: Path, machine: str, stack: Mapping[str, str | None]) -> Path:
    """``<machine>-torch<version>-cuda<version>.json``, with the names made file-safe."""
    name = f"{machine}-torch{stack.get('torch')}-cuda{stack.get('cuda') or 'none'}"
    return folder / (re.sub(r"[^A-Za-z0-9._+-]", "_", name) + ".json")


def load(path: Path, stack: Mapping[str, str | None]) -> Measured | None:
    try:
        return Measured.from_json(json.loads(path.read_text(encoding="utf-8")), stack)
    except (OSError, ValueError):
        return None


def save(path: Path, measured: Measured, stack: Mapping[str, str | None]) -> str | None:
    """Write atomically; the reason it could not be written, or None."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(json.dumps(measured.to_json(stack), indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(scratch, path)
    except OSError as exc:
        return f"not cached ({exc})"
    return None


# -- the figures a run uses -----------------------------------------------------------------


@dataclass(frozen=True)
class Ceilings:
    """The spec table's figures, the measured ones (None: not measured, ``why``) and the user's
    (``--attnperf-peaks``: dtype or 'bw' to FLOP/s or bytes/s).

    The roofline takes user > measured > spec, so a case is judged against what this machine
    does; MFU and bandwidth % take user > spec > measured, so a card in the table keeps the
    vendor's figures and any other device, the CPU too, gets the measured ones."""

    spec: HardwareSpec
    measured: Measured | None = None
    why: str | None = None  # why nothing was measured
    user: tuple[tuple[str, float], ...] = ()
    cache_note: str | None = None  # where the figures were kept, or why not

    def _figures(self, key: str) -> dict[str, float | None]:
        if key == "bw":
            spec, measured = self.spec.hbm_bytes_per_s, self.measured and self.measured.bytes_per_s
        else:
            spec, measured = self.spec.peak_flops_for(key), self.measured and self.measured.peak(key)
        return {"user": dict(self.user).get(key), "measured": measured or None, "spec": spec}

    def _pick(self, key: str, order: tuple[str, ...]) -> Ceiling | None:
        figures = self._figures(key)
        return next((Ceiling(figures[s], s) for s in order if figures[s]), None)  # type: ignore[arg-type]

    def roofline_peak(self, dtype: str) -> Ceiling | None:
        """The roofline's FLOP/s ceiling for ``dtype``: user, else measured, else spec."""
        return self._pick(dtype, ("user", "measured", "spec"))

    def roofline_bandwidth(self) -> Ceiling | None:
        """The roofline's bytes/s ceiling: user, else measured, else spec."""
        return self._pick("bw", ("user", "measured", "spec"))

    def _limit(self, key: str) -> Ceiling | None:
        figures = self._figures(key)
        if figures["user"]:
            return Ceiling(figures["user"], "user")
        known = [Ceiling(figures[s], s) for s in ("measured", "spec") if figures[s]]  # type: ignore[arg-type]
        return max(known, key=lambda c: c.value) if known else None

    def limit_peak(self, dtype: str) -> Ceiling | None:
        """The FLOP/s no kernel beats for ``dtype`` (the impossible-speed check): user, else the
        higher of measured and spec (a kernel may beat the measured matmul, never the card)."""
        return self._limit(dtype)

    def limit_bandwidth(self) -> Ceiling | None:
        """The bytes/s no kernel beats: user, else the higher of measured and spec (a stream of
        reads may beat the measured copy, which reads and writes; never the card's memory)."""
        return self._limit("bw")

    def rate_peak(self, dtype: str) -> Ceiling | None:
        """The FLOP/s that MFU is taken against for ``dtype``: user, else spec, else measured."""
        return self._pick(dtype, ("user", "spec", "measured"))

    def rate_bandwidth(self) -> Ceiling | None:
        """The bytes/s that bandwidth % is taken against: user, else spec, else measured."""
        return self._pick("bw", ("user", "spec", "measured"))

    def lines(self) -> list[str]:
        """For the summary: each figure beside the spec's, the ridge point, where they came from."""
        m = self.measured
        how = (f"measured {m.date}" + (", from the cache" if m.cached else "") if m else self.why or "not measured")
        shown = []
        for key in (*DTYPES, "bw"):
            unit, name = (1e9, "copy (GB/s)") if key == "bw" else (1e12, key)
            given = [f"{_figure(v / unit)} {s}" for s, v in self._figures(key).items() if v]
            shown.extend([f"{name} {' / '.join(given)}"] if given else [])
        out = [f"ceilings ({how}; TFLOP/s, fp32 without TF32): " + (", ".join(shown) or "none known")]
        peak, band = self.roofline_peak("bf16"), self.roofline_bandwidth()
        if peak and band:
            out.append(f"roofline ridge (bf16): {_figure(ridge(peak.value, band.value))} FLOP/B from the {peak.source} "
                       f"peak and {band.source} bandwidth")
        if m and m.notes:
            out.append("ceilings notes: " + "; ".join(m.notes))
        if self.cache_note:
            out.append(f"ceilings {self.cache_note}")
        return out


def _figure(value: float) -> str:
    """One decimal from 10 up (989.5, 4800.0), else three significant digits (a CPU's 0.0512)."""
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


CACHE_FOLDER = ("pytest-attnperf", "ceilings")  # under the user's cache folder ($XDG_CACHE_HOME, or ~/.cache)


def obtain(spec: HardwareSpec, how: str, peaks: tuple[tuple[str, float], ...], *, pool_run: bool,
           environment: Callable[[], Mapping[str, str | None]], machine: str, folder: Path,
           measure_now: Callable[[], Measured]) -> Ceilings:
    """The run's ceilings on ``spec``: from the cache in ``folder``, else measured now
    (``measure_now``), as ``--attnperf-ceilings`` (``how``) says; never raises. The software
    stack that names the cache file is read (``environment``) only when the figures are wanted."""
    base = Ceilings(spec, user=peaks)
    if how == "off":
        return replace(base, why="not measured (--attnperf-ceilings=off)")
    if pool_run:
        return replace(base, why="not measured in a pool run")
    env = environment()
    stack = {"device": env.get("device"), "torch": env.get("torch"), "cuda": env.get("cuda"),
             "driver": env.get("driver")}
    path = cache_path(folder, machine, stack)
    if how == "cache":
        cached = load(path, stack)
        if cached is not None:
            return replace(base, measured=cached, cache_note=f"cache: {path}")
    try:
        measured = measure_now()
    except Exception as exc:  # noqa: BLE001 - the run goes on with the spec figures
        return replace(base, why=f"not measured: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    if not any(v for _, v in measured.flops) and not measured.bytes_per_s:
        return replace(base, measured=measured)
    if measured.doubts:  # this run's figures; the next run measures them again
        return replace(base, measured=measured, cache_note=f"NOT cached, not plausible enough to keep for later runs "
                       f"({'; '.join(measured.doubts)}): measured again by the next run")
    problem = save(path, measured, stack)
    return replace(base, measured=measured, cache_note=problem or f"cached in {path}")


def main(argv: list[str] | None = None) -> int:
    """Measure this machine's ceilings with the default timer and print them beside the spec."""
    parser = argparse.ArgumentParser(prog="attnperf-ceilings", description=main.__doc__)
    parser.add_argument("--budget", type=float, default=0.5, help="seconds of sampling per ceiling (default 0.5)")
    args = parser.parse_args(argv)
    device = detect_device()
    spec = match(device) or unlisted_spec(device)
    started = time.monotonic()
    measured = measure(default_timer(device), SamplingPlan(budget_s=args.budget), device)
    print(f"{device.name} ({spec.name}), {time.monotonic() - started:.1f} s")
    for line in Ceilings(spec, measured).lines():
        print(line)
    for dtype in DTYPES:
        print(f"  {dtype} matmul {dict(measured.shapes).get(dtype, '-')}")
    print(f"  copy {dict(measured.shapes).get('copy', '-')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
