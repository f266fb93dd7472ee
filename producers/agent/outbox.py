"""Getting the agent's records to Kafka: a bounded queue, one sending thread, a spool per key.

Collectors hand records (contract-v1 dicts) to `Outbox.put` from their own
threads. Each is checked against the contract first (`decode_obj`): a record
the worker would refuse is dropped here, with the reason in the log. The queue
is bounded (`queue_max`); when the sending thread cannot keep up, the oldest
record is dropped and counted.

The sending thread wakes when records are queued, and at least every
`flush_s`, and hands them to the trainer client's delivery
(`trainer/delivery.py`): batch envelopes per topic, sent in order; while the
broker is away they go to a bounded spool on local disk and are sent first,
oldest first, when it is back. The agent never waits for the broker to start.

Where records go (the worker's expectations, docs/contract.md):

| kinds        | topic                  | key  |
|--------------|------------------------|------|
| hw, gpu      | `<prefix>node-events`  | node |
| heartbeat    | `<prefix>telemetry`    | job  |
| stack, flight| `<prefix>traces`       | job  |

The node's relay (relay.py) hands over envelopes it packed from the training
processes' records (`put_envelope`): each is sent as one message to the topic
and key it names, after the collectors' records of the same cycle, and the
relay is told once it was sent, spooled or given up (counted).

A `Delivery` sends under one key, so there is one per key, each with its own
spool directory under `spool_dir` (named after the key, with a file `key`
holding it): a restarted agent finds its predecessor's backlog there and sends
it before anything new.

The sending thread never waits on the broker for long, so the relay's frames
are answered within a second or two whatever Kafka does (its clients would
otherwise give up on it and each open a Kafka connection of its own, just when
the broker is in trouble). Two bounds:

- one send: `PatientSend` runs the Kafka client on a thread of its own and
  gives up waiting after `send_wait_s` (1 s; a broker that is away holds a
  send for its metadata wait, 5 s and more). The message goes to the spool; the
  send left behind may still get through, and then the spool's copy is not
  sent again. While it waits no other message is tried: they spool at once.
- one cycle: sending stops `cycle_s` (0.5 s) after a cycle started and the rest
  spools behind what is already there, so the backlog of a long outage is sent
  in slices between the new records once the broker is back, never holding
  them up. A cycle that sent part of a backlog is followed by the next at once.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gangwatch.producers.trainer.delivery import Delivery, Send
from gangwatch.producers.trainer.spool import Spool
from gangwatch.schemas import DecodeError, Record, decode_obj
from gangwatch.schemas.topics import TopicSettings

log = logging.getLogger("gangwatch.agent")



def destination(rec: Record, topics: TopicSettings) -> tuple[str, str]:
    """(topic, key) of an agent record: node events keyed by node, heartbeats (of frozen ranks) and traces by job."""
    if rec.kind in ("hw", "gpu"):
        return topics.node_events, rec.node
    if rec.kind == "heartbeat":
        return topics.telemetry, rec.job
    return topics.traces, rec.job


def spool_name(key: str) -> str:
    """A directory name for a key: readable, and distinct for keys that only differ in unsafe characters."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", key)[:100]
    return f"{safe}-{hashlib.sha1(key.encode()).hexdigest()[:8]}"


class BrokerSlow(TimeoutError):
    """A send `PatientSend` stopped waiting for (or did not start: an earlier one still waits)."""


