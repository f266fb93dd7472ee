"""Safety guards between a decision and the job controller.

- Blast radius: at most `max_evict_nodes`, and at most `max_evict_frac` of the job's
  nodes (at least one), evicted per job per window; beyond that, escalate to a human.
  All ranks going silent at once looks like a partition of the monitoring path,
  and must never drain the job.
- Silences: an `ops` record of type `silence` mutes a node or a whole job until
  `until_ts`; findings are still recorded, actions are not sent.
- Planned operations: an `ops` record with `planned: true` makes the stops that follow
  within the planned window a `planned` incident (no eviction, not a platform failure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gangwatch.schemas import EVICTING_ACTIONS, Ops
from gangwatch.triage.budgets import Safety
from gangwatch.triage.decide import Decision


@dataclass
class Guards:
    safety: Safety
    evictions: list[tuple[float, str]] = field(default_factory=list)  # (ts, node)
    silences: list[tuple[str | None, float]] = field(default_factory=list)  # (node or None for job, until)
    planned: list[tuple[str | None, float, float]] = field(default_factory=list)  # (node|None, from, until)

    # --- operator annotations ------------------------------------------------------

    def on_ops(self, rec: Ops, planned_window_s: float) -> None:
        until = rec.until_ts if rec.until_ts is not None else rec.ts + planned_window_s
        if rec.type == "silence":
            self.silences.append((rec.node, until))
        if rec.planned:
            self.planned.append((rec.node, rec.ts, until))

    def silenced(self, node: str | None, now: float) -> bool:
        return any(until >= now and (n is None or n == node) for n, until in self.silences)

    def is_planned(self, now: float) -> bool:
        """A planned operation on the job (or any node of it) covers `now`."""
        return any(start <= now <= until for _, start, until in self.planned)

    # --- blast radius ------------------------------------------------------------

    def allowed_evictions(self, job_nodes: int) -> int:
        frac = max(1, math.floor(self.safety.max_evict_frac * job_nodes))
        return min(self.safety.max_evict_nodes, frac)

    def review(self, decisions: list[Decision], now: float, job_nodes: int) -> list[Decision]:
        """Apply blast radius and silences; returns what may be sent."""
        recent = {n for t, n in self.evictions if now - t <= self.safety.window_s}
        out: list[Decision] = []
        for d in decisions:
            muted = [n for n in d.nodes if self.silenced(n, now)] or (self.silenced(None, now) and ["job"])
            if muted:
                continue  # recorded in the incident, not sent
            if d.type in EVICTING_ACTIONS and d.nodes:
                wanted = recent | set(d.nodes)
                limit = self.allowed_evictions(job_nodes)
                if len(wanted) > limit:
                    out.append(Decision("escalate", d.nodes, "manual",
                                        f"blast-radius guard: {d.type} of {len(d.nodes)} node(s) would make "
                                        f"{len(wanted)} evicted within {self.safety.window_s:.0f} s, over the "
                                        f"limit of {limit} for a {job_nodes}-node job; was: {d.reason}"))
                    continue
                recent = wanted
                self.evictions += [(now, n) for n in d.nodes]
            out.append(d)
        return out

    def give_back(self, nodes: list[str]) -> None:
        """Evictions shown wrong (the node was alive after all) no longer count against the blast radius."""
        self.evictions = [(t, n) for t, n in self.evictions if n not in nodes]

    def to_dict(self) -> dict[str, Any]:
        return {"evictions": self.evictions, "silences": self.silences, "planned": self.planned}

    @classmethod
    def from_dict(cls, d: dict[str, Any], safety: Safety) -> Guards:
        return cls(safety, [tuple(x) for x in d["evictions"]], [tuple(x) for x in d["silences"]],
                   [tuple(x) for x in d["planned"]])
