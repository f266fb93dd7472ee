"""Creating and listing gangwatch's Kafka topics on a broker (their names: `gangwatch.schemas.topics`).

    gangwatch topics create --bootstrap 127.0.0.1:9092
    gangwatch topics list
"""

from __future__ import annotations

from gangwatch.schemas.security import kafka_python_security
from gangwatch.schemas.topics import TopicSettings

ALREADY_EXISTS = 36  # Kafka error code TOPIC_ALREADY_EXISTS


def create_topics(settings: TopicSettings, bootstrap: str, *, timeout_s: float = 30.0) -> list[str]:
    """Create every gangwatch topic that is missing; returns the names created (existing ones are fine,
    if their partition counts agree: see `check_partitions`)."""
    from kafka.admin import KafkaAdminClient
    from kafka.errors import for_code

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="gangwatch-topics",
                             request_timeout_ms=int(timeout_s * 1000), **kafka_python_security())
    created: list[str] = []
    try:
        existing = set(admin.list_topics())
        wanted = {t: {"num_partitions": settings.partitions, "replication_factor": settings.replication,
                      "configs": settings.configs(t)} for t in settings.all() if t not in existing}
        if wanted:
            res = admin.create_topics(wanted, timeout_ms=int(timeout_s * 1000), raise_errors=False)
            errors = []
            for t in res.get("topics", []):
                code = t.get("error_code", 0)
                if code == 0:
                    created.append(t["name"])
                elif code != ALREADY_EXISTS:
                    errors.append(f"{t['name']}: {for_code(code).__name__} {t.get('error_message') or ''}".strip())
            if errors:
                raise RuntimeError("could not create topics: " + "; ".join(errors))
            if created:
                admin.wait_for_topics(created)
    finally:
        admin.close()
    check_partitions(settings, bootstrap)
    return sorted(created)


def check_partitions(settings: TopicSettings, bootstrap: str) -> None:
    """Fail when an input or internal topic exists with another partition count: they must be co-partitioned
    (a job's records of every kind on the same partition number), or jobs split across workers silently."""
    counts = list_topics(bootstrap, settings.prefix)
    wrong = [f"{t} has {counts[t]}" for t in (*settings.inputs, *settings.internal)
             if t in counts and counts[t] != settings.partitions]
    if wrong:
        raise RuntimeError(f"topics must all have {settings.partitions} partitions (GANGWATCH_TOPIC_PARTITIONS): "
                           + ", ".join(wrong))


def missing_topics(bootstrap: str, names: tuple[str, ...], *, timeout_s: float) -> list[str]:
    """The topics of `names` the broker does not have, asked once within `timeout_s` (a producer sending to a
    missing topic waits for its metadata a whole minute before it fails)."""
    from kafka.admin import KafkaAdminClient

    ms = max(1000, int(timeout_s * 1000))
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="gangwatch-topics", request_timeout_ms=ms,
                             bootstrap_timeout_ms=ms, **kafka_python_security())
    try:
        existing = set(admin.list_topics())
    finally:
        admin.close()
    return [t for t in names if t not in existing]


def list_topics(bootstrap: str, prefix: str = "") -> dict[str, int]:
    """Existing topics whose names start with `prefix`, with their partition counts."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="gangwatch-topics", **kafka_python_security())
    try:
        names = sorted(t for t in consumer.topics() if t.startswith(prefix))
        return {t: len(consumer.partitions_for_topic(t) or ()) for t in names}
    finally:
        consumer.close()
