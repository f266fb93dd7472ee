"""Waiting for Kafka and ClickHouse before a command uses them: visible, bounded, one line when they stay away.

Client libraries retry silently for 30 s or more and then raise a long traceback
when a service is down. Commands check the address first: a TCP connection to
each given `host:port`, retried once a second for at most `--connect-timeout`
seconds, with one line on stderr saying what is awaited (not one per try). An
address that accepts a connection is then asked whether it is what was meant:
a Kafka address must answer Kafka's ApiVersions request (`kafka_answers`), so a
ClickHouse or HTTP port given as `--bootstrap` is one line, not a client's 30 s
bootstrap timeout.
"""

from __future__ import annotations

import socket
import struct
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


def wait_for(what: str, addresses: list[tuple[str, int]], timeout_s: float, *, hint: str) -> list[str]:
    """Return the addresses (`host:port`) that accept a connection, once any does; else, after `timeout_s`, a
    one-line UserError. While it waits it says so once, on stderr."""
    started = time.monotonic()
    shown = False
    while True:
        reasons = {f"{h}:{p}": _try(h, p) for h, p in addresses}
        up = [a for a, r in reasons.items() if r is None]
        if up:
            if shown:
                print(f"{what} is up ({time.monotonic() - started:.0f} s)", file=sys.stderr)
            return up
        waited = time.monotonic() - started
        where = ", ".join(f"{a} ({r})" for a, r in reasons.items())
        if waited >= timeout_s:
            raise UserError(f"cannot reach {what} at {where} after {timeout_s:.0f} s; {hint}", EXIT_SERVICE)
        if not shown:
            print(f"waiting for {what} at {where}, up to {timeout_s:.0f} s (--connect-timeout)", file=sys.stderr,
                  flush=True)
            shown = True
        time.sleep(min(1.0, max(0.0, timeout_s - waited)))


def wait_for_kafka(bootstrap: str, timeout_s: float) -> None:
    """Wait for a Kafka address to accept connections, check that one answers as Kafka (plain listeners: a TLS
    one is asked by `check_kafka_credentials`), then `check_kafka_credentials`."""
    sec = kafka_security()
    started = time.monotonic()
    up = wait_for("Kafka", hostports(bootstrap, 9092), timeout_s,
                  hint="start it (./gw up) or pass --bootstrap HOST:PORT")
    if sec.security_protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        answer_s = max(1.0, min(5.0, timeout_s - (time.monotonic() - started)))
        why = {a: kafka_answers(a, answer_s) for a in up}
        if all(why.values()):
            where = ", ".join(f"{a} {w}" for a, w in why.items())
            raise UserError(f"--bootstrap {bootstrap} is not Kafka: {where}; give a Kafka broker's listener "
                            "(9092 by default)", EXIT_SERVICE)
    check_kafka_credentials(bootstrap, sec, timeout_s=min(max(timeout_s, 5.0), 15.0))


def kafka_answers(address: str, timeout_s: float) -> str:
    """'' when `host:port` answers Kafka's ApiVersions request (v0, allowed before any SASL handshake) with a
    response to it; else what it did instead, as a phrase ("answers HTTP ...", "did not answer ... in 3 s")."""
    host, _, port = address.rpartition(":")
    correlation = 0x6777  # "gw"
    client = b"gangwatch-probe"
    header = struct.pack(">hhih", 18, 0, correlation, len(client)) + client  # ApiVersions v0, header v1
    got = b""
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(struct.pack(">i", len(header)) + header)
            while len(got) < 8:
                chunk = sock.recv(8 - len(got))
                if not chunk:
                    break
                got += chunk
    except TimeoutError:
        if not got:
            return f"did not answer Kafka's ApiVersions request in {timeout_s:.0f} s" + _http_too(host, port)
    except OSError as e:
        return f"closed the connection ({e.strerror or type(e).__name__}) on Kafka's ApiVersions request"
    if got.startswith(b"HTTP/"):
        return "answers HTTP (an HTTP port: ClickHouse's is 8123)"
    if len(got) < 8:
        return ("closed the connection on Kafka's ApiVersions request" if not got else
                f"answered Kafka's ApiVersions request with {len(got)} bytes of something else")
    size, echoed = struct.unpack(">ii", got)
    if echoed != correlation or not 4 <= size <= 1 << 20:
        return "answered Kafka's ApiVersions request with something else (another protocol)"
    return ""


def _http_too(host: str, port: str) -> str:
    """', and answers HTTP (...)' when an HTTP server is there (it waits for a request's end, not Kafka's)."""
    from gangwatch.sinks.store import http_answer

    answer = http_answer(host.strip("[]"), int(port))
    if b"clickhouse-client" in answer:
        return ", and answers as ClickHouse's native port does"
    return ", and answers HTTP (an HTTP port; ClickHouse's is 8123)" if answer else ""


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
    from gangwatch.streams.client_security import kafka_refusal

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
