"""The Faust worker's logic without Faust: batches of Kafka messages in, messages to publish out.

`streams.worker` is thin glue around the two classes here, so everything that
decides what happens to a record can be tested as plain functions (Faust's
`take()` cannot be exercised through its test context).

- `JobRunner` (the main agent): messages of the job-keyed input topics (plus
  node events already re-keyed by job) -> one `Core` per job, driven on event
  time -> findings / actions / incidents keyed by job, rejects to the DLQ, the
  node -> job map to `node-jobs`, and the jobs whose state must be saved.
  Within a batch the records of a job are processed in event-time order (stable:
  arrival order breaks ties), the order replay uses. Records of a job whose
  `job` record has not arrived yet wait up to `hold_s` (wall) for it; then they
  are processed exactly as replay would (those older than the topology are
  rejected by the core), or rejected when it never comes.
- `NodeRouter`: node-keyed messages (`node-events`) and the node -> job map
  (`node-jobs`, published by `JobRunner` when a `job` record arrives) -> the same
  records re-keyed by job onto `by-job`. An event of a node not (yet) in any job
  waits up to `hold_s` for its mapping, then is dropped (the core ignores
  events of nodes outside every job too).
"""

from __future__ import annotations

import hashlib
import time
import zlib
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from gangwatch.schemas import DecodeError, Record, decode, encode, encode_batch
from gangwatch.streams.topics import TopicSettings
from gangwatch.triage.engine import Core, CoreConfig
from gangwatch.triage.outputs import Outputs

_NODE_KINDS = frozenset({"hw", "gpu"})
MAX_PENDING = 200_000  # records held per job (or node) waiting for their job record (or mapping)


class Msg(NamedTuple):
    """One consumed Kafka message: where it came from and its bytes."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: float = 0.0  # the Kafka message timestamp, seconds


class Send(NamedTuple):
    """One message to publish."""

    topic: str
    key: bytes
    value: bytes


@dataclass
class Result:
    """What one batch (or one tick) produced."""

    sends: list[Send] = field(default_factory=list)
    outputs: Outputs = field(default_factory=Outputs)  # for sinks
    rejects: list[tuple[DecodeError, str, int | None, float]] = field(default_factory=list)  # for sinks
    records: list[Record] = field(default_factory=list)  # inputs processed (for telemetry sinks)
    dirty: set[str] = field(default_factory=set)  # jobs whose state changed
    dropped: int = 0  # node events dropped for want of a job


class _Item(NamedTuple):
    """One record in a job's batch; sorts by (ts, seq) natively (seq is unique, so `rec` is never compared)."""

    ts: float
    seq: int
    rec: Record
    msg: Msg


def dlq_value(err: DecodeError, msg: Msg, ts: float | None = None) -> bytes:
    """The dead-letter message: why, and exactly where the message came from."""
    return orjson.dumps({"source": msg.topic, "topic": msg.topic, "partition": msg.partition, "offset": msg.offset,
                         "ts": msg.timestamp if ts is None else ts, **err.to_dict()})


@dataclass
class JobState:
    """What a job's table entry holds: the core, and what it has already seen.

    `offsets` ("topic:partition" -> next offset) are saved in the same value as the core,
    so a partition replayed after a rebalance or crash (offsets commit later than state)
    is skipped instead of observed twice. `seen` does the same for node events, which the
    router may re-publish at new offsets: digest -> event time, kept for `SEEN_S`.
    """

    core: Core
    offsets: dict[str, int] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)


SEEN_S = 600.0  # event-time horizon of node-event de-duplication
_DEDUP_KINDS = frozenset({"hw", "ops"})  # gpu samples are periodic and many: a repeated one is harmless


def pack_state(st: JobState) -> bytes:
    """A job's state as a table value: JSON, zlib-compressed (a 2,048-rank job: ~150 KB -> ~15 KB)."""
    return zlib.compress(orjson.dumps({"core": st.core.state(), "offsets": st.offsets, "seen": st.seen},
                                      option=orjson.OPT_SERIALIZE_NUMPY), 1)


def unpack_state(value: bytes) -> JobState:
    obj = orjson.loads(zlib.decompress(value))
    return JobState(Core.from_state(obj["core"]), dict(obj.get("offsets") or {}), dict(obj.get("seen") or {}))


