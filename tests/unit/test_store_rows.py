"""Rows of the store's tables: a value the contract allows never overflows a typed column (issue 24), and
incident stages keep their order."""

from __future__ import annotations

import orjson
import pytest
from gangwatch.schemas import DeadLetter, DecodeError, decode
from gangwatch.sinks.store import ChdbStore
from gangwatch.sinks.tables import DATETIME_MAX, ROW_OF, UINT64_MAX, incident_row, rejected_row

from tests.contract.samples import SAMPLES

pytestmark = pytest.mark.unit

STAGES = {"detect": 4.1, "localize": 0.5, "decide": 2.0, "replace": 30.0, "rollback": 60.0, "comm_rebuild": 9.0,
          "total": 105.6}  # in the order triage.incident.Timeline.stages() gives them


def _decoded(kind: str, **fields):
    return decode(orjson.dumps({**SAMPLES[kind], **fields}))[0]


@pytest.mark.parametrize("ts", [1.1805916207174113e21, -5.0e9, 0.5])
def test_event_times_and_versions_are_pinned_to_their_column_types(ts):
    rows = {kind: ROW_OF[kind][1](_decoded(kind, ts=ts)) for kind in ("finding", "action", "incident")}
    dead = rejected_row(DeadLetter.of(DecodeError("bad", raw="x"), "f.jsonl", line=3, ts=ts))
    for row in (*rows.values(), dead):
        assert 0 <= row["event_time"] <= DATETIME_MAX
    assert 0 <= rows["incident"]["version"] <= UINT64_MAX
    assert rows["finding"]["ts"] == ts  # the exact event time stays in `ts`


def test_a_gpu_index_beyond_int32_is_left_out_of_the_column():
    row = ROW_OF["finding"][1](_decoded("finding", gpu=2**40))
    assert row["gpu"] is None and ROW_OF["finding"][1](_decoded("finding", gpu=7))["gpu"] == 7


def test_stage_names_keep_the_stage_order():
    row = incident_row(_decoded("incident", stage_s=STAGES))
    assert row["stage_names"] == list(STAGES) and row["stage_seconds"] == list(STAGES.values())


def test_extreme_rows_insert_into_chdb(tmp_path):
    store = ChdbStore(tmp_path / "store")
    try:
        store.create_tables()
        for kind, extra in (("finding", {"gpu": 2**40}), ("incident", {"stage_s": STAGES}), ("action", {})):
            table, row = ROW_OF[kind]
            store.insert(table, [row(_decoded(kind, ts=1.1805916207174113e21, **extra))])
        store.insert("gw_rejected", [rejected_row(DeadLetter.of(DecodeError("bad"), "f", ts=1.18e21))])
        [inc] = store.query("SELECT stage_names, version, toUInt32(event_time) AS t FROM gw_incidents")
        assert inc == {"stage_names": list(STAGES), "version": UINT64_MAX, "t": DATETIME_MAX}
        assert store.query("SELECT gpu, ts FROM gw_findings") == [{"gpu": None, "ts": 1.1805916207174113e21}]
    finally:
        store.close()


# --- the decoder: one line, one error, the line kept -------------------------------------------------------


@pytest.mark.parametrize("line", [
    b'{"kind":"step","v":1,"ts":1.0,"job":"j","rank":0,"step":1' + b"0" * 400 + b',"step_s":1.0,"loss":NaN}',
    b'{"kind":"step","v":1,"ts":1.0,"job":"j","rank":' + b"[" * 1000 + b"]" * 1000 + b',"step":1,"step_s":1.0}',
    b'{"kind":"step","v":1,"ts":1.0,"job":"j","rank":0,"step":1180591620717411303424,"step_s":1.0}',
    b'{"kind":"heartbeat","v":1,"ts":1.0,"job":"j","rank":-1,"loss":NaN}',
])
def test_a_bad_line_is_one_error_that_keeps_the_line(line):
    [err] = decode(line)
    assert isinstance(err, DecodeError) and err.reason and err.raw == line.decode()
