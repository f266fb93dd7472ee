"""The controller's simulated mode (control/simulated.py, `gangwatch controller --simulate`): each action's answers
published when due on the clock, stamped then, restarts announced, checkpoints named; a fake clock, no broker."""

from __future__ import annotations

import os

import orjson
import pytest
from gangwatch.control.simulated import (
    RESTARTS,
    EventClock,
    SimulatedMode,
    controller_of,
    truth_checkpoints,
)
from gangwatch.producers.simulate.responder import Delays, SimulatedController
from gangwatch.schemas import Action, Lifecycle, Recovery

from gangwatch.cli import main
from gangwatch.cli.simcontroller import DELAYS

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def action(i: int, kind: str, ts: float = 1000.0, nodes=("n1",), job: str = "j") -> Action:
    return Action(id=f"a{i}", ts=ts, job=job, incident="i1", type=kind, nodes=list(nodes))


def mode(clock: Clock, checkpoints=None, **kw):
    sent = []
    return SimulatedMode("j", SimulatedController(faulty=frozenset({"n1"}), **kw), sent.append, clock,
                         checkpoints), sent


def run_until(m: SimulatedMode, clock: Clock, end: float, step: float = 0.5) -> None:
    while clock.t < end:
        clock.t = round(clock.t + step, 6)
        m.tick()


def test_a_replace_is_answered_phase_by_phase_when_due_stamped_then_with_its_restart_said():
    d = Delays()
    clock = Clock(1005.0)  # the action (decided at 1000) reaches the controller 5 s later
    m, sent = mode(clock)
    assert m.handle(action(1, "replace")) == 5
    m.tick()
    assert sent == []  # nothing is due at once
    run_until(m, clock, 1200.0)
    due = {"accepted": 1005 + d.accept_s}
    due["replaced"] = due["accepted"] + d.replace_s
    due["ckpt_loaded"] = due["replaced"] + d.ckpt_s
    due["comm_ready"] = due["ckpt_loaded"] + d.comm_s
    due["resumed"] = due["comm_ready"] + d.resume_s
    recs = [r for r in sent if isinstance(r, Recovery)]
    assert {r.phase: r.ts for r in recs} == due  # the clock ticks on the due times exactly: stamped then
    assert [r.phase for r in recs] == list(due)
    [restart] = [r for r in sent if isinstance(r, Lifecycle)]
    assert (restart.event, restart.reason, restart.source, restart.ts) == ("restart", "replace a1", "controller",
                                                                           due["accepted"])
    assert sent.index(restart) == sent.index(recs[0]) + 1  # said right after accepted, before the silence


def test_only_restarting_actions_announce_a_restart_and_each_action_is_answered_once():
    clock = Clock(1000.0)
    m, sent = mode(clock)
    kinds = ["isolate", "dual_run", "restart_in_process", "degrade", "collect_stacks", "escalate"]
    for i, kind in enumerate(kinds):
        m.handle(action(i, kind))
    assert m.handle(action(2, "restart_in_process")) == 0  # redelivered: once means once
    assert m.handle(action(9, "replace", job="other")) == 0  # another job's
    run_until(m, clock, 1400.0)
    restarts = [r.reason for r in sent if isinstance(r, Lifecycle)]
    assert restarts == ["restart_in_process a2"] and "restart_in_process" in RESTARTS
    assert {r.action for r in sent if isinstance(r, Recovery)} == {"a0", "a1", "a2"}
    [dual] = [r for r in sent if isinstance(r, Recovery) and r.action == "a1"]
    assert dual.phase == "dual_run_result" and dual.ts == 1000 + Delays().dual_run_s


