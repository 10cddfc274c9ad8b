"""A project's own decode kernels, registered from its conftest.py, run through the decode
suites' tests with shapes of its own (fake CPU device and scripted timer: tests/kit.py), in this
process: torch and fla are loaded once, not once a run."""

from __future__ import annotations

import kit
import pytest

OWN_CONFTEST = '''
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right


def pytest_attnperf_register_kernels(registry, config):
    @registry.kernel(family="softmax", name="my-decode", backward=False)
    def my_decode(q, k, v, *, causal, scale, window=None):
        if window:
            raise NotImplementedError("no window")
        mask = causal_lower_right(q.shape[2], k.shape[2]) if causal else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)

    @registry.kernel(family="softmax", name="my-upper-left", backward=False)
    def my_upper_left(q, k, v, *, causal, scale, window=None):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)

    @registry.kernel(family="gdn_decode", name="my-step", backward=False)
    def my_step(q, k, v, g, beta, *, scale, initial_state):
        import torch

        state, outs = initial_state.clone(), []
        for t in range(q.shape[1]):
            qt, kt, vt = (x[:, t].float() for x in (q, k, v))
            state = state * g[:, t].exp()[..., None, None]
            u = beta[:, t].float()[..., None] * (vt - torch.einsum("bhk,bhkv->bhv", kt, state))
            state = state + kt[..., :, None] * u[..., None, :]
            outs.append(scale * torch.einsum("bhk,bhkv->bhv", qt, state))
        return torch.stack(outs, 1).to(q.dtype), state
'''

OWN_STEPS = '''
from pytest_attnperf.families.linear.decode import LinearDecodeCase, test_linear_decode

ATTNPERF_FAMILY = "gdn_decode"
ATTNPERF_CASES = (LinearDecodeCase("cpu-b2-h2-t2-d16-fp32", 2, 2, 2, 16, 16, "fp32", gpu=False),)
ATTNPERF_DIRECTIONS = ("fwd",)
'''

OWN_SHAPES = '''
from pytest_attnperf.families.softmax.decode import decode_case, test_softmax_decode

ATTNPERF_FAMILY = "softmax"
ATTNPERF_CASES = (decode_case(2, 3, 80, heads=4, kv_heads=2, head_dim=16, dtype="fp32", gpu=False),)
ATTNPERF_DIRECTIONS = ("fwd",)
'''


def test_a_projects_own_decode_kernel_runs_through_the_hook(pytester: pytest.Pytester) -> None:
    """A project registers decode kernels from its conftest.py (a softmax one, a GDN step) and declares
    its own decode shapes with the decode suites' tests: the right kernels pass, the upper-left one
    fails its check."""
    pytester.syspathinsert()  # the fakes, for -p
    (pytester.path / "attnperf_fakes.py").write_text(kit.conftest("cpu", samples=kit.steps(5, centred=True)))
    pytester.makeconftest(OWN_CONFTEST)
    pytester.makepyfile(test_my_decode=OWN_SHAPES, test_my_steps=OWN_STEPS)
    result = pytester.runpytest_inprocess("-p", "pytest_attnperf.plugin", "-p", "attnperf_fakes", "-p", "no:randomly",
                                          "-p", "no:cacheprovider", "--benchmark-disable", "-rA", "-k", "my-")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    assert "PASSED test_my_decode.py::test_softmax_decode[b2-h4-kv2-t3-cache80-d16-causal-fp32-my-decode-fwd]" in out
    assert "PASSED test_my_steps.py::test_linear_decode[cpu-b2-h2-t2-d16-fp32-my-step-fwd]" in out
    result.stdout.fnmatch_lines(["FAILED test_my_decode.py::test_softmax_decode[[]*-my-upper-left-fwd[]]*"])
