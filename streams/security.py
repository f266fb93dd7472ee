"""Kafka security for the asyncio clients: the SSL context aiokafka needs, and Faust's `broker_credentials`.

The settings themselves (`GANGWATCH_KAFKA_*`, validation, kafka-python's
arguments, masking) are `gangwatch.schemas.security.KafkaSecurity`; kafka-python
reads the certificate files itself, aiokafka and Faust take an `ssl.SSLContext`.
"""

from __future__ import annotations

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
