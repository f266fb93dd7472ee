"""The harness of the detector contract suite: the input streams and a driver that feeds a detector as
`JobMonitor` does (see test_detectors.py for the properties checked)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gangwatch.detectors.clocks import ClockDetector
from gangwatch.detectors.monitor import DEFAULT_DETECTORS
from gangwatch.detectors.topology import Topology
from gangwatch.producers.simulate import Fault, Scenario, generate
from gangwatch.schemas import DecodeError, Finding, Record, decode_obj, to_dict

REPO = Path(__file__).resolve().parents[2]

# --- the input: one small job per fault, so that every detector fires somewhere -----------------


def _scenario(name: str, seed: int, *faults: Fault, **kw) -> Scenario:
    return Scenario(name, seed, tp=8, pp=2, dp=4, duration_s=200.0, faults=faults, **kw)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    # fail-stop: Xid 79, the rank's exception, missing heartbeats, NCCL timeouts, stack + flight sweep
    _scenario("xid79", 11, Fault("xid79", 100.0, node="n002", params={"gpu": 2})),
    # fail-slow: one GPU throttles hard enough to slow the whole job (fail_slow and job_slowdown)
    _scenario("thermal", 12, Fault("thermal_straggler", 40.0, rank=13, magnitude=0.8, params={"ramp_s": 10.0})),
    # hang: a data loader stalls; heartbeats go on, steps stop; stack + flight sweep
    _scenario("hang", 13, Fault("dataloader_hang", 100.0, rank=21)),
    # silent data corruption: one replica's digest disagrees, then loss / grad_norm blow up
    _scenario("sdc", 14, Fault("sdc", 60.0, rank=29)),
    # planned maintenance: the job stops and restarts on a spare node (a second `job` record)
    _scenario("planned", 15, Fault("planned_maintenance", 90.0, node="n005",
                                   params={"lead_s": 30.0, "restart_after_s": 30.0})),
    # start-up: the ranks come up over two minutes after the job record, then train; no fault at all
    _scenario("slow_start", 16, launch_s=120.0),
    # a PCIe link that keeps replaying on one GPU (NVML counters only; the job trains on)
    _scenario("link_errors", 17, Fault("link_errors", 60.0, node="n003", params={"gpu": 5})),
    # a node's clock runs 30 s ahead from the start (clock_skew); another's records arrive 20 s late
    _scenario("clocks", 18, Fault("clock_skew", 0.0, node="n002", params={"offset_s": 30.0}),
              Fault("late_delivery", 40.0, node="n005", params={"lag_s": 20.0})),
)}

DETECTORS = {cls.name: cls for cls in DEFAULT_DETECTORS}
DET_IDS = list(DETECTORS)
SC_IDS = list(SCENARIOS)

_LATENESS_S = 0.5  # out-of-order records: adjacent records closer than this may swap


@functools.cache
def wire(sc_name: str) -> tuple[dict[str, Any], ...]:
    """The scenario's records as wire dicts (event-time order)."""
    return tuple(generate(SCENARIOS[sc_name]))


@functools.cache
def stream(sc_name: str) -> tuple[Record, ...]:
    recs = tuple(decode_obj(d) for d in wire(sc_name))
    bad = [r for r in recs if isinstance(r, DecodeError)]
    assert not bad, bad[:3]
    assert recs[0].kind == "job", "a stream starts with its job's topology"
    return recs


# --- the harness: drive one detector as JobMonitor does ------------------------------------------


class Driver:
    """One detector, its topology, and the records it has been fed, with the job's clock as `JobMonitor` keeps it:
    time moves by the job's own time (`ClockDetector.now`) and the detector reads each record with its node's
    clock offset taken out (the clock detector itself reads them raw)."""

    def __init__(self, det: Any, topo: Topology, clock: ClockDetector | None = None) -> None:
        self.det, self.topo = det, topo
        self.clock = det if isinstance(det, ClockDetector) else clock or ClockDetector(topo)
        if hasattr(det, "clock") and det is not self.clock:
            det.clock = self.clock
        self.last_ts: float | None = None

    @classmethod
    def fresh(cls, det_cls: type, recs: Sequence[Record]) -> Driver:
        topo = Topology.from_job(recs[0])
        return cls(det_cls(topo), topo)

    def feed(self, rec: Record) -> list[Finding]:
        clock = self.clock
        if rec.kind != "job":
            clock.heard(rec)
        now = max(clock.now(), self.topo.ts)
        out = self.det.advance(now)
        if clock is not self.det:
            clock.advance(now)
        self.last_ts = now if self.last_ts is None else max(self.last_ts, now)
        if rec.kind == "job":
            if rec.ts > self.topo.ts or rec.ranks != list(self.topo.ranks):  # not the job record it started from
                self.set_topology(Topology.from_job(rec))
        else:
            if clock is not self.det and rec.kind in clock.kinds:
                clock.observe(rec)
            if rec.kind in self.det.kinds:
                out += self.det.observe(rec if clock is self.det else clock.corrected(rec))
        return out

    def set_topology(self, topo: Topology) -> None:
        self.topo = topo
        self.det.set_topology(topo)
        if self.clock is not self.det:
            self.clock.set_topology(topo)

    def finish(self) -> list[Finding]:
        return self.det.advance(self.last_ts) if self.last_ts is not None else []

    def run(self, recs: Iterable[Record]) -> list[Finding]:
        out: list[Finding] = []
        for rec in recs:
            out += self.feed(rec)
        return out + self.finish()


def run(det_cls: type, recs: Sequence[Record]) -> list[Finding]:
    return Driver.fresh(det_cls, recs).run(recs)


@functools.cache
def reference(det_name: str, sc_name: str) -> tuple[Finding, ...]:
    """The in-order run every other property is compared with."""
    return tuple(run(DETECTORS[det_name], stream(sc_name)))


def wire_list(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    """Findings as wire dicts: compares every field, `extra` and the id included."""
    return [to_dict(f) for f in findings]


def kinds_and_nodes(findings: Iterable[Finding]) -> set[tuple[str, str, str | None]]:
    return {(f.type, f.detector, f.node) for f in findings}
