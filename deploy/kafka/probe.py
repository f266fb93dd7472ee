#!/usr/bin/env python3
"""One readiness probe of a Kafka broker (used by deploy/kafka/broker.sh).

An open port is not "ready": a freshly started KRaft broker accepts connections
before the controller has elected itself and before __consumer_offsets exists.
So one attempt does the full round trip a test will need:

  1. describe the cluster (metadata from a live broker),
  2. create the probe topic (ignored if it already exists),
  3. produce one unique message with acks=all,
  4. consume it back through a throw-away consumer group (JoinGroup +
     FindCoordinator, which creates __consumer_offsets), commit, leave,
  5. delete the throw-away group.

Exit status 0 on success, 1 on failure (reason on stderr). The caller retries
until its own deadline; each attempt is bounded by --timeout seconds.
Needs kafka-python (pip install kafka-python; tested with 3.0.12).
"""

import argparse
import logging
import socket
import sys
import time
import uuid

PROBE_TOPIC = "gangwatch-probe"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092",
                   help="bootstrap servers (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="seconds allowed for this single attempt (default: %(default)s)")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    return p.parse_args()


def port_open(bootstrap, timeout_s=1.0):
    """Cheap pre-check: kafka-python spends ~30 s retrying a closed bootstrap port."""
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def describe(admin):
    info = admin.describe_cluster()
    brokers = info.get("brokers") or []
    if not brokers:
        raise RuntimeError(f"cluster has no live brokers yet: {info}")
    return info


def ensure_topic(admin, timeout_ms):
    from kafka.errors import TopicAlreadyExistsError
    try:
        admin.create_topics(
            {PROBE_TOPIC: {"num_partitions": 1, "replication_factor": 1,
                           "configs": {"retention.ms": "3600000"}}},
            timeout_ms=timeout_ms, wait_for_metadata=True)
    except TopicAlreadyExistsError:
        pass


def produce(bootstrap, payload, timeout_s):
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all",
                             request_timeout_ms=int(timeout_s * 1000),
                             max_block_ms=int(timeout_s * 1000))
    try:
        producer.send(PROBE_TOPIC, value=payload).get(timeout=timeout_s)
        producer.flush(timeout=timeout_s)
    finally:
        producer.close(timeout=5)


def consume(bootstrap, group, payload, deadline):
    """Join a fresh group, read from the start until our payload shows up."""
    from kafka import KafkaConsumer
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest",
                             enable_auto_commit=False,
                             session_timeout_ms=6000,
                             heartbeat_interval_ms=1000)
    try:
        consumer.subscribe([PROBE_TOPIC])
        while time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                if any(r.value == payload for r in records):
                    consumer.commit()  # proves the group coordinator accepts writes
                    return
        raise RuntimeError(f"probe message not consumed back via group {group}")
    finally:
        consumer.close()


def attempt(args):
    from kafka.admin import KafkaAdminClient
    if not port_open(args.bootstrap):
        raise ConnectionRefusedError(f"nothing listens on {args.bootstrap}")
    start = time.monotonic()
    deadline = start + args.timeout
    timeout_ms = int(args.timeout * 1000)
    group = f"gangwatch-probe-{uuid.uuid4().hex[:12]}"
    payload = uuid.uuid4().hex.encode()

    admin = KafkaAdminClient(bootstrap_servers=args.bootstrap,
                             request_timeout_ms=timeout_ms,
                             client_id="gangwatch-probe")
    try:
        info = describe(admin)
        ensure_topic(admin, timeout_ms)
        produce(args.bootstrap, payload, max(1.0, deadline - time.monotonic()))
        consume(args.bootstrap, group, payload, deadline)
        try:  # keep the broker free of throw-away groups; not fatal
            admin.delete_groups([group])
        except Exception as exc:  # noqa: BLE001
            logging.debug("could not delete group %s: %s", group, exc)
    finally:
        admin.close()
    return info, time.monotonic() - start


def main():
    args = parse_args()
    # kafka-python logs every refused connection at ERROR while the broker boots
    logging.basicConfig(level=logging.CRITICAL)
    try:
        import kafka  # noqa: F401
    except ImportError:
        print("probe: kafka-python is not installed (pip install kafka-python)", file=sys.stderr)
        return 2
    try:
        info, took = attempt(args)
    except Exception as exc:  # noqa: BLE001 - any failure just means "not ready yet"
        print(f"probe: not ready: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"probe: ok cluster_id={info.get('cluster_id')} "
              f"brokers={len(info.get('brokers') or [])} controller={info.get('controller_id')} "
              f"round_trip={took:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
