"""Put contract-v1 files onto the input topics, keyed as the worker expects.

    gangwatch publish run.jsonl.gz --bootstrap 127.0.0.1:9092 --realtime

Records of several files are merged by event time (as replay does) and sent to
the topic of their kind (`topics.topic_for`: job-keyed telemetry, jobs, traces,
ops; node-keyed node events). Consecutive records of one topic and key travel
as one `batch` envelope of up to `envelope` records, as the trainer client and
the node agent send them, so the worker pays its per-message cost per envelope.
Lines that do not decode go to the dead-letter topic with the reason.

Pacing: as fast as the broker takes them (a backlog, as a worker sees after an
outage), `rate` records per second, or `speed` x real time from the records'
event times (`speed=1`: live delivery). The clock and sleep are injectable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gangwatch.schemas import DeadLetter, DecodeError, Record, encode, encode_batch
from gangwatch.schemas.security import kafka_python_security
from gangwatch.schemas.topics import TopicSettings, topic_for
from gangwatch.streams.replay import InputFile, merged, unusable


@dataclass
class Published:
    records: int = 0
    messages: int = 0
    rejected: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    wall_s: float = 0.0
    stopped: list[str] | None = None
    invalid: list[str] | None = None  # inputs with lines but not one valid record
    empty: list[str] | None = None  # inputs without a line


Send = Callable[[str, bytes, bytes], None]  # (topic, key, value)


class Publisher:
    """Groups records into envelopes per (topic, key) and hands them to `send` in event-time order."""

    def __init__(self, send: Send, topics: TopicSettings, *, envelope: int = 64) -> None:
        self.send, self.topics, self.envelope = send, topics, envelope
        self._open: tuple[str, str] | None = None
        self._pending: list[Record] = []
        self.result = Published()

    def add(self, rec: Record) -> None:
        where = topic_for(rec, self.topics)
        if where != self._open or len(self._pending) >= self.envelope:
            self.flush()
            self._open = where
        self._pending.append(rec)
        r = self.result
        r.records += 1
        r.first_ts = rec.ts if r.first_ts is None else r.first_ts
        r.last_ts = rec.ts

    def reject(self, err: DecodeError, source: str, line: int, ts: float) -> None:
        self.flush()
        self.result.rejected += 1
        self.send(self.topics.dlq, source.encode(), DeadLetter.of(err, source, line=line, ts=ts).encode())

    def flush(self) -> None:
        if not self._pending:
            return
        topic, key = self._open  # type: ignore[misc]
        recs, self._pending = self._pending, []
        value = encode(recs[0]) if len(recs) == 1 else encode_batch(recs, ts=recs[-1].ts)
        self.send(topic, key.encode(), value)
        self.result.messages += 1


def publish(paths: list[Path], send: Send, topics: TopicSettings, *, envelope: int = 64,
            rate: float | None = None, speed: float | None = None,
            progress: Callable[[Published, float], None] | None = None,
            clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Published:
    """Send every record of `paths`; returns what was sent. `rate` and `speed` exclude each other."""
    inputs = [InputFile(p) for p in paths]
    total = sum(i.size for i in inputs) or 1
    pub = Publisher(send, topics, envelope=envelope)
    started = clock()
    first_ts: float | None = None
    next_progress = started
    for n, item in enumerate(merged(inputs), 1):
        v = item.value
        if isinstance(v, DecodeError):
            pub.reject(v, item.source, item.line, item.ts)
            continue
        due = None
        if speed is not None:
            first_ts = v.ts if first_ts is None else first_ts
            due = started + (v.ts - first_ts) / speed
        elif rate is not None:
            due = started + pub.result.records / rate
        if due is not None and due > clock():
            pub.flush()  # what is due now goes out before we wait
            sleep(max(0.0, due - clock()))
        pub.add(v)
        if progress is not None and n % 2048 == 0 and clock() >= next_progress:
            next_progress = clock() + 0.2
            progress(pub.result, sum(i.read_bytes for i in inputs) / total)
    pub.flush()
    pub.result.wall_s = clock() - started
    pub.result.stopped = [i.stopped for i in inputs if i.stopped]
    pub.result.invalid, pub.result.empty = unusable(inputs)
    return pub.result


def kafka_send(bootstrap: str, **config: Any) -> tuple[Send, Callable[[], None]]:
    """A `send` over a kafka-python producer, and a `close` that waits for every acknowledgement and raises
    `ConnectionError` naming the first failure."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="gangwatch-publish", linger_ms=20,
                             max_request_size=16 << 20, **{**kafka_python_security(), **config})
    errors: list[BaseException] = []

    def send(topic: str, key: bytes, value: bytes) -> None:
        producer.send(topic, key=key, value=value).add_errback(errors.append)

    def close() -> None:
        try:
            producer.flush(timeout=60)
        finally:
            producer.close(timeout=10)
        if errors:
            raise ConnectionError(f"{len(errors)} message(s) not acknowledged by Kafka, first: {errors[0]}")

    return send, close
