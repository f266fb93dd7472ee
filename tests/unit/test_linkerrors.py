"""Link error rates (detectors/linkerrors.py): PCIe-replay and NVLink-CRC counters that keep climbing on one GPU,
the simulator fault that drives them, and what triage makes of the finding (its declared policy)."""

from __future__ import annotations

import pytest
from gangwatch.detectors.catalog import typed
from gangwatch.detectors.config import LinkErrorConfig
from gangwatch.detectors.linkerrors import LinkErrorDetector, LinkErrorRate
from gangwatch.detectors.topology import Topology
from gangwatch.producers.simulate import FAULT_CLASS, Fault, Scenario, generate, truth
from gangwatch.schemas import Gpu, Job, RankInfo, decode_obj
from gangwatch.triage.core import Core

from tests.helpers import drive

pytestmark = pytest.mark.unit

T0 = 1_000.0
TOPO = Topology.from_job(Job(ts=T0, job="j", ranks=[RankInfo(rank=n * 8 + g, node=f"n{n:03d}", gpu=g)
                                                    for n in range(2) for g in range(8)]))


def samples(counts, *, node="n001", gpu=3, every_s=10.0, counter="pcie_replay", t0=T0):
    """One GPU's samples, `every_s` apart, carrying the cumulative `counts`."""
    return [Gpu(ts=t0 + i * every_s, node=node, gpu=gpu, **{counter: c}) for i, c in enumerate(counts)]


def cumulative(per_interval, start=0):
    out = [start]
    for n in per_interval:
        out.append(out[-1] + n)
    return out


def test_a_steady_replay_rate_is_one_finding_with_its_onset():
    # healthy for 5 intervals, then 12 replays per 10 s (1.2/s, the threshold is 8 a minute)
    counts = cumulative([0, 1, 0, 0, 0] + [12] * 10, start=40)
    found = drive(LinkErrorDetector(TOPO), samples(counts))
    [f] = found
    ev = typed(f).evidence
    assert isinstance(ev, LinkErrorRate)
    assert (f.type, f.detector, f.node, f.gpu, f.rank) == ("link_errors", "linkerrors.pcie_replay", "n001", 3, 11)
    assert f.ts == T0 + 80.0  # the third bad interval ends at sample 8
    assert ev.onset_ts == T0 + 50.0 and ev.errors == 36 and ev.rate_per_s == 1.2
    assert (ev.intervals_over, ev.window_intervals, ev.counter_value) == (3, 5, 41 + 36)


@pytest.mark.parametrize("per_interval", [
    [0, 0, 200, 0, 0, 0, 0, 0],  # one burst: no persistence
    [1, 0, 1, 1, 0, 1, 0, 1],  # a replay now and then: below 8 a minute
    [2, 0, 0, 2, 0, 0, 2, 0],  # bad intervals, but never 3 of 5
])
def test_bursts_and_background_replays_are_not_a_degrading_link(per_interval):
    assert drive(LinkErrorDetector(TOPO), samples(cumulative(per_interval))) == []


def test_a_counter_reset_starts_over_instead_of_a_negative_rate():
    counts = [500, 520, 540] + [0, 0, 0, 0, 0] + [0, 1, 1, 1, 1]
    assert drive(LinkErrorDetector(TOPO), samples(counts)) == []


def test_samples_out_of_order_or_repeated_are_ignored():
    recs = samples(cumulative([20] * 6))
    recs = [recs[0], recs[1], recs[1], recs[0], *recs[2:]]
    [f] = drive(LinkErrorDetector(TOPO), recs)
    assert typed(f).evidence.onset_ts == T0


def test_one_finding_per_episode_and_a_new_one_after_it_healed():
    cfg = LinkErrorConfig(rearm_intervals=3)
    counts = cumulative([20] * 6 + [0] * 3 + [20] * 4)
    found = drive(LinkErrorDetector(TOPO, cfg), samples(counts))
    assert [typed(f).evidence.onset_ts for f in found] == [T0, T0 + 90.0]


def test_a_window_of_one_interval_holds_only_the_last_one():
    cfg = LinkErrorConfig(hits=1, window=1, rearm_intervals=1)
    found = drive(LinkErrorDetector(TOPO, cfg), samples(cumulative([20, 0, 20])))
    assert [(typed(f).evidence.onset_ts, typed(f).evidence.intervals_over, typed(f).evidence.window_intervals)
            for f in found] == [(T0, 1, 1), (T0 + 20.0, 1, 1)]


def test_nvlink_crc_has_its_own_threshold_and_each_gpu_its_own_counter():
    crc = samples(cumulative([500] * 6), counter="nvlink_crc", gpu=1)  # 50/s: below 100/s
    storm = samples(cumulative([5000] * 6), counter="nvlink_crc", gpu=2)
    found = drive(LinkErrorDetector(TOPO), sorted(crc + storm, key=lambda r: (r.ts, r.gpu)))
    assert [(f.gpu, f.detector, typed(f).evidence.rate_per_s) for f in found] == [(2, "linkerrors.nvlink_crc", 500.0)]


