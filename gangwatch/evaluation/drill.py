"""`gangwatch drill`: a game day of the live pipeline on a simulated job, scored against the stage budgets.

    drill = Drill(DrillSpec(job="drill-7", seed=7, faults=3), start_ts=clock())
    while not drill.finished:
        for rec in drill.due(clock()):   # the job's records, as their event time comes
            send(rec)
        for rec in outputs():            # actions, incidents and recovery records the pipeline and controller sent
            drill.observe(rec)
    report = score(drill, Budgets())     # one row per injected event; actions that should not have happened

This module is the drill's logic and keeps no clock of its own: the runner (`gangwatch.evaluation.drill_live`: the real
broker, a worker, the controller's simulated mode) passes the time and what it read.

**What is injected.** `injections` draws `faults` events from the seed: their kinds (every kind of `kinds`
once before any twice), distinct machines, and planned times spread over `duration_s` (`lead_s` of healthy
running first). Kinds: a machine killed (`node_loss`: the node goes silent; `xid79`: its GPU falls off the bus),
a rank hung (`dataloader_hang`, `pp_deadlock`), a slow GPU (`thermal_straggler`, at full throttle within
20 s), a corrupted replica (`sdc`), `intermittent_straggler` and `nic_degradation` (the simulator's), and two
benign ones that must open nothing: a job-wide `pause` (the job says `lifecycle` `pause`, stops stepping for
`hold_s`, says `resume`) and a user `stop` (every rank says `stop`, SIGTERM, and goes silent; the user starts
the job again `hold_s` later).

**Episodes.** The simulator stops a job at its first stalling fault, so the job's life is cut into episodes,
one per injection: an episode is a simulated `Scenario` of the job from its start (the `job` record when the
job was (re)started, else continuing the steps where the last one ended) with its one event `lead_s` or more
in. It ends when the job is restarted (the controller `accepted` an action it carries out by restarting: the
job's records stop there, and the next episode starts when the action is `resumed`, from the step after the
checkpoint the controller says it loaded), or, with no restart, once the event's incident was decided (or
closed) and `quiet_s` passed, or after `window_s` without an outcome. A job that stalled, or that the user
stopped, starts again with a `job` record. An injection whose episode was cut by a restart before its time is
carried into the next episode.

**Score.** Each row's figures are seconds from the injection to the stage timestamps of its incident (the
one naming its machine, else the first detected in its window): detect, localize, decide, recover. Budgets
(`triage.config.Budgets`) are cumulative from the injection: detect within `detect`; localize and decide
within `detect + localize`; recover within `total`, except when the decision keeps the job running (path
`non_stop`: nothing to recover). A row fails on a figure over its budget, a stage never reached, an
escalation to a human, a recovery the controller reported `failed`, or, for a benign event, any incident at
all. The recovery stages the incident itself reports over their budgets (`over_budget`: replace, rollback,
comm_rebuild) are noted, not failed: in a drill they are the simulated controller's configured delays plus
the pipeline's delivery, which the recover figure carries against the end-to-end budget. Wrong actions:
evictions (`EVICTING`) of machines that were not faulty, and pages (`escalate`) for benign events or outside
any injection.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gangwatch.schemas import Action, Heartbeat, Incident, Lifecycle, Record, Recovery, decode_obj
from gangwatch.triage.budgets import Budgets

FAULTS = ("node_loss", "xid79", "dataloader_hang", "pp_deadlock", "thermal_straggler", "sdc")
BENIGN = ("pause", "stop")
KINDS = (*FAULTS, *BENIGN, "intermittent_straggler", "nic_degradation")
DEFAULT_KINDS = (*FAULTS, *BENIGN)
NODE_WIDE = frozenset({"node_loss", "nic_degradation", "pause", "stop"})  # no rank is named
STALLS = frozenset({"node_loss", "xid79", "dataloader_hang", "pp_deadlock"})  # the job makes no progress after
PARAMS: dict[str, dict[str, Any]] = {"thermal_straggler": {"ramp_s": 20.0}}  # a slow GPU, not a slow drift
HOLD_S = {"pause": (60.0, 120.0), "stop": (30.0, 60.0)}  # how long paused / stopped, drawn in this range
RESTARTS = frozenset({"replace", "evict_group", "requeue", "rollback", "restart_in_process"})
EVICTING = frozenset({"replace", "evict_group", "isolate", "requeue", "rollback"})
ANSWERED = {"dual_run": "dual_run_result", "replay": "replay_result"}  # diagnosis still under way until answered
STOP_SPREAD_S = 0.9  # a user's stop reaches every rank within this
SPAN_S = 240.0  # planned seconds per injection when no duration is given


@dataclass(frozen=True)
class DrillSpec:
    """What to drill: the job (tp x pp x dp ranks, `gpus_per_node` a machine), how many events of which kinds,
    and the drill's pace (seconds of job time)."""

    job: str = "drill"
    seed: int = 1
    faults: int = 3
    kinds: tuple[str, ...] = DEFAULT_KINDS
    duration_s: float | None = None  # injections are planned within it; None: SPAN_S per injection
    tp: int = 2
    pp: int = 2
    dp: int = 4
    gpus_per_node: int = 1
    lead_s: float = 60.0  # healthy running before an injection, from the episode's start
    window_s: float = 600.0  # the longest wait for an injection's outcome (the end-to-end budget)
    quiet_s: float = 45.0  # after an event that needs no restart: how long the drill watches before going on

    def __post_init__(self) -> None:
        if self.faults < 1:
            raise ValueError(f"--faults must be at least 1, got {self.faults}")
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"unknown kind {unknown[0]!r}; choose from {', '.join(KINDS)}" if unknown
                             else f"name at least one kind: {', '.join(KINDS)}")
        if self.tp * self.pp * self.dp % self.gpus_per_node:
            raise ValueError(f"tp*pp*dp = {self.tp * self.pp * self.dp} ranks do not fill machines of "
                             f"{self.gpus_per_node} GPUs")
        if "pp_deadlock" in self.kinds and self.pp < 2:
            raise ValueError("pp_deadlock needs --pp 2 or more")
        if self.faults > self.nodes:
            raise ValueError(f"{self.faults} faults need as many machines; the job has {self.nodes}")
        if self.duration < self.lead_s + 1:
            raise ValueError(f"--duration {self.duration:g} leaves no time after the {self.lead_s:g} s lead")

    @property
    def nodes(self) -> int:
        return self.tp * self.pp * self.dp // self.gpus_per_node

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def duration(self) -> float:
        return self.duration_s if self.duration_s is not None else SPAN_S * self.faults


