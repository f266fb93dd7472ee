"""The drill's logic (gangwatch/evaluation/drill.py) without a broker: what is injected where and when, the
job's episodes, the score. The pipeline here is an in-process `Core` and the controller's simulated mode on a
fake clock that ticks every half second, so a drill runs as the live one would, deterministically."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from gangwatch.control.simulated import SimulatedMode
from gangwatch.producers.simulate.responder import Delays, SimulatedController
from gangwatch.schemas import Action, Job, Lifecycle, Recovery, Step
from gangwatch.triage.budgets import Budgets
from gangwatch.triage.core import Core, CoreConfig

from gangwatch.cli import main
from gangwatch.evaluation.drill import (
    DEFAULT_KINDS,
    HOLD_S,
    Drill,
    DrillSpec,
    Report,
    Seen,
    injections,
    restore_check,
    score,
    truth_of,
)

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
TICK = 0.5


def run_in_process(spec: DrillSpec, delays: Delays | None = None) -> tuple[Drill, list]:
    """The drill against an in-process pipeline; also every record handed out, in order."""
    now = [T0]
    drill = Drill(spec, T0)
    core = Core(CoreConfig())
    inbox: list = []
    simulated = SimulatedController.of_truth(truth_of(spec, drill.planned), delays=delays or Delays())
    controller = SimulatedMode(spec.job, simulated, inbox.append, lambda: now[0], lambda: drill.checkpoints)
    fed = []

    def take(out) -> None:
        for a in out.actions:
            drill.observe(a)
            controller.handle(a)
        for i in out.incidents:
            drill.observe(i)

    while not drill.finished:
        assert now[0] < T0 + 3000, "the drill never finished"
        now[0] += TICK
        recs = drill.due(now[0])
        fed += recs
        controller.tick()
        answers, inbox[:] = list(inbox), []
        for r in answers:
            drill.observe(r)
        for rec in sorted(recs + answers, key=lambda r: r.ts):
            take(core.process(rec))
        take(core.advance(now[0] - 1.0))
    return drill, fed


# --- what is injected -----------------------------------------------------------------------------------


def test_injections_follow_the_seed_cover_every_kind_before_repeating_and_keep_to_their_slots():
    spec = DrillSpec(seed=3, faults=10)
    got = injections(spec)
    assert got == injections(spec) and got != injections(DrillSpec(seed=4, faults=10))
    kinds = [i.kind for i in got]
    assert sorted(kinds[:len(DEFAULT_KINDS)]) == sorted(DEFAULT_KINDS)
    assert len(set(kinds[len(DEFAULT_KINDS):])) == 10 - len(DEFAULT_KINDS)
    slot = (spec.duration - spec.lead_s) / spec.faults
    for n, i in enumerate(got):
        assert spec.lead_s + n * slot <= i.at_s <= spec.lead_s + n * slot + slot / 2 + 1e-6
        lo, hi = HOLD_S.get(i.kind, (0.0, 0.0))
        assert lo <= i.hold_s <= hi
        if i.benign:
            assert i.node is None and i.rank is None and i.where == "job"
        elif i.rank is not None:
            assert i.rank // spec.gpus_per_node == int(i.node[1:])
    machines = [i.node for i in got if not i.benign]
    assert len(set(machines)) == len(machines)


@pytest.mark.parametrize(("kw", "says"), [
    ({"faults": 17}, "17 faults need as many machines"), ({"kinds": ("pp_deadlock",), "pp": 1}, "--pp 2"),
    ({"kinds": ("meteor",)}, "unknown kind 'meteor'"), ({"faults": 0}, "at least 1"),
    ({"gpus_per_node": 3}, "do not fill"), ({"duration_s": 30.0}, "leaves no time"),
])
def test_a_spec_that_cannot_be_drilled_says_why(kw, says):
    with pytest.raises(ValueError, match=says):
        DrillSpec(**kw)


def test_drill_mistakes_are_one_line_before_any_service(capsys):
    assert main(["drill", "--faults", "40", "--bootstrap", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "40 faults need as many machines" in err
    with pytest.raises(SystemExit) as e:
        main(["drill", "--kinds", "node_loss,meteor"])
    assert e.value.code == 2 and "unknown kind 'meteor'" in capsys.readouterr().err


# --- a drill, in process --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def killed_and_paused():
    spec = DrillSpec(job="d", seed=11, faults=2, kinds=("node_loss", "pause"))
    drill, fed = run_in_process(spec)
    return spec, drill, fed


def test_a_killed_machine_is_replaced_within_budget_and_a_pause_opens_nothing(killed_and_paused):
    spec, drill, _ = killed_and_paused
    report = score(drill, Budgets())
    assert report.passed, report
    rows = {r.kind: r for r in report.rows}
    assert set(rows) == {"node_loss", "pause"} and not report.wrong and not report.unexpected
    kill = rows["node_loss"]
    [planned] = [i for i in drill.planned if i.kind == "node_loss"]
    assert kill.culprits == [planned.node] and kill.actions == [f"replace {planned.node}"]
    assert 2 * 5.0 + 0.5 <= kill.detect_s <= 60  # silent for two heartbeat periods and the slack, at the least
    d = Delays()
    restart = d.accept_s + d.replace_s + d.ckpt_s + d.comm_s + d.resume_s
    lateness = CoreConfig().lateness_s  # the action leaves once the watermark, this far behind, passes the decision
    assert restart <= kill.recover_s - kill.decide_s <= restart + lateness + TICK + 0.1  # figures rounded to 0.1
    assert rows["pause"].detect_s is None and rows["pause"].actions == []


def test_the_restart_cuts_the_job_and_the_next_episode_starts_when_the_controller_says_resumed(killed_and_paused):
    spec, drill, fed = killed_and_paused
    kill = next(e for e in drill.episodes if e.injection.kind == "node_loss")
    [accepted] = [r for r in drill.seen.recoveries if r.phase == "accepted"]
    [resumed] = [r for r in drill.seen.recoveries if r.phase == "resumed"]
    assert kill.cut_ts == accepted.ts and kill.over_ts == resumed.ts
    assert max(r.ts for r in kill.records[:kill.pos]) <= accepted.ts
    after = drill.episodes[drill.episodes.index(kill) + 1]
    assert after.restarted and isinstance(after.records[0], Job) and after.records[0].ts == resumed.ts
    [loaded] = [r for r in drill.seen.recoveries if r.phase == "ckpt_loaded"]
    first = min(r.step for r in after.records if isinstance(r, Step))
    steps_before = [r.step for r in kill.records[:kill.pos] if isinstance(r, Step)]
    assert first == (loaded.extra["step"] + 1 if "step" in loaded.extra else max(steps_before) + 1)
    assert [r.ts for r in fed] == sorted(r.ts for r in fed)  # handed out in time order, across episodes


def test_a_pause_is_said_held_and_the_job_goes_on_later_by_as_much(killed_and_paused):
    spec, drill, _ = killed_and_paused
    ep = next(e for e in drill.episodes if e.injection.kind == "pause")
    said = [(r.event, r.ts) for r in ep.records if isinstance(r, Lifecycle)]
    assert said == [("pause", round(ep.inject_ts, 6)), ("resume", round(ep.inject_ts + ep.injection.hold_s, 6))]
    inside = [r for r in ep.records if ep.inject_ts <= r.ts < ep.inject_ts + ep.injection.hold_s]
    assert {r.kind for r in inside} == {"heartbeat", "lifecycle"}
    assert {r.rank for r in inside if r.kind == "heartbeat"} == set(range(spec.ranks))


def test_no_rank_falls_silent_across_a_pause_or_where_the_job_goes_on_into_the_next_episode():
    kinds = ("pause", "intermittent_straggler")
    seed = next(s for s in range(100) if injections(DrillSpec(seed=s, faults=2, kinds=kinds))[0].kind == "pause")
    spec = DrillSpec(job="g", seed=seed, faults=2, kinds=kinds, quiet_s=20.0)
    drill, fed = run_in_process(spec)
    pause, after = drill.episodes[0], drill.episodes[1]
    assert pause.injection.kind == "pause" and not after.restarted  # the job went on: no new job record
    last: dict[int, float] = {}
    gaps = []
    for r in fed:
        if r.kind in ("heartbeat", "step") and pause.start_ts + 10 <= r.ts <= after.inject_ts:
            if r.rank in last:
                gaps.append(r.ts - last[r.rank])
            last[r.rank] = r.ts
    heartbeat_s = 5.0
    assert gaps and max(gaps) <= heartbeat_s + 0.1
    assert not [i for i in drill.seen.incidents.values() if i.detected_ts < after.inject_ts]


def test_wrong_evictions_and_pages_are_named_and_tight_budgets_fail(killed_and_paused):
    spec, drill, _ = killed_and_paused
    report = score(drill, Budgets(detect=5.0))
    kill = next(r for r in report.rows if r.kind == "node_loss")
    assert not report.passed and any(f.startswith(f"detect {kill.detect_s:g} s > 5 s") for f in kill.failures)
    inc = kill.incident
    drill.observe(Action(id="x1", ts=T0 + 1.0, job="d", incident=inc, type="replace", nodes=["n099"]))
    drill.observe(Action(id="x2", ts=T0 + 2.0, job="d", incident="elsewhere", type="escalate"))
    drill.observe(Action(id="x3", ts=T0 + 3.0, job="other", incident="elsewhere", type="escalate"))
    try:
        wrong = score(drill, Budgets()).wrong
    finally:
        for aid in ("x1", "x2"):
            del drill.seen.actions[aid]
    assert [(w.action, w.nodes) for w in wrong] == [("x1", ["n099"]), ("x2", [])]
    assert "not faulty (#" in wrong[0].why and wrong[1].why == "a page for no injection"


def test_a_slow_replacement_is_noted_against_its_stage_and_fails_only_the_end_to_end_budget():
    spec = DrillSpec(job="r", seed=11, faults=1, kinds=("node_loss",))
    drill, _ = run_in_process(spec, Delays(replace_s=150.0))
    [row] = score(drill, Budgets()).rows
    assert row.passed and row.notes and row.notes[0].startswith("incident over budget: replace 15")
    d = Delays(replace_s=150.0)
    took = row.decide_s + d.accept_s + d.replace_s + d.ckpt_s + d.comm_s + d.resume_s
    assert took <= row.recover_s <= took + CoreConfig().lateness_s + TICK + 0.1
    [tight] = score(drill, Budgets(total=took - 1.0)).rows
    assert tight.failures == [f"recover {row.recover_s:g} s > {took - 1.0:g} s"]


def test_a_stopped_job_opens_nothing_and_starts_again_with_a_job_record():
    spec = DrillSpec(job="s", seed=2, faults=1, kinds=("stop",), quiet_s=20.0)
    drill, fed = run_in_process(spec)
    report = score(drill, Budgets())
    assert report.passed and report.rows[0].kind == "stop" and not drill.seen.incidents
    ep = drill.episodes[0]
    stops = [r for r in fed if isinstance(r, Lifecycle) and r.event == "stop"]
    assert sorted(r.rank for r in stops) == list(range(spec.ranks))
    assert max(r.ts for r in fed) <= ep.inject_ts + 1.0  # nothing of the job after the user stopped it
    assert ep.over_ts == pytest.approx(ep.inject_ts + ep.injection.hold_s)


# --- the restore check ----------------------------------------------------------------------------------


def loads(*items: tuple[str, str, float, dict]) -> SimpleNamespace:
    return SimpleNamespace(seen=Seen(recoveries=[Recovery(ts=ts, job="d", action=a, phase=p, extra=x)
                                                 for a, p, ts, x in items]))


def test_the_restore_check_picks_a_checkpoint_by_the_seed_and_needs_a_resume_after_it():
    assert "nothing was restored" in restore_check(loads(("a1", "accepted", 1.0, {})), 1).note
    bare = restore_check(loads(("a1", "ckpt_loaded", 1.0, {})), 1)
    assert bare.checkpoint is None and "extra.checkpoint" in bare.note
    drill = loads(("a1", "ckpt_loaded", 10.0, {"checkpoint": "step-10"}), ("a1", "resumed", 20.0, {}),
                  ("a2", "ckpt_loaded", 30.0, {"checkpoint": "step-40"}), ("a2", "failed", 31.0, {}))
    for seed in range(6):
        picked = random.Random(seed).choice(["step-10", "step-40"])
        rc = restore_check(drill, seed)
        assert (rc.checkpoint, rc.restored, rc.candidates, rc.loads) == (picked, picked == "step-10", 2, 2)
        assert Report([], [], [], Budgets(), rc).passed is rc.restored  # a restore that never resumed fails
    assert Report([], [], [], Budgets(), bare).passed  # nothing named: said, not failed
