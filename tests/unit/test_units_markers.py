"""The skip reason quoted when a pinned SDPA backend cannot run: torch's own words, the cause
kept, the pin's own noise dropped. Warning texts as torch 2.11 printed them on the H200."""

from __future__ import annotations

from pytest_attnperf.markers import unavailable_reason

AT = " (Triggered internally at /pytorch/aten/src/ATen/native/transformers/cuda/sdp_utils.cpp:988.)"
NO_KERNEL = RuntimeError("No available kernel. Aborting execution.")


def test_header_joined_with_its_cause_and_pin_noise_dropped() -> None:
    """torch's order: each backend's header, then its first failed check; for the backends the
    pin switched off that check is "has been runtime disabled", and both are left out."""
    seen = [
        "Memory efficient kernel not used because:" + AT,
        "Memory Efficient attention has been runtime disabled." + AT,
        "Flash attention kernel not used because:" + AT,
        "Expected query, key and value to all be of dtype: {Half, BFloat16}. Got Query dtype: float" + AT,
        "cuDNN attention kernel not used because:" + AT,
        "cuDNN attention has been runtime disabled." + AT,
    ]
    reason = unavailable_reason(NO_KERNEL, seen)
    assert reason == (
        "Flash attention kernel not used because: Expected query, key and value to all be of "
        "dtype: {Half, BFloat16}. Got Query dtype: float [No available kernel. Aborting execution.]"
    )


def test_a_check_shared_by_two_backends_is_quoted_for_both() -> None:
    both = "Both fused kernels requires query, key and value to be 4 dimensional" + AT
    seen = ["Flash attention kernel not used because:", both,
            "Memory efficient kernel not used because:", both]
    reason = unavailable_reason(NO_KERNEL, seen)
    assert reason is not None
    assert "Flash attention kernel not used because: Both fused kernels" in reason
    assert "Memory efficient kernel not used because: Both fused kernels" in reason


def test_header_without_a_cause_says_so() -> None:
    seen = ["Memory efficient kernel not used because:" + AT]
    reason = unavailable_reason(NO_KERNEL, seen)
    assert reason == ("Memory efficient kernel not used because (torch named no check) "
                      "[No available kernel. Aborting execution.]")


def test_no_warnings_quotes_the_exception() -> None:
    assert unavailable_reason(NO_KERNEL, []) == "No available kernel. Aborting execution."


def test_other_errors_are_not_unavailability() -> None:
    assert unavailable_reason(RuntimeError("CUDA error: an illegal memory access"), []) is None
    assert unavailable_reason(ValueError("No available kernel"), []) is None
