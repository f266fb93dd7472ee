"""Triage of one job: findings become incidents, incidents get decisions.

Skeleton version: a fail-stop finding opens (or joins) the job's open
incident, names the node as culprit and asks for a hot replacement; steps
resuming close the incident. The full decision tree lives in `triage.decide`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from detectors.base import stable_id
from detectors.topology import Topology
from schemas import Action, Finding, Incident, Record, decode_obj, to_dict
from triage.outputs import Outputs


@dataclass(frozen=True)
class Budgets:
    """Stage budgets in seconds (domain.md)."""

    detect: float = 60.0
    localize: float = 300.0
    replace: float = 120.0
    rollback: float = 120.0
    comm_rebuild: float = 60.0
    total: float = 600.0


@dataclass(frozen=True)
class TriageConfig:
    budgets: Budgets = field(default_factory=Budgets)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TriageConfig":
        return cls(budgets=Budgets(**d.get("budgets", {})))


class Triage:
    def __init__(self, job: str, config: TriageConfig, topo: Topology | None = None) -> None:
        self.job = job
        self.config = config
        self.topo = topo
        self.incident: Incident | None = None
        self.findings: list[str] = []

    def on_topology(self, topo: Topology) -> Outputs:
        self.topo = topo
        return Outputs()

    def on_findings(self, findings: list[Finding]) -> Outputs:
        out = Outputs(findings=list(findings))
        for f in findings:
            if f.type != "fail_stop" or f.node is None:
                continue
            inc = self.incident
            if inc is None:
                inc = Incident(id=stable_id("i", self.job, f.id), ts=f.ts, job=self.job, cls="fail_stop",
                               onset_ts=f.evidence.get("last_seen_ts", f.ts), detected_ts=f.ts)
            nodes = sorted(set(inc.culprit_nodes) | {f.node})
            action = Action(id=stable_id("a", inc.id, "replace", *nodes), ts=f.ts, job=self.job, incident=inc.id,
                            type="replace", nodes=nodes, path="hot",
                            reason=f"ranks {f.evidence.get('ranks')} on {f.node} stopped heartbeating",
                            evidence=[f.id])
            inc = Incident(**{**_fields(inc), "ts": f.ts, "culprit_nodes": nodes, "evicted_nodes": nodes,
                              "localized_ts": f.ts, "decided_ts": f.ts, "path": "hot"})
            self.incident = inc
            out.actions.append(action)
            out.incidents.append(inc)
        return out

    def on_record(self, rec: Record) -> Outputs:
        return Outputs()

    def advance(self, now: float) -> Outputs:
        return Outputs()

    def state(self) -> dict[str, Any]:
        return {"incident": to_dict(self.incident) if self.incident else None}

    @classmethod
    def from_state(cls, state: dict[str, Any], config: TriageConfig, topo: Topology) -> "Triage":
        tri = cls(topo.job, config, topo)
        tri.incident = decode_obj(state["incident"]) if state["incident"] else None
        return tri


def _fields(inc: Incident) -> dict[str, Any]:
    return {k: getattr(inc, k) for k in inc.__dataclass_fields__ if k != "kind"}
