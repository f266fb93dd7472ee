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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gangwatch.schemas import DecodeError, Record, decode
from gangwatch.sinks.base import Sink
from gangwatch.sinks.files import JsonlSink
from gangwatch.sinks.store import Store
from gangwatch.sinks.storesink import StoreSink
from gangwatch.triage.engine import Core, CoreConfig
from gangwatch.triage.outputs import Outputs


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
    """Drives a `Core` over items and hands what it produces to the sinks."""

    def __init__(self, sinks: list[Sink], core: Core | None = None) -> None:
        self.core = core or Core(CoreConfig())
        self.sinks = sinks
        self.summary = Summary()

    def feed(self, item: Item) -> None:
        s = self.summary
        v = item.value
        if isinstance(v, DecodeError):
            self._reject(v, item.source, item.line, item.ts)
            return
        s.records += 1
        if s.first_ts is None:
            s.first_ts = v.ts
        s.last_ts = v.ts if s.last_ts is None else max(s.last_ts, v.ts)
        for sink in self.sinks:
            sink.observe(v)
        out = self.core.process(v)
        if out:
            self._emit(out, item)

    def _reject(self, err: DecodeError, source: str, line: int | None, ts: float) -> None:
        self.summary.rejected += 1
        for sink in self.sinks:
            sink.reject(err, source, line, ts)

    def _emit(self, out: Outputs, item: Item | None) -> None:
        s = self.summary
        for f in out.findings:
            s.by_type[f.type] = s.by_type.get(f.type, 0) + 1
        s.findings += len(out.findings)
        s.actions += len(out.actions)
        s.incidents += len(out.incidents)
        for sink in self.sinks:
            sink.write(out)
        for err in out.rejected:
            if item is None:
                self._reject(err, "core", None, 0.0)
            else:
                self._reject(err, item.source, item.line, item.ts)

    def close(self) -> Summary:
        self._emit(self.core.finish(), None)
        for sink in self.sinks:
            sink.close()
        return self.summary


def run(paths: list[Path], out_dir: Path, store: Store | None, *, telemetry: bool = False,
        progress: bool | None = None, core: Core | None = None, sinks: list[Sink] | None = None) -> Summary:
    """Replay `paths` into `out_dir` (and `store`, and any further `sinks`); returns the summary."""
    if progress is None:
        progress = sys.stderr.isatty()
    sinks = [JsonlSink(out_dir), *(sinks or [])]
    if store is not None:
        sinks.append(StoreSink(store, telemetry=telemetry, max_delay_s=float("inf")))
    rep = Replay(sinks, core)
    rep.summary.out_dir = str(out_dir)
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
