"""The reference job controller without a broker: actions in, node swaps, checkpoints and recovery phases out.

The job is a stand-in (`FakeGang`) whose milestones the test writes; the launcher's
process handling is tested on real processes (a fake torchrun) in test_launcher.py.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from gangwatch.control.controller import Controller, Nodes, Publisher, WebhookSource, run
from gangwatch.control.journal import AppliedLog
from gangwatch.control.launcher import JobSpec
from gangwatch.schemas import Action, Finding, Lifecycle, Recovery, decode, encode
from gangwatch.schemas.signature import SECRET_ENV, sign
from gangwatch.sinks.webhook import WebhookSink

from gangwatch.cli import main

pytestmark = pytest.mark.unit

JOB = "j1"


class FakeGang:
    """A launch that records what was asked of it; `milestones` and `codes` are set by the test."""

    made: list[FakeGang] = []

    def __init__(self, spec, nodes, resume_from, attempt) -> None:
        self.spec, self.nodes, self.resume_from, self.attempt = spec, list(nodes), resume_from, attempt
        self.dir = spec.run_dir / f"attempt-{attempt}"
        self.started = self.stopped = False
        self.marks: list[dict] = []
        self.codes: dict[str, int | None] = {n: None for n in nodes}
        FakeGang.made.append(self)

    def start(self) -> None:
        self.started = True

    def stop(self, grace_s: float) -> None:
        self.stopped = True
        self.codes = {n: -15 for n in self.nodes}

    def milestones(self) -> list[dict]:
        return list(self.marks)

    def returncodes(self) -> dict[str, int | None]:
        return dict(self.codes)

    def running(self) -> bool:
        return any(c is None for c in self.codes.values())


@pytest.fixture
def setup(tmp_path):
    FakeGang.made = []
    spec = JobSpec(job=JOB, command=["train.py"], ckpt_dir=tmp_path / "ckpt", run_dir=tmp_path / "runs")
    spec.ckpt_dir.mkdir()
    sent: list = []

    def make(**kw) -> Controller:
        kw.setdefault("state_dir", tmp_path / "state")
        return Controller(spec, ["n1", "n2"], ["n3"], sent.append, gang=FakeGang, **kw)

    return spec, sent, make


def action(type_: str, nodes=(), evidence=(), id_: str | None = None) -> Action:
    return Action(id=id_ or f"a-{type_}-{'-'.join(nodes)}", ts=100.0, job=JOB, incident="i-1", type=type_,
                  nodes=list(nodes), evidence=list(evidence))


def phases(sent) -> list[tuple[str, str]]:
    return [(r.action, r.phase) for r in sent if isinstance(r, Recovery)]


def recoveries(sent) -> list[Recovery]:
    return [r for r in sent if isinstance(r, Recovery)]


def said(sent) -> list[tuple[str, str | None]]:
    """The job-level lifecycle records the controller published: (event, reason)."""
    assert all(r.rank is None and r.source == "controller" and r.job == JOB for r in sent if isinstance(r, Lifecycle))
    return [(r.event, r.reason) for r in sent if isinstance(r, Lifecycle)]


def checkpoint(spec, step: int) -> None:
    (spec.ckpt_dir / f"step-{step:08d}.pt").write_bytes(b"x")


def test_nodes_without_puts_spares_in_the_places_of_the_evicted():
    nodes = Nodes(["n1", "n2", "n3", "n4"], ["s1", "s2", "s3"], [])
    after = nodes.without(["n4", "n2"])
    assert after == Nodes(["n1", "s1", "n3", "s2"], ["s3"], ["n2", "n4"])
    assert nodes.without(["n1", "n2", "n3", "n4"]) is None  # three spares for four nodes


def test_applied_ids_survive_a_restart_and_the_older_journal_of_bare_ids_still_counts(tmp_path):
    journal = tmp_path / "applied"
    journal.write_text("a-old-1\na-old-2\n")  # what a controller wrote before the journal was the adapters' one
    ids = AppliedLog(journal)
    ids.add(Action(id="a-1", ts=1.0, job="j", incident="i", type="replace", nodes=["n1"]), (), ok=True, at=5.0)
    again = AppliedLog(journal)
    assert all(i in again for i in ("a-old-1", "a-old-2", "a-1")) and "a-3" not in again and len(again) == 3


def test_replace_restarts_from_the_latest_checkpoint_with_a_spare_and_reports_the_job_s_own_times(setup):
    spec, sent, make = setup
    checkpoint(spec, 10)
    checkpoint(spec, 20)
    c = make()
    c.start()
    first = FakeGang.made[0]
    assert first.nodes == ["n1", "n2"] and first.resume_from == spec.ckpt_dir / "step-00000020.pt"
    checkpoint(spec, 30)

    a = action("replace", ["n2"])
    c.handle(a)
    second = FakeGang.made[1]
    assert first.stopped and second.started
    assert second.nodes == ["n1", "n3"] and second.resume_from == spec.ckpt_dir / "step-00000030.pt"
    assert phases(sent) == [(a.id, "accepted"), (a.id, "replaced")]

    second.marks = [{"ts": 500.0, "event": "ckpt_loaded", "step": 30}, {"ts": 501.5, "event": "comm_ready"}]
    c.tick()
    second.marks.append({"ts": 502.25, "event": "step", "step": 31})
    c.tick()
    c.tick()
    assert phases(sent)[2:] == [(a.id, "ckpt_loaded"), (a.id, "comm_ready"), (a.id, "resumed")]
    assert [r.ts for r in recoveries(sent)[2:]] == [500.0, 501.5, 502.25]  # when it happened, not when noticed
    assert recoveries(sent)[2].extra == {"checkpoint": "step-30", "step": 30}  # what a drill's restore check reads


def test_a_broker_that_refuses_its_records_does_not_stop_the_controller_or_the_recovery(setup, caplog):
    """The controller owns the job: a `recovery` or `lifecycle` record the broker does not take (it is away) is
    logged, and the recovery goes on; what the broker takes once back is published."""
    spec, sent, make = setup
    checkpoint(spec, 10)
    away = [True]

    def publish(rec) -> None:
        if away[0]:
            raise ConnectionError("111 ECONNREFUSED")
        sent.append(rec)

    c = Controller(spec, ["n1", "n2"], ["n3"], publish, gang=FakeGang, state_dir=spec.run_dir.parent / "state")
    c.start()
    a = action("replace", ["n2"])
    c.handle(a)
    second = FakeGang.made[1]
    assert second.started and second.nodes == ["n1", "n3"] and sent == []
    assert any("the accepted record of action a-replace-n2 could not be published: ConnectionError" in r.getMessage()
               for r in caplog.records)
    away[0] = False
    second.marks = [{"ts": 500.0, "event": "ckpt_loaded", "step": 10}]
    c.tick()
    assert phases(sent) == [(a.id, "ckpt_loaded")]


def test_an_action_is_applied_once_even_by_a_restarted_controller(setup):
    spec, sent, make = setup
    c = make()
    c.start()
    a = action("replace", ["n2"])
    c.handle(a)
    c.handle(a)
    assert len(FakeGang.made) == 2 and phases(sent) == [(a.id, "accepted"), (a.id, "replaced")]

    again = make()  # the same state dir: it knows the action, and the node set it left behind
    again.start()
    again.handle(a)
    assert FakeGang.made[-1].nodes == ["n1", "n3"] and len(FakeGang.made) == 3
    assert len(recoveries(sent)) == 2


def test_rollback_goes_back_before_the_first_corrupt_step_and_isolate_then_changes_nothing(setup):
    spec, sent, make = setup
    for step in (30, 40, 50):
        checkpoint(spec, step)
    c = make(evidence_wait_s=30)
    c.start()
    suspect = Finding(id="f-sdc", ts=99.0, job=JOB, type="sdc_suspect", detector="sdc.digest", rank=2, node="n2",
                      evidence={"step": 45})
    rollback = action("rollback", ["n2"], evidence=["f-sdc"])
    c.handle(rollback)  # the finding is not there yet: the rollback waits for it
    c.handle(action("isolate", ["n2"]))
    assert len(FakeGang.made) == 1

    c.remember(suspect)
    c.tick()
    assert len(FakeGang.made) == 2
    restarted = FakeGang.made[1]
    assert restarted.nodes == ["n1", "n3"] and restarted.resume_from == spec.ckpt_dir / "step-00000040.pt"
    assert phases(sent) == [("a-rollback-n2", "accepted"), ("a-isolate-n2", "accepted"), ("a-rollback-n2", "replaced")]


def test_rollback_goes_back_to_the_last_step_the_replicas_agreed_on_not_just_before_the_mismatch(setup):
    """Digests every 5 steps, a checkpoint every step: the mismatch at 45 says nothing about 41..44, so the
    newest checkpoint the vote vouches for is the one of step 40."""
    spec, sent, make = setup
    for step in range(38, 47):
        checkpoint(spec, step)
    c = make(evidence_wait_s=30)
    c.start()
    c.remember(Finding(id="f-sdc", ts=99.0, job=JOB, type="sdc_suspect", detector="sdc.digest", rank=2, node="n2",
                       evidence={"step": 45, "last_agreeing_step": 40}))
    c.handle(action("rollback", ["n2"], evidence=["f-sdc"]))
    assert FakeGang.made[-1].resume_from == spec.ckpt_dir / "step-00000040.pt"


def test_a_rollback_without_a_step_in_its_evidence_uses_the_oldest_checkpoint(setup):
    spec, sent, make = setup
    for step in (30, 40):
        checkpoint(spec, step)
    c = make(evidence_wait_s=0.0)
    c.start()
    c.handle(action("rollback", ["n2"], evidence=["f-unknown"]))
    assert FakeGang.made[-1].resume_from == spec.ckpt_dir / "step-00000030.pt"


def test_without_a_spare_the_job_is_stopped_and_the_action_failed(setup):
    spec, sent, make = setup
    c = make()
    c.start()
    c.handle(action("replace", ["n1"]))
    evict = action("evict_group", ["n2", "n3"])
    c.handle(evict)
    assert FakeGang.made[-1].stopped and len(FakeGang.made) == 2
    assert phases(sent)[-2:] == [(evict.id, "accepted"), (evict.id, "failed")]


def test_a_restarted_job_that_dies_before_its_first_step_is_a_failed_recovery(setup):
    spec, sent, make = setup
    c = make()
    c.start()
    a = action("restart_in_process")
    c.handle(a)
    restarted = FakeGang.made[-1]
    assert restarted.nodes == ["n1", "n2"]  # in place: nothing was swapped, so no `replaced`
    restarted.codes = {"n1": 1, "n2": -15}
    c.tick()
    assert phases(sent) == [(a.id, "accepted"), (a.id, "failed")]


def test_other_jobs_stacks_and_human_matters_start_nothing(setup):
    spec, sent, make = setup
    c = make()
    c.start()
    c.handle(Action(id="a-x", ts=1.0, job="other", incident="i", type="replace", nodes=["n1"]))
    c.handle(action("collect_stacks"))
    c.handle(action("escalate"))
    c.handle(action("degrade", ["n2"]))
    assert len(FakeGang.made) == 1 and phases(sent) == [("a-degrade-n2", "accepted")]


def test_a_dry_run_launches_nothing_publishes_nothing_and_keeps_no_state(setup, tmp_path):
    spec, sent, make = setup
    c = make(dry_run=True)
    c.start()
    c.handle(action("replace", ["n2"]))
    assert FakeGang.made == [] and sent == [] and not (tmp_path / "state").exists()


def test_the_webhook_queues_signed_actions_and_refuses_the_rest():
    source = WebhookSource("127.0.0.1", 0, "s3cret")
    try:
        a = action("replace", ["n2"])
        good = WebhookSink(source.url, "s3cret", max_attempts=1).deliver(a)
        forged = WebhookSink(source.url, "not-the-secret", max_attempts=1, rng=random.Random(0)).deliver(a)
        assert (good.ok, good.status, forged.status) == (True, 202, 401)
        assert source.poll(1.0) == [a]
        body = encode(a)
        now = time.time()
        assert source.accept(body, sign("s3cret", body, "another-id", now), "another-id") == 400
        assert source.accept(b"{}", sign("s3cret", b"{}", a.id, now), a.id) == 400
        assert source.poll(0.01) == []
    finally:
        source.close()


def test_the_command_line_names_itself_in_its_errors_and_refuses_a_node_named_twice(capsys, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert main(["controller", "--job", "j1", "--nodes", "n1,n2", "--", "train.py"]) == 2
    [line] = capsys.readouterr().err.splitlines()  # no secret to check the topic's actions with: one line
    assert line.startswith("gangwatch controller: error: actions on the alert topic are signed") and SECRET_ENV in line
    monkeypatch.setenv(SECRET_ENV, "s3cret")
    assert main(["controller", "--job", "j1", "--nodes", "n1,n2", "--bootstrap", "127.0.0.1:1",
                 "--connect-timeout", "0.1", "--", "train.py"]) == 5
    assert capsys.readouterr().err.splitlines()[-1].startswith("gangwatch controller: error: cannot reach Kafka")
    with pytest.raises(SystemExit) as e:
        main(["controller", "--job", "j1", "--nodes", "n1,n1", "--", "train.py"])
    assert e.value.code == 2 and "a node is named twice" in capsys.readouterr().err


# --- the job's ordinary life, said as job-level lifecycle records -------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_start_is_said_before_the_launch_and_restart_before_the_old_gang_is_stopped(setup):
    spec, sent, make = setup
    seen: list[tuple] = []  # (record, how many gangs were made, whether the newest was stopped) at each publish
    clock = Clock()

    def publish(rec) -> None:
        sent.append(rec)
        seen.append((rec, len(FakeGang.made), FakeGang.made[-1].stopped if FakeGang.made else None))

    c = Controller(spec, ["n1", "n2"], ["n3"], publish, gang=FakeGang, state_dir=spec.run_dir.parent / "st",
                   clock=clock)
    c.start()
    a = action("replace", ["n2"])
    c.handle(a)
    c.handle(action("restart_in_process"))
    assert said(sent) == [("start", None), ("restart", f"replace {a.id}"),
                          ("restart", "restart_in_process a-restart_in_process-")]
    life = [(r.event, made, stopped) for r, made, stopped in seen if isinstance(r, Lifecycle)]
    assert life == [("start", 0, None), ("restart", 1, False), ("restart", 2, False)]  # each before what it says
    stamps = [r.ts for r in sent]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)  # stamped when each happened, in order
    assert all(isinstance(r, Lifecycle) for r in decode(encode(sent[0])))  # a contract record


def test_a_controller_stopped_while_the_job_runs_says_stop_and_a_finished_job_says_end_once(setup):
    spec, sent, make = setup
    c = make()
    c.start()
    c.close()
    assert said(sent) == [("start", None), ("stop", "user")]
    assert FakeGang.made[-1].stopped

    sent.clear()
    c = make()
    c.start()
    FakeGang.made[-1].codes = {"n1": 0, "n2": 0}  # every torchrun exited 0
    assert c.finished()
    c.close()
    c.close()
    assert said(sent) == [("start", None), ("end", None)]


def test_run_says_end_when_the_job_finishes_and_stop_when_it_is_stopped(setup):
    spec, sent, make = setup

    class Quiet:
        def poll(self, timeout_s: float) -> list:
            gang = FakeGang.made[-1]
            if len(FakeGang.made) == 1:
                gang.codes = {n: 0 for n in gang.nodes}  # the first job runs to its end
            return []

        def commit(self) -> None:
            pass

    run(make(), [Quiet()], threading.Event(), poll_s=0.0)
    assert said(sent) == [("start", None), ("end", None)]
    sent.clear()
    stop = threading.Event()
    stop.set()  # the controller was told to stop (TERM, INT) while its job runs
    run(make(), [Quiet()], stop, poll_s=0.0)
    assert said(sent) == [("start", None), ("stop", "user")]


def test_a_job_stopped_for_want_of_a_spare_is_not_said_restarted(setup):
    spec, sent, make = setup
    c = make()
    c.start()
    c.handle(action("evict_group", ["n1", "n2"]))
    assert said(sent) == [("start", None)] and phases(sent)[-1][1] == "failed"


def test_lifecycle_the_broker_refuses_never_stops_the_action(setup):
    spec, sent, make = setup

    def publish(rec) -> None:
        if isinstance(rec, Lifecycle):
            raise ConnectionError("broker away")
        sent.append(rec)

    c = Controller(spec, ["n1", "n2"], ["n3"], publish, gang=FakeGang)
    c.start()
    c.handle(action("replace", ["n2"]))
    assert FakeGang.made[-1].nodes == ["n1", "n3"] and FakeGang.made[0].stopped


def test_the_publisher_sends_each_record_to_its_topic_keyed_by_job(monkeypatch):
    import kafka
    from gangwatch.schemas.topics import TopicSettings

    got: list[tuple[str, bytes, bytes]] = []

    class Producer:
        def __init__(self, **kw) -> None:
            pass

        def send(self, topic, key, value):
            got.append((topic, key, value))
            return type("Ack", (), {"get": lambda self, timeout: None})()

    monkeypatch.setattr(kafka, "KafkaProducer", Producer)
    pub = Publisher("127.0.0.1:1", TopicSettings(prefix="x."))
    pub(Lifecycle(ts=1.0, job=JOB, event="restart", reason="replace a-1", source="controller"))
    pub(Recovery(ts=2.0, job=JOB, action="a-1", phase="accepted"))
    assert [(t, k) for t, k, _ in got] == [("x.telemetry", b"j1"), ("x.ops", b"j1")]
    assert decode(got[0][2])[0].event == "restart"


# --- active diagnosis: replay and dual run (control/trials.py), readmit, spares -----------------------------


def replay_action(*groups: tuple[str, list[str]]) -> Action:
    return Action(id="a-replay-1", ts=100.0, job=JOB, incident="i-1", type="replay",
                  nodes=sorted({n for _, nodes in groups for n in nodes}),
                  extra={"phase": 1, "groups": [{"id": g, "nodes": nodes, "suspects": nodes, "dp": 2}
                                                for g, nodes in groups]})


def runs_of(kind: str) -> list[FakeGang]:
    return [g for g in FakeGang.made if g.spec.job.startswith(f"{JOB}-{kind}-")]


def test_a_replay_stops_the_job_runs_each_group_on_its_nodes_from_the_latest_checkpoint_and_answers_once(setup):
    spec, sent, make = setup
    checkpoint(spec, 10)
    checkpoint(spec, 20)
    c = make(replay_timeout_s=3600.0)
    c.start()
    job = FakeGang.made[0]
    a = replay_action(("p1-0", ["n1"]), ("p1-1", ["n2"]), ("p1-2", ["n3", "n4"]))
    c.handle(a)
    assert job.stopped and said(sent) == [("start", None), ("restart", f"replay {a.id}")]
    runs = {tuple(g.nodes): g for g in runs_of("replay")}
    assert set(runs) == {("n1",), ("n2",), ("n3", "n4")} and len(FakeGang.made) == 4  # no relaunch of the job
    for g in runs.values():
        assert g.started and g.resume_from == spec.ckpt_dir / "step-00000020.pt"
        assert g.spec.env["GANGWATCH_REPLAY_STEPS"] == "1" and "GANGWATCH_DIGEST_OUT" not in g.spec.env
        assert g.spec.ckpt_dir != spec.ckpt_dir and spec.run_dir in g.spec.run_dir.parents  # nothing of the job's
    assert not list(spec.run_dir.glob("attempt-1"))
    runs[("n1",)].codes = {"n1": 0}
    runs[("n2",)].codes = {"n2": 1}
    runs[("n3", "n4")].codes = {"n3": 0, "n4": None}  # still running
    c.tick()
    assert [r for r in recoveries(sent) if r.phase == "replay_result"] == []
    assert not c.finished()
    runs[("n3", "n4")].codes = {"n3": 0, "n4": 0}
    c.tick()
    c.tick()
    [answer] = [r for r in recoveries(sent) if r.phase == "replay_result"]
    assert answer.action == a.id and answer.results == {"p1-0": "pass", "p1-1": "fail", "p1-2": "pass"}
    assert runs[("n2",)].stopped  # what was left of the failed group is stopped
    assert len(FakeGang.made) == 4 and not c.finished()  # the job stays stopped, waiting for the next action

    culprit = action("replace", ["n2"])
    c.handle(culprit)
    assert FakeGang.made[-1].nodes == ["n1", "n3"] and FakeGang.made[-1].resume_from == spec.ckpt_dir / \
        "step-00000020.pt"
    replaced = [r for r in recoveries(sent) if r.action == culprit.id]
    assert [(r.phase, r.spares) for r in replaced] == [("accepted", 1), ("replaced", 0)]


def test_a_replay_group_still_running_at_the_timeout_is_killed_and_fails(setup):
    spec, sent, make = setup
    c = make(replay_timeout_s=0.0)
    c.start()
    a = replay_action(("p2-0", ["n1"]), ("p2-1", ["n2"]))
    c.handle(a)
    done, hung = runs_of("replay")
    done.codes = {"n1": 0}
    c.tick()
    [answer] = [r for r in recoveries(sent) if r.phase == "replay_result"]
    assert answer.results == {"p2-0": "pass", "p2-1": "fail"} and hung.stopped
    assert done.resume_from is None  # no checkpoint yet: from the start


def test_a_replay_without_groups_fails_and_runs_nothing(setup):
    spec, sent, make = setup
    c = make()
    c.start()
    bad = Action(id="a-r", ts=1.0, job=JOB, incident="i", type="replay", nodes=["n1"], extra={"phase": 1})
    c.handle(bad)
    assert runs_of("replay") == [] and phases(sent) == [("a-r", "accepted"), ("a-r", "failed")]


def dual_finding(step: int) -> Finding:
    return Finding(id="f-sdc", ts=99.0, job=JOB, type="sdc_suspect", detector="sdc.digest", rank=2, node="n2",
                   evidence={"step": step})


def test_a_dual_run_runs_one_step_on_each_suspect_and_a_spare_alone_and_reports_their_digests(setup):
    spec, sent, make = setup
    for step in (30, 40, 50):
        checkpoint(spec, step)
    c = make(evidence_wait_s=30, replay_timeout_s=3600.0)
    c.start()
    dual = action("dual_run", ["n2"], evidence=["f-sdc"])
    c.handle(dual)
    assert runs_of("dual_run") == []  # it waits for the evidence naming the first corrupt step, as a rollback does
    c.remember(dual_finding(45))
    c.tick()
    runs = {tuple(g.nodes): g for g in runs_of("dual_run")}
    assert set(runs) == {("n2",), ("n3",)}  # the suspect, and the spare as the reference; each alone
    assert not FakeGang.made[0].stopped  # the job trains on meanwhile
    c.handle(action("isolate", ["n2"]))  # a dual run takes nobody out: an isolation still does
    assert FakeGang.made[-1].nodes == ["n1", "n3"] and FakeGang.made[0].stopped
    for (node,), g in runs.items():
        assert g.resume_from == spec.ckpt_dir / "step-00000040.pt" and g.spec.env["GANGWATCH_REPLAY_STEPS"] == "1"
        Path(g.spec.env["GANGWATCH_DIGEST_OUT"]).write_text(f"digest-of-{node}\n")
        g.codes = {node: 0}
    c.tick()
    [answer] = [r for r in recoveries(sent) if r.phase == "dual_run_result"]
    assert answer.digests == {"n2": "digest-of-n2", "n3": "digest-of-n3"} and answer.reference == "n3"
    assert decode(encode(answer)) == [answer]


def test_without_a_spare_the_reference_is_a_node_that_is_no_suspect_and_a_failed_run_gives_no_digest(setup):
    spec, sent, make = setup
    c = make(evidence_wait_s=0.0, replay_timeout_s=3600.0)
    c.start()
    c.handle(action("replace", ["n1"]))  # the one spare is used: n3 runs in n1's place
    c.handle(action("dual_run", ["n2"]))
    runs = {tuple(g.nodes): g for g in runs_of("dual_run")}
    assert set(runs) == {("n2",), ("n3",)}
    runs[("n2",)].codes = {"n2": -9}
    Path(runs[("n3",)].spec.env["GANGWATCH_DIGEST_OUT"]).write_text("ref\n")
    runs[("n3",)].codes = {"n3": 0}
    c.tick()
    [answer] = [r for r in recoveries(sent) if r.phase == "dual_run_result"]
    assert answer.digests == {"n3": "ref"} and answer.reference == "n3"


def test_readmit_makes_a_cleared_node_a_spare_again_and_every_acceptance_says_the_spares_left(setup, tmp_path):
    spec, sent, make = setup
    c = make()
    c.start()
    c.handle(action("isolate", ["n2"]))
    c.handle(action("readmit", ["n2", "n1"]))  # n1 never left: only n2 comes back
    c.handle(action("degrade", ["n1"]))
    assert c.nodes == Nodes(["n1", "n3"], ["n2"], [])
    assert make().nodes == c.nodes  # kept in the state dir
    assert [(r.action, r.phase, r.spares) for r in recoveries(sent)] == [
        ("a-isolate-n2", "accepted", 1), ("a-isolate-n2", "replaced", 0), ("a-readmit-n2-n1", "accepted", 0),
        ("a-degrade-n1", "accepted", 1)]


def test_a_job_that_ends_by_itself_is_said_once_with_each_nodes_exit(setup, caplog):
    """A user's Ctrl-C in the job (torchrun killed by SIGINT) on one node, a crash (exit 1) on the other: one
    WARNING naming both, then nothing more while the controller waits; a stop of its own doing is not said."""
    import logging

    _, _, make = setup
    c = make()
    c.start()
    gang = FakeGang.made[-1]
    with caplog.at_level(logging.INFO, logger="gangwatch.controller"):
        c.tick()  # running: nothing to say
        gang.codes = {"n1": -2, "n2": 1}
        c.tick()
        c.tick()
    said_exit = [r for r in caplog.records if "ended by itself" in r.getMessage()]
    assert len(said_exit) == 1 and said_exit[0].levelname == "WARNING"
    assert ("job j1 (attempt 0) ended by itself: n1 killed by SIGINT (signal 2), n2 exit code 1; it is not "
            "restarted unless an action says so") in said_exit[0].getMessage()
    caplog.clear()
    c = make()
    c.start()
    with caplog.at_level(logging.INFO, logger="gangwatch.controller"):
        c.handle(action("replace", ["n1", "n2"]))  # one spare for two: the controller stops the job itself
        c.tick()
    assert FakeGang.made[-1].stopped and not FakeGang.made[-1].running()
    assert not [r for r in caplog.records if "ended by itself" in r.getMessage()]


def test_an_exit_code_is_said_as_a_signal_when_it_is_one():
    from gangwatch.control.controller import exits

    assert exits({"n1": 130, "n2": -9, "n3": 0, "n4": None}) == \
        "n1 exit code 130 (128 + SIGINT), n2 killed by SIGKILL (signal 9), n3 exit code 0, n4 still running"
