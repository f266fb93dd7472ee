"""Heartbeats the agent sends for ranks whose process lives but cannot beat (stopped, traced, in D state):
a fake /proc tree and a fake send, and one job through the core (issue 23: frozen is a hang, not a death)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from gangwatch.producers.agent import Agent, AgentSettings
from gangwatch.producers.agent.frozen import FrozenRanks
from gangwatch.producers.agent.procs import RankTable
from gangwatch.schemas import Heartbeat, Job, Outputs, RankInfo, Step, decode, decode_obj

from tests.helpers import replay_core

pytestmark = pytest.mark.unit


def fake_process(root: Path, pid: int, ppid: int, env: dict[str, str] | None, state: str = "S",
                 started: int = 4242, comm: str = "python") -> None:
    """A /proc/PID directory: `stat` (state, parent, start time at field 22) and `environ` (None: unreadable)."""
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    set_state(root, pid, state, ppid=ppid, started=started, comm=comm)
    if env is not None:
        (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


def set_state(root: Path, pid: int, state: str, *, ppid: int = 1, started: int = 4242, comm: str = "python") -> None:
    fields = [state, ppid, pid, pid, 0, -1, 4194560, 1234, 0, 0, 0, 5, 3, 0, 0, 20, 0, 4, 0, started, 3133440]
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) " + " ".join(map(str, fields)) + "\n")


def no_wait(seconds: float) -> None:
    """The collector's confirming wait, skipped: a fake /proc keeps its states until the test changes them."""


def rank_env(rank: int, job: str = "j", **more: str) -> dict[str, str]:
    return {"GANGWATCH_JOB": job, "RANK": str(rank), **more}


@pytest.fixture
def proc(tmp_path) -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "self").mkdir()  # /proc has non-pid entries too
    (root / "meminfo").write_text("MemTotal: 1 kB\n")
    return root


def beats(recs: list[dict]) -> list[tuple[str, int, str]]:
    assert all(r["kind"] == "heartbeat" and r["source"] == "agent" for r in recs)
    return [(r["job"], r["rank"], r["proc_state"]) for r in recs]


def test_a_frozen_rank_gets_a_heartbeat_each_period_and_a_running_sleeping_or_dead_one_none(proc):
    fake_process(proc, 100, 1, {"PATH": "/usr/bin"}, state="T")  # stopped, but no rank: nothing
    fake_process(proc, 200, 1, rank_env(0), state="R")
    fake_process(proc, 201, 1, rank_env(1), state="S")
    fake_process(proc, 202, 1, rank_env(2), state="T")  # SIGSTOP
    fake_process(proc, 203, 1, rank_env(3), state="D")  # swapping, a hung NFS read
    fake_process(proc, 204, 1, rank_env(4), state="t")  # stopped under a tracer
    fake_process(proc, 205, 1, rank_env(5), state="Z")  # dead, not reaped yet
    fake_process(proc, 206, 201, rank_env(1), state="D", comm="pt_data_worker")  # rank 1's worker: not rank 1
    frozen = FrozenRanks(RankTable("n1", proc), every_s=5.0, sleep=no_wait)
    for k in range(3):
        recs = frozen.poll(1000.0 + 5 * k)
        assert beats(recs) == [("j", 2, "T"), ("j", 3, "D"), ("j", 4, "t")]
        assert {r["ts"] for r in recs} == {1000.0 + 5 * k}
        assert all(isinstance(decode_obj(r), Heartbeat) for r in recs)  # the contract takes them
    set_state(proc, 202, "S")  # SIGCONT: it beats by itself again
    set_state(proc, 203, "Z")  # died in its D state
    (proc / "204" / "stat").unlink()  # vanished
    assert beats(frozen.poll(1015.0)) == []
    extra = decode_obj({"kind": "heartbeat", "v": 1, "ts": 1.0, "job": "j", "rank": 2, "source": "agent",
                        "proc_state": "T"}).extra
    assert extra == {"source": "agent", "proc_state": "T"}


def test_a_rank_started_later_is_watched_from_its_second_listing_and_a_reused_pid_is_not_it(proc):
    frozen = FrozenRanks(RankTable("n1", proc), every_s=5.0, sleep=no_wait)
    assert frozen.poll(0.0) == []
    fake_process(proc, 300, 1, rank_env(7), state="T")  # new: may still show its launcher's environment
    assert frozen.poll(5.0) == []
    assert beats(frozen.poll(10.0)) == [("j", 7, "T")]
    (proc / "300" / "environ").write_bytes(b"PATH=/usr/bin\0")
    set_state(proc, 300, "T", started=9999)  # rank 7 died, pid 300 went to another (stopped) process
    assert frozen.poll(15.0) == []
    assert frozen.poll(20.0) == [] and frozen.poll(25.0) == []


