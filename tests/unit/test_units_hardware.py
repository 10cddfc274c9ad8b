"""Unit tests for ``pytest_attnperf.hw.table``: name normalising, table matching, ``--hw`` resolution.

Devices are faked with ``DetectedDevice``; nothing here asks torch about a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_attnperf.hw.table import TABLE, DetectedDevice, HardwareMismatch, match, normalise, resolve


@dataclass(frozen=True)
class Card:
    """A device string as CUDA reports it, its capability, and what it should be known as."""

    device_name: str
    capability: tuple[int, int]
    normalised: str
    row: str

    def device(self) -> DetectedDevice:
        return DetectedDevice(kind="cuda", name=self.device_name, capability=self.capability)


CARDS = (
    Card("NVIDIA GeForce RTX 4090", (8, 9), "rtx4090", "rtx4090"),
    Card("NVIDIA H100 80GB HBM3", (9, 0), "h10080gbhbm3", "h100"),
    Card("NVIDIA H200", (9, 0), "h200", "h200"),
    Card("NVIDIA A100-SXM4-80GB", (8, 0), "a100sxm480gb", "a100"),
    Card("NVIDIA RTX A6000", (8, 6), "rtxa6000", "a6000"),
    Card("NVIDIA GB10", (12, 1), "gb10", "gb10"),
    Card("NVIDIA GeForce RTX 2070", (7, 5), "rtx2070", "rtx2070"),
)
H200 = DetectedDevice(kind="cuda", name="NVIDIA H200", capability=(9, 0))
L40S = DetectedDevice(kind="cuda", name="NVIDIA L40S", capability=(8, 9), sm_count=142, l2_bytes=96 * 2**20)
CPU = DetectedDevice(kind="cpu", name="x86_64")


# -- normalise and match --------------------------------------------------------------------


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.row)
def test_normalise_drops_vendor_words_and_punctuation(card: Card) -> None:
    """Lower case, no 'NVIDIA'/'GeForce', no spaces or dashes."""
    assert normalise(card.device_name) == card.normalised


def test_normalise_drops_tesla() -> None:
    """Old data-centre names carry 'Tesla'."""
    assert normalise("Tesla V100-SXM2-16GB") == "v100sxm216gb"


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.row)
def test_match_finds_the_row_by_token_and_capability(card: Card) -> None:
    """Each real device string, with its real capability, finds its row."""
    spec = match(card.device())
    assert spec is not None
    assert spec.name == card.row
    assert spec.capability == card.capability


def test_match_refuses_a_capability_that_disagrees() -> None:
    """An 'H100' string on an sm_80 part is no H100."""
    assert match(DetectedDevice(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(8, 0))) is None


@pytest.mark.parametrize(
    "device",
    [L40S, DetectedDevice(kind="cuda", name="NVIDIA RTX A1000", capability=(8, 6)),
     DetectedDevice(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=None)],
    ids=["l40s", "rtx-a1000", "no-capability"],
)
def test_match_returns_none_for_an_unknown_gpu(device: DetectedDevice) -> None:
    """A GPU the table does not know, or one without a capability, matches nothing."""
    assert match(device) is None


def test_match_of_the_cpu_is_the_cpu_row() -> None:
    """Without a GPU the 'cpu' row applies whatever the processor is called."""
    assert match(CPU) is TABLE["cpu"]


# -- the table ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_row_is_sourced_and_consistent(name: str) -> None:
    """Every row names its source, is keyed by its name, and has tokens that can match."""
    spec = TABLE[name]
    assert spec.source.strip()
    assert spec.name == name
    assert spec.tokens
    assert all(normalise(token) == token for token in spec.tokens), "a token must be normalised to match"
    assert set(spec.peak_flops) == {"bf16", "fp16", "fp32"}
    assert not spec.measured_only
    if name != "cpu":
        assert spec.capability is not None
        assert spec.hbm_bytes_per_s
        assert spec.hbm_bytes_per_s > 1e11
        fp16 = spec.peak_flops_for("fp16")
        assert fp16
        assert fp16 > 1e13


def test_ridge_falls_back_to_fp16_and_is_none_without_figures() -> None:
    """The ridge uses bf16, fp16 where bf16 is missing (Turing), and None on the CPU."""
    assert TABLE["h200"].ridge_flop_per_byte == pytest.approx(989.5e12 / 4800e9)
    assert TABLE["rtx2070"].ridge_flop_per_byte == pytest.approx(29.9e12 / 448e9)
    assert TABLE["cpu"].ridge_flop_per_byte is None


# -- resolve --------------------------------------------------------------------------------


@pytest.mark.parametrize("card", CARDS, ids=lambda c: c.row)
def test_resolve_without_a_name_detects(card: Card) -> None:
    """No --hw: the detected row."""
    assert resolve(None, card.device()) is TABLE[card.row]


@pytest.mark.parametrize("requested", ["h200", "H200", " h200 "])
def test_resolve_accepts_the_present_card_in_any_case(requested: str) -> None:
    """--hw naming the card present, however written, is that card's row."""
    assert resolve(requested, H200) is TABLE["h200"]


