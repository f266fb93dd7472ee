"""The worker's I/O half (`streams.worker._Glue`) on fakes of Faust's consumer: when it calls the input path down."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from gangwatch.streams.runner import JobRunner
from gangwatch.streams.topics import TopicSettings
from gangwatch.streams.worker import _Glue

pytestmark = pytest.mark.unit


class Consumer:
    """aiokafka's consumer as `answering` reads it: its assignment and each partition's last answered fetch."""

    def __init__(self, stamps_ms: dict[str, float | None]) -> None:
        self.stamps_ms = stamps_ms

    def assignment(self) -> set[str]:
        return set(self.stamps_ms)

    def last_poll_timestamp(self, tp: str) -> float | None:
        return self.stamps_ms[tp]


def glue(consumer: Consumer) -> _Glue:
    thread = SimpleNamespace(_ensure_consumer=lambda: consumer)
    app = SimpleNamespace(consumer=SimpleNamespace(_thread=thread))
    return _Glue(app, JobRunner(TopicSettings()), None, {}, (), (), [], False, None)


def event(offset: int) -> Any:
    return SimpleNamespace(message=SimpleNamespace(topic="gw.telemetry", partition=0, offset=offset, key=b"j1",
                                                   value=b"{}", timestamp=None))


def test_a_fresh_fetch_answer_means_the_broker_answers() -> None:
    now_ms = time.time() * 1000
    assert glue(Consumer({"a": now_ms - 10_000, "b": now_ms - 200})).answering(1.5)
    assert not glue(Consumer({"a": now_ms - 10_000, "b": now_ms - 3_000})).answering(1.5)
    assert glue(Consumer({"a": None})).answering(1.5)  # nothing fetched yet: no opinion


def test_records_taken_while_flow_control_pauses_every_fetch_are_no_outage() -> None:
    """Faust pauses every partition while its buffers are full: no fetch is answered, yet the agents take
    records. That is a busy path (silence would be wrong, and so would a reconnect grace)."""
    stale = time.time() * 1000 - 10_000
    g = glue(Consumer({"a": stale, "b": stale}))
    assert not g.answering(1.5)
    g.msg(event(7))
    assert g.answering(1.5) and g.next_offset[("gw.telemetry", 0)] == 8
    g.last_read -= 2.0  # the records stopped coming 2 s ago, and still no fetch is answered
    assert not g.answering(1.5)