def test_a_frozen_rank_of_another_deployment_gets_no_heartbeat_from_this_agent(proc):
    """Its heartbeat would land in this deployment's topics as a job it never hears of again."""
    fake_process(proc, 500, 1, {**rank_env(0), "GANGWATCH_TOPIC_PREFIX": "other."}, state="T")
    fake_process(proc, 501, 1, {**rank_env(1), "GANGWATCH_TOPIC_PREFIX": "gw."}, state="T")
    frozen = FrozenRanks(RankTable("n1", proc, prefix="gw."), every_s=5.0, sleep=no_wait)
    assert beats(frozen.poll(0.0)) == [("j", 1, "T")]


def traced_by(root: Path, pid: int, tracer_pid: int, comm: str | None, state: str = "t") -> None:
    """`pid`'s `status` says `state` and names `tracer_pid` as its tracer, a process called `comm` (None: gone)."""
    (root / str(pid) / "status").write_text(f"Name:\tpython\nState:\t{state} (tracing stop)\n"
                                             f"TracerPid:\t{tracer_pid}\nUid:\t0\t0\t0\t0\n")
    if comm is not None:
        fake_process(root, tracer_pid, 1, {"PATH": "/usr/bin"}, comm=comm)
        (root / str(tracer_pid) / "comm").write_text(comm + "\n")


def test_a_rank_stopped_while_py_spy_reads_it_is_looked_at_not_frozen_and_one_under_a_debugger_is(proc):
    """py-spy stops a process while it dumps it (the agent's own stack sweep, exactly when a stall is
    diagnosed): that `t` is no freeze. A debugger's is. `status` is read after `stat`: what it says wins."""
    fake_process(proc, 600, 1, rank_env(0), state="t")
    traced_by(proc, 600, 700, "py-spy")
    fake_process(proc, 601, 1, rank_env(1), state="t")
    traced_by(proc, 601, 701, "gdb")
    fake_process(proc, 602, 1, rank_env(2), state="t")  # its status cannot be read: a freeze, as before
    fake_process(proc, 603, 1, rank_env(3), state="D")
    traced_by(proc, 603, 702, "py-spy")  # traced but in D: a freeze the tracer did not make
    fake_process(proc, 604, 1, rank_env(4), state="t")
    traced_by(proc, 604, 0, None, state="S")  # the dump ended between the two reads
    fake_process(proc, 605, 1, rank_env(5), state="t")
    traced_by(proc, 605, 709, None)  # its tracer exited before its name was read
    fake_process(proc, 606, 1, rank_env(6), state="t")
    traced_by(proc, 606, 0, None)  # `t` with nobody tracing: a detach under way
    frozen = FrozenRanks(RankTable("n1", proc), every_s=5.0, sleep=no_wait)
    assert beats(frozen.poll(0.0)) == [("j", 1, "t"), ("j", 2, "t"), ("j", 3, "D")]


def test_a_frozen_state_that_passes_within_the_confirming_wait_is_no_freeze(proc):
    """A page fault or a disk write puts a rank in `D` for milliseconds: read again half a second later, it runs."""
    fake_process(proc, 800, 1, rank_env(0), state="D")
    fake_process(proc, 801, 1, rank_env(1), state="D")
    waited = []

    def sleep(seconds: float) -> None:
        waited.append(seconds)
        set_state(proc, 800, "S")  # rank 0's write returned; rank 1 hangs on

    frozen = FrozenRanks(RankTable("n1", proc), every_s=5.0, sleep=sleep)
    assert beats(frozen.poll(0.0)) == [("j", 1, "D")] and waited == [0.5]
    set_state(proc, 801, "S")
    assert frozen.poll(5.0) == [] and waited == [0.5]  # nothing frozen at the first read: no wait


class WatchedTable(RankTable):
    """A RankTable that keeps every state it read."""

    def states(self, now: float) -> list:
        out = super().states(now)
        self.read = [*getattr(self, "read", []), *(state for _, state in out)]
        return out


