"""A job's ordinary life, as data: the states it moves through, each with the record that moved it.

    starting ──first step──► running ◄──resume── paused
        ▲                     │  └──pause──────────▲
        │ job record          ├─ every rank exited cleanly, or `end` ─► finished
        │                     ├─ a rank stops on purpose ─► stopping ─ all ranks ended ─► stopped
        │                     ├─ a rank crashes or loses a peer ─► failed (what follows is its teardown)
        │                     └─ the controller's `restart` ─► restarting
        └──────────── (a new job record, from any state: "restarted after ...")

Sources, in the order they are trusted: what the job says (`lifecycle` records
from the trainer client, the launcher and the controller; a clean `exit`), then
inference where nobody said anything: every rank ending with code 0 is a
finished job, every rank stopped on purpose is a stopped job, and a new `job`
record with the same id after an end is a restart.

Each move is one `job_state` finding naming the new state, the one before and
what moved it. None of them is a fault: they open no incident and point at no
node; triage reads them to know that the silence of a stopped or finished job,
or of a job its controller is restarting, is expected. In the store they are
the job's life (`gw_jobs`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from gangwatch.detectors.base import DetectorBase, SavedJob, fill_missing
from gangwatch.detectors.config import LifeConfig
from gangwatch.detectors.failstop import PEER_LOST, clean_exit
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.runs import RecordRun, observe_each
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Record, decode_obj, to_dict
from gangwatch.schemas.evidence import Evidence

STATES = ("starting", "running", "paused", "stopping", "stopped", "finished", "failed", "restarting")
# the job's silence is expected: nothing opens. `stopping` is not: a rank killed outright says nothing, and its
# siblings' stops (the launcher's teardown) must not hide it; a job stops once every rank has ended.
QUIET = frozenset({"stopped", "finished", "restarting"})
_CRASHES = frozenset({"exception", "oom", "exit"})


@dataclass(frozen=True, slots=True, kw_only=True)
class JobState(Evidence):
    """The job moved to `state` from `previous`, because of `cause`."""

    state: str
    previous: str | None
    cause: str  # what moved it, in words ("SIGTERM on 6 of 6 ranks", "first step 0", "pause: checkpoint", ...)
    ended_ranks: int  # ranks that exited or stopped since the job (re)started
    job_ranks: int


JOB_STATE = FindingType("job_state", JobState, Policy(
    incident=None, weight=0.0, risk=0.0, job_state=lambda f, ev: ev.state,
    describe=lambda f, ev: f"job {ev.state}: {ev.cause}"))


class JobLifeDetector(DetectorBase):
    """The life of one job: where it is between start and end."""

    name: ClassVar[str] = "life"
    kinds: ClassVar[frozenset[str]] = frozenset({"step", "framework", "lifecycle"})
    finding_types: ClassVar[tuple[FindingType, ...]] = (JOB_STATE,)

    def __init__(self, topo: Topology, config: LifeConfig | None = None) -> None:
        self.config = config or LifeConfig()
        self.current: str | None = None  # the job's state (None: not started)
        self.pending: list[Finding] = []  # moves made where no finding can be returned (a new topology)
        self.moved_ts = -math.inf  # when the job last moved (a move never goes back before it)
        self.top_step = -1  # the newest step seen
        self.failed_step = -1  # the newest step when it last failed
        self.topo = topo
        self._new_run(topo)

    def _new_run(self, topo: Topology) -> None:
        before = self.current
        self.topo = topo
        self.ended: set[int] = set()  # ranks that exited (cleanly, or losing a peer) or stopped
        self.stopped: set[int] = set()  # ... of them, stopped on purpose
        self.paused: set[int] = set()  # ranks (-1: the job) in a known pause
        cause = "job record" if before is None else f"job record: restarted after {before}"
        self.pending.append(self._move("starting", cause, topo.ts))

    def set_topology(self, topo: Topology) -> None:
        if (topo.ts, topo.ranks) != (self.topo.ts, self.topo.ranks):  # the same record twice is no restart
            self._new_run(topo)

    # --- observe --------------------------------------------------------------

    def observe_run(self, run: RecordRun) -> list[tuple[int, list[Finding]]]:
        """Steps of a running or paused job move nothing: only a run with a framework or lifecycle record, or
        a job not running yet, is read record by record."""
        if self.current in ("running", "paused") and "framework" not in run.by_kind and "lifecycle" not in run.by_kind:
            if "step" in run.by_kind:
                cols = run.steps()
                ok = (cols.ts >= self.topo.ts) & (cols.rank < self.topo.size)
                if ok.any():
                    self.top_step = max(self.top_step, int(cols.step[ok].max()))
            return []
        return observe_each(self, run)

    def observe(self, rec: Record) -> list[Finding]:
        out, self.pending = self.pending, []
        if rec.ts < self.topo.ts or (rec.rank is not None and rec.rank >= self.topo.size):
            return out
        kind = rec.kind
        if kind == "step":
            if self.current in ("starting", "restarting", "failed") and self._after_move(rec):
                self._to(out, "running", f"step {rec.step}", rec.ts, self.config.report_running)
            self.top_step = max(self.top_step, rec.step)
        elif kind == "lifecycle":
            self._lifecycle(rec, out)
        elif rec.type in _CRASHES:
            lost = bool(PEER_LOST.search(rec.message or ""))
            if clean_exit(rec) or lost:
                self._ended(rec.rank, rec.ts, out, stopped=False)
            if not clean_exit(rec) and self.current not in QUIET | {"stopping"}:  # a crash, a peer lost: broken
                what = f"lost a remote peer: {rec.message or ''}" if lost else f"{rec.type} {rec.message or ''}"
                self._to(out, "failed", f"rank {rec.rank} {what[:200]}".rstrip(), rec.ts)
        return out

    def _after_move(self, rec: Record) -> bool:
        """A step that shows the job running again after its last move: stamped after it, and (after a
        failure) either past the newest step before it or a heartbeat period later (a step of the old run,
        ended as a rank failed or arriving late, moves nothing back: a job's life never runs backwards)."""
        if rec.ts <= self.moved_ts:
            return False
        return self.current != "failed" or rec.step > self.failed_step or rec.ts > self.moved_ts + self.topo.heartbeat_s

    def _lifecycle(self, rec: Record, out: list[Finding]) -> None:
        who = "the job" if rec.rank is None else f"rank {rec.rank}"
        said = f"{rec.event}{f': {rec.reason}' if rec.reason else ''} ({who}{f', {rec.source}' if rec.source else ''})"
        event, ranks = rec.event, range(self.topo.size) if rec.rank is None else (rec.rank,)
        if event == "pause":
            self.paused.add(-1 if rec.rank is None else rec.rank)
            if self.current in ("starting", "running"):
                self._to(out, "paused", said, rec.ts)
        elif event == "resume":
            self.paused.discard(-1 if rec.rank is None else rec.rank)
            if self.current == "paused" and not self.paused:
                self._to(out, "running", said, rec.ts, self.config.report_running)
        elif event == "stop":
            for r in ranks:
                self._ended(r, rec.ts, out, stopped=True, cause=said)
        elif event == "end":
            if rec.rank is None:
                self._to(out, "finished", said, rec.ts)
            else:
                self._ended(rec.rank, rec.ts, out, stopped=False, cause=said)
        elif event == "restart":
            self._to(out, "restarting", said, rec.ts)
        elif event == "start" and self.current is None:
            self._to(out, "starting", said, rec.ts)

    def _ended(self, rank: int, ts: float, out: list[Finding], *, stopped: bool, cause: str | None = None) -> None:
        """A rank is gone on purpose or at its end; once every rank is, the job stopped or finished."""
        self.ended.add(rank)
        if stopped:
            self.stopped.add(rank)
        n, size = len(self.ended), self.topo.size
        if self.current == "failed":
            return  # ranks stopped or ending after a failure are its teardown, not a stop on purpose
        if n == size:
            if self.stopped:
                self._to(out, "stopped", f"{len(self.stopped)} of {size} ranks stopped on purpose"
                                         f"{f', last: {cause}' if cause else ''}", ts)
            else:
                self._to(out, "finished", f"every rank of {size} exited cleanly", ts)
        elif stopped and self.current not in QUIET:
            self._to(out, "stopping", cause or f"rank {rank} stopped", ts)

    def _to(self, out: list[Finding], state: str, cause: str, ts: float, report: bool = True) -> None:
        if state == self.current:
            return
        move = self._move(state, cause, ts)
        if report:
            out.append(move)

    def _move(self, state: str, cause: str, ts: float) -> Finding:
        before, self.current = self.current, state
        self.moved_ts = max(self.moved_ts, ts)
        if state == "failed":
            self.failed_step = self.top_step
        return JOB_STATE.finding(
            ts=ts, job=self.topo.job, detector="life", key=(state, ts, cause), score=1.0,
            evidence=JobState(state=state, previous=before, cause=cause, ended_ranks=len(self.ended),
                              job_ranks=self.topo.size))

    def advance(self, now: float) -> list[Finding]:
        out, self.pending = self.pending, []
        return out

    # --- state ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "current": self.current, "ended": sorted(self.ended),
                "stopped": sorted(self.stopped), "paused": sorted(self.paused),
                "pending": [to_dict(f) for f in self.pending],
                "moved_ts": None if math.isinf(self.moved_ts) else self.moved_ts, "top_step": self.top_step,
                "failed_step": self.failed_step}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> JobLifeDetector:
        det = cls(topo, LifeConfig(**state["config"]))
        det.current = state["current"]
        det.ended, det.stopped = set(state["ended"]), set(state["stopped"])
        det.paused = set(state["paused"])
        det.pending = [decode_obj(f) for f in state["pending"]]
        det.moved_ts = -math.inf if state["moved_ts"] is None else state["moved_ts"]
        det.top_step, det.failed_step = state["top_step"], state["failed_step"]
        return det

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        """Its saved state brought up to date (`DetectorBase.upgrade_state`)."""
        if version == 2 and state is None:  # added in version 3: the job record's `starting`, long past, is not
            return {**cls(job.topo).state(), "pending": []}  # reported again
        if version == 3:
            fill_missing(state, {"moved_ts": None, "top_step": -1, "failed_step": -1})  # (a move's time not known)
        return state
