"""Comm detector: an NCCL-timeout storm is one comm_error finding; it blames no node, suspects are weak."""

from __future__ import annotations

import json
import random

import pytest
from gangwatch.detectors.comm import CommDetector
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Framework, Job, RankInfo

from tests.helpers import drive

pytestmark = pytest.mark.unit

T0 = 1_000.0


def topo(nodes=8, per_node=8) -> Topology:
    """tp = the GPU index (a tp group is one node), dp = the node, one pipeline stage."""
    ranks = [RankInfo(rank=n * per_node + g, node=f"n{n:03d}", gpu=g, tp=g, pp=0, dp=n)
             for n in range(nodes) for g in range(per_node)]
    return Topology.from_job(Job(ts=T0, job="j", ranks=ranks))


def timeout(ts, rank, pg="7", peer=None, op="allreduce", type="nccl_timeout") -> Framework:
    return Framework(ts=ts, job="j", rank=rank, type=type, op=op, seq=48211, pg=pg, peer=peer,
                     message="Watchdog caught collective operation timeout")


def random_storm(seed=0, n=300, size=64, span=3.0, exclude=()):
    """`n` timeouts from random ranks within `span` s, naming random peers in numeric process groups."""
    rnd = random.Random(seed)
    ranks = [r for r in range(size) if r not in exclude]
    recs = [timeout(T0 + rnd.uniform(0, span), rnd.choice(ranks), pg=str(rnd.randrange(40)),
                    peer=rnd.randrange(size)) for _ in range(n)]
    return sorted(recs, key=lambda r: r.ts)


def run(det, recs, tail=30.0):
    return drive(det, recs, tail)


def test_storm_of_300_timeouts_is_one_finding_after_window() -> None:
    t = topo()
    recs = random_storm()
    det = CommDetector(t)
    found = []
    for rec in recs:
        found += det.advance(rec.ts)
        found += det.observe(rec)
    assert found == []  # still collecting: the window is not over
    first = recs[0].ts
    assert det.advance(first + det.config.window_s - 0.001) == []
    found = det.advance(first + det.config.window_s)
    assert len(found) == 1
    [f] = found
    assert (f.type, f.detector, f.ts) == ("comm_error", "comm.storm", pytest.approx(first + det.config.window_s))
    assert f.node is None and f.rank is None and f.gpu is None  # the report itself blames nobody
    ev = f.evidence
    assert ev["reports"] == 300
    assert ev["reporting_ranks"] == len({r.rank for r in recs})
    assert ev["ops"] == {"allreduce": 300} and sum(ev["pgs"].values()) == 300
    assert ev["first_ts"] == pytest.approx(first)
    assert 0 < f.score <= 1.0
    # random peers: no small set of ranks hits every group; any suspect set is small
    assert len(ev["suspect_ranks"]) <= det.config.max_suspects
    assert det.advance(first + 1000) == []  # reported once
    assert "node" not in {k for k, v in vars_of(f).items() if v is not None}


def vars_of(f):
    return {k: getattr(f, k) for k in f.__dataclass_fields__}


def test_late_reports_of_the_same_storm_make_no_second_finding() -> None:
    det = CommDetector(topo())
    found = run(det, random_storm(), tail=15)
    # stragglers keep timing out for a while after the summary; within quiet_s they belong to it
    found += run(det, [timeout(T0 + 20 + i, rank=i % 64, pg="3", peer=1) for i in range(30)], tail=5)
    assert len(found) == 1


def test_a_new_storm_after_quiet_is_a_second_finding() -> None:
    det = CommDetector(topo())
    a = run(det, random_storm(seed=1))
    later = [timeout(T0 + 500 + i * 0.01, rank=i, pg="7", peer=5) for i in range(10) if i != 5]
    b = run(det, later)
    assert len(a) == 1 and len(b) == 1 and a[0].id != b[0].id
    assert b[0].evidence["reports"] == 9 and b[0].evidence["suspect_ranks"] == [5]


def test_non_reporter_hitting_all_groups_is_the_only_suspect() -> None:
    t = topo()
    rnd = random.Random(3)
    reporters = [r for r in range(64) if r != 5]
    recs = sorted((timeout(T0 + rnd.uniform(0, 3), rnd.choice(reporters), pg="7", peer=5) for _ in range(300)),
                  key=lambda r: r.ts)
    [f] = run(CommDetector(t), recs)
    assert f.evidence["suspect_ranks"] == [5]
    assert f.evidence["suspect_nodes"] == ["n000"]
    assert f.node is None  # still a weak hint, not a verdict
    reporting = {r.rank for r in recs}
    assert not reporting & set(f.evidence["suspect_ranks"])


