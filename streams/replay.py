"""In-process runtime: replay JSONL(.gz) files through the pure core.

    gangwatch replay run.jsonl.gz --out out/

Records of several files are merged by event time (each file must be in
event-time order, as sidecars write them). Outputs go to `out/findings.jsonl`,
`out/actions.jsonl`, `out/incidents.jsonl`, bad lines to `out/rejected.jsonl`,
and the same rows into the embedded chDB store (`out/store` by default).
The same input gives byte-identical JSONL outputs.
"""

from __future__ import annotations

import dataclasses
import gzip
import heapq
import itertools
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gangwatch.schemas import Action, DeadLetter, DecodeError, Outputs, Record, codec, decode, encode
from gangwatch.schemas.codec import oversized
from gangwatch.schemas.columns import StepRows
from gangwatch.sinks.files import JsonlSink
from gangwatch.sinks.interface import Sink
from gangwatch.sinks.store import Store
from gangwatch.sinks.storesink import StoreSink
from gangwatch.triage.budgets import CoreConfig
from gangwatch.triage.core import JOB_KEYED, RUN_KINDS, Core

_CHUNK = 4096  # items fed at once: runs of records within them go through the core together


def _gunzipped(raw: IO[bytes]) -> IO[bytes]:
    """`raw` itself, or a gunzipping reader over it when it starts with gzip's magic bytes (not by name)."""
    magic = raw.read(2)
    raw.seek(0)
    return gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw


def open_text(path: Path) -> IO[bytes]:
    """Open a JSONL file, gunzipping when it is gzip."""
    return _gunzipped(open(path, "rb"))


_HEAD_KEEP = 16 * 1024  # bytes of an oversized line kept for its dead letter (DeadLetter keeps 4 KiB of text)


_BLOCK = 1 << 20  # bytes read at a time


def bounded_lines(fh: IO[bytes], limit: int) -> Iterator[tuple[bytes, int]]:
    """(line without its newline, its length) for each line of `fh`, never holding more than `limit` bytes of
    one line (plus one block read): a longer line comes as (its first bytes, its full length) and the rest of
    it is read and dropped, up to the next newline. Blocks come from `read1` (one read of the underlying file
    or gzip stream each): a file cut short raises after every line that was whole before the cut."""
    read = getattr(fh, "read1", fh.read)
    keep = min(limit + 1, _HEAD_KEEP)  # what of a line over the limit is kept (as reading limit + 1 bytes would)
    carry = b""
    skipping: tuple[bytes, int] | None = None  # (head, length so far) of a line over the limit
    while True:
        block = read(_BLOCK)
        if skipping is not None:
            if not block:
                yield skipping
                return
            nl = block.find(b"\n")
            if nl < 0:
                skipping = (skipping[0], skipping[1] + len(block))
                continue
            yield skipping[0], skipping[1] + nl
            skipping, block = None, block[nl + 1:]
            if not block:
                continue
        elif not block:
            if carry:  # the last line, without a newline
                yield carry, len(carry)
            return
        lines = (carry + block if carry else block).split(b"\n")
        carry = lines.pop()
        for line in lines:
            n = len(line)
            yield (line if n <= limit else line[:keep]), n
        if len(carry) > limit:
            skipping, carry = (carry[:keep], len(carry)), b""


