"""The runner's columnar path: a batch envelope of steps and heartbeats of one job goes through `JobRunner` as one
`StepRows` item, and everything the runner does with it is what it does with the envelope's records one by one
(the record path: the same messages decoded record by record)."""

from __future__ import annotations

import math
import random
from collections import Counter

import orjson
import pytest
from gangwatch.detectors.runs import RecordRun
from gangwatch.schemas import DecodeError, Framework, Heartbeat, Job, RankInfo, Step, columns, decode, encode, to_dict
from gangwatch.schemas.columns import StepRows
from gangwatch.schemas.topics import TopicSettings, topic_for
from gangwatch.streams import runner as runner_module
from gangwatch.streams.runner import JobRunner, Msg
from gangwatch.triage.core import JobCore

from tests.unit.test_runpath import spoiled, view

pytestmark = pytest.mark.unit

T = TopicSettings()
T0 = 1_700_000_000.0
WALL = T0 + 1_000.0  # the workers' clock: records more than a minute past it are from the future
RANKS, PER_NODE = 48, 16


def job_record() -> Job:
    return Job(ts=T0, job="j1", heartbeat_s=1.0, ranks=[RankInfo(rank=r, node=f"n{r // PER_NODE}", gpu=r % PER_NODE)
                                                        for r in range(RANKS)])


def envelope(recs: list, offset: int, topic: str = T.telemetry) -> Msg:
    return Msg(topic, 0, offset, b"j1", orjson.dumps({"kind": "batch", "v": 1, "ts": T0, "items": recs}))


def node_items(node: int, k: int, t: float, rnd: random.Random, *, slow: bool = False) -> list[dict]:
    """One node's report of step `k`: a step and a heartbeat per rank, times spread by `rnd`."""
    items = []
    for r in range(node * PER_NODE, (node + 1) * PER_NODE):
        ts = round(t + rnd.uniform(0, 0.05), 6)
        compute = 0.9 if slow and r == node * PER_NODE else 0.6
        items.append(to_dict(Step(ts=ts, job="j1", rank=r, step=k, step_s=1.0, compute_s=compute, comm_wait_s=0.35,
                                  data_wait_s=0.01)))
        items.append(to_dict(Heartbeat(ts=round(ts + 0.0001, 6), job="j1", rank=r, step=k)))
    return items


