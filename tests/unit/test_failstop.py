"""Fail-stop detector: start-up is not silence, silent nodes within 2 periods + 1 s, a silent job is the
monitoring path's, crashes and clean exits, event-time determinism; start-up and monitoring findings
through triage end to end."""

from __future__ import annotations

import pytest
from gangwatch.detectors.catalog import typed
from gangwatch.detectors.failstop import FailStopDetector
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Framework, Heartbeat, Job, Lifecycle, Outputs, RankInfo, Step
from gangwatch.triage.core import Core

from tests.helpers import drive

pytestmark = pytest.mark.unit

T0 = 1_000.0
HB = 5.0
INF = float("inf")


def job(nodes=4, per_node=8, ts=T0, first_node=0) -> Job:
    ranks = [RankInfo(rank=n * per_node + g, node=f"n{first_node + n:03d}", gpu=g)
             for n in range(nodes) for g in range(per_node)]
    return Job(ts=ts, job="j", ranks=ranks, heartbeat_s=HB)


def topo(**kw) -> Topology:
    return Topology.from_job(job(**kw))


def beats(t: Topology, until: float, dead_nodes=(), dead_at=INF, up=None, start=T0, steps=False):
    """Every rank's heartbeats each period, staggered, from `start` (or from `up[rank]`, when it is up)
    until `until`; the ranks of `dead_nodes` stop at `dead_at`. With `steps`, a step record per beat too;
    without, one with each rank's first beat (start-up is over: silence is news from then on)."""
    out, k, stepped = [], 0, set()
    while start + k * HB <= until:
        for r in t.ranks:
            ts = start + k * HB + (r.rank * 0.37) % HB
            if ts > until or (r.node in dead_nodes and ts >= dead_at) or (up and ts < up.get(r.rank, INF)):
                continue
            out.append(Heartbeat(ts=ts, job="j", rank=r.rank))
            if steps or r.rank not in stepped:
                out.append(Step(ts=ts, job="j", rank=r.rank, step=k, step_s=1.0))
                stepped.add(r.rank)
        k += 1
    return sorted(out, key=lambda h: h.ts)


def last_beat(recs, t: Topology, node: str) -> float:
    return max(r.ts for r in recs if t.node_of(r.rank) == node)


# --- silence ------------------------------------------------------------------------------------


def test_silent_node_is_one_finding_within_two_periods_and_a_second():
    t = topo()
    recs = beats(t, T0 + 120, dead_nodes={"n002"}, dead_at=T0 + 50)
    [f] = drive(FailStopDetector(t), recs)
    assert (f.type, f.node, f.evidence["ranks"], f.evidence["whole_node"]) == ("fail_stop", "n002", list(range(16, 24)),
                                                                             True)
    latency = f.ts - last_beat(recs, t, "n002")
    assert f.evidence["last_seen_ts"] == last_beat(recs, t, "n002")
    assert 2 * HB < latency <= 2 * HB + 1.0  # one lost heartbeat is forgiven; the second is not


def test_late_and_lost_heartbeats_are_forgiven():
    t = topo()
    recs = [h for h in beats(t, T0 + 600) if not (h.rank == 3 and T0 + 100 < h.ts < T0 + 106)]  # one lost
    # a GC pause holds a heartbeat back by most of a period
    recs = sorted((Heartbeat(ts=h.ts + 4.0, job="j", rank=h.rank) if h.rank == 9 and T0 + 200 < h.ts < T0 + 206
                   else h for h in recs), key=lambda h: h.ts)
    assert drive(FailStopDetector(t), recs, tail=0.9) == []


def test_partial_node_reported_after_grace():
    t = topo(nodes=2, per_node=4)
    recs = [h for h in beats(t, T0 + 100) if not (h.rank == 5 and h.ts > T0 + 30)]
    found = drive(FailStopDetector(t), recs)
    assert [(f.node, f.evidence["ranks"], f.rank) for f in found] == [("n001", [5], 5)]
    assert not found[0].evidence["whole_node"]
    last = max(h.ts for h in recs if h.rank == 5)
    assert 3 * HB < found[0].ts - last <= 3 * HB + 1.5  # two periods + one of grace for its siblings


