"""The node's relay over a real Unix socket, without Kafka: trainer clients of one node -> the agent's relay ->
its outbox -> a `send` that keeps every message.

- Envelopes hold the records of many ranks, one job each (the key), every rank's records in order; they close
  at `max_records`, at about `max_bytes`, when their linger runs out (an injected clock), or at once for a
  framework or lifecycle record (a rank's `exit` at close goes out without waiting).
- A client without a relay, or whose relay is full, gone or killed (a process, SIGKILL) sends to Kafka itself:
  no record is lost; it tries the relay again later, and sends its own spooled backlog first.
- A bad frame is answered `B`, logged and counted; the relay goes on.
- The agent runs the relay (`gangwatch agent --relay`), reports its counts, and runs without it where it
  cannot listen.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from gangwatch.producers.agent import Agent, AgentSettings
from gangwatch.producers.agent import metric_samples as agent_metric_samples
from gangwatch.producers.agent.outbox import Outbox
from gangwatch.producers.agent.relay import Packer, Relay, RelayUnavailable, Ticket
from gangwatch.producers.trainer import TrainerClient
from gangwatch.producers.trainer.client import metric_samples as trainer_metric_samples
from gangwatch.producers.trainer.relay import ACCEPTED, BAD, HEADER, default_path, frame, relay_path
from gangwatch.schemas import Framework, Heartbeat, Hw, Step, decode, encode, encode_batch

from gangwatch.cli import main
from tests.unit.trainercases import FakeTime, Recorder

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


class Kafka:
    """A thread-safe `send` that keeps every message and lets a test wait for them."""

    def __init__(self) -> None:
        self.msgs: list[tuple[str, bytes, bytes]] = []
        self._cond = threading.Condition()

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        with self._cond:
            self.msgs.append((topic, key, value))
            self._cond.notify_all()

    def wait(self, n: int, timeout: float = 10.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.msgs) >= n, timeout), f"{len(self.msgs)} of {n} messages"

    def envelopes(self, topic: str = "gw.telemetry") -> list[tuple[str, list]]:
        """(key, records) of every message on `topic`, in the order sent."""
        with self._cond:
            return [(k.decode(), decode(v)) for t, k, v in self.msgs if t == topic]


class Timer:
    """The relay's clock for lingering: moves only when told."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def wait_until(cond, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def path_exists(p: Path) -> bool:
    return p.exists() or p.is_symlink()


@pytest.fixture
def path(tmp_path) -> Path:
    return tmp_path / "relay.sock"


@pytest.fixture
def node(tmp_path, path):
    """A factory of one relay (fake linger clock) in front of a started outbox that sends to a `Kafka`."""
    made = []

    def make(kafka: Kafka | None = None, outbox: dict | None = None, **kw):
        """`kafka`: the outbox's `send` (default a `Kafka`); `outbox`: more arguments of the outbox."""
        kafka, timer = kafka or Kafka(), Timer()
        box = Outbox(kafka, tmp_path / "agent-spool", **(outbox or {}))
        box.start()
        relay = Relay(path, box, timer=timer, **{"linger_s": 3600.0, **kw})
        relay.start()
        made.append((relay, box))
        return relay, kafka, timer

    yield make
    for relay, box in made:
        relay.close(2.0)
        box.close(2.0)


@pytest.fixture
def clients(tmp_path, path, node):
    """A factory of trainer clients without threads (flush() runs on the caller) that use the relay at `path`;
    each has a `Recorder` for what it sends to Kafka itself, and fake time. Closed before the relay."""
    made = []

    def make(job: str = "j1", rank: int = 0, **kw):
        ft, direct = FakeTime(), Recorder()
        kw.setdefault("relay", path)
        c = TrainerClient(job=job, rank=rank, world_size=8, send=direct, clock=ft.clock, timer=ft.timer,
                          background=False, exit_hooks=False, announce=False,
                          spool_dir=tmp_path / f"spool-{job}-{rank}", **kw)
        made.append(c)
        ft.advance(1.0)  # steps come after the first heartbeat (records of equal time go steps first)
        return c, direct, ft

    yield make
    for c in made:
        c.close(2.0)


def by_rank(envelopes) -> dict[tuple[str, int], list[tuple[str, int | None]]]:
    """(job, rank) -> the (kind, step) of its records, in the order they were sent."""
    out: dict = {}
    for _, recs in envelopes:
        for r in recs:
            out.setdefault((r.job, r.rank), []).append((r.kind, getattr(r, "step", None)))
    return out


