"""Connection security from configuration: Kafka SASL/SSL settings and URLs with their secrets masked.

Pure (no I/O beyond reading the given environment mapping), so that every layer
that builds a client can use it: the trainer client and the node agent
(producers), the sinks, and the worker (streams, which adds the SSL context
aiokafka and Faust need: `gangwatch.streams.client_security`).

Kafka, from `GANGWATCH_KAFKA_*` variables (`KafkaSecurity.from_env`):

| variable | meaning | default |
|---|---|---|
| `GANGWATCH_KAFKA_SECURITY_PROTOCOL` | `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT` or `SASL_SSL` | `PLAINTEXT` |
| `GANGWATCH_KAFKA_SASL_MECHANISM` | `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` | `PLAIN` (SASL only) |
| `GANGWATCH_KAFKA_USERNAME`, `GANGWATCH_KAFKA_PASSWORD` | the SASL user (both required with SASL) | |
| `GANGWATCH_KAFKA_SSL_CAFILE` | CA bundle (PEM) that signed the brokers' certificates | the system's |
| `GANGWATCH_KAFKA_SSL_CERTFILE`, `GANGWATCH_KAFKA_SSL_KEYFILE` | client certificate and key (mutual TLS) | |
| `GANGWATCH_KAFKA_SSL_CHECK_HOSTNAME` | `0` to skip the broker host name check | `1` |

The password never appears in a repr (`***`); `mask_url` does the same for a
URL's `user:password@` and for query values named like secrets.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MASK = "***"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ENV = {
    "security_protocol": "GANGWATCH_KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "GANGWATCH_KAFKA_SASL_MECHANISM",
    "username": "GANGWATCH_KAFKA_USERNAME",
    "password": "GANGWATCH_KAFKA_PASSWORD",
    "ssl_cafile": "GANGWATCH_KAFKA_SSL_CAFILE",
    "ssl_certfile": "GANGWATCH_KAFKA_SSL_CERTFILE",
    "ssl_keyfile": "GANGWATCH_KAFKA_SSL_KEYFILE",
    "ssl_check_hostname": "GANGWATCH_KAFKA_SSL_CHECK_HOSTNAME",
}
_SECRET_WORDS = ("password", "passwd", "secret", "token", "keypass")


@dataclass(frozen=True)
class KafkaSecurity:
    """How a Kafka client authenticates and encrypts; PLAINTEXT (the default) adds nothing to a client's arguments.

    Raises ValueError (naming the variable, never the password) when the settings
    do not fit together: SASL without a user or password, a mechanism without SASL,
    certificate files without SSL, a key without its certificate.
    """

    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        proto = (self.security_protocol or "PLAINTEXT").strip().upper()
        if proto not in SECURITY_PROTOCOLS:
            raise ValueError(f"{ENV['security_protocol']} must be one of {', '.join(SECURITY_PROTOCOLS)}, "
                             f"got {self.security_protocol!r}")
        object.__setattr__(self, "security_protocol", proto)
        mech = self.sasl_mechanism.strip().upper() if self.sasl_mechanism else None
        if self.sasl:
            mech = mech or "PLAIN"
            if mech not in SASL_MECHANISMS:
                raise ValueError(f"{ENV['sasl_mechanism']} must be one of {', '.join(SASL_MECHANISMS)}, "
                                 f"got {self.sasl_mechanism!r}")
            if not self.username or self.password is None or self.password == "":
                raise ValueError(f"{proto} needs {ENV['username']} and {ENV['password']}")
        else:
            for name in ("sasl_mechanism", "username", "password"):
                if getattr(self, name):
                    raise ValueError(f"{ENV[name]} is set but the security protocol is {proto}: "
                                     f"set {ENV['security_protocol']}=SASL_SSL (or SASL_PLAINTEXT)")
        object.__setattr__(self, "sasl_mechanism", mech)
        if not self.ssl:
            for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
                if getattr(self, name):
                    raise ValueError(f"{ENV[name]} is set but the security protocol is {proto}: "
                                     f"set {ENV['security_protocol']}=SSL (or SASL_SSL)")
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError(f"{ENV['ssl_keyfile']} needs {ENV['ssl_certfile']}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KafkaSecurity:
        """The settings in `GANGWATCH_KAFKA_*` (of `env`, default the process environment)."""
        env = os.environ if env is None else env
        got: dict[str, Any] = {k: env[v] for k, v in ENV.items() if env.get(v, "") != ""}
        if "ssl_check_hostname" in got:
            got["ssl_check_hostname"] = got["ssl_check_hostname"].strip().lower() not in ("0", "false", "no", "off")
        return cls(**got)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={MASK if k == 'password' else v!r}" for k, v in self._fields() if v is not None)
        return f"KafkaSecurity({shown})"

    __str__ = __repr__

    def _fields(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in ENV]

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def ssl(self) -> bool:
        return self.security_protocol.endswith("SSL")

    def kafka_python(self) -> dict[str, Any]:
        """Keyword arguments for kafka-python's KafkaProducer, KafkaConsumer and KafkaAdminClient."""
        if self.security_protocol == "PLAINTEXT":
            return {}
        out: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.sasl:
            out |= {"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.username,
                    "sasl_plain_password": self.password}
        if self.ssl:
            out["ssl_check_hostname"] = self.ssl_check_hostname
            out |= {k: v for k in ("ssl_cafile", "ssl_certfile", "ssl_keyfile") if (v := getattr(self, k))}
        return out

    def aiokafka(self, ssl_context: Any = None) -> dict[str, Any]:
        """Keyword arguments for aiokafka's clients; `ssl_context` is required with SSL (streams.security makes it)."""
        if self.security_protocol == "PLAINTEXT":
            return {}
        if self.ssl and ssl_context is None:
            raise ValueError(f"{self.security_protocol} needs an SSL context for aiokafka")
        out: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.sasl:
            out |= {"sasl_mechanism": self.sasl_mechanism, "sasl_plain_username": self.username,
                    "sasl_plain_password": self.password}
        if self.ssl:
            out["ssl_context"] = ssl_context
        return out


def mask_url(url: str) -> str:
    """`url` with the password of its `user:password@` and the values of secret-named query parameters as ***.

    ``clickhouse://app:pw@ch1:9000/db?secure=1`` -> ``clickhouse://app:***@ch1:9000/db?secure=1``.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    cut = min([i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0], default=len(rest))
    netloc, tail = rest[:cut], rest[cut:]
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{hostport}" if colon else f"{user}@{hostport}"
    path, q, query = tail.partition("?")
    if q:
        query, h, fragment = query.partition("#")
        parts = []
        for item in query.split("&"):
            name, eq, value = item.partition("=")
            secret = any(w in name.lower() for w in _SECRET_WORDS)
            parts.append(f"{name}={MASK}" if eq and secret and value else item)
        tail = path + "?" + "&".join(parts) + (h + fragment if h else "")
    return (scheme + sep if sep else "") + netloc + tail


def kafka_python_security(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """kafka-python keyword arguments from `GANGWATCH_KAFKA_*` (`env`, default the process environment)."""
    return KafkaSecurity.from_env(env).kafka_python()
