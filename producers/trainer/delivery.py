"""Getting records to Kafka from the client's sending thread, whatever the broker does.

Each flush packs the records of one topic into `batch` envelopes (one message
of up to `batch_max` records), keyed by the job id so every record of a job
reaches one partition in order. A message is sent only when nothing older is
waiting; otherwise, or when the send fails, it goes to the spool (spool.py),
and the spool is sent first, oldest message first, on every later flush.

After a failure the broker is left alone for a while (0.5 s, doubling up to
5 s) and messages go straight to the spool, so an outage costs one timed-out
send per back-off period, not one per message. The cap is short on purpose:
once the broker is back, every producer of a job must resume within the
worker's reconnect grace (`streams.runner`, 15 s), or the ones still waiting
would look silent next to the ones already sending.

`send(topic, key, value)` must deliver one message or raise. The default,
`KafkaSend`, creates its kafka-python producer on first use, so a broker that
is down when training starts delays nothing but this thread.
"""

from __future__ import annotations

import atexit
import logging
import time
from collections.abc import Callable, Iterable

from gangwatch.producers.trainer.spool import Message, Spool
from gangwatch.schemas import Record, encode_batch
from gangwatch.schemas.security import kafka_python_security

log = logging.getLogger("gangwatch.trainer")
Send = Callable[[str, bytes, bytes], None]  # (topic, key, value); raises when not delivered


class Delivery:
    """Sends batch messages, or spools them while the broker is away; counts what was lost."""

    def __init__(self, send: Send, key: str, spool: Spool, *, batch_max: int = 1000,
                 backoff_s: tuple[float, float] = (0.5, 5.0), clock: Callable[[], float] = time.monotonic) -> None:
        self.send, self.key, self.spool = send, key.encode(), spool
        self.batch_max, self._backoff, self._clock = batch_max, backoff_s, clock
        self._delay = 0.0  # current back-off; 0 while the broker answers
        self._retry_at = 0.0
        self.dropped = 0  # records lost: the spool's size bound, or a spool that cannot be written
        # counts read by the metrics endpoint (producers/metrics.py); only the sending thread writes them
        self.kinds: dict[str, int] = {}  # records handed over, by kind (sent or spooled)
        self.sent_messages = 0  # messages the broker acknowledged, new or from the spool
        self.sent_records = 0  # records in them
        self.failures = 0  # sends that failed

    def deliver(self, by_topic: Iterable[tuple[str, list[Record]]], ts: float, deadline: float | None = None) -> None:
        """Send the spool's backlog, then these records (or spool them); stop sending at `deadline`."""
        self._drain(deadline)
        kinds = self.kinds
        for topic, recs in by_topic:
            for rec in recs:
                kinds[rec.kind] = kinds.get(rec.kind, 0) + 1
            for i in range(0, len(recs), self.batch_max):
                chunk = recs[i:i + self.batch_max]
                try:
                    msg = (topic, len(chunk), encode_batch(chunk, ts=ts))
                except TypeError as e:  # a value that is not plain JSON (e.g. in a step's extra fields)
                    self.dropped += len(chunk)
                    log.warning("gangwatch: %d records lost, cannot encode them: %s", len(chunk), e)
                    continue
                if self.spool or not self._try(msg, deadline):
                    self._to_spool(msg)

    def _drain(self, deadline: float | None = None) -> None:
        """Send spooled messages in order until the spool is empty or a send fails."""
        while (msg := self.spool.peek()) is not None and self._try(msg, deadline):
            self.spool.pop()
            if not self.spool:
                log.info("gangwatch: the spool is sent; Kafka is reachable again")

    def _try(self, msg: Message, deadline: float | None) -> bool:
        now = self._clock()
        if now < self._retry_at or (deadline is not None and now >= deadline):
            return False
        topic, count, value = msg
        try:
            self.send(topic, self.key, value)
        except Exception as e:  # whatever the client raises, training goes on
            self.failures += 1
            if not self._delay:
                log.warning("gangwatch: cannot send to Kafka (%s: %s); spooling to %s", type(e).__name__, e,
                            self.spool.directory)
            self._delay = min(self._backoff[1], max(self._backoff[0], 2 * self._delay))
            self._retry_at = now + self._delay
            return False
        self._delay = 0.0
        self.sent_messages += 1
        self.sent_records += count
        return True

    def _to_spool(self, msg: Message) -> None:
        try:
            self.dropped += self.spool.append(msg)
        except OSError as e:
            self.dropped += msg[1]
            log.warning("gangwatch: cannot write the spool in %s (%s); %d records lost", self.spool.directory, e,
                        msg[1])


class KafkaSend:
    """The default `send`: a kafka-python producer made on first use; each send waits for the broker's ack.

    A failed send closes the producer without waiting (so it cannot deliver the
    message later behind the spool's back) and the next send makes a new one.

    kafka-python closes each producer from an `atexit` handler of its own. Made
    after the client registered its `close`, that handler would run first (atexit
    runs last in, first out) and leave the client's last records, the `exit` or
    `exception` of a process that ends by `sys.exit` or an uncaught exception, to
    a closed producer: spooled, and sent only by the next process of the rank. So
    the handler is taken back; the client's close closes the producer (`close`).
    """

    def __init__(self, bootstrap: str, timeout_s: float = 5.0) -> None:
        self.bootstrap, self.timeout_s = bootstrap, timeout_s
        self._producer = None

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        if self._producer is None:
            from kafka import KafkaProducer

            ms = int(self.timeout_s * 1000)
            self._producer = KafkaProducer(
                bootstrap_servers=self.bootstrap, bootstrap_timeout_ms=ms, max_block_ms=ms, request_timeout_ms=ms,
                delivery_timeout_ms=2 * ms, linger_ms=0, compression_type="gzip", max_request_size=16 << 20,
                client_id="gangwatch-trainer", **kafka_python_security())
            cleanup = getattr(self._producer, "_cleanup", None)
            if cleanup is not None:  # kafka-python's own atexit close: ours (the client's) comes after the last send
                atexit.unregister(cleanup)
        try:
            self._producer.send(topic, key=key, value=value).get(timeout=2 * self.timeout_s + 1)
        except Exception:
            self.close(timeout_s=0)
            raise

    def close(self, timeout_s: float = 2.0) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            producer.close(timeout=timeout_s)
