"""A worker group: a job on one worker, its nodes' events routed by another's router (`streams/marks.py`).

Live order, on one wall clock that runs with event time: the job's records reach its worker (B) as they are
sent; its nodes' events (`node-events`, partition 1) are read by worker A's router, which re-keys them onto
`by-job` and marks every tick how far it has read. A is killed; the Xid that explains a dying rank is sent
while nobody reads partition 1; after the group's rebalance B reads partition 1 itself and routes the Xid. B
must decide what replay decides (the same action, id included), which it can only do if it did not run the
job's time past the Xid while the partition was nobody's.
"""

from __future__ import annotations

import math

import orjson
import pytest
from gangwatch.schemas import decode
from gangwatch.streams.marks import Marks, decode_mark, encode_mark, is_mark
from gangwatch.streams.router import NodeRouter
from gangwatch.streams.runner import JobRunner, Msg

from tests.integration.kafkakit import T0, messages, scenario
from tests.unit.test_runner import Clock, T, by_topic, emitted, replay_core

pytestmark = pytest.mark.unit

KILL, REBALANCE = T0 + 29.0, T0 + 39.0  # A dies; the group gives partition 1 to B (its session timed out)


def dying_rank_with_xid(with_xid: bool = True) -> list:
    """Four nodes; rank 9 (n002) dies at 30.6 s, 0.1 s after its GPU's Xid 79; the gang stalls with it."""
    out = []
    for r in scenario(seconds=60, silent=None, xid_node="n002", xid_at=30.5):
        if r.kind == "hw" and not with_xid:
            continue
        if r.ts > T0 + 30.6 and (getattr(r, "rank", None) == 9 or r.kind == "step"):
            continue
        out.append(r)
    return out


def group_run(recs: list, *, marks: bool = True, kill: float = KILL) -> list:
    """B's outputs. `marks=False`: B waits for no other router (a worker before marks)."""
    clock = Clock()
    wall = lambda ts: 100.0 + (ts - T0)  # noqa: E731 - the wall clock runs with event time, from 100 s
    read_b: set[int] = set()
    b = JobRunner(T, clock=clock, node_partition=(lambda node: 1) if marks else None,
                  node_partitions_read=lambda: read_b)
    table: dict[bytes, bytes] = {}  # the node-job table (a changelog: whoever reads partition 1 has it)
    router_a, router_b = NodeRouter(T, table, clock=clock), NodeRouter(T, table, clock=clock)
    node_msgs = [m for m in messages(recs, T, batch=1) if m[0] == T.node_events]
    job_msgs = [m for m in messages(recs, T, batch=1) if m[0] != T.node_events]
    node_ts = [min(r.ts for r in decode(v)) for _, _, v in node_msgs]
    job_ts = [min(r.ts for r in decode(v)) for _, _, v in job_msgs]
    offsets = {"job": 0, "node": 0, "by_job": 0, "map": 0}
    to_b: list[Msg] = []  # by-job and node-job messages on their way
    maps: list[Msg] = []
    out: list = []
    j = n = 0

    def take(res) -> None:
        for s in res.sends:
            if s.topic == T.by_job:
                offsets["by_job"] += 1
                to_b.append(Msg(s.topic, 0, offsets["by_job"], s.key, s.value))
            elif s.topic == T.node_jobs:
                offsets["map"] += 1
                maps.append(Msg(s.topic, 1, offsets["map"], s.key, s.value))

    t = T0
    while t < T0 + 62:
        t += 0.5
        clock.now = wall(t)
        # what was sent by now reaches its readers
        batch = []
        while j < len(job_msgs) and job_ts[j] <= t:
            topic, key, value = job_msgs[j]
            batch.append(Msg(topic, 0, j, key, value))
            j += 1
        router = router_a if t < kill else router_b if t >= REBALANCE else None
        if t >= REBALANCE:
            read_b.add(1)
        if router is not None:
            got, maps[:] = list(maps), []
            while n < len(node_msgs) and node_ts[n] <= t:
                topic, key, value = node_msgs[n]
                got.append(Msg(topic, 1, n, key, value))
                n += 1
            take(router.on_batch(got))
        batch, to_b[:] = batch + to_b, []
        pending = (lambda: math.inf) if router is not router_b else \
            (lambda: router_b.node_events_pending_from([(T.node_events, 1)], lambda *_: False, b.by_job_read,
                                                       b.job_nodes, b.jobs))
        res = b.on_batch(batch, pending_from=pending) if batch else b.on_tick(pending_from=pending)
        take(res)
        out += emitted(res)
        if batch:
            tick = b.on_tick(pending_from=pending)
            take(tick)
            out += emitted(tick)
        if router is router_a:  # A's tick: its marks for the jobs of the nodes it reads
            take(router_a.marks([(T.node_events, 1)], lambda *_: False, lambda key: 1 if key[:1] == b"n" else 0))
    return by_topic(out)


