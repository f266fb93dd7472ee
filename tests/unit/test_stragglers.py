"""Triage of stragglers: the true cost of replacing one, several at once, corroboration by the node's hardware."""

from __future__ import annotations

import pytest
from gangwatch.detectors.failslow import FAIL_SLOW, HETEROGENEOUS, Heterogeneity, StragglerEvidence
from gangwatch.detectors.hardware import HW_FAULT, GpuCondition
from gangwatch.detectors.linkerrors import LINK_ERRORS, LinkErrorRate
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Job, Outputs, RankInfo
from gangwatch.triage.budgets import Safety, TriageConfig
from gangwatch.triage.decide import Situation, decide, straggler_plan
from gangwatch.triage.localize import Localization
from gangwatch.triage.triage import Triage

pytestmark = pytest.mark.unit

T0 = 10_000.0
HOLD = Safety().failslow_hold_s


@pytest.fixture
def topo():
    """16 nodes of 8 GPUs, two pipeline stages; nodes under leaf switches of four (sw00: n000-n003, ...)."""
    ranks = [RankInfo(rank=n * 8 + g, node=f"n{n:03d}", gpu=g, tp=g, pp=n % 2, dp=n // 2,
                      extra={"switch": f"sw{n // 4:02d}"}) for n in range(16) for g in range(8)]
    return Topology.from_job(Job(ts=T0, job="j", ranks=ranks, heartbeat_s=5.0))


def slow(topo, rank, ts, cost, floor=0.0, key=None):
    return FAIL_SLOW.finding(
        ts=ts, job="j", detector="failslow.compute", key=key or (rank, ts), rank=rank, topo=topo, score=6.0,
        evidence=StragglerEvidence(relative=6.0, individual=6.0, slowdown_frac=cost / 0.8, steps_flagged=3, window=10,
                                   step=int(ts - T0), pp=int(topo.pp[rank]), compute_s=1.0, stage_median_s=0.8,
                                   comm_wait_s=0.1, onset_ts=ts - 3, cost_frac=cost, floor_frac=floor,
                                   long_hits=3, long_window=30))


def throttle(node, gpu, ts, topo):
    return HW_FAULT.finding(ts=ts, job="j", detector="hardware.nvml", key=(node, gpu, ts), node=node, gpu=gpu,
                            topo=topo, rank=topo.rank_on(node, gpu),
                            evidence=GpuCondition(severity="degraded", source="nvml", code=None,
                                                  name="THROTTLE:hw_thermal", count=1, message="", temp_c=91.0,
                                                  sm_clock_mhz=1500.0))


def run(tri, items):
    out = Outputs()
    for it in items:
        out.extend(tri.advance(it[1]) if isinstance(it, tuple) else tri.on_findings([it]))
    return out


def latest(out):
    incs: dict[str, object] = {}
    for i in out.incidents:
        incs[i.id] = i
    return list(incs.values())


# --- the true cost ---------------------------------------------------------------------------------


def test_replacing_one_straggler_gains_only_down_to_the_next_slowest():
    assert [p.replace for p in straggler_plan([0.12], 0.0, 1800, 120)] == [True]  # 216 s saved > 120 s
    [keep] = straggler_plan([0.12], 0.10, 1800, 120)  # a rank 10 % slower anyway: only 2 % to gain
    assert not keep.replace and keep.gain_frac == pytest.approx(0.02) and keep.remaining_frac == 0.10
    # two equal stragglers: replacing one gains nothing, replacing both gains it all (270 s > 240 s)
    a, b = straggler_plan([0.15, 0.15], 0.0, 1800, 120)
    assert a.replace and b.replace and a.replacements == 2 and a.gain_frac == pytest.approx(0.15)
    a, b = straggler_plan([0.10, 0.10], 0.0, 1800, 120)  # 180 s < 240 s: keep both
    assert not a.replace and not b.replace and (a.gain_frac, a.replacements) == (0.0, 1)
    assert b.gain_frac == pytest.approx(0.10) and b.replacements == 2
    # a big one and a small one: replace the big one, keep the small one (it would add 1 % only)
    big, small = straggler_plan([0.20, 0.01], 0.0, 1800, 120)
    assert big.replace and big.remaining_frac == 0.01 and not small.replace
    assert small.gain_frac == pytest.approx(0.01) and small.replacements == 1
    assert straggler_plan([], 0.0, 1800, 120) == []


def test_the_reason_shows_the_gain_and_the_cost():
    loc = Localization(culprits=["n003"], confidence=0.7, per_node={"n003": 0.7})
    [d] = decide(Situation(cls="fail_slow", loc=loc, threshold=0.5, spares_left=None, slowdown_frac=0.12,
                           remaining_frac=0.10, summary="fail_slow"))
    assert d.type == "degrade" and d.path == "non_stop"
    assert "n003 makes each step 12.0% longer; replacing it leaves it 10.0% longer" in d.reason
    assert "~36 s saved over 1800 s against 1 replacement (120 s): keep running" in d.reason
    [d] = decide(Situation(cls="fail_slow", loc=loc, threshold=0.5, spares_left=None, slowdown_frac=0.12,
                           summary="fail_slow"))
    assert d.type == "replace" and "~216 s saved over 1800 s against 1 replacement (120 s): replace" in d.reason