def test_findings_do_not_depend_on_advance_cadence():
    t = topo()
    recs = beats(t, T0 + 200, dead_nodes={"n001", "n003"}, dead_at=T0 + 70)
    a = drive(FailStopDetector(t), recs)
    det = FailStopDetector(t)
    b = []
    for i, rec in enumerate(recs):
        if i % 37 == 0:
            b += det.advance(rec.ts)
        b += det.observe(rec)
    b += det.advance(recs[-1].ts)
    assert a == b and len(a) == 2


def test_rank_that_comes_back_is_rearmed():
    t = topo(nodes=2, per_node=2)
    det = FailStopDetector(t)
    recs = [h for h in beats(t, T0 + 200) if not (h.rank == 3 and T0 + 30 < h.ts < T0 + 80)]
    found = drive(det, recs)
    assert [f.evidence["ranks"] for f in found] == [[3]]  # the outage
    found2 = drive(det, [h for h in beats(t, T0 + 300) if h.ts > T0 + 200 and not (h.rank == 3 and h.ts > T0 + 250)])
    assert len(found2) == 1 and found2[0].id != found[0].id  # a second, distinct outage


# --- start-up -------------------------------------------------------------------------------------


def test_ranks_appearing_minutes_after_the_job_record_are_not_silent():
    t = topo()
    up = {r: T0 + 30.0 + 8.0 * r for r in range(t.size)}  # the last one after more than four minutes
    assert drive(FailStopDetector(t), beats(t, T0 + 900, up=up)) == []


def test_rank_that_never_appears_gets_one_start_timeout_and_no_fail_stop():
    t = topo()
    recs = [h for h in beats(t, T0 + 1200) if h.rank != 13]
    det = FailStopDetector(t)
    assert drive(det, [h for h in recs if h.ts < T0 + 599]) == []  # not before the deadline
    [f] = drive(det, [h for h in recs if h.ts >= T0 + 599])
    assert (f.type, f.detector, f.node, f.rank) == ("start_timeout", "failstop.start", "n001", None)
    assert f.evidence["ranks"] == [13] and f.evidence["nodes"] == ["n001"] and f.evidence["job_ranks"] == 32
    assert T0 + 600 <= f.ts <= T0 + 600.5


def test_start_timeout_names_every_missing_rank_and_node_once():
    t = topo()
    missing = {3, *range(16, 24)}
    det = FailStopDetector(t)
    found = drive(det, [h for h in beats(t, T0 + 2000) if h.rank not in missing])
    assert [f.type for f in found] == ["start_timeout"]  # once, though the ranks stay missing for 1,400 s more
    f = found[0]
    assert f.evidence["ranks"] == sorted(missing) and f.evidence["nodes"] == ["n000", "n002"] and f.node is None


def test_a_restart_starts_up_again():
    t = topo()
    det = FailStopDetector(t)
    assert drive(det, beats(t, T0 + 100)) == []
    t1 = T0 + 130.0  # the job restarts on other nodes: the ranks take minutes to come up again
    moved = Topology.from_job(job(ts=t1, first_node=4))
    det.set_topology(moved)
    up = {r: t1 + 120.0 for r in range(moved.size) if r != 30}  # rank 30 never comes back
    found = drive(det, beats(moved, t1 + 800, up=up, start=t1))
    assert [(f.type, f.evidence["ranks"], f.evidence["nodes"]) for f in found] == [("start_timeout", [30], ["n007"])]
    assert t1 + 600 <= found[0].ts <= t1 + 600.5


def test_the_same_job_record_delivered_twice_forgets_nothing():
    t = topo()
    det = FailStopDetector(t)
    recs = beats(t, T0 + 200, dead_nodes={"n001"}, dead_at=T0 + 50)
    first = drive(det, [h for h in recs if h.ts < T0 + 100])
    det.set_topology(topo())  # the job record again (at-least-once delivery)
    assert len(first) == 1 and drive(det, [h for h in recs if h.ts >= T0 + 100]) == []


# --- the whole job silent -------------------------------------------------------------------------


