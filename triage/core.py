"""The pure core: records in, findings + actions + incidents out, on event time.

`JobCore` is one job's unit: its detectors (`JobMonitor`) and its triage, with
its own watermark. It is the only thing the runtimes drive: the Faust worker
holds one per job (node events arrive already re-keyed by job), and replay
holds one per job the same way, through `Core`, which routes a file's records
to their job (node events through the node -> job map built from `job`
records) and moves every job's time with the stream.

Event time: `JobCore.process(rec)` first advances the job to its watermark (the
largest event time it has seen, less `lateness_s`), then observes the record.
A job none of whose records arrive is advanced from outside (`advance(now)`):
by the wall-clock silence timer in the worker, by the stream's time in replay.

Settings are passed in, never read back from saved state: `state()` holds data
only (with a version), so a redeploy with new thresholds reaches restored jobs.

Every incident record a job's core emits names the clock its times are in
(`extra.clock`: `ClockDetector.frame`, the nodes whose times were corrected and
by how much, and what the job's time rests on).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from gangwatch.detectors.clocksteps import ClockSteps
from gangwatch.detectors.monitor import JobMonitor, RecordRun
from gangwatch.schemas import DecodeError, Job, Outputs, Record, encode
from gangwatch.schemas.columns import StepRows
from gangwatch.triage.budgets import CoreConfig
from gangwatch.triage.migrate import STATE_VERSION, migrate
from gangwatch.triage.triage import Triage

HOLD_RECORDS = 100_000  # records held, all jobs together, for job records not seen yet (replay)
JOB_KEYED = frozenset({"step", "heartbeat", "framework", "lifecycle", "stack", "flight", "recovery"})
NODE_KEYED = frozenset({"hw", "gpu"})
RUN_KINDS = JOB_KEYED | NODE_KEYED  # what `process_many` takes together (job and ops records go one by one)
_TRIAGE_SKIPS = frozenset({"step", "heartbeat", "hw", "gpu"})  # kinds whose record triage ignores (a step: but
# one past the job's newest step)


def _until_due(ts: list[float], start: int, top: float, lateness: float, due: float) -> tuple[int, float]:
    """Where in `ts` (from `start` on) a time first may move event time to `due` or past it (its index, or
    len(ts)), and the largest time before it (at least `top`): where a run of records is cut. (Whether the job's
    time then moves is the job's clock's answer: a lone node ahead does not move it.)"""
    limit = due + lateness
    for k in range(start, len(ts)):
        t = ts[k]
        if t >= limit:
            return k, top
        if t > top:
            top = t
    return len(ts), top


def _run_end(recs: list[Record | StepRows], start: int, top: float, lateness: float, due: float,
             job: str | None = None, node_job: Mapping[str, str] | None = None) -> tuple[int, float, int]:
    """How far the run of records that begins at `recs[start]` (of `RUN_KINDS`) goes: up to the first record that
    is not of `RUN_KINDS`, moves event time to `due` or past it, or (with `job`: replay's many jobs) is not job
    `job`'s (a node event is the job's that `node_job` says runs on its node). Returns (its end, the largest time
    in it, at least `top`, its record count). A `StepRows` the run ends inside is cut in two in place (`recs`
    grows by one; the end is where its rest begins)."""
    n, e, count = len(recs), start, 0
    while e < n:
        r = recs[e]
        if type(r) is StepRows:
            if job is not None and r.job != job:
                break
            k, top = _until_due(r.ts, 1 if e == start else 0, top, lateness, due)
            count += k
            if k < len(r):
                if k:
                    recs[e:e + 1] = r.split(k)
                    e += 1
                break
        elif e > start:
            if r.kind not in RUN_KINDS:
                break
            t = r.ts
            if t - lateness >= due:
                break
            if job is not None and (r.job if r.kind in JOB_KEYED else node_job.get(r.node)) != job:
                break
            if t > top:
                top = t
            count += 1
        else:
            count += 1
        e += 1
    return e, top, count


def _clock_named(method: Callable[..., Outputs | None]) -> Callable[..., Outputs | None]:
    """A `JobCore` entry point whose incident records (those of its job, appended to the `Outputs` it was given or
    made) name the clock their times are in: `extra.clock`, `ClockDetector.frame` then (a nested call's first)."""

    @functools.wraps(method)
    def named(self: JobCore, *args: Any, **kw: Any) -> Outputs | None:
        given = kw.get("out") or (args[-1] if args and type(args[-1]) is Outputs else None)  # (`out`, the last)
        start = len(given.incidents) if given is not None else 0
        got = method(self, *args, **kw)
        out = given if got is None else got
        if out is not None and len(out.incidents) > start:
            frame = self.monitor.clocks.frame()
            for inc in out.incidents[start:]:
                if inc.job == self.job and "clock" not in inc.extra:
                    inc.extra["clock"] = {**frame, "offsets_s": dict(frame["offsets_s"])}
        return got

    return named


class JobCore:
    """One job's detectors and triage, driven by the job's own event time."""

    def __init__(self, job: Job, config: CoreConfig | None = None) -> None:
        self.config = config or CoreConfig()
        self.job = job.job
        self.monitor = JobMonitor(job, configs=self.config.detectors)
        self.triage = Triage(job.job, self.config.triage)
        self.triage.on_topology(self.monitor.topo)
        self.watermark = float("-inf")
        self.max_ts = job.ts
        self.records = 0
        self._reader: ClockSteps | None = None  # `readers_steps`

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(self.monitor.topo.nodes)

    @_clock_named
    def process(self, rec: Record, out: Outputs | None = None) -> Outputs:
        """Observe one record of this job (after advancing time to the watermark); outputs go to `out`."""
        self.records += 1
        out = Outputs() if out is None else out
        rec = self.monitor.unstepped(rec)
        if rec.ts > self.max_ts:
            self.max_ts = rec.ts
        self._move_time(rec, out)
        kind = rec.kind
        if kind == "job":
            self.monitor.replace_topology(rec)
            self.triage.on_topology(self.monitor.topo)
            return out
        if kind == "ops":
            return self.triage.on_record(rec, out)
        findings = self.monitor.observe(rec)
        if findings:
            self.triage.on_findings(findings, out)
        self.triage.on_record(rec, out)
        return out

    @_clock_named
    def process_many(self, recs: list[Record | StepRows], out: Outputs | None = None) -> Outputs:
        """`process` of each record of this job in turn, giving the same outputs in the same order: between two
        moves of the job's event time, its records go through the detectors as one `RecordRun` (each
        detector takes its records at once), and triage hears each record's findings and the records it reads
        in record order. A `StepRows` counts as its steps, in turn (it is cut where the job's time moves)."""
        out = Outputs() if out is None else out
        recs = list(recs)  # a StepRows cut in two leaves its rest here
        n, s, u = len(recs), 0, 0  # (recs[:u]: their clock steps taken out)
        lateness, tick = self.config.lateness_s, self.config.tick_s
        while s < n:
            rec = recs[s]
            rows = type(rec) is StepRows
            if not rows and rec.kind not in RUN_KINDS:
                self.process(rec, out)  # (a job record may bring other nodes: the records after it wait for it)
                s += 1
                continue
            if u <= s:  # this record and those after it up to the next job or ops record, in the job's one frame
                u = s
                while u < n and (type(recs[u]) is StepRows or recs[u].kind in RUN_KINDS):
                    recs[u] = self.monitor.unstepped(recs[u])
                    u += 1
                rec = recs[s]
            ts = rec.ts[0] if rows else rec.ts
            if ts > self.max_ts:
                self.max_ts = ts
            self._move_time(rec, out)
            e, top, count = _run_end(recs, s, self.max_ts, lateness, min(self.watermark + tick, self._decision_due()))
            u += len(recs) - n  # (a StepRows cut in two before it)
            n = len(recs)
            self.max_ts = top
            self.records += count
            self._observe_run(RecordRun(recs[s:e]), out)
            s = e
        return out

    def now(self) -> float:
        """The job's time: its clock's (`ClockDetector.now`, robust to a node whose clock is off), or the job
        record's before any other record."""
        t = self.monitor.clocks.now()
        return t if t > -math.inf else self.monitor.topo.ts

    def heard(self, rec: Record | StepRows) -> None:
        """A record of this job (a `StepRows`: by its first item) is about to come: its node's time moves (what
        `process` does first, for a driver that asks the job's time before handing it the record)."""
        first = rec.record(0) if type(rec) is StepRows else rec
        self.monitor.clocks.heard(self.monitor.unstepped(first))

    def read_shift(self, rec: Record) -> float:
        """How much earlier than stamped the job reads `rec`: its node's clock step and offset, as the job's
        clock knows them where `rec` arrived. A reader that orders or holds the job's records before handing
        them over (the worker's runner) tells each one here as it arrives and orders them by `rec.ts -
        read_shift(rec)`, the job's time: by their stamped times, a node whose clock runs ahead would be read
        that much late. The steps are learned as the records arrive (`ClockSteps`, its own copy of the job's,
        `readers_steps`): a record with no `mono` of its own (a kernel log line) read after its node's clock
        stepped is shifted by that step before the job has read the records that show it."""
        clocks = self.monitor.clocks
        shift = self.readers_steps().step_of(rec) if rec.kind in clocks.kinds else 0.0
        return shift + clocks.offset_of(rec) if clocks.skewed else shift

    def read_shifts(self, rows: StepRows) -> np.ndarray:
        """`read_shift` of every item of `rows`, in item order."""
        clocks = self.monitor.clocks
        shifts = self.readers_steps().steps_of_rows(rows)
        if shifts is None:
            shifts = np.zeros(len(rows))
        if clocks.skewed:
            rank = np.asarray(rows.column("rank"), dtype=np.int64)
            ok = (rank >= 0) & (rank < self.monitor.topo.size)
            shifts = shifts + np.where(ok, clocks.rank_offsets()[np.where(ok, rank, 0)], 0.0)
        return shifts

    def readers_steps(self) -> ClockSteps:
        """The clock steps of the job's nodes as its records arrive: a copy of what the job's clock knows,
        taken at the job's (re)start or restore, then told the records as they are read."""
        steps = self.monitor.clocks.steps
        if self._reader is None or self._reader.topo is not steps.topo:
            self._reader = ClockSteps.from_state(steps.state(), steps.topo, 2 * steps.half)
        return self._reader

    def latest(self) -> float:
        """The newest time any of the job's nodes reached (corrected by its clock), or the job record's."""
        return max(self.monitor.clocks.latest(), self.monitor.topo.ts)

    def _move_time(self, rec: Record | StepRows, out: Outputs) -> None:
        """A record (or a `StepRows`, by its first item) reached the job: its time moves to the job's clock less
        `lateness_s` when that passes the next grid point or a decision due (never by one node's time alone)."""
        if type(rec) is not StepRows and rec.kind == "job":  # a (re)start: its launcher's time, as it says
            t = rec.ts - self.config.lateness_s
            if t >= min(self.watermark + self.config.tick_s, self._decision_due()):
                self.advance(t, out)
            return
        clocks = self.monitor.clocks
        clocks.heard(rec)
        due = min(self.watermark + self.config.tick_s, self._decision_due())
        ts = rec.ts[0] if type(rec) is StepRows else rec.ts - clocks.offset_of(rec)
        if ts - self.config.lateness_s >= due:  # it may move the job's time: ask the clock
            t = self.now() - self.config.lateness_s
            if t >= due:
                self.advance(t, out)

    def _decision_due(self) -> float:
        """When triage decides next (`Triage.due`), if that is still ahead (inf: nothing).

        Event time moves with the records in steps of at least `tick_s`, but a decision due before a record's
        time (less `lateness_s`) is taken before that record is read, off the grid: live, the worker's clock
        took it as soon as it was due, and the records it caused (the controller's stop of the job, say) come
        after it; replayed, they must not end the incident first."""
        due = self.triage.due()
        return due if due > self.watermark else math.inf

    def _observe_run(self, run: RecordRun, out: Outputs) -> None:
        found = self.monitor.observe_run(run)
        tri = self.triage
        heard = set(found)
        for kind, pos in run.by_kind.items():
            if kind not in _TRIAGE_SKIPS:
                heard.update(pos)
        steps = run.by_kind.get("step")
        if steps:  # a step past the newest one triage has seen may end an incident
            step = run.steps().step
            before = np.maximum.accumulate(np.concatenate(([tri.max_step], step[:-1])))
            heard.update(steps[j] for j in np.flatnonzero(step > before).tolist())
        record = run.record
        for i in sorted(heard):
            fs = found.get(i)
            if fs:
                tri.on_findings(fs, out)
            tri.on_record(record(i), out)

    @_clock_named
    def advance(self, now: float, out: Outputs | None = None) -> Outputs:
        """Fire every timeout up to event time `now` (never backwards)."""
        out = Outputs() if out is None else out
        if now <= self.watermark:
            return out
        self.watermark = now
        findings = self.monitor.advance(now)
        if findings:
            self.triage.on_findings(findings, out)
        self.triage.advance(now, out)
        return out

    @_clock_named
    def apply_offsets(self, out: Outputs) -> None:
        """The clock offsets learned since time last moved take effect now, time standing still: at the end of
        input the records left may be one node's alone, its clock not known yet, which cannot move the time that
        would apply them (a node 300 s ahead, read in event-time order after everyone else); the end is then where
        its corrected times say, not its raw ones."""
        findings = self.monitor.clocks.advance(self.watermark)
        if findings:
            self.triage.on_findings(findings, out)

    @_clock_named
    def finish(self, now: float, out: Outputs | None = None) -> Outputs:
        """End of input at event time `now`: timeouts up to it, then what collecting detectors hold (a partial
        sweep, a storm still inside its window, peers' reports of a rank that vanished just before the end). The
        open incident's decision is taken when it is due: no more evidence is coming (a crash loop's page, a
        death's replacement, as live takes them seconds after the last record). The end of a file is still not
        silence: no detector's timeout runs past `now`."""
        out = self.advance(now, out)
        findings = self.monitor.finish()
        if findings:
            self.triage.on_findings(findings, out)
        until = max([now, *(f.ts for f in findings)])
        inc = self.triage.incident  # its decision, not an answer it may still be waiting for (live waits too)
        if inc is not None and inc.decided_ts is None and math.isfinite(inc.decide_at):
            until = max(until, inc.decide_at)
        if findings or until > now:
            self.triage.advance(until, out)
        return out

    # --- state: data only -------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {
            "v": STATE_VERSION,
            "watermark": None if self.watermark == float("-inf") else self.watermark,
            "max_ts": self.max_ts,
            "records": self.records,
            "monitor": self.monitor.state(),
            "triage": self.triage.state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], config: CoreConfig | None = None) -> JobCore:
        """A job restored from `state()`, of this version or an older one (triage/migrate.py), running with `config`
        (today's settings, not the saved ones)."""
        state = migrate(state)
        core = cls.__new__(cls)
        core.config = config or CoreConfig()
        core.monitor = JobMonitor.from_state(state["monitor"], configs=core.config.detectors)
        core.job = core.monitor.job_record.job
        core.triage = Triage.from_state(state["triage"], core.config.triage, core.monitor.topo)
        core.watermark = float("-inf") if state["watermark"] is None else state["watermark"]
        core.max_ts = state["max_ts"]
        core.records = state["records"]
        core._reader = None
        return core


