"""In-process runtime: replay JSONL(.gz) files through the pure core.

    gangwatch replay run.jsonl.gz --out out/

Records of several files are merged by event time (each file must be in
event-time order, as sidecars write them). Outputs go to `out/findings.jsonl`,
`out/actions.jsonl`, `out/incidents.jsonl`, bad lines to `out/rejected.jsonl`,
and the same rows into the embedded chDB store (`out/store` by default).
The same input gives byte-identical JSONL outputs.
"""

from __future__ import annotations

import gzip
import heapq
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Iterator

from schemas import DecodeError, Record, decode
from sinks.files import JsonlSink, rejected_obj
from sinks.store import Store
from sinks.tables import ROW_OF, rejected_row, telemetry_row
from triage.engine import Core, CoreConfig
from triage.outputs import Outputs

_STORE_BATCH = 5000


def open_text(path: Path) -> IO[bytes]:
    """Open a JSONL file, gunzipping when it is gzip (by magic bytes, not by name)."""
    fh = open(path, "rb")
    magic = fh.read(2)
    fh.seek(0)
    return gzip.GzipFile(fileobj=fh) if magic == b"\x1f\x8b" else fh


@dataclass
class Item:
    """One decoded part of one line: a record or an error, with where it came from."""

    ts: float
    source: str
    line: int
    value: Record | DecodeError


def read_file(path: Path) -> Iterator[Item]:
    """Decode every line of one file (batches unpacked); blank lines are skipped."""
    source = str(path)
    last_ts = float("-inf")
    with open_text(path) as fh:
        for n, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            for v in decode(raw):
                if isinstance(v, DecodeError):
                    yield Item(last_ts, source, n, v)  # keep errors in place, by the previous record's time
                else:
                    last_ts = v.ts
                    yield Item(v.ts, source, n, v)


def merged(paths: Iterable[Path]) -> Iterator[Item]:
    """Items of all files merged by event time (stable: file order breaks ties)."""
    return heapq.merge(*(read_file(p) for p in paths), key=lambda it: it.ts)


@dataclass
class Summary:
    records: int = 0
    rejected: int = 0
    findings: int = 0
    actions: int = 0
    incidents: int = 0
    first_ts: float | None = None
    last_ts: float | None = None
    wall_s: float = 0.0
    by_type: dict[str, int] = field(default_factory=dict)
    out_dir: str = ""

    def render(self) -> str:
        span = (self.last_ts - self.first_ts) if self.first_ts is not None and self.last_ts is not None else 0.0
        rate = self.records / self.wall_s if self.wall_s > 0 else 0.0
        lines = [
            f"replayed  {self.records:,} records ({span:,.0f} s of event time) in {self.wall_s:.2f} s"
            f" ({rate:,.0f} records/s)",
            f"rejected  {self.rejected:,}" + ("  -> rejected.jsonl" if self.rejected else ""),
            f"findings  {self.findings:,}" + "".join(f"\n  {k:<14} {v:,}" for k, v in sorted(self.by_type.items())),
            f"actions   {self.actions:,}",
            f"incidents {self.incidents:,} updates",
            f"outputs   {self.out_dir}",
        ]
        return "\n".join(lines)


class Replay:
    """Drives a `Core` over items and writes what it produces."""

    def __init__(self, out_dir: Path, store: Store | None = None, core: Core | None = None,
                 telemetry: bool = False) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.core = core or Core(CoreConfig())
        self.store = store
        self.telemetry = telemetry
        self.sinks = {k: JsonlSink(out_dir / f"{k}s.jsonl") for k in ("finding", "action", "incident")}
        self.rejected = JsonlSink(out_dir / "rejected.jsonl")
        self.summary = Summary(out_dir=str(out_dir))
        self._rows: dict[str, list[dict]] = {}

    def feed(self, item: Item) -> None:
        s = self.summary
        v = item.value
        if isinstance(v, DecodeError):
            self._reject(v, item)
            return
        s.records += 1
        if s.first_ts is None:
            s.first_ts = v.ts
        s.last_ts = v.ts if s.last_ts is None else max(s.last_ts, v.ts)
        if self.telemetry:
            self._row("gw_telemetry", telemetry_row(v))
        out = self.core.process(v)
        if out:
            self._emit(out, item)

    def _reject(self, err: DecodeError, item: Item) -> None:
        self.summary.rejected += 1
        self.rejected.write_obj(rejected_obj(err, item.source, item.line))
        self._row("gw_rejected", rejected_row(err, f"{item.source}:{item.line}", max(item.ts, 0.0)))

    def _emit(self, out: Outputs, item: Item | None) -> None:
        s = self.summary
        for rec in [*out.findings, *out.actions, *out.incidents]:
            self.sinks[rec.kind].write(rec)
            table, row = ROW_OF[rec.kind]
            self._row(table, row(rec))
        for f in out.findings:
            s.by_type[f.type] = s.by_type.get(f.type, 0) + 1
        s.findings += len(out.findings)
        s.actions += len(out.actions)
        s.incidents += len(out.incidents)
        for err in out.rejected:
            self._reject(err, item or Item(0.0, "core", 0, err))

    def _row(self, table: str, row: dict) -> None:
        if self.store is None:
            return
        rows = self._rows.setdefault(table, [])
        rows.append(row)
        if len(rows) >= _STORE_BATCH:
            self.store.insert(table, rows)
            self._rows[table] = []

    def close(self) -> Summary:
        self._emit(self.core.finish(), None)
        for table, rows in self._rows.items():
            if rows and self.store is not None:
                self.store.insert(table, rows)
        self._rows.clear()
        for sink in [*self.sinks.values(), self.rejected]:
            sink.close()
        return self.summary


def run(paths: list[Path], out_dir: Path, store: Store | None, *, telemetry: bool = False,
        progress: bool | None = None, core: Core | None = None) -> Summary:
    """Replay `paths` into `out_dir` (and `store`); returns the summary."""
    if progress is None:
        progress = sys.stderr.isatty()
    if store is not None:
        store.create_tables()
    rep = Replay(out_dir, store, core, telemetry)
    started = time.monotonic()
    next_print = started
    for item in merged(paths):
        rep.feed(item)
        if progress and rep.summary.records % 4096 == 0 and time.monotonic() >= next_print:
            next_print = time.monotonic() + 0.2
            _progress(rep.summary, time.monotonic() - started)
    summary = rep.close()
    summary.wall_s = time.monotonic() - started
    if progress:
        sys.stderr.write("\r\x1b[2K")
    return summary


def _progress(s: Summary, elapsed: float) -> None:
    rate = s.records / elapsed if elapsed > 0 else 0.0
    sys.stderr.write(f"\r\x1b[2Kreplaying: {s.records:,} records ({rate:,.0f}/s), {s.findings} findings, "
                     f"{s.actions} actions, {s.rejected} rejected")
    sys.stderr.flush()
