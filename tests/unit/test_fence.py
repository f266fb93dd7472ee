"""The shared "apply actions once" loop (streams/fence.py) and the Slurm backend's reading of scontrol.

A scripted backend stands in for the cluster; the Slurm backend gets a fake
`subprocess.run` answering what scontrol 22.05 prints. The real Slurm is in
tests/integration/test_slurm.py, the Kubernetes client in test_kubernetes_adapter.py.
"""

from __future__ import annotations

import gzip
import subprocess
import threading

import pytest
from gangwatch.schemas import Action, Incident, encode
from gangwatch.streams.fence import AppliedLog, FenceError, Fencer, Outcome, drain_reason, follow, read_records
from gangwatch.streams.slurm import SlurmBackend

pytestmark = pytest.mark.unit


class Scripted:
    """A backend that records its calls and fails the first `fail` fences."""

    name = "scripted"

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[tuple[str, str, str, bool]] = []
        self.fail = fail

    def fence(self, node: str, action: Action, *, cls: str, act: bool) -> Outcome:
        self.calls.append(("fence", node, cls, act))
        if self.fail:
            self.fail -= 1
            return Outcome(node, "scheduler down", error="connection refused")
        return Outcome(node, "fenced" if act else "would fence", changed=act)

    def restore(self, node: str, note: str, *, act: bool) -> Outcome:
        self.calls.append(("restore", node, note, act))
        return Outcome(node, "restored", changed=act)


def action(id: str = "a-1", nodes: tuple[str, ...] = ("n1",), type: str = "replace", reason: str = "why",
           **kw) -> Action:
    return Action(id=id, ts=1.0, job="j", incident="i-1", type=type, nodes=list(nodes), reason=reason, **kw)


def test_applied_ids_survive_a_restart_and_dry_runs_write_nothing(tmp_path):
    path = tmp_path / "applied.jsonl"
    b = Scripted()
    dry = Fencer(b, applied=AppliedLog(path))
    dry.handle(action())
    assert dry.handle(action()) == [] and dry.duplicates == 1
    assert not path.exists() and b.calls == [("fence", "n1", "replace", False)]

    Fencer(b, act=True, applied=AppliedLog(path)).handle(action())
    path.write_text(path.read_text() + '{"id": "torn')  # a crash mid-line must not break the next start
    again = Fencer(b, act=True, applied=AppliedLog(path))
    assert again.handle(action()) == [] and len(again.applied) == 1
    assert [c[3] for c in b.calls] == [False, True]


def test_only_fencing_actions_reach_the_backend_with_mapped_names_and_the_incident_class():
    b = Scripted()
    f = Fencer(b, act=True, node_map={"n1": "gpu-0001"})
    assert f.handle(Incident(id="i-1", ts=1.0, job="j", cls="sdc")) == []
    for t in ("rollback", "degrade", "escalate", "collect_stacks", "restart_in_process", "dual_run"):
        [o] = f.handle(action(id=f"a-{t}", type=t))
        assert "nothing for scripted to do" in o.what
    [o] = f.handle(action(id="a-rq0", type="requeue", nodes=()))  # software failures: no node to blame
    assert "nothing for scripted to do" in o.what
    f.handle(action(id="a-x", type="isolate", nodes=("n1", "n2")))
    f.handle(action(id="a-y", type="evict_group", extra={"class": "hang"}))
    f.handle(action(id="a-z", type="requeue", nodes=("n9",)))  # no spare: requeued *without* n9
    assert b.calls == [("fence", "gpu-0001", "sdc", True), ("fence", "n2", "sdc", True),
                       ("fence", "gpu-0001", "hang", True), ("fence", "n9", "sdc", True)]


def test_a_failure_is_retried_then_not_counted_as_applied(tmp_path):
    waits: list[float] = []
    b = Scripted(fail=5)
    f = Fencer(b, act=True, applied=AppliedLog(tmp_path / "a.jsonl"), retries=2, retry_wait_s=1.0,
               sleep=waits.append)
    [o] = f.handle(action())
    assert o.error and waits == [1.0, 2.0] and len(b.calls) == 3
    assert "a-1" not in f.applied and '"status": "failed"' in (tmp_path / "a.jsonl").read_text()
    [o] = f.handle(action())  # delivered again: tried again (two failures left, then it works)
    assert o.changed and "a-1" in f.applied


