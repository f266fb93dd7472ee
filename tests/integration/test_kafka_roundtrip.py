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


def test_a_100k_rank_job_record_fits_the_topics_gangwatch_creates(kafka_bootstrap, unique):
    """The `job` record of a 100,000-rank job is ~6 MB: over the broker's 1 MB default, within the contract's limit
    (topics are created with `max.message.bytes` at that limit)."""
    from gangwatch.schemas import Job, RankInfo
    from gangwatch.schemas.codec import MAX_MESSAGE_BYTES
    from gangwatch.schemas.topics import TopicSettings
    from gangwatch.streams.topic_admin import create_topics

    t = TopicSettings(prefix=f"{unique}.")
    create_topics(t, kafka_bootstrap)
    job = Job(ts=1.0, job="big", heartbeat_s=5.0, ranks=[
        RankInfo(rank=r, node=f"n{r // 8:05d}", gpu=r % 8, tp=r % 8, pp=0, dp=r // 8) for r in range(100_000)])
    value = encode(job)
    assert 1 << 20 < len(value) < MAX_MESSAGE_BYTES
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=MAX_MESSAGE_BYTES)
    producer.send(t.jobs, key=b"big", value=value).get(timeout=30)  # MessageSizeTooLargeError on a 1 MB topic
    producer.close()
    [msg] = consume(kafka_bootstrap, t.jobs, unique, 1)
    assert decode(msg.value) == [job]


def test_publishing_a_file_without_one_valid_line_is_an_input_error(kafka_bootstrap, topics, unique, tmp_path,
                                                                     capsys):
    """README: a file without one valid line is exit 3; what did not decode still goes to the dead-letter topic."""
    import random

    from gangwatch.cli import main

    noise = tmp_path / "random.bin"
    noise.write_bytes(random.Random(36).randbytes(5000).replace(b"\x1f\x8b", b"xx"))
    lines = noise.read_bytes().count(b"\n") + 1
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    common = ["--bootstrap", kafka_bootstrap, "--prefix", topics.prefix, "--connect-timeout", "5"]
    assert main(["publish", str(noise), *common]) == 3
    out, err = capsys.readouterr()
    assert f"{lines} lines did not decode" in out and "published 0 records" in out
    assert err.count("\n") == 1 and f"no line of {noise} is a contract-v1 record" in err and topics.dlq in err
    assert len(consume(kafka_bootstrap, topics.dlq, unique, lines)) == lines
    assert main(["publish", str(empty), *common]) == 3
    assert f"{empty} is empty: not one record" in capsys.readouterr().err


def test_publishing_to_a_broker_without_gangwatchs_topics_says_to_create_them(kafka_bootstrap, unique, tmp_path,
                                                                                capsys):
    """A prefix with no topics: one line naming a missing topic and the command that creates them, exit 5 (asked
    within --connect-timeout, not after the producer's minute of waiting for metadata); nothing is created."""
    from gangwatch.cli import main

    run = tmp_path / "run.jsonl"
    run.write_bytes(orjson.dumps(SAMPLES["step"]) + b"\n")
    prefix = f"{unique}."
    assert main(["publish", str(run), "--bootstrap", kafka_bootstrap, "--prefix", prefix,
                 "--connect-timeout", "3"]) == 5
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"has no topic {prefix}" in err
    assert f"gangwatch topics create --bootstrap {kafka_bootstrap} --prefix {prefix}" in err
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id=unique)
    try:
        assert not [t for t in admin.list_topics() if t.startswith(prefix)]
    finally:
        admin.close()
