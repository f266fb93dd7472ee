"""Turn what a node leaves behind (per-rank dumps, a kernel log) into contract records for replay.

A stack or flight sweep of a hung job is usually a folder with one file per rank
(`dump_rank5.txt`, `rank3.pkl`, PyTorch's own `nccl_trace_rank_3` without a
suffix, `trace_3`, ...). `gangwatch ingest` makes a replayable stream of it: one
`job` record (the topology: each rank on its own node unless told
`gpus_per_node`) and one `stack` / `flight` record per rank, all in one
snapshot, at a fixed event time so the output is the same every run.

A sweep may lack ranks: py-spy cannot dump a process stuck in the kernel, and a
dead node leaves nothing. The job then has `ranks` ranks (default: the highest
rank found + 1) and the sweep is analysed with the dumps there are (replay
closes a partial sweep at the end of its input); `missing_ranks` names the gaps.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from gangwatch.producers import flight
from gangwatch.producers.flight import load_dump, to_flight_record
from gangwatch.producers.kmsg import parse_lines, to_hw_record
from gangwatch.producers.nvml import bus_key

_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_TRAILING = re.compile(r"(?:^|[_.-])(\d+)$")  # `trace_3`, `stack-3`: the rank as the name's last number
_PYSPY_THREAD = re.compile(r"^Thread (0x[0-9a-fA-F]+|\d+) ", re.MULTILINE)
DEFAULT_TS = 1_700_000_000.0


def rank_files(directory: Path, suffixes: tuple[str, ...]) -> dict[int, Path]:
    """Files of `directory` with one of `suffixes` (or none, as PyTorch names its flight-recorder dumps) whose
    name carries a rank number (`rank3.pkl`, `dump_rank5.txt`, `nccl_trace_rank_3`, `trace_3`), by rank."""
    found: dict[int, Path] = {}
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") or not (path.suffix in suffixes or path.suffix == "") or not path.is_file():
            continue
        m = _RANK.search(path.name) or _TRAILING.search(path.stem)
        if m:
            rank = int(m.group(1))
            if rank in found:
                raise ValueError(f"two files for rank {rank}: {found[rank].name} and {path.name}")
            found[rank] = path
    if not found:
        raise ValueError(f"no per-rank files ({'/'.join(suffixes)} with 'rank<N>' in the name) in {directory}")
    return found


def job_record(job: str, ranks: int, gpus_per_node: int, ts: float, heartbeat_s: float = 5.0) -> dict[str, Any]:
    """A `job` record placing ranks 0..ranks-1 on nodes n000, n001, ... `gpus_per_node` at a time."""
    return {"kind": "job", "v": 1, "ts": ts, "job": job, "heartbeat_s": heartbeat_s,
            "ranks": [{"rank": r, "node": f"n{r // gpus_per_node:03d}", "gpu": r % gpus_per_node}
                      for r in range(ranks)]}


def _job_size(files: dict[int, Path], ranks: int | None) -> int:
    """The job's rank count: `ranks` when given (every file's rank must be below it), else the highest + 1."""
    if ranks is None:
        return max(files) + 1
    beyond = sorted(r for r in files if r >= ranks)
    if beyond:
        raise ValueError(f"dumps of ranks {beyond} but the job has {ranks} ranks (--ranks)")
    return ranks


def missing_ranks(recs: list[dict[str, Any]]) -> list[int]:
    """The ranks of the job record of `recs` that have no dump among them."""
    n = len(recs[0]["ranks"])
    return sorted(set(range(n)) - {r["rank"] for r in recs[1:]})


def pyspy_records(directory: Path, *, job: str = "job", gpus_per_node: int = 1, ts: float = DEFAULT_TS,
                  snapshot: str = "s-0001", ranks: int | None = None) -> list[dict[str, Any]]:
    """`job` + one `stack` record (format py-spy) per rank's file (`*rank<N>*.txt`, `.log`, `.out`)."""
    files = rank_files(directory, (".txt", ".log", ".out"))
    n = _job_size(files, ranks)
    recs = [job_record(job, n, gpus_per_node, ts)]
    for rank, path in sorted(files.items()):
        recs.append({"kind": "stack", "v": 1, "ts": ts + 1.0, "job": job, "rank": rank, "snapshot": snapshot,
                     "format": "py-spy", "dump": read_pyspy(path)})
    return recs


