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
until it makes progress again. So has a job that heartbeats when no heartbeat
of any rank came in the `alive_periods` heartbeat periods before the stall's
threshold passed: nothing shows it alive, and its silence is fail-stop's (a node
gone, the monitoring path down, or the job ended without a word); the hang is
reported if a heartbeat of that time turns up late. (A job whose client sends no
heartbeats has only its steps: their stopping is a hang, as ever.)

Frozen ranks: a node agent heartbeats for a rank whose process lives but cannot
run (`source: "agent"`, `proc_state` T stopped, t traced, D uninterruptible;
producers/agent/frozen.py). The detector keeps each such rank as frozen from the
agent's first report until the rank's own heartbeat or step after the agent's
latest one, or until the agent's reports stop (2.5 heartbeat periods). A hang
found while a rank is frozen names it: one `frozen_rank` finding per frozen rank
with the hang (and one as soon as a rank freezes during a stall already
reported), naming the rank, its node and its state. Its policy names the rank's
node as what the stall waits on, and evicts nothing for it (triage waits for it
to thaw, then tells a human); a py-spy sweep cannot see it (a stopped process
answers no dump), so without it the stall would name nobody.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
from gangwatch.detectors.base import DetectorBase, SavedJob, fill_missing
from gangwatch.detectors.config import HangConfig
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.runs import RecordRun, observe_each
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Record
from gangwatch.schemas.evidence import Evidence
from gangwatch.schemas.records import FROZEN_STATES


@dataclass(frozen=True, slots=True, kw_only=True)
class HangEvidence(Evidence):
    """No step progress for `threshold_s` after `last_step`."""

    last_step: int  # the newest step any rank finished
    last_progress_ts: float  # when the job last made progress (a rank finished a step of its own)
    threshold_s: float  # the stall that counts as a hang, from the job's rhythm
    baseline_s: float | None  # median step interval (None: no baseline yet)
    lagging_ranks: list[int]  # ranks behind the newest step, when a small minority (a hint, no verdict)


# names no culprit; the incident it opens asks for a stack + flight-recorder sweep
HANG = FindingType("hang", HangEvidence, Policy(
    incident="hang", risk=0.0, onset="last_progress_ts", sweep=True,
    describe=lambda f, ev: f"no step progress for {ev.threshold_s} s after step {ev.last_step}"))


@dataclass(frozen=True, slots=True, kw_only=True)
class FrozenRank(Evidence):
    """The rank's process alive but frozen, as its node's agent reports it, while the job makes no progress."""

    proc_state: str  # the /proc/PID/stat letter the agent read: T, t or D
    state: str  # ... in words: stopped, stopped by a tracer, in uninterruptible sleep
    since_ts: float  # the agent's first report of it frozen
    last_report_ts: float  # its latest report when this finding was made
    last_step: int  # the newest step any rank finished (the job waits since)


# names the rank a stall waits on and its node, but evicts nothing for being frozen: triage waits for it to thaw
FROZEN_RANK = FindingType("frozen_rank", FrozenRank, Policy(
    incident="hang", opens=False, verdict=True, weight=0.9, onset="since_ts", frozen=True,
    risk=lambda f, ev: 0.2 if ev.proc_state == "D" else 0.0,  # a hung filesystem or driver call is the node's
    label=lambda f, ev: f"frozen_rank ({ev.proc_state})",
    describe=lambda f, ev: f"rank {f.rank} on {f.node} is {ev.state} ({ev.proc_state}), its node's agent says"))

_FROZEN_FRESH = 2.5  # heartbeat periods after the agent's latest report that a rank is still taken as frozen

_STOPS = frozenset({"exit", "exception", "oom"})  # framework records of a process that stopped


