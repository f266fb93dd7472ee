"""`gangwatch store query` and `replay --store` on the real ClickHouse server, as issue 24 met them: the HTTP
port by mistake, a database that is not there, a query the server refuses, the rows of extreme values, stage
order and floats in full."""

from __future__ import annotations

import os
import socket
import time

import orjson
import pytest
from gangwatch.schemas import DeadLetter, DecodeError, decode
from gangwatch.sinks.store import ClickHouseStore
from gangwatch.sinks.tables import DATETIME_MAX, ROW_OF, rejected_row

from gangwatch.cli import main
from tests.contract.samples import SAMPLES
from tests.helpers import missing

pytestmark = pytest.mark.integration

HTTP_PORT_ENV = "GANGWATCH_CH_HTTP_PORT"
STAGE_ORDER = ["detect", "localize", "decide", "replace", "rollback", "comm_rebuild", "total"]


@pytest.fixture
def server(clickhouse_addr, unique):
    """(HOST:PORT, a database name of this test), dropped afterwards."""
    from clickhouse_driver import Client

    host, port = clickhouse_addr
    yield f"{host}:{port}", unique
    Client(host=host, port=port).execute(f"DROP DATABASE IF EXISTS {unique}")


def _databases(addr: str) -> set[str]:
    from clickhouse_driver import Client

    host, _, port = addr.rpartition(":")
    return {r[0] for r in Client(host=host, port=int(port)).execute("SELECT name FROM system.databases")}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_the_http_port_by_mistake_is_one_line_within_seconds(server, capsys, tmp_path):
    addr, db = server
    host = addr.rpartition(":")[0]
    http = _http_port(host)
    started = time.monotonic()
    code, _, err = _run(capsys, "store", "query", "SELECT 1", "--store", f"clickhouse://{host}:{http}/{db}")
    assert code == 5 and len(err.splitlines()) == 1 and "looks like the HTTP port" in err, err
    assert time.monotonic() - started < 10
    (tmp_path / "in.jsonl").write_bytes(orjson.dumps(SAMPLES["job"]) + b"\n")
    code, _, err = _run(capsys, "replay", str(tmp_path / "in.jsonl"), "--out", str(tmp_path / "o"), "--store",
                        f"clickhouse://{host}:{http}/{db}")
    assert code == 5 and "looks like the HTTP port" in err and db not in _databases(addr)


def test_a_query_creates_no_database_and_shows_the_servers_message(server, capsys):
    addr, db = server
    code, _, err = _run(capsys, "store", "query", "SELECT 1", "--store", f"clickhouse://{addr}/{db}")
    assert code == 3 and f"database '{db}' does not exist" in err and len(err.splitlines()) == 1
    assert db not in _databases(addr)
    code, _, err = _run(capsys, "store", "query", "SELEC 1", "--store", f"clickhouse://{addr}/default")
    assert code == 2 and len(err.splitlines()) == 1 and "Stack trace" not in err
    assert "the query failed: Code: 62. DB::Exception: Syntax error: failed at position 1" in err


def test_rows_of_extreme_values_insert_on_the_server(server):
    addr, db = server
    host, _, port = addr.rpartition(":")
    store = ClickHouseStore(host, int(port), database=db)
    try:
        store.create_tables()
        for kind, extra in (("finding", {"gpu": 2**40, "ts": 1.1805916207174113e21}), ("incident", {"ts": -5e9}),
                            ("action", {"ts": 1.1805916207174113e21})):
            table, row = ROW_OF[kind]
            store.insert(table, [row(decode(orjson.dumps({**SAMPLES[kind], **extra}))[0])])
        store.insert("gw_rejected", [rejected_row(DeadLetter.of(DecodeError("bad", raw="x"), "f", ts=1.18e21))])
        assert store.query("SELECT gpu, ts, toUInt32(event_time) AS t FROM gw_findings") == [
            {"gpu": None, "ts": 1.1805916207174113e21, "t": DATETIME_MAX}]
        assert store.query("SELECT version, toUInt32(event_time) AS t FROM gw_incidents") == [{"version": 0, "t": 0}]
        assert store.query("SELECT toUInt32(event_time) AS t FROM gw_rejected") == [{"t": DATETIME_MAX}]
    finally:
        store.close()