@dataclass(frozen=True)
class Injection:
    """One planned event: its kind, where (`node`, and `rank` for a per-GPU kind; none for a benign one) and
    when (`at_s` after the drill's start, or later when the job is still recovering then)."""

    index: int
    kind: str
    at_s: float
    node: str | None
    rank: int | None
    hold_s: float = 0.0  # pause: how long the job is paused; stop: how long until it is started again

    @property
    def benign(self) -> bool:
        return self.kind in BENIGN

    @property
    def where(self) -> str:
        if self.node is None:
            return "job"
        return self.node if self.rank is None else f"{self.node}/r{self.rank}"


def injections(spec: DrillSpec) -> list[Injection]:
    """The drill's events, a function of the seed: kinds cycle through `kinds` (shuffled each round), machines
    are distinct, times lie one in each of `faults` equal slots after the lead, in the slot's first half."""
    rng = random.Random(spec.seed)
    kinds: list[str] = []
    while len(kinds) < spec.faults:
        round_ = list(spec.kinds)
        rng.shuffle(round_)
        kinds += round_
    machines = rng.sample(range(spec.nodes), spec.faults)
    slot = (spec.duration - spec.lead_s) / spec.faults
    out = []
    for i, (kind, m) in enumerate(zip(kinds[:spec.faults], machines, strict=True)):
        at = spec.lead_s + i * slot + rng.uniform(0.0, slot / 2)
        lo, hi = HOLD_S.get(kind, (0.0, 0.0))
        node = None if kind in BENIGN else f"n{m:03d}"
        rank = None if kind in NODE_WIDE else m * spec.gpus_per_node + rng.randrange(spec.gpus_per_node)
        out.append(Injection(i, kind, round(at, 3), node, rank, round(rng.uniform(lo, hi), 3)))
    return out


