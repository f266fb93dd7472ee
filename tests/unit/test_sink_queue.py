"""The delivery queue's parts (error classification, Retry-After, giving up, the bounded pause, how the worker
wraps and feeds its sinks) and the store sink on real engines: chDB here, the ClickHouse server when
GANGWATCH_CLICKHOUSE names one. The contract over every sink is test_sink_contract.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from clickhouse_driver.errors import ErrorCodes, NetworkError, ServerException
from gangwatch.schemas import DeadLetter, Outputs, decode
from gangwatch.sinks.alertmanager import AlertmanagerSink
from gangwatch.sinks.interface import DeliveryError
from gangwatch.sinks.queued import QueuedSink, RetryPolicy, SinkPause, classify, queued
from gangwatch.sinks.storesink import StoreSink
from gangwatch.sinks.webhook import WebhookSink
from kafka.errors import KafkaTimeoutError

from tests.helpers import need, need_module
from tests.unit.sinkcases import (
    BASE_S,
    SECRET,
    WAIT_S,
    FakeStore,
    Harness,
    StoreHarness,
    Watched,
    WebhookHarness,
    action,
    finding,
    incident,
    send,
)

pytestmark = pytest.mark.unit


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


def test_the_worker_sizes_its_queues_and_pause_from_its_settings(tmp_path: Path) -> None:
    from gangwatch.streams.worker import make_app
    from gangwatch.streams.worker_settings import WorkerSettings

    app = make_app(WorkerSettings(app_id="t-queues", sink_queue=7, sink_pause_s=1.5, sink_give_up_s=30.0,
                                  datadir=str(tmp_path)),
                   [StoreSink(FakeStore(StoreHarness(tmp_path)), retries=0)])
    from gangwatch.streams import faust_adapter

    wio = faust_adapter.attached(app)
    [sink] = wio.sinks
    assert (sink.capacity, sink.retry.give_up_s, wio.pause.max_pause_s) == (7, 30.0, 1.5)
    sink.close()


def test_inline_delivery_blocks_the_caller_and_the_queue_does_not(tmp_path: Path) -> None:
    """The point of it all: with the receiver stuck, an inline write returns only once the receiver let go of
    it; a queued one returns while the receiver still holds it. (How long each takes: bench/bench_sinks.py.)"""
    h = WebhookHarness(tmp_path)
    inline = h.inner()
    h.gate.close()
    call = Watched(lambda: send(inline, Outputs(actions=[action("1")])), h.gate)
    assert h.gate.entered.wait(WAIT_S)  # the receiver holds the POST
    h.gate.opened.set()
    assert not call.returned_while_stuck()  # the caller waited for it
    sink = h.make()
    h.gate.close()
    call = Watched(lambda: send(sink, Outputs(actions=[action("2")])), h.gate)
    assert call.returned_while_stuck()
    assert h.gate.entered.wait(WAIT_S) and not h.gate.left.is_set()  # the delivery is at the stuck receiver
    h.gate.opened.set()
    assert sink.drain(WAIT_S) == 0
    h.close()
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
    """`WorkerIO.publish` as the jobs agent runs it: with the controller stuck it returns at once; a refused action
    comes back as a dead letter on the DLQ topic at a later publish (the next batch or tick)."""
    import asyncio
    from types import SimpleNamespace

    from gangwatch.schemas.topics import TopicSettings
    from gangwatch.streams.runner import JobRunner, Result
    from gangwatch.streams.workerio import WorkerIO

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
    wio = WorkerIO(SimpleNamespace(producer=Producer()), JobRunner(topics), None, {}, (), (), [sink], False, None)
    wio.pause = SinkPause(wio.sinks)
    h.gate.close()

    def batch(out: Outputs) -> None:
        asyncio.run(wio.publish(Result(outputs=out)))

    call = Watched(lambda: batch(Outputs(actions=[action("poison"), action("ok")])), h.gate)
    assert call.returned_while_stuck()  # the batch is done ...
    assert h.gate.entered.wait(WAIT_S) and not h.gate.left.is_set()  # ... while the POST is stuck at the controller
    h.gate.opened.set()
    assert sink.drain(WAIT_S) == 0 and sent == []
    batch(Outputs())
    [(topic, key, value)] = sent
    dead = DeadLetter.from_dict(orjson.loads(value))
    assert topic == topics.dlq and key == b"sink:webhook" and dead.kind == "action" and "HTTP 400" in dead.reason
    assert set(h.state()) == {"a-ok"}
    sink.close()
    h.close()


def test_marks_settle_when_delivered_or_dead_never_before(tmp_path: Path) -> None:
    """A mark taken after a flush is reached only once that delivery is done: delivered (the controller let it
    through) or dead (refused for good, or refused because the queue was full)."""
    h = WebhookHarness(tmp_path)
    sink = h.make(capacity=1)
    assert sink.mark() == sink.done() == 0
    h.gate.close()
    send(sink, Outputs(actions=[action("1")]))
    first = sink.mark()
    assert h.gate.entered.wait(WAIT_S) and sink.done() < first  # on its way, stuck at the controller
    send(sink, Outputs(actions=[action("2")]))  # the queue holds 1: refused at once, a dead letter
    second = sink.mark()
    assert second == first + 1 and sink.done() < first  # settled out of turn, never counted ahead of the first
    h.gate.opened.set()
    assert sink.drain(WAIT_S) == 0 and sink.done() == second
    assert [d.kind for d in sink.take_dead()] == ["action"] and set(h.state()) == {"a-1"}
    send(sink, Outputs(findings=[finding("3")]))  # nothing the webhook takes: no new mark to wait for
    assert sink.mark() == second
    sink.close()
    h.close()


class _Marked:
    """A sink's marks, moved by hand."""

    def __init__(self) -> None:
        self.m = self.d = 0

    def mark(self) -> int:
        return self.m

    def done(self) -> int:
        return self.d


