"""The models' suite: each configured model's attention layers as ordinary cases of their
families (checked, timed, gated, recorded), collected when ``--attnperf-model`` is given.

``test_models_softmax`` and ``test_models_linear`` (prefill and training),
``test_models_decode_softmax`` and ``test_models_decode_linear`` (decode, forward only). A case
whose fp64 reference does not fit is checked on two key/value groups (``grouped``); kernels whose
T x T scores would not fit are removed, and a refusing SDPA backend is skipped with torch's
reason. docs/models.md, "Kernels and checks".
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from pytest_attnperf import costs
from pytest_attnperf.families import parametrize as suite
from pytest_attnperf.families.checks import reported_plainly
from pytest_attnperf.families.linear import decode as linear_decode
from pytest_attnperf.families.linear import suite as linear_suite
from pytest_attnperf.families.models import cases as model_cases
from pytest_attnperf.families.models import grouped
from pytest_attnperf.families.models.layers import all_specs
from pytest_attnperf.families.models.load import load
from pytest_attnperf.families.registry import Kernel
from pytest_attnperf.families.softmax import memory
from pytest_attnperf.families.softmax import suite as softmax_suite
from pytest_attnperf.hw.detect import memory_gb

__all__ = ["built", "test_models_decode_linear", "test_models_decode_softmax", "test_models_linear",
           "test_models_softmax"]

DECODE = ("fwd",)  # serving runs no backward

CASES_KEY = pytest.StashKey[model_cases.ModelCases]()
# kernels that hold fp32 T x T scores (about five such tensors forward+backward), and their cap
SCORES_KERNELS = ("naive", "sdpa-math")
SCORES_MAX_GB, SCORE_COPIES = 40.0, 5
MEMORY_SHARE = 0.5  # ... and at most this share of the memory of the device the case runs on


def built(config: pytest.Config) -> model_cases.ModelCases:
    """The run's model cases (built once): each ``--attnperf-model`` read, split at each
    ``--attnperf-tp``; a spec or a split that fails is a usage error naming it."""
    if CASES_KEY in config.stash:
        return config.stash[CASES_KEY]

    session = config.stash[suite.RUN_KEY]
    s = session.settings
    models = []
    for spec in s.models:
        try:
            model = load(spec)
            models.append((model.name, all_specs(model.config, s.tp)))
        except ValueError as exc:
            raise pytest.UsageError(f"attnperf: --attnperf-model {spec}: {exc}") from None
    shapes = model_cases.shapes(s.model_prefill, s.model_train, gpu=session.device.is_gpu, decode=s.model_decode)
    config.stash[CASES_KEY] = made = model_cases.build(models, shapes)
    return made


def scores_gb(case: Any) -> float:
    """What a kernel that materialises fp32 scores holds at once on ``case``, in GB (estimated)."""
    return memory.scores_gb(case, "fp32", SCORE_COPIES)


def scores_cap(gpu: bool) -> tuple[float, str]:
    """The most GB a scores-holding kernel may take on a model case, and why: ``SCORES_MAX_GB``,
    or ``MEMORY_SHARE`` of the device's memory where that is less."""
    memory = memory_gb(gpu)
    if memory is not None and MEMORY_SHARE * memory < SCORES_MAX_GB:
        return MEMORY_SHARE * memory, (f"{MEMORY_SHARE:.0%} of the {memory:.0f} GB of this machine's "
                                       f"{'GPU' if gpu else 'host memory'}")
    return SCORES_MAX_GB, f"{SCORES_MAX_GB:g} GB"


def _capped(kernel: Kernel) -> Kernel:
    def supports(case: Any) -> str | None:
        cap, why = scores_cap(bool(case.gpu))
        if scores_gb(case) > cap:
            return (f"materialises T x T scores: about {scores_gb(case):.0f} GB at B={case.batch} H={case.heads} "
                    f"T={case.seq} (model cases cap it at {why})")
        return kernel.supports(case)

    return dataclasses.replace(kernel, supports=supports)


def _refusing_plainly(kernel: Kernel) -> Kernel:
    """A pinned SDPA backend whose "No available kernel" becomes a refusal (a skip) quoting the
    reasons torch warned of (a head dim or layout the backend lacks)."""
    inner = kernel.fn

    def fn(*args: Any, **kwargs: Any) -> Any:

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return inner(*args, **kwargs)
            except RuntimeError as exc:
                if "No available kernel" not in str(exc):
                    raise
                why = "; ".join(dict.fromkeys(str(w.message).splitlines()[0] for w in caught)) or str(exc)
                raise NotImplementedError(f"SDPA {kernel.sdpa_backend} takes no such shape "
                                          f"(q {tuple(args[0].shape)}): {why}") from None

    return dataclasses.replace(kernel, fn=fn)


def _softmax_kernels(registry: Any) -> list[Kernel]:
    picked = []
    for kernel in registry.family("softmax"):
        if kernel.name in SCORES_KERNELS:
            kernel = _capped(kernel)
        if kernel.sdpa_backend is not None:
            kernel = _refusing_plainly(kernel)
        picked.append(kernel)
    return picked


