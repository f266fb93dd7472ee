"""Triage of one job end to end over findings and records: incidents, stages, guards."""

from __future__ import annotations

import pytest
from gangwatch.detectors.failstop import FAIL_STOP, HeartbeatLoss
from gangwatch.detectors.hang import HANG, HangEvidence
from gangwatch.detectors.sdc import SDC_SUSPECT, NumericAnomaly, ReplicaMismatch
from gangwatch.detectors.stacks import STACK_OUTLIER, StackOutlier
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Job, Ops, RankInfo, Recovery, Step
from gangwatch.triage.budgets import Safety, TriageConfig
from gangwatch.triage.triage import Triage

pytestmark = pytest.mark.unit

T0 = 10_000.0


@pytest.fixture
def topo():
    ranks = [RankInfo(rank=n * 8 + g, node=f"n{n:03d}", gpu=g, tp=g, pp=n % 2, dp=n // 2)
             for n in range(16) for g in range(8)]
    return Topology.from_job(Job(ts=T0, job="j", ranks=ranks, heartbeat_s=5.0))


def lost(topo, node, ts, last_seen=None):
    seen = last_seen if last_seen is not None else ts - 15
    ranks = list(topo.node_ranks[node])
    return FAIL_STOP.finding(ts=ts, job="j", detector="failstop.heartbeat", key=(node, ts), node=node,
                             evidence=HeartbeatLoss(cause="heartbeat", ranks=ranks, node_ranks=len(ranks),
                                                    whole_node=True, first_silent_ts=seen, last_seen_ts=seen,
                                                    timeout_s=10.5))


def hang(ts, last_progress_ts=None, key=1):
    return HANG.finding(ts=ts, job="j", detector="hang.progress", key=key,
                        evidence=HangEvidence(last_step=5, last_progress_ts=last_progress_ts or ts - 20,
                                              threshold_s=20.0, baseline_s=1.0, lagging_ranks=[]))


def outlier(topo, ts, rank, snapshot="s1", cluster_size=1):
    return STACK_OUTLIER.finding(
        ts=ts, job="j", detector="stacks", key=(snapshot, rank), rank=rank, topo=topo,
        evidence=StackOutlier(snapshot=snapshot, cluster=1, cluster_size=cluster_size, dominant_size=100,
                              ranks_compared=128, stage=0, ranks_reported=128, node_suspects=1, frames=["f"],
                              missing_frames=[], top_frame="f"))


def run(tri, items):
    """Feed findings / records / ('advance', t) in order; collect outputs."""
    from gangwatch.schemas import Outputs

    out = Outputs()
    for it in items:
        if isinstance(it, tuple):
            out.extend(tri.advance(it[1]))
        elif it.kind == "finding":
            out.extend(tri.on_findings([it]))
        else:
            out.extend(tri.on_record(it))
    return out


def test_node_loss_replaces_the_node_and_recovery_closes_the_incident(topo):
    tri = Triage("j", TriageConfig(), topo)
    tri.on_record(Step(ts=T0 + 1, job="j", rank=0, step=100, step_s=1.0))
    f = lost(topo, "n003", T0 + 30)
    out = run(tri, [f, ("advance", T0 + 32)])
    assert out.actions == []  # still settling
    out = run(tri, [("advance", T0 + 36)])
    [a] = out.actions
    assert (a.type, a.nodes, a.path, a.evidence) == ("replace", ["n003"], "hot", [f.id])
    inc = out.incidents[-1]
    assert inc.cls == "fail_stop" and inc.culprit_nodes == ["n003"] and inc.decided_ts == T0 + 35
    assert inc.stage_s["detect"] == 15.0
    out = run(tri, [Recovery(ts=T0 + 80, job="j", action=a.id, phase="replaced"),
                    Recovery(ts=T0 + 150, job="j", action=a.id, phase="ckpt_loaded"),
                    Step(ts=T0 + 200, job="j", rank=0, step=101, step_s=1.0)])
    final = out.incidents[-1]
    assert final.recovered_ts == T0 + 200
    assert final.stage_s["replace"] == 45.0 and final.stage_s["rollback"] == 70.0
    assert final.stage_s["total"] == 200 - 15
    assert final.over_budget == []
    assert tri.incident is None


def test_over_budget_stages_are_listed(topo):
    tri = Triage("j", TriageConfig(), topo)
    f = lost(topo, "n003", T0 + 100, last_seen=T0)  # detected 100 s after onset: over the 60 s budget
    out = run(tri, [f, ("advance", T0 + 200)])
    [a] = out.actions
    out = run(tri, [Recovery(ts=T0 + 500, job="j", action=a.id, phase="replaced"),
                    Recovery(ts=T0 + 800, job="j", action=a.id, phase="resumed")])
    assert set(out.incidents[-1].over_budget) == {"detect", "replace", "total"}


def test_all_nodes_silent_at_once_escalates_never_evicts(topo):
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [lost(topo, n, T0 + 30 + i * 0.01) for i, n in enumerate(topo.nodes)] + [("advance", T0 + 60)])
    assert {a.type for a in out.actions} == {"escalate"}
    assert out.incidents[-1].evicted_nodes == []


