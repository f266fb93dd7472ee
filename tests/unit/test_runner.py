"""The Faust worker's logic as plain functions: `JobRunner` and `NodeRouter` (no broker, no Faust)."""

from __future__ import annotations

import math
import random

import orjson
import pytest
from gangwatch.schemas import Gpu, Heartbeat, Hw, Job, Lifecycle, RankInfo, Step, decode, encode, encode_batch
from gangwatch.schemas.codec import decode_obj
from gangwatch.schemas.columns import StepRows
from gangwatch.schemas.topics import TopicSettings, topic_for
from gangwatch.streams.router import NodeRouter
from gangwatch.streams.runner import JobRunner, Msg
from gangwatch.triage.core import Core
from hypothesis import HealthCheck, Phase, assume, example, given, settings
from hypothesis import strategies as st

from gangwatch.evaluation.invariance import Job as InvJob
from gangwatch.evaluation.invariance import Perturbation
from gangwatch.evaluation.invariance import records as inv_records
from tests.integration.kafkakit import T0, messages, scenario

pytestmark = pytest.mark.unit

T = TopicSettings()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def as_msgs(triples, start=0) -> list[Msg]:
    return [Msg(topic, 0, start + i, key, value) for i, (topic, key, value) in enumerate(triples)]


def replay_core(recs) -> list:
    """Replay's findings, then its actions, then its incidents, each in the order it made them (the order on
    each topic; how the three topics interleave is no promise of the contract)."""
    core, out = Core(), []
    for rec in sorted(recs, key=lambda r: r.ts):
        o = core.process(rec)
        out += [*o.findings, *o.actions, *o.incidents]
    return by_topic(out)


def by_topic(recs: list) -> list:
    return [r for kind in ("finding", "action", "incident") for r in recs if r.kind == kind]


def emitted(res, t: TopicSettings = T) -> list:
    """What the runner published on the findings, actions and incidents topics, topic by topic, each in order."""
    return by_topic([decode(s.value)[0] for s in res.sends if s.topic in (t.findings, t.actions, t.incidents)])


def test_one_shuffled_batch_gives_what_replay_gives():
    recs = scenario(xid_node=None)
    msgs = as_msgs(messages(recs, T))
    random.Random(7).shuffle(msgs)  # topics interleave arbitrarily; the runner sorts by event time
    res = JobRunner(T).on_batch(msgs)
    got = emitted(res)
    want = replay_core(recs)
    assert got and sorted(got, key=lambda r: (r.kind, r.ts, r.id)) == sorted(want, key=lambda r: (r.kind, r.ts, r.id))
    assert [r for r in got if r.kind == "finding"] == [r for r in want if r.kind == "finding"]


def test_records_wait_for_their_job_record_then_run_in_event_time_order():
    recs = scenario(xid_node=None)
    msgs = messages(recs, T)
    job_msg = [m for m in msgs if m[0] == T.jobs]
    rest = [m for m in msgs if m[0] != T.jobs]
    runner = JobRunner(T)
    first = runner.on_batch(as_msgs(rest))  # telemetry before the topology: held, not rejected
    assert first.sends == [] and sum(it.n for st in runner.jobs.values() for it in st.pending) == len(recs) - 1
    second = runner.on_batch(as_msgs(job_msg, start=10_000))
    assert emitted(second) == replay_core(recs)
    nodes = sorted(orjson.loads(s.value)["node"] for s in second.sends if s.topic == T.node_jobs)
    assert nodes == ["n000", "n001", "n002", "n003"]
    assert second.dirty == {"j1"}


def test_records_whose_job_never_comes_go_to_the_dlq_after_the_hold():
    clock = Clock()
    runner = JobRunner(T, hold_s=5.0, clock=clock)
    hb = Heartbeat(ts=T0, job="ghost", rank=0)
    assert runner.on_batch([Msg(T.telemetry, 3, 42, b"ghost", encode(hb))]).sends == []
    assert runner.on_tick().sends == []
    clock.now += 5.0
    [dead] = runner.on_tick().sends
    d = orjson.loads(dead.value)
    assert dead.topic == T.dlq and (d["topic"], d["partition"], d["offset"]) == (T.telemetry, 3, 42)
    assert "ghost" in d["reason"] and d["kind"] == "heartbeat"


