"""A real Prometheus server (Debian's `prometheus`) scrapes gangwatch's processes; the test asks its HTTP API.

One Prometheus per module, on a free loopback port with a temp config and storage,
scraping every second three targets whose ports are chosen up front:

- `gangwatch-worker`: `gangwatch worker --metrics-port P` against the real broker (its own
  topic prefix and app id). The test publishes a short job and waits, through
  `/api/v1/query`, until `gangwatch_records_total` counts exactly the records it sent,
  by kind; Faust's own sensor (`gangwatch_faust_*`) and the consumer lag are there too.
- `gangwatch-agent`: `gangwatch agent --metrics-port P` following a kernel-log file.
- `gangwatch-trainer`: a training loop with the trainer client, turned on only by
  `GANGWATCH_METRICS_PORT`; as local rank 1 it serves on that port + 1.

Without the `prometheus` binary the tests skip with the reason (fail under
GANGWATCH_REQUIRE_SERVICES=1, as in CI); without Kafka, as every integration test.
Every wait has a deadline; every process started is stopped.
"""

from __future__ import annotations

import collections
import json
import os
import select
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable

import pytest

from tests.integration.daemons import Daemon, free_port, require_program, wait_until
from tests.integration.kafkakit import REPO, WorkerProc, messages, produce, scenario, wait_for, worker_args

pytestmark = pytest.mark.integration

JOBS = ("gangwatch-worker", "gangwatch-agent", "gangwatch-trainer")


