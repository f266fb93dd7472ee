"""The job controller over a webhook: every `action` is POSTed, signed, to a controller URL.

Each action goes out as its contract JSON (`schemas.encode(action)`, nothing
added) with these headers:

- `Content-Type: application/json`
- `X-Gangwatch-Signature-V1: t=<unix seconds>,v1=<hex HMAC-SHA256>`: the MAC, with the
  shared secret, of the bytes ``b"<t>.<idempotency key>." + body``, so it covers when it
  was sent, which action it is and the body (signature scheme v1, below)
- `X-Gangwatch-Signature: sha256=<hex HMAC-SHA256 of the body>`: the body-only signature
  of earlier releases, still sent so that their receivers keep working; it can be
  replayed, so a receiver should check the v1 header instead
- `Idempotency-Key: <action id>`: the same decision always carries the same key,
  so a controller that sees it twice acts once
- `X-Gangwatch-Action: <action type>`

Receivers check with `verify_signature` (or a `SignatureVerifier`, which also
remembers what it accepted): the MAC must match (constant time), `t` must be
within `tolerance_s` (default 300 s) of the receiver's clock, and the same
(key, t, signature) must not have been accepted before: a captured request
cannot be replayed (the reference controller checks only the v1 header).
Each attempt, retries included, is signed afresh with a timestamp later than
the attempt before, so a legitimate retry always passes
and the receiver's idempotency by action id still makes it act once. The
sender's and receiver's clocks must agree to within the tolerance.

On the alert topic the same scheme signs every action (`TopicSigner`: the
worker, and `replay --publish`, whenever the secret is set): the record header
`X-Gangwatch-Signature-V1` carries ``t=...,v1=...`` over the message value with
the action's id as the key. Whatever acts on the topic checks it with a
`TopicVerifier` (the reference controller, the Slurm and Kubernetes adapters)
and refuses unsigned, forged, stale and replayed actions, one log line each:
anyone who can write to the topic could otherwise drain a cluster.

Delivery is at least once, and bounded: connection errors, timeouts, 5xx, 408
and 429 are retried with exponential backoff and jitter from a seeded RNG (a
`Retry-After` is honoured, up to a cap), at most `max_attempts` tries within
`deadline_s`; any other status is final. With `single_attempt=True` (how the
worker runs it, inside a `sinks.queued.QueuedSink` that retries off the event
loop) `write` makes one POST per action and raises `DeliveryError` (transient
or not, by the same rule) at the first failure; it remembers the ids delivered,
so the queue's retry of the same outputs resumes after them. An action that finally fails is kept in `failed` and
handed to the optional dead-letter callback: never dropped silently. Findings
and incidents are not sent; `collect_stacks` actions are (the controller relays
them to the node sidecars). The secret (argument or `GANGWATCH_WEBHOOK_SECRET`)
never appears in a repr or a log line.
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import logging
import os
import random
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gangwatch.schemas import Action, DeadLetter, Outputs, Record, encode
from gangwatch.schemas.signature import (
    IDEMPOTENCY_HEADER,
    LEGACY_SIGNATURE_HEADER,
    SECRET_ENV,
    SIGNATURE_HEADER,
    Secret,
    legacy_signature,
    secret_bytes,
    sign,
)
from gangwatch.sinks.interface import DeliveryError

log = logging.getLogger(__name__)

ACTION_HEADER = "X-Gangwatch-Action"
_ERROR_BODY_KEEP = 200  # characters of a controller's error response kept in a failure
_DELIVERED_KEEP = 100_000  # action ids remembered as delivered (single_attempt mode)


def retryable(status: int | None) -> bool:
    """Whether a POST that ended with `status` (None: no response: refused, reset, timed out) may be retried:
    connection errors, 408, 429 and 5xx; every other 4xx says the request itself is wrong."""
    return status is None or status in (408, 429) or status >= 500


def _mask_url(url: str) -> str:
    """The URL without any user:password part and without its query (tokens live there)."""
    p = urllib.parse.urlsplit(url)
    host = p.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{p.port}" if p.port else "")
    if p.username or p.password:
        netloc = "***@" + netloc
    return urllib.parse.urlunsplit((p.scheme, netloc, p.path, "***" if p.query else "", ""))


def _split_userinfo(url: str) -> tuple[str, str]:
    """(the URL without user:password, a Basic Authorization value or "") - urllib cannot use them in place."""
    p = urllib.parse.urlsplit(url)
    if p.username is None and p.password is None:
        return url, ""
    netloc = p.netloc.rpartition("@")[2]
    user = urllib.parse.unquote(p.username or "")
    password = urllib.parse.unquote(p.password or "")
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return urllib.parse.urlunsplit((p.scheme, netloc, p.path, p.query, p.fragment)), "Basic " + token


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as an error: urllib would turn the POST into a body-less GET."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        return None


@dataclass(frozen=True, slots=True)
class Delivery:
    """How one action's delivery ended.

    `status` is the last HTTP status (None when no response came back), `attempts`
    the number of POSTs made, `elapsed_s` the time spent on the injected clock,
    including backoff sleeps; `error` says why it failed ("" when `ok`).
    """

    action: Action
    ok: bool
    attempts: int
    status: int | None
    error: str
    elapsed_s: float
    retry_after: float | None = None  # the last answer's Retry-After, seconds


class WebhookSink:
    """Sends every action of the outputs to a job controller's webhook, signed, at least once.

    `secret` falls back to the environment variable `GANGWATCH_WEBHOOK_SECRET`; one
    of the two is required. Backoff before retry n (n = 1, 2, ...) is
    ``min(max_backoff_s, backoff_s * 2**(n-1))`` scaled by a factor drawn uniformly
    from [0.5, 1.0] by `rng` (equal jitter); a `Retry-After` (seconds or an HTTP
    date) replaces it, capped at `max_retry_after_s`. Retries stop after
    `max_attempts` POSTs or when the next wait would pass `deadline_s` since the
    first try. `dead_letter(delivery)` is called for each action that finally fails.
    `wall_clock` (unix seconds) stamps each attempt's signature; `clock` times the retries.
    """

    def __init__(self, url: str, secret: str | bytes | None = None, *, timeout_s: float = 5.0,
                 max_attempts: int = 5, backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 max_retry_after_s: float = 60.0, deadline_s: float = 120.0,
                 rng: random.Random | None = None, seed: int = 0,
                 dead_letter: Callable[[Delivery], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 wall_clock: Callable[[], float] = time.time, ssl_context: ssl.SSLContext | None = None,
                 proxies: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None,
                 single_attempt: bool = False) -> None:
        scheme = urllib.parse.urlsplit(url).scheme
        if scheme not in ("http", "https"):
            raise ValueError(f"webhook URL must be http or https, got {scheme or 'no'} scheme")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if secret is None:
            secret = (os.environ if env is None else env).get(SECRET_ENV)
        if not secret:
            raise ValueError(f"a webhook secret is required: pass `secret` or set {SECRET_ENV}")
        self.url, auth = _split_userinfo(url)  # credentials in the URL become a Basic header, kept masked
        self._secret = Secret(secret_bytes(secret))
        self._auth = Secret(auth.encode()) if auth else None
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.deadline_s = deadline_s
        self._rng = rng if rng is not None else random.Random(seed)
        self._dead_letter = dead_letter
        self._clock, self._sleep, self._wall = clock, sleep, wall_clock
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler(dict(proxies or {})),
                                                      _NoRedirect()]
        if ssl_context is not None:
            handlers.append(urllib.request.HTTPSHandler(context=ssl_context))
        self._opener = urllib.request.build_opener(*handlers)
        self.single_attempt = single_attempt
        self._delivered: dict[str, None] = {}  # ids delivered, oldest first (single_attempt mode)
        self.failed: list[Delivery] = []
        self.sent = 0  # actions delivered (2xx)
        self.attempts = 0  # POSTs made, retries included

    accepts = frozenset({"action"})  # all a queue in front of it needs to hold (sinks/queued.py)

    def __repr__(self) -> str:
        return (f"WebhookSink(url={_mask_url(self.url)!r}, secret={self._secret!r}, "
                f"max_attempts={self.max_attempts}, sent={self.sent}, failed={len(self.failed)})")

    # --- the Sink protocol ----------------------------------------------------------

    def write(self, out: Outputs) -> None:
        """Deliver the actions now (the controller should not wait for a checkpoint).

        With `single_attempt`: one POST per action not delivered before; the first failure raises
        `DeliveryError` (`transient` by `retryable`), and what follows it waits for the retry."""
        if not self.single_attempt:
            for action in out.actions:
                self.deliver(action)
            return
        for action in out.actions:
            if action.id in self._delivered:
                continue
            d = self.deliver(action, attempts=1)
            if not d.ok:
                transient = retryable(d.status)
                raise DeliveryError(f"action {action.id} ({action.type}): {d.error}", transient=transient,
                                    retry_after=d.retry_after, ids=() if transient else (action.id,))
            self._delivered[action.id] = None
            if len(self._delivered) > _DELIVERED_KEEP:
                del self._delivered[next(iter(self._delivered))]

    def reject(self, dead: DeadLetter) -> None:
        pass

    def observe(self, rec: Record) -> None:
        pass

    def flush(self) -> None:
        pass  # nothing is buffered: `write` delivers or dead-letters each action

    def close(self) -> None:
        if self.failed:
            log.warning("webhook %s: %d action(s) were not delivered (kept in `failed`)", _mask_url(self.url),
                        len(self.failed))
        self._opener.close()

    # --- delivery -------------------------------------------------------------------

    def deliver(self, action: Action, attempts: int | None = None) -> Delivery:
        """POST one action until it is accepted or the retry budget is spent; never raises on I/O.

        `attempts` (default `max_attempts`) bounds the POSTs; with `single_attempt` a failure is the
        caller's to retry and is neither kept in `failed` nor handed to the dead-letter callback."""
        max_attempts = self.max_attempts if attempts is None else attempts
        body = encode(action)
        headers = {
            "Content-Type": "application/json",
            IDEMPOTENCY_HEADER: action.id,
            ACTION_HEADER: action.type,
        }
        if self._auth is not None:
            headers["Authorization"] = self._auth.reveal().decode()
        start = self._clock()
        status: int | None = None
        error = ""
        attempt = 0
        signed_at = -1
        while True:
            attempt += 1
            self.attempts += 1
            # each attempt is signed afresh, with a timestamp later than the last: a retry is no replay
            signed_at = max(int(self._wall()), signed_at + 1)
            headers[SIGNATURE_HEADER] = sign(self._secret.reveal(), body, action.id, signed_at)
            headers[LEGACY_SIGNATURE_HEADER] = legacy_signature(self._secret.reveal(), body)
            status, retry_after, error = self._post(body, headers)
            if status is not None and 200 <= status < 300:
                self.sent += 1
                return Delivery(action, True, attempt, status, "", self._clock() - start)
            if not retryable(status):
                log.error("webhook %s rejected action %s (%s): %s; not retried", _mask_url(self.url), action.id,
                          action.type, error)
                break
            if attempt >= max_attempts:
                break
            delay = self._delay(attempt, retry_after)
            if self._clock() - start + delay > self.deadline_s:
                error += f"; gave up: the next wait ({delay:.1f}s) would pass the {self.deadline_s:g}s deadline"
                break
            log.warning("webhook %s: action %s attempt %d failed (%s); retry in %.2fs", _mask_url(self.url),
                        action.id, attempt, error, delay)
            self._sleep(delay)
        d = Delivery(action, False, attempt, status, error, self._clock() - start, retry_after)
        return d if self.single_attempt else self._fail(d)

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after_s)
        cap = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return cap * (0.5 + 0.5 * self._rng.random())

    def _fail(self, d: Delivery) -> Delivery:
        self.failed.append(d)
        log.error("webhook %s: action %s (%s, job %s) not delivered after %d attempt(s): %s", _mask_url(self.url),
                  d.action.id, d.action.type, d.action.job, d.attempts, d.error)
        if self._dead_letter is not None:
            try:
                self._dead_letter(d)
            except Exception:  # a broken callback must not lose the record; it stays in `failed`
                log.exception("webhook dead-letter callback failed for action %s", d.action.id)
        return d

    def _post(self, body: bytes, headers: dict[str, str]) -> tuple[int | None, float | None, str]:
        """One POST: (status or None, Retry-After seconds or None, error text)."""
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                resp.read()
                return resp.status, None, ""
        except urllib.error.HTTPError as e:
            try:
                text = e.read(_ERROR_BODY_KEEP).decode("utf-8", "replace").strip()
            except (OSError, http.client.HTTPException, AttributeError):
                text = ""
            finally:
                e.close()
            retry_after = self._retry_after(e.headers.get("Retry-After") if e.headers else None)
            return e.code, retry_after, f"HTTP {e.code}" + (f": {text}" if text else "")
        except urllib.error.URLError as e:
            return None, None, f"connection error: {e.reason}"
        except (OSError, http.client.HTTPException) as e:  # timeouts, resets, bad status lines
            return None, None, f"connection error: {type(e).__name__}: {e}"

    def _retry_after(self, value: str | None) -> float | None:
        if not value:
            return None
        value = value.strip()
        if value.isdigit():
            return float(value)
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        return max(0.0, when.timestamp() - self._wall())
