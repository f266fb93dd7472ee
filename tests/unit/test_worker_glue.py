"""The worker's I/O half (`streams.worker._Glue`) on fakes of Faust's consumer: when it calls the input path down."""

from __future__ import annotations

import time
from types import SimpleNamespace

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


def test_a_fresh_fetch_answer_means_the_broker_answers() -> None:
    now_ms = time.time() * 1000
    assert glue(Consumer({"a": now_ms - 10_000, "b": now_ms - 200})).answering(1.5)
    assert not glue(Consumer({"a": now_ms - 10_000, "b": now_ms - 3_000})).answering(1.5)
    assert glue(Consumer({"a": None})).answering(1.5)  # nothing fetched yet: no opinion