class PatientSend:
    """A `send` run on a thread of its own, waited for at most `wait_s`; raises `BrokerSlow` after that.

    One message is in flight at a time: while a send the caller stopped waiting
    for still runs, every call raises `BrokerSlow` at once. A message whose send
    the caller gave up on but which got through after all is remembered (the
    last one only): asked to send exactly that message again (its copy from the
    spool), this returns without sending it twice.
    """

    def __init__(self, send: Send, wait_s: float = 1.0) -> None:
        self.send, self.wait_s = send, wait_s
        self._cond = threading.Condition()
        self._msg: tuple[str, bytes, bytes] | None = None  # handed to the thread, not done yet
        self._error: BaseException | None = None  # how the last send ended
        self._abandoned = False  # the caller stopped waiting for the message in flight
        self._late: tuple[str, bytes, bytes] | None = None  # abandoned, and delivered after all
        self._closed = False
        self._thread: threading.Thread | None = None

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        msg = (topic, key, value)
        with self._cond:
            if self._msg is not None:
                raise BrokerSlow("an earlier message still waits for the broker")
            if self._late is not None and self._late == msg:
                self._late = None  # it got there: not again
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gangwatch-agent-kafka", daemon=True)
                self._thread.start()
            self._msg, self._error = msg, None
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self._msg is None, self.wait_s):
                self._abandoned = True
                raise BrokerSlow(f"no answer from the broker within {self.wait_s:g} s")
            if self._error is not None:
                raise self._error

    @property
    def busy(self) -> bool:
        """Whether a send is in flight (one the caller may have stopped waiting for)."""
        with self._cond:
            return self._msg is not None

    @property
    def got_through_late(self) -> bool:
        """Whether the send the caller last stopped waiting for got through after all (its spooled copy is not
        sent again)."""
        with self._cond:
            return self._late is not None

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._msg is not None or self._closed)
                if self._msg is None:
                    return
                msg = self._msg
            try:
                self.send(*msg)
                error = None
            except Exception as e:
                error = e
            with self._cond:
                if self._abandoned and error is None:
                    self._late = msg
                self._msg, self._error, self._abandoned = None, error, False
                self._cond.notify_all()

    def close(self) -> None:
        """Stop the thread; close the client it wraps unless a send still holds it after `wait_s` (the process's
        exit ends that one)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            idle = self._cond.wait_for(lambda: self._msg is None, self.wait_s)
        close = getattr(self.send, "close", None)
        if idle and close is not None:
            close()


class Outbox:
    """Records from every collector, sent to Kafka by one thread, or spooled while it is away.

    `send_wait_s` and `cycle_s` bound the sending thread's waits (see the module's docstring)."""

    def __init__(self, send: Send, spool_dir: Path, *, topic_prefix: str = "gw.", queue_max: int = 10_000,
                 flush_s: float = 1.0, spool_bytes: int = 64 << 20, send_wait_s: float = 1.0, cycle_s: float = 0.5,
                 clock: Callable[[], float] = time.time, timer: Callable[[], float] = time.monotonic) -> None:
        self.send, self.spool_dir, self.topic_prefix = PatientSend(send, send_wait_s), Path(spool_dir), topic_prefix
        self.topics = TopicSettings(prefix=topic_prefix)
        self.queue_max, self.flush_s, self.spool_bytes, self.cycle_s = queue_max, flush_s, spool_bytes, cycle_s
        self._clock, self._timer = clock, timer
        self._lock = threading.Lock()
        self._queue: deque[Record] = deque()
        self._envelopes: deque[tuple[str, str, list[Record], Callable[[], None]]] = deque()  # the relay's
        self._lost = 0  # records dropped here: invalid, or pushed out of the full queue
        self.sent = 0  # messages the broker acknowledged
        self._deliveries: dict[str, Delivery] = {}
        for keyfile in sorted(self.spool_dir.glob("*/key")):  # a predecessor's backlog goes first
            self._delivery(keyfile.read_text())
        self._wake, self._stop = threading.Event(), threading.Event()
        self._deadline: float | None = None  # set by close(): sending stops there, the rest stays spooled
        self._thread: threading.Thread | None = None

    # --- the collectors' side ----------------------------------------------------------------------

    def put(self, records: Iterable[dict[str, Any]]) -> None:
        """Queue contract-v1 records for sending; invalid ones are logged and dropped."""
        queued = False
        for obj in records:
            rec = decode_obj(obj)
            if isinstance(rec, DecodeError):
                log.warning("a %s record was dropped, it breaks the contract: %s", obj.get("kind"), rec)
                with self._lock:
                    self._lost += 1
                continue
            with self._lock:
                if len(self._queue) >= self.queue_max:
                    self._queue.popleft()
                    self._lost += 1
                self._queue.append(rec)
            queued = True
        if queued:
            self._wake.set()

    def put_envelope(self, topic: str, key: str, records: list[Record], done: Callable[[], None]) -> None:
        """Queue records already checked and packed for one message (the relay's); `done()` is called on the
        sending thread once they were sent, spooled or given up (and counted), whatever happened."""
        self._envelopes.append((topic, key, records, done))
        self._wake.set()

    @property
    def dropped(self) -> int:
        """Records lost so far: invalid, pushed out of the full queue, or given up by a full spool."""
        return self._lost + sum(d.dropped for d in list(self._deliveries.values()))

    @property
    def queue_depth(self) -> int:
        """Records queued for the sending thread (safe from any thread)."""
        return len(self._queue)

    def deliveries(self) -> list[Delivery]:
        """The delivery of every key so far, each with its spool and counts (for the metrics endpoint)."""
        return list(self._deliveries.values())  # a C-level copy: the sending thread may add a key meanwhile

    @property
    def backlog(self) -> bool:
        """Whether spooled messages wait for the broker."""
        return any(d.spool for d in list(self._deliveries.values()))

    # --- the sending side --------------------------------------------------------------------------

    def start(self) -> None:
        """Send from a background thread from now on (without it, `flush()` sends on the caller's thread)."""
        self._thread = threading.Thread(target=self._loop, name="gangwatch-agent-send", daemon=True)
        self._thread.start()

    def flush(self) -> None:
        """Send (or spool) what is queued, on the caller's thread; only without a background thread."""
        self._cycle()

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is left, for at most about `timeout_s` (the rest stays spooled), then close the spools."""
        self._deadline = self._timer() + 0.8 * timeout_s
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        else:
            self._final()

    def _loop(self) -> None:
        draining = False
        while not self._stop.is_set():
            if not draining:  # a backlog being sent goes on at once
                self._wake.wait(self.flush_s)
            self._wake.clear()
            sent = self.sent
            self._cycle()
            draining = self.sent > sent and self.backlog
        self._final()

    def _cycle(self, deadline: float | None = None) -> None:
        """Deliver what is queued, grouped by key and topic in arrival order; drain older spools; sending stops at
        `deadline` (default: `cycle_s` from now), the rest is spooled; never raises."""
        try:
            if deadline is None:
                deadline = self._timer() + self.cycle_s
            with self._lock:
                recs = list(self._queue)
                self._queue.clear()
            groups: dict[str, dict[str, list[Record]]] = {}
            for rec in recs:
                topic, key = destination(rec, self.topics)
                groups.setdefault(key, {}).setdefault(topic, []).append(rec)
            ts = self._clock()
            for key, by_topic in groups.items():
                self._delivery(key).deliver(by_topic.items(), ts=ts, deadline=deadline)
            while self._envelopes:  # popleft is atomic: envelopes the relay adds meanwhile are never lost
                topic, key, envelope, done = self._envelopes.popleft()
                groups.setdefault(key, {})  # its delivery sends its backlog first: not again below
                try:
                    self._delivery(key).deliver([(topic, envelope)], ts=ts, deadline=deadline)
                except Exception:
                    with self._lock:
                        self._lost += len(envelope)
                    log.exception("%d records of the relay lost: sending them failed", len(envelope))
                finally:
                    done()
            for key, delivery in self._deliveries.items():
                if key not in groups and delivery.spool:
                    delivery.deliver((), ts=ts, deadline=deadline)  # nothing new: only the backlog
        except Exception:
            log.exception("sending failed; the agent goes on")

    def _final(self) -> None:
        """The last cycles before closing, up to the deadline, as long as sending gets somewhere. Under load a
        first send may wait on the broker (its metadata) past `send_wait_s` and get through late, after the cycle
        spooled everything behind it: it is waited for and the backlog sent on, not left for the next start (an
        agent run `--once` would leave it every time, and the next would send it twice)."""
        left = max(0.0, self._deadline - self._timer()) if self._deadline is not None else 0.0
        until = time.monotonic() + left  # real time: what the waits below take
        while True:
            sent = self.sent
            self._cycle(self._deadline)
            if not self.backlog or time.monotonic() >= until:
                break
            while self.send.busy and time.monotonic() < until:
                time.sleep(0.05)  # a send in flight: it may still get through
            if self.sent == sent and not self.send.got_through_late:
                break  # nothing got through: the broker is away, the backlog stays spooled
        try:
            self.send.close()
            for delivery in self._deliveries.values():
                delivery.spool.close()
        except Exception:
            log.exception("closing the sender failed")

    def _send(self, topic: str, key: bytes, value: bytes) -> None:
        self.send(topic, key, value)  # raises when the broker did not take it
        self.sent += 1

    def _delivery(self, key: str) -> Delivery:
        delivery = self._deliveries.get(key)
        if delivery is None:
            directory = self.spool_dir / spool_name(key)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "key").write_text(key)
            delivery = Delivery(self._send, key, Spool(directory, self.spool_bytes), clock=self._timer)
            self._deliveries[key] = delivery
        return delivery