def _digest(rec: Record) -> str:
    return hashlib.blake2b(encode(rec), digest_size=8).hexdigest()


def _reject(res: Result, err: DecodeError, msg: Msg, ts: float | None, dlq: str) -> None:
    res.sends.append(Send(dlq, msg.key or b"", dlq_value(err, msg, ts)))
    res.rejects.append((err, f"{msg.topic}[{msg.partition}]", msg.offset, msg.timestamp if ts is None else ts))


class JobRunner:
    """One `Core` per job over batches of job-partitioned messages; no I/O."""

    def __init__(self, topics: TopicSettings, config: CoreConfig | None = None, *, hold_s: float = 30.0,
                 silence: bool = True, load: Callable[[str], bytes | None] = lambda job: None,
                 keep_records: bool = False, clock: Callable[[], float] = time.monotonic) -> None:
        self.topics = topics
        self.keep_records = keep_records  # hand every input record to the sinks (Result.records)
        self.config = config or CoreConfig()
        self.hold_s = hold_s
        self.silence = silence
        self.load = load
        self.clock = clock
        self.cores: dict[str, Core] = {}
        self.offsets: dict[str, dict[str, int]] = {}  # job -> JobState.offsets
        self.seen: dict[str, dict[str, float]] = {}  # job -> JobState.seen
        self.duplicates = 0  # replayed records skipped
        self.partition: dict[str, int] = {}  # job -> its partition number (same on every job-keyed topic)
        self.arrived: dict[str, float] = {}  # job -> wall clock of its newest processed batch
        self.pending: dict[str, list[_Item]] = {}  # job -> records waiting for the job record
        self.pending_since: dict[str, float] = {}
        self.records = 0
        self._seq = 0

    # --- batches --------------------------------------------------------------------

    def on_batch(self, msgs: list[Msg]) -> Result:
        res = Result()
        by_job: dict[str, list[_Item]] = {}
        for msg in msgs:
            if msg.value is None:
                continue
            for v in decode(msg.value):
                if isinstance(v, DecodeError):
                    _reject(res, v, msg, None, self.topics.dlq)
                    continue
                job = self._job_of(v, msg)
                if job is None:  # a node event on a job-keyed topic: let the router re-key it
                    res.sends.append(Send(self.topics.node_events, (v.node or "").encode(), encode(v)))
                    continue
                self._seq += 1
                by_job.setdefault(job, []).append(_Item(v.ts, self._seq, v, msg))
                self.partition[job] = msg.partition
        now = self.clock()
        for job in sorted(by_job):
            self._run_job(job, by_job[job], now, res)
        return res

    def _job_of(self, rec: Record, msg: Msg) -> str | None:
        job = getattr(rec, "job", None)
        if job:
            return job
        if rec.kind in _NODE_KINDS or rec.kind == "ops":
            return msg.key.decode() if msg.topic == self.topics.by_job and msg.key else None
        return None

    def _core(self, job: str) -> Core | None:
        core = self.cores.get(job)
        if core is None:
            saved = self.load(job)
            if saved is not None:
                self._take(job, unpack_state(saved))
                core = self.cores[job]
        return core

    def _take(self, job: str, st: JobState) -> None:
        self.cores[job], self.offsets[job], self.seen[job] = st.core, st.offsets, st.seen

    def _fresh(self, job: str, items: list[_Item]) -> list[_Item]:
        """Drop what the job's state already holds (replayed offsets, re-published node events)."""
        offs = self.offsets.setdefault(job, {})
        seen = self.seen.setdefault(job, {})
        by_job = self.topics.by_job
        fresh = []
        last: Msg | None = None
        old = True
        top: dict[str, int] = {}  # where -> next offset after this batch
        for it in items:
            m = it.msg
            if m is not last:  # the items of one message are usually adjacent
                last = m
                where = f"{m.topic}:{m.partition}"
                old = m.offset < offs.get(where, 0)
                if not old and m.offset >= top.get(where, 0):
                    top[where] = m.offset + 1
            if old:
                continue
            if m.topic == by_job and it.rec.kind in _DEDUP_KINDS:
                d = _digest(it.rec)
                if d in seen:
                    continue
                seen[d] = it.ts
            fresh.append(it)
        offs.update(top)
        self.duplicates += len(items) - len(fresh)
        return fresh

    def _run_job(self, job: str, items: list[_Item], now: float, res: Result) -> None:
        core = self._core(job)
        if job in self.pending:
            items = self.pending.pop(job) + items
            self.pending_since.pop(job, None)
        items.sort()
        if core is None:
            if not any(it.rec.kind == "job" for it in items):
                self._hold(job, items, now, res)
                return
            core = self.cores[job] = Core(self.config)
        items = self._fresh(job, items)
        process = core.process
        for it in items:
            rec = it.rec
            if rec.kind == "job":
                before = set(core.node_job)
                out = process(rec)
                self._publish_nodes(job, rec.ts, before, set(core.node_job), res)
            else:
                out = process(rec)
            if out:
                self._emit(job, out, it, res)
        self.records += len(items)
        if self.keep_records:
            res.records += [it.rec for it in items]
        self.arrived[job] = now
        res.dirty.add(job)
        seen = self.seen[job]
        if seen and len(seen) > 64:
            horizon = core.max_ts - SEEN_S
            for d in [d for d, ts in seen.items() if ts < horizon]:
                del seen[d]

    def _hold(self, job: str, items: list[_Item], now: float, res: Result) -> None:
        keep = items[-MAX_PENDING:]
        for it in items[:-MAX_PENDING] if len(items) > MAX_PENDING else ():
            self._no_job(job, it, res)
        self.pending[job] = keep
        self.pending_since.setdefault(job, now)

    def _no_job(self, job: str, it: _Item, res: Result) -> None:
        err = DecodeError(f"no `job` record seen for job {job!r} within the hold time", "job", it.rec.kind,
                          raw=encode(it.rec).decode()[:4096])
        _reject(res, err, it.msg, it.ts, self.topics.dlq)

    def _publish_nodes(self, job: str, ts: float, before: set[str], after: set[str], res: Result) -> None:
        for node in sorted(after):
            res.sends.append(Send(self.topics.node_jobs, node.encode(),
                                  orjson.dumps({"node": node, "job": job, "ts": ts})))
        for node in sorted(before - after):
            res.sends.append(Send(self.topics.node_jobs, node.encode(),
                                  orjson.dumps({"node": node, "job": None, "was": job, "ts": ts})))

    def _emit(self, job: str, out: Outputs, it: _Item | None, res: Result) -> None:
        key = job.encode()
        t = self.topics
        for topic, recs in ((t.findings, out.findings), (t.actions, out.actions), (t.incidents, out.incidents)):
            for rec in recs:
                res.sends.append(Send(topic, key, encode(rec)))
        res.outputs.extend(Outputs(out.findings, out.actions, out.incidents, profiles=out.profiles))  # rejects apart
        for err in out.rejected:
            if it is not None:
                _reject(res, err, it.msg, it.ts, t.dlq)

    # --- time -----------------------------------------------------------------------

    def on_tick(self, caught_up: Callable[[str], bool] = lambda job: True) -> Result:
        """Advance silent jobs through wall-clock time; give up on records that waited too long for a job.

        A job's watermark is its largest event time + the wall time since its newest
        batch arrived - `lateness_s`, advanced only while `caught_up(job)` (nothing of
        its partition is left to read: a consumer that lags is not silence).
        """
        res = Result()
        now = self.clock()
        for job in sorted(self.pending_since):
            if now - self.pending_since[job] >= self.hold_s:
                del self.pending_since[job]
                for it in self.pending.pop(job, []):
                    self._no_job(job, it, res)
        if not self.silence:
            return res
        for job in sorted(self.cores):
            core = self.cores[job]
            if core.max_ts == float("-inf") or job not in self.arrived or not caught_up(job):
                continue
            out = core.advance(core.max_ts + (now - self.arrived[job]) - self.config.lateness_s)
            if out:
                self._emit(job, out, None, res)
                res.dirty.add(job)
        return res

    # --- rebalances -----------------------------------------------------------------

    def restore(self, job: str, saved: bytes, partition: int) -> None:
        """Take over a job from its saved state (after a rebalance); silence counts from now."""
        self._take(job, unpack_state(saved))
        self.partition[job] = partition
        self.arrived[job] = self.clock()

    def drop_partitions(self, partitions: set[int]) -> list[str]:
        """Forget the jobs of partitions this worker lost (their state is in the table)."""
        gone = [j for j, p in self.partition.items() if p in partitions]
        for job in gone:
            for d in (self.cores, self.offsets, self.seen, self.partition, self.arrived, self.pending,
                      self.pending_since):
                d.pop(job, None)
        return gone

    def resume(self) -> None:
        """After a rebalance pause: silence counts from now, not from before the pause."""
        now = self.clock()
        for job in self.arrived:
            self.arrived[job] = now

    def state_of(self, job: str) -> bytes:
        return pack_state(JobState(self.cores[job], self.offsets.get(job, {}), self.seen.get(job, {})))


