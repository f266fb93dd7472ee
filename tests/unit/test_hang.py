"""Hang detector: stall threshold from the job's own step rhythm, checkpoints, re-arming, lagging ranks, state."""

from __future__ import annotations

import json

import pytest
from gangwatch.detectors.hang import HangDetector
from gangwatch.detectors.runs import RecordRun
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Framework, Heartbeat, Job, Lifecycle, RankInfo, Step

pytestmark = pytest.mark.unit

T0 = 1_000.0
N = 16  # ranks: 2 nodes x 8 GPUs


def topo(nodes=2, per_node=8) -> Topology:
    ranks = [RankInfo(rank=n * per_node + g, node=f"n{n:03d}", gpu=g) for n in range(nodes) for g in range(per_node)]
    return Topology.from_job(Job(ts=T0, job="j", ranks=ranks))


def step_s(k: int, ckpt_every: int | None = None, ckpt_s: float = 15.0) -> float:
    return ckpt_s if ckpt_every and k > 0 and k % ckpt_every == 0 else 1.0


def steps(first: int, last: int, t_start: float, *, ckpt_every=None, skip=(), ranks=N):
    """Every rank reports steps first..last; step k ends step_s(k) after step k-1. Returns (records, end ts)."""
    out, t = [], t_start
    for k in range(first, last + 1):
        t += step_s(k, ckpt_every)
        for r in range(ranks):
            if (r, k) in skip:
                continue
            out.append(Step(ts=round(t + 0.002 * r, 6), job="j", rank=r, step=k, step_s=step_s(k, ckpt_every)))
    return out, t


def run(det, recs, until=None, tick=1.0):
    """Advance to each record's time and observe it; then advance every `tick` up to `until` (silence)."""
    found = []
    for rec in recs:
        found += det.advance(rec.ts)
        found += det.observe(rec)
    if until is not None and recs:
        t = recs[-1].ts
        while t < until:
            t = min(until, t + tick)
            found += det.advance(t)
    return found


def test_stall_after_step_100_is_one_hang_at_last_progress_plus_threshold() -> None:
    det = HangDetector(topo())
    recs, _ = steps(0, 100, T0)
    last_progress = max(r.ts for r in recs if r.step == 100)  # when the last rank finished step 100
    found = run(det, recs, until=last_progress + 900)
    assert len(found) == 1
    [f] = found
    assert (f.type, f.rank, f.node, f.detector) == ("hang", None, None, "hang.progress")
    ev = f.evidence
    assert ev["last_step"] == 100
    assert ev["last_progress_ts"] == pytest.approx(last_progress)
    assert ev["baseline_s"] == pytest.approx(1.0)
    # max(min_stall 20 s, 10 x 1 s median, 1.5 x 1 s longest interval) = 20 s
    assert ev["threshold_s"] == pytest.approx(max(20.0, 10 * 1.0, 1.5 * 1.0))
    assert f.ts == pytest.approx(last_progress + ev["threshold_s"])
    assert f.ts - last_progress < 60 < 600  # far below a fixed ten-minute timeout
    assert ev["lagging_ranks"] == []


def test_threshold_scales_with_slow_step_rhythm() -> None:
    det = HangDetector(topo())
    recs = [Step(ts=T0 + 5.0 * k + 0.01 * r, job="j", rank=r, step=k, step_s=5.0) for k in range(40) for r in range(N)]
    found = run(det, recs, until=recs[-1].ts + 600)
    [f] = found
    assert f.evidence["threshold_s"] == pytest.approx(50.0, rel=1e-3)  # 10 x 5 s


def test_no_hang_while_steps_keep_coming() -> None:
    recs, end = steps(0, 300, T0)
    assert run(HangDetector(topo()), recs, until=end + 10) == []


def test_periodic_checkpoint_is_not_a_hang() -> None:
    recs, end = steps(0, 300, T0, ckpt_every=50)  # every 50th step takes 15 s
    det = HangDetector(topo())
    found = []
    for rec in recs:  # advance finely through the long steps
        t = det.progress_ts
        while t + 0.5 < rec.ts:
            t += 0.5
            found += det.advance(t)
        found += det.advance(rec.ts)
        found += det.observe(rec)
    assert found == []
    assert det.threshold_s() >= 1.5 * 15.0  # the checkpoint step is in the baseline
    # a real stall after the checkpoint rhythm is still caught, well inside ten minutes
    found = run(det, recs[-1:], until=end + 600)
    assert len(found) == 1 and found[0].evidence["threshold_s"] < 60


