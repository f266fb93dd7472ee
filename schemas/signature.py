"""Signature scheme v1 of gangwatch's actions: on the webhook (HTTP headers) and on the alert topic (record headers).

The shared secret (`GANGWATCH_WEBHOOK_SECRET`) MACs, with HMAC-SHA256, the bytes
``b"<t>.<idempotency key>." + body``: when it was signed (unix seconds), which
action it is (its id) and the body, so a receiver can refuse a forged, tampered,
stale (more than `tolerance_s` from its clock) or replayed action. The header is
``X-Gangwatch-Signature-V1: t=<t>,v1=<hex MAC>``. Here because the wire contract
owns it: the sinks sign (`sinks.webhook`), and every actuator verifies: the
reference controller, the fencing adapters, and the node agent before a stack
sweep (producers may import only `schemas`). Pure but for the clock, which each
signer and verifier takes as an argument (the wall clock by default).
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NoReturn

SECRET_ENV = "GANGWATCH_WEBHOOK_SECRET"
SIGNATURE_HEADER = "X-Gangwatch-Signature-V1"  # scheme v1: timestamp, idempotency key and body
IDEMPOTENCY_HEADER = "Idempotency-Key"  # the action's id: what the v1 signature binds the body to
LEGACY_SIGNATURE_HEADER = "X-Gangwatch-Signature"  # before v1: the body only (replayable), kept for old receivers

DEFAULT_TOLERANCE_S = 300.0  # how far a signature's timestamp may be from the receiver's clock
DEFAULT_REPLAY_ENTRIES = 100_000  # signatures a SignatureVerifier remembers at most


def signed_payload(timestamp: int, key: str, body: bytes) -> bytes:
    """The bytes a v1 signature MACs: ``b"<timestamp>.<idempotency key>." + body``."""
    return f"{int(timestamp)}.{key}.".encode() + body


def sign(secret: str | bytes, body: bytes, key: str, timestamp: float) -> str:
    """The `X-Gangwatch-Signature-V1` value for `body` sent as action `key` at `timestamp` (unix seconds).

    ``t=<integer seconds>,v1=<hex HMAC-SHA256 of signed_payload(t, key, body)>``.
    """
    t = int(timestamp)
    mac = hmac.new(secret_bytes(secret), signed_payload(t, key, body), hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def legacy_signature(secret: str | bytes, body: bytes) -> str:
    """The `X-Gangwatch-Signature` value receivers of releases before v1 check: ``sha256=<hex HMAC of body>``."""
    return "sha256=" + hmac.new(secret_bytes(secret), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a receiver makes of one signed request: `ok`, or the HTTP `status` to answer and the `reason`.

    Truthy when `ok`. `status` is 200 when ok, 401 for a missing, malformed or
    wrong signature or a timestamp outside the tolerance, 409 for a replay.
    """

    ok: bool
    status: int
    reason: str = ""
    timestamp: int | None = None

    def __bool__(self) -> bool:
        return self.ok


def _parse(header: str | None) -> tuple[int, list[str]] | str:
    """(t, [v1 signatures]) from a header value, or why it cannot be read."""
    if not header:
        return "no signature"
    if header.strip().startswith("sha256="):
        return ("a body-only sha256= signature (before v1) proves no freshness: check the X-Gangwatch-Signature-V1 "
                "header instead")
    t: int | None = None
    macs: list[str] = []
    for part in header.split(","):
        name, eq, value = part.strip().partition("=")
        if not eq:
            return "malformed signature header"
        if name == "t":
            if not value.isascii() or not value.isdigit() or len(value) > 12:
                return "malformed signature timestamp"
            t = int(value)
        elif name == "v1":
            macs.append(value)
    if t is None:
        return "the signature has no timestamp (t=)"
    if not macs:
        return "the signature has no v1 MAC"
    return t, macs


def verify_signature(secret: str | bytes, body: bytes, header: str | None, key: str | None, *,
                     tolerance_s: float = DEFAULT_TOLERANCE_S, now: float | None = None,
                     seen: ReplayGuard | None = None) -> Verdict:
    """Check one request's `X-Gangwatch-Signature-V1` (`header`) over `body` and its `Idempotency-Key` (`key`).

    Refuses (401) a missing or malformed header, a MAC that does not match (compared
    in constant time), a timestamp more than `tolerance_s` from `now` (default: the
    wall clock) in either direction; and (409) a signature `seen` already accepted.
    Without `seen` there is no replay memory: use a `SignatureVerifier` for that.
    """
    if key is None or key == "":
        return Verdict(False, 401, "no Idempotency-Key")
    parsed = _parse(header)
    if isinstance(parsed, str):
        return Verdict(False, 401, parsed)
    t, macs = parsed
    expected = hmac.new(secret_bytes(secret), signed_payload(t, key, body), hashlib.sha256).hexdigest().encode("ascii")
    matched = ""
    for mac in macs:
        try:
            given = mac.encode("ascii")
        except UnicodeEncodeError:
            continue
        if hmac.compare_digest(expected, given):
            matched = mac
    if not matched:
        return Verdict(False, 401, "bad signature", t)
    now = time.time() if now is None else now
    if abs(now - t) > tolerance_s:
        side = "old" if t < now else "far in the future"
        return Verdict(False, 401, f"signature timestamp {t} is {abs(now - t):.0f} s {side} "
                                   f"(tolerance {tolerance_s:g} s): stale or a clock out of sync", t)
    if seen is not None and not seen.add(key, t, matched, now):
        return Verdict(False, 409, f"replayed request: this signature of {key} was already accepted", t)
    return Verdict(True, 200, "", t)


