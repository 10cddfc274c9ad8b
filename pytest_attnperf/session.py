"""The run's state: device, hardware, timer, kernels, baselines, results.

Created by ``pytest_configure`` and kept in ``config.stash``. Everything
heavy (torch, the device query, the baseline file) is resolved on first use, so a run with no
attention tests imports nothing and writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import pytest

from pytest_attnperf.families.builtin import CALLS, check_signature, register_builtin
from pytest_attnperf.families.family import admit
from pytest_attnperf.families.registry import KernelRegistry
from pytest_attnperf.gate.policy import GateTerms, Here
from pytest_attnperf.hw import ceilings
from pytest_attnperf.hw.ceilings import Ceilings
from pytest_attnperf.hw.table import DetectedDevice, HardwareMismatch, HardwareSpec, machine_id, resolve
from pytest_attnperf.measure.overhead import SampleOverhead
from pytest_attnperf.measure.timing import SamplingPlan, Timer, default_timer
from pytest_attnperf.options import Settings, source, user_cache
from pytest_attnperf.outcome import Row
from pytest_attnperf.parallel.fleet import Fleet, Seat
from pytest_attnperf.store import envinfo
from pytest_attnperf.store.keeper import BaselineKeeper

__all__ = ["SESSION_KEY", "AttnPerfSession", "get_session"]


@dataclass
class AttnPerfSession:
    """The run's state: its settings, the device and its figures found on first need, its
    baseline file (``baselines``), the rows measured, and its place under pytest-xdist."""

    config: pytest.Config
    settings: Settings
    rows: list[Row] = field(default_factory=list)
    checked_only: int = 0  # cases --attnperf-check-only let through measure() untimed
    fleet: Fleet | None = None  # a pytest-xdist controller's workers (plugins/xdist.py)
    seat: Seat | None = None  # a pytest-xdist worker's GPU and place in the fleet

    # -- device and hardware -------------------------------------------------------------
    @cached_property
    def device(self) -> DetectedDevice:
        """The device a ``pytest_attnperf_detect_device`` implementation found; a UsageError if
        none did."""
        detected: DetectedDevice | None = self.config.hook.pytest_attnperf_detect_device(config=self.config)
        if detected is None:
            raise pytest.UsageError("attnperf: no pytest_attnperf_detect_device implementation returned a device")
        return detected

    @cached_property
    def hardware(self) -> HardwareSpec:
        """The hardware spec for ``--hw``, or for the device detected; a UsageError when the two
        do not match."""
        try:
            return resolve(self.settings.hw, self.device)
        except HardwareMismatch as exc:
            raise pytest.UsageError(f"attnperf: {exc} (the name from {source(self.config, 'hw')})") from None

    @cached_property
    def machine(self) -> str:
        """The name of this machine in the recording histories (``--attnperf-machine`` or detected)."""
        return self.settings.machine or machine_id(self.device)

    @cached_property
    def timer(self) -> Timer:
        """The timer a ``pytest_attnperf_make_timer`` implementation made, else the device's default."""
        made = self.config.hook.pytest_attnperf_make_timer(config=self.config, device=self.device)
        return made if made is not None else default_timer(self.device)

    @cached_property
    def registry(self) -> KernelRegistry:
        """The built-in kernels and those the ``pytest_attnperf_register_kernels`` hooks add, each one
        its family takes (``family.admit``)."""
        registry = KernelRegistry()
        register_builtin(registry)
        self.config.hook.pytest_attnperf_register_kernels(registry=registry, config=self.config)
        for kernel in registry:
            admit(kernel)
        wrong = [why for family in CALLS for k in registry.family(family)
                 if (why := check_signature(family, k.name, k.fn)) is not None]
        if wrong:  # every one of its cases would fail with the same TypeError: say it once, here
            raise pytest.UsageError("attnperf: " + "\n  ".join(wrong))
        return registry

    @cached_property
    def ceilings(self) -> Ceilings:
        """The machine's ceilings beside the spec's and the user's (``hw.ceilings.obtain``), found on
        first need and kept for the run."""
        s = self.settings
        return ceilings.obtain(self.hardware, s.ceilings, s.peaks, pool_run=s.pool_out is not None,
                               environment=lambda: self.environment, machine=self.machine,
                               folder=user_cache(*ceilings.CACHE_FOLDER),
                               measure_now=lambda: ceilings.measure(self.timer, self.plan("cold"), self.device))

    @cached_property
    def gate_terms(self) -> GateTerms:
        """The gate's settings, frozen once for the run."""
        return GateTerms.from_settings(self.settings)

    @cached_property
    def here(self) -> Here:
        """What the gate knows of this machine: its name and its sample overhead (measured on first need)."""
        return Here(self.machine, self.overhead.for_gate_ms)

    def plan(self, mode: str | None = None) -> SamplingPlan:
        """The sampling plan from the settings, in ``mode`` when given."""
        s = self.settings
        return SamplingPlan(
            mode=mode or s.mode,
            min_samples=s.min_samples,
            target_stdrel=s.target_stdrel,
            budget_s=s.budget_s,
            cold_graphs=s.cold_graphs,
            hot_sample_ms=s.hot_sample_ms,
            inventory=s.pool_out is None,  # a pool run's figures are pooled; the main run reads the kernels
        )

    @cached_property
    def overhead(self) -> SampleOverhead:
        """The run's sample overhead (``measure.overhead``), timed on first need."""
        return SampleOverhead(lambda: self.device.is_gpu, lambda: self.timer, lambda: self.plan("cold"))

    def prepare(self, items: list[pytest.Item]) -> None:
        """Before any test, when measured cases are selected: measure the sample overhead and the
        ceilings (or read them from their cache), so no case's time includes them. Not in a pool
        run (its parent prepared) or when only collecting; a device that cannot be looked up is
        left to each case to report."""
        if self.settings.pool_out is not None or self.config.option.collectonly:
            return
        if not any("attnperf" in getattr(item, "fixturenames", ()) for item in items):
            return
        try:
            self.hardware  # noqa: B018 - the device lookup each measured case makes anyway
        except Exception:  # noqa: BLE001 - each measured case meets the error itself
            return
        self.overhead.measure()
        self.ceilings  # noqa: B018 - measured, or read from their cache, now

    # -- baselines ------------------------------------------------------------------------
    @cached_property
    def baselines(self) -> BaselineKeeper:
        """The hardware's baseline file over this run (``store.keeper``): under pytest-xdist its
        workers send their entries to the controller instead of a journal."""
        return BaselineKeeper(self.settings, lambda: self.hardware.name, lambda: self.environment,
                              parallel=lambda: self.seat is not None or self.fleet is not None)

    @cached_property
    def environment(self) -> dict[str, str | None]:
        """The header of a baseline file measured now (versions, device, driver, date), found once."""
        return envinfo.environment(self.device, self.hardware.name)


SESSION_KEY = pytest.StashKey[AttnPerfSession]()


def get_session(config: pytest.Config) -> AttnPerfSession:
    """The attnperf session of a configured pytest run."""
    return config.stash[SESSION_KEY]
