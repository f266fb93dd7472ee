"""Following gangwatch's output topics from outside the worker: the job controller and the fencing adapters.

    reader = TopicReader(bootstrap, [topics.actions], group="gangwatch-slurm", verify=TopicVerifier(secret))
    reader.wait_assigned(30.0)          # before anything it must not miss is published
    while running:
        for rec in reader.poll(0.5):    # decoded records; what does not decode is logged and skipped
            handle(rec)
        reader.commit()                 # after the records of the poll were handled: at least once

A consumer group (kafka-python) keeps the place across restarts. A new group
starts at the end of the topics unless `from_beginning`: old actions are usually
stale (draining nodes for an incident long over is no help, and a controller must
not apply actions published before it ever ran). Offsets are committed only after
the records of a poll were handled, so a reader that dies re-reads them and the
handlers skip what they applied by its id.

Actions are acted on only when signed: with `verify` (a `schemas.signature.TopicVerifier`
built from the worker's secret), an action whose record headers carry no valid v1
signature, a stale one, or a copy of one already accepted, is refused: logged on one
line (where it was, which action, why) and not handed out. A reader without `verify`
hands out no action at all (each refused the same way, "no secret to check its
signature with"): whatever acts on actions must have the secret.

A broker that goes away is waited for: a poll that fails is logged (once per
cause) and reads nothing; the next one tries again.

Waiting for the assignment polls the group; whatever that poll returns is kept
and handed out by the next `poll`, never dropped (a record published in the
moment between joining and the first poll would otherwise be lost).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gangwatch.schemas import DecodeError, Record, decode
from gangwatch.schemas.security import kafka_python_security

if TYPE_CHECKING:
    from gangwatch.schemas.signature import TopicVerifier

log = logging.getLogger("gangwatch.follow")


class TopicReader:
    """Records of some topics through a consumer group, committed after they were handled."""

    def __init__(self, bootstrap: str, names: Sequence[str], group: str, *, from_beginning: bool = False,
                 client_id: str | None = None, verify: TopicVerifier | None = None) -> None:
        from kafka import KafkaConsumer

        self.names = list(names)
        self._consumer = KafkaConsumer(*self.names, bootstrap_servers=bootstrap, group_id=group,
                                       auto_offset_reset="earliest" if from_beginning else "latest",
                                       enable_auto_commit=False, client_id=client_id or group,
                                       **kafka_python_security())
        self._uncommitted = False
        self.verify = verify
        self.refused = 0  # actions refused for their signature
        self._early: list[Any] = []  # messages a poll returned while waiting for the assignment
        self._down: str | None = None  # why the last poll failed (None: it did not)

    def wait_assigned(self, timeout_s: float) -> None:
        """Join the group and resolve the start offsets, so nothing published from now on is missed."""
        deadline = time.monotonic() + timeout_s
        while not self._consumer.assignment():
            if time.monotonic() > deadline:
                raise ConnectionError(f"no partition of {', '.join(self.names)} assigned within {timeout_s:g} s")
            for name in self.names:  # a topic made a moment ago may be missing from the first metadata: ask again
                self._consumer.partitions_for_topic(name)
            got = self._consumer.poll(timeout_ms=200)
            self._early.extend(m for msgs in got.values() for m in msgs)  # handed out by the next poll
        for tp in self._consumer.assignment():
            self._consumer.position(tp)  # resolve "latest" now, not at the first record

    def poll(self, timeout_s: float) -> list[Record]:
        """The records that arrived (waiting up to `timeout_s` for some), with their messages' keys."""
        return [rec for _, rec in self.poll_keyed(timeout_s)]

    def poll_keyed(self, timeout_s: float) -> list[tuple[bytes | None, Record]]:
        from kafka.errors import KafkaError

        if self._early:
            got: dict[Any, list[Any]] = {None: self._early}
            self._early = []
        else:
            try:
                got = self._consumer.poll(timeout_ms=int(timeout_s * 1000))
            except KafkaError as e:  # the broker away: kafka-python raises its group heartbeat's failure here
                why = str(e)  # (kafka-python's errors name their class)
                if why != self._down:
                    log.warning("%s: cannot read now (%s); trying again", ", ".join(self.names), why)
                    self._down = why
                time.sleep(timeout_s)  # the wait the poll would have made
                return []
            if self._down is not None:
                log.info("%s: reading again", ", ".join(self.names))
                self._down = None
        out: list[tuple[bytes | None, Record]] = []
        for msgs in got.values():
            for m in msgs:
                self._uncommitted = True
                for rec in decode(m.value):
                    if isinstance(rec, DecodeError):
                        log.warning("%s[%d]@%d: skipped, does not decode: %s", m.topic, m.partition, m.offset,
                                    rec.reason)
                    elif rec.kind == "action" and (why := self._refusal(m, rec)):
                        self.refused += 1
                        log.warning("%s[%d]@%d: refused action %s (%s %s of job %s): %s", m.topic, m.partition,
                                    m.offset, rec.id, rec.type, ",".join(rec.nodes) or "-", rec.job, why)
                    else:
                        out.append((m.key, rec))
        return out

    def _refusal(self, m: Any, action: Record) -> str:
        """Why the action of message `m` is not handed out ('' when it is)."""
        if self.verify is None:
            return "no secret to check its signature with"
        verdict = self.verify(m.value, m.headers, action.id)
        return "" if verdict else verdict.reason

    def commit(self) -> None:
        """Commit what was read; a broker that cannot take the commit now (down, its coordinator moving) is
        logged and the commit tried again after the next poll: what was read is read again at worst."""
        if not self._uncommitted:
            return
        from kafka.errors import KafkaError

        try:
            self._consumer.commit()
        except KafkaError as e:
            log.warning("%s: commit failed (%s: %s); tried again after the next poll", ", ".join(self.names),
                        type(e).__name__, e)
            return
        self._uncommitted = False

    def close(self) -> None:
        self._consumer.close()
