"""NCCL-timeout storms: many ranks report timed-out collectives within seconds.

The reports name random peers and the reporting ranks are victims, not
culprits. Reports of one job are collected for `window_s` after the first and
summarized as one `comm_error` finding (no node: nobody is blamed by the
report itself). The finding carries a weak suspect set for triage to use only
when no other evidence exists: the smallest set of ranks that appears in every
timed-out group, preferring ranks that did *not* report (a rank stuck
elsewhere never reaches the collective's watchdog).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from gangwatch.detectors.base import DetectorBase
from gangwatch.detectors.config import CommConfig
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Record
from gangwatch.schemas.evidence import Evidence

_COMM_TYPES = frozenset({"nccl_timeout", "nccl_error", "barrier_timeout"})
_GROUP_KINDS = frozenset({"tp", "pp", "dp"})


@dataclass(frozen=True, slots=True, kw_only=True)
class CommStorm(Evidence):
    """Collective timeouts reported within `window_s` of the first; the reporters are victims."""

    reports: int
    reporting_ranks: int
    ops: dict[str, int]  # reports per collective
    pgs: dict[str, int]  # reports per process group
    suspect_ranks: list[int]  # a weak suspect set: ranks in every timed-out group (non-reporters first)
    suspect_nodes: list[str]
    first_ts: float  # the first report


# blames nobody; the incident it opens (a hang) asks for a sweep; its suspects count only when nothing else does
COMM_ERROR = FindingType("comm_error", CommStorm, Policy(
    incident="hang", onset="first_ts", sweep=True, suspects=lambda f, ev: (ev.suspect_ranks, ev.suspect_nodes),
    describe=lambda f, ev: f"{ev.reports} collective timeouts from {ev.reporting_ranks} ranks"))


class CommDetector(DetectorBase):
    """Summarizes collective-timeout storms of one job."""

    name: ClassVar[str] = "comm"
    kinds: ClassVar[frozenset[str]] = frozenset({"framework"})
    finding_types: ClassVar[tuple[FindingType, ...]] = (COMM_ERROR,)

    def __init__(self, topo: Topology, config: CommConfig | None = None) -> None:
        self.config = config or CommConfig()
        self.topo = topo
        self.storm: dict[str, Any] | None = None  # {first, last, reports: [[rank, pg, peer, op]], reported}

    def set_topology(self, topo: Topology) -> None:
        self.topo = topo
        self.storm = None

    def observe(self, rec: Record) -> list[Finding]:
        if rec.type not in _COMM_TYPES or rec.rank >= self.topo.size:
            return []
        s = self.storm
        if s is None or (s["reported"] and rec.ts - s["last"] > self.config.quiet_s):
            s = self.storm = {"first": rec.ts, "last": rec.ts, "reports": [], "reported": False}
        s["last"] = max(s["last"], rec.ts)
        if not s["reported"]:
            s["reports"].append([rec.rank, rec.pg, rec.peer, rec.op])
        return []

    def advance(self, now: float) -> list[Finding]:
        s = self.storm
        if s is None or s["reported"] or now < s["first"] + self.config.window_s:
            return []
        s["reported"] = True
        reports = s["reports"]
        reporters = sorted({r[0] for r in reports})
        suspects = self._suspects(reports, set(reporters))
        return [COMM_ERROR.finding(
            ts=s["first"] + self.config.window_s, job=self.topo.job, detector="comm.storm",
            key=(s["first"], len(reports)), score=min(1.0, len(reporters) / max(1, self.topo.size)),
            evidence=CommStorm(reports=len(reports), reporting_ranks=len(reporters),
                               ops=dict(sorted(Counter(str(r[3]) for r in reports).items())),
                               pgs=dict(sorted(Counter(str(r[1]) for r in reports).items())),
                               suspect_ranks=suspects,
                               suspect_nodes=self.topo.nodes_of(suspects) if suspects else [],
                               first_ts=round(s["first"], 6)),
        )]

    def _suspects(self, reports: list[list], reporters: set[int]) -> list[int]:
        """Smallest set of ranks hitting every timed-out group (greedy), non-reporters first."""
        groups = []
        for rank, pg, peer, _ in reports:
            if pg in _GROUP_KINDS:
                members = set(self.topo.group_ranks(pg, rank).tolist())
            else:
                members = {rank} | ({peer} if peer is not None and peer < self.topo.size else set())
            members.discard(rank)  # the reporter reached its watchdog: it is not what it waits for
            if members:
                groups.append(frozenset(members))
        chosen: list[int] = []
        open_groups = list(groups)
        while open_groups and len(chosen) < self.config.max_suspects:
            counts = Counter(r for g in open_groups for r in g)
            best = max(counts.items(), key=lambda kv: (kv[1], kv[0] not in reporters, -kv[0]))[0]
            chosen.append(best)
            open_groups = [g for g in open_groups if best not in g]
        return sorted(chosen) if not open_groups else []

    def state(self) -> dict[str, Any]:
        storm = None if self.storm is None else {**self.storm, "reports": [list(r) for r in self.storm["reports"]]}
        return {"config": asdict(self.config), "storm": storm}  # a snapshot: later records must not change it

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> CommDetector:
        det = cls(topo, CommConfig(**state["config"]))
        det.storm = None if state["storm"] is None else {**state["storm"],
                                                         "reports": [list(r) for r in state["storm"]["reports"]]}
        return det
