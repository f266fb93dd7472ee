"""SdcDetector: replica-digest minorities (name a rank) and loss / grad-norm blow-ups (job-wide only)."""

from __future__ import annotations

import numpy as np
import pytest
from gangwatch.detectors.config import SdcConfig
from gangwatch.detectors.sdc import SdcDetector, digest_vote, job_value, jump_score
from gangwatch.schemas import to_dict

from tests.unit.stepgen import (
    DigestFault,
    assert_json_safe,
    feed,
    gen_columns,
    gen_steps,
    interleave_late,
    make_topology,
    roundtrip,
)

pytestmark = pytest.mark.unit

CFG = SdcConfig()


@pytest.fixture(scope="module")
def topo():
    return make_topology(128)  # tp=8, pp=4, dp=4: 32 shards of 4 replicas


def digest_findings(found):
    return [f for f in found if f.detector == "sdc.digest"]


def numeric_findings(found):
    return [f for f in found if f.detector == "sdc.numeric"]


# --- the pure steps -------------------------------------------------------------------------------


def test_digest_vote():
    shard = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    codes = np.array([0, 0, 1, 2, 3, 4, 4, 5, -1])
    v = digest_vote(codes, shard, 3, min_majority=2)
    assert v.minority.tolist() == [False, False, True, False, False, False, False, True, False]
    assert v.checked.tolist() == [True, True, True, False, False, True, True, True, False]  # shard 1: 1 vs 1
    assert v.total.tolist() == [3, 2, 3] and v.major_count.tolist() == [2, 1, 2]


def test_job_value_and_jump_score():
    assert job_value(np.array([1.0, 2.0, np.nan, 3.0]), np.array([True, True, False, True])) == (2.0, None, 0)
    assert job_value(np.array([1.0, np.nan, np.inf]), np.array([True, True, True])) == (1.0, "NaN", 2)
    assert job_value(np.array([1.0, np.inf]), np.array([True, True]))[1] == "Infinity"
    base, z, ratio = jump_score(5.0, np.array([0.9, 1.0, 1.1, 1.0, 1.0]), CFG.floor_frac)
    assert base == 1.0 and ratio == 5.0 and z > CFG.z_threshold


# --- digests --------------------------------------------------------------------------------------


def test_minority_replica_is_found_at_its_first_mismatching_step(topo):
    det = SdcDetector(topo)
    found = feed(det, gen_steps(topo, 100, digest_faults=[DigestFault(45, 70, 75)]))
    assert len(found) == 1
    f = found[0]
    assert (f.type, f.detector, f.rank, f.node, f.gpu) == ("sdc_suspect", "sdc.digest", 45, topo.node_of(45),
                                                            topo.gpu_of(45))
    ev = f.evidence
    assert ev["step"] == 70 and ev["digest"].startswith("bad")
    assert ev["majority_digest"] == f"{70:08x}-{ev['shard']:04x}"
    assert ev["shard"] == int(topo.shard[45]) and ev["replicas"] == 4 and ev["agree"] == 3
    assert ev["minority_ranks"] == [45] and f.score == 0.75
    assert (ev["tp"], ev["pp"]) == (topo.ranks[45].tp, topo.ranks[45].pp)


def test_a_mismatch_names_the_last_step_its_rank_still_agreed_even_when_digests_are_sparse(topo):
    """Digests every step: the step before the mismatch. Digests only every 10 steps: the last compared one, so a
    rollback to a checkpoint after it could keep the corruption (it may have begun at any step in between)."""
    import dataclasses

    [f] = feed(SdcDetector(topo), gen_steps(topo, 100, digest_faults=[DigestFault(45, 70, 75)]))
    assert f.evidence["last_agreeing_step"] == 69
    sparse = [[dataclasses.replace(r, replica_digest=None) if r.step % 10 else r for r in batch]
              for batch in gen_steps(topo, 100, digest_faults=[DigestFault(45, 70, 75)])]
    [f] = feed(SdcDetector(topo), sparse)
    assert (f.evidence["step"], f.evidence["last_agreeing_step"]) == (70, 60)


def test_two_replicas_that_disagree_blame_nobody():
    topo2 = make_topology(16, tp=4, pp=2)  # dp=2: no majority possible
    assert feed(SdcDetector(topo2), gen_steps(topo2, 30, digest_faults=[DigestFault(3, 10)])) == []


def test_no_clear_majority_blames_nobody(topo):
    same_shard = [r for r in range(topo.size) if topo.shard[r] == topo.shard[0]][:2]  # 2 bad of 4: 2-1-1
    found = feed(SdcDetector(topo), gen_steps(topo, 30, digest_faults=[DigestFault(r, 15) for r in same_shard]))
    assert found == []