class ReplayGuard:
    """A bounded memory of the signatures accepted within the tolerance window.

    `add(key, t, mac, now)` is False when (key, t, mac) was accepted before.
    Entries whose `t` is older than `now - tolerance_s` are dropped (such a request
    fails the timestamp check anyway). When `max_entries` are held, the oldest is
    dropped and no timestamp at or before it is accepted any more, so a replay can
    never pass for want of memory (a legitimate retry signs with a newer `t`).
    """

    def __init__(self, tolerance_s: float = DEFAULT_TOLERANCE_S, max_entries: int = DEFAULT_REPLAY_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.tolerance_s = tolerance_s
        self.max_entries = max_entries
        self._seen: set[tuple[str, int, str]] = set()
        self._order: list[tuple[int, str, str]] = []  # a heap by t
        self._floor: int | None = None  # no t at or below this is accepted (its memory was given up)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, key: str, t: int, mac: str, now: float) -> bool:
        with self._lock:
            self._expire(now)
            if self._floor is not None and t <= self._floor:
                return False
            entry = (key, t, mac)
            if entry in self._seen:
                return False
            while len(self._seen) >= self.max_entries:
                old_t, old_key, old_mac = heapq.heappop(self._order)
                self._seen.discard((old_key, old_t, old_mac))
                self._floor = old_t if self._floor is None else max(self._floor, old_t)
            if self._floor is not None and t <= self._floor:
                return False
            self._seen.add(entry)
            heapq.heappush(self._order, (t, key, mac))
            return True

    def _expire(self, now: float) -> None:
        while self._order and self._order[0][0] < now - self.tolerance_s:
            t, key, mac = heapq.heappop(self._order)
            self._seen.discard((key, t, mac))


class SignatureVerifier:
    """The receiver's check with its replay memory: ``verifier(body, header, key) -> Verdict``.

    `clock` (unix seconds) is injectable for tests; `tolerance_s` bounds both the
    clock skew accepted and how long a signature is remembered.
    """

    def __init__(self, secret: str | bytes, *, tolerance_s: float = DEFAULT_TOLERANCE_S,
                 clock: Callable[[], float] = time.time, max_entries: int = DEFAULT_REPLAY_ENTRIES) -> None:
        if not secret:
            raise ValueError("a webhook secret is required")
        if tolerance_s <= 0:
            raise ValueError(f"tolerance_s must be > 0, got {tolerance_s}")
        self._secret = Secret(secret_bytes(secret))
        self.tolerance_s = tolerance_s
        self._clock = clock
        self.seen = ReplayGuard(tolerance_s, max_entries)

    def __repr__(self) -> str:
        return f"SignatureVerifier(secret={self._secret!r}, tolerance_s={self.tolerance_s:g}, seen={len(self.seen)})"

    def __call__(self, body: bytes, header: str | None, key: str | None) -> Verdict:
        return verify_signature(self._secret.reveal(), body, header, key, tolerance_s=self.tolerance_s,
                                now=self._clock(), seen=self.seen)


class TopicSigner:
    """Signs actions published on the alert topic: ``signer.headers(value, action_id)`` -> the Kafka record
    headers (scheme v1, as the webhook's, stamped with `clock`, unix seconds)."""

    def __init__(self, secret: str | bytes, clock: Callable[[], float] = time.time) -> None:
        if not secret:
            raise ValueError("a webhook secret is required")
        self._secret = Secret(secret_bytes(secret))
        self._clock = clock

    def __repr__(self) -> str:
        return f"TopicSigner(secret={self._secret!r})"

    def headers(self, value: bytes, action_id: str) -> list[tuple[str, bytes]]:
        return [(SIGNATURE_HEADER, sign(self._secret.reveal(), value, action_id, self._clock()).encode())]


class TopicVerifier:
    """Checks an action read from the alert topic: ``verifier(value, headers, action_id) -> Verdict``, with the
    replay memory of a `SignatureVerifier` (a copy of a message read again is refused; the applied-ids journals
    of the actuators make a re-read after a restart act once)."""

    def __init__(self, secret: str | bytes, *, tolerance_s: float = DEFAULT_TOLERANCE_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.check = SignatureVerifier(secret, tolerance_s=tolerance_s, clock=clock)

    def __repr__(self) -> str:
        return f"TopicVerifier({self.check!r})"

    def __call__(self, value: bytes, headers: list[tuple[str, bytes]] | None, action_id: str) -> Verdict:
        found = [v for k, v in headers or () if k == SIGNATURE_HEADER]
        try:
            header = found[-1].decode("ascii") if found else None
        except UnicodeDecodeError:
            return Verdict(False, 401, "malformed signature header")
        return self.check(value, header, action_id)


def topic_secret(env: Mapping[str, str] | None = None) -> str | None:
    """The secret actions on the topic are signed with (GANGWATCH_WEBHOOK_SECRET), or None."""
    return (os.environ if env is None else env).get(SECRET_ENV) or None


def secret_bytes(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else bytes(secret)


class Secret:
    """Holds the shared secret; its repr and str are masked so it never reaches a log."""

    __slots__ = ("_value",)

    def __init__(self, value: bytes) -> None:
        self._value = value

    def reveal(self) -> bytes:
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:  # keep it out of pickles too
        raise TypeError("the webhook secret cannot be pickled")
