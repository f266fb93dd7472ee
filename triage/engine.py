"""The pure core: records in, findings + actions + incidents out, on event time.

`Core` is what both runtimes drive (replay in-process, the Faust worker on
Kafka). It keeps one `JobMonitor` per job, maps node-keyed records (hw, gpu) to
the job running on that node, and hands every finding to the job's `Triage`.

Event time: `process(rec)` first advances everything to the watermark
(the largest event time seen, less `lateness_s`), then observes the record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gangwatch.detectors.monitor import JobMonitor
from gangwatch.schemas import DecodeError, Job, Record, encode
from gangwatch.triage.config import TriageConfig
from gangwatch.triage.job import Triage
from gangwatch.triage.outputs import Outputs

_JOB_KEYED = frozenset({"step", "heartbeat", "framework", "stack", "flight", "recovery"})
_NODE_KEYED = frozenset({"hw", "gpu"})


@dataclass(frozen=True)
class CoreConfig:
    lateness_s: float = 1.0  # how far behind the newest event time timeouts are evaluated
    tick_s: float = 0.5  # records advance event time in steps of at least this (timeouts carry their own ts)
    triage: TriageConfig = field(default_factory=TriageConfig)


class Core:
    """Every job's detectors and triage, driven by event time."""

    def __init__(self, config: CoreConfig | None = None) -> None:
        self.config = config or CoreConfig()
        self.monitors: dict[str, JobMonitor] = {}
        self.triage: dict[str, Triage] = {}
        self.node_job: dict[str, str] = {}
        self.watermark = float("-inf")
        self.max_ts = float("-inf")
        self.records = 0

    # --- records ----------------------------------------------------------------

    def process(self, rec: Record, out: Outputs | None = None) -> Outputs:
        """Observe one input record (after advancing time to the watermark); outputs are appended to `out`."""
        self.records += 1
        out = Outputs() if out is None else out
        if rec.ts > self.max_ts:
            self.max_ts = rec.ts
            if rec.ts - self.config.lateness_s >= self.watermark + self.config.tick_s:
                self.advance(rec.ts - self.config.lateness_s, out)
        kind = rec.kind
        if kind in _JOB_KEYED:
            job = rec.job
            mon = self.monitors.get(job)
            if mon is None:
                out.rejected.append(DecodeError(f"no `job` record seen for job {job!r}", "job", kind,
                                                raw=_short(rec)))
                return out
        elif kind in _NODE_KEYED:
            job = self.node_job.get(rec.node)
            if job is None:
                return out  # a node running no job we know: nothing to attribute it to
            mon = self.monitors[job]
        elif kind == "job":
            self._on_job(rec)
            return out
        else:  # ops
            for job in ([rec.job] if rec.job else sorted({self.node_job.get(rec.node)} - {None})):
                if job in self.triage:
                    self.triage[job].on_record(rec, out)
            return out
        tri = self.triage[job]
        findings = mon.observe(rec)
        if findings:
            tri.on_findings(findings, out)
        tri.on_record(rec, out)
        return out

    def _on_job(self, rec: Job) -> None:
        mon = self.monitors.get(rec.job)
        if mon is None:
            self.monitors[rec.job] = JobMonitor(rec)
            self.triage[rec.job] = Triage(rec.job, self.config.triage)
        else:
            for node in mon.topo.nodes:
                self.node_job.pop(node, None)
            mon.replace_topology(rec)
        for r in rec.ranks:
            self.node_job[r.node] = rec.job
        self.triage[rec.job].on_topology(self.monitors[rec.job].topo)

    # --- time -------------------------------------------------------------------

    def advance(self, now: float, out: Outputs | None = None) -> Outputs:
        """Fire every timeout up to event time `now` (never backwards)."""
        out = Outputs() if out is None else out
        if now <= self.watermark:
            return out
        self.watermark = now
        for job in sorted(self.monitors):
            tri = self.triage[job]
            findings = self.monitors[job].advance(now)
            if findings:
                tri.on_findings(findings, out)
            tri.advance(now, out)
        return out

    def finish(self) -> Outputs:
        """End of input: advance to the last event time seen (the end of a file is not silence)."""
        return self.advance(self.max_ts)

    # --- state ------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "config": {"lateness_s": self.config.lateness_s, "tick_s": self.config.tick_s,
                       "triage": asdict(self.config.triage)},
            "watermark": None if self.watermark == float("-inf") else self.watermark,
            "max_ts": None if self.max_ts == float("-inf") else self.max_ts,
            "records": self.records,
            "jobs": {job: {"monitor": self.monitors[job].state(), "triage": self.triage[job].state()}
                     for job in sorted(self.monitors)},
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Core:
        cfg = state["config"]
        core = cls(CoreConfig(cfg["lateness_s"], cfg["tick_s"], TriageConfig.from_dict(cfg["triage"])))
        core.watermark = float("-inf") if state["watermark"] is None else state["watermark"]
        core.max_ts = float("-inf") if state["max_ts"] is None else state["max_ts"]
        core.records = state["records"]
        for job, js in state["jobs"].items():
            mon = JobMonitor.from_state(js["monitor"])
            core.monitors[job] = mon
            core.triage[job] = Triage.from_state(js["triage"], core.config.triage, mon.topo)
            for node in mon.topo.nodes:
                core.node_job[node] = job
        return core


def _short(rec: Record) -> str:
    return encode(rec).decode()[:4096]
