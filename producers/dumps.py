"""Turn a directory of per-rank dumps (py-spy text, PyTorch flight-recorder pickles) into contract records.

A stack or flight sweep of a hung job is usually a folder with one file per rank
(`dump_rank5.txt`, `rank3.pkl`, ...). `gangwatch ingest` makes a replayable
stream of it: one `job` record (the topology: each rank on its own node unless
told `gpus_per_node`) and one `stack` / `flight` record per rank, all in one
snapshot, at a fixed event time so the output is the same every run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from producers.flight import load_dump, to_flight_record

_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
DEFAULT_TS = 1_700_000_000.0


def rank_files(directory: Path, suffixes: tuple[str, ...]) -> dict[int, Path]:
    """Files of `directory` whose name carries a rank number (`rank3.pkl`, `dump_rank5.txt`), by rank."""
    found: dict[int, Path] = {}
    for path in sorted(directory.iterdir()):
        m = _RANK.search(path.name)
        if m and path.suffix in suffixes and path.is_file():
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


def _check_dense(files: dict[int, Path]) -> int:
    n = max(files) + 1
    missing = sorted(set(range(n)) - set(files))
    if missing:
        raise ValueError(f"ranks {missing} have no dump; a sweep needs every rank 0..{n - 1}")
    return n


def pyspy_records(directory: Path, *, job: str = "job", gpus_per_node: int = 1, ts: float = DEFAULT_TS,
                  snapshot: str = "s-0001") -> list[dict[str, Any]]:
    """`job` + one `stack` record (format py-spy) per `*rank<N>*.txt` file."""
    files = rank_files(directory, (".txt",))
    n = _check_dense(files)
    recs = [job_record(job, n, gpus_per_node, ts)]
    for rank, path in sorted(files.items()):
        recs.append({"kind": "stack", "v": 1, "ts": ts + 1.0, "job": job, "rank": rank, "snapshot": snapshot,
                     "format": "py-spy", "dump": path.read_text(errors="replace")})
    return recs


def flight_records(directory: Path, *, job: str = "job", gpus_per_node: int = 1, ts: float = DEFAULT_TS,
                   snapshot: str = "s-0001") -> list[dict[str, Any]]:
    """`job` + one `flight` record per `*rank<N>*.pkl` flight-recorder dump (read with a restricted unpickler)."""
    files = rank_files(directory, (".pkl", ".pickle"))
    n = _check_dense(files)
    recs = [job_record(job, n, gpus_per_node, ts)]
    for rank, path in sorted(files.items()):
        recs.append(to_flight_record(load_dump(path), job=job, rank=rank, snapshot=snapshot, ts=ts + 1.0))
    return recs
