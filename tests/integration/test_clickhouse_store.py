"""The store's DDL and rows on the real ClickHouse server (native protocol) and on chDB, side by side."""

from __future__ import annotations

import orjson
import pytest
from gangwatch.schemas import DeadLetter, DecodeError, ProfileSnapshot, decode
from gangwatch.sinks.store import ChdbStore, ClickHouseStore
from gangwatch.sinks.tables import ROW_OF, TABLES, profile_row, rejected_row, telemetry_row

from tests.contract.samples import SAMPLES

pytestmark = pytest.mark.integration


def _records():
    f = decode(orjson.dumps(SAMPLES["finding"]))[0]
    a = decode(orjson.dumps(SAMPLES["action"]))[0]
    i = decode(orjson.dumps(SAMPLES["incident"]))[0]
    return f, a, i


def _fill(store):
    store.create_tables()
    store.create_tables()  # idempotent
    for rec in _records():
        table, row = ROW_OF[rec.kind]
        store.insert(table, [row(rec)])
        store.insert(table, [row(rec)])  # a retried insert: deduplicated by id
    step = decode(orjson.dumps({**SAMPLES["step"], "loss": "NaN"}))[0]
    store.insert("gw_telemetry", [telemetry_row(step)])
    for ts, risk in ((1700000010.0, 0.5), (1700000020.0, 1.25)):  # two snapshots: the later one wins
        store.insert("gw_node_profiles", [profile_row(ProfileSnapshot(
            job="j1", node="n003", ts=ts, risk=risk, recent_types=["hw_fault"], recent_ids=["f-1"], evictions=1,
            repeat_offender=False))])
    err = DecodeError("must be >= 0, got -3", "items[2].rank", "step", 2, '{"kind":"step","rank":-3}')
    store.insert("gw_rejected", [rejected_row(DeadLetter.of(err, "run.jsonl", line=7, ts=1700000001.5)),
                                 rejected_row(DeadLetter.of(err, "gw.telemetry", topic="gw.telemetry", partition=3,
                                                            offset=42, ts=1700000002.0))])


QUERIES = [
    "SELECT id, job, type, node, rank, gpu, score, evidence FROM gw_findings FINAL ORDER BY id",
    "SELECT id, type, nodes, evidence, path FROM gw_actions FINAL ORDER BY id",
    "SELECT id, class, culprit_nodes, stage_names, stage_seconds, recovered_ts FROM gw_incidents FINAL",
    "SELECT kind, job, rank, step, step_s, loss, toYYYYMMDD(event_time) AS day FROM gw_telemetry",
    "SELECT count() AS n FROM gw_findings FINAL",
    "SELECT node, risk, recent_types, evictions, repeat_offender FROM gw_node_profiles FINAL",
    "SELECT source, reason, field, kind, batch_index, line, topic, partition, offset, ts, raw FROM gw_rejected "
    "ORDER BY ts",
]


@pytest.fixture
def server_store(clickhouse_addr, unique):
    host, port = clickhouse_addr
    store = ClickHouseStore(host, port, database=unique)
    yield store
    store._client.execute(f"DROP DATABASE IF EXISTS {unique}")
    store.close()


def test_server_runs_the_ddl_and_returns_the_rows(server_store):
    _fill(server_store)
    version = server_store.query("SELECT version() AS v")[0]["v"]
    assert version.split(".")[0].isdigit()
    tables = {r["name"] for r in server_store.query(f"SELECT name FROM system.tables WHERE database = "
                                                    f"'{server_store.database}'")}
    assert set(TABLES) <= tables
    [finding] = server_store.query(QUERIES[0])
    assert finding["id"] == "f-1" and finding["rank"] == 5 and orjson.loads(finding["evidence"]) == {"relative": 0.4}
    [incident] = server_store.query(QUERIES[2])
    assert incident["culprit_nodes"] == ["n003"] and incident["recovered_ts"] is None
    assert server_store.query(QUERIES[4]) == [{"n": 1}]


def test_dead_letters_keep_where_they_came_from(server_store):
    _fill(server_store)
    from_file, from_topic = server_store.query(QUERIES[6])
    assert (from_file["source"], from_file["line"], from_file["topic"], from_file["batch_index"]) == \
        ("run.jsonl", 7, "", 2)
    assert (from_topic["topic"], from_topic["partition"], from_topic["offset"]) == ("gw.telemetry", 3, 42)


OLD_REJECTED = """CREATE TABLE gw_rejected (
    event_time DateTime, source String, reason String, field String, kind String, raw String
) ENGINE = MergeTree PARTITION BY toYYYYMM(event_time) ORDER BY (event_time, source)"""


def test_a_store_of_an_older_release_gets_the_new_columns(server_store, tmp_path):
    server_store._client.execute(OLD_REJECTED)
    local = ChdbStore(tmp_path / "store")
    try:
        local._session.query(OLD_REJECTED)
        for store in (server_store, local):
            _fill(store)  # create_tables twice: adds the missing columns once, then finds them there
            assert len(store.query(QUERIES[6])) == 2
    finally:
        local.close()


def test_chdb_and_server_agree(server_store, tmp_path):
    _fill(server_store)
    local = ChdbStore(tmp_path / "store")
    _fill(local)
    try:
        for sql in QUERIES:
            assert _normalize(local.query(sql)) == _normalize(server_store.query(sql)), sql
    finally:
        local.close()


def _normalize(rows):
    """chDB's JSONEachRow quotes 64-bit integers; the driver gives ints."""
    out = []
    for row in rows:
        out.append({k: (int(v) if isinstance(v, str) and v.isdigit() and k in ("n", "day", "line", "offset",
                                                                                 "batch_index") else v)
                    for k, v in row.items()})
    return out
