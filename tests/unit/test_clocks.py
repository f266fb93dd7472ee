"""Time you can trust (issue 34): each node's clock learned from the job's own steps, the job's time robust to one
node's clock, and a node's late records judged against their own lag. Pure: the core, no service."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import orjson
import pytest
from gangwatch.detectors.clocks import ClockDetector
from gangwatch.detectors.floats import nanmedian_rows
from gangwatch.detectors.topology import Topology
from gangwatch.producers.simulate import Fault, Scenario, generate
from gangwatch.schemas import DecodeError, Heartbeat, Job, RankInfo, Step, decode, decode_obj
from gangwatch.triage.core import Core, JobCore
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.unit

T0, HB = 1_767_225_600.0, 5.0


def job(nodes: int = 6, per_node: int = 4, pp: int = 1) -> Job:
    ranks = [RankInfo(rank=n * per_node + g, node=f"n{n}", gpu=g, pp=n % pp) for n in range(nodes)
             for g in range(per_node)]
    return Job(ts=T0, job="j", ranks=ranks, heartbeat_s=HB)


def steps(j: Job, n: int, skew: dict[str, float] | None = None, start: int = 0, every: float = 1.0,
          spread: float = 0.002) -> list[Step]:
    """`n` synchronous steps: every rank ends step k within `spread` of the others, each node stamping its
    records with its clock (`skew`: node -> seconds ahead)."""
    rnd = np.random.default_rng(7)
    out = []
    for k in range(start, start + n):
        end = T0 + 10.0 + k * every
        for r in j.ranks:
            off = (skew or {}).get(r.node, 0.0)
            out.append(Step(ts=round(end + off + rnd.uniform(0, spread), 6), job="j", rank=r.rank, step=k,
                            step_s=every))
    return out


def through(core: JobCore, recs) -> list:
    found = []
    for r in recs:
        found += core.process(r).findings
    return found


def test_a_node_ahead_is_learned_in_a_few_steps_named_once_and_its_times_corrected():
    j = job()
    core = JobCore(j)
    found = through(core, steps(j, 30, skew={"n3": 30.0}))
    skews = [f for f in found if f.type == "clock_skew"]
    assert [(f.node, round(f.evidence["offset_s"])) for f in skews] == [("n3", 30)]
    clocks = core.monitor.clocks
    assert clocks.offset_of(Step(ts=0.0, job="j", rank=12, step=0, step_s=1.0)) == pytest.approx(30.0, abs=0.01)
    assert clocks.offset_of(Step(ts=0.0, job="j", rank=0, step=0, step_s=1.0)) == 0.0
    # the job's time is the healthy nodes', not the skewed one's (its last record said +30 s)
    assert core.now() == pytest.approx(T0 + 10.0 + 29, abs=0.01)
    assert not [f for f in found if f.type in ("fail_stop", "hang", "telemetry_gap")]


def test_a_lone_node_ahead_cannot_move_the_jobs_time_before_its_offset_is_known():
    j = job()
    core = JobCore(j)
    recs = steps(j, 2)
    through(core, recs)
    before = core.now()
    core.process(Heartbeat(ts=before + 300.0, job="j", rank=20))  # n5 says it is five minutes later
    assert core.now() < before + 1.0 and core.watermark < before
    for r in range(4):  # a second node saying so too: the time moves
        core.process(Heartbeat(ts=before + 300.0, job="j", rank=r))
    assert core.now() == before + 300.0


@pytest.mark.parametrize("offset", [-45.0, 12.0])
def test_an_offset_either_way_appearing_mid_run_is_learned_and_a_drift_back_drops_it(offset):
    j = job(nodes=8, pp=2)
    core = JobCore(j)
    found = through(core, steps(j, 20) + steps(j, 20, skew={"n6": offset}, start=20))
    assert [(f.node, round(f.evidence["offset_s"])) for f in found if f.type == "clock_skew"] == [
        ("n6", round(offset))]
    assert not [f for f in found if f.type in ("fail_stop", "telemetry_gap")]
    through(core, steps(j, 40, start=40))  # NTP fixed: the offset falls back within the tolerance
    assert not core.monitor.clocks.skewed


def test_nothing_is_learned_where_the_ranks_do_not_leave_their_steps_together():
    j = job()
    recs = steps(j, 30, skew={"n3": 3.0}, spread=2.5)
    core = JobCore(j)
    found = through(core, recs)
    assert not [f for f in found if f.type == "clock_skew"] and not core.monitor.clocks.skewed


@pytest.mark.parametrize(("skew", "launched", "wrong"), [
    ({"n1": 30.0}, 0.0, ("n1", 30.0)),
    ({"n0": -30.0}, 0.0, ("n0", -30.0)),  # n0's steps end before the job began: n0 is wrong
    ({"n0": -30.0}, -100.0, ("n1", 30.0)),  # the job record, stamped 100 s earlier, cannot tell
], ids=["n1 ahead", "n0 behind", "n0 behind, launcher's clock behind both"])
def test_of_two_clocks_that_disagree_the_job_records_clock_tells_which_is_wrong(skew, launched, wrong):
    """Which of two clocks is wrong cannot be told from them alone: the job record's time (its launcher's clock)
    is a third opinion, since no step ends before its job began; where it cannot tell, the job's time is the clock
    behind (a record may come late, never early). Either way one node is corrected, and every decision taken in
    one frame."""
    j = dataclasses.replace(job(nodes=2), ts=T0 + launched)
    core = JobCore(j)
    found = through(core, steps(j, 30, skew=skew))
    [f] = [f for f in found if f.type == "clock_skew"]
    assert (f.node, f.evidence["offset_s"]) == (wrong[0], pytest.approx(wrong[1], abs=0.01))
    assert not [f for f in found if f.type in ("fail_stop", "telemetry_gap")]


@pytest.mark.parametrize("nodes", [8, 2])
def test_the_clock_learns_the_same_from_runs_as_from_records_and_restores_from_its_state(nodes):
    j = job(nodes=nodes, pp=2)
    skewed = "n2" if nodes > 2 else "n1"
    recs = steps(j, 25, skew={skewed: 20.0}) + [Heartbeat(ts=T0 + 40 + i, job="j", rank=i)
                                                for i in range(4 * nodes)]
    recs.sort(key=lambda r: r.ts)
    topo = Topology.from_job(j)
    a, b = ClockDetector(topo), ClockDetector(topo)
    from gangwatch.detectors.runs import RecordRun

    for r in recs:
        a.observe(r)
    for i in range(0, len(recs), 37):
        b.observe_run(RecordRun(recs[i:i + 37]))
    a.advance(T0 + 100), b.advance(T0 + 100)
    assert orjson.dumps(a.state()) == orjson.dumps(b.state()) and a.now() == b.now()
    again = ClockDetector.from_state(orjson.loads(orjson.dumps(a.state())), topo)
    assert orjson.dumps(again.state()) == orjson.dumps(a.state()) and again.skewed


def _scenario(*faults: Fault, **kw) -> list:
    sc = Scenario("s", 21, tp=8, pp=2, dp=4, duration_s=200.0, faults=faults, **kw)
    return [decode_obj(d) for d in generate(sc)]


def _replay(recs) -> tuple[list, list]:
    core, found, actions = Core(), [], []
    for r in recs:
        out = core.process(r)
        found += out.findings
        actions += out.actions
    out = core.finish()
    return found + out.findings, actions + out.actions


@pytest.mark.parametrize("offset", [30.0, -30.0, 300.0])
def test_a_healthy_node_whose_clock_is_off_costs_no_machine(offset):
    found, actions = _replay(_scenario(Fault("clock_skew", 20.0, node="n003", params={"offset_s": offset})))
    assert [(f.type, f.node) for f in found if f.type not in ("job_state", "hw_fault")] == [("clock_skew", "n003")]
    assert actions == []


@pytest.mark.parametrize("params", [{"lag_s": 20.0}, {"lag_s": 60.0}, {"flush_s": 40.0}])
def test_a_node_whose_records_arrive_late_is_one_telemetry_gap_never_a_death(params):
    found, actions = _replay(_scenario(Fault("late_delivery", 30.0, node="n005", params=params)))
    gaps = [f for f in found if f.type == "telemetry_gap"]
    assert [(f.node, f.evidence["cause"]) for f in gaps] == [("n005", "delivery lag")]
    lag = params.get("lag_s", params.get("flush_s"))
    assert gaps[0].evidence["lag_s"] <= lag + 5.0
    assert not [f for f in found if f.type in ("fail_stop", "silence_withdrawn", "hang")] and actions == []


def test_a_real_death_beside_a_skewed_clock_is_found_as_fast_and_only_the_dead_node_replaced():
    found, actions = _replay(_scenario(Fault("clock_skew", 0.0, node="n006", params={"offset_s": 30.0}),
                                       Fault("node_loss", 100.0, node="n002")))
    [stop] = [f for f in found if f.type == "fail_stop"]
    assert stop.node == "n002" and stop.ts - (T0 + 100.0) <= 2 * HB + 1.0
    assert [(a.type, a.nodes) for a in actions] == [("replace", ["n002"])]


@pytest.mark.parametrize(("dp", "basis"), [(4, "steps"), (1, "pair")])
def test_an_incident_names_the_clock_its_times_are_in(dp, basis):
    """An incident's record says what the job's time rests on and which node's times were corrected, by how much:
    read beside a node's own logs, its times can be put back on that node's clock."""
    sc = Scenario("s", 21, tp=8, pp=2, dp=dp, duration_s=200.0, faults=(
        Fault("clock_skew", 0.0, node="n001", params={"offset_s": 30.0}), Fault("node_loss", 100.0, node="n000")))
    core, incidents = Core(), []
    for d in generate(sc):
        incidents += core.process(decode_obj(d)).incidents
    incidents += core.finish().incidents
    assert incidents and all(set(i.extra["clock"]) == {"basis", "offsets_s"} for i in incidents)
    last = incidents[-1].extra["clock"]
    assert last["basis"] == basis
    if basis == "steps":  # learned from the steps' agreement: n001's records were read 30 s earlier than stamped
        assert set(last["offsets_s"]) == {"n001"} and abs(last["offsets_s"]["n001"] - 30.0) < 1.0
    one = Scenario("o", 21, tp=8, pp=1, dp=1, duration_s=120.0,
                   faults=(Fault("xid79", 60.0, node="n000", params={"gpu": 2}),))
    core = Core()
    got = [i for d in generate(one) for i in core.process(decode_obj(d)).incidents] + core.finish().incidents
    assert got and all(i.extra["clock"] == {"basis": "as stamped", "offsets_s": {}} for i in got)


def test_records_before_their_job_record_wait_for_it_and_only_what_never_gets_one_is_refused():
    j = job()
    early = [Heartbeat(ts=T0 + 1.0, job="j", rank=0), Heartbeat(ts=T0 + 1.5, job="x", rank=0)]
    core = Core()
    for r in early:
        assert core.process(r).rejected == []
    core.process(j)
    failstop = next(d for d in core.jobs["j"].monitor.detectors if d.name == "failstop")
    assert failstop.last_seen[0] == T0 + 1.0  # read once its job record came
    refused = core.finish().rejected
    assert [(e.kind, "no `job` record seen for job 'x'" in e.reason) for e in refused] == [("heartbeat", True)]


def test_replay_refuses_a_time_no_file_holds():
    from gangwatch.streams.replay import implausible_time

    (ok,) = decode(orjson.dumps({"kind": "heartbeat", "v": 1, "ts": T0, "job": "j", "rank": 0}))
    assert implausible_time(ok, T0 - 1) is None and implausible_time(ok, -math.inf) is None
    for ts, last, says in ((2.0 ** 70, -math.inf, "outside any plausible range"),
                           (T0 + 3 * 86_400, T0, "3.0 days after the file's previous record"),
                           (12.0, T0, "outside any plausible range")):
        (rec,) = decode(orjson.dumps({"kind": "heartbeat", "v": 1, "ts": ts, "job": "j", "rank": 0}))
        err = implausible_time(rec, last)
        assert isinstance(err, DecodeError) and says in err.reason
    (small,) = decode(orjson.dumps({"kind": "heartbeat", "v": 1, "ts": 12.0, "job": "j", "rank": 0}))
    assert implausible_time(small, 11.0) is None  # a file of made-up small times, as tests write


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9), st.integers(1, 70), st.integers(0, 2**32 - 1), st.floats(0.0, 1.0),
       st.sampled_from([1e-3, 1.0, 30.0, 1e9]))
def test_the_clock_s_row_medians_are_numpy_s_nanmedian(rows, cols, seed, holes, scale):
    """The job clock's offsets come from `nanmedian_rows`: the same floats as np.nanmedian, so a saved state and
    every finding come out as before (rows of NaN only, odd and even counts, repeated values, infinities). A
    zero's sign may differ where -0.0 and 0.0 tie in the sort: no offset or spread is ever a zero kept signed."""
    rnd = np.random.default_rng(seed)
    a = np.round(rnd.normal(0.0, scale, (rows, cols)), int(rnd.integers(0, 7)))  # rounding repeats values
    a[rnd.random(a.shape) < holes] = np.nan
    a[rnd.random(a.shape) < 0.02] = np.inf
    a[rnd.random(a.shape) < 0.02] = -np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy warns of all-NaN rows
        want = np.nanmedian(a, axis=1)
    got = nanmedian_rows(a)
    assert np.array_equal(got, want, equal_nan=True), (a, got, want)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.floats(-1e6, 1e6, allow_nan=False)), min_size=1, max_size=60))
def test_the_votes_are_each_node_s_median(pairs):
    """A node's vote (its ranks' median end time), for all nodes in one sort, is numpy's median of its own."""
    from gangwatch.detectors.clocks import _group_medians

    nodes = sorted({g for g, _ in pairs})
    group = np.array([nodes.index(g) for g, _ in pairs])
    x = np.array([v for _, v in pairs])
    want = [float(np.median(x[group == k])) for k in range(len(nodes))]
    assert _group_medians(group, x, len(nodes)).tolist() == want
