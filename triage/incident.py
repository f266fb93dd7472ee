"""One incident's timeline: stage timestamps, stage durations against budgets, and its contract record."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gangwatch.schemas import Incident
from gangwatch.schemas.classes import decided_by, rank
from gangwatch.triage.budgets import Budgets

KEEP_WAITING = 16  # incidents of jobs that kept running, waiting for the controller's word, kept per job

_PHASE_FIELD = {"replaced": "replaced_ts", "ckpt_loaded": "ckpt_loaded_ts", "comm_ready": "comm_ready_ts",
                "resumed": "recovered_ts"}


@dataclass
class Timeline:
    """A mutable incident being tracked; `record()` turns it into the contract's `incident`."""

    id: str
    job: str
    cls: str
    onset_ts: float
    detected_ts: float
    planned: bool = False
    localized_ts: float | None = None
    decided_ts: float | None = None
    replaced_ts: float | None = None
    ckpt_loaded_ts: float | None = None
    comm_ready_ts: float | None = None
    recovered_ts: float | None = None
    failed_ts: float | None = None
    decide_at: float = 0.0
    culprit_nodes: list[str] = field(default_factory=list)
    evicted_nodes: list[str] = field(default_factory=list)
    path: str | None = None
    findings: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    stall_step: int = -1  # newest step when the incident was decided; progress past it means recovered
    restarts: list[str] = field(default_factory=list)  # its actions carried out by stopping and restarting the job
    resolution: str | None = None  # how it ended without a recovery: self_resolved, job_stopped, ... (None: not so)
    attempts: int = 0  # a crash loop: how many times it recurred after a restart
    signature: str | None = None  # the software failure it is about (a crash loop recurs with the same one)
    swapped: list[str] = field(default_factory=list)  # a crash loop's node swapped once for a spare: node or code?
    withdrawn: list[str] = field(default_factory=list)  # its findings a late record showed wrong
    shadow: bool = False  # its actions were only recorded (shadow mode): nothing was sent
    # an answer it waits for from the controller (triage/diagnose.py): kind, action id, nodes, until when
    awaiting: dict[str, Any] | None = None
    proof: dict[str, str] | None = None  # a dual run's digests, node -> digest
    rungs: list[dict[str, Any]] = field(default_factory=list)  # the escalation ladder's rungs tried

    def promote(self, cls: str) -> bool:
        """Raise the class if `cls` explains more (a hang that turns out to be a dead node is fail_stop); one
        decided by nobody (planned: recorded, never acted on) stays what it is."""
        if decided_by(self.cls) != "nobody" and rank(cls) > rank(self.cls):  # precedence: schemas/classes.py
            self.cls = cls
            return True
        return False

    def on_phase(self, phase: str, ts: float) -> bool:
        if phase == "failed":
            self.failed_ts = ts
            return True
        name = _PHASE_FIELD.get(phase)
        if name is None or getattr(self, name) is not None:
            return False
        setattr(self, name, ts)
        return True

    def stages(self) -> dict[str, float]:
        """Durations of the stages that have both ends, in seconds."""
        pairs = {"detect": (self.onset_ts, self.detected_ts), "localize": (self.detected_ts, self.localized_ts),
                 "decide": (self.localized_ts or self.detected_ts, self.decided_ts),
                 "replace": (self.decided_ts, self.replaced_ts),
                 "rollback": (self.replaced_ts or self.decided_ts, self.ckpt_loaded_ts),
                 "comm_rebuild": (self.ckpt_loaded_ts, self.comm_ready_ts),
                 "total": (self.onset_ts, self.recovered_ts)}
        return {k: round(max(0.0, b - a), 3) for k, (a, b) in pairs.items() if a is not None and b is not None}

    def record(self, ts: float, budgets: Budgets) -> Incident:
        stage_s = self.stages()
        limits = asdict(budgets)
        over = [k for k, v in stage_s.items() if k in limits and v > limits[k]]
        return Incident(
            id=self.id, ts=round(ts, 6), job=self.job, cls=self.cls, planned=self.planned,
            onset_ts=round(self.onset_ts, 6), detected_ts=round(self.detected_ts, 6),
            localized_ts=_r(self.localized_ts), decided_ts=_r(self.decided_ts), recovered_ts=_r(self.recovered_ts),
            culprit_nodes=list(self.culprit_nodes), evicted_nodes=list(self.evicted_nodes), path=self.path,
            stage_s=stage_s, over_budget=over,
            extra={"findings": list(self.findings[:64]), "actions": list(self.actions),
                   **({"resolution": self.resolution} if self.resolution else {}),
                   **({"attempts": self.attempts} if self.attempts else {}),
                   **({"withdrawn": list(self.withdrawn)} if self.withdrawn else {}),
                   **({"shadow": True} if self.shadow else {}),
                   **({"proof": dict(self.proof)} if self.proof else {}),
                   **({"rungs": [dict(r) for r in self.rungs]} if self.rungs else {})},
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Timeline:
        return cls(**d)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)
