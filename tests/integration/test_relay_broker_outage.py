"""The broker stopped for 60 s under relayed ranks: the agent's relay keeps taking every record, none is lost.

A broker of this test's own (kafkakit.PrivateBroker) and a real `gangwatch agent`
process with its relay; eight trainer clients of its node (threads of this test,
each with its own Kafka connection for what the relay does not take) step
together, five steps a second. After a few seconds the broker gets SIGKILL and
stays down for 60 s, then is started again on the same data; the ranks train on
through it all, then close.

Checked: no client ever sent a record itself (the relay refused nothing, answered
every frame, and no client touched its own connection or spool: a broker in
trouble is the agent's business, not the ranks'); and once the agent sent its
spool, every record the relay took is on the topics: every step of every rank,
every heartbeat, the job record and every rank's exit (counted, each record once;
a resent message may store a record twice, at least once is the contract).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid

import pytest
from gangwatch.producers.trainer import TrainerClient
from gangwatch.schemas import DecodeError, decode
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.topic_admin import create_topics

from tests.integration.kafkakit import PrivateBroker, WorkerProc, read_all, wait_for
from tests.integration.test_agent_kafka import agent_args, log_has

pytestmark = pytest.mark.integration

RANKS = 8
STEP_S = 0.2  # five steps a second on every rank
BEFORE_S, OUTAGE_S, AFTER_S = 5.0, 60.0, 5.0  # training before the broker is killed, its outage, training after


def test_the_relay_keeps_taking_records_through_a_60_s_broker_outage_and_loses_none(tmp_path):
    broker = PrivateBroker(tmp_path)
    broker.start()
    name = f"t{uuid.uuid4().hex[:12]}"
    topics = TopicSettings(prefix=f"{name}.", partitions=2)
    create_topics(topics, broker.bootstrap)
    relay = tmp_path / "relay.sock"
    agent = WorkerProc(agent_args(broker.bootstrap, topics.prefix, tmp_path / "kern.log", tmp_path / "spool",
                                  "--relay", str(relay), "--metrics-port", "0"), tmp_path / "agent.log")
    clients: list[TrainerClient] = []
    try:
        wait_for(lambda: log_has(agent, "relay for the training processes at"), 30, "the relay to listen",
                 proc=agent)
        clients = [TrainerClient(job=name, rank=r, world_size=RANKS, local_rank=r, node="n042",
                                 nodes=["n042"] * RANKS, bootstrap=broker.bootstrap, relay=relay,
                                 topic_prefix=topics.prefix, spool_dir=tmp_path / f"rank{r}", exit_hooks=False)
                   for r in range(RANKS)]
        wait_for(lambda: all(c.relay.connected for c in clients), 10, "every client to reach the relay")
        stop, going = threading.Event(), [True]
        collective = threading.Barrier(RANKS, action=lambda: going.__setitem__(0, not stop.is_set()))

        def train(c: TrainerClient) -> None:
            for k in itertools.count():
                collective.wait(30)  # the ranks step together, and stop together
                if not going[0]:
                    return
                c.step(k, loss=1.0 / (k + 1))
                time.sleep(STEP_S)

        threads = [threading.Thread(target=train, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        time.sleep(BEFORE_S)
        broker.kill()
        killed = time.monotonic()
        time.sleep(OUTAGE_S)  # the fault itself: the broker stays down this long, the ranks train on
        broker.start()
        print(f"\nbroker down {time.monotonic() - killed:.1f} s ({OUTAGE_S:g} s, then its restart)")
        time.sleep(AFTER_S)
        stop.set()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        for c in clients:
            c.close(timeout_s=10)

        handed = sum(c.relay.accepted for c in clients)
        directly = sum(sum(c.delivery.kinds.values()) for c in clients)  # records a client sent or spooled itself
        fallbacks = {c.launch.rank: c.relay.refused + c.relay.failed for c in clients
                     if c.relay.refused or c.relay.failed or c.delivery.kinds}
        steps = {c.launch.rank: c.last_step + 1 for c in clients}

        def arrived() -> list:
            msgs = read_all(broker.bootstrap, [topics.telemetry, topics.jobs])
            return [r for topic in msgs.values() for _, v in topic for r in decode(v)]

        def identity(r) -> tuple:
            return r.kind, getattr(r, "rank", None), getattr(r, "step", None), r.ts

        wanted = sum(steps.values())
        wait_for(lambda: sum(r.kind == "step" for r in {identity(r): r for r in arrived()}.values()) >= wanted, 90,
                 f"all {wanted} steps on telemetry", proc=agent)
        got = arrived()
        assert not [r for r in got if isinstance(r, DecodeError)]
        unique = {identity(r): r for r in got}
        print(f"records the relay took {handed}; frames it did not take (client fallbacks) "
              f"{sum(fallbacks.values())} records (ranks {sorted(fallbacks)}); records the clients sent or spooled "
              f"themselves {directly}; received {len(got)}, {len(unique)} distinct; steps {wanted}")
        assert fallbacks == {}, "clients sent records themselves while the agent was there"
        assert len(unique) == handed  # every record the relay took, and nothing else
        for rank, n in steps.items():
            assert sorted(r.step for r in unique.values() if r.kind == "step" and r.rank == rank) == list(range(n))
        assert sum(r.kind == "framework" and r.type == "exit" for r in unique.values()) == RANKS
        assert sum(r.kind == "job" for r in unique.values()) == 1
        assert agent.stop() == 0
    finally:
        for c in clients:
            c.close(timeout_s=2)
        agent.stop()
        broker.stop()
