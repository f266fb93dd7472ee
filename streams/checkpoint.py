"""The worker's checkpoint: one protocol, in one place (`Checkpoint`).

A checkpoint makes three things agree: what the sinks have, what the saved job states say is done, and where
the consumer group resumes reading. Its steps run in this order, always:

1. **Sinks settle.** The worker hands each sink's deliveries to a queue of its own (`sinks.queued`), so outputs
   may still wait there when a batch is done. A job's state taken after a batch waits (`PendingStates`) until
   every queued sink has settled (delivered, or turned into a dead letter) everything flushed before it was
   taken. Were it written at once, a worker killed in that moment would leave a state that says "done" for
   outputs no sink ever got.
2. **States are written** to the worker's table (its changelog topic on the broker). A write counts once the
   broker has confirmed its changelog message, not when it sits in the producer's buffer (`confirm`).
3. **Offsets are committed** no further than the written, confirmed states cover (`resume_points`: the runner's
   records not in a confirmed state, held, pending or read since; the router's events still held; a partition's
   hole not read yet), nor past what was handed to the runner. Faust's own commits go through the same cap
   (`commit`, installed by `install`); `commit_read` commits on the tick what the cap held back before.

Resuming. A replacement worker (after a crash, a kill or a rebalance) restores the saved states of its
partitions and reads each input from the group's committed offset. By step 3 that offset is never past a record
that a saved state does not cover: it is at or below every saved state's own resume point there (the lowest
offset its `Coverage` lists as not processed). The restored states then tell the records they processed (skipped,
by `JobState.offsets`) from those they owe (processed when read). Records a job holds for a slower input are in
no state until one is written that lists them owed, so the commit stays below them and a kill leaves no gap.

A state not yet written is no loss: the saved one is older, and the replacement reads the inputs after it again
and delivers their outputs with the same ids (sinks are idempotent). Per job at most two states wait for the
sinks: the oldest (whose outputs are on their way) and the newest (replaced by each later batch), so a sink
that is always a little behind still lets states through, one delivery behind it. Sinks without marks (those
that keep nothing worth waiting for, as the Alertmanager sink, whose alerts are re-sent while they last) hold no
state back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from faust.types import TP
    from gangwatch.streams.router import NodeRouter
    from gangwatch.streams.runner import JobRunner

log = logging.getLogger("gangwatch.worker")

Marks = tuple[int, ...]
Where = tuple[str, int]  # (topic, partition)
Commit = Callable[[dict[Any, int]], Awaitable[bool]]  # offsets -> whether the broker took them


def tp(topic: str, partition: int) -> TP:
    """Faust's topic-partition (imported here only when a worker runs)."""
    from faust.types import TP

    return TP(topic, partition)


class PendingStates:
    """Step 1: states waiting for their outputs to settle in every sink that has marks (`mark()`, `done()`)."""

    def __init__(self, sinks: Iterable[Any], write: Callable[[str, bytes], None]) -> None:
        self.sinks = [s for s in sinks if callable(getattr(s, "mark", None)) and callable(getattr(s, "done", None))]
        self._write = write
        self._waiting: dict[str, list[tuple[Marks, bytes]]] = {}  # job -> [oldest, newest]
        self._settled: Marks = tuple(s.done() for s in self.sinks)
        self.written = 0  # states written
        self.held = 0  # states offered that had to wait

    def offer(self, states: Mapping[str, bytes]) -> None:
        """States taken after their outputs were flushed into the sinks: written now if nothing is on its way,
        else kept (the oldest waiting one stays, the newest replaces the one behind it)."""
        if not states:
            return
        marks = tuple(s.mark() for s in self.sinks)
        for job, blob in states.items():
            queue = self._waiting.get(job)
            if queue is None and self._reached(marks, self._settled):
                self._write(job, blob)
                self.written += 1
                continue
            self.held += 1
            if queue is None:
                self._waiting[job] = [(marks, blob)]
            elif len(queue) == 1:
                queue.append((marks, blob))
            else:
                queue[1] = (marks, blob)

    def note_settled(self) -> None:
        """Take the sinks' settled marks now: call it before their dead letters are taken, so a state is never
        written before the dead letters of its outputs are handed on."""
        self._settled = tuple(s.done() for s in self.sinks)

    def write_settled(self) -> int:
        """Write every waiting state whose outputs were settled at the last `note_settled()`; how many."""
        n = 0
        for job in list(self._waiting):
            queue = self._waiting[job]
            while queue and self._reached(queue[0][0], self._settled):
                _, blob = queue.pop(0)
                self._write(job, blob)
                n += 1
            if not queue:
                del self._waiting[job]
        self.written += n
        return n

    def drop(self, jobs: Iterable[str]) -> None:
        """Forget the waiting states of jobs this worker no longer has (their new owner restores the saved one)."""
        for job in jobs:
            self._waiting.pop(job, None)

    def waiting(self) -> int:
        """Jobs whose newest state is not written yet."""
        return len(self._waiting)

    @staticmethod
    def _reached(marks: Marks, settled: Marks) -> bool:
        return all(d >= m for m, d in zip(marks, settled, strict=True))