class Core:
    """Replay's driver of `JobCore`s: routes a stream of many jobs' records to their jobs.

    Job-keyed records go to their job; node events (hw, gpu) to the job running on
    their node (the map comes from `job` records); `ops` to the job it names or the
    job on its node. With `silence` (the default, as the worker's silence timer),
    every job's time moves with the stream's, so a job that falls silent is
    noticed while other jobs keep the stream going.
    """

    def __init__(self, config: CoreConfig | None = None, *, silence: bool = True) -> None:
        self.config = config or CoreConfig()
        self.silence = silence
        self.jobs: dict[str, JobCore] = {}
        self.node_job: dict[str, str] = {}
        self.max_ts = float("-inf")
        self.clock = float("-inf")  # the stream's time, in steps of tick_s
        self.records = 0
        self.held: dict[str, list[Record]] = {}  # job -> its records that came before its job record
        self.held_count = 0

    def process(self, rec: Record, out: Outputs | None = None) -> Outputs:
        self.records += 1
        out = Outputs() if out is None else out
        self._move_time(rec, rec.ts, out)
        kind = rec.kind
        if kind == "job":
            self._on_job(rec, out)
            return out
        if kind in JOB_KEYED:
            core = self.jobs.get(rec.job)
            if core is None:
                self._hold(rec, out)
                return out
            return core.process(rec, out)
        if kind in NODE_KEYED:
            job = self.node_job.get(rec.node)
            return self.jobs[job].process(rec, out) if job else out  # a node in no job: nothing to attribute
        for job in ([rec.job] if rec.job else sorted({self.node_job.get(rec.node)} - {None})):  # ops
            if job in self.jobs:
                self.jobs[job].process(rec, out)
        return out

    def _job_of(self, rec: Record) -> str | None:
        """The job a record of `RUN_KINDS` goes to (None: none known)."""
        job = rec.job if rec.kind in JOB_KEYED else self.node_job.get(rec.node)
        return job if job in self.jobs else None

    def process_many(self, recs: list[Record | StepRows], out: Outputs | None = None) -> Outputs:
        """`process` of each record in turn, giving each job the same outputs in the same order: between two moves
        of the stream's time, each job's records (in their order) go to its `JobCore.process_many` together, the
        jobs in the order they first appear (a fleet's records interleave job by job: cut at each change of job,
        runs were two or three records long). Only the order of different jobs' outputs within one tick of the
        stream's time may differ from `process`'s, and nothing decides on it: the worker, too, runs a batch job by
        job. A `StepRows` counts as its steps, in turn (cut where the stream's time moves; of a job not known,
        they go one by one)."""
        out = Outputs() if out is None else out
        recs = list(recs)  # a StepRows cut in two leaves its rest here
        i = 0
        lateness, tick, silence = self.config.lateness_s, self.config.tick_s, self.silence
        while i < len(recs):
            rec = recs[i]
            rows = type(rec) is StepRows
            if rows:
                job = rec.job if rec.job in self.jobs else None
            else:
                job = self._job_of(rec) if rec.kind in RUN_KINDS else None
            if job is None:
                for r in rec.records() if rows else (rec,):
                    self.process(r, out)
                i += 1
                continue
            self._move_time(rec, rec.ts[0] if rows else rec.ts, out)
            due = self.clock + tick if silence else math.inf
            runs: dict[str, list[Record | StepRows]] = {}
            while job is not None:  # this tick's runs, job by job
                j, top, count = _run_end(recs, i, self.max_ts, lateness, due, job, self.node_job)
                self.max_ts = top
                self.records += count
                runs.setdefault(job, []).extend(recs[i:j])
                job, i = self._next_in_tick(recs, j, due)
            for job, run in runs.items():
                self.jobs[job].process_many(run, out)
        return out

    def _next_in_tick(self, recs: list[Record | StepRows], i: int, due: float) -> tuple[str | None, int]:
        """The job of the record this tick's runs go on with, and where it is (None: they end at `recs[i]`: past
        the inputs, not of `RUN_KINDS`, of a job not known, or moving the stream's time). Node events of nodes in
        no job on the way are read as `process` reads them (they move nothing but the newest time seen)."""
        node_job, jobs, limit = self.node_job, self.jobs, due + self.config.lateness_s
        while i < len(recs):
            r = recs[i]
            if type(r) is StepRows:
                ts, job = r.ts[0], r.job
                if job not in jobs or ts >= limit:
                    return None, i
            else:
                ts, kind = r.ts, r.kind
                if kind not in RUN_KINDS or ts >= limit:
                    return None, i
                job = r.job if kind in JOB_KEYED else node_job.get(r.node)
                if job not in jobs:
                    if kind in JOB_KEYED:
                        return None, i  # held for its job record: in its place
                    self.process(r)  # a node in no job: nothing to attribute
                    i += 1
                    continue
            if ts > self.max_ts:
                self.max_ts = ts
            return job, i
        return None, i

    def _move_time(self, rec: Record | StepRows, ts: float, out: Outputs) -> None:
        """The stream's time moves with a record (`ts`: its time, a `StepRows`'s first): to its job's time (the
        job's clock: one node's clock ahead does not move it), a job or ops record's own time; a record of no
        job known moves nothing."""
        if ts > self.max_ts:
            self.max_ts = ts
        if not self.silence or ts - self.config.lateness_s < self.clock + self.config.tick_s:
            return  # it cannot move the stream's time
        kind = "step" if type(rec) is StepRows else rec.kind
        if kind in ("job", "ops"):
            t = ts
        else:
            job = rec.job if kind in JOB_KEYED else self.node_job.get(rec.node)
            core = self.jobs.get(job) if job is not None else None
            if core is None:
                return
            core.heard(rec)
            t = core.now()
        if t - self.config.lateness_s >= self.clock + self.config.tick_s:
            self.advance(t - self.config.lateness_s, out)

    def _hold(self, rec: Record, out: Outputs) -> None:
        """A record of a job whose `job` record has not come yet (it travels on another topic, another spool):
        held for it, `HOLD_RECORDS` at most (then the oldest held is refused, saying so), until it comes or
        the input ends (`finish` refuses what is still held)."""
        self.held.setdefault(rec.job, []).append(rec)
        self.held_count += 1
        if self.held_count > HOLD_RECORDS:
            job = next(iter(self.held))
            self._refuse(self.held[job].pop(0), "held for it longer than the hold allows "
                                                f"({HOLD_RECORDS} records of jobs not started)", out)
            self.held_count -= 1
            if not self.held[job]:
                del self.held[job]

    @staticmethod
    def _refuse(rec: Record, why: str, out: Outputs) -> None:
        out.rejected.append(DecodeError(f"no `job` record seen for job {rec.job!r} ({why})", "job", rec.kind,
                                        raw=encode(rec).decode()[:4096]))

    def _on_job(self, rec: Job, out: Outputs) -> None:
        core = self.jobs.get(rec.job)
        if core is None:
            core = self.jobs[rec.job] = JobCore(rec, self.config)
        else:
            for node in core.nodes:
                self.node_job.pop(node, None)
            core.process(rec, out)
        for node in core.nodes:
            self.node_job[node] = rec.job
        held = self.held.pop(rec.job, ())
        self.held_count -= len(held)
        for early in held:  # what came before it, in the order it came
            core.process(early, out)

    def advance(self, now: float, out: Outputs | None = None) -> Outputs:
        """Every job to event time `now`."""
        out = Outputs() if out is None else out
        self.clock = max(self.clock, now)
        for job in sorted(self.jobs):
            self.jobs[job].advance(now, out)
        return out

    def finish(self) -> Outputs:
        """End of input: every job to the last event time seen (the end of a file is not silence); records still
        held for a job record that never came are refused."""
        out = Outputs()
        for job in list(self.held):
            for rec in self.held.pop(job):
                self._refuse(rec, "in the whole input", out)
        self.held_count = 0
        for job in sorted(self.jobs):
            self.jobs[job].apply_offsets(out)
        # the end of input is the newest (corrected) time seen: nothing is to come that a lone node's could race
        end = max((core.latest() for core in self.jobs.values()), default=-math.inf)
        for job in sorted(self.jobs):
            core = self.jobs[job]
            core.finish((end if self.silence else core.latest()), out)
        return out
