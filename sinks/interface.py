"""The sink interface: where the core's outputs go.

A sink takes `Outputs` (findings, actions, incidents, node-profile snapshots)
and `DeadLetter`s (rejected messages, with where they came from) as they are
produced, and `flush()`es at checkpoints: the replay end, or before a
Faust worker commits offsets. Sinks are idempotent on the record ids, so a
retried flush or a replayed partition does not double anything downstream.

The worker does not call a sink that talks to the network from its event loop:
it wraps it in a `sinks.queued.QueuedSink` (a bounded queue and a delivery
thread of its own) or uses one that sends off-thread by itself (`AsyncSink`:
the Alertmanager sink). A sink that does its own I/O in `write`/`flush` says how
a failure may be treated by raising `DeliveryError` (or an exception that
`sinks.queued.classify` knows): transient (the same call may succeed later) or
permanent (it never will: the item becomes a dead letter).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from gangwatch.schemas import DeadLetter, Outputs, Record


class Sink(Protocol):
    def write(self, out: Outputs) -> None:
        """Take the outputs of one core call (may buffer)."""

    def reject(self, dead: DeadLetter) -> None:
        """Take one rejected message, with why and where it came from."""

    def observe(self, rec: Record) -> None:
        """Take one raw input record (for sinks that keep telemetry)."""

    def flush(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncSink(Protocol):
    """A sink whose `write`, `reject`, `observe` and `flush` never wait on I/O (they hand over to a thread).

    `pressure()` is True while its backlog is above its high-water mark (until it falls below
    the low-water mark); `take_dead()` hands over (and forgets) the dead letters of what could
    never be delivered; `pending()` is the backlog; `drain(timeout_s)` waits until it is sent
    and returns what is left; `close()` drains within its own timeout and returns what was left.
    """

    def pressure(self) -> bool: ...

    def take_dead(self) -> list[DeadLetter]: ...

    def pending(self) -> int: ...

    def drain(self, timeout_s: float) -> int: ...


class DeliveryError(Exception):
    """A delivery failed. `transient`: the same call may succeed later (retry it); else it never will.

    `retry_after` (seconds) is the receiver's own hint (an HTTP `Retry-After`), or None. `ids`
    names the records that failed permanently by themselves, when the sink knows (the webhook
    does: one POST per action), so the caller dead-letters them and delivers the rest without
    searching for them.
    """

    def __init__(self, reason: str, *, transient: bool, retry_after: float | None = None,
                 ids: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.reason = reason
        self.transient = transient
        self.retry_after = retry_after
        self.ids = ids
