"""The reference job controller without a broker: actions in, node swaps, checkpoints and recovery phases out.

The job is a stand-in (`FakeGang`) whose milestones the test writes; the launcher's
process handling is tested on real processes (a fake torchrun) in test_launcher.py.
"""

from __future__ import annotations

import random
import time

import pytest
from gangwatch.schemas import Action, Finding, encode
from gangwatch.sinks.controller import WebhookSink, sign
from gangwatch.streams.controller import AppliedIds, Controller, Nodes, WebhookSource
from gangwatch.streams.launcher import JobSpec

from gangwatch.cli import main

pytestmark = pytest.mark.unit

JOB = "j1"


class FakeGang:
    """A launch that records what was asked of it; `milestones` and `codes` are set by the test."""

    made: list[FakeGang] = []

    def __init__(self, spec, nodes, resume_from, attempt) -> None:
        self.nodes, self.resume_from, self.attempt = list(nodes), resume_from, attempt
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
    return [(r.action, r.phase) for r in sent]


def checkpoint(spec, step: int) -> None:
    (spec.ckpt_dir / f"step-{step:08d}.pt").write_bytes(b"x")


def test_nodes_without_puts_spares_in_the_places_of_the_evicted():
    nodes = Nodes(["n1", "n2", "n3", "n4"], ["s1", "s2", "s3"], [])
    after = nodes.without(["n4", "n2"])
    assert after == Nodes(["n1", "s1", "n3", "s2"], ["s3"], ["n2", "n4"])
    assert nodes.without(["n1", "n2", "n3", "n4"]) is None  # three spares for four nodes


def test_applied_ids_survive_a_restart(tmp_path):
    ids = AppliedIds(tmp_path / "applied")
    ids.add("a-1")
    ids.add("a-2")
    assert "a-1" in AppliedIds(tmp_path / "applied") and "a-3" not in AppliedIds(tmp_path / "applied")


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
    assert [r.ts for r in sent[2:]] == [500.0, 501.5, 502.25]  # when it happened, not when it was noticed


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
    assert len(sent) == 2


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
    c.handle(action("dual_run", ["n2"]))
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


def test_the_command_line_names_itself_in_its_errors_and_refuses_a_node_named_twice(capsys):
    assert main(["controller", "--job", "j1", "--nodes", "n1,n2", "--bootstrap", "127.0.0.1:1",
                 "--connect-timeout", "0.1", "--", "train.py"]) == 5
    assert capsys.readouterr().err.splitlines()[-1].startswith("gangwatch controller: error: cannot reach Kafka")
    with pytest.raises(SystemExit) as e:
        main(["controller", "--job", "j1", "--nodes", "n1,n1", "--", "train.py"])
    assert e.value.code == 2 and "a node is named twice" in capsys.readouterr().err
