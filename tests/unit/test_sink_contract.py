"""The sink contract, the same tests over every sink as the worker runs it (`sinks.queued.queued`).

Sinks: JSONL files, the Kafka topics (kafka-python's producer replaced by a fake
that keeps a log per topic), the ClickHouse store (`StoreSink` over a fake store
that raises clickhouse-driver's own exceptions), the job-controller webhook and
Alertmanager (both against a local http.server). For each:

- idempotent rewrite: the same outputs written twice leave the same end state, by id;
- flush and close: `drain` delivers everything, `close` reports what it left, a
  close with a stuck receiver is bounded in time;
- transient vs permanent errors: two transient failures then success is one
  delivery after two back-offs (1x, 2x the base: the injected sleep records them);
  a permanent failure (HTTP 400, a ClickHouse type mismatch, a record that cannot
  be encoded) is tried once and becomes one dead letter while the rest is delivered;
- backpressure: with the receiver stuck, `write`+`flush` stay within a few ms,
  `pressure()` turns on at the high-water mark, a full queue refuses into dead
  letters, and everything else is delivered once the receiver answers again.

Nothing sleeps to wait for a thread: tests wait on events and on `drain`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from clickhouse_driver.errors import ErrorCodes, NetworkError, ServerException
from gangwatch.schemas import Action, DeadLetter, Finding, Incident, Outputs, decode
from gangwatch.sinks.alertmanager import AlertmanagerSink
from gangwatch.sinks.base import DeliveryError
from gangwatch.sinks.controller import WebhookSink
from gangwatch.sinks.files import JsonlSink
from gangwatch.sinks.kafka import KafkaSink
from gangwatch.sinks.queued import QueuedSink, RetryPolicy, SinkPause, classify, queued
from gangwatch.sinks.storesink import StoreSink
from kafka.errors import KafkaTimeoutError

pytestmark = pytest.mark.unit

SECRET = "contract-secret"
T0 = 1_800_000_000.0
WAIT_S = 10.0  # the most any event wait may take before the test fails
BASE_S = 0.25  # the back-off base of every sink under test (the injected sleep returns at once)


def finding(i: str, *, poison: bool = False) -> Finding:
    return Finding(id=f"f-{i}", ts=T0 + 1, job="j1", type="fail_stop", detector="failstop.heartbeat", rank=3,
                   node="n001", evidence={1: "no str key: orjson refuses it"} if poison else {"gap_s": 12.5})


def action(i: str) -> Action:
    return Action(id=f"a-{i}", ts=T0 + 2, job="j1", incident=f"i-{i}", type="replace", nodes=["n001"],
                  reason="missed heartbeats", evidence=[f"f-{i}"], path="hot")


def incident(i: str) -> Incident:
    return Incident(id=f"i-{i}", ts=T0 + 3, job="j1", cls="fail_stop", onset_ts=T0, detected_ts=T0 + 1,
                    culprit_nodes=["n001"], extra={"findings": [f"f-{i}"], "actions": [f"a-{i}"]})


class Sleeps:
    """The injected back-off wait: records each delay and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


class Gate:
    """Where a stuck receiver waits: `entered` is set when a delivery reached it, `opened` lets it go on."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.opened.set()

    def close(self) -> None:
        self.opened.clear()
        self.entered.clear()

    def pass_through(self) -> None:
        self.entered.set()
        assert self.opened.wait(WAIT_S), "the test never opened the gate"


class Receiver:
    """A local HTTP endpoint: answers from a script (then 200), 400 for a body that names a poison id."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.accepted: list[bytes] = []
        self.script: list[int] = []
        self.gate = Gate()
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.gate.pass_through()
                with outer._lock:
                    outer.requests.append(body)
                    status = outer.script.pop(0) if outer.script else 200
                    if b"poison" in body:
                        status = 400
                    if status < 300:
                        outer.accepted.append(body)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.gate.opened.set()
        self.server.shutdown()
        self.server.server_close()


# --- one harness per sink: how to build it, read its end state, make it fail or stall -------------------


