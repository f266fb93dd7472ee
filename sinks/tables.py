"""ClickHouse tables of gangwatch: DDL and the mapping of records to rows.

The same DDL runs on the Debian ClickHouse 18.16 server and on chDB, so it
keeps to what 18.16 accepts: MergeTree family, `PARTITION BY` / `ORDER BY`,
DateTime, Nullable, Array; no TTL, DateTime64, LowCardinality, Map or JSON.

Every table has `ts Float64` (event time, exact) and `event_time DateTime`
(the same instant, for date functions and partitions). Tables of outputs are
ReplacingMergeTree keyed by the record id, so a retried insert of the same
rows collapses to one row (`SELECT ... FINAL` to read the deduplicated view).

`gw_node_days` is a rollup, not a record: records per node, day and kind, a
SummingMergeTree that the materialized view `gw_node_days_mv` feeds from each
insert into `gw_telemetry`. The DDL runs in its order, so the view comes after
both its tables; on a store of an older release its `IF NOT EXISTS` creates
them, and the rollup holds what is inserted from then on.

A column added to a table after it was first released is also listed in
`ADDED_COLUMNS`: a store made by an older release gets it with `ALTER TABLE ...
ADD COLUMN` (18.16 has no `ADD COLUMN IF NOT EXISTS`, so the store asks
`system.columns` first).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import orjson
from gangwatch.schemas import Action, DeadLetter, Finding, Incident, ProfileSnapshot, Record, to_dict

DDL: dict[str, str] = {
    "gw_findings": """
CREATE TABLE IF NOT EXISTS {db}gw_findings (
    id String, ts Float64, event_time DateTime, job String, type String, detector String,
    rank Nullable(Int64), node String, gpu Nullable(Int32), score Nullable(Float64), evidence String
) ENGINE = ReplacingMergeTree PARTITION BY toYYYYMM(event_time) ORDER BY (job, id)""",
    "gw_actions": """
CREATE TABLE IF NOT EXISTS {db}gw_actions (
    id String, ts Float64, event_time DateTime, job String, incident String, type String,
    nodes Array(String), reason String, evidence Array(String), path String, shadow UInt8, verdict String
) ENGINE = ReplacingMergeTree PARTITION BY toYYYYMM(event_time) ORDER BY (job, id)""",
    "gw_incidents": """
CREATE TABLE IF NOT EXISTS {db}gw_incidents (
    id String, ts Float64, event_time DateTime, version UInt64, job String, class String, planned UInt8,
    onset_ts Nullable(Float64), detected_ts Nullable(Float64), localized_ts Nullable(Float64),
    decided_ts Nullable(Float64), recovered_ts Nullable(Float64),
    culprit_nodes Array(String), evicted_nodes Array(String), path String,
    stage_names Array(String), stage_seconds Array(Float64), over_budget Array(String)
) ENGINE = ReplacingMergeTree(version) PARTITION BY toYYYYMM(event_time) ORDER BY (job, id)""",
    "gw_telemetry": """
CREATE TABLE IF NOT EXISTS {db}gw_telemetry (
    ts Float64, event_time DateTime, kind String, job String, node String, rank Nullable(Int64),
    step Nullable(Int64), step_s Nullable(Float64), compute_s Nullable(Float64),
    comm_wait_s Nullable(Float64), data_wait_s Nullable(Float64), loss Nullable(Float64),
    grad_norm Nullable(Float64), payload String
) ENGINE = MergeTree PARTITION BY toYYYYMMDD(event_time) ORDER BY (job, kind, event_time)""",
    # a rollup of gw_telemetry, fed by the view below: per node, day (UTC) and record kind, how many raw records named
    # the node (step and heartbeat records name a rank, not a node, and are not in it). Rows of one key add up as
    # parts merge: read it with sum(records) ... GROUP BY. Only what is inserted after the view exists is rolled up.
    "gw_node_days": """
CREATE TABLE IF NOT EXISTS {db}gw_node_days (
    day Date, node String, kind String, job String, records UInt64
) ENGINE = SummingMergeTree PARTITION BY toYYYYMM(day) ORDER BY (node, day, kind, job)""",
    "gw_node_days_mv": """