@pytest.mark.parametrize("seed", range(5))
def test_reporters_never_suspected_when_a_non_reporter_hits_every_group(seed) -> None:
    # rank 41 (node n005, gpu 1) is silent; its tp peers report "tp", its dp replicas report "dp",
    # random ranks report "pp" (one stage: everyone), a few name it in numeric groups
    t = topo()
    rnd = random.Random(seed)
    tp_peers = [r for r in t.group_ranks("tp", 41).tolist() if r != 41]
    dp_peers = [r for r in t.group_ranks("dp", 41).tolist() if r != 41]
    others = [r for r in range(64) if r != 41]
    recs = []
    for i in range(200):
        kind = rnd.choice(["tp", "dp", "pp", "num"])
        if kind == "tp":
            recs.append(timeout(T0 + i * 0.01, rnd.choice(tp_peers), pg="tp"))
        elif kind == "dp":
            recs.append(timeout(T0 + i * 0.01, rnd.choice(dp_peers), pg="dp"))
        elif kind == "pp":
            recs.append(timeout(T0 + i * 0.01, rnd.choice(others), pg="pp"))
        else:
            recs.append(timeout(T0 + i * 0.01, rnd.choice(others), pg=str(rnd.randrange(9)), peer=41))
    [f] = run(CommDetector(t), recs)
    reporting = {r.rank for r in recs}
    assert 41 not in reporting
    assert f.evidence["suspect_ranks"] == [41]
    assert not reporting & set(f.evidence["suspect_ranks"])
    assert f.evidence["suspect_nodes"] == ["n005"]


def test_tp_group_labels_point_at_the_silent_member() -> None:
    t = topo()
    group = t.group_ranks("tp", 5).tolist()
    assert group == list(range(8))  # rank 5's tensor-parallel group is node n000
    reporters = [r for r in group if r != 5]
    recs = [timeout(T0 + i * 0.05, reporters[i % len(reporters)], pg="tp", peer=None) for i in range(70)]
    [f] = run(CommDetector(t), recs)
    assert 5 in f.evidence["suspect_ranks"]
    assert f.evidence["suspect_ranks"] == [5] and f.evidence["suspect_nodes"] == ["n000"]
    assert f.evidence["pgs"] == {"tp": 70}


def test_dp_group_labels_point_at_the_silent_replica() -> None:
    t = topo()
    group = t.group_ranks("dp", 13).tolist()  # same tp index (gpu 5) on every node
    assert group == [5, 13, 21, 29, 37, 45, 53, 61]
    recs = [timeout(T0 + i * 0.05, r, pg="dp") for i, r in enumerate(g for g in group if g != 13)]
    [f] = run(CommDetector(t), recs)
    assert f.evidence["suspect_ranks"] == [13] and f.evidence["suspect_nodes"] == ["n001"]


def test_other_framework_events_are_ignored() -> None:
    det = CommDetector(topo())
    recs = [timeout(T0 + i, rank=i, type=kind) for i, kind in enumerate(["exception", "oom", "exit"])]
    assert run(det, recs) == []
    assert det.storm is None


def test_nccl_error_and_barrier_timeout_join_the_storm() -> None:
    recs = [timeout(T0, 1, peer=5), timeout(T0 + 0.5, 2, peer=5, type="nccl_error"),
            timeout(T0 + 1, 3, peer=5, type="barrier_timeout", op="barrier")]
    [f] = run(CommDetector(topo()), recs)
    assert f.evidence["reports"] == 3 and f.evidence["ops"] == {"allreduce": 2, "barrier": 1}


def test_ranks_outside_the_topology_are_ignored() -> None:
    det = CommDetector(topo(nodes=1))
    assert run(det, [timeout(T0, rank=30, peer=1)]) == []


def test_findings_are_deterministic_and_cadence_free() -> None:
    recs = random_storm(seed=7)
    a = run(CommDetector(topo()), recs)
    det = CommDetector(topo())
    b = []
    for rec in recs:
        b += det.observe(rec)
    b += det.advance(recs[-1].ts + 30)
    assert a == b and len(a) == 1


def test_state_round_trip_mid_storm() -> None:
    t = topo()
    recs = random_storm(seed=2)
    for cut in (1, 150, 299):
        det = CommDetector(t)
        first = run(det, recs[:cut], tail=0)
        snap = json.loads(json.dumps(det.state()))  # a JSON-able value
        clone = CommDetector.from_state(snap, t)
        a = run(det, recs[cut:])
        b = run(clone, recs[cut:])
        assert first == [] and a == b and len(a) == 1 and a[0].evidence["reports"] == 300


def test_state_snapshot_is_not_changed_by_later_records() -> None:
    t = topo()
    recs = random_storm(seed=4)
    det = CommDetector(t)
    run(det, recs[:100], tail=0)
    snap = det.state()
    frozen = json.dumps(snap, sort_keys=True)
    run(det, recs[100:])
    assert json.dumps(snap, sort_keys=True) == frozen


def test_new_topology_drops_the_open_storm() -> None:
    det = CommDetector(topo())
    run(det, random_storm()[:50], tail=0)
    det.set_topology(topo(nodes=4))
    assert det.storm is None and det.advance(T0 + 100) == []