def test_the_wait_for_a_job_record_is_minutes_by_default_and_learns_from_the_longest_seen():
    """The controller's `start` came 30-50 s before rank 0's job record on a loaded host: held, not refused. A
    start that once took 400 s makes the next job's records wait at least twice that."""
    clock = Clock()
    runner = JobRunner(T, clock=clock)  # the default hold
    start = Lifecycle(ts=T0, job="j1", event="start", source="controller")
    runner.on_batch([Msg(T.jobs, 0, 1, b"j1", encode(start))])
    clock.now += 400.0
    assert runner.on_tick().sends == []  # still waiting
    job = Job(ts=T0 + 1, job="j1", ranks=[RankInfo(rank=0, node="n000", gpu=0)], heartbeat_s=5.0)
    res = runner.on_batch([Msg(T.jobs, 0, 2, b"j1", encode(job))])
    assert not [s for s in res.sends if s.topic == T.dlq] and runner.longest_wait == 400.0
    ghost = Heartbeat(ts=T0, job="ghost", rank=0)
    runner.on_batch([Msg(T.telemetry, 0, 3, b"ghost", encode(ghost))])
    clock.now += 700.0
    assert not [s for s in runner.on_tick().sends if s.topic == T.dlq]  # 700 s < twice the 400 s seen
    clock.now += 101.0
    assert [orjson.loads(s.value)["kind"] for s in runner.on_tick().sends if s.topic == T.dlq] == ["heartbeat"]


def test_garbage_goes_to_the_dlq_with_where_it_came_from():
    res = JobRunner(T).on_batch([Msg(T.telemetry, 2, 7, b"j1", b"\x00 not json")])
    [dead] = res.sends
    d = orjson.loads(dead.value)
    assert (dead.topic, d["source"], d["partition"], d["offset"]) == (T.dlq, T.telemetry, 2, 7) and d["reason"]


def test_silence_fires_missed_heartbeats_on_wall_time_only_when_caught_up():
    clock = Clock()
    recs = scenario(seconds=10, silent=None, xid_node=None)
    runner = JobRunner(T, clock=clock)
    assert emitted(runner.on_batch(as_msgs(messages(recs, T)))) == []
    clock.now += 60.0
    assert emitted(runner.on_tick(caught_up=lambda job: False)) == []  # a lagging consumer is not silence
    res = runner.on_tick()
    # the whole job fell silent after one step, every rank: its end, told as its life (to the store), no alarm
    assert [(f.type, f.evidence["state"]) for f in res.outputs.life] == [("silent_end", "finished")]
    assert emitted(res) == []
    quiet = JobRunner(T, clock=clock, silence=False)
    quiet.on_batch(as_msgs(messages(recs, T)))
    clock.now += 60.0
    assert emitted(quiet.on_tick()) == []


def test_state_survives_a_handover():
    recs = scenario(xid_node=None)
    msgs = as_msgs(messages(recs, T))
    cut = len(msgs) // 2
    a = JobRunner(T)
    out = emitted(a.on_batch(msgs[:cut]))
    saved = a.state_of("j1")
    assert a.drop_partitions({0}) == ["j1"] and a.cores == {}
    b = JobRunner(T, load=lambda job: saved if job == "j1" else None)  # restored on first use
    out += emitted(b.on_batch(msgs[cut:]))
    assert by_topic(out) == replay_core(recs)


def test_a_replayed_partition_is_skipped_not_observed_twice():
    recs = scenario()
    triples = messages(recs, T)
    # the router's output: the Xid keyed by job on by-job, published twice (a router replay)
    triples = [(T.by_job, b"j1", v) if topic == T.node_events else (topic, k, v) for topic, k, v in triples]
    xid_msg = next(v for topic, _, v in triples if topic == T.by_job)
    msgs = as_msgs(triples)
    cut = len(msgs) * 3 // 4
    a = JobRunner(T)
    out = emitted(a.on_batch(msgs[:cut]))
    saved = a.state_of("j1")
    b = JobRunner(T, load=lambda job: saved)
    again = msgs[:cut] + msgs[cut:] + [Msg(T.by_job, 0, 99_999, b"j1", xid_msg)]  # offsets committed late
    out += emitted(b.on_batch(again))
    assert by_topic(out) == replay_core(recs)
    assert b.duplicates == sum(len(decode(m.value)) for m in msgs[:cut]) + 1


