"""The built-in kernels and suites: one folder per attention family, each with its kernels
(``kernels.py``) and its suite (``suite.py``: ``ATTNPERF_FAMILY``, ``ATTNPERF_CASES`` and the test
function the plugin parametrizes).

``--attnperf-suites=softmax,linear`` (or ``all``) adds the suites to any run, so a project's own
kernels (``pytest_attnperf_register_kernels`` in its conftest.py) run through them; a project's
own test module can import a suite's test function and declare shapes of its own.
"""

from __future__ import annotations

import inspect

from pytest_attnperf.families.linear import decode as linear_decode
from pytest_attnperf.families.linear import kernels as linear
from pytest_attnperf.families.registry import KernelRegistry
from pytest_attnperf.families.softmax import kernels as softmax

__all__ = ["CALLS", "SUITES", "check_signature", "register_builtin"]

SUITES = ("softmax", "linear")  # families with a built-in suite (families/<name>/suite.py), in the order they run


def register_builtin(registry: KernelRegistry) -> None:
    """Register every built-in kernel of every family."""
    softmax.register(registry)
    linear.register(registry)
    linear_decode.register(registry)


# how each built-in family calls its kernels: positional inputs, then keyword arguments
CALLS = {
    "softmax": (("q", "k", "v"), ("causal", "scale", "window")),
    "linear_attn": (("q", "k", "v"), ("scale",)),
    "gla": (("q", "k", "v", "g"), ("scale",)),
    "simple_gla": (("q", "k", "v", "g"), ("scale",)),
    "gdn": (("q", "k", "v", "g", "beta"), ("scale",)),
    # decode: a few recurrent steps from a state, returning (o, final_state)
    "linear_attn_decode": (("q", "k", "v"), ("scale", "initial_state")),
    "gla_decode": (("q", "k", "v", "g"), ("scale", "initial_state")),
    "simple_gla_decode": (("q", "k", "v", "g"), ("scale", "initial_state")),
    "gdn_decode": (("q", "k", "v", "g", "beta"), ("scale", "initial_state")),
}


def check_signature(family: str, name: str, fn: object) -> str | None:
    """Why ``fn`` cannot take its family's call (None: it can, or the family or the callable's
    signature is not known): the call the family makes and what binding it said."""
    call = CALLS.get(family)
    if call is None or not callable(fn):
        return None
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or an extension callable: nothing to read
        return None
    inputs, keywords = call
    try:
        signature.bind(*inputs, **dict.fromkeys(keywords))
    except TypeError as exc:
        wanted = f"fn({', '.join(inputs)}, *, {', '.join(keywords)})"
        return (f"kernel '{name}' in family '{family}' cannot take the family's call {wanted}: {exc} "
                f"(its signature is {name}{signature})")
    return None
