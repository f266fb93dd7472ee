"""The sink interface: where the core's outputs go.

A sink takes `Outputs` (findings, actions, incidents, node-profile snapshots)
and `DeadLetter`s (rejected messages, with where they came from) as they are
produced, and `flush()`es at checkpoints: the replay end, or before a
Faust worker commits offsets. Sinks are idempotent on the record ids, so a
retried flush or a replayed partition does not double anything downstream.
"""

from __future__ import annotations

from typing import Protocol

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
