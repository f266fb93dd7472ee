"""Incident classes, declared once: what each class means to every part that treats classes differently.

An incident's `cls` is one of these names (the contract's `incident.cls`). Everything
that depends on a class is a field of its `IncidentClass`, with no default, so a
class added without deciding one of them fails at import, not silently at run time:

| field | read by |
|---|---|
| `rank` | triage: which class an incident takes when evidence of several kinds joins it (higher wins) |
| `severity` | the Alertmanager sink's `severity` label: `critical` pages, `warning` does not, `info` is a record |
| `opened_by_findings` | the detector registry: a detector's finding may open an incident of this class |
| `stops_the_job` | triage, shadow scoring: no progress while it is open, so a step past it proves recovery |
| `keeps_training` | triage: the job trains on through it, so steps prove nothing and the controller's word closes it |
| `self_resolves` | triage: an undecided one closes without a page when the job steps on by itself (a job-wide wait) |
| `waits` | triage: how long its decision waits: `settle`, stack `sweep`, straggler `hold`, `late` (held-up records) |
| `decided_by` | triage: which decision path decides it (`DECIDED_BY` says what each does) |
| `floor` | `gangwatch eval`: the least a suite run must score on faults of this class (None: not a fault class) |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SEVERITIES = ("critical", "warning", "info")
WAITS = ("settle", "sweep", "hold", "late")
# How an incident of a class is decided (triage/decide.py, triage/stragglers.py, triage/diagnose.py):
DECIDED_BY = {
    "nobody": "recorded, never acted on: no stack sweep, no action, and its class stays what it is",
    "culprit": "the culprit localized is replaced (a cold requeue with no spare left); nobody named: the "
               "escalation ladder",
    "stragglers": "the stragglers of one window planned together: replaced where the gain pays for it, else kept "
                  "running and not decided again unless much worse; hardware that explains one shortens the hold",
    "dual_run": "rolled back, the suspect isolated and confirmed by a dual run; a numeric anomaly naming no rank "
                "soon after belongs to the decided incident",
    "budget": "waits for progress up to its budget, then a human; the ladder restarts nothing and pages before a "
              "replay",
}


@dataclass(frozen=True)
class Floor:
    """The least one class must score over a suite run (each fault, not the median, within the budgets)."""

    recall: float = 1.0  # faults detected as an incident of their class
    localized: float = 1.0  # faults whose incident names their node
    innocent_per_culprit: float = 0.0  # innocent nodes evicted per culprit node
    detect_s: float = 60.0  # every fault detected within this of its onset (at most Budgets.detect) ...
    localize_s: float = 300.0  # ... and localized within this (Budgets.localize)
    # an incident localizes a fault only if it names the fault's nodes and at most this many innocent nodes per
    # node of the fault (a culprit and a neighbour still narrow a 2,048-GPU job to two machines; naming the
    # whole gang localizes nothing, whatever it includes)
    named_innocents: float = 1.0


@dataclass(frozen=True)
class IncidentClass:
    name: str
    meaning: str
    rank: int
    severity: Literal["critical", "warning", "info"]
    opened_by_findings: bool
    stops_the_job: bool
    keeps_training: bool
    self_resolves: bool
    waits: Literal["settle", "sweep", "hold", "late"]
    decided_by: Literal["nobody", "culprit", "stragglers", "dual_run", "budget"]
    floor: Floor | None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"incident class {self.name}: severity {self.severity!r} is not one of {SEVERITIES}")
        if self.stops_the_job and self.keeps_training:
            raise ValueError(f"incident class {self.name}: a job cannot both stop and train on")
        if self.waits not in WAITS:
            raise ValueError(f"incident class {self.name}: waits {self.waits!r} is not one of {WAITS}")
        if self.decided_by not in DECIDED_BY:
            raise ValueError(f"incident class {self.name}: decided_by {self.decided_by!r} is not one of "
                             f"{tuple(DECIDED_BY)}")


# In the contract's order (schemas/records.py INCIDENT_CLASSES).
CLASSES: dict[str, IncidentClass] = {c.name: c for c in (
    IncidentClass("fail_stop", "a rank or node died: its processes exited, it fell silent, or its GPU fell off",
                  rank=4, severity="critical", opened_by_findings=True, stops_the_job=True, keeps_training=False,
                  self_resolves=False, waits="settle", decided_by="culprit",
                  # a node that dies without a word (power, kernel panic) is found from silence: within two
                  # heartbeat periods (5 s in the suites) plus 1 s (slack and the timeout grid); an Xid sooner
                  floor=Floor(detect_s=11.0)),
    IncidentClass("fail_slow", "a straggler: one node's ranks steadily slower, the whole gang waits for them",
                  rank=2, severity="warning", opened_by_findings=True, stops_the_job=False, keeps_training=True,
                  self_resolves=False, waits="hold", decided_by="stragglers", floor=Floor()),
    IncidentClass("hang", "the job stopped stepping with its ranks alive; someone is stuck",
                  rank=3, severity="critical", opened_by_findings=True, stops_the_job=True, keeps_training=False,
                  self_resolves=True, waits="sweep", decided_by="culprit",
                  # evicting the smallest group that surely holds the culprit is by design
                  floor=Floor(innocent_per_culprit=1.0)),
    IncidentClass("sdc", "silent data corruption: numbers wrong with no error (loss or grad-norm spikes, digests)",
                  rank=5, severity="critical", opened_by_findings=True, stops_the_job=False, keeps_training=True,
                  self_resolves=False, waits="settle", decided_by="dual_run", floor=Floor()),
    IncidentClass("planned", "an operator's maintenance or a scheduler's preemption: recorded, never a failure",
                  rank=6, severity="info", opened_by_findings=False, stops_the_job=False, keeps_training=False,
                  self_resolves=False, waits="settle", decided_by="nobody",
                  # NOT YET HELD: triage names every node of the gang a planned stop stopped as the incident's
                  # culprits (16 of 16 in planned_restart_128), not the node the operator's `ops` record named;
                  # until it does, the maintained node need only be among them. Decided by nobody, a planned
                  # incident evicts and pages no one (those floors still hold it).
                  floor=Floor(named_innocents=float("inf"))),
    IncidentClass("unknown", "the job stopped and nothing explains it: a human looks",
                  rank=1, severity="critical", opened_by_findings=True, stops_the_job=True, keeps_training=False,
                  self_resolves=False, waits="late", decided_by="culprit", floor=None),
    IncidentClass("stall", "the whole job waited alike with nobody to blame (a checkpoint, an evaluation, the "
                  "filesystem): a page only once it outlasts its budget",
                  rank=3, severity="warning", opened_by_findings=False, stops_the_job=True, keeps_training=False,
                  self_resolves=True, waits="settle", decided_by="budget", floor=None),
)}


def decided_by(cls: str | None) -> str | None:
    """How an incident of `cls` is decided (`DECIDED_BY`); None for a name that is no class (or None)."""
    c = CLASSES.get(cls) if cls is not None else None
    return None if c is None else c.decided_by


def rank(cls: str) -> int:
    """`cls`'s precedence; 0 for a name that is no class."""
    c = CLASSES.get(cls)
    return 0 if c is None else c.rank