def test_state_round_trip_continues_the_same():
    recs = samples(cumulative([0, 0, 12, 12, 12, 12]))
    a = LinkErrorDetector(TOPO)
    drive(a, recs[:4])
    b = LinkErrorDetector.from_state(a.state(), TOPO)
    assert drive(a, recs[4:]) == drive(b, recs[4:]) and len(drive(LinkErrorDetector(TOPO), recs)) == 1


def test_nodes_that_leave_the_job_are_forgotten():
    det = LinkErrorDetector(TOPO)
    drive(det, samples([0, 5], node="n000") + samples([0, 5], node="n001"))
    det.set_topology(Topology.from_job(Job(ts=T0 + 50, job="j", ranks=[RankInfo(rank=0, node="n001", gpu=3)])))
    assert list(det.nodes) == ["n001"]


# --- the simulator's fault, end to end ----------------------------------------------------------------


SC = Scenario("links", 5, tp=8, pp=2, dp=2, duration_s=240.0,
              faults=(Fault("link_errors", 80.0, node="n002", params={"gpu": 6}),))


def test_the_simulated_fault_drives_one_gpus_counter_only():
    gpus = [r for r in generate(SC) if r["kind"] == "gpu"]
    onset = SC.start_ts + 80.0
    bad = [r for r in gpus if (r["node"], r["gpu"]) == ("n002", 6)]
    assert bad[-1]["pcie_replay"] - max(r["pcie_replay"] for r in bad if r["ts"] < onset) > 100  # ~1/s for 160 s
    assert all(r["nvlink_crc"] == 0 for r in gpus)
    others = {}
    for r in gpus:
        if (r["node"], r["gpu"]) != ("n002", 6):
            others.setdefault((r["node"], r["gpu"]), set()).add(r["pcie_replay"])
    assert all(len(v) == 1 for v in others.values())  # benign counts stay put
    [f] = truth(SC)["faults"]
    assert f["class"] is None is FAULT_CLASS["link_errors"] and f["gpus"] == [["n002", 6]]


def test_a_nvlink_fault_and_bad_params():
    sc = Scenario("crc", 6, tp=8, pp=1, dp=2, duration_s=120.0,
                  faults=(Fault("link_errors", 30.0, node="n001", params={"gpu": 0, "counter": "nvlink_crc"}),))
    crc = [r["nvlink_crc"] for r in generate(sc) if r["kind"] == "gpu" and (r["node"], r["gpu"]) == ("n001", 0)]
    assert crc[-1] > 30_000  # ~1000/s for 90 s
    for params in ({"counter": "ecc"}, {"rate_per_s": 0}):
        with pytest.raises(ValueError):
            Fault("link_errors", 10.0, node="n001", params=params)


def test_through_the_core_the_link_is_found_raises_risk_and_evicts_nobody():
    core = Core()
    outs = [core.process(decode_obj(d)) for d in generate(SC)]
    outs.append(core.finish())
    findings = [f for o in outs for f in o.findings if f.type == "link_errors"]
    assert [(f.node, f.gpu) for f in findings] == [("n002", 6)]
    assert findings[0].ts - (SC.start_ts + 80.0) <= 3 * SC.gpu_sample_s + 1  # three bad intervals
    assert [a for o in outs for a in o.actions] == [] and [i for o in outs for i in o.incidents] == []
    [profile] = [p for o in outs for p in o.profiles if findings[0].id in p.recent_ids]
    assert profile.node == "n002" and profile.risk == 0.3 and profile.recent_types[-1] == "link_errors"


def test_its_policy_corroborates_a_straggler_on_the_same_node():
    from gangwatch.detectors.failslow import FAIL_SLOW, StragglerEvidence
    from gangwatch.triage.localize import localize

    link = drive(LinkErrorDetector(TOPO), samples(cumulative([20] * 6), node="n001", gpu=3))[0]
    slow = FAIL_SLOW.finding(ts=T0 + 60, job="j", detector="failslow.compute", key=1, rank=11, topo=TOPO,
                             evidence=StragglerEvidence(relative=4.0, individual=3.0, slowdown_frac=0.05,
                                                        steps_flagged=3, window=10, step=100, pp=0, compute_s=1.05,
                                                        stage_median_s=1.0, comm_wait_s=0.1, onset_ts=T0 + 30))
    t = typed(link)
    assert (t.incident_class, t.weight, t.risk, t.onset_ts, t.label) == (None, 0.4, 0.3, T0, "PCIE_REPLAY_RATE")
    alone = localize([typed(slow)], TOPO, 0.5).per_node["n001"]
    both = localize([typed(slow), t], TOPO, 0.5).per_node["n001"]
    assert (alone, both) == (0.7, round(1 - 0.3 * 0.6, 4))