def _advanced(rank: np.ndarray, step: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Per record (in order): whether it is past every step its rank reported before it (`last`: each rank's
    newest before these records), as record-by-record updates of `last` would find."""
    n = len(rank)
    order = np.lexsort((np.arange(n), rank))  # by rank, each rank's records in order
    r, s = rank[order], step[order]
    big = np.int64(1) << 32
    key = np.maximum.accumulate(r * big + s)  # ranks ascend, so a running max stays within its rank
    prior = np.empty(n, dtype=np.int64)
    prior[0] = -1
    prior[1:] = np.where(r[1:] == r[:-1], key[:-1] - r[1:] * big, -1)
    out = np.empty(n, dtype=bool)
    out[order] = s > np.maximum(prior, last[r])
    return out


class HangDetector(DetectorBase):
    """Job-wide step progress of one job."""

    name: ClassVar[str] = "hang"
    kinds: ClassVar[frozenset[str]] = frozenset({"step", "framework", "lifecycle", "heartbeat"})
    finding_types: ClassVar[tuple[FindingType, ...]] = (HANG, FROZEN_RANK)

    def __init__(self, topo: Topology, config: HangConfig | None = None) -> None:
        self.config = config or HangConfig()
        self.clock: Any = None  # the job's `clocks.ClockDetector` (JobMonitor hands it over): when steps ended
        self.longest: dict[str, float] = {}  # what a pause was -> the longest one of it the job has had
        self._reset(topo)

    def _reset(self, topo: Topology) -> None:
        self.topo = topo
        self.last_step = np.full(topo.size, -1, dtype=np.int64)
        self.max_step = -1
        self.progress_ts = topo.ts  # when the job last made progress: a rank finished a step (the stall clock)
        self.first_ts = topo.ts  # when the newest step was first seen (the rhythm's clock)
        self.now = -math.inf  # the job's time at the last advance
        self.heard_ts = -math.inf  # the newest heartbeat of a rank of the job (-inf: it sends none)
        self.intervals: list[float] = []
        self.seen_intervals = 0
        self.reported = False
        self.reports = 0  # hangs reported in this run: with the run's job record and the step, a finding's id
        self.stopped_ts = -np.inf  # the latest exit, exception or OOM of any rank
        self.paused: dict[int, tuple[float, str]] = {}  # rank (-1: the job) -> (since, what) of known pauses
        self._threshold: tuple[object, float] = (None, 0.0)  # cache: (intervals version, threshold)
        self.frozen: dict[int, tuple[str, float, float]] = {}  # rank -> (state, since, latest agent report)
        self.named: set[int] = set()  # frozen ranks named in the stall reported now

    def set_topology(self, topo: Topology) -> None:
        self._reset(topo)  # a restart keeps what the job's pauses take (`longest`)

    def observe(self, rec: Record) -> list[Finding]:
        if rec.kind == "lifecycle":
            self._lifecycle(rec)
            return []
        if rec.rank >= self.topo.size:
            return []
        if rec.kind == "heartbeat":
            if rec.ts > self.heard_ts and rec.extra.get("source") != "agent":  # a rank's own
                self.heard_ts = rec.ts
            return self._beat(rec)
        if rec.kind == "framework":
            if rec.type in _STOPS:
                self.stopped_ts = max(self.stopped_ts, rec.ts)
            return []
        advanced = rec.step > self.last_step[rec.rank]
        if advanced:
            self.last_step[rec.rank] = rec.step
        if self.frozen:
            self._thaw(rec.rank, rec.ts)
        if rec.step > self.max_step:
            self.progress(rec.step, rec.ts)
        elif advanced:
            self._confirm(rec.ts if self.clock is None else
                          min(rec.ts, self.clock.step_end(rec.step) + self.config.ahead_s))  # (`_bounded`'s)
        return []

    def _bounded(self, step: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """When ranks that finished these steps of their own made progress: their times, but no later than
        `ahead_s` past the step's end by the clocks that agreed on it (`ClockDetector.step_ends`). A gang ends a
        step together: a rank's step stamped later is a clock that stepped ahead, its offset not learned yet, and
        it proves no progress past the step's own end."""
        if self.clock is None:
            return ts
        return np.minimum(ts, self.clock.step_ends(step) + self.config.ahead_s)

    def _confirm(self, ts: float) -> None:
        """A rank finished a step of its own, not past the newest one: the job was still making progress then (a
        node whose records come early, its clock behind in an event-time replay, reaches the newest step first;
        the others' steps after it are progress too)."""
        if self.now > -math.inf:
            ts = min(ts, self.now + self.config.ahead_s)
        if ts > self.progress_ts:
            self.progress_ts = ts

    def _beat(self, rec: Record) -> list[Finding]:
        """A heartbeat: the agent's for a frozen rank (named at once during a stall already reported), or the
        rank's own, which ends its freeze."""
        state = rec.extra.get("proc_state") if rec.extra.get("source") == "agent" else None
        if state not in FROZEN_STATES:
            if self.frozen:
                self._thaw(rec.rank, rec.ts)
            return []
        was = self.frozen.get(rec.rank)
        fresh = was is not None and rec.ts - was[2] <= _FROZEN_FRESH * self.topo.heartbeat_s
        self.frozen[rec.rank] = (was[0] if fresh else state, was[1] if fresh else rec.ts, max(rec.ts, was[2])
                                 if fresh else rec.ts)
        if self.reported and rec.rank not in self.named:
            return self._name_frozen(rec.ts, [rec.rank])
        return []

    def _thaw(self, rank: int, ts: float) -> None:
        """The rank's own record at `ts`: after the agent's latest report, it runs again."""
        was = self.frozen.get(rank)
        if was is not None and ts > was[2]:
            del self.frozen[rank]

    def frozen_at(self, now: float) -> list[int]:
        """The ranks frozen at `now`: the agent reported them within `_FROZEN_FRESH` heartbeat periods."""
        fresh = _FROZEN_FRESH * self.topo.heartbeat_s
        return sorted(r for r, (_, _, last) in self.frozen.items() if now - last <= fresh)

    def _name_frozen(self, ts: float, ranks: list[int]) -> list[Finding]:
        out = []
        for r in ranks:
            state, since, last = self.frozen[r]
            self.named.add(r)
            out.append(FROZEN_RANK.finding(
                ts=ts, job=self.topo.job, detector="hang.frozen", topo=self.topo, rank=r, score=1.0,
                key=(r, since, self.topo.ts, self.reports),
                evidence=FrozenRank(proc_state=state, state=FROZEN_STATES[state], since_ts=round(since, 6),
                                    last_report_ts=round(last, 6), last_step=int(self.max_step))))
        return out

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
                self.first_ts = max(self.first_ts, rec.ts)  # (and the pause is no step of the rhythm)
        elif rec.event in ("stop", "end", "restart"):
            self.stopped_ts = max(self.stopped_ts, rec.ts)

    def pause_limit_s(self, what: str) -> float:
        """How long a known pause of kind `what` may last before the job counts as hung."""
        cfg, seen = self.config, self.longest.get(what)
        return cfg.pause_limit_s if seen is None else max(cfg.min_stall_s, cfg.pause_min_s, cfg.pause_factor * seen)

    def progress(self, step: int, ts: float) -> None:
        """A step past the newest one any rank finished, at `ts`: the job made progress."""
        # a step stamped ahead of the job's own time (a node whose clock ran ahead, before its offset is learned)
        # happened no later than the job's time: it must not make a 25 s "step" of the job's rhythm
        if self.now > -math.inf:
            ts = min(ts, self.now + self.config.ahead_s)
        if self.max_step >= 0 and ts > self.first_ts:
            self.seen_intervals += 1
            if self.seen_intervals > self.config.warmup_steps and not self.reported:  # a hang is no rhythm
                gap = (ts - self.first_ts) / (step - self.max_step)
                self.intervals = [*self.intervals[-(self.config.window - 1):], round(gap, 6)]
        self.max_step = step
        self.progress_ts = max(self.progress_ts, ts)
        self.first_ts = max(self.first_ts, ts)
        self.reported = False
        self.named.clear()

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
        self.now = max(self.now, now)
        if self.reported or self.max_step < 0 or self.stopped_ts >= self.progress_ts:
            return []
        threshold = self.threshold_s()
        if self.paused:  # a known pause holds the stall clock, up to its limit
            over = min(since + self.pause_limit_s(what) for since, what in self.paused.values())
            threshold = max(threshold, over - self.progress_ts)
        if now < self.progress_ts + threshold:
            return []
        at = self.progress_ts + threshold
        if -math.inf < self.heard_ts < at - self.config.alive_periods * self.topo.heartbeat_s:
            return []  # its heartbeats stopped too: not alive as far as records tell (fail-stop's silence)
        self.reported = True
        self.reports += 1
        lagging = np.flatnonzero(self.last_step < self.max_step)
        hint = lagging.tolist() if 0 < len(lagging) <= self.config.max_lagging_frac * self.topo.size else []
        return [HANG.finding(
            ts=at, job=self.topo.job, detector="hang.progress",
            # the id may not depend on progress_ts: the step's first record to *arrive* sets it, which differs
            # between a live worker and a replay of what it read by a few ms (and the incident's id, and the ids of
            # the actions a controller answers, follow from this one)
            key=(self.max_step, self.topo.ts, self.reports), score=1.0,
            evidence=HangEvidence(
                last_step=int(self.max_step), last_progress_ts=round(self.progress_ts, 6),
                threshold_s=round(threshold, 3),
                baseline_s=round(float(np.median(self.intervals)), 6) if self.intervals else None,
                lagging_ranks=hint),
        ), *self._name_frozen(at, self.frozen_at(at))]  # after the hang: it opens the incident they join

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "last_step": self.last_step.tolist(), "max_step": self.max_step,
                "progress_ts": self.progress_ts, "first_ts": self.first_ts, "intervals": list(self.intervals),
                "seen_intervals": self.seen_intervals, "reported": self.reported, "reports": self.reports,
                "stopped_ts": None if np.isinf(self.stopped_ts) else self.stopped_ts,
                "paused": [[r, since, what] for r, (since, what) in sorted(self.paused.items())],
                "longest": dict(self.longest),
                # only while some rank is frozen: a state without them (saved before issue 35) is one with none
                **({"frozen": [[r, st, since, last] for r, (st, since, last) in sorted(self.frozen.items())]}
                   if self.frozen else {}),
                **({"named": sorted(self.named)} if self.named else {}),
                "now": self.now if self.now > -math.inf else None,
                "heard_ts": None if self.heard_ts == -math.inf else self.heard_ts}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> HangDetector:
        det = cls(topo, HangConfig(**state["config"]))
        det.last_step = np.asarray(state["last_step"], dtype=np.int64)
        det.max_step = state["max_step"]
        det.progress_ts = state["progress_ts"]
        det.first_ts = state["first_ts"]
        det.intervals = list(state["intervals"])
        det.seen_intervals = state["seen_intervals"]
        det.reported = state["reported"]
        det.reports = state["reports"]
        det.stopped_ts = -np.inf if state["stopped_ts"] is None else state["stopped_ts"]
        det.paused = {int(r): (since, what) for r, since, what in state["paused"]}
        det.longest = dict(state["longest"])
        # saved before frozen ranks were kept: none frozen, none named
        det.frozen = {int(r): (st, since, last) for r, st, since, last in state.get("frozen", ())}
        det.named = set(state.get("named", ()))
        det.now = -math.inf if state["now"] is None else state["now"]
        det.heard_ts = -math.inf if state["heard_ts"] is None else state["heard_ts"]
        return det

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        """Its saved state brought up to date (`DetectorBase.upgrade_state`)."""
        if version == 2:  # grew without a version change: any of this may be missing
            fill_missing(state, {"stopped_ts": None, "paused": [], "longest": {}, "reports": int(state["reported"])})
        if version == 4 and state is not None:  # issue 42: the stall and rhythm clocks were one; no time known yet
            # (no clamp of a step stamped ahead until time next moves)
            fill_missing(state, {"first_ts": state["progress_ts"], "now": None})
            fill_missing(state, {"heard_ts": None})  # no heartbeat known: a stall is a hang until one comes
        return state

    def observe_run(self, run: RecordRun) -> list[tuple[int, list[Finding]]]:
        """Steps: each rank's last step is the largest it reported; only a step past the job's newest one (a
        handful per run) moves the job's progress; a run with a framework or lifecycle record goes through
        `observe`, record by record."""
        if "framework" in run.by_kind or "lifecycle" in run.by_kind:
            return observe_each(self, run)
        out = self._beats(run) if "heartbeat" in run.by_kind else []
        cols = run.steps()
        ok = cols.rank < self.topo.size
        rank, step, ts = cols.rank[ok], cols.step[ok], cols.ts[ok]
        if step.size == 0:
            return out
        advanced = _advanced(rank, step, self.last_step)
        np.maximum.at(self.last_step, rank, step)
        if self.frozen:  # a frozen rank's own step ends its freeze
            for r in [r for r in self.frozen if r in set(rank.tolist())]:
                self._thaw(r, float(ts[rank == r].max()))
        before = np.maximum.accumulate(np.concatenate(([self.max_step], step[:-1])))
        new = step > before
        # the other ranks' own steps between two new ones are progress too (`_confirm`): the latest of each stretch
        stretch = np.cumsum(new)
        confirmed = np.full(int(stretch[-1]) + 1, -np.inf)
        same = advanced & ~new
        np.maximum.at(confirmed, stretch[same], self._bounded(step[same], ts[same]))
        at = np.flatnonzero(new)
        for k, (s, t) in enumerate(zip(step[at].tolist(), ts[at].tolist(), strict=True)):
            if confirmed[k] > -np.inf:
                self._confirm(float(confirmed[k]))
            self.progress(s, t)  # never a finding: hang finds only as time passes
        if confirmed[-1] > -np.inf:
            self._confirm(float(confirmed[-1]))
        return out

    def _beats(self, run: RecordRun) -> list[tuple[int, list[Finding]]]:
        """The run's heartbeats: the agents' ones are records of their own (their extra fields keep them out of
        the decoder's columns); the ranks' own, columns or records, show the job alive (`heard_ts`) and matter
        otherwise only while some rank is frozen."""
        out = []
        recs, size = run.recs, self.topo.size
        own = [t for i, r, t in zip(run.by_kind["heartbeat"], run.lists("heartbeat", "rank"),
                                    run.lists("heartbeat", "ts"), strict=True)
               if r < size and (recs[i] is None or recs[i].extra.get("source") != "agent")]  # the ranks' own
        if own:
            self.heard_ts = max(self.heard_ts, max(own))
        for i in run.by_kind["heartbeat"]:
            rec = recs[i]
            if rec is not None and (rec.extra or self.frozen) and rec.rank < self.topo.size:
                found = self._beat(rec)
                if found:
                    out.append((i, found))
        if self.frozen:  # the ranks' own heartbeats from the decoder's columns
            for r, t in zip(run.lists("heartbeat", "rank"), run.lists("heartbeat", "ts"), strict=True):
                if r in self.frozen:
                    self._thaw(r, t)
        return out