def test_resolve_refuses_another_known_card() -> None:
    """--hw=h100 on an H200 names both."""
    with pytest.raises(HardwareMismatch) as info:
        resolve("h100", H200)
    message = str(info.value)
    assert "h100" in message
    assert "h200" in message
    assert "NVIDIA H200" in message
    assert "9.0" in message


def test_resolve_refuses_an_unknown_name_listing_the_known_ones() -> None:
    """--hw=nosuchcard lists every name in the table."""
    with pytest.raises(HardwareMismatch) as info:
        resolve("nosuchcard", H200)
    message = str(info.value)
    assert "nosuchcard" in message
    assert all(name in message for name in TABLE)


def test_hardware_mismatch_is_a_value_error() -> None:
    """Callers catching ValueError see a mismatch too."""
    assert issubclass(HardwareMismatch, ValueError)


def test_unknown_gpu_resolves_to_a_measured_only_spec() -> None:
    """An L40S runs as 'l40s' with no vendor peaks, keeping what the device reported."""
    spec = resolve(None, L40S)
    assert spec.name == "l40s"
    assert spec.measured_only
    assert spec.capability == (8, 9)
    assert spec.sm_count == 142
    assert spec.l2_bytes == 96 * 2**20
    assert all(value is None for value in spec.peak_flops.values())
    assert spec.hbm_bytes_per_s is None
    assert spec.ridge_flop_per_byte is None
    assert "NVIDIA L40S" in spec.source


@pytest.mark.parametrize("requested", ["l40s", "L40S"])
def test_unknown_gpu_can_be_named_by_its_normalised_name(requested: str) -> None:
    """--hw=l40s on an L40S is accepted, so its first baseline can be recorded."""
    spec = resolve(requested, L40S)
    assert spec.name == "l40s"
    assert spec.measured_only


def test_unknown_gpu_cannot_claim_a_table_row() -> None:
    """--hw=h200 on an L40S is refused."""
    with pytest.raises(HardwareMismatch, match="l40s"):
        resolve("h200", L40S)


def test_cpu_resolves_to_cpu() -> None:
    """The CPU runs as 'cpu', detected or named."""
    assert resolve(None, CPU) is TABLE["cpu"]
    assert resolve("cpu", CPU) is TABLE["cpu"]
    with pytest.raises(HardwareMismatch, match="x86_64"):
        resolve("h200", CPU)


def test_machine_id_names_the_card_and_the_boot(tmp_path: Path) -> None:
    from pytest_attnperf.hw.table import DetectedDevice, machine_id

    boot = tmp_path / "boot_id"
    boot.write_text("5e6f7a8b-1111-2222-3333-444455556666\n")
    gpu = DetectedDevice("cuda", "NVIDIA H200", (9, 0), 132, extra={"uuid": "GPU-1a2b3c4d-aaaa-bbbb"})
    assert machine_id(gpu, boot) == "gpu-1a2b3c4d/boot-5e6f7a8b"
    assert machine_id(DetectedDevice("cuda", "NVIDIA H200"), boot) == "h200/boot-5e6f7a8b"  # no UUID
    assert machine_id(gpu, tmp_path / "missing") == "gpu-1a2b3c4d"  # no boot id (not Linux)