def truth_of(spec: DrillSpec, planned: Iterable[Injection], checkpoints: Iterable[dict] = ()) -> dict[str, Any]:
    """The ground truth the controller's simulated mode answers from: each fault's machine and class (a dual
    run finds the SDC machine's digest different), and the checkpoints the job saved so far."""
    from gangwatch.producers.simulate import FAULT_CLASS

    return {"job": spec.job, "faults": [{"kind": i.kind, "class": FAULT_CLASS[i.kind], "planned": False,
                                         "nodes": [i.node]} for i in planned if not i.benign],
            "benign": {"checkpoints": list(checkpoints)}}


@dataclass
class Episode:
    """A stretch of the job's life that holds one injection (see the module's docstring)."""

    injection: Injection
    start_ts: float
    inject_ts: float
    restarted: bool  # began with a `job` record
    records: list[Record]
    checkpoints: list[tuple[int, float, float]]  # (step, start, end of the save)
    pos: int = 0  # records before it were handed out
    cut_ts: float | None = None  # the job stopped here: nothing of it is handed out after
    over_ts: float | None = None  # it ended here; the next began

    @property
    def injected(self) -> bool:
        """Its injection happened: the job was not cut before it, and its time was reached."""
        return ((self.cut_ts is None or self.cut_ts >= self.inject_ts) and self.pos > 0
                and (self.over_ts is not None or self.records[self.pos - 1].ts >= self.inject_ts))


def _paused(recs: list[Record], at: float, hold: float, heartbeat_s: float, job: str) -> list[Record]:
    """The job's records with a job-wide pause of `hold` s at `at`: `pause`, nothing but heartbeats (the last
    step each rank finished; from `at` to the end of the pause, so no rank is silent longer than a period),
    `resume`, then everything later by `hold`."""
    before = [r for r in recs if r.ts < at]
    last: dict[int, int | None] = {}
    for r in before:
        if r.kind == "heartbeat":
            last.setdefault(r.rank, None)
        elif r.kind == "step":
            last[r.rank] = r.step
    times = [*(at + k * heartbeat_s for k in range(math.ceil(hold / heartbeat_s))), at + hold - 0.05]
    beats = [Heartbeat(ts=round(t + 0.001 * rank, 6), job=job, rank=rank, step=step)
             for rank, step in sorted(last.items()) for t in times]
    said = [Lifecycle(ts=round(at, 6), job=job, event="pause", reason="eval", source="trainer"),
            Lifecycle(ts=round(at + hold, 6), job=job, event="resume", reason="eval", source="trainer")]
    later = [_later(r, hold) for r in recs if r.ts >= at]
    return sorted([*before, *beats, *said, *later], key=lambda r: r.ts)


def _later(rec: Record, hold: float) -> Record:
    """`rec` `hold` seconds later by every clock it carries (the wall clock's `ts`, the monotonic `mono`)."""
    mono = getattr(rec, "mono", None)
    if mono is None:
        return dataclasses.replace(rec, ts=round(rec.ts + hold, 6))
    return dataclasses.replace(rec, ts=round(rec.ts + hold, 6), mono=round(mono + hold, 6))


def _stopped(recs: list[Record], at: float, job: str, ranks: int) -> list[Record]:
    """The job's records up to a user's stop at `at`: every rank says `stop` (SIGTERM) within `STOP_SPREAD_S`."""
    stops = [Lifecycle(ts=round(at + STOP_SPREAD_S * rank / ranks, 6), job=job, event="stop", rank=rank,
                       reason="SIGTERM", source="trainer") for rank in range(ranks)]
    return [*(r for r in recs if r.ts < at), *stops]


