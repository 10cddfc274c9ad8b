"""Command-line options and ini keys, resolved command line > environment > ini > default.

Each value is parsed once, at configure time, into ``Settings``; a bad value is a usage error
that names where it came from (``--attnperf-tolerance``, ``ATTNPERF_TOLERANCE`` or the ini
key ``attnperf_tolerance``).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

__all__ = ["MODES", "Settings", "add_options", "duration_ms", "fraction", "peaks", "read_settings"]

MODES = ("cold", "hot")
T = TypeVar("T")


@dataclass(frozen=True)
class Option:
    dest: str
    flag: str
    env: str
    ini: str
    default: str
    help: str
    is_flag: bool = False


OPTIONS = (
    Option("hw", "--hw", "ATTNPERF_HW", "attnperf_hw", "",
           "hardware name (h200, h100, gb10, ...): baselines/<NAME>.yaml; detected when omitted"),
    Option("update_baselines", "--update-baselines", "ATTNPERF_UPDATE_BASELINES",
           "attnperf_update_baselines", "false",
           "record the measured cases into the hardware's baseline file instead of gating",
           is_flag=True),
    Option("baselines", "--attnperf-baselines", "ATTNPERF_BASELINES", "attnperf_baselines",
           "baselines", "folder of per-hardware baseline files (relative to the rootdir)"),
    Option("tolerance", "--attnperf-tolerance", "ATTNPERF_TOLERANCE", "attnperf_tolerance",
           "5%", "slowdown tolerated before a case regresses: '5%' or 0.05"),
    Option("run_noise", "--attnperf-run-noise", "ATTNPERF_RUN_NOISE", "attnperf_run_noise", "0.5%",
           "least run-to-run standard deviation of a case's median assumed by the gate (0.5%: over "
           "five unchanged H200 runs a median's sd was up to 0.61% for cases >= 50 us and 0.89% for 10-50 us); "
           "a case's own, from its recordings, is used when larger"),
    Option("run_noise_time", "--attnperf-run-noise-time", "ATTNPERF_RUN_NOISE_TIME", "attnperf_run_noise_time",
           "0.1us", "least run-to-run standard deviation of a case's median as a time, for short kernels, whose "
           "medians move between processes by a time that does not shrink with them ('0.1us'; a bare number is "
           "in us). 0.1us: session 10, H200 cases of 10-40 us timed cold in three processes on each of two GPUs, "
           "the median case's sd 0.07-0.12 us (1-1.4% at most); it outweighs --attnperf-run-noise below 20 us"),
    Option("machine_noise", "--attnperf-machine-noise", "ATTNPERF_MACHINE_NOISE", "attnperf_machine_noise", "0.7%",
           "standard deviation of a case's move between two machines (another GPU, lease or boot), added to "
           "the noise bar unless the baseline's centre is known to come from this machine or its recordings "
           "come from two or more machines (0.7%: RMS move of 162 H200 softmax cases between two leases in "
           "session 4, CUPTI attached; 0.34% between two others in session 5)"),
    Option("machine_offset", "--attnperf-machine-offset", "ATTNPERF_MACHINE_OFFSET", "attnperf_machine_offset",
           "2us", "standard deviation of the time a machine adds to or takes from every sample of a case whatever "
           "its length, used with --attnperf-machine-noise ('2us', '0.5 us', '0.002ms'; a bare number is in us). "
           "2us: RMS move of the 45 H200 softmax cases under 60 us timed cold, four machines against the one that "
           "recorded them (session 7): 0.2 us on another single-GPU lease, 2.1 to 2.4 us, all slower, on three GPUs "
           "of two 2-GPU hosts (hot mode, many calls per graph: 4 of 5 such callables within 1.3%, so mostly a "
           "fixed per-sample cost, not a share of the kernel)"),
    Option("machine_residual", "--attnperf-machine-residual", "ATTNPERF_MACHINE_RESIDUAL",
           "attnperf_machine_residual", "0.5us",
           "used instead of --attnperf-machine-offset where the move is partly known: a cold case whose "
           "recordings and this run both have a sample floor (a one-element add, measured once a run and kept with "
           "each recording) is compared against its centre moved by the floors' difference, and this is the "
           "standard deviation of what that leaves. 0.5us: session 9, 150 H200 cases under 1 ms timed cold on two "
           "GPUs of a 2-GPU host against one recording on a single-GPU lease moved +1.82 to +2.07 us on average "
           "by size class (sd 0.35-0.44 us across the cases under 200 us), the floors +1.80 to +1.96 us"),
    Option("machine", "--attnperf-machine", "ATTNPERF_MACHINE", "attnperf_machine", "",
           "this machine's name in the baselines' recording history (default: the GPU's UUID and the boot "
           "id); a fixed name makes reboots of a dedicated box one machine"),
    Option("require_baseline", "--attnperf-require-baseline", "ATTNPERF_REQUIRE_BASELINE",
           "attnperf_require_baseline", "false",
           "fail a measured case that has no entry in the baseline file (default: pass as 'new')",
           is_flag=True),
    Option("mode", "--attnperf-mode", "ATTNPERF_MODE", "attnperf_mode", "cold",
           "cold: L2 flushed before every sample (default, for gating); hot: back-to-back replays"),
    Option("budget", "--attnperf-budget", "ATTNPERF_BUDGET", "attnperf_budget", "0.5",
           "seconds of sampling per case before stopping, once the sample floor is reached"),
    Option("stdrel", "--attnperf-stdrel", "ATTNPERF_STDREL", "attnperf_stdrel", "0.5%",
           "stop sampling a case once its relative standard deviation is under this"),
    Option("min_samples", "--attnperf-min-samples", "ATTNPERF_MIN_SAMPLES",
           "attnperf_min_samples", "10", "floor on samples per case"),
    Option("cold_graphs", "--attnperf-cold-graphs", "ATTNPERF_COLD_GRAPHS", "attnperf_cold_graphs", "8",
           "cold mode: captures of each case's graph, sampled in turn (each capture of a short kernel has a "
           "median of its own, up to 5% apart on the H200; the run's median is over all of them)"),
    Option("hot_sample", "--attnperf-hot-sample", "ATTNPERF_HOT_SAMPLE", "attnperf_hot_sample", "20ms",
           "hot mode: about how long one sample lasts, above 0 and at most 100 ms ('0.5ms', '20ms'; a bare number "
           "is in us): a graph of that many back-to-back calls (at most 64, or 128 per ms of a sample longer than "
           "0.5 ms) is replayed and a sample is its time over its calls. The default is do_bench_cudagraph's "
           "rep (which sizes its graph by the eager time of a call, so it holds fewer calls than ours): on the "
           "H200 a 10 us cuDNN forward took 10.2 us a call in graphs of 39 calls (0.5 ms) and 9.6 in graphs "
           "of 600 or more"),
    Option("processes", "--attnperf-processes", "ATTNPERF_PROCESSES", "attnperf_processes", "3",
           "on a CUDA device, time each short case (see --attnperf-processes-below) in this many processes "
           "(1: this one only): that many less one worker pytest runs measure them before the tests start, and "
           "the case's figure pools the samples of all of them, as many from each. A short kernel's median moves "
           "between processes by 0.4-0.7% on the H200, which nothing within one process averages away; pooled "
           "over 3, the 40 cases under 50 us moved by at most 0.58% (sd over 8 runs), one process alone by up to "
           "1.17%. Costs a worker's start-up and those cases' time per extra process (about 40 s each there)"),
    Option("processes_below", "--attnperf-processes-below", "ATTNPERF_PROCESSES_BELOW",
           "attnperf_processes_below", "50us",
           "with --attnperf-processes: the cases timed in several processes are those whose baseline centre is "
           "under this ('50us'; a bare number is in us); a case with no baseline entry is timed here only"),
    Option("triton_cache", "--attnperf-triton-cache", "ATTNPERF_TRITON_CACHE", "attnperf_triton_cache",
           "~/.cache/pytest-attnperf/triton",
           "on a CUDA device, when recording or when baselines/<hw>.autotune exists: Triton's cache folder (one "
           "subfolder per hardware, kept between runs) that gets the recorded autotune choices; 'off' leaves "
           "TRITON_CACHE_DIR alone (default ~/.cache/pytest-attnperf/triton)"),
    Option("ceilings", "--attnperf-ceilings", "ATTNPERF_CEILINGS", "attnperf_ceilings", "cache",
           "measured matmul and copy ceilings for the roofline: cache (measure once per machine and software "
           "stack, kept under $XDG_CACHE_HOME or ~/.cache, pytest-attnperf/ceilings), refresh (measure again), "
           "off (spec figures only); default cache"),
    Option("peaks", "--attnperf-peaks", "ATTNPERF_PEAKS", "attnperf_peaks", "",
           "peaks to use instead of the measured and spec ones, e.g. 'bf16=990,fp16=990,fp32=67,bw=4800' "
           "(bf16/fp16/fp32 in TFLOP/s, bw in GB/s; any subset); default none"),
    Option("report", "--attnperf-report", "ATTNPERF_REPORT", "attnperf_report", "",
           "folder to write the studies' report.json, report.md and plots into at the end of the run (default: none)"),
    Option("case_timeout", "--attnperf-case-timeout", "ATTNPERF_CASE_TIMEOUT", "attnperf_case_timeout", "300",
           "time limit of one attention case's warm-up, correctness check and timing, failing that case "
           "alone (0: none; default 300 s)"),
)


@dataclass(frozen=True)
class Settings:
    """Every attnperf setting, parsed and checked."""

    hw: str | None
    update_baselines: bool
    require_baseline: bool
    baselines_dir: Path
    tolerance: float
    run_noise: float
    run_noise_time_ms: float
    machine_noise: float
    machine_offset_ms: float
    machine_residual_ms: float
    machine: str | None
    mode: str
    budget_s: float
    target_stdrel: float
    min_samples: int
    cold_graphs: int
    processes: int = 1
    processes_below_ms: float = 0.05
    hot_sample_ms: float = 20.0
    case_timeout_s: float = 300.0  # 0: no limit (isolation.CaseClock)
    worker_out: Path | None = None  # set in a worker run (see processes.py): where its samples go
    ceilings: str = "cache"  # see --attnperf-ceilings
    peaks: tuple[tuple[str, float], ...] = ()  # --attnperf-peaks: (bf16|fp16|fp32, FLOP/s) and ("bw", bytes/s)
    report_dir: Path | None = None  # --attnperf-report: where the studies' report goes


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("attnperf", "attention kernel correctness and performance")
    for opt in OPTIONS:
        if opt.is_flag:
            group.addoption(opt.flag, action="store_true", default=None, dest=f"attnperf_{opt.dest}",
                            help=f"{opt.help} (env {opt.env}, ini {opt.ini})")
            parser.addini(opt.ini, help=opt.help, type="bool", default=False)
        else:
            group.addoption(opt.flag, action="store", default=None, dest=f"attnperf_{opt.dest}",
                            metavar=opt.dest.upper(), help=f"{opt.help} (env {opt.env}, ini {opt.ini})")
            parser.addini(opt.ini, help=f"{opt.help} (default {opt.default})", default="")
    group.addoption("--attnperf-worker-out", action="store", default=None, dest="attnperf_worker_out",
                    help=argparse.SUPPRESS)  # internal: a worker run of --attnperf-processes


def _raw(config: pytest.Config, opt: Option) -> tuple[str, str]:
    """The value as given and where it came from."""
    cli = config.getoption(f"attnperf_{opt.dest}")
    if cli is not None:
        return str(cli), opt.flag
    env = os.environ.get(opt.env)
    if env is not None and env != "":
        return env, f"environment variable {opt.env}"
    ini = config.getini(opt.ini)
    if ini not in (None, "", []):
        return str(ini), f"ini key {opt.ini}"
    return opt.default, "the default"


def fraction(text: str) -> float:
    """'5%' or '0.05' as 0.05; ``ValueError`` outside [0, 10)."""
    text = text.strip()
    value = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    if not 0.0 <= value < 10.0:
        raise ValueError("must be a fraction such as 0.05 or a percentage such as 5%")
    return value


_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def duration_ms(text: str) -> float:
    """'1us', '0.5 us', '0.002ms' or '1' (microseconds) as milliseconds; ``ValueError`` when
    negative or not a time."""
    text = text.strip().lower()
    unit = next((u for u in ("us", "ms", "s") if text.endswith(u)), None)
    number = text[: -len(unit)] if unit else text
    value = float(number) * _UNITS_MS[unit or "us"]
    if not 0.0 <= value < 1e6:
        raise ValueError("must be a time of at least 0, such as 1us or 0.002ms")
    return value


def _hot_sample_ms(text: str) -> float:
    value = duration_ms(text)
    if not 0 < value <= 100:  # 100 ms: a graph of up to 12800 calls of a sub-8-us kernel
        raise ValueError("must be a time above 0 and at most 100ms, such as 0.5ms or 20ms")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be positive")
    return value


def _time_limit_s(text: str) -> float:
    """'300', '300s' or '1.5 s' as seconds; 0 is no limit."""
    text = text.strip().lower()
    value = float(text[:-1] if text.endswith("s") else text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError("must be a finite number of seconds, at least 0 (0: no limit), such as 300 or 300s")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def _mode(text: str) -> str:
    text = text.strip().lower()
    if text not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)}")
    return text


CEILINGS = ("cache", "refresh", "off")
PEAK_KEYS = {"bf16": 1e12, "fp16": 1e12, "fp32": 1e12, "bw": 1e9}  # TFLOP/s and GB/s as given


def _ceilings(text: str) -> str:
    text = text.strip().lower()
    if text not in CEILINGS:
        raise ValueError(f"must be one of {', '.join(CEILINGS)}")
    return text


def peaks(text: str) -> tuple[tuple[str, float], ...]:
    """'bf16=990,bw=4800' as (('bf16', 9.9e14), ('bw', 4.8e12)): FLOP/s and bytes/s."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in PEAK_KEYS:
            raise ValueError(f"'{part}' is not KEY=NUMBER with KEY one of {', '.join(PEAK_KEYS)}")
        number = float(value)
        if not (number > 0 and number < 1e9):
            raise ValueError(f"'{part}': a peak must be a positive number (TFLOP/s, or GB/s for bw)")
        out[key] = number * PEAK_KEYS[key]
    return tuple(sorted(out.items()))


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


