"""Fault tests on the real services: the worker's sinks through an outage, and the worker under overload.

Each test is bounded (every wait has a deadline) and stops everything it started. What they
measure goes into one table printed at the end of the session (`fault_figures`, conftest.py);
figures are reported, not asserted; correctness is asserted: nothing lost, nothing doubled,
every action applied exactly once, the backlog drained, no crash.

- ClickHouse down for 60 s (a private server, deploy/clickhouse/server.sh on free ports, SIGKILLed
  and restarted on its data) while the worker stores a job's telemetry and outputs.
- The controller's webhook failing for 60 s (500, then timeouts, then dropped connections) while
  two live jobs run (test_faults_controller.py).
- Twice the worker's measured capacity for ~25 s (test_faults_overload.py).

The input is `kafkakit.scenario` (a 16-rank job; a node goes silent, another gets a fatal Xid),
published with `kafkakit.messages` / `kafkakit.produce` as the other integration tests do.
Duplicates are counted by each table's key after FINAL (findings, actions, incidents by id,
profiles by node); `gw_telemetry` is plain MergeTree (no FINAL), so by (kind, job, node, rank, ts).

    GANGWATCH_KAFKA=127.0.0.1:9092 GANGWATCH_CLICKHOUSE=127.0.0.1:9000 \
        .venv/bin/python -m pytest -m fault tests/integration/    # ~4.5 min on 2 cores
"""

from __future__ import annotations

import time

import orjson
import pytest
from gangwatch.sinks.store import ClickHouseStore

from tests.integration.daemons import PrivateClickHouse, free_port, worker_metrics
from tests.integration.kafkakit import T0, caught_up, messages, produce, read_all, scenario, wait_for, worker_args

pytestmark = [pytest.mark.integration, pytest.mark.fault]

OUTAGE_S = 60.0


def output_ids(bootstrap: str, topics) -> dict[str, set[str]]:
    """The ids of every finding, action and incident the worker published (the truth the store must hold)."""
    got = read_all(bootstrap, [topics.findings, topics.actions, topics.incidents])
    return {table: {orjson.loads(v)["id"] for _, v in got[topic]}
            for table, topic in (("gw_findings", topics.findings), ("gw_actions", topics.actions),
                                 ("gw_incidents", topics.incidents))}


def test_clickhouse_down_60s(kafka_bootstrap, topics, unique, workers, tmp_path, fault_figures):
    ch = PrivateClickHouse(tmp_path)
    ch.start()
    try:
        _clickhouse_down(ch, kafka_bootstrap, topics, unique, workers, fault_figures)
    finally:
        ch.stop()


def _clickhouse_down(ch, bootstrap, topics, unique, workers, figures):
    recs = scenario(seconds=60, silent="n001", silent_at=30.0, xid_node="n002", xid_at=40.5)
    before = [r for r in recs if r.ts < T0 + 20]  # stored while the server is up
    during = [r for r in recs if T0 + 20 <= r.ts < T0 + 50]  # the faults' outputs arise during the outage
    after = [r for r in recs if r.ts >= T0 + 50]  # published once it is back
    store = ClickHouseStore(*ch.addr, database=unique)  # creates the database
    store.create_tables()  # the worker makes them too; here they exist before the first query
    port = free_port()
    w = workers(*worker_args(bootstrap, unique, topics, "--no-silence", "--store", ch.url(unique), "--telemetry",
                             "--metrics-port", str(port)))

    def processed(n: int) -> bool:  # the worker's cores had n records (its commits wait for the store: not those)
        return worker_metrics(port)["records"] >= n

    def telemetry() -> dict:
        [row] = store.query("SELECT count() AS rows, uniqExact(kind, job, node, ifNull(rank, -1), ts) AS unique "
                             "FROM gw_telemetry")
        return row

    produce(bootstrap, messages(before, topics))
    wait_for(lambda: telemetry()["unique"] == len(before), 120.0, "the first records stored", proc=w)

    pre = output_ids(bootstrap, topics)
    ch.kill()
    killed = time.monotonic()
    produce(bootstrap, messages(during, topics))
    wait_for(lambda: processed(len(before) + len(during)), 60.0, "the worker to process past the outage", proc=w)
    mid = output_ids(bootstrap, topics)
    made = sum(len(mid[t] - pre[t]) for t in mid)
    assert made, "no output arose during the outage"
    wait_for(lambda: time.monotonic() - killed >= OUTAGE_S, OUTAGE_S + 5, "the outage to last its time", proc=w)
    ch.start()
    restarted = time.monotonic()
    store = ClickHouseStore(*ch.addr, database=unique)  # a fresh connection to the restarted server
    produce(bootstrap, messages(after, topics))
    wait_for(lambda: processed(len(recs)), 60.0, "the worker to process it all", proc=w)
    want = output_ids(bootstrap, topics)

    def stored_ids() -> dict[str, set[str]]:
        return {t: {r["id"] for r in store.query(f"SELECT DISTINCT id FROM {t}")} for t in want}

    def all_stored() -> bool:
        have = stored_ids()
        return telemetry()["unique"] == len(recs) and all(want[t] <= have[t] for t in want)

    wait_for(all_stored, 120.0, "every record and output stored after the restart", every=0.5, proc=w)
    back_s = time.monotonic() - restarted
    wait_for(lambda: caught_up(bootstrap, unique, topics.job_inputs), 60.0, "the input committed to its end", proc=w)
    tel = telemetry()
    have = stored_ids()
    lost = len(recs) - tel["unique"] + sum(len(want[t] - have[t]) for t in want)
    dup = tel["rows"] - tel["unique"]
    stored_outputs = 0
    for t in want:  # after FINAL, one row per key
        [row] = store.query(f"SELECT count() AS rows, uniqExact(job, id) AS unique FROM {t} FINAL")
        dup += row["rows"] - row["unique"]
        stored_outputs += row["unique"]
    [prof] = store.query("SELECT count() AS rows, uniqExact(job, node) AS unique FROM gw_node_profiles FINAL")
    dup += prof["rows"] - prof["unique"]
    [rej] = store.query("SELECT count() AS n FROM gw_rejected")
    assert w.alive(), w.tail()
    produced_outputs = sum(len(ids) for ids in want.values())
    figures("outage s (SIGKILL -> restart)", round(restarted - killed, 1))
    figures("telemetry rows produced / stored", f"{len(recs)} / {tel['unique']}")
    figures("outputs published / stored (FINAL)", f"{produced_outputs} / {stored_outputs}")
    figures("outputs that arose during the outage", made)
    figures("records lost", lost)
    figures("rows duplicated (by key, after FINAL)", dup)
    figures("s from restart to all stored", round(back_s, 1))
    retries = sum("sink store:" in line and "retry" in line for line in w.log.read_text(errors="replace").splitlines())
    figures("store deliveries retried (worker log)", retries)
    print(f"\ntelemetry {tel}, outputs {produced_outputs}, profiles {prof}, rejected {rej['n']}")
    assert retries > 0, "no delivery met the outage"
    assert lost == 0
    assert dup == 0
    assert rej["n"] == 0