def test_ckpt_loaded_names_the_newest_checkpoint_saved_before_it():
    clock = Clock(1000.0)
    saves = [{"step": 100, "ts": 900.0, "end_ts": 906.0}, {"step": 160, "ts": 960.0, "end_ts": 966.0}]
    m, sent = mode(clock, lambda: saves)
    m.handle(action(1, "rollback"))
    loaded_at = 1000 + Delays().accept_s + Delays().ckpt_s
    accepted_at = 1000 + Delays().accept_s
    saves.append({"step": 200, "ts": accepted_at - 1.0, "end_ts": accepted_at + 0.5})  # unfinished when it stopped
    run_until(m, clock, 1100.0)
    [loaded] = [r for r in sent if isinstance(r, Recovery) and r.phase == "ckpt_loaded"]
    assert loaded.ts == loaded_at and loaded.extra == {"checkpoint": "step-160", "step": 160}
    m2, sent2 = mode(Clock(1000.0))
    m2.handle(action(1, "rollback"))
    run_until(m2, m2.clock, 1100.0)
    assert sent2 and all(r.extra == {} for r in sent2)  # no checkpoints known: nothing named


def test_the_fast_clock_runs_speed_times_the_wall_clock_from_its_origin():
    wall = Clock(1_000_030.0)
    clock = EventClock(10.0, 1_000_000.0, wall=wall)
    assert clock() == 1_000_000.0 + 30 * 10 and clock.wall_seconds(30.0) == 3.0
    assert EventClock(wall=wall)() == wall.t
    with pytest.raises(ValueError, match="speed"):
        EventClock(0.0)


def test_the_truth_names_the_machines_and_its_checkpoints_are_read_again_when_it_changes(tmp_path):
    path = tmp_path / "t.truth.json"
    path.write_bytes(orjson.dumps({"faults": [{"class": "sdc", "nodes": ["n4"]}, {"class": "fail_stop",
                                                                                 "nodes": ["n2"]}]}))
    c, where = controller_of(str(path))
    assert (c.faulty, c.corrupting, where) == ({"n2", "n4"}, {"n4"}, path)
    read = truth_checkpoints(path)
    assert read() == []
    path.write_bytes(orjson.dumps({"faults": [], "benign": {"checkpoints": [{"step": 5, "ts": 1.0, "end_ts": 2.0}]}}))
    os.utime(path, ns=(1, 10**18))  # a new modification time even on a coarse file system
    assert read() == [{"step": 5, "ts": 1.0, "end_ts": 2.0}]
    c2, none = controller_of("n3, n7")
    assert (c2.faulty, none) == ({"n3", "n7"}, None)
    for bad in ("", " , "):
        with pytest.raises(ValueError, match="faulty machines"):
            controller_of(bad)
    path.write_text("{}")
    with pytest.raises(ValueError, match="faults"):
        controller_of(str(path))


def test_the_cli_delay_defaults_are_the_simulated_controllers():
    d = Delays()
    assert {name: default for name, _, default in DELAYS} == {
        "accept": d.accept_s, "replace": d.replace_s, "ckpt": d.ckpt_s, "comm": d.comm_s, "resume": d.resume_s,
        "replay": d.replay_s, "dual-run": d.dual_run_s}


def test_simulated_mode_mistakes_are_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GANGWATCH_WEBHOOK_SECRET", raising=False)
    assert main(["controller", "--simulate", "n1", "--job", "j"]) == 2
    assert "GANGWATCH_WEBHOOK_SECRET" in capsys.readouterr().err
    monkeypatch.setenv("GANGWATCH_WEBHOOK_SECRET", "s")
    bad = tmp_path / "x.json"
    bad.write_text("not json")
    assert main(["controller", "--simulate", str(bad), "--job", "j"]) == 3
    assert main(["controller", "--simulate", str(tmp_path / "missing.json"), "--job", "j"]) == 3
    assert main(["controller", "--simulate", "n1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "Traceback" not in err, err
    with pytest.raises(SystemExit) as e:
        main(["controller", "--simulate", "n1", "--job", "j", "--no-answer", "bogus"])
    assert e.value.code == 2 and "unknown action type 'bogus'" in capsys.readouterr().err
