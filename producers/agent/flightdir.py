"""New PyTorch flight-recorder dumps in a directory become `flight` records.

PyTorch writes a rank's dump (on a collective timeout with
`TORCH_NCCL_DUMP_ON_TIMEOUT=1`, or when asked) to the path in
`TORCH_FR_DUMP_TEMP_FILE` followed by the rank: `/var/fr/nccl_trace_rank_3`. It
writes the file in place, so a dump is read only once it has not changed for
`settle_s` (its modification time says so), and again if it is rewritten later.
Dumps already there when the agent starts are old ones and are left alone,
unless `from_start`.

Whose dump is it? Looked up when the file is first seen, while the process
that wrote it is most likely still alive (a job that timed out is often torn
down seconds later): the local rank whose `TORCH_FR_DUMP_TEMP_FILE` + rank is
exactly this path, else the one local job with a rank of the number that ends
the file name. A dump no rank can be found for is skipped, with a line in the log.

The snapshot id: every rank's dump of one hang must share one, or the flight
detector cannot compare them. Agents cannot agree on one without talking, so
they use what they all see: the id of the job's latest `collect_stacks` action,
when one arrived in the last minutes (the flight records then join the stack
sweep), else the minute the dump was written (`fr-<epoch seconds of the minute>`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gangwatch.producers.agent.procs import RankProcess
from gangwatch.producers.flight import FlightDumpError, UnsafePickleError, load_dump, to_flight_record

log = logging.getLogger("gangwatch.agent")
_RANK_AT_END = re.compile(r"(\d+)(?:\.pkl|\.pickle)?$")

Signature = tuple[int, int]  # (size, mtime in ns): a file with a new signature was rewritten
Owner = tuple[str, int]  # (job, rank) of the process that wrote a dump


class FlightWatcher:
    """The flight-recorder collector: scans `directory` every `every_s`."""

    name = "flight-recorder dumps"

    def __init__(self, directory: Path, *, processes: Callable[[], list[RankProcess]],
                 sweep_of: Callable[[str, float], str | None] = lambda job, now: None, every_s: float = 2.0,
                 settle_s: float = 2.0, from_start: bool = False) -> None:
        self.directory, self.every_s, self.settle_s = Path(directory), every_s, settle_s
        self._processes, self._sweep_of = processes, sweep_of
        self._done: dict[Path, Signature] = {}  # files published (or found unusable), as they were then
        self._pending: dict[Path, tuple[Signature, Owner | None]] = {}  # new versions not settled yet, and writer
        if not from_start:
            self._done = dict(self._scan())
        if not self.directory.is_dir():
            log.info("flight-recorder directory %s does not exist yet; watching for it", self.directory)

    def _scan(self) -> list[tuple[Path, Signature]]:
        try:
            paths = sorted(self.directory.iterdir())
        except OSError:  # not there (yet)
            return []
        found = []
        for path in paths:
            try:
                st = path.stat()
            except OSError:
                continue
            if path.is_file():
                found.append((path, (st.st_size, st.st_mtime_ns)))
        return found

    def poll(self, now: float) -> list[dict[str, Any]]:
        """`flight` records of the dumps that are new and complete; `now` is the wall-clock time."""
        recs = []
        present = self._scan()
        for path, sig in present:
            if self._done.get(path) == sig:
                continue
            seen = self._pending.get(path)
            if seen is None or seen[0] != sig:  # a new version: look its writer up while it is alive
                self._pending[path] = (sig, self._writer(path) or (seen[1] if seen else None))
            if now - sig[1] / 1e9 < self.settle_s:
                continue  # written moments ago: maybe still being written
            self._done[path] = sig
            rec = self._record(path, sig, self._pending.pop(path)[1], now)
            if rec is not None:
                recs.append(rec)
        names = {path for path, _ in present}  # forget files that were deleted
        self._done = {p: s for p, s in self._done.items() if p in names}
        self._pending = {p: v for p, v in self._pending.items() if p in names}
        return recs

    def _writer(self, path: Path) -> Owner | None:
        procs = self._processes()
        for p in procs:
            if p.fr_prefix and Path(p.fr_prefix + str(p.rank)).resolve() == path.resolve():
                return p.job, p.rank
        m = _RANK_AT_END.search(path.name)
        if m is None:
            return None
        rank = int(m.group(1))
        jobs = {p.job for p in procs if p.rank == rank}
        return (jobs.pop(), rank) if len(jobs) == 1 else None

    def _record(self, path: Path, sig: Signature, owner: Owner | None, now: float) -> dict[str, Any] | None:
        if owner is None:
            log.warning("flight-recorder dump %s skipped: no rank here has TORCH_FR_DUMP_TEMP_FILE + rank = this "
                        "path, and the rank number ending its name is not that of a single local job", path)
            return None
        job, rank = owner
        try:
            dump = load_dump(path)
        except (FlightDumpError, UnsafePickleError, OSError) as e:
            log.warning("flight-recorder dump %s (rank %d of job %s) not read: %s", path, rank, job, e)
            return None
        written = sig[1] / 1e9
        snapshot = self._sweep_of(job, now) or f"fr-{int(written // 60) * 60}"
        log.info("flight-recorder dump of rank %d of job %s (snapshot %s)", rank, job, snapshot)
        return to_flight_record(dump, job=job, rank=rank, snapshot=snapshot, ts=written)

    def close(self) -> None:
        """Nothing held open."""
