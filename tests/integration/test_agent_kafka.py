"""`gangwatch agent` as a process against the real broker.

- Real Xid lines appended to the kernel-log file it follows arrive as `hw` records on
  node-events, keyed by the node, each firmware dump folded into its Xid.
- A `collect_stacks` action published on the actions topic makes it run the real py-spy on
  a real sleeping Python process of that job, and publish its `stack` record on traces,
  keyed by the job, with the action's id as the snapshot.
- Started where no broker answers, it spools; the next agent with the same spool sends it.
- Eight ranks of its node stepping together hand their records to its relay: the envelopes on
  telemetry hold the records of all of them, and every record arrives.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gangwatch.producers.trainer import TrainerClient
from gangwatch.schemas import Action, DecodeError, decode, encode

from tests.helpers import data_path, need
from tests.integration.kafkakit import REPO, WorkerProc, produce, read_all, wait_for

pytestmark = pytest.mark.integration

PY_SPY = Path(sys.executable).with_name("py-spy")
CLI = [sys.executable, "-m", "gangwatch"]


def agent_args(bootstrap: str, prefix: str, kmsg: Path, spool: Path, *extra: str) -> list[str]:
    return [*CLI, "agent", "--node", "n042", "--bootstrap", bootstrap, "--prefix", prefix, "--kmsg", str(kmsg),
            "--gpu-every", "0", "--spool-dir", str(spool), "--py-spy", str(PY_SPY), *extra]


def records(bootstrap: str, topic: str) -> list[tuple[bytes, object]]:
    """(key, record) of every record on `topic` now."""
    out = [(k, r) for k, v in read_all(bootstrap, [topic])[topic] for r in decode(v)]
    assert not [r for _, r in out if isinstance(r, DecodeError)]
    return out


def log_has(agent: WorkerProc, text: str) -> bool:
    return text in agent.log.read_text(errors="replace")


@pytest.fixture
def agents(tmp_path):
    started: list[WorkerProc] = []

    def start(args: list[str]) -> WorkerProc:
        a = WorkerProc(args, tmp_path / f"agent{len(started)}.log")
        started.append(a)
        return a

    yield start
    for a in started:
        a.stop()


def test_xid_lines_appended_to_the_kernel_log_arrive_as_hw_records_keyed_by_node(kafka_bootstrap, topics, tmp_path,
                                                                                agents):
    kmsg = tmp_path / "kern.log"
    kmsg.write_text(data_path("kmsg/benign-kmsg.log").read_text())  # there before the agent: not reported
    agent = agents(agent_args(kafka_bootstrap, topics.prefix, kmsg, tmp_path / "spool"))
    wait_for(lambda: log_has(agent, "agent of node n042 running"), 30, "the agent to start", proc=agent)

    with open(kmsg, "a") as f:
        f.write(data_path("kmsg/h100-xid119.log").read_text())  # five Xid 119, the first with a 34-line dump
        f.write("[Sun Feb 23 16:31:00 2025] NVRM: Xid (PCI:0000:9b:00): 79, pid=1, name=python, GPU has fallen off "
                "the bus.\n")  # the last line: everything before it has arrived once it has
    wait_for(lambda: any(r.code == 79 for _, r in records(kafka_bootstrap, topics.node_events)), 30,
             "the Xid 79 on node-events", proc=agent)

    got = records(kafka_bootstrap, topics.node_events)
    assert [(k, r.kind, r.node, r.source, r.code) for k, r in got] == \
        [(b"n042", "hw", "n042", "xid", 119)] * 5 + [(b"n042", "hw", "n042", "xid", 79)]
    assert got[0][1].extra["pci"] == "0000:9b:00" and got[0][1].extra["process"] == "nvidia-smi"
    assert agent.stop() == 0
    assert log_has(agent, "agent stopped")


def test_a_collect_stacks_action_makes_the_agent_py_spy_the_jobs_process_here(kafka_bootstrap, topics, tmp_path,
                                                                             agents, unique):
    need(PY_SPY.exists(), f"py-spy is not installed beside {sys.executable} (the `agent` extra)")
    job = f"job-{unique}"
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import sys, time\n\ndef wait_for_work():\n    print('ready', flush=True)\n"
                       "    sys.stdin.read()\n\nwait_for_work()\n")
    child = subprocess.Popen([sys.executable, str(sleeper)], env={**os.environ, "GANGWATCH_JOB": job, "RANK": "3"},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        agent = agents(agent_args(kafka_bootstrap, topics.prefix, tmp_path / "kern.log", tmp_path / "spool"))
        wait_for(lambda: log_has(agent, "listening for collect_stacks actions"), 60, "the agent to listen",
                 proc=agent)
        act = Action(id=f"a-{unique}", ts=1.0, job=job, incident="i-1", type="collect_stacks",
                     reason="hang: sweep stacks and flight-recorder dumps")
        produce(kafka_bootstrap, [(topics.actions, job.encode(), encode(act))])
        wait_for(lambda: records(kafka_bootstrap, topics.traces), 60, "the stack record on traces", proc=agent)
    finally:
        child.stdin.close()
        child.wait(10)

    [(key, rec)] = records(kafka_bootstrap, topics.traces)
    assert key == job.encode()
    assert (rec.kind, rec.job, rec.rank, rec.snapshot, rec.format) == ("stack", job, 3, act.id, "py-spy")
    assert f"Process {child.pid}:" in rec.dump and "wait_for_work (sleeper.py:" in rec.dump


def test_without_a_broker_the_agent_spools_and_the_next_one_sends_the_backlog(kafka_bootstrap, topics, tmp_path):
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        nowhere = f"127.0.0.1:{s.getsockname()[1]}"
    kmsg = tmp_path / "kern.log"
    kmsg.write_text(data_path("kmsg/xid13-xid43-storm.log").read_text())
    spool = tmp_path / "spool"
    once = [*agent_args(nowhere, topics.prefix, kmsg, spool), "--once", "--from-start"]
    done = subprocess.run(once, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert list(spool.glob("*/*.spool")) and records(kafka_bootstrap, topics.node_events) == []

    kmsg.write_text("")  # nothing new: the second agent only has the backlog to send
    again = [*agent_args(kafka_bootstrap, topics.prefix, kmsg, spool), "--once"]
    done = subprocess.run(again, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    codes = [r.code for _, r in records(kafka_bootstrap, topics.node_events)]
    assert codes == [13] * 16 + [43]
    assert not list(spool.glob("*/*.spool"))


def test_the_ranks_of_a_node_share_envelopes_through_the_agents_relay(kafka_bootstrap, topics, tmp_path, agents,
                                                                     unique):
    relay = tmp_path / "relay.sock"
    agent = agents(agent_args(kafka_bootstrap, topics.prefix, tmp_path / "kern.log", tmp_path / "spool", "--relay",
                              str(relay), "--relay-linger-s", "0.5", "--metrics-port", "0"))
    wait_for(lambda: log_has(agent, "relay for the training processes at"), 30, "the relay to listen", proc=agent)
    job, ranks, steps = f"job-{unique}", 8, 8
    clients = [TrainerClient(job=job, rank=r, world_size=ranks, local_rank=r, node="n042", nodes=["n042"] * ranks,
                             bootstrap=kafka_bootstrap, relay=relay, topic_prefix=topics.prefix,
                             spool_dir=tmp_path / f"rank{r}", exit_hooks=False) for r in range(ranks)]
    wait_for(lambda: all(c.relay.connected for c in clients), 10, "every client to reach the relay")
    collective = threading.Barrier(ranks)

    def train(c: TrainerClient) -> None:
        for k in range(steps):
            collective.wait(30)  # the ranks step together, as their collectives make them
            c.step(k, loss=1.0 / (k + 1))
            time.sleep(1.0)  # a step a second

    threads = [threading.Thread(target=train, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in clients:
        c.close(timeout_s=10)

    def telemetry() -> list[tuple[bytes, list]]:
        msgs = read_all(kafka_bootstrap, [topics.telemetry])[topics.telemetry]
        return [(k, decode(v)) for k, v in msgs]

    def arrived() -> bool:
        kinds = [r.kind for _, rs in telemetry() for r in rs]
        return kinds.count("step") == ranks * steps and kinds.count("framework") == ranks  # the exits

    wait_for(arrived, 30, "every step and exit on telemetry", proc=agent)
    envelopes = telemetry()
    assert {k for k, _ in envelopes} == {job.encode()}
    assert not [r for _, rs in envelopes for r in rs if isinstance(r, DecodeError)]
    with_steps = [rs for _, rs in envelopes if any(r.kind == "step" for r in rs)]
    assert sum(map(len, with_steps)) / len(with_steps) >= ranks, [len(rs) for rs in with_steps]
    for rank in range(ranks):
        assert [r.step for _, rs in envelopes for r in rs if r.kind == "step" and r.rank == rank] == list(range(steps))
    assert sum(r.kind == "heartbeat" for _, rs in envelopes for r in rs) >= ranks
    assert all(c.relay.refused == c.relay.failed == 0 and c.delivery.sent_messages == 0 for c in clients)
    [(_, job_rec)] = records(kafka_bootstrap, topics.jobs)
    assert len(job_rec.ranks) == ranks
    assert agent.stop() == 0
