"""JobMonitor: the detectors of one job, fed its records in event-time order.

It owns the job's topology (from `job` records), routes each record to the
detectors that want its kind, advances them all through event time, and
saves/restores their state as one JSON-able value.

Thresholds come from the caller: `configs` maps a detector's name to an
instance of its config dataclass (the type of its constructor's `config`
argument, see `config_type`); a detector left out runs with its defaults. A
restored monitor runs with the caller's configs too, never the ones in the
saved state, so a redeploy with new thresholds reaches restored jobs.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import asdict
from functools import cache
from typing import Any

from gangwatch.detectors.base import Detector
from gangwatch.detectors.catalog import DEFAULT_DETECTORS  # the detectors every job gets, in emission order
from gangwatch.detectors.clocks import ClockDetector
from gangwatch.detectors.runs import RecordRun
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Job, Record, to_dict
from gangwatch.schemas.codec import decode_obj
from gangwatch.schemas.columns import StepRows

__all__ = ["DEFAULT_DETECTORS", "JobMonitor", "RecordRun", "config_type", "detector_configs"]


@cache
def config_type(cls: type) -> type:
    """The config dataclass a detector class takes (its constructor's `config: XConfig | None`)."""
    hint = typing.get_type_hints(cls.__init__)["config"]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return args[0]


def detector_configs(detectors: tuple[type, ...] = DEFAULT_DETECTORS) -> dict[str, type]:
    """Detector name -> its config dataclass, in catalog order."""
    return {cls.name: config_type(cls) for cls in detectors}


def _checked(configs: Mapping[str, Any] | None, detectors: tuple[type, ...]) -> dict[str, Any]:
    """Every detector's config: the caller's, or its defaults; a name or a type nobody knows is an error."""
    configs = dict(configs or {})
    kinds = detector_configs(detectors)
    unknown = sorted(set(configs) - set(kinds))
    if unknown:
        raise ValueError(f"no detector named {', '.join(unknown)} (detectors: {', '.join(kinds)})")
    out = {}
    for name, kind in kinds.items():
        cfg = configs.get(name)
        if cfg is not None and not isinstance(cfg, kind):
            raise TypeError(f"detector {name} takes a {kind.__name__}, not a {type(cfg).__name__}")
        out[name] = kind() if cfg is None else cfg
    return out




class JobMonitor:
    """All detectors of one job."""

    def __init__(self, job: Job, detectors: tuple[type, ...] = DEFAULT_DETECTORS,
                 configs: Mapping[str, Any] | None = None) -> None:
        self.job_record = job
        self._job_dict: tuple[Job, dict[str, Any]] | None = None  # (job_record, its wire form), for `state()`
        self.topo = Topology.from_job(job)
        self.configs = _checked(configs, detectors)
        self.detectors: list[Detector] = [cls(self.topo, self.configs[cls.name]) for cls in detectors]
        self._routes = self._build_routes()

    def _build_routes(self) -> dict[str, list[Detector]]:
        """Kind -> the detectors that read it, but the clock (`self.clocks`), which reads every record first."""
        clocks = [d for d in self.detectors if isinstance(d, ClockDetector)]
        self.clocks = clocks[0] if clocks else ClockDetector(self.topo)
        for det in self.detectors:
            if hasattr(det, "clock"):  # a detector that judges silence reads the job's own time from it
                det.clock = self.clocks
        routes: dict[str, list[Detector]] = {}
        for det in self.detectors:
            if det is self.clocks:
                continue
            for kind in det.kinds:
                routes.setdefault(kind, []).append(det)
        return routes

    def replace_topology(self, job: Job) -> None:
        """A new `job` record (a node was swapped in, or the job restarted)."""
        self.job_record = job
        self.topo = Topology.from_job(job)
        for det in self.detectors:
            det.set_topology(self.topo)

    def unstepped(self, rec: Record | StepRows) -> Record | StepRows:
        """`rec` with its node's clock steps taken out of its time (`clocksteps.py`): what every part of the job
        reads (a record the clock does not read, the launcher's or the controller's, as it came)."""
        if type(rec) is StepRows:
            return self.clocks.steps.unstepped_rows(rec)
        return self.clocks.steps.unstepped(rec) if rec.kind in self.clocks.kinds else rec

    def observe(self, rec: Record) -> list[Finding]:
        """Every detector's findings of one record: the clock's first (it learns from the record's own time),
        then the others', which read it with its node's clock offset taken out."""
        clocks = self.clocks
        out: list[Finding] = clocks.observe(rec) if rec.kind in clocks.kinds else []
        rec = clocks.corrected(rec)
        for det in self._routes.get(rec.kind, ()):
            out += det.observe(rec)
        return out

    def observe_run(self, run: RecordRun) -> dict[int, list[Finding]]:
        """What `observe` on each record of `run` in turn gives (no time passes between them), as position in
        the run -> its findings, detectors in emission order; positions without findings are left out.

        Each detector gets the records of its kinds at once, through its `observe_run` (vectorized for the
        step scorers, fail-stop and hang; record by record by default: `base.DetectorBase`). Detectors share no state,
        so taking them one after the other gives each record's findings as taking the records in turn does.
        """
        clocks = self.clocks
        found: dict[int, list[Finding]] = {}
        if any(k in run.by_kind for k in clocks.kinds):  # the clock reads the raw times, first ...
            for i, fs in clocks.observe_run(run):
                found[i] = list(fs)
        run = clocks.corrected_run(run)  # ... the others these, its offsets taken out
        for det in self.detectors:
            if det is clocks or not any(k in run.by_kind for k in det.kinds):
                continue
            for i, fs in det.observe_run(run):
                have = found.get(i)
                if have is None:
                    found[i] = list(fs)
                else:
                    have += fs
        return found

    def advance(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for det in self.detectors:
            out += det.advance(now)
        return out

    def finish(self) -> list[Finding]:
        """The input ended (replay): what detectors still collecting (sweeps) make of what they have."""
        out: list[Finding] = []
        for det in self.detectors:
            out += det.finish()
        return out

    def state(self) -> dict[str, Any]:
        """The monitor's state as plain data (read-only: its `job` part is kept from one call to the next, as
        building it anew for a 100k-rank job was most of the cost of saving its state)."""
        if self._job_dict is None or self._job_dict[0] is not self.job_record:
            self._job_dict = (self.job_record, to_dict(self.job_record))
        return {"job": self._job_dict[1], "detectors": {d.name: d.state() for d in self.detectors}}

    @classmethod
    def from_state(cls, state: dict[str, Any], detectors: tuple[type, ...] = DEFAULT_DETECTORS,
                   configs: Mapping[str, Any] | None = None) -> JobMonitor:
        """A monitor restored from `state()`, its detectors running with `configs` (not the saved ones)."""
        job = decode_obj(state["job"])
        mon = cls(job, detectors, configs)
        restored = []
        for t in detectors:
            saved = state["detectors"][t.name]
            if isinstance(saved, dict) and "config" in saved:  # a detector's snapshot carries its config: today's wins
                saved = {**saved, "config": asdict(mon.configs[t.name])}
            restored.append(t.from_state(saved, mon.topo))
        mon.detectors = restored
        mon._routes = mon._build_routes()
        return mon