def test_suspects_in_several_shards_are_all_named(topo):
    faults = [DigestFault(3, 20, 22), DigestFault(77, 20, 22), DigestFault(100, 25, 26)]
    found = digest_findings(feed(SdcDetector(topo), gen_steps(topo, 40, digest_faults=faults)))
    assert [(f.rank, f.evidence["step"]) for f in found] == [(3, 20), (77, 20), (100, 25)]


def test_once_per_episode_then_rearm(topo):
    faults = [DigestFault(9, 20, 30), DigestFault(9, 60, 62), DigestFault(9, 170, 171)]
    found = digest_findings(feed(SdcDetector(topo), gen_steps(topo, 200, digest_faults=faults), batch=True))
    # 30..59 agree for 30 steps (< rearm_steps): the same episode; 62..169 agree for 108 steps: re-armed
    assert [f.evidence["step"] for f in found] == [20, 170]


def test_widespread_mismatch_is_one_job_wide_finding(topo):
    firsts = [int(np.flatnonzero(topo.shard == s)[0]) for s in range(20)]  # 20 of 32 shards
    found = feed(SdcDetector(topo), gen_steps(topo, 40, digest_faults=[DigestFault(r, 20, 30) for r in firsts]))
    assert len(found) == 1
    f = found[0]
    assert f.rank is None and f.node is None and f.detector == "sdc.digest"
    assert f.evidence["reason"] == "widespread" and f.evidence["shards_mismatched"] == 20


# --- numbers --------------------------------------------------------------------------------------


def test_nan_loss_is_job_wide_corroboration_without_a_culprit(topo):
    found = feed(SdcDetector(topo), gen_steps(topo, 100, nan_loss={80: [7]}))
    assert len(found) == 1
    f = found[0]
    assert (f.type, f.detector, f.rank, f.node, f.gpu) == ("sdc_suspect", "sdc.numeric", None, None, None)
    ev = f.evidence
    assert ev["metric"] == "loss" and ev["value"] == "NaN" and ev["step"] == 80 and ev["ranks_nonfinite"] == 1
    assert ev["nonfinite"] is True and ev["ratio"] is None
    assert ev["baseline"] == pytest.approx(2.96, rel=0.02)


def test_nan_during_warmup_is_still_reported(topo):
    found = numeric_findings(feed(SdcDetector(topo), gen_steps(topo, 10, nan_loss={2: None}, digests=False)))
    assert [(f.evidence["step"], f.evidence["ranks_nonfinite"]) for f in found] == [(2, 128)]


def test_inf_grad_norm(topo):
    found = numeric_findings(feed(SdcDetector(topo), gen_steps(topo, 60, inf_grad=[50]), batch=True))
    assert [(f.evidence["metric"], f.evidence["value"]) for f in found] == [("grad_norm", "Infinity")]


@pytest.mark.parametrize("metric,spikes", [("grad_norm", {"grad_spikes": {70: 6.0}}),
                                           ("loss", {"loss_spikes": {70: 5.5}})])
def test_a_5x_jump_is_reported(topo, metric, spikes):
    found = feed(SdcDetector(topo), gen_steps(topo, 100, **spikes), batch=True)
    assert len(found) == 1
    f = found[0]
    assert f.rank is None and f.evidence["metric"] == metric and f.evidence["step"] == 70
    assert f.evidence["ratio"] >= CFG.jump_factor and f.evidence["z"] >= CFG.z_threshold and f.score >= 6


def test_benign_spikes_are_ignored(topo):
    spikes = {"loss_spikes": {60: 1.3, 61: 1.3, 90: 2.0}, "grad_spikes": {70: 3.0, 80: 1.3}}
    assert feed(SdcDetector(topo), gen_steps(topo, 120, **spikes), batch=True) == []


def test_numeric_episode_is_reported_once(topo):
    nan = {s: [1] for s in range(40, 46)} | {100: [2]}
    found = numeric_findings(feed(SdcDetector(topo), gen_steps(topo, 110, nan_loss=nan), batch=True))
    assert [f.evidence["step"] for f in found] == [40, 100]


def test_no_findings_in_healthy_steps(topo):
    det = SdcDetector(topo)
    assert feed(det, gen_columns(topo, 3600, seed=9), batch=True) == []
    assert len(det.hist["loss"]) == CFG.history and det.agree_run.min() == 3600


