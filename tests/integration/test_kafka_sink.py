"""KafkaSink through a real broker: each output kind lands on its topic, keyed by job, read back identical."""

from __future__ import annotations

import orjson
import pytest
from gangwatch.schemas import Action, DeadLetter, DecodeError, Finding, Incident, Outputs, decode
from gangwatch.sinks.kafka import KafkaSink, KafkaSinkError
from gangwatch.sinks.queued import classify
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from tests.integration.kafkakit import consume

pytestmark = pytest.mark.integration

KINDS = ("findings", "actions", "incidents", "dlq")


@pytest.fixture
def sink_topics(kafka_bootstrap, unique):
    names = {k: f"{unique}.{k}" for k in KINDS}
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id=unique)
    admin.create_topics([NewTopic(n, num_partitions=3, replication_factor=1) for n in names.values()])
    yield names
    admin.delete_topics(list(names.values()))
    admin.close()


def _outputs() -> Outputs:
    findings = [
        Finding(id="f-1", ts=100.0, job="j1", type="hw_fault", detector="hw.xid", node="n003", gpu=2, score=9.0,
                evidence={"xid": 79, "message": "GPU has fallen off the bus"}),
        Finding(id="f-2", ts=101.5, job="j2", type="fail_slow", detector="failslow.compute", rank=5, node="n010",
                gpu=5, score=7.2, evidence={"z": 7.2, "window": [1, 2, 3]}),
        Finding(id="f-3", ts=102.0, job="j1", type="fail_stop", detector="failstop.heartbeat", rank=17),
    ]
    actions = [
        Action(id="a-1", ts=102.0, job="j1", incident="i-1", type="replace", nodes=["n003"],
               reason="Xid 79 on gpu 2; 511 ranks stalled", evidence=["f-1", "f-3"], path="hot"),
        Action(id="a-2", ts=103.0, job="j2", incident="i-2", type="collect_stacks", nodes=["n010"]),
    ]
    incidents = [
        Incident(id="i-1", ts=102.0, job="j1", cls="fail_stop", onset_ts=99.0, detected_ts=100.0,
                 localized_ts=100.0, decided_ts=102.0, culprit_nodes=["n003"], evicted_nodes=["n003"], path="hot",
                 stage_s={"detect": 1.0, "localize": 0.0, "decide": 2.0}),
        Incident(id="i-2", ts=103.0, job="j2", cls="fail_slow"),
    ]
    return Outputs(findings=findings, actions=actions, incidents=incidents)


def test_outputs_land_on_their_topics_keyed_by_job(kafka_bootstrap, sink_topics, unique):
    out = _outputs()
    sink = KafkaSink(kafka_bootstrap, findings_topic=sink_topics["findings"], actions_topic=sink_topics["actions"],
                     incidents_topic=sink_topics["incidents"], dlq_topic=sink_topics["dlq"])
    sink.write(out)
    err = DecodeError("must be >= 0, got -3", "rank", "step", None, '{"kind":"step","rank":-3}')
    sink.reject(DeadLetter.of(err, "gw.telemetry", topic="gw.telemetry", partition=1, offset=42, ts=104.0))
    sink.close()
    assert (sink.sent, sink.failed) == (8, 0)

    for kind, recs in (("findings", out.findings), ("actions", out.actions), ("incidents", out.incidents)):
        msgs = consume(kafka_bootstrap, sink_topics[kind], f"{unique}-{kind}", len(recs))
        assert len(msgs) == len(recs), kind
        got = {m.value: m for m in msgs}
        by_id = {}
        for m in msgs:
            [rec] = decode(m.value)
            assert m.key == rec.job.encode()
            by_id[rec.id] = rec
        assert by_id == {r.id: r for r in recs}
        # one job, one partition: a job's records stay in order
        for job in {r.job for r in recs}:
            assert len({m.partition for m in got.values() if m.key == job.encode()}) == 1

    [dead] = consume(kafka_bootstrap, sink_topics["dlq"], f"{unique}-dlq", 1)
    assert dead.key == b"gw.telemetry"
    assert orjson.loads(dead.value) == {"reason": "must be >= 0, got -3", "field": "rank", "kind": "step",
                                        "raw": '{"kind":"step","rank":-3}', "source": "gw.telemetry",
                                        "topic": "gw.telemetry", "partition": 1, "offset": 42, "ts": 104.0}


def test_flush_waits_for_acknowledgement(kafka_bootstrap, sink_topics, unique):
    sink = KafkaSink(kafka_bootstrap, findings_topic=sink_topics["findings"], actions_topic=sink_topics["actions"],
                     incidents_topic=sink_topics["incidents"], dlq_topic=sink_topics["dlq"], linger_ms=30_000)
    sink.write(Outputs(actions=_outputs().actions))
    sink.flush()  # with a 30 s linger, only flush() gets them to the broker now
    probe = KafkaConsumer(bootstrap_servers=kafka_bootstrap)
    parts = [TopicPartition(sink_topics["actions"], p) for p in range(3)]
    assert sum(probe.end_offsets(parts).values()) == 2
    probe.close()
    sink.close()


def test_a_record_the_broker_refuses_makes_flush_raise(kafka_bootstrap, unique):
    small = f"{unique}.small"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id=unique)
    admin.create_topics([NewTopic(small, num_partitions=1, replication_factor=1,
                                  topic_configs={"max.message.bytes": "200"})])
    try:
        sink = KafkaSink(kafka_bootstrap, incidents_topic=small)
        sink.write(Outputs(incidents=[Incident(id="i-big", ts=1.0, job="j1", cls="unknown",
                                               culprit_nodes=[f"n{i:04d}" for i in range(100)])]))
        with pytest.raises(KafkaSinkError, match="i-big") as raised:
            sink.flush()
        assert sink.failed == 1
        err = raised.value  # too large never heals: permanent, this record named, the broker's error kept
        assert not err.transient and err.ids == ("i-big",) and "MessageSizeTooLarge" in str(err)
        assert classify(err) == (False, err.reason) and err.__cause__ is not None
        sink.flush()  # reported once, not again
        sink.close()
    finally:
        admin.delete_topics([small])
        admin.close()
