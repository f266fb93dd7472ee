"""Webhook signatures v1: timestamp, action id and body under one MAC; stale, forged and replayed requests refused.

The same scheme signs actions on the alert topic (record headers): `TopicSigner` / `TopicVerifier`."""

from __future__ import annotations

import hashlib
import hmac
import logging
import random
import urllib.error
import urllib.request

import pytest
from gangwatch.control.controller import WebhookSource
from gangwatch.schemas import Action, encode
from gangwatch.schemas.signature import (
    ReplayGuard,
    SignatureVerifier,
    TopicSigner,
    TopicVerifier,
    sign,
    signed_payload,
    verify_signature,
)
from gangwatch.sinks.webhook import WebhookSink

pytestmark = pytest.mark.unit

SECRET = "s3cr3t-shared-with-the-controller"
T0 = 1_767_225_666


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _action(id: str = "a-0001") -> Action:
    return Action(id=id, ts=1700000000.5, job="j1", incident="i-0001", type="replace", nodes=["n003"],
                  reason="Xid 79", evidence=["f-0001"], path="hot")


def test_the_header_is_t_and_v1_over_timestamp_key_and_body():
    body = encode(_action())
    header = sign(SECRET, body, "a-0001", T0 + 0.9)
    expected = hmac.new(SECRET.encode(), f"{T0}.a-0001.".encode() + body, hashlib.sha256).hexdigest()
    assert header == f"t={T0},v1={expected}"
    assert signed_payload(T0, "a-0001", body) == f"{T0}.a-0001.".encode() + body


def test_a_fresh_signature_verifies_and_each_part_is_covered():
    body = encode(_action())
    header = sign(SECRET, body, "a-0001", T0)
    assert verify_signature(SECRET, body, header, "a-0001", now=T0).status == 200
    assert verify_signature(SECRET, body + b" ", header, "a-0001", now=T0).reason == "bad signature"
    assert verify_signature(SECRET, body, header, "a-0002", now=T0).reason == "bad signature"  # another action
    moved = header.replace(f"t={T0}", f"t={T0 + 1}")  # the timestamp changed: the MAC no longer matches
    assert verify_signature(SECRET, body, moved, "a-0001", now=T0).reason == "bad signature"
    assert verify_signature("another-secret", body, header, "a-0001", now=T0).status == 401


@pytest.mark.parametrize("header, reason", [
    (None, "no signature"),
    ("", "no signature"),
    ("sha256=" + "0" * 64, "before v1"),
    ("garbage", "malformed signature header"),
    ("t=abc,v1=00", "malformed signature timestamp"),
    ("t=\u0661\u0662,v1=00", "malformed signature timestamp"),  # Arabic-Indic digits are digits to str.isdigit
    ("v1=00", "no timestamp"),
    (f"t={T0}", "no v1 MAC"),
    (f"t={T0},v1=\u00e9", "bad signature"),
])
def test_malformed_headers_are_401_with_a_reason(header, reason):
    v = verify_signature(SECRET, b"{}", header, "a-0001", now=T0)
    assert (v.ok, v.status) == (False, 401) and reason in v.reason


def test_a_missing_idempotency_key_is_401():
    body = b"{}"
    assert verify_signature(SECRET, body, sign(SECRET, body, "", T0), None, now=T0).reason == "no Idempotency-Key"


@pytest.mark.parametrize("skew, ok", [(-300, True), (300, True), (-301, False), (301, False), (-86400, False)])
def test_the_timestamp_must_be_within_the_tolerance(skew, ok):
    body = encode(_action())
    v = verify_signature(SECRET, body, sign(SECRET, body, "a-0001", T0 + skew), "a-0001", now=T0)
    assert v.ok is ok
    if not ok:
        assert v.status == 401 and "tolerance 300 s" in v.reason
        assert ("old" if skew < 0 else "future") in v.reason


def test_the_tolerance_is_configurable():
    body = b"{}"
    header = sign(SECRET, body, "k", T0 - 30)
    assert verify_signature(SECRET, body, header, "k", now=T0)
    assert not verify_signature(SECRET, body, header, "k", now=T0, tolerance_s=10)
    verify = SignatureVerifier(SECRET, tolerance_s=10, clock=Clock(T0))
    assert verify(body, header, "k").status == 401


def test_a_replay_is_refused_and_a_fresh_resend_passes():
    clock = Clock()
    verify = SignatureVerifier(SECRET, clock=clock)
    body = encode(_action())
    header = sign(SECRET, body, "a-0001", T0)
    assert verify(body, header, "a-0001").ok
    clock.now += 5
    again = verify(body, header, "a-0001")
    assert (again.ok, again.status) == (False, 409) and "replayed" in again.reason
    assert verify(body, sign(SECRET, body, "a-0001", T0 + 5), "a-0001").ok  # the sender re-signs a retry
    clock.now = T0 + 301
    assert verify(body, header, "a-0001").status == 401  # by then the timestamp is stale anyway


def test_a_failed_check_is_not_remembered():
    verify = SignatureVerifier(SECRET, clock=Clock())
    body = b"{}"
    assert verify(body, f"t={T0},v1=" + "0" * 64, "k").status == 401
    assert len(verify.seen) == 0
    assert verify(body, sign(SECRET, body, "k", T0), "k").ok