def test_a_real_py_spy_dump_of_a_real_rank_never_makes_it_frozen():
    """A real rank process, dumped by the real py-spy over and over while the agent polls /proc: the polls did
    read the rank in `t` (inside dumps), and no heartbeat was ever sent for it."""
    import subprocess
    import sys

    from gangwatch.producers.agent import default_py_spy
    if not os.access(default_py_spy(), os.X_OK):
        pytest.fail(f"py-spy is not installed at {default_py_spy()} (it is a dependency of the agent)")
    rank = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.001)"],
                            env={**os.environ, **rank_env(0, job="pyspy-look"), "GANGWATCH_NODE": "n-look"})
    try:
        table = WatchedTable("n-look")
        frozen = FrozenRanks(table, every_s=5.0)
        frozen.poll(0.0)  # the first listing classifies every process already there
        sent, dumps = [], 0
        while dumps < 50 and table.read.count("t") < 5:
            dump = subprocess.Popen([default_py_spy(), "dump", "--pid", str(rank.pid)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            while dump.poll() is None:
                sent += frozen.poll(1.0)
            dumps += 1
        assert "t" in table.read, f"{dumps} dumps of pid {rank.pid}, never read stopped by py-spy: no test"
        assert sent == []
    finally:
        rank.kill()
        rank.wait()


def test_a_worker_left_behind_by_a_dead_rank_is_not_taken_for_the_rank(proc):
    fake_process(proc, 400, 1, rank_env(2), state="S")
    fake_process(proc, 401, 400, rank_env(2), state="D", comm="pt_data_worker")
    frozen = FrozenRanks(RankTable("n1", proc), every_s=5.0, sleep=no_wait)
    assert frozen.poll(0.0) == []
    for f in (proc / "400").iterdir():  # the rank is gone; its worker, reparented to init, hangs on in D
        f.unlink()
    (proc / "400").rmdir()
    set_state(proc, 401, "D", ppid=1, comm="pt_data_worker")
    assert frozen.poll(5.0) == [] and frozen.poll(10.0) == []


def test_the_agent_sends_them_on_the_telemetry_topic_keyed_by_job(tmp_path, proc):
    from tests.unit.test_agent import FakeKafka

    fake_process(proc, 500, 1, rank_env(3, job="j7", GANGWATCH_NODE="n9"), state="T")
    fake_process(proc, 501, 1, rank_env(4, job="j7", GANGWATCH_NODE="n9"), state="S")
    fake_process(proc, 502, 1, rank_env(5, job="j7", GANGWATCH_NODE="n8"), state="T")  # another node's rank
    base = {"node": "n9", "bootstrap": "127.0.0.1:1", "kmsg": "off", "gpu_every_s": 0.0}
    kafka = FakeKafka()
    before = time.monotonic()
    Agent(AgentSettings(**base, spool_dir=tmp_path / "s1"), send=kafka, proc_root=proc,
          clock=lambda: 1234.5).run_once()
    [(topic, key, rec)] = [(t, k, r) for t, k, v in kafka.messages for r in decode(v)]
    assert (topic, key.decode()) == ("gw.telemetry", "j7")
    assert rec == Heartbeat(ts=1234.5, job="j7", rank=3, mono=rec.mono, extra={"source": "agent", "proc_state": "T"})
    assert before <= rec.mono <= time.monotonic()  # the node's monotonic clock, read beside the wall clock
    kafka = FakeKafka()
    Agent(AgentSettings(**base, spool_dir=tmp_path / "s2", heartbeat_s=0.0), send=kafka, proc_root=proc).run_once()
    assert kafka.messages == []  # the check turned off


# --- through the core: a rank SIGSTOPped for 30 s --------------------------------------------------------

T0 = 1_700_000_000.0
HB = 5.0
NODES = ("n1", "n2", "n3")
RANKS = 6  # rank r on NODES[r // 2]


def stopped_rank_3(proc: Path, *, agent: bool, freeze_s: float = 30.0, state: str = "T") -> tuple[list, float]:
    """A job of 3 nodes x 2 ranks, a step a second, heartbeats every HB; rank 3 (on n2) is SIGSTOPped for
    `freeze_s` after step 59: its own heartbeats and steps stop, and its peers wait in the next collective. With
    `agent`, n2's agent (the real collector, on a fake /proc whose rank 3 is in `state` meanwhile) polls every
    HB."""
    recs: list = [Job(ts=T0, job="j", heartbeat_s=HB,
                      ranks=[RankInfo(rank=r, node=NODES[r // 2], gpu=r % 2) for r in range(RANKS)])]
    stop = T0 + 10.0 + 60.0
    cont = stop + freeze_s
    t = T0 + 10.0
    for k in range(120):
        step_s = 1.0 + (freeze_s if k == 60 else 0.0)  # step 60 ends once rank 3 runs again
        t += step_s
        recs += [Step(ts=t + 0.01 * r, job="j", rank=r, step=k, step_s=step_s, compute_s=0.6, comm_wait_s=0.4)
                 for r in range(RANKS)]
    hb = T0 + 1.0
    while hb <= t:
        recs += [Heartbeat(ts=hb + 0.1 * r, job="j", rank=r) for r in range(RANKS)
                 if not (r == 3 and stop <= hb + 0.1 * r < cont)]
        hb += HB
    if agent:
        fake_process(proc, 2002, 1, rank_env(2, GANGWATCH_NODE="n2"))
        fake_process(proc, 2003, 1, rank_env(3, GANGWATCH_NODE="n2"))
        frozen = FrozenRanks(RankTable("n2", proc), every_s=HB, sleep=no_wait)
        now = T0 + 3.7  # the agent's own phase
        while now <= t:
            set_state(proc, 2003, state if stop <= now < cont else "S")
            recs += [decode_obj(r) for r in frozen.poll(now)]
            now += HB
    return recs, t


def replay(recs: list, until: float) -> Outputs:
    return replay_core(recs, until)


def test_a_rank_stopped_for_30_s_is_a_hang_that_ends_by_itself_not_a_death(proc):
    recs, end = stopped_rank_3(proc, agent=True)
    agents = [r for r in recs if isinstance(r, Heartbeat) and r.extra.get("source") == "agent"]
    assert len(agents) == 6 and {(r.rank, r.extra["proc_state"]) for r in agents} == {(3, "T")}
    out = replay(recs, end + 5)
    assert [f.type for f in out.findings if f.type == "fail_stop"] == []
    assert [(a.type, a.nodes) for a in out.actions] == [("collect_stacks", [])]  # a sweep, no eviction
    [inc] = {i.id: i for i in out.incidents}.values()
    assert inc.extra["resolution"] == "self_resolved" and inc.evicted_nodes == []
    # the sweep cannot dump a stopped process, but the stall still names what it waited on (issue 35)
    [frozen] = [f for f in out.findings if f.type == "frozen_rank"]
    assert (frozen.rank, frozen.node, frozen.evidence["proc_state"], frozen.evidence["state"]) == (3, "n2", "T",
                                                                                                  "stopped")
    assert frozen.id in inc.extra["findings"]
    assert inc.cls == "hang" and inc.culprit_nodes == ["n2"]


@pytest.mark.parametrize("state,words", [("T", "stopped"), ("D", "in uninterruptible sleep")])
def test_a_rank_frozen_past_the_stall_budget_is_a_page_naming_it_never_an_eviction(proc, state, words):
    """Frozen for 10 minutes: the stall waits for it up to the stall budget (300 s from its onset), then a human
    is told which rank of which node is frozen and how; nobody is evicted, and its thaw ends the incident."""
    recs, end = stopped_rank_3(proc, agent=True, freeze_s=600.0, state=state)
    out = replay(recs, end + 5)
    assert [f.type for f in out.findings if f.type == "fail_stop"] == []
    assert not [a for a in out.actions if a.type not in ("collect_stacks", "escalate")]
    [page] = [a for a in out.actions if a.type == "escalate"]
    assert page.nodes == ["n2"] and f"rank 3 on n2 is {words} ({state})" in page.reason
    onset = min(i.onset_ts for i in out.incidents)
    assert page.ts == pytest.approx(onset + 300.0)  # the stall budget, not the sweep's wait
    last = out.incidents[-1]
    assert last.cls == "hang" and last.culprit_nodes == ["n2"] and last.evicted_nodes == []
    assert last.recovered_ts is not None and last.recovered_ts > page.ts  # it thawed and the job stepped on


def test_without_the_agents_heartbeats_the_same_freeze_is_taken_for_a_death(proc):
    """What the agent's heartbeats prevent: rank 3's silence alone is a fail-stop of n2."""
    recs, end = stopped_rank_3(proc, agent=False)
    out = replay(recs, end + 5)
    assert any(f.type == "fail_stop" and f.node == "n2" for f in out.findings)
    assert ("replace", ["n2"]) in [(a.type, a.nodes) for a in out.actions]