def _get(config: pytest.Config, dest: str, parse: Callable[[str], T]) -> T:
    opt = next(o for o in OPTIONS if o.dest == dest)
    text, source = _raw(config, opt)
    try:
        return parse(text)
    except ValueError as exc:
        raise pytest.UsageError(f"attnperf: bad value {text!r} from {source}: {exc}") from None


def read_settings(config: pytest.Config) -> Settings:
    """Parse every setting; raises ``pytest.UsageError`` naming the source of a bad one."""
    hw = _get(config, "hw", str).strip() or None
    folder = Path(_get(config, "baselines", str))
    if not folder.is_absolute():
        folder = Path(config.rootpath) / folder
    out = config.getoption("attnperf_worker_out")
    worker = out is not None  # a worker only measures: it gates, records and spawns nothing
    report = _get(config, "report", str).strip()
    return Settings(
        hw=hw.lower() if hw else None,
        update_baselines=_get(config, "update_baselines", _bool) and not worker,
        require_baseline=_get(config, "require_baseline", _bool) and not worker,
        baselines_dir=folder,
        tolerance=_get(config, "tolerance", fraction),
        run_noise=_get(config, "run_noise", fraction),
        run_noise_time_ms=_get(config, "run_noise_time", duration_ms),
        machine_noise=_get(config, "machine_noise", fraction),
        machine_offset_ms=_get(config, "machine_offset", duration_ms),
        machine_residual_ms=_get(config, "machine_residual", duration_ms),
        machine=_get(config, "machine", str).strip() or None,
        mode=_get(config, "mode", _mode),
        budget_s=_get(config, "budget", _positive_float),
        target_stdrel=_get(config, "stdrel", fraction),
        min_samples=_get(config, "min_samples", _positive_int),
        cold_graphs=_get(config, "cold_graphs", _positive_int),
        processes=1 if worker else _get(config, "processes", _positive_int),
        processes_below_ms=_get(config, "processes_below", duration_ms),
        hot_sample_ms=_get(config, "hot_sample", _hot_sample_ms),
        case_timeout_s=_get(config, "case_timeout", _time_limit_s),
        worker_out=Path(out) if worker else None,
        ceilings=_get(config, "ceilings", _ceilings),
        peaks=_get(config, "peaks", peaks),
        report_dir=None if worker or not report else Path(config.invocation_params.dir) / report,
    )