def test_progress_resuming_rearms() -> None:
    det = HangDetector(topo())
    recs, end = steps(0, 100, T0)
    first = run(det, recs, until=end + 40)
    assert len(first) == 1
    assert det.advance(end + 39) == []  # one stall, one finding
    recs2, end2 = steps(101, 130, end + 40)
    assert run(det, recs2) == []  # progress resumed: no new finding while it lasts
    second = run(det, recs2[-1:], until=end2 + 120)
    assert len(second) == 1
    assert second[0].id != first[0].id and second[0].evidence["last_step"] == 130
    # the 41 s stall was reported as a hang, so it is not part of the job's rhythm: the next
    # hang is found as fast as the first
    assert second[0].evidence["threshold_s"] == pytest.approx(first[0].evidence["threshold_s"])
    assert second[0].ts - second[0].evidence["last_progress_ts"] < 600


def test_lagging_ranks_name_the_rank_missing_the_newest_step() -> None:
    recs, end = steps(0, 101, T0, skip={(7, 101)})  # rank 7 never finishes step 101
    found = run(HangDetector(topo()), recs, until=end + 120)
    assert len(found) == 1
    assert found[0].evidence["lagging_ranks"] == [7] and found[0].evidence["last_step"] == 101


def test_lagging_ranks_are_not_listed_when_many_lag() -> None:
    skip = {(r, 101) for r in range(8)}  # half the job is behind: no hint
    recs, end = steps(0, 101, T0, skip=skip)
    [f] = run(HangDetector(topo()), recs, until=end + 120)
    assert f.evidence["lagging_ranks"] == []


def test_no_finding_before_any_step() -> None:
    det = HangDetector(topo())
    assert det.advance(T0) == []
    assert det.advance(T0 + 10_000) == []


def test_without_baseline_the_detector_is_patient() -> None:
    recs, end = steps(0, 2, T0)  # too few steps for a baseline (warm-up)
    det = HangDetector(topo())
    found = run(det, recs, until=end + 200)
    assert len(found) == 1
    assert found[0].evidence["baseline_s"] is None
    assert found[0].evidence["threshold_s"] > det.config.min_stall_s


def test_findings_do_not_depend_on_advance_cadence() -> None:
    recs, end = steps(0, 150, T0, skip={(3, 150)})
    a = run(HangDetector(topo()), recs, until=end + 300, tick=0.25)
    det = HangDetector(topo())
    b = []
    for rec in recs:
        b += det.observe(rec)
    b += det.advance(end + 300)
    assert a == b and len(a) == 1