def _het(topo, cost, incident_frac=0.10):
    return HETEROGENEOUS.finding(ts=T0 + 40, job="j", detector="failslow.heterogeneous", key=1, rank=21, topo=topo,
                                 score=60.0, evidence=Heterogeneity(ratio=2.35, cost_frac=cost, stage_spread_frac=0.01,
                                                                    steps=30, since_step=10, step=39, pp=0,
                                                                    incident_frac=incident_frac))


def test_a_heterogeneous_rank_costing_the_job_more_than_a_tenth_is_replaced_when_a_spare_exists(topo):
    """ByteDance's public straggler trace: one worker computing ~2.35x its stage peers from the start costs the
    job 55 % of its time: decided like a straggler, the figure in the reason."""
    out = run(Triage("j", TriageConfig(), topo), [_het(topo, 0.55), ("advance", T0 + 200)])
    [a] = out.actions
    assert (a.type, a.nodes) == ("replace", ["n002"]) and "55.0% longer" in a.reason
    assert out.incidents[-1].cls == "fail_slow" and out.incidents[-1].culprit_nodes == ["n002"]


def test_a_costly_heterogeneous_rank_with_no_spare_left_goes_to_a_human_with_its_cost(topo):
    out = run(Triage("j", TriageConfig(spares=0), topo), [_het(topo, 0.55), ("advance", T0 + 200)])
    [a] = out.actions
    assert (a.type, a.nodes) == ("escalate", ["n002"])
    assert "no spare left (pool: 0 warm spares left, of triage.spares): the job loses 55.0%" in a.reason


def test_a_heterogeneous_rank_is_reported_and_never_evicted(topo):
    tri = Triage("j", TriageConfig(), topo)
    het = HETEROGENEOUS.finding(ts=T0 + 40, job="j", detector="failslow.heterogeneous", key=1, rank=21, topo=topo,
                                score=6.0, evidence=Heterogeneity(ratio=1.15, cost_frac=0.1, stage_spread_frac=0.01,
                                                                  steps=30, since_step=10, step=39, pp=0))
    out = run(tri, [het, ("advance", T0 + 4000)])
    assert out.actions == [] and out.incidents == [] and tri.profiles["n002"].recent[-1]["type"] == "heterogeneous"


def test_a_straggler_over_a_heterogeneous_floor_is_kept(topo):
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [slow(topo, 21, T0 + 100, cost=0.12, floor=0.10), ("advance", T0 + 100 + HOLD)])
    [a] = out.actions
    assert (a.type, a.nodes) == ("degrade", ["n002"]) and "leaves it 10.0% longer" in a.reason


# --- several culprits at once -----------------------------------------------------------------------


def test_two_gpus_of_one_node_are_one_action(topo):
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [slow(topo, 41, T0 + 100, 0.15), slow(topo, 45, T0 + 102, 0.14), ("advance", T0 + 100 + HOLD)])
    [a] = out.actions
    assert (a.type, a.nodes) == ("replace", ["n005"])
    [inc] = latest(out)
    assert inc.culprit_nodes == ["n005"] and inc.evicted_nodes == ["n005"]


def test_nodes_under_one_switch_are_one_action(topo):
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [slow(topo, 9, T0 + 100, 0.15), slow(topo, 17, T0 + 105, 0.15), ("advance", T0 + 100 + HOLD)])
    [a] = out.actions
    assert (a.type, a.nodes) == ("replace", ["n001", "n002"]) and "under switch sw00" in a.reason
    [inc] = latest(out)
    assert inc.culprit_nodes == ["n001", "n002"]


def test_unrelated_stragglers_are_separate_incidents_planned_together(topo):
    """Three stragglers on three switches: three incidents, each with its own action; replacing only the
    slowest would gain little (the next is almost as slow), replacing all three pays for itself."""
    tri = Triage("j", TriageConfig(), topo)
    fs = [slow(topo, 1, T0 + 100, 0.20), slow(topo, 41, T0 + 104, 0.19), slow(topo, 89, T0 + 108, 0.18)]
    out = run(tri, [*fs, ("advance", T0 + 100 + HOLD)])
    assert sorted((a.type, tuple(a.nodes)) for a in out.actions) == [
        ("replace", ("n000",)), ("replace", ("n005",)), ("replace", ("n011",))]
    assert all("together with 2 other slow groups" in a.reason for a in out.actions)
    incs = latest(out)
    assert len(incs) == 3 and len({a.incident for a in out.actions}) == 3
    assert sorted(tuple(i.culprit_nodes) for i in incs) == [("n000",), ("n005",), ("n011",)]
    for inc in incs:  # each incident holds its own straggler's finding, and its own onset
        [f] = [f for f in fs if f.id in inc.extra["findings"]]
        assert inc.culprit_nodes == [f.node] and inc.onset_ts == f.evidence["onset_ts"]
    assert len(tri.waiting) == 3 and tri.incident is None


