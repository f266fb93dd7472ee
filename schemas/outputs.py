"""What the core hands to the runtimes and sinks: the output envelope, node-profile snapshots, dead letters.

- `Outputs`: what one call into the pure core produced, in emission order (findings, actions,
  incidents, node-profile snapshots, rejected records). Every sink takes it; it lives here, in
  the contract, so that sinks depend on the contract only.
- `ProfileSnapshot`: one node's profile at an event time, the row of `gw_node_profiles`.
- `DeadLetter`: a rejected message with why (the `DecodeError`'s fields) and where it came from
  (a file and line, or a topic, partition and offset). One shape wherever a reject ends up: a
  line of replay's `rejected.jsonl`, a message on `gw.dlq`, a row of `gw_rejected`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import orjson
from gangwatch.schemas.codec import DecodeError
from gangwatch.schemas.records import Action, Finding, Incident


@dataclass(frozen=True, slots=True)
class ProfileSnapshot:
    """One node's profile as of event time `ts`: its decayed risk, recent findings and evictions."""

    job: str
    node: str
    ts: float
    risk: float
    recent_types: list[str]
    recent_ids: list[str]
    evictions: int
    repeat_offender: bool

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "node": self.node, "ts": self.ts, "risk": self.risk,
                "recent_types": list(self.recent_types), "recent_ids": list(self.recent_ids),
                "evictions": self.evictions, "repeat_offender": self.repeat_offender}


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A rejected message: why (the fields of its `DecodeError`), where it came from, and its text.

    `source` is the file or the topic it was read from; `line` places it in a file, `topic`,
    `partition` and `offset` on Kafka. `ts` is the event time it was rejected at (the record's, or
    the previous record's in a file), or the Kafka message timestamp. Fields that are None are left
    out of the wire form.
    """

    reason: str
    source: str
    field: str = ""
    kind: str | None = None
    index: int | None = None  # position of the item in a batch
    raw: str = ""  # the offending text, cut to 4 KiB
    line: int | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    ts: float | None = None

    @classmethod
    def of(cls, err: DecodeError, source: str, *, line: int | None = None, topic: str | None = None,
           partition: int | None = None, offset: int | None = None, ts: float | None = None) -> DeadLetter:
        if ts is not None and not math.isfinite(ts):
            ts = None  # e.g. a file's first line: no event time seen yet
        return cls(err.reason, source, err.field, err.kind, err.index, err.raw, line, topic, partition, offset, ts)

    @property
    def where(self) -> str:
        """One string for where it came from: `FILE:LINE`, `TOPIC[PARTITION]:OFFSET`, or the source alone."""
        if self.line is not None:
            return f"{self.source}:{self.line}"
        if self.partition is not None:
            return f"{self.topic or self.source}[{self.partition}]:{self.offset}"
        return self.source

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": self.reason, "field": self.field}
        for name in ("kind", "index"):
            if (v := getattr(self, name)) is not None:
                out[name] = v
        out["raw"] = self.raw
        out["source"] = self.source
        for name in ("line", "topic", "partition", "offset", "ts"):
            if (v := getattr(self, name)) is not None:
                out[name] = v
        return out

    def encode(self) -> bytes:
        return orjson.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeadLetter:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class Outputs:
    """What one call into the core produced, in emission order."""

    findings: list[Finding] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    rejected: list[DecodeError] = field(default_factory=list)  # the runtime adds where they came from
    profiles: list[ProfileSnapshot] = field(default_factory=list)  # node profiles that changed
    life: list[Finding] = field(default_factory=list)  # the job's life: `job_state` findings, kept apart from faults
    shadow: list[Action] = field(default_factory=list)  # shadow mode: actions recorded, never sent (and verdicts)

    def extend(self, other: Outputs) -> None:
        self.findings += other.findings
        self.actions += other.actions
        self.incidents += other.incidents
        self.rejected += other.rejected
        self.profiles += other.profiles
        self.life += other.life
        self.shadow += other.shadow

    def __bool__(self) -> bool:
        return bool(self.findings or self.actions or self.incidents or self.rejected or self.profiles or self.life
                    or self.shadow)
