"""What the incident plots show (gangwatch/report/figures.py), from records through the store's own row functions.

Each class's view must point at the culprit: the series it highlights is the culprit's and no other, and the
steps it masks (warm-up, a checkpoint, a known pause) are out of its colour scale. Expected values are computed
here from the records' numbers, never copied from the code's output.
"""

from __future__ import annotations

import datetime as dt
import statistics

import pytest
from gangwatch.schemas import Frame, Heartbeat, Hw, Job, Lifecycle, RankInfo, Stack, Step
from gangwatch.sinks.tables import telemetry_row

from gangwatch.report import figures as fg
from gangwatch.report import postmortem as pm

pytestmark = pytest.mark.unit

T0 = dt.datetime(2026, 3, 2, 8, 0, tzinfo=dt.UTC).timestamp()
RANKS, PER_NODE = 16, 4
STEPS = 80
CULPRIT, SLOW_FROM, SLOW = 5, 40, 1.2  # rank 5 (node n001, stage 0) computes 20% slower from step 40
STAGE_S = (1.0, 0.6)  # compute seconds of pipeline stage 0 and 1
CKPT_STEP, CKPT_S = 55, 7.0  # a checkpoint save: every rank's step (and compute) 7 s longer
WARM = 3.0  # step 0 after the start computes 3x, decaying over the warm-up