CREATE MATERIALIZED VIEW IF NOT EXISTS {db}gw_node_days_mv TO {db}gw_node_days AS
SELECT toDate(toUInt16(intDiv(toUInt32(event_time), 86400))) AS day, node, kind, job, count() AS records
FROM {db}gw_telemetry WHERE node != '' GROUP BY day, node, kind, job""",
    # each job's life: one row per move (detectors/life.py), the job's state from `ts` on
    "gw_jobs": """
CREATE TABLE IF NOT EXISTS {db}gw_jobs (
    id String, ts Float64, event_time DateTime, job String, state String, previous String, cause String,
    ended_ranks Int64, job_ranks Int64
) ENGINE = ReplacingMergeTree PARTITION BY toYYYYMM(event_time) ORDER BY (job, ts, id)""",
    "gw_node_profiles": """
CREATE TABLE IF NOT EXISTS {db}gw_node_profiles (
    job String, node String, ts Float64, event_time DateTime, version UInt64, risk Float64,
    recent_types Array(String), recent_ids Array(String), evictions UInt32, repeat_offender UInt8
) ENGINE = ReplacingMergeTree(version) PARTITION BY toYYYYMM(event_time) ORDER BY (job, node)""",
    # one row per `schemas.DeadLetter`; its `index` is `batch_index` here (INDEX is a keyword in a column list)
    "gw_rejected": """
