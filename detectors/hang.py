"""Hang: heartbeats alive but no step progress for longer than the job's own rhythm allows.

The stall threshold comes from the job's step-time baseline, not a fixed ten
minutes: `max(min_stall_s, stall_factor x median step interval, spike_factor x
longest recent step)`, so checkpoint saves (long but finishing steps) do not
look like a hang while a 1 s/step job is declared hung within tens of seconds.

The finding names no culprit (every rank looks the same from outside); it
lists the ranks lagging behind the newest step when they are a small minority,
as a hint. Triage answers a hang with a stack and flight-recorder sweep.

A known pause (a `lifecycle` `pause` of any rank, or of the whole job, until its `resume`: a synchronous
checkpoint save, an evaluation pass) is no stall: the stall clock starts again when it ends. It is
bounded, never trusted forever: a pause of a kind not seen before may last `pause_limit_s`; later ones
`pause_factor` times the longest pause of that kind the job has had (as NVIDIA's resiliency extension sizes
its section timeouts from observed sections); past that the job is hung.

A job whose ranks exited (cleanly at its end, or crashing) after its last
progress has stopped, not hung: fail-stop speaks for it, and no hang is reported
until it makes progress again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
from gangwatch.detectors.base import DetectorBase
from gangwatch.detectors.config import HangConfig
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.steps import RecordRun, observe_each
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Record
from gangwatch.schemas.evidence import Evidence


@dataclass(frozen=True, slots=True, kw_only=True)
class HangEvidence(Evidence):
    """No step progress for `threshold_s` after `last_step`."""

    last_step: int  # the newest step any rank finished
    last_progress_ts: float  # when it was first seen
    threshold_s: float  # the stall that counts as a hang, from the job's rhythm
    baseline_s: float | None  # median step interval (None: no baseline yet)
    lagging_ranks: list[int]  # ranks behind the newest step, when a small minority (a hint, no verdict)


# names no culprit; the incident it opens asks for a stack + flight-recorder sweep
HANG = FindingType("hang", HangEvidence, Policy(
    incident="hang", risk=0.0, onset="last_progress_ts", sweep=True,
    describe=lambda f, ev: f"no step progress for {ev.threshold_s} s after step {ev.last_step}"))


_STOPS = frozenset({"exit", "exception", "oom"})  # framework records of a process that stopped


class HangDetector(DetectorBase):
    """Job-wide step progress of one job."""

    name: ClassVar[str] = "hang"
    kinds: ClassVar[frozenset[str]] = frozenset({"step", "framework", "lifecycle"})
    finding_types: ClassVar[tuple[FindingType, ...]] = (HANG,)

    def __init__(self, topo: Topology, config: HangConfig | None = None) -> None:
        self.config = config or HangConfig()
        self.longest: dict[str, float] = {}  # what a pause was -> the longest one of it the job has had
        self._reset(topo)

    def _reset(self, topo: Topology) -> None:
        self.topo = topo
        self.last_step = np.full(topo.size, -1, dtype=np.int64)
        self.max_step = -1
        self.progress_ts = topo.ts  # when the newest step was first seen
        self.intervals: list[float] = []
        self.seen_intervals = 0
        self.reported = False
        self.reports = 0  # hangs reported in this run: with the run's job record and the step, a finding's id
        self.stopped_ts = -np.inf  # the latest exit, exception or OOM of any rank
        self.paused: dict[int, tuple[float, str]] = {}  # rank (-1: the job) -> (since, what) of known pauses
        self._threshold: tuple[object, float] = (None, 0.0)  # cache: (intervals version, threshold)

    def set_topology(self, topo: Topology) -> None:
        self._reset(topo)  # a restart keeps what the job's pauses take (`longest`)

    def observe(self, rec: Record) -> list[Finding]:
        if rec.kind == "lifecycle":
            self._lifecycle(rec)
            return []
        if rec.rank >= self.topo.size:
            return []
        if rec.kind == "framework":
            if rec.type in _STOPS:
                self.stopped_ts = max(self.stopped_ts, rec.ts)
            return []
        if rec.step > self.last_step[rec.rank]:
            self.last_step[rec.rank] = rec.step
        if rec.step > self.max_step:
            self.progress(rec.step, rec.ts)
        return []

    def _lifecycle(self, rec: Record) -> None:
        if rec.rank is not None and rec.rank >= self.topo.size:
            return
        who = -1 if rec.rank is None else rec.rank
        if rec.event == "pause":
            self.paused.setdefault(who, (rec.ts, rec.reason or "pause"))
        elif rec.event == "resume" and who in self.paused:
            since, what = self.paused.pop(who)
            self.longest[what] = max(self.longest.get(what, 0.0), round(rec.ts - since, 6))
            if not self.paused:
                self.progress_ts = max(self.progress_ts, rec.ts)  # the stall clock starts again
        elif rec.event in ("stop", "end", "restart"):
            self.stopped_ts = max(self.stopped_ts, rec.ts)

    def pause_limit_s(self, what: str) -> float:
        """How long a known pause of kind `what` may last before the job counts as hung."""
        cfg, seen = self.config, self.longest.get(what)
        return cfg.pause_limit_s if seen is None else max(cfg.min_stall_s, cfg.pause_min_s, cfg.pause_factor * seen)

    def progress(self, step: int, ts: float) -> None:
        """A step past the newest one any rank finished, at `ts`: the job made progress."""
        if self.max_step >= 0 and ts > self.progress_ts:
            self.seen_intervals += 1
            if self.seen_intervals > self.config.warmup_steps and not self.reported:  # a hang is no rhythm
                gap = (ts - self.progress_ts) / (step - self.max_step)
                self.intervals = [*self.intervals[-(self.config.window - 1):], round(gap, 6)]
        self.max_step = step
        self.progress_ts = max(self.progress_ts, ts)
        self.reported = False

    def threshold_s(self) -> float:
        """Seconds without progress that count as a hang, from the job's recent rhythm."""
        cfg = self.config
        if not self.intervals:
            return cfg.min_stall_s * 3  # no baseline yet: be patient
        key = (len(self.intervals), self.intervals[-1], self.seen_intervals)
        if self._threshold[0] != key:
            self._threshold = (key, max(cfg.min_stall_s, cfg.stall_factor * float(np.median(self.intervals)),
                                        cfg.spike_factor * max(self.intervals)))
        return self._threshold[1]

    def advance(self, now: float) -> list[Finding]:
        if self.reported or self.max_step < 0 or self.stopped_ts >= self.progress_ts:
            return []
        threshold = self.threshold_s()
        if self.paused:  # a known pause holds the stall clock, up to its limit
            over = min(since + self.pause_limit_s(what) for since, what in self.paused.values())
            threshold = max(threshold, over - self.progress_ts)
        if now < self.progress_ts + threshold:
            return []
        self.reported = True
        self.reports += 1
        lagging = np.flatnonzero(self.last_step < self.max_step)
        hint = lagging.tolist() if 0 < len(lagging) <= self.config.max_lagging_frac * self.topo.size else []
        return [HANG.finding(
            ts=self.progress_ts + threshold, job=self.topo.job, detector="hang.progress",
            # the id may not depend on progress_ts: the step's first record to *arrive* sets it, which differs
            # between a live worker and a replay of what it read by a few ms (and the incident's id, and the ids of
            # the actions a controller answers, follow from this one)
            key=(self.max_step, self.topo.ts, self.reports), score=1.0,
            evidence=HangEvidence(
                last_step=int(self.max_step), last_progress_ts=round(self.progress_ts, 6),
                threshold_s=round(threshold, 3),
                baseline_s=round(float(np.median(self.intervals)), 6) if self.intervals else None,
                lagging_ranks=hint),
        )]

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "last_step": self.last_step.tolist(), "max_step": self.max_step,
                "progress_ts": self.progress_ts, "intervals": list(self.intervals),
                "seen_intervals": self.seen_intervals, "reported": self.reported, "reports": self.reports,
                "stopped_ts": None if np.isinf(self.stopped_ts) else self.stopped_ts,
                "paused": [[r, since, what] for r, (since, what) in sorted(self.paused.items())],
                "longest": dict(self.longest)}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> HangDetector:
        det = cls(topo, HangConfig(**state["config"]))
        det.last_step = np.asarray(state["last_step"], dtype=np.int64)
        det.max_step = state["max_step"]
        det.progress_ts = state["progress_ts"]
        det.intervals = list(state["intervals"])
        det.seen_intervals = state["seen_intervals"]
        det.reported = state["reported"]
        det.reports = state["reports"]
        det.stopped_ts = -np.inf if state["stopped_ts"] is None else state["stopped_ts"]
        det.paused = {int(r): (since, what) for r, since, what in state["paused"]}
        det.longest = dict(state["longest"])
        return det

    def observe_run(self, run: RecordRun) -> list[tuple[int, list[Finding]]]:
        """Steps: each rank's last step is the largest it reported; only a step past the job's newest one (a
        handful per run) moves the job's progress; a run with a framework or lifecycle record goes through
        `observe`, record by record."""
        if "framework" in run.by_kind or "lifecycle" in run.by_kind:
            return observe_each(self, run)
        cols = run.steps()
        ok = cols.rank < self.topo.size
        rank, step, ts = cols.rank[ok], cols.step[ok], cols.ts[ok]
        if step.size == 0:
            return []
        np.maximum.at(self.last_step, rank, step)
        before = np.maximum.accumulate(np.concatenate(([self.max_step], step[:-1])))
        new = np.flatnonzero(step > before)
        for s, t in zip(step[new].tolist(), ts[new].tolist(), strict=True):
            self.progress(s, t)  # never a finding: hang finds only as time passes
        return []
