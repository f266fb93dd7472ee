"""`Outputs`: what one call into the pure core produced, in emission order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gangwatch.schemas import Action, DecodeError, Finding, Incident


@dataclass
class Outputs:
    """What one call into the core produced, in emission order."""

    findings: list[Finding] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    rejected: list[DecodeError] = field(default_factory=list)
    # node profile snapshots that changed: {job, node, ts, risk, recent_findings, evictions, repeat_offender}
    profiles: list[dict[str, Any]] = field(default_factory=list)

    def extend(self, other: Outputs) -> None:
        self.findings += other.findings
        self.actions += other.actions
        self.incidents += other.incidents
        self.rejected += other.rejected
        self.profiles += other.profiles

    def __bool__(self) -> bool:
        return bool(self.findings or self.actions or self.incidents or self.rejected or self.profiles)
