"""Answering `collect_stacks` actions: py-spy on each local rank, one `stack` record per rank, once per action."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest
from gangwatch.producers.agent.procs import RankProcess
from gangwatch.producers.agent.stacks import ActionListener, StackSweeper, dump_failure
from gangwatch.schemas import Action, Stack, decode_obj

from tests.helpers import data_path
from tests.unit.test_agent_frozen import fake_process

pytestmark = pytest.mark.unit


@pytest.fixture
def proc(tmp_path) -> Path:
    """An empty fake /proc tree (`fake_process` adds processes)."""
    (tmp_path / "proc").mkdir()
    return tmp_path / "proc"

RANKS = [RankProcess(pid=4101, job="j1", rank=4), RankProcess(pid=4102, job="j1", rank=5),
         RankProcess(pid=5101, job="other", rank=0)]


def fake_py_spy(tmp_path: Path, *, fail_pid: int | None = None,
                error: str = "Error: Permission denied (os error 13)") -> str:
    """An executable that answers `dump --pid P` with a real rank's dump text (or fails for `fail_pid`)."""
    real = data_path("pyspy/dataloader-hang-8ranks/dump_rank5.txt")
    script = tmp_path / "py-spy"
    script.write_text(f"""#!/bin/sh
[ "$1" = dump ] && [ "$2" = --pid ] || exit 64
if [ "$3" = "{fail_pid}" ]; then echo "{error}" >&2; exit 1; fi
echo "Process $3: python3 -u train.py"
tail -n +2 {real}
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def action(id: str = "a-1", job: str = "j1", nodes: list[str] | None = None) -> Action:
    return Action(id=id, ts=1.0, job=job, incident="i-1", type="collect_stacks", nodes=nodes or [])


def test_a_sweep_dumps_every_local_rank_of_the_job_into_one_snapshot(tmp_path):
    sweeper = StackSweeper(py_spy=fake_py_spy(tmp_path), processes=lambda: RANKS, clock=lambda: 7.0)
    recs = [decode_obj(r) for r in sweeper.sweep("j1", "a-9")]
    assert all(isinstance(r, Stack) for r in recs)
    assert [(r.job, r.rank, r.snapshot, r.format, r.ts) for r in recs] == [("j1", 4, "a-9", "py-spy", 7.0),
                                                                           ("j1", 5, "a-9", "py-spy", 7.0)]
    assert recs[0].dump.startswith("Process 4101: ") and "Thread 14154 (idle)" in recs[0].dump


def test_a_rank_py_spy_cannot_dump_is_left_out_with_the_reason(tmp_path, proc, caplog):
    """Another user's process (the fake /proc's, owned by whoever runs the test) and an agent that is not root."""
    fake_process(proc, 4102, 1, None)
    sweeper = StackSweeper(py_spy=fake_py_spy(tmp_path, fail_pid=4102), processes=lambda: RANKS, proc_root=proc,
                           euid=lambda: proc.stat().st_uid + 1)
    with caplog.at_level(logging.WARNING, "gangwatch.agent"):
        recs = sweeper.sweep("j1", "a-1")
    assert [r["rank"] for r in recs] == [4]
    assert "Permission denied" in caplog.text and "needs root or CAP_SYS_PTRACE" in caplog.text


@pytest.mark.parametrize("state,said", [("T", "stopped (T)"), ("t", "stopped by a tracer (t)"),
                                        ("D", "in uninterruptible sleep (D)")])
def test_a_frozen_rank_py_spy_cannot_dump_is_said_frozen_to_root_never_short_of_root(tmp_path, proc, caplog,
                                                                                       state, said):
    """The live case of issue 35: the agent runs as root, rank 5 is SIGSTOPped, py-spy's ptrace is refused."""
    fake_process(proc, 4102, 1, None, state=state)
    sweeper = StackSweeper(py_spy=fake_py_spy(tmp_path, fail_pid=4102, error="Error: Operation not permitted "
                                              "(os error 1)"), processes=lambda: RANKS, proc_root=proc,
                           euid=lambda: 0)
    with caplog.at_level(logging.WARNING, "gangwatch.agent"):
        recs = sweeper.sweep("j1", "a-1")
    assert [r["rank"] for r in recs] == [4]
    assert f"rank 5 of job j1) failed: the process is {said}, not a permission problem" in caplog.text
    assert "root" not in caplog.text and "CAP_SYS_PTRACE" not in caplog.text


REFUSED = "Error: Operation not permitted (os error 1)"


@pytest.mark.parametrize("message,state,euid,owner,want,never", [
    (REFUSED, "T", 0, 1000, "is stopped (T), not a permission problem: it dumps once it is continued", "root"),
    (REFUSED, "t", 0, 0, "stopped by a tracer (t), not a permission problem: a debugger, or another py-spy",
     "root"),
    ("no answer within 30 s", "D", 0, 1000, "in uninterruptible sleep (D), not a permission problem", "root"),
    (REFUSED, "T", 1000, 1001, "another user's process (uid 1001; the agent runs as uid 1000): py-spy needs root "
     "or CAP_SYS_PTRACE", "stopped"),
    ("Error: Permission denied (os error 13)", "S", 0, 1000, "refused although the agent runs as root: ptrace is "
     "restricted", "needs root"),
    (REFUSED, "S", 1000, 1000, "refused: the agent (uid 1000) may not trace it", "another user"),
    (REFUSED, None, 0, None, "the process has exited (gone)", "root"),
    ("Error: Failed to find python version from target process", "R", 0, 1000,
     "Error: Failed to find python version from target process", "root"),
])
def test_a_dump_failure_is_told_by_its_real_cause(message, state, euid, owner, want, never):
    said = dump_failure(message, state, euid=euid, owner=owner)
    assert want in said and never not in said.replace(message, "")
    assert message in said  # py-spy's own words are kept


