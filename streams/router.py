"""Node events re-keyed by the job running on their node: the worker's second agent, without Faust.

`NodeRouter`: node-keyed messages (`node-events`) and the node -> job map
(`node-jobs`, published by `JobRunner` when a `job` record arrives) -> the same
records re-keyed by job onto `by-job`. An event of a node not (yet) in any job
waits up to `hold_s` for its mapping, then is dropped (the core ignores events
of nodes outside every job too). The worker commits no `node-events` offset past
an event still waiting (`resume_points`), so a router that takes over reads it
again; it then re-publishes the events after it that were already routed, and the
jobs side drops those copies by digest (`JobRunner`: hw and ops; a repeated gpu
sample is observed twice). Every tick it tells the jobs of its nodes how far it
has read their partitions (`marks`, for the jobs another worker runs:
`streams/marks.py`).
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Container, Iterable, Mapping, MutableMapping
from typing import Any

import orjson
from gangwatch.schemas import DecodeError, Record, decode, encode_batch
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.marks import encode_mark
from gangwatch.streams.runner import MAX_PENDING, Lagging, Msg, Result, Send, reject


class NodeRouter:
    """Re-keys node events by the job running on their node; no I/O.

    `table` maps node (bytes) -> JSON `{"job": .., "ts": ..}` (the worker passes its
    changelog-backed Faust table).

    Until the jobs side has read back what was published onto by-job, those events
    are still on their way to their job: `node_events_pending_from` counts the events published per job
    (`inflight`) against the by-job records the runner has read (`JobRunner.by_job_read`),
    so a backlog read at full speed cannot run a job's time past a node event on its way.
    Entries older than `hold_s` (wall) no longer hold anything (the job may be another
    worker's). Events still waiting for their node's job (`pending`) hold back only when
    their node is in a job record the runner has read (`nodes`): its mapping is on the
    way; most pending events are of nodes that run no job at all, and hold nothing.
    """

    def __init__(self, topics: TopicSettings, table: MutableMapping[bytes, bytes], *, hold_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.topics = topics
        self.table = table
        self.hold_s = hold_s
        self.clock = clock
        self.pending: dict[str, list[tuple[float, Record, Msg]]] = {}  # node -> (wall time held, record, where)
        self.frontier: dict[tuple[str, int], float] = {}  # (topic, partition) -> newest event time read
        self.dropped = 0
        self.routed = 0
        self.inflight: dict[str, deque[tuple[float, float]]] = {}  # job -> (event time, wall) published, unread
        self.published: Counter[str] = Counter()  # events published onto by-job, per job

    def node_events_pending_from(self, inputs: Iterable[tuple[str, int]], lagging: Lagging,
                 read: Mapping[str, int] | None = None, nodes: Mapping[str, float] | None = None,
                 mine: Container[str] | None = None) -> float:
        """Event time from which node events may still reach by-job: the oldest frontier among this router's
        `inputs` (topic, partition) that still have data to read, of the events published but not yet `read`
        back by the runner (`read`, for the jobs that are `mine`: another worker's hold nothing here), and of
        those waiting for the mapping of a node in a job record read (`nodes`: node -> that record's time;
        the node's events before it are not the job's, and must not hold back the very record whose
        processing publishes the map: a node agent speaks before any job starts on its node)."""
        point = min((self.frontier.get(tp, -math.inf) for tp in inputs if lagging(*tp)), default=math.inf)
        now = self.clock()
        nodes = nodes or {}
        for node in set(self.pending).intersection(nodes):
            start = nodes[node]
            point = min([point, *(r.ts for t, r, _ in self.pending[node] if now - t < self.hold_s and r.ts >= start)])
        for job in list(self.inflight):
            q = self.inflight[job]
            if read is None or (mine is not None and job not in mine):
                del self.inflight[job]
                continue
            unread = self.published[job] - read.get(job, 0)
            while q and (len(q) > unread or now - q[0][1] >= self.hold_s):
                q.popleft()
            if q:
                point = min(point, min(ts for ts, _ in q))
            else:
                del self.inflight[job]
        return point

    def marks(self, inputs: Iterable[tuple[str, int]], lagging: Lagging, partition_of: Callable[[bytes], int],
              local: Container[int] = ()) -> Result:
        """One mark per job with a node on a `node-events` partition of `inputs` (this router's): per such
        partition, the newest event time read there while it has data left to read (or nothing read yet: the
        job's start), None when it has none (`streams/marks.py`). `partition_of`: a key's partition; `local`:
        the partitions of the jobs this worker runs itself (they ask this router directly: no mark)."""
        mine = {p for topic, p in inputs if topic == self.topics.node_events}
        if not mine:
            return Result()
        points: dict[str, dict[int, float | None]] = {}
        for key, raw in list(self.table.items()):
            p = partition_of(key)
            if p not in mine:
                continue  # (a standby copy of another worker's partition)
            entry = orjson.loads(raw)
            if partition_of(entry["job"].encode()) in local:
                continue
            job = points.setdefault(entry["job"], {})
            if not lagging(self.topics.node_events, p):
                job[p] = None
                continue
            t = self.frontier.get((self.topics.node_events, p), -math.inf)
            point = t if t > -math.inf else float(entry["ts"])  # (nothing read there yet: from the job's start)
            have = job.get(p)
            job[p] = point if have is None else min(have, point)
        return Result(sends=[Send(self.topics.by_job, job.encode(), encode_mark(pts))
                             for job, pts in sorted(points.items())])

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
            where = (msg.topic, msg.partition)
            for v in decode(msg.value):
                if isinstance(v, DecodeError):
                    reject(res, v, msg, None, self.topics.dlq, "decode")
                else:
                    items.append((v.ts, 1, v, msg))
                    if v.ts > self.frontier.get(where, float("-inf")):
                        self.frontier[where] = v.ts
        items.sort(key=lambda x: (x[0], x[1]))  # stable: arrival order breaks ties
        out: dict[str, list[Record]] = {}
        now = self.clock()
        for _, is_rec, payload, msg in items:
            if is_rec:
                self._route(payload, msg, now, out)
            else:
                self._map(payload, out)
        for job in sorted(out):
            recs = out[job]
            self.routed += len(recs)
            self.published[job] += len(recs)
            self.inflight.setdefault(job, deque()).extend((r.ts, now) for r in recs)
            res.sends.append(Send(self.topics.by_job, job.encode(), encode_batch(recs, recs[0].ts)))
        return res

    def _job(self, node: str) -> tuple[str, float] | None:
        raw = self.table.get(node.encode())
        if not raw:
            return None
        entry = orjson.loads(raw)
        return entry["job"], entry["ts"]

    def _route(self, rec: Record, msg: Msg, now: float, out: dict[str, list[Record]]) -> None:
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
            held.append((now, rec, msg))
        else:
            out.setdefault(hit[0], []).append(rec)

    def _map(self, entry: dict[str, Any], out: dict[str, list[Record]]) -> None:
        node, job, ts = entry["node"], entry.get("job"), float(entry.get("ts") or 0.0)
        key = node.encode()
        if job:
            self.table[key] = orjson.dumps({"job": job, "ts": ts})
            held = self.pending.pop(node, [])
            for _, rec, _msg in held:
                if rec.ts >= ts:  # events before the job started on this node were not the job's
                    out.setdefault(job, []).append(rec)
                else:
                    self.dropped += 1
        else:
            cur = self._job(node)
            if cur is not None and cur[0] == entry.get("was"):
                del self.table[key]

    def resume_points(self) -> dict[tuple[str, int], int]:
        """Per input (topic, partition), the offset of the oldest event still waiting for its node's job."""
        out: dict[tuple[str, int], int] = {}
        for held in self.pending.values():
            for _, _, msg in held:
                where = (msg.topic, msg.partition)
                out[where] = min(out.get(where, msg.offset), msg.offset)
        return out

    def on_tick(self) -> Result:
        """Drop events whose node found no job within `hold_s`."""
        now = self.clock()
        for node in list(self.pending):
            held = self.pending[node]
            keep = [e for e in held if now - e[0] < self.hold_s]
            self.dropped += len(held) - len(keep)
            if keep:
                self.pending[node] = keep
            else:
                del self.pending[node]
        return Result(dropped=self.dropped)