def test_a_job_whose_node_events_another_worker_routes_waits_for_them_across_that_worker_s_death():
    recs = dying_rank_with_xid()
    want = replay_core(recs)
    assert ("action", "replace") in {(r.kind, getattr(r, "type", None)) for r in want}
    got = group_run(recs)
    assert [(r.kind, r.id) for r in got] == [(r.kind, r.id) for r in want]
    # without the marks, B ran the job past the Xid while partition 1 was nobody's: not replay's decision
    blind = group_run(recs, marks=False)
    assert [r.id for r in blind if r.kind == "action"] != [r.id for r in want if r.kind == "action"]


def test_a_worker_group_that_loses_no_worker_decides_as_replay_does():
    recs = dying_rank_with_xid()
    got = group_run(recs, kill=math.inf)
    assert [(r.kind, r.id) for r in got] == [(r.kind, r.id) for r in replay_core(recs)]


def test_a_mark_round_trips_and_nothing_else_is_one():
    pts = {3: 1234.5, 0: None}
    assert decode_mark(encode_mark(pts)) == pts and is_mark(encode_mark(pts))
    assert not is_mark(b'{"kind":"hw","v":1}') and not is_mark(None)
    with pytest.raises(ValueError):
        decode_mark(b'{"gangwatch_mark":1,"points":{"1":"soon"}}')


def test_marks_hold_a_job_at_its_start_its_point_its_reach_and_never_past_hold_s():
    m = Marks(stale_s=2.0, hold_s=30.0)
    assert m.point("j", [1], start=50.0, now=0.0) == 50.0  # never marked: from the job's start
    m.heard("j", {1: None, 2: 70.0}, reach=80.0, now=1.0)
    assert m.point("j", [1], 50.0, now=2.0) == 80.0  # caught up: up to what the job had read when it came
    assert m.point("j", [1, 2], 50.0, now=2.0) == 70.0  # a lagging router's point
    assert m.quiet("j", [1], now=2.0) and not m.quiet("j", [1, 2], now=2.0) and not m.quiet("j", [1], now=3.0)
    assert m.point("j", [1], 50.0, now=3.0 + 29.9) == 80.0  # its marks stopped: held where they left it ...
    assert m.point("j", [1], 50.0, now=3.0 + 30.0) == math.inf and m.given_up == 1  # ... hold_s past stale
    assert m.point("j", [1], 50.0, now=40.0) == math.inf and m.given_up == 1
    m.heard("j", {1: 90.0}, reach=95.0, now=41.0)  # it marks again
    assert m.point("j", [1], 50.0, now=41.5) == 90.0
    assert m.point("j", [3], 50.0, now=41.5) == 50.0 and m.point("j", [3], 50.0, now=71.5) == math.inf
    m.forget(["j"])
    assert m.point("j", [1], 50.0, now=72.0) == 50.0


def test_a_router_marks_each_job_of_its_partitions_caught_up_or_at_its_frontier():
    table: dict[bytes, bytes] = {}
    router = NodeRouter(T, table)
    router.on_batch([Msg(T.node_jobs, 1, 0, b"n1", orjson.dumps({"node": "n1", "job": "j1", "ts": T0})),
                     Msg(T.node_jobs, 2, 0, b"n2", orjson.dumps({"node": "n2", "job": "j1", "ts": T0})),
                     Msg(T.node_jobs, 3, 0, b"n3", orjson.dumps({"node": "n3", "job": "j2", "ts": T0}))])
    part = {b"n1": 1, b"n2": 2, b"n3": 3, b"j1": 0, b"j2": 0}.__getitem__
    res = router.marks([(T.node_events, 1), (T.node_events, 2)], lambda topic, p: p == 2, part)
    [mark] = res.sends  # j2's node is on a partition this router does not read
    assert (mark.topic, mark.key) == (T.by_job, b"j1") and decode_mark(mark.value) == {1: None, 2: T0}
    assert router.marks([], lambda *_: False, part).sends == []
    # a job this worker runs itself asks its router directly: no mark for it
    assert router.marks([(T.node_events, 1), (T.node_events, 2)], lambda *_: False, part, local={0}).sends == []
