"""Waiting for Kafka and ClickHouse before a command uses them: visible, bounded, one line when they stay away.

Client libraries retry silently for 30 s or more and then raise a long traceback
when a service is down. Commands check the address first: a TCP connection to
each given `host:port`, retried once a second with a line on stderr saying what
is awaited, for at most `--connect-timeout` seconds.
"""

from __future__ import annotations

import socket
import sys
import time
from urllib.parse import urlsplit

from gangwatch.cli.options import EXIT_SERVICE, EXIT_USAGE, UserError


def hostports(spec: str, default_port: int) -> list[tuple[str, int]]:
    """`a:9092,b` -> [(a, 9092), (b, default_port)]; bad ports are a user error."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part.startswith("["):  # [v6]:port
            host, _, rest = part[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else ""
        elif ":" in part:
            host, _, port = part.rpartition(":")
        else:
            host, port = part, ""
        port = port or str(default_port)
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise UserError(f"bad address {part!r}: want HOST:PORT", EXIT_USAGE)
        out.append((host or "127.0.0.1", int(port)))
    if not out:
        raise UserError(f"no address in {spec!r}: want HOST:PORT", EXIT_USAGE)
    return out


def _try(host: str, port: int) -> str | None:
    """None when a TCP connection opens, else why not."""
    try:
        with socket.create_connection((host, port), timeout=2.0):
            return None
    except OSError as e:
        return e.strerror or type(e).__name__


def wait_for(what: str, addresses: list[tuple[str, int]], timeout_s: float, *, hint: str) -> None:
    """Return once any address accepts a connection; else, after `timeout_s`, a one-line UserError."""
    started = time.monotonic()
    shown = False
    while True:
        reasons = {f"{h}:{p}": _try(h, p) for h, p in addresses}
        if any(r is None for r in reasons.values()):
            if shown:
                print(f"{what} is up", file=sys.stderr)
            return
        waited = time.monotonic() - started
        where = ", ".join(f"{a} ({r})" for a, r in reasons.items())
        if waited >= timeout_s:
            raise UserError(f"cannot reach {what} at {where} after {timeout_s:.0f} s; {hint}", EXIT_SERVICE)
        print(f"waiting for {what} at {where}: {waited:.0f}/{timeout_s:.0f} s", file=sys.stderr, flush=True)
        shown = True
        time.sleep(min(1.0, max(0.0, timeout_s - waited)))


def wait_for_kafka(bootstrap: str, timeout_s: float) -> None:
    """Wait for a Kafka address to accept connections, then `check_kafka_credentials`."""
    sec = kafka_security()
    wait_for("Kafka", hostports(bootstrap, 9092), timeout_s,
             hint="start it (./gw up) or pass --bootstrap HOST:PORT")
    check_kafka_credentials(bootstrap, sec, timeout_s=min(max(timeout_s, 5.0), 15.0))


def kafka_security():
    """The Kafka clients' SASL/SSL settings (`GANGWATCH_KAFKA_*`); a one-line UserError when they do not fit."""
    from gangwatch.schemas.security import KafkaSecurity

    try:
        return KafkaSecurity.from_env()
    except ValueError as e:
        raise UserError(str(e), EXIT_USAGE) from None


def check_kafka_credentials(bootstrap: str, sec, timeout_s: float) -> None:
    """With SASL or TLS configured, connect once as the clients will: a broker that refuses the user or whose
    certificate is not trusted is a one-line UserError (client libraries retry for 30 s and then say only that
    they could not bootstrap). A broker that does not answer is no refusal: the caller's wait says that."""
    if sec.security_protocol == "PLAINTEXT":
        return
    from gangwatch.streams.security import kafka_refusal

    refused = kafka_refusal(bootstrap, sec, timeout_s=timeout_s)
    if refused:
        raise UserError(refused, EXIT_SERVICE)


def check_store_url(url: str) -> None:
    """A store URL that `open_store` takes, else a one-line UserError (before anything is written or waited for)."""
    from gangwatch.sinks.store import check_url

    try:
        check_url(url)
    except ValueError as e:
        raise UserError(f"--store: {e}", EXIT_USAGE) from None


def wait_for_store(url: str, timeout_s: float) -> None:
    """`check_store_url`, and for `clickhouse://HOST:PORT/DB` the wait; the embedded chDB store needs none."""
    check_store_url(url)
    if not url.startswith(("clickhouse://", "clickhouses://")):
        return
    parts = urlsplit(url)
    secure = url.startswith("clickhouses://") or "secure=1" in parts.query or "secure=true" in parts.query.lower()
    host, port = parts.hostname or "127.0.0.1", parts.port or (9440 if secure else 9000)
    wait_for("ClickHouse", [(host, port)], timeout_s,
             hint="start it (./gw up) or pass --store clickhouse://HOST:PORT/DB")
