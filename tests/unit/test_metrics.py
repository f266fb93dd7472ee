"""Self-metrics without a server: the series each process exposes, with their labels and values.

- The worker (`streams/metrics.py`): a real `JobRunner` batch (and tick) counted into a
  fresh registry: records by kind, decode rejects and DLQ messages by cause, findings and
  actions by type, duplicates, stage durations of a closed incident (once), batch time and
  lag, and the gauges sampled on a tick (lag per partition, sinks).
- The producers (`producers/metrics.py`): a trainer client and a live agent read through
  the producer collector, exactly as a scrape reads them.
- prometheus-client stays optional: the trainer client imports it only when a port is
  set, and without it logs one line and trains on.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import threading
import time

import pytest
from gangwatch.producers import metrics as pm
from gangwatch.producers.agent import Agent
from gangwatch.producers.agent import metric_samples as agent_metric_samples
from gangwatch.producers.nvml import FakeNvml
from gangwatch.producers.trainer import TrainerClient
from gangwatch.producers.trainer.client import metric_samples as trainer_metric_samples
from gangwatch.schemas import DecodeError, Heartbeat, Incident, Job, Outputs, RankInfo, Step, encode
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.metrics import WorkerMetrics
from gangwatch.streams.runner import JobRunner, Msg, Result
from prometheus_client import CollectorRegistry, generate_latest

from tests.integration.kafkakit import messages, scenario
from tests.unit.test_agent import FakeKafka, settings

pytestmark = pytest.mark.unit

T = TopicSettings()


def as_msgs(triples) -> list[Msg]:
    return [Msg(topic, 0, i, key, value) for i, (topic, key, value) in enumerate(triples)]


def value(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


@pytest.fixture
def worker_metrics():
    reg = CollectorRegistry()
    return WorkerMetrics(reg), reg


# --- the worker -------------------------------------------------------------------------------------


def test_a_runner_batch_is_counted_by_kind_with_rejects_by_topic_and_outputs_by_type(worker_metrics):
    m, reg = worker_metrics
    recs = scenario(xid_node=None)  # n001 goes silent at 20 s: a fail-stop, its incident and actions
    bad = (T.telemetry, b"j1", b'{"kind":"step","v":1,"ts":1.0}')  # no job, rank, step: breaks the contract
    res = JobRunner(T).on_batch(as_msgs([*messages(recs, T), bad]))
    m.count(res)

    kinds = collections.Counter(r.kind for r in recs)
    assert set(kinds) == {"job", "step", "heartbeat"}
    for kind, n in kinds.items():
        assert value(reg, "gangwatch_records_total", kind=kind) == n
    assert value(reg, "gangwatch_decode_rejects_total", topic=T.telemetry) == 1
    assert value(reg, "gangwatch_dlq_messages_total", cause="decode", topic=T.telemetry) == 1

    findings = collections.Counter((f.type, f.detector) for f in res.outputs.findings)
    actions = collections.Counter(a.type for a in res.outputs.actions)
    assert "fail_stop" in {t for t, _ in findings} and actions  # the scenario makes both, or this proves nothing
    for (ftype, detector), n in findings.items():
        assert value(reg, "gangwatch_findings_total", type=ftype, detector=detector) == n
    for atype, n in actions.items():
        assert value(reg, "gangwatch_actions_total", type=atype) == n

    text = generate_latest(reg).decode()  # the exposition format a scrape reads
    assert f'gangwatch_records_total{{kind="step"}} {float(kinds["step"])}' in text
    detector = next(d for t, d in findings if t == "fail_stop")
    assert f'gangwatch_findings_total{{detector="{detector}",type="fail_stop"}} 1.0' in text
    assert "# TYPE gangwatch_incident_stage_seconds histogram" in text


def test_replayed_records_count_as_duplicates_not_records(worker_metrics):
    m, reg = worker_metrics
    msgs = as_msgs(messages(scenario(seconds=5, silent=None, xid_node=None), T))
    runner = JobRunner(T)
    m.count(runner.on_batch(msgs))
    first = value(reg, "gangwatch_records_total", kind="step")
    m.count(runner.on_batch(msgs))  # the same offsets again, as after a rebalance
    assert value(reg, "gangwatch_records_total", kind="step") == first
    assert value(reg, "gangwatch_duplicates_total") == len(scenario(seconds=5, silent=None, xid_node=None))


def test_records_that_never_see_their_job_go_to_the_dlq_as_no_job(worker_metrics):
    m, reg = worker_metrics
    now = [100.0]
    runner = JobRunner(T, hold_s=5.0, clock=lambda: now[0])
    step = Step(ts=1.0, job="ghost", rank=0, step=1, step_s=1.0)
    m.count(runner.on_batch(as_msgs([(T.telemetry, b"ghost", encode(step))])))
    assert value(reg, "gangwatch_dlq_messages_total", cause="no_job", topic=T.telemetry) is None  # still waiting
    now[0] += 6.0
    m.count(runner.on_tick())
    assert value(reg, "gangwatch_dlq_messages_total", cause="no_job", topic=T.telemetry) == 1
    assert value(reg, "gangwatch_decode_rejects_total", topic=T.telemetry) is None  # it did decode
    assert value(reg, "gangwatch_records_total", kind="step") is None  # and never reached a core


def test_a_record_the_core_refuses_is_a_core_dead_letter(worker_metrics, monkeypatch):
    m, reg = worker_metrics
    job = Job(ts=10.0, job="j1", heartbeat_s=1.0, ranks=[RankInfo(rank=0, node="n0", gpu=0)])
    runner = JobRunner(T)
    m.count(runner.on_batch(as_msgs([(T.jobs, b"j1", encode(job))])))
    core = runner.jobs["j1"].core  # today's cores refuse nothing on their own: make this one refuse (the runner
    # hands a job's records between job records to process_many as one run)
    monkeypatch.setattr(core, "process_many",
                        lambda recs, out=None: Outputs(rejected=[DecodeError("refused", "ts", recs[-1].kind)]))
    m.count(runner.on_batch(as_msgs([(T.telemetry, b"j1", encode(Heartbeat(ts=11.0, job="j1", rank=0)))])))
    assert value(reg, "gangwatch_dlq_messages_total", cause="core", topic=T.telemetry) == 1
    assert value(reg, "gangwatch_records_total", kind="heartbeat") == 1  # it did reach the core


def incident(iid: str, recovered: float | None, cls: str = "fail_stop") -> Incident:
    return Incident(id=iid, ts=100.0, job="j1", cls=cls, onset_ts=10.0, detected_ts=20.0, recovered_ts=recovered,
                    stage_s={"detect": 10.0, "total": 90.0} if recovered else {"detect": 10.0})


def test_stage_durations_are_observed_once_when_an_incident_closes(worker_metrics):
    m, reg = worker_metrics
    m.count(Result(outputs=Outputs(incidents=[incident("i1", None)])))  # still open: nothing yet
    assert value(reg, "gangwatch_incident_stage_seconds_count", stage="detect", **{"class": "fail_stop"}) is None
    closed = incident("i1", 100.0)
    m.count(Result(outputs=Outputs(incidents=[closed, closed])))  # re-emitted, and again after a restart
    m.count(Result(outputs=Outputs(incidents=[closed])))
    labels = {"stage": "total", "class": "fail_stop"}
    assert value(reg, "gangwatch_incident_stage_seconds_count", **labels) == 1
    assert value(reg, "gangwatch_incident_stage_seconds_sum", **labels) == 90.0
    assert value(reg, "gangwatch_incident_stage_seconds_bucket", le="60.0", **labels) == 0
    assert value(reg, "gangwatch_incident_stage_seconds_bucket", le="120.0", **labels) == 1
    m.count(Result(outputs=Outputs(incidents=[incident("i2", 50.0, cls="hang")])))
    assert value(reg, "gangwatch_incident_stage_seconds_count", stage="detect", **{"class": "hang"}) == 1


def test_batch_time_and_event_time_lag(worker_metrics):
    m, reg = worker_metrics
    m.batch_done(0.03, lag_s=2.5)
    m.batch_done(0.2, lag_s=None)  # a batch that processed nothing leaves the lag as it was
    assert value(reg, "gangwatch_batch_seconds_count") == 2
    assert value(reg, "gangwatch_batch_seconds_bucket", le="0.05") == 1
    assert value(reg, "gangwatch_event_time_lag_seconds") == 2.5


class FakeSink:
    """A sink as the metrics see one: `pending()` and a cumulative `failures` count."""

    def __init__(self) -> None:
        self.queued = 0
        self.failures = 0

    def pending(self) -> int:
        return self.queued


class WebhookSink:  # named like the real one: the label is the class name without "Sink"
    def __init__(self) -> None:
        self.failed: list[object] = []


def test_a_tick_samples_lag_per_partition_jobs_the_router_and_the_sinks(worker_metrics):
    m, reg = worker_metrics
    sink, hook = FakeSink(), WebhookSink()
    sink.queued, sink.failures, hook.failed = 3, 2, ["a"]
    m.sample(lag={(T.telemetry, 0): 40, (T.telemetry, 1): 0}, jobs=2, routed=10, dropped=1, sinks=[sink, hook])
    assert value(reg, "gangwatch_consumer_lag_records", topic=T.telemetry, partition="0") == 40
    assert value(reg, "gangwatch_consumer_lag_records", topic=T.telemetry, partition="1") == 0
    assert value(reg, "gangwatch_jobs") == 2
    assert value(reg, "gangwatch_sink_queue_depth", sink="fake") == 3
    assert value(reg, "gangwatch_sink_failures_total", sink="fake") == 2
    assert value(reg, "gangwatch_sink_failures_total", sink="webhook") == 1

    sink.queued, sink.failures = 0, 5
    m.sink_failed(sink)  # a sink that raised in the batch
    m.sample(lag={(T.telemetry, 1): 7}, jobs=1, routed=25, dropped=1, sinks=[sink, hook])
    assert value(reg, "gangwatch_consumer_lag_records", topic=T.telemetry, partition="0") is None  # revoked
    assert value(reg, "gangwatch_consumer_lag_records", topic=T.telemetry, partition="1") == 7
    assert value(reg, "gangwatch_sink_queue_depth", sink="fake") == 0
    assert value(reg, "gangwatch_sink_failures_total", sink="fake") == 6  # 5 it counted + 1 it raised
    assert value(reg, "gangwatch_node_events_routed_total") == 25
    assert value(reg, "gangwatch_node_events_dropped_total") == 1


# --- the producers ----------------------------------------------------------------------------------


def scrape(*watched) -> CollectorRegistry:
    """A registry with a fresh producer collector watching `watched` ((object, reader) pairs)."""
    collector = pm.ProducerCollector()
    for obj, read in watched:
        collector.watch(obj, read)
    reg = CollectorRegistry()
    reg.register(collector)
    return reg


class Send:
    def __init__(self) -> None:
        self.up = True
        self.sent = 0

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        if not self.up:
            raise ConnectionError("no broker")
        self.sent += 1


def test_the_trainer_clients_queues_records_and_delivery_are_read_at_scrape_time(tmp_path):
    send, now = Send(), [0.0]
    client = TrainerClient(job="j7", rank=3, world_size=8, local_rank=1, node="n2", send=send, background=False,
                           exit_hooks=False, spool_dir=tmp_path, metrics_port=0, timer=lambda: now[0])
    try:
        reg = scrape((client, trainer_metric_samples))
        for k in range(5):
            now[0] += 1.0
            client.step(k)
        assert value(reg, "gangwatch_producer_queue_depth", queue="steps") == 5
        assert value(reg, "gangwatch_producer_queue_depth", queue="control") == 1  # the first heartbeat
        client.flush()
        assert value(reg, "gangwatch_producer_queue_depth", queue="steps") == 0
        assert value(reg, "gangwatch_producer_records_total", kind="step") == 5
        assert value(reg, "gangwatch_producer_records_total", kind="heartbeat") == 1
        assert value(reg, "gangwatch_producer_records_total", kind="job") is None  # rank 3 does not announce
        assert value(reg, "gangwatch_producer_sent_messages_total") == send.sent == 1
        assert value(reg, "gangwatch_producer_sent_records_total") == 6
        assert value(reg, "gangwatch_trainer_last_step") == 4
        assert value(reg, "gangwatch_trainer_info", job_id="j7", rank="3", local_rank="1", node="n2") == 1

        send.up = False  # the broker goes away: the next flush spools
        client.step(5)
        client.flush()
        assert value(reg, "gangwatch_producer_send_failures_total") == 1
        assert value(reg, "gangwatch_producer_spool_bytes") > 0
        assert value(reg, "gangwatch_producer_dropped_records_total") == 0
    finally:
        client.close()
    assert value(scrape(), "gangwatch_trainer_info", job_id="j7", rank="3", local_rank="1", node="n2") is None


def test_a_live_agent_reports_polls_per_collector_and_its_outbox(tmp_path):
    (tmp_path / "kern.log").write_text("")
    kafka = FakeKafka()
    agent = Agent(settings(tmp_path, gpu_every_s=0.05), send=kafka, nvml=lambda: FakeNvml([{"temp_c": 40.0}] * 2))
    agent.listener.connect_timeout_s = 0.1  # no broker in a unit test: the listener just keeps trying
    reg = scrape((agent, agent_metric_samples))
    runner = threading.Thread(target=agent.run, kwargs={"close_timeout_s": 4.0})
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while (value(reg, "gangwatch_producer_records_total", kind="gpu") or 0) < 4:
            assert time.monotonic() < deadline, generate_latest(reg).decode()
            time.sleep(0.02)
        assert value(reg, "gangwatch_agent_polls_total", collector="GPU samples") >= 2
        assert value(reg, "gangwatch_agent_polls_total", collector="kernel log") >= 1
        assert value(reg, "gangwatch_agent_poll_failures_total", collector="GPU samples") == 0
        assert value(reg, "gangwatch_agent_info", node="n9") == 1
        assert value(reg, "gangwatch_producer_queue_depth", queue="outbox") is not None
    finally:
        agent.stop()
        runner.join(10)
    assert not runner.is_alive()
    assert value(reg, "gangwatch_producer_sent_records_total") == sum(r.kind == "gpu" for _, _, r in kafka.records())


def test_samples_of_several_objects_add_up_and_a_broken_reader_does_not_fail_the_scrape(caplog):
    class Thing:
        pass

    def broken(_obj):
        raise RuntimeError("boom")

    a, b, c = Thing(), Thing(), Thing()
    reg = scrape((a, lambda _: [(pm.DROPPED, (), 2)]), (b, lambda _: [(pm.DROPPED, (), 3)]), (c, broken))
    assert value(reg, "gangwatch_producer_dropped_records_total") == 5
    assert "boom" in caplog.text


def test_the_port_variable(caplog):
    assert pm.port_from_env({}) == 0
    assert pm.port_from_env({"GANGWATCH_METRICS_PORT": " 9470 "}) == 9470
    assert pm.port_from_env({"GANGWATCH_METRICS_PORT": "ninety"}) == 0
    assert pm.port_from_env({"GANGWATCH_METRICS_PORT": "70000"}) == 0
    assert caplog.text.count("GANGWATCH_METRICS_PORT") == 2


OPTIONAL = """
import logging, sys
sys.modules["prometheus_client"] = None  # as if it were not installed: importing it raises ImportError
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from gangwatch.producers.trainer import TrainerClient
client = TrainerClient(job="j1", send=lambda t, k, v: None, background=False, exit_hooks=False,
                       spool_dir=sys.argv[1])
