"""The Faust worker's logic without Faust: batches of Kafka messages in, messages to publish out.

`streams.worker` only connects Faust to `JobRunner` here and `NodeRouter`
(streams/router.py), so everything that decides what happens to a record can be
tested as plain functions (Faust's `take()` cannot be exercised through its
test context).

- `JobRunner` (the main agent): messages of the job-keyed input topics (plus
  node events already re-keyed by job) -> one `JobCore` per job, driven on event
  time -> findings / actions / incidents keyed by job, rejects to the DLQ, the
  node -> job map to `node-jobs`, and the jobs whose state must be saved.
  Within a batch the records of a job are processed in event-time order (stable:
  arrival order breaks ties), the order replay uses. A batch envelope of steps and
  heartbeats of one job in event-time order (a node sidecar's) travels as one
  `StepRows` (columns, no record object per item) as long as no other record of
  the job falls inside its time span (else it is taken apart), and is cut where
  only its first part may go yet. Records of a job whose `job` record has not
  arrived yet wait for it (it travels on another topic: the controller's `start`
  before rank 0's job record on a loaded host) up to `hold_s` (wall; 600 s by
  default, a start-up at scale takes minutes), or twice the longest wait seen so
  far when that is longer; then they are processed exactly as replay would
  (those older than the topology are rejected by the core), or rejected when it
  never comes.

Node events of a job's nodes that another worker's router reads arrive with that
router's marks (`streams/marks.py`): the job runs no further than they say.

What the runner holds for each job (`JobState`) and how it is saved and restored
(`pack_state`, `unpack_state`) live in `streams.jobstate`.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import time
from collections import Counter
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import NamedTuple

import orjson
from gangwatch.schemas import DeadLetter, DecodeError, Outputs, Record, decode, encode
from gangwatch.schemas.columns import StepRows
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.items import (
    SEQ,
    TS,
    Item,
    Msg,
    N,
    cut,
    in_order,
    is_job,
    item_of,
    keyed,
    last_of,
    one_by_one,
    ts_at,
)
from gangwatch.streams.jobstate import JobState, Taken, cover_of, pack_state, take_state, unpack_state
from gangwatch.streams.marks import Marks, decode_mark, is_mark
from gangwatch.triage.budgets import CoreConfig
from gangwatch.triage.core import JobCore

_NODE_KINDS = frozenset({"hw", "gpu"})
MAX_PENDING = 200_000  # records held per job (or node) waiting for their job record (or mapping)


class Send(NamedTuple):
    """One message to publish."""

    topic: str
    key: bytes
    value: bytes
    action_id: str | None = None  # an action: signed with this id as the key when the worker has the secret


@dataclass
class Result:
    """What one batch (or one tick) produced."""

    sends: list[Send] = field(default_factory=list)
    outputs: Outputs = field(default_factory=Outputs)  # for sinks
    rejects: list[DeadLetter] = field(default_factory=list)  # for sinks
    records: list[Record] = field(default_factory=list)  # inputs processed (for telemetry sinks)
    dirty: set[str] = field(default_factory=set)  # jobs whose state changed
    dropped: int = 0  # node events dropped for want of a job
    # counts for the self-metrics (streams/metrics.py)
    kinds: Counter[str] = field(default_factory=Counter)  # input records handed to a core, by kind
    duplicates: int = 0  # replayed records skipped (the job's state already held them)
    dead: Counter[tuple[str, str]] = field(default_factory=Counter)  # (cause, input topic) -> messages to the DLQ


def dead_letter(err: DecodeError, msg: Msg, ts: float | None = None) -> DeadLetter:
    """The dead letter of a message: why, and exactly where the message came from."""
    return DeadLetter.of(err, msg.topic, topic=msg.topic, partition=msg.partition, offset=msg.offset,
                         ts=msg.timestamp if ts is None else ts)


SEEN_S = 600.0  # event-time horizon of node-event de-duplication
_DEDUP_KINDS = frozenset({"hw", "ops"})  # gpu samples are periodic and many: a repeated one is harmless


def _digest(rec: Record) -> str:
    return hashlib.blake2b(encode(rec), digest_size=8).hexdigest()


def reject(res: Result, err: DecodeError, msg: Msg, ts: float | None, dlq: str, cause: str) -> None:
    """Send a dead letter to the DLQ; `cause` (decode, no_job, core) is what the metrics count it under."""
    dead = dead_letter(err, msg, ts)
    res.sends.append(Send(dlq, msg.key or b"", dead.encode()))
    res.rejects.append(dead)
    res.dead[cause, msg.topic] += 1


def _from_the_future(rec: Record, now: float, limit: float) -> DecodeError:
    who = " ".join(f"{k} {getattr(rec, k)}" for k in ("job", "rank", "node") if getattr(rec, k, None) is not None)
    return DecodeError(f"event time {rec.ts:.3f} is {rec.ts - now:.0f} s ahead of this worker's clock (more than "
                       f"max_future_s={limit:g}): fix the clock of its sender ({who}), e.g. with NTP",
                       field="ts", kind=rec.kind)


Lagging = Callable[[str, int], bool]  # (topic, partition) -> data is left to read there
PendingFrom = Callable[[], float]  # event time from which the router may still publish onto by-job (inf: nothing)
NEVER_LAGGING: Lagging = lambda topic, partition: False  # noqa: E731
NOTHING_PENDING: PendingFrom = lambda: float("inf")  # noqa: E731


class JobRunner:
    """One `JobCore` per job over batches of job-partitioned messages; no I/O.

    Event time must not depend on delivery speed. A job is fed by several inputs (each
    job-keyed topic and `by-job` at the job's partition); a consumer catching up on a
    backlog reads them at different speeds, so records of a fast input are held until
    every input that still has data to read has reached their time: a job's release
    point is the minimum, over its inputs with data left to read (`lagging`), of the
    newest event time read from each, and of the time from which the node router may
    still publish onto `by-job` (`pending_from`). An input with nothing left to read holds
    no one back. Live, inputs are read up between batches and records pass at once; as
    a backlog, the same records reach the core in the same order as live.

    The same holds across an outage of the input path (the broker gone, `path(False)`):
    its producers spool and resend once it is back, each after its own back-off, so the
    first to resend would make the others look silent. While the path is down nothing
    is silent, and for `reconnect_s` after it answers again a job's records newer than
    what was read before the outage are held; then they go to the core in event-time
    order, every producer's backlog in place, and silence counts from there.

    Clock skew. Event time is the senders' clocks. Within a job, one node's clock ahead
    cannot carry the job's time (the job's time is its nodes', `ClockDetector.now`), and
    its offset is learned and taken out (`clock_skew`); a record more than `max_future_s`
    (an hour) ahead of this worker's wall clock (`wall`) when it arrives is no clock at
    all: not processed but dead-lettered (cause `future`), naming the sender to fix (NTP).
    Late records (a clock behind, a backlog) are processed in event-time order like any
    other. Replay has no wall clock: there the file's time is the only one.
    """

    def __init__(self, topics: TopicSettings, config: CoreConfig | None = None, *, hold_s: float = 600.0,
                 silence: bool = True, load: Callable[[str], bytes | None] = lambda job: None,
                 keep_records: bool = False, reconnect_s: float = 15.0, max_future_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 node_partition: Callable[[str], int] | None = None,
                 node_partitions_read: Callable[[], Container[int]] = frozenset, mark_hold_s: float = 30.0) -> None:
        """`node_partition`: a node's `node-events` partition, and `node_partitions_read`: those this worker's
        router reads (a worker group: a job waits for the marks of the others, `streams/marks.py`; None: one
        reader of everything, as replay and a lone worker are)."""
        self.topics = topics
        self.keep_records = keep_records  # hand every input record to the sinks (Result.records)
        self.config = config or CoreConfig()
        self.hold_s = hold_s
        self.longest_wait = 0.0  # the longest a job's records waited for its job record (wall)
        self.silence = silence
        self.load = load
        self.clock = clock
        self.jobs: dict[str, JobState] = {}
        self.frontier: dict[tuple[str, int], float] = {}  # (topic, partition) -> newest event time read
        self.inputs = (*topics.job_inputs, topics.by_job)
        self.duplicates = 0  # replayed records skipped
        self.by_job_read: Counter[str] = Counter()  # records read from by-job, per job (the router's in-flight)
        # nodes of every job record read (processed or not yet) -> the newest such record's time (its start there)
        self.job_nodes: dict[str, float] = {}
        self.reconnect_s = reconnect_s
        self.max_future_s, self.wall = max_future_s, wall
        # during an input-path outage and its reconnect grace: per job, the newest event time read before it
        self.outage: dict[str, float] | None = None
        self.trust_from = math.inf  # (clock) when the grace after an outage ends; inf while it lasts
        self.outages = 0
        self.records = 0
        self._seq = 0
        self.node_partition, self.node_partitions_read = node_partition, node_partitions_read
        self.marks = Marks(hold_s=mark_hold_s)
        self._node_parts: dict[str, tuple[object, frozenset[int]]] = {}  # job -> (topology, its nodes' partitions)

    @property
    def cores(self) -> dict[str, JobCore]:
        return {job: st.core for job, st in self.jobs.items() if st.core is not None}

    def _state(self, job: str) -> JobState:
        st = self.jobs.get(job)
        if st is None:
            saved = self.load(job)
            st = self.jobs[job] = unpack_state(saved, self.config) if saved is not None else JobState()
        return st

    # --- batches --------------------------------------------------------------------

    def on_batch(self, msgs: list[Msg], lagging: Lagging = NEVER_LAGGING,
                 pending_from: PendingFrom = NOTHING_PENDING) -> Result:
        res = Result()
        by_job: dict[str, list[Item]] = {}
        frontier = self.frontier
        ahead = self.wall() + self.max_future_s  # later than this: a sender's clock is wrong
        by_job_topic, dlq, seq = self.topics.by_job, self.topics.dlq, self._seq
        partition_of: dict[str, int] = {}  # job -> the partition of its newest message here
        for msg in msgs:
            if msg.value is None:
                continue
            where = (msg.topic, msg.partition)
            newest = frontier.get(where, float("-inf"))
            routed = msg.topic == by_job_topic and msg.key
            if routed and is_mark(msg.value):
                self._mark(msg, res)
                continue
            decoded = decode(msg.value, columns=True, heartbeats=True)
            if len(decoded) == 1 and type(decoded[0]) is StepRows:
                rows = decoded[0]
                top = max(rows.ts)
                if rows.job and top <= ahead:  # else: record by record, below
                    n = len(rows)
                    if routed:
                        self.by_job_read[msg.key.decode()] += n
                    items = by_job.get(rows.job)
                    if items is None:
                        items = by_job[rows.job] = []
                    mine = self._keyed(rows.job, [item_of(rows, seq + 1, msg)])
                    items += mine
                    top = max(last_of(it)[0] for it in mine)
                    if top > newest:
                        newest = top
                    seq += n
                    partition_of[rows.job] = msg.partition
                    frontier[where] = newest
                    continue
                decoded = rows.records()
            for idx, v in enumerate(decoded):
                if isinstance(v, DecodeError):
                    reject(res, v, msg, None, dlq, "decode")
                    continue
                if routed:
                    self.by_job_read[msg.key.decode()] += 1
                ts = v.ts
                if ts > ahead:
                    reject(res, _from_the_future(v, ahead - self.max_future_s, self.max_future_s), msg, ts, dlq,
                           "future")
                    continue
                job = getattr(v, "job", None) or self._job_of(v, msg)
                if job is None:  # a node event on a job-keyed topic: let the router re-key it
                    if ts > newest:
                        newest = ts
                    res.sends.append(Send(self.topics.node_events, (v.node or "").encode(), encode(v)))
                    continue
                [it] = self._keyed(job, [Item(ts, seq + 1, v, msg, idx, 1, None, 0.0, False)])
                if it.ts > newest:
                    newest = it.ts
                if v.kind == "job":
                    for r in v.ranks:
                        if ts > self.job_nodes.get(r.node, -math.inf):
                            self.job_nodes[r.node] = ts
                seq += 1
                items = by_job.get(job)
                if items is None:
                    items = by_job[job] = []
                items.append(it)
                partition_of[job] = msg.partition
            if newest > float("-inf"):
                frontier[where] = newest
        self._seq = seq
        for job, partition in partition_of.items():
            self._state(job).partition = partition
        now = self.clock()
        for job in sorted(set(by_job) | {j for j, st in self.jobs.items() if st.held}):
            self._run_job(job, by_job.get(job, []), now, lagging, pending_from, res)
        return res

    def _keyed(self, job: str, items: list[Item]) -> list[Item]:
        """`items` (in the order read) in the job's time (`items.keyed`: each record's stamped time less what the
        job's clock takes out of its node's, `JobCore.read_shift`), as far as the job's core is there to say;
        those read before it was stay as they are (stamped times, not `keyed`) until it is."""
        st = self.jobs.get(job)
        core = None if st is None else st.core
        if core is None or all(it.keyed for it in items):
            return items
        out = []
        for it in sorted(items, key=SEQ):  # as read: a node's first record teaches its clock's base
            if it.keyed:
                out.append(it)
            elif type(it.rec) is StepRows:
                shifts = core.read_shifts(it.rec)
                out += keyed(it, shifts.tolist()) if shifts.any() else [it._replace(keyed=True)]
            else:
                shift = core.read_shift(it.rec)
                out.append(it._replace(ts=it.ts - shift, shift=shift, keyed=True) if shift else
                           it._replace(keyed=True))
        return out

    def _job_of(self, rec: Record, msg: Msg) -> str | None:
        job = getattr(rec, "job", None)
        if job:
            return job
        if rec.kind in _NODE_KINDS or rec.kind == "ops":
            return msg.key.decode() if msg.topic == self.topics.by_job and msg.key else None
        return None

    def release_point(self, partition: int, lagging: Lagging, pending_from: PendingFrom, job: str | None = None,
                      now: float = 0.0) -> float:
        """Event time up to which a job of `partition` has all its inputs (see the class docstring), and (`job`)
        the node events other workers route to it (`marked_point`)."""
        point = pending_from()
        for topic in self.inputs:
            if lagging(topic, partition):
                point = min(point, self.frontier.get((topic, partition), float("-inf")))
        return point if job is None else min(point, self.marked_point(job, now))

    def _mark(self, msg: Msg, res: Result) -> None:
        """A router's mark on by-job (`streams/marks.py`); one this version cannot read goes to the DLQ."""
        job = msg.key.decode()
        try:
            points = decode_mark(msg.value)
        except ValueError as e:
            reject(res, DecodeError(str(e), kind="mark"), msg, None, self.topics.dlq, "decode")
            return
        st = self.jobs.get(job)
        if st is None:
            return  # a job not read here (yet): it waits from its start for the next mark
        reach = max((self.frontier.get((t, st.partition), -math.inf) for t in self.inputs), default=-math.inf)
        self.marks.heard(job, points, reach, self.clock())

    def marked_point(self, job: str, now: float) -> float:
        """Event time up to which the routers of other workers have routed the node events of the job's nodes
        (inf: none of its nodes is read elsewhere; `streams/marks.py`)."""
        remote = self._remote(job)
        return self.marks.point(job, remote, self.jobs[job].core.monitor.topo.ts, now) if remote else math.inf

    def _quiet(self, job: str, now: float) -> bool:
        """No node event of the job's nodes is on its way from another worker's router (`Marks.quiet`)."""
        remote = self._remote(job)
        return not remote or self.marks.quiet(job, remote, now)

    def _remote(self, job: str) -> list[int]:
        """The `node-events` partitions of the job's nodes that another worker reads."""
        st = self.jobs.get(job)
        if self.node_partition is None or st is None or st.core is None:
            return []  # (a job not started: its job record must go, to publish the map of its nodes)
        topo = st.core.monitor.topo
        have = self._node_parts.get(job)
        if have is None or have[0] is not topo:
            have = self._node_parts[job] = (topo, frozenset(map(self.node_partition, topo.nodes)))
        read = self.node_partitions_read()
        return [p for p in have[1] if p not in read]

    def _fresh(self, st: JobState, items: list[Item]) -> tuple[list[Item], int]:
        """Drop what the job's state already holds (replayed offsets, re-published node events); keep what it
        owes (read by an earlier worker, not processed: see `JobState`). Returns (what is kept, how many records
        were dropped); an item of a replayed message is kept record by record."""
        offs, seen, owed = st.offsets, st.seen, st.owed
        by_job = self.topics.by_job
        fresh = []
        dropped = 0
        last: Msg | None = None
        old = True
        due: set[tuple[int, int]] | None = None
        top: dict[str, int] = {}  # where -> next offset after this batch
        for it in items:
            m = it.msg
            if m is not last:  # the items of one message are usually adjacent
                last = m
                where = f"{m.topic}:{m.partition}"
                old = m.offset < offs.get(where, 0)
                due = owed.get(where) if old else None
                if not old and m.offset >= top.get(where, 0):
                    top[where] = m.offset + 1
                if not old and m.offset < st.first.get(where, m.offset + 1):  # items come in event-time order
                    st.first[where] = m.offset
            if old:
                for one in one_by_one(it):
                    if due and (m.offset, one.idx) in due:  # owed: its digest is in `seen` already
                        due.discard((m.offset, one.idx))
                        if not due:
                            del owed[where]
                        fresh.append(one)
                    else:
                        dropped += 1
                continue
            if m.topic == by_job and type(it.rec) is not StepRows and it.rec.kind in _DEDUP_KINDS:
                d = _digest(it.rec)
                if d in seen:
                    dropped += 1
                    continue
                seen[d] = it.ts
            fresh.append(it)
        offs.update(top)
        self.duplicates += dropped
        return fresh, dropped

    def _run_job(self, job: str, items: list[Item], now: float, lagging: Lagging, pending_from: PendingFrom,
                 res: Result) -> None:
        st = self._state(job)
        if items:
            items.sort()
            # offsets advance as read, held or not: what is unprocessed is owed
            items, dropped = self._fresh(st, items)
            if dropped:
                # a copy skipped (the router's re-publish) still moved the offsets: a state taken now lets the
                # commits pass it, where none would be taken until the job's next record came
                res.dirty.add(job)
            res.duplicates += dropped
        if st.pending:
            items = st.pending + items
            since, st.pending, st.pending_since = st.pending_since, [], None
            if since is not None and (st.core is not None or any(map(is_job, items))):  # its job record came
                self.longest_wait = max(self.longest_wait, now - since)
        if st.core is None and not any(map(is_job, items)) and not any(map(is_job, st.held)):
            self._hold(st, job, in_order(items), now, res)
            return
        held = self._keyed(job, st.held + items)
        if not held:
            return
        point = self.release_point(st.partition, lagging, pending_from, job, now)
        if self.outage is not None:  # every producer's backlog first
            point = min(point, self.outage.get(job, -math.inf))
        excess = sum(map(N, held)) - MAX_PENDING
        if st.core is not None and excess <= 0 and max(last_of(it)[0] for it in held) <= point:
            st.held = []  # the usual case: every record can go, overlapping envelopes as one
            self._process(job, st, in_order(held, merge=True), now, res)
            return
        held = st.held = in_order(held)
        if excess > 0:  # memory bound: past it, the oldest go ahead of their inputs
            point = max(point, ts_at(held, excess - 1))
        if last_of(held[-1])[0] <= point:  # every record can go (past the memory bound, or the job record among them)
            ready = held
            st.held = []
        else:
            k = bisect.bisect_right(held, point, key=TS)  # items whose first record can go
            ready, st.held = held[:k], held[k:]
            if ready and ready[-1].n > 1 and last_of(ready[-1])[0] > point:  # only its first records can go
                at = bisect.bisect_right(ready[-1].rec.ts, point + ready[-1].shift)
                ready[-1], rest = cut(ready[-1], at)
                st.held.insert(0, rest)
        if ready:
            self._process(job, st, ready, now, res)

    def _process(self, job: str, st: JobState, items: list[Item], now: float, res: Result) -> None:
        """Feed the job's released items to its core in order: a `job` record alone (it may change the nodes),
        the records between them as one run (`JobCore.process_many`: the same outputs as one by one)."""
        kinds = res.kinds
        run: list[Item] = []
        early: list[Item] = []  # records stamped before the job's first job record: read right after it

        def flush_run() -> None:
            if run:
                out = st.core.process_many([it.rec for it in run])
                if out:
                    self._emit(job, out, run[-1], res)  # a JobCore rejects nothing (else: named after the last)
                run.clear()

        k = 0
        while k < len(items):
            it = items[k]
            k += 1
            rec = it.rec
            if type(rec) is StepRows:
                if st.core is None:
                    early.append(it)
                    continue
                kinds.update(rec.counts())
                run.append(it)
                continue
            if rec.kind != "job":
                if st.core is None:
                    early.append(it)
                    continue
                kinds[rec.kind] += 1
                run.append(it)
                continue
            flush_run()
            kinds["job"] += 1
            if st.core is None:
                st.core = JobCore(rec, self.config)
                self._publish_nodes(job, rec.ts, set(), set(st.core.nodes), res)
                for e in early:  # what came before it in event time (the controller's start), as replay reads it
                    if type(e.rec) is StepRows:
                        kinds.update(e.rec.counts())
                    else:
                        kinds[e.rec.kind] += 1
                run.extend(early)
                early.clear()
                # what came after it, read before its core was there: in the job's time now (`_keyed`)
                items = items[:k] + in_order(self._keyed(job, items[k:]), merge=True)
                continue
            before = set(st.core.nodes)
            out = st.core.process(rec)
            self._publish_nodes(job, rec.ts, before, set(st.core.nodes), res)
            if out:
                self._emit(job, out, it, res)
        flush_run()
        for it in early:
            self._no_job(job, it, res)
        self.records += sum(map(N, items))
        if self.keep_records:
            res.records += [r for it in items for r in (it.rec.records() if type(it.rec) is StepRows else (it.rec,))]
        st.arrived = now
        res.dirty.add(job)
        seen = st.seen
        if seen and len(seen) > 64 and st.core is not None:
            horizon = st.core.max_ts - SEEN_S
            for d in [d for d, ts in seen.items() if ts < horizon]:
                del seen[d]

    def _hold(self, st: JobState, job: str, items: list[Item], now: float, res: Result) -> None:
        """Keep `items` (in order) until the job record comes: the newest `MAX_PENDING` records of them."""
        excess = sum(map(N, items)) - MAX_PENDING
        k = 0
        while excess > 0:
            it = items[k]
            if it.n > excess:
                gone, items[k] = cut(it, excess)
            else:
                gone, k = it, k + 1
            self._no_job(job, gone, res)
            excess -= gone.n
        st.pending = items[k:]
        st.pending_since = now if st.pending_since is None else st.pending_since

    def _no_job(self, job: str, it: Item, res: Result) -> None:
        for one in one_by_one(it):
            err = DecodeError(f"no `job` record seen for job {job!r} within the hold time", "job", one.rec.kind,
                              raw=encode(one.rec).decode()[:4096])
            reject(res, err, one.msg, one.ts, self.topics.dlq, "no_job")

    def _publish_nodes(self, job: str, ts: float, before: set[str], after: set[str], res: Result) -> None:
        for node in sorted(after):
            res.sends.append(Send(self.topics.node_jobs, node.encode(),
                                  orjson.dumps({"node": node, "job": job, "ts": ts})))
        for node in sorted(before - after):
            res.sends.append(Send(self.topics.node_jobs, node.encode(),
                                  orjson.dumps({"node": node, "job": None, "was": job, "ts": ts})))

    def _emit(self, job: str, out: Outputs, it: Item | None, res: Result) -> None:
        key = job.encode()
        t = self.topics
        res.sends += [Send(t.findings, key, encode(rec)) for rec in out.findings]
        res.sends += [Send(t.actions, key, encode(rec), rec.id) for rec in out.actions]
        res.sends += [Send(t.incidents, key, encode(rec)) for rec in out.incidents]
        res.outputs.extend(Outputs(out.findings, out.actions, out.incidents, profiles=out.profiles,
                                   life=out.life, shadow=out.shadow))  # rejects apart
        for err in out.rejected:
            if it is not None:
                reject(res, err, it.msg, last_of(it)[0] + it.shift, t.dlq, "core")

    # --- time -----------------------------------------------------------------------

    def on_tick(self, caught_up: Callable[[str], bool] = lambda job: True, lagging: Lagging = NEVER_LAGGING,
                pending_from: PendingFrom = NOTHING_PENDING) -> Result:
        """Release held records whose inputs caught up; advance silent jobs through wall-clock time; give up on
        records that waited too long for a job.

        A job's watermark is its largest event time + the wall time since its newest
        batch arrived - `lateness_s`, advanced only while `caught_up(job)` (nothing of
        its partition is left to read: a consumer that lags is not silence).
        """
        res = Result()
        now = self.clock()
        if self.outage is not None and now >= self.trust_from:
            self.outage, self.trust_from = None, math.inf
            self.resume()  # silence counts from the end of the grace
        for job in sorted(self.jobs):
            st = self.jobs[job]
            if st.held:
                self._run_job(job, [], now, lagging, pending_from, res)
            if st.pending_since is not None and now - st.pending_since >= max(self.hold_s, 2 * self.longest_wait):
                for it in st.pending:
                    self._no_job(job, it, res)
                st.pending, st.pending_since = [], None
                res.dirty.add(job)  # owes them no more
        if not self.silence or self.outage is not None:
            return res
        for job in sorted(self.jobs):
            st = self.jobs[job]
            core = st.core
            if core is None or st.arrived is None or st.held or not caught_up(job) or not self._quiet(job, now):
                continue
            out = core.advance(core.now() + (now - st.arrived) - self.config.lateness_s)
            if out:
                self._emit(job, out, None, res)
                res.dirty.add(job)
        return res

    def input_down(self) -> None:
        """The input path stopped answering (no fetch comes back): silence is no news until it is back and every
        producer had `reconnect_s` to resend (see the class docstring)."""
        if self.outage is None:
            self.outages += 1
            self.outage = {job: max((self.frontier.get((t, st.partition), -math.inf) for t in self.inputs),
                                    default=-math.inf) for job, st in self.jobs.items()}
        self.trust_from = math.inf

    def input_up(self) -> None:
        """The input path answers (again): after an outage, silence is judged once `reconnect_s` has passed."""
        if self.outage is not None and math.isinf(self.trust_from):
            self.trust_from = self.clock() + self.reconnect_s

    # --- rebalances -----------------------------------------------------------------

    def saved(self, job: str, value: bytes) -> None:
        """`value` (from `state_of`) is now the job's state in the table."""
        st = self.jobs.get(job)
        if st is not None:
            st.written = cover_of(value)

    def resume_points(self) -> dict[tuple[str, int], int]:
        """Per input (topic, partition), the lowest offset holding a record that no written state has processed.

        The worker commits no input offset past it: a worker that takes over starts reading there, so every
        record is either in a saved state or read again (then the state's `offsets` and owed positions tell
        processed from not). Inputs with nothing uncovered are absent.
        """
        out: dict[tuple[str, int], int] = {}
        for st in self.jobs.values():
            for where, offset in st.uncovered().items():
                topic, _, p = where.rpartition(":")
                key = (topic, int(p))
                out[key] = min(out.get(key, offset), offset)
        return out

    def deleted(self, topic: str, partition: int, before: int) -> list[str]:
        """The log of (topic, partition) no longer keeps the records before offset `before` (retention): what jobs
        owe there is given up. Returns the jobs that owed some (their states are to be saved again)."""
        where, jobs = f"{topic}:{partition}", []
        for job, st in self.jobs.items():
            if pos := st.owed.get(where):
                pos.difference_update([p for p in pos if p[0] < before])
                if not pos:
                    del st.owed[where]
                jobs.append(job)
        return jobs

    def restore(self, job: str, saved: bytes, partition: int) -> None:
        """Take over a job from its saved state (after a rebalance); silence counts from now."""
        st = self.jobs[job] = unpack_state(saved, self.config)
        st.partition = partition
        st.arrived = self.clock()

    def drop_partitions(self, partitions: set[int]) -> list[str]:
        """Forget the jobs of partitions this worker lost (their state is in the table)."""
        gone = [j for j, st in self.jobs.items() if st.partition in partitions]
        for job in gone:
            del self.jobs[job]
            self._node_parts.pop(job, None)
        self.marks.forget(gone)
        for where in [w for w in self.frontier if w[1] in partitions]:
            del self.frontier[where]
        return gone

    def resume(self) -> None:
        """After a rebalance pause: silence counts from now, not from before the pause."""
        now = self.clock()
        for st in self.jobs.values():
            if st.arrived is not None:
                st.arrived = now

    def state_of(self, job: str) -> bytes:
        return pack_state(self.jobs[job])

    def take_state(self, job: str) -> Taken:
        """`state_of` without its compression (`jobstate.seal`), which needs nothing of the job any more."""
        return take_state(self.jobs[job])
