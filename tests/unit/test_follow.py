"""`control.follow.TopicReader` when the broker goes away: kafka-python's `poll` raises the failure of its group
heartbeat (a broker refusing connections); the reader, and the controller that owns a running job through it, go
on reading once the broker is back."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import kafka
import pytest
from gangwatch.control.follow import TopicReader
from gangwatch.schemas import Finding, encode
from kafka.errors import KafkaConnectionError

pytestmark = pytest.mark.unit


class FlakyConsumer:
    """A consumer whose polls follow a script: an exception is raised, anything else returned."""

    script: list = []

    def __init__(self, *topics, **config) -> None:
        self.polls = 0

    def poll(self, timeout_ms: int = 0):
        self.polls += 1
        step = FlakyConsumer.script.pop(0) if FlakyConsumer.script else {}
        if isinstance(step, Exception):
            raise step
        return step


def message(rec, offset: int) -> SimpleNamespace:
    return SimpleNamespace(topic="gw.findings", partition=0, offset=offset, key=b"j1", value=encode(rec), headers=[])


def test_a_poll_the_broker_fails_reads_nothing_and_the_next_one_reads_on(monkeypatch, caplog):
    finding = Finding(ts=1.0, id="f-1", job="j1", node="n1", rank=0, type="fail_stop", detector="failstop", score=1.0)
    down = KafkaConnectionError("111 ECONNREFUSED")
    FlakyConsumer.script = [down, down, {"tp": [message(finding, 7)]}]
    monkeypatch.setattr(kafka, "KafkaConsumer", FlakyConsumer)
    reader = TopicReader("127.0.0.1:1", ["gw.findings"], "g")
    with caplog.at_level(logging.INFO, logger="gangwatch.follow"):
        assert reader.poll(0.01) == [] and reader.poll(0.01) == []
        assert reader.poll(0.01) == [finding]
    said = [r.getMessage() for r in caplog.records]
    assert said == ["gw.findings: cannot read now (KafkaConnectionError: 111 ECONNREFUSED); trying again",
                    "gw.findings: reading again"]  # once per cause, and once when it reads again