def test_without_py_spy_the_sweep_says_how_to_get_it(tmp_path, caplog):
    sweeper = StackSweeper(py_spy=str(tmp_path / "nowhere" / "py-spy"), processes=lambda: RANKS)
    with caplog.at_level(logging.WARNING, "gangwatch.agent"):
        assert sweeper.sweep("j1", "a-1") == []
    assert "pip install py-spy" in caplog.text


def test_a_job_without_ranks_here_gives_nothing(tmp_path):
    sweeper = StackSweeper(py_spy=fake_py_spy(tmp_path), processes=lambda: RANKS)
    assert sweeper.sweep("absent", "a-1") == []


def test_each_action_is_answered_once_and_only_where_it_points(tmp_path):
    sweeper = StackSweeper(py_spy=fake_py_spy(tmp_path), processes=lambda: RANKS)
    listener = ActionListener("127.0.0.1:1", "gw.actions", "n1", sweeper)
    assert len(listener.handle(action("a-1"), now=100.0)) == 2
    assert listener.handle(action("a-1"), now=101.0) == []  # delivered again
    assert listener.handle(action("a-2", nodes=["n2"]), now=102.0) == []  # another node's business
    assert len(listener.handle(action("a-3", nodes=["n2", "n1"]), now=103.0)) == 2


def test_the_latest_sweep_of_a_job_is_remembered_for_a_while(tmp_path):
    sweeper = StackSweeper(py_spy=fake_py_spy(tmp_path), processes=lambda: [])
    listener = ActionListener("127.0.0.1:1", "gw.actions", "n1", sweeper, sweep_window_s=600.0)
    listener.handle(action("a-1"), now=1000.0)
    listener.handle(action("a-2"), now=1100.0)
    assert listener.sweep_of("j1", 1100.0 + 600.0) == "a-2"
    assert listener.sweep_of("j1", 1100.0 + 601.0) is None
    assert listener.sweep_of("other", 1100.0) is None


def test_without_a_broker_the_listener_says_so_once_and_keeps_trying(tmp_path, caplog):
    sweeper = StackSweeper(py_spy=fake_py_spy(tmp_path), processes=lambda: [])
    listener = ActionListener("127.0.0.1:1", "gw.actions", "n1", sweeper, retry_s=3.0, connect_timeout_s=0.2)
    with caplog.at_level(logging.WARNING, "gangwatch.agent"):
        assert listener.poll(1.0) == []
        assert listener.poll(2.0) == []
    assert caplog.text.count("not listening for collect_stacks actions yet") == 1
    assert listener.every_s == 3.0  # the agent polls it again after the retry period
    listener.close()


def test_with_the_secret_only_signed_fresh_sweeps_are_answered(tmp_path, caplog):
    """The alert topic is writable by more than the worker: with the worker's secret the agent answers a
    `collect_stacks` action only when its record carries a valid v1 signature, fresh and not seen before."""
    import time
    from types import SimpleNamespace

    from gangwatch.schemas import encode
    from gangwatch.schemas.signature import TopicSigner, TopicVerifier

    def msg(a: Action, signer: TopicSigner | None = None, value: bytes | None = None) -> SimpleNamespace:
        body = encode(a)
        return SimpleNamespace(value=value or body, headers=signer.headers(body, a.id) if signer else [])

    good, forger = TopicSigner("s3cret-Zq81"), TopicSigner("a guess")
    old = TopicSigner("s3cret-Zq81", clock=lambda: time.time() - 3600)
    signed = msg(action("a-ok"), good)
    tampered = msg(action("a-t"), good, value=encode(action("a-t", job="other")))  # signed for j1, sent for other
    batch = [msg(action("a-unsigned")), msg(action("a-forged"), forger), tampered, msg(action("a-stale"), old),
             signed, signed]
    sweeper = StackSweeper(py_spy=fake_py_spy(tmp_path), processes=lambda: RANKS)
    listener = ActionListener("127.0.0.1:1", "gw.actions", "n1", sweeper,
                              verify=TopicVerifier("s3cret-Zq81"))
    listener._consumer = SimpleNamespace(poll=lambda timeout_ms: {"tp": batch})
    with caplog.at_level(logging.WARNING, "gangwatch.agent"):
        recs = listener.poll(100.0)
    assert {r["snapshot"] for r in recs} == {"a-ok"} and len(recs) == 2  # the job's two ranks here, once
    assert listener.refused == 5
    said = [r.getMessage() for r in caplog.records]
    assert [m.split(" refused: ")[0] for m in said] == [
        "collect_stacks a-unsigned of job j1", "collect_stacks a-forged of job j1", "collect_stacks a-t of job other",
        "collect_stacks a-stale of job j1", "collect_stacks a-ok of job j1"]
    assert "replayed" in said[-1] and "no signature" in said[0] and "bad signature" in said[1]
    assert "s3cret-Zq81" not in caplog.text
