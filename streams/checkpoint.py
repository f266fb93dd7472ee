"""A job's state is saved only once its outputs are settled in every sink.

The worker hands each sink's deliveries to a queue of its own (`sinks.queued`), so
outputs may still wait there when a batch is done. Were the job's state written at
once, a worker killed in that moment would leave a state that says "done" for outputs
no sink ever got: its replacement restores that state, reads on after it, and the
controller never hears of the action. So a state is written only when every queued
sink has *settled* (delivered, or turned into a dead letter) everything flushed
before that state was taken:

    cps = Checkpoints(sinks, write=lambda job, blob: table[job.encode()] = blob)
    cps.offer({job: blob, ...})     # after the batch's outputs were flushed into the sinks
    cps.note_settled()              # before the sinks' dead letters are taken (and published)
    cps.write_settled()             # writes every state whose outputs are settled

A state not yet written is no loss: the saved one is older, and a replacement worker
restores it, reads the inputs after it again and delivers their outputs (with the
same ids: sinks are idempotent, so what was delivered twice is not doubled). The
input offsets live in the state (`streams.jobstate.JobState`), so reading again starts
exactly there.

Per job at most two states wait: the oldest (whose outputs are on their way) and the
newest (replaced by each later batch). Once the oldest is written the newest moves
up, so a sink that is always a little behind still lets states through, one
delivery behind it; memory stays two states per job whatever the sinks do.
Sinks without marks (those that send nothing, or that keep nothing worth waiting
for, as the Alertmanager sink, whose alerts are re-sent while they last) do not hold
states back; without queued sinks every state is written at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

Marks = tuple[int, ...]


class Checkpoints:
    """States waiting for their outputs to settle in every sink that has marks (`mark()`, `done()`)."""

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
