"""The shared "apply actions once" loop (control/fence.py) and the Slurm backend's reading of scontrol.

A scripted backend stands in for the cluster; the Slurm backend gets a fake
`subprocess.run` answering what scontrol 22.05 prints. The real Slurm is in
tests/integration/test_slurm.py, the Kubernetes client in test_kubernetes_adapter.py.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import threading

import pytest
from gangwatch.control.fence import (
    AppliedLog,
    Breaker,
    FenceError,
    Fencer,
    Outcome,
    breaker_path,
    drain_reason,
    follow,
    read_records,
)
from gangwatch.control.slurm import SlurmBackend
from gangwatch.schemas import Action, Incident, encode

pytestmark = pytest.mark.unit


class Scripted:
    """A backend that records its calls and fails the first `fail` fences."""

    name = "scripted"

    def __init__(self, fail: int = 0, fleet: int = 100) -> None:
        self.calls: list[tuple[str, str, str, bool]] = []
        self.fail = fail
        self.fleet = fleet
        self.counts = 0

    def node_count(self) -> int:
        self.counts += 1
        return self.fleet

    def fence(self, node: str, action: Action, *, cls: str, act: bool) -> Outcome:
        self.calls.append(("fence", node, cls, act))
        if self.fail:
            self.fail -= 1
            return Outcome(node, "scheduler down", error="connection refused")
        return Outcome(node, "fenced" if act else "would fence", changed=act, would=not act)

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


# --- the fleet breaker -----------------------------------------------------------------------------


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def fenced_nodes(b: Scripted) -> list[str]:
    return [c[1] for c in b.calls if c[0] == "fence"]


def adapter(tmp_path, b: Scripted, clock: Clock, *, act: bool = True, **kw) -> Fencer:
    """An adapter as `gangwatch ... apply` builds one: the journal and the breaker's file beside it."""
    state = tmp_path / "slurm-applied.jsonl"
    return Fencer(b, act=act, applied=AppliedLog(state),
                  breaker=Breaker(breaker_path(state), clock=clock, **kw), retries=0)


def test_breaker_trips_at_the_share_of_the_fleet_and_refuses_every_fencing_action_after(tmp_path, caplog):
    b, clock = Scripted(fleet=100), Clock()  # 5 % of 100 watched nodes: 5 nodes per hour
    f = adapter(tmp_path, b, clock)
    for i in range(1, 5):
        clock.t += 60
        f.handle(action(id=f"a-{i}", nodes=(f"n{i}",)))
    f.handle(action(id="a-again", nodes=("n4",)))  # a node already counted adds nothing
    assert f.handle(action(id="a-5", nodes=("n5",)))[0].changed  # the 5th: at the limit, allowed
    with caplog.at_level("WARNING", logger="gangwatch.fence"):
        [o] = f.handle(action(id="a-6", nodes=("n6",)))  # the 6th would go over it
    assert not o.changed and not o.error and "refused by the fleet breaker" in o.what
    assert "6 distinct nodes fenced within 3600 s, over the limit of 5 (5% of 100 watched nodes" in o.what
    assert any("FLEET BREAKER TRIPPED" in r.message for r in caplog.records)
    assert fenced_nodes(b) == ["n1", "n2", "n3", "n4", "n4", "n5"]

    caplog.clear()
    with caplog.at_level("WARNING", logger="gangwatch.fence"):
        refused = [f.handle(action(id="a-7", nodes=("n1",))),  # even a node fenced before
                   f.handle(action(id="a-8", type="isolate", nodes=("n7", "n8"))),
                   f.handle(action(id="a-9", type="requeue", nodes=("n9",)))]
    assert all("refused by the fleet breaker" in o.what for outs in refused for o in outs)
    lines = [r.message for r in caplog.records]
    assert len(lines) == 3 and all(m.startswith("scripted: refused by the fleet breaker: ") for m in lines)
    assert "isolate a-8 (job j, incident i-1, nodes n7,n8) not fenced" in lines[1]
    # what fences nothing is never blocked
    for t in ("escalate", "restart_in_process", "rollback", "collect_stacks"):
        [o] = f.handle(action(id=f"a-{t}", type=t))
        assert "nothing for scripted to do" in o.what
    [o] = f.handle(action(id="a-rq", type="requeue", nodes=()))
    assert "nothing for scripted to do" in o.what
    assert fenced_nodes(b) == ["n1", "n2", "n3", "n4", "n4", "n5"] and f.refused == 4

    journal = [json.loads(line) for line in (tmp_path / "slurm-applied.jsonl").read_text().splitlines()]
    assert [e["id"] for e in journal if e.get("status") == "refused-by-breaker"] == ["a-6", "a-7", "a-8", "a-9"]
    assert [e["breaker"] for e in journal if "breaker" in e] == ["tripped"]
    st = json.loads((tmp_path / "slurm-applied.breaker.json").read_text())
    assert st["tripped"] and st["action"] == "a-6" and st["limit"] == 5 and st["watched"] == 100
    assert "a-6" not in f.applied and "a-5" in f.applied