def episode(spec: DrillSpec, inj: Injection, index: int, start_ts: float, inject_ts: float, start_step: int,
            restarted: bool) -> Episode:
    """The records of one episode, from `start_ts`, with `inj` at `inject_ts` (job record only if `restarted`)."""
    from gangwatch.producers.simulate import Fault, Noise, Scenario, simulate
    from gangwatch.producers.simulate.emit import messages

    at_s = round(inject_ts - start_ts, 6)
    faults: tuple[Fault, ...] = ()
    if not inj.benign:
        faults = (Fault(inj.kind, at_s, node=inj.node, rank=inj.rank, params=PARAMS.get(inj.kind, {})),)
    sc = Scenario(spec.job, seed=spec.seed * 1000 + index, tp=spec.tp, pp=spec.pp, dp=spec.dp,
                  gpus_per_node=spec.gpus_per_node, job=spec.job, start_ts=start_ts, start_step=start_step,
                  duration_s=at_s + inj.hold_s + spec.window_s + spec.quiet_s, faults=faults,
                  noise=Noise() if restarted else Noise(warmup_steps=0))
    plan = simulate(sc)
    recs = [decode_obj(d) for d in messages(sc) if restarted or d["kind"] != "job"]
    if inj.kind == "pause":
        recs = _paused(recs, inject_ts, inj.hold_s, sc.heartbeat_s, spec.job)
    elif inj.kind == "stop":
        recs = _stopped(recs, inject_ts, spec.job, spec.ranks)
    ckpts = [(k, a, b) for s in plan.segments for k, a, b in s.ckpt]
    if inj.kind == "pause":
        ckpts = [(k, a, b) if a < inject_ts else (k, a + inj.hold_s, b + inj.hold_s) for k, a, b in ckpts]
    return Episode(inj, start_ts, inject_ts, restarted, recs, ckpts)


@dataclass
class Seen:
    """What the pipeline and the controller said about the job."""

    actions: dict[str, Action] = field(default_factory=dict)
    incidents: dict[str, Incident] = field(default_factory=dict)  # the latest version of each
    recoveries: list[Recovery] = field(default_factory=list)

    def ended(self, action: str) -> Recovery | None:
        """The `resumed` or `failed` of an action (the first)."""
        return next((r for r in self.recoveries if r.action == action and r.phase in ("resumed", "failed")), None)

    def restart_since(self, ts: float) -> tuple[Action, Recovery] | None:
        """The first restarting action the controller accepted at or after `ts`."""
        got = [(r.ts, a.id, a, r) for r in self.recoveries
               if r.phase == "accepted" and r.ts >= ts and (a := self.actions.get(r.action)) is not None
               and a.type in RESTARTS]
        return min(got, key=lambda g: (g[0], g[1]))[2:] if got else None

    def awaiting(self, inc: Incident) -> bool:
        """An action of the incident still waits for its answer (a dual run, a replay)."""
        for aid in inc.extra.get("actions", ()):
            a = self.actions.get(aid)
            if a is not None and a.type in ANSWERED and not any(
                    r.action == aid and r.phase == ANSWERED[a.type] for r in self.recoveries):
                return True
        return False

    def restarting(self, inc: Incident) -> bool:
        return any((a := self.actions.get(aid)) is not None and a.type in RESTARTS
                   for aid in inc.extra.get("actions", ()))


