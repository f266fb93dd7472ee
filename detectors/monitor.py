"""JobMonitor: the detectors of one job, fed its records in event-time order.

It owns the job's topology (from `job` records), routes each record to the
detectors that want its kind, advances them all through event time, and
saves/restores their state as one JSON-able value.
"""

from __future__ import annotations

from typing import Any

from gangwatch.detectors.base import Detector
from gangwatch.detectors.catalog import DEFAULT_DETECTORS  # the detectors every job gets, in emission order
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Job, Record, to_dict
from gangwatch.schemas.codec import decode_obj

__all__ = ["DEFAULT_DETECTORS", "JobMonitor"]


class JobMonitor:
    """All detectors of one job."""

    def __init__(self, job: Job, detectors: tuple[type, ...] = DEFAULT_DETECTORS) -> None:
        self.job_record = job
        self.topo = Topology.from_job(job)
        self.detectors: list[Detector] = [cls(self.topo) for cls in detectors]
        self._routes = self._build_routes()

    def _build_routes(self) -> dict[str, list[Detector]]:
        routes: dict[str, list[Detector]] = {}
        for det in self.detectors:
            for kind in det.kinds:
                routes.setdefault(kind, []).append(det)
        return routes

    def replace_topology(self, job: Job) -> None:
        """A new `job` record (a node was swapped in, or the job restarted)."""
        self.job_record = job
        self.topo = Topology.from_job(job)
        for det in self.detectors:
            det.set_topology(self.topo)

    def observe(self, rec: Record) -> list[Finding]:
        out: list[Finding] = []
        for det in self._routes.get(rec.kind, ()):
            out += det.observe(rec)
        return out

    def advance(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for det in self.detectors:
            out += det.advance(now)
        return out

    def state(self) -> dict[str, Any]:
        return {"job": to_dict(self.job_record), "detectors": {d.name: d.state() for d in self.detectors}}

    @classmethod
    def from_state(cls, state: dict[str, Any], detectors: tuple[type, ...] = DEFAULT_DETECTORS) -> JobMonitor:
        job = decode_obj(state["job"])
        mon = cls(job, detectors)
        mon.detectors = [t.from_state(state["detectors"][t.name], mon.topo) for t in detectors]
        mon._routes = mon._build_routes()
        return mon
