"""A node's wall clock stepping, seen by its monotonic clock (`detectors/clocksteps.py`), over generated streams."""

from __future__ import annotations

import random

import orjson
import pytest
from gangwatch.detectors.clocksteps import ClockSteps
from gangwatch.schemas import Gpu, Heartbeat, Lifecycle, Step, decode
from gangwatch.schemas.columns import StepRows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.stepgen import make_topology

pytestmark = pytest.mark.unit

TOL = 2.0  # ClockConfig().tolerance_s
BOOT = 1_700_000_000.0  # when the nodes booted (wall time): mono = true time - BOOT
T0 = BOOT + 86_400.0
topo = make_topology(8, gpus_per_node=2, tp=2, pp=1)  # 4 nodes of 2 ranks


def stream(step_s: float, at: float, seconds: float = 60.0, node_rank: int = 2, seed: int = 0) -> list[tuple]:
    """(true time, record) of one node's two ranks (2 and 3: node n00001) and its GPU, a record a second each,
    the node's wall clock `step_s` off from `at` seconds on; today's clients (every record with `mono`)."""
    rnd = random.Random(seed)
    out = []
    for k in range(int(seconds)):
        for rank in (node_rank, node_rank + 1):
            true = T0 + k + rnd.uniform(0.0, 0.2)
            wall = true + (step_s if k >= at else 0.0)
            mono = round(true - BOOT, 6)
            rec = Heartbeat(ts=wall, job="j1", rank=rank, mono=mono) if k % 2 else \
                Step(ts=wall, job="j1", rank=rank, step=k, step_s=1.0, mono=mono)
            out.append((true, rec))
        true = T0 + k + 0.5
        wall = true + (step_s if k >= at else 0.0)
        out.append((true, Gpu(ts=wall, node="n00001", gpu=0, mono=round(true - BOOT, 6))))
    return out


steps = st.one_of(st.floats(-600.0, -TOL), st.floats(TOL, 600.0)).map(lambda x: round(x, 3))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(step_s=steps, at=st.integers(12, 58), shuffle=st.integers(0, 30), seed=st.integers(0, 1000))
def test_every_record_with_mono_is_read_at_its_true_time_in_any_order_and_the_step_is_named_once(
        step_s, at, shuffle, seed):
    """Whatever the step and wherever it falls after the node is first heard, and read in any order that moves
    records up to `shuffle` places (a spool flushed late, a replay sorted by the stamped times: up to 10 s here),
    each record's time comes back as the time its node's clock had when first heard; the node is named once, with
    the step. (The frame is the clock a node is first heard with: a record read before it from a clock that
    already stepped sets it.)"""
    recs = stream(step_s, at, seed=seed)
    rnd = random.Random(seed)
    order = sorted(range(len(recs)), key=lambda i: i + rnd.uniform(0, shuffle))
    cs = ClockSteps(topo, TOL)
    for i in order:
        true, rec = recs[i]
        got = cs.unstepped(rec).ts
        assert type(got) is float and got == pytest.approx(true, abs=1e-6), (i, rec)  # (a float, as decoded)
    assert cs.said() == [("n00001", pytest.approx(step_s, abs=1e-3))]
    assert cs.said() == []  # said once


def test_a_record_without_mono_after_the_step_is_read_with_the_step_taken_out():
    cs = ClockSteps(topo, TOL)
    for _, rec in stream(30.0, 10):
        cs.unstepped(rec)
    late = Lifecycle(ts=T0 + 70.0, job="j1", event="pause", rank=3)
    assert cs.unstepped(late).ts == pytest.approx(T0 + 40.0) and type(cs.unstepped(late).ts) is float
    other = Lifecycle(ts=T0 + 70.0, job="j1", event="pause", rank=0)  # another node: its clock did not step
    assert cs.unstepped(other).ts == T0 + 70.0


def test_a_clock_that_wanders_less_than_half_the_tolerance_is_left_alone():
    cs = ClockSteps(topo, TOL)
    recs = stream(0.9, 20)
    assert [cs.unstepped(r).ts for _, r in recs] == [r.ts for _, r in recs]
    assert cs.said() == []


def test_records_of_older_clients_pass_as_they_came():
    cs = ClockSteps(topo, TOL)
    recs = [Heartbeat(ts=T0 + k + (30.0 if k > 5 else 0.0), job="j1", rank=2) for k in range(20)]
    assert all(cs.unstepped(r) is r for r in recs)
    assert cs.said() == [] and cs.state() == {"nodes": {}, "news": []}


def test_a_restart_keeps_the_step_and_takes_the_new_processes_monotonic_clock():
    """A new attempt (the node may have rebooted: its monotonic clock starts again) keeps what the node's wall
    clock did, and reads the new processes' records in the same frame."""
    cs = ClockSteps(topo, TOL)
    for _, rec in stream(-45.0, 10):
        cs.unstepped(rec)
    assert cs.said() == [("n00001", -45.0)]
    restarted = make_topology(8, gpus_per_node=2, tp=2, pp=1, ts=T0 + 100.0)
    cs.set_topology(restarted)
    rebooted = Heartbeat(ts=T0 + 200.0 - 45.0, job="j1", rank=2, mono=12.5)
    assert cs.unstepped(rebooted).ts == pytest.approx(T0 + 200.0)
    assert cs.said() == []


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(step_s=steps, at=st.integers(1, 40), cut=st.integers(1, 60), seed=st.integers(0, 1000))
def test_a_batch_as_columns_reads_as_its_records_one_by_one(step_s, at, cut, seed):
    """The worker's and replay's way (`StepRows`) gives each item the time, and leaves the state, that its
    records one by one do."""
    items = [r for _, r in stream(step_s, at, seed=seed) if r.kind != "gpu"]
    one, many = ClockSteps(topo, TOL), ClockSteps(topo, TOL)
    want = [one.unstepped(r).ts for r in items]
    got = []
    for start in range(0, len(items), cut):
        msg = orjson.dumps({"kind": "batch", "v": 1, "items": [
            {"kind": r.kind, "v": 1, **{k: v for k, v in _fields(r).items() if v is not None}}
            for r in items[start:start + cut]]})
        for rows in decode(msg, columns=True, heartbeats=True):  # (a batch too small for columns: records)
            got += list(many.unstepped_rows(rows).ts) if type(rows) is StepRows else [many.unstepped(rows).ts]
    assert got == pytest.approx(want, abs=1e-9)
    assert many.state() == one.state()


def test_its_state_restores_to_the_same_knowledge():
    cs = ClockSteps(topo, TOL)
    recs = stream(20.0, 15)
    for _, rec in recs[:40]:
        cs.unstepped(rec)
    back = ClockSteps.from_state(orjson.loads(orjson.dumps(cs.state())), topo, TOL)
    assert [back.unstepped(r).ts for _, r in recs[40:]] == [cs.unstepped(r).ts for _, r in recs[40:]]
    assert back.said() == cs.said()


def _fields(rec) -> dict:
    return {k: getattr(rec, k) for k in rec.__slots__ if k not in ("kind", "extra")}
