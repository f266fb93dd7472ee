"""The input of the detector contract suite: one small simulated job per fault, so that every detector of the
catalog fires somewhere, and each detector's in-order run over each (`reference`). The checks themselves are
`gangwatch.detectors.contract`, which a detector outside this repository can run on its own streams."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

from gangwatch.detectors.contract import Trace, trace
from gangwatch.detectors.monitor import DEFAULT_DETECTORS
from gangwatch.producers.simulate import Fault, Scenario, generate
from gangwatch.schemas import DecodeError, Finding, Record, decode_obj

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


@functools.cache
def wire(sc_name: str) -> tuple[dict[str, Any], ...]:
    """The scenario's records as wire dicts (event-time order)."""
    return tuple(generate(SCENARIOS[sc_name]))


@functools.cache
def stream(sc_name: str) -> tuple[Record, ...]:
    """The scenario's records, decoded from copies of its wire dicts: a record keeps the lists it was decoded
    from (a `gpu` record's `throttle`), and test_input_not_mutated compares the records with `wire`, which must
    not change with them."""
    recs = tuple(decode_obj(copy.deepcopy(d)) for d in wire(sc_name))
    bad = [r for r in recs if isinstance(r, DecodeError)]
    assert not bad, bad[:3]
    assert recs[0].kind == "job", "a stream starts with its job's topology"
    return recs


@functools.cache
def traced(det_name: str, sc_name: str) -> Trace:
    """The detector's in-order run over the scenario, once per process: its findings, after how many records each
    batch came, and its state at every cut point (`contract.trace`).

    Nearly all of a run's time is the job's clock (`ClockDetector`, driven beside every detector as `JobMonitor`
    drives it), so a run costs about the same whichever the detector (~0.5 s of CPU here); the properties that
    only compare with the in-order run (findings are contract records, the state round trip, input not mutated,
    missing fields, determinism) take it from here instead of driving the detector again. tests/contract/groups.py
    keeps the per-detector tests on one xdist worker, so that this is computed once in the whole session."""
    return trace(DETECTORS[det_name], stream(sc_name))


def reference(det_name: str, sc_name: str) -> tuple[Finding, ...]:
    """The in-order run every other property is compared with (cached: `traced`)."""
    return tuple(traced(det_name, sc_name).findings)