def test_the_replay_memory_expires_what_the_tolerance_would_refuse():
    guard = ReplayGuard(tolerance_s=300)
    for i in range(50):
        assert guard.add(f"k{i}", T0 + i, "mac", now=T0 + i)
    assert len(guard) == 50
    assert guard.add("new", T0 + 400, "mac", now=T0 + 400)
    assert len(guard) == 1 + sum(1 for i in range(50) if T0 + i >= T0 + 100)


def test_a_full_replay_memory_refuses_what_it_forgot_rather_than_let_a_replay_pass():
    guard = ReplayGuard(tolerance_s=300, max_entries=3)
    for i in range(3):
        assert guard.add(f"k{i}", T0 + i, "m", now=T0 + 10)
    assert guard.add("k3", T0 + 3, "m", now=T0 + 10)  # k0 (t=T0) is forgotten...
    assert len(guard) == 3
    assert not guard.add("k0", T0, "m", now=T0 + 10)  # ...so its replay is still refused
    assert not guard.add("other", T0, "m", now=T0 + 10)  # as is anything as old
    assert guard.add("k4", T0 + 11, "m", now=T0 + 11)  # newer signatures pass


def test_the_sender_signs_each_attempt_afresh_and_later_than_the_last():
    posts: list[dict[str, str]] = []
    sink = WebhookSink("http://127.0.0.1:1/", SECRET, max_attempts=3, rng=random.Random(0),
                       sleep=lambda s: None, wall_clock=lambda: float(T0))

    def post(body: bytes, headers: dict[str, str]):
        posts.append(dict(headers))
        return 503, None, "HTTP 503"

    sink._post = post  # type: ignore[method-assign]
    a = _action()
    sink.deliver(a)
    sigs = [h["X-Gangwatch-Signature-V1"] for h in posts]
    assert len(sigs) == 3 and len(set(sigs)) == 3
    assert [s.split(",")[0] for s in sigs] == [f"t={T0}", f"t={T0 + 1}", f"t={T0 + 2}"]
    verify = SignatureVerifier(SECRET, clock=Clock(T0))
    assert all(verify(encode(a), s, a.id).ok for s in sigs)  # every retry passes the replay memory


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_reference_controller_refuses_a_captured_request_replayed(caplog):
    clock = Clock(T0)
    source = WebhookSource("127.0.0.1", 0, SECRET, clock=clock)
    try:
        a = _action()
        body = encode(a)
        headers = {"X-Gangwatch-Signature-V1": sign(SECRET, body, a.id, T0), "Idempotency-Key": a.id}
        assert _post(source.url, body, headers) == 202
        with caplog.at_level(logging.WARNING, logger="gangwatch.controller"):
            assert _post(source.url, body, headers) == 409  # the same request again
            clock.now = T0 + 3600
            headers["X-Gangwatch-Signature-V1"] = sign(SECRET, body, a.id, T0 + 10)
            assert _post(source.url, body, headers) == 401  # an hour late
        assert "replayed" in caplog.text and "stale" in caplog.text
        assert source.poll(0.5) == [a]
        assert source.poll(0.01) == []
    finally:
        source.close()


def test_the_reference_controller_refuses_a_body_over_its_limit_unread():
    source = WebhookSource("127.0.0.1", 0, SECRET, max_body=1024)
    try:
        body = b"x" * 2048
        assert _post(source.url, body, {"Idempotency-Key": "k"}) == 413
        assert source.poll(0.01) == []
    finally:
        source.close()


def test_the_verifier_repr_masks_the_secret():
    assert SECRET not in repr(SignatureVerifier(SECRET))
    assert SECRET not in repr(TopicSigner(SECRET)) and SECRET not in repr(TopicVerifier(SECRET))


def test_an_action_on_the_topic_verifies_from_its_record_headers_and_nothing_else_does():
    clock = Clock()
    value = encode(_action())
    headers = TopicSigner(SECRET, clock=clock).headers(value, "a-0001")
    assert headers == [("X-Gangwatch-Signature-V1", sign(SECRET, value, "a-0001", T0).encode())]
    check = TopicVerifier(SECRET, clock=clock)
    assert check(value, [("other", b"x"), *headers], "a-0001")  # found among other headers
    assert check(value, headers, "a-0001").status == 409  # the same message again: a replay
    fresh = TopicVerifier(SECRET, clock=clock)
    assert fresh(value, None, "a-0001").reason == "no signature"
    assert fresh(value, [], "a-0001").reason == "no signature"
    assert fresh(value + b" ", headers, "a-0001").reason == "bad signature"  # the value changed
    assert fresh(value, headers, "a-0002").reason == "bad signature"  # signed for another action id
    assert fresh(value, TopicSigner("other", clock=clock).headers(value, "a-0001"), "a-0001").reason == \
        "bad signature"
    assert fresh(value, [("X-Gangwatch-Signature-V1", b"\xff")], "a-0001").reason == "malformed signature header"
    clock.now += 301
    assert "stale" in fresh(value, headers, "a-0001").reason  # tolerance 300 s by default