# --- packing ----------------------------------------------------------------------------------------


def hb(rank: int, job: str = "j1") -> Heartbeat:
    return Heartbeat(ts=1.0, job=job, rank=rank)


def test_an_envelope_closes_at_its_size_its_bytes_its_linger_or_at_once_for_an_event():
    packer = Packer(max_records=3, max_bytes=100, linger_s=0.25)
    closed = packer.add("gw.telemetry", "j1", [(hb(r), 10) for r in range(7)], Ticket(), now=0.0)
    assert [len(e.records) for e in closed] == [3, 3]
    assert packer.due(0.24) == [] and packer.next_due() == 0.25
    [late] = packer.due(0.25)
    assert [r.rank for r in late.records] == [6] and packer.next_due() is None

    closed = packer.add("gw.telemetry", "j1", [(hb(r), 40) for r in range(3)], Ticket(), now=1.0)
    assert [len(e.records) for e in closed] == [2]  # a third 40-byte record would pass 100 bytes

    packer = Packer(max_records=512, max_bytes=1 << 20, linger_s=0.25)
    assert packer.add("gw.telemetry", "j1", [(hb(0), 10)], Ticket(), now=0.0) == []
    event = Framework(ts=1.0, job="j1", rank=1, type="exit")
    [env] = packer.add("gw.telemetry", "j1", [(event, 10)], Ticket(), now=0.0)
    assert [r.kind for r in env.records] == ["heartbeat", "framework"]  # what lingered goes with it


def test_an_envelope_holds_its_records_in_event_time_order():
    """Ranks hand their records over in their own order: the envelope goes out in event-time order (a rank's
    records of one time keep theirs), which the worker reads as columns as they stand."""
    packer = Packer(max_records=8, max_bytes=1 << 20, linger_s=0.25)
    came = [Step(ts=2.0 + d, job="j1", rank=r, step=1, step_s=1.0) for r, d in enumerate([0.3, 0.1, 0.2, 0.0])]
    came += [Heartbeat(ts=2.1, job="j1", rank=1, step=1), Heartbeat(ts=1.9, job="j1", rank=4)]
    packer.add("gw.telemetry", "j1", [(r, 10) for r in came], Ticket(), now=0.0)
    [env] = packer.due(0.25)
    assert [(r.ts, r.kind, r.rank) for r in env.records] == sorted(
        [(r.ts, r.kind, r.rank) for r in came], key=lambda x: x[0])
    assert [r.kind for r in env.records if r.rank == 1] == ["step", "heartbeat"]


def test_a_ticket_waits_for_every_envelope_holding_its_records():
    packer = Packer(max_records=2, max_bytes=1 << 20, linger_s=0.25)
    first, second = Ticket(), Ticket()
    [env] = packer.add("gw.telemetry", "j1", [(hb(0), 1), (hb(0), 1), (hb(0), 1)], first, now=0.0)
    packer.add("gw.telemetry", "j1", [(hb(1), 1)], second, now=0.0)
    packer.add("gw.telemetry", "j2", [(hb(2, "j2"), 1)], first, now=0.0)
    assert env.tickets == [first] and (first.pending, second.pending) == (3, 1)


# --- several clients, one relay ---------------------------------------------------------------------


def test_envelopes_hold_many_ranks_records_of_one_job_in_per_rank_order(node, clients):
    relay, kafka, _ = node(max_records=4)  # no linger: only the size closes an envelope
    made = [clients(job, rank) for job in ("ja", "jb") for rank in range(4)]
    rounds = threading.Barrier(len(made))

    def train(c: TrainerClient, ft: FakeTime) -> None:
        for k in range(4):
            ft.advance(1.0)
            c.step(k)
            c.flush()  # returns once the relay answered
            rounds.wait(10)

    threads = [threading.Thread(target=train, args=(c, ft)) for c, _, ft in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)

    envelopes = kafka.envelopes()
    assert all(len(recs) == 4 and {r.job for r in recs} == {key} for key, recs in envelopes)
    assert sorted(key for key, _ in envelopes) == ["ja"] * 5 + ["jb"] * 5  # 4 heartbeats + 16 steps per job
    later = [recs for _, recs in envelopes if all(r.kind == "step" and r.step > 0 for r in recs)]
    assert len(later) == 6 and all({r.rank for r in recs} == {0, 1, 2, 3} for recs in later)
    expected = [("heartbeat", None)] + [("step", k) for k in range(4)]
    assert by_rank(envelopes) == {(job, rank): expected for job in ("ja", "jb") for rank in range(4)}
    assert all(direct.msgs == [] and c.relay.accepted == 5 for c, direct, _ in made)
    assert (relay.records, relay.envelopes, relay.refused, relay.bad_frames) == (40, 10, 0, 0)


