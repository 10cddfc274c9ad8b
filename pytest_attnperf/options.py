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
from typing import Any, TypeVar

import pytest

from pytest_attnperf.families.builtin import SUITES
from pytest_attnperf.families.models.cases import parse_decode, parse_prefill, parse_train
from pytest_attnperf.families.models.load import check_models
from pytest_attnperf.gate.drift import available
from pytest_attnperf.gate.memory import Tolerance

__all__ = ["MODES", "OPT_IN", "Settings", "add_options", "duration_ms", "fraction", "peaks", "project_dir",
           "read_settings", "seconds", "source"]

MODES = ("cold", "hot")
T = TypeVar("T")


TRITON_CACHE_DEFAULT = "$XDG_CACHE_HOME/pytest-attnperf/triton"  # ~/.cache/... with the variable unset


@dataclass(frozen=True)
class Option:
    dest: str
    flag: str
    env: str  # "": none (a tuning option: PYTEST_ADDOPTS carries it in the environment)
    ini: str
    default: str
    help: str
    is_flag: bool = False
    repeat: bool = False  # the flag may be given more than once; its values join the list


OPTIONS = (
    Option("hw", "--hw", "ATTNPERF_HW", "attnperf_hw", "",
           "hardware name (h200, h100, gb10, ...) naming baselines/<name>.yaml (default: detected)"),
    Option("update_baselines", "--update-baselines", "ATTNPERF_UPDATE_BASELINES",
           "attnperf_update_baselines", "false",
           "record the measured cases into the baseline file instead of gating them (default: off)",
           is_flag=True),
    Option("baselines", "--attnperf-baselines", "ATTNPERF_BASELINES", "attnperf_baselines", "baselines",
           "baseline folder, relative to the ini file's folder, else to the current one (default baselines)"),
    Option("suites", "--attnperf-suites", "ATTNPERF_SUITES", "attnperf_suites", "",
           "built-in suites to add to the run: softmax, linear or all, comma-separated (default: none)"),
    Option("opt_in", "--attnperf-opt-in", "ATTNPERF_OPT_IN", "attnperf_opt_in", "",
           "opt-in rows of the built-in tables: precision (the linear fp16 and fp32 rows) (default: none)"),
    # cases from a model's config (docs/models.md); opt-in: none unless a model is given
    Option("models", "--attnperf-model", "ATTNPERF_MODELS", "attnperf_models", "",
           "a model whose layers become cases: llama3-8b, a config.json, its folder, a hub id; "
           "repeatable (default: none)",
           repeat=True),
    Option("tp", "--attnperf-tp", "ATTNPERF_TP", "attnperf_tp", "1",
           "tensor-parallel degrees the models' heads are split for, comma-separated, e.g. 1,8 (default 1)"),
    Option("model_prefill", "--attnperf-model-prefill", "ATTNPERF_MODEL_PREFILL", "attnperf_model_prefill", "",
           "the models' prefill lengths at B=1, comma-separated, or none (default 4096,16384; CPU 128)"),
    Option("model_train", "--attnperf-model-train", "ATTNPERF_MODEL_TRAIN", "attnperf_model_train", "",
           "the models' training shapes BATCHxSEQ, comma-separated, or none (default 8x4096; CPU 2x64)"),
    Option("model_decode", "--attnperf-model-decode", "ATTNPERF_MODEL_DECODE", "attnperf_model_decode", "",
           "the models' decode shapes BATCHxCACHE, comma-separated, or none (default 1x32768,32x8192; CPU 2x64)"),
    Option("check_only", "--attnperf-check-only", "ATTNPERF_CHECK_ONLY", "attnperf_check_only", "false",
           "run every correctness check but time, gate and record nothing (default: off)", is_flag=True),
    Option("seed", "--attnperf-seed", "ATTNPERF_SEED", "attnperf_seed", "0",
           "draws every case's inputs afresh from this seed; 0 draws the ones baselines were recorded on (default 0)"),
    # the gate; the evidence behind each default is in docs/gate.md
    Option("tolerance", "--attnperf-tolerance", "ATTNPERF_TOLERANCE", "attnperf_tolerance", "5%",
           "slowdown tolerated before a case fails (default 5%)"),
    Option("run_noise", "--attnperf-run-noise", "", "attnperf_run_noise", "0.5%",
           "least run-to-run spread of a case's median the gate assumes (default 0.5%)"),
    Option("run_noise_time", "--attnperf-run-noise-time", "", "attnperf_run_noise_time",
           "0.1us", "least run-to-run spread of a median as a time, for short kernels (default 0.1 us)"),
    Option("machine_noise", "--attnperf-machine-noise", "", "attnperf_machine_noise", "0.7%",
           "spread of a case's move between machines, allowed against another's recordings (default 0.7%)"),
    Option("machine_offset", "--attnperf-machine-offset", "", "attnperf_machine_offset",
           "2us", "time per sample a machine may add or take, allowed against another's recordings (default 2 us)"),
    Option("machine_residual", "--attnperf-machine-residual", "",
           "attnperf_machine_residual", "0.5us",
           "--attnperf-machine-offset once the sample overheads' difference is known (default 0.5 us)"),
    Option("machine", "--attnperf-machine", "", "attnperf_machine", "",
           "this machine's name in the baselines' recording history (default: GPU UUID and boot id)"),
    Option("memory_tolerance", "--attnperf-memory-tolerance", "ATTNPERF_MEMORY_TOLERANCE",
           "attnperf_memory_tolerance", "4MiB+1%",
           "growth of peak memory above the inputs tolerated before a case fails, or off (default 4MiB+1%)"),
    Option("require_baseline", "--attnperf-require-baseline", "ATTNPERF_REQUIRE_BASELINE",
           "attnperf_require_baseline", "false",
           "fail a measured case with no baseline entry or left unjudged on a contended host (default off)",
           is_flag=True),
    Option("fail_on_kernel_change", "--attnperf-fail-on-kernel-change", "ATTNPERF_FAIL_ON_KERNEL_CHANGE",
           "attnperf_fail_on_kernel_change", "false",
           "fail a case whose kernel inventory differs from its baseline entry's, not only report it (default: off)",
           is_flag=True),
    # sampling; the evidence behind each default is in docs/measurement.md
    Option("mode", "--attnperf-mode", "ATTNPERF_MODE", "attnperf_mode", "cold",
           "cold: L2 flushed before every sample; hot: back-to-back calls (default cold)"),
    Option("budget", "--attnperf-budget", "", "attnperf_budget", "0.5s",
           "sampling time per case once --attnperf-min-samples are taken (default 0.5 s)"),
    Option("stdrel", "--attnperf-stdrel", "", "attnperf_stdrel", "0.5%",
           "stop sampling a case once its relative standard deviation is below this (default 0.5%)"),
    Option("min_samples", "--attnperf-min-samples", "",
           "attnperf_min_samples", "10", "least samples per case (default 10 samples)"),
    Option("cold_graphs", "--attnperf-cold-graphs", "", "attnperf_cold_graphs", "8",
           "cold mode: captures of each case's graph, sampled in turn (default 8 graphs)"),
    Option("hot_sample", "--attnperf-hot-sample", "", "attnperf_hot_sample", "20ms",
           "hot mode: length of one sample, a graph of back-to-back calls, at most 100 ms (default 20 ms)"),
    Option("processes", "--attnperf-processes", "", "attnperf_processes", "3",
           "processes whose samples of a short GPU case are pooled; 1: this one only (default 3 processes)"),
    Option("processes_below", "--attnperf-processes-below", "",
           "attnperf_processes_below", "50us",
           "a case is short for --attnperf-processes when its baseline is under this (default 50 us)"),
    Option("triton_cache", "--attnperf-triton-cache", "ATTNPERF_TRITON_CACHE", "attnperf_triton_cache",
           TRITON_CACHE_DEFAULT,
           "Triton cache given the recorded autotune picks; off: as is "
           "(default $XDG_CACHE_HOME/pytest-attnperf/triton)"),
    Option("ceilings", "--attnperf-ceilings", "", "attnperf_ceilings", "cache",
           "measured matmul/copy ceilings: cache (once per machine and stack), refresh or off (default cache)"),
    Option("peaks", "--attnperf-peaks", "", "attnperf_peaks", "",
           "your own peaks, e.g. bf16=990,fp16=990,fp32=67 (TFLOP/s),bw=4800 (GB/s) (default: none)"),
    Option("report", "--attnperf-report", "ATTNPERF_REPORT", "attnperf_report", "",
           "folder for report.json, report.md and plots, relative as --attnperf-baselines (default: none)"),
    Option("benchmark_table", "--attnperf-benchmark-table", "ATTNPERF_BENCHMARK_TABLE", "attnperf_benchmark_table",
           "false", "also print pytest-benchmark's table of the measured cases after attnperf's (default: off)",
           is_flag=True),
    # the run history and triage; docs/history.md
    Option("history", "--attnperf-history", "ATTNPERF_HISTORY", "attnperf_history", "",
           "folder to which gating and recording runs append a record per case, <hw>.jsonl (default: none)"),
    Option("commit", "--attnperf-commit", "ATTNPERF_COMMIT", "attnperf_commit", "",
           "the commit history records name (default: git HEAD of the ini file's folder, else none)"),
    Option("fail_on_drift", "--attnperf-fail-on-drift", "ATTNPERF_FAIL_ON_DRIFT", "attnperf_fail_on_drift",
           "false", "fail a case as drifted when its history shows a lasting slowdown into this run (default: off)",
           is_flag=True),
    Option("pr_comment", "--attnperf-pr-comment", "ATTNPERF_PR_COMMENT", "attnperf_pr_comment", "",
           "Markdown file of regressions, improvements, memory changes and drifts, for a PR (default: none)"),
    Option("case_timeout", "--attnperf-case-timeout", "ATTNPERF_CASE_TIMEOUT", "attnperf_case_timeout", "300s",
           "time limit of one case (warm-up, checks, timing) before it fails; 0: none (default 300 s)"),
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
    pool_out: Path | None = None  # set in a pool run (plugins/pool.py): where its samples go
    ceilings: str = "cache"  # see --attnperf-ceilings
    peaks: tuple[tuple[str, float], ...] = ()  # --attnperf-peaks: (bf16|fp16|fp32, FLOP/s) and ("bw", bytes/s)
    report_dir: Path | None = None  # --attnperf-report: where the studies' report goes
    suites: tuple[str, ...] = ()  # built-in suites added to the collection (--attnperf-suites)
    opt_in: tuple[str, ...] = ()  # --attnperf-opt-in: the opt-in row groups of the built-in tables collected
    check_only: bool = False  # correctness only: nothing timed, gated or recorded
    seed: int = 0  # --attnperf-seed: mixed into every case's input draw (0: the usual draw)
    benchmark_table: bool = False  # --attnperf-benchmark-table: pytest-benchmark's table keeps attnperf's cases
    fail_on_kernel_change: bool = False  # --attnperf-fail-on-kernel-change: a changed inventory fails the case
    memory_tolerance: str = "4MiB+1%"  # --attnperf-memory-tolerance, as gate.memory.Tolerance.parse reads it
    models: tuple[str, ...] = ()  # --attnperf-model: specs, local paths made absolute (families/models/load.py)
    tp: tuple[int, ...] = (1,)  # --attnperf-tp: the degrees the models' heads are split for
    model_prefill: str = ""  # --attnperf-model-prefill, checked ("": the device's defaults)
    model_train: str = ""  # --attnperf-model-train, checked ("": the device's defaults)
    model_decode: str = ""  # --attnperf-model-decode, checked ("": the device's defaults)
    history_dir: Path | None = None  # --attnperf-history: where each measured case's record is appended
    commit: str | None = None  # --attnperf-commit: the commit the history's records name (else git's)
    fail_on_drift: bool = False  # --attnperf-fail-on-drift: a lasting slowdown on the history fails the case
    pr_comment: Path | None = None  # --attnperf-pr-comment: the pull-request comment's Markdown file


GROUP = ("attnperf: attention kernels' correctness and speed "
         "(each option also env ATTNPERF_<NAME>, ini attnperf_<name>)")
TUNING_GROUP = ("attnperf tuning: the gate's noise model, sampling, ceilings and caches "
                "(ini attnperf_<name>; no environment variable but the cache's: PYTEST_ADDOPTS carries them; "
                "defaults measured: docs/gate.md, docs/measurement.md)")
# the options a user seldom sets: shown apart in --help and in docs/options.md
TUNING = frozenset({
    "run_noise", "run_noise_time", "machine_noise", "machine_offset", "machine_residual", "machine",
    "budget", "stdrel", "min_samples", "cold_graphs", "hot_sample", "processes", "processes_below",
    "triton_cache", "ceilings", "peaks",
})


def add_options(parser: pytest.Parser) -> None:
    """Register every option, the everyday ones and the tuning ones in two ``--help`` groups."""
    everyday = parser.getgroup("attnperf", GROUP)
    tuning = parser.getgroup("attnperf-tuning", TUNING_GROUP)
    for opt in OPTIONS:
        group = tuning if opt.dest in TUNING else everyday
        shown = opt.help.replace("%", "%%")  # argparse %-formats help strings
        if opt.repeat:
            group.addoption(opt.flag, action="append", default=None, dest=f"attnperf_{opt.dest}",
                            metavar=opt.dest.upper(), help=shown)
            parser.addini(opt.ini, help=opt.help, default="")
        elif opt.is_flag:
            group.addoption(opt.flag, action="store_true", default=None, dest=f"attnperf_{opt.dest}", help=shown)
            parser.addini(opt.ini, help=opt.help, type="bool", default=False)
        else:
            group.addoption(opt.flag, action="store", default=None, dest=f"attnperf_{opt.dest}",
                            metavar=opt.dest.upper(), help=shown)
            parser.addini(opt.ini, help=opt.help, default="")
    # internal: a pool run of --attnperf-processes, started by its parent (plugins/pool.py)
    everyday.addoption("--attnperf-pool-input", action="store", default=None, dest="attnperf_pool_input",
                       help=argparse.SUPPRESS)  # its cases and settings, a JSON file
    everyday.addoption("--attnperf-pool-out", action="store", default=None, dest="attnperf_pool_out",
                       help=argparse.SUPPRESS)  # where its samples go, a line per case
    everyday.addoption("--attnperf-pool-turn", action="store", default=None, dest="attnperf_pool_turn",
                       help=argparse.SUPPRESS)  # GO,DONE: the pipes its turn comes through (plugins/turns.py)


def _raw(config: pytest.Config, opt: Option) -> tuple[str, str]:
    """The value as given and where it came from."""
    cli = config.getoption(f"attnperf_{opt.dest}")
    if cli is not None:
        return ",".join(cli) if isinstance(cli, list) else str(cli), opt.flag
    env = os.environ.get(opt.env) if opt.env else None
    if env is not None and env != "":
        return env, f"environment variable {opt.env}"
    ini = config.getini(opt.ini)
    if ini not in (None, "", []) and ini is not False:  # a bool key's default reads False: not given
        return str(ini), f"ini key {opt.ini}"
    return opt.default, "the default"


def source(config: pytest.Config, dest: str) -> str:
    """Where the setting ``dest`` came from: ``--hw``, ``environment variable ATTNPERF_HW``, ``ini key
    attnperf_hw`` or ``the default``, for a message about its value."""
    return _raw(config, next(o for o in OPTIONS if o.dest == dest))[1]


def configured(config: pytest.Config) -> bool:
    """Whether any attnperf option is given: on the command line, in the environment or the ini
    file (a project that uses the plugin, as against one that merely has it installed)."""
    return any(_raw(config, opt)[1] != "the default" for opt in OPTIONS)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def fraction(text: str) -> float:
    """'5%' or a fraction below 1 such as '0.05', as 0.05; ``ValueError`` for a bare number of
    1 or more (a percentage without its sign) and outside [0, 10)."""
    text = text.strip()
    if text.endswith("%"):
        value = _finite(text[:-1]) / 100.0
    else:
        value = _finite(text)
        if value >= 1.0:
            raise ValueError(f"did you mean {text}%? (write {text}% or {value / 100:g})")
    if not 0.0 <= value < 10.0:
        raise ValueError("must be a fraction such as 0.05 or a percentage such as 5%")
    return value


_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
DURATION_MAX_MS = 1e9


def duration_ms(text: str, *, bare_seconds: bool = False) -> float:
    """A time with its unit, ``us``, ``ms`` or ``s`` ('1us', '0.5 ms', '2s'), as milliseconds.

    The one rule for every duration: a unit is always accepted; a bare number means seconds,
    and is accepted only where ``bare_seconds`` (options whose default is a bare number of
    seconds); elsewhere a bare number other than 0 is refused, since a bare '2' could mean
    2 us or 2 s. ``ValueError`` when negative or not a time."""
    text = text.strip().lower()
    unit = next((u for u in ("us", "ms", "s") if text.endswith(u)), None)
    number = text[: -len(unit)] if unit else text
    value = _finite(number)
    if unit is None and value != 0 and not bare_seconds:
        raise ValueError(f"a time needs its unit: {number}us, {number}ms or {number}s")
    value *= _UNITS_MS[unit or "s"]
    if value < 0.0:
        raise ValueError("must be a time of at least 0, such as 1us, 0.5ms or 2s")
    if value >= DURATION_MAX_MS:  # well inside what the timers take (setitimer, threading.Timer)
        raise ValueError(f"must be a time below {DURATION_MAX_MS / 1e3:g}s (about 11 days), such as 1us, 0.5ms or 2s")
    return value


def seconds(text: str) -> float:
    """A duration in seconds; a bare number is seconds ('300', '300s', '0.5 s', '500ms')."""
    return duration_ms(text, bare_seconds=True) / 1e3


def _hot_sample_ms(text: str) -> float:
    value = duration_ms(text)
    if not 0 < value <= 100:  # 100 ms: a graph of up to 12800 calls of a sub-8-us kernel
        raise ValueError("must be a time above 0 and at most 100ms, such as 0.5ms or 20ms")
    return value


def _positive_seconds(text: str) -> float:
    value = seconds(text)
    if value <= 0:
        raise ValueError("must be a time above 0, such as 0.5s or 500ms")
    return value


def _count(most: int) -> Callable[[str], int]:
    """A parser of a whole number from 1 to ``most``: more would spend the run's memory, processes
    or time on nothing the gate uses."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected a whole number from 1 to {most}") from None
        if not 1 <= value <= most:
            raise ValueError(f"must be from 1 to {most}")
        return value

    return parse


# the most each count may be: processes each hold a device context; graphs, a capture each; samples,
# beyond what the budget ever takes
MOST = {"min_samples": 100_000, "cold_graphs": 256, "processes": 32}


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
def _suites(text: str) -> tuple[str, ...]:
    """'softmax,linear' or 'all' as the built-in suites' names, in the package's order."""
    names = {n.strip().lower() for n in text.split(",") if n.strip()}
    if "all" in names:
        return SUITES
    unknown = sorted(names - set(SUITES))
    if unknown:
        raise ValueError(f"unknown suite {', '.join(unknown)}: choose from {', '.join(SUITES)} or all")
    return tuple(n for n in SUITES if n in names)


OPT_IN = {"precision": "the linear GPU table's fp16 and fp32 rows: they catch a gradient 1% off on one head, "
                        "and sparse 1% output errors, that bf16 cannot (docs/checks.md, \"Power\")"}
"""The opt-in row groups of the built-in tables (a case's ``opt_in``), and what each adds."""


def _opt_in(text: str) -> tuple[str, ...]:
    """'precision' as ('precision',): names of ``OPT_IN``, each once."""
    names = tuple(dict.fromkeys(n.strip().lower() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in OPT_IN]
    if unknown:
        known = "; ".join(f"{name} ({what})" for name, what in OPT_IN.items())
        raise ValueError(f"unknown opt-in row group {', '.join(unknown)}: choose from {known}")
    return names


def _model_specs(config: pytest.Config) -> Callable[[str], tuple[str, ...]]:
    """'llama3-8b,./my-model' as its specs, a path that exists (from the folder pytest was started
    in, else the project's) made absolute, so a pool run reads the same file."""
    bases = (Path(config.invocation_params.dir), project_dir(config))

    def parse(text: str) -> tuple[str, ...]:
        specs = []
        for spec in filter(None, (s.strip() for s in text.split(","))):
            found = next((base / spec for base in bases if (base / spec).exists()), None)
            specs.append(str(found.resolve()) if found is not None else spec)
        return tuple(dict.fromkeys(specs))

    return parse


def _degrees(text: str) -> tuple[int, ...]:
    """'1,2,4,8' as (1, 2, 4, 8): whole numbers of at least 1, each once."""
    degrees = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{part!r} is not a tensor-parallel degree (a whole number of at least 1)")
        degrees.append(int(part))
    if not degrees:
        raise ValueError("give at least one degree, such as 1 or 1,8")
    return tuple(dict.fromkeys(degrees))


def _model_shapes(parse: Callable[[str], object]) -> Callable[[str], str]:
    def check(text: str) -> str:
        parse(text)  # ValueError for a bad value
        return text.strip()

    return check


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a whole number >= 0, got {text!r}") from None
    if value < 0:
        raise ValueError(f"expected a whole number >= 0, got {text!r}")
    return value


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("must be true or false")


def _memory_tolerance(text: str) -> str:
    return Tolerance.parse(text).describe()


def user_cache(*parts: str) -> Path:
    """``$XDG_CACHE_HOME/<parts>``, or under ``~/.cache`` without it: where the plugin keeps
    what it measured or installed for this user (ceilings, the Triton cache)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: ignored, as the XDG specification says
        base = str(Path.home() / ".cache")
    return Path(base).joinpath(*parts)


def _get(config: pytest.Config, dest: str, parse: Callable[[str], T]) -> T:
    opt = next(o for o in OPTIONS if o.dest == dest)
    text, source = _raw(config, opt)
    try:
        return parse(text)
    except ValueError as exc:
        raise pytest.UsageError(f"attnperf: bad value {text!r} from {source}: {exc}") from None


def project_dir(config: pytest.Config) -> Path:
    """Where relative paths point: the folder of the ini file (pytest.ini, tox.ini, setup.cfg or
    pyproject.toml) that configures this run, else the folder pytest was started in."""
    inipath = config.inipath
    return Path(inipath).parent if inipath is not None else Path(config.invocation_params.dir)


def _project_path(config: pytest.Config, text: str) -> Path:
    """A folder option's path: as given when absolute, else under ``project_dir``."""
    path = Path(text)
    return path if path.is_absolute() else project_dir(config) / path


def _history(config: pytest.Config) -> tuple[Path | None, bool]:
    """``--attnperf-history``'s folder and ``--attnperf-fail-on-drift``, checked together."""
    text = _get(config, "history", str).strip()
    fail = _get(config, "fail_on_drift", _bool)
    if fail and not text:
        raise pytest.UsageError("attnperf: --attnperf-fail-on-drift judges each case on its history: "
                                "give --attnperf-history=DIR too")
    if fail:
        missing = available()
        if missing is not None:
            raise pytest.UsageError(f"attnperf: --attnperf-fail-on-drift needs the change-point library: {missing}")
    return (_project_path(config, text) if text else None), fail


def read_settings(config: pytest.Config) -> Settings:
    """Parse every setting; raises ``pytest.UsageError`` naming the source of a bad one. (A pool
    run's settings come from its input file instead: ``settings_from_data``.)"""
    hw = _get(config, "hw", str).strip() or None
    folder = _project_path(config, _get(config, "baselines", str))
    report = _get(config, "report", str).strip()
    check_only = _get(config, "check_only", _bool)
    update = _get(config, "update_baselines", _bool)
    if check_only and update:
        raise pytest.UsageError("attnperf: --attnperf-check-only times nothing, so --update-baselines has "
                                "nothing to record; use one or the other")
    history_dir, fail_on_drift = _history(config)
    pr_comment = _get(config, "pr_comment", str).strip()
    return Settings(
        hw=hw.lower() if hw else None,
        update_baselines=update,
        require_baseline=_get(config, "require_baseline", _bool),
        baselines_dir=folder,
        tolerance=_get(config, "tolerance", fraction),
        run_noise=_get(config, "run_noise", fraction),
        run_noise_time_ms=_get(config, "run_noise_time", duration_ms),
        machine_noise=_get(config, "machine_noise", fraction),
        machine_offset_ms=_get(config, "machine_offset", duration_ms),
        machine_residual_ms=_get(config, "machine_residual", duration_ms),
        machine=_get(config, "machine", str).strip() or None,
        mode=_get(config, "mode", _mode),
        budget_s=_get(config, "budget", _positive_seconds),
        target_stdrel=_get(config, "stdrel", fraction),
        min_samples=_get(config, "min_samples", _count(MOST["min_samples"])),
        cold_graphs=_get(config, "cold_graphs", _count(MOST["cold_graphs"])),
        processes=_get(config, "processes", _count(MOST["processes"])),
        processes_below_ms=_get(config, "processes_below", duration_ms),
        hot_sample_ms=_get(config, "hot_sample", _hot_sample_ms),
        case_timeout_s=_get(config, "case_timeout", seconds),
        ceilings=_get(config, "ceilings", _ceilings),
        peaks=_get(config, "peaks", peaks),
        report_dir=project_dir(config) / report if report else None,  # one base for every relative path
        suites=_get(config, "suites", _suites),
        opt_in=_get(config, "opt_in", _opt_in),
        check_only=check_only,
        seed=_get(config, "seed", _seed),
        benchmark_table=_get(config, "benchmark_table", _bool),
        fail_on_kernel_change=_get(config, "fail_on_kernel_change", _bool),
        memory_tolerance=_get(config, "memory_tolerance", _memory_tolerance),
        **_model_settings(config),
        history_dir=history_dir,
        commit=_get(config, "commit", str).strip() or None,
        fail_on_drift=fail_on_drift,
        pr_comment=Path(config.invocation_params.dir) / pr_comment if pr_comment else None,
    )


def _model_settings(config: pytest.Config) -> dict[str, Any]:
    """The models' settings; their shapes are read only when a model is given."""
    models = _get(config, "models", _model_specs(config))
    if not models:
        return {"models": (), "tp": _get(config, "tp", _degrees)}
    tp = _get(config, "tp", _degrees)
    try:
        check_models(models, tp)  # each read and split now: a wrong spec or degree stops the run at start-up
    except ValueError as exc:
        raise pytest.UsageError(f"attnperf: {exc}") from None
    return {"models": models, "tp": tp,
            "model_prefill": _get(config, "model_prefill", _model_shapes(parse_prefill)),
            "model_train": _get(config, "model_train", _model_shapes(parse_train)),
            "model_decode": _get(config, "model_decode", _model_shapes(parse_decode))}