def test_a_state_is_written_only_once_every_sink_settled_its_outputs() -> None:
    from gangwatch.streams.checkpoint import PendingStates

    a, b = _Marked(), _Marked()
    written: list[tuple[str, bytes]] = []
    cps = PendingStates([a, b, object()], lambda job, blob: written.append((job, blob)))  # object(): no marks
    cps.offer({"j1": b"s0"})  # nothing on its way: written at once
    assert written == [("j1", b"s0")]
    a.m = b.m = 1  # a batch's outputs went into both sinks
    cps.offer({"j1": b"s1", "j2": b"t1"})
    a.m = 2  # the next batch's outputs, into `a` only
    cps.offer({"j1": b"s2"})
    cps.offer({"j1": b"s3"})  # replaces s2: only the oldest waiting state and the newest are kept
    a.d = b.d = 1
    assert cps.write_settled() == 0  # settled, but not yet noted (its dead letters are not handed on yet)
    cps.note_settled()
    assert cps.write_settled() == 2 and written[1:] == [("j1", b"s1"), ("j2", b"t1")]
    assert cps.waiting() == 1
    a.d = 2
    cps.note_settled()
    assert cps.write_settled() == 1 and written[-1] == ("j1", b"s3")
    a.m = 3
    cps.offer({"j3": b"u1"})
    cps.drop(["j3"])  # revoked: its new owner restores the state saved before
    a.d = 3
    cps.note_settled()
    assert cps.write_settled() == 0 and cps.waiting() == 0 and ("j3", b"u1") not in written


def test_without_queued_sinks_every_state_is_written_at_once() -> None:
    from gangwatch.streams.checkpoint import PendingStates

    written: list[str] = []
    cps = PendingStates([], lambda job, blob: written.append(job))
    cps.offer({"j1": b"x", "j2": b"y"})
    assert written == ["j1", "j2"] and cps.waiting() == 0


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
    need_module("chdb", "the embedded store (the `embedded` extra)")
    from gangwatch.sinks.store import ChdbStore

    _real_store_contract(ChdbStore(tmp_path / "chdb"))


def test_store_contract_on_the_clickhouse_server() -> None:
    import os
    import uuid

    addr = need(os.environ.get("GANGWATCH_CLICKHOUSE"), "no ClickHouse server (set GANGWATCH_CLICKHOUSE=HOST:PORT)")
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


def test_records_written_after_the_sink_closed_are_dead_letters_and_said_in_the_log(tmp_path: Path, caplog) -> None:
    """A worker stopping (SIGINT) while it catches up: what its agent still writes after the sinks closed is not
    lost silently (issue 24): dead letters naming why, and a warning line naming the sink and the count."""
    import logging

    h = StoreHarness(tmp_path)
    sink = queued(h.inner())
    assert sink.close(WAIT_S) == 0
    with caplog.at_level(logging.WARNING, logger="gangwatch.sinks.queued"):
        send(sink, Outputs(actions=[action("1"), action("2")]))
    assert [d.reason for d in sink.take_dead()] == ["not delivered to the store sink: the sink is closed"] * 2
    assert [r.getMessage() for r in caplog.records] == [
        "sink store: 2 record(s) came after it closed (the worker is stopping): dead letters, not delivered"]


@pytest.mark.parametrize("in_flight", [True, False])
def test_a_worker_stopping_mid_batch_feeds_no_closed_sink_and_saves_no_state_over_it(tmp_path: Path, caplog,
                                                                                     in_flight: bool) -> None:
    """SIGINT while the worker catches up (issue 24). `WorkerIO.stop` closes the sinks, each delivering its queue within
    its close timeout. A batch still under way then feeds no sink (no dead letters "the sink is closed") and no
    state is saved, so the next worker reads its records again and delivers their outputs; the log says so.
    Stopped between batches, with everything delivered, the touched jobs' states are saved."""
    import asyncio
    import logging
    from types import SimpleNamespace

    from gangwatch.schemas.topics import TopicSettings
    from gangwatch.streams.runner import JobRunner, Result
    from gangwatch.streams.workerio import WorkerIO

    h = StoreHarness(tmp_path)
    sink = queued(h.inner())
    wio = WorkerIO(SimpleNamespace(producer=SimpleNamespace(send=None)), JobRunner(TopicSettings()), None, {}, (), (),
                [sink], False, None)
    wio.pause = SinkPause(wio.sinks)
    written: list[str] = []
    wio.checkpoint.pending._write = lambda job, blob: written.append(job)
    wio.runner.jobs["j1"] = None
    wio.runner.state_of = lambda job: b"state"

    asyncio.run(wio.publish(Result(outputs=Outputs(actions=[action("1")]), dirty={"j1"})))
    wio.save(Result(dirty={"j1"}))
    with caplog.at_level(logging.INFO, logger="gangwatch"):
        wio.stop(in_flight=in_flight)
        # the batch under way goes on: its outputs and its state go nowhere
        asyncio.run(wio.publish(Result(outputs=Outputs(actions=[action("2")]), dirty={"j1"})))
        wio.save(Result(dirty={"j1"}))
        asyncio.run(wio.offer(wio.take(wio.clock())))  # the tick: nothing is taken once stopping
    said = [r.getMessage() for r in caplog.records]
    assert set(h.state()) == {"a-1"} and sink.take_dead() == []
    assert not [m for m in said if "came after it closed" in m]
    if in_flight:
        assert written == []
        assert [m for m in said if m.startswith("stopping with a batch under way not delivered: no state was saved")]
    else:
        assert written == ["j1"]
        assert "stopped: every output delivered, the states of 1 jobs saved" in said
