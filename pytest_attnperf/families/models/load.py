"""A model spec as a config: a committed config's name, a local ``config.json`` or a folder holding
one, or a Hugging Face model id, read through transformers' config classes.

transformers is needed only here, and only when a model is given (``pip install
pytest-attnperf[models]``); ``ModelError`` says what went wrong in words a usage error can show.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_attnperf.families.models.layers import layer_specs, unsupported

__all__ = ["CONFIGS", "INSTALL_HINT", "Model", "ModelError", "check_models", "committed", "load", "model_name"]

CONFIGS = Path(__file__).resolve().parent / "configs"  # the committed configs, <name>.json (docs/models.md)
INSTALL_HINT = "pip install pytest-attnperf[models]"


class ModelError(ValueError):
    """A model spec that cannot be read, with the reason and the fix."""


@dataclass(frozen=True)
class Model:
    """A model read from its spec: ``name`` (in case ids), where it came from, and its config."""

    name: str
    source: str
    config: Any


def committed() -> tuple[str, ...]:
    """The committed configs' names, sorted."""
    return tuple(sorted(p.stem for p in CONFIGS.glob("*.json")))


def model_name(spec: str) -> str:
    """The name a spec's cases carry: a committed config's own, a file's folder (or the file's
    stem when it is not ``config.json``), a folder's, a hub id's last part; lower case, and
    anything but letters, digits and ``-`` made ``_`` (``.`` separates the parts of a case id)."""
    path = Path(spec)
    if spec in committed():
        raw = spec
    elif path.is_file():
        raw = path.resolve().parent.name if path.name == "config.json" else path.stem
    elif path.is_dir():
        raw = path.resolve().name
    else:
        raw = spec.rstrip("/").rsplit("/", 1)[-1]
    return re.sub(r"[^a-z0-9-]", "_", raw.lower()) or "model"


def _transformers() -> Any:
    try:
        import transformers  # noqa: PLC0415 - torch loads on first use, not at the plugin's start-up
    except ImportError as exc:
        raise ModelError(f"--attnperf-model reads a model's config with transformers, which cannot be imported "
                         f"({type(exc).__name__}: {exc}): {INSTALL_HINT}") from None
    return transformers


def _source(spec: str) -> tuple[str, bool]:
    """``(what to read, whether it is on the hub)``."""
    if spec in committed():
        return str(CONFIGS / f"{spec}.json"), False
    path = Path(spec)
    if path.is_file():
        return str(path), False
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"folder {spec} holds no config.json")
        return str(path), False
    if spec.startswith(("./", "../", "/", "~")) or spec.endswith(".json"):
        raise ModelError(f"no such file or folder: {spec}")
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        return spec, True
    raise ModelError(f"{spec!r} is no committed config ({', '.join(committed())}), no config.json, no folder "
                     "holding one and no Hugging Face model id (owner/name)")


@functools.cache
def load(spec: str) -> Model:
    """The model ``spec`` names, its config read by ``transformers.AutoConfig``; ``ModelError``
    when transformers is missing, the file or folder is not a config, or the hub cannot give it."""
    source, on_hub = _source(spec)
    transformers = _transformers()
    try:
        config = transformers.AutoConfig.from_pretrained(source)
    except OSError as exc:
        if not on_hub:
            raise ModelError(str(exc).splitlines()[0]) from None
        offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") else ""
        raise ModelError(f"{spec!r} is no committed config ({', '.join(committed())}) and no local file or folder, "
                         f"and the Hugging Face hub could not give its config{offline}: "
                         f"{str(exc).splitlines()[0]} (give a local config.json or the folder holding it)") from None
    except ValueError as exc:  # transformers' own: an unknown model_type, a field its class refuses
        raise ModelError(f"transformers cannot read it as a config: {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # noqa: BLE001 - a config class's own checks: huggingface_hub's strict dataclasses'
        # errors (their cause on the last line), an arithmetic error on a zero
        lines = [line for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        raise ModelError(f"transformers cannot read it as a config ({type(exc).__name__}): "
                         f"{lines[-1].strip()}") from None
    return Model(model_name(spec), source, config)


def check_models(specs: Sequence[str], tps: Sequence[int]) -> None:
    """Read each spec and split it at each degree; ``ModelError`` naming the spec (and the degree)
    that fails: at start-up, before any collection."""
    named: dict[str, str] = {}
    for spec in specs:
        try:
            model = load(spec)
        except ModelError as exc:
            raise ModelError(f"--attnperf-model {spec}: {exc}") from None
        if why := unsupported(model.config):
            raise ModelError(f"--attnperf-model {spec}: {why}")
        if named.setdefault(model.name, spec) != spec:
            raise ModelError(f"--attnperf-model {named[model.name]} and {spec} both name their cases {model.name!r} "
                             "(a folder's name, a file's stem or a hub id's last part): give one of them a folder "
                             "or file of another name")
        for tp in tps:
            try:
                layer_specs(model.config, tp)
            except ValueError as exc:
                raise ModelError(f"--attnperf-model {spec} at --attnperf-tp={tp}: {exc}") from None