def behind(recs, t: Topology, node: str, after: float) -> list:
    """`recs` without the step records of `node` from `after` on (its heartbeats go on): that node stopped
    finishing steps the others went on with."""
    return [r for r in recs if not (r.kind == "step" and t.node_of(r.rank) == node and r.ts >= after)]


@pytest.mark.parametrize("how", ["a node's steps behind", "one node"])
def test_whole_job_silent_at_once_but_not_at_one_step_is_one_monitoring_gap_not_node_faults(how):
    """The whole job falls silent, but not as a job ends: its ranks had not all finished the same step, or it is one
    node (whose silence is as much that node's death). No node is at fault: one job-level monitoring gap."""
    t = topo(nodes=1) if how == "one node" else topo()
    det = FailStopDetector(t)
    recs = beats(t, T0 + 100, steps=True)
    if how != "one node":
        recs = behind(recs, t, "n002", T0 + 80)
    found = drive(det, recs) + det.advance(T0 + 400)
    assert [(f.type, f.node, f.rank) for f in found] == [("monitoring_gap", None, None)]
    f = found[0]
    assert f.evidence["silent_ranks"] == t.size and f.evidence["silent_nodes"] == len(t.nodes)
    assert f.ts - recs[-1].ts <= 2 * HB + 1.0
    if how != "one node":  # the path comes back: watched again, and a node lost afterwards is a node fault again
        later = beats(t, T0 + 600, dead_nodes={"n003"}, dead_at=T0 + 550, start=T0 + 500)
        assert [(f.type, f.node) for f in drive(det, later)] == [("fail_stop", "n003")]


@pytest.mark.parametrize("nodes", [2, 4])
def test_a_job_whose_every_rank_stops_after_the_same_step_ended_and_says_so_once(nodes):
    """Telemetry that stops with every rank at the same step, as a job ends whose launcher reports nothing: the
    job's end (its life `finished`, said once, naming the step), no monitoring gap and no node fault; a rank heard
    again moves it back to running, and a node lost after that is a node fault again."""
    t = topo(nodes=nodes)
    det = FailStopDetector(t)
    recs = beats(t, T0 + 100 + HB - 0.01, steps=True)  # every rank's beats (steps) are staggered: its 21st the last
    found = drive(det, recs) + det.advance(T0 + 400)
    assert [(f.type, f.evidence.get("state")) for f in found] == [("silent_end", "finished")]
    [end] = found
    last_step = max(r.step for r in recs if r.kind == "step")
    assert end.evidence["step"] == last_step and end.evidence["ended_ranks"] == t.size and end.node is None
    assert end.ts - recs[-1].ts <= 2 * HB + 1.0
    assert typed(end).job_state == "finished" and typed(end).incident_class is None
    later = beats(t, T0 + 600, dead_nodes={t.nodes[-1]}, dead_at=T0 + 550, start=T0 + 500, steps=True)
    again = drive(det, later)
    assert [(f.type, f.evidence.get("state"), f.node) for f in again] == [
        ("silent_end", "running", None), ("fail_stop", None, t.nodes[-1])]


def _through_core(recs, until: float):
    """Records through `Core`, then event time on to `until` a second at a time, as the live worker's
    silence timer moves it when no record arrives."""
    core = Core()
    out = Outputs()
    for rec in recs:
        core.process(rec, out)
    now = recs[-1].ts
    while now < until:
        now = min(now + 1.0, until)
        core.advance(now, out)
    return out


@pytest.mark.parametrize("case", ["whole job silent", "rank never started"])
def test_job_level_findings_through_triage_escalate_and_never_evict(case):
    t = topo()
    if case == "whole job silent":  # one node behind in steps: no end; the steps stop, the hang detector fires too
        recs, until, want, why = behind(beats(t, T0 + 100, steps=True), t, "n002", T0 + 80), T0 + 400, \
            "monitoring_gap", "monitoring path"
    else:
        recs, until, want, why = [r for r in beats(t, T0 + 700, steps=True) if r.rank != 7], T0 + 700, \
            "start_timeout", "1 of 32 ranks never reported within 600.0 s of the job start (on n000)"
    out = _through_core([job(), *recs], until)
    assert want in [f.type for f in out.findings] and "fail_stop" not in [f.type for f in out.findings]
    assert [(a.type, a.nodes, a.path) for a in out.actions] == [("escalate", [], "manual")]
    assert why in out.actions[0].reason
    assert out.incidents[-1].cls in ("unknown", "hang") and out.incidents[-1].evicted_nodes == []