def _backlog(recs, chunks: int) -> list[list[Msg]]:
    """The scenario as a consumer catching up sees it: the job record and a first chunk of telemetry, then every
    node event (re-keyed onto by-job, far ahead in event time: the router raced through its backlog), then the
    rest of the telemetry in `chunks` batches."""
    triples = [(T.by_job, b"j1", v) if topic == T.node_events else (topic, k, v) for topic, k, v in messages(recs, T)]
    jobs = as_msgs([t for t in triples if t[0] == T.jobs])
    nodes = as_msgs([t for t in triples if t[0] == T.by_job], start=500)
    telemetry = as_msgs([t for t in triples if t[0] == T.telemetry], start=1000)
    size = -(-len(telemetry) // (chunks + 1))
    parts = [telemetry[i:i + size] for i in range(0, len(telemetry), size)]
    return [jobs + parts[0], nodes, *parts[1:]]


def _node_events(recs):
    """GPU samples of every node every second, as an agent sends them."""
    extra = [Gpu(ts=T0 + k + 0.0003, node=f"n{i:03d}", gpu=0, temp_c=60.0) for k in range(1, 40) for i in range(4)]
    return sorted([*recs, *extra], key=lambda r: r.ts)


def test_a_backlog_gives_what_live_delivery_gives():
    """Node events read long before the telemetry of their time wait for it: the release point is the slowest
    input that still has data to read. Without that, the node events move the job's time far ahead of its
    heartbeats, and every node looks silent."""
    recs = _node_events(scenario(xid_node="n002"))
    want = replay_core(recs)
    batches = _backlog(recs, chunks=5)
    runner = JobRunner(T)
    left = [len(batches) - 2]  # telemetry batches still unread after the current one
    lagging = lambda topic, p: topic == T.telemetry and left[0] > 0  # noqa: E731
    out = emitted(runner.on_batch(batches[0], lagging)) + emitted(runner.on_batch(batches[1], lagging))
    assert sum(len(st.held) for st in runner.jobs.values()) > 100  # the node events wait
    for batch in batches[2:]:
        left[0] -= 1
        out += emitted(runner.on_batch(batch, lagging))
    assert by_topic(out) == want
    eager = JobRunner(T)
    wrong = by_topic([r for b in batches for r in emitted(eager.on_batch(b))])
    assert wrong != want and {f.type for f in wrong if f.kind == "finding"} - {f.type for f in want
                                                                               if f.kind == "finding"}


def _by_node(recs: list) -> list[tuple[str, bytes, bytes]]:
    """(topic, key, value) as node agents send them: consecutive records of one topic, key and node share an
    envelope (of 16 at most)."""
    node_of = {r.rank: r.node for job in recs if job.kind == "job" for r in job.ranks}
    out: list[tuple[str, bytes, bytes]] = []
    group: list = []
    where = None
    for rec in [*recs, None]:
        dest = None if rec is None else (*topic_for(rec, T), node_of.get(getattr(rec, "rank", None)))
        if group and (dest != where or len(group) >= 16):
            value = encode(group[0]) if len(group) == 1 else encode_batch(group, group[0].ts)
            out.append((where[0], where[1].encode(), value))
            group = []
        where = dest
        if rec is not None:
            group.append(rec)
    return out


def _outputs_keyed(outs: list, until: float = math.inf) -> tuple:
    """Outputs up to `until` as compared: actions by id, incidents (updated in place) by id, culprits and time,
    each in order; findings by type and node, in any order. (A finding's id may hash a record's time less its
    node's learned clock offset, whose last millisecond depends on which records fixed it; when a monitoring
    ticket such as `clock_skew` is said depends on when time moved.)"""
    outs = [o for o in by_topic(outs) if o.ts <= until]
    return (sorted((o.type, o.node or "") for o in outs if o.kind == "finding"),
            [o.id for o in outs if o.kind == "action"],
            [(o.id, tuple(o.culprit_nodes), round(o.ts, 6)) for o in outs if o.kind == "incident"])


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck),
          phases=(Phase.explicit, Phase.generate))
@given(nodes=st.sampled_from([2, 3, 8]), fault=st.sampled_from([None, "node_loss"]),
       seed=st.integers(1, 40), offset=st.tuples(st.sampled_from([-1.0, 1.0]), st.floats(3.0, 59.0)).map(
           lambda t: round(t[0] * t[1], 1)), at_s=st.sampled_from([0.0, 40.0, 100.0]),
       lag=st.sampled_from([None, T.telemetry, T.jobs, T.by_job]), batches=st.integers(0, 2**32),
       per_node=st.booleans())
