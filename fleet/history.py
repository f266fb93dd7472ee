"""Node fault histories: the rows every fleet analysis reads, and the import format for histories kept elsewhere.

One row is one event on one machine: a fault (`fail_stop`, an Xid, a kernel panic, ...) or a precursor
(`ecc_correctable`, `thermal`, `link_errors`, `nic_flap`, ...), with when it began and, if known, when the
machine was back (`end`; empty when unknown or instantaneous). The import format is CSV with a header or JSON
lines, with these fields:

| field | meaning |
|---|---|
| `node` | the machine (hostname as the scheduler knows it) |
| `start` | when the event began: epoch seconds or ISO 8601 (`2026-11-02T08:15:00Z`; no zone means UTC) |
| `end` | when the machine was back in service (same forms), or empty |
| `class` | what happened: free text, compared case-insensitively (gangwatch's incident classes are among them) |
| `description` | anything else (an Xid, a ticket, the repair), kept but not interpreted |

`from_incidents` makes the same rows from gangwatch's `gw_incidents`: one row per culprit node of each
incident (planned ones left out: maintenance is not a fault).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import orjson

FIELDS = ("node", "start", "end", "class", "description")


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
        """How long the machine was out (0 when the end is not known)."""
        return max(0.0, self.end - self.start) if self.end is not None else 0.0


def in_order(e: NodeEvent) -> tuple[float, str, str]:
    """The sort key of histories: by start, then node and class."""
    return e.start, e.node, e.cls


def parse_time(value: object, what: str) -> float | None:
    """Epoch seconds from epoch seconds or ISO 8601 text (no zone: UTC); None for empty."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{what}: {text!r} is neither epoch seconds nor an ISO 8601 time "
                         "(e.g. 2026-11-02T08:15:00Z)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return t.timestamp()


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
    end = parse_time(row.get("end"), f"{where}: end")
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


def parse(text: str, name: str = "history") -> list[NodeEvent]:
    """Every event of a history file's text (CSV with a header, or JSON lines), sorted by start."""
    return sorted((event(row, where) for where, row in _rows(text, name)), key=in_order)


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
        w.writerow([e.node, repr(e.start), "" if e.end is None else repr(e.end), e.cls, e.description])
    return buf.getvalue()