def read_text(path: Path, what: str, max_bytes: int | None = None) -> str:
    """The file as text, refusing binary data (NUL bytes or mostly undecodable bytes) with the reason.

    A file over `max_bytes` (default `flight.MAX_DUMP_BYTES`: 64 MiB, or `GANGWATCH_MAX_DUMP_BYTES`) is refused
    by its size on disk, before anything is read.
    """
    data = flight.read_bounded(path, flight.MAX_DUMP_BYTES if max_bytes is None else max_bytes)
    if b"\0" in data:
        raise ValueError(f"{path} is not {what}: it holds binary data (NUL bytes)")
    text = data.decode("utf-8", errors="replace")
    if text.count("\ufffd") > max(8, len(text) // 100):
        raise ValueError(f"{path} is not {what}: more than 1% of it is not UTF-8 text")
    return text


def pyspy_json_to_text(traces: list[dict[str, Any]]) -> str:
    """`py-spy dump --json` (a list of thread traces: pid, thread_id, os_thread_id, thread_name, active,
    owns_gil, frames of name/filename/short_filename/line) as the text `py-spy dump` prints, which the stack
    detector reads."""
    lines: list[str] = []
    pid = None
    for t in traces:
        if t.get("pid") is not None and t.get("pid") != pid:
            pid = t["pid"]
            info = t.get("process_info") or {}
            lines.append(f"Process {pid}: {info.get('command_line', '')}".rstrip())
        tid = t.get("os_thread_id") if t.get("os_thread_id") is not None else f"{int(t.get('thread_id') or 0):#X}"
        status = "idle" if not t.get("active", True) else "active+gil" if t.get("owns_gil") else "active"
        lines.append(f'Thread {tid} ({status}): "{t.get("thread_name") or ""}"')
        for f in t.get("frames") or ():
            lines.append(f"    {f.get('name', '?')} ({f.get('short_filename') or f.get('filename', '')}:"
                         f"{f.get('line', 0)})")
    return "\n".join(lines) + "\n"


def read_pyspy(path: Path) -> str:
    """The text of a `py-spy dump` (or of `py-spy dump --json`, turned into that text), refusing files that are
    neither (no `Thread <id> ...` header)."""
    text = read_text(path, "a py-spy dump")
    if text.lstrip().startswith("["):
        try:
            traces = json.loads(text)
            text = pyspy_json_to_text([t for t in traces if isinstance(t, dict)])
        except (ValueError, TypeError, AttributeError) as e:
            raise ValueError(f"{path} looks like `py-spy dump --json` output but does not read as one: {e}") from None
    if not _PYSPY_THREAD.search(text):
        raise ValueError(f"{path} is not a py-spy dump: no 'Thread <id> (...)' line, as `py-spy dump --pid P` "
                         "prints")
    return text


def flight_records(directory: Path, *, job: str = "job", gpus_per_node: int = 1, ts: float = DEFAULT_TS,
                   snapshot: str = "s-0001", ranks: int | None = None) -> list[dict[str, Any]]:
    """`job` + one `flight` record per rank's flight-recorder dump (`*rank<N>*.pkl`, or PyTorch's own
    `nccl_trace_rank_<N>` without a suffix), read with a restricted unpickler."""
    files = rank_files(directory, (".pkl", ".pickle", ".json"))
    n = _job_size(files, ranks)
    recs = [job_record(job, n, gpus_per_node, ts)]
    for rank, path in sorted(files.items()):
        recs.append(to_flight_record(load_dump(path), job=job, rank=rank, snapshot=snapshot, ts=ts + 1.0))
    return recs


def kmsg_records(path: Path, *, node: str, ts: float = DEFAULT_TS, gpu_of: dict[str, int] | None = None,
                 job: str | None = None, gpus_per_node: int = 8) -> list[dict[str, Any]]:
    """`hw` records of the GPU, ECC, NIC, PCIe and NVLink events in one node's kernel log (dmesg text).

    Kernel timestamps are not interpreted (monotonic ones need the boot time): the
    events keep their order, `ts` + 1 ms apart. `gpu_of` maps a PCI bus id as the
    log prints it (e.g. `0000:3b:00`) to the GPU index on the node. With `job`, a
    `job` record placing `gpus_per_node` ranks on `node` comes first, so that a
    replay of the file alone attributes the events.
    """
    return kmsg_folder_records({node: path}, ts=ts, gpu_of=gpu_of, job=job, gpus_per_node=gpus_per_node)


def kmsg_folder_records(logs: dict[str, Path], *, ts: float = DEFAULT_TS, gpu_of: dict[str, int] | None = None,
                        job: str | None = None, gpus_per_node: int = 8) -> list[dict[str, Any]]:
    """`kmsg_records` of several nodes' kernel logs (node name -> its log): with `job`, one `job` record placing
    `gpus_per_node` ranks on each node, in the order given; each log's events keep their order."""
    gpu_of = {bus_key(k): v for k, v in (gpu_of or {}).items()}
    recs: list[dict[str, Any]] = []
    if job:
        recs.append(job_record(job, gpus_per_node * len(logs), gpus_per_node, ts))
        for rank in recs[0]["ranks"]:
            rank["node"] = list(logs)[rank["rank"] // gpus_per_node]
    for node, path in logs.items():
        events = parse_lines(read_text(path, "a kernel log").splitlines())
        for i, ev in enumerate(events):
            gpu = gpu_of.get(bus_key(ev.pci)) if ev.pci else None
            recs.append(to_hw_record(ev, node=node, ts=ts + 1.0 + i * 1e-3, gpu=gpu))
    return recs
