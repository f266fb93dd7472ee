"""The node's relay: the training processes of this node hand their records to the agent, which packs them.

Each rank's trainer client would otherwise send a batch message of its own
about once a second, holding a step or two; the worker pays a fixed cost per
message, four to eight times the per-record cost of 64-record envelopes
(docs/performance.md). The relay listens on a Unix socket (one thread per
connected client), takes every rank's records, and packs them per (topic, key)
into envelopes that go through the agent's outbox: the same delivery, spool,
ordering per key and loss counts as the agent's own records.

An envelope is handed to the outbox when the first of these comes:

- it holds `max_records` records (or about `max_bytes` of them);
- `linger_s` passed since its first record (default 0.25 s, below);
- it holds a `framework` or `lifecycle` record (an exception, a timeout, an
  exit, a stop, a pause): those go at once, with what lingered before them.

Heartbeats and steps linger. 0.25 s: the ranks of a synchronous job finish a
step within milliseconds of each other, and a client connected to a relay
sends each step as it is finished (`TrainerClient`), so one step of every local
rank arrives well inside the window; a heartbeat is at most 0.25 s later than
when sent directly, 5 % of the 5 s heartbeat period the fail-stop detector
counts in, and a step is no later than the client's own 1 s flush made it.

Key = the record's job (`<prefix>telemetry` and `<prefix>jobs` are keyed by
job): records of different jobs never share an envelope. A client sends its
next frame only once this one was answered, so every rank's records stay in
order across envelopes; within one, the records go in event-time order (a
stable sort by `ts` when it closes: records of one time keep the order they
came in), the order the worker reads them in anyway, and the one in which it
takes an envelope as columns without sorting it first.

Answers (framing in producers/trainer/relay.py): a frame is answered `A` once
every envelope holding its records was sent or spooled by the outbox (or given
up and counted there), so records the relay acknowledged survive the agent
being killed. The outbox never waits on the broker for more than about a
second (outbox.py): while Kafka is slow or away the envelopes go to the agent's
spool and the frames are answered as before, so the clients stay on the relay
and the spool is sent, in order, once the broker is back. A frame that would
take the relay past `queue_max` records (lingering, or waiting in the outbox)
is refused (`F`), and so is every frame once the relay is closing: the client
sends those itself. A frame that is not
well formed, names a topic the trainer client does not send to, or holds a
record the contract refuses (`decode`) is answered `B`, logged (once per
connection) and counted; a length over the limit also closes that connection.
Neither stops the relay.

The socket is made readable and writable by every local user (the training
processes run as their users, the agent as its own): whoever can run a process
on the node can hand it records, as whoever holds the job's Kafka settings can
send them directly. `--relay off` where that is not wanted.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

from gangwatch.producers.agent.outbox import Outbox
from gangwatch.producers.trainer.relay import ACCEPTED, BAD, FULL, HEADER, MAX_FRAME_BYTES, recv_exactly
from gangwatch.schemas import DecodeError, Record, decode

log = logging.getLogger("gangwatch.agent")

URGENT = frozenset({"framework", "lifecycle"})  # kinds that flush their envelope at once
KINDS_BY_SUFFIX = {"telemetry": frozenset({"step", "heartbeat", "framework", "lifecycle"}), "jobs": frozenset({"job"})}
TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class RelayUnavailable(OSError):
    """The relay cannot listen at its path (another agent's relay answers there)."""


class BadFrame(ValueError):
    """A frame the relay refuses: why, for the log."""


@dataclass(eq=False)
class Ticket:
    """One accepted frame: answered once none of the envelopes holding its records is pending any more."""

    pending: int = 0
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class Envelope:
    """Records of one topic and key, packed for one message."""

    topic: str
    key: str
    opened: float  # timer reading when its first record came
    records: list[Record] = field(default_factory=list)
    nbytes: int = 0
    tickets: list[Ticket] = field(default_factory=list)
    urgent: bool = False


class Packer:
    """The envelopes being filled, one per (topic, key); no threads, no clock of its own (`now` is passed in)."""

    def __init__(self, max_records: int, max_bytes: int, linger_s: float) -> None:
        self.max_records, self.max_bytes, self.linger_s = max_records, max_bytes, linger_s
        self._open: dict[tuple[str, str], Envelope] = {}

    def add(self, topic: str, key: str, records: list[tuple[Record, int]], ticket: Ticket,
            now: float) -> list[Envelope]:
        """Add (record, its size in bytes) in order; returns the envelopes this closed (full, or urgent)."""
        closed: list[Envelope] = []
        env = self._open.get((topic, key))
        for rec, size in records:
            if env is not None and env.records and env.nbytes + size > self.max_bytes:
                closed.append(self._close(env))
                env = None
            if env is None:
                env = self._open[(topic, key)] = Envelope(topic, key, now)
            env.records.append(rec)
            env.nbytes += size
            env.urgent = env.urgent or rec.kind in URGENT
            if not env.tickets or env.tickets[-1] is not ticket:
                env.tickets.append(ticket)
                ticket.pending += 1
            if len(env.records) >= self.max_records:
                closed.append(self._close(env))
                env = None
        if env is not None and env.urgent:
            closed.append(self._close(env))
        return closed

    def due(self, now: float) -> list[Envelope]:
        """Close and return the envelopes whose linger ran out by `now`."""
        return [self._close(env) for env in list(self._open.values()) if env.opened + self.linger_s <= now]

    def next_due(self) -> float | None:
        """When the next envelope's linger runs out (None: nothing is open)."""
        return min((env.opened + self.linger_s for env in self._open.values()), default=None)

    def close_all(self) -> list[Envelope]:
        return [self._close(env) for env in list(self._open.values())]

    def _close(self, env: Envelope) -> Envelope:
        del self._open[(env.topic, env.key)]
        env.records.sort(key=attrgetter("ts"))  # event-time order (see the module's docstring)
        return env


class Relay:
    """Records from this node's training processes, taken on a Unix socket and packed into envelopes.

    Counts, read by the metrics endpoint: `records` accepted, `refused` (records
    of frames refused because the relay was full or closing), `bad_frames`,
    `envelopes` handed to the outbox, `clients` connected now, and
    `queue_depth` (records lingering here or waiting in the outbox).
    For tests: `timer` replaces the clock of the linger (`wake()` makes the relay
    look at it again).
    """

    def __init__(self, path: Path, outbox: Outbox, *, max_records: int = 512, linger_s: float = 0.25,
                 queue_max: int = 20_000, max_bytes: int = 4 << 20, wait_s: float = 60.0,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self.path, self.outbox, self.queue_max, self.wait_s = Path(path), outbox, queue_max, wait_s
        self.max_records, self.linger_s = max_records, linger_s
        self._timer = timer
        self._packer = Packer(max_records, max_bytes, linger_s)
        self._cond = threading.Condition()  # guards everything below, and wakes the linger thread
        self._held = 0  # records lingering or handed to the outbox and not delivered yet
        self._unanswered = 0  # frames accepted whose answer was not written yet
        self._closing = False
        self._conns: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self.records = self.refused = self.bad_frames = self.envelopes = 0

    # --- what the agent calls -------------------------------------------------------------------

    def start(self) -> None:
        """Listen at `path` (a stale socket file is replaced) and start taking records; raises `OSError` (or
        `RelayUnavailable`, when another relay answers there) if it cannot."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() or self.path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(self.path))
            except OSError:
                self.path.unlink()  # left by an agent that died: nobody listens there
            else:
                raise RelayUnavailable(f"another relay answers at {self.path}")
            finally:
                probe.close()
        # bound and listening under a name of its own first, then renamed into place: the socket file appears
        # only once it takes connections (a trainer that saw it between bind and listen was refused, and sent
        # to Kafka directly for `retry_s`)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        staging = self.path.with_name(f".gw{os.getpid()}")  # (short: a socket path has 107 bytes at most)
        try:
            staging.unlink(missing_ok=True)
            listener.bind(str(staging))
            staging.chmod(0o666)  # the training processes run as other users
            listener.listen(128)
            os.replace(staging, self.path)
        except OSError:
            listener.close()
            staging.unlink(missing_ok=True)
            raise
        self._listener = listener
        for target, name in ((self._accept_loop, "gangwatch-relay-accept"), (self._linger_loop, "gangwatch-relay")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("relay for the training processes at %s (envelopes of up to %d records or %.2f s)", self.path,
                 self.max_records, self.linger_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop listening, refuse new frames, hand what lingers to the outbox and answer the frames it held
        once the outbox delivered them (waiting at most `timeout_s`), then close every connection."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._hand_over(self._packer.close_all())
            self._cond.notify_all()
        if self._listener is not None:
            self._stop_socket(self._listener)
            self.path.unlink(missing_ok=True)
        with self._cond:
            self._cond.wait_for(lambda: self._unanswered == 0, timeout_s)
            conns = list(self._conns)
        for conn in conns:
            self._stop_socket(conn)
        for t in self._threads:
            t.join(1.0)

    def wake(self) -> None:
        """Look at the clock again now (tests that move `timer` call it)."""
        with self._cond:
            self._cond.notify_all()

    @property
    def clients(self) -> int:
        return len(self._conns)

    @property
    def queue_depth(self) -> int:
        return self._held

    # --- threads ------------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # the listener was shut down: closing
                return
            with self._cond:
                if self._closing:
                    conn.close()
                    return
                self._conns.add(conn)
            serving = threading.Thread(target=self._serve, args=(conn,), name="gangwatch-relay-client", daemon=True)
            serving.start()
            self._threads = [*(t for t in self._threads if t.is_alive()), serving]  # the finished ones let go

    def _linger_loop(self) -> None:
        """Hand envelopes whose linger ran out to the outbox, sleeping until the next one is due."""
        with self._cond:
            while not self._closing:
                self._hand_over(self._packer.due(self._timer()))
                due = self._packer.next_due()
                self._cond.wait(None if due is None else max(0.0, due - self._timer()))

    def _serve(self, conn: socket.socket) -> None:
        """One client: read a frame, answer it, until the connection closes."""
        said_bad = False
        try:
            while True:
                head = recv_exactly(conn, HEADER.size)
                if head is None:
                    return
                (size,) = HEADER.unpack(head)
                if size > MAX_FRAME_BYTES:
                    self._bad(f"a frame of {size} bytes, over the limit of {MAX_FRAME_BYTES}; closing the "
                              "connection", said_bad)
                    conn.sendall(BAD)
                    return
                body = recv_exactly(conn, size)
                if body is None:
                    return
                try:
                    groups = parse(body)
                except BadFrame as e:
                    self._bad(str(e), said_bad)
                    said_bad = True
                    conn.sendall(BAD)
                    continue
                ticket = self._take(groups)
                if ticket is None:
                    conn.sendall(FULL)
                    continue
                try:
                    if not ticket.done.wait(self.wait_s):  # the outbox is stuck: the client gave up long ago
                        log.warning("relay: a frame was not delivered within %.0f s; closing that connection",
                                    self.wait_s)
                        return
                    conn.sendall(ACCEPTED)
                finally:
                    with self._cond:
                        self._unanswered -= 1
                        self._cond.notify_all()
        except OSError:
            return  # the client went away (or the relay is closing)
        finally:
            with self._cond:
                self._conns.discard(conn)
            conn.close()

    # --- packing ------------------------------------------------------------------------------------

    def _take(self, groups: dict[tuple[str, str], list[tuple[Record, int]]]) -> Ticket | None:
        """Pack a frame's records; None (nothing taken) when the relay is closing or would hold too many."""
        count = sum(len(recs) for recs in groups.values())
        ticket = Ticket()
        with self._cond:
            if self._closing or self._held + count > self.queue_max:
                self.refused += count
                return None
            self._held += count
            self._unanswered += 1
            self.records += count
            now = self._timer()
            for (topic, key), recs in groups.items():
                self._hand_over(self._packer.add(topic, key, recs, ticket, now))
            if ticket.pending == 0:  # a frame without records: nothing to wait for
                ticket.done.set()
            self._cond.notify_all()  # the linger thread: a new envelope may be due first
        return ticket

    def _hand_over(self, envelopes: list[Envelope]) -> None:
        """Queue closed envelopes in the outbox (called holding `_cond`, so envelopes of one key keep their
        order)."""
        for env in envelopes:
            self.envelopes += 1
            self.outbox.put_envelope(env.topic, env.key, env.records, lambda env=env: self._delivered(env))

    def _delivered(self, env: Envelope) -> None:
        """The outbox is done with an envelope (sent, spooled, or given up and counted): answer its frames."""
        with self._cond:
            self._held -= len(env.records)
            for ticket in env.tickets:
                ticket.pending -= 1
                if ticket.pending == 0:
                    ticket.done.set()
            self._cond.notify_all()

    def _bad(self, why: str, said: bool) -> None:
        with self._cond:
            self.bad_frames += 1
        (log.debug if said else log.warning)("relay: a bad frame from a client: %s", why)

    @staticmethod
    def _stop_socket(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept() or recv() on it
        except OSError:
            pass
        sock.close()


def parse(body: bytes) -> dict[tuple[str, str], list[tuple[Record, int]]]:
    """A frame's records grouped by (topic, job), each with its share of the bytes; raises `BadFrame`."""
    if not body.endswith(b"\n"):
        raise BadFrame("a frame must be whole lines `<topic> <value>`")
    groups: dict[tuple[str, str], list[tuple[Record, int]]] = {}
    for line in body[:-1].split(b"\n"):
        raw_topic, _, value = line.partition(b" ")
        topic = raw_topic.decode("ascii", "replace")
        suffix = next((s for s in KINDS_BY_SUFFIX if topic.endswith(s)), None)
        if not value or suffix is None or len(topic) > 249 or not set(topic) <= TOPIC_CHARS:
            raise BadFrame(f"not a line for a topic the trainer client sends to: {line[:80]!r}")
        recs = decode(value)
        size = len(value) // max(1, len(recs))
        for rec in recs:
            if isinstance(rec, DecodeError):
                raise BadFrame(f"{topic}: {rec}")
            if rec.kind not in KINDS_BY_SUFFIX[suffix]:
                raise BadFrame(f"a {rec.kind} record does not go to {topic}")
            groups.setdefault((topic, rec.job), []).append((rec, size))
    return groups
