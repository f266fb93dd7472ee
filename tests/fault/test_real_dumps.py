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


def test_pyspy_dataloader_hang_names_rank_5(tmp_path, real_data):
    findings, actions, incidents = _replay(tmp_path, "pyspy", real_data / "pyspy" / "dataloader-hang-8ranks")
    assert [(f["type"], f["rank"], f["node"]) for f in findings] == [("stack_outlier", 5, "n005")]
    assert [(a["type"], a["nodes"]) for a in actions] == [("replace", ["n005"])]
    assert incidents[-1]["class"] == "hang" and incidents[-1]["culprit_nodes"] == ["n005"]


def test_flight_recorder_gloo_hang_names_rank_3(tmp_path, real_data):
    findings, actions, _ = _replay(tmp_path, "flight", real_data / "flight-recorder" / "gloo-dataloader-hang-4ranks")
    assert [(f["type"], f["rank"], f["evidence"]["reason"]) for f in findings] == [
        ("stack_outlier", 3, "never_enqueued")]
    assert [(a["type"], a["nodes"]) for a in actions] == [("replace", ["n003"])]


def test_ingest_rejects_a_folder_without_rank_files(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["ingest", "pyspy", str(tmp_path)]) == 3
    assert "no per-rank files" in capsys.readouterr().err


def test_ingest_kmsg_turns_a_real_kernel_log_into_hw_records(tmp_path, real_data):
    out = tmp_path / "hw.jsonl"
    assert main(["ingest", "kmsg", str(real_data / "kmsg" / "h100-xid119.log"), "--node", "n001",
                 "--gpu-of", "0000:9b:00=4", "--out", str(out)]) == 0
    recs = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [(r["kind"], r["code"], r["gpu"], r["pci"]) for r in recs] == [("hw", 119, 4, "0000:9b:00")] * 5
    assert [r["process"] for r in recs][:3] == ["nvidia-smi"] * 3  # what the parser found travels along
    from gangwatch.schemas import DecodeError, decode

    assert not any(isinstance(d, DecodeError) for r in recs for d in decode(orjson.dumps(r)))


def test_ingest_kmsg_of_a_benign_log_writes_nothing(tmp_path, real_data):
    out = tmp_path / "hw.jsonl"
    assert main(["ingest", "kmsg", str(real_data / "kmsg" / "benign-kmsg.log"), "--out", str(out)]) == 0
    assert out.read_bytes() == b""


def test_a_sweep_missing_a_rank_is_analysed_with_the_dumps_there_are(tmp_path, real_data, capsys):
    """py-spy could not dump rank 2 (a process stuck in the kernel, a dead node): the other seven still name
    rank 5, whatever the files are called (`.log` here); the gap is said in one line."""
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    for src in (real_data / "pyspy" / "dataloader-hang-8ranks").glob("dump_rank*.txt"):
        if src.stem != "dump_rank2":
            (sweep / f"{src.stem}.log").write_bytes(src.read_bytes())
    findings, actions, _ = _replay(tmp_path, "pyspy", sweep)
    assert [(f["type"], f["rank"]) for f in findings] == [("stack_outlier", 5)]
    assert [(a["type"], a["nodes"]) for a in actions] == [("replace", ["n005"])]
    assert "no dump of rank(s) 2 of 8" in capsys.readouterr().err


def test_flight_dumps_under_pytorchs_own_names_read_like_any_other(tmp_path, real_data):
    """PyTorch writes `${TORCH_NCCL_DEBUG_INFO_TEMP_FILE}<rank>`, by default `/tmp/nccl_trace_rank_<rank>`: no
    suffix."""
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for src in (real_data / "flight-recorder" / "gloo-dataloader-hang-4ranks").glob("rank*.pkl"):
        (dumps / f"nccl_trace_rank_{src.stem.removeprefix('rank')}").write_bytes(src.read_bytes())
    findings, actions, _ = _replay(tmp_path, "flight", dumps)
    assert [(f["type"], f["rank"]) for f in findings] == [("stack_outlier", 3)]
    assert [(a["type"], a["nodes"]) for a in actions] == [("replace", ["n003"])]


def test_ranks_says_how_big_the_job_is_when_the_last_ranks_left_no_dump(tmp_path, real_data, capsys):
    folder = real_data / "pyspy" / "dataloader-hang-8ranks"
    out = tmp_path / "s.jsonl"
    assert main(["ingest", "pyspy", str(folder), "--ranks", "10", "--out", str(out)]) == 0
    recs = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert len(recs[0]["ranks"]) == 10 and len(recs) == 9
    assert "no dump of rank(s) 8, 9 of 10" in capsys.readouterr().err
    assert main(["ingest", "pyspy", str(folder), "--ranks", "4"]) == 3
    assert "dumps of ranks [4, 5, 6, 7] but the job has 4 ranks" in capsys.readouterr().err


