"""End to end through `gangwatch replay`: a silent node, a corrupted file, determinism."""

from __future__ import annotations

import gzip

import orjson
import pytest

from gangwatch.cli import main

pytestmark = pytest.mark.fault

T0 = 1_700_000_000.0


def write_stream(path, *, dead_node="n001", dead_at=60.0, corrupt=False, hb=5.0, nodes=3, per_node=4):
    recs = [{"kind": "job", "v": 1, "ts": T0, "job": "j1", "heartbeat_s": hb,
             "ranks": [{"rank": n * per_node + g, "node": f"n{n:03d}", "gpu": g}
                       for n in range(nodes) for g in range(per_node)]}]
    for k in range(1, 40):
        items = []
        for r in range(nodes * per_node):
            ts = T0 + k * hb + r * 0.05
            if f"n{r // per_node:03d}" == dead_node and ts >= T0 + dead_at:
                continue
            items.append({"kind": "heartbeat", "v": 1, "ts": ts, "job": "j1", "rank": r, "step": k})
        recs.append({"kind": "batch", "v": 1, "ts": items[0]["ts"], "items": items})
    lines = [orjson.dumps(r) for r in recs]
    if corrupt:
        lines.insert(3, b'{"kind":"heartbeat","v":1,"ts":1700000010.0,"job":"j1","rank":"two"}')
        lines.insert(7, b"\x00\x01 not json")
        lines.insert(9, b'{"kind":"heartbeat","v":7,"ts":1700000010.0,"job":"j1","rank":2}')
    data = b"\n".join(lines) + b"\n"
    path.write_bytes(gzip.compress(data, mtime=0) if path.suffix == ".gz" else data)
    return path


def read(path):
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_silent_node_becomes_fail_stop_within_three_periods(tmp_path):
    src = write_stream(tmp_path / "run.jsonl.gz")
    assert main(["replay", str(src), "--out", str(tmp_path / "out"), "-q"]) == 0
    findings = read(tmp_path / "out" / "findings.jsonl")
    assert [(f["type"], f["node"]) for f in findings] == [("fail_stop", "n001")]
    assert findings[0]["ts"] - (T0 + 60.0) <= 3 * 5.0
    actions = read(tmp_path / "out" / "actions.jsonl")
    assert actions and actions[0]["nodes"] == ["n001"]
    [inc] = read(tmp_path / "out" / "incidents.jsonl")
    assert inc["class"] == "fail_stop" and inc["culprit_nodes"] == ["n001"]


def test_corrupted_lines_go_to_rejected_with_reason(tmp_path):
    src = write_stream(tmp_path / "bad.jsonl", corrupt=True)
    assert main(["replay", str(src), "--out", str(tmp_path / "out"), "-q", "--no-store"]) == 0
    rejected = read(tmp_path / "out" / "rejected.jsonl")
    assert [(r["line"], r["field"]) for r in rejected] == [(4, "rank"), (8, ""), (10, "v")]
    assert all(r["reason"] and r["source"].endswith("bad.jsonl") for r in rejected)
    # the good lines still ran: the node loss is still found
    assert [f["node"] for f in read(tmp_path / "out" / "findings.jsonl")] == ["n001"]


def test_same_input_gives_byte_identical_outputs(tmp_path):
    src = write_stream(tmp_path / "run.jsonl", corrupt=True)
    for out in ("a", "b"):
        assert main(["replay", str(src), "--out", str(tmp_path / out), "-q", "--no-store"]) == 0
    for name in ("findings.jsonl", "actions.jsonl", "incidents.jsonl", "rejected.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_store_holds_the_findings(tmp_path):
    from gangwatch.sinks.store import ChdbStore

    src = write_stream(tmp_path / "run.jsonl")
    assert main(["replay", str(src), "--out", str(tmp_path / "out"), "-q"]) == 0
    store = ChdbStore(tmp_path / "out" / "store")
    rows = store.query("SELECT type, node FROM gw_findings FINAL")
    store.close()
    assert rows == [{"type": "fail_stop", "node": "n001"}]


def test_missing_file_is_a_clear_error(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]) == 3
    assert "no such file" in capsys.readouterr().err