@example(nodes=2, fault=None, seed=3, offset=59.5, at_s=40.0, lag=T.telemetry, batches=0, per_node=False)
@example(nodes=3, fault=None, seed=22, offset=-39.1, at_s=0.0, lag=T.telemetry, batches=38253, per_node=False)
def test_a_worker_reads_a_node_whose_clock_is_off_in_the_job_s_time_as_replay_does(nodes, fault, seed, offset,
                                                                                      at_s, lag, batches, per_node):
    """Issue 42/44: one node's clock off from the start or stepped mid-run, the job read by a worker in batches
    of any size with an input lagging, decides as replay of its arrival order: the same findings and actions
    (ids) and incident updates (times included). Held and ordered by stamped times, the node ahead came after its
    peers' records of the same moment: its records late, a delivery-lag ticket, an incident stamped apart.
    (Records read before the job's record are ordered by their stamped times: no clock of the job is known yet.
    The first batch here ends with the job record.) `per_node`: envelopes of one node's records, as node agents
    send them (cut where only their first records may go yet), else of the job's."""
    job = InvJob(nodes, fault, seed=seed, duration_s=200.0)
    assume(job.takes(Perturbation("arrival", offset, at_s)))
    recs = [decode_obj(m) for m in inv_records(job, Perturbation("arrival", offset, at_s))]
    core, want = Core(silence=False), []
    for rec in recs:  # replay, as the records arrived
        o = core.process(rec)
        want += [*o.findings, *o.actions, *o.incidents]
    jid = recs[0].job.encode()
    sent = _by_node(recs) if per_node else messages(recs, T)
    msgs = as_msgs([(T.by_job, jid, v) if topic == T.node_events else (topic, k, v)
                    for topic, k, v in sent])  # (node events: re-keyed by the router)
    runner, got, rnd = JobRunner(T, silence=False, max_future_s=1e12), [], random.Random(batches)
    i, n = 0, next(k for k, m in enumerate(msgs) if m.topic == T.jobs) + 1  # the first batch: to the job record
    while i < len(msgs):
        left = i + n < len(msgs)
        got += emitted(runner.on_batch(msgs[i:i + n], lambda topic, p, left=left: left and topic == lag))
        i, n = i + n, rnd.randint(1, 60)
    until = recs[-1].ts - 30.0  # (the end of the input is no silence: what is due there waits for more input)
    got, want = _outputs_keyed(got, until), _outputs_keyed(want, until)
    if at_s == 0.0 and lag is not None:
        # a clock off from the start, an input lagging at the job's start: its first records are read before any
        # clock of the job is known, in stamped order, and what the job learns from their rhythm (a hang's
        # threshold) and when it decides may differ; what it decides may not (a healthy node of three, 39 s
        # behind, was replaced: read early, it looked silent until the job's clock learned it)
        got, want = (got[1], [i[:2] for i in got[2]]), (want[1], [i[:2] for i in want[2]])
    assert got == want


def test_a_node_envelope_in_the_job_s_time_is_cut_at_the_release_point_by_that_time():
    """A node agent's envelope (16 steps, as columns) of a node whose clock stepped 30 s ahead, read while the
    `jobs` input lags at T0 + 40: its records (the job's times T0 + 12..27, stamped 30 s later) are all before
    the release point and go as one, a later record stays; judged by the stamped times, it was to be cut past its
    end (an empty tail: the batch failed)."""
    ranks = [RankInfo(rank=r, node=f"n{r}", gpu=0, tp=0, pp=0, dp=r) for r in range(2)]
    before = [Step(ts=T0 + k + 0.01 * r, job="j1", rank=r, step=k, step_s=1.0, mono=1000.0 + k + 0.01 * r)
              for k in range(1, 11) for r in range(2)]
    stepped = [Step(ts=T0 + 30 + k + 0.01, job="j1", rank=1, step=k, step_s=1.0, mono=1000.0 + k + 0.01)
               for k in range(11, 28)]  # (the first one shows the step: the envelope after it is in one frame)
    runner = JobRunner(T, silence=False)
    runner.on_batch(as_msgs([(T.jobs, b"j1", encode(Job(ts=T0, job="j1", heartbeat_s=1.0, ranks=ranks))),
                             (T.telemetry, b"j1", encode_batch(before, before[0].ts)),
                             (T.telemetry, b"j1", encode(stepped[0]))]))
    later = Step(ts=T0 + 45, job="j1", rank=0, step=45, step_s=1.0, mono=1045.0)  # past the point: held
    lagging = lambda topic, p: topic == T.jobs  # noqa: E731
    envelope = encode_batch(stepped[1:], stepped[1].ts)
    assert type(decode(envelope, columns=True, heartbeats=True)[0]) is StepRows  # (one item, as the worker reads it)
    runner.on_batch(as_msgs([(T.jobs, b"j2", encode(Lifecycle(ts=T0 + 40, job="j2", event="pause", rank=0))),
                             (T.telemetry, b"j1", envelope), (T.telemetry, b"j1", encode(later))], start=10), lagging)
    st = runner.jobs["j1"]
    assert [it.rec for it in st.held] == [later] and st.core.monitor.clocks.steps.kept() == {"n1": 30.0}


