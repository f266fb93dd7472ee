"""The ordinary life of a job through the whole core (issue 23): pauses, stops, ends, restarts and code bugs
cost nothing, and what is broken in them is still found.

Each test builds the telemetry of a small job (3 nodes x 2 ranks, a step a second, a heartbeat every 5 s)
with the moments of its life, replays it through `Core` with event time moving on after the last record (as
the worker's silence timer moves it), and asserts the exact actions, incidents and job states.
"""

from __future__ import annotations

import pytest
from gangwatch.schemas import Framework, Heartbeat, Job, Lifecycle, Ops, Outputs, RankInfo, Step
from gangwatch.triage.budgets import CoreConfig, TriageConfig
from gangwatch.triage.core import Core, JobCore

from tests.helpers import replay_core

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0
HB = 5.0
NODES = ("n1", "n2", "n3")
RANKS = 6  # rank r on NODES[r // 2]


def job(ts: float, nodes: tuple[str, ...] = NODES) -> Job:
    return Job(ts=ts, job="j", ranks=[RankInfo(rank=r, node=nodes[r // 2], gpu=r % 2) for r in range(RANKS)],
               heartbeat_s=HB)


def run_of(start: float, first_step: int, steps: int, *, gap: dict[int, float] | None = None,
           silent: dict[int, float] | None = None, beat_until: float | None = None,
           nodes: tuple[str, ...] = NODES) -> tuple[list, float]:
    """A run: its job record, 10 s of start-up, then `steps` steps from `first_step` (1 s each; step k waits
    `gap[k]` s more before it ends: a pause); heartbeats every HB from every rank throughout (until
    `beat_until`); rank r sends nothing from `silent[r]` on. Returns (records, the time of the last step)."""
    gap, silent = gap or {}, silent or {}
    recs: list = [job(start, nodes)]
    t = start + 10.0
    for k in range(first_step, first_step + steps):
        t += 1.0 + gap.get(k, 0.0)
        recs += [Step(ts=t + 0.01 * r, job="j", rank=r, step=k, step_s=1.0 + gap.get(k, 0.0), compute_s=0.6,
                      comm_wait_s=0.4) for r in range(RANKS) if t < silent.get(r, float("inf"))]
    end = beat_until if beat_until is not None else t
    hb = start + 1.0
    while hb <= end:
        recs += [Heartbeat(ts=hb + 0.1 * r, job="j", rank=r) for r in range(RANKS) if hb < silent.get(r, float("inf"))]
        hb += HB
    return recs, t


def replay(recs: list, until: float, **triage) -> Outputs:
    return replay_core(recs, until, CoreConfig(triage=TriageConfig(**triage)))


def acts(out: Outputs) -> list[tuple[str, list[str]]]:
    return [(a.type, a.nodes) for a in out.actions]


def states(out: Outputs) -> list[str]:
    return [f.evidence["state"] for f in out.life]


def final(out: Outputs) -> dict:
    """Each incident's last record, by id."""
    return {i.id: i for i in out.incidents}


def test_a_healthy_job_has_a_life_and_no_finding():
    recs, end = run_of(T0, 0, 120)
    recs += [Framework(ts=end + 1 + 0.01 * r, job="j", rank=r, type="exit", extra={"code": 0}) for r in range(RANKS)]
    out = replay(recs, end + 300)
    assert out.findings == [] and out.actions == [] and out.incidents == []
    assert states(out) == ["starting", "running", "finished"]


def test_an_unannounced_job_wide_pause_of_45_s_pages_nobody():
    """Every rank sleeps 45 s at one step (a synchronous checkpoint the loop does not announce): a hang, a
    sweep asked for, then the job steps on: the incident closes by itself, no escalation, no eviction."""
    recs, end = run_of(T0, 0, 150, gap={60: 45.0})
    out = replay(recs, end + 5)
    assert acts(out) == [("collect_stacks", [])]
    [inc] = final(out).values()
    assert inc.cls == "stall" and inc.extra["resolution"] == "self_resolved" and inc.evicted_nodes == []


def test_an_announced_pause_is_no_stall_at_all():
    recs, end = run_of(T0, 0, 150, gap={60: 45.0})
    t60 = next(r.ts for r in recs if r.kind == "step" and r.step == 59 and r.rank == 0)
    recs += [Lifecycle(ts=t60 + 0.1 + 0.01 * r, job="j", rank=r, event="pause", reason="checkpoint") for r in range(6)]
    recs += [Lifecycle(ts=t60 + 45.1 + 0.01 * r, job="j", rank=r, event="resume", reason="checkpoint")
             for r in range(6)]
    out = replay(recs, end + 5)
    assert out.findings == [] and out.actions == [] and out.incidents == []
    assert states(out) == ["starting", "running", "paused", "running"]


def test_a_job_stopped_by_its_user_and_started_again_with_the_same_id_costs_nothing():
    first, end = run_of(T0, 0, 60)
    stop = [Lifecycle(ts=end + 0.5 + 0.01 * r, job="j", rank=r, event="stop", reason="SIGTERM", source="trainer")
            for r in range(RANKS)]
    second, end2 = run_of(end + 120, 50, 60)  # the user starts it again two minutes later, from a checkpoint
    out = replay(first + stop + second, end2 + 5)
    assert out.findings == [] and out.actions == [] and out.incidents == []
    assert states(out) == ["starting", "running", "stopping", "stopped", "starting", "running"]


def test_a_job_restarted_by_its_controller_is_no_monitoring_gap():
    first, end = run_of(T0, 0, 60)
    restart = Lifecycle(ts=end + 0.5, job="j", event="restart", reason="a-123 restart_in_process",
                        source="controller")
    second, end2 = run_of(end + 40, 50, 30)
    out = replay([*first, restart, *second], end2 + 5)
    assert out.findings == [] and out.actions == [] and states(out)[-3:] == ["restarting", "starting", "running"]


def test_a_job_ending_without_its_controller_with_code_0_everywhere_is_finished():
    recs, end = run_of(T0, 0, 60)
    recs += [Framework(ts=end + 0.2 * r, job="j", rank=r, type="exit", extra={"code": 0}) for r in range(RANKS)]
    out = replay(recs, end + 600)
    assert out.findings == [] and out.actions == [] and states(out)[-1] == "finished"


def test_a_late_heartbeat_during_start_up_evicts_nobody():
    """Before the first step, rank 3's heartbeats are held back 40 s by a loaded host: nobody is evicted."""
    recs, end = run_of(T0, 0, 60)
    late = [r for r in recs if r.kind == "heartbeat" and r.rank == 3 and r.ts < T0 + 10]
    recs = [r for r in recs if r not in late]
    out = replay(recs, end + 5)
    assert out.actions == [] and out.incidents == []


def _crashing_runs(attempts: int, *, fail_at: int = 40, ckpt: int = 30, swapped_after: int | None = None,
                   start: float = T0, first: int = 0) -> tuple[list, float]:
    """A code bug: rank 3 (on n2) raises the same error at step `fail_at` in every attempt; the controller
    restarts the job from the checkpoint at step `ckpt` each time (a new job record, the same id); from attempt
    `swapped_after` on, n2 is swapped for the spare n4 (the bug follows rank 3 onto it)."""
    recs = []
    for k in range(attempts):
        nodes = ("n1", "n4", "n3") if swapped_after is not None and k >= swapped_after else NODES
        run, t = run_of(start, first, fail_at - first, beat_until=start + 10 + (fail_at - first), nodes=nodes)
        recs += run
        recs.append(Framework(ts=t + 0.5, job="j", rank=3, type="exception",
                              message=f"RuntimeError: shape mismatch in batch {fail_at} at 0x7f3a{attempts}"))
        recs += [Framework(ts=t + 0.6 + 0.01 * r, job="j", rank=r, type="exception",
                           message="RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500")
                 for r in range(RANKS) if r != 3]
        start, first = t + 30.0, ckpt
    return recs, t


def test_a_repeating_code_bug_with_no_spare_is_restarted_twice_then_escalated_naming_its_node_evicting_nobody():
    recs, end = _crashing_runs(4)
    out = replay(recs, end + 60, spares=0)
    assert acts(out) == [("restart_in_process", ["n2"]), ("restart_in_process", ["n2"]), ("escalate", ["n2"])]
    assert len({a.id for a in out.actions}) == 3 and len({a.incident for a in out.actions}) == 1
    page = out.actions[-1]
    assert "crash loop" in page.reason and "rank 3" in page.reason and "3 times" in page.reason
    assert all(i.evicted_nodes == [] for i in out.incidents) and len(final(out)) == 1


def test_a_crash_loop_with_a_spare_free_swaps_its_node_once_and_pages_when_the_failure_follows_the_rank():
    """Issue 42: the failure stayed on n2 through two restarts; a spare is free, so n2 is swapped once (one spare's
    cost); the same failure on the spare n4 is the code's: a page naming the rank and the swap that proved it."""
    recs, end = _crashing_runs(4, swapped_after=3)
    out = replay(recs, end + 60, spares=2)
    assert acts(out) == [("restart_in_process", ["n2"]), ("restart_in_process", ["n2"]), ("replace", ["n2"]),
                         ("escalate", ["n4"])]
    swap, page = out.actions[2], out.actions[3]
    assert "swapped for a spare once" in swap.reason and "spares" in swap.reason
    assert "followed rank 3 from n2 onto the spare n4" in page.reason and "not the machine" in page.reason
    assert len({a.incident for a in out.actions}) == 1 and len(final(out)) == 1


def test_a_crash_loop_that_stays_behind_on_its_swapped_node_keeps_that_node_out_and_pages_nobody():
    """The same failure three times on n2, n2 swapped for n4: the job then steps on past where it failed, so it
    was the machine: n2 stays out, nobody is paged."""
    recs, end = _crashing_runs(3)
    run, end = run_of(end + 30.0, 30, 40, nodes=("n1", "n4", "n3"))  # on the spare: past step 40, no failure
    run += [Framework(ts=end + 1 + 0.01 * r, job="j", rank=r, type="exit", extra={"code": 0}) for r in range(RANKS)]
    out = replay(recs + run, end + 60, spares=2)
    assert acts(out) == [("restart_in_process", ["n2"]), ("restart_in_process", ["n2"]), ("replace", ["n2"])]
    [inc] = final(out).values()
    assert inc.evicted_nodes == ["n2"] and inc.recovered_ts is not None


def test_a_failure_the_restart_gets_past_is_not_a_loop():
    """The same error, but each attempt gets further (the bug is flaky, a restart helps): restarted each time."""
    recs: list = []
    start, first = T0, 0
    for fail_at in (40, 80, 120):
        run, t = run_of(start, first, fail_at - first, beat_until=start + 10 + (fail_at - first))
        recs += [*run, Framework(ts=t + 0.5, job="j", rank=3, type="exception", message="RuntimeError: flaky")]
        start, first = t + 30.0, fail_at - 5
    out = replay(recs, t + 60)
    assert [a.type for a in out.actions] == ["restart_in_process"] * 3


def test_a_rank_leaving_with_exit_code_0_while_its_peers_train_is_its_nodes_failure():
    recs, end = run_of(T0, 0, 120, silent={2: T0 + 50.0})
    recs.append(Framework(ts=T0 + 50.0, job="j", rank=2, type="exit", extra={"code": 0}))
    out = replay(recs, end + 5)
    assert acts(out) == [("restart_in_process", ["n2"])]
    [inc] = final(out).values()
    assert inc.culprit_nodes == ["n2"] and inc.evicted_nodes == []


def test_a_rank_whose_records_come_late_while_the_job_steps_on_is_a_telemetry_gap_and_nothing_is_done():
    """Under load, rank 4's records reach the pipeline 20 s late for a while: its peers go on completing steps it
    takes part in, so it lived: one `telemetry_gap` (its records lagged), no fail-stop, no incident, nothing
    sent; once they come it is live again, and no flapping while it lags."""
    recs, end = run_of(T0, 0, 120)
    late = {id(r) for r in recs if r.kind != "job" and r.rank == 4 and T0 + 60 <= r.ts < T0 + 90}
    core, out = Core(), Outputs()
    held = []
    for rec in sorted(recs, key=lambda r: r.ts):
        if id(rec) in late:
            held.append(rec)
            continue
        while held and held[0].ts + 20.0 <= rec.ts:  # delivered 20 s after they were stamped
            core.process(held.pop(0), out)
        core.process(rec, out)
    [gap] = out.findings
    assert (gap.type, gap.rank, gap.evidence["cause"]) == ("telemetry_gap", 4, "delivery lag")
    assert 15.0 <= gap.evidence["lag_s"] <= 21.0
    assert out.actions == [] and out.incidents == []


# --- shadow mode ---------------------------------------------------------------------------------------


def verdicts(out: Outputs) -> list[tuple[str, list[str], str]]:
    return [(a.type, a.nodes, a.extra["verdict"]) for a in out.shadow if "verdict" in a.extra]


def test_in_shadow_mode_a_dead_nodes_replacement_is_recorded_sent_nowhere_and_scored_right():
    """n2 loses power at +60 s and the job stays down (nothing acted on it): the would-be replace was right."""
    recs, end = run_of(T0, 0, 120, silent={2: T0 + 60.0, 3: T0 + 60.0})
    recs = [r for r in recs if not (r.kind == "step" and r.ts > T0 + 60.0)]  # the gang waits for n2
    out = replay(recs, T0 + 60 + 700, shadow=True)
    assert out.actions == [] and [(a.type, a.nodes) for a in out.shadow][:1] == [("replace", ["n2"])]
    assert all(a.extra["shadow"] for a in out.shadow) and all(i.extra.get("shadow") for i in out.incidents)
    assert verdicts(out) == [("replace", ["n2"], "true")]


def test_in_shadow_mode_a_page_for_a_stall_the_job_recovers_from_by_itself_is_scored_false():
    """A 6-minute unannounced stall outlasts its 300 s budget: the would-be page; then the job steps on."""
    recs, end = run_of(T0, 0, 120, gap={60: 360.0})
    out = replay(recs, end + 5, shadow=True)
    assert [a.type for a in out.actions] == ["collect_stacks"]  # a sweep is diagnosis: still asked for
    assert verdicts(out) == [("escalate", [], "false")]
    assert "stepped past step 59" in [a for a in out.shadow if "verdict" in a.extra][0].extra["why"]


def test_shadow_mode_is_turned_on_for_one_job_by_an_ops_record_and_off_again():
    recs, end = run_of(T0, 0, 200, silent={2: T0 + 60.0, 3: T0 + 60.0})
    recs = [r for r in recs if not (r.kind == "step" and r.ts > T0 + 60.0)]  # the gang waits for n2
    on = Ops(ts=T0 + 5.0, type="shadow", job="j", note="watch before trusting")
    out = replay([*recs, on], end + 5)
    assert out.actions == [] and [a.type for a in out.shadow][:1] == ["replace"]
    off = Ops(ts=T0 + 30.0, type="act", job="j")
    out = replay([*recs, on, off], end + 5)
    assert [a.type for a in out.actions] == ["replace"] and out.shadow == []


def test_gangwatch_store_shadow_prints_the_precision_per_job_and_action_type(tmp_path, capsys):
    """A replay in shadow mode, then the score from its store: the page for the stall the job recovered from by
    itself was wrong."""
    from gangwatch.schemas import encode

    from gangwatch.cli import main

    recs, _ = run_of(T0, 0, 120, gap={60: 360.0})
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(encode(r) + b"\n" for r in sorted(recs, key=lambda r: r.ts)))
    out = tmp_path / "out"
    assert main(["replay", str(path), "--out", str(out), "--set", "triage.shadow=true", "-q"]) == 0
    assert (out / "actions.jsonl").read_bytes().count(b'"escalate"') == 0  # sent nowhere
    assert (out / "shadow.jsonl").read_bytes().count(b'"verdict":"false"') == 1
    capsys.readouterr()
    assert main(["store", "shadow", "--out", str(out), "--format", "jsonl"]) == 0
    import orjson

    rows = [orjson.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["job"], r["type"], r["would"], r["right"], r["wrong"], r["precision"]) for r in rows] == [
        ("j", "escalate", 1, 0, 1, 0.0)]


def test_a_rank_killed_outright_is_found_though_its_launcher_stops_its_sibling():
    """SIGKILL on rank 2 (n2): torchrun stops its sibling rank 3 with SIGTERM (whose handler says `stop`) and the
    peers on n1 lose it: a few stops hide nobody's silence: n2 is replaced."""
    recs, end = run_of(T0, 0, 120, silent={2: T0 + 60.0, 3: T0 + 60.5, 0: T0 + 61.0, 1: T0 + 61.0})
    recs.append(Lifecycle(ts=T0 + 60.5, job="j", rank=3, event="stop", reason="SIGTERM", source="trainer"))
    recs += [Framework(ts=T0 + 60.6 + 0.01 * r, job="j", rank=r, type="exception",
                       message="RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500")
             for r in (0, 1, 4, 5)]
    out = replay(recs, T0 + 90)
    assert acts(out) == [("replace", ["n2"])]


def test_a_user_stop_with_one_ranks_record_lost_is_still_a_stop():
    first, end = run_of(T0, 0, 60, silent={4: T0 + 70.5})
    stop = [Lifecycle(ts=end + 0.5 + 0.01 * r, job="j", rank=r, event="stop", reason="SIGTERM", source="trainer")
            for r in range(RANKS) if r != 4]  # rank 4 was killed before its handler could send
    out = replay([r for r in first if r.ts <= end + 0.5] + stop, end + 120)
    assert out.actions == [] and out.incidents == []


def test_late_step_records_after_a_failure_never_move_the_jobs_life_back():
    """A crash loop, live: rank 2 raises at step 31; the step records its peers ended around then, and those held
    back by a loaded host, arrive after the exception. The job stays `failed`: its life never runs backwards,
    and no two moves share one instant. A step well past the failure (the job restarted in place) is running."""
    recs, _ = run_of(T0, 0, 40)
    crash = Framework(ts=T0 + 10 + 31 + 0.5, job="j", rank=2, type="exception", message="RuntimeError: boom")
    late = [r for r in recs if r.kind == "step" and crash.ts - 1.0 <= r.ts]  # ended around it, or after it
    first = [r for r in recs if r not in late]
    stamped_before = [Step(ts=crash.ts - 0.2, job="j", rank=r, step=31, step_s=1.0) for r in (0, 1)]
    again = Step(ts=crash.ts + 2 * HB, job="j", rank=0, step=42, step_s=1.0)
    out = Outputs()
    core = JobCore(recs[0])
    for r in sorted(first[1:], key=lambda r: r.ts) + [crash] + stamped_before + late[:3]:
        core.process(r, out)
    assert states(out)[-1] == "failed"
    core.process(again, out)
    moves = [(f.evidence["state"], f.ts) for f in out.life]
    assert [s for s, _ in moves[-2:]] == ["failed", "running"] and len({t for _, t in moves}) == len(moves)
