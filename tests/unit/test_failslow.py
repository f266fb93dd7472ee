"""FailSlowDetector: straggler scenarios, the score / threshold / persistence steps, and the contract."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from gangwatch.detectors.catalog import typed
from gangwatch.detectors.config import FailSlowConfig
from gangwatch.detectors.failslow import FailSlowDetector
from gangwatch.detectors.slowscore import (
    individual_scores,
    needed_hits,
    peer_groups,
    persist,
    relative_scores,
    slowness,
    step_costs,
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


def test_individual_scores_ignore_what_happens_to_everyone_and_what_a_rank_always_was():
    groups = peer_groups(np.zeros(32, dtype=np.int32), 4)
    nan = np.full(32, np.nan)
    everyone_slower = np.full(32, 0.7 * 1.3)
    slow, scale, med = slowness(everyone_slower, nan, nan, groups, CFG)
    assert np.abs(individual_scores(slow, np.zeros(32), scale)).max() < 1e-9  # relative to the stage: nothing
    one_slower = np.full(32, 0.7)
    one_slower[7] *= 1.1
    slow, scale, _ = slowness(one_slower, nan, nan, groups, CFG)
    usual = np.zeros(32)
    assert individual_scores(slow, usual, scale)[7] > CFG.ind_threshold
    usual[7] = 0.1  # it always was 10 % slower: no change, no score
    assert abs(individual_scores(slow, usual, scale)[7]) < 1e-9
    assert np.isnan(individual_scores(slow, nan, scale)).all()


def test_slowness_falls_back_on_the_time_not_spent_waiting():
    groups = peer_groups(np.zeros(16, dtype=np.int32), 4)
    step, comm = np.ones(16), np.full(16, 0.3)
    comm[3] = 0.23  # worked 0.77 instead of 0.7
    slow, scale, med = slowness(np.full(16, np.nan), comm, step, groups, CFG)
    assert slow[3] == pytest.approx(0.1) and med[0] == pytest.approx(0.7) and scale[0] == CFG.floor_frac


def test_a_stragglers_cost_is_what_it_adds_over_the_slowest_stage():
    med_work = np.array([0.70, 0.70, 0.80, 0.80])  # stages 0 and 1 are lighter than stage 2
    level = np.array([0.10, 0.20, 0.05, 0.0])
    costs = step_costs(level, med_work, 1.0)
    assert costs.tolist() == pytest.approx([0.0, 0.04, 0.04, 0.0])  # 0.77 < 0.80: free; 0.84 - 0.80 ...


def test_needed_hits_rise_with_the_stray_hit_rate():
    assert needed_hits(10, 1e-4, 1e-7, 3) == 3  # a quiet job: the floor
    assert needed_hits(30, 1e-4, 1e-7, 4) == 4
    noisy = needed_hits(10, 0.05, 1e-7, 3)
    assert noisy > 3 and needed_hits(30, 0.05, 1e-7, 4) > noisy
    assert needed_hits(10, 0.5, 1e-7, 3) == 11  # so noisy that ten steps can never tell


def test_threshold_needs_both_scores():
    rel = np.array([3.5, 3.5, 2.5, 0.0, np.nan, 1.9, 9.0])
    ind = np.array([2.0, 1.9, 3.0, 9.0, 9.0, 9.0, np.nan])
    assert threshold(rel, ind, CFG).tolist() == [True, False, True, False, False, False, False]


def test_a_rank_that_usually_stands_out_needs_the_full_change():
    rel, ind = np.array([9.0, 9.0, 9.0]), np.array([2.5, 2.5, 3.1])
    usual = np.array([0.0, 5.0, 5.0])  # ranks 1 and 2 are always 5 spreads slower than their stage
    assert threshold(rel, ind, CFG, usual).tolist() == [True, False, True]


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
    scored = 3600 - CFG.warmup_steps  # every rank scored on every step; baselines learn from its quiet ones
    assert det.nbase.max() <= scored and det.nbase.min() >= 0.8 * scored and not det.het.any()


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
    strag = [Straggler(9, 1.15, start=50, stop=90), Straggler(9, 1.15, start=200, stop=230)]
    found = flags(feed(det, gen_steps(topo, 260, seed=2, stragglers=strag, **LEAN), batch=True))
    assert [(f.rank, f.evidence["step"]) for f in found] == [(9, 52), (9, 202)]
    assert found[0].id != found[1].id


def test_warmup_and_calibration_steps_flag_nobody(topo):
    det = FailSlowDetector(topo)
    quiet = CFG.warmup_steps + CFG.calib_steps
    found = feed(det, gen_steps(topo, quiet + 20, stragglers=[Straggler(3, 1.3, start=quiet + 5)], **LEAN),
                 batch=True)
    assert [(f.rank, f.evidence["step"]) for f in flags(found)] == [(3, quiet + 5 + CFG.hits - 1)]
    assert det.calib == CFG.calib_steps and det.first_step == CFG.warmup_steps


def test_slow_from_the_start_is_heterogeneous_reported_once_and_never_a_straggler(topo):
    """Several ranks a few % to 15 % slower than their stage from the first step: a difference, not a fault."""
    slower = {3: 1.03, 40: 1.06, 77: 1.10, 120: 1.15}
    det = FailSlowDetector(topo)
    found = feed(det, gen_columns(topo, 600, seed=4, stragglers=[Straggler(r, f) for r, f in slower.items()],
                                  **LEAN), batch=True)
    assert flags(found) == []
    het = by_type(found, "heterogeneous")
    assert sorted(f.rank for f in het) == sorted(slower)  # each once, then quiet
    for f in het:
        ev = f.evidence
        assert ev["ratio"] == pytest.approx(slower[f.rank], abs=0.01)
        # judged over the calibration steps and on, until het_min_s of event time (1 s steps here) had passed
        assert ev["since_step"] == CFG.warmup_steps and ev["step"] - ev["since_step"] + 1 == ev["steps"]
        assert ev["steps"] >= CFG.calib_steps and f.ts >= CFG.warmup_steps + CFG.het_min_s
        assert f.detector == "failslow.heterogeneous"
        assert f.node == topo.node_of(f.rank)
    assert det.het.sum() == len(slower) and not det.in_episode.any()


def test_a_busy_host_during_a_short_calibration_is_no_heterogeneity(topo):
    """A job of 0.125 s steps calibrates in 4 s: a rank slowed 30 % by a busy host for those seconds only is not
    steadily slower. Judged over the calibration steps alone it was; over het_min_s
    (60 s) it is nothing; a rank 15 % slower all along still is heterogeneous."""
    burst = Straggler(5, 1.3, start=CFG.warmup_steps, stop=CFG.warmup_steps + CFG.calib_steps + 2)

    def het(cfg: FailSlowConfig) -> list[int]:
        found = feed(FailSlowDetector(topo, cfg), gen_columns(topo, 700, step_s=0.125, seed=7, stragglers=[
            burst, Straggler(90, 1.15)], **LEAN), batch=True)
        assert flags(found) == []
        return sorted(f.rank for f in by_type(found, "heterogeneous"))

    assert het(FailSlowConfig(het_min_s=0.0)) == [5, 90]
    assert het(CFG) == [90]


def test_in_a_job_of_short_steps_a_straggler_is_judged_over_min_window_s(topo):
    """0.125 s steps: 10 steps are 1.25 s. A rank slowed 30 % for 2 s (a busy host: its trainer client retrying a
    broker that went away) is no straggler; one slowed for good is, about min_window_s after it began."""
    start = CFG.warmup_steps + CFG.calib_steps + 480  # after heterogeneity was judged (60 s of 0.125 s steps)

    def found(cfg: FailSlowConfig, stop: int | None) -> list:
        det = FailSlowDetector(topo, cfg)
        return flags(feed(det, gen_columns(topo, start + 200, step_s=0.125, seed=8, stragglers=[
            Straggler(17, 1.3, start=start, stop=stop)], **LEAN), batch=True))

    assert [f.rank for f in found(FailSlowConfig(min_window_s=0.0), start + 16)] == [17]  # what it did before
    assert found(CFG, start + 16) == []
    [f] = found(CFG, None)
    assert f.rank == 17 and 6.0 <= (f.evidence["step"] - start) * 0.125 <= CFG.min_window_s + 2.0


def test_a_heterogeneous_rank_that_then_slows_down_is_a_straggler(topo):
    det = FailSlowDetector(topo)
    found = feed(det, gen_steps(topo, 120, seed=5, stragglers=[Straggler(21, 1.10, stop=80),
                                                                Straggler(21, 1.25, start=80)], **LEAN), batch=True)
    assert [f.rank for f in by_type(found, "heterogeneous")] == [21]
    [f] = flags(found)
    assert f.rank == 21 and 80 <= f.evidence["step"] < 80 + 10
    assert f.evidence["individual"] >= CFG.support_threshold and f.evidence["relative"] >= CFG.rel_threshold


@pytest.mark.parametrize("seed", range(6))
def test_intermittent_slowness_is_found_within_30_steps(topo, seed):
    """20 % slower in a quarter of the steps (on average): found within 30 steps of its onset."""
    det = FailSlowDetector(topo)
    onset = 60
    found = feed(det, gen_steps(topo, 200, seed=seed, stragglers=[Straggler(70, 1.20, start=onset, prob=0.25)],
                                **LEAN), batch=True)
    [f] = flags(found)
    assert f.rank == 70 and f.evidence["step"] - onset < 30
    assert 0.0 < f.evidence["cost_frac"] < 0.2 * 0.7  # paid in some steps only: less than a steady straggler's


def test_missing_fields_skip_that_signal(topo):
    det = FailSlowDetector(topo)
    no_compute = gen_steps(topo, 80, stragglers=[Straggler(11, 1.2, start=50)], compute=False, **LEAN)
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
        return feed(FailSlowDetector(topo), gen_steps(topo, 100, seed=8, stragglers=[Straggler(1, 1.1, start=45),
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
    feed(det, gen_steps(topo, 60, stragglers=[Straggler(5, 1.3, start=45)], **LEAN), batch=True)
    assert det.in_episode[5]
    bigger = make_topology(256)
    det.set_topology(bigger)
    assert det.in_episode.shape == (256,) and not det.in_episode.any() and det.warm == 0
    assert det.calib == 0 and not det.het.any()
    found = feed(det, gen_steps(bigger, 60, start_step=60, t0=70.0, stragglers=[Straggler(200, 1.3, start=105)],
                                **LEAN))
    assert [f.rank for f in flags(found)] == [200]


def test_rewind_to_a_checkpoint_warms_up_again_and_keeps_the_episode(topo):
    det = FailSlowDetector(topo)
    found = feed(det, gen_steps(topo, 80, stragglers=[Straggler(8, 1.2, start=45)], **LEAN), batch=True)
    assert [f.rank for f in flags(found)] == [8]
    restart = gen_steps(topo, 40, start_step=50, t0=90.0, stragglers=[Straggler(8, 1.2)], **LEAN)  # back to 50
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
    batches = list(gen_steps(topo, 60, stragglers=[Straggler(8, 1.3, start=45)], **LEAN))
    last = [r for r in batches[-1] if r.rank != 0]  # the last step never completes
    found = feed(det, batches[:-1] + [last])
    assert det.buf.open and found
    assert det.advance(last[-1].ts) == [] and det.buf.open
    det.advance(last[0].ts + CFG.buffer.lateness_s)
    assert not det.buf.open


# --- real jobs: heavy-tailed step times ----------------------------------------------------------


def heavy(topo, n_steps, seed, mode, straggler=None, start=100, factor=1.3):
    """Columns of a job whose compute times are heavy-tailed, as on real CPU jobs (p90 ~ 1.5 x median):
    `common`: the whole job's step varies that much (contention), each rank 1.5 % on top; `spikes`: 5 % of
    rank-steps take 1.5 x as long; `mixed`: common, 10 % per rank and 3 % spikes."""
    from gangwatch.detectors.runs import StepColumns

    rng = np.random.default_rng(seed)
    n, t = topo.size, 0.0
    for s in range(n_steps):
        jitter = {"common": 0.015, "spikes": 0.015, "mixed": 0.10}[mode]
        c = 0.7 * np.exp(jitter * rng.standard_normal(n))
        if mode in ("common", "mixed"):
            c *= np.exp(0.316 * rng.standard_normal())  # ln(1.5) / 1.2816: p90 = 1.5 x median
        if mode in ("spikes", "mixed"):
            c *= np.where(rng.random(n) < (0.05 if mode == "spikes" else 0.03), 1.5, 1.0)
        if straggler is not None and s >= start:
            c[straggler] *= factor
        step = float(c.max()) + 0.25
        t += step
        yield StepColumns.from_arrays(np.full(n, t), np.full(n, s), np.arange(n), step_s=np.full(n, step),
                                      compute_s=c, comm_wait_s=step - c - 0.01)


@pytest.mark.parametrize("mode", ["common", "spikes", "mixed"])
@pytest.mark.parametrize("size", [4, 128])
def test_heavy_tailed_healthy_jobs_flag_nobody(mode, size):
    topo = make_topology(size, tp=1, pp=1, gpus_per_node=2) if size == 4 else make_topology(size)
    for seed in range(2):
        det = FailSlowDetector(topo)
        found = [f for cols in heavy(topo, 1500, seed, mode) for f in det.observe_many(cols)]
        assert found == [], [(f.type, f.rank, f.evidence) for f in found]


@pytest.mark.parametrize("mode", ["common", "spikes"])
def test_heavy_tailed_jobs_still_show_a_rank_that_slows_by_30_percent(mode):
    topo = make_topology(4, tp=1, pp=1, gpus_per_node=2)  # the real-job test's shape: 4 ranks, 2 nodes
    det = FailSlowDetector(topo)
    found = [f for cols in heavy(topo, 200, 9, mode, straggler=2, start=100) for f in det.observe_many(cols)]
    first = flags(found)[0]
    assert first.rank == 2 and first.evidence["step"] - 100 < 15
    assert {f.rank for f in found} == {2}


# --- what a straggler costs ----------------------------------------------------------------------


def test_cost_and_floor_tell_what_replacing_the_straggler_gains(topo):
    """A 15 % heterogeneous rank sets a floor: a 20 % straggler's replacement gains only down to it."""
    det = FailSlowDetector(topo)
    found = feed(det, gen_steps(topo, 100, seed=3, stragglers=[Straggler(10, 1.15), Straggler(90, 1.20, start=60)],
                                **LEAN), batch=True)
    assert [f.rank for f in by_type(found, "heterogeneous")] == [10]
    [f] = flags(found)
    ev = f.evidence
    assert f.rank == 90 and ev["cost_frac"] == pytest.approx(0.2 * 0.7, rel=0.2)  # compute is 70 % of a step
    assert ev["floor_frac"] == pytest.approx(0.15 * 0.7, rel=0.2)
    ft = typed(f)
    assert ft.slowdown_frac == ev["cost_frac"] and ft.slow_floor == ev["floor_frac"]


