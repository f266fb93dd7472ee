"""Fail-stop detector: missed heartbeats grouped per node, crashes, event-time determinism."""

from __future__ import annotations

import pytest
from gangwatch.detectors.failstop import FailStopDetector
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Framework, Heartbeat, Job, RankInfo

pytestmark = pytest.mark.unit

T0 = 1_000.0


def topo(nodes=4, per_node=8, hb=5.0) -> Topology:
    ranks = [RankInfo(rank=n * per_node + g, node=f"n{n:03d}", gpu=g) for n in range(nodes) for g in range(per_node)]
    return Topology.from_job(Job(ts=T0, job="j", ranks=ranks, heartbeat_s=hb))


def beats(t: Topology, until: float, dead_nodes=(), dead_at=float("inf"), jitter=0.37):
    """Heartbeats every period from every rank, staggered; ranks of `dead_nodes` stop at `dead_at`."""
    out, k = [], 0
    while T0 + k * t.heartbeat_s <= until:
        for r in t.ranks:
            ts = T0 + k * t.heartbeat_s + (r.rank * jitter) % t.heartbeat_s
            if ts > until or (r.node in dead_nodes and ts >= dead_at):
                continue
            out.append(Heartbeat(ts=ts, job="j", rank=r.rank))
        k += 1
    return sorted(out, key=lambda h: h.ts)


def run(det, recs, step=None):
    found = []
    for rec in recs:
        found += det.advance(rec.ts)
        found += det.observe(rec)
    return found


def test_silent_node_is_one_finding_naming_the_node_and_its_ranks():
    t = topo()
    det = FailStopDetector(t)
    found = run(det, beats(t, T0 + 120, dead_nodes={"n002"}, dead_at=T0 + 50))
    assert len(found) == 1
    f = found[0]
    assert (f.type, f.node) == ("fail_stop", "n002")
    assert f.evidence["ranks"] == list(range(16, 24)) and f.evidence["whole_node"]
    # known within three heartbeat periods of the node's last sign of life
    assert f.ts - f.evidence["last_seen_ts"] <= 3 * t.heartbeat_s + 1e-9
    assert f.ts - (T0 + 50) <= 3 * t.heartbeat_s


def test_healthy_job_has_no_findings():
    t = topo()
    assert run(FailStopDetector(t), beats(t, T0 + 600)) == []


def test_partial_node_reported_after_grace():
    t = topo(nodes=2, per_node=4)
    det = FailStopDetector(t)
    recs = [h for h in beats(t, T0 + 100) if not (h.rank == 5 and h.ts > T0 + 30)]
    found = run(det, recs)
    assert [(f.node, f.evidence["ranks"], f.rank) for f in found] == [("n001", [5], 5)]
    assert not found[0].evidence["whole_node"]


def test_findings_do_not_depend_on_advance_cadence():
    t = topo()
    recs = beats(t, T0 + 200, dead_nodes={"n001", "n003"}, dead_at=T0 + 70)
    a = run(FailStopDetector(t), recs)
    det = FailStopDetector(t)
    b = []
    for i, rec in enumerate(recs):
        if i % 37 == 0:
            b += det.advance(rec.ts)
        b += det.observe(rec)
    b += det.advance(recs[-1].ts)
    assert a == b and len(a) == 2


def test_rank_that_comes_back_is_rearmed():
    t = topo(nodes=1, per_node=2)
    det = FailStopDetector(t)
    recs = [h for h in beats(t, T0 + 200) if not (T0 + 30 < h.ts < T0 + 80)]
    found = run(det, recs)
    assert len(found) == 1  # the outage
    found2 = run(det, [h for h in beats(t, T0 + 400) if h.ts > T0 + 200 and h.ts < T0 + 300])
    found2 += det.advance(T0 + 400)
    assert len(found2) == 1 and found2[0].id != found[0].id  # a second, distinct outage


def test_process_exit_is_immediate():
    t = topo(nodes=2, per_node=2)
    det = FailStopDetector(t)
    [f] = det.observe(Framework(ts=T0 + 3, job="j", rank=3, type="exit", message="exit code 1"))
    assert (f.type, f.node, f.rank, f.evidence["cause"]) == ("fail_stop", "n001", 3, "exit")
    assert det.observe(Framework(ts=T0 + 3, job="j", rank=3, type="nccl_timeout")) == []


def test_state_round_trip_mid_stream():
    t = topo()
    recs = beats(t, T0 + 200, dead_nodes={"n000"}, dead_at=T0 + 100)
    half = len(recs) // 2
    det = FailStopDetector(t)
    first = run(det, recs[:half])
    clone = FailStopDetector.from_state(det.state(), t)
    assert run(det, recs[half:]) == run(clone, recs[half:])
    assert first == []


def test_new_topology_resets_ranks():
    t = topo(nodes=2, per_node=2)
    det = FailStopDetector(t)
    run(det, beats(t, T0 + 20))
    bigger = topo(nodes=3, per_node=2)
    det.set_topology(bigger)
    assert det.last_seen.shape == (6,)
