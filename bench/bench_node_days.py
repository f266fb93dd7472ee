"""Benchmark: innocent_evictions.sql over the gw_node_days rollup against the same query over raw gw_telemetry.

The drawn month of tests/integration/test_shipped_sql.py (32 jobs, 64 nodes,
its incidents and evictions, the days each node was up), with its NVML
telemetry made as dense as a sampler makes it: on each day a node was up, each
of its 8 GPUs sampled every `--period` s (a real sampler: 5 to 60 s). The
records go into a fresh chDB store through `create_tables` (so the
materialized view rolls them up as they arrive), then the shipped query runs
twice: as shipped (reading the rollup) and with the rollup replaced by the
same aggregation over gw_telemetry (what the query would scan without it).
Printed: the rows each run read (chDB's own count), its time, and whether the
two answers agree. Nothing is asserted.

    PYTHONPATH=. .venv/bin/python bench/bench_node_days.py [--period 300]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits beside the packages

from gangwatch.sinks.store import ChdbStore  # noqa: E402
from gangwatch.sinks.tables import incident_row  # noqa: E402

from gangwatch.report.queries import catalog, render  # noqa: E402
from tests.integration.test_shipped_sql import DAY, INCIDENTS, TELEMETRY  # noqa: E402

RAW = ("(SELECT toDate(toUInt16(intDiv(toUInt32(event_time), 86400))) AS day, node, kind, count() AS records "
       "FROM gw_telemetry WHERE node != '' GROUP BY day, node, kind)")


def up_days() -> list[tuple[str, int]]:
    """(node, day number) of every day the drawn month has an NVML sample of the node."""
    return sorted({(r.node, int(r.ts // DAY)) for r in TELEMETRY if r.kind == "gpu"})


def fill(store: ChdbStore, period: int) -> None:
    store.create_tables()
    store.insert("gw_incidents", [incident_row(i) for i in INCIDENTS])
    per_day = 86400 // period
    for node, day in up_days():  # one INSERT ... SELECT per node-day, as a worker's batches would arrive
        store._session.query(
            f"INSERT INTO gw_telemetry (ts, event_time, kind, job, node, payload) "
            f"SELECT {day * 86400} + intDiv(number, 8) * {period} AS t, toDateTime(toUInt32(t)), 'gpu', '', "
            f"'{node}', '' FROM numbers({per_day * 8})")


def timed(store: ChdbStore, sql: str) -> tuple[bytes, int, float]:
    start = time.perf_counter()
    res = store._session.query(sql, "JSONEachRow")
    return res.bytes(), res.storage_rows_read(), time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--period", type=int, default=300, help="seconds between two samples of one GPU")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = ChdbStore(Path(tmp) / "store")
        t0 = time.perf_counter()
        fill(store, args.period)
        print(f"filled in {time.perf_counter() - t0:.1f} s: {len(up_days())} node-days up, a sample of each of 8 "
              f"GPUs every {args.period} s")
        counts = {t: store.query(f"SELECT count() AS n FROM {t}")[0]["n"] for t in ("gw_telemetry", "gw_node_days")}
        sql = render(catalog()["innocent_evictions"], {"all": "1"})
        rollup = timed(store, sql)
        raw = timed(store, sql.replace("FROM gw_node_days", f"FROM {RAW}"))
        store._session.query("OPTIMIZE TABLE gw_node_days FINAL")
        merged = store.query("SELECT count() AS n FROM gw_node_days")[0]["n"]
        store.close()
    print(f"gw_telemetry rows: {counts['gw_telemetry']:,}; gw_node_days rows: {counts['gw_node_days']:,} "
          f"({merged:,} once merged)")
    print(f"{'innocent_evictions over':<28}{'rows read':>14}{'seconds':>10}")
    print(f"{'the rollup (as shipped)':<28}{rollup[1]:>14,}{rollup[2]:>10.3f}")
    print(f"{'raw gw_telemetry':<28}{raw[1]:>14,}{raw[2]:>10.3f}")
    evictions = len(rollup[0].splitlines())
    print(f"same answer: {rollup[0] == raw[0]} ({evictions} evictions)")


if __name__ == "__main__":
    main()
