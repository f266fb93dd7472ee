"""The proof on a real job: a torchrun job on CPU, watched live, broken four ways, and put back by the controller.

Each test runs examples/tiny_job/train.py (4 ranks: nodes n1 and n2 with 2 ranks
each, spare n3) under `gangwatch controller`, with the worker on the real
broker writing to the ClickHouse server and one `gangwatch agent` per node
(tests/integration/livejob.py). A faulty run must be detected, localized to
n2 and decided; the controller must carry the decision out and the job train
on without n2 (the SDC run takes its actions through the signed webhook, the
others from the alert topic); the incident (gw_incidents FINAL) must show every stage within
its budget: detect < 60 s, localize < 5 min, replace and rollback < 2 min each,
total < 10 min. The five durations are printed (pytest -s shows them).

A decision is checked as soon as it is made, so a wrong one fails in about a
minute instead of at the recovery deadline. The healthy run lasts about 75 s
of training here (bench/bench_real_job.py runs it for 5 minutes) and is watched
for another 30 s after its clean end.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest
from gangwatch.streams.topics import TopicSettings, create_topics
from kafka.admin import KafkaAdminClient

from tests.integration.conftest import PARTITIONS
from tests.integration.kafkakit import caught_up
from tests.integration.livejob import CKPT_EVERY, Fault, LiveJob

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

STEPS = 5000  # more than any test needs: a faulty run is stopped by the test, not by its end
BUDGET_S = {"detect": 60.0, "localize": 300.0, "replace": 120.0, "rollback": 120.0, "total": 600.0}
DECIDED_WITHIN_S = 300.0  # from the start of everything to the decision
RECOVERED_WITHIN_S = 300.0  # from the decision to the first step of the restarted job, as gangwatch records it


@pytest.fixture
def live(kafka_bootstrap, topics, clickhouse_addr, unique, tmp_path):
    made: list[LiveJob] = []

    def start(fault: Fault | None, steps: int = STEPS, webhook: bool = False) -> LiveJob:
        job = LiveJob(kafka_bootstrap, topics, clickhouse_addr, tmp_path, job=unique, fault=fault, webhook=webhook)
        made.append(job)
        job.start(steps)
        return job

    yield start
    for job in made:
        job.stop()
        job.store._client.execute(f"DROP DATABASE IF EXISTS {unique}")


def decided(job: LiveJob, cls: str) -> dict:
    """The first incident of class `cls`, once it has a decision."""
    def found() -> list[dict]:
        return [i for i in job.incidents() if i["class"] == cls and i["decided_ts"] is not None]

    job.wait(lambda: bool(found()), DECIDED_WITHIN_S, f"a decided {cls} incident")
    return found()[0]


def recovered(job: LiveJob, cls: str, spare: str = "n3") -> dict:
    """Wait for the incident to close and the job to train on with `spare` for n2; check the stage budgets."""
    inc = job.wait_incident(cls, RECOVERED_WITHIN_S)
    stages = dict(zip(inc["stage_names"], inc["stage_seconds"], strict=True))
    print(f"\n{job.fault.kind}: five durations {job.stages(inc)}; all stages {stages}")
    assert inc["over_budget"] == [] and {"detect", "replace", "rollback", "total"} <= stages.keys()
    for stage, budget in BUDGET_S.items():
        assert stages.get(stage, 0.0) < budget, f"{stage} took {stages[stage]} s, over its {budget} s"
    assert job.nodes()["active"] == ["n1", spare] and job.nodes()["out"] == ["n2"]
    [loaded] = [m for m in job.milestones(1) if m["event"] == "ckpt_loaded"]
    job.wait(lambda: job.newest_checkpoint() > loaded["step"] + CKPT_EVERY, 120.0,
             "a checkpoint written by the restarted job")
    return inc


def nothing_else(job: LiveJob, inc: dict) -> None:
    """The fault's incident is the only one: the controller's own stop and restart of the job (the old run falling
    silent, its steps stalling) belongs to the incident it was carried out for, and opens no second one."""
    others = [i for i in job.incidents() if i["id"] != inc["id"]]
    assert others == [], [(i["class"], i["culprit_nodes"], i["onset_ts"] - inc["decided_ts"]) for i in others]


def node_actions(job: LiveJob) -> list[tuple[str, list[str]]]:
    return [(a["type"], a["nodes"]) for a in job.actions() if a["nodes"]]


def test_a_rank_killed_with_sigkill_is_a_fail_stop_of_its_node_and_the_job_resumes_on_the_spare(live):
    job = live(Fault("kill", step=60))
    inc = decided(job, "fail_stop")
    assert inc["culprit_nodes"] == ["n2"], job.findings()
    assert node_actions(job) == [("replace", ["n2"])]
    nothing_else(job, recovered(job, "fail_stop"))


def test_a_rank_hung_in_its_data_loader_is_found_in_real_stack_dumps_and_its_node_replaced(live):
    if not (shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()):
        pytest.fail("py-spy is not installed: the node agents cannot dump the hung job's stacks")
    job = live(Fault("hang", step=60))
    inc = decided(job, "hang")
    assert inc["culprit_nodes"] == ["n2"], job.findings()
    assert node_actions(job) == [("replace", ["n2"])]
    assert "collect_stacks" in {a["type"] for a in job.actions()}
    outliers = [f for f in job.findings() if f["type"] == "stack_outlier"]
    assert [(f["rank"], f["node"]) for f in outliers] == [(2, "n2")]
    frames = json.loads(outliers[0]["evidence"])["frames"]
    assert any("dataloader" in frame for frame in frames), frames  # py-spy saw the rank waiting on its loader
    nothing_else(job, recovered(job, "hang"))


def test_a_rank_made_30_percent_slower_is_a_straggler_on_its_node_and_nothing_else_is_flagged(live):
    job = live(Fault("slow", step=60))
    inc = decided(job, "fail_slow")
    assert inc["culprit_nodes"] == ["n2"]
    assert node_actions(job) == [("replace", ["n2"])]
    inc = recovered(job, "fail_slow")
    flagged = {(f["type"], f["node"]) for f in job.findings() if f["node"]}
    assert flagged == {("fail_slow", "n2")}, job.findings()
    assert node_actions(job) == [("replace", ["n2"])]
    nothing_else(job, inc)


def test_a_replica_with_perturbed_weights_is_rolled_back_before_the_corruption_and_its_node_isolated(live):
    job = live(Fault("sdc", step=45), webhook=True)  # a digest step (every 5): the corrupt update is voted on at once
    inc = decided(job, "sdc")
    assert inc["culprit_nodes"] == ["n2"], job.findings()
    suspects = [(f["rank"], f["node"]) for f in job.findings() if f["type"] == "sdc_suspect"]
    assert suspects == [(2, "n2")]
    assert {("rollback", ("n2",)), ("isolate", ("n2",))} <= {(t, tuple(n)) for t, n in node_actions(job)}
    inc = recovered(job, "sdc")
    [loaded] = [m for m in job.milestones(1) if m["event"] == "ckpt_loaded"]
    assert loaded["step"] < 45  # the checkpoint it went back to was written before the corrupt update
    nothing_else(job, inc)


# --- the healthy run: one job, two tests (while it trains; after its clean end) ----------------------


@pytest.fixture(scope="module")
def healthy(kafka_bootstrap, clickhouse_addr, tmp_path_factory):
    """A healthy job of 600 steps (about 75 s of training), run to its clean end and read by the worker."""
    name = f"t{uuid.uuid4().hex[:12]}"
    topics = TopicSettings(prefix=f"{name}.", partitions=PARTITIONS)
    create_topics(topics, kafka_bootstrap)
    job = LiveJob(kafka_bootstrap, topics, clickhouse_addr, tmp_path_factory.mktemp("healthy"), job=name)
    try:
        job.start(600)
        ended = job.run_to_end(400.0)
        job.wait(lambda: caught_up(job.bootstrap, job.job, topics.job_inputs), 60.0, "the worker to read it all")
        yield job, ended
    finally:
        job.stop()
        job.store._client.execute(f"DROP DATABASE IF EXISTS {name}")
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        admin.delete_topics([t for t in admin.list_topics() if t.startswith(name)])
        admin.close()


def loud(job: LiveJob, until: float = float("inf")) -> list[dict]:
    """Findings above precursor severity, actions and incidents (event time up to `until`): what a healthy job
    must never cause."""
    findings = [f for f in job.findings() if json.loads(f["evidence"]).get("severity") != "precursor"]
    return [r for r in findings + job.actions() + job.incidents() if r["ts"] <= until]


def test_a_healthy_run_raises_nothing_while_it_trains(healthy):
    job, ended = healthy
    assert [m["event"] for m in job.milestones(0)] == ["comm_ready", "step"]
    assert job.newest_checkpoint() == 600
    assert loud(job, until=ended) == []


def test_a_healthy_run_raises_nothing_after_its_clean_end(healthy):
    job, _ = healthy
    watch_until = time.monotonic() + 30.0  # past every detector timeout (hang: 20 s) on the worker's silence timer
    while time.monotonic() < watch_until:
        assert loud(job) == []
        time.sleep(1.0)