def _outage_run(signal_outage: bool) -> list:
    """A healthy job; the broker goes away at T0+20 for 30 s of event time. When it is back, the producers of
    n000-n001 resend their backlog at once and those of n002-n003 eight seconds later (their back-off), with
    silence ticks in between, as a live worker sees it."""
    clock = Clock()
    recs = scenario(seconds=60, silent=None, xid_node=None)
    before = [r for r in recs if r.ts <= T0 + 20]
    early = [r for r in recs if r.ts > T0 + 20 and getattr(r, "rank", 0) < 8]
    late = [r for r in recs if r.ts > T0 + 20 and getattr(r, "rank", 0) >= 8]
    runner = JobRunner(T, clock=clock, reconnect_s=15.0)
    out = emitted(runner.on_batch(as_msgs(messages(before, T))))
    for _ in range(60):  # 30 s of outage, ticked every 0.5 s
        clock.now += 0.5
        if signal_outage:
            runner.input_down()
        out += emitted(runner.on_tick())
    runner.input_up()
    out += emitted(runner.on_batch(as_msgs(messages(early, T), start=10_000)))
    for _ in range(16):
        clock.now += 0.5
        runner.input_up()
        out += emitted(runner.on_tick())
    out += emitted(runner.on_batch(as_msgs(messages(late, T), start=20_000)))
    for _ in range(20):
        clock.now += 0.5
        runner.input_up()
        out += emitted(runner.on_tick())
    return out


def test_producers_resending_after_a_broker_outage_at_different_times_raise_nothing():
    """While the path is down nothing is silent; after it answers again every producer's backlog is awaited
    (the reconnect grace) and then processed in event-time order: a healthy job stays healthy. Without the
    outage known, the same arrivals make the late producers' nodes look silent."""
    assert _outage_run(signal_outage=True) == []
    blind = _outage_run(signal_outage=False)
    assert {f.type for f in blind if f.kind == "finding"} & {"fail_stop", "monitoring_gap"}


def test_a_node_that_died_during_the_outage_is_found_once_the_grace_ends():
    clock = Clock()
    recs = scenario(seconds=60, silent="n003", silent_at=30.0, xid_node=None)
    runner = JobRunner(T, clock=clock, reconnect_s=15.0)
    runner.on_batch(as_msgs(messages([r for r in recs if r.ts <= T0 + 20], T)))
    runner.input_down()
    clock.now += 30.0
    runner.input_up()
    out = emitted(runner.on_batch(as_msgs(messages([r for r in recs if r.ts > T0 + 20], T), start=10_000)))
    assert out == []  # held: others may still be resending
    for _ in range(40):
        clock.now += 0.5
        runner.input_up()
        out += emitted(runner.on_tick())
    assert [(f.type, f.node) for f in out if f.kind == "finding" and f.type == "fail_stop"] == [("fail_stop", "n003")]


def test_a_sender_clock_hours_ahead_is_dead_lettered_not_allowed_to_carry_the_job_forward():
    """One rank's clock two hours fast: no clock at all, refused with its sender named, the job stays healthy;
    within the limit (an hour) it is processed, and one node's time does not carry the job's anyway."""
    recs = scenario(seconds=30, silent=None, xid_node=None)
    wall = lambda: T0 + 30.0  # noqa: E731 - a live worker: its clock is where the records are
    skewed = Heartbeat(ts=T0 + 7230.0, job="j1", rank=5)
    runner = JobRunner(T, wall=wall)
    res = runner.on_batch(as_msgs(messages([*recs, skewed], T)))
    assert emitted(res) == []
    [dead] = [orjson.loads(s.value) for s in res.sends if s.topic == T.dlq]
    assert dead["field"] == "ts" and "7200 s ahead" in dead["reason"] and "rank 5" in dead["reason"]
    assert res.dead["future", T.telemetry] == 1
    # and a worker that lets it through is not fooled either: one node's time does not move the job's (its clock)
    trusting = JobRunner(T, wall=wall, max_future_s=float("inf"))
    fooled = emitted(trusting.on_batch(as_msgs(messages([*recs, skewed], T))))
    assert not {f.type for f in fooled if f.kind == "finding"} & {"fail_stop", "monitoring_gap", "hang"}
    small = Heartbeat(ts=T0 + 330.0, job="j1", rank=5)  # 300 s fast: within max_future_s, processed
    res = JobRunner(T, wall=wall).on_batch(as_msgs(messages([*recs, small], T)))
    assert not [s for s in res.sends if s.topic == T.dlq]