def test_restore_needs_a_note_and_is_logged(tmp_path):
    b = Scripted()
    f = Fencer(b, act=True, applied=AppliedLog(tmp_path / "a.jsonl"), node_map={"n1": "gpu-0001"})
    with pytest.raises(ValueError):
        f.restore(["n1"], "")
    [o] = f.restore(["n1"], "RMA 7")
    assert o.changed and b.calls == [("restore", "gpu-0001", "RMA 7", True)]
    assert '"restore": "gpu-0001"' in (tmp_path / "a.jsonl").read_text()


def test_drain_reason_is_one_bounded_line():
    a = action(reason="line one\nline   two")
    assert drain_reason(a) == "gangwatch: i-1 replace: line one line two"
    assert len(drain_reason(action(reason="x" * 500))) == 200


def test_read_records_plain_and_gzip_skipping_bad_lines(tmp_path):
    lines = encode(action()) + b"\nnot json\n\n" + encode(action(id="a-2")) + b"\n"
    (tmp_path / "a.jsonl").write_bytes(lines)
    with gzip.open(tmp_path / "a.jsonl.gz", "wb") as g:
        g.write(lines)
    for name in ("a.jsonl", "a.jsonl.gz"):
        assert [r.id for r in read_records(tmp_path / name)] == ["a-1", "a-2"]


class Source:
    """A topic stand-in: polls return the given batches, then nothing."""

    def __init__(self, *batches: list) -> None:
        self.batches = list(batches)
        self.commits = 0

    def poll(self, timeout_s: float) -> list:
        return self.batches.pop(0) if self.batches else []

    def commit(self) -> None:
        self.commits += 1


def test_follow_commits_after_each_poll_and_stops_uncommitted_on_a_failure():
    b = Scripted()
    src = Source([action("a-1")], [action("a-2")])
    follow(Fencer(b, act=True), src, threading.Event(), idle_timeout_s=0.01, poll_s=0)
    assert src.commits >= 2 and len(b.calls) == 2

    src = Source([action("a-3")])
    with pytest.raises(FenceError, match="a-3"):
        follow(Fencer(Scripted(fail=9), act=True, retries=0), src, threading.Event(), idle_timeout_s=0.01, poll_s=0)
    assert src.commits == 0  # redelivered after a restart


# --- the Slurm backend reading scontrol ---------------------------------------------------------

DRAINED = ("NodeName=gpu-0001 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 State=IDLE+DRAIN ThreadsPerCore=1 "
           "Partitions=main  BootTime=2026-11-30T15:10:38 ExtSensorsTemp=n/s "
           "Reason=gangwatch: i-1 replace: Xid 79 (confidence 0.97) [root@2026-11-30T15:49:24]\n")


def fake_run(*answers: tuple[int, str, str]):
    calls: list[list[str]] = []
    queue = list(answers)

    def run(argv, **kw):
        calls.append(argv)
        rc, out, err = queue.pop(0)
        return subprocess.CompletedProcess(argv, rc, out, err)

    return run, calls


def test_slurm_reads_state_and_reason_and_leaves_a_drained_node():
    run, calls = fake_run((0, DRAINED, ""))
    st = SlurmBackend(run=run).node("gpu-0001")
    assert st.drained and st.ours and st.reason == "gangwatch: i-1 replace: Xid 79 (confidence 0.97)"
    run, calls = fake_run((0, DRAINED.replace("gangwatch: i-1 replace: Xid 79 (confidence 0.97)", "bios"), ""))
    o = SlurmBackend(run=run).fence("gpu-0001", action(), cls="x", act=True)
    assert o.what == "already drained by someone else (bios): left as it is" and len(calls) == 1


def test_slurm_unknown_node_and_unreachable_controller():
    run, _ = fake_run((1, "", "Node gpu-9 not found\n"))
    assert "unknown to Slurm" in SlurmBackend(run=run).fence("gpu-9", action(), cls="x", act=True).what
    run, _ = fake_run((1, "", "slurm_load_node error: Unable to contact slurm controller (connect failure)\n"))
    o = SlurmBackend(run=run).fence("gpu-1", action(), cls="x", act=True)
    assert "Unable to contact slurm controller" in o.error


def test_slurm_drains_with_argv_not_a_shell():
    idle = DRAINED.replace("IDLE+DRAIN", "IDLE").split(" Reason=")[0] + "\n"
    run, calls = fake_run((0, idle, ""), (0, "", ""))
    b = SlurmBackend("/opt/slurm/bin/scontrol", run=run)
    o = b.fence("gpu-0001", action(reason='it said "no"; rm -rf /'), cls="x", act=True)
    assert o.changed and b.updates == 1
    assert calls[1] == ["/opt/slurm/bin/scontrol", "update", "NodeName=gpu-0001", "State=DRAIN",
                        'Reason=gangwatch: i-1 replace: it said "no"; rm -rf /']
