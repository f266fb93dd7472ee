"""Every Kafka client of gangwatch against a real broker's SASL_SSL listener: in with the right credentials,
refused in one line without them.

The broker is a private one (kafkakit.PrivateBroker) with a second listener, SASL_SSL: SASL PLAIN over TLS,
its certificate signed by a CA this module makes with `openssl` (daemons.make_pki). Every client reads
`GANGWATCH_KAFKA_*` (schemas/security.py), as an operator would set them:

- with the right user, password and CA: `topics create`, `publish`, the worker (Faust/aiokafka), `topics tail`,
  the reference controller (dry run: it reads and verifies the worker's signed action), `agent --once` and the
  trainer client (in this process) all reach the broker; what they send is read back over SASL_SSL;
- with a wrong password, or trusting another CA: each command exits 5 with one line on stderr that says why
  (the user refused; the certificate not trusted) and names the variable to change, never the password, and
  no traceback; the trainer client keeps training, spools, and says so in one warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from gangwatch.producers.trainer import TrainerClient
from gangwatch.schemas import DecodeError, decode
from gangwatch.schemas.security import KafkaSecurity
from gangwatch.schemas.topics import TopicSettings

from tests.helpers import data_path
from tests.integration.conftest import PARTITIONS
from tests.integration.daemons import make_pki
from tests.integration.kafkakit import (
    REPO,
    PrivateBroker,
    WorkerProc,
    messages,
    read_all,
    scenario,
    wait_for,
    worker_args,
    write_jsonl,
)

pytestmark = pytest.mark.integration

USER, PASSWORD = "gw", "gw-pass-4e1b9"
WRONG = "not-the-password-Zq81"
SECRET = "the worker's secret"
CLI = [sys.executable, "-m", "gangwatch"]


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """(the broker, its certificates), the broker with a SASL_SSL listener for user `gw`; stopped afterwards."""
    folder = tmp_path_factory.mktemp("sasl-ssl")
    pki = make_pki(folder / "pki")
    broker = PrivateBroker(folder, sasl_ssl=(pki, {USER: PASSWORD}))
    broker.start()
    yield broker, pki
    broker.stop()


def credentials(ca: Path, password: str = PASSWORD) -> dict[str, str]:
    return {"GANGWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "GANGWATCH_KAFKA_USERNAME": USER,
            "GANGWATCH_KAFKA_PASSWORD": password, "GANGWATCH_KAFKA_SSL_CAFILE": str(ca)}


def kafka_python(env: dict[str, str]) -> dict:
    return KafkaSecurity.from_env(env).kafka_python()


def gangwatch(env: dict[str, str], *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([*CLI, *args], cwd=REPO, env=full, capture_output=True, text=True, timeout=timeout)


def records(bootstrap: str, topic: str, env: dict[str, str]) -> list:
    got = [r for _, v in read_all(bootstrap, [topic], security=kafka_python(env))[topic] for r in decode(v)]
    assert not [r for r in got if isinstance(r, DecodeError)]
    return got


def test_every_client_reaches_the_broker_with_the_right_credentials(secure, tmp_path, monkeypatch):
    broker, pki = secure
    bootstrap, env = broker.secure_bootstrap, credentials(pki.ca)
    name = f"s{uuid.uuid4().hex[:10]}"
    topics = TopicSettings(prefix=f"{name}.", partitions=PARTITIONS)
    made = gangwatch(env, "topics", "create", "--bootstrap", bootstrap, "--prefix", topics.prefix,
                     "--partitions", str(PARTITIONS))
    assert made.returncode == 0 and "created" in made.stdout, made.stderr

    # the reference controller reads the alert topic from its end: it starts first
    controller = WorkerProc([*CLI, "controller", "--job", "j1", "--nodes", "n000,n001,n002,n003", "--dry-run",
                             "--bootstrap", bootstrap, "--prefix", topics.prefix, "--group", f"{name}-controller"],
                            tmp_path / "controller.log", env={**env, "GANGWATCH_WEBHOOK_SECRET": SECRET})
    try:
        wait_for(lambda: "dry run: not launching" in controller.log.read_text(errors="replace"), 60.0,
                 "the controller to start reading", proc=controller)
        src = write_jsonl(tmp_path / "in.jsonl", messages(scenario(xid_node=None), topics))  # n001 falls silent
        sent = gangwatch(env, "publish", str(src), "--bootstrap", bootstrap, "--prefix", topics.prefix)
        assert sent.returncode == 0 and "published" in sent.stdout, sent.stderr

        worker = WorkerProc(worker_args(bootstrap, name, topics, "--no-silence"), tmp_path / "worker.log",
                            env={**env, "GANGWATCH_WEBHOOK_SECRET": SECRET})
        try:
            wait_for(lambda: any(a.type == "replace" for a in records(bootstrap, topics.actions, env)), 120.0,
                     "the worker's replace action on the alert topic", proc=worker)
        finally:
            worker.stop()
        [replace] = [a for a in records(bootstrap, topics.actions, env) if a.type == "replace"]
        assert replace.nodes == ["n001"]
        wait_for(lambda: "dry run: would stop j1" in controller.log.read_text(errors="replace"), 60.0,
                 "the controller to read the signed replace", proc=controller)
    finally:
        controller.stop()

    tail = gangwatch(env, "topics", "tail", "actions", "--bootstrap", bootstrap, "--prefix", topics.prefix,
                     "--from-beginning", "--timeout", "20", "--json")
    assert tail.returncode == 0 and replace.id in tail.stdout, tail.stderr

    kmsg = tmp_path / "kern.log"
    kmsg.write_text(data_path("kmsg/h100-xid119.log").read_text())
    agent = gangwatch(env, "agent", "--once", "--node", "n042", "--bootstrap", bootstrap, "--prefix", topics.prefix,
                      "--kmsg", str(kmsg), "--from-start", "--gpu-every", "0", "--spool-dir", str(tmp_path / "spool"))
    assert agent.returncode == 0, agent.stderr
    assert {(r.node, r.code) for r in records(bootstrap, topics.node_events, env)} == {("n042", 119)}

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    client = TrainerClient(job="jt", rank=0, world_size=1, nodes=["n001"], bootstrap=bootstrap,
                           topic_prefix=topics.prefix, heartbeat_s=0.2, flush_s=0.05, spool_dir=tmp_path / "tspool",
                           exit_hooks=False)
    for k in range(3):
        with client.step_context(k):
            pass
    client.close()
    steps = [r.step for r in records(bootstrap, topics.telemetry, env) if r.kind == "step" and r.job == "jt"]
    assert steps == [0, 1, 2]


@pytest.mark.parametrize("wrong, says", [
    ("password", f"refused user '{USER}' (PLAIN): wrong user or password"),
    ("ca", "its TLS certificate is not trusted"),
])
def test_without_the_right_credentials_every_command_is_refused_in_one_line(secure, tmp_path, wrong, says):
    broker, pki = secure
    bootstrap = broker.secure_bootstrap
    env = credentials(pki.other_ca) if wrong == "ca" else credentials(pki.ca, password=WRONG)
    src = tmp_path / "in.jsonl"
    src.write_text('{"kind":"job","v":1,"ts":1.0,"job":"j1","world":1}\n')
    secret = {"GANGWATCH_WEBHOOK_SECRET": SECRET}
    common = ("--bootstrap", bootstrap, "--connect-timeout", "10")
    commands = {
        "topics list": ("topics", "list", *common),
        "publish": ("publish", str(src), *common),
        "topics tail": ("topics", "tail", "actions", *common, "--timeout", "5"),
        "worker": ("worker", *common, "--metrics-port", "0"),
        "controller": ("controller", "--job", "j1", "--nodes", "n1", "--dry-run", *common),
        "slurm apply": ("slurm", "apply", *common, "--idle-timeout", "5"),
        "agent": ("agent", "--once", "--bootstrap", bootstrap, "--kmsg", "off", "--gpu-every", "0",
                  "--spool-dir", str(tmp_path / "spool")),
    }
    for what, args in commands.items():
        done = gangwatch({**env, **secret}, *args, timeout=90.0)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 5, (what, done.returncode, done.stdout, done.stderr)
        assert len(lines) == 1 and says in lines[0] and "GANGWATCH_KAFKA_" in lines[0], (what, done.stderr)
        assert WRONG not in done.stdout + done.stderr and PASSWORD not in done.stdout + done.stderr, what


def test_a_trainer_client_with_a_wrong_password_trains_on_and_spools(secure, tmp_path, monkeypatch, caplog):
    broker, pki = secure
    for k, v in credentials(pki.ca, password=WRONG).items():
        monkeypatch.setenv(k, v)
    client = TrainerClient(job="jw", rank=0, world_size=1, nodes=["n001"], bootstrap=broker.secure_bootstrap,
                           topic_prefix="unused.", heartbeat_s=0, flush_s=0.05, spool_dir=tmp_path / "spool",
                           exit_hooks=False)
    started = time.monotonic()
    for k in range(3):
        with client.step_context(k):
            pass
    stepped = time.monotonic() - started
    client.close()
    assert stepped < 1.0, "training waited for the broker"
    assert list((tmp_path / "spool").rglob("*.spool")), "nothing was spooled"
    said = [r.getMessage() for r in caplog.records if r.name.startswith("gangwatch")]
    assert any("cannot send to Kafka" in m for m in said)
    assert WRONG not in caplog.text
