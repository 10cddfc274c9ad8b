"""Runs spread over pytest-xdist workers: one worker per GPU, one set of results.

The controller gives worker ``gwK`` the K-th GPU (``pytest_attnperf_visible_gpus``) and runs
``--dist load`` as ``loadgroup``, a shape's cases in one group. Each measured case's summary row
and baseline entry travel to the controller on its teardown report; the controller alone writes
the baseline file, the autotune choices, the summary and the report, and reports each case no
worker ran as an error naming the dead worker (``report_not_run``). More timing workers than
GPUs are refused or fail their timed cases; a check-only run's workers may share a card.
docs/parallel.md.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from pytest_attnperf.families.parametrize import OPTED_OUT_KEY, REMOVED_KEY, removed
from pytest_attnperf.options import configured
from pytest_attnperf.outcome import Row
from pytest_attnperf.parallel.fleet import (
    INPUT_KEY,
    OUTPUT_KEY,
    REPORT_ATTR,
    Fleet,
    Seat,
    WorkerShare,
    _expanded,
    _local,
    case_key,
    decode,
    encode,
    group_of,
    is_controller,
    is_worker,
    timing_turn,
)
from pytest_attnperf.plugins.pool import PoolRuns
from pytest_attnperf.session import AttnPerfSession
from pytest_attnperf.store.baselines import write_atomic

__all__ = ["COMMITTED_KEY", "Worker", "add_groups", "attach_case", "configure", "configure_node", "make_scheduler",
           "node_down", "planned", "prepare", "report_not_run", "summary_lines", "worker_output"]

COMMITTED_KEY = pytest.StashKey[dict[str, Any] | None]()  # a case's baseline entry at its teardown (None: none)


def _explicit(session: AttnPerfSession) -> bool:
    """Whether the run asks for attnperf's timing in so many words (``--hw``, ``--update-baselines``,
    ``--attnperf-suites``, from the command line, the environment or the ini file)."""
    s = session.settings
    return s.hw is not None or s.update_baselines or bool(s.suites)



def configure(config: pytest.Config, session: AttnPerfSession) -> None:
    """Called by ``pytest_configure``: a worker pins its GPU, a controller plans the fleet."""
    if is_worker(config):
        session.seat = _take_seat(config)
        config.pluginmanager.register(Worker(session), "attnperf-xdist-worker")
    elif is_controller(config):
        session.fleet = _plan(config, session)
        config.pluginmanager.register(Controller(session), "attnperf-xdist-controller")



class Worker:
    """The plugin a pytest-xdist worker registers (only there): each case's rows and baseline
    entry to the controller on its teardown report, and the worker's end-of-run payload."""

    def __init__(self, session: AttnPerfSession) -> None:
        self.session = session

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outside the plugin's own: its entry is committed first
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
        """On a teardown report: the case's rows and committed entry, for the controller."""
        report = yield
        if report.when == "teardown":
            attach_case(self.session, case_key(item), report, item.stash.get(COMMITTED_KEY, None))
        return report

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The worker's end-of-run payload, for the controller."""
        worker_output(session.config, self.session)