def _worker_loop(msgs, *, read_back: bool) -> list:
    """The worker's two agents over a backlog: the jobs agent reads all it has each round; the router reads
    the node events and the node -> job map one round behind it, and what it re-keys comes back on by-job."""
    runner, router = JobRunner(T, silence=False), NodeRouter(T, {})
    node_q = [Msg(t, 0, i, k, v) for i, (t, k, v) in enumerate(msgs) if t == T.node_events]
    job_q = [Msg(t, 0, i, k, v) for i, (t, k, v) in enumerate(msgs) if t != T.node_events]
    lagging = lambda topic, p: topic == T.node_events and any(m.topic == T.node_events for m in node_q)  # noqa: E731
    pending_from = lambda: router.node_events_pending_from(  # noqa: E731
        [(T.node_events, 0)], lagging, *((runner.by_job_read, runner.job_nodes, runner.jobs) if read_back else ()))
    out, offset = [], 10**6
    for rnd in range(20):
        batch, job_q = job_q, []
        res = runner.on_batch(batch, pending_from=pending_from) if batch else runner.on_tick(pending_from=pending_from)
        for s in res.sends:
            offset += 1
            if s.topic in (T.node_jobs, T.node_events):
                node_q.append(Msg(s.topic, 0, offset, s.key, s.value))
        out += emitted(res)
        if rnd % 2 and node_q:
            batch, node_q = node_q, []
            for s in router.on_batch(batch).sends:
                offset += 1
                job_q.append(Msg(s.topic, 0, offset, s.key, s.value))
    return sorted((r.job, r.kind, r.type, r.ts) for r in out if r.kind in ("finding", "action"))


def test_a_node_event_on_its_way_through_the_router_holds_its_job_back():
    """Three jobs as a backlog; j2's Xid goes node-events -> router -> by-job while the jobs agent races through
    j2's telemetry. The router's events in flight (published, not yet read back) and those waiting for the map of
    a node in a job record already read hold the release point: replay's findings and actions. Without that, j2
    runs past its Xid and never replaces n012."""
    from tests.integration.test_parity import several_jobs

    msgs = messages(several_jobs(), T)
    want = sorted((r.job, r.kind, r.type, r.ts) for r in replay_core(several_jobs()) if r.kind in ("finding", "action"))
    assert _worker_loop(msgs, read_back=True) == want
    blind = _worker_loop(msgs, read_back=False)
    assert ("j2", "action", "replace") not in {t[:3] for t in blind}


def test_held_records_are_not_saved_as_done():
    """A worker that dies while records are held: its successor reads again from the resume point, processes what
    the saved state owes and skips what it processed."""
    recs = _node_events(scenario(xid_node="n002"))
    batches = _backlog(recs, chunks=4)
    a = JobRunner(T)
    lagging = lambda topic, p: topic == T.telemetry  # noqa: E731
    out = emitted(a.on_batch(batches[0], lagging)) + emitted(a.on_batch(batches[1], lagging))
    held = a.jobs["j1"].held
    assert held and any(it.msg.topic == T.by_job for it in held)
    saved = a.state_of("j1")
    a.saved("j1", saved)
    points = a.resume_points()
    assert points[(T.by_job, 0)] == min(it.msg.offset for it in held if it.msg.topic == T.by_job)
    b = JobRunner(T, load=lambda job: saved)
    read = batches[0] + batches[1]  # committed (acknowledged), but for the resume points
    again = [m for m in read if m.offset >= points.get((m.topic, m.partition), m.offset + 1)]
    out += emitted(b.on_batch(again + [m for batch in batches[2:] for m in batch]))  # what a successor reads
    assert by_topic(out) == replay_core(recs)
    assert b.records + a.records == len(recs)  # each record reached a core once


def _out_of_offset_order() -> list[Msg]:
    """One partition whose offset order is not event-time order: telemetry offset 0 is newer than offset 1,
    and a node event read on by-job sits between them."""
    job = messages(scenario(nodes=1, seconds=0, silent=None, xid_node=None), T)[0]
    return [Msg(job[0], 0, 0, job[1], job[2]),
            Msg(T.telemetry, 0, 0, b"j1", encode(Heartbeat(ts=T0 + 2.0, job="j1", rank=0))),
            Msg(T.telemetry, 0, 1, b"j1", encode(Heartbeat(ts=T0 + 1.0, job="j1", rank=1))),
            Msg(T.by_job, 0, 0, b"j1", encode(Gpu(ts=T0 + 1.5, node="n000", gpu=0, temp_c=60.0)))]