class Drill:
    """The drill's job: its records as their time comes (`due`), episode after episode, until every injection
    had its outcome (`finished`); what it was told (`observe`) decides where episodes end."""

    def __init__(self, spec: DrillSpec, start_ts: float) -> None:
        self.spec, self.start_ts = spec, start_ts
        self.planned = injections(spec)
        self.seen = Seen()
        self.episodes: list[Episode] = []
        self.checkpoints: list[dict[str, Any]] = []  # saves the job finished, as the simulated truth lists them
        self.last_step = -1
        self._todo = list(self.planned)
        self._next(start_ts, restarted=True, start_step=0)

    @property
    def episode(self) -> Episode:
        return self.episodes[-1]

    @property
    def finished(self) -> bool:
        return not self._todo and self.episode.over_ts is not None

    @property
    def done(self) -> int:
        """Injections whose episode is over."""
        return len(self.planned) - len(self._todo)

    def observe(self, rec: Record) -> None:
        """An output of the pipeline (action, incident) or a controller's answer (recovery) about any job."""
        if getattr(rec, "job", None) != self.spec.job:
            return
        if isinstance(rec, Action):
            self.seen.actions.setdefault(rec.id, rec)
        elif isinstance(rec, Incident):
            old = self.seen.incidents.get(rec.id)
            if old is None or rec.ts >= old.ts:
                self.seen.incidents[rec.id] = rec
        elif isinstance(rec, Recovery):
            self.seen.recoveries.append(rec)

    def due(self, now: float) -> list[Record]:
        """The job's records with event time up to `now` not handed out yet, in time order."""
        out: list[Record] = []
        while True:
            ep = self.episode
            if ep.over_ts is not None:
                return out
            end = self._end(ep, now)
            limit = min(x for x in (now, ep.cut_ts, end[0] if end else None) if x is not None)
            while ep.pos < len(ep.records) and ep.records[ep.pos].ts <= limit:
                rec = ep.records[ep.pos]
                out.append(rec)
                ep.pos += 1
                if rec.kind == "step":
                    self.last_step = max(self.last_step, rec.step)
            for k, a, b in ep.checkpoints:
                if b <= limit and (not self.checkpoints or self.checkpoints[-1]["end_ts"] < b):
                    self.checkpoints.append({"step": k, "ts": round(a, 6), "end_ts": round(b, 6)})
            if end is None or end[0] > now:
                return out
            over, restarted, resume_step = end
            ep.over_ts = over
            if ep.cut_ts is None or ep.cut_ts >= ep.inject_ts:
                self._todo.remove(ep.injection)
            if not self._todo:
                return out
            self._next(over, restarted, resume_step if resume_step is not None else self.last_step + 1)

    def _next(self, start_ts: float, restarted: bool, start_step: int) -> None:
        inj = self._todo[0]
        self.last_step = start_step - 1
        inject_ts = max(self.start_ts + inj.at_s, start_ts + self.spec.lead_s)
        self.episodes.append(episode(self.spec, inj, len(self.episodes), start_ts, inject_ts, start_step,
                                     restarted))

    def _end(self, ep: Episode, now: float) -> tuple[float, bool, int | None] | None:
        """Where `ep` ends, whether the job then starts again, and from which step (None: after the last one);
        None while that is not known yet. Sets `cut_ts` once the job stopped."""
        spec, inj, seen = self.spec, ep.injection, self.seen
        restart = seen.restart_since(ep.start_ts)
        if restart is not None:
            action, accepted = restart
            ep.cut_ts = accepted.ts if ep.cut_ts is None else min(ep.cut_ts, accepted.ts)
            done = seen.ended(action.id)
            if done is None:
                return (now, True, None) if now >= accepted.ts + spec.window_s else None
            loaded = next((r for r in seen.recoveries if r.action == action.id and r.phase == "ckpt_loaded"
                           and isinstance(r.extra.get("step"), int)), None)
            return max(done.ts, accepted.ts), True, loaded.extra["step"] + 1 if loaded is not None else None
        if inj.kind == "pause":
            return ep.inject_ts + inj.hold_s + spec.quiet_s, False, None
        if inj.kind == "stop":
            ep.cut_ts = ep.inject_ts + STOP_SPREAD_S
            return ep.inject_ts + inj.hold_s, True, None
        give_up = (ep.inject_ts + spec.window_s, inj.kind in STALLS, None)
        inc = primary(seen.incidents.values(), inj, ep.inject_ts, now)
        if inc is None or seen.restarting(inc) or seen.awaiting(inc):
            return give_up if now >= give_up[0] else None
        if inc.decided_ts is None and not inc.extra.get("resolution"):
            return give_up if now >= give_up[0] else None
        settled = max(inc.ts, inc.decided_ts or 0.0) + spec.quiet_s
        return min(settled, give_up[0]), inj.kind in STALLS, None


def primary(incidents: Iterable[Incident], inj: Injection, since: float, until: float) -> Incident | None:
    """The incident of an injection: detected in [since, until], the one naming its machine, else the first."""
    found = sorted((i for i in incidents if i.detected_ts is not None and since - 1.0 <= i.detected_ts <= until
                    and not i.planned), key=lambda i: (i.detected_ts, i.id))
    named = [i for i in found if inj.node is not None and inj.node in i.culprit_nodes]
    return (named or found or [None])[0]


# --- the score ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One injected event: seconds from its injection to each stage of its incident, and the verdict."""

    index: int
    kind: str
    where: str
    at_s: float  # injected this long after the drill's start
    detect_s: float | None
    localize_s: float | None
    decide_s: float | None
    recover_s: float | None
    incident: str | None
    cls: str | None
    path: str | None
    culprits: list[str]
    actions: list[str]  # "type nodes", in order
    failures: list[str]  # why it failed (empty: it passed)
    notes: list[str] = field(default_factory=list)  # shown, not failed: recovery stages over their own budgets

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class Wrong:
    """An action that should not have happened."""

    action: str
    type: str
    nodes: list[str]
    why: str


