"""Triton autotune choices recorded with a baseline and installed on a fresh machine.

``--update-baselines`` on a CUDA device copies the ``*.autotune.json`` results this run's kernels
produced into ``baselines/<hw>.autotune/`` (``<hash>.json`` each, plus ``manifest.yaml``); a run on
a CUDA device installs them into the Triton cache folder it points ``TRITON_CACHE_DIR`` at, so
the kernels run the configurations their baselines were timed with, and reports every kernel
that autotuned anyway. docs/autotune.md.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from pytest_attnperf.store.baselines import write_atomic

__all__ = [
    "AutotuneError", "Choice", "chosen_config", "describe_config", "folder_for", "install", "kernel_of",
    "load_manifest", "record", "scan",
]

FORMAT = 1
MANIFEST = "manifest.yaml"
SUFFIX = ".autotune.json"


class AutotuneError(Exception):
    """A recorded choice or manifest that cannot be used; the message names the file and the cause."""


@dataclass(frozen=True)
class Choice:
    """One recorded autotune result: the Triton cache hash folder it lives in and what it chose."""

    hash_dir: str
    kernel: str
    file: str  # Triton's file name in the hash folder: <kernel>.autotune.json
    key: tuple[str, ...]
    chosen: str
    source: str  # the test whose run produced it
    triton: str | None

    def as_mapping(self) -> dict[str, Any]:
        """The choice as plain data, as the manifest holds it."""
        return {"kernel": self.kernel, "file": self.file, "key": list(self.key), "chosen": self.chosen,
                "source": self.source, "triton": self.triton}


# -- pure: Triton's files -------------------------------------------------------------------


def scan(cache_dir: Path) -> dict[str, Path]:
    """Every autotune result under ``cache_dir``, as ``"<hash>/<kernel>.autotune.json"`` -> path."""
    found: dict[str, Path] = {}
    if not cache_dir.is_dir():
        return found
    for sub in os.scandir(cache_dir):
        if not sub.is_dir(follow_symlinks=False):
            continue
        for entry in os.scandir(sub.path):
            if entry.name.endswith(SUFFIX) and entry.is_file():
                found[f"{sub.name}/{entry.name}"] = Path(entry.path)
    return found


def describe_config(config: Mapping[str, Any]) -> str:
    """A Triton ``Config.__dict__`` as one readable line: ``BT=64 BV=32 num_warps=4 num_stages=2``."""
    kwargs = config.get("kwargs") or {}
    parts = [f"{k}={v}" for k, v in sorted(kwargs.items())]
    for name in ("num_warps", "num_stages", "num_ctas", "maxnreg"):
        if config.get(name) is not None:
            parts.append(f"{name}={config[name]}")
    return " ".join(parts)


def _timing(value: Any) -> tuple[float, ...]:
    """A timing as Triton stores it (one number, or the quantiles' list, median first)."""
    return tuple(float(v) for v in value) if isinstance(value, list) else (float(value),)


def chosen_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """The config Triton takes from a result file: the least timing (compared as Triton does)."""
    pairs = data.get("configs_timings")
    if not isinstance(pairs, list) or not pairs:
        raise ValueError("no 'configs_timings' list")
    best = min(pairs, key=lambda pair: _timing(pair[1]))
    if not isinstance(best[0], dict):
        raise ValueError("a config is not a mapping")
    return best[0]


def read_result(path: Path) -> tuple[tuple[str, ...], str]:
    """``(key, chosen config)`` of one Triton autotune result file; ``AutotuneError`` if unusable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        key = data.get("key") or []
        return tuple(str(k) for k in key), describe_config(chosen_config(data))
    except (OSError, UnicodeDecodeError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise AutotuneError(f"{path} is not a Triton autotune result: {type(exc).__name__}: {exc}") from None


# -- pure: the recorded folder ---------------------------------------------------------------


def folder_for(baselines_dir: Path, hw: str) -> Path:
    """The recorded choices of hardware ``hw``: ``<baselines dir>/<hw>.autotune``."""
    return baselines_dir / f"{hw}.autotune"


def kernel_of(rel: str) -> str:
    """The kernel a result file ``"<hash>/<kernel>.autotune.json"`` belongs to."""
    return rel.split("/", 1)[1][: -len(SUFFIX)]


def _triton_version() -> str | None:
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return None


def load_manifest(folder: Path) -> dict[str, Choice]:
    """The recorded choices by hash folder; empty when there is no manifest; ``AutotuneError``
    naming the file when it is unreadable."""
    path = folder / MANIFEST
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise AutotuneError(f"{path} cannot be read: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise AutotuneError(f"{path} is not an attnperf autotune manifest (expected 'format: {FORMAT}' and 'entries')")
    choices = {}
    for hash_dir, entry in data["entries"].items():
        try:
            choices[str(hash_dir)] = Choice(
                hash_dir=str(hash_dir), kernel=str(entry["kernel"]), file=str(entry["file"]),
                key=tuple(str(k) for k in entry.get("key") or ()), chosen=str(entry.get("chosen", "")),
                source=str(entry.get("source", "")),
                triton=None if entry.get("triton") is None else str(entry["triton"]),
            )
        except (KeyError, TypeError) as exc:
            raise AutotuneError(f"{path}, entry '{hash_dir}': {type(exc).__name__}: {exc}") from None
        if "/" in choices[str(hash_dir)].file or "/" in str(hash_dir):
            raise AutotuneError(f"{path}, entry '{hash_dir}': a hash folder or file name holds '/'")
    return choices


def record(
    folder: Path, cache_dir: Path, produced: Mapping[str, str], triton: str | None,
) -> tuple[int, int, list[str]]:
    """Copy the result files ``produced`` (``"<hash>/<file>"`` -> the test that produced it) from
    ``cache_dir`` into ``folder`` as ``<hash>.json`` and merge them into the manifest: entries of
    other hash folders are kept. Returns ``(written, kept, problems)``; an unreadable manifest
    raises ``AutotuneError`` and nothing is written."""
    choices = load_manifest(folder)
    written, problems = 0, []
    for rel, source in sorted(produced.items()):
        hash_dir, _, name = rel.partition("/")
        path = cache_dir / hash_dir / name
        try:
            key, chosen = read_result(path)
            text = path.read_text(encoding="utf-8")
        except (AutotuneError, OSError) as exc:
            problems.append(f"not recorded: {exc}")
            continue
        write_atomic(folder / f"{hash_dir}.json", text)
        choices[hash_dir] = Choice(hash_dir, name[: -len(SUFFIX)], name, key, chosen, source, triton)
        written += 1
    if written:
        manifest = {"format": FORMAT, "triton": triton,
                    "entries": {h: c.as_mapping() for h, c in sorted(choices.items())}}
        write_atomic(folder / MANIFEST, yaml.safe_dump(manifest, sort_keys=True, default_flow_style=False, width=120))
    return written, len(choices) - written, problems


def install(folder: Path, cache_dir: Path) -> tuple[dict[str, Choice], list[str]]:
    """Copy the recorded choices into ``cache_dir`` under their hash folders and remove every
    other autotune result there (one left by an earlier run would hide that no recorded choice
    applies); compiled kernels are kept. Returns the choices installed, by ``"<hash>/<file>"``,
    and the problems met (each costs only its own entry)."""
    choices = load_manifest(folder)
    installed: dict[str, Choice] = {}
    problems = []
    for hash_dir, choice in sorted(choices.items()):
        source = folder / f"{hash_dir}.json"
        try:
            read_result(source)
        except AutotuneError as exc:
            problems.append(f"not installed: {exc}")
            continue
        target = cache_dir / hash_dir / choice.file
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{choice.file}.{os.getpid()}.tmp")
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
        installed[f"{hash_dir}/{choice.file}"] = choice
    for rel, path in scan(cache_dir).items():
        if rel not in installed:
            path.unlink(missing_ok=True)
    return installed, problems