class NodeRouter:
    """Re-keys node events by the job running on their node; no I/O.

    `table` maps node (bytes) -> JSON `{"job": .., "ts": ..}` (the worker passes its
    changelog-backed Faust table).
    """

    def __init__(self, topics: TopicSettings, table: MutableMapping[bytes, bytes], *, hold_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.topics = topics
        self.table = table
        self.hold_s = hold_s
        self.clock = clock
        self.pending: dict[str, list[tuple[float, Record]]] = {}  # node -> (wall time held, record)
        self.dropped = 0
        self.routed = 0

    def on_batch(self, msgs: list[Msg]) -> Result:
        res = Result()
        items: list[tuple[float, int, Any, Msg]] = []  # (ts, 0 = map entry first at equal ts, payload, msg)
        for msg in msgs:
            if msg.value is None:
                continue
            if msg.topic == self.topics.node_jobs:
                entry = orjson.loads(msg.value)
                items.append((float(entry.get("ts") or 0.0), 0, entry, msg))
                continue
            for v in decode(msg.value):
                if isinstance(v, DecodeError):
                    _reject(res, v, msg, None, self.topics.dlq)
                else:
                    items.append((v.ts, 1, v, msg))
        items.sort(key=lambda x: (x[0], x[1]))  # stable: arrival order breaks ties
        out: dict[str, list[Record]] = {}
        now = self.clock()
        for _, is_rec, payload, _msg in items:
            if is_rec:
                self._route(payload, now, out)
            else:
                self._map(payload, out)
        for job in sorted(out):
            recs = out[job]
            self.routed += len(recs)
            res.sends.append(Send(self.topics.by_job, job.encode(), encode_batch(recs, recs[0].ts)))
        return res

    def _job(self, node: str) -> tuple[str, float] | None:
        raw = self.table.get(node.encode())
        if not raw:
            return None
        entry = orjson.loads(raw)
        return entry["job"], entry["ts"]

    def _route(self, rec: Record, now: float, out: dict[str, list[Record]]) -> None:
        job = getattr(rec, "job", None)
        if job:  # an ops record that names its job after all
            out.setdefault(job, []).append(rec)
            return
        node = rec.node or ""
        hit = self._job(node)
        if hit is None:
            held = self.pending.setdefault(node, [])
            if len(held) >= MAX_PENDING:
                held.pop(0)
                self.dropped += 1
            held.append((now, rec))
        else:
            out.setdefault(hit[0], []).append(rec)

    def _map(self, entry: dict[str, Any], out: dict[str, list[Record]]) -> None:
        node, job, ts = entry["node"], entry.get("job"), float(entry.get("ts") or 0.0)
        key = node.encode()
        if job:
            self.table[key] = orjson.dumps({"job": job, "ts": ts})
            held = self.pending.pop(node, [])
            for _, rec in held:
                if rec.ts >= ts:  # events before the job started on this node were not the job's
                    out.setdefault(job, []).append(rec)
                else:
                    self.dropped += 1
        else:
            cur = self._job(node)
            if cur is not None and cur[0] == entry.get("was"):
                del self.table[key]

    def on_tick(self) -> Result:
        """Drop events whose node found no job within `hold_s`."""
        now = self.clock()
        for node in list(self.pending):
            held = self.pending[node]
            keep = [(t, r) for t, r in held if now - t < self.hold_s]
            self.dropped += len(held) - len(keep)
            if keep:
                self.pending[node] = keep
            else:
                del self.pending[node]
        return Result(dropped=self.dropped)
