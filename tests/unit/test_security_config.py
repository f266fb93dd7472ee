"""Kafka SASL/SSL and ClickHouse credentials from configuration: each client library's arguments, and no secret
in a repr, a log line or the command line's output.

No SASL or TLS broker runs here: what is checked is the mapping onto kafka-python, aiokafka and Faust (each
client built with it where that needs no broker), not a handshake.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from gangwatch.schemas.security import ENV, KafkaSecurity, kafka_python_security, mask_url
from gangwatch.streams.client_security import aiokafka_kwargs, faust_app_kwargs, faust_credentials, ssl_context

from gangwatch.cli import main
from tests.helpers import need

pytestmark = pytest.mark.unit

KAFKA_PW = "kafka-Pa55w0rd-never-logged"
CH_PW = "ch-Pa55w0rd-never-logged"


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[str, str]:
    """A self-signed certificate and its key (PEM), made by openssl."""
    need(shutil.which("openssl"), "openssl is not installed: no certificate to load")
    d = tmp_path_factory.mktemp("tls")
    crt, key = d / "client.pem", d / "client.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(crt), "-subj", "/CN=gangwatch-test", "-days", "1"], check=True, capture_output=True,
                   timeout=60)
    return str(crt), str(key)


def _env(**kw: str) -> dict[str, str]:
    return {ENV[k]: v for k, v in kw.items()}


# --- the settings ----------------------------------------------------------------------------------------------


def test_plaintext_adds_nothing_to_any_client():
    sec = KafkaSecurity.from_env({})
    assert sec.security_protocol == "PLAINTEXT"
    assert sec.kafka_python() == {} and sec.aiokafka() == {} and aiokafka_kwargs(sec) == {}
    assert faust_credentials(sec) is None and faust_app_kwargs(sec) == {}
    assert kafka_python_security({}) == {}


def test_sasl_ssl_scram_maps_onto_kafka_python():
    env = _env(security_protocol="sasl_ssl", sasl_mechanism="scram-sha-512", username="gw", password=KAFKA_PW,
               ssl_cafile="/etc/ssl/certs/ca-certificates.crt")
    assert kafka_python_security(env) == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "sasl_plain_username": "gw",
        "sasl_plain_password": KAFKA_PW, "ssl_check_hostname": True,
        "ssl_cafile": "/etc/ssl/certs/ca-certificates.crt",
    }


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_plaintext_for_each_mechanism(mechanism):
    sec = KafkaSecurity("SASL_PLAINTEXT", mechanism, "gw", KAFKA_PW)
    assert sec.kafka_python() == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                                  "sasl_plain_username": "gw", "sasl_plain_password": KAFKA_PW}
    assert sec.aiokafka() == sec.kafka_python()  # no SSL: no context, the same names


def test_sasl_defaults_to_plain():
    assert KafkaSecurity("SASL_SSL", None, "gw", KAFKA_PW).sasl_mechanism == "PLAIN"


def test_every_kafka_python_argument_is_one_each_client_takes(cert):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient

    crt, key = cert
    sec = KafkaSecurity("SASL_SSL", "SCRAM-SHA-256", "gw", KAFKA_PW, ssl_cafile=crt, ssl_certfile=crt,
                        ssl_keyfile=key, ssl_check_hostname=False)
    kw = sec.kafka_python()
    assert kw["ssl_certfile"] == crt and kw["ssl_keyfile"] == key and kw["ssl_check_hostname"] is False
    for client in (KafkaProducer, KafkaConsumer, KafkaAdminClient):
        assert set(kw) <= set(client.DEFAULT_CONFIG), client.__name__


def test_ssl_only_with_a_client_certificate(cert):
    crt, key = cert
    sec = KafkaSecurity.from_env(_env(security_protocol="SSL", ssl_cafile=crt, ssl_certfile=crt, ssl_keyfile=key,
                                      ssl_check_hostname="0"))
    assert sec.kafka_python() == {"security_protocol": "SSL", "ssl_check_hostname": False, "ssl_cafile": crt,
                                  "ssl_certfile": crt, "ssl_keyfile": key}
    ctx = ssl_context(sec)
    assert isinstance(ctx, ssl.SSLContext) and ctx.check_hostname is False
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert len(ctx.get_ca_certs()) == 1  # our CA file, not the system's
    kw = aiokafka_kwargs(sec)
    assert kw["security_protocol"] == "SSL" and isinstance(kw["ssl_context"], ssl.SSLContext)


def test_aiokafka_clients_accept_the_arguments(cert):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    crt, key = cert
    sec = KafkaSecurity("SASL_SSL", "SCRAM-SHA-512", "gw", KAFKA_PW, ssl_cafile=crt)

    async def build() -> None:
        for cls in (AIOKafkaProducer, AIOKafkaConsumer):
            client = cls(bootstrap_servers="127.0.0.1:1", **aiokafka_kwargs(sec))  # no connection until start()
            inner = client.client if cls is AIOKafkaProducer else client._client
            assert inner._security_protocol == "SASL_SSL" and inner._sasl_mechanism == "SCRAM-SHA-512"
            assert (inner._sasl_plain_username, inner._sasl_plain_password) == ("gw", KAFKA_PW)
            assert isinstance(inner._ssl_context, ssl.SSLContext)
            if cls is AIOKafkaProducer:
                await client.stop()  # never started: closes what the constructor opened

    asyncio.run(build())


@pytest.mark.parametrize("protocol", ["SASL_SSL", "SASL_PLAINTEXT", "SSL"])
def test_faust_credentials_come_out_as_the_same_aiokafka_arguments(protocol, cert):
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    crt, _ = cert
    sasl = protocol.startswith("SASL")
    sec = KafkaSecurity(protocol, "SCRAM-SHA-256" if sasl else None, "gw" if sasl else None,
                        KAFKA_PW if sasl else None, ssl_cafile=crt if protocol.endswith("SSL") else None)
    ours = aiokafka_kwargs(sec)
    theirs = credentials_to_aiokafka_auth(faust_credentials(sec))
    assert {k: v for k, v in theirs.items() if k != "ssl_context"} == {k: v for k, v in ours.items()
                                                                        if k != "ssl_context"}
    assert (theirs.get("ssl_context") is None) == (ours.get("ssl_context") is None)


@pytest.mark.parametrize("env, says", [
    (_env(security_protocol="KERBEROS"), "must be one of"),
    (_env(security_protocol="SASL_SSL", username="gw"), "needs GANGWATCH_KAFKA_USERNAME and GANGWATCH_KAFKA_PASSWORD"),
    (_env(security_protocol="SASL_SSL", password=KAFKA_PW), "needs GANGWATCH_KAFKA_USERNAME"),
    (_env(security_protocol="SASL_SSL", sasl_mechanism="GSSAPI", username="gw", password=KAFKA_PW), "must be one"),
    (_env(username="gw", password=KAFKA_PW), "GANGWATCH_KAFKA_USERNAME is set but the security protocol is PLAINTEXT"),
    (_env(security_protocol="SASL_PLAINTEXT", username="gw", password=KAFKA_PW, ssl_cafile="/ca.pem"),
     "GANGWATCH_KAFKA_SSL_CAFILE is set"),
    (_env(security_protocol="SSL", ssl_keyfile="/k.pem"), "GANGWATCH_KAFKA_SSL_KEYFILE needs"),
])
def test_settings_that_do_not_fit_are_refused_without_the_password(env, says):
    with pytest.raises(ValueError) as e:
        KafkaSecurity.from_env(env)
    assert says in str(e.value) and KAFKA_PW not in str(e.value)


def test_the_password_is_masked_in_reprs():
    sec = KafkaSecurity("SASL_SSL", "PLAIN", "gw", KAFKA_PW)
    for text in (repr(sec), str(sec), f"{sec}", repr(faust_credentials(sec)), repr(faust_app_kwargs(sec))):
        assert KAFKA_PW not in text
    assert "password='***'" in repr(sec) and "username='gw'" in repr(sec)


@pytest.mark.parametrize("url, shown", [
    ("clickhouse://app:s3cr%40t@ch1:9000/db?secure=1", "clickhouse://app:***@ch1:9000/db?secure=1"),
    ("clickhouses://app:pw@ch1/db", "clickhouses://app:***@ch1/db"),
    ("clickhouse://app@ch1:9000", "clickhouse://app@ch1:9000"),
    ("clickhouse://ch1:9000/db", "clickhouse://ch1:9000/db"),
    ("clickhouse://u:p@w@ch1:9000", "clickhouse://u:***@ch1:9000"),
    ("clickhouse://ch1/db?password=pw&keypass=k2&verify=0#x", "clickhouse://ch1/db?password=***&keypass=***&verify=0#x"),
    ("chdb:/var/lib/gw", "chdb:/var/lib/gw"),
    ("kafka1:9092", "kafka1:9092"),
])
def test_mask_url(url, shown):
    assert mask_url(url) == shown


def test_the_clickhouse_store_takes_credentials_from_the_url_and_masks_them(monkeypatch, tmp_path):
    import clickhouse_driver
    from gangwatch.sinks import store

    made: list[dict] = []

    class FakeClient:
        def __init__(self, host: str, **kw: object) -> None:
            made.append({"host": host, **kw})

        def execute(self, sql: str, *a: object, **kw: object) -> list:
            return []

        def disconnect(self) -> None:
            pass

    monkeypatch.setattr(clickhouse_driver, "Client", FakeClient)
    ca = tmp_path / "ca.pem"
    ca.write_text("(a CA bundle)")  # the file must exist: a missing one is refused, naming it
    s = store.open_store(f"clickhouses://gw:{CH_PW.replace('-', '%2D')}@ch1/gwdb?verify=0&ca_certs={ca}")
    main, admin = made  # the store's client, and the one that creates its database (answering at once)
    assert main == {"host": "ch1", "port": 9440, "database": "gwdb", "user": "gw", "password": CH_PW,
                    "secure": True, "verify": False, "ca_certs": str(ca)}
    assert admin == {**{k: v for k, v in main.items() if k != "database"},
                     "send_receive_timeout": store.HELLO_TIMEOUT_S}
    assert CH_PW not in repr(s) and repr(s) == "ClickHouseStore(clickhouses://gw:***@ch1:9440/gwdb)"
    store.ClickHouseStore("ch2", 9000, env={store.USER_ENV: "env-user", store.PASSWORD_ENV: CH_PW})
    assert (made[-1]["user"], made[-1]["password"]) == ("env-user", CH_PW)
    store.open_store("clickhouse://ch3:9001")
    assert (made[-1]["user"], made[-1]["password"], made[-1]["port"]) == ("default", "", 9001)


# --- nothing secret reaches a log or the terminal --------------------------------------------------------------


def test_a_worker_app_built_with_sasl_logs_no_secret(monkeypatch, caplog, tmp_path):
    from gangwatch.streams.worker import make_app
    from gangwatch.streams.worker_settings import WorkerSettings

    for k, v in _env(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512", username="gw",
                     password=KAFKA_PW).items():
        monkeypatch.setenv(k, v)
    with caplog.at_level(logging.DEBUG):
        app = make_app(WorkerSettings(bootstrap="127.0.0.1:1", datadir=str(tmp_path / "faust"), metrics_port=0))
    creds = app.conf.broker_credentials
    assert (creds.username, creds.password, creds.mechanism.value, creds.protocol.value) == (
        "gw", KAFKA_PW, "SCRAM-SHA-512", "SASL_PLAINTEXT")
    assert KAFKA_PW not in caplog.text and KAFKA_PW not in repr(creds)


def _no_secret(caplog, capsys) -> str:
    out, err = capsys.readouterr()
    for text in (caplog.text, out, err):
        assert KAFKA_PW not in text and CH_PW not in text
        assert CH_PW.replace("-", "%2D") not in text
    return err


def test_replay_with_a_store_password_logs_no_secret(monkeypatch, caplog, capsys, tmp_path):
    """The store is unreachable (a closed port): the error names where, never the password."""
    monkeypatch.setenv(ENV["password"], KAFKA_PW)
    monkeypatch.setenv(ENV["username"], "gw")
    monkeypatch.setenv(ENV["security_protocol"], "SASL_SSL")
    src = tmp_path / "in.jsonl"
    src.write_text('{"kind":"job","v":1,"ts":1.0,"job":"j1","world":2}\n')
    url = f"clickhouse://gw:{CH_PW}@127.0.0.1:1/gw?secure=0"
    with caplog.at_level(logging.DEBUG):
        code = main(["replay", str(src), "--out", str(tmp_path / "out"), "--store", url, "--connect-timeout", "0.2"])
    err = _no_secret(caplog, capsys)
    assert code != 0 and "ClickHouse" in err


def test_worker_with_kafka_and_store_passwords_logs_no_secret(monkeypatch, caplog, capsys, tmp_path):
    monkeypatch.setenv(ENV["password"], KAFKA_PW)
    monkeypatch.setenv(ENV["username"], "gw")
    monkeypatch.setenv(ENV["security_protocol"], "SASL_PLAINTEXT")
    with caplog.at_level(logging.DEBUG):
        code = main(["worker", "--bootstrap", "127.0.0.1:1", "--store", f"clickhouse://gw:{CH_PW}@127.0.0.1:1/gw",
                     "--connect-timeout", "0.2"])
    err = _no_secret(caplog, capsys)
    assert code != 0 and "Kafka" in err


def test_path_of_a_secret_file_is_fine_to_show(tmp_path):
    p = Path(tmp_path / "ca.pem")
    assert str(p) in repr(KafkaSecurity("SSL", ssl_cafile=str(p)))


SASL = dict(security_protocol="SASL_SSL", username="gw", password="pw-Zq81", ssl_cafile="/etc/ca.pem")


@pytest.mark.parametrize("sec, reason, says", [  # aiokafka's words, as it logged them against the real broker
    (SASL, "[Error 58] SaslAuthenticationFailed: Authentication failed: Invalid username or password",
     "refused user 'gw' (PLAIN): wrong user or password (GANGWATCH_KAFKA_USERNAME, GANGWATCH_KAFKA_PASSWORD)"),
    (SASL, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate "
     "(_ssl.c:1006)", "its TLS certificate is not trusted (unable to get local issuer certificate): set "
     "GANGWATCH_KAFKA_SSL_CAFILE to the CA that signed it (now /etc/ca.pem)"),
    ({**SASL, "sasl_mechanism": "SCRAM-SHA-256"}, "UnsupportedSaslMechanism: ...",
     "does not offer SASL SCRAM-SHA-256: set GANGWATCH_KAFKA_SASL_MECHANISM"),
    (SASL, "", "the TLS handshake failed (no answer in TLS): does the listener speak TLS?"),
    (dict(security_protocol="SSL"), "KafkaConnectionError: Connection at 127.0.0.1:9094 closed",
     "closed the connection after TLS: its listener may need SASL"),
    (dict(security_protocol="SASL_PLAINTEXT", username="gw", password="pw-Zq81"),
     "KafkaConnectionError: Connection at 127.0.0.1:9094 closed", "its listener may speak TLS"),
])
def test_a_refused_bootstrap_is_one_line_naming_what_to_change(sec, reason, says):
    from gangwatch.streams.client_security import _explain

    line = _explain("127.0.0.1:9094", KafkaSecurity(**sec), reason)
    assert line.startswith("Kafka at 127.0.0.1:9094") and says in line and "pw-Zq81" not in line
    assert "\n" not in line


def test_a_broker_that_is_only_unreachable_is_no_refusal():
    import socket

    from gangwatch.streams.client_security import _explain, kafka_refusal

    assert _explain("h:1", KafkaSecurity(**SASL), "[Errno 111] Connect call failed ('127.0.0.1', 1)") is None
    with socket.socket() as s:  # bound, not listening: connections to it are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert kafka_refusal(f"127.0.0.1:{port}", KafkaSecurity(**{**SASL, "ssl_cafile": None}), 2.0) is None


def test_tls_files_that_do_not_load_are_one_line(tmp_path):
    from gangwatch.streams.client_security import kafka_refusal

    (tmp_path / "ca.pem").write_text("not a certificate")
    for ca in (tmp_path / "missing.pem", tmp_path / "ca.pem"):
        line = kafka_refusal("127.0.0.1:9", KafkaSecurity(**{**SASL, "ssl_cafile": str(ca)}), 1.0)
        assert line.startswith("cannot load the TLS files of GANGWATCH_KAFKA_SSL_*") and str(ca) in line