def test_a_growing_straggler_is_reported_again_with_its_cost(topo):
    """A thermal ramp: found early at a small cost, reported again as it grows, up to its full cost."""
    det = FailSlowDetector(topo)
    ramp = [Straggler(33, 1 + 0.3 * k / 40, start=50 + k, stop=51 + k) for k in range(40)]
    found = flags(feed(det, gen_steps(topo, 160, seed=2, stragglers=[*ramp, Straggler(33, 1.3, start=90)], **LEAN),
                       batch=True))
    assert {f.rank for f in found} == {33} and 2 <= len(found) <= CFG.max_reports
    costs = [f.evidence["cost_frac"] for f in found]
    assert costs == sorted(costs) and costs[-1] == pytest.approx(0.3 * 0.7 / 1.16, rel=0.25)  # all of it, at last
    assert len({f.evidence["onset_ts"] for f in found}) == 1  # one episode


def test_state_round_trip_mid_calibration(topo):
    recs = [r for b in gen_steps(topo, 90, seed=6, stragglers=[Straggler(20, 1.1), Straggler(30, 1.2, start=60)],
                                 **LEAN) for r in b]
    cut = 25 * 128 + 5
    ref = FailSlowDetector(topo)
    expected = feed(ref, [recs])
    det = FailSlowDetector(topo)
    got = feed(det, [recs[:cut]])
    assert 0 < det.calib < CFG.calib_steps
    det = roundtrip(det, topo)
    got += feed(det, [recs[cut:]])
    assert got == expected and {(f.type, f.rank) for f in got} == {("heterogeneous", 20), ("fail_slow", 30)}
