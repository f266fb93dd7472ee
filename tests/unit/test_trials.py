"""Replay groups and dual runs on real processes: a fake torchrun per node that passes, fails or hangs, and a
deadline that leaves nothing of a hung run behind."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from gangwatch.control.launcher import JobSpec
from gangwatch.control.trials import Trial, replay_groups
from gangwatch.schemas import Action

pytestmark = pytest.mark.unit

# Stands in for torchrun: what it does depends on its node's name. `ok*` writes the digest it was asked for (its
# node's name and resume checkpoint, so the test can tell who wrote what) and exits 0, `bad*` exits 3, `hung*`
# starts a rank that ignores TERM and ignores TERM itself.
FAKE_TORCHRUN = r'''
import json, os, signal, subprocess, sys, time
node = os.environ["GANGWATCH_NODE"]
with open(os.path.join(os.path.dirname(os.environ["GANGWATCH_PROGRESS"]), node + ".env"), "w") as fh:
    fh.write(json.dumps({k: os.environ.get(k) for k in ("GANGWATCH_JOB", "GANGWATCH_REPLAY_STEPS", "GANGWATCH_CKPT_DIR",
                                                  "GANGWATCH_RESUME_FROM", "GANGWATCH_DIGEST_OUT")}))
if node.startswith("ok"):
    out = os.environ.get("GANGWATCH_DIGEST_OUT")
    if out:
        with open(out, "w") as fh:
            fh.write(node + "@" + os.environ.get("GANGWATCH_RESUME_FROM", "-") + "\n")
    sys.exit(0)
if node.startswith("bad"):
    sys.exit(3)
rank = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                         "time.sleep(600)"], start_new_session=True)
with open(os.path.join(os.path.dirname(os.environ["GANGWATCH_PROGRESS"]), "rank.pid"), "w") as fh:
    fh.write(str(rank.pid))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(600)
'''


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def settle(trial: Trial, deadline_s: float = 30.0) -> None:
    """Poll the trial on the real clock until it is over (its own deadline decides hung runs)."""
    until = time.monotonic() + deadline_s
    while not trial.poll(time.monotonic()):
        assert time.monotonic() < until, "the trial never ended"
        time.sleep(0.05)


@pytest.fixture
def spec(tmp_path) -> JobSpec:
    fake = tmp_path / "torchrun.py"
    fake.write_text(FAKE_TORCHRUN)
    return JobSpec(job="j9", command=["train.py"], ckpt_dir=tmp_path / "ckpt", run_dir=tmp_path / "runs",
                   nproc_per_node=1, torchrun=(sys.executable, str(fake)))


def replay(*groups: tuple[str, list[str]]) -> Action:
    return Action(id="a-r1", ts=1.0, job="j9", incident="i", type="replay",
                  extra={"phase": 1, "groups": [{"id": g, "nodes": n, "suspects": n, "dp": 1} for g, n in groups]})


def test_groups_that_exit_0_pass_and_the_others_fail_and_a_hung_one_is_killed_with_its_ranks(spec, tmp_path):
    ckpt = tmp_path / "ckpt" / "step-00000020.pt"
    trial = Trial.replay(spec, replay(("p1-0", ["ok1"]), ("p1-1", ["bad1"]), ("p1-2", ["hung1"])), ckpt, steps=2,
                         timeout_s=3.0, now=time.monotonic())
    hung = trial.runs[2].gang
    pid_file = hung.dir / "rank.pid"
    until = time.monotonic() + 20
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < until
        time.sleep(0.05)
    rank = int(pid_file.read_text())
    settle(trial)
    assert trial.results() == {"p1-0": "pass", "p1-1": "fail", "p1-2": "fail"}
    assert not hung.running()
    until = time.monotonic() + 10  # (SIGKILL is sent; the kernel takes a moment to carry it out)
    while alive(rank):  # nothing of the hung group outlives its deadline
        assert time.monotonic() < until, "the hung group's rank outlived its deadline"
        time.sleep(0.05)
    env = json.loads((trial.runs[0].gang.dir / "ok1.env").read_text())
    assert env["GANGWATCH_REPLAY_STEPS"] == "2" and env["GANGWATCH_RESUME_FROM"] == str(ckpt)
    assert env["GANGWATCH_JOB"] != "j9" and Path(env["GANGWATCH_CKPT_DIR"]) != spec.ckpt_dir
    assert env["GANGWATCH_DIGEST_OUT"] is None


def test_a_dual_run_gives_each_node_that_passed_its_digest_and_none_to_one_that_failed(spec, tmp_path):
    ckpt = tmp_path / "ckpt" / "step-00000040.pt"
    dual = Action(id="a-d1", ts=1.0, job="j9", incident="i", type="dual_run", nodes=["ok-suspect", "bad-suspect"])
    trial = Trial.dual_run(spec, dual, dual.nodes, "ok-ref", ckpt, timeout_s=30.0, now=time.monotonic())
    assert [r.nodes for r in trial.runs] == [("ok-suspect",), ("bad-suspect",), ("ok-ref",)]  # each node alone
    settle(trial)
    assert trial.digests() == {"ok-suspect": f"ok-suspect@{ckpt}", "ok-ref": f"ok-ref@{ckpt}"}
    assert trial.reference == "ok-ref"


@pytest.mark.parametrize("extra", [{}, {"groups": []}, {"groups": [{"id": "p1-0"}]}, {"groups": [{"nodes": ["n1"]}]},
                                   {"groups": [{"id": "g", "nodes": ["n1"]}, {"id": "g", "nodes": ["n2"]}]}])
def test_a_replay_whose_groups_cannot_be_read_is_refused_with_a_line(extra):
    with pytest.raises(ValueError) as e:
        replay_groups(Action(id="a-x", ts=1.0, job="j", incident="i", type="replay", extra=extra))
    assert "a-x" in str(e.value) and "\n" not in str(e.value)