@pytest.mark.parametrize("said", ["exit 0", "nothing"])
def test_a_finished_job_through_triage_is_no_incident(said):
    """Every rank exits cleanly, or stops after the same step without a word: the steps stop (the hang detector
    says so) and the heartbeats too; no action, no incident, and the job's life ends `finished`."""
    t = topo()
    recs = beats(t, T0 + 300 + HB - 0.01, steps=True)  # every rank's last step the same
    if said == "exit 0":
        recs = sorted(recs + exits(t, T0 + 300.5, code=0), key=lambda r: r.ts)
    out = _through_core([job(), *recs], T0 + 900)
    assert "monitoring_gap" not in [f.type for f in out.findings] and out.actions == [] and out.incidents == []
    assert [typed(f).job_state for f in out.life][-1] == "finished"


def test_the_same_job_losing_one_node_through_triage_replaces_it():
    """The contrast to the test above: a node silent while the rest of the job stops with it (the gang waits in
    its collective: heartbeats go on, steps do not) is a node fault, found within two periods and a second."""
    t = topo()
    dead = T0 + 50
    recs = [r for r in beats(t, T0 + 100, dead_nodes={"n002"}, dead_at=dead, steps=True)
            if r.kind != "step" or r.ts < dead]
    out = _through_core([job(), *recs], T0 + 100)
    [f] = [f for f in out.findings if f.type != "hang"]  # (the stalled steps are a hang as well, later)
    assert (f.type, f.node) == ("fail_stop", "n002")
    assert f.ts - last_beat(recs, t, "n002") <= 2 * HB + 1.0
    assert [(a.type, a.nodes) for a in out.actions] == [("replace", ["n002"])]


def test_a_silent_node_the_gang_steps_on_without_is_a_telemetry_gap_unless_the_job_is_elastic():
    """A synchronous step cannot complete without every rank: peers that go on stepping after a node fell silent
    waited for it, so it lives and only its records are missing (one `telemetry_gap`, nothing evicted). A job
    whose record says it goes on without a rank (`elastic`) keeps the rule that silence is a death."""
    t = topo()
    recs = beats(t, T0 + 200, dead_nodes={"n002"}, dead_at=T0 + 50, steps=True)
    out = _through_core([job(), *recs], T0 + 200)
    assert [(f.type, f.node, f.evidence["cause"]) for f in out.findings] == [("telemetry_gap", "n002", "no records")]
    assert f"{len(t.node_ranks['n002'])} rank(s) of n002 sent nothing" in typed(out.findings[0]).describe
    assert out.actions == [] and out.incidents == []
    elastic = Job(ts=T0, job="j", ranks=job().ranks, heartbeat_s=HB, extra={"elastic": True})
    out = _through_core([elastic, *recs], T0 + 200)
    assert [(f.type, f.node) for f in out.findings] == [("fail_stop", "n002")]
    assert [(a.type, a.nodes) for a in out.actions] == [("replace", ["n002"])]


def test_a_node_the_gang_seemed_to_step_on_without_is_dead_once_its_peers_say_they_lost_it():
    """CI, a live torchrun job under load: n2's rank SIGKILLed before its last seconds of records were flushed, so
    its peers' last steps looked like steps taken without it (its telemetry gap, nothing evicted); then the peers
    raised "closed by peer". That report refutes the gang's evidence: the silent node is dead, and replaced."""
    t = topo()
    recs = beats(t, T0 + 65, dead_nodes={"n002"}, dead_at=T0 + 50, steps=True)  # n002's last records lost
    recs += [Framework(ts=T0 + 66 + 0.001 * r.rank, job="j", rank=r.rank, type="exception", message=PEER_GONE)
             for r in t.ranks if r.node != "n002"]
    out = _through_core([job(), *recs], T0 + 200)
    stops = [f for f in out.findings if f.type == "fail_stop"]
    assert [(f.node, f.evidence["cause"]) for f in stops] == [("n002", "heartbeat")]
    assert [(a.type, a.nodes) for a in out.actions] == [("replace", ["n002"])]
    quiet = _through_core([job(), *beats(t, T0 + 65, dead_nodes={"n002"}, dead_at=T0 + 50, steps=True)], T0 + 65)
    assert "fail_stop" not in [f.type for f in quiet.findings]  # no report: the gang's steps say it lived


