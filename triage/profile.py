"""Node profile: one node's health across the three signal sources, with memory.

Framework timeouts, runtime telemetry and hardware/OS events all land here as
findings. The profile keeps the recent ones, the node's eviction history, and a
risk score that decays with event time; how much a finding adds is its type's
`risk` policy, declared beside its detector. Precursors (correctable-ECC
bursts, high HBM temperature, NIC flaps) raise risk without evicting anyone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gangwatch.detectors.registry import Typed
from gangwatch.schemas import ProfileSnapshot

_KEEP = 32


@dataclass
class NodeProfile:
    node: str
    risk: float = 0.0
    risk_ts: float = 0.0
    recent: list[dict[str, Any]] = field(default_factory=list)  # newest last: {ts, type, severity, id}
    evictions: list[float] = field(default_factory=list)

    def risk_at(self, now: float, half_life_s: float) -> float:
        return self.risk * math.pow(0.5, max(0.0, now - self.risk_ts) / half_life_s)

    def add(self, t: Typed, half_life_s: float) -> None:
        """One finding on this node: its risk weight (its type's policy) adds to the decayed risk."""
        f = t.finding
        self.risk = self.risk_at(f.ts, half_life_s) + t.risk
        self.risk_ts = max(self.risk_ts, f.ts)
        entry = {"ts": f.ts, "type": f.type, "severity": t.grade, "id": f.id}
        if t.explains_slow:
            entry["explains_slow"] = True  # hardware evidence that explains a straggler here (policy)
        self.recent = [*self.recent[-(_KEEP - 1):], entry]

    def explains_slow(self, since: float, until: float) -> list[str]:
        """Ids of this node's hardware findings in [since, until] that explain a straggler here."""
        return [r["id"] for r in self.recent if r.get("explains_slow") and since <= r["ts"] <= until]

    def evicted(self, ts: float) -> None:
        self.evictions = [*self.evictions[-(_KEEP - 1):], ts]

    def repeat_offender(self, now: float, window_s: float = 7 * 86400.0) -> bool:
        return sum(1 for t in self.evictions if now - t <= window_s) >= 2

    def snapshot(self, job: str, ts: float, half_life_s: float) -> ProfileSnapshot:
        """The profile as of event time `ts` (a row of the node-profile table)."""
        return ProfileSnapshot(job=job, node=self.node, ts=ts, risk=round(self.risk_at(ts, half_life_s), 4),
                               recent_types=[r["type"] for r in self.recent], recent_ids=[r["id"] for r in self.recent],
                               evictions=len(self.evictions), repeat_offender=self.repeat_offender(ts))

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "risk": self.risk, "risk_ts": self.risk_ts, "recent": self.recent,
                "evictions": self.evictions}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeProfile:
        return cls(d["node"], d["risk"], d["risk_ts"], [dict(x) for x in d["recent"]], list(d["evictions"]))