class InputFile:
    """One input file, read line by line; remembers how far it got and why it stopped early, if it did.

    A line longer than `max_line_bytes` (default: the codec's `MAX_MESSAGE_BYTES`, 16 MiB, from
    `GANGWATCH_MAX_MESSAGE_BYTES`) is never read whole nor parsed: it becomes one error item,
    `line larger than N bytes`, which replay writes to `rejected.jsonl` like any bad line.
    """

    def __init__(self, path: Path, max_line_bytes: int | None = None, *, columns: bool = False) -> None:
        self.path = path
        self.max_line_bytes = max_line_bytes
        self.columns = columns  # batches of steps as one `StepRows` item each (see `codec.decode`)
        self.size = path.stat().st_size
        self._raw: IO[bytes] | None = None
        self.stopped: str | None = None  # "FILE line N: why", when the file ended before its end
        self.decoded = 0  # items that decoded (records, or `StepRows` of several)
        self.refused = 0  # items that did not

    @property
    def read_bytes(self) -> int:
        """Bytes of the file (compressed, for .gz) consumed so far."""
        if self._raw is None:
            return 0
        return self.size if self._raw.closed else self._raw.tell()

    def __iter__(self) -> Iterator[Item]:
        """Decode every line (batches unpacked; with `columns`, a batch of valid steps of one job is one
        `StepRows` item, timed by its last step); blank lines are skipped. A file cut short (a truncated gzip,
        an unreadable block) ends with one error item saying where, after everything before it."""
        source = str(self.path)
        last_ts = float("-inf")
        n = 0
        columns = self.columns
        with open(self.path, "rb") as raw:
            self._raw = raw
            fh = _gunzipped(raw)
            try:
                limit = codec.MAX_MESSAGE_BYTES if self.max_line_bytes is None else self.max_line_bytes
                for n, (line, size) in enumerate(bounded_lines(fh, limit), 1):
                    if size > limit:
                        err = dataclasses.replace(oversized(size, limit, "line"), raw=line[:4096].decode(
                            "utf-8", "replace"))
                        self.refused += 1
                        yield Item(last_ts, source, n, err)
                        continue
                    if not line.strip():
                        continue
                    for v in decode(line, max_bytes=limit, columns=columns):
                        if type(v) is not DecodeError:
                            v = implausible_time(v, last_ts) or v
                        if type(v) is DecodeError:
                            self.refused += 1
                            yield Item(last_ts, source, n, v)  # keep errors in place, by the previous record's time
                        else:
                            self.decoded += 1
                            last_ts = v.ts[-1] if type(v) is StepRows else v.ts
                            yield Item(last_ts, source, n, v)
            except (EOFError, OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
                why = str(e) or type(e).__name__
                self.stopped = f"{source} stopped after line {n}: {why}"
                yield Item(last_ts, source, n + 1, DecodeError(reason=f"input stopped: {why}"))


EARLIEST_TS = 946_684_800.0  # 2000-01-01: no telemetry of this kind is older
LATEST_TS = 7_258_118_400.0  # 2200-01-01
MAX_JUMP_S = 86_400.0  # a record this far past the file's previous one is a wrong clock or a corrupt line


def implausible_time(v: Record | StepRows, last_ts: float) -> DecodeError | None:
    """A record whose time no real file holds (after 2200, a day past the file's previous record, or before 2000
    in a file of this century's times; a file of small made-up times, as tests write, is taken as it is):
    refused with its reason, so that it cannot become the job's clock (replay has no wall clock to hold it
    against, as the worker's `max_future_s` does)."""
    times = v.ts if type(v) is StepRows else (v.ts,)
    lo, hi = min(times), max(times)
    early = lo < EARLIEST_TS <= last_ts
    if not early and hi < LATEST_TS and (last_ts == float("-inf") or hi <= last_ts + MAX_JUMP_S):
        return None
    if early or hi >= LATEST_TS:
        why = f"event time {hi if hi >= LATEST_TS else lo!r} is outside any plausible range (2000 to 2200)"
    else:
        why = (f"event time {hi:.3f} is {(hi - last_ts) / 86_400:.1f} days after the file's previous record "
               f"({last_ts:.3f}): a wrong clock or a corrupt line")
    kind = "step" if type(v) is StepRows else v.kind
    raw = "" if type(v) is StepRows else encode(v).decode()[:4096]
    return DecodeError(why, "ts", kind, raw=raw)


@dataclass(slots=True)
class Item:
    """One decoded part of one line: a record or an error, with where it came from."""

    ts: float
    source: str
    line: int
    value: Record | DecodeError | StepRows


def _records_of(item: Item) -> list[Item]:
    """An item of each record of `item` (a `StepRows` holds several; anything else is one)."""
    v = item.value
    if type(v) is not StepRows:
        return [item]
    return [Item(rec.ts, item.source, item.line, rec) for rec in v.records()]


def merged(inputs: Iterable[InputFile]) -> Iterator[Item]:
    """Items of all files merged by event time (stable: file order breaks ties; read them without `columns`:
    a `StepRows` item would be placed by its last step's time alone)."""
    return heapq.merge(*inputs, key=lambda it: it.ts)


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
    by_kind: dict[str, int] = field(default_factory=dict)  # input records by kind
    stopped: list[str] = field(default_factory=list)  # inputs that ended early, and where
    invalid: list[str] = field(default_factory=list)  # inputs with lines but not one valid record
    empty: list[str] = field(default_factory=list)  # inputs without a line
    interrupted: float | None = None  # stopped by Ctrl-C, with this share of the input bytes read
    out_dir: str = ""

    def why_nothing(self) -> str | None:
        """When nothing was found, the likely reason a person can act on (None when findings exist)."""
        if self.findings:
            return None
        if not self.records:
            return "the inputs held no valid record" + (" (see rejected.jsonl)" if self.rejected else "")
        if "job" not in self.by_kind:
            node_only = set(self.by_kind) <= {"hw", "gpu", "ops"}
            what = "only node events (" + ", ".join(sorted(self.by_kind)) + ")" if node_only else "no `job` record"
            return (f"the inputs hold {what}: detectors run per job, and a node's events reach a job through "
                    "the job record's topology. Replay them with the job's telemetry, or give `ingest kmsg` "
                    "--job JOB to write a job record on that node")
        return None


Responder = Callable[[list[Action]], list[Record]]  # actions -> what a (simulated) controller answers, with times


class Replay:
    """Drives a `Core` over items and hands what it produces to the sinks.

    With a `responder` (a simulated controller), the records it answers the core's actions with join the input
    at their event time, so that a diagnosis that asks (a replay, a dual run) gets its answer in replay too."""

    def __init__(self, sinks: list[Sink], core: Core | None = None, responder: Responder | None = None) -> None:
        self.core = core or Core(CoreConfig())
        self.sinks = sinks
        self.summary = Summary()
        self.responder = responder
        self.answers: list[tuple[float, int, Record]] = []  # (ts, order, record): a heap
        self._order = itertools.count()

    def feed_answered(self, items: list[Item]) -> None:
        """`feed` of each item, the responder's answers due by its time first (in time order)."""
        for item in items:
            self._answer_until(item.ts)
            self.feed(item)

    def _answer_until(self, ts: float) -> None:
        while self.answers and self.answers[0][0] <= ts:
            _, _, rec = heapq.heappop(self.answers)
            self.feed(Item(rec.ts, "controller", None, rec))

    def feed(self, item: Item) -> None:
        s = self.summary
        v = item.value
        if type(v) is StepRows:
            for one in _records_of(item):
                self.feed(one)
            return
        if isinstance(v, DecodeError):
            self._reject(v, item.source, item.line, item.ts)
            return
        s.records += 1
        s.by_kind[v.kind] = s.by_kind.get(v.kind, 0) + 1
        if s.first_ts is None:
            s.first_ts = v.ts
        s.last_ts = v.ts if s.last_ts is None else max(s.last_ts, v.ts)
        for sink in self.sinks:
            sink.observe(v)
        out = self.core.process(v)
        if out:
            self._emit(out, item)

    def feed_many(self, items: list[Item]) -> None:
        """`feed` of each item in turn, with the same outputs in the same order for each job (`Core.process_many`:
        of two jobs within one tick of the stream's time, either may come first): consecutive records that the
        core cannot reject go through `Core.process_many` together (a `StepRows` whole, as columns, unless a
        sink observes records); anything else one by one, in its place."""
        s = self.summary
        jobs = self.core.jobs
        by_kind = s.by_kind
        observers = [sink.observe for sink in self.sinks if type(sink) is not JsonlSink]  # JSONL observes nothing
        run: list[Record | StepRows] = []
        last: Item | None = None
        if observers:  # they observe records: steps as their records
            items = [one for item in items for one in _records_of(item)]
        for item in items:
            v = item.value
            if type(v) is StepRows:
                if v.job in jobs:
                    n, ts = len(v), v.ts
                    s.records += n
                    by_kind["step"] = by_kind.get("step", 0) + n
                    if s.first_ts is None:
                        s.first_ts = ts[0]
                    top = max(ts)
                    if s.last_ts is None or top > s.last_ts:
                        s.last_ts = top
                    run.append(v)
                    last = item
                    continue
                if run:
                    self._run(run, last)
                    run = []
                self.feed(item)  # a job not known: record by record, each rejected
                continue
            kind = None if isinstance(v, DecodeError) else v.kind  # (an error has a `kind` too: the one it failed)
            if kind not in RUN_KINDS or (kind in JOB_KEYED and v.job not in jobs):  # an error, a job, ops, ...
                if run:
                    self._run(run, last)
                    run = []
                self.feed(item)
                continue
            s.records += 1
            by_kind[kind] = by_kind.get(kind, 0) + 1
            ts = v.ts
            if s.first_ts is None:
                s.first_ts = ts
            if s.last_ts is None or ts > s.last_ts:
                s.last_ts = ts
            for observe in observers:
                observe(v)
            run.append(v)
            last = item
        if run:
            self._run(run, last)

    def _run(self, run: list[Record | StepRows], last: Item | None) -> None:
        out = self.core.process_many(run)
        if out:
            self._emit(out, last)  # the core rejects none of these records: `last` is never blamed

    def _reject(self, err: DecodeError, source: str, line: int | None, ts: float | None) -> None:
        self.summary.rejected += 1
        dead = DeadLetter.of(err, source, line=line, ts=ts)
        for sink in self.sinks:
            sink.reject(dead)

    def _emit(self, out: Outputs, item: Item | None) -> None:
        if self.responder is not None and out.actions:
            for rec in self.responder(out.actions):
                heapq.heappush(self.answers, (rec.ts, next(self._order), rec))
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
                self._reject(err, "core", None, None)
            else:
                self._reject(err, item.source, item.line, item.ts)

    def close(self) -> Summary:
        self._answer_until(float("inf"))  # answers due after the input's end (and what they lead to)
        self._emit(self.core.finish(), None)
        for sink in self.sinks:
            sink.close()
        return self.summary


Progress = Callable[[Summary, float], None]  # (summary so far, fraction of the input bytes read)


def unusable(inputs: list[InputFile]) -> tuple[list[str], list[str]]:
    """The inputs read to their end without one valid record: (those with lines that did not decode, those
    without a line)."""
    return ([str(i.path) for i in inputs if i.refused and not i.decoded],
            [str(i.path) for i in inputs if not i.refused and not i.decoded and not i.stopped])


def run(paths: list[Path], out_dir: Path, store: Store | None, *, telemetry: bool = False,
        progress: Progress | None = None, core: Core | None = None, sinks: list[Sink] | None = None,
        append: bool = False, responder: Responder | None = None) -> Summary:
    """Replay `paths` into `out_dir` (and `store`, and any further `sinks`); returns the summary.

    The JSONL outputs are replaced unless `append`. An input cut short keeps what was read
    before the cut in every output; `Summary.stopped` says where it stopped. Ctrl-C (KeyboardInterrupt) ends
    the replay with what was found so far written to every sink and `Summary.interrupted` set: the outputs are
    partial (no end-of-input decisions are made for evidence that was still coming).
    """
    inputs = [InputFile(p, columns=len(paths) == 1 and responder is None) for p in paths]
    total = sum(i.size for i in inputs) or 1
    sinks = [JsonlSink(out_dir, append=append), *(sinks or [])]
    if store is not None:
        sinks.append(StoreSink(store, telemetry=telemetry, max_delay_s=float("inf")))
    rep = Replay(sinks, core, responder)
    rep.summary.out_dir = str(out_dir)
    started = time.monotonic()
    next_print = started
    items = iter(inputs[0]) if len(inputs) == 1 else merged(inputs)
    try:
        while chunk := list(itertools.islice(items, _CHUNK)):
            if responder is None:
                rep.feed_many(chunk)
            else:
                rep.feed_answered(chunk)
            if progress is not None and time.monotonic() >= next_print:
                next_print = time.monotonic() + 0.2
                progress(rep.summary, sum(i.read_bytes for i in inputs) / total)
    except KeyboardInterrupt:  # Ctrl-C: what was found so far is written, marked partial; nothing is decided
        summary = rep.summary  # as if the input ended here (no finish: more evidence was coming)
        summary.interrupted = sum(i.read_bytes for i in inputs) / total
        for sink in sinks:
            sink.close()
    else:
        summary = rep.close()
    summary.wall_s = time.monotonic() - started
    summary.stopped = [i.stopped for i in inputs if i.stopped]
    summary.invalid, summary.empty = unusable(inputs)
    return summary