def test_a_killed_node_is_the_culprit_not_the_peers_that_lost_it():
    """SIGKILL on n002's ranks: they say nothing, every other rank raises "connection closed by peer" and stops.
    The vanished node is replaced; the victims are named as consequences and evict nobody."""
    t = topo()
    kill = T0 + 50
    recs = beats(t, kill, dead_nodes={"n002"}, dead_at=kill, steps=True)
    recs += [Framework(ts=kill + 0.05 + 0.001 * r.rank, job="j", rank=r.rank, type="exception",
                       message="RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                       "[10.0.0.3]:40211. This may indicate a possible application crash on rank 0 or a network "
                       "set up issue.") for r in t.ranks if r.node != "n002"]
    out = _through_core([job(), *sorted(recs, key=lambda r: r.ts)], kill + 60)
    types = [(f.type, f.node) for f in out.findings]
    assert ("fail_stop", "n002") in types and "monitoring_gap" not in [f.type for f in out.findings]
    assert {n for ty, n in types if ty == "fail_stop"} == {"n002"}
    assert sum(ty == "peer_lost" for ty, _ in types) == 24
    assert [(a.type, a.nodes) for a in out.actions] == [("replace", ["n002"])]


PEER_GONE = ("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:40211. "
             "This may indicate a possible application crash on rank 0 or a network set up issue.")


@pytest.mark.parametrize("phase", [0.0, 0.3, 0.9])
def test_a_sibling_torn_down_after_reporting_the_loss_is_a_consequence_not_a_second_culprit(phase):
    """torchrun per node, SIGKILL on rank 2 (n001): its sibling is stopped without a word by n001's launcher;
    on n000 rank 0 raises "closed by peer" and its launcher stops rank 1 before rank 1 says anything. Only
    n001 vanished without a word; rank 1's silence is the teardown, whichever heartbeat came last."""
    t = topo(nodes=2, per_node=2)
    kill = T0 + 50
    recs = [h for h in beats(t, kill + phase * HB, steps=True)
            if not (t.node_of(h.rank) == "n001" and h.ts >= kill)]
    recs += [Framework(ts=kill + 0.05, job="j", rank=0, type="exception", message=PEER_GONE)]
    recs = [r for r in recs if not (r.rank == 1 and r.ts > kill + 0.1)]  # stopped by its launcher
    out = _through_core([job(nodes=2, per_node=2), *sorted(recs, key=lambda r: r.ts)], kill + 60)
    assert {(f.type, f.node) for f in out.findings if f.type == "fail_stop"} == {("fail_stop", "n001")}
    causes = sorted((f.rank, f.evidence["cause"]) for f in out.findings if f.type == "peer_lost")
    assert causes == [(0, "exception"), (1, "teardown")]
    assert [(a.type, a.nodes) for a in out.actions] == [("replace", ["n001"])]


def test_the_silent_sibling_of_a_reporter_is_the_culprit_when_every_other_node_spoke():
    """SIGKILL on rank 1 (n000): rank 0 beside it and both ranks of n001 raise "closed by peer". No node vanished
    without a word but n000's rank 1, so it is the culprit although its sibling reported the loss."""
    t = topo(nodes=2, per_node=2)
    kill = T0 + 50
    recs = [h for h in beats(t, kill, steps=True) if not (h.rank == 1 and h.ts >= kill - 2)]
    recs += [Framework(ts=kill + 0.05 + 0.01 * r, job="j", rank=r, type="exception", message=PEER_GONE)
             for r in (0, 2, 3)]
    out = _through_core([job(nodes=2, per_node=2), *sorted(recs, key=lambda r: r.ts)], kill + 60)
    assert [(f.type, f.node, f.rank) for f in out.findings if f.type == "fail_stop"] == [("fail_stop", "n000", 1)]
    assert [(a.type, a.nodes) for a in out.actions] == [("replace", ["n000"])]