def test_records_released_out_of_offset_order_are_owed_by_position():
    """While by-job still has data to read, the telemetry at offset 0 (newer than by-job's frontier) is held and
    offset 1 is processed: the saved state owes offset 0 alone. A high-water mark could only say "from 0",
    and offset 1 would reach the core twice."""
    a = JobRunner(T)
    a.on_batch(_out_of_offset_order(), lagging=lambda topic, p: topic == T.by_job)
    assert [it.msg.offset for it in a.jobs["j1"].held] == [0] and a.records == 3  # job, offset 1, gpu
    saved = a.state_of("j1")
    a.saved("j1", saved)
    assert a.resume_points() == {(T.telemetry, 0): 0}
    b = JobRunner(T, load=lambda job: saved)
    b.on_batch(_out_of_offset_order()[1:3])  # the telemetry again, from the resume point
    assert (b.records, b.duplicates) == (1, 1)
    assert b.jobs["j1"].owed == {} and b.jobs["j1"].core.max_ts == T0 + 2.0


def test_resume_points_follow_what_the_broker_has_saved():
    """Until a state is confirmed saved, everything a job read is uncovered; then only what that state owes, plus
    what was read after it; a job that owes nothing holds no input back."""
    a = JobRunner(T)
    msgs = _out_of_offset_order()
    a.on_batch(msgs, lagging=lambda topic, p: topic == T.by_job)
    assert a.resume_points() == {(T.jobs, 0): 0, (T.telemetry, 0): 0, (T.by_job, 0): 0}  # nothing saved yet
    a.saved("j1", a.state_of("j1"))
    assert a.resume_points() == {(T.telemetry, 0): 0}
    a.on_batch([Msg(T.telemetry, 0, 2, b"j1", encode(Heartbeat(ts=T0 + 3.0, job="j1", rank=0)))])
    assert a.resume_points() == {(T.telemetry, 0): 0}  # released, but the saved state still owes offset 0
    a.saved("j1", a.state_of("j1"))
    assert a.resume_points() == {}
    a.on_batch([Msg(T.telemetry, 0, 3, b"j1", encode(Heartbeat(ts=T0 + 4.0, job="j1", rank=0)))])
    assert a.resume_points() == {(T.telemetry, 0): 3}  # read after the newest saved state


def test_a_skipped_copy_of_a_node_event_is_saved_past_so_the_commits_reach_it():
    """The router re-publishes a node event the job already processed (after a restart): the copy is skipped,
    but it moved by-job's offset, so the job counts as changed; once that state is saved, nothing is held back
    (else the commits stopped before the copy until the job's next record)."""
    a = JobRunner(T)
    a.on_batch(_out_of_offset_order())
    a.saved("j1", a.state_of("j1"))
    assert a.resume_points() == {}
    hw = encode(xid("n000", T0 + 1.6))
    assert a.on_batch([Msg(T.by_job, 0, 1, b"j1", hw)]).dirty == {"j1"}
    a.saved("j1", a.state_of("j1"))
    copy = a.on_batch([Msg(T.by_job, 0, 2, b"j1", hw)])
    assert (a.duplicates, copy.dirty, a.resume_points()) == (1, {"j1"}, {(T.by_job, 0): 2})
    a.saved("j1", a.state_of("j1"))
    assert a.resume_points() == {}


def test_records_waiting_for_their_job_record_are_owed_until_given_up():
    clock = Clock()
    a = JobRunner(T, hold_s=5.0, clock=clock)
    res = a.on_batch([Msg(T.telemetry, 1, 7, b"ghost", encode(Heartbeat(ts=T0, job="ghost", rank=0)))])
    assert res.dirty == set() and a.resume_points() == {(T.telemetry, 1): 7}
    saved = a.state_of("ghost")  # no core yet: only what it read and owes
    b = JobRunner(T, load=lambda job: saved)
    b.on_batch([Msg(T.telemetry, 1, 7, b"ghost", encode(Heartbeat(ts=T0, job="ghost", rank=0)))])
    assert len(b.jobs["ghost"].pending) == 1  # owed: waits again
    clock.now += 5.0
    gone = a.on_tick()
    assert gone.dirty == {"ghost"} and len(gone.rejects) == 1
    a.saved("ghost", a.state_of("ghost"))
    assert a.resume_points() == {}


def test_router_commits_stop_at_the_oldest_event_waiting_for_its_node():
    clock = Clock()
    router = NodeRouter(T, {}, hold_s=30.0, clock=clock)
    router.on_batch([Msg(T.node_events, 2, 5, b"n002", encode(xid("n002", T0 + 5))),
                     Msg(T.node_events, 2, 6, b"n003", encode(xid("n003", T0 + 6)))])
    assert router.resume_points() == {(T.node_events, 2): 5}
    router.on_batch([Msg(T.node_jobs, 0, 0, b"n002", orjson.dumps({"node": "n002", "job": "j1", "ts": T0}))])
    assert router.resume_points() == {(T.node_events, 2): 6}  # routed: on by-job now
    clock.now += 30.0
    router.on_tick()
    assert router.resume_points() == {}  # given up