CREATE TABLE IF NOT EXISTS {db}gw_rejected (
    event_time DateTime, source String, reason String, field String, kind String, raw String,
    ts Float64, batch_index Nullable(Int64), line Nullable(Int64), topic String, partition Nullable(Int32),
    offset Nullable(Int64)
) ENGINE = MergeTree PARTITION BY toYYYYMM(event_time) ORDER BY (event_time, source)""",
}

# table -> columns (name, type) added after its first release, in the order they were added
ADDED_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    # shadow mode (triage/shadow.py): 1 for an action only recorded; its verdict once scored ("true", "false")
    "gw_actions": (("shadow", "UInt8"), ("verdict", "String")),
    "gw_rejected": (("ts", "Float64"), ("batch_index", "Nullable(Int64)"), ("line", "Nullable(Int64)"),
                    ("topic", "String"), ("partition", "Nullable(Int32)"), ("offset", "Nullable(Int64)")),
}

TABLES = tuple(DDL)


def ddl(db: str = "") -> list[str]:
    """The CREATE statements, optionally qualified with a database name."""
    prefix = f"{db}." if db else ""
    return [s.format(db=prefix).strip() for s in DDL.values()]


def upgrades(existing: dict[str, set[str]]) -> list[str]:
    """ALTER statements that add the `ADDED_COLUMNS` missing from tables made by an older release.

    `existing`: table -> its column names now (from `system.columns`); a table not in it is left alone.
    """
    return [f"ALTER TABLE {table} ADD COLUMN {name} {type_}" for table, cols in ADDED_COLUMNS.items()
            if table in existing for name, type_ in cols if name not in existing[table]]


# What the typed columns hold. The contract lets an event time be any finite number and a GPU index any 64-bit
# integer; a row keeps such a value exactly where a column can (`ts`, the JSON of the record), and pins or
# drops it where one cannot, so that no one record's value makes a whole insert fail.
DATETIME_MAX = 2**32 - 1  # DateTime: seconds from 1970 to 2106-02-07
UINT64_MAX = 2**64 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _num(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def _dt(ts: float) -> int:
    """An event time as a DateTime value: pinned to the range of the type."""
    return min(max(int(ts), 0), DATETIME_MAX)


def _version(ts: float) -> int:
    """The version of a ReplacingMergeTree row (UInt64): the event time in microseconds, pinned to the type."""
    return min(max(int(round(ts * 1e6)), 0), UINT64_MAX)


def _int32(x: int | None) -> int | None:
    return x if x is None or INT32_MIN <= x <= INT32_MAX else None


def finding_row(f: Finding) -> dict[str, Any]:
    return {"id": f.id, "ts": f.ts, "event_time": _dt(f.ts), "job": f.job, "type": f.type, "detector": f.detector,
            "rank": f.rank, "node": f.node or "", "gpu": _int32(f.gpu), "score": _num(f.score),
            "evidence": orjson.dumps(f.evidence, option=orjson.OPT_SORT_KEYS).decode()}


def job_row(f: Finding) -> dict[str, Any]:
    """A `job_state` finding: the job moved to `state`."""
    ev = f.evidence
    return {"id": f.id, "ts": f.ts, "event_time": _dt(f.ts), "job": f.job, "state": ev["state"],
            "previous": ev.get("previous") or "", "cause": ev.get("cause", ""),
            "ended_ranks": int(ev.get("ended_ranks", 0)), "job_ranks": int(ev.get("job_ranks", 0))}


def action_row(a: Action) -> dict[str, Any]:
    return {"id": a.id, "ts": a.ts, "event_time": _dt(a.ts), "job": a.job, "incident": a.incident, "type": a.type,
            "nodes": list(a.nodes), "reason": a.reason, "evidence": list(a.evidence), "path": a.path or "",
            "shadow": int(bool(a.extra.get("shadow"))), "verdict": str(a.extra.get("verdict") or "")}


def incident_row(i: Incident) -> dict[str, Any]:
    stages = list(i.stage_s.items())  # in the order of the stages (detect, localize, decide, ..., total)
    return {"id": i.id, "ts": i.ts, "event_time": _dt(i.ts), "version": _version(i.ts), "job": i.job,
            "class": i.cls, "planned": int(i.planned), "onset_ts": i.onset_ts, "detected_ts": i.detected_ts,
            "localized_ts": i.localized_ts, "decided_ts": i.decided_ts, "recovered_ts": i.recovered_ts,
            "culprit_nodes": list(i.culprit_nodes), "evicted_nodes": list(i.evicted_nodes), "path": i.path or "",
            "stage_names": [k for k, _ in stages], "stage_seconds": [float(v) for _, v in stages],
            "over_budget": list(i.over_budget)}


def telemetry_row(r: Record) -> dict[str, Any]:
    """A raw input record: common columns pulled out, the whole record kept as JSON in `payload`."""
    get = r.__class__.__dataclass_fields__.__contains__
    val = (lambda name: getattr(r, name) if get(name) else None)  # noqa: E731
    return {"ts": r.ts, "event_time": _dt(r.ts), "kind": r.kind, "job": val("job") or "", "node": val("node") or "",
            "rank": val("rank"), "step": val("step"), "step_s": _num(val("step_s")),
            "compute_s": _num(val("compute_s")), "comm_wait_s": _num(val("comm_wait_s")),
            "data_wait_s": _num(val("data_wait_s")), "loss": _num(val("loss")), "grad_norm": _num(val("grad_norm")),
            "payload": orjson.dumps(to_dict(r)).decode()}


def profile_row(p: ProfileSnapshot) -> dict[str, Any]:
    """A node-profile snapshot; the latest per node wins."""
    return {**p.to_dict(), "event_time": _dt(p.ts), "version": _version(p.ts),
            "repeat_offender": int(p.repeat_offender)}


def rejected_row(d: DeadLetter) -> dict[str, Any]:
    """A dead letter, field for field (rows of older releases hold `FILE:LINE` or `TOPIC[P]:OFFSET` in `source`)."""
    ts = max(d.ts or 0.0, 0.0)
    return {"event_time": _dt(ts), "source": d.source, "reason": d.reason, "field": d.field, "kind": d.kind or "",
            "raw": d.raw, "ts": ts, "batch_index": d.index, "line": d.line, "topic": d.topic or "",
            "partition": d.partition, "offset": d.offset}


ROW_OF: dict[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "finding": ("gw_findings", finding_row),
    "action": ("gw_actions", action_row),
    "incident": ("gw_incidents", incident_row),
}
