"""AlertmanagerSink against a real Alertmanager (Debian's `prometheus-alertmanager`) on loopback.

The test starts its own Alertmanager (temp config and storage, clustering off)
whose only route groups by `job` and notifies a webhook receiver the test runs,
with `send_resolved: true`. It pushes incidents of two jobs through the sink and
checks, through Alertmanager's API and the notifications it sends:

- the alerts arrive with gangwatch's labels and annotations;
- they are grouped by job (`/api/v2/alerts/groups`, and one notification per job);
- re-sending keeps an open incident's alert firing past its `endsAt`;
- closing an incident resolves its alerts (gone from the active list, and a
  `resolved` notification for that job) while the other job's stay firing.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from gangwatch.schemas import Action, Finding, Incident, Outputs
from gangwatch.sinks.alertmanager import AlertmanagerSink

from tests.integration.daemons import Daemon, free_port, require_program, wait_until

pytestmark = pytest.mark.integration


class Receiver:
    """A webhook receiver for Alertmanager's notifications (JSON bodies kept in arrival order)."""

    def __init__(self) -> None:
        self.got: list[dict] = []
        lock = threading.Lock()
        rx = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    rx.got.append(json.loads(body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def notified(self, job: str, status: str) -> list[dict]:
        return [n for n in list(self.got) if n["groupLabels"] == {"job": job} and n["status"] == status]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


CONFIG = """\
route:
  receiver: hook
  group_by: [job]
  group_wait: 200ms
  group_interval: 500ms
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {url}
        send_resolved: true
"""


@pytest.fixture
def alertmanager(tmp_path):
    """(base URL, webhook receiver) of a fresh Alertmanager; stopped afterwards."""
    binary = require_program("prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager")
    rx = Receiver()
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(CONFIG.format(url=rx.url))
    port = free_port()
    am = Daemon("alertmanager", [binary, f"--config.file={conf}", f"--storage.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                                 "--log.level=debug"], tmp_path / "alertmanager.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200, 30,
                   "Alertmanager /-/ready", alive=am)
        yield base, rx
    finally:
        am.stop()
        rx.close()


def get(url: str) -> list[dict]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def groups(base: str) -> dict[str, list[dict]]:
    """job -> its active alerts, from /api/v2/alerts/groups."""
    out: dict[str, list[dict]] = {}
    for g in get(f"{base}/api/v2/alerts/groups"):
        active = [a for a in g["alerts"] if a["status"]["state"] == "active"]
        if active:
            out[g["labels"]["job"]] = active
    return out


def test_incidents_fire_group_by_job_and_resolve(alertmanager):
    base, rx = alertmanager
    now = time.time()
    xid = Finding(id="f-a", ts=now - 3, job="train-a", type="hw_fault", detector="hardware.xid", node="n003", gpu=1,
                  rank=25, evidence={"severity": "fatal", "source": "xid", "code": 79,
                                     "name": "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"})
    inc_a = Incident(id="i-a", ts=now, job="train-a", cls="fail_stop", onset_ts=now - 5, detected_ts=now - 3,
                     culprit_nodes=["n003"], path="hot", extra={"findings": ["f-a"], "actions": ["a-a"]})
    act_a = Action(id="a-a", ts=now, job="train-a", incident="i-a", type="replace", nodes=["n003"],
                   reason="ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, fail_stop; culprit n003 (confidence 0.97)")
    inc_b = Incident(id="i-b", ts=now, job="train-b", cls="fail_slow", onset_ts=now - 60, detected_ts=now - 50,
                     culprit_nodes=["n010", "n011"], extra={"findings": [], "actions": []})
    sink = AlertmanagerSink(base, resend_s=0.5, ttl_s=2.0)
    try:
        sink.write(Outputs(findings=[xid], actions=[act_a], incidents=[inc_a, inc_b]))
        sink.flush()

        # arrive, grouped by job
        got = wait_until(lambda: (lambda g: g if set(g) == {"train-a", "train-b"} and len(g["train-b"]) == 2
                                  else None)(groups(base)), 20, "two job groups in /api/v2/alerts/groups")
        [a] = got["train-a"]
        assert a["labels"] == {"alertname": "GangwatchIncident", "job": "train-a", "incident": "i-a",
                               "class": "fail_stop", "severity": "critical", "node": "n003", "gpu": "1"}
        assert a["annotations"]["reason"].startswith("replace n003: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
        assert "Xid 79" in a["annotations"]["evidence"]
        assert "i-a" in a["annotations"]["report"]
        assert {x["labels"]["node"] for x in got["train-b"]} == {"n010", "n011"}
        assert {x["labels"]["severity"] for x in got["train-b"]} == {"warning"}
        # both nodes notified, in train-b's group (one message or two: an alert whose startsAt is older than
        # group_wait makes Alertmanager flush its new group at once, and the second comes with the next
        # group_interval)
        def notified_nodes(job: str) -> set[str]:
            return {a["labels"]["node"] for n in rx.notified(job, "firing") for a in n["alerts"]}

        wait_until(lambda: notified_nodes("train-a") and notified_nodes("train-b") == {"n010", "n011"}, 20,
                   "firing notifications for both jobs, train-b's naming both its nodes")
        assert notified_nodes("train-a") == {"n003"}

        # re-sending keeps them firing well past the first endsAt (now + 2 s)
        first_end = max(x["endsAt"] for x in got["train-a"])
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            assert set(groups(base)) == {"train-a", "train-b"}, "an open incident's alert stopped firing"
            time.sleep(0.25)
        assert groups(base)["train-a"][0]["endsAt"] > first_end

        # train-a recovers: its alert resolves, train-b's stay
        closed = Incident(**{**{f: getattr(inc_a, f) for f in ("id", "job", "cls", "onset_ts", "detected_ts",
                                                                "culprit_nodes", "path", "extra")},
                             "ts": time.time(), "recovered_ts": time.time()})
        sink.write(Outputs(incidents=[closed]))
        sink.flush()
        wait_until(lambda: set(groups(base)) == {"train-b"}, 20, "train-a's alert to resolve")
        wait_until(lambda: rx.notified("train-a", "resolved"), 20, "a resolved notification for train-a")
        [resolved] = rx.notified("train-a", "resolved")[-1]["alerts"]
        assert resolved["status"] == "resolved" and resolved["labels"]["incident"] == "i-a"
        assert not rx.notified("train-b", "resolved")
    finally:
        sink.close()
    assert sink.failures == 0 and sink.posts >= 3