def place(rank: int) -> RankInfo:
    return RankInfo(rank=rank, node=f"n{rank // PER_NODE:03d}", gpu=rank % PER_NODE, tp=rank % 2,
                    pp=rank // 8, dp=(rank // 2) % 4)


JOB = Job(ts=T0, job="j1", ranks=[place(r) for r in range(RANKS)], heartbeat_s=5.0)


def compute(rank: int, step: int, outliers: dict[tuple[int, int], float] | None = None) -> float:
    base = STAGE_S[rank // 8] * (SLOW if rank == CULPRIT and step >= SLOW_FROM else 1.0)
    if step < fg.WARMUP_STEPS:
        base *= 1.0 + (WARM - 1.0) * (1.0 - step / fg.WARMUP_STEPS)
    if step == CKPT_STEP:
        base += CKPT_S
    return base * (outliers or {}).get((rank, step), 1.0)


def slow_job(outliers: dict[tuple[int, int], float] | None = None) -> list:
    """The job record, then every rank's steps: a synchronous step lasts its slowest rank's compute + 0.2 s."""
    recs: list = [JOB]
    t = T0
    for s in range(STEPS):
        comp = [compute(r, s, outliers) for r in range(RANKS)]
        t += max(comp) + 0.2
        recs += [Step(ts=t + 0.001 * r, job="j1", rank=r, step=s, step_s=max(comp) + 0.2, compute_s=comp[r])
                 for r in range(RANKS)]
    return recs


def window(recs: list, *, named=(CULPRIT,), culprits=("n001",), stacks=None) -> pm.StepWindow:
    rows = [telemetry_row(r) for r in recs]
    steps = [r for r in rows if r["kind"] == "step"]
    return pm.step_window(steps, T0, max(r["ts"] for r in rows) + 1.0, named=named, culprits=culprits,
                          where=pm.places(telemetry_row(JOB)["payload"]),
                          others=pm.events([r for r in rows if r["kind"] != "step"]), stacks=stacks)


def test_warm_up_and_an_unannounced_checkpoint_are_masked_and_nothing_else():
    w = window(slow_job())
    assert fg.masked_steps(w) == {**dict.fromkeys(range(fg.WARMUP_STEPS), fg.WARMUP), CKPT_STEP: fg.JOB_PAUSE}


def test_a_slow_stretch_longer_than_a_pause_is_not_masked():
    slow = {(r, s): 3.0 for r in range(RANKS) for s in range(30, 30 + fg.PAUSE_RUN + 1)}  # whole job 3x: a slowdown
    masked = fg.masked_steps(window(slow_job(slow)))
    assert not set(range(30, 30 + fg.PAUSE_RUN + 1)) & set(masked)


def test_an_announced_pause_masks_the_steps_it_brackets():
    recs = slow_job()
    at = {r.step: r.ts for r in recs if isinstance(r, Step) and r.rank == 0}
    recs += [Lifecycle(ts=at[20] + 0.05, job="j1", event="pause", reason="eval"),
             Lifecycle(ts=at[22] - 0.5, job="j1", event="resume")]
    masked = fg.masked_steps(window(recs))
    assert {s for s, why in masked.items() if why == f"{fg.PAUSE} (eval)"} == {21, 22}


def test_fail_slow_highlights_the_culprit_by_its_compute_against_its_stage():
    w = window(slow_job())
    d = fg.deviation(w, fg.masked_steps(w), since_step=SLOW_FROM)
    assert d.what == "compute_s" and d.culprits == [CULPRIT]
    want = 100.0 * (SLOW * STAGE_S[0] / statistics.median([STAGE_S[0]] * 7 + [SLOW * STAGE_S[0]]) - 1.0)
    assert d.mean[CULPRIT] == pytest.approx(want)
    assert max(d.mean, key=lambda r: d.mean[r]) == CULPRIT  # the highlighted series is the one that stands out
    assert all(abs(v) < 1e-9 for r, v in d.mean.items() if r != CULPRIT)
    # the step time all ranks share would not show it: every rank's step time is the same at every step
    assert all(len({p.step_s for r in w.ranks for p in w.series[r] if p.step == s}) == 1 for s in w.steps)


def test_masked_steps_are_out_of_the_colour_scale():
    # warm-up: ranks far apart (cold caches); the checkpoint: one rank's save 50% slower than the others'
    outliers = {(r, s): 1.6 if r % 2 else 0.5 for r in range(RANKS) for s in range(fg.WARMUP_STEPS)}
    outliers[(12, CKPT_STEP)] = 1.5
    w = window(slow_job(outliers))
    masked = fg.masked_steps(w)
    assert set(masked) == {*range(fg.WARMUP_STEPS), CKPT_STEP}
    d = fg.deviation(w, masked)
    kept_out = [abs(v) for j, s in enumerate(d.steps) if s in masked for row in d.grid if (v := row[j]) is not None]
    assert d.scale == (-d.scale[1], d.scale[1]) and d.scale[1] < max(kept_out)
    mine = [v for s, v in zip(d.steps, d.row(CULPRIT), strict=True) if s not in masked and v is not None]
    assert d.scale[1] == pytest.approx(max(mine))  # set by the unmasked cells: the culprit's deviation at most
    unmasked = fg.deviation(w, {})
    assert unmasked.scale[1] > 2 * d.scale[1]  # what the mask keeps out would otherwise set the scale


def _heartbeats(dead: int, dead_at: float, end: float) -> list[Heartbeat]:
    out = []
    for r in range(RANKS):
        t = T0 + 0.3 * r
        while t < (dead_at if r == dead else end):
            out.append(Heartbeat(ts=t, job="j1", rank=r))
            t += JOB.heartbeat_s
    return out


def test_fail_stop_shows_the_culprit_silent_and_its_xid_marked():
    recs = [r for r in slow_job() if not isinstance(r, Step) or r.step < 30]
    last_step_ts = max(r.ts for r in recs if isinstance(r, Step))
    end = last_step_ts + 60.0
    xid = Hw(ts=last_step_ts + 0.5, node="n001", source="xid", code=79, gpu=1, message="Xid 79")
    elsewhere = Hw(ts=last_step_ts + 1.0, node="n003", source="nic", message="link down")
    recs += _heartbeats(CULPRIT, last_step_ts - 1.0, end) + [xid, elsewhere, Step(
        ts=end, job="j1", rank=0, step=29, step_s=0.1)]
    w = window(recs)
    live = fg.liveness(w, ["n001"])
    assert live.culprits == [CULPRIT] and live.culprit_nodes == ["n001"]
    assert [(e.what, e.node) for e in live.marks] == [("Xid 79", "n001")]  # the culprit's node's only
    beats = [r.ts for r in recs if isinstance(r, Heartbeat) and r.rank == CULPRIT]
    assert live.silent_from(CULPRIT) == pytest.approx(max(beats))
    assert live.age[CULPRIT][-1] == pytest.approx(live.times[-1] - max(beats))
    others = [v for r in live.age if r != CULPRIT for v in live.age[r][-5:]]
    assert max(others) < 2 * JOB.heartbeat_s < live.age[CULPRIT][-1]  # the live ones beat, the culprit is silent
    assert {row[-1] for row in live.progress.values()} == {29}  # every node stopped at the same step


def test_hang_finds_the_culprit_in_its_own_stack_cluster():
    healthy = [Frame(func="all_reduce", file="torch/distributed/distributed_c10d.py", line=2501),
               Frame(func="train_step", file="megatron/training.py", line=700)]
    stuck = [Frame(func="_recv", file="multiprocessing/connection.py", line=384),
             Frame(func="__next__", file="torch/utils/data/dataloader.py", line=630),
             Frame(func="train_step", file="megatron/training.py", line=700)]
    recs = [Stack(ts=T0 + 100 + 0.01 * r, job="j1", rank=r, snapshot="s-1", format="frames",
                  frames=stuck if r == CULPRIT else healthy) for r in range(RANKS)]
    sigs = pm.stack_signatures([telemetry_row(r) for r in recs])
    clusters = fg.stack_clusters(window(slow_job(), stacks=sigs))
    assert clusters[0].ranks == tuple(r for r in range(RANKS) if r != CULPRIT) and not clusters[0].culprit
    flagged = [c for c in clusters if c.culprit]
    assert [c.ranks for c in flagged] == [(CULPRIT,)] and flagged[0].nodes == ("n001",)
    assert fg.distinct_frame(flagged[0], clusters[0]) == "_recv (connection.py)"


def test_sdc_votes_per_step_and_replica_and_the_culprit_dissents():
    bad_from = 30
    recs = []
    for rec in slow_job():
        if isinstance(rec, Step):
            p = place(rec.rank)
            digest = f"{p.tp}-{p.pp}-{rec.step}" + ("-x" if rec.rank == CULPRIT and rec.step >= bad_from else "")
            rec = Step(ts=rec.ts, job="j1", rank=rec.rank, step=rec.step, step_s=rec.step_s, replica_digest=digest)
        recs.append(rec)
    w = window(recs)
    rows = [{**telemetry_row(r), "digest": r.replica_digest} for r in recs if isinstance(r, Step)]
    w = pm.step_window(rows, w.start, w.end, named=[CULPRIT], culprits=["n001"], where=w.places, others=w.events)
    v = fg.digest_vote(w, fg.masked_steps(w))
    shard = (place(CULPRIT).tp, place(CULPRIT).pp)
    assert v.culprits == [CULPRIT]
    assert set(v.rows) == {r for r in range(RANKS) if (place(r).tp, place(r).pp) == shard}
    assert v.dissents(CULPRIT) == STEPS - bad_from
    assert all(v.dissents(r) == 0 for r in v.rows if r != CULPRIT)


def test_ranks_text_compresses_runs():
    assert fg.ranks_text([0, 1, 2, 3, 5, 8, 9]) == "0-3, 5, 8-9"