def test_missing_fields_are_tolerated(topo):
    assert feed(SdcDetector(topo), gen_steps(topo, 30, numbers=False, digests=False)) == []

    def last_stage_only(batches):  # with pipeline parallelism only the last stage computes the loss
        for b in batches:
            yield [r if topo.ranks[r.rank].pp == 3 else
                   type(r)(ts=r.ts, job=r.job, rank=r.rank, step=r.step, step_s=r.step_s) for r in b]
    found = feed(SdcDetector(topo), last_stage_only(gen_steps(topo, 60, grad_spikes={40: 8.0})))
    assert [f.evidence["metric"] for f in found] == ["grad_norm"]


# --- contract -------------------------------------------------------------------------------------


def _stream(topo):
    s = gen_steps(topo, 120, seed=4, digest_faults=[DigestFault(33, 50, 53), DigestFault(90, 95)],
                  nan_loss={60: [5]}, grad_spikes={80: 7.0})
    return [r for b in interleave_late(s, frac=0.1) for r in b]


def test_batch_equals_per_record(topo):
    a, b = SdcDetector(topo), SdcDetector(topo)
    one = feed(a, [_stream(topo)])
    many = []
    recs = _stream(topo)
    for i in range(0, len(recs), 300):
        many += b.observe_many(recs[i:i + 300])
    assert one == many and len(one) == 4 and a.state() == b.state()


def test_state_round_trip_mid_stream(topo):
    recs = _stream(topo)
    expected = feed(SdcDetector(topo), [recs])
    cut = next(i for i, r in enumerate(recs) if r.step == 60 and r.rank == 5) + 1  # a NaN in an open step
    det = SdcDetector(topo)
    got = feed(det, [recs[:cut]])
    assert any(d["loss"].count("NaN") for d in det.state()["buffer"]["open"])
    det = roundtrip(det, topo)
    assert got + feed(det, [recs[cut:]]) == expected


def test_deterministic(topo):
    first = feed(SdcDetector(topo), [_stream(topo)])
    assert first == feed(SdcDetector(topo), [_stream(topo)])
    assert len({f.id for f in first}) == len(first)
    for f in first:
        assert_json_safe(to_dict(f))


def test_set_topology_resets_ranks_and_keeps_the_numeric_baseline(topo):
    det = SdcDetector(topo)
    feed(det, gen_steps(topo, 40, digest_faults=[DigestFault(3, 30)]), batch=True)
    assert det.flagged[3] and len(det.hist["loss"]) == 30
    det.set_topology(make_topology(256))
    assert det.flagged.shape == (256,) and not det.flagged.any() and len(det.hist["loss"]) == 30


def _three_replicas(bad_from: int, steps: int = 30):
    """Three data-parallel replicas of one shard (a node each), a digest every step; rank 1 differs from
    `bad_from` on. Records in event-time order, one list per rank."""
    from gangwatch.schemas import Job, RankInfo, Step

    job = Job(ts=0.0, job="j", ranks=[RankInfo(rank=r, node=f"n{r}", gpu=0, dp=r) for r in range(3)])
    per = {r: [Step(ts=10.0 + k + 0.001 * r, job="j", rank=r, step=k, step_s=1.0,
                    replica_digest=f"d{k}" if r != 1 or k < bad_from else f"x{k}") for k in range(steps)]
           for r in range(3)}
    return job, per


@pytest.mark.parametrize("order", ["its own backlog late", "its peers' backlogs late"])
def test_a_replica_whose_records_come_after_the_vote_is_found_at_its_first_mismatching_step(order):
    """A spool flushed in one burst after the broker was away: the records of steps already voted on vote late,
    and the mismatch is found at the step it began (8), on the record path and the run path alike."""
    from gangwatch.detectors.runs import RecordRun
    from gangwatch.detectors.topology import Topology

    job, per = _three_replicas(bad_from=8)
    first = [per[0]] + ([per[2]] if order == "its own backlog late" else [per[1]])
    later = [per[1]] if order == "its own backlog late" else [per[2]]
    recs = sorted((r for rs in first for r in rs), key=lambda r: r.ts) + [r for rs in later for r in rs]
    topo = Topology.from_job(job)
    one, runs = SdcDetector(topo), SdcDetector(topo)
    found_one = [f for r in recs for f in one.observe(r)] + one.advance(1e9)
    found_runs = [f for i in range(0, len(recs), 7) for _, fs in runs.observe_run(RecordRun(recs[i:i + 7]))
                  for f in fs] + runs.advance(1e9)
    assert [(f.rank, f.evidence["step"]) for f in digest_findings(found_one)] == [(1, 8)]
    assert [to_dict(f) for f in found_one] == [to_dict(f) for f in found_runs]
    assert one.state() == runs.state()