def _linear_kernels(registry: Any, families: tuple[str, ...]) -> list[Kernel]:
    return [k for family in families for k in registry.family(family)]


def _none(metafunc: pytest.Metafunc, what: str, shapes: str) -> None:
    """One skipped item, saying why, where the models given have no layer of this family or no
    shape for it (``shapes``: the options that give them)."""
    names = [n for n in ("case", "kernel", "direction") if n in metafunc.fixturenames]
    layers = what.removesuffix("-decode")
    skip = pytest.mark.skip(reason=f"no {what} cases: the models given have no {layers} layers, or {shapes} none")
    metafunc.parametrize(names, [pytest.param(*[None] * len(names), id=f"no-{what}-layers", marks=skip)])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    made = built(metafunc.config)
    registry = metafunc.config.stash[suite.RUN_KEY].registry
    name = metafunc.function.__name__
    if name == "test_models_softmax":
        if not made.softmax:
            return _none(metafunc, "softmax", "--attnperf-model-prefill and --attnperf-model-train are")
        suite.check_cases(__name__, made.softmax)
        suite.parametrize(metafunc, "softmax", made.softmax, kernels=_softmax_kernels(registry))
    elif name == "test_models_linear":
        if not made.linear:
            return _none(metafunc, "linear-attention", "--attnperf-model-prefill and --attnperf-model-train are")
        families = tuple(dict.fromkeys(made.layers[c.id][1].family for c in made.linear))
        suite.check_cases(__name__, made.linear)
        suite.parametrize(metafunc, families, made.linear, kernels=_linear_kernels(registry, families))
    elif name == "test_models_decode_softmax":
        if not made.softmax_decode:
            return _none(metafunc, "softmax-decode", "--attnperf-model-decode is")
        suite.check_cases(__name__, made.softmax_decode)
        suite.parametrize(metafunc, "softmax", made.softmax_decode, DECODE, kernels=_softmax_kernels(registry))
    elif name == "test_models_decode_linear":
        if not made.linear_decode:
            return _none(metafunc, "linear-attention-decode", "--attnperf-model-decode is")
        families = tuple(dict.fromkeys(f"{made.layers[c.id][1].family}_decode" for c in made.linear_decode))
        suite.check_cases(__name__, made.linear_decode)
        suite.parametrize(metafunc, families, made.linear_decode, DECODE, kernels=_linear_kernels(registry, families))
    return None


def _note(request: pytest.FixtureRequest, case: Any) -> None:
    """The case's model, layer kind, layers and degree as JUnit properties."""
    model, spec = built(request.config).layers[case.id]
    request.node.user_properties.extend([("model", model), ("layer_kind", spec.kind), ("tp", str(spec.tp)),
                                         ("layers", str(len(spec.layers)))])


def test_models_softmax(
    case: Any, kernel: Kernel, direction: str, attnperf_device: Any, attnperf_seed: int, attnperf: Any,
    request: pytest.FixtureRequest,
) -> None:
    """A model's softmax layer: output (and gradients for fwdbwd) against fp64, then device time."""
    _note(request, case)
    if grouped.fits_whole(case):
        softmax_suite.test_softmax(case, kernel, direction, attnperf_device, attnperf_seed, attnperf, request)
        return
    with reported_plainly(attnperf_seed):
        timed: Callable[[], Any] = grouped.run_grouped(kernel, case, direction, attnperf_device)
    cost = costs.softmax_attention(
        batch=case.batch, heads=case.heads, kv_heads=case.kv_heads, seq=case.seq, head_dim=case.head_dim,
        dtype=case.dtype, causal=case.causal, window=case.window, backward=direction == "fwdbwd",
    )
    attnperf.measure(timed, cost=cost, dtype=case.dtype, detect_backend=kernel.sdpa_backend is None)


def test_models_linear(
    case: Any, kernel: Kernel, direction: str, attnperf_device: Any, attnperf_seed: int, attnperf: Any,
    request: pytest.FixtureRequest,
) -> None:
    """A model's linear-attention layer: output and gradients against our fp64 recurrence, then device time."""
    _note(request, case)
    linear_suite.test_linear(case, kernel, direction, attnperf_device, attnperf_seed, attnperf, request)


def test_models_decode_softmax(
    case: Any, kernel: Kernel, direction: str, attnperf_device: Any, attnperf_seed: int, attnperf: Any,
    request: pytest.FixtureRequest,
) -> None:
    """A model's softmax layer decoding: one new token per request over its KV cache, against fp64,
    then device time."""
    _note(request, case)
    softmax_suite.test_softmax(case, kernel, direction, attnperf_device, attnperf_seed, attnperf, request)


def test_models_decode_linear(
    case: Any, kernel: Kernel, direction: str, attnperf_device: Any, attnperf_seed: int, attnperf: Any,
    request: pytest.FixtureRequest,
) -> None:
    """A model's linear-attention layer decoding: one recurrent step per request from its state,
    output and new state against the fp64 recurrence, then device time."""
    _note(request, case)
    linear_decode.test_linear_decode(case, kernel, direction, attnperf_device, attnperf_seed, attnperf, request)