class Controller:
    """The plugin a pytest-xdist controller registers (only there): it gives each worker its GPU,
    schedules a shape's cases together, and takes in the workers' cases and end-of-run payloads."""

    def __init__(self, session: AttnPerfSession) -> None:
        self.session = session

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """``loadgroup`` with each case's group from its workers' map (``make_scheduler``)."""
        return make_scheduler(config, log, self.session)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """Give a starting worker its GPU and the fleet's size."""
        configure_node(node.config, self.session, node)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        """Take a finished worker's end-of-run payload; note a worker that died."""
        if error is not None and self.session.fleet is not None:
            self.session.fleet.deaths.setdefault(str(node.gateway.id), None)
        node_down(self.session, node, error)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """Keep the node ids a worker collected (every worker collects the same)."""
        if self.session.fleet is not None and not self.session.fleet.collected:
            self.session.fleet.collected = list(ids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        """Note the case a worker died in (pytest-xdist reports it as failed)."""
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
        if self.session.fleet is not None and worker is not None:
            self.session.fleet.deaths[str(worker)] = crashitem

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Take in a worker's case as its teardown report arrives (``receive_case``); note that
        some report of the case arrived."""
        if self.session.fleet is not None:
            self.session.fleet.reported.add(report.nodeid)
        if report.when == "teardown":
            receive_case(self.session, report)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """After pytest-xdist's loop: each case no worker ran after a worker died, reported as an
        error (``report_not_run``) before pytest decides the exit status. A run stopped on
        purpose (``-x``, an interrupt) raises out of the loop and reports nothing of the kind."""
        result = yield
        report_not_run(session.config, self.session)
        return result


def planned(config: pytest.Config) -> bool:
    """Whether this pytest-xdist run gets one GPU per worker: a project or run that configures
    attnperf (any attnperf option given, on the command line, in the environment or as an ini
    key). Other projects that merely have the plugin installed keep pytest-xdist as it is."""
    return configured(config)



def _plan(config: pytest.Config, session: AttnPerfSession) -> Fleet:
    option = config.option
    workers = len(getattr(option, "tx", None) or []) or int(getattr(option, "numprocesses", 0) or 0)
    specs = _expanded([str(spec) for spec in getattr(option, "tx", None) or []])
    if not planned(config):
        return Fleet(gpus=[], workers=len(specs) or workers, specs=specs, planned=False)
    gpus = config.hook.pytest_attnperf_visible_gpus(config=config)
    fleet = Fleet(gpus=list(gpus or []), workers=len(specs) or workers, specs=specs)
    if getattr(option, "dist", None) == "each":
        raise pytest.UsageError("attnperf: --dist each runs every case on every worker, and one baseline entry "
                                "cannot hold several GPUs' figures; use --dist load (the default of -n)")
    if fleet.shared_gpu and _explicit(session) and not (option.collectonly or session.settings.check_only):
        raise pytest.UsageError(
            f"attnperf: {fleet.workers} pytest-xdist workers for {len(fleet.gpus)} GPU(s): two workers would time "
            f"on one card at once and each would slow the other; run with -n {len(fleet.gpus)} (or -n auto)")
    if getattr(option, "dist", None) == "load":
        option.dist = "loadgroup"  # a shape's cases on one worker: warm-up and autotuning once (see group_of)
    if getattr(option, "maxworkerrestart", "") is None:
        # a crashed worker is not replaced (under group scheduling a replacement re-ran the case
        # that crashed it, or the run hung), so one crash ends the run: pytest-xdist reports the case
        # it died in as failed and shuts the other workers down once they finish the cases they hold.
        # The cases finished are kept, and each case no worker ran is reported as an error
        # (report_not_run); --max-worker-restart=N asks for replacements all the same
        option.maxworkerrestart = "0"
    if fleet.gpus and specs:  # the pin in each worker's environment from its start, before any conftest runs
        option.tx = [f"{spec}//env:CUDA_VISIBLE_DEVICES={fleet.gpu_for(f'gw{i}')}" if _local(spec) else spec
                     for i, spec in enumerate(specs)]
    return fleet



def _take_seat(config: pytest.Config) -> Seat:
    given = config.workerinput.get(INPUT_KEY) or {}  # type: ignore[attr-defined]
    seat = Seat(worker=str(config.workerinput.get("workerid", "gw?")),  # type: ignore[attr-defined]
                gpu=given.get("gpu"), gpus=int(given.get("gpus", 0)), workers=int(given.get("workers", 1)),
                testrunuid=str(config.workerinput.get("testrunuid", "")),  # type: ignore[attr-defined]
                unplanned=bool(given.get("unplanned", False)))
    if given.get("loadgroup"):  # the controller's --dist (loadgroup for load), which a worker does not parse
        config.option.loadgroup = True
    if seat.gpu is None:
        return seat
    if given.get("shared"):
        seat.refusal = (f"{seat.workers} pytest-xdist workers share {seat.gpus} GPU(s), so {seat.worker} would time on "
                        f"GPU {seat.gpu} while another worker does: run with -n {seat.gpus} (or -n auto)")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        seat.refusal = (f"CUDA was initialised before pytest-attnperf could pin {seat.worker} to GPU {seat.gpu} "
                        "(a conftest.py or plugin used CUDA while loading), so this worker's cuda:0 may be another "
                        "worker's card; keep CUDA calls out of module level")
    os.environ["CUDA_VISIBLE_DEVICES"] = seat.gpu
    return seat



def configure_node(config: pytest.Config, session: AttnPerfSession, node: Any) -> None:
    """Controller: the worker's GPU and the fleet's size, in the worker's input."""
    fleet = session.fleet
    if fleet is None:
        return
    worker = str(node.gateway.id)
    fleet.testrunuid = str(node.workerinput.get("testrunuid", ""))
    if not fleet.planned:
        node.workerinput[INPUT_KEY] = {"gpu": None, "gpus": 0, "workers": fleet.workers, "unplanned": True}
        return
    pinned = (getattr(getattr(node.gateway, "spec", None), "env", None) or {}).get("CUDA_VISIBLE_DEVICES")
    gpu = pinned or fleet.gpu_for(worker)  # a restarted worker keeps its spec, and so its GPU
    fleet.shares[worker] = WorkerShare(gpu=gpu)
    node.workerinput[INPUT_KEY] = {"gpu": gpu, "gpus": len(fleet.gpus), "workers": fleet.workers,
                                   "shared": fleet.shares_gpu(worker),
                                   "loadgroup": getattr(config.option, "dist", None) == "loadgroup"}



def _groups_path(testrunuid: str, worker: str) -> Path:
    return Path(tempfile.gettempdir()) / f"attnperf-groups-{testrunuid}-{worker}.json"



def add_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker under ``loadgroup``: mark each measured case with its group (``group_of``)
    and write the node id -> group map for the controller's scheduler (``make_scheduler``):
    pytest-xdist's own way, a ``@group`` suffix on the node id, does not take with pytest 9,
    whose node ids cannot be changed after collection."""
    if not getattr(config.option, "loadgroup", False):
        return
    groups = {}
    for item in items:
        name = group_of(item)
        if name is not None:
            groups[item.nodeid] = name
            item.add_marker(pytest.mark.xdist_group(name))
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or not groups:
        return

    try:
        write_atomic(_groups_path(str(workerinput.get("testrunuid", "")), str(workerinput.get("workerid", ""))),
                     json.dumps(groups))
    except OSError:  # no map: each case is its own group, as without grouping
        pass



def make_scheduler(config: pytest.Config, log: Any, session: AttnPerfSession) -> Any:
    """Controller, under ``loadgroup``: pytest-xdist's group scheduling, with each case's group
    read from the map its workers wrote (same host), else from the node id's ``@group``."""
    fleet = session.fleet
    if fleet is None or config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # noqa: PLC0415 - it imports execnet: on a controller only

    groups = fleet.groups

    class ShapeScheduling(LoadGroupScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return groups().get(nodeid) or str(super()._split_scope(nodeid))

        def remove_node(self, node: Any) -> str | None:
            """pytest-xdist's, but the case a crashed worker died in goes back with its group as
            done: the rest of the group may run on another worker, that case not again (it took
            one worker down, and would take the next)."""
            workload = self.assigned_work.pop(node)
            pending = [(scope, nodeid) for scope, unit in workload.items() for nodeid, done in unit.items() if not done]
            if not pending:
                return None
            scope, crashitem = pending[0]
            workload[scope][crashitem] = True
            self.workqueue.update({name: unit for name, unit in workload.items() if not all(unit.values())})
            for other in self.assigned_work:
                self._reschedule(other)
            return str(crashitem)

    return ShapeScheduling(config, log)



def prepare(session: AttnPerfSession, items: list[pytest.Item]) -> None:
    """The run's preparation (``AttnPerfSession.prepare``: the sample overhead and the ceilings),
    in a worker under a case's rules: none where the worker may not time (``Seat.why_not_timing``;
    its cases fail with the reason), one worker at a time without a GPU."""
    seat = session.seat
    if seat is not None:
        try:
            refused = seat.why_not_timing(lambda: session.device.is_gpu) is not None
        except Exception:  # noqa: BLE001 - each measured case meets the error itself
            return
        if refused:
            return
    with timing_turn(seat, lambda: session.device.is_gpu):
        session.prepare(items)


def attach_case(session: AttnPerfSession, key: str, report: pytest.TestReport, entry: dict[str, Any] | None) -> None:
    """Worker, on a teardown report: the rows this test added and its baseline entry (when it
    passed and the run records), for the controller."""
    seat = session.seat
    if seat is None:
        return
    rows = session.rows[seat.rows_sent:]
    seat.rows_sent = len(session.rows)
    if not rows and entry is None:
        return
    case: dict[str, Any] = {"key": key, "rows": rows, "entry": entry, "worker": seat.worker}
    if not seat.facts_sent:  # with the first case: the controller can write even if this worker dies later
        case["facts"] = _facts(session)
        seat.facts_sent = True
    try:
        setattr(report, REPORT_ATTR, encode(case))
    except Exception as exc:  # noqa: BLE001 - named on the controller, never an internal error here
        setattr(report, REPORT_ATTR, encode({"key": key, "rows": [], "entry": None, "worker": seat.worker,
                                             "error": f"{type(exc).__name__}: {exc}"}))



def _facts(session: AttnPerfSession) -> dict[str, Any]:
    """The worker's device, hardware spec and software environment (all known once a case was measured)."""
    facts = {}
    for name in ("device", "hardware", "environment"):
        try:
            facts[name] = getattr(session, name)
        except Exception:  # noqa: BLE001 - what cannot be had is left out
            pass
    return facts



def _adopt_facts(session: AttnPerfSession, facts: dict[str, Any], worker: str) -> None:
    """Controller: the first worker's facts become the session's (the controller never opens a
    device); a worker on other hardware stops the run from writing any baseline."""
    fleet = session.fleet
    assert fleet is not None
    share = fleet.shares.setdefault(worker, WorkerShare(gpu=None))
    device = facts.get("device")
    if device is not None and share.device is None:
        uuid = (device.extra or {}).get("uuid")
        share.device = device.name + (f", {uuid}" if uuid else "")
    hardware = facts.get("hardware")
    if hardware is None:
        return
    known = session.__dict__.get("hardware")
    if known is None:
        for name in ("device", "hardware", "environment"):
            if name in facts:
                session.__dict__[name] = facts[name]  # the session's cached properties, as a worker found them
    elif known.name != hardware.name and fleet.mixed is None:
        fleet.mixed = (f"the workers measured on different hardware ({known.name}, and {hardware.name} on {worker}), "
                       "which one baseline file cannot hold; run each kind of card apart")
        fleet.problems.append(fleet.mixed)



def receive_case(session: AttnPerfSession, report: pytest.TestReport) -> None:
    """Controller: a case's rows and entry, as its teardown report arrives."""
    text = getattr(report, REPORT_ATTR, None)
    if session.fleet is None or not isinstance(text, str):
        return
    try:
        case = decode(text)
    except Exception as exc:  # noqa: BLE001 - a payload that cannot be read is named, never dropped silently
        session.fleet.problems.append(f"{report.nodeid}: its results could not be read ({type(exc).__name__}: {exc})")
        return
    if case.get("error"):
        session.fleet.problems.append(f"{case['key']}: its results could not be sent ({case['error']}); not recorded")
        return
    if case.get("facts"):
        _adopt_facts(session, case["facts"], case["worker"])
    if any(row.nodeid == case["key"] for row in session.rows):  # a rerun's or --dist each's second: first kept
        session.fleet.problems.append(f"{case['key']}: measured more than once; the first result is kept")
        return
    session.rows.extend(case["rows"])
    if case["entry"] is not None:
        session.baselines.commit(case["key"], case["entry"])
    share = session.fleet.shares.setdefault(case["worker"], WorkerShare(gpu=None))
    share.cases += len(case["rows"])



def worker_output(config: pytest.Config, session: AttnPerfSession) -> None:
    """Worker, at session end: what the controller needs besides the cases (the autotune
    plugin sends its own part)."""
    if session.seat is None or not hasattr(config, "workeroutput"):
        return

    opted_out = {group: sorted(ids) for group, ids in config.stash.get(OPTED_OUT_KEY, {}).items()}
    payload: dict[str, Any] = {"worker": session.seat.worker, "checked_only": session.checked_only,
                               "removed": removed(config), "opted_out": opted_out}
    if session.rows or session.baselines.pending:  # the device was looked up for them: its facts are known and cheap
        payload["facts"] = _facts(session)
        payload["drift"] = session.baselines.drift()
        payload["floor"] = session.overhead.figure
        payload["overhead_refusals"] = sorted(session.overhead.refusals)
    pool_runs = PoolRuns.of(config)
    if pool_runs is not None and pool_runs.results is not None:
        payload["processes"] = pool_runs.summary_lines()
    config.workeroutput[OUTPUT_KEY] = encode(payload)



def node_down(session: AttnPerfSession, node: Any, error: object | None) -> None:
    """Controller: a worker ended; take its end-of-run payload, and its device's facts for the
    baseline file and the report (the controller never opens a device)."""
    fleet = session.fleet
    if fleet is None:
        return
    worker = str(node.gateway.id)
    share = fleet.shares.setdefault(worker, WorkerShare(gpu=None))
    text = getattr(node, "workeroutput", {}).get(OUTPUT_KEY)
    if not isinstance(text, str):
        if error is not None:
            fleet.problems.append(f"{worker} ended early ({error}); the cases it finished are kept")
        return
    try:
        payload = decode(text)
    except Exception as exc:  # noqa: BLE001
        fleet.problems.append(f"{worker}: its end-of-run results could not be read ({type(exc).__name__}: {exc})")
        return
    share.finished = payload
    session.checked_only += int(payload.get("checked_only", 0))

    if payload.get("removed") and REMOVED_KEY not in session.config.stash:  # every worker collects them all
        session.config.stash[REMOVED_KEY] = list(payload["removed"])
    if payload.get("opted_out") and OPTED_OUT_KEY not in session.config.stash:
        session.config.stash[OPTED_OUT_KEY] = {group: set(ids) for group, ids in payload["opted_out"].items()}
    if payload.get("facts"):
        _adopt_facts(session, payload["facts"], worker)



def report_not_run(config: pytest.Config, session: AttnPerfSession) -> None:
    """Controller, after the run's loop: where a worker died, each collected case no report
    arrived for is reported as an error naming the worker and the case it died in, so pytest's
    last line and its exit status count it; the summary says how many (``summary_lines``)."""
    fleet = session.fleet
    if fleet is None or not fleet.deaths:
        return
    fleet.not_run = fleet.unreported()
    if not fleet.not_run:
        return
    cause = fleet.death_cause()
    collected = len(dict.fromkeys(fleet.collected))
    fleet.problems.append(f"{len(fleet.not_run)} of {collected} collected cases not run, each reported as an "
                          f"error: {cause}, which ended the run")
    for nodeid in fleet.not_run:
        config.hook.pytest_runtest_logreport(report=_not_run_report(nodeid, f"not run: {cause}, which ended the run"))


def _not_run_report(nodeid: str, message: str) -> pytest.TestReport:
    """A failed setup report (an error) for a case no worker ran, as pytest-xdist's own report of
    the case a worker died in is made."""
    path, _, name = nodeid.partition("::")
    return pytest.TestReport(nodeid=nodeid, location=(path, None, name or path), keywords={}, outcome="failed",
                             longrepr=message, when="setup")


def summary_lines(session: AttnPerfSession) -> list[str]:
    """The controller's lines on the fleet: each worker's GPU and device, its cases, its floor."""
    fleet = session.fleet
    if fleet is None or not (session.rows or fleet.problems):  # a run that measured nothing: no word of it
        return []
    lines = []
    if fleet.gpus:
        each = "one GPU each" if not fleet.shared_gpu else "MORE workers than GPUs"
        lines.append(f"pytest-xdist: {fleet.workers} workers, {each} (CUDA_VISIBLE_DEVICES={','.join(fleet.gpus)})")
    elif fleet.workers > 1:
        lines.append(f"pytest-xdist: {fleet.workers} workers, no GPU: timing took turns on a lock, but the other "
                     "workers' checks shared the CPU meanwhile; record CPU baselines without -n")
    for worker in sorted(fleet.shares, key=lambda w: (len(w), w)):
        share = fleet.shares[worker]
        where = f"GPU {share.gpu}" if share.gpu is not None else "CPU"
        device = f" ({share.device})" if share.device else ""
        lines.append(f"  {worker}: {where}{device}: {share.cases} measured cases")
        payload = share.finished or {}
        floor = payload.get("floor")
        if floor and floor[0] is not None:
            lines.append(f"    sample overhead ({floor[1]}): {1e3 * floor[0]:.2f} us")
        lines.extend(f"    {line}" for line in payload.get("processes", ()))
        lines.extend(f"    sample overheads not used: {refused}" for refused in payload.get("overhead_refusals", ()))
    lines.extend(f"pytest-xdist: {problem}" for problem in fleet.problems)
    return lines



def merged_drift(session: AttnPerfSession) -> list[str]:
    """The environment drift the workers found, each line once."""
    seen: list[str] = []
    for share in (session.fleet.shares.values() if session.fleet else ()):
        for line in (share.finished or {}).get("drift", ()):
            if line not in seen:
                seen.append(line)
    return seen



def rows_in_order(rows: list[Row]) -> list[Row]:
    """The controller's rows in node-id order (workers finish cases in no fixed order)."""
    return sorted(rows, key=lambda row: row.nodeid)
