"""The trainer-side reporter: what a training process calls to send its steps and heartbeats.

    rep = Reporter("j1", rank=5, bootstrap="kafka1:9092")
    rep.start_heartbeats(period_s=5.0)           # a daemon thread: one heartbeat per period
    for step in ...:
        ...
        rep.step(step, step_s=1.84, compute_s=1.10, comm_wait_s=0.66, loss=2.31)
    rep.close()

Records are contract v1 (`step`, `heartbeat`, `framework`), keyed by job so that
every record of a job reaches one partition in order, and packed into `batch`
envelopes: a flush sends what accumulated since the last one as one message.
`send` and `clock` are injectable, so tests need neither Kafka nor time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gangwatch.schemas import Framework, Heartbeat, Record, Step, encode, encode_batch

Send = Callable[[str, bytes, bytes], None]  # (topic, key, value)


class Reporter:
    """Steps, heartbeats and framework events of one rank, sent to the telemetry topic."""

    def __init__(self, job: str, rank: int, *, bootstrap: str | None = None, send: Send | None = None,
                 topic: str = "gw.telemetry", clock: Callable[[], float] = time.time, batch_max: int = 64) -> None:
        if (bootstrap is None) == (send is None):
            raise ValueError("give exactly one of `bootstrap` (a Kafka address) or `send` (a function)")
        self.job, self.rank, self.topic = job, rank, topic
        self._clock, self._batch_max = clock, batch_max
        self._producer = None
        if send is None:
            from kafka import KafkaProducer  # imported here: tests with `send` need no Kafka client

            self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
            send = lambda topic, key, value: self._producer.send(topic, key=key, value=value)  # noqa: E731
        self._send = send
        self._pending: list[Record] = []
        self._lock = threading.Lock()
        self._last_step: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what the trainer calls ------------------------------------------------------

    def step(self, step: int, step_s: float, **fields: Any) -> None:
        """One finished step; `fields` are the optional Step fields (compute_s, comm_wait_s, loss, ...)."""
        self._add(Step(ts=self._clock(), job=self.job, rank=self.rank, step=step, step_s=step_s, **fields))
        self._last_step = step
        self.flush()

    def event(self, type: str, message: str = "", **fields: Any) -> None:
        """A framework event (`nccl_timeout`, `exception`, `exit`, ...), sent at once."""
        self._add(Framework(ts=self._clock(), job=self.job, rank=self.rank, type=type, message=message, **fields))
        self.flush()

    def heartbeat(self) -> None:
        """The process is alive (with the last finished step)."""
        self._add(Heartbeat(ts=self._clock(), job=self.job, rank=self.rank, step=self._last_step))
        self.flush()

    def start_heartbeats(self, period_s: float = 5.0) -> None:
        """Send a heartbeat every `period_s` from a daemon thread until `close()`."""
        def loop() -> None:
            while not self._stop.wait(period_s):
                self.heartbeat()

        self.heartbeat()
        self._thread = threading.Thread(target=loop, name="gangwatch-heartbeat", daemon=True)
        self._thread.start()

    # --- sending ---------------------------------------------------------------------

    def _add(self, rec: Record) -> None:
        with self._lock:
            self._pending.append(rec)

    def flush(self) -> None:
        """Send what is pending: one record as itself, several as one `batch` message."""
        with self._lock:
            pending, self._pending = self._pending, []
        key = self.job.encode()
        for i in range(0, len(pending), self._batch_max):
            chunk = pending[i:i + self._batch_max]
            value = encode(chunk[0]) if len(chunk) == 1 else encode_batch(chunk, ts=chunk[-1].ts)
            self._send(self.topic, key, value)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.flush()
        if self._producer is not None:
            self._producer.flush()
            self._producer.close()