def test_the_blast_radius_guard_still_holds_for_several_stragglers(topo):
    tri = Triage("j", TriageConfig(safety=Safety(max_evict_nodes=2)), topo)
    fs = [slow(topo, 1, T0 + 100, 0.20), slow(topo, 41, T0 + 104, 0.20), slow(topo, 89, T0 + 108, 0.20)]
    out = run(tri, [*fs, ("advance", T0 + 100 + HOLD)])
    types = sorted(a.type for a in out.actions)
    assert types == ["escalate", "replace", "replace"]
    [esc] = [a for a in out.actions if a.type == "escalate"]
    assert "blast-radius guard" in esc.reason
    assert len({n for a in out.actions if a.type == "replace" for n in a.nodes}) == 2


def test_a_node_being_replaced_opens_nothing_more(topo):
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [slow(topo, 41, T0 + 100, 0.15), ("advance", T0 + 100 + HOLD)])
    assert [a.type for a in out.actions] == ["replace"]
    out = run(tri, [slow(topo, 41, T0 + 200, 0.25), ("advance", T0 + 400)])
    assert out.actions == [] and tri.incident is None


def test_a_kept_straggler_is_decided_again_only_when_it_got_much_worse(topo):
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [slow(topo, 41, T0 + 100, 0.04), ("advance", T0 + 100 + HOLD)])
    assert [a.type for a in out.actions] == ["degrade"] and tri.kept == {"n005": 0.04}
    out = run(tri, [slow(topo, 41, T0 + 300, 0.06), ("advance", T0 + 300 + HOLD)])  # 1.5 x: no flapping
    assert out.actions == []
    out = run(tri, [slow(topo, 41, T0 + 500, 0.12), ("advance", T0 + 500 + HOLD)])  # 3 x: decided again
    assert [(a.type, a.nodes) for a in out.actions] == [("replace", ["n005"])]


# --- corroborated by the node's hardware ---------------------------------------------------------------


def test_a_throttling_gpu_s_straggler_is_decided_without_the_full_hold(topo):
    tri = Triage("j", TriageConfig(), topo)
    hold = Safety().failslow_corroborated_hold_s
    hw = throttle("n005", 1, T0 + 95, topo)
    out = run(tri, [hw, slow(topo, 41, T0 + 100, 0.15), ("advance", T0 + 100 + hold - 1)])
    assert out.actions == []
    out = run(tri, [("advance", T0 + 100 + hold)])
    [a] = out.actions
    assert (a.type, a.nodes, a.ts) == ("replace", ["n005"], T0 + 100 + hold)
    [inc] = latest(out)
    assert hw.id in inc.extra["findings"] and inc.decided_ts - inc.detected_ts == hold


def test_hardware_news_after_the_straggler_also_shortens_the_hold(topo):
    tri = Triage("j", TriageConfig(), topo)
    link = LINK_ERRORS.finding(ts=T0 + 110, job="j", detector="linkerrors", key=1, node="n005", gpu=1, topo=topo,
                               rank=41, evidence=LinkErrorRate(counter="nvlink_crc", rate_per_s=500.0,
                                                               threshold_per_s=100.0, errors=5000, intervals_over=3,
                                                               window_intervals=5, onset_ts=T0 + 90,
                                                               counter_value=9000))
    out = run(tri, [slow(topo, 41, T0 + 100, 0.15), link, ("advance", T0 + 120)])
    assert [(a.type, a.ts) for a in out.actions] == [("replace", T0 + 120)]


def test_an_uncorroborated_straggler_waits_the_full_hold(topo):
    tri = Triage("j", TriageConfig(), topo)
    other = throttle("n009", 1, T0 + 95, topo)  # another node's throttling explains nothing here
    out = run(tri, [other, slow(topo, 41, T0 + 100, 0.15), ("advance", T0 + 100 + HOLD - 1)])
    assert out.actions == []
    assert [a.type for a in run(tri, [("advance", T0 + 100 + HOLD)]).actions] == ["replace"]


def test_a_corroborated_straggler_not_worth_replacing_yet_waits_for_the_rest_of_the_evidence(topo):
    """A throttling GPU may still be slowing down: keeping it running can wait for the full hold."""
    tri = Triage("j", TriageConfig(), topo)
    out = run(tri, [throttle("n005", 1, T0 + 95, topo), slow(topo, 41, T0 + 100, 0.02), ("advance", T0 + 120)])
    assert out.actions == []
    out = run(tri, [slow(topo, 41, T0 + 130, 0.12, key="again"), ("advance", T0 + 100 + HOLD)])
    [a] = out.actions
    assert (a.type, a.nodes) == ("replace", ["n005"]) and "12.0% longer" in a.reason


def test_state_round_trip_keeps_what_was_kept_and_what_is_being_replaced(topo):
    tri = Triage("j", TriageConfig(), topo)
    run(tri, [slow(topo, 41, T0 + 100, 0.04), slow(topo, 89, T0 + 100, 0.3), ("advance", T0 + 100 + HOLD)])
    clone = Triage.from_state(tri.state(), TriageConfig(), topo)
    assert clone.kept == tri.kept == {"n005": 0.04} and clone.replacing == tri.replacing == {"n011"}