client.step(0)
client.flush()
client.close()
print("trained on")
"""


def test_the_trainer_client_never_needs_prometheus_client(tmp_path):
    """Importing the trainer client does not import it; asked for a port without it: one log line, training goes on."""
    probe = ("import sys; import gangwatch.producers.trainer, gangwatch.producers.agent; "
             "print('prometheus_client' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip() == "False"
    env = {"GANGWATCH_METRICS_PORT": "9470", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", OPTIONAL, str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "trained on", done.stderr
    said = [line for line in done.stderr.splitlines() if "metrics" in line]
    assert said == ["WARNING gangwatch: trainer client of rank 0: no metrics endpoint: prometheus-client is not "
                    "installed (pip install prometheus-client)"]


# --- a metrics port another process holds -------------------------------------------------------------


@pytest.fixture
def taken_port():
    """A port another process (here: a socket of the test) already listens on, as a second worker or agent finds
    the first one's 9464 / 9465."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("0.0.0.0", 0))
    sock.listen(1)
    yield sock.getsockname()[1]
    sock.close()


def _scrapes(port: int) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.status == 200 and b"gangwatch_" in r.read()


def test_a_worker_whose_metrics_port_is_taken_serves_on_a_free_one_and_says_which(taken_port, caplog):
    from gangwatch.streams.metrics import serve_metrics

    endpoint = serve_metrics(WorkerMetrics(CollectorRegistry()), taken_port)
    try:
        assert endpoint.port not in (0, taken_port) and _scrapes(endpoint.port)
        [line] = [r.getMessage() for r in caplog.records if "taken" in r.getMessage()]
        assert f"metrics port {taken_port} is taken" in line and f"on port {endpoint.port} instead" in line
        assert "--metrics-port" in line and "GANGWATCH_METRICS_PORT" in line
    finally:
        endpoint.close()