def test_an_envelope_waits_for_its_linger_and_no_longer(node, clients):
    relay, kafka, timer = node(linger_s=0.25)
    c, direct, _ = clients()
    flushing = threading.Thread(target=c.flush)  # blocks until the relay answered
    flushing.start()
    wait_until(lambda: relay.queue_depth == 1, "the heartbeat to linger in the relay")
    assert kafka.msgs == [] and flushing.is_alive()  # the relay's clock has not moved: nothing can be due
    timer.t = 0.25
    relay.wake()
    flushing.join(10)
    assert not flushing.is_alive()
    [(key, [rec])] = kafka.envelopes()
    assert (key, rec.kind) == ("j1", "heartbeat") and direct.msgs == [] and c.relay.accepted == 1


def test_the_exit_at_close_goes_out_at_once_with_what_lingered(node, clients):
    relay, kafka, _ = node()  # a linger of an hour: only the exit can send the envelope
    c, direct, _ = clients()
    c.step(0)
    c.close(timeout_s=5)
    [(_, recs)] = kafka.envelopes()
    assert [r.kind for r in recs] == ["heartbeat", "step", "framework"] and recs[-1].type == "exit"
    assert direct.msgs == [] and c.relay.accepted == 3


def test_while_a_relay_is_in_use_heartbeats_fall_on_multiples_of_their_period(node, clients):
    node()
    c, _, ft = clients()  # connected when made
    ft.advance(1.25)  # the wall clock: 2.25 s past a multiple of 5 s
    assert c.relay.connected and c._until_heartbeat() == pytest.approx(2.75)
    alone, _, _ = clients(rank=1, relay="off")
    assert alone._until_heartbeat() == 5.0  # without a relay: a period from the last


# --- when the relay is absent, full, gone ---------------------------------------------------------


def test_without_a_relay_the_client_sends_directly_and_takes_the_relay_once_it_is_there(node, clients):
    c, direct, ft = clients()
    c.step(0)
    c.flush()
    assert [r.kind for r in direct.records()] == ["heartbeat", "step"] and not c.relay.connected
    relay, kafka, _ = node(max_records=1)
    c.step(1)
    c.flush()  # tried again only after `retry_s`
    assert [r.step for r in direct.steps()] == [0, 1] and kafka.msgs == []
    ft.advance(5.0)
    c.step(2)
    c.flush()
    assert [r.step for _, recs in kafka.envelopes() for r in recs] == [2] and c.relay.connected
    assert [r.step for r in direct.steps()] == [0, 1]


def test_a_full_relay_refuses_and_the_client_sends_the_records_itself(node, clients):
    relay, kafka, _ = node(queue_max=3, max_records=1)
    c, direct, _ = clients()
    for k in range(4):
        c.step(k)
    c.flush()  # a heartbeat and four steps: more than the relay may hold
    assert [r.kind for r in direct.records()] == ["heartbeat"] + ["step"] * 4
    assert (c.relay.refused, relay.refused, relay.records) == (5, 5, 0) and kafka.msgs == []
    c.step(4)
    c.flush()  # one record fits again
    assert [r.step for _, recs in kafka.envelopes() for r in recs] == [4] and c.relay.accepted == 1
    assert c.relay.connected


def test_a_client_sends_its_own_backlog_first_then_uses_the_relay(node, clients):
    c, direct, ft = clients()
    direct.fail = True  # no relay yet, and the broker is away: records spool on this rank's disk
    c.step(0)
    c.flush()
    assert c.delivery.spool and direct.msgs == []
    relay, kafka, _ = node(max_records=1)
    direct.fail = False
    ft.advance(60.0)  # past the back-off and the relay's retry
    c.step(1)
    c.flush()  # the backlog first, and this cycle's records behind it, directly
    assert [r.kind for r in direct.records()] == ["heartbeat", "step", "step"] and kafka.msgs == []
    c.step(2)
    c.flush()
    assert [r.step for _, recs in kafka.envelopes() for r in recs] == [2]


