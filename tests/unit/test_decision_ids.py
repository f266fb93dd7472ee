"""An action's id is its decision's: the same decision carries the same id however late or how often the worker
makes it; a new id is a new decision.

Issue 43: `test_controller_down_60s` once saw two action ids at the controller beyond the three it expected. They
were no retries under new ids (the webhook's Idempotency-Key is the action id on every attempt, tests/unit/
test_controller.py; the id hashes the incident, the type and the nodes: `triage.triage.Triage.act`), but two new
decisions: the test's two jobs streamed 200 s of telemetry and stopped together, with no end-of-job record, and a
run that took longer than that under CI's load saw each job fall silent at once, one `monitoring_gap` escalation
per job. The test now streams for longer than all its waits together and says so if it ever runs out.
"""

from __future__ import annotations

import dataclasses

import pytest
from gangwatch.schemas import decode
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.runner import JobRunner, Msg

from tests.integration.kafkakit import messages, scenario

pytestmark = pytest.mark.unit

T = TopicSettings()
SECONDS = 30  # of telemetry per job; then nothing more, and no end-of-job record


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def two_jobs() -> list[Msg]:
    """Two healthy one-node jobs of 16 ranks in one partition, their telemetry ending at the same moment (on one
    node, that is no end the job's steps can show: the node may have died with it; a monitoring gap each)."""
    recs = []
    for job, prefix in (("ja", "a"), ("jb", "b")):
        for rec in scenario(nodes=1, per_node=16, seconds=SECONDS, hb=2.0, silent=None, xid_node=None, job=job):
            if rec.kind == "job":
                rec = dataclasses.replace(rec, ranks=[dataclasses.replace(r, node=prefix + r.node[1:])
                                                      for r in rec.ranks])
            recs.append(rec)
    recs.sort(key=lambda r: r.ts)
    return [Msg(topic, 0, i, key, value) for i, (topic, key, value) in enumerate(messages(recs, T))]


def actions_when_silent(start: float, waited: float, every: float = 1.0, handover_at: int | None = None) -> list:
    """The actions a worker publishes for `two_jobs` read at wall time `start`, then `waited` seconds of silence
    (a tick every `every` seconds, its input caught up); with `handover_at`, another worker takes the partition
    over from the first one's saved states after that many messages and is given the rest (and some again)."""
    clock = Clock(start)
    msgs = two_jobs()
    runner = JobRunner(T, clock=clock)
    sends = []
    if handover_at is not None:
        sends += runner.on_batch(msgs[:handover_at]).sends
        saved = {job: runner.state_of(job) for job in runner.jobs}
        runner = JobRunner(T, clock=clock, load=saved.get)
        msgs = msgs[handover_at // 2:]  # read again from before the states (offsets committed late)
    sends += runner.on_batch(msgs).sends
    while clock.now < start + waited:
        clock.now += every
        sends += runner.on_tick().sends
    return [decode(s.value)[0] for s in sends if s.topic == T.actions]


def test_telemetry_that_stops_is_one_new_decision_per_job_with_an_id_that_is_the_decision_s():
    assert actions_when_silent(1_000.0, 1.0) == []  # still in time: nothing to decide
    assert actions_when_silent(1_000.0, 60.0) == []  # the page waits the lateness bound (`late_s`) for late records
    got = actions_when_silent(1_000.0, 120.0)
    # each job fell silent on every rank at once: the monitoring path failed or the job ended unannounced
    assert sorted((a.job, a.type) for a in got) == [("ja", "escalate"), ("jb", "escalate")]
    assert all("monitoring_gap" in a.reason for a in got), [a.reason for a in got]
    # the same decisions noticed at another wall time, ticks further apart, or by a worker that took over from
    # saved states and read part of the input again: the same ids, so the controller's idempotency by id acts once
    for again in (actions_when_silent(5_000.0, 180.0, every=7.0), actions_when_silent(1_000.0, 120.0, handover_at=40)):
        assert sorted(a.id for a in again) == sorted(a.id for a in got)
