"""Active diagnosis on a real job: the reference controller answers `replay` and `dual_run` by running the job.

Each test runs examples/tiny_job/train.py under `gangwatch controller` (nodes n1
and n2 of two ranks each, spare n3), watched live by the worker and the node
agents (tests/integration/livejob.py), the fault travelling to the ranks in
their environment:

- `hang_comm` on n2: its rank's gradient all_reduce never completes while every
  other rank waits in the same one, so every stack is alike and passive evidence
  names nobody. The stall goes up the escalation ladder (the stall budget cut to
  15 s: a page, then a replay): the controller stops the job, replays its step
  from the latest checkpoint on each node alone (DP 2: a node's two ranks),
  n2's group hangs and is killed at the replay timeout, n1's passes; triage
  intersects that into n2, which is replaced by n3.
- `sdc` on n2, once: the replicas' vote names n2; rollback + isolate + dual
  run. The dual run (one step from the checkpoint before the corruption, on n2
  and on a reference, each alone) gives the same digest bit for bit, since a
  one-off corruption does not recur: n2 is readmitted (a spare again) and the
  incident closes `not_confirmed`. The persistent case (`sdc_load`, digests
  differ, `confirmed`) is the SDC test of test_real_job.py.

Each asserts the actions and the answers, reads the incident's rungs or proof
from the incidents topic, and replays the recorded telemetry twice: with the
controller's recorded answers, and with the simulated controller's
(`gangwatch replay --simulate-controller n2`) in place of the replay and
dual-run answers; both must give the live outcome.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from pathlib import Path

import pytest
from gangwatch.producers.simulate.responder import Delays, SimulatedController
from gangwatch.schemas import RESTARTING_ACTIONS

from tests.helpers import need_module
from tests.integration.livejob import Fault, LiveJob, Outcome

need_module("torch", "the live job is examples/tiny_job/train.py (the `torch` extra)")
pytestmark = pytest.mark.integration

STEPS = 5000  # more than any test needs: the test stops the job
HANG_AT = 40
REPLAY_TIMEOUT_S = 40  # a replay group still running after this is hung: killed, failed
WITHIN_S = 420.0  # from the start of everything to the incident closed


@pytest.fixture
def live(kafka_bootstrap, topics, clickhouse_addr, unique, tmp_path):
    made: list[LiveJob] = []

    def start(fault: Fault, *train_args: str, **kw) -> LiveJob:
        job = LiveJob(kafka_bootstrap, topics, clickhouse_addr, tmp_path, job=unique, fault=fault, **kw)
        made.append(job)
        job.start(STEPS, *train_args)
        return job

    yield start
    for job in made:
        job.stop()
        job.store._client.execute(f"DROP DATABASE IF EXISTS {unique}")


def answers(job: LiveJob, phase: str) -> list:
    return [r for r in job.inputs() if r.kind == "recovery" and r.phase == phase]


def dual_runs(job: LiveJob, action_id: str) -> dict[str, dict]:
    """What each run of a dual run left in its folder (control/trials.py): node -> the digest it wrote, the
    checkpoint it loaded (rank 0's `ckpt_loaded` milestone) and its rank count (`comm_ready`)."""
    out = {}
    [base] = (job.state / "runs").glob(f"dual_run-{re.sub(r'[^A-Za-z0-9._-]', '_', action_id)}")
    for run in sorted(p for p in base.iterdir() if p.is_dir()):
        said = {m["event"]: m for m in map(json.loads, (run / "attempt-0" / "progress.jsonl").read_text().splitlines())}
        out[run.name] = {"digest": (run / "digest").read_text().strip(), "ckpt": Path(said["ckpt_loaded"]["ckpt"]),
                         "world": said["comm_ready"]["world"]}
    return out


def digest_of_checkpoint(ckpt: Path, world: int) -> str:
    """The digest a run would write (examples/tiny_job/train.py `write_digest`) of the parameters it loaded
    from `ckpt`, had it taken no step: every rank holds the same ones."""
    import torch

    h = hashlib.sha256()
    for t in torch.load(ckpt, weights_only=True)["model"].values():
        h.update(t.contiguous().numpy().tobytes())
    return hashlib.sha256((h.hexdigest() * world).encode()).hexdigest()


def closed(job: LiveJob, culprit: str | None) -> list[dict]:
    return [i for i in job.incidents() if i["recovered_ts"] is not None and
            (culprit is None or i["culprit_nodes"] == [culprit])]


def same_when_replayed(job: LiveJob, live: Outcome, figures) -> None:
    """The live outcome, replayed with the recorded answers and with simulated ones for replay and dual run
    (the controller's restarts keep their recorded answers: the simulated one is told not to answer them)."""
    simulated = SimulatedController(faulty=frozenset({"n2"}), corrupting=frozenset({"n2"}) if job.fault.kind ==
                                    "sdc_load" else frozenset(), delays=Delays(replay_s=1.0, dual_run_s=1.0),
                                    silent=RESTARTING_ACTIONS)
    recorded, answered = job.replayed(), job.replayed(simulated)
    print(f"\nlive {live}\nreplayed {recorded}\nsimulated answers {answered}")
    figures("replay_same", recorded == live)
    figures("simulated_same", answered == live)
    assert recorded == live
    assert answered == live


def test_a_hang_every_rank_shows_alike_is_localized_by_replay_and_its_node_replaced(live, fault_figures):
    started = time.monotonic()
    job = live(Fault("hang_comm", step=HANG_AT), worker_extra=("--set", "triage.stall_budget_s=15", "--set",
                                                               "triage.hang_collect_s=20"),
               controller_extra=("--replay-timeout", str(REPLAY_TIMEOUT_S), "--stop-grace", "5"))
    job.wait(lambda: bool(closed(job, "n2")), WITHIN_S, "the incident localized to n2 by replay, closed")
    wall = time.monotonic() - started
    [inc] = closed(job, "n2")
    got = job.outcome()
    assert got.evictions == (("replace", ("n2",)),) and got.restarts == (), got
    assert got.incidents == (("stall", ("n2",)),), (got, job.findings())
    assert not [f for f in job.findings() if f["type"] == "stack_outlier"]  # the stacks named nobody
    replays = [a for a in job.actions() if a["type"] == "replay"]
    assert len(replays) == 1 and sorted(replays[0]["nodes"]) == ["n1", "n2"]
    [result] = answers(job, "replay_result")
    [action] = [a for a in job.action_records() if a.type == "replay"]
    groups = {g["id"]: g["nodes"] for g in action.extra["groups"]}
    assert sorted(map(tuple, groups.values())) == [("n1",), ("n2",)]
    assert result.results == {g: "fail" if nodes == ["n2"] else "pass" for g, nodes in groups.items()}
    assert result.ts - action.ts >= REPLAY_TIMEOUT_S  # the hung group was given its time, then killed
    assert job.nodes()["active"] == ["n1", "n3"] and job.nodes()["out"] == ["n2"]
    [record] = [i for i in job.incident_records() if i.id == inc["id"]]
    rungs = record.extra["rungs"]
    assert [r["rung"] for r in rungs] == ["page", "replay"], rungs
    assert rungs[-1]["outcome"] == "localized" and rungs[-1]["runs"] == 2, rungs
    localize_s = record.localized_ts - record.detected_ts
    print(f"\nhang_comm: rungs {rungs}; localized {localize_s:.1f} s after detection; replay answered "
          f"{result.ts - action.ts:.1f} s after it was asked; stages {record.stage_s}")
    fault_figures("localize_s", round(localize_s, 1))
    fault_figures("replay_answer_s", round(result.ts - action.ts, 1))
    fault_figures("wall_s", round(wall, 1))
    job.caught_up()
    same_when_replayed(job, job.outcome(), fault_figures)


def test_a_one_off_corruption_is_not_confirmed_by_the_dual_run_and_its_node_readmitted(live, fault_figures):
    started = time.monotonic()
    # a digest step (every 5): the corrupt update is voted on at once; every checkpoint kept, so that the one the
    # dual run loaded is still there to be read when the test checks the digests against it
    job = live(Fault("sdc", step=45), "--keep", str(STEPS))
    job.wait(lambda: bool(answers(job, "dual_run_result")) and "readmit" in {a["type"] for a in job.actions()},
             WITHIN_S, "the dual run's answer and the readmission")
    job.wait(lambda: job.nodes()["spares"] == ["n2"], 60.0, "n2 back among the controller's spares")
    wall = time.monotonic() - started
    [result] = answers(job, "dual_run_result")
    [dual] = [a for a in job.action_records() if a.type == "dual_run"]
    assert dual.nodes == ["n2"] and result.reference == "n1"  # the spare is running the job: n1 is the reference
    assert set(result.digests) == {"n1", "n2"} and result.digests["n1"] == result.digests["n2"]  # bit for bit
    # each digest is what that node's run wrote, a sha256 in hex, of parameters one step past the checkpoint
    # both loaded (the one before the corrupt step 45), not of what it loaded
    runs = dual_runs(job, dual.id)
    assert {n: r["digest"] for n, r in runs.items()} == result.digests, runs
    assert all(re.fullmatch(r"[0-9a-f]{64}", d) for d in result.digests.values()), result.digests
    [(ckpt, world)] = {(r["ckpt"], r["world"]) for r in runs.values()}
    assert ckpt.parent == job.ckpt and int(ckpt.stem.split("-")[1]) < 45 and world == 2, (ckpt, world)
    assert result.digests["n2"] != digest_of_checkpoint(ckpt, world)
    assert {("rollback", ("n2",)), ("isolate", ("n2",)), ("readmit", ("n2",))} <= {
        (a["type"], tuple(a["nodes"])) for a in job.actions()}
    assert job.nodes() == {"active": ["n1", "n3"], "spares": ["n2"], "out": []}
    job.wait(lambda: any(i.extra.get("resolution") == "not_confirmed" for i in job.incident_records()), 60.0,
             "the incident closed not_confirmed")
    [record] = job.incident_records()
    assert record.cls == "sdc" and record.culprit_nodes == [] and record.extra["proof"] == result.digests
    said = [(r.phase, r.spares) for r in job.inputs() if r.kind == "recovery" and r.phase in ("accepted", "replaced")]
    assert ("replaced", 0) in said and all(n in (0, 1) for _, n in said), said  # the spares held, on every one
    fault_figures("dual_run_answer_s", round(result.ts - dual.ts, 1))
    fault_figures("wall_s", round(wall, 1))
    job.caught_up()
    same_when_replayed(job, job.outcome(), fault_figures)