def test_a_crash_of_its_own_is_not_a_peer_loss():
    t = topo(nodes=2, per_node=2)
    [f] = FailStopDetector(t).observe(Framework(ts=T0 + 3, job="j", rank=1, type="exception",
                                                message="RuntimeError: CUDA error: an illegal memory access"))
    assert (f.type, f.node) == ("fail_stop", "n000")


# --- processes ------------------------------------------------------------------------------------


def test_process_exit_is_immediate():
    t = topo(nodes=2, per_node=2)
    det = FailStopDetector(t)
    [f] = det.observe(Framework(ts=T0 + 3, job="j", rank=3, type="exit", message="exit code 1"))
    assert (f.type, f.node, f.rank, f.evidence["cause"]) == ("fail_stop", "n001", 3, "exit")
    assert det.observe(Framework(ts=T0 + 3, job="j", rank=3, type="nccl_timeout")) == []


def exits(t: Topology, ts: float, **extra):
    return [Framework(ts=ts + 0.01 * r, job="j", rank=r, type="exit", extra=extra) for r in range(t.size)]


def test_a_lone_clean_exit_while_the_job_trains_on_is_that_ranks_failure():
    t = topo(nodes=3, per_node=2)
    recs = beats(t, T0 + 200, steps=True)
    out = sorted(recs + [Framework(ts=T0 + 50.2, job="j", rank=3, type="exit", extra={"code": 0})], key=lambda r: r.ts)
    [f] = drive(FailStopDetector(t), [r for r in out if not (r.rank == 3 and r.ts > T0 + 50.2)])
    assert (f.type, f.rank, f.node, f.evidence["cause"]) == ("fail_stop", 3, "n001", "exit")
    assert "code 0" in f.evidence["message"] and T0 + 80 <= f.ts <= T0 + 81  # end_window_s (30 s) later


def test_a_clean_exit_its_peers_then_lose_is_that_ranks_failure_at_once():
    t = topo(nodes=3, per_node=2)
    recs = [r for r in beats(t, T0 + 50, steps=True)] + [
        Framework(ts=T0 + 50.2, job="j", rank=3, type="exit", extra={"code": 0}),
        Framework(ts=T0 + 50.3, job="j", rank=0, type="exception",
                  message="RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500")]
    found = drive(FailStopDetector(t), sorted(recs, key=lambda r: r.ts))
    assert [(f.type, f.rank, f.evidence["cause"]) for f in found] == [("fail_stop", 3, "exit"),
                                                                     ("peer_lost", 0, "exception")]
    assert found[0].ts == T0 + 50.3


def test_every_rank_exiting_cleanly_is_the_end_of_the_job():
    t = topo()
    recs = beats(t, T0 + 100) + exits(t, T0 + 100.5, code=0)
    assert drive(FailStopDetector(t), recs, tail=600.0) == []


def test_exits_without_a_clean_code_are_crashes_and_their_silence_is_no_news():
    t = topo()
    recs = beats(t, T0 + 100) + exits(t, T0 + 100.5, code=134)
    found = drive(FailStopDetector(t), recs, tail=600.0)
    assert {(f.type, f.detector) for f in found} == {("fail_stop", "failstop.process")} and len(found) == 32


