"""The broker killed for 30 s in the middle of a healthy real run: no record lost, no alarm.

A broker of this test's own (kafkakit.PrivateBroker) carries the whole run: the
torchrun job of examples/tiny_job/train.py under the reference controller, the
node agents and the worker (storing every input record in gw_telemetry). Once
the job has trained for a while the broker gets SIGKILL, stays down for 30 s and
is started again on the same data. Meanwhile the trainer clients and agents
spool; afterwards they resend, each after its own back-off, and the worker waits
its reconnect grace for all of them before it judges silence (streams/runner.py).

Checked right after the restart: the worker logged the outage (it holds what
producers resend for its grace only when it saw the broker go). Checked once
the job has ended and the worker has read everything: every step of every rank
is stored, every rank's heartbeats are stored, with at least half the beats
the outage's length holds stamped while the broker was down (the heartbeat
thread kept beating through the outage, into the spool) and no gap a third of
the outage long, no producer reports a dropped record, and nothing above precursor
severity was found: no finding (but a job-wide slowdown, which blames nobody),
no action, no incident.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.topic_admin import create_topics

from tests.helpers import need_module
from tests.integration.conftest import PARTITIONS
from tests.integration.kafkakit import PrivateBroker, caught_up
from tests.integration.livejob import NODES, LiveJob

need_module("torch", "the live job is examples/tiny_job/train.py (the `torch` extra)")
pytestmark = pytest.mark.integration

STEPS = 900  # about 110 s of training: the outage (30 s, plus the broker's restart) sits in the middle
KILL_AT_STEP = 150
OUTAGE_S = 30.0
HEARTBEAT_S = 2.0  # examples/tiny_job/train.py's default
RANKS = 2 * len(NODES)


def test_a_broker_killed_for_30_s_during_a_healthy_run_loses_no_record_and_raises_no_alarm(clickhouse_addr,
                                                                                             tmp_path):
    broker = PrivateBroker(tmp_path)
    broker.start()
    name = f"t{uuid.uuid4().hex[:12]}"
    topics = TopicSettings(prefix=f"{name}.", partitions=PARTITIONS)
    create_topics(topics, broker.bootstrap)
    (tmp_path / "job").mkdir()
    job = LiveJob(broker.bootstrap, topics, clickhouse_addr, tmp_path / "job", job=name,
                  worker_extra=("--telemetry",))
    try:
        job.start(STEPS)
        job.wait(lambda: job.newest_checkpoint() >= KILL_AT_STEP, 240.0, f"the job to reach step {KILL_AT_STEP}")
        broker.kill()
        killed, down_from = time.monotonic(), time.time()
        during = job.newest_checkpoint()
        time.sleep(OUTAGE_S)  # the fault itself: the broker stays down this long
        assert job.newest_checkpoint() > during, "training waited for the broker"
        broker.start()
        down_to = time.time()
        print(f"\nbroker down {time.monotonic() - killed:.1f} s (killed at checkpoint {during}, "
              f"{OUTAGE_S:g} s down, then its restart)")
        # the worker saw the outage (its grace holds the first producers to resend): before its own watch, the
        # silence timer that also looked for it sat in a commit to the dead broker and never did
        worker_log = tmp_path / "job" / "worker.log"
        job.wait(lambda: "the broker is unreachable" in worker_log.read_text(errors="replace"), 30.0,
                 "the worker to log the outage")
        job.run_to_end(400.0)
        job.wait(lambda: caught_up(broker.bootstrap, name, topics.job_inputs), 120.0, "the worker to read it all")
        want = RANKS * (STEPS + 1)  # steps 0..STEPS on every rank

        def stored_steps() -> int:
            [row] = job.query(f"SELECT uniqExact(rank, step) AS n FROM gw_telemetry WHERE job = '{name}' "
                              "AND kind = 'step'")
            return row["n"]

        try:
            job.wait(lambda: stored_steps() == want, 120.0, f"all {want} steps stored")
        except AssertionError as e:
            rows = job.query(f"SELECT DISTINCT rank, step FROM gw_telemetry WHERE job = '{name}' AND kind = 'step'")
            have = {(r["rank"], r["step"]) for r in rows}
            missing = sorted({(r, s) for r in range(RANKS) for s in range(STEPS + 1)} - have)
            raise AssertionError(f"{len(missing)} steps not stored, (rank, step): {missing[:40]}") from e
        [steps] = job.query(f"SELECT count() AS n FROM gw_telemetry WHERE job = '{name}' AND kind = 'step'")
        beats = job.query(f"SELECT rank, ts, payload FROM gw_telemetry WHERE job = '{name}' AND kind = 'heartbeat' "
                          "ORDER BY rank, ts")
        print(f"steps stored {stored_steps()} of {want} ({steps['n'] - want} stored twice: resent after a lost "
              f"acknowledgement), heartbeats stored {len(beats)}")
        by_rank: dict[int, list[float]] = {}
        for b in beats:
            by_rank.setdefault(b["rank"], []).append(b["ts"])
            assert "dropped" not in json.loads(b["payload"]), b  # a producer that lost records says so
        assert sorted(by_rank) == list(range(RANKS))
        gaps = {r: round(max(b - a for a, b in zip(ts, ts[1:], strict=False)), 2) for r, ts in by_rank.items()}
        inside = {r: sum(down_from <= t <= down_to for t in ts) for r, ts in by_rank.items()}
        print(f"longest gap between a rank's heartbeats {gaps} s (period {HEARTBEAT_S:g} s); heartbeats stamped while "
              f"the broker was down {inside}")
        # Heartbeats lost to the outage leave a gap as long as the outage, and none stamped while it lasted. A gap
        # of a few periods is the trainer's heartbeat thread not getting the CPU (seen in CI on 2 cores: 5.5 s on
        # every rank at once, the stamps taken late, nothing lost): not what this test is about.
        assert max(gaps.values()) < OUTAGE_S / 3, gaps
        assert min(inside.values()) >= OUTAGE_S / HEARTBEAT_S / 2, inside  # beaten into the spool meanwhile
        # A job slowdown is the trainers' own step times (not delivery timing, which the outage disturbs): on this
        # 2-core machine every client and the worker retrying a dead broker can slow a 0.1 s step for a few steps.
        # It names nobody and opens nothing (as in the benign-noise scenario); any other finding is a false alarm.
        for f in job.findings():
            if f["type"] == "job_slowdown":
                print(f"the job itself was slower for a while: {f['evidence']}")
        findings = [f for f in job.findings() if f["type"] != "job_slowdown"
                    and json.loads(f["evidence"]).get("severity") != "precursor"]
        assert findings + job.actions() + job.incidents() == []
    finally:
        job.stop()
        job.store._client.execute(f"DROP DATABASE IF EXISTS {name}")
        broker.stop()
