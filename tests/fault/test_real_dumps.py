"""The real hung-job datasets localize their culprit through `gangwatch ingest` + `gangwatch replay`."""

from __future__ import annotations

import orjson
import pytest

from gangwatch.cli import main

pytestmark = pytest.mark.fault


def _replay(tmp_path, fmt, folder):
    sweep = tmp_path / "sweep.jsonl"
    assert main(["ingest", fmt, str(folder), "--out", str(sweep)]) == 0
    assert main(["replay", str(sweep), "--out", str(tmp_path / "out"), "-q", "--no-store"]) == 0
    read = lambda name: [orjson.loads(x) for x in (tmp_path / "out" / name).read_bytes().splitlines()]  # noqa: E731
    return read("findings.jsonl"), read("actions.jsonl"), read("incidents.jsonl")


def test_pyspy_dataloader_hang_names_rank_5(tmp_path, shared_data):
    findings, actions, incidents = _replay(tmp_path, "pyspy", shared_data / "pyspy" / "dataloader-hang-8ranks")
    assert [(f["type"], f["rank"], f["node"]) for f in findings] == [("stack_outlier", 5, "n005")]
    assert [(a["type"], a["nodes"]) for a in actions] == [("replace", ["n005"])]
    assert incidents[-1]["class"] == "hang" and incidents[-1]["culprit_nodes"] == ["n005"]


def test_flight_recorder_gloo_hang_names_rank_3(tmp_path, shared_data):
    findings, actions, _ = _replay(tmp_path, "flight", shared_data / "flight-recorder" / "gloo-dataloader-hang-4ranks")
    assert [(f["type"], f["rank"], f["evidence"]["reason"]) for f in findings] == [
        ("stack_outlier", 3, "never_enqueued")]
    assert [(a["type"], a["nodes"]) for a in actions] == [("replace", ["n003"])]


def test_ingest_rejects_a_folder_without_rank_files(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["ingest", "pyspy", str(tmp_path)]) == 2
    assert "no per-rank files" in capsys.readouterr().err