def test_an_agent_whose_metrics_port_is_taken_serves_on_a_free_one_and_says_which(tmp_path, taken_port, caplog):
    """A second agent on one host (its default 9465 held by the first) runs, with its metrics on a free port."""
    (tmp_path / "kern.log").write_text("")
    agent = Agent(settings(tmp_path, gpu_every_s=0, metrics_port=taken_port), send=FakeKafka(),
                  nvml=lambda: FakeNvml([]))
    agent.listener.connect_timeout_s = 0.1
    runner = threading.Thread(target=agent.run, kwargs={"close_timeout_s": 2.0})
    pm.stop()
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while pm._endpoint is None:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.02)
        port = pm._endpoint.port
        assert port != taken_port and _scrapes(port)
        [line] = [r.getMessage() for r in caplog.records if "taken" in r.getMessage()]
        assert f"agent of node n9: metrics port {taken_port} is taken; serving metrics on port {port} instead" in line
        assert "--metrics-port" in line
    finally:
        agent.stop()
        runner.join(10)
        pm.stop()
    assert not runner.is_alive()


def test_a_metrics_port_that_cannot_be_served_at_all_is_one_line_naming_the_port_and_the_option():
    with pytest.raises(pm.MetricsUnavailable) as e:
        pm.serve(9464, CollectorRegistry(), addr="203.0.113.1")  # not this host's address: no port serves there
    assert "port 9464" in str(e.value) and "--metrics-port" in str(e.value) and "\n" not in str(e.value)