def test_same_findings_give_same_action_ids(topo):
    ids = []
    for _ in range(2):
        tri = Triage("j", TriageConfig(), topo)
        ids.append([a.id for a in run(tri, [lost(topo, "n001", T0 + 30), ("advance", T0 + 60)]).actions])
    assert ids[0] == ids[1] and len(ids[0]) == 1


def test_planned_stop_is_planned_and_evicts_nobody(topo):
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [Ops(ts=T0, type="maintenance", job="j", node="n005", planned=True),
                    lost(topo, "n005", T0 + 60), ("advance", T0 + 100)])
    assert out.actions == []
    assert out.incidents[-1].cls == "planned" and out.incidents[-1].planned


def test_a_stall_during_a_planned_stop_sweeps_no_stacks(topo):
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [Ops(ts=T0, type="maintenance", job="j", planned=True), hang(T0 + 60), ("advance", T0 + 200)])
    assert out.actions == [] and out.incidents[-1].cls == "planned"


def test_hang_asks_for_stacks_then_replaces_the_outlier_node(topo):
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [hang(T0 + 40, last_progress_ts=T0 + 20)])
    assert [a.type for a in out.actions] == ["collect_stacks"]
    assert out.actions[0].reason == "no step progress for 20.0 s after step 5: sweep stacks and flight-recorder dumps"
    out = run(tri, [outlier(topo, T0 + 70, 45), ("advance", T0 + 200)])
    [a] = out.actions
    assert (a.type, a.nodes) == ("replace", ["n005"])
    inc = out.incidents[-1]
    assert inc.cls == "hang" and inc.onset_ts == T0 + 20 and inc.localized_ts is not None


def _outliers(tri, topo, ranks):
    return run(tri, [hang(T0 + 40)] + [outlier(topo, T0 + 70, r) for r in ranks] + [("advance", T0 + 200)])


def test_outliers_in_one_pipeline_evict_the_pipeline(topo):
    # rank 3 (n000: pp 0, dp 0) and rank 11 (n001: pp 1, dp 0) share tp 3 and dp 0: one pipeline, two nodes
    tri = Triage("j", TriageConfig(), topo)
    [a] = [a for a in _outliers(tri, topo, (3, 11)).actions if a.type != "collect_stacks"]
    assert (a.type, a.nodes) == ("evict_group", ["n000", "n001"])
    assert "pp group" in a.reason and "1 presumably healthy" in a.reason


def test_outliers_without_a_small_common_group_evict_just_their_nodes(topo):
    # ranks 3 (n000) and 19 (n002) share only their DP group, which spans the 8 nodes of stage 0
    tri = Triage("j", TriageConfig(), topo)
    [a] = [a for a in _outliers(tri, topo, (3, 19)).actions if a.type != "collect_stacks"]
    assert (a.type, a.nodes) == ("evict_group", ["n000", "n002"])