def stream(seed: int) -> list[Msg]:
    """A job's telemetry as node sidecars send it, with what a live stream has: envelopes in event-time order or
    not, whose time spans are apart or overlap, a bad item now and then, a clock hours ahead, a node that falls
    silent, a slow rank, a crash reported on its own, a stall (heartbeats only: the ranks live on them), and the
    job record after some of its telemetry."""
    rnd = random.Random(seed)
    msgs: list[Msg] = []
    offsets: Counter[str] = Counter()

    def add(topic: str, make) -> None:
        msgs.append(make(offsets[topic]))
        offsets[topic] += 1

    job_at = rnd.randrange(1, 8)
    for k in range(1, 40):
        t = T0 + k
        if k == job_at:
            add(T.jobs, lambda o: Msg(T.jobs, 0, o, b"j1", encode(job_record())))
        for node in range(RANKS // PER_NODE):
            if node == 2 and k > 25:
                continue  # falls silent
            items = node_items(node, k, t + rnd.choice([0.0, 0.02, 0.1, 0.3]) * node, rnd, slow=node == 1 and k > 10)
            if k > 31:  # the collective stalls
                items = [{**i, "step": 31} for i in items if i["kind"] == "heartbeat"]
            if rnd.random() < 0.6:
                items.sort(key=lambda i: i["ts"])  # in event-time order (else: as the ranks reported)
            if rnd.random() < 0.05:
                items[rnd.randrange(len(items))] = spoiled(items[0], rnd)
            if rnd.random() < 0.02:
                items[-1] = {**items[-1], "ts": WALL + 7200.0}  # a clock two hours ahead: no clock at all
            cut = rnd.choice([len(items), len(items), len(items) // 2, 1])
            for part in (items[:cut], items[cut:]):
                if part:
                    add(T.telemetry, lambda o, part=part: envelope(part, o))
        if k == 30:
            crash = Framework(ts=t + 0.5, job="j1", rank=3, type="exception", message="CUDA error")
            add(topic_for(crash, T)[0], lambda o, crash=crash: Msg(topic_for(crash, T)[0], 0, o, b"j1", encode(crash)))
    return msgs


@pytest.fixture
def by_records(monkeypatch):
    """Call `fn` with the runner decoding every message record by record: the path the columns must match."""

    def call(fn, *args, **kw):
        with monkeypatch.context() as m:
            m.setattr(runner_module, "decode", lambda value, **_: decode(value))
            return fn(*args, **kw)

    return call


def outcome(res) -> tuple:
    return ([(s.topic, s.key, s.value) for s in res.sends], view(res.outputs), sorted(res.dirty), res.kinds,
            res.duplicates, res.dead, [encode(r) for r in res.records])


def runner(**kw) -> JobRunner:
    return JobRunner(T, silence=False, wall=lambda: WALL, keep_records=True, **kw)


@pytest.mark.parametrize("seed", range(8))
def test_envelopes_as_columns_give_what_their_records_give(seed, by_records):
    rnd = random.Random(seed)
    msgs = stream(seed)
    got, want = runner(), runner()
    frontier = T0
    i = held_columns = 0
    while i < len(msgs):
        batch = msgs[i:i + rnd.choice([1, 3, 10, 40])]
        i += len(batch)
        frontier = max(frontier, *(r.ts for m in batch for r in decode(m.value)
                                   if type(r) is not DecodeError and r.ts < WALL))
        point = frontier - rnd.choice([0.0, 0.02, 0.3, 2.0]) if i < len(msgs) else float("inf")
        pending_from = lambda point=point: point  # noqa: E731 - the router holds the job back this far
        a = got.on_batch(batch, pending_from=pending_from)
        b = by_records(want.on_batch, batch, pending_from=pending_from)
        assert outcome(a) == outcome(b)
        held_columns += sum(type(it.rec) is StepRows for st in got.jobs.values() for it in st.held)
        assert got.jobs["j1"].unprocessed() == want.jobs["j1"].unprocessed()
        if rnd.random() < 0.3:
            assert outcome(got.on_tick(pending_from=pending_from)) == \
                   outcome(by_records(want.on_tick, pending_from=pending_from))
    assert got.records == want.records and got.state_of("j1") == want.state_of("j1")
    assert view(want.cores["j1"].finish(frontier)) == view(got.cores["j1"].finish(frontier))
    assert held_columns, "some envelopes were held as columns"


def test_the_stream_finds_and_rejects_what_it_should(by_records):
    """The random streams above are worth comparing: they make findings and dead letters."""
    r = runner()
    sends = [s for m in stream(0) for s in by_records(r.on_batch, [m]).sends]
    assert {s.topic for s in sends} >= {T.findings, T.dlq}


def sixteen_ranks(offset: int) -> Msg:
    """One envelope, steps and heartbeats of 16 ranks at 16 distinct times, in order."""
    items = [to_dict(rec) for r in range(16) for rec in (
        Step(ts=T0 + 1 + r * 0.01, job="j1", rank=r, step=1, step_s=1.0),
        Heartbeat(ts=T0 + 1 + r * 0.01 + 0.001, job="j1", rank=r, step=1))]
    return envelope(items, offset)


def test_an_envelope_is_cut_where_only_part_of_it_may_go(by_records):
    job = Msg(T.jobs, 0, 0, b"j1", encode(job_record()))
    got, want = runner(), runner()
    point = T0 + 1.075  # ranks 0-7 and their heartbeats may go
    a = got.on_batch([job, sixteen_ranks(0)], pending_from=lambda: point)
    b = by_records(want.on_batch, [job, sixteen_ranks(0)], pending_from=lambda: point)
    assert outcome(a) == outcome(b)
    held = got.jobs["j1"].held
    assert len(held) == 1 and type(held[0].rec) is StepRows and (held[0].idx, held[0].n) == (16, 16)
    assert got.records == 1 + 16
    assert got.jobs["j1"].unprocessed() == {f"{T.telemetry}:0": {(0, i) for i in range(16, 32)}}
    assert got.jobs["j1"].unprocessed() == want.jobs["j1"].unprocessed()
    assert outcome(got.on_tick()) == outcome(by_records(want.on_tick))
    assert got.records == 33 and got.jobs["j1"].held == [] and got.state_of("j1") == want.state_of("j1")


def test_a_bad_item_is_dead_lettered_and_the_rest_go_on():
    items = orjson.loads(sixteen_ranks(0).value)["items"]
    items[5] = {**items[5], "rank": -1}
    r = runner()
    res = r.on_batch([Msg(T.jobs, 0, 0, b"j1", encode(job_record())), envelope(items, 0)])
    dead = [s for s in res.sends if s.topic == T.dlq]
    assert len(dead) == 1 and orjson.loads(dead[0].value)["field"] == "items[5].rank"
    assert r.records == 1 + 31 and res.kinds == {"job": 1, "step": 16, "heartbeat": 15}


@pytest.mark.parametrize("shuffled", [False, True])
def test_an_envelope_read_again_processes_only_what_the_saved_state_owes(by_records, shuffled):
    """A worker saves its state while part of an envelope is held, and dies; its successor reads the envelope
    again: the part processed is skipped, the part owed goes to the core, as the record path does (an envelope
    not in time order too: its records' places in the message are what is owed)."""
    job = Msg(T.jobs, 0, 0, b"j1", encode(job_record()))
    items = orjson.loads(sixteen_ranks(0).value)["items"]
    if shuffled:
        random.Random(1).shuffle(items)
    later = envelope([to_dict(Heartbeat(ts=T0 + 3, job="j1", rank=r, step=1)) for r in range(16)], 1)
    runs = {}
    for name, call in (("columns", lambda fn, *a, **k: fn(*a, **k)), ("records", by_records)):
        a = runner()
        call(a.on_batch, [job, envelope(items, 0)], pending_from=lambda: T0 + 1.075)
        saved = a.state_of("j1")
        b = runner(load=lambda j, saved=saved: saved)
        res = call(b.on_batch, [envelope(items, 0), later])
        runs[name] = (outcome(res), b.records, b.duplicates, b.state_of("j1"))
        assert (a.records, b.records, b.duplicates) == (17, 16 + 16, 16)
    assert runs["columns"] == runs["records"]


def fed_to_core(monkeypatch, call):
    """(what `call()` returns, the pieces it handed to `JobCore.process_many`: records and `StepRows`)."""
    pieces = []
    take = JobCore.process_many

    def seen(core, recs, out=None):
        pieces.extend(recs)
        return take(core, recs, out)

    with monkeypatch.context() as m:
        m.setattr(JobCore, "process_many", seen)
        return call(), pieces


@pytest.mark.parametrize("point", [math.inf, T0 + 1.08])
def test_envelopes_whose_times_overlap_go_to_the_core_in_event_time_order(by_records, monkeypatch, point):
    """Envelopes whose time spans interleave: when all of them can go, the core gets them as one `StepRows` in
    event-time order; when only part can, record by record (what is held keeps each record's place)."""
    job = Msg(T.jobs, 0, 0, b"j1", encode(job_record()))
    first = sixteen_ranks(1)
    items = orjson.loads(first.value)["items"]
    second = envelope([{**i, "ts": i["ts"] + 0.005} for i in items], 2)  # interleaves with the first
    got, want = runner(), runner()
    assert outcome(got.on_batch([job], pending_from=lambda: point)) == \
           outcome(by_records(want.on_batch, [job], pending_from=lambda: point))
    a, pieces = fed_to_core(monkeypatch, lambda: got.on_batch([first, second], pending_from=lambda: point))
    assert outcome(a) == outcome(by_records(want.on_batch, [first, second], pending_from=lambda: point))
    assert got.state_of("j1") == want.state_of("j1")
    if point == math.inf:
        assert [(type(p), len(p)) for p in pieces] == [(StepRows, 64)]
    else:
        assert pieces and all(type(p) is not StepRows for p in pieces) and got.jobs["j1"].held
        assert got.jobs["j1"].unprocessed() == want.jobs["j1"].unprocessed()


@pytest.mark.parametrize("point", [math.inf, T0 + 1.08])
def test_an_envelope_not_in_event_time_order_is_sorted_and_keeps_its_places(by_records, monkeypatch, point):
    """A node's ranks report in their own order: the envelope is sorted by time as one item of columns that keeps
    each record's place in the message (what is held and owed says so); what can go reaches the core as columns."""
    job = Msg(T.jobs, 0, 0, b"j1", encode(job_record()))
    items = orjson.loads(sixteen_ranks(1).value)["items"]
    random.Random(3).shuffle(items)
    shuffled = envelope(items, 1)
    got, want = runner(), runner()
    assert outcome(got.on_batch([job])) == outcome(by_records(want.on_batch, [job]))
    a, pieces = fed_to_core(monkeypatch, lambda: got.on_batch([shuffled], pending_from=lambda: point))
    assert outcome(a) == outcome(by_records(want.on_batch, [shuffled], pending_from=lambda: point))
    assert got.jobs["j1"].unprocessed() == want.jobs["j1"].unprocessed()
    if point == math.inf:
        assert [(type(p), len(p)) for p in pieces] == [(StepRows, 32)]
    else:
        held = got.jobs["j1"].held
        assert held and sum(it.n for it in held) + sum(map(len, pieces)) == 32
        assert all(type(p) is StepRows for p in pieces) and type(held[0].rec) is StepRows
        assert outcome(got.on_tick()) == outcome(by_records(want.on_tick))
    assert got.state_of("j1") == want.state_of("j1")


@pytest.mark.parametrize("seed", range(4))
def test_merged_rows_are_their_records_in_time_order(seed):
    """`StepRows.merged`: the parts' records, one part after the other, sorted by time (ties kept in that
    order), whether the parts hold steps only, heartbeats too, or heartbeats only."""
    rnd = random.Random(seed)
    parts = []
    for _ in range(rnd.randrange(2, 7)):
        items = []
        t = T0 + rnd.choice([0.0, 0.01, 0.5])
        for r in range(rnd.choice([16, 20, 33])):
            t += rnd.choice([0.0, 0.0, 0.01, 0.03])  # equal times within a part and across parts
            kind = rnd.choice(["step", "beat", "both"]) if rnd.random() < 0.7 else "step"
            if kind in ("step", "both"):
                items.append(to_dict(Step(ts=round(t, 6), job="j1", rank=r, step=2, step_s=1.0, loss=rnd.random())))
            if kind in ("beat", "both"):
                items.append(to_dict(Heartbeat(ts=round(t, 6), job="j1", rank=r, step=2)))
        (rows,) = decode(orjson.dumps({"kind": "batch", "v": 1, "items": items}), columns=True, heartbeats=True)
        assert type(rows) is StepRows
        parts.append(rows)
    merged = StepRows.merged(parts)
    want = sorted((r for p in parts for r in p.records()), key=lambda r: r.ts)
    assert merged.records() == want and [merged.record(i) for i in range(len(merged))] == want
    assert list(merged.ts) == [r.ts for r in want] and merged.counts() == Counter(r.kind for r in want)
    head, tail = merged.split(rnd.randrange(len(want) + 1))
    assert head.records() + tail.records() == want


def mixed_items(rnd: random.Random) -> list[dict]:
    """Steps and heartbeats of one job, as the record path must also see them: some spoiled, some fields left
    out, some heartbeats without a step."""
    items = []
    for r in range(rnd.choice([1, 2, 5, 9])):
        step = to_dict(Step(ts=T0 + r, job="j1", rank=r, step=3, step_s=1.0, compute_s=0.5, loss=1.5))
        beat = to_dict(Heartbeat(ts=T0 + r + 0.5, job="j1", rank=r, step=3 if rnd.random() < 0.7 else None))
        items += rnd.sample([step, beat], 2) if rnd.random() < 0.8 else [step]
    for j in range(len(items)):
        if rnd.random() < 0.1:
            items[j] = spoiled(items[j], rnd) if items[j]["kind"] == "step" and rnd.random() < 0.5 else \
                spoiled_any(items[j], rnd)
        if rnd.random() < 0.1 and type(items[j]) is dict:
            items[j].pop(rnd.choice(["compute_s", "loss", "step"]), None)
    return items


def spoiled_any(item: dict, rnd: random.Random) -> dict:
    """A step or heartbeat item changed in one way the columns must not take as it stands."""
    how = rnd.randrange(14)
    if how == 0:
        return [item]  # not an object
    if how == 1:  # as many fields, one of them unknown
        return {**{k: v for k, v in item.items() if k != "job"}, "note": "j1"}
    key, value = [("v", True), ("v", 1.0), ("ts", 5), ("ts", "1"), ("job", 7), ("job", ""), ("rank", 2.0),
                  ("rank", -1), ("step", -2), ("kind", "gpu"), ("note", 1), ("ts", None)][how - 2]
    return {**item, key: value}


def test_steps_and_heartbeats_as_columns_are_the_records_the_record_path_gives(monkeypatch):
    monkeypatch.setattr(columns, "MIN_MIXED", 1)  # small batches too: more ways to differ
    rnd = random.Random(5)
    seen = {"columns": 0, "records": 0}
    for _ in range(500):
        msg = orjson.dumps({"kind": "batch", "v": 1, "ts": 1.0, "items": mixed_items(rnd)})
        want, got = decode(msg), decode(msg, columns=True, heartbeats=True)
        if len(got) == 1 and type(got[0]) is StepRows:
            seen["columns"] += 1
            rows = got[0]
            assert rows.records() == want and [encode(r) for r in rows.records()] == [encode(r) for r in want]
            assert [rows.record(i) for i in range(len(rows))] == want and list(rows.ts) == [r.ts for r in want]
            k = rnd.randrange(len(rows) + 1)
            head, tail = rows.split(k)
            assert head.records() + tail.records() == want and len(head) == k
        else:
            seen["records"] += 1
            assert [v.to_dict() if type(v) is DecodeError else encode(v) for v in got] == \
                   [v.to_dict() if type(v) is DecodeError else encode(v) for v in want]
    assert min(seen.values()) > 100, seen


@pytest.mark.parametrize("seed", range(3))
def test_a_job_core_takes_steps_and_heartbeats_as_columns(seed):
    """What the core makes of envelopes of steps and heartbeats as columns is what it makes of their records
    (fail-stop reads the heartbeats' columns, a node falls silent, a crash goes record by record)."""
    rnd = random.Random(seed)
    pieces: list = []
    for m in stream(seed):
        pieces += [v for v in decode(m.value, columns=True, heartbeats=True) if type(v) is not DecodeError]
    rows = [type(p) is StepRows for p in pieces]
    pieces = [p for p, r in zip(pieces, rows, strict=True) if (max(p.ts) if r else p.ts) < WALL
              and (r or p.kind != "job")]  # the core's own job record; no clock an hour ahead
    recs = [r for p in pieces for r in (p.records() if type(p) is StepRows else (p,))]
    assert sum(type(p) is StepRows and p.beats is not None for p in pieces) > 20
    a, b = JobCore(job_record()), JobCore(job_record())
    want, got = a.process_many([]), b.process_many([])
    for r in recs:
        a.process(r, want)
    i = 0
    while i < len(pieces):
        n = rnd.choice([1, 4, 30])
        b.process_many(pieces[i:i + n], got)
        i += n
    a.finish(a.max_ts, want)
    b.finish(b.max_ts, got)
    assert want.findings and view(want) == view(got) and a.state() == b.state()


@pytest.mark.parametrize("step", [None, 0])
def test_heartbeats_as_columns_end_start_up_as_their_records_do(step):
    """A heartbeat that names its rank's last step ends the job's start-up, read from the columns too."""
    beats = [to_dict(Heartbeat(ts=T0 + 1 + r * 0.01, job="j1", rank=r, step=step)) for r in range(RANKS)]
    (rows,) = decode(orjson.dumps({"kind": "batch", "v": 1, "items": beats}), columns=True, heartbeats=True)
    assert type(rows) is StepRows
    a, b = JobCore(job_record()), JobCore(job_record())
    for rec in rows.records():
        a.process(rec)
    b.process_many([rows])
    assert a.state() == b.state()
    assert next(d for d in b.monitor.detectors if d.name == "failstop").stepped is (step is not None)


def test_a_run_reads_a_field_of_its_steps_or_heartbeats_from_columns_and_records_alike():
    items = orjson.loads(sixteen_ranks(0).value)["items"]
    (rows,) = decode(orjson.dumps({"kind": "batch", "v": 1, "items": items[:-3]}), columns=True, heartbeats=True)
    alone = decode(encode(Heartbeat(ts=T0 + 2, job="j1", rank=4, step=None)))[0]
    recs = [*rows.records(), alone, *rows.records()]
    run, plain = RecordRun([rows, alone, rows]), RecordRun(recs)
    for kind in ("step", "heartbeat"):
        for name in ("rank", "ts", "step"):
            want = [getattr(r, name) for r in recs if r.kind == kind]
            assert run.lists(kind, name) == plain.lists(kind, name) == want
    assert run.by_kind == plain.by_kind and [run.record(i) for i in range(len(recs))] == recs


def test_past_the_memory_bound_columns_go_as_their_records_would(by_records, monkeypatch):
    """Records waiting for their job record, then held behind a slow input, past `MAX_PENDING`: the oldest are
    dead-lettered, then processed ahead of their inputs, envelopes cut where the bound falls."""
    monkeypatch.setattr(runner_module, "MAX_PENDING", 37)

    def later(offset: int) -> Msg:  # the envelope of `sixteen_ranks`, `offset` seconds on
        items = orjson.loads(sixteen_ranks(0).value)["items"]
        return envelope([{**i, "ts": i["ts"] + offset} for i in items], offset)

    job = Msg(T.jobs, 0, 0, b"j1", encode(job_record()))
    got, want = runner(), runner()
    never = lambda: -math.inf  # noqa: E731 - the router holds every job back
    for batch in ([later(0), later(1)], [later(2)], [job, later(3)], [later(4), later(5)]):
        assert outcome(got.on_batch(batch, pending_from=never)) == \
               outcome(by_records(want.on_batch, batch, pending_from=never))
        assert got.jobs["j1"].unprocessed() == want.jobs["j1"].unprocessed()
        assert all(type(it.rec) is StepRows for it in got.jobs["j1"].held + got.jobs["j1"].pending)
    assert [it.n for it in got.jobs["j1"].held] == [5, 32] and got.state_of("j1") == want.state_of("j1")


def test_a_small_batch_of_steps_and_heartbeats_comes_as_records():
    """Columns pay for themselves over many items only: fewer than `MIN_MIXED` come as records."""
    items = orjson.loads(sixteen_ranks(0).value)["items"]
    small = orjson.dumps({"kind": "batch", "v": 1, "items": items[:columns.MIN_MIXED - 1]})
    assert decode(small, columns=True, heartbeats=True) == decode(small)
    enough = orjson.dumps({"kind": "batch", "v": 1, "items": items[:columns.MIN_MIXED]})
    assert [type(v) for v in decode(enough, columns=True, heartbeats=True)] == [StepRows]
