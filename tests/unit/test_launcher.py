"""The launcher on real processes: a fake torchrun per node, the protocol's environment, and a stop that leaves
nothing behind even when torchrun and its ranks ignore TERM."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from gangwatch.control.launcher import Gang, JobSpec, checkpoints, descendants, latest, newest_before

pytestmark = pytest.mark.unit

# Stands in for torchrun: the first node hosts the rendezvous port; each starts one "rank" in its own session
# (as torchrun does) that ignores TERM, reports a milestone with what the launcher told it, and then ignores
# TERM itself, like a torchrun stuck in its shutdown.
FAKE_TORCHRUN = r'''
import json, os, signal, socket, subprocess, sys, time
endpoint = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--rdzv-endpoint="))
host, port = endpoint.rsplit(":", 1)
try:
    store = socket.create_server((host, int(port)))
except OSError:
    store = None
rank = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                         "time.sleep(600)"], start_new_session=True)
with open(os.environ["GANGWATCH_PROGRESS"], "a") as fh:
    fh.write(json.dumps({"ts": time.time(), "event": "comm_ready", "node": os.environ["GANGWATCH_NODE"],
                         "job": os.environ["GANGWATCH_JOB"], "resume": os.environ.get("GANGWATCH_RESUME_FROM"),
                         "hosts_store": store is not None, "args": sys.argv[1:]}) + "\n")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(600)
'''


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def wait(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_gang_starts_one_torchrun_per_node_and_its_stop_leaves_no_process(tmp_path):
    fake = tmp_path / "torchrun.py"
    fake.write_text(FAKE_TORCHRUN)
    spec = JobSpec(job="j9", command=["train.py", "--steps", "5"], ckpt_dir=tmp_path / "ckpt",
                   run_dir=tmp_path / "runs", torchrun=(sys.executable, str(fake)))
    gang = Gang(spec, ["n1", "n2"], resume_from=tmp_path / "ckpt" / "step-00000010.pt", attempt=3)
    gang.start()
    try:
        wait(lambda: len(gang.milestones()) == 2)
        marks = {m["node"]: m for m in gang.milestones()}
        assert marks["n1"]["hosts_store"] and not marks["n2"]["hosts_store"]
        assert {m["job"] for m in marks.values()} == {"j9"}
        assert {m["resume"] for m in marks.values()} == {str(tmp_path / "ckpt" / "step-00000010.pt")}
        args = marks["n2"]["args"]
        assert "--nnodes=2" in args and "--max-restarts=0" in args and "--rdzv-id=j9-3" in args
        assert args[-3:] == ["train.py", "--steps", "5"]
        assert gang.running() and (gang.dir / "n1.log").exists()
        family = [pid for p in gang.procs.values() for pid, _ in descendants(p.pid)]
        assert len(family) == 2
    finally:
        gang.stop(grace_s=0.5)
    wait(lambda: not any(alive(pid) for pid in family))
    assert not gang.running() and all(code is not None for code in gang.returncodes().values())


def test_checkpoints_are_chosen_by_the_step_in_their_name(tmp_path):
    for name in ("step-00000010.pt", "step-00000030.pt", "step-00000020.pt", "step-00000040.tmp", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    assert [s for s, _ in checkpoints(tmp_path)] == [10, 20, 30]
    assert latest(tmp_path) == tmp_path / "step-00000030.pt"
    assert newest_before(tmp_path, 30) == tmp_path / "step-00000020.pt"
    assert newest_before(tmp_path, 10) is None and latest(tmp_path / "nothing") is None