class Checkpoint:
    """The worker's checkpoint protocol (see the module docstring): sinks settle -> states written and confirmed
    -> offsets committed under the cap.

    `table`: the state table (a Faust table, or a plain mapping in tests); `read` and `holes`: the reader's
    (`WorkerIO`) next offset per input after what it handed to the runner, and the first offset of each input
    not handed over yet; `assignment()`: the input partitions this worker holds now.
    """

    def __init__(self, sinks: Iterable[Any], table: Any, runner: JobRunner, router: NodeRouter,
                 read: Mapping[Where, int], holes: Mapping[Where, int], assignment: Callable[[], Collection[Any]],
                 watch_changelog: Callable[[Any, Callable[[Any], None]], bool] | None = None) -> None:
        self.table, self.runner, self.router = table, runner, router
        self.read, self.holes, self.assignment = read, holes, assignment
        self.pending = PendingStates(sinks, self._write)
        self.saves = 0  # states written to the table
        # written states whose changelog message the broker has not confirmed yet (future None: a plain mapping,
        # which has no changelog to wait for)
        self.unconfirmed: list[tuple[str, bytes, asyncio.Future | None]] = []
        self._sent: Any = None  # the future of the changelog message the last write sent
        if watch_changelog is not None:
            watch_changelog(table, lambda fut: setattr(self, "_sent", fut))
        self.committed: dict[Any, int] = {}  # what this worker last committed, per input
        self._commit: Commit | None = None  # Faust's own commit, under the cap (`install`)

    # --- 1 and 2: states ------------------------------------------------------------------------------------

    def offer(self, states: Mapping[str, bytes]) -> None:
        """States taken after their batch's outputs were flushed into the sinks (step 1)."""
        self.pending.offer(states)

    def sinks_settled(self) -> None:
        """Take the sinks' settled marks (before their dead letters are taken and published)."""
        self.pending.note_settled()

    def write_settled(self) -> int:
        """Step 2: write every state whose outputs the sinks have settled."""
        return self.pending.write_settled()

    def drop(self, jobs: Iterable[str]) -> None:
        self.pending.drop(jobs)

    def _write(self, job: str, blob: bytes) -> None:
        if self.runner.jobs.get(job) is not None:  # still ours
            self._sent = None
            self.table[job.encode()] = blob
            self.unconfirmed.append((job, blob, self._sent))
            self.saves += 1

    def confirm(self) -> None:
        """Tell the runner which written states the broker has, in the order they were written (a state counts
        for the cap only from here)."""
        done = 0
        for job, blob, fut in self.unconfirmed:
            if fut is not None and not fut.done():
                break
            done += 1
            if fut is None or not fut.cancelled() and fut.exception() is None:
                self.runner.saved(job, blob)
        del self.unconfirmed[:done]

    # --- 3: commits -----------------------------------------------------------------------------------------

    def resume_points(self) -> dict[Where, int]:
        """Per input, the lowest offset a replacement must read again: what no confirmed state covers (the
        runner's), what the router still holds, and a hole not read yet."""
        self.confirm()
        points = {**self.runner.resume_points(), **self.router.resume_points()}
        for where, offset in self.holes.items():
            points[where] = min(points.get(where, offset), offset)
        return points

    def install(self, wrap: Callable[[Commit], Commit]) -> None:
        """Route Faust's own commits through the cap: `wrap(capped)` installs `capped` and returns Faust's commit.

        Faust commits the offset after the messages its streams acknowledged, and `take_events` acknowledges a
        whole batch, held records included. Its own view of what is committed is left alone (its
        acknowledgement bookkeeping depends on it); only what reaches the broker is lowered, and `commit_read`
        commits the rest once the records are saved."""
        if self._commit is None:
            self._commit = wrap(self.commit)

    async def commit(self, offsets: dict[Any, int]) -> bool:
        """Commit `offsets`, each no further than what was handed to the runner (Faust counts offsets it dropped
        as read) nor than `resume_points`; inputs nothing was handed from since the assignment are left."""
        points, read = self.resume_points(), self.read
        capped = {t: min(offset, read[where], points.get(where, offset)) for t, offset in offsets.items()
                  if (where := (t.topic, t.partition)) in read}
        if not capped:
            return True
        assert self._commit is not None, "install() first"
        done = await self._commit(capped)
        if done:
            self.committed.update(capped)
        return bool(done)

    def due(self) -> dict[Any, int]:
        """Per assigned input, what was handed to the runner, where this worker has not committed as far as the
        cap allows."""
        points, assigned, due = self.resume_points(), self.assignment(), {}
        for (topic, partition), read in self.read.items():
            t = tp(topic, partition)
            if t in assigned and min(read, points.get((topic, partition), read)) > self.committed.get(t, -1):
                due[t] = read
        return due

    async def commit_read(self) -> None:
        """Commit, under the cap, what was handed to the runner and is not committed yet.

        Faust commits only when its acknowledgements move: what the cap lowered, or a commit the broker refused
        during a rebalance (which Faust takes as done), would stay behind at the end of the input. Committing
        what was read, on the tick, keeps the group's offsets with the worker whatever Faust's view."""
        due = self.due()
        if due and not await self.commit(due):
            log.info("a commit of %d inputs was refused (a rebalance?); again on the next tick", len(due))

    def revoked(self, tps: Iterable[Any]) -> None:
        for t in tps:
            self.committed.pop(t, None)

    def capped(self) -> dict[Where, int]:
        """Inputs whose commit the cap holds below what was read: (topic, partition) -> read up to."""
        points = self.resume_points()
        return {where: read for where, read in self.read.items() if points.get(where, read) < read}