def test_a_relay_that_closes_answers_what_it_holds_then_clients_send_directly(node, clients):
    relay, kafka, _ = node()
    c, direct, _ = clients()
    flushing = threading.Thread(target=c.flush)
    flushing.start()
    wait_until(lambda: relay.queue_depth == 1, "the heartbeat to linger in the relay")
    relay.close(5.0)  # the agent stops: what lingers goes to the outbox, and its frames are answered
    flushing.join(10)
    assert [r.kind for _, recs in kafka.envelopes() for r in recs] == ["heartbeat"] and c.relay.accepted == 1
    c.step(0)
    c.flush()  # the relay is gone: straight to Kafka, and no record lost
    assert [r.kind for r in direct.records()] == ["step"] and not c.relay.connected
    assert not path_exists(relay.path)


# --- while Kafka is slow or away ---------------------------------------------------------------------


class Stalled(Kafka):
    """A broker in trouble: a send waits until `released` (a metadata wait that does not end), then goes through,
    or with `fails` raises a timeout as the Kafka client does; once released, sends go through at once."""

    def __init__(self, fails: bool) -> None:
        super().__init__()
        self.fails, self.released, self.stalls = fails, threading.Event(), 0

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        if not self.released.is_set():
            self.stalls += 1
            self.released.wait()
            if self.fails:
                raise TimeoutError("KafkaTimeoutError: Failed to update metadata after 5.0 secs")
        super().__call__(topic, key, value)


@pytest.mark.parametrize("fails", [False, True], ids=["send-held-then-through", "send-held-then-timed-out"])
def test_a_broker_that_holds_every_send_does_not_stop_the_relay_taking_records(node, clients, fails):
    """The relay answers every frame while the outbox's send is held (the agent spools), no client sends a
    record itself, and once the broker is back every record arrives once, in order."""
    stalled, later = Stalled(fails), Timer()  # `later`: the outbox's clock, for its back-off
    relay, kafka, _ = node(stalled, outbox={"send_wait_s": 0.05, "timer": later}, max_records=1)
    box = relay.outbox
    try:
        c, direct, ft = clients()
        for k in range(5):
            c.step(k)
            c.flush()  # returns once the relay answered
        assert (c.relay.accepted, c.relay.refused, c.relay.failed, relay.refused) == (6, 0, 0, 0)
        assert direct.msgs == [] and not c.delivery.spool and c.relay.connected  # no fallback of the client's
        assert stalled.stalls == 1 and kafka.msgs == [] and box.backlog  # one send waited; the rest was spooled
    finally:
        stalled.released.set()
    wait_until(lambda: not box.send.busy, "the held send to end")
    assert len(kafka.msgs) == (0 if fails else 1)  # it got through after all, or timed out
    later.t = 60.0  # past the outbox's back-off
    c.step(5)
    c.flush()
    kafka.wait(7)  # a heartbeat and six steps, one envelope each
    wait_until(lambda: not box.backlog, "the spool to be sent")
    assert by_rank(kafka.envelopes()) == {("j1", 0): [("heartbeat", None)] + [("step", k) for k in range(6)]}
    assert direct.msgs == [] and box.dropped == 0


RELAY_PROCESS = """
import sys, time
from pathlib import Path
from gangwatch.producers.agent.outbox import Outbox
from gangwatch.producers.agent.relay import Relay

out = open(sys.argv[2], "ab")

def send(topic, key, value):
    out.write(topic.encode() + b" " + value + b"\\n")
    out.flush()  # in the kernel's hands: a SIGKILL after this loses nothing

box = Outbox(send, Path(sys.argv[3]))
box.start()
Relay(Path(sys.argv[1]), box, linger_s=0.05).start()
print("ready", flush=True)
time.sleep(3600)
"""


