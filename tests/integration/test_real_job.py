"""The proof on a real job: a torchrun job on CPU, watched live, broken four ways, and put back by the controller.

Each test runs examples/tiny_job/train.py (4 ranks: nodes n1 and n2 with 2 ranks
each, spare n3) under `gangwatch controller`, with the worker on the real
broker writing to the ClickHouse server and one `gangwatch agent` per node
(tests/integration/livejob.py). A faulty run must be detected, localized to
n2 and decided; the controller must carry the decision out and the job train
on without n2 (the SDC run, a replica corrupting every update from step 45 on,
is also confirmed by the controller's dual run: n2's digest differs from the
reference's; it takes its actions through the signed webhook, the
others from the alert topic); the incident (gw_incidents FINAL) must show every stage within
its budget: detect < 60 s, localize < 5 min, replace and rollback < 2 min each,
total < 10 min. The five durations are printed (pytest -s shows them). The kill runs twice: the ranks
sending to Kafka themselves, and handing their records to their node agents' relays (GANGWATCH_RELAY), as a
production deployment does.

A decision is checked as soon as it is made, so a wrong one fails in about a
minute instead of at the recovery deadline. The healthy run lasts about 75 s
of training here (bench/bench_real_job.py runs it for 5 minutes) and is watched
for another 30 s after its clean end.

The ordinary life of a real job (issue 23) must cost nobody a page, a node or a
restart: a job-wide pause of 45 s (announced or not), a user's stop and start
again under the same job id, a clean end with or without the controller. And
what is broken must be told apart from it: a code bug that crashes every
attempt is restarted at most twice and then paged naming its node, evicting
nothing; a rank that exits 0 alone while its peers train is its node's
failure; a node whose telemetry reaches the worker 12 s late during start-up
is evicted for nothing, so two nodes killed at once afterwards are both
replaced. Each asserts the exact pages (escalate), evictions and restarts,
then replays the telemetry the live run recorded (every input topic, through
replay's code, with the worker's settings) and asserts the same outcome. The slowest are marked `slow`.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.topic_admin import create_topics
from kafka.admin import KafkaAdminClient

from tests.helpers import need, need_module
from tests.integration.conftest import PARTITIONS
from tests.integration.kafkakit import caught_up
from tests.integration.livejob import CKPT_EVERY, Fault, LiveJob, Outcome

need_module("torch", "the live job is examples/tiny_job/train.py (the `torch` extra)")
pytestmark = pytest.mark.integration

STEPS = 5000  # more than any test needs: a faulty run is stopped by the test, not by its end
BUDGET_S = {"detect": 60.0, "localize": 300.0, "replace": 120.0, "rollback": 120.0, "total": 600.0}
REACHED_WITHIN_S = 600.0  # from the start of everything to the checkpoint before the fault's step
DECIDED_WITHIN_S = 300.0  # from there to the decision
RECOVERED_WITHIN_S = 300.0  # from the decision to the first step of the restarted job, as gangwatch records it


@pytest.fixture
def live(kafka_bootstrap, topics, clickhouse_addr, unique, tmp_path):
    made: list[LiveJob] = []

    def start(fault: Fault | None, steps: int = STEPS, webhook: bool = False, controller: bool = True,
              **layout) -> LiveJob:
        job = LiveJob(kafka_bootstrap, topics, clickhouse_addr, tmp_path, job=unique, fault=fault, webhook=webhook,
                      **layout)
        made.append(job)
        if controller:
            job.start(steps)
        else:
            job.start_watching()  # the test runs the job itself
        return job

    yield start
    for job in made:
        job.stop()
        job.store._client.execute(f"DROP DATABASE IF EXISTS {unique}")


def decided(job: LiveJob, cls: str) -> dict:
    """The first incident of class `cls`, once it has a decision: within `DECIDED_WITHIN_S` of the job's last
    checkpoint before its fault step (a loaded machine trains slower; how soon the fault was found is what the
    stage budgets hold, in `recovered`)."""
    def found() -> list[dict]:
        return [i for i in job.incidents() if i["class"] == cls and i["decided_ts"] is not None]

    near = job.fault.step - CKPT_EVERY  # the fault's step comes at most CKPT_EVERY steps after this checkpoint
    job.wait(lambda: job.newest_checkpoint() >= near or bool(found()), REACHED_WITHIN_S,
             f"the job to reach step {near} (its fault comes at step {job.fault.step})")
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


@pytest.mark.parametrize("relay", [False, True], ids=["direct", "relay"])
def test_a_rank_killed_with_sigkill_is_a_fail_stop_of_its_node_and_the_job_resumes_on_the_spare(live, relay):
    """Sent directly, and through the node agents' relays as in production: the killed rank's last records
    reach the worker either way, and the spare's agent carries the restarted ranks' records."""
    job = live(Fault("kill", step=60), relay=relay)
    inc = decided(job, "fail_stop")
    assert inc["culprit_nodes"] == ["n2"], job.findings()
    assert node_actions(job) == [("replace", ["n2"])]
    nothing_else(job, recovered(job, "fail_stop"))
    relayed = {node: job.relayed(node) for node in ("n1", "n2", "n3")}
    assert all(relayed.values()) if relay else not any(relayed.values()), relayed


def faulted_rank(job, node: str) -> int:
    """The global rank of `node`'s local rank 0 (where the tiny job puts a node's fault) in the first attempt:
    0 or 2, as torchrun's rendezvous ordered the nodes."""
    first = next(r for r in job.inputs() if r.kind == "job")
    return min(r.rank for r in first.ranks if r.node == node)