def test_state_round_trip_mid_stream() -> None:
    t = topo()
    recs, end = steps(0, 120, T0, ckpt_every=50, skip={(9, 120)})
    for cut in (10, len(recs) // 2, len(recs) - 3):
        det = HangDetector(t)
        first = run(det, recs[:cut])
        snap = json.loads(json.dumps(det.state()))  # a JSON-able value
        clone = HangDetector.from_state(snap, t)
        a = run(det, recs[cut:], until=end + 120)
        b = run(clone, recs[cut:], until=end + 120)
        assert a == b and len(a) == 1 and first == []
        assert a[0].evidence["lagging_ranks"] == [9]


def test_state_round_trip_after_hang_keeps_it_reported() -> None:
    t = topo()
    recs, end = steps(0, 60, T0)
    det = HangDetector(t)
    assert len(run(det, recs, until=end + 60)) == 1
    clone = HangDetector.from_state(json.loads(json.dumps(det.state())), t)
    assert clone.advance(end + 500) == [] and det.advance(end + 500) == []


def test_new_topology_resets_progress() -> None:
    recs, end = steps(0, 50, T0)
    det = HangDetector(topo())
    run(det, recs)
    det.set_topology(topo(nodes=3))
    assert det.last_step.shape == (24,) and det.max_step == -1
    assert det.advance(end + 10_000) == []


def test_state_snapshot_is_not_changed_by_later_records() -> None:
    recs, end = steps(0, 80, T0)
    det = HangDetector(topo())
    run(det, recs[:500])
    snap = det.state()
    frozen = json.dumps(snap, sort_keys=True)
    run(det, recs[500:], until=end + 60)
    assert json.dumps(snap, sort_keys=True) == frozen


@pytest.mark.parametrize("how", [{"type": "exit", "extra": {"code": 0}}, {"type": "exception",
                                                                          "message": "CUDA error"}])
def test_a_job_whose_ranks_stopped_after_their_last_step_is_not_hung(how) -> None:
    """The end of a job (clean exits) or a crash explains the stall: fail-stop speaks for it, not a hang; new
    progress (a restart) re-arms the detector."""
    recs, end = steps(0, 50, T0)
    stops = [Framework(ts=end + 0.5 + 0.01 * r, job="j", rank=r, **how) for r in range(N)]
    det = HangDetector(topo())
    assert run(det, [*recs, *stops], until=end + 300) == []
    more, end2 = steps(51, 60, end + 400)
    assert [f.type for f in run(det, more, until=end2 + 2000)] == ["hang"]


# --- known pauses ----------------------------------------------------------------------------------


def _paused(first_pause_s: float, reason="checkpoint", rank=0):
    """100 steps at 1 s, then a known pause of `first_pause_s` on `rank` (None: the job), then 50 more steps."""
    before, t = steps(0, 100, T0)
    pause = Lifecycle(ts=t + 0.1, job="j", rank=rank, event="pause", reason=reason)
    resume = Lifecycle(ts=t + 0.1 + first_pause_s, job="j", rank=rank, event="resume", reason=reason)
    after, end = steps(101, 150, t + 0.1 + first_pause_s)
    return [*before, pause, resume, *after], pause, end


@pytest.mark.parametrize("rank", [0, None])
def test_a_known_pause_is_no_hang_however_long_it_is_within_its_limit(rank):
    recs, _, end = _paused(300.0, rank=rank)  # five minutes of checkpoint: 15x the stall threshold
    assert run(HangDetector(topo()), recs, until=end + 5) == []


def test_a_known_pause_that_never_ends_is_a_hang_at_its_limit():
    recs, pause, _ = _paused(10.0)
    det = HangDetector(topo())
    cut = [r for r in recs if r.ts <= pause.ts]  # the resume never comes
    [f] = run(det, cut, until=pause.ts + 700)
    assert f.type == "hang" and abs(f.ts - (pause.ts + 600.0)) <= 1.0  # pause_limit_s for a first pause


def test_a_pause_limit_is_learned_from_the_jobs_own_pauses():
    """After a 40 s checkpoint, the next one may last 3 x 40 s, not the first pause's 600 s."""
    recs, pause, end = _paused(40.0)
    det = HangDetector(topo())
    assert run(det, recs, until=end + 1) == []
    assert det.pause_limit_s("checkpoint") == 120.0 and det.pause_limit_s("eval") == 600.0
    second = Lifecycle(ts=end + 0.5, job="j", rank=0, event="pause", reason="checkpoint")
    clone = HangDetector.from_state(json.loads(json.dumps(det.state())), topo())
    [f] = run(clone, [second], until=end + 200)
    assert abs(f.ts - (second.ts + 120.0)) <= 1.0


# --- frozen ranks: the agent's heartbeats for a process alive but stopped, traced or in D (issue 35) ----------

def agent_beats(rank: int, first: float, last: float, state: str = "T", every: float = 5.0) -> list[Heartbeat]:
    """What a node agent sends for `rank` frozen in `state` (producers/agent/frozen.py), every `every` seconds."""
    out, t = [], first
    while t <= last:
        out.append(Heartbeat(ts=round(t, 6), job="j", rank=rank, extra={"source": "agent", "proc_state": state}))
        t += every
    return out


def frozen_stall(rank: int = 11, state: str = "T", *, from_s: float = 2.0, for_s: float = 60.0):
    """Steps 0..100 (a step a second), then `rank` frozen from `from_s` after the last progress for `for_s`; every
    rank's own heartbeats every 5 s throughout (a stall stops steps, not heartbeats), none of `rank`'s while frozen."""
    recs, end = steps(0, 100, T0)
    progress = min(r.ts for r in recs if r.step == 100)
    frozen = (progress + from_s, progress + from_s + for_s)
    own = [Heartbeat(ts=round(T0 + 5.0 * k + 0.01 * r, 6), job="j", rank=r) for k in range(int((end + 300 - T0) / 5))
           for r in range(N) if not (r == rank and frozen[0] - 5.0 < T0 + 5.0 * k <= frozen[1])]
    return [*recs, *own, *agent_beats(rank, *frozen, state)], progress


@pytest.mark.parametrize("state,words", [("T", "stopped"), ("t", "stopped by a tracer"),
                                         ("D", "in uninterruptible sleep")])
def test_a_hang_names_the_rank_its_agent_reports_frozen(state, words):
    recs, progress = frozen_stall(state=state)
    hang, frozen = run(HangDetector(topo()), sorted(recs, key=lambda r: r.ts), until=progress + 100)
    assert hang.type == "hang" and frozen.type == "frozen_rank" and frozen.ts == hang.ts
    assert (frozen.rank, frozen.node, frozen.gpu) == (11, "n001", 3)
    ev = frozen.evidence
    assert (ev["proc_state"], ev["state"], ev["since_ts"], ev["last_step"]) == (state, words, progress + 2.0, 100)
    assert hang.ts - 2 * 5.0 <= ev["last_report_ts"] <= hang.ts


def test_a_rank_that_freezes_during_a_reported_stall_is_named_at_once_and_once():
    recs, progress = frozen_stall(from_s=40.0, for_s=60.0)  # the hang is reported 20 s after the last progress
    found = run(HangDetector(topo()), sorted(recs, key=lambda r: r.ts), until=progress + 200)
    assert [f.type for f in found] == ["hang", "frozen_rank"]
    assert found[1].ts == progress + 40.0 and found[1].rank == 11


def test_a_freeze_that_ended_names_nobody():
    """Thawed before the stall (its own heartbeat after the agent's last report), or the agent's reports long
    stopped: the hang names no frozen rank."""
    recs, progress = frozen_stall(from_s=-30.0, for_s=10.0)  # frozen 30..20 s before the last progress
    own = Heartbeat(ts=progress - 15.0, job="j", rank=11)
    assert [f.type for f in run(HangDetector(topo()), sorted([*recs, own], key=lambda r: r.ts),
                                until=progress + 100)] == ["hang"]
    stale, progress = frozen_stall(from_s=-5.0, for_s=5.0)  # its agent's last report 20 s before the hang
    assert [f.type for f in run(HangDetector(topo()), sorted(stale, key=lambda r: r.ts), until=progress + 100)] \
        == ["hang"]


def test_the_run_path_finds_what_the_record_path_finds_with_frozen_ranks():
    recs, progress = frozen_stall(from_s=-3.0, for_s=80.0)
    recs = sorted([*recs, Heartbeat(ts=progress - 4.0, job="j", rank=2)], key=lambda r: r.ts)
    a, b = HangDetector(topo()), HangDetector(topo())
    want = run(a, recs, until=progress + 100, tick=7.0)
    got, i = [], 0
    while i < len(recs):  # runs of the records with one time, as the core cuts them
        j = i
        while j < len(recs) and recs[j].ts == recs[i].ts:
            j += 1
        got += b.advance(recs[i].ts)
        got += [f for _, fs in b.observe_run(RecordRun(recs[i:j])) for f in fs]
        i = j
    t = recs[-1].ts
    while t < progress + 100:
        t = min(progress + 100, t + 7.0)
        got += b.advance(t)
    assert got == want and [f.type for f in want] == ["hang", "frozen_rank"]
    assert a.state() == b.state()


def test_frozen_ranks_survive_a_state_round_trip_and_old_states_load():
    recs, progress = frozen_stall(from_s=-3.0, for_s=80.0)
    recs = sorted(recs, key=lambda r: r.ts)
    cut = next(i for i, r in enumerate(recs) if r.ts > progress + 1)
    det = HangDetector(topo())
    run(det, recs[:cut])
    clone = HangDetector.from_state(json.loads(json.dumps(det.state())), topo())
    assert [f.type for f in run(clone, recs[cut:], until=progress + 100)] == ["hang", "frozen_rank"]
    old = {k: v for k, v in det.state().items() if k not in ("frozen", "named")}  # saved before issue 35
    assert [f.type for f in run(HangDetector.from_state(old, topo()), recs[cut:], until=progress + 100)][0] == "hang"