def test_an_exited_rank_is_watched_again_only_as_a_new_process():
    t = topo(nodes=2, per_node=2)
    det = FailStopDetector(t)
    recs = beats(t, T0 + 50)
    drive(det, recs)
    det.observe(Framework(ts=T0 + 50.2, job="j", rank=3, type="exit", extra={"code": 0}))
    det.observe(Heartbeat(ts=T0 + 50.4, job="j", rank=3))  # its heartbeat thread's last word
    # its silence is no news, but leaving while the others train on is its failure (no heartbeat loss)
    left = drive(det, [h for h in beats(t, T0 + 120) if h.ts > T0 + 50 and h.rank != 3])
    assert [(f.type, f.evidence["cause"], f.evidence["ranks"]) for f in left] == [("fail_stop", "exit", [3])]
    det.observe(Heartbeat(ts=T0 + 130, job="j", rank=3))  # started again in place
    found = drive(det, [h for h in beats(t, T0 + 160) if h.ts > T0 + 130 and h.rank != 3])
    assert [(f.type, f.evidence["ranks"]) for f in found] == [("fail_stop", [3])]


# --- state ----------------------------------------------------------------------------------------


def test_state_round_trip_mid_stream():
    t = topo()
    recs = beats(t, T0 + 200, dead_nodes={"n000"}, dead_at=T0 + 100, up={r: T0 + 20 for r in range(32)})
    half = len(recs) // 2
    det = FailStopDetector(t)
    first = drive(det, recs[:half])
    clone = FailStopDetector.from_state(det.state(), t)
    assert drive(det, recs[half:]) == drive(clone, recs[half:])
    assert first == []


def test_new_topology_resets_ranks():
    t = topo(nodes=2, per_node=2)
    det = FailStopDetector(t)
    drive(det, beats(t, T0 + 20))
    det.set_topology(topo(nodes=3, per_node=2, ts=T0 + 30))
    assert det.last_seen.shape == (6,) and not det.status.any()


# --- the ordinary life of a job -------------------------------------------------------------------


def _no_steps(recs):
    return [r for r in recs if r.kind != "step"]


def test_before_the_first_step_a_silent_rank_is_held_to_the_start_deadline():
    """A heartbeat held back on a loaded host during start-up (imports, data loading) evicts nobody; the same
    silence after the first step is a fail-stop."""
    t = topo(nodes=3, per_node=2)
    recs = [r for r in _no_steps(beats(t, T0 + 300)) if not (r.rank == 4 and T0 + 40 < r.ts < T0 + 200)]
    assert drive(FailStopDetector(t), recs) == []
    stepping = [r for r in beats(t, T0 + 300) if not (r.rank == 4 and T0 + 40 < r.ts < T0 + 200)]
    assert [(f.type, f.evidence["ranks"]) for f in drive(FailStopDetector(t), stepping)] == [("fail_stop", [4])]


def test_a_rank_silent_through_start_up_is_reported_at_the_start_deadline_or_when_its_peers_lose_it():
    t = topo(nodes=3, per_node=2)
    silent = [r for r in _no_steps(beats(t, T0 + 700)) if not (r.rank == 4 and r.ts > T0 + 40)]
    [f] = drive(FailStopDetector(t), silent)
    assert (f.type, f.evidence["ranks"]) == ("fail_stop", [4]) and T0 + 600 <= f.ts <= T0 + 601
    lost = Framework(ts=T0 + 60.0, job="j", rank=0, type="exception", message="Connection reset by peer")
    found = drive(FailStopDetector(t), sorted([r for r in silent if r.ts < T0 + 100] + [lost], key=lambda r: r.ts))
    assert ("fail_stop", [4]) in [(f.type, f.evidence["ranks"]) for f in found]


@pytest.mark.parametrize("who", ["every rank", "the job"])
def test_a_job_stopped_on_purpose_falls_silent_with_no_finding(who):
    t = topo(nodes=3, per_node=2)
    recs = beats(t, T0 + 100, steps=True)
    if who == "every rank":  # each rank's SIGTERM handler said so
        recs += [Lifecycle(ts=T0 + 100.2 + 0.01 * r, job="j", rank=r, event="stop", reason="SIGTERM")
                 for r in range(t.size)]
    else:  # the launcher or controller said so
        recs.append(Lifecycle(ts=T0 + 100.2, job="j", event="stop", reason="user", source="controller"))
    assert drive(FailStopDetector(t), recs, tail=600.0) == []


