"""The webhook sink against a real local HTTP receiver: signed bodies, bounded retries, dead letters."""

from __future__ import annotations

import hashlib
import hmac
import logging
import random
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from gangwatch.schemas import Action, Finding, Incident, Outputs, decode, encode
from gangwatch.schemas.signature import sign, verify_signature
from gangwatch.sinks.webhook import Delivery, WebhookSink

pytestmark = pytest.mark.unit

SECRET = "s3cr3t-shared-with-the-controller"


class Receiver:
    """A job controller stand-in: verifies each request's signature, records it, answers from a script."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.requests: list[dict] = []  # every request: headers, body, whether the signature verified
        self.script: list[tuple[int, dict[str, str]]] = []  # responses to give, in order; then 200
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver._lock:
                    receiver.requests.append({
                        "path": self.path, "body": body, "headers": dict(self.headers),
                        "verified": bool(verify_signature(receiver.secret, body,
                                                          self.headers.get("X-Gangwatch-Signature-V1"),
                                                          self.headers.get("Idempotency-Key"))),
                    })
                    status, headers = receiver.script.pop(0) if receiver.script else (200, {})
                payload = b'{"ok":true}' if status < 300 else b'{"error":"nope"}'
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/gangwatch/actions"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()

    @property
    def delivered(self) -> list[dict]:
        return [r for r in self.requests if r["verified"]]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


class FakeTime:
    """An injected clock that only moves when the sink sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET)
    yield r
    r.close()


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


def _sink(url: str, fake_time: FakeTime, **kw) -> WebhookSink:
    kw.setdefault("secret", SECRET)
    return WebhookSink(url, rng=random.Random(7), clock=fake_time.clock, sleep=fake_time.sleep, timeout_s=5.0, **kw)


def _action(id: str = "a-0001", type: str = "replace") -> Action:
    return Action(id=id, ts=1700000000.5, job="j1", incident="i-0001", type=type, nodes=["n003"],
                  reason="Xid 79 on gpu 2; 511 ranks stalled", evidence=["f-0001", "f-0002"], path="hot")


def _closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    return f"http://127.0.0.1:{port}/actions"


def test_signed_body_arrives_and_verifies(receiver, fake_time):
    sink = _sink(receiver.url, fake_time)
    action = _action()
    sink.write(Outputs(actions=[action]))

    [req] = receiver.requests
    assert req["verified"]
    assert req["body"] == encode(action)  # exactly the contract JSON, nothing added
    assert decode(req["body"]) == [action]
    h = req["headers"]
    assert h["Content-Type"] == "application/json"
    t = int(h["X-Gangwatch-Signature-V1"].split(",")[0].removeprefix("t="))
    assert h["X-Gangwatch-Signature-V1"] == sign(SECRET, req["body"], action.id, t)
    # the body-only signature of earlier releases goes out beside it, unchanged, for their receivers
    assert h["X-Gangwatch-Signature"] == "sha256=" + hmac.new(SECRET.encode(), req["body"], hashlib.sha256).hexdigest()
    assert h["Idempotency-Key"] == action.id
    assert h["X-Gangwatch-Action"] == "replace"
    assert (sink.sent, sink.attempts, sink.failed, fake_time.sleeps) == (1, 1, [], [])


def test_wrong_secret_fails_verification(receiver, fake_time):
    sink = _sink(receiver.url, fake_time, secret="not-the-shared-secret")
    sink.write(Outputs(actions=[_action()]))

    [req] = receiver.requests
    assert not req["verified"]
    assert receiver.delivered == []
    header = req["headers"]["X-Gangwatch-Signature-V1"]
    key = req["headers"]["Idempotency-Key"]
    assert verify_signature("not-the-shared-secret", req["body"], header, key)
    assert not verify_signature(SECRET, req["body"] + b" ", sign(SECRET, req["body"], key, time.time()), key)
    assert not verify_signature(SECRET, req["body"], None, key)
    assert not verify_signature(SECRET, req["body"], header.replace("v1=", "v0="), key)
    assert not verify_signature(SECRET, req["body"], "t=1,v1=\u00e9", key)


def test_503_twice_then_200_is_delivered_once_after_backoff(receiver, fake_time):
    receiver.script = [(503, {}), (503, {})]
    sink = _sink(receiver.url, fake_time, backoff_s=0.5)
    d = sink.deliver(_action())

    assert d.ok and d.attempts == 3 and d.status == 200
    assert len(receiver.requests) == 3 and all(r["verified"] for r in receiver.requests)
    assert len({r["body"] for r in receiver.requests}) == 1  # the same body each time
    assert (sink.sent, sink.failed) == (1, [])
    # exponential backoff with equal jitter: retry n waits in [b*2^(n-1)/2, b*2^(n-1)]
    s1, s2 = fake_time.sleeps
    assert 0.25 <= s1 <= 0.5 and 0.5 <= s2 <= 1.0
    assert d.elapsed_s == pytest.approx(s1 + s2)
    # the same seed gives the same waits
    again = FakeTime()
    receiver.script = [(503, {}), (503, {})]
    _sink(receiver.url, again, backoff_s=0.5).deliver(_action())
    assert again.sleeps == fake_time.sleeps