def test_breaker_stays_tripped_across_a_restart_until_a_person_resets_it(tmp_path):
    b, clock = Scripted(fleet=40), Clock()  # 5 % of 40 is 2: the floor of 2 nodes
    f = adapter(tmp_path, b, clock)
    f.handle(action(id="a-1", type="evict_group", nodes=("n1", "n2")))
    f.handle(action(id="a-2", nodes=("n3",)))
    assert fenced_nodes(b) == ["n1", "n2"]

    clock.t += 7200  # the window is over, but a trip is not: it waits for a person
    restarted = adapter(tmp_path, b, clock)
    [o] = restarted.handle(action(id="a-3", nodes=("n4",)))
    assert "refused by the fleet breaker" in o.what and fenced_nodes(b) == ["n1", "n2"]

    was = Breaker(breaker_path(tmp_path / "slurm-applied.jsonl"), clock=clock).reset("INC-9: checked", by="ops")
    assert was["tripped"] and was["action"] == "a-2"
    # the running adapter reads the reset before its next action; a-3 delivered again is fenced now
    [o] = restarted.handle(action(id="a-3", nodes=("n4",)))
    assert o.changed and fenced_nodes(b) == ["n1", "n2", "n4"]
    st = json.loads((tmp_path / "slurm-applied.breaker.json").read_text())
    assert st["tripped"] is False and st["note"] == "INC-9: checked" and st["by"] == "ops"
    with pytest.raises(ValueError, match="note"):
        Breaker(None).reset("  ")


def test_reset_starts_the_count_afresh_and_old_fences_leave_the_window(tmp_path):
    b, clock = Scripted(fleet=40), Clock()
    f = adapter(tmp_path, b, clock)
    f.handle(action(id="a-1", nodes=("n1", "n2")))
    f.handle(action(id="a-2", nodes=("n3",)))  # trips
    Breaker(breaker_path(tmp_path / "slurm-applied.jsonl"), clock=clock).reset("rack PDU: real")
    clock.t += 1
    f.handle(action(id="a-3", nodes=("n3", "n4")))  # n1, n2 fenced before the reset no longer count
    assert fenced_nodes(b) == ["n1", "n2", "n3", "n4"]

    b2, clock2 = Scripted(fleet=40), Clock()
    g = adapter(tmp_path / "other", b2, clock2)
    g.handle(action(id="b-1", nodes=("n1", "n2")))
    clock2.t += 3601  # out of the window: no longer counted
    g.handle(action(id="b-2", nodes=("n3", "n4")))
    assert fenced_nodes(b2) == ["n1", "n2", "n3", "n4"] and g.refused == 0


def test_fleet_nodes_wins_over_the_backends_count_which_is_cached(tmp_path):
    b, clock = Scripted(fleet=1000), Clock()
    f = adapter(tmp_path, b, clock, fleet_nodes=20, min_nodes=1)  # 5 % of 20: 1 node
    f.handle(action(id="a-1", nodes=("n1",)))
    [o] = f.handle(action(id="a-2", nodes=("n2",)))
    assert "refused" in o.what and "from --fleet-nodes" in o.what and b.counts == 0

    g = adapter(tmp_path / "g", b, clock)
    for i in range(3):
        g.handle(action(id=f"b-{i}", nodes=(f"n{i}",)))
    assert b.counts == 1 and g.refused == 0  # 50 allowed; counted once per 10 minutes


def test_a_fleet_it_cannot_count_is_not_fenced_and_tried_again(tmp_path):
    class NoCount(Scripted):
        node_count = None

    b = NoCount()
    f = adapter(tmp_path, b, Clock())
    [o] = f.handle(action())
    assert o.error and "--fleet-nodes" in o.error and b.calls == [] and "a-1" not in f.applied
    with pytest.raises(FenceError):  # follow stops uncommitted: delivered again after a restart
        follow(f, Source([action(id="a-2")]), threading.Event(), idle_timeout_s=0.01, poll_s=0)


def test_a_dry_run_counts_what_it_would_fence_but_trips_for_itself_only(tmp_path):
    b, clock = Scripted(fleet=40), Clock()
    dry = adapter(tmp_path, b, clock, act=False)
    dry.handle(action(id="a-1", nodes=("n1", "n2")))
    [o] = dry.handle(action(id="a-2", nodes=("n3",)))
    assert "refused by the fleet breaker" in o.what and o.what.endswith("(dry run)") and dry.refused == 1
    assert not (tmp_path / "slurm-applied.breaker.json").exists() and not (tmp_path / "slurm-applied.jsonl").exists()
    real = adapter(tmp_path, b, clock)
    [o] = real.handle(action(id="a-3", nodes=("n3",)))
    assert o.changed  # the dry run's trip blocks nobody else

    real.handle(action(id="a-4", nodes=("n4", "n5")))  # trips for real
    [o] = adapter(tmp_path, b, clock, act=False).handle(action(id="a-5", nodes=("n6",)))
    assert "refused by the fleet breaker" in o.what  # a dry run shows the real breaker as it is


def test_an_unreadable_breaker_file_counts_as_tripped(tmp_path):
    path = tmp_path / "x.breaker.json"
    path.write_text("{not json")
    assert Breaker(path).state()["tripped"]
    assert Breaker(path).limit(1000) == 50 and Breaker(path).limit(10) == 2 and Breaker(path, min_nodes=1).limit(3) == 1


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


def test_slurm_counts_its_nodes_for_the_breaker():
    idle = DRAINED.replace("IDLE+DRAIN", "IDLE").split(" Reason=")[0]
    run, calls = fake_run((0, "\n".join([idle, idle.replace("gpu-0001", "gpu-0002"), ""]), ""))
    assert SlurmBackend(run=run).node_count() == 2 and calls == [["scontrol", "show", "node", "-o"]]
    run, _ = fake_run((1, "", "Unable to contact slurm controller\n"))
    with pytest.raises(Exception, match="Unable to contact"):
        SlurmBackend(run=run).node_count()