class Prometheus:
    """A running Prometheus and its query API."""

    def __init__(self, daemon: Daemon, url: str, ports: dict[str, int]) -> None:
        self.daemon, self.url, self.ports = daemon, url, ports

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query: (labels, value) of every series in the result."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return [(s["metric"], float(s["value"][1])) for s in body["data"]["result"]]

    def wait(self, promql: str, ok: Callable[[list[tuple[dict[str, str], float]]], bool], timeout_s: float,
             what: str, proc: WorkerProc | None = None) -> list[tuple[dict[str, str], float]]:
        """Query until `ok(result)`; fail with `what`, the last result and the process's log at the deadline."""
        last: list = []

        def check() -> bool:
            last[:] = self.query(promql)
            return ok(last)

        try:
            wait_for(check, timeout_s, what, every=0.5, proc=proc)
        except AssertionError as e:
            raise AssertionError(f"{e}\nlast result of {promql}: {last}") from None
        return last


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Prometheus:
    binary = require_program("prometheus", package="prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    ports = {job: free_port() for job in JOBS}
    config = {  # JSON is YAML: no YAML writer needed
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                           for job, port in ports.items()],
    }
    (tmp / "prometheus.yml").write_text(json.dumps(config, indent=2))
    port = free_port()
    daemon = Daemon("prometheus", [binary, f"--config.file={tmp / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                    tmp / "prometheus.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200, 60,
                   "Prometheus to be ready (/-/ready)", every_s=0.2, alive=daemon)
        yield Prometheus(daemon, url, ports)
    finally:
        daemon.stop()


def test_prometheus_scrapes_the_worker_and_counts_every_record_by_kind(prometheus, kafka_bootstrap, topics, unique,
                                                                        workers):
    w = workers(*worker_args(kafka_bootstrap, f"{unique}-app", topics, "--metrics-port",
                             str(prometheus.ports["gangwatch-worker"])))
    prometheus.wait('up{job="gangwatch-worker"}', lambda r: r and r[0][1] == 1, 90,
                    "Prometheus to scrape the worker (up == 1)", proc=w)

    recs = scenario(seconds=6, silent=None, xid_node=None)
    produce(kafka_bootstrap, messages(recs, topics))
    want = collections.Counter(r.kind for r in recs)
    got = prometheus.wait('sum by (kind) (gangwatch_records_total{job="gangwatch-worker"})',
                          lambda r: {m["kind"]: v for m, v in r} == want, 90,
                          f"gangwatch_records_total to count {dict(want)}", proc=w)
    assert {m["kind"]: v for m, v in got} == want

    faust = prometheus.query('sum(gangwatch_faust_messages_received_total{job="gangwatch-worker"})')
    assert faust and faust[0][1] >= len(messages(recs, topics)), faust  # Faust's own sensor, same endpoint
    prometheus.wait(f'sum(gangwatch_consumer_lag_records{{job="gangwatch-worker",topic="{topics.telemetry}"}})',
                    lambda r: r and r[0][1] == 0, 30, "the worker to report no lag on the telemetry topic", proc=w)
    assert prometheus.query('gangwatch_batch_seconds_count{job="gangwatch-worker"}')[0][1] >= 1
    assert prometheus.query('process_resident_memory_bytes{job="gangwatch-worker"}')[0][1] > 0


def test_prometheus_scrapes_the_agent(prometheus, kafka_bootstrap, topics, tmp_path):
    kmsg = tmp_path / "kern.log"
    kmsg.write_text("")
    agent = WorkerProc([sys.executable, "-m", "gangwatch", "agent", "--node", "n042", "--bootstrap", kafka_bootstrap,
                        "--prefix", topics.prefix, "--kmsg", str(kmsg), "--gpu-every", "0",
                        "--spool-dir", str(tmp_path / "spool"),
                        "--metrics-port", str(prometheus.ports["gangwatch-agent"])], tmp_path / "agent.log")
    try:
        wait_for(lambda: "running" in agent.log.read_text(errors="replace"), 30, "the agent to start", proc=agent)
        with open(kmsg, "a") as f:  # the agent follows the log from its end: written after it started
            f.write("[Sun Feb 23 16:31:00 2025] NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=python, GPU has fallen "
                    "off the bus.\n")
        prometheus.wait('gangwatch_producer_records_total{job="gangwatch-agent",kind="hw"}',
                        lambda r: r and r[0][1] == 1, 60, "the agent's Xid to be counted", proc=agent)
        polls = prometheus.query('gangwatch_agent_polls_total{job="gangwatch-agent",collector="kernel log"}')
        assert polls and polls[0][1] >= 1
        assert prometheus.query('gangwatch_agent_info{job="gangwatch-agent"}')[0][0]["node"] == "n042"
    finally:
        assert agent.stop() == 0, agent.tail()


TRAIN = """
import time
from gangwatch.producers.trainer import TrainerClient
client = TrainerClient(job="prom-job", flush_s=0.2, heartbeat_s=1.0)
step = 0
while True:
    with client.step_context(step):
        time.sleep(0.02)
    step += 1
"""


def test_prometheus_scrapes_a_training_process_on_its_port_plus_its_local_rank(prometheus, kafka_bootstrap, topics,
                                                                                tmp_path):
    port = prometheus.ports["gangwatch-trainer"]
    env = {"GANGWATCH_METRICS_PORT": str(port - 1), "LOCAL_RANK": "1", "RANK": "1", "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2", "GANGWATCH_BOOTSTRAP": kafka_bootstrap, "GANGWATCH_TOPIC_PREFIX": topics.prefix,
           "TMPDIR": str(tmp_path)}
    trainer = WorkerProc([sys.executable, "-c", TRAIN], tmp_path / "trainer.log", env=env)
    try:
        prometheus.wait('gangwatch_producer_records_total{job="gangwatch-trainer",kind="step"}',
                        lambda r: r and r[0][1] > 0, 60, "the training process's steps to be counted", proc=trainer)
        prometheus.wait('gangwatch_producer_sent_records_total{job="gangwatch-trainer"}',
                        lambda r: r and r[0][1] > 1, 30, "them to reach Kafka", proc=trainer)
        info = prometheus.query('gangwatch_trainer_info{job="gangwatch-trainer"}')
        assert [(m["job_id"], m["rank"], m["local_rank"]) for m, _ in info] == [("prom-job", "1", "1")]
    finally:
        trainer.stop()


def test_a_worker_whose_metrics_port_is_taken_serves_on_a_free_one_and_says_so_once(kafka_bootstrap, topics, unique):
    """A second worker on one host (issue 24): the taken port is named in one warning with the port used instead,
    and the worker runs on (it used to exit)."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = worker_args(kafka_bootstrap, f"{unique}-app", topics, "--metrics-port", str(port))
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            lines, deadline = [], time.monotonic() + 90.0
            while time.monotonic() < deadline and not any("metrics port" in x for x in lines):
                if select.select([proc.stderr], [], [], 1.0)[0]:
                    line = proc.stderr.readline()
                    if not line:  # it exited
                        break
                    lines.append(line)
            warned = [x for x in lines if f"metrics port {port} is taken; serving metrics on port" in x]
            assert len(warned) == 1 and proc.poll() is None, "".join(lines)
        finally:
            proc.terminate()
            proc.wait(timeout=60)