def test_429_honours_retry_after(receiver, fake_time):
    receiver.script = [(429, {"Retry-After": "7"}), (503, {"Retry-After": "120"})]
    sink = _sink(receiver.url, fake_time, max_retry_after_s=30.0)
    assert sink.deliver(_action()).ok
    assert fake_time.sleeps == [7.0, 30.0]  # as asked, but capped


def test_400_is_not_retried_and_ends_in_failed(receiver, fake_time):
    receiver.script = [(400, {})]
    dead: list[Delivery] = []
    sink = _sink(receiver.url, fake_time, dead_letter=dead.append)
    action = _action()
    sink.write(Outputs(actions=[action]))

    assert len(receiver.requests) == 1 and fake_time.sleeps == []
    [d] = sink.failed
    assert (d.action, d.ok, d.attempts, d.status) == (action, False, 1, 400)
    assert "nope" in d.error
    assert dead == [d] and sink.sent == 0


def test_a_redirect_is_not_followed(receiver, fake_time):
    receiver.script = [(307, {"Location": "/elsewhere"})]
    sink = _sink(receiver.url, fake_time)
    d = sink.deliver(_action())
    assert (d.ok, d.status, d.attempts, len(receiver.requests)) == (False, 307, 1, 1)
    assert sink.failed == [d]


def test_receiver_down_gives_up_after_bounded_attempts(fake_time):
    dead: list[Delivery] = []
    sink = _sink(_closed_port_url(), fake_time, max_attempts=4, dead_letter=dead.append)
    action = _action(type="collect_stacks")
    sink.write(Outputs(actions=[action]))

    [d] = sink.failed
    assert (d.action, d.ok, d.attempts, d.status) == (action, False, 4, None)
    assert "connection" in d.error
    assert len(fake_time.sleeps) == 3 and sink.attempts == 4
    assert dead == [d]


def test_deadline_bounds_the_time_spent(fake_time):
    sink = _sink(_closed_port_url(), fake_time, max_attempts=50, backoff_s=1.0, max_backoff_s=8.0, deadline_s=20.0)
    d = sink.deliver(_action())
    assert not d.ok and d.attempts < 50
    assert d.elapsed_s <= 20.0 and "deadline" in d.error


def test_a_failing_dead_letter_callback_still_keeps_the_action(fake_time):
    def broken(d: Delivery) -> None:
        raise RuntimeError("dead-letter store is down")

    sink = _sink(_closed_port_url(), fake_time, max_attempts=1, dead_letter=broken)
    sink.write(Outputs(actions=[_action()]))
    assert len(sink.failed) == 1


def test_same_action_twice_carries_the_same_idempotency_key(receiver, fake_time):
    sink = _sink(receiver.url, fake_time)
    sink.write(Outputs(actions=[_action("a-77")]))
    sink.write(Outputs(actions=[_action("a-77")]))
    sink.write(Outputs(actions=[_action("a-78")]))

    keys = [r["headers"]["Idempotency-Key"] for r in receiver.requests]
    assert keys == ["a-77", "a-77", "a-78"]
    assert receiver.requests[0]["body"] == receiver.requests[1]["body"]


def test_only_actions_are_sent(receiver, fake_time):
    sink = _sink(receiver.url, fake_time)
    finding = Finding(id="f-1", ts=1.0, job="j1", type="fail_stop", detector="failstop.heartbeat", rank=3)
    incident = Incident(id="i-1", ts=1.0, job="j1", cls="fail_stop")
    sink.write(Outputs(findings=[finding], incidents=[incident]))
    sink.flush()
    assert receiver.requests == []
    sink.write(Outputs(findings=[finding], actions=[_action(type="collect_stacks")], incidents=[incident]))
    assert [r["headers"]["X-Gangwatch-Action"] for r in receiver.requests] == ["collect_stacks"]


def test_secret_never_in_repr_or_logs(monkeypatch, caplog, fake_time):
    env_secret = "env-secret-value-1234567890"
    monkeypatch.setenv("GANGWATCH_WEBHOOK_SECRET", env_secret)
    url = _closed_port_url().replace("http://", "http://user:pw-in-url@") + "?token=tok-in-url"
    with caplog.at_level(logging.DEBUG, logger="gangwatch.sinks.webhook"):
        sink = WebhookSink(url, rng=random.Random(1), clock=fake_time.clock, sleep=fake_time.sleep, max_attempts=3)
        sink.write(Outputs(actions=[_action()]))
        sink.close()
    assert sink.failed and caplog.records  # it did fail and log
    shown = repr(sink) + str(sink) + caplog.text
    for leaked in (env_secret, "pw-in-url", "tok-in-url"):
        assert leaked not in shown
    assert "***" in repr(sink)


def test_credentials_in_the_url_become_a_basic_header(receiver, fake_time):
    url = receiver.url.replace("http://", "http://gw:p%40ss@")
    sink = _sink(url, fake_time)
    assert sink.deliver(_action()).ok
    [req] = receiver.requests
    assert req["headers"]["Authorization"] == "Basic Z3c6cEBzcw=="  # gw:p@ss
    assert "p%40ss" not in repr(sink) and "gw:" not in sink.url


def test_a_secret_is_required(monkeypatch):
    monkeypatch.delenv("GANGWATCH_WEBHOOK_SECRET", raising=False)
    with pytest.raises(ValueError, match="secret"):
        WebhookSink("http://127.0.0.1:1/")
    with pytest.raises(ValueError, match="http"):
        WebhookSink("file:///etc/passwd", secret=SECRET)