def test_stage_names_come_in_stage_order_and_floats_in_full(server, capsys, tmp_path):
    from gangwatch.producers.simulate import Fault, Scenario, write

    addr, db = server
    sc = Scenario("ch", seed=3, tp=4, pp=1, dp=4, gpus_per_node=4, duration_s=180.0,
                  faults=(Fault("xid79", at_s=60.0, node="n001", params={"gpu": 1}),))
    stream, _ = write(sc, tmp_path)
    url = f"clickhouse://{addr}/{db}"
    assert _run(capsys, "replay", str(stream), "--out", str(tmp_path / "o"), "--store", url, "-q")[0] == 0
    code, out, _ = _run(capsys, "store", "query", "SELECT stage_names, ts FROM gw_incidents FINAL", "--store", url,
                        "--format", "jsonl")
    rows = [orjson.loads(x) for x in out.splitlines()]
    assert code == 0 and rows
    for r in rows:
        names = r["stage_names"]
        assert names == [s for s in STAGE_ORDER if s in names] and len(names) >= 2, names
    code, out, _ = _run(capsys, "store", "query", "SELECT ts FROM gw_incidents FINAL ORDER BY ts LIMIT 1",
                        "--store", url)
    assert code == 0 and out.splitlines()[1].strip() == repr(min(r["ts"] for r in rows))


@pytest.mark.parametrize("sql", ["DROP TABLE gw_rejected", "INSERT INTO gw_rejected SELECT * FROM gw_rejected",
                                 "SELECT 1 SETTINGS readonly = 0", "CREATE TABLE x (a UInt8) ENGINE = Memory"])
def test_store_query_only_reads_on_the_server(server, capsys, sql):
    addr, db = server
    host, _, port = addr.rpartition(":")
    ClickHouseStore(host, int(port), database=db).create_tables()
    code, out, err = _run(capsys, "store", "query", sql, "--store", f"clickhouse://{addr}/{db}")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "Code: 164" in err
    assert "refused: queries here only read (the store is opened read-only), so nothing was changed" in err
    code, out, _ = _run(capsys, "store", "query", "SELECT name FROM system.tables WHERE database = currentDatabase()"
                        " AND name IN ('gw_rejected', 'x')", "--store", f"clickhouse://{addr}/{db}",
                        "--format", "jsonl")
    assert code == 0 and out.split() == ['{"name":"gw_rejected"}']


def _http_port(host: str) -> int:
    """The server's HTTP port: the variable deploy/clickhouse/server.sh (and so `./gw up` and CI) reads."""
    http = int(os.environ.get(HTTP_PORT_ENV, "8123"))
    try:
        socket.create_connection((host, http), timeout=2).close()
    except OSError:
        missing(f"the ClickHouse server's HTTP port {host}:{http} is not open ({HTTP_PORT_ENV}, as "
                "deploy/clickhouse/server.sh reads it)")
    return http


@pytest.mark.parametrize("which", ["native", "http"])
@pytest.mark.parametrize("argv", [["topics", "list"], ["publish", "{src}"], ["worker"]])
def test_a_clickhouse_port_given_as_bootstrap_is_named_not_kafka(clickhouse_addr, capsys, tmp_path, which, argv):
    host, native = clickhouse_addr
    port = native if which == "native" else _http_port(host)
    (tmp_path / "in.jsonl").write_bytes(orjson.dumps(SAMPLES["job"]) + b"\n")
    code, _, err = _run(capsys, *[a.format(src=tmp_path / "in.jsonl") for a in argv],
                        "--bootstrap", f"{host}:{port}", "--connect-timeout", "3")
    assert code == 5 and len(err.splitlines()) == 1, err  # one line: no retries, no traceback, no "internal error"
    assert f"--bootstrap {host}:{port} is not Kafka" in err and "did not answer Kafka's ApiVersions request" in err
    assert ("answers as ClickHouse's native port does" if which == "native" else "answers HTTP") in err


def test_tls_to_the_plain_native_port_says_it_does_not_speak_tls(clickhouse_addr, capsys):
    host, port = clickhouse_addr
    code, _, err = _run(capsys, "store", "query", "SELECT 1", "--store", f"clickhouses://{host}:{port}/default")
    assert code == 5 and len(err.splitlines()) == 1, err
    assert f"{host}:{port} does not speak TLS: it is ClickHouse's plain native port" in err and "9440" in err
    assert "HTTP" not in err
