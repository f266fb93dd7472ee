"""A bounded queue and a delivery thread per sink, so that no sink can stall detection.

    sink = queued(WebhookSink(url, single_attempt=True))   # the worker does this for every sink
    sink.write(outputs); sink.flush()                       # enqueue: never waits on the network
    if sink.pressure(): ...                                 # above the high-water mark: hold the input
    sink.take_dead()                                        # dead letters, for the DLQ topic
    left = sink.close()                                     # drain within `close_timeout_s`

The sinks are synchronous libraries (urllib, clickhouse-driver, kafka-python,
files), so each gets one thread of its own; the caller (the worker's event
loop, inside its batch lock) only appends to a list under a lock.

- **Units.** `observe`, `reject` and `write` are staged (only what the inner
  sink takes, when it says so in `accepts`: the webhook only actions); `flush()` closes the
  staged calls into one unit (one worker batch) and queues it. The thread takes
  every unit waiting (up to `max_batch` records), replays their calls on the
  inner sink and calls its `flush()`: one delivery (one insert per table after a
  ClickHouse outage, not one per batch).
- **Retries only for transient errors** (`classify`): connection refused or
  reset, timeouts, HTTP 5xx, 408 and 429, ClickHouse network errors and its
  server-side transient codes, Kafka errors kafka-python marks retriable. The
  same delivery is tried again after ``min(cap_s, base_s * factor**(n-1))``
  (a receiver's `Retry-After` wins, up to the cap), until it succeeds or
  `give_up_s` passed since its first failure. Inner sinks are idempotent on
  record ids, so a delivery that landed half-way and is tried again doubles
  nothing (the webhook remembers what it delivered, the store's tables collapse
  by id); the inner's `discard()`, if it has one, drops its half-done buffer first.
- **Permanent errors** (HTTP 4xx but 408/429, ClickHouse schema, type and parse
  errors, encoding errors, anything unexpected) are not retried: the delivery is
  split in halves, and each half delivered on its own, until the records that
  fail by themselves are found (or, when the sink names them in its
  `DeliveryError.ids`, as the webhook does, those alone); each becomes a `DeadLetter` (the project's one
  dead-letter shape: `source` ``sink:<name>``, the reason, the record's kind, its
  JSON as `raw`, its event time), kept for `take_dead()` (the worker publishes
  them on the DLQ topic) and counted in `failures`.
- **Backpressure.** `pending()` counts the records queued and in delivery.
  `pressure()` turns True when it reaches `high_water` and stays True until it
  falls to `low_water`; the caller then holds its input (the worker waits,
  bounded by `SinkPause`, outside its batch lock). A unit that arrives while
  `capacity` records are pending is not queued: it becomes dead letters
  ("queue full"), so memory stays bounded whatever the receiver does.
- **Marks.** `mark()` after a `flush()` names everything queued so far;
  once `done() >= mark` all of it was delivered or became dead letters
  (`done()` counts units settled in order: one refused at once while an
  earlier one is still on its way waits for that one). The worker writes a job's saved state only when
  the outputs that state covers are settled in every sink, so a worker killed
  with deliveries still queued leaves a state from before them: its
  replacement reads those inputs again and delivers their outputs (same ids).
- **Flush and close.** `drain(timeout_s)` waits until everything queued is
  delivered (or dead) and returns the records left; `close(timeout_s)` drains,
  stops the thread and closes the inner sink, and returns what was left (a
  delivery still retrying is abandoned: its records are dead letters "closed").

Time is injectable: `clock` (monotonic seconds) and `sleep` (the back-off wait,
by default an interruptible wait on the close event), so tests run without real
sleeps.
"""

from __future__ import annotations

import errno
import http.client
import logging
import threading
import time
import urllib.error
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from gangwatch.schemas import DeadLetter, Outputs, Record, encode
from gangwatch.sinks.interface import AsyncSink, DeliveryError, Sink
from gangwatch.sinks.store import store_error_transient