def test_a_relay_killed_mid_run_loses_no_record(tmp_path, path, clients):
    sent = tmp_path / "relayed.txt"
    proc = subprocess.Popen([sys.executable, "-c", RELAY_PROCESS, str(path), str(sent), str(tmp_path / "spool")],
                            cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout.readline() == "ready\n"
        made = [clients("j1", rank) for rank in range(4)]
        steps = 60

        def train(c: TrainerClient) -> None:
            for k in range(steps):
                c.step(k)
                c.flush()

        threads = [threading.Thread(target=train, args=(c,)) for c, _, _ in made]
        for t in threads:
            t.start()
        wait_until(lambda: all(c.relay.accepted >= 5 for c, _, _ in made), "records through the relay", 30)
        proc.send_signal(signal.SIGKILL)  # mid-run: most clients wait for an answer to a frame right now
        proc.wait(10)
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    relayed = [r for line in sent.read_bytes().splitlines() for r in decode(line.split(b" ", 1)[1])]
    directly = [r for _, d, _ in made for r in d.records()]
    assert relayed and directly and any(c.relay.failed for c, _, _ in made)  # frames in flight went directly
    for rank in range(4):
        got = {r.step for r in relayed + directly if r.kind == "step" and r.rank == rank}
        assert got == set(range(steps)), rank  # every step arrived (at least once)
    assert all(not c.relay.connected for c, _, _ in made)


# --- bad frames -------------------------------------------------------------------------------------


def answer(conn: socket.socket, data: bytes) -> bytes:
    conn.sendall(data)
    return conn.recv(1)


def test_a_bad_frame_is_answered_logged_and_counted_and_the_relay_goes_on(node, path, caplog):
    relay, kafka, _ = node(max_records=1)
    step = encode_batch([Step(ts=1.0, job="j1", rank=0, step=3, step_s=1.0)], ts=1.0)
    xid = encode(Hw(ts=1.0, node="n1", source="xid", code=79))
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(path))
    with caplog.at_level(logging.WARNING, "gangwatch.agent"):
        assert answer(conn, HEADER.pack(9) + b"not json\n") == BAD
        assert answer(conn, frame([("gw.telemetry", b'{"kind":"step","v":1}')])) == BAD  # fields missing
        assert answer(conn, frame([("gw.actions", step)])) == BAD  # not a topic of the trainer client
        assert answer(conn, frame([("gw.telemetry", xid)])) == BAD  # a node event is not telemetry
        assert answer(conn, frame([("gw.telemetry", step)])) == ACCEPTED  # the same connection goes on
    assert "a bad frame" in caplog.text and caplog.text.count("a bad frame") == 1  # once per connection
    assert relay.bad_frames == 4 and relay.records == 1
    [(_, [rec])] = kafka.envelopes()
    assert rec.step == 3

    assert answer(conn, HEADER.pack(1 << 31)) == BAD  # a length over the limit: that connection is closed
    assert conn.recv(1) == b""
    conn.close()
    again = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    again.connect(str(path))
    assert answer(again, frame([("gw.telemetry", step)])) == ACCEPTED and relay.bad_frames == 5
    again.close()


# --- where the relay listens ------------------------------------------------------------------------


def test_a_second_relay_on_a_live_socket_is_refused_and_a_stale_socket_is_replaced(node, path, tmp_path):
    relay, _, _ = node()
    with pytest.raises(RelayUnavailable):
        Relay(path, Outbox(Kafka(), tmp_path / "other")).start()
    relay.close()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # a socket file nobody listens on: an agent that died
    stale.close()
    node()
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.connect(str(path))  # a new relay listens there
    probe.close()


def test_where_a_client_looks_for_its_relay(monkeypatch, tmp_path):
    assert relay_path(None, "n1") == default_path("n1") and default_path("a/b").name == "a_b.sock"
    assert relay_path("off", "n1") is None and relay_path("/run/r.sock", "n1") == Path("/run/r.sock")
    assert relay_path("/run/gw/{node}.sock", "rack 3/n1") == Path("/run/gw/rack_3_n1.sock")  # hosts of many nodes
    kw = {"job": "j", "background": False, "exit_hooks": False, "spool_dir": tmp_path}  # not closed: sends nothing
    monkeypatch.setenv("GANGWATCH_RELAY", "/run/gw.sock")
    assert TrainerClient(bootstrap="127.0.0.1:1", **kw).relay.path == Path("/run/gw.sock")
    assert TrainerClient(send=Recorder(), **kw).relay is None  # a `send` of a test's own: no relay unless named
    monkeypatch.setenv("GANGWATCH_RELAY", "off")
    assert TrainerClient(bootstrap="127.0.0.1:1", **kw).relay is None
    monkeypatch.delenv("GANGWATCH_RELAY")  # none named: no relay, whatever listens at the default path
    assert TrainerClient(bootstrap="127.0.0.1:1", **kw).relay is None


