"""What a worker's log says at start and in its progress line (issue 24): no ERROR for changelog topics that
are still being created, and no "lag" of months for a replayed or simulated stream."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import pytest
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.runner import JobRunner
from gangwatch.streams.workerio import WorkerIO, event_time_text

from tests.helpers import need_module

pytestmark = pytest.mark.unit

worker = need_module("gangwatch.streams.worker", "the Faust worker (the `worker` extra)")
faust_adapter = need_module("gangwatch.streams.faust_adapter", "the Faust worker (the `worker` extra)")
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, where the simulator starts


def test_changelog_topics_not_found_at_start_are_debug_lines_until_the_topics_exist(caplog):
    aiokafka = logging.getLogger("test-aiokafka.cluster")  # a logger of its own: the real one stays untouched
    aiokafka.setLevel(logging.INFO)
    noise = faust_adapter.ChangelogsNotYet("gw-app", logger=aiokafka.name)
    with caplog.at_level(logging.INFO, logger=aiokafka.name):
        for _ in range(15):  # what a new worker logs while Faust creates its tables' changelogs
            aiokafka.error("Topic %s not found in cluster metadata", "gw-app-core-state-changelog")
        aiokafka.error("Topic %s not found in cluster metadata", "gw.telemetry")  # an input: still an error
        aiokafka.error("Topic %s not found in cluster metadata", "other-app-core-state-changelog")  # not ours
        aiokafka.error("Topic %s is not authorized for this client", "gw-app-core-state-changelog")
        assert noise.demoted == 15
        assert [(r.levelname, r.args[0]) for r in caplog.records] == [
            ("ERROR", "gw.telemetry"), ("ERROR", "other-app-core-state-changelog"),
            ("ERROR", "gw-app-core-state-changelog")]
        caplog.clear()
        noise.done()  # the topics exist: a changelog missing now is something wrong
        aiokafka.error("Topic %s not found in cluster metadata", "gw-app-core-state-changelog")
    assert [r.levelname for r in caplog.records] == ["ERROR"] and not aiokafka.filters


def test_with_debug_logging_the_start_up_lines_are_shown_as_debug(caplog):
    aiokafka = logging.getLogger("test-aiokafka.debug")
    aiokafka.setLevel(logging.DEBUG)
    noise = faust_adapter.ChangelogsNotYet("gw-app", logger=aiokafka.name)
    with caplog.at_level(logging.DEBUG, logger=aiokafka.name):
        aiokafka.error("Topic %s not found in cluster metadata", "gw-app-node-job-changelog")
    noise.done()
    assert [r.levelname for r in caplog.records] == ["DEBUG"]


def test_event_time_is_shown_as_a_time_with_its_distance_from_the_clock_not_as_lag():
    assert event_time_text(None, T0) == "no event time yet"
    assert event_time_text(T0, T0 + 0.25) == "newest event time 2026-01-01T00:00:00Z (0.250 s behind the clock)"
    assert event_time_text(T0, T0 + 28_944_662) == \
        "newest event time 2026-01-01T00:00:00Z (335.0 days behind the clock)"
    assert event_time_text(T0 + 7200, T0) == "newest event time 2026-01-01T02:00:00Z (2.0 h ahead of the clock)"


def test_the_progress_line_of_a_simulated_stream_says_event_time_not_lag(caplog):
    router = SimpleNamespace(resume_points=lambda: {}, routed=0, dropped=0)
    g = WorkerIO(SimpleNamespace(), JobRunner(TopicSettings()), router, {}, (), (), [], False, None)
    g.newest_ts, g.lag_s = T0 + 180, time.time() - (T0 + 180)
    with caplog.at_level(logging.INFO, logger="gangwatch.worker"):
        g.stats(router, every_s=1e-9)
    [line] = [r.getMessage() for r in caplog.records]
    assert "newest event time 2026-01-01T00:03:00Z (" in line and "behind the clock" in line
    assert "lag" not in line


def test_fausts_error_lines_for_normal_states_are_said_as_info_for_this_apps_topics_only(caplog):
    """Faust's own templates (so a Faust that rewords them fails here), logged as its consumer thread and its
    assignor log them: an idle partition of ours becomes one INFO line that says why; the changelogs' no-fetch
    and missing-topic lines become DEBUG; the same lines about topics not ours, and other errors, stay."""
    from faust.transport.drivers import aiokafka as driver
    from faust.types import TP

    consumer = logging.getLogger("faust.transport.drivers.aiokafka")
    assignor = logging.getLogger("faust.assignor.partition_assignor")
    said = faust_adapter.NormalStates("gw-app", "gw.")
    prefix = "[^---AIOKafkaConsumerThread]: "  # what mode's CompositeLogger puts before the message
    idle = prefix + driver.SLOW_PROCESSING_STREAM_IDLE_SINCE_START + " There are multiple possible explanations"
    try:
        with caplog.at_level(logging.INFO):
            consumer.error(idle, TP("gw.telemetry", 1), "5 minutes ago")
            consumer.error(prefix + driver.SLOW_PROCESSING_NO_FETCH_SINCE_START,
                           TP("gw-app-core-state-changelog", 0), "5 minutes ago")
            assignor.warning("Ignoring missing topic: %r", "gw-app-node-job-changelog")
            consumer.error(idle, TP("other.telemetry", 1), "5 minutes ago")  # not our topic
            consumer.error(prefix + driver.SLOW_PROCESSING_NO_FETCH_SINCE_START, TP("gw.telemetry", 0), "now")
            assignor.warning("Ignoring missing topic: %r", "gw.telemetry")  # an input missing: still said
    finally:
        said.close()
    got = [(r.levelname, r.getMessage()) for r in caplog.records if r.name in said.LOGGERS]
    assert got[0] == ("INFO", "partition TP(topic='gw.telemetry', partition=1): no record taken since the worker "
                              "started (5 minutes ago); normal while it has no new input")
    assert [level for level, _ in got[1:]] == ["ERROR", "ERROR", "WARNING"]
    assert "other.telemetry" in got[1][1] and "TP(topic='gw.telemetry', partition=0)" in got[2][1]
    assert said not in consumer.filters and said not in assignor.filters  # (others' workers in this process may
    # still hold theirs)


def test_a_worker_without_a_signing_secret_says_once_that_its_actions_go_out_unsigned(caplog, monkeypatch):
    from gangwatch.schemas.signature import SECRET_ENV

    monkeypatch.delenv(SECRET_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="gangwatch.worker"):
        assert worker.action_signer(SimpleNamespace(webhook_secret=None), "gw.actions") is None
        assert worker.action_signer(SimpleNamespace(webhook_secret="s3cret-4ever"), "gw.actions") is not None
    [said] = [r for r in caplog.records if r.name == "gangwatch.worker"]
    assert said.levelname == "WARNING"  # before Faust sets up logging only WARNING and above reach stderr
    assert f"actions on gw.actions are not signed: no secret in {SECRET_ENV}" in said.getMessage()
