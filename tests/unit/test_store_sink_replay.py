"""The store sink under the delivery queue: a delivery that failed after part of it was inserted is replayed
whole (`QueuedSink` discards and calls the same records again); the tables without an id to collapse on
(`gw_telemetry`, `gw_rejected`: plain MergeTree) must not get what had landed a second time."""

from __future__ import annotations

from typing import Any

import pytest
from clickhouse_driver.errors import NetworkError
from gangwatch.schemas import DeadLetter, Heartbeat, Outputs
from gangwatch.sinks.queued import QueuedSink, RetryPolicy
from gangwatch.sinks.storesink import StoreSink

from tests.unit.sinkcases import finding

pytestmark = pytest.mark.unit


class AppendStore:
    """A MergeTree store: every inserted row is kept (nothing collapses); insert calls numbered in `fail_on` raise
    the driver's NetworkError (the server went away) without storing anything."""

    def __init__(self, fail_on: set[int]) -> None:
        self.fail_on = fail_on
        self.calls = 0
        self.tables: dict[str, list[dict[str, Any]]] = {}

    def create_tables(self) -> None:
        pass

    def insert(self, table: str, rows: list[dict[str, Any]]) -> None:
        self.calls += 1
        if self.calls in self.fail_on:
            raise NetworkError("Connection refused (127.0.0.1:9000)")
        self.tables.setdefault(table, []).extend(dict(r) for r in rows)

    def query(self, sql: str) -> list[dict[str, Any]]:
        return []

    def close(self) -> None:
        pass


def beat(i: int) -> Heartbeat:
    return Heartbeat(ts=1_700_000_000.0 + i, job="j1", rank=i % 4, step=i)


def dead(i: int) -> DeadLetter:
    return DeadLetter(reason="bad", source=f"gw.telemetry[0]:{i}", kind="step", raw="{}", ts=1_700_000_000.0 + i)


def queued_store(store: AppendStore, **kw: Any) -> QueuedSink:
    inner = StoreSink(store, telemetry=True, retries=0, max_delay_s=float("inf"), **kw)
    return QueuedSink(inner, retry=RetryPolicy(base_s=0.0, give_up_s=None), sleep=lambda s: None, start=False)


def keys(rows: list[dict[str, Any]]) -> list[tuple]:
    return sorted((r["ts"], r["kind"], r["rank"] if "rank" in r else r["source"]) for r in rows)


def test_rows_inserted_before_a_failure_in_the_same_delivery_are_not_inserted_again() -> None:
    store = AppendStore(fail_on={2})  # the second insert of the delivery fails: the first (10 rows) had landed
    sink = queued_store(store, batch_rows=10)
    for i in range(25):
        sink.observe(beat(i))
    sink.flush()
    assert sink.drain(5.0) == 0
    assert sink.retries == 1 and sink.failures == 0
    assert keys(store.tables["gw_telemetry"]) == keys([{"ts": beat(i).ts, "kind": "heartbeat", "rank": i % 4}
                                                       for i in range(25)])


def test_a_table_inserted_before_the_one_that_failed_is_not_inserted_again() -> None:
    # tables go in name order: gw_findings, gw_rejected, then gw_telemetry fails once
    store = AppendStore(fail_on={3})
    sink = queued_store(store)
    sink.write(Outputs(findings=[finding("f1")]))
    for i in range(3):
        sink.reject(dead(i))
        sink.observe(beat(i))
    sink.flush()
    assert sink.drain(5.0) == 0
    assert sink.retries == 1
    assert len(store.tables["gw_rejected"]) == 3
    assert len(store.tables["gw_telemetry"]) == 3
    assert len(store.tables["gw_findings"]) == 2  # keyed by id: FINAL makes it one


def test_the_same_rows_in_two_deliveries_are_both_stored() -> None:
    # only what landed in a failed attempt is held back from its retry; a later delivery is not deduplicated
    store = AppendStore(fail_on=set())
    sink = queued_store(store)
    for _ in range(2):
        sink.observe(beat(1))
        sink.flush()
        assert sink.drain(5.0) == 0
    assert len(store.tables["gw_telemetry"]) == 2


def test_a_delivery_split_after_a_permanent_error_stores_every_row_once() -> None:
    from clickhouse_driver.errors import ErrorCodes, ServerException

    class Poisoned(AppendStore):
        def insert(self, table: str, rows: list[dict[str, Any]]) -> None:
            if table == "gw_findings" and any("poison" in r["id"] for r in rows):
                self.calls += 1
                raise ServerException("Type mismatch in VALUES section", code=ErrorCodes.TYPE_MISMATCH)
            super().insert(table, rows)

    store = Poisoned(fail_on=set())
    sink = queued_store(store, batch_rows=4)
    for i in range(6):
        sink.observe(beat(i))
    sink.write(Outputs(findings=[finding("poison")]))
    for i in range(6, 12):
        sink.observe(beat(i))
    sink.flush()
    assert sink.drain(5.0) == 0
    assert sink.failures == 1  # the poisoned finding, alone
    assert keys(store.tables["gw_telemetry"]) == keys([{"ts": beat(i).ts, "kind": "heartbeat", "rank": i % 4}
                                                       for i in range(12)])
