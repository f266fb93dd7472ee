"""The fencing adapters' Kafka source on a real broker: actions from the alert topic, applied once, offsets committed.

A recording backend stands in for Slurm / Kubernetes (they have tests of their
own); what is checked here is the consumer: a fresh group reading from the
beginning with --from-beginning, a duplicated action applied once, records that
are not actions skipped, committed offsets (a second consumer of the same group
sees nothing new), a failure that leaves the offsets uncommitted, and that only
actions signed with the worker's secret are applied: unsigned, forged, tampered,
stale and replayed ones are refused, one log line each.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from gangwatch.control.fence import ActionTopic, FenceError, Fencer, Outcome, follow
from gangwatch.control.follow import TopicReader
from gangwatch.schemas import Action, Finding, encode
from gangwatch.schemas.signature import SIGNATURE_HEADER, TopicSigner, TopicVerifier
from kafka import KafkaProducer

pytestmark = pytest.mark.integration


class Recording:
    name = "recording"

    def __init__(self, fail: bool = False, expect: int = 0) -> None:
        self.fenced: list[tuple[str, str]] = []
        self.fail = fail
        self.expect = expect  # stop following once this many nodes are fenced (then a short idle wait for extras)
        self.stop = threading.Event()

    def fence(self, node: str, action: Action, *, cls: str, act: bool) -> Outcome:
        if self.fail:
            return Outcome(node, "down", error="scheduler unreachable")
        self.fenced.append((action.id, node))
        if self.expect and len(self.fenced) >= self.expect:
            self.stop.set()
        return Outcome(node, "fenced", changed=True)

    def restore(self, node: str, note: str, *, act: bool) -> Outcome:
        raise AssertionError("never called here")


def act(id: str, nodes: list[str]) -> Action:
    return Action(id=id, ts=1.0, job="j1", incident="i-1", type="replace", nodes=nodes, reason="Xid 79")


SECRET = "the worker's secret"
SIGNER = TopicSigner(SECRET)


def publish(bootstrap: str, topic: str, recs: list, signer: TopicSigner | None = SIGNER) -> None:
    """`recs` on `topic`, the actions signed by `signer` (as the worker signs them); or (value, headers) pairs as
    they are."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for r in recs:
            if isinstance(r, tuple):
                value, headers = r
            else:
                value = encode(r)
                headers = signer.headers(value, r.id) if signer is not None and r.kind == "action" else []
            producer.send(topic, key=b"j1", value=value, headers=headers).get(timeout=30)
    finally:
        producer.close()


def source_of(bootstrap: str, topics, group: str) -> ActionTopic:
    return ActionTopic(bootstrap, topics, group, verify=TopicVerifier(SECRET), from_beginning=True)


def follow_until(backend: Recording, source: ActionTopic) -> None:
    """Follow the topic until the backend fenced what it expects (bounded: 60 s without a record ends it), then
    a little longer, so that an action applied twice would show."""
    follow(Fencer(backend, act=True), source, backend.stop, idle_timeout_s=60, poll_s=0.5)
    follow(Fencer(backend, act=True), source, threading.Event(), idle_timeout_s=2, poll_s=0.5)


def test_actions_from_the_topic_are_applied_once_and_committed(kafka_bootstrap, topics, unique):
    finding = Finding(id="f-1", ts=1.0, job="j1", type="hang", detector="hang")
    publish(kafka_bootstrap, topics.actions, [act("a-1", ["n1"]), finding, act("a-1", ["n1"]), act("a-2", ["n2"])])
    backend = Recording(expect=2)
    source = source_of(kafka_bootstrap, topics, unique)
    try:
        source.wait_assigned(30)
        follow_until(backend, source)
    finally:
        source.close()
    assert backend.fenced == [("a-1", "n1"), ("a-2", "n2")]

    publish(kafka_bootstrap, topics.actions, [act("a-3", ["n3"])])
    later = Recording(expect=1)
    source = source_of(kafka_bootstrap, topics, unique)  # same group: committed offsets
    try:
        source.wait_assigned(30)
        follow_until(later, source)
    finally:
        source.close()
    assert later.fenced == [("a-3", "n3")]