def test_a_rank_hung_in_its_data_loader_is_found_in_real_stack_dumps_and_its_node_replaced(live):
    need(shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists(),
         "py-spy is not installed (the `agent` extra): the node agents cannot dump the hung job's stacks")
    job = live(Fault("hang", step=60))
    inc = decided(job, "hang")
    assert inc["culprit_nodes"] == ["n2"], job.findings()
    assert node_actions(job) == [("replace", ["n2"])]
    assert "collect_stacks" in {a["type"] for a in job.actions()}
    outliers = [f for f in job.findings() if f["type"] == "stack_outlier"]
    assert [(f["rank"], f["node"]) for f in outliers] == [(faulted_rank(job, "n2"), "n2")]
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


def test_a_replica_with_perturbed_weights_is_rolled_back_before_the_corruption_and_its_node_isolated(live,
                                                                                                      fault_figures):
    started = time.monotonic()
    # corrupting under load from a digest step (every 5) on: the corrupt update is voted on at once (a one-off
    # corruption, which the dual run clears, is tests/integration/test_active_diagnosis.py's)
    job = live(Fault("sdc_load", step=45), webhook=True)
    inc = decided(job, "sdc")
    assert inc["culprit_nodes"] == ["n2"], job.findings()
    suspects = [(f["rank"], f["node"]) for f in job.findings() if f["type"] == "sdc_suspect"]
    assert suspects == [(faulted_rank(job, "n2"), "n2")]
    assert {("rollback", ("n2",)), ("isolate", ("n2",))} <= {(t, tuple(n)) for t, n in node_actions(job)}
    inc = recovered(job, "sdc")
    [loaded] = [m for m in job.milestones(1) if m["event"] == "ckpt_loaded"]
    assert loaded["step"] < 45  # the checkpoint it went back to was written before the corrupt update
    nothing_else(job, inc)
    job.wait(lambda: any(i.extra.get("resolution") == "confirmed" for i in job.incident_records()), 120.0,
             "the dual run's confirmation on the incident")
    [result] = [r for r in job.inputs() if r.kind == "recovery" and r.phase == "dual_run_result"]
    assert result.reference == "n1" and set(result.digests) == {"n1", "n2"}  # the spare runs the job: n1 is trusted
    assert result.digests["n1"] != result.digests["n2"]
    [record] = job.incident_records()
    assert record.culprit_nodes == ["n2"] and record.extra["proof"] == result.digests
    assert "readmit" not in {a["type"] for a in job.actions()} and job.nodes()["out"] == ["n2"]
    job.caught_up()
    same_when_replayed(job, job.outcome(), fault_figures, started)


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
    must never cause. (`job_state` findings are the job's life itself, no fault: detectors/life.py.)"""
    findings = [f for f in job.findings() if json.loads(f["evidence"]).get("severity") != "precursor"
                and f["type"] != "job_state"]
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


def test_a_healthy_run_replayed_gives_the_same_nothing(healthy):
    job, _ = healthy
    ended = [(r.rank, r.source) for r in job.inputs() if r.kind == "lifecycle" and r.event == "end"]
    assert ended == [(None, "controller")]  # the controller said the job's end
    live = job.outcome()
    assert live == NOTHING, (live, [(f["type"], f["rank"], f["evidence"]) for f in job.findings()])
    for order in ("event", "arrival"):  # replay = live in both orders
        replayed = job.replayed(order=order)
        assert replayed == NOTHING, (order, replayed, job.replayed_findings())


# --- the ordinary life of a real job, and what is broken in it (issue 23) ------------------------------------

NOTHING = Outcome(pages=(), evictions=(), restarts=(), incidents=(), others=())
QUIET_S = 25.0  # past every detector's timeout on the worker's silence timer (fail-stop 4.5 s, hang 20 s)


def quiet_for(job: LiveJob, seconds: float) -> None:
    """Watch the run for `seconds`: no action and no incident may appear meanwhile."""
    until = time.monotonic() + seconds

    def still_quiet() -> bool:
        assert job.actions() == [] and job.incidents() == [], job.outcome()
        return time.monotonic() >= until

    job.wait(still_quiet, seconds + 60.0, f"{seconds:g} s of quiet")


def lifecycle(recs: list, event: str) -> list:
    return [r for r in recs if r.kind == "lifecycle" and r.event == event]


def same_when_replayed(job: LiveJob, live: Outcome, figures, started: float, **more) -> None:
    """The live outcome, replayed from the recorded inputs sorted by event time and as their messages were sent
    (issue 42: replay = live in both orders); one row of the case's figures."""
    replayed, arrived = job.replayed(), job.replayed(order="arrival")
    row = {"pages": live.pages, "evictions": live.evictions, "restarts": live.restarts,
           "incidents": live.incidents, "wall_s": round(time.monotonic() - started, 1), **more}
    print(f"\nlive {row}\nreplayed {replayed}\nreplayed in arrival order {arrived}")
    for name, value in row.items():
        figures(name, value if isinstance(value, float) else str(value))
    figures("replay_same", replayed == live)
    figures("replay_same_arrival", arrived == live)
    assert replayed == live and arrived == live, (replayed, arrived)


def node_of(recs: list, rank: int) -> str:
    """The node `rank` runs on, as the newest `job` record says."""
    [*_, newest] = [r for r in recs if r.kind == "job"]
    return newest.ranks[rank].node


PAUSE_AT = 30


@pytest.mark.parametrize("kind", ["pause", pytest.param("pause_announced", marks=pytest.mark.slow)])
def test_a_job_wide_pause_of_45_s_pages_nobody_and_evicts_nobody(live, kind, fault_figures):
    started = time.monotonic()
    job = live(Fault(kind, step=PAUSE_AT), steps=PAUSE_AT + 30)
    job.run_to_end(400.0)
    job.caught_up()
    recs = job.inputs()
    first = {s.step: s.ts for s in recs if s.kind == "step" and s.rank == 0}
    assert first[PAUSE_AT] - first[PAUSE_AT - 1] >= 45.0  # the job did stop stepping for 45 s
    got = job.outcome()
    assert (got.pages, got.evictions, got.restarts) == ((), (), ()) and job.attempts() == 1
    if kind == "pause":  # unannounced: a stall of the whole job, nobody to blame; it closed by itself
        assert got.incidents == (("stall", ()),), job.findings()
        assert all(i["recovered_ts"] is not None for i in job.incidents())
        assert set(got.others) <= {"collect_stacks"}
    else:  # announced (client.pause): no hang at all
        assert got == NOTHING, job.findings()
        said = [r for r in lifecycle(recs, "pause") if abs(r.ts - first[PAUSE_AT - 1]) < 5.0]
        assert {r.rank for r in said} == {0, 1, 2, 3}  # every rank said it (rank 0 also at its checkpoints)
    same_when_replayed(job, got, fault_figures, started, pause_s=round(first[PAUSE_AT] - first[PAUSE_AT - 1], 1))


@pytest.mark.slow  # two launches of the job: about 4 minutes on 2 busy cores
def test_a_user_stop_and_a_start_again_with_the_same_job_id_is_nothing(live, fault_figures):
    started = time.monotonic()
    job = live(None, steps=60)
    job.wait(lambda: job.newest_checkpoint() >= 20, 300.0, "checkpoint 20")
    job.stop_controller()  # SIGTERM, as a user or a scheduler stops it

    def stopped() -> list:  # the ranks whose stop record is on the broker (a relay may deliver it after the exit)
        return sorted(r.rank for r in lifecycle(job.inputs(), "stop") if r.rank is not None)
    try:
        job.wait(lambda: stopped() == [0, 1, 2, 3], 60.0, "each rank's stop record")  # SIGTERM each
    except AssertionError:
        assert stopped() == [0, 1, 2, 3]  # (which rank's record never came)
        raise
    recs = job.inputs()
    assert [(r.reason, r.source) for r in lifecycle(recs, "stop") if r.rank is None] == [("user", "controller")]
    quiet_for(job, QUIET_S)  # silent on purpose, for longer than any detector waits
    job.start_controller(60)  # the same job id, state and checkpoints
    job.run_to_end(400.0)
    job.caught_up()
    [loaded] = [m for m in job.milestones(1) if m["event"] == "ckpt_loaded"]
    assert loaded["step"] >= 20 and job.attempts() == 2
    got = job.outcome()
    assert got == NOTHING, job.findings()
    same_when_replayed(job, got, fault_figures, started)


def test_a_job_run_by_torchrun_alone_to_its_clean_end_is_nothing(live, fault_figures):
    started = time.monotonic()
    job = live(None, controller=False)
    job.torchrun(40)
    quiet_for(job, QUIET_S)
    job.caught_up()
    exits = [r for r in job.inputs() if r.kind == "framework" and r.type == "exit"]
    assert sorted(r.rank for r in exits) == [0, 1, 2, 3]  # every rank said its clean exit; nobody said `end`
    got = job.outcome()
    assert got == NOTHING, job.findings()
    same_when_replayed(job, got, fault_figures, started)


CRASH_DECIDED_S = 120.0  # from a crash (the job's processes gone) to gangwatch's answer: a restart or a page


@pytest.mark.slow  # three launches of the job: about 6 minutes on 2 busy cores
def test_a_code_bug_crashing_every_attempt_is_restarted_twice_its_node_swapped_once_then_paged_naming_the_rank(
        live, fault_figures):
    """Issue 42: rank 2's code raises at step 25 in every attempt. Restarted in place twice; the failure stayed
    on its node, and a spare is free, so that node is swapped once (the one eviction: a test that costs one
    spare); the failure follows rank 2 onto the spare, so it is the code: one page naming the spare and the
    swap."""
    started = time.monotonic()
    job = live(Fault("raise", step=25, rank=2))  # a bug of rank 2's code, wherever it runs
    first_node = None
    answers = 0  # restarts, the swap and pages so far

    def answered(n: int) -> bool:
        got = job.outcome()
        # fails at once, not at the deadline: a code bug costs at most the one swap of the crashing rank's node
        assert len(got.evictions) <= 1 and all(e == ("replace", (first_node,)) for e in got.evictions), got
        return len(got.restarts) + len(got.evictions) + len(got.pages) >= n

    while True:  # each crash must be answered in time: a restart in place, the swap, or (at last) a page
        attempt = job.attempts()
        job.wait(lambda n=attempt: len(job.crashes(2)) >= n, 300.0, f"rank 2's crash in attempt {attempt - 1}")
        if first_node is None:  # where rank 2 first ran, by the first job record read back
            job.wait(lambda: any(r.kind == "job" for r in job.inputs()), 60.0, "the job record read back")
            first_node = node_of([r for r in job.inputs() if r.kind == "job"][:1], 2)
        job.wait(lambda n=answers + 1: answered(n), CRASH_DECIDED_S, f"an answer to crash {attempt}")
        answers += 1
        if job.outcome().pages or answers > 4:
            break
        job.wait(lambda n=attempt: job.attempts() > n, 60.0, "the controller's restart")
    paged = time.monotonic() - started
    quiet_s = time.monotonic() + QUIET_S
    job.wait(lambda: time.monotonic() >= quiet_s, QUIET_S + 60.0, "more actions after the page, if any")
    job.caught_up()
    recs = job.inputs()
    spare = node_of(recs, 2)
    got = job.outcome()
    assert spare != first_node, (first_node, spare)  # the swap moved rank 2 off its node
    assert got.evictions == (("replace", (first_node,)),) and got.pages == ((spare,),), (got, job.findings())
    assert len(got.restarts) == 2 and job.attempts() == 1 + len(got.restarts) + 1
    assert len(got.incidents) == 1, got.incidents  # every crash of the same bug is one incident
    [page] = job.query("SELECT reason FROM gw_actions FINAL WHERE type = 'escalate'")
    assert f"from {first_node} onto the spare {spare}" in page["reason"], page["reason"]
    crashes = job.crashes(2)
    assert len(crashes) == job.attempts() and len({r.message for r in crashes}) == 1
    same_when_replayed(job, got, fault_figures, started, paged_s=round(paged, 1), attempts=job.attempts())


def test_a_rank_that_exits_0_alone_while_its_peers_train_is_its_node_s_failure(live, fault_figures):
    started = time.monotonic()
    job = live(Fault("exit0", step=25))  # n2's first rank calls sys.exit(0)

    def named() -> list[dict]:
        return [i for i in job.incidents() if i["culprit_nodes"] == ["n2"] and i["decided_ts"] is not None]

    job.wait(lambda: bool(named()), DECIDED_WITHIN_S, "an incident naming n2, decided")
    decided_s = time.monotonic() - started
    acted = job.outcome()
    if acted.evictions or acted.restarts:  # carried out (n2 replaced, or the job restarted in place) ...
        job.wait(lambda: job.attempts() > 1, 60.0, "the controller's restart")
    job.stop_controller()  # ... and then stopped by its user: the case ends here
    job.caught_up()
    got = job.outcome()
    assert [c for _, c in got.incidents] == [("n2",)], (got, job.findings())
    assert {n for _, nodes in got.evictions for n in nodes} <= {"n2"}, got  # nobody else is taken out
    assert {n for nodes in got.pages for n in nodes} <= {"n2"}, got
    recs = job.inputs()
    exits = [r for r in recs if r.kind == "framework" and r.type == "exit" and r.ts < named()[0]["decided_ts"]]
    assert [(node_of(recs[:recs.index(r)], r.rank), r.extra.get("code")) for r in exits] == [("n2", 0)]
    same_when_replayed(job, got, fault_figures, started, decided_s=round(decided_s, 1))


LATE_S = 12.0  # how long n3's telemetry is held back during start-up: more than twice the fail-stop timeout (4.5 s)


def test_a_late_start_up_evicts_nobody_and_two_nodes_killed_at_once_are_both_replaced(live, fault_figures):
    """A loaded host at start-up, then a real double failure (issue 23's sixth case). Four nodes of one rank, two
    spares. n3's rank holds its telemetry back for 12 s after its first heartbeat (stamped on time, delivered
    late) and joins the first collective only then: the job has not stepped yet, n3 is silent and nobody else
    says it is lost, so nothing is evicted. At step 40, n2 and n4 are SIGKILLed at once: both are replaced by the
    spares, which this 4-node job's blast-radius budget allows (set to half its nodes here: 2 of 4; by default a
    quarter of the nodes, at least one) only because the late start-up took none of it."""
    started = time.monotonic()
    job = live(Fault("kill", step=40, node="n2,n4"), nodes=("n1", "n2", "n3", "n4"), spares=("n5", "n6"), nproc=1,
               fault_env={"FAULT_LATE_NODE": "n3", "FAULT_LATE_S": str(LATE_S)},
               worker_extra=("--set", "triage.safety.max_evict_frac=0.5"))
    inc = decided(job, "fail_stop")
    decided_s = time.monotonic() - started
    assert inc["culprit_nodes"] == ["n2", "n4"], job.findings()
    job.wait(lambda: job.attempts() > 1, 120.0, "the controller's restart on the spares")
    job.wait(lambda: bool(job.milestones(1)) and any(m["event"] == "step" for m in job.milestones(1)), 300.0,
             "the first step of the restarted job")
    job.stop_controller()  # the job trains on the spares; its user stops it here (the worker then reads it all)
    job.caught_up()
    recs = job.inputs()
    # n3's rank 2 was heard late indeed (its first record held back stamped up to a heartbeat period into the hold)
    assert max(job.delivery_delays(2)) >= LATE_S - 3.0
    first_step = min(r.ts for r in recs if r.kind == "step")
    late = [r for r in recs if r.kind == "heartbeat" and r.rank == 2 and r.ts < first_step]
    assert max(b.ts - a.ts for a, b in zip(late, late[1:], strict=False)) < 5.0  # ... and beat all along
    got = job.outcome()
    assert got.evictions == (("replace", ("n2", "n4")),) and got.pages == () and got.restarts == (), got
    assert got.incidents == (("fail_stop", ("n2", "n4")),), (got, job.findings())
    assert sorted(job.nodes()["out"]) == ["n2", "n4"]
    same_when_replayed(job, got, fault_figures, started, decided_s=round(decided_s, 1),
                       late_s=round(max(job.delivery_delays(2)), 1))


CLOCK_S = 30.0  # how far ahead n3's clock runs: six fail-stop timeouts (4.5 s at this job's heartbeat)


def test_a_node_whose_clock_runs_ahead_costs_no_machine_and_a_real_death_beside_it_only_the_dead_one(
        live, fault_figures):
    """Issue 34: three nodes of one rank; n3's NTP daemon died and its clock runs 30 s ahead, from the start (every
    record of its rank says so); at step 40 n2 is SIGKILLed. The job's time is its nodes', not n3's: nobody looks
    silent for it, n3 is named in one `clock_skew` (an operator's ticket), and only n2 is replaced. Replaying the
    recorded telemetry gives the same."""
    started = time.monotonic()
    job = live(Fault("kill", step=40, node="n2"), nodes=("n1", "n2", "n3"), spares=("n4",), nproc=1,
               fault_env={"FAULT_CLOCK_NODE": "n3", "FAULT_CLOCK_S": str(CLOCK_S)})
    inc = decided(job, "fail_stop")
    decided_s = time.monotonic() - started
    assert inc["culprit_nodes"] == ["n2"], job.findings()
    job.wait(lambda: job.attempts() > 1, 120.0, "the controller's restart on the spare")
    job.stop_controller()
    job.caught_up()
    found = job.findings()
    skews = [(f["node"], round(json.loads(f["evidence"])["offset_s"])) for f in found if f["type"] == "clock_skew"]
    assert skews and {n for n, _ in skews} == {"n3"} and all(abs(off - CLOCK_S) <= 2 for _, off in skews), found
    assert not [f for f in found if f["type"] in ("fail_stop", "telemetry_gap") and f["node"] in ("n1", "n3")], found
    got = job.outcome()
    assert got.evictions == (("replace", ("n2",)),) and got.pages == () and got.restarts == (), got
    same_when_replayed(job, got, fault_figures, started, decided_s=round(decided_s, 1))


STEP_S = 25.0  # how far n1's clock steps ahead mid-run: five fail-stop timeouts (4.5 s at this job's heartbeat)


def test_a_one_node_job_whose_clock_steps_ahead_mid_run_is_nothing_and_the_step_is_named(live, fault_figures):
    """Issue 42: a job of one node (two ranks), no peer to compare its clock with. 20 s after its ranks start, the
    node's wall clock steps 25 s ahead (an NTP step: every rank stamps its records with it); their monotonic clock
    does not, and their records carry both. Nobody looks silent, nobody is paged, the step is named once on n1,
    and replaying the recorded telemetry in either order gives the same (sorted by the stamped times, the
    controller's `end` comes 25 s before the node's last records: they are waited for)."""
    started = time.monotonic()
    job = live(None, steps=400, nodes=("n1",), spares=("n2",), nproc=2,
               fault_env={"FAULT_CLOCK_NODE": "n1", "FAULT_CLOCK_S": str(STEP_S), "FAULT_CLOCK_AFTER_S": "20"})
    job.run_to_end(400.0)
    job.caught_up()
    found = job.findings()
    steps = [(f["node"], json.loads(f["evidence"]).get("stepped_s")) for f in found if f["type"] == "clock_skew"]
    assert len(steps) == 1 and steps[0][0] == "n1" and abs(steps[0][1] - STEP_S) <= 1.0, found
    got = job.outcome()
    assert got == NOTHING, found
    same_when_replayed(job, got, fault_figures, started)
