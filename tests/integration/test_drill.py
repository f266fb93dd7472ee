"""`gangwatch drill` at small scale on the real broker and ClickHouse: a 16-rank simulated job, a machine killed,
a rank hung and a replica corrupted, job time 10x faster than the wall clock.

The drill runs its own worker and the controller's simulated mode as subprocesses on topics of this test; the
controller swaps a machine and loads a checkpoint in 10 s each (its defaults are 30 and 40), which leaves the
end-to-end budget room for the worker to lag behind on a loaded machine (each wall second is ten of the job's).
Asserted: it prints its table with every event passing its budgets (exit 0); read back from the broker
independently of the drill, every action that restarts the job was answered by the simulated controller
(`accepted` .. `resumed`, with a `restart` lifecycle record), and the store holds an incident naming each
planned machine, recovered.
"""

from __future__ import annotations

import re

import pytest
from gangwatch.schemas import Action, Lifecycle, Recovery, decode
from gangwatch.schemas.topics import TopicSettings

from gangwatch.cli import main
from gangwatch.evaluation.drill import RESTARTS, DrillSpec, injections
from tests.integration.kafkakit import read_all

pytestmark = pytest.mark.integration

KINDS = "node_loss,dataloader_hang,sdc"


@pytest.fixture
def cleanup(kafka_bootstrap, clickhouse_addr, unique):
    yield
    from clickhouse_driver import Client
    from kafka.admin import KafkaAdminClient

    host, port = clickhouse_addr
    Client(host=host, port=port).execute(f"DROP DATABASE IF EXISTS {unique}")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        mine = [t for t in admin.list_topics() if t.startswith(unique) or t.startswith(f"gangwatch-{unique}")]
        if mine:
            admin.delete_topics(mine)
    finally:
        admin.close()


def test_a_small_drill_meets_every_budget_and_the_simulated_controller_answers(
        kafka_bootstrap, clickhouse_addr, unique, tmp_path, capsys, cleanup):
    host, port = clickhouse_addr
    store = f"clickhouse://{host}:{port}/{unique}"
    code = main(["drill", "--bootstrap", kafka_bootstrap, "--store", store, "--faults", "3", "--kinds", KINDS,
                 "--seed", "5", "--speed", "10", "--job", unique, "--prefix", f"{unique}.", "--restore-check",
                 "--delay", "replace=10", "--delay", "ckpt=10", "--duration", "360", "--workdir", str(tmp_path)])
    out, err = capsys.readouterr()
    print(out)
    assert code == 0, f"{out}\n{err}"
    rows = [ln for ln in out.splitlines() if re.match(r"\d+  ", ln)]
    planned = injections(DrillSpec(job=unique, seed=5, faults=3, kinds=tuple(KINDS.split(",")), duration_s=360.0))
    assert [r.split()[1] for r in rows] == [i.kind for i in planned]
    assert all(" pass" in r and "FAIL" not in r for r in rows), out
    assert "wrong actions: none" in out

    topics = TopicSettings(prefix=f"{unique}.")
    got = read_all(kafka_bootstrap, [topics.actions, topics.ops, topics.telemetry])
    actions = [r for _, v in got[topics.actions] for r in decode(v) if isinstance(r, Action)]
    answers = [r for _, v in got[topics.ops] for r in decode(v) if isinstance(r, Recovery)]
    restarts = [r for _, v in got[topics.telemetry] if b'"lifecycle"' in v for r in decode(v)
                if isinstance(r, Lifecycle) and r.event == "restart" and r.source == "controller"]
    restarting = [a for a in actions if a.type in RESTARTS]
    assert len(restarting) >= 3
    for a in restarting:
        phases = [r.phase for r in sorted(answers, key=lambda r: r.ts) if r.action == a.id]
        assert phases[0] == "accepted" and phases[-1] == "resumed" and "ckpt_loaded" in phases, (a, phases)
        assert any(a.id in (r.reason or "") for r in restarts), a

    from gangwatch.sinks.store import ClickHouseStore

    db = ClickHouseStore(host, port, database=unique)
    try:
        stored = db.query(f"SELECT culprit_nodes, recovered_ts FROM gw_incidents FINAL WHERE job = '{unique}'")
    finally:
        db.close()
    recovered = {n for row in stored if row["recovered_ts"] is not None for n in row["culprit_nodes"]}
    assert {i.node for i in planned} <= recovered, stored
