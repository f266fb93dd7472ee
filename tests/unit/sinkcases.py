"""What the sink tests share: records, a local HTTP receiver, and one harness per sink (how to build it as the
worker runs it, read its end state, make it fail or stall). The tests: test_sink_contract.py (the same
contract over every sink) and test_sink_queue.py (the delivery queue's parts, the store on real engines)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
from clickhouse_driver.errors import ErrorCodes, NetworkError, ServerException
from gangwatch.schemas import Action, Finding, Incident, Outputs
from gangwatch.sinks.alertmanager import AlertmanagerSink
from gangwatch.sinks.files import JsonlSink
from gangwatch.sinks.kafka import KafkaSink
from gangwatch.sinks.queued import RetryPolicy, queued
from gangwatch.sinks.storesink import StoreSink
from gangwatch.sinks.webhook import WebhookSink
from kafka.errors import KafkaTimeoutError

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
    """Where a stuck receiver waits: `entered` is set when a delivery reached it, `opened` lets it go on, `left`
    is set once it went on (or gave up waiting): a caller that returned before `left` did not wait for it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.left = threading.Event()
        self.opened.set()

    def close(self) -> None:
        self.opened.clear()
        self.entered.clear()
        self.left.clear()

    def pass_through(self) -> None:
        self.entered.set()
        try:
            assert self.opened.wait(WAIT_S), "the test never opened the gate"
        finally:
            self.left.set()


class Watched:
    """`call()` on a thread of its own, noting whether the receiver behind `gate` had let go of its request by
    the time the call returned: the behaviour a wall-clock threshold used to stand for ("returned while the
    receiver was still stuck"), with no clock in it."""

    def __init__(self, call: Callable[[], Any], gate: Gate) -> None:
        self.returned = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.receiver_had_let_go: bool | None = None

        def run() -> None:
            try:
                self.value = call()
            except BaseException as e:  # noqa: BLE001 - handed to the test
                self.error = e
            self.receiver_had_let_go = gate.left.is_set()
            self.returned.set()

        threading.Thread(target=run, daemon=True).start()

    def returned_while_stuck(self) -> bool:
        """It returned (within WAIT_S), without an error, while the receiver still held what it was sent."""
        assert self.returned.wait(WAIT_S), "the call never returned"
        assert self.error is None, self.error
        return self.receiver_had_let_go is False


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


class ReceiverHarness(Harness):
    """A sink that POSTs to a local `Receiver`: failures are scripted HTTP statuses."""

    def fail_transient(self, n: int) -> None:
        self.receiver.script = [503] * n

    def attempts(self) -> int:
        return len(self.receiver.requests)

    def close(self) -> None:
        super().close()
        self.receiver.close()


class WebhookHarness(ReceiverHarness):
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


class AlertmanagerHarness(ReceiverHarness):
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


HARNESSES = [FilesHarness, KafkaHarness, StoreHarness, WebhookHarness, AlertmanagerHarness]



def send(sink: Any, out: Outputs) -> float:
    """What the worker does per batch: write, flush; returns the seconds it took."""
    t = time.perf_counter()
    sink.write(out)
    sink.flush()
    return time.perf_counter() - t


