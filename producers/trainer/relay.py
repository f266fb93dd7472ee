"""The node's relay, seen from a training process: handing records to the node agent instead of to Kafka.

Every rank sending its own batch message once a second makes tiny messages (a
step and now and then a heartbeat), and the worker pays a fixed cost per
message. The node agent (`gangwatch agent`, producers/agent/relay.py) listens on
a Unix socket, takes the records of every rank of its node, packs them per
topic and job into large envelopes, and sends those through its own delivery
and spool. `RelayLink` is the trainer client's end of that socket; only the
client's sending thread uses it.

Where: `relay=` or `GANGWATCH_RELAY` (a socket path, or `off`); unset, no relay
(a job reaches the relay its operator set up, not whatever listens at a default
path). `{node}` in the path stands for the node's name (`GANGWATCH_NODE`), for
hosts that run several nodes' agents (a test bed, simulated nodes):
`<temp dir>/gangwatch-agent/{node}.sock` is where an agent listens by default
(`default_path`). A relay that does not answer is no error: the client sends to
Kafka itself, and tries the relay again every `retry_s`.

Wire framing, both directions on one SOCK_STREAM connection:

- client -> relay, a *frame*: a 4-byte big-endian length N, then N bytes of
  lines `<topic> <value>\\n`, each value a contract-v1 message (a `batch`
  envelope, exactly what the client would send to Kafka on that topic);
- relay -> client, one byte per frame: `A` accepted, `F` refused because the
  relay is full or closing, `B` refused because the frame is bad.

The client sends one frame and waits for its answer before the next (so
answers need no numbering). `A` means the agent has sent the records to Kafka
or written them to its spool on disk: a relay killed after that loses nothing.
The agent answers within a second or two whatever the broker does (it spools
while Kafka is slow or away), so a broker in trouble is the agent's business:
its clients stay on the relay. Anything without an `A` (refused, no answer
within `ack_timeout_s`: an agent that is gone or stuck itself, the connection
gone) the client delivers itself; a relay killed after delivering but before
answering makes that a duplicate, never a loss (delivery is at least once, as
the spool's already is).
"""

from __future__ import annotations

import logging
import re
import socket
import struct
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from gangwatch.schemas import Record, encode_batch
from gangwatch.schemas.codec import MAX_MESSAGE_BYTES

log = logging.getLogger("gangwatch.trainer")

RELAY_ENV = "GANGWATCH_RELAY"
OFF = "off"
HEADER = struct.Struct(">I")  # a frame's length
MAX_FRAME_BYTES = MAX_MESSAGE_BYTES  # a frame as large as the largest message the contract allows
ACCEPTED, FULL, BAD = b"A", b"F", b"B"
BATCH_MAX = 1000  # records per line, as `Delivery` packs them
CONNECT_S = 0.2


NODE = "{node}"  # in a relay's path: the node's name, made safe for a file name


def _safe(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", node)


def default_path(node: str) -> Path:
    """`<temp dir>/gangwatch-agent/<node>.sock`: where the agent of `node` listens unless told otherwise."""
    return Path(tempfile.gettempdir()) / "gangwatch-agent" / f"{_safe(node)}.sock"


def relay_path(setting: str | Path | None, node: str) -> Path | None:
    """The socket a setting names: a path (`{node}` in it: the node's name); None for `off`; the node's default
    path for None or ""."""
    if setting is None or str(setting).strip() == "":
        return default_path(node)
    if str(setting).strip().lower() == OFF:
        return None
    return Path(str(setting).strip().replace(NODE, _safe(node)))


def frame(lines: Iterable[tuple[str, bytes]]) -> bytes:
    """One frame of (topic, value) lines, with its length in front."""
    body = b"".join(b"%s %s\n" % (topic.encode(), value) for topic, value in lines)
    return HEADER.pack(len(body)) + body


def recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    """`n` bytes from `sock`; None if the peer closed the connection first."""
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class RelayLink:
    """A training process's connection to its node's relay (used by the sending thread only).

    Counts, read by the metrics endpoint: `accepted` (records the relay took),
    `refused` (records it refused: full, closing, or a bad frame) and `failed`
    (records handed over when the relay went away or did not answer); the last
    two were delivered by the client itself.
    """

    def __init__(self, path: Path, *, ack_timeout_s: float = 5.0, retry_s: float = 5.0,
                 timer: Callable[[], float] = time.monotonic) -> None:
        self.path, self.ack_timeout_s, self.retry_s, self._timer = Path(path), ack_timeout_s, retry_s, timer
        self._sock: socket.socket | None = None
        self._retry_at = 0.0
        self._said_full = False
        self.accepted = self.refused = self.failed = 0

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> bool:
        """Connect now unless connected or waiting to retry; whether connected. A local connect: it returns at
        once, or after `CONNECT_S` at most when the relay's backlog is full."""
        return self._connect(self._timer())

    def hand_over(self, by_topic: list[tuple[str, list[Record]]], ts: float, deadline: float | None = None) -> bool:
        """Hand these records to the relay as one frame; True once the relay answered that the agent sent or
        spooled them. False: the caller delivers them itself (the relay is absent, refused them, or did not
        answer by `deadline` or within `ack_timeout_s`)."""
        count = sum(len(recs) for _, recs in by_topic)
        now = self._timer()
        wait_s = self.ack_timeout_s if deadline is None else min(self.ack_timeout_s, deadline - now)
        if count == 0 or wait_s <= 0 or not self._connect(now):
            return False
        try:
            data = frame((topic, encode_batch(recs[i:i + BATCH_MAX], ts=ts))
                         for topic, recs in by_topic for i in range(0, len(recs), BATCH_MAX))
        except TypeError:  # a value that is not plain JSON: the caller's delivery counts and logs it
            return False
        if len(data) - HEADER.size > MAX_FRAME_BYTES:
            return False
        end = time.monotonic() + wait_s  # the socket's timeouts are in real seconds
        try:
            self._sock.settimeout(wait_s)
            self._sock.sendall(data)
            self._sock.settimeout(max(0.001, end - time.monotonic()))
            answer = recv_exactly(self._sock, 1)
            why = "it closed the connection" if answer is None else f"it answered {answer!r}"
        except OSError as e:  # a timeout, a reset, a broken pipe
            answer, why = None, f"{type(e).__name__}: {e}"
        if answer == ACCEPTED:
            self.accepted += count
            return True
        if answer not in (FULL, BAD):
            self.failed += count
            log.warning("gangwatch: the relay at %s did not take %d records (%s); sending them to Kafka directly, "
                        "trying the relay again in %.0f s", self.path, count, why, self.retry_s)
            self._disconnect(now)
            return False
        self.refused += count
        if answer == BAD:
            log.warning("gangwatch: the relay at %s found a frame of %d records bad; sending them to Kafka "
                        "directly", self.path, count)
        elif not self._said_full:  # back-pressure comes in bursts: said once
            log.info("gangwatch: the relay at %s is full; sending to Kafka directly meanwhile", self.path)
            self._said_full = True
        return False

    def _connect(self, now: float) -> bool:
        if self._sock is not None:
            return True
        if now < self._retry_at:
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_S)
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            self._retry_at = now + self.retry_s
            return False
        self._sock = sock
        log.info("gangwatch: sending through the node's relay at %s", self.path)
        return True

    def _disconnect(self, now: float) -> None:
        self.close()
        self._retry_at = now + self.retry_s

    def close(self) -> None:
        if self._sock is not None:
            sock, self._sock = self._sock, None
            sock.close()
