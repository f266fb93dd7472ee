"""Finding a job's ranks on this node in /proc (a fake /proc tree, and the real one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gangwatch.producers.agent.procs import RankProcess, rank_processes

pytestmark = pytest.mark.unit


def fake_process(root: Path, pid: int, ppid: int, env: dict[str, str] | None, comm: str = "python") -> None:
    """A /proc/PID directory: `stat` (with its awkward comm field) and `environ` (None: unreadable)."""
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 1234 0 0 0 5 3 0 0 20 0 1\n")
    if env is not None:
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


@pytest.fixture
def proc(tmp_path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "self").mkdir()  # /proc has non-pid entries too
    (root / "meminfo").write_text("MemTotal: 1 kB\n")
    return root


def test_each_rank_of_each_job_is_found_once_by_the_variables_the_trainer_client_reads(proc):
    fake_process(proc, 100, 1, {"PATH": "/usr/bin"})  # not a rank
    fake_process(proc, 200, 1, {"TORCHELASTIC_RUN_ID": "none", "LOCAL_RANK": "0"})  # torchrun itself: no RANK
    fake_process(proc, 201, 200, {"TORCHELASTIC_RUN_ID": "run-7", "RANK": "4", "TORCH_FR_DUMP_TEMP_FILE": "/fr/t_"})
    fake_process(proc, 202, 200, {"TORCHELASTIC_RUN_ID": "run-7", "RANK": "5"})
    fake_process(proc, 203, 201, {"TORCHELASTIC_RUN_ID": "run-7", "RANK": "4"}, comm="pt_data_worker")  # loader
    fake_process(proc, 204, 203, {"TORCHELASTIC_RUN_ID": "run-7", "RANK": "4"}, comm="a (weird) name")
    fake_process(proc, 300, 1, {"SLURM_JOB_ID": "991", "RANK": "0", "GANGWATCH_JOB": "mine"})  # ours wins
    fake_process(proc, 301, 1, {"SLURM_JOB_ID": "992", "RANK": "1"})
    fake_process(proc, 400, 1, None)  # another user's process: environ unreadable
    fake_process(proc, 401, 1, {"RANK": "not a number", "GANGWATCH_JOB": "x"})
    assert rank_processes("n1", proc) == [
        RankProcess(pid=301, job="992", rank=1),
        RankProcess(pid=300, job="mine", rank=0),
        RankProcess(pid=201, job="run-7", rank=4, fr_prefix="/fr/t_"),
        RankProcess(pid=202, job="run-7", rank=5),
    ]


def test_a_process_that_vanishes_mid_scan_is_skipped(proc):
    fake_process(proc, 500, 1, {"GANGWATCH_JOB": "j", "RANK": "0"})
    (proc / "501").mkdir()  # exited between the listing and the read: no files any more
    assert [p.pid for p in rank_processes("n1", proc)] == [500]


def test_the_real_proc_shows_a_child_started_with_a_job_and_a_rank():
    env = {**os.environ, "GANGWATCH_JOB": f"procs-test-{os.getpid()}", "RANK": "6"}
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], env=env,
                             stdin=subprocess.PIPE)
    try:
        mine = [p for p in rank_processes("n1") if p.job == env["GANGWATCH_JOB"]]
        assert mine == [RankProcess(pid=child.pid, job=env["GANGWATCH_JOB"], rank=6)]
    finally:
        child.stdin.close()
        child.wait(10)


def test_a_rank_naming_another_node_is_that_nodes_agents_not_ours(proc):
    """Two named nodes on one machine: each agent claims only the ranks that name it (or name no node)."""
    fake_process(proc, 10, 1, {"GANGWATCH_JOB": "j", "RANK": "0", "GANGWATCH_NODE": "n1"})
    fake_process(proc, 11, 1, {"GANGWATCH_JOB": "j", "RANK": "2", "GANGWATCH_NODE": "n2"})
    fake_process(proc, 12, 1, {"GANGWATCH_JOB": "j", "RANK": "3"})
    assert [p.rank for p in rank_processes("n1", proc)] == [0, 3]
    assert [p.rank for p in rank_processes("n2", proc)] == [2, 3]


def test_a_rank_naming_another_topic_prefix_is_another_deployments(proc):
    """Two gangwatch deployments on one machine (or two test beds): an agent claims the ranks that name its
    prefix or none, so it never reports another deployment's ranks into its own topics."""
    fake_process(proc, 10, 1, {"GANGWATCH_JOB": "a", "RANK": "0", "GANGWATCH_TOPIC_PREFIX": "staging."})
    fake_process(proc, 11, 1, {"GANGWATCH_JOB": "b", "RANK": "0", "GANGWATCH_TOPIC_PREFIX": "gw."})
    fake_process(proc, 12, 1, {"GANGWATCH_JOB": "c", "RANK": "0"})
    assert [p.job for p in rank_processes("n1", proc, prefix="staging.")] == ["a", "c"]
    assert [p.job for p in rank_processes("n1", proc, prefix="gw.")] == ["b", "c"]
    assert [p.job for p in rank_processes("n1", proc)] == ["a", "b", "c"]
