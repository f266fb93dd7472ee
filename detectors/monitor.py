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
from collections.abc import Callable, Mapping
from dataclasses import asdict
from functools import cache
from operator import attrgetter
from typing import Any

import numpy as np
from gangwatch.detectors.base import Detector
from gangwatch.detectors.catalog import DEFAULT_DETECTORS  # the detectors every job gets, in emission order
from gangwatch.detectors.failstop import LIVE, NOT_STARTED, SILENT, FailStopDetector
from gangwatch.detectors.hang import HangDetector
from gangwatch.detectors.steps import RecordRun, observe_each
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Job, Record, to_dict
from gangwatch.schemas.codec import decode_obj

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


# --- run paths of detectors that have none of their own -----------------------------------------
# (they read the detector's state as its `observe` does; each falls back to `observe` record by record
# whenever the shortcut could differ from it)

_RANK, _TS = attrgetter("rank"), attrgetter("ts")
RunPath = Callable[[Any, RecordRun], list[tuple[int, list[Finding]]]]


def _ranks_and_times(run: RecordRun, kinds: frozenset[str]) -> tuple[np.ndarray, np.ndarray]:
    """(rank, ts) of the run's records of `kinds` (steps and heartbeats), in run order: steps from the run's
    columns, other records from their attributes."""
    parts = []  # (positions, ranks, times) per kind
    for kind in kinds:
        pos = run.by_kind.get(kind)
        if not pos:
            continue
        if kind == "step":
            cols = run.steps()
            parts.append((pos, cols.rank, cols.ts))
        else:
            mine = list(map(run.recs.__getitem__, pos))
            parts.append((pos, np.fromiter(map(_RANK, mine), dtype=np.int64, count=len(mine)),
                          np.fromiter(map(_TS, mine), dtype=np.float64, count=len(mine))))
    if len(parts) == 1:
        return parts[0][1], parts[0][2]
    order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")
    return np.concatenate([p[1] for p in parts])[order], np.concatenate([p[2] for p in parts])[order]


def _failstop_run(det: FailStopDetector, run: RecordRun) -> list[tuple[int, list[Finding]]]:
    """Heartbeats and steps of ranks not exited nor silent, none of them due before the next tick: each only
    makes its rank live and moves its last-seen time forward (`observe` gives no finding and schedules nothing
    sooner for them). Otherwise `beat` on each in turn (what `observe` does with them); a run with a
    framework or lifecycle record goes through `observe`, record by record."""
    if "framework" in run.by_kind or "lifecycle" in run.by_kind:
        return observe_each(det, run)
    rank, ts = _ranks_and_times(run, det.kinds)
    ok = (rank < det.topo.size) & (ts >= det.topo.ts)
    rank, ts = rank[ok], ts[ok]
    if rank.size == 0:
        return []
    if not det.stepped:  # start-up lasts until a step of this run (or a heartbeat that names its rank's last one)
        cols = run.steps() if "step" in run.by_kind else None
        det.stepped = (cols is not None and bool(((cols.rank < det.topo.size) & (cols.ts >= det.topo.ts)).any())) \
            or any(run.recs[i].step is not None and run.recs[i].ts >= det.topo.ts
                   for i in run.by_kind.get("heartbeat", ()))
    status = det.status[rank]
    if (status == SILENT).any():  # a late record may withdraw a report of silence: record by record
        return observe_each(det, run)
    if not ((status == LIVE) | (status == NOT_STARTED)).all() or float((ts + det.timeout).min()) < det.next_tick:
        beat = det.beat
        for r, t in zip(rank.tolist(), ts.tolist(), strict=True):
            beat(r, t)
        return []
    det.status[rank] = LIVE
    np.maximum.at(det.last_seen, rank, ts)
    return []


def _hang_run(det: HangDetector, run: RecordRun) -> list[tuple[int, list[Finding]]]:
    """Steps: each rank's last step is the largest it reported; only a step past the job's newest one (a
    handful per run) moves the job's progress; a run with a framework or lifecycle record goes through
    `observe`, record by record."""
    if "framework" in run.by_kind or "lifecycle" in run.by_kind:
        return observe_each(det, run)
    cols = run.steps()
    ok = cols.rank < det.topo.size
    rank, step, ts = cols.rank[ok], cols.step[ok], cols.ts[ok]
    if step.size == 0:
        return []
    np.maximum.at(det.last_step, rank, step)
    before = np.maximum.accumulate(np.concatenate(([det.max_step], step[:-1])))
    new = np.flatnonzero(step > before)
    for s, t in zip(step[new].tolist(), ts[new].tolist(), strict=True):
        det.progress(s, t)  # never a finding: hang finds only as time passes
    return []


RUN_PATHS: dict[type, RunPath] = {FailStopDetector: _failstop_run, HangDetector: _hang_run}


class JobMonitor:
    """All detectors of one job."""

    def __init__(self, job: Job, detectors: tuple[type, ...] = DEFAULT_DETECTORS,
                 configs: Mapping[str, Any] | None = None) -> None:
        self.job_record = job
        self.topo = Topology.from_job(job)
        self.configs = _checked(configs, detectors)
        self.detectors: list[Detector] = [cls(self.topo, self.configs[cls.name]) for cls in detectors]
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

    def observe_run(self, run: RecordRun) -> dict[int, list[Finding]]:
        """What `observe` on each record of `run` in turn gives (no time passes between them), as position in
        the run -> its findings, detectors in emission order; positions without findings are left out.

        Each detector gets the records of its kinds at once: through its `observe_run` when it has one
        (the step scorers, fail-stop, hang: vectorized), else record by record. Detectors share no state,
        so taking them one after the other gives each record's findings as taking the records in turn does.
        """
        found: dict[int, list[Finding]] = {}
        for det in self.detectors:
            if not any(k in run.by_kind for k in det.kinds):
                continue
            many = getattr(det, "observe_run", None)
            path = RUN_PATHS.get(type(det))
            pairs = many(run) if many is not None else path(det, run) if path is not None else observe_each(det, run)
            for i, fs in pairs:
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
            finish = getattr(det, "finish", None)
            if finish is not None:
                out += finish()
        return out

    def state(self) -> dict[str, Any]:
        return {"job": to_dict(self.job_record), "detectors": {d.name: d.state() for d in self.detectors}}

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