@dataclass(frozen=True)
class RestoreCheck:
    checkpoint: str | None  # the reference picked (None: no ckpt_loaded carried one)
    candidates: int  # distinct references seen
    loads: int  # ckpt_loaded records seen
    restored: bool  # a restore from it was followed by `resumed` of the same action
    note: str


@dataclass(frozen=True)
class Report:
    rows: list[Row]
    wrong: list[Wrong]
    unexpected: list[str]  # incidents no injection explains
    budgets: Budgets
    restore: RestoreCheck | None = None

    @property
    def passed(self) -> bool:
        """Every row passed, no action was wrong, and a checkpoint the restore check drew was restored."""
        restored = self.restore is None or self.restore.checkpoint is None or self.restore.restored
        return all(r.passed for r in self.rows) and not self.wrong and restored


def _since(ts: float | None, t0: float) -> float | None:
    return None if ts is None else round(ts - t0, 1)


def score(drill: Drill, budgets: Budgets) -> Report:
    """Each injection against the budgets, and the actions that should not have happened."""
    seen = drill.seen
    windows = [(ep, ep.inject_ts, ep.over_ts if ep.over_ts is not None else math.inf)
               for ep in drill.episodes if ep.injected]
    owner: dict[str, Injection] = {}  # incident id -> the injection it belongs to
    rows = []
    for ep, t0, t1 in windows:
        inj = ep.injection
        mine = [i for i in seen.incidents.values() if i.detected_ts is not None and t0 - 1.0 <= i.detected_ts <= t1]
        for i in mine:
            owner.setdefault(i.id, inj)
        inc = primary(mine, inj, t0, t1)
        rows.append(_row(inj, t0, drill.start_ts, inc, mine, seen, budgets))
    wrong = []
    for a in sorted(seen.actions.values(), key=lambda a: (a.ts, a.id)):
        inj = owner.get(a.incident)
        if a.type in EVICTING and a.nodes:
            faulty = {inj.node} if inj is not None and inj.node is not None else set()
            innocent = [n for n in a.nodes if n not in faulty]
            if innocent:
                where = f"#{inj.index + 1} {inj.kind}" if inj is not None else "no injection"
                wrong.append(Wrong(a.id, a.type, innocent, f"not faulty ({where})"))
        elif a.type == "escalate" and (inj is None or inj.benign):
            wrong.append(Wrong(a.id, a.type, list(a.nodes),
                               f"a page for a benign {inj.kind}" if inj is not None else "a page for no injection"))
    unexpected = [f"{i.id} {i.cls} detected {_since(i.detected_ts, drill.start_ts)} s in"
                  for i in sorted(seen.incidents.values(), key=lambda i: (i.detected_ts or 0.0, i.id))
                  if i.id not in owner and not i.planned]
    return Report(rows, wrong, unexpected, budgets)


def _row(inj: Injection, t0: float, start: float, inc: Incident | None, mine: list[Incident], seen: Seen,
         b: Budgets) -> Row:
    acts = [a for i in mine for aid in i.extra.get("actions", ()) if (a := seen.actions.get(aid)) is not None]
    actions = [f"{a.type} {','.join(a.nodes)}".strip() for a in acts if a.type != "collect_stacks"]
    at = round(t0 - start, 1)
    if inj.benign:
        fails = [f"opened {i.cls} incident {i.id}" for i in mine]
        return Row(inj.index, inj.kind, inj.where, at, None, None, None, None, None, None, None, [], actions, fails)
    if inc is None:
        return Row(inj.index, inj.kind, inj.where, at, None, None, None, None, None, None, None, [], actions,
                   ["not detected"])
    stages = (_since(inc.detected_ts, t0), _since(inc.localized_ts, t0), _since(inc.decided_ts, t0),
              _since(inc.recovered_ts, t0))
    limits = (("detect", "detected", b.detect), ("localize", "localized", b.detect + b.localize),
              ("decide", "decided", b.detect + b.localize), ("recover", "recovered", b.total))
    keeps_running = inc.path == "non_stop"
    fails = []
    for (name, done, limit), took in zip(limits, stages, strict=True):
        if took is None and not (name == "recover" and keeps_running):
            fails.append(f"never {done}")
        elif took is not None and took > limit:
            fails.append(f"{name} {took:g} s > {limit:g} s")
    notes = [f"incident over budget: {s} {inc.stage_s.get(s, 0):g} s" for s in inc.over_budget
             if s not in ("detect", "total")]
    pages = [a for a in acts if a.type == "escalate"]
    if pages:
        fails.append(f"escalated to a human: {pages[0].reason[:100]}")
    elif inc.path == "manual":
        fails.append("escalated to a human")
    failed = [r for a in acts for r in seen.recoveries if r.action == a.id and r.phase == "failed"]
    if failed:
        fails.append(f"recovery failed ({failed[0].action})")
    return Row(inj.index, inj.kind, inj.where, at, *stages, inc.id, inc.cls, inc.path, list(inc.culprit_nodes),
               actions, fails, notes)


