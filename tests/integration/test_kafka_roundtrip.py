"""Contract records through a real Kafka broker: published with kafka-python, read back identical."""

from __future__ import annotations

import orjson
import pytest
from gangwatch.schemas import KINDS, DecodeError, decode, encode, encode_batch
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from tests.contract.samples import SAMPLES
from tests.integration.kafkakit import consume

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(kafka_bootstrap, unique):
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id=unique)
    admin.create_topics([NewTopic(unique, num_partitions=2, replication_factor=1)])
    yield unique
    admin.delete_topics([unique])
    admin.close()


def test_every_kind_survives_the_broker(kafka_bootstrap, topic, unique):
    recs = [decode(orjson.dumps(SAMPLES[k]))[0] for k in sorted(SAMPLES)]
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for rec in recs:
        producer.send(topic, key=b"j1", value=encode(rec))
    producer.send(topic, key=b"j1", value=encode_batch(recs[:3], ts=1.0))
    producer.flush()
    producer.close()

    msgs = consume(kafka_bootstrap, topic, unique, len(recs) + 1)
    assert len(msgs) == len(recs) + 1
    assert {m.partition for m in msgs} == {msgs[0].partition}  # one key, one partition, in order
    decoded = [decode(m.value) for m in msgs]
    assert [d[0] for d in decoded[:-1]] == recs
    assert decoded[-1] == recs[:3]
    assert {type(r) for r in recs} == set(KINDS.values())


def test_a_bad_message_decodes_to_an_error_not_an_exception(kafka_bootstrap, topic, unique):
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    producer.send(topic, value=b'{"kind":"step","v":1,"ts":1,"job":"j","rank":-3,"step":1,"step_s":1}')
    producer.flush()
    producer.close()
    [msg] = consume(kafka_bootstrap, topic, unique, 1)
    [err] = decode(msg.value)
    assert isinstance(err, DecodeError) and err.field == "rank"