def test_a_sweep_of_py_spy_json_dumps_reads_like_the_text_ones(tmp_path, real_data):
    """`py-spy dump --json` (py-spy's StackTrace list) of the same sweep, made from the text dumps here: the same
    culprit. A JSON file that is no trace list is refused with the reason."""
    from gangwatch.detectors.stacks import parse_pyspy

    sweep = tmp_path / "json"
    sweep.mkdir()
    for src in (real_data / "pyspy" / "dataloader-hang-8ranks").glob("dump_rank*.txt"):
        traces = [{"pid": t.pid or 1, "thread_id": 140000000000 + i, "os_thread_id": int(t.thread),
                   "thread_name": t.name, "active": t.state != "idle", "owns_gil": False,
                   "frames": [{"name": f.func, "filename": f"/opt/{f.file}", "short_filename": f.file,
                               "line": f.line or 0, "module": None, "locals": None} for f in t.frames]}
                  for i, t in enumerate(parse_pyspy(src.read_text()))]
        (sweep / f"{src.stem}.txt").write_text(orjson.dumps(traces).decode())
    findings, actions, _ = _replay(tmp_path, "pyspy", sweep)
    assert [(f["type"], f["rank"]) for f in findings] == [("stack_outlier", 5)]
    assert [(a["type"], a["nodes"]) for a in actions] == [("replace", ["n005"])]
    (sweep / "dump_rank0.txt").write_text('[{"frames": 3}]')
    assert main(["ingest", "pyspy", str(sweep)]) == 3


def test_flight_dumps_written_as_json_read_like_the_pickles(tmp_path, real_data):
    """PyTorch can write the flight recorder as JSON (`_dump_nccl_trace_json`): the same dict, the same culprit."""
    from gangwatch.producers.flight import load_dump

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    for src in (real_data / "flight-recorder" / "gloo-dataloader-hang-4ranks").glob("rank*.pkl"):
        (dumps / f"nccl_trace_{src.stem}.json").write_bytes(orjson.dumps(load_dump(src), default=str))
    findings, actions, _ = _replay(tmp_path, "flight", dumps)
    assert [(f["type"], f["rank"]) for f in findings] == [("stack_outlier", 3)]
    assert [(a["type"], a["nodes"]) for a in actions] == [("replace", ["n003"])]


def test_a_folder_of_kernel_logs_is_one_job_over_their_nodes(tmp_path, real_data):
    """dmesg of three nodes, each file named after its node: one job record over the three, each node's events
    on it; the Xid 79 node is the one replaced, the benign node untouched."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "gpu-a.log").write_bytes((real_data / "kmsg" / "benign-kmsg.log").read_bytes())
    (logs / "gpu-b.log").write_text("[ 100.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n")
    (logs / "gpu-c.log").write_bytes((real_data / "kmsg" / "benign-kmsg.log").read_bytes())
    out = tmp_path / "hw.jsonl"
    assert main(["ingest", "kmsg", str(logs), "--job", "j", "--gpus-per-node", "2", "--gpu-of", "0000:3B:00.0=1",
                 "--out", str(out)]) == 0
    recs = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert [r["node"] for r in recs[0]["ranks"]] == ["gpu-a", "gpu-a", "gpu-b", "gpu-b", "gpu-c", "gpu-c"]
    assert [(r["node"], r["code"], r["gpu"]) for r in recs[1:]] == [("gpu-b", 79, 1)]
    assert main(["replay", str(out), "--out", str(tmp_path / "out"), "-q", "--no-store"]) == 0
    actions = [orjson.loads(x) for x in (tmp_path / "out" / "actions.jsonl").read_bytes().splitlines()]
    assert [(a["type"], a["nodes"]) for a in actions] == [("replace", ["gpu-b"])]


NVRX_TRUTH = {"gpu_error_1st": [12, 14], "gpu_error_2nd": [9, 14], "lock_gil_1st": [9, 14], "lock_gil_2nd": [10, 15]}


@pytest.mark.parametrize("scenario", sorted(NVRX_TRUTH))
def test_nvidia_real_hangs_name_exactly_the_faulty_nodes(tmp_path, real_data, scenario):
    """NVIDIA's four real 16-rank sweeps (two injected faults each), as pickles through `ingest flight` and as the
    held-out evaluation frames them (`<scenario>.jsonl.gz`): the faulty ranks' nodes are replaced, no peer's."""
    truth = NVRX_TRUTH[scenario]
    root = real_data / "flight-recorder" / "nvrx"
    assert (root / scenario / "fault_injection.log").read_text().startswith(f"Fault ranks: {truth}")
    (tmp_path / "ingested").mkdir()
    findings, actions, incidents = _replay(tmp_path / "ingested", "flight", root / scenario)
    flight = [f for f in findings if f["type"] == "stack_outlier"]
    assert [(f["rank"], f["node"]) for f in flight] == [(r, f"n{r:03d}") for r in truth]
    assert [(a["type"], a["nodes"]) for a in actions if a["type"] == "replace"] == [
        ("replace", [f"n{r:03d}" for r in truth])]
    assert incidents[-1]["class"] == "hang" and incidents[-1]["culprit_nodes"] == [f"n{r:03d}" for r in truth]
    out = tmp_path / "framed"
    assert main(["replay", str(root / f"{scenario}.jsonl.gz"), "--out", str(out), "-q", "--no-store"]) == 0
    read = lambda name: [orjson.loads(x) for x in (out / name).read_bytes().splitlines()]  # noqa: E731
    nodes = [f"node-{r:03d}" for r in truth]
    assert [f["node"] for f in read("findings.jsonl") if f["type"] == "stack_outlier"] == nodes
    assert [a["nodes"] for a in read("actions.jsonl") if a["type"] == "replace"] == [nodes]
    assert read("incidents.jsonl")[-1]["culprit_nodes"] == nodes
