"""Node fault histories: the rows every fleet analysis reads, and the import format for histories kept elsewhere.

One row is one event on one machine: a fault (`fail_stop`, an Xid, a kernel panic, ...) or a precursor
(`ecc_correctable`, `thermal`, `link_errors`, `nic_flap`, ...), with when it began and, if known, when the
machine was back (`end`; empty when unknown or instantaneous). The import format is CSV with a header or JSON
lines, with these fields:

| field | meaning |
|---|---|
| `node` | the machine (hostname as the scheduler knows it) |
| `start` | when the event began: epoch seconds or ISO 8601 (`2026-11-02T08:15:00Z`; no zone means UTC) |
| `end` | when the machine was back in service (same forms); `open`: still out at the history's end; or empty |
| `class` | what happened: free text, compared case-insensitively (gangwatch's incident classes are among them) |
| `description` | anything else (an Xid, a ticket, the repair), kept but not interpreted |

Times before 2000-01-01 are refused (`EARLIEST`): they are day or hour numbers that were never converted to
dates, or a zero that stands for "none", and read as 1970 they would be a second history. An `end` of `open`
(`OPEN_END`, any case) is kept as `math.inf`: the machine was down from `start` to at least the history's end.

`from_incidents` makes the same rows from gangwatch's `gw_incidents`: one row per culprit node of each
incident (planned ones left out: maintenance is not a fault).
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

FIELDS = ("node", "start", "end", "class", "description")
OPEN_END = "open"  # the `end` of an event whose machine was still out when the history was written ...
OPEN = math.inf  # ... as it is kept
EARLIEST = 946684800.0  # 2000-01-01T00:00:00Z: an earlier time is a number that was never a date


@dataclass(frozen=True)
class NodeEvent:
    """One event of a node's history (lists of them are kept sorted by `in_order`)."""

    start: float
    node: str
    cls: str
    end: float | None = None
    description: str = ""

    @property
    def down_s(self) -> float:
        """How long the machine was out (0 when the end is not known; infinite while still open)."""
        return max(0.0, self.end - self.start) if self.end is not None else 0.0

    @property
    def still_open(self) -> bool:
        """Whether the machine was still out when the history was written (`end` given as `open`)."""
        return self.end == OPEN


def in_order(e: NodeEvent) -> tuple[float, str, str]:
    """The sort key of histories: by start, then node and class."""
    return e.start, e.node, e.cls


def parse_time(value: object, what: str) -> float | None:
    """Epoch seconds from epoch seconds or ISO 8601 text (no zone: UTC); None for empty; ValueError for a time
    before 2000 (`EARLIEST`) or one that is not finite."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        t = float(value)
    else:
        text = str(value).strip()
        try:
            t = float(text)
        except ValueError:
            try:
                when = datetime.fromisoformat(text.replace("Z", "+00:00"))
            except ValueError:
                raise ValueError(f"{what}: {text!r} is neither epoch seconds nor an ISO 8601 time "
                                 "(e.g. 2026-11-02T08:15:00Z)") from None
            t = (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(t):
        raise ValueError(f"{what}: {value!r} is not a time")
    if t < EARLIEST:
        raise ValueError(f"{what}: {value!r} is before 2000 (read as {datetime.fromtimestamp(t, UTC):%Y-%m-%d}): "
                         "a day or hour number not converted to a date? give epoch seconds or ISO 8601")
    return t


def event(row: Mapping[str, object], where: str) -> NodeEvent:
    """One row of the import format as a `NodeEvent`; ValueError naming `where` and the field when it is wrong."""
    node = str(row.get("node") or "").strip()
    cls = str(row.get("class") or "").strip().lower()
    if not node:
        raise ValueError(f"{where}: no node")
    if not cls:
        raise ValueError(f"{where}: no class (what happened: e.g. fail_stop, xid_79, ecc_correctable)")
    start = parse_time(row.get("start"), f"{where}: start")
    if start is None:
        raise ValueError(f"{where}: no start time")
    raw_end = row.get("end")
    is_open = isinstance(raw_end, str) and raw_end.strip().lower() == OPEN_END
    end = OPEN if is_open else parse_time(raw_end, f"{where}: end")
    if end is not None and end < start:
        raise ValueError(f"{where}: end is before start")
    return NodeEvent(start=start, node=node, cls=cls, end=end, description=str(row.get("description") or ""))


def _rows(text: str, name: str) -> Iterator[tuple[str, Mapping[str, object]]]:
    head = text.lstrip()[:1]
    if head in ("{", ""):
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise ValueError(f"{name}:{n}: not JSON ({e})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{name}:{n}: want an object with {', '.join(FIELDS)}")
            yield f"{name}:{n}", row
        return
    reader = csv.DictReader(io.StringIO(text))
    missing = [f for f in ("node", "start", "class") if f not in (reader.fieldnames or ())]
    if missing:
        raise ValueError(f"{name}: the CSV header lacks {', '.join(missing)} "
                         f"(want a header line: {','.join(FIELDS)})")
    for row in reader:
        yield f"{name}:{reader.line_num}", row


def parse(text: str | bytes, name: str = "history") -> list[NodeEvent]:
    """Every event of a history file's text or bytes (CSV with a header, or JSON lines; bytes may be gzipped),
    sorted by start."""
    if isinstance(text, bytes):
        text = decode(text, name)
    return sorted((event(row, where) for where, row in _rows(text, name)), key=in_order)


def decode(data: bytes, name: str = "history") -> str:
    """A history file's bytes as text: gunzipped when they are gzip (by their magic, whatever the file's name),
    UTF-8; ValueError naming `name` otherwise."""
    try:
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        return data.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError):
        raise ValueError(f"{name}: not a text file (want CSV with a header, or JSON lines, optionally gzipped)") \
            from None


def from_incidents(rows: Iterable[Mapping[str, object]]) -> list[NodeEvent]:
    """A history from rows of `gw_incidents` (latest version of each): one event per culprit node, planned left out."""
    out = []
    for r in rows:
        if r.get("planned") or r.get("class") == "planned":
            continue
        start = r.get("onset_ts") or r.get("detected_ts") or r.get("ts")
        if start is None:
            continue
        end = r.get("recovered_ts")
        for node in r.get("culprit_nodes") or ():
            out.append(NodeEvent(start=float(start), node=str(node), cls=str(r.get("class")),
                                 end=float(end) if end is not None else None,
                                 description=f"incident {r.get('id')} job {r.get('job')}"))
    return sorted(out, key=in_order)


def to_csv(events: Iterable[NodeEvent]) -> str:
    """The import format's CSV of `events` (epoch seconds), for round trips and generated histories."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(FIELDS)
    for e in events:
        end = "" if e.end is None else OPEN_END if e.still_open else repr(e.end)
        w.writerow([e.node, repr(e.start), end, e.cls, e.description])
    return buf.getvalue()
