"""Fail-stop: ranks that stop heartbeating, and processes that exit or crash.

A rank is missing when neither a heartbeat nor a step arrived for
`miss_factor` x the job's `heartbeat_s`. Missing ranks are reported per node:
when every rank of a node is missing, one finding names the node and all its
ranks; a node where only some ranks are missing is reported once the first of
them has been missing for a further `grace_factor` periods (time for its
siblings to time out too), so a node is one finding, not eight.

Timeouts are evaluated on a fixed event-time grid (half a heartbeat period),
so the findings do not depend on how often `advance` is called.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
from gangwatch.detectors.base import finding
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Framework, Record

_CRASH_TYPES = frozenset({"exit", "exception", "oom"})


@dataclass(frozen=True)
class FailStopConfig:
    miss_factor: float = 3.0  # heartbeat periods of silence before a rank is missing
    grace_factor: float = 1.0  # extra periods to wait for the rest of a node before reporting part of it


class FailStopDetector:
    """Missed heartbeats and crashed processes of one job."""

    name: ClassVar[str] = "failstop"
    kinds: ClassVar[frozenset[str]] = frozenset({"heartbeat", "step", "framework"})

    def __init__(self, topo: Topology, config: FailStopConfig | None = None) -> None:
        self.config = config or FailStopConfig()
        self.topo = topo
        self._reset(topo)

    def _reset(self, topo: Topology) -> None:
        self.topo = topo
        self.last_seen = np.full(topo.size, topo.ts, dtype=np.float64)
        self.reported = np.zeros(topo.size, dtype=bool)
        self.tick = topo.heartbeat_s / 2
        self.timeout = topo.heartbeat_s * self.config.miss_factor
        self.grace = topo.heartbeat_s * self.config.grace_factor
        self.next_tick = self._grid_at_or_after(topo.ts + self.timeout)

    def _grid_at_or_after(self, t: float) -> float:
        return t if math.isinf(t) else math.ceil(t / self.tick) * self.tick

    def set_topology(self, topo: Topology) -> None:
        self._reset(topo)

    # --- observe --------------------------------------------------------------

    def observe(self, rec: Record) -> list[Finding]:
        rank = rec.rank
        if rank >= self.topo.size:
            return []
        if rec.kind == "framework":
            return self._crash(rec) if rec.type in _CRASH_TYPES else []
        if rec.ts > self.last_seen[rank]:
            self.last_seen[rank] = rec.ts
            if self.reported[rank]:
                self.reported[rank] = False  # it came back: watch it again
            deadline = rec.ts + self.timeout
            if deadline < self.next_tick:  # only after a lull; keep the grid aligned
                self.next_tick = self._grid_at_or_after(deadline)
        return []

    def _crash(self, rec: Framework) -> list[Finding]:
        node = self.topo.node_of(rec.rank)
        return [finding(
            ts=rec.ts, job=self.topo.job, type="fail_stop", detector="failstop.process", topo=self.topo,
            rank=rec.rank, key=(rec.rank, rec.type, rec.ts), score=1.0,
            evidence={"cause": rec.type, "ranks": [rec.rank], "message": (rec.message or "")[:500],
                      "node_ranks": len(self.topo.node_ranks.get(node, ()))},
        )]

    # --- advance --------------------------------------------------------------

    def advance(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        while self.next_tick <= now:
            t = self.next_tick
            out += self._evaluate(t)
            self.next_tick = max(t + self.tick, self._grid_at_or_after(self._next_event()))
        return out

    def _next_event(self) -> float:
        watching = ~self.reported
        if not watching.any():
            return math.inf
        return float(self.last_seen[watching].min()) + self.timeout

    def _evaluate(self, t: float) -> list[Finding]:
        deadline = self.last_seen + self.timeout
        missing = (deadline <= t) & ~self.reported
        if not missing.any():
            return []
        out = []
        node_index = self.topo.node_index
        for ni in np.unique(node_index[missing]):
            node = self.topo.nodes[ni]
            ranks = np.asarray(self.topo.node_ranks[node])
            new = ranks[missing[ranks]]
            all_gone = bool(((deadline[ranks] <= t) | self.reported[ranks]).all())
            first = float(deadline[new].min())
            if not all_gone and t < first + self.grace:
                continue  # give its siblings time to time out too
            ts = float(deadline[ranks].max()) if all_gone else first + self.grace
            self.reported[new] = True
            silent_since = float(self.last_seen[new].min())
            out.append(finding(
                ts=ts, job=self.topo.job, type="fail_stop", detector="failstop.heartbeat", node=node,
                key=(node, silent_since), score=len(new) / len(ranks),
                rank=int(new[0]) if len(new) == 1 else None, topo=self.topo,
                evidence={"cause": "heartbeat", "ranks": new.tolist(), "node_ranks": len(ranks),
                          "whole_node": all_gone, "first_silent_ts": round(silent_since, 6),
                          "last_seen_ts": round(float(self.last_seen[new].max()), 6),
                          "timeout_s": self.timeout},
            ))
        return out

    # --- state ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "last_seen": self.last_seen.tolist(),
                "reported": self.reported.tolist(),
                "next_tick": None if math.isinf(self.next_tick) else self.next_tick}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> FailStopDetector:
        det = cls(topo, FailStopConfig(**state["config"]))
        det.last_seen = np.asarray(state["last_seen"], dtype=np.float64)
        det.reported = np.asarray(state["reported"], dtype=bool)
        det.next_tick = math.inf if state["next_tick"] is None else state["next_tick"]
        return det
