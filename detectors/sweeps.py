"""Collecting sweeps: per-rank dumps of one job that share a `snapshot` id, analysed once complete.

A sweep (stack dumps, flight-recorder summaries) is analysed when every rank of
the topology has reported, or `window_s` of event time after its first record,
whichever comes first, or when the input ends (`finish`: a file of dumps with a
rank missing, whose py-spy failed or whose node died, holds all there is).
Records of a sweep already analysed, or arriving after its window, are dropped.
A sweep's times are its records' times as corrected by their nodes' clocks as
known now, not when each came: a node whose clock just stepped, read early (its
records stamped behind, in an event-time replay), would otherwise open the window
from its dumps and leave its peers' dumps of the same sweep late.
At most `max_pending` sweeps are collected at once.
`SweepDetector` does the bookkeeping; a subclass says what it keeps of a record
(`entry`) and what a finished sweep means (`analyse`). The evidence of what a
sweep finds starts with the sweep's id (`SweepEvidence`), so triage can weigh
the findings of one sweep against each other.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gangwatch.detectors.base import DetectorBase
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Record
from gangwatch.schemas.evidence import Evidence


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepEvidence(Evidence):
    """Evidence of a finding about one sweep: first of all, which one."""

    snapshot: str  # the sweep's id


@dataclass
class Sweep:
    first_ts: float
    last_ts: float
    items: dict[int, Any] = field(default_factory=dict)  # rank -> what the detector keeps of its record
    raw: dict[int, float] = field(default_factory=dict)  # rank -> its record's time by its node's own clock


class SweepDetector(DetectorBase):
    """Base of the detectors that analyse whole sweeps (`stacks`, `flight`)."""

    kind: ClassVar[str]  # the record kind collected

    def __init__(self, topo: Topology, window_s: float, max_pending: int, remember_done: int) -> None:
        self.topo = topo
        self.window_s = window_s
        self.max_pending = max_pending
        self.pending: dict[str, Sweep] = {}
        self.done: deque[str] = deque(maxlen=remember_done)
        self.clock: Any = None  # the job's `clocks.ClockDetector` (JobMonitor hands it over): the nodes' offsets

    def entry(self, rec: Record, sweep: Sweep) -> Any:
        """What to keep of one rank's record."""
        raise NotImplementedError

    def analyse(self, snapshot: str, items: Mapping[int, Any], ts: float) -> list[Finding]:
        """Findings of one finished sweep, stamped `ts`."""
        raise NotImplementedError

    def set_topology(self, topo: Topology) -> None:
        self.topo = topo
        for sweep in self.pending.values():
            sweep.items = {r: v for r, v in sweep.items.items() if r < topo.size}
            sweep.raw = {r: t for r, t in sweep.raw.items() if r < topo.size}

    def observe(self, rec: Record) -> list[Finding]:
        if rec.kind != self.kind or rec.rank >= self.topo.size or rec.snapshot in self.done:
            return []
        sweep = self.pending.get(rec.snapshot)
        if sweep is None:
            sweep = self.pending[rec.snapshot] = Sweep(rec.ts, rec.ts)
        else:
            self._retime(sweep)
            if rec.ts > sweep.first_ts + self.window_s:
                return []  # late: the window closed (advance may not have run yet)
        sweep.items[rec.rank] = self.entry(rec, sweep)
        sweep.raw[rec.rank] = rec.ts + (float(self.clock.rank_offsets()[rec.rank]) if self.clock is not None else 0.0)
        sweep.first_ts = min(sweep.first_ts, rec.ts)
        sweep.last_ts = max(sweep.last_ts, rec.ts)
        out: list[Finding] = []
        if len(sweep.items) >= self.topo.size:
            out += self._close(rec.snapshot, sweep.last_ts)
        while len(self.pending) > self.max_pending:
            sid = min(self.pending, key=lambda s: (self.pending[s].first_ts, s))
            out += self._close(sid, self.pending[sid].last_ts)
        return out

    def _retime(self, sweep: Sweep) -> None:
        """The sweep's first and last times by its nodes' clocks as known now. A sweep saved without its records'
        own times keeps the times it has."""
        if self.clock is not None and sweep.raw and len(sweep.raw) == len(sweep.items) and self.clock.skewed:
            offs = self.clock.rank_offsets()
            ts = [t - float(offs[r]) for r, t in sweep.raw.items()]
            sweep.first_ts, sweep.last_ts = min(ts), max(ts)

    def advance(self, now: float) -> list[Finding]:
        for sweep in self.pending.values():
            self._retime(sweep)
        due = sorted((s.first_ts + self.window_s, sid) for sid, s in self.pending.items()
                     if s.first_ts + self.window_s <= now)
        out: list[Finding] = []
        for deadline, sid in due:
            out += self._close(sid, deadline)
        return out

    def finish(self) -> list[Finding]:
        """The input ended: analyse every sweep still collecting with what it has, stamped its last record."""
        out: list[Finding] = []
        for last, sid in sorted((s.last_ts, sid) for sid, s in self.pending.items()):
            out += self._close(sid, last)
        return out

    def _close(self, sid: str, ts: float) -> list[Finding]:
        sweep = self.pending.pop(sid)
        self.done.append(sid)
        return self.analyse(sid, sweep.items, ts)
