"""Batched writes of the core's outputs into a ClickHouse store (server or chDB).

Rows are buffered per table and inserted when a table reaches `batch_rows`, or
when `max_delay_s` of wall time passed since the oldest buffered row, or on
`flush()`. Only a transient failure (network, timeouts, a server overloaded:
`store.store_error_transient`, or an OSError) is retried here, `retries` times
with exponential backoff capped at `max_backoff_s`; a permanent one (unknown
table or column, a type or parse error) is not: `flush` raises `DeliveryError`
with `transient` saying which. Under the worker the sink runs with `retries=0`
inside a `QueuedSink`, which does the retrying off the event loop and turns
what can never be stored into dead letters. A table's rows leave the buffer
only once inserted, so a flush that failed half-way resumes where it stopped
(`discard()` drops what is buffered). The output tables are ReplacingMergeTree
keyed by record id, so a retry that did land twice collapses to one row.

`gw_telemetry` and `gw_rejected` are plain MergeTree: nothing collapses a row
inserted twice. A queue's retry discards and writes the whole delivery again,
while part of it may already be stored (a table inserted before the one that
failed, or the rows of a flush `batch_rows` triggered mid-delivery). So the sink
remembers the rows of those two tables stored since the last completed
`flush()`; `discard()` keeps them as landed, and each landed row is skipped once
when the retry writes it again. (A row whose insert raised after the server had
stored it cannot be told from one it never got; that doubling remains possible.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from gangwatch.schemas import DeadLetter, Outputs, Record
from gangwatch.sinks.interface import DeliveryError
from gangwatch.sinks.store import Store, store_error_transient
from gangwatch.sinks.tables import ROW_OF, action_row, job_row, profile_row, rejected_row, telemetry_row

log = logging.getLogger(__name__)

APPEND_ONLY = frozenset({"gw_telemetry", "gw_rejected"})  # plain MergeTree: a row inserted twice stays twice
LANDED_KEEP = 200_000  # digests of stored rows remembered at most (a queue's delivery is at most 20,000 records)


class StoreSink:
    def __init__(self, store: Store, *, telemetry: bool = False, telemetry_every: int = 1, batch_rows: int = 5000,
                 max_delay_s: float = 1.0, retries: int = 5, backoff_s: float = 0.2, max_backoff_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.telemetry = telemetry
        self.telemetry_every = max(1, telemetry_every)
        self.batch_rows = batch_rows
        self.max_delay_s = max_delay_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._clock, self._sleep = clock, sleep
        self._rows: dict[str, list[dict[str, Any]]] = {}
        self._oldest: float | None = None
        self._seen = 0
        self._stored: dict[int, int] = {}  # digest -> rows of APPEND_ONLY tables stored since the last flush()
        self._landed: dict[int, int] = {}  # ... stored by a delivery that failed: skipped once each on its retry
        self.inserted = 0
        self.skipped = 0  # rows not inserted again: a failed delivery had stored them
        store.create_tables()

    @property
    def accepts(self) -> frozenset[str]:
        """What it stores (a queue in front of it holds nothing else): raw inputs only with `telemetry`."""
        kinds = {"finding", "action", "incident", "profile", "life", "shadow", "reject"}
        return frozenset(kinds | {"observe"} if self.telemetry else kinds)

    def write(self, out: Outputs) -> None:
        for rec in (*out.findings, *out.actions, *out.incidents):
            table, row = ROW_OF[rec.kind]
            self._add(table, row(rec))
        for p in out.profiles:
            self._add("gw_node_profiles", profile_row(p))
        for f in out.life:
            self._add("gw_jobs", job_row(f))
        for a in out.shadow:
            self._add("gw_actions", action_row(a))

    def reject(self, dead: DeadLetter) -> None:
        self._add("gw_rejected", rejected_row(dead))

    def observe(self, rec: Record) -> None:
        if self.telemetry:
            self._seen += 1
            if self._seen % self.telemetry_every == 0:
                self._add("gw_telemetry", telemetry_row(rec))

    def _add(self, table: str, row: dict[str, Any]) -> None:
        if self._landed and table in APPEND_ONLY:
            key = _digest(table, row)
            n = self._landed.get(key, 0)
            if n:  # the failed attempt of this delivery stored it already
                if n == 1:
                    del self._landed[key]
                else:
                    self._landed[key] = n - 1
                _count(self._stored, key)  # stored in this attempt too, should it fail in turn
                self.skipped += 1
                return
        rows = self._rows.setdefault(table, [])
        rows.append(row)
        if self._oldest is None:
            self._oldest = self._clock()
        if len(rows) >= self.batch_rows or self._clock() - self._oldest >= self.max_delay_s:
            self._flush_tables()

    def flush(self) -> None:
        """Insert everything buffered; the delivery is then complete (nothing of it is held as landed)."""
        self._flush_tables()
        self._stored.clear()

    def _flush_tables(self) -> None:
        for table in sorted(self._rows):
            rows = self._rows[table]
            if rows:
                self._insert(table, rows)
            del self._rows[table]  # only once stored: a failed flush resumes with the tables still here
        self._oldest = None

    def discard(self) -> None:
        """Drop every buffered row (after a failed flush, before the caller writes them again); what the failed
        attempt had stored of APPEND_ONLY tables is held as landed, so writing it again skips it."""
        self._rows.clear()
        self._oldest = None
        for key, n in self._stored.items():
            _count(self._landed, key, n)
        self._stored.clear()
        _trim(self._landed)

    def _insert(self, table: str, rows: list[dict[str, Any]]) -> None:
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                self.store.insert(table, rows)
                self.inserted += len(rows)
                if table in APPEND_ONLY:
                    for row in rows:
                        _count(self._stored, _digest(table, row))
                    _trim(self._stored)
                return
            except Exception as e:  # the driver raises many types: which of them may pass by itself?
                transient = store_error_transient(e)
                if transient is None:
                    transient = isinstance(e, (OSError, EOFError))  # refused, reset, timed out
                reason = f"insert of {len(rows)} row(s) into {table}: {type(e).__name__}: {e}"
                if not transient:
                    raise DeliveryError(reason, transient=False) from e
                if attempt == self.retries:
                    raise DeliveryError(reason, transient=True) from e
                log.warning("%s; retry %d in %.1fs", reason, attempt + 1, delay)
                self._sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)

    def close(self) -> None:
        self.flush()
        self.store.close()


def _digest(table: str, row: dict[str, Any]) -> int:
    """One row's identity within this process (every column's value)."""
    try:
        return hash((table, *row.values()))
    except TypeError:  # a column that holds a list: its JSON instead
        return hash((table, orjson.dumps(row, default=str)))


def _count(counts: dict[int, int], key: int, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


def _trim(counts: dict[int, int]) -> None:
    while len(counts) > LANDED_KEEP:  # the oldest first: dicts keep insertion order
        del counts[next(iter(counts))]