# --- the agent ---------------------------------------------------------------------------------------


def test_the_agent_relays_its_nodes_records_and_reports_its_counts(tmp_path, path):
    kafka = Kafka()
    agent = Agent(AgentSettings(node="n9", bootstrap="127.0.0.1:1", kmsg="off", gpu_every_s=0, heartbeat_s=0,
                                spool_dir=tmp_path / "spool", relay=path, relay_linger_s=0.05), send=kafka)
    agent.listener.connect_timeout_s = 0.1  # no broker in a unit test: the listener just keeps trying
    runner = threading.Thread(target=agent.run, kwargs={"close_timeout_s": 4.0})
    runner.start()
    try:
        wait_until(lambda: path_exists(path), "the relay to listen")
        client = TrainerClient(job="j1", rank=0, world_size=1, send=Recorder(), relay=path, background=False,
                               exit_hooks=False, spool_dir=tmp_path / "rank0")
        client.step(0)
        client.flush()
        assert client.relay.accepted == 3  # the job record, a heartbeat, a step
        samples = {(f.name, labels): v for f, labels, v in agent_metric_samples(agent)}
        assert samples[("gangwatch_agent_relay_records", ("accepted",))] == 3
        assert samples[("gangwatch_agent_relay_envelopes", ())] == 2  # one on jobs, one on telemetry
        assert samples[("gangwatch_agent_relay_clients", ())] == 1
        assert samples[("gangwatch_producer_queue_depth", ("relay",))] == 0
        trainer = {(f.name, labels): v for f, labels, v in trainer_metric_samples(client)}
        assert trainer[("gangwatch_trainer_relay_records", ("accepted",))] == 3
        assert trainer[("gangwatch_trainer_relay_connected", ())] == 1
        client.close()
    finally:
        agent.stop()
        runner.join(10)
    assert not runner.is_alive() and not path_exists(path)
    assert sorted(r.kind for _, recs in kafka.envelopes("gw.telemetry") + kafka.envelopes("gw.jobs")
                  for r in recs) == ["framework", "heartbeat", "job", "step"]


def test_an_agent_whose_relay_cannot_listen_runs_without_it(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    agent = Agent(AgentSettings(node="n9", bootstrap="127.0.0.1:1", kmsg="off", gpu_every_s=0, heartbeat_s=0,
                                spool_dir=tmp_path / "spool", relay=tmp_path / "file" / "relay.sock"), send=Kafka())
    agent.listener.connect_timeout_s = 0.1
    runner = threading.Thread(target=agent.run, kwargs={"close_timeout_s": 2.0})
    with caplog.at_level(logging.WARNING, "gangwatch.agent"):
        runner.start()
        wait_until(lambda: "no relay at" in caplog.text, "the warning")
        agent.stop()
        runner.join(10)
    assert not runner.is_alive() and agent.relay is None


@pytest.mark.parametrize(("argv", "expected"), [
    ([], "default"), (["--relay", "off"], None), (["--relay", "/run/gw/relay.sock"], Path("/run/gw/relay.sock")),
    (["--relay", "/run/gw/{node}.sock"], Path("/run/gw/n7.sock"))])
def test_the_agent_command_line_sets_the_relay(monkeypatch, argv, expected):
    seen = []

    class Recorded:
        def __init__(self, settings: AgentSettings) -> None:
            seen.append(settings)

        def run_once(self) -> None:
            pass

    monkeypatch.setattr("gangwatch.producers.agent.Agent", Recorded)
    assert main(["agent", "--once", "--node", "n7", "--relay-max-records", "64", "--relay-linger-s", "0.5",
                 *argv]) == 0
    [s] = seen
    assert s.relay == (default_path("n7") if expected == "default" else expected)
    assert (s.relay_max_records, s.relay_linger_s) == (64, 0.5)


def test_an_envelope_size_over_a_batch_is_refused(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["agent", "--once", "--relay-max-records", "5000"])
    assert exited.value.code == 2 and "--relay-max-records" in capsys.readouterr().err
    monkeypatch.setenv("GANGWATCH_RELAY_MAX_RECORDS", "0")
    assert main(["agent", "--once"]) == 2
    assert "must be greater than 0" in capsys.readouterr().err
