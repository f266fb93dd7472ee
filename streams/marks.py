"""Router marks: how far another worker's router has read the node events of a job's nodes.

A job's node events (an Xid, a NIC going down) reach it in two hops: the
sidecar publishes them on `node-events`, keyed by node; the router of whichever
worker of the group reads that node's partition re-keys them by job onto
`by-job`, where the job's worker reads them. The job's own records come
straight. So a job's worker must not run the job's time past a node event that
is still on its way: when the router is its own, it asks it
(`NodeRouter.node_events_pending_from`); when the node's partition is another
worker's, that worker's router tells it, with a **mark** on `by-job` (keyed by
the job, so it comes after every event routed to the job before it):

- `NodeRouter.marks`, every tick: for each job that another worker runs with
  a node on a `node-events` partition this router reads, that partition's
  point: the newest event time read there while it still has data to read, or
  "caught up" (nothing left).
- `Marks` (the job's worker): the newest mark per (job, partition). The job
  runs up to its point, and never past how far the job's own inputs had been
  read when it came (a record read after the mark may have been sent after a
  node event the router had not read yet): records wait a tick at most for the
  next mark. A partition never marked for the job yet (a job just started, a
  job restored on a new worker) holds it at its start. A partition whose marks
  stop (its worker was killed, the group is rebalancing) holds it where its
  last mark did, until a router marks it again or for `hold_s` after the mark
  went stale (`stale_s`); then the job goes on without it (a partition nobody
  reads must not stop the job for ever). The silence timer moves the job only
  while every such partition marked it lately as caught up (`quiet`).

A worker that reads every partition itself (one worker, or the node's partition
is its own) waits for no mark. The marks are not saved: a restored job waits
for fresh ones. Their format is internal to one app's `by-job` topic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import orjson

MARK_PREFIX = b'{"gangwatch_mark":'  # a by-job message that starts so is a mark, not records


def encode_mark(points: dict[int, float | None]) -> bytes:
    """A mark: node-events partition -> the event time its node events were routed up to (None: all it had)."""
    return orjson.dumps({"gangwatch_mark": 1, "points": {str(p): v for p, v in sorted(points.items())}})


def is_mark(value: bytes | None) -> bool:
    return value is not None and value.startswith(MARK_PREFIX)


def decode_mark(value: bytes) -> dict[int, float | None]:
    """`encode_mark`'s points (ValueError: not a mark this version reads)."""
    obj = orjson.loads(value)
    points = obj.get("points") if isinstance(obj, dict) else None
    if not isinstance(points, dict):
        raise ValueError("a router mark without points")
    out: dict[int, float | None] = {}
    for p, v in points.items():
        if v is not None and not isinstance(v, int | float):
            raise ValueError(f"a router mark's point is not a time: {v!r}")
        out[int(p)] = None if v is None else float(v)
    return out


class Marks:
    """The routers' newest marks for the jobs of this worker, and how far each job may run by them (no I/O:
    the caller passes its wall clock)."""

    def __init__(self, *, stale_s: float = 2.0, hold_s: float = 30.0) -> None:
        self.stale_s, self.hold_s = stale_s, hold_s
        # (job, partition) -> (how far it may run: the point, or the job's reach when the mark came; wall time)
        self.last: dict[tuple[str, int], tuple[float, float]] = {}
        self.caught_up: dict[tuple[str, int], bool] = {}  # ... and whether the mark said "nothing left"
        self.waiting: dict[tuple[str, int], float] = {}  # (job, partition) -> wall time it was first asked for
        self.given_up = 0  # (job, partition) waits that ran out (the job went on without that partition)

    def heard(self, job: str, points: dict[int, float | None], reach: float, now: float) -> None:
        """A mark for `job` was read; `reach`: the newest event time of the job's own inputs read so far (what
        the router had routed when it marked is at least what was sent before those: their time may go)."""
        for p, point in points.items():
            self.last[job, p] = (reach if point is None else min(point, reach), now)
            self.caught_up[job, p] = point is None
            self.waiting.pop((job, p), None)

    def point(self, job: str, partitions: Iterable[int], start: float, now: float) -> float:
        """The event time up to which `job` has every node event of these (other workers') partitions (see
        the module's docstring; `start`: the job's start time): inf when there are none, or every wait ran out."""
        out = math.inf
        for p in partitions:
            key = (job, p)
            last = self.last.get(key)
            since = self.waiting.setdefault(key, now) if last is None else last[1] + self.stale_s
            if now - since >= self.hold_s:  # nobody marks it: the job goes on without it
                if last is not None or since > -math.inf:
                    self.given_up += 1
                    self.last.pop(key, None)
                    self.waiting[key] = -math.inf  # (counted once; it holds nothing until a mark comes)
                continue
            out = min(out, start if last is None else last[0])
        return out

    def quiet(self, job: str, partitions: Iterable[int], now: float) -> bool:
        """Every one of these partitions marked the job lately as having nothing left to route: wall time
        that passes without records is the job's silence, not the routers' lag."""
        return all((job, p) in self.last and self.caught_up[job, p] and now - self.last[job, p][1] < self.stale_s
                   for p in partitions)

    def forget(self, jobs: Iterable[str]) -> None:
        """Jobs this worker no longer runs."""
        gone = set(jobs)
        for d in (self.last, self.caught_up, self.waiting):
            for key in [k for k in d if k[0] in gone]:
                del d[key]
