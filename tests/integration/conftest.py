"""Real services for integration tests: a Kafka broker and a ClickHouse server on 127.0.0.1.

Start them with `deploy/dev.sh up` (CI's `.ci/run` does). Where they are not
running, the tests skip with the reason, except when GANGWATCH_REQUIRE_SERVICES=1
(as in CI), where a missing service fails the run instead of hiding it (tests/helpers.py `missing`: the
one rule for every environment skip of the suite).
"""

from __future__ import annotations

import os
import socket
import uuid

import pytest
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.topic_admin import create_topics

from tests.conftest import FIGURE_PROPERTY
from tests.helpers import missing
from tests.integration.kafkakit import WorkerProc

KAFKA = os.environ.get("GANGWATCH_KAFKA", "127.0.0.1:9092")
CLICKHOUSE = os.environ.get("GANGWATCH_CLICKHOUSE", "127.0.0.1:9000")


def _reachable(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def _require(addr: str, what: str, how: str) -> None:
    if _reachable(addr):
        return
    missing(f"{what} is not reachable at {addr}; start it with `{how}`")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    _require(KAFKA, "Kafka", "deploy/kafka/broker.sh start")
    return KAFKA


@pytest.fixture(scope="session")
def clickhouse_addr() -> tuple[str, int]:
    _require(CLICKHOUSE, "ClickHouse", "deploy/clickhouse/server.sh start")
    host, _, port = CLICKHOUSE.rpartition(":")
    return host, int(port)


@pytest.fixture
def unique() -> str:
    """A fresh name for a topic, group or database of one test."""
    return f"t{uuid.uuid4().hex[:12]}"


# --- the worker under test: its topics and its processes ------------------------------------

PARTITIONS = 4


@pytest.fixture
def topics(kafka_bootstrap, unique) -> TopicSettings:
    settings = TopicSettings(prefix=f"{unique}.", partitions=PARTITIONS)
    create_topics(settings, kafka_bootstrap)
    yield settings
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        mine = [t for t in admin.list_topics() if t.startswith(unique)]
        admin.delete_topics(mine)
    finally:
        admin.close()


@pytest.fixture
def workers(tmp_path):
    started: list[WorkerProc] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProc:
        w = WorkerProc(list(args), tmp_path / f"worker{len(started)}.log", env=env)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


# --- the fault tests' figures: one table at the end of the session -----------------------------
# The table itself is tests/conftest.py's (it collects the figures from the test reports, so that under
# pytest-xdist the controller prints them whichever worker measured them).


@pytest.fixture
def fault_figures(request):
    """`figures(name, value)`: add one figure of this test to the session's fault table (reported, not asserted).

    The table is printed at the end of the session and written to `$GANGWATCH_FAULT_TABLE`, or to
    `fault-figures.txt` under pytest's base temp dir."""
    fault = request.node.name.removeprefix("test_")

    def add(name: str, value) -> None:
        text = f"{value:.3g}" if isinstance(value, float) else str(value)
        request.node.user_properties.append((FIGURE_PROPERTY, (fault, name, text)))

    return add
