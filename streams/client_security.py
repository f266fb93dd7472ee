"""Kafka security for the asyncio clients: the SSL context aiokafka needs, and Faust's `broker_credentials`.

The settings themselves (`GANGWATCH_KAFKA_*`, validation, kafka-python's
arguments, masking) are `gangwatch.schemas.security.KafkaSecurity`; kafka-python
reads the certificate files itself, aiokafka and Faust take an `ssl.SSLContext`.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from gangwatch.schemas.security import KafkaSecurity


def ssl_context(sec: KafkaSecurity) -> ssl.SSLContext | None:
    """A client context for `sec` (CA file, client certificate, host name check), None without SSL."""
    if not sec.ssl:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=sec.ssl_cafile)
    if sec.ssl_certfile:
        ctx.load_cert_chain(sec.ssl_certfile, sec.ssl_keyfile)
    if not sec.ssl_check_hostname:
        ctx.check_hostname = False
    return ctx


def aiokafka_kwargs(sec: KafkaSecurity) -> dict[str, Any]:
    """Keyword arguments for AIOKafkaProducer / AIOKafkaConsumer / AIOKafkaAdminClient."""
    return sec.aiokafka(ssl_context(sec))


def faust_credentials(sec: KafkaSecurity) -> Any:
    """Faust's `broker_credentials` for `sec`: SASLCredentials, SSLCredentials, or None for PLAINTEXT."""
    if sec.security_protocol == "PLAINTEXT":
        return None
    import faust

    ctx = ssl_context(sec)
    if sec.sasl:  # with a context Faust speaks SASL_SSL, without one SASL_PLAINTEXT
        return faust.SASLCredentials(username=sec.username, password=sec.password, mechanism=sec.sasl_mechanism,
                                     ssl_context=ctx)
    return faust.SSLCredentials(ctx)


def faust_app_kwargs(sec: KafkaSecurity | None = None) -> dict[str, Any]:
    """`faust.App(...)` keyword arguments for `sec` (default: from the environment); {} for PLAINTEXT."""
    creds = faust_credentials(KafkaSecurity.from_env() if sec is None else sec)
    return {} if creds is None else {"broker_credentials": creds}


class _Reasons(logging.Handler):
    """Collects what aiokafka logs while it bootstraps (it says why a connection failed only there)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def kafka_refusal(bootstrap: str, sec: KafkaSecurity, timeout_s: float = 10.0) -> str | None:
    """Connect once as every client will (TLS, SASL) and fetch the cluster's metadata; None when that works,
    else one line saying why (the broker refused the user, its certificate is not trusted, the listener speaks
    another protocol), naming the variable to change and never the password.

    A broker that does not answer in `timeout_s` is no refusal (None): the caller has its own wait for that.
    """
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    try:
        kwargs = aiokafka_kwargs(sec)
    except (OSError, ssl.SSLError) as e:  # a CA, certificate or key file missing or not PEM
        return f"cannot load the TLS files of GANGWATCH_KAFKA_SSL_* ({e.strerror or e}: {e.filename or sec.ssl_cafile})"

    async def probe() -> None:
        client = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                                     client_id="gangwatch-probe", **kwargs)
        try:
            await asyncio.wait_for(client.start(), timeout_s)
        finally:
            await client.close()

    got = _Reasons()
    logger = logging.getLogger("aiokafka")
    propagate, logger.propagate = logger.propagate, False  # its lines become the one line below
    logger.addHandler(got)
    try:
        asyncio.run(probe())
        return None
    except (TimeoutError, KafkaError, OSError) as e:
        said = [m for m in got.messages if m.startswith("Unable")]  # 'Unable connect to "h:p": why'
        reason = said[-1].partition('": ')[2] if said else str(e)
    finally:
        logger.removeHandler(got)
        logger.propagate = propagate
    return _explain(bootstrap, sec, reason)


def _explain(bootstrap: str, sec: KafkaSecurity, reason: str) -> str | None:
    """One line for a failed bootstrap's `reason` (aiokafka's words), with what to change."""
    where = f"Kafka at {bootstrap}"
    if "SaslAuthenticationFailed" in reason or "Authentication failed" in reason:
        return (f"{where} refused user {sec.username!r} ({sec.sasl_mechanism}): wrong user or password "
                f"(GANGWATCH_KAFKA_USERNAME, GANGWATCH_KAFKA_PASSWORD)")
    if "UnsupportedSaslMechanism" in reason:
        return f"{where} does not offer SASL {sec.sasl_mechanism}: set GANGWATCH_KAFKA_SASL_MECHANISM to one it does"
    if "CERTIFICATE_VERIFY_FAILED" in reason:
        detail = reason.partition("certificate verify failed: ")[2].partition(" (_ssl")[0] or reason
        return (f"{where}: its TLS certificate is not trusted ({detail}): set GANGWATCH_KAFKA_SSL_CAFILE to the CA "
                f"that signed it" + ("" if sec.ssl_cafile is None else f" (now {sec.ssl_cafile})"))
    tls_failed = any(w in reason for w in ("WRONG_VERSION_NUMBER", "record layer failure", "UNEXPECTED_EOF"))
    if sec.ssl and (tls_failed or not reason.strip()):
        return (f"{where}: the TLS handshake failed ({reason.strip() or 'no answer in TLS'}): does the listener "
                f"speak TLS? set GANGWATCH_KAFKA_SECURITY_PROTOCOL to its protocol (now {sec.security_protocol})")
    if "closed" in reason and sec.security_protocol == "SSL":
        return (f"{where} closed the connection after TLS: its listener may need SASL (GANGWATCH_KAFKA_SECURITY_"
                f"PROTOCOL=SASL_SSL, GANGWATCH_KAFKA_USERNAME, GANGWATCH_KAFKA_PASSWORD)")
    if "closed" in reason and sec.security_protocol == "SASL_PLAINTEXT":
        return (f"{where} closed the connection: its listener may speak TLS (GANGWATCH_KAFKA_SECURITY_PROTOCOL="
                f"SASL_SSL) or another SASL mechanism")
    return None  # unreachable or slow: the caller's wait and the client's own errors say it