def test_group_eviction_over_the_blast_radius_climbs_the_ladder_to_a_restart(topo):
    """The smallest group holding both suspects is over the blast radius: the ladder's next rung, a restart (with
    no ladder configured: a human, told why)."""
    tri = Triage("j", TriageConfig(safety=Safety(max_evict_nodes=1)), topo)
    [a] = [a for a in _outliers(tri, topo, (3, 11)).actions if a.type != "collect_stacks"]
    assert (a.type, a.nodes, a.path) == ("requeue", [], "cold") and "escalation ladder" in a.reason
    rungs = tri.incident.rungs
    assert [(r["rung"], r["outcome"]) for r in rungs] == [("group", "refused by the blast-radius guard"),
                                                           ("restart", "restarted, watching")]
    tri = Triage("j", TriageConfig(safety=Safety(max_evict_nodes=1), ladder=()), topo)
    [a] = [a for a in _outliers(tri, topo, (3, 11)).actions if a.type != "collect_stacks"]
    assert a.type == "escalate" and "blast-radius" in a.reason


def test_a_job_wide_stall_with_no_culprit_pages_only_once_it_outlasts_its_budget(topo):
    """Every rank alike and the sweep names nobody: a stall, which waits for progress; a human is paged only if
    the job is still stalled `stall_budget_s` (300 s) after its onset, told how long."""
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [hang(T0 + 40), ("advance", T0 + 40 + 91)])
    assert [a.type for a in out.actions] == ["collect_stacks"] and out.incidents[-1].cls == "stall"
    out = run(tri, [("advance", T0 + 20 + 299)])
    assert out.actions == []
    out = run(tri, [("advance", T0 + 20 + 300)])
    [page] = out.actions
    assert page.type == "escalate" and "no step progress for 300 s" in page.reason and page.nodes == []
    assert out.incidents[-1].cls == "stall" and out.incidents[-1].decided_ts == T0 + 320


@pytest.mark.parametrize("resumes_at", [T0 + 45, T0 + 200])
def test_a_stall_the_job_steps_out_of_closes_by_itself_with_no_page(topo, resumes_at):
    """A synchronous checkpoint or an evaluation pass the loop does not announce: before the decision (45 s) or
    after it became a stall (200 s), the job's next step closes the incident as self-resolved."""
    tri = Triage("j", TriageConfig(), topo)
    run(tri, [Step(ts=T0 + 19, job="j", rank=0, step=5, step_s=1.0)])
    out = run(tri, [hang(T0 + 40), ("advance", resumes_at - 1),
                    Step(ts=resumes_at, job="j", rank=0, step=6, step_s=1.0), ("advance", T0 + 1000)])
    assert [a.type for a in out.actions] == ["collect_stacks"]
    last = out.incidents[-1]
    assert last.recovered_ts == resumes_at and last.extra["resolution"] == "self_resolved" and tri.incident is None


def test_state_round_trip_mid_incident(topo):
    tri = Triage("j", TriageConfig(), topo)
    run(tri, [lost(topo, "n002", T0 + 30)])
    clone = Triage.from_state(tri.state(), TriageConfig(), topo)
    a = run(tri, [("advance", T0 + 60)])
    b = run(clone, [("advance", T0 + 60)])
    assert a.actions == b.actions and a.incidents == b.incidents and a.actions


def test_sdc_incident_waits_for_recovery_and_absorbs_later_numeric_corroboration(topo):
    tri = Triage("j", TriageConfig(), topo)
    digest = SDC_SUSPECT.finding(
        ts=T0 + 10, job="j", detector="sdc.digest", key=1, rank=42, topo=topo,
        evidence=ReplicaMismatch(step=50, digest="bad", majority_digest="good", shard=5, tp=2, pp=1, replicas=8,
                                 agree=7, minority_ranks=[42]))
    out = run(tri, [Step(ts=T0 + 9, job="j", rank=0, step=50, step_s=1.0), digest, ("advance", T0 + 20)])
    assert [a.type for a in out.actions] == ["rollback", "isolate", "dual_run"]
    rollback = out.actions[0]
    # the job keeps stepping (the controller has not acted yet): that is not a recovery
    out = run(tri, [Step(ts=T0 + 30, job="j", rank=0, step=70, step_s=1.0)])
    assert out.incidents == [] and tri.waiting
    numeric = SDC_SUSPECT.finding(
        ts=T0 + 90, job="j", detector="sdc.numeric", key=2,
        evidence=NumericAnomaly(metric="grad_norm", value=30.0, baseline=1.0, z=200.0, ratio=30.0, step=130,
                                nonfinite=False, ranks_nonfinite=0))
    out = run(tri, [numeric, ("advance", T0 + 200)])
    assert out.actions == []  # no second incident, no second rollback
    assert numeric.id in out.incidents[-1].extra["findings"]
    out = run(tri, [Recovery(ts=T0 + 300, job="j", action=rollback.id, phase="ckpt_loaded"),
                    Recovery(ts=T0 + 400, job="j", action=rollback.id, phase="resumed")])
    assert out.incidents[-1].recovered_ts == T0 + 400 and tri.waiting[0].awaiting["kind"] == "dual_run"
    out = run(tri, [("advance", T0 + 20 + 900)])  # the dual run it asked for never answered: a human, and done
    assert [a.type for a in out.actions] == ["escalate"] and tri.waiting == []