def test_a_crashed_ranks_siblings_torn_down_by_their_launcher_are_no_node_fault():
    t = topo(nodes=3, per_node=2)
    recs = [r for r in beats(t, T0 + 100, steps=True) if not (r.rank in (2, 3) and r.ts > T0 + 50)]
    recs += [Framework(ts=T0 + 50.1, job="j", rank=2, type="exception", message="RuntimeError: bad batch")]
    found = drive(FailStopDetector(t), sorted(recs, key=lambda r: r.ts))
    assert [(f.type, f.rank, f.evidence["cause"]) for f in found] == [("fail_stop", 2, "exception"),
                                                                     ("peer_lost", 3, "teardown")]


def test_every_rank_exiting_cleanly_at_the_end_is_the_jobs_end_though_the_last_ones_see_their_peers_go():
    """An older client's torchrun trace: every rank exits with code 0 at the end of training (no `stop` record),
    and the ranks still in their last barrier lose the peers that left first: the job finished, nobody failed."""
    t = topo(nodes=3, per_node=2)
    end = T0 + 100
    recs = beats(t, end, steps=True) + [r for r in exits(t, end + 0.2, code=0) if r.rank < 4] + [
        Framework(ts=end + 0.3 + 0.01 * r, job="j", rank=r, type="exception",
                  message="RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer")
        for r in (4, 5)]
    recs.sort(key=lambda r: r.ts)
    found = drive(FailStopDetector(t), recs, tail=60.0)
    assert [f.type for f in found] == ["peer_lost", "peer_lost"]  # the last two saw the others go; no fail_stop
    out = _through_core([job(nodes=3, per_node=2), *recs], end + 60)
    assert "fail_stop" not in [f.type for f in out.findings] and out.actions == []


@pytest.mark.parametrize("peers_said", [True, False])
def test_a_rank_killed_in_the_last_seconds_of_a_trace_is_named_from_its_peers_reports(peers_said):
    """SIGKILL on n1 two seconds before the recording ends: its silence is not timed out yet, but its peers' errors
    name it (the rank that neither exited nor said anything); without them, the end of a file is no evidence."""
    t = topo(nodes=3, per_node=2)
    kill = T0 + 100
    recs = beats(t, kill, steps=True)
    if peers_said:
        recs += [Framework(ts=kill + 0.2 + 0.01 * r, job="j", rank=r, type="exception",
                           message="RuntimeError: Connection closed by peer") for r in (0, 1, 4, 5)]
    recs.sort(key=lambda r: r.ts)
    core = Core()
    out = Outputs()
    for r in [job(nodes=3, per_node=2), *recs]:
        core.process(r, out)
    out.extend(core.finish())
    stops = [(f.type, f.node) for f in out.findings if f.type == "fail_stop"]
    if peers_said:
        assert stops == [("fail_stop", "n001")]
        assert [(a.type, a.nodes) for a in out.actions] == [("replace", ["n001"])]  # decided at the end, as live
    else:
        assert stops == [] and out.actions == []


@pytest.mark.parametrize("held_s", [8.0, 40.0])  # its first held record comes 19 s or 51 s late
def test_a_report_of_silence_is_withdrawn_by_records_stamped_before_it_however_late_they_come(held_s):
    """n001's records from T0 + 50 are held up (a spool, a broker blip), then delivered after fail-stop reported
    the node silent: the first of them withdraws the report, however late it comes (more than a timeout late, its
    lateness is news of its own too, which must not swallow the withdrawal: it did, and the eviction it took was
    never given back)."""
    t = topo(nodes=2, per_node=2)
    recs = beats(t, T0 + 120)
    held = [r for r in recs if t.node_of(r.rank) == "n001" and T0 + 50 <= r.ts < T0 + 50 + 11.0 + held_s]
    det = FailStopDetector(t)
    found = drive(det, [r for r in recs if r not in held and r.ts < T0 + 50 + 11.0 + held_s])
    [silent] = [f for f in found if f.type == "fail_stop"]
    back = []
    for r in held:  # they arrive now, at the time the job has reached
        back += det.observe(r)
    assert [(f.type, f.evidence["withdrawn"]) for f in back if f.type == "silence_withdrawn"] == [
        ("silence_withdrawn", silent.id)]
