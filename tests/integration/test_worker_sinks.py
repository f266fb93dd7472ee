"""The production path end to end: records produced with kafka-python become rows in the real ClickHouse
server, actions on the alert topic, and signed POSTs at a job-controller webhook that verifies them."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest
from gangwatch.schemas import decode
from gangwatch.schemas.signature import verify_signature
from gangwatch.sinks.store import ClickHouseStore

from tests.integration.daemons import free_port, worker_metrics
from tests.integration.kafkakit import caught_up, messages, produce, read_all, scenario, wait_for, worker_args

pytestmark = pytest.mark.integration

SECRET = "test-secret-not-for-production"


class Receiver:
    """A local job controller: records every POST and whether its signature verified; answers `status`
    (503 while a test keeps it down) to a request whose signature verifies."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = bool(verify_signature(SECRET, body, self.headers.get("X-Gangwatch-Signature-V1", ""),
                                           self.headers.get("Idempotency-Key")))
                code = outer.status if ok else 401
                outer.posts.append({"ok": ok, "key": self.headers.get("Idempotency-Key"), "body": orjson.loads(body),
                                    "status": code})
                self.send_response(code)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/actions"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def database(clickhouse_addr, unique):
    host, port = clickhouse_addr
    store = ClickHouseStore(host, port, database=unique)
    yield store, f"clickhouse://{host}:{port}/{unique}"
    store._client.execute(f"DROP DATABASE IF EXISTS {unique}")
    store.close()


def test_kafka_in_clickhouse_alert_topic_and_webhook_out(kafka_bootstrap, topics, unique, workers, receiver,
                                                          database):
    store, url = database
    produce(kafka_bootstrap, messages(scenario(xid_node=None), topics))  # n001 goes silent at 20 s
    w = workers(*worker_args(kafka_bootstrap, unique, topics, "--no-silence", "--store", url,
                             "--webhook", receiver.url), env={"GANGWATCH_WEBHOOK_SECRET": SECRET})
    wait_for(lambda: any(p["body"]["type"] == "replace" for p in receiver.posts), 90.0, "a signed replace action",
             proc=w)
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.job_inputs), 90.0, "all input consumed", proc=w)

    alerts = [decode(v)[0] for _, v in read_all(kafka_bootstrap, [topics.actions])[topics.actions]]
    replace = [a for a in alerts if a.type == "replace"]
    assert [a.nodes for a in replace] == [["n001"]]
    posted = [p for p in receiver.posts if p["body"]["type"] == "replace"]
    assert posted and all(p["ok"] for p in receiver.posts)
    assert posted[0]["key"] == replace[0].id and posted[0]["body"]["id"] == replace[0].id

    def stored() -> bool:
        return bool(store.query("SELECT id FROM gw_actions FINAL WHERE type = 'replace'"))

    wait_for(stored, 30.0, "the action row in ClickHouse", proc=w)
    [row] = store.query("SELECT id, nodes, path FROM gw_actions FINAL WHERE type = 'replace'")
    assert row == {"id": replace[0].id, "nodes": ["n001"], "path": "hot"}
    findings = store.query("SELECT type, node FROM gw_findings FINAL WHERE type = 'fail_stop'")
    assert findings == [{"type": "fail_stop", "node": "n001"}]
    [inc] = store.query("SELECT class, culprit_nodes FROM gw_incidents FINAL")
    assert inc == {"class": "fail_stop", "culprit_nodes": ["n001"]}


def test_an_action_still_queued_for_the_controller_survives_a_worker_kill(kafka_bootstrap, topics, unique, workers,
                                                                         receiver):
    """The controller answers 503 while the worker decides a replace; the worker is killed with the action still in
    its webhook queue (published on the alert topic, every input record processed, the delivery refused three times:
    long past the commit interval). The next worker delivers it, exactly once: the job's saved state, and so the
    committed offsets, waited for that delivery, so the replacement reads those inputs again."""
    receiver.status = 503
    recs = scenario(xid_node=None)
    produce(kafka_bootstrap, messages(recs, topics))
    port = free_port()
    args = worker_args(kafka_bootstrap, unique, topics, "--no-silence", "--webhook", receiver.url)
    env = {"GANGWATCH_WEBHOOK_SECRET": SECRET}
    first = workers(*args, "--metrics-port", str(port), env=env)

    def refused() -> int:
        return sum(p["body"]["type"] == "replace" and p["status"] == 503 for p in list(receiver.posts))

    def processed() -> bool:
        try:
            return worker_metrics(port)["records"] >= len(recs)
        except OSError:  # the endpoint is not up yet
            return False

    wait_for(processed, 90.0, "every record processed", proc=first)
    wait_for(lambda: refused() >= 3, 90.0, "the replace, refused three times by the controller", proc=first)
    [replace] = [a for a in (decode(v)[0] for _, v in read_all(kafka_bootstrap, [topics.actions])[topics.actions])
                 if a.type == "replace"]
    first.kill()
    receiver.status = 200
    second = workers(*args, env=env)

    def applied() -> list[dict]:
        return [p for p in list(receiver.posts) if p["status"] == 200 and p["key"] == replace.id]

    wait_for(applied, 90.0, "the replace, delivered by the next worker", proc=second)
    wait_for(lambda: caught_up(kafka_bootstrap, unique, topics.job_inputs), 90.0, "all input consumed and committed",
             proc=second)
    assert len(applied()) == 1 and applied()[0]["body"]["nodes"] == ["n001"]
    assert all(p["ok"] for p in receiver.posts)


def test_replay_can_publish_to_the_alert_topic(kafka_bootstrap, unique, tmp_path, monkeypatch):
    from gangwatch.schemas.topics import TopicSettings
    from gangwatch.streams.topic_admin import create_topics

    from gangwatch.cli import main
    from tests.integration.kafkakit import write_jsonl

    monkeypatch.setenv("GANGWATCH_TOPIC_PREFIX", f"{unique}.")
    t = TopicSettings.from_env()
    create_topics(t, kafka_bootstrap)
    src = write_jsonl(tmp_path / "run.jsonl", messages(scenario(xid_node=None), t))
    assert main(["replay", str(src), "--out", str(tmp_path / "out"), "--no-store", "-q",
                 "--publish", kafka_bootstrap]) == 0
    alerts = [decode(v)[0] for _, v in read_all(kafka_bootstrap, [t.actions])[t.actions]]
    assert [(a.type, a.nodes) for a in alerts if a.type == "replace"] == [("replace", ["n001"])]