class Harness:
    name = ""
    native = False  # sends off-thread by itself (no QueuedSink around it)

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.gate = Gate()
        self.sleeps = Sleeps()

    def make(self, **kw: Any) -> Any:
        kw.setdefault("retry", RetryPolicy(base_s=BASE_S, cap_s=4 * BASE_S, give_up_s=None))
        kw.setdefault("sleep", self.sleeps)
        kw.setdefault("close_timeout_s", 2.0)
        return queued(self.inner(), **kw)

    def inner(self) -> Any:
        raise NotImplementedError

    def outputs(self, i: str) -> Outputs:
        return Outputs(findings=[finding(i)], actions=[action(i)], incidents=[incident(i)])

    def poisoned(self) -> Outputs:
        """Good records around one that fails permanently, whose id contains "poison"."""
        return Outputs(findings=[finding("good1"), finding("poison", poison=True)], actions=[action("good1")],
                       incidents=[incident("good1")])

    def expected(self, *ids: str) -> set[str]:
        return {f"{p}-{i}" for i in ids for p in "fai"}

    def state(self) -> dict[str, Any]:
        """The end state the receiver holds: record id -> what it holds for it."""
        raise NotImplementedError

    def fail_transient(self, n: int) -> None:
        raise NotImplementedError

    def attempts(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        self.gate.opened.set()


class FlakyFile:
    """A file object that stalls at the gate and fails `fail` flushes with ENOSPC (transient)."""

    def __init__(self, fh: Any, h: FilesHarness) -> None:
        self.fh, self.h = fh, h

    def write(self, b: bytes) -> int:
        return self.fh.write(b)

    def flush(self) -> None:
        self.h.gate.pass_through()
        self.h.flushes += 1
        if self.h.fail > 0:
            self.h.fail -= 1
            raise OSError(28, "No space left on device")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


class FilesHarness(Harness):
    name = "files"

    def inner(self) -> JsonlSink:
        self.fail = 0
        self.flushes = 0
        sink = JsonlSink(self.tmp_path / "out")
        sink._files["findings"] = FlakyFile(sink._files["findings"], self)
        return sink

    def state(self) -> dict[str, Any]:
        out = {}
        for name in ("findings", "actions", "incidents"):
            for line in (self.tmp_path / "out" / f"{name}.jsonl").read_bytes().splitlines():
                rec = orjson.loads(line)
                out[rec["id"]] = rec
        return out

    def fail_transient(self, n: int) -> None:
        self.fail = n

    def attempts(self) -> int:
        return self.flushes


class FakeProducer:
    """kafka-python's producer as the Kafka sink uses it: send -> a future with errbacks; flush; close."""

    def __init__(self, h: KafkaHarness) -> None:
        self.h = h
        self.log: dict[str, list[bytes]] = {}
        self._pending: list[tuple[str, bytes, Any]] = []

    def send(self, topic: str, key: bytes, value: bytes) -> Any:
        fut = _Future()
        self._pending.append((topic, value, fut))
        return fut

    def flush(self, timeout: float | None = None) -> None:
        self.h.gate.pass_through()
        self.h.flushes += 1
        pending, self._pending = self._pending, []
        for topic, value, fut in pending:
            if self.h.fail > 0:
                fut.fail(KafkaTimeoutError("no leader for the partition within the timeout"))
            else:
                self.log.setdefault(topic, []).append(value)
        if pending and self.h.fail > 0:
            self.h.fail -= 1

    def close(self, timeout: float | None = None) -> None:
        pass


class _Future:
    def __init__(self) -> None:
        self.errbacks: list[Any] = []

    def add_errback(self, fn: Any, *args: Any) -> _Future:
        self.errbacks.append((fn, args))
        return self

    def fail(self, exc: BaseException) -> None:
        for fn, args in self.errbacks:
            fn(*args, exc)


class KafkaHarness(Harness):
    name = "kafka"

    def inner(self) -> KafkaSink:
        self.fail = 0
        self.flushes = 0
        self.producer = FakeProducer(self)
        return KafkaSink(producer=self.producer)

    def state(self) -> dict[str, Any]:
        return {orjson.loads(v)["id"]: orjson.loads(v) for values in self.producer.log.values() for v in values}

    def fail_transient(self, n: int) -> None:
        self.fail = n

    def attempts(self) -> int:
        return self.flushes


class FakeStore:
    """A ClickHouse store keyed by id per table (ReplacingMergeTree read with FINAL), raising the driver's errors:
    NetworkError while `fail` > 0, and a server TYPE_MISMATCH for an insert with a row whose id holds "poison"."""

    def __init__(self, h: StoreHarness) -> None:
        self.h = h
        self.tables: dict[str, dict[str, dict]] = {}

    def create_tables(self) -> None:
        pass

    def insert(self, table: str, rows: list[dict[str, Any]]) -> None:
        self.h.gate.pass_through()
        self.h.inserts += table == "gw_actions"  # the first table of a delivery (they go in name order)
        if self.h.fail > 0:
            self.h.fail -= 1
            raise NetworkError("Connection refused (127.0.0.1:9000)")
        if any("poison" in r.get("id", "") for r in rows):
            raise ServerException("Type mismatch in VALUES section", code=ErrorCodes.TYPE_MISMATCH)
        for r in rows:
            self.tables.setdefault(table, {})[r.get("id") or r.get("node")] = r

    def query(self, sql: str) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass


class StoreHarness(Harness):
    name = "store"

    def inner(self) -> StoreSink:
        self.fail = 0
        self.inserts = 0
        self.store = FakeStore(self)
        return StoreSink(self.store, retries=0, max_delay_s=float("inf"))

    def poisoned(self) -> Outputs:
        out = super().poisoned()
        out.findings[1] = finding("poison")  # encodes: the server refuses it
        return out

    def state(self) -> dict[str, Any]:
        return {k: v for t in self.store.tables.values() for k, v in t.items()}

    def fail_transient(self, n: int) -> None:
        self.fail = n

    def attempts(self) -> int:
        return self.inserts


class WebhookHarness(Harness):
    name = "webhook"

    def inner(self) -> WebhookSink:
        self.receiver = Receiver()
        self.receiver.gate = self.gate
        return WebhookSink(self.receiver.url + "/actions", SECRET, single_attempt=True, timeout_s=5.0)

    def outputs(self, i: str) -> Outputs:
        return Outputs(findings=[finding(i)], actions=[action(i)])

    def poisoned(self) -> Outputs:
        return Outputs(actions=[action("good1"), action("poison"), action("good2")])

    def expected(self, *ids: str) -> set[str]:
        return {f"a-{i}" for i in ids}

    def state(self) -> dict[str, Any]:
        return {orjson.loads(b)["id"]: orjson.loads(b) for b in self.receiver.accepted}

    def fail_transient(self, n: int) -> None:
        self.receiver.script = [503] * n

    def attempts(self) -> int:
        return len(self.receiver.requests)

    def close(self) -> None:
        super().close()
        self.receiver.close()


class AlertmanagerHarness(Harness):
    name = "alertmanager"
    native = True

    def make(self, **kw: Any) -> AlertmanagerSink:
        self.receiver = Receiver()
        self.receiver.gate = self.gate
        capacity = kw.pop("capacity", 10_000)
        return AlertmanagerSink(self.receiver.url, backoff_s=BASE_S, max_backoff_s=4 * BASE_S, sleep=self.sleeps,
                                high_water=int(capacity * 0.8), low_water=int(capacity * 0.5), timeout_s=2.0,
                                close_timeout_s=kw.get("close_timeout_s", 2.0))

    def outputs(self, i: str) -> Outputs:
        return Outputs(findings=[finding(i)], incidents=[incident(i)])

    def poisoned(self) -> Outputs:
        return Outputs(incidents=[incident("poison")])

    def expected(self, *ids: str) -> set[str]:
        return {f"i-{i}" for i in ids}

    def state(self) -> dict[str, Any]:
        out = {}
        for body in self.receiver.accepted:
            for alert in json.loads(body):
                out[alert["labels"]["incident"]] = alert["labels"]
        return out

    def fail_transient(self, n: int) -> None:
        self.receiver.script = [503] * n

    def attempts(self) -> int:
        return len(self.receiver.requests)

    def close(self) -> None:
        super().close()
        self.receiver.close()


HARNESSES = [FilesHarness, KafkaHarness, StoreHarness, WebhookHarness, AlertmanagerHarness]


@pytest.fixture(params=HARNESSES, ids=[h.name for h in HARNESSES])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    harness = request.param(tmp_path)
    yield harness
    harness.close()


def send(sink: Any, out: Outputs) -> float:
    """What the worker does per batch: write, flush; returns the seconds it took."""
    t = time.perf_counter()
    sink.write(out)
    sink.flush()
    return time.perf_counter() - t


# --- the contract ---------------------------------------------------------------------------------------


def test_idempotent_rewrite(h: Harness) -> None:
    once = h.make()
    send(once, h.outputs("1"))
    assert once.drain(WAIT_S) == 0
    first = h.state()
    assert set(first) == h.expected("1")
    send(once, h.outputs("1"))  # the same outputs again (a replayed partition, a retried batch)
    send(once, h.outputs("1"))
    assert once.drain(WAIT_S) == 0
    assert h.state() == first
    assert once.take_dead() == []
    assert once.close() == 0


def test_flush_and_close(h: Harness) -> None:
    sink = h.make()
    for i in range(5):
        send(sink, h.outputs(str(i)))
    assert sink.drain(WAIT_S) == 0 and sink.pending() == 0
    assert set(h.state()) == h.expected(*map(str, range(5)))
    assert sink.close() == 0


def test_close_with_a_stuck_receiver_is_bounded_and_says_what_it_left(h: Harness) -> None:
    sink = h.make(close_timeout_s=0.3)
    h.gate.close()
    send(sink, h.outputs("1"))
    assert h.gate.entered.wait(WAIT_S)  # the delivery is stuck at the receiver
    send(sink, h.outputs("2"))
    t = time.monotonic()
    left = sink.close(0.3) if not h.native else sink.close()
    took = time.monotonic() - t
    h.gate.opened.set()
    assert left > 0
    assert took < 0.3 + (2.5 if h.native else 0.5)  # the Alertmanager sink may wait out one HTTP timeout


def test_transient_errors_are_retried_with_capped_exponential_backoff(h: Harness) -> None:
    sink = h.make()
    h.fail_transient(2)
    send(sink, h.outputs("1"))
    assert sink.drain(WAIT_S) == 0
    assert set(h.state()) == h.expected("1")  # delivered
    assert h.sleeps.delays == [BASE_S, 2 * BASE_S]  # after each of the two failures, doubling
    assert h.attempts() == 3
    assert sink.take_dead() == []
    if isinstance(h, WebhookHarness):  # one delivery: one request accepted, by its idempotency key
        assert len(h.receiver.accepted) == 1
    assert sink.close() == 0


def test_permanent_errors_are_not_retried_and_become_dead_letters(h: Harness) -> None:
    sink = h.make()
    send(sink, h.poisoned())
    assert sink.drain(WAIT_S) == 0
    dead = sink.take_dead()
    assert [d.kind for d in dead if "poison" in d.raw] == [dead[0].kind] and dead, dead
    assert all(isinstance(d, DeadLetter) and d.source == f"sink:{sink.name}" and "permanent" in d.reason
               for d in dead)
    assert h.sleeps.delays == []  # no back-off: nothing was retried
    assert not any("poison" in k for k in h.state())
    if not h.native:  # everything but the poison arrived (Alertmanager sends a batch in one POST)
        good = {k for k in h.expected("good1", "good2") if k in _ids(h.poisoned())}
        assert set(h.state()) == good
        assert len(dead) == 1 and sink.failures == 1
    if isinstance(h, WebhookHarness):
        assert [b for b in h.receiver.requests if b"poison" in b] and \
            len([b for b in h.receiver.requests if b"poison" in b]) == 1  # tried once
    assert sink.take_dead() == []  # handed over once


def test_backpressure_write_never_blocks_pressure_is_reported_and_the_backlog_drains(h: Harness) -> None:
    capacity = 10
    sink = h.make(capacity=capacity)
    h.gate.close()
    took = [send(sink, h.outputs("0"))]
    assert h.gate.entered.wait(WAIT_S)  # the receiver holds the first delivery
    assert not sink.pressure()
    i = 1
    while not sink.pressure():
        took.append(send(sink, h.outputs(str(i))))
        i += 1
        assert i < 50, "pressure never reported"
    pressed_at = sink.pending()
    assert pressed_at >= int(capacity * 0.8)
    for j in range(i, i + 10):  # a full queue refuses what comes (as dead letters), without waiting
        took.append(send(sink, h.outputs(str(j))))
    assert max(took) < 0.05, f"write+flush took up to {max(took) * 1000:.1f} ms while the receiver was stuck"
    if not h.native:
        assert sink.full and sink.overflowed > 0
        refused = sink.take_dead()
        assert refused and all("queue full" in d.reason for d in refused)
    h.gate.opened.set()
    assert sink.drain(WAIT_S) == 0
    assert not sink.pressure()
    delivered = set(h.state())
    assert h.expected("0") <= delivered
    if not h.native:
        assert sink.delivered + sink.overflowed == _count_all(h, i + 10)
    assert sink.close() == 0


def _ids(out: Outputs) -> set[str]:
    return {r.id for r in (*out.findings, *out.actions, *out.incidents)}


def _count_all(h: Harness, n: int) -> int:
    return sum(len(h.expected(str(i))) for i in range(n))  # what the sink takes of them (the webhook: actions)


# --- the parts: classification, the pause, the worker's wrapping ------------------------------------------


def test_classification_of_errors() -> None:
    import urllib.error

    def http(code: int) -> urllib.error.HTTPError:
        return urllib.error.HTTPError("http://x", code, "x", {}, None)  # type: ignore[arg-type]

    transient = [ConnectionRefusedError(), ConnectionResetError(), TimeoutError(), http(503),
                 http(500), http(429), http(408), NetworkError("down"),
                 ServerException("too many parts", code=ErrorCodes.TOO_MANY_PARTS),
                 ServerException("timeout", code=ErrorCodes.TIMEOUT_EXCEEDED), KafkaTimeoutError(),
                 DeliveryError("x", transient=True), OSError(28, "No space left on device"),
                 RuntimeError("Code: 241. DB::Exception: Memory limit (total) exceeded")]
    permanent = [http(400), http(401), http(404), http(413), ServerException("no table", code=ErrorCodes.UNKNOWN_TABLE),
                 ServerException("type", code=ErrorCodes.TYPE_MISMATCH), TypeError("Dict key must be str"),
                 UnicodeEncodeError("ascii", "é", 0, 1, "x"), ValueError("bad"), PermissionError(13, "denied"),
                 DeliveryError("x", transient=False), RuntimeError("Code: 60. DB::Exception: Table x does not exist")]
    assert [e for e in transient if not classify(e)[0]] == []
    assert [e for e in permanent if classify(e)[0]] == []


def test_retry_after_is_honoured_up_to_the_cap() -> None:
    p = RetryPolicy(base_s=0.5, cap_s=30.0)
    assert [p.delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert p.delay(1, hint=7.0) == 7.0 and p.delay(1, hint=600.0) == 30.0


def test_transient_failures_give_up_into_dead_letters_after_give_up_s(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    h = StoreHarness(tmp_path)
    sink = queued(h.inner(), retry=RetryPolicy(base_s=1.0, cap_s=8.0, give_up_s=60.0), clock=lambda: now[0],
                  sleep=sleep)
    h.fail_transient(1_000)
    send(sink, Outputs(actions=[action("1")]))
    assert sink.drain(WAIT_S) == 0
    [dead] = sink.take_dead()
    assert "gave up after" in dead.reason and dead.kind == "action" and 60.0 <= now[0] < 70.0
    sink.close()


def test_the_pause_holds_for_a_bounded_time_then_lets_the_worker_go_on() -> None:
    class Pressed:
        def __init__(self) -> None:
            self.on = True

        def pressure(self) -> bool:
            return self.on

    now = [0.0]
    s = Pressed()
    pause = SinkPause([s, object()], max_pause_s=5.0, clock=lambda: now[0])
    assert pause.hold()
    now[0] = 4.9
    assert pause.hold()
    now[0] = 5.0
    assert not pause.hold() and pause.gave_up == 1  # spent: go on while it stays pressed
    now[0] = 50.0
    assert not pause.hold()
    s.on = False
    assert not pause.hold()
    s.on = True
    assert pause.hold() and pause.pauses == 2  # a new episode


def test_the_worker_keeps_each_sinks_metric_name_and_leaves_async_sinks_alone(tmp_path: Path) -> None:
    from gangwatch.streams.metrics import sink_name

    store = queued(StoreSink(FakeStore(StoreHarness(tmp_path)), retries=0))
    hook = queued(WebhookSink("http://127.0.0.1:9/x", SECRET, single_attempt=True))
    am = AlertmanagerSink("http://127.0.0.1:9", background=False)
    assert isinstance(store, QueuedSink) and (sink_name(store), sink_name(hook)) == ("store", "webhook")
    assert queued(am) is am and queued(store) is store
    for s in (store, hook):
        s.close()


def test_inline_delivery_blocks_the_caller_and_the_queue_does_not(tmp_path: Path) -> None:
    """The point of it all, measured: a receiver stuck for 0.3 s holds an inline write 0.3 s, a queued one not."""
    h = WebhookHarness(tmp_path)
    inline = h.inner()
    h.gate.close()
    timer = threading.Timer(0.3, h.gate.opened.set)
    timer.start()
    t_inline = send(inline, Outputs(actions=[action("1")]))
    sink = h.make()
    h.gate.close()
    timer = threading.Timer(0.3, h.gate.opened.set)
    timer.start()
    t_queued = send(sink, Outputs(actions=[action("2")]))
    assert sink.drain(WAIT_S) == 0
    h.close()
    assert t_inline >= 0.25 and t_queued < 0.05
    assert decode(h.receiver.accepted[-1])[0].id == "a-2"


def test_a_queue_holds_only_what_its_sink_takes(tmp_path: Path) -> None:
    """The webhook sends actions only: findings and incidents never fill its queue (nor end as its dead letters)."""
    h = WebhookHarness(tmp_path)
    sink = h.make(capacity=4)
    h.gate.close()
    for i in range(20):  # 20 findings and incidents, no action
        send(sink, Outputs(findings=[finding(str(i))], incidents=[incident(str(i))]))
    assert sink.pending() == 0 and not sink.pressure() and sink.take_dead() == []
    store = queued(StoreSink(FakeStore(StoreHarness(tmp_path)), retries=0), start=False)
    store.observe(finding("x"))  # telemetry off: not held
    store.write(Outputs(findings=[finding("y")]))
    store.flush()
    assert store.pending() == 1
    h.close()


def test_the_worker_only_enqueues_and_publishes_sinks_dead_letters_on_the_dlq_topic(tmp_path: Path) -> None:
    """`_Glue.publish` as the jobs agent runs it: with the controller stuck it returns at once; a refused action
    comes back as a dead letter on the DLQ topic at a later publish (the next batch or tick)."""
    import asyncio
    from types import SimpleNamespace

    from gangwatch.streams.runner import JobRunner, Result
    from gangwatch.streams.topics import TopicSettings
    from gangwatch.streams.worker import _Glue

    sent: list[tuple[str, bytes, bytes]] = []

    class Producer:
        async def send(self, topic: str, key: bytes, value: bytes, **kw: Any) -> Any:
            sent.append((topic, key, value))
            done = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done

    topics = TopicSettings()
    h = WebhookHarness(tmp_path)
    sink = h.make()
    glue = _Glue(SimpleNamespace(producer=Producer()), JobRunner(topics), None, {}, (), (), [sink], False, None)
    glue.pause = SinkPause(glue.sinks)
    h.gate.close()

    async def batch(out: Outputs) -> float:
        t = time.perf_counter()
        await glue.publish(Result(outputs=out))
        return time.perf_counter() - t

    took = asyncio.run(batch(Outputs(actions=[action("poison"), action("ok")])))
    assert h.gate.entered.wait(WAIT_S) and took < 0.05  # the POST is stuck at the controller; the batch is not
    h.gate.opened.set()
    assert sink.drain(WAIT_S) == 0 and sent == []
    asyncio.run(batch(Outputs()))
    [(topic, key, value)] = sent
    dead = DeadLetter.from_dict(orjson.loads(value))
    assert topic == topics.dlq and key == b"sink:webhook" and dead.kind == "action" and "HTTP 400" in dead.reason
    assert set(h.state()) == {"a-ok"}
    sink.close()
    h.close()


# --- the store sink on real engines: chDB here, the ClickHouse server when GANGWATCH_CLICKHOUSE names one ----------


def _real_store_contract(store: Any, break_link: Any = None) -> None:
    """Idempotent rewrite on ReplacingMergeTree (read FINAL), a dropped table as the permanent (schema) error
    and, when `break_link` is given (it breaks the connection and returns how to mend it), a transient one."""
    mend: list[Any] = []
    delays: list[float] = []

    def sleep(s: float) -> None:  # the back-off wait: the server comes back meanwhile
        delays.append(s)
        while mend:
            mend.pop()()

    sink = queued(StoreSink(store, retries=0), retry=RetryPolicy(base_s=BASE_S, give_up_s=None), sleep=sleep)
    h = Harness(Path("."))

    def ids() -> set[str]:
        return {r["id"] for t in ("gw_findings", "gw_actions", "gw_incidents")
                for r in store.query(f"SELECT id FROM {t} FINAL")}

    for _ in range(2):
        send(sink, h.outputs("1"))
    assert sink.drain(WAIT_S) == 0 and sink.take_dead() == []
    assert ids() == h.expected("1") and store.query("SELECT count() AS n FROM gw_actions FINAL")[0]["n"] == 1
    if break_link is not None:
        mend.append(break_link())
        send(sink, h.outputs("2"))
        assert sink.drain(WAIT_S) == 0 and sink.take_dead() == []
        assert len(delays) == 1 and ids() == h.expected("1", "2")
    store.query("DROP TABLE gw_actions")  # a schema error: the same rows will never go in
    send(sink, h.outputs("3"))
    assert sink.drain(WAIT_S) == 0
    [dead] = sink.take_dead()
    assert dead.kind == "action" and "a-3" in dead.raw and "permanent" in dead.reason and "60" in dead.reason
    assert {r["id"] for r in store.query("SELECT id FROM gw_findings FINAL")} >= {"f-3"}
    assert {r["id"] for r in store.query("SELECT id FROM gw_incidents FINAL")} >= {"i-3"}
    assert sink.close() == 0


def test_store_contract_on_chdb(tmp_path: Path) -> None:
    pytest.importorskip("chdb")
    from gangwatch.sinks.store import ChdbStore

    _real_store_contract(ChdbStore(tmp_path / "chdb"))


def test_store_contract_on_the_clickhouse_server() -> None:
    import os
    import uuid

    addr = os.environ.get("GANGWATCH_CLICKHOUSE")
    if not addr:
        pytest.skip("no ClickHouse server (set GANGWATCH_CLICKHOUSE=HOST:PORT)")
    from clickhouse_driver import Client
    from gangwatch.sinks.store import ClickHouseStore

    host, _, port = addr.rpartition(":")
    db = f"t{uuid.uuid4().hex[:12]}"
    store = ClickHouseStore(host, int(port), database=db)
    good = store._client

    def break_link() -> Any:
        store._client = Client(host="127.0.0.1", port=1, connect_timeout=1)  # nothing listens: refused
        return lambda: setattr(store, "_client", good)

    try:
        _real_store_contract(store, break_link)
    finally:
        Client(host=host, port=int(port)).execute(f"DROP DATABASE IF EXISTS {db}")