def test_the_router_frontier_holds_back_by_job_until_the_router_has_read_its_inputs():
    router = NodeRouter(T, {})
    router.on_batch([Msg(T.node_events, 2, 0, b"n002", encode(xid("n002", T0 + 5)))])
    inputs = [(T.node_events, 2), (T.node_events, 3)]
    assert router.node_events_pending_from(inputs, lambda topic, p: p == 2) == T0 + 5
    # partition 3: nothing read yet
    assert router.node_events_pending_from(inputs, lambda topic, p: True) == float("-inf")
    assert router.node_events_pending_from(inputs, lambda topic, p: False) == float("inf")


# --- router -------------------------------------------------------------------------------


def xid(node: str, ts: float) -> Hw:
    return Hw(ts=ts, node=node, gpu=0, source="xid", code=79, message="Xid 79")


def mapping(node: str, job: str | None, ts: float, was: str | None = None) -> Msg:
    return Msg(T.node_jobs, 0, 0, node.encode(), orjson.dumps({"node": node, "job": job, "ts": ts, "was": was}))


def test_router_rekeys_node_events_by_job_and_holds_them_until_the_map_knows_the_node():
    table: dict[bytes, bytes] = {}
    router = NodeRouter(T, table)
    ev = xid("n002", T0 + 5)
    held = router.on_batch([Msg(T.node_events, 0, 0, b"n002", encode(ev))])
    assert held.sends == [] and "n002" in router.pending
    res = router.on_batch([mapping("n002", "j1", T0)])
    [sent] = res.sends
    assert (sent.topic, sent.key) == (T.by_job, b"j1") and decode(sent.value) == [ev]
    again = router.on_batch([Msg(T.node_events, 0, 1, b"n002", encode_batch([ev, ev], ev.ts))])
    assert [s.key for s in again.sends] == [b"j1"] and len(decode(again.sends[0].value)) == 2


def test_router_drops_events_older_than_the_job_and_forgets_nodes_the_job_released():
    table: dict[bytes, bytes] = {}
    router = NodeRouter(T, table, hold_s=1.0)
    router.on_batch([Msg(T.node_events, 0, 0, b"n1", encode(xid("n1", T0 - 1)))])
    assert router.on_batch([mapping("n1", "j1", T0)]).sends == [] and router.dropped == 1
    router.on_batch([mapping("n1", "j2", T0 + 10)])  # the node moved to j2 ...
    router.on_batch([mapping("n1", None, T0 + 11, was="j1")])  # ... so j1 letting it go changes nothing
    assert orjson.loads(table[b"n1"])["job"] == "j2"
    router.on_batch([mapping("n1", None, T0 + 12, was="j2")])
    assert b"n1" not in table


def test_topic_for_keys():
    recs = scenario(seconds=1)
    assert {topic_for(r, T) for r in recs if r.kind == "hw"} == {(T.node_events, "n002")}
    assert topic_for(recs[0], T) == (T.jobs, "j1")
    assert {topic_for(r, T)[0] for r in recs if r.kind in ("step", "heartbeat")} == {T.telemetry}


def test_a_node_agent_that_spoke_before_its_job_started_does_not_hold_the_job_record_back():
    """Node agents run before any job does: their events wait in the router for the map of their node, which
    the runner publishes when it processes the job record. Those older than the job record are not the job's
    and must not hold that record back (they did, in a fleet through a worker group: a job's start waited the
    router's hold_s, 30 s of wall, and its node's events meanwhile were dropped for want of a map)."""
    clock = Clock()
    runner, router = JobRunner(T, clock=clock, silence=False), NodeRouter(T, {}, clock=clock)
    early = [Gpu(ts=T0 - 10.0 + k, node="n002", gpu=0, temp_c=60.0) for k in range(5)]
    router.on_batch([Msg(T.node_events, 0, i, b"n002", encode(g)) for i, g in enumerate(early)])
    assert "n002" in router.pending

    def pending_from() -> float:
        return router.node_events_pending_from([(T.node_events, 0)], lambda *_: False, runner.by_job_read,
                                               runner.job_nodes, runner.jobs)

    first = [r for r in scenario(seconds=5, silent=None, xid_node=None)]
    res = runner.on_batch(as_msgs(messages(first, T)), pending_from=pending_from)
    assert "j1" in runner.cores and runner.records == len(first)
    maps = [s for s in res.sends if s.topic == T.node_jobs]
    assert {s.key for s in maps} == {f"n{i:03d}".encode() for i in range(4)}
    # and an event of the node after the start, still waiting for the map, does hold the job back
    router.on_batch([Msg(T.node_events, 0, 9, b"n002", encode(xid("n002", T0 + 6.0)))])
    assert pending_from() == T0 + 6.0
