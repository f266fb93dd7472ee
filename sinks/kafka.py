"""The alert topics: the core's outputs published to Kafka with kafka-python.

findings → `gw.findings`, actions → `gw.actions` (the alert topic a job
controller may consume instead of the webhook), incidents → `gw.incidents`,
rejected messages → `gw.dlq`. Each record is `schemas.encode(record)` keyed by
its job id, so every record of a job lands in one partition, in order. A dead
letter is `schemas.DeadLetter` (why, where it came from, its text), keyed by
its source. With a `signer` each action carries the v1 signature in its record
headers (sinks/webhook.py): actuators on the topic refuse actions without it.

Sends are asynchronous; `flush()` waits for every one to be acknowledged by all
in-sync replicas (`acks='all'`, idempotent producer) and raises
`KafkaSinkError` if any failed, so a worker that flushes before committing its
offsets re-reads rather than loses them (the record ids make the retry harmless).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gangwatch.schemas import DeadLetter, Outputs, Record, encode
from gangwatch.schemas.security import kafka_python_security
from gangwatch.sinks.interface import DeliveryError
from kafka import KafkaProducer

if TYPE_CHECKING:
    from gangwatch.schemas.signature import TopicSigner

log = logging.getLogger(__name__)

FINDINGS_TOPIC = "gw.findings"
ACTIONS_TOPIC = "gw.actions"
INCIDENTS_TOPIC = "gw.incidents"
DLQ_TOPIC = "gw.dlq"


class KafkaSinkError(DeliveryError):
    """Some records were not acknowledged by the broker since the last flush.

    Transient when every error was one kafka-python marks retriable (a timeout, a leader moving); else
    permanent, naming in `ids` the records whose own error never heals (a message too large, a topic
    authorization failure), so a delivery queue dead-letters those and sends the others again.
    """


class KafkaSink:
    """Publishes findings, actions, incidents and dead letters to their topics.

    `producer` replaces the KafkaProducer (a fake in unit tests); otherwise one is
    built with `acks='all'`, `linger_ms`, the `GANGWATCH_KAFKA_*` security settings
    (schemas/security.py) and any extra kafka-python `config` (which wins).
    `flush_timeout_s` bounds how long `flush()` waits for acknowledgements.
    """

    def __init__(self, bootstrap_servers: str | list[str] = "127.0.0.1:9092", *,
                 findings_topic: str = FINDINGS_TOPIC, actions_topic: str = ACTIONS_TOPIC,
                 incidents_topic: str = INCIDENTS_TOPIC, dlq_topic: str = DLQ_TOPIC, linger_ms: int = 5,
                 flush_timeout_s: float = 30.0, client_id: str = "gangwatch-sink", producer: Any = None,
                 signer: TopicSigner | None = None, **config: Any) -> None:
        self.topics = {"finding": findings_topic, "action": actions_topic, "incident": incidents_topic}
        self.dlq_topic = dlq_topic
        self.signer = signer  # signs each action (sinks/webhook.py: what actuators on the topic check)
        self.flush_timeout_s = flush_timeout_s
        self._producer = producer if producer is not None else KafkaProducer(
            bootstrap_servers=bootstrap_servers, client_id=client_id, acks="all", linger_ms=linger_ms,
            **{**kafka_python_security(), **config})
        self._errors: list[tuple[str, str, BaseException]] = []  # (topic, record id, error) since last flush
        self.sent = 0  # records handed to the producer
        self.failed = 0  # records the broker did not acknowledge

    def write(self, out: Outputs) -> None:
        for rec in (*out.findings, *out.actions, *out.incidents):
            value = encode(rec)
            headers = self.signer.headers(value, rec.id) if self.signer is not None and rec.kind == "action" else None
            self._send(self.topics[rec.kind], rec.job.encode(), value, rec.id, headers)

    def reject(self, dead: DeadLetter) -> None:
        self._send(self.dlq_topic, dead.source.encode(), dead.encode(), dead.where)

    def observe(self, rec: Record) -> None:
        pass

    def _send(self, topic: str, key: bytes, value: bytes, what: str, headers: list | None = None) -> None:
        fut = self._producer.send(topic, key=key, value=value, **({"headers": headers} if headers else {}))
        fut.add_errback(self._on_error, topic, what)
        self.sent += 1

    def _on_error(self, topic: str, what: str, exc: BaseException) -> None:
        # runs on the producer's I/O thread: record it, let flush() raise on the caller's thread
        self._errors.append((topic, what, exc))

    def flush(self) -> None:
        """Wait until every record sent so far is acknowledged; raise `KafkaSinkError` if any was not."""
        self._producer.flush(timeout=self.flush_timeout_s)
        if self._errors:
            errors, self._errors = self._errors, []
            self.failed += len(errors)
            topic, what, exc = errors[0]
            for t, w, e in errors:
                log.error("kafka: %s to %s was not acknowledged: %s", w, t, e)
            lasting = tuple(w for _, w, e in errors if getattr(e, "retriable", True) is False)
            raise KafkaSinkError(f"{len(errors)} record(s) not acknowledged, first {what} to {topic}: "
                                 f"{type(exc).__name__}: {exc}", transient=not lasting, ids=lasting) from exc

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._producer.close(timeout=self.flush_timeout_s)
