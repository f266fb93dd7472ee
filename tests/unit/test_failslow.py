"""FailSlowDetector: straggler scenarios, the score / threshold / persistence steps, and the contract."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gangwatch.detectors.failslow import (
    FailSlowConfig,
    FailSlowDetector,
    individual_scores,
    peer_groups,
    persist,
    relative_scores,
    threshold,
)
from gangwatch.schemas import to_dict

from tests.unit.stepgen import (
    JobSlow,
    Straggler,
    assert_json_safe,
    by_type,
    feed,
    gen_columns,
    gen_steps,
    interleave_late,
    make_topology,
    roundtrip,
)

pytestmark = pytest.mark.unit

CFG = FailSlowConfig()
LEAN = {"numbers": False, "digests": False}  # failslow reads neither: cheaper records


@pytest.fixture(scope="module")
def topo():
    return make_topology(128)  # 16 nodes x 8 GPUs, tp=8, pp=4, dp=4: 32 ranks per stage


def flags(findings, rank=None):
    return [f for f in by_type(findings, "fail_slow") if rank is None or f.rank == rank]


# --- score / threshold / persistence, one step at a time ---------------------------------------


def test_relative_scores_straggler_computes_longest_and_waits_least():
    rng = np.random.default_rng(0)
    pp = np.repeat([0, 1], 32)
    compute = 0.7 * (1 + 0.015 * rng.standard_normal(64))
    compute[[5, 40]] *= 1.10
    comm = 1.0 - compute
    rel, med = relative_scores(compute, comm, np.ones(64), peer_groups(pp, 4), CFG)
    assert rel[5] > CFG.rel_threshold and rel[40] > CFG.rel_threshold
    assert np.delete(rel, [5, 40]).max() < CFG.rel_threshold
    assert med[0] == pytest.approx(0.7, rel=0.02)


def test_relative_scores_need_both_signals_to_agree_and_fall_back_to_one():
    pp = np.zeros(16, dtype=np.int32)
    compute, comm = np.full(16, 0.7), np.full(16, 0.3)
    compute[3] = 0.8  # computes longer but does not wait less: not a straggler by both measures
    rel, _ = relative_scores(compute, comm, np.ones(16), peer_groups(pp, 4), CFG)
    assert rel[3] == pytest.approx(0.0)
    rel, _ = relative_scores(np.full(16, np.nan), np.where(np.arange(16) == 3, 0.2, 0.3), np.ones(16),
                             peer_groups(pp, 4), CFG)
    assert rel[3] > CFG.rel_threshold  # comm_wait alone, floor from step_s
    rel, _ = relative_scores(np.full(16, np.nan), np.full(16, np.nan), np.ones(16), peer_groups(pp, 4), CFG)
    assert np.isnan(rel).all()


def test_small_stages_are_pooled():
    groups = peer_groups(np.array([0, 0, 1, 1, 2, 2, 2, 2, 2]), min_peers=4)
    assert [g.tolist() for g in groups] == [[4, 5, 6, 7, 8], [0, 1, 2, 3]]


def test_individual_scores_ignore_what_happens_to_everyone():
    groups = peer_groups(np.zeros(32, dtype=np.int32), 4)
    base = np.full(32, 0.7)
    everyone_slower = np.full(32, 0.7 * 1.3)
    assert np.abs(individual_scores(everyone_slower, base, groups, CFG)).max() < 1e-9
    one_slower = np.full(32, 0.7)
    one_slower[7] *= 1.1
    ind = individual_scores(one_slower, base, groups, CFG)
    assert ind[7] > CFG.ind_threshold and np.isnan(individual_scores(one_slower, np.full(32, np.nan), groups,
                                                                     CFG)).all()


def test_threshold_individual_score_never_fires_alone():
    rel = np.array([3.5, 2.5, 0.0, np.nan, 1.9])
    ind = np.array([0.0, 9.0, 9.0, 9.0, 9.0])
    assert threshold(rel, ind, CFG).tolist() == [True, True, False, False, False]


def test_persist_is_k_of_last_n_scored_steps():
    hist = np.zeros(2, dtype=np.uint32)
    counts = []
    for hit, scored in [(1, 1), (0, 1), (1, 0), (1, 1)] + [(0, 1)] * 9:
        hist, count = persist(hist, np.array([hit, 0], bool), np.array([scored, 1], bool), window=10)
        counts.append(int(count[0]))
    # the unscored step keeps the history; hits leave the window after 10 scored steps
    assert counts == [1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1]


# --- scenarios ------------------------------------------------------------------------------------


def test_straggler_10pct_is_flagged_within_10_steps(topo):
    onset = 50
    det = FailSlowDetector(topo)
    found = feed(det, gen_steps(topo, 120, stragglers=[Straggler(37, 1.10, start=onset)], **LEAN), batch=True)
    assert [f.rank for f in flags(found)] == [37]
    f = flags(found)[0]
    steps_to_detect = f.evidence["step"] - onset + 1
    assert steps_to_detect <= 10
    assert steps_to_detect == CFG.hits  # 10% is ~5 robust sigmas: a hit on every step
    assert f.detector == "failslow.compute" and f.node == topo.node_of(37) and f.gpu == topo.gpu_of(37)
    ev = f.evidence
    assert ev["relative"] >= CFG.rel_threshold and ev["window"] == CFG.window
    assert ev["steps_flagged"] >= CFG.hits and 0.05 < ev["slowdown_frac"] < 0.15
    assert ev["individual"] is not None and ev["individual"] > CFG.ind_threshold


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_straggler_detection_latency_over_seeds(topo, seed):
    det = FailSlowDetector(topo)
    found = feed(det, gen_steps(topo, 80, seed=seed, stragglers=[Straggler(100, 1.10, start=40)], **LEAN),
                 batch=True)
    assert [f.rank for f in flags(found)] == [100]
    assert flags(found)[0].evidence["step"] - 40 + 1 <= 10


def test_no_flags_in_an_hour_of_healthy_steps(topo):
    """3,600 steps x 128 ranks with 1.5% gaussian noise: not one fail_slow finding."""
    det = FailSlowDetector(topo)
    found = feed(det, gen_columns(topo, 3600, noise=0.015, seed=7, **LEAN), batch=True)
    assert flags(found) == [] and not det.in_episode.any()
    learned = 3600 - CFG.warmup_steps  # every rank scored on every step; the rare lone hit is not learned
    assert det.nbase.max() == learned and det.nbase.min() >= learned - 10


def test_intermittent_straggler_is_flagged(topo):
    det = FailSlowDetector(topo)
    stream = gen_steps(topo, 300, seed=3, stragglers=[Straggler(64, 1.20, start=30, prob=0.3)], **LEAN)
    found = feed(det, stream, batch=True)
    assert [f.rank for f in flags(found)] == [64]
    assert flags(found)[0].evidence["step"] - 30 < 100


@pytest.mark.parametrize("where", ["wait", "compute"])
def test_job_wide_slowdown_flags_nobody(topo, where):
    """A checkpoint (everyone waits) or a job-wide compute slowdown: relative scores stay quiet, and the
    individual scores, which do jump for everyone, must not flag anyone on their own."""
    det = FailSlowDetector(topo)
    slow = [JobSlow(100, 110, 3.0, where), JobSlow(200, 400, 1.3, where)]
    assert flags(feed(det, gen_steps(topo, 500, seed=5, slow=slow, **LEAN), batch=True)) == []


def test_one_finding_per_episode_then_rearm(topo):
    det = FailSlowDetector(topo)
    strag = [Straggler(9, 1.15, start=20, stop=60), Straggler(9, 1.15, start=200, stop=230)]
    found = flags(feed(det, gen_steps(topo, 260, seed=2, stragglers=strag, **LEAN), batch=True))
    assert [(f.rank, f.evidence["step"]) for f in found] == [(9, 22), (9, 202)]
    assert found[0].id != found[1].id


def test_warmup_steps_are_not_scored(topo):
    det = FailSlowDetector(topo)
    found = flags(feed(det, gen_steps(topo, 40, stragglers=[Straggler(3, 1.3)], **LEAN), batch=True))
    assert [f.rank for f in found] == [3]
    assert found[0].evidence["step"] == CFG.warmup_steps + CFG.hits - 1  # steps 0..9 are warm-up


def test_slow_from_the_start_has_no_individual_baseline_but_is_flagged(topo):
    det = FailSlowDetector(topo)
    found = flags(feed(det, gen_steps(topo, 40, stragglers=[Straggler(3, 1.3)], **LEAN), batch=True))
    assert found[0].evidence["individual"] is None


def test_missing_fields_skip_that_signal(topo):
    det = FailSlowDetector(topo)
    no_compute = gen_steps(topo, 60, stragglers=[Straggler(11, 1.2, start=20)], compute=False, **LEAN)
    (f,) = flags(feed(det, no_compute))
    assert f.rank == 11 and f.evidence["compute_s"] is None  # comm_wait alone
    assert f.evidence["slowdown_frac"] == pytest.approx(0.2, abs=0.05)  # estimated from the wait it skipped
    det = FailSlowDetector(topo)
    nothing = gen_steps(topo, 60, stragglers=[Straggler(11, 1.2)], compute=False, comm=False, **LEAN)
    assert flags(feed(det, nothing, batch=True)) == []


def test_batch_equals_per_record_with_late_records(topo):
    def stream():
        s = gen_steps(topo, 150, seed=4, stragglers=[Straggler(7, 1.12, start=40), Straggler(90, 1.2, prob=.3)],
                      slow=[JobSlow(60, 64)], **LEAN)
        return interleave_late(s, frac=0.1)
    a, b = FailSlowDetector(topo), FailSlowDetector(topo)
    one = feed(a, stream())
    many = feed(b, stream(), batch=True)
    assert one == many and {f.rank for f in one} >= {7}
    assert a.state() == b.state() and a.buf.dropped == 0


def test_state_round_trip_mid_stream(topo):
    recs = [r for batch in interleave_late(gen_steps(topo, 120, seed=6, stragglers=[Straggler(20, 1.1, start=50)],
                                                     **LEAN), frac=0.1) for r in batch]
    cut = 60 * 128 + 77  # mid-step: open steps in the buffer
    ref = FailSlowDetector(topo)
    expected = feed(ref, [recs])
    det = FailSlowDetector(topo)
    got = feed(det, [recs[:cut]])
    assert det.buf.open  # something to carry over
    det = roundtrip(det, topo)
    got += feed(det, [recs[cut:]])
    assert got == expected and [f.rank for f in got] == [20]
    assert roundtrip(det, topo).state() == ref.state()


def test_deterministic(topo):
    def run():
        return feed(FailSlowDetector(topo), gen_steps(topo, 100, seed=8, stragglers=[Straggler(1, 1.1, start=30),
                                                                                     Straggler(2, 1.2, prob=.3)],
                                                      **LEAN), batch=True)
    first = run()
    assert first == run() and first
    for f in first:
        assert_json_safe(to_dict(f))


def test_records_are_not_mutated(topo):
    batches = list(gen_steps(topo, 20, stragglers=[Straggler(0, 1.3)], **LEAN))
    before = [[dataclasses.astuple(r) for r in b] for b in batches]
    feed(FailSlowDetector(topo), batches)
    feed(FailSlowDetector(topo), batches, batch=True)
    assert [[dataclasses.astuple(r) for r in b] for b in batches] == before


def test_set_topology_resets_per_rank_state(topo):
    det = FailSlowDetector(topo)
    feed(det, gen_steps(topo, 30, stragglers=[Straggler(5, 1.3)], **LEAN), batch=True)
    assert det.in_episode[5]
    bigger = make_topology(256)
    det.set_topology(bigger)
    assert det.in_episode.shape == (256,) and not det.in_episode.any() and det.warm == 0
    found = feed(det, gen_steps(bigger, 30, start_step=30, t0=40.0, stragglers=[Straggler(200, 1.3)], **LEAN))
    assert [f.rank for f in flags(found)] == [200]


def test_rewind_to_a_checkpoint_warms_up_again_and_keeps_the_episode(topo):
    det = FailSlowDetector(topo)
    found = feed(det, gen_steps(topo, 60, stragglers=[Straggler(8, 1.2, start=20)], **LEAN), batch=True)
    assert [f.rank for f in flags(found)] == [8]
    restart = gen_steps(topo, 40, start_step=30, t0=70.0, stragglers=[Straggler(8, 1.2)], **LEAN)  # back to 30
    assert flags(feed(det, restart, batch=True)) == []  # same straggler, same episode
    assert det.epoch == 1 and det.buf.epoch == 1 and det.warm == CFG.warmup_steps and det.in_episode[8]


def test_dead_rank_does_not_stall_scoring(topo):
    """A rank that stops reporting: its steps never complete, yet they close (most ranks moved on)."""
    def without_rank_3(batches):
        for b in batches:
            yield [r for r in b if r.rank != 3 or r.step < 30]
    det = FailSlowDetector(topo)
    found = feed(det, without_rank_3(gen_steps(topo, 80, stragglers=[Straggler(50, 1.2, start=40)], **LEAN)))
    assert [f.rank for f in flags(found)] == [50]


def test_advance_closes_the_last_steps_on_event_time(topo):
    det = FailSlowDetector(topo)
    batches = list(gen_steps(topo, 30, stragglers=[Straggler(8, 1.3)], **LEAN))
    last = [r for r in batches[-1] if r.rank != 0]  # the last step never completes
    found = feed(det, batches[:-1] + [last])
    assert det.buf.open and found
    assert det.advance(last[-1].ts) == [] and det.buf.open
    det.advance(last[0].ts + CFG.buffer.lateness_s)
    assert not det.buf.open