log = logging.getLogger(__name__)

RAW_KEEP = 4096  # characters of a record kept in its dead letter (as DeadLetter.raw elsewhere)
DEAD_KEEP = 100_000  # dead letters held for take_dead(); beyond, the oldest are counted and dropped

Op = tuple[str, Any]  # ("observe", Record) | ("reject", DeadLetter) | ("write", Outputs)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential back-off with a cap: wait ``min(cap_s, base_s * factor**(n - 1))`` before retry n.

    `give_up_s`: a delivery still failing transiently this long after its first failure becomes dead
    letters ("gave up"); None: retry as long as the process lives (the queue then fills and says so).
    """

    base_s: float = 0.5
    factor: float = 2.0
    cap_s: float = 30.0
    give_up_s: float | None = 600.0

    def delay(self, retry: int, hint: float | None = None) -> float:
        if hint is not None:
            return min(max(hint, 0.0), self.cap_s)
        return min(self.cap_s, self.base_s * self.factor ** max(retry - 1, 0))


_PERMANENT_OS = (PermissionError, FileNotFoundError, IsADirectoryError, NotADirectoryError)
_PERMANENT_ERRNO = frozenset({errno.EROFS, errno.EINVAL, errno.EBADF})


def classify(exc: BaseException) -> tuple[bool, str]:
    """(transient, reason) of a failed delivery: may the same call succeed later?

    Transient: `DeliveryError(transient=True)`; an HTTP error 408, 429 or 5xx; connection refused
    or reset, timeouts and other socket errors (an OSError, but a file that cannot be opened or a
    read-only file system); ClickHouse network errors and transient server codes
    (`store.store_error_transient`); a Kafka error kafka-python marks `retriable` (the Kafka sink's
    "not acknowledged" is a `DeliveryError` that says which). Permanent: every other HTTP status,
    ClickHouse schema and type errors, encoding errors (ValueError, TypeError, UnicodeError), and anything
    not known here.
    """
    reason = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, DeliveryError):
        return exc.transient, exc.reason
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (408, 429) or exc.code >= 500, f"HTTP {exc.code}"
    stored = store_error_transient(exc)
    if stored is not None:
        return stored, reason
    retriable = getattr(exc, "retriable", None)  # kafka-python's errors say it themselves
    if isinstance(retriable, bool):
        return retriable, reason
    if isinstance(exc, _PERMANENT_OS) or (isinstance(exc, OSError) and exc.errno in _PERMANENT_ERRNO):
        return False, reason
    if isinstance(exc, (OSError, EOFError, http.client.HTTPException)):  # refused, reset, timed out, cut short
        return True, reason
    return False, reason  # encoding errors and what nobody expected: retrying cannot help


def _atoms(ops: list[Op]) -> list[Op]:
    """The calls, one record each (a write of one finding, action, incident or profile)."""
    out: list[Op] = []
    for kind, x in ops:
        if kind != "write":
            out.append((kind, x))
            continue
        for name in ("findings", "actions", "incidents", "profiles", "life", "shadow"):
            for item in getattr(x, name):
                out.append(("write", Outputs(**{name: [item]})))
    return out


def _count(ops: Iterable[Op]) -> int:
    n = 0
    for kind, x in ops:
        n += len(x.findings) + len(x.actions) + len(x.incidents) + len(x.profiles) + len(x.life) + len(x.shadow) \
            if kind == "write" else 1
    return n


def _items(op: Op) -> list[Any]:
    kind, x = op
    if kind != "write":
        return [x]
    return [*x.findings, *x.actions, *x.incidents, *x.profiles, *x.life, *x.shadow]


def _raw(item: Any) -> tuple[str | None, str, float | None]:
    """(kind, JSON text cut to RAW_KEEP, event time) of a record, profile or dead letter."""
    try:
        if isinstance(item, DeadLetter):
            kind, text = "dead_letter", item.encode()
        elif hasattr(item, "kind"):
            kind, text = item.kind, encode(item)
        else:
            kind, text = "profile", orjson.dumps(item.to_dict())
        raw = text.decode("utf-8", "replace")
    except Exception:  # the record that cannot be encoded: keep what repr says of it
        kind, raw = getattr(item, "kind", type(item).__name__), repr(item)
    ts = getattr(item, "ts", None)
    return kind, raw[:RAW_KEEP], ts if isinstance(ts, (int, float)) else None


class QueuedSink:
    """`inner` behind a bounded queue and a delivery thread of its own (see the module's text).

    `capacity` (records), `high_water` and `low_water` (fractions of it) bound the queue and
    say when to report `pressure()`; `max_batch` bounds the records of one delivery; `retry`
    is the back-off policy; `close_timeout_s` bounds `close()`.
    """

    def __init__(self, inner: Sink, *, name: str | None = None, capacity: int = 100_000,
                 high_water: float = 0.8, low_water: float = 0.5, max_batch: int = 20_000,
                 retry: RetryPolicy | None = None, close_timeout_s: float = 10.0,
                 classify: Callable[[BaseException], tuple[bool, str]] = classify,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] | None = None,
                 start: bool = True) -> None:
        if capacity < 1 or not 0 <= low_water < high_water <= 1:
            raise ValueError(f"need capacity >= 1 and 0 <= low_water < high_water <= 1, got {capacity}, "
                             f"{low_water}, {high_water}")
        self.inner = inner
        self.name = name or _name(inner)
        accepts = getattr(inner, "accepts", None)  # what it takes: finding, action, incident, profile, reject, observe
        self._accepts: frozenset[str] | None = None if accepts is None else frozenset(accepts)
        self.capacity = capacity
        self.high = max(1, int(capacity * high_water))
        self.low = int(capacity * low_water)
        self.max_batch = max(1, max_batch)
        self.retry = retry or RetryPolicy()
        self.close_timeout_s = close_timeout_s
        self._classify = classify
        self._clock = clock
        self._sleep = sleep or self._wait_unless_closing
        self._cond = threading.Condition(threading.RLock())
        self._queue: deque[tuple[list[Op], int, int]] = deque()  # (calls, records, unit number) per unit
        self._staged: list[Op] = []
        self._staged_n = 0
        self._queued = 0  # records in _queue
        self._inflight = 0  # records being delivered
        self._inflight_units: list[int] = []
        self._units_in = 0  # units closed by flush() (queued, or refused as dead letters at once), numbered from 1
        self._units_done = 0  # units 1.._units_done are all settled: delivered or dead
        self._settled_ahead: set[int] = set()  # settled while an earlier one was not (refused when the queue was full)
        self._pressed = False
        self._closing = threading.Event()  # close() was called: no new units, the back-off wait ends
        self._abandon = False  # close() timed out: give up the delivery in progress
        self._dead: deque[DeadLetter] = deque()
        self.delivered = 0  # records delivered
        self.failures = 0  # records that became dead letters
        self.retries = 0  # deliveries tried again after a transient error
        self.overflowed = 0  # records refused because the queue was full
        self.dead_dropped = 0  # dead letters nobody took, forgotten beyond DEAD_KEEP
        self.last_error = ""
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._run, name=f"gangwatch-sink-{self.name}", daemon=True)
            self._thread.start()

    def __repr__(self) -> str:
        return (f"QueuedSink({self.inner!r}, pending={self.pending()}, delivered={self.delivered}, "
                f"failures={self.failures})")

    # --- the Sink protocol (the caller's thread: never waits on I/O) ------------------------

    def observe(self, rec: Record) -> None:
        if self._accepts is None or "observe" in self._accepts:
            self._stage(("observe", rec), 1)

    def reject(self, dead: DeadLetter) -> None:
        if self._accepts is None or "reject" in self._accepts:
            self._stage(("reject", dead), 1)

    def write(self, out: Outputs) -> None:
        if self._accepts is not None:  # queue only what the inner sink takes (the webhook: actions)
            a = self._accepts
            out = Outputs(findings=out.findings if "finding" in a else [],
                          actions=out.actions if "action" in a else [],
                          incidents=out.incidents if "incident" in a else [],
                          profiles=out.profiles if "profile" in a else [],
                          life=out.life if "life" in a else [], shadow=out.shadow if "shadow" in a else [])
        n = _count([("write", out)])
        if n:
            self._stage(("write", out), n)

    def flush(self) -> None:
        """Queue what was staged since the last flush as one unit (does not wait for its delivery)."""
        with self._cond:
            self._enqueue()

    def close(self, timeout_s: float | None = None) -> int:
        """Deliver what is queued within `timeout_s` (default `close_timeout_s`), stop, close the inner sink;
        return the records left undelivered (they are dead letters too, "closed")."""
        timeout_s = self.close_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        left = self.drain(timeout_s)
        with self._cond:
            self._closing.set()
            if left:
                self._abandon = True
                while self._queue:
                    ops, n, unit = self._queue.popleft()
                    self._queued -= n
                    self._settle([unit])
                    self._dead_letters(ops, "closed before it could be delivered")
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()) + 0.1)
            if self._thread.is_alive():
                log.warning("sink %s: still delivering at close; abandoned", self.name)
                return left
        if left:
            log.warning("sink %s: %d record(s) not delivered at close", self.name, left)
        try:
            self.inner.close()
        except Exception:
            log.exception("sink %s: closing it failed", self.name)
        return left

    # --- backpressure and dead letters ---------------------------------------------------------

    def pending(self) -> int:
        """Records queued or being delivered (staged ones not counted: they are the caller's batch)."""
        return self._queued + self._inflight

    def pressure(self) -> bool:
        """True from when `pending()` reaches the high-water mark until it falls to the low-water mark."""
        with self._cond:
            return self._update_pressure()

    def mark(self) -> int:
        """A mark after everything flushed so far: all of it is settled once `done()` reaches it."""
        with self._cond:
            return self._units_in

    def done(self) -> int:
        """The mark up to which everything is settled: delivered, or a dead letter `take_dead()` hands over."""
        return self._units_done

    @property
    def full(self) -> bool:
        """The queue holds `capacity` records: what comes now is refused (as dead letters)."""
        return self.pending() >= self.capacity

    def take_dead(self) -> list[DeadLetter]:
        """The dead letters since the last call (what could never be delivered, with why)."""
        with self._cond:
            out = list(self._dead)
            self._dead.clear()
        return out

    def drain(self, timeout_s: float) -> int:
        """Queue what is staged, wait until everything is delivered or dead (at most `timeout_s`);
        return the records left."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._enqueue()
            if self._thread is None:  # not started (tests): deliver here
                while self._queue:
                    self._deliver_next_locked()
            while self.pending() and not self._closing.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            return self.pending()

    def run_once(self) -> bool:
        """Deliver what is queued now, on this thread (for a sink made with `start=False`); False if nothing was."""
        with self._cond:
            if not self._queue:
                return False
            self._deliver_next_locked()
            return True

    # --- internals -----------------------------------------------------------------------------

    def _stage(self, op: Op, n: int) -> None:
        with self._cond:
            self._staged.append(op)
            self._staged_n += n
            if self._staged_n >= self.max_batch:
                self._enqueue()

    def _enqueue(self) -> None:  # holding the lock
        if not self._staged:
            return
        ops, n = self._staged, self._staged_n
        self._staged, self._staged_n = [], 0
        self._units_in += 1
        unit = self._units_in
        if self._closing.is_set():
            self._dead_letters(ops, "the sink is closed")
            self._settle([unit])
            log.warning("sink %s: %d record(s) came after it closed (the worker is stopping): dead letters, not "
                        "delivered", self.name, n)
            return
        if self.pending() >= self.capacity:
            self.overflowed += n
            self._dead_letters(ops, f"queue full ({self.capacity} records waiting for the {self.name} sink)")
            self._settle([unit])
            self._update_pressure()
            return
        self._queue.append((ops, n, unit))
        self._queued += n
        self._update_pressure()
        self._cond.notify_all()

    def _settle(self, units: list[int]) -> None:  # holding the lock
        self._settled_ahead.update(units)
        while self._units_done + 1 in self._settled_ahead:
            self._units_done += 1
            self._settled_ahead.discard(self._units_done)

    def _update_pressure(self) -> bool:  # holding the lock
        depth = self.pending()
        if depth >= self.high:
            self._pressed = True
        elif depth <= self.low:
            self._pressed = False
        return self._pressed

    def _take_batch(self) -> tuple[list[Op], int]:  # holding the lock; the queue is not empty
        ops, n, unit = self._queue.popleft()
        ops = list(ops)
        units = [unit]
        while self._queue and n + self._queue[0][1] <= self.max_batch:
            more, m, unit = self._queue.popleft()
            ops += more
            n += m
            units.append(unit)
        self._queued -= n
        self._inflight = n
        self._inflight_units = units
        return ops, n

    def _deliver_next_locked(self) -> None:
        ops, n = self._take_batch()
        self._cond.release()
        try:
            self._deliver(ops, n)
        finally:
            self._cond.acquire()
            self._inflight = 0
            self._settle(self._inflight_units)
            self._inflight_units = []
            self._update_pressure()
            self._cond.notify_all()

    def _run(self) -> None:
        with self._cond:
            while True:
                while not self._queue and not self._closing.is_set():
                    self._cond.wait()
                if not self._queue:
                    return
                self._deliver_next_locked()

    def _wait_unless_closing(self, seconds: float) -> None:
        self._closing.wait(seconds)

    def _deliver(self, ops: list[Op], n: int) -> None:
        """Deliver `ops` (n records): retry while transient, split on permanent, dead-letter what fails alone."""
        retries = 0
        first_failure: float | None = None
        while True:
            try:
                for kind, x in ops:
                    getattr(self.inner, kind)(x)
                self.inner.flush()
                self.delivered += n
                return
            except Exception as e:
                transient, reason = self._classify(e)
                hint = e.retry_after if isinstance(e, DeliveryError) else None
                culprits = set(e.ids) if isinstance(e, DeliveryError) else set()
                self.last_error = reason
                self._discard()
            if not transient:
                atoms = _atoms(ops) if len(ops) > 1 or n > 1 else ops
                named = [a for a in atoms if getattr(_items(a)[0], "id", None) in culprits]
                if named and len(named) < len(atoms):  # the sink said which: those alone are dead
                    log.error("sink %s: permanent error, not retried: %s", self.name, reason)
                    self._dead_letters(named, f"permanent: {reason}")
                    dead = {id(a) for a in named}
                    rest = [a for a in atoms if id(a) not in dead]
                    self._deliver(rest, _count(rest))
                    return
                if len(atoms) > 1:  # find the records that fail by themselves: halves, each on its own
                    half = len(atoms) // 2
                    for part in (atoms[:half], atoms[half:]):
                        self._deliver(part, _count(part))
                    return
                log.error("sink %s: permanent error, not retried: %s", self.name, reason)
                self._dead_letters(ops, f"permanent: {reason}")
                return
            now = self._clock()
            first_failure = now if first_failure is None else first_failure
            give_up = self.retry.give_up_s
            if self._abandon:
                self._dead_letters(ops, f"closed while retrying after {retries + 1} attempt(s): {reason}")
                return
            if give_up is not None and now - first_failure >= give_up:
                self._dead_letters(ops, f"gave up after {retries + 1} attempt(s) in {now - first_failure:.0f} s: "
                                        f"{reason}")
                return
            retries += 1
            self.retries += 1
            delay = self.retry.delay(retries, hint)
            log.warning("sink %s: %d record(s) not delivered (%s); retry %d in %.2f s", self.name, n, reason,
                        retries, delay)
            self._sleep(delay)

    def _discard(self) -> None:
        discard = getattr(self.inner, "discard", None)
        if callable(discard):
            try:
                discard()
            except Exception:
                log.exception("sink %s: discard failed", self.name)

    def _dead_letters(self, ops: list[Op], reason: str) -> None:
        letters = []
        for op in ops:
            for item in _items(op):
                kind, raw, ts = _raw(item)
                letters.append(DeadLetter(reason=f"not delivered to the {self.name} sink: {reason}",
                                          source=f"sink:{self.name}", kind=kind, raw=raw, ts=ts))
        if not letters:
            return
        with self._cond:  # re-entrant: also called with it held
            self.failures += len(letters)
            self._dead.extend(letters)
            while len(self._dead) > DEAD_KEEP:
                self._dead.popleft()
                self.dead_dropped += 1


def _name(sink: Any) -> str:
    name = type(sink).__name__
    return (name[:-4] if name.endswith("Sink") and len(name) > 4 else name).lower()


def queued(sink: Sink, **kw: Any) -> Sink:
    """`sink` behind a `QueuedSink`, unless it already sends off-thread by itself (an `AsyncSink`).

    The wrapper's class carries the inner class's name, so the worker's metrics keep their
    `sink` label (store, webhook, ...)."""
    if isinstance(sink, (QueuedSink, AsyncSink)):
        return sink
    cls = _QUEUED.get(type(sink).__name__)
    if cls is None:
        cls = type(type(sink).__name__, (QueuedSink,), {"__qualname__": f"QueuedSink[{type(sink).__name__}]"})
        _QUEUED[type(sink).__name__] = cls
    return cls(sink, **kw)


_QUEUED: dict[str, type[QueuedSink]] = {}


class SinkPause:
    """When the worker should hold its input: while a sink reports pressure, for at most `max_pause_s` at a time.

    `hold()` is True while some sink's `pressure()` is True, until that has lasted `max_pause_s`;
    then False (the worker goes on, and what does not fit in a full queue becomes dead letters)
    until every sink is below its low-water mark again. So a stuck receiver costs detection at
    most `max_pause_s` once, never a stall. `pauses`, `gave_up` and `held_s` count what happened.
    """

    def __init__(self, sinks: Iterable[Any], max_pause_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sinks = [s for s in sinks if callable(getattr(s, "pressure", None))]
        self.max_pause_s = max_pause_s
        self._clock = clock
        self._since: float | None = None
        self._spent = False
        self.pauses = 0
        self.gave_up = 0
        self.held_s = 0.0

    def hold(self) -> bool:
        pressed = [s for s in self.sinks if s.pressure()]
        now = self._clock()
        if not pressed:
            if self._since is not None and not self._spent:
                self.held_s += now - self._since
            self._since, self._spent = None, False
            return False
        if self._spent:
            return False
        if self._since is None:
            self._since = now
            self.pauses += 1
            log.warning("sink backlog over its high-water mark (%s): holding the input for up to %.1f s",
                        ", ".join(getattr(s, "name", type(s).__name__) for s in pressed), self.max_pause_s)
        if now - self._since >= self.max_pause_s:
            self._spent = True
            self.gave_up += 1
            self.held_s += now - self._since
            log.warning("sinks still over their high-water mark after %.1f s: going on; what does not fit in a "
                        "full queue becomes dead letters", self.max_pause_s)
            return False
        return True

    def dead_letters(self) -> list[DeadLetter]:
        """Every sink's dead letters since the last call."""
        out: list[DeadLetter] = []
        for s in self.sinks:
            take = getattr(s, "take_dead", None)
            if callable(take):
                out += take()
        return out