def test_a_failed_action_is_not_committed(kafka_bootstrap, topics, unique):
    publish(kafka_bootstrap, topics.actions, [act("a-1", ["n1"])])
    source = source_of(kafka_bootstrap, topics, unique)
    try:
        source.wait_assigned(30)
        with pytest.raises(FenceError, match="scheduler unreachable"):
            follow(Fencer(Recording(fail=True), act=True, retries=0), source, threading.Event(), idle_timeout_s=10)
    finally:
        source.close()
    backend = Recording(expect=1)
    source = source_of(kafka_bootstrap, topics, unique)
    try:
        source.wait_assigned(30)
        follow_until(backend, source)
    finally:
        source.close()
    assert backend.fenced == [("a-1", "n1")]  # delivered again to the restarted adapter


def test_only_actions_signed_with_the_secret_are_applied(kafka_bootstrap, topics, unique, caplog):
    """Anyone who can write to the alert topic could drain a cluster: the adapter acts on the worker's signed
    actions only, and says why it refused each other one."""
    good = act("a-good", ["n1"])
    value = encode(good)
    signed = (value, SIGNER.headers(value, good.id))
    tampered = encode(act("a-tampered", ["n4"]))
    stale = encode(act("a-stale", ["n5"]))
    publish(kafka_bootstrap, topics.actions, [
        signed,
        act("a-unsigned", ["n2"]),  # no header at all
        (encode(act("a-forged", ["n3"])), TopicSigner("another secret").headers(encode(act("a-forged", ["n3"])),
                                                                                  "a-forged")),
        (tampered.replace(b'"n4"', b'"n9"'), SIGNER.headers(tampered, "a-tampered")),  # changed after signing
        (stale, TopicSigner(SECRET, clock=lambda: time.time() - 3600).headers(stale, "a-stale")),  # an hour old
        signed,  # the same message again: a replay
    ], signer=None)
    backend = Recording(expect=1)
    source = source_of(kafka_bootstrap, topics, unique)
    with caplog.at_level(logging.WARNING, logger="gangwatch.follow"):
        try:
            source.wait_assigned(30)
            follow_until(backend, source)
        finally:
            source.close()
    assert backend.fenced == [("a-good", "n1")]
    assert source.refused == 5
    why = {r.getMessage().split("refused action ")[1].split(" ")[0]: r.getMessage().split(" of job j1): ", 1)[1]
           for r in caplog.records if "refused action" in r.getMessage()}
    assert why.keys() == {"a-unsigned", "a-forged", "a-tampered", "a-stale", "a-good"}
    assert why["a-unsigned"] == "no signature" and why["a-forged"] == why["a-tampered"] == "bad signature"
    assert "stale" in why["a-stale"] and "replayed" in why["a-good"]
    assert SIGNATURE_HEADER == "X-Gangwatch-Signature-V1"  # the header the docs name


def test_a_reader_without_the_secret_hands_out_no_action(kafka_bootstrap, topics, unique, caplog):
    """Whatever acts on actions must check them: a reader built without a verifier refuses even a signed one."""
    good = act("a-signed", ["n1"])
    value = encode(good)
    publish(kafka_bootstrap, topics.actions, [(value, SIGNER.headers(value, good.id))], signer=None)
    reader = TopicReader(kafka_bootstrap, [topics.actions], unique, from_beginning=True)
    got = []
    with caplog.at_level(logging.WARNING, logger="gangwatch.follow"):
        try:
            reader.wait_assigned(30)
            deadline = time.monotonic() + 30
            while reader.refused == 0 and time.monotonic() < deadline:
                got += reader.poll(0.5)
        finally:
            reader.close()
    assert got == [] and reader.refused == 1
    assert "refused action a-signed (replace n1 of job j1): no secret to check its signature with" in caplog.text