def monitoring_gap(topo, ts):
    from gangwatch.detectors.failstop import MONITORING_GAP, MonitoringGap

    return MONITORING_GAP.finding(
        ts=ts, job="j", detector="failstop.heartbeat", key=("job", ts), score=1.0,
        evidence=MonitoringGap(cause="heartbeat", silent_ranks=topo.size, job_ranks=topo.size,
                               silent_nodes=len(topo.nodes), first_silent_ts=ts - 11, last_seen_ts=ts - 11,
                               timeout_s=10.5))


def sdc_decided(tri, topo):
    digest = SDC_SUSPECT.finding(
        ts=T0 + 10, job="j", detector="sdc.digest", key=1, rank=42, topo=topo,
        evidence=ReplicaMismatch(step=50, digest="bad", majority_digest="good", shard=5, tp=2, pp=1, replicas=8,
                                 agree=7, minority_ranks=[42]))
    out = run(tri, [Step(ts=T0 + 9, job="j", rank=0, step=50, step_s=1.0), digest, ("advance", T0 + 20)])
    return out.actions[0]


@pytest.mark.parametrize("accepted", [True, False])
def test_the_controllers_own_restart_of_a_running_job_opens_no_second_incident(topo, accepted):
    """SDC decided while the job ran; the controller accepts the rollback and stops the job: the old run's silence
    (a monitoring gap) and stalled steps (a hang) belong to the restart, not to a new incident naming nobody. The new
    run is watched afresh: a monitoring gap after its job record opens an incident. Without the controller's word
    the same silence is news."""
    tri = Triage("j", TriageConfig(), topo)
    rollback = sdc_decided(tri, topo)
    items = [Recovery(ts=T0 + 40, job="j", action=rollback.id, phase="accepted")] if accepted else []
    items += [monitoring_gap(topo, T0 + 60), hang(T0 + 70, key=2), ("advance", T0 + 200)]
    out = run(tri, items)
    if not accepted:
        assert {i.cls for i in out.incidents} <= {"unknown", "hang"} and tri.incident is not None
        assert tri.incident.id != tri.waiting[0].id
        return
    assert out.actions == [] and tri.incident is None and tri.profiles.keys() == {"n005"}
    assert {i.id for i in out.incidents} == {tri.waiting[0].id}  # only the SDC incident, with the restart's evidence
    assert len(out.incidents[-1].extra["findings"]) == 3
    clone = Triage.from_state(tri.state(), TriageConfig(), topo)
    assert clone.restarting == tri.restarting
    new_run = Topology.from_job(Job(ts=T0 + 210, job="j", ranks=list(topo.ranks), heartbeat_s=5.0))
    tri.on_topology(new_run)
    out = run(tri, [monitoring_gap(new_run, T0 + 400), ("advance", T0 + 500)])
    assert [a.type for a in out.actions] == ["escalate"]  # the new run's own silence is news again


def test_a_restart_the_controller_never_finishes_stops_absorbing_after_the_total_budget(topo):
    tri = Triage("j", TriageConfig(), topo)
    rollback = sdc_decided(tri, topo)
    out = run(tri, [Recovery(ts=T0 + 40, job="j", action=rollback.id, phase="accepted"),
                    monitoring_gap(topo, T0 + 40 + 601), ("advance", T0 + 720)])  # (its page waits `late_s`)
    assert [a.type for a in out.actions] == ["escalate"]