def restore_check(drill: Drill, seed: int) -> RestoreCheck:
    """A checkpoint reference picked (by the seed) from the `ckpt_loaded` records, and whether a restore from it
    was followed by `resumed` of the same action (restored successfully)."""
    loads = [r for r in drill.seen.recoveries if r.phase == "ckpt_loaded"]
    refs = sorted({str(r.extra["checkpoint"]) for r in loads if r.extra.get("checkpoint")})
    if not refs:
        note = ("no ckpt_loaded record names its checkpoint: the controller must put the checkpoint it loaded in "
                "the record's extra.checkpoint (a path or URI; extra.step: its step)" if loads else
                "no ckpt_loaded record: nothing was restored")
        return RestoreCheck(None, 0, len(loads), False, note)
    ref = random.Random(seed).choice(refs)
    ok = [r for r in loads if str(r.extra.get("checkpoint")) == ref
          and any(x.action == r.action and x.phase == "resumed" and x.ts >= r.ts for x in drill.seen.recoveries)]
    note = (f"restored by {ok[0].action} and resumed" if ok else
            "loaded but the job never resumed after it")
    return RestoreCheck(ref, len(refs), len(loads), bool(ok), note)


# --- shown to a person ----------------------------------------------------------------------------------


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def render(report: Report, head: str) -> str:
    """The drill's table: one row per injection, then wrong actions, unexpected incidents, the restore check."""
    b = report.budgets
    lines = [head, f"seconds from each injection to its incident's stage; budgets: detect {b.detect:g}, localize "
             f"and decide {b.detect + b.localize:g}, recover {b.total:g}"]
    cols = ("#", "event", "where", "at", "detect", "localize", "decide", "recover", "class", "path", "actions",
            "result")
    table = [cols]
    for r in report.rows:
        table.append((str(r.index + 1), r.kind, r.where, f"+{r.at_s:.0f}", _s(r.detect_s), _s(r.localize_s),
                      _s(r.decide_s), _s(r.recover_s), r.cls or "-", r.path or "-", "; ".join(r.actions) or "-",
                      ("pass" if r.passed else "FAIL: " + "; ".join(r.failures))
                      + "".join(f" ({n})" for n in r.notes)))
    widths = [max(len(row[i]) for row in table) for i in range(len(cols) - 1)]
    for row in table:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
    lines.append("wrong actions: " + ("none" if not report.wrong else "; ".join(
        f"{w.type} {','.join(w.nodes)} ({w.action}): {w.why}" for w in report.wrong)))
    lines.append("incidents no injection explains: " + ("none" if not report.unexpected else
                                                        "; ".join(report.unexpected)))
    rc = report.restore
    if rc is not None:
        lines.append(f"restore check: {rc.note}" if rc.checkpoint is None else
                     f"restore check: {rc.checkpoint} (drawn from {rc.candidates} checkpoint(s) named in {rc.loads} "
                     f"restore(s)): {'pass' if rc.restored else 'FAIL'}, {rc.note}")
    passed = sum(r.passed for r in report.rows)
    lines.append(f"{passed} of {len(report.rows)} passed" + ("" if report.passed else " -> FAIL"))
    return "\n".join(lines)


def to_json(report: Report, **head: Any) -> dict[str, Any]:
    return {**head, "passed": report.passed, "budgets": dataclasses.asdict(report.budgets),
            "rows": [{**dataclasses.asdict(r), "passed": r.passed} for r in report.rows],
            "wrong": [dataclasses.asdict(w) for w in report.wrong], "unexpected": report.unexpected,
            "restore": dataclasses.asdict(report.restore) if report.restore is not None else None}
