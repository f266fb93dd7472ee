"""Triage of one job: findings become incidents, incidents get decisions, recovery closes them.

Flow, all on event time:
What a finding means here is not written here: each finding type's policy is
declared beside its detector (`detectors.registry.Policy`), and triage asks a
finding's typed view (`detectors.catalog.typed`) for it.

1. Every finding updates its node's profile. Precursors, job-wide slowdowns and
   numeric blips stop there.
2. A finding that signals an interruption opens the job's incident (or joins the
   open one, possibly raising its class: a hang explained by a dead node is a
   fail-stop). A hang also asks the sidecars for a stack sweep at once. Job-level
   findings (ranks that never started, the whole job silent at once) open an
   `unknown` incident: they name no culprit, so it goes to a human, never evicts.
3. The decision waits a class-specific time for the rest of the evidence: a few
   seconds for a fail-stop, the stack sweep for a hang, the hysteresis hold for
   a straggler. Then findings are fused (`triage.localize`), the decision tree
   runs (`triage.decide`) and the guards review it (`triage.safety`).
4. `recovery` records and steps resuming past the stall close the incident.
   A decided incident of a job that kept running (SDC, a straggler) waits for
   the controller's word instead. Once the controller accepts one of its actions
   that stops and restarts the job, the old run's silence and stalled steps are
   the restart's, not news: until the job record of the new run (or `resumed`,
   `failed`, or the `total` budget passing) the findings of the old run join that
   incident instead of opening another.
   Once every rank has exited cleanly the job is over: later findings (the steps
   have stopped, after all) open nothing.
5. The job's life (`job_state` findings, `detectors.life`): while the job is
   stopping, stopped, finished or being restarted by its controller its silence
   is expected, so nothing opens; an incident not decided yet when the job
   stops, ends or restarts closes with that resolution and no action.
6. A job-wide stall with no culprit (every rank alike, the sweep names nobody)
   is class `stall`: it waits for progress until `stall_budget_s` after its
   onset, closing as `self_resolved` with no page when the job steps on (a
   checkpoint save, an evaluation pass), and escalates only if the job is still
   stalled then. A hang whose job steps on before its decision closes the same way.
7. A rank its node's agent reports frozen (stopped, traced, in uninterruptible
   sleep: a `frozen_rank` finding with the hang) is what the stall waits on:
   its node is named (the incident's `culprit_nodes`, the finding its evidence)
   but, with no other verdict, never evicted for it. The incident waits like a
   stall, up to `stall_budget_s` from its onset, for the process to thaw (the
   job stepping on closes it `self_resolved`, still naming it); still frozen
   then, a human is told who is frozen and how. Other evidence decides as
   usual, and a frozen rank then lends it no weight.
8. A crash loop: a software failure (a `signature`: cause, rank, message without
   its numbers) that recurs after a restart with no progress past the step it
   failed at is the same incident again, restarted at most
   `crash_loop_restarts` times; then it escalates, naming the rank's node. A
   software failure never evicts a machine on its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gangwatch.detectors.base import stable_id
from gangwatch.detectors.catalog import typed
from gangwatch.detectors.failstop import clean_exit
from gangwatch.detectors.life import QUIET
from gangwatch.detectors.registry import Typed
from gangwatch.detectors.topology import Topology
from gangwatch.fleet import kb
from gangwatch.schemas import (
    EVICTING_ACTIONS,
    RESTARTING_ACTIONS,
    Action,
    Finding,
    Outputs,
    Record,
    decode_obj,
    to_dict,
)
from gangwatch.schemas.classes import CLASSES, decided_by
from gangwatch.triage.budgets import TriageConfig
from gangwatch.triage.decide import Decision, Situation, decide
from gangwatch.triage.diagnose import ActiveDiagnosis
from gangwatch.triage.incident import KEEP_WAITING, Timeline
from gangwatch.triage.localize import localize
from gangwatch.triage.profile import NodeProfile
from gangwatch.triage.safety import Guards
from gangwatch.triage.shadow import Shadow
from gangwatch.triage.stragglers import Stragglers

_CORROBORATE_S = 1800.0  # a numeric anomaly this soon after an SDC decision belongs to it
_KEEP_PRECEDENTS = 32


class Triage:
    """Incidents and decisions of one job.

    It holds the job's state and carries decisions out (`act`); two collaborators decide what it hands them,
    through the interface of `triage.handle.TriageHandle` (which `Triage` implements): `stragglers`, the incidents of
    classes declared `decided_by="stragglers"`, and `diagnosis`, active diagnosis (the escalation ladder, replays,
    dual runs) and the answers to it. Which path an incident takes is read from its class's declaration
    (`schemas/classes.py`), never from its name."""

    def __init__(self, job: str, config: TriageConfig, topo: Topology | None = None) -> None:
        self.job = job
        self.config = config
        self.topo = topo
        self.profiles: dict[str, NodeProfile] = {}
        self.guards = Guards(config.safety)
        self.incident: Timeline | None = None
        # decided incidents of jobs that kept running (SDC, stragglers): they no longer gather evidence but
        # still wait for the controller's recovery records; the newest few are kept
        self.waiting: list[Timeline] = []
        self.gathered: list[Typed] = []  # the findings of the open incident, typed
        self.spares_used = 0  # hot replacements decided (against `config.spares`, or since the controller's count)
        self.spares_reported: int | None = None  # warm spares the controller last said it holds for the job
        self.max_step = -1
        self.stragglers = Stragglers(self)  # fail-slow decisions, and the stragglers kept running
        self.diagnosis = ActiveDiagnosis(self)  # the ladder, replays, dual runs, and their answers
        self.replacing: set[str] = set()  # nodes evicted since the job (re)started: their replacement is under way
        self.finished: set[int] = set()  # ranks that exited cleanly since the job (re)started
        # a waiting incident whose job-stopping action the controller accepted, until when its restart may take
        self.restarting: tuple[str, float] | None = None
        self.life: str | None = None  # the job's state (`detectors.life`): starting, running, stopped, ...
        self.run_ts = float("-inf")  # when the current run's job record was sent
        # crash loops: failure signature -> {"incident": the closed incident's timeline, "step": where it failed}
        self.loops: dict[str, dict[str, Any]] = {}
        self.shadow = Shadow(config.shadow_window_s)  # would-be actions waiting for their verdict
        self.shadow_ops: bool | None = None  # an `ops` record's `shadow` / `act` for this job (None: the setting)
        # after the ladder's restart rung: {"incident", "rungs", "until"}; the same fault back by then climbs on
        self.watch: dict[str, Any] | None = None
        self.precedents: list[kb.Entry] = []  # this job's closed incidents (newest last): a decision cites the closest
        self.acted: list[dict[str, Any]] = []  # the open incident's actions, for its entry once it closes

    @property
    def kept(self) -> dict[str, float]:
        """Node -> what its straggler costs (of each step) since it was kept (`Stragglers.kept`)."""
        return self.stragglers.kept

    # --- inputs ---------------------------------------------------------------

    def on_topology(self, topo: Topology) -> None:
        if self.topo is not None and (topo.ts, topo.ranks) == (self.topo.ts, self.topo.ranks):
            self.topo = topo
            return  # the same job record again (at-least-once delivery): no restart
        self.topo = topo
        self.finished = set()
        self.run_ts = topo.ts
        self.max_step = -1  # a new run: its progress is measured from its own first step
        self.stragglers.restarted()  # a restart: stragglers are measured afresh
        self.replacing = set()
        self.restarting = None  # the new run is watched afresh

    # Each input method appends what it produces to `out` (a new `Outputs` when not given) and returns it.

    def on_findings(self, findings: list[Finding], out: Outputs | None = None) -> Outputs:
        out = Outputs() if out is None else out
        touched: dict[str, float] = {}
        for f in findings:
            t = typed(f)
            if t.job_state is not None:  # the job's life, not a fault: an output of its own
                out.life.append(f)
                self._on_life(t, out)
                continue
            out.findings.append(f)
            if self.shadow.watch and t.incident_class is not None:
                self.shadow.on_finding(f)
            if t.withdraws is not None:
                self._withdraw(t, out)
                continue
            if self._restart_absorbs(t, out):
                continue
            if f.node is not None:
                self._profile(f.node).add(t, self.config.risk_half_life_s)
                touched[f.node] = max(touched.get(f.node, f.ts), f.ts)
            self._consider(t, out)
        for node, ts in sorted(touched.items()):
            out.profiles.append(self.profiles[node].snapshot(self.job, ts, self.config.risk_half_life_s))
        return out

    def on_record(self, rec: Record, out: Outputs | None = None) -> Outputs:
        out = Outputs() if out is None else out
        inc = self.incident
        if rec.kind == "step":
            if rec.step > self.max_step:
                self.max_step = rec.step
                if self.shadow.watch:
                    self.shadow.on_progress(rec.step, rec.ts, out)
                if inc and inc.decided_ts is not None and rec.step > inc.stall_step and rec.ts > inc.decided_ts:
                    inc.recovered_ts = rec.ts
                    self._close(rec.ts, out)
                elif inc and inc.decided_ts is None and CLASSES[inc.cls].self_resolves and \
                        rec.step > inc.stall_step:
                    inc.recovered_ts, inc.resolution = rec.ts, "self_resolved"  # it went on by itself: no page
                    if not any(t.verdict for t in self.gathered):
                        inc.cls = "stall"  # the whole job stalled and went on, nobody to blame
                    self._name_suspects(inc, rec.ts)  # ... or a frozen rank thawed: the stall waited on it
                    self._close(rec.ts, out)
        elif rec.kind == "recovery":
            self._on_recovery(rec, out)
        elif rec.kind == "ops":
            self.guards.on_ops(rec, self.config.planned_window_s)
            if rec.type in ("shadow", "act"):  # an operator turns shadow mode on or off for this job
                self.shadow_ops = rec.type == "shadow"
        elif rec.kind == "framework" and clean_exit(rec) and self.topo is not None and rec.rank < self.topo.size:
            self.finished.add(rec.rank)
        return out

    def _on_life(self, t: Typed, out: Outputs) -> None:
        """The job moved in its life; a stop or an end closes an incident not decided yet (a restart does not: the
        controller may be carrying out this very incident's decision, due a moment before its record)."""
        self.life = t.job_state
        inc = self.incident
        if self.life in ("stopped", "finished") and inc is not None and inc.decided_ts is None:
            inc.resolution = f"job_{self.life}"
            self._name_suspects(inc, t.finding.ts)
            self._close(t.finding.ts, out)

    def _name_suspects(self, inc: Timeline, ts: float) -> None:
        """An incident closed before its decision (the job ended first, or it stepped on by itself) still names,
        for its post-mortem, the nodes a verdict finding named that localization holds to be culprits, and those
        of the ranks frozen meanwhile (nothing is done about them)."""
        if inc.planned or self.topo is None:
            return
        named = {t.finding.node for t in self.gathered if t.verdict}
        culprits = set(localize(self.gathered, self.topo, self.config.confidence).culprits) & named
        culprits |= {t.finding.node for t in self.gathered if t.frozen and t.finding.node is not None}
        if culprits:
            inc.culprit_nodes = sorted(set(inc.culprit_nodes) | culprits)
            inc.localized_ts = ts if inc.localized_ts is None else inc.localized_ts

    def _withdraw(self, t: Typed, out: Outputs) -> None:
        """A late record shows a report of silence wrong: an incident not decided yet drops it (and closes,
        withdrawn, when nothing else opened it); a decided one gives the eviction back to the blast-radius
        budget and says so."""
        wid, f = t.withdraws, t.finding
        for inc in (self.incident, *self.waiting):
            if inc is None or wid not in inc.findings or wid in inc.withdrawn:
                continue
            inc.withdrawn.append(wid)
            if inc is self.incident and inc.decided_ts is None:
                self.gathered = [g for g in self.gathered if g.finding.id != wid]
                if not any(g.incident_class for g in self.gathered):
                    inc.resolution = "withdrawn"
                    self._close(f.ts, out)
                    return
            elif f.node in inc.evicted_nodes:
                self.guards.give_back([f.node])
                inc.resolution = "withdrawn"
            out.incidents.append(inc.record(f.ts, self.config.budgets))
            return

    def _job_over(self) -> bool:
        """Every rank exited cleanly: the job finished, and the silence and stalled steps after it are no fault."""
        return self.topo is not None and len(self.finished) == self.topo.size

    def spares_left(self) -> int | None:
        """Warm spares left for hot replacements: the controller's last count less what was decided since, else
        the configured pool less what was used (None: unlimited)."""
        if self.spares_reported is not None:
            return max(0, self.spares_reported - self.spares_used)
        return None if self.config.spares is None else max(0, self.config.spares - self.spares_used)

    def pool(self) -> str:
        """The spare pool's state, for a decision's reason."""
        left = self.spares_left()
        if left is None:
            return ""  # no count from the controller and no pool configured: nothing to say
        whose = "by the controller's count" if self.spares_reported is not None else "of triage.spares"
        return f"{left} warm spare{'s' if left != 1 else ''} left, {whose}"

    def _on_recovery(self, rec: Record, out: Outputs) -> None:
        if rec.spares is not None:  # the controller's own count replaces what was decided against before it
            self.spares_reported, self.spares_used = rec.spares, 0
        if rec.phase in ("dual_run_result", "replay_result"):
            for w in (self.incident, *self.waiting):
                if w is not None and w.awaiting and w.awaiting["action"] == rec.action:
                    self.diagnosis.answer(w, rec, out)
                    return
            return  # an answer nobody waits for (late, or asked before a restart): recorded, nothing more
        inc = self.incident
        if inc is not None and rec.action in inc.actions:
            if inc.on_phase(rec.phase, rec.ts):
                if rec.phase == "resumed":
                    self._close(rec.ts, out)
                else:
                    out.incidents.append(inc.record(rec.ts, self.config.budgets))
            return
        for w in self.waiting:
            if rec.action not in w.actions:
                continue
            if rec.phase == "accepted" and rec.action in w.restarts:
                self.restarting = (w.id, rec.ts + self.config.budgets.total)
            elif rec.phase in ("resumed", "failed") and self.restarting and self.restarting[0] == w.id:
                self.restarting = None
            if w.on_phase(rec.phase, rec.ts):
                out.incidents.append(w.record(rec.ts, self.config.budgets))
                if rec.phase == "resumed" and not w.awaiting:  # (one still asking waits for its answer)
                    self.waiting.remove(w)
            return

    def _restart_absorbs(self, t: Typed, out: Outputs) -> bool:
        """A finding of the run the controller is stopping joins the incident it stops it for (no profile, no
        new incident); True when it did."""
        if self.restarting is None or self.incident is not None:
            return False
        wid, until = self.restarting
        w = next((w for w in self.waiting if w.id == wid), None)
        f = t.finding
        if w is None or f.ts > until:
            self.restarting = None
            return False
        if t.incident_class is None:
            return False
        w.findings.append(f.id)
        out.incidents.append(w.record(f.ts, self.config.budgets))
        return True

    def due(self) -> float:
        """The earliest event time at which `advance` decides something: the open incident's decision, the end
        of a wait for an answer or for the next rung (inf: nothing). A record at or past it must come after that
        decision, as it did live: the job's core advances to a record's time first when it is (`JobCore`)."""
        inc, t = self.incident, math.inf
        if inc is not None and inc.decided_ts is None:
            t = inc.decide_at
        for w in (inc, *self.waiting):
            if w is not None and w.awaiting and w.awaiting["until"] < t:
                t = w.awaiting["until"]
        return t

    def advance(self, now: float, out: Outputs | None = None) -> Outputs:
        out = Outputs() if out is None else out
        inc = self.incident
        if inc is not None and inc.decided_ts is None and now >= inc.decide_at:
            self._decide(inc.decide_at, out)
        for w in (self.incident, *self.waiting):
            if w is not None and w.awaiting and now >= w.awaiting["until"]:
                if w.awaiting["kind"] == "ladder":  # the wait before the next rung is over
                    self.diagnosis.next_rung(w, out)
                else:
                    self.diagnosis.unanswered(w, w.awaiting["until"], out)
        if self.shadow.watch:
            self.shadow.advance(now, out)
        return out

    # --- incidents --------------------------------------------------------------

    def _consider(self, t: Typed, out: Outputs) -> None:
        if self._job_over() or self.life in QUIET:
            return  # recorded in the profiles; a job stopped, ended or restarting on purpose has nothing to recover
        f, p = t.finding, t.policy
        cls = t.incident_class
        path = decided_by(p.incident)
        if path == "stragglers" and self.stragglers.settled(t):
            return  # kept running (no flapping unless it got much worse), or being replaced already
        inc = self.incident
        if inc is None and path == "dual_run" and f.rank is None:
            recent = [w for w in self.waiting if w.cls == p.incident and f.ts - w.detected_ts <= _CORROBORATE_S]
            if recent:  # the numbers going bad after a replica mismatch: the same corruption surfacing
                recent[-1].findings.append(f.id)
                out.incidents.append(recent[-1].record(f.ts, self.config.budgets))
                return
        if inc is not None and inc.signature and t.signature == inc.signature and inc.decided_ts is not None \
                and f.ts > self.run_ts > inc.decided_ts:
            self._recur(inc, t, out)  # it failed the same way again after its restart
            return
        if inc is None:
            if cls is None:
                return
            inc = self._open(t, cls)
            inc.findings.append(f.id)
            self.gathered.append(t)
            if p.sweep and CLASSES[inc.cls].decided_by != "nobody":  # a planned stop is no stall to debug
                self._collect_stacks(t, out)
        else:
            changed = cls is not None and inc.promote(cls)
            if inc.decided_ts is None and (changed or p.sweep_result):
                # a new class, or the sweep is in: the rest of it arrives within seconds
                inc.decide_at = min(inc.decide_at, f.ts + self.config.settle_s)
            inc.findings.append(f.id)
            self.gathered.append(t)
        if CLASSES[inc.cls].decided_by == "stragglers" and inc.decided_ts is None:
            self.stragglers.corroborate(inc, t)
        if inc.decided_ts is not None and t.verdict and f.node not in inc.culprit_nodes:
            self._decide(f.ts, out)  # a new culprit after the decision: decide again for it

    def _open(self, t: Typed, cls: str) -> Timeline:
        f = t.finding
        sig = t.signature
        loop = self.loops.get(sig) if sig else None
        if loop is not None:
            if self.max_step <= loop["step"]:  # no progress past where it failed before: the same incident again
                inc = Timeline.from_dict(loop["incident"])
                self.incident, self.gathered = inc, []
                self._recur(inc, t, None)
                return inc
            del self.loops[sig]  # it got further this time: the restarts help
        onset = t.onset_ts
        planned = self.guards.is_planned(f.ts)
        wait = {"settle": self.config.settle_s, "sweep": self.config.hang_collect_s,
                "hold": self.config.safety.failslow_hold_s, "late": self.config.late_s}[t.waits or CLASSES[cls].waits]
        if t.policy.sweep_result:
            wait = 0.0  # a finished sweep is already all the evidence there will be
        inc = Timeline(id=stable_id("i", self.job, f.id), job=self.job, cls="planned" if planned else cls,
                       onset_ts=onset, detected_ts=f.ts, planned=planned, decide_at=f.ts + wait, signature=sig,
                       stall_step=self.max_step)
        if t.waits == "late" and t.verdict and f.node is not None:  # it names its node now; only the decision
            inc.localized_ts = f.ts  # waits for late records (a one-node job's silence only the stream saw)
        if self.watch is not None and f.ts <= self.watch["until"] and not planned:  # back after a restart
            inc.rungs = [*self.watch["rungs"][:-1], {**self.watch["rungs"][-1], "outcome":
                         f"the fault came back ({self.watch['incident']})"}]
            self.watch = None
        self.incident = inc
        self.gathered = []
        self.acted = []
        return inc

    def _recur(self, inc: Timeline, t: Typed, out: Outputs | None) -> None:
        """A crash loop's failure again: the incident is decided anew on this evidence (the same one, reopened
        when it had closed)."""
        f = t.finding
        inc.attempts += 1
        inc.decided_ts = inc.recovered_ts = inc.resolution = None
        inc.decide_at = f.ts + self.config.settle_s
        inc.stall_step = self.max_step
        if out is not None:
            inc.findings.append(f.id)
            self.gathered = [t]

    def _collect_stacks(self, t: Typed, out: Outputs) -> None:
        inc, f = self.incident, t.finding
        a = Action(id=stable_id("a", inc.id, "collect_stacks"), ts=f.ts, job=self.job, incident=inc.id,
                   type="collect_stacks", nodes=[], path=None, evidence=[f.id],
                   reason=f"{t.describe}: sweep stacks and flight-recorder dumps")
        inc.actions.append(a.id)
        out.actions.append(a)
        out.incidents.append(inc.record(f.ts, self.config.budgets))

    def _decide(self, now: float, out: Outputs) -> None:
        inc = self.incident
        topo = self.topo
        software = tuple(t.finding.rank for t in self.gathered if t.software and t.finding.rank is not None)
        frozen = [t for t in self.gathered if t.frozen and t.finding.node is not None]
        others = [t for t in self.gathered if not t.frozen] if frozen else self.gathered
        held = bool(frozen) and not software and not any(t.verdict for t in others)  # the stall waits on them
        # frozen ranks name their nodes only when nothing else explains the incident (what a sweep then finds odd
        # is the frozen rank's victims); they never lend weight to evicting a node
        loc = localize(frozen if held else others, topo, self.config.confidence)
        frozen_nodes = tuple(sorted({t.finding.node for t in frozen})) if held else ()
        if inc.localized_ts is None and (loc.culprits or loc.group or frozen_nodes):
            inc.localized_ts = now
        if held:
            inc.culprit_nodes = sorted(set(inc.culprit_nodes) | set(frozen_nodes))
            stall_ends = inc.onset_ts + self.config.stall_budget_s
            if inc.decided_ts is None and now < stall_ends:  # it may thaw by itself: wait, as for a stall
                inc.decide_at = stall_ends
                out.incidents.append(inc.record(now, self.config.budgets))
                return
        if CLASSES[inc.cls].decided_by == "stragglers" and inc.decided_ts is None and loc.culprits and \
                not loc.group and loc.confidence >= self.config.confidence:
            self.stragglers.decide(inc, loc, now, out)
            return
        job_level = tuple(t.describe for t in self.gathered if t.policy.job_level)
        unsure = [t for t in self.gathered if t.finding.node is not None and not t.evicts]
        if CLASSES[inc.cls].self_resolves and not (held or loc.culprits or loc.group or software or job_level) \
                and not any(t.policy.suspects is not None for t in self.gathered):
            stall_ends = inc.onset_ts + self.config.stall_budget_s
            if now < stall_ends:  # every rank alike and nobody named: wait for progress, up to the budget
                if inc.cls != "stall":
                    inc.cls = "stall"
                    out.incidents.append(inc.record(now, self.config.budgets))
                inc.decide_at = stall_ends
                return
            inc.cls = "stall"
        situation = Situation(
            cls=inc.cls, loc=loc, threshold=self.config.confidence,
            spares_left=self.spares_left(), pool=self.pool(),
            replace_cost_s=self.config.replace_cost_s, failslow_horizon_s=self.config.failslow_horizon_s,
            slowdown_frac=max((s for t in self.gathered if t.finding.node in loc.culprits
                               and (s := t.slowdown_frac) is not None), default=0.0),
            software_ranks=software, software_nodes=tuple(sorted({topo.node_of(r) for r in software})),
            summary=self.summarize(), job_level=job_level, stalled_s=max(0.0, now - inc.onset_ts),
            frozen=tuple(t.describe for t in frozen) if held else (), frozen_nodes=frozen_nodes,
            unsure=tuple(t.describe for t in unsure), unsure_nodes=tuple(sorted({t.finding.node for t in unsure})),
        )
        already = set(inc.evicted_nodes)
        decisions = [d for d in decide(situation) if not (d.nodes and set(d.nodes) <= already)]
        limit = self.config.crash_loop_restarts + len(inc.swapped)  # (a swap is one more try)
        if inc.signature and inc.attempts >= limit:
            paged = inc.attempts > limit  # once: later recurrences only join it
            restarts = [d for d in decisions if d.type in ("restart_in_process", "requeue")]
            swap = self._swap(inc) if restarts and not paged and not inc.swapped else None
            decisions = ([swap] if swap else [self._crash_loop(inc, d) for d in restarts if not paged]) + \
                [d for d in decisions if d.type not in ("restart_in_process", "requeue")]
        decisions = self.guards.review(decisions, now, len(topo.nodes))
        if self.config.ladder and CLASSES[inc.cls].stops_the_job and not inc.planned and not software \
                and not job_level and not held and not (loc.culprits and loc.confidence >= self.config.confidence):
            decisions = self.diagnosis.climb(inc, loc, decisions, now)
        first = inc.decided_ts is None
        evidence = loc.evidence or [t.finding.id for t in self.gathered[:16]]
        decisions = self._cite(decisions, evidence)
        if first:
            inc.decided_ts = now
            inc.stall_step = self.max_step
        inc.culprit_nodes = sorted(set(inc.culprit_nodes) | set(loc.culprits) | set(loc.group_nodes))
        for d in decisions:
            self.act(d, now, evidence, out)
        if first and inc.path in ("non_stop", None) and not any(d.type == "escalate" for d in decisions):
            inc.recovered_ts = now  # kept running: nothing to recover from
            self._close(now, out)
            return
        out.incidents.append(inc.record(now, self.config.budgets))
        if first and CLASSES[inc.cls].keeps_training:
            # the job did not stop, so steps going on prove nothing: wait for the controller's word
            self.await_controller(inc)
            self.let_go()

    def _swap(self, inc: Timeline) -> Decision | None:
        """A crash loop whose failure stayed on one node, with a spare free: that node swapped for a spare once,
        to tell the node from the code (None: no spare, or no one node). If the failure then follows its rank
        onto the spare, it is the code (`_crash_loop` says so, naming the swap); if it does not, the node is
        out."""
        left = self.spares_left()
        if left is not None and left < 1:
            return None
        rank, node = self._loop_rank(inc)
        inc.swapped = [node]
        return Decision("replace", (node,), "hot",
                        f"crash loop: {rank} on {node} failed the same way {inc.attempts + 1} times after "
                        f"{inc.attempts} restart{'s' if inc.attempts != 1 else ''} with no progress past step "
                        f"{inc.stall_step}: {node} is swapped for a spare once, to tell the node from the code "
                        f"(the same failure on the spare is the code's){self.pool()}")

    def _loop_rank(self, inc: Timeline) -> tuple[str, str]:
        """A crash loop's rank, as its signature says it ("rank N"), and the node it runs on now."""
        rank = inc.signature.split("|", 2)[1]
        return rank, self.topo.node_of(int(rank.split()[-1]))

    def _crash_loop(self, inc: Timeline, d: Decision) -> Decision:
        """Restarting again would fail again: a human, told the signature, the count and where (and, after a swap,
        that the failure followed its rank onto the spare)."""
        cause, _, message = inc.signature.split("|", 2)
        rank, node = self._loop_rank(inc)
        nodes = d.nodes or (node,)
        swap = (f"; it followed {rank} from {', '.join(inc.swapped)} onto the spare {', '.join(nodes)}, so it is "
                "not the machine") if inc.swapped else ""
        return Decision("escalate", nodes, "manual",
                        f"crash loop: {rank} on {', '.join(nodes)} failed the same way {inc.attempts + 1} times "
                        f"({cause}: {message}) after {inc.attempts} restart{'s' if inc.attempts != 1 else ''} with no "
                        f"progress past step {inc.stall_step}{swap}: no more restarts; a software failure evicts no "
                        "machine; a human must fix the code, the data or the configuration")

    def _cite(self, decisions: list[Decision], evidence: list[str]) -> list[Decision]:
        """The first decision's reason names the closest past incident of the job (`fleet.kb`), when one is alike."""
        if not decisions or not self.precedents:
            return decisions
        cited = set(evidence)
        sig = kb.Signature.of((t.finding.type, t.finding.detector, t.finding.node, t.finding.evidence)
                              for t in self.gathered if t.finding.id in cited)
        match = kb.closest(sig, self.precedents)
        if match is None:
            return decisions
        first = decisions[0]
        return [Decision(first.type, first.nodes, first.path, f"{first.reason}; {match.cite()}", first.data),
                *decisions[1:]]

    # --- what the collaborators may do (`triage.handle.TriageHandle`) ------------------------

    def act(self, d: Decision, now: float, evidence: list[str], out: Outputs, inc: Timeline | None = None,
            results: dict[str, str] | None = None) -> None:
        """Carry out `d` for `inc` (the open incident when None): its action, sent or shadowed."""
        inc = inc or self.incident
        again = (inc.attempts,) if inc.attempts else ()  # a crash loop's later restarts are actions of their own
        data = dict(d.data or {})
        plan = data.pop("plan", None)  # a replay's plan stays with the incident; the action carries its phase
        if "phase" in data or "rung" in data:  # a replay's phases, the ladder's rungs: actions of their own
            again = (*again, f"phase {data.get('phase')} rung {data.get('rung')}")
        a = Action(id=stable_id("a", inc.id, d.type, *d.nodes, *again), ts=round(now, 6), job=self.job, incident=inc.id,
                   type=d.type, nodes=list(d.nodes), reason=d.reason, evidence=sorted(evidence), path=d.path,
                   extra=data)
        if a.id in inc.actions:
            return
        inc.actions.append(a.id)
        if inc.path is None or d.type != "escalate":
            inc.path = d.path if inc.path in (None, "non_stop") or d.type in ("replace", "evict_group") else inc.path
        if self._shadowed():  # recorded, scored later, sent nowhere; the incident follows it as if it were sent
            inc.shadow = True
            self.shadow.would(a, inc.cls, self.max_step, out)
            if d.type in EVICTING_ACTIONS:
                self.guards.give_back(list(d.nodes))  # nothing was evicted: the blast radius is untouched
            if d.type == "degrade":
                self.stragglers.kept_running(d.nodes, now)
            return
        if inc is self.incident:
            self.acted.append(to_dict(a))
        if d.type in RESTARTING_ACTIONS:
            inc.restarts.append(a.id)
        if d.type == "dual_run":
            inc.awaiting = {"kind": "dual_run", "action": a.id, "nodes": list(d.nodes), "asked": a.ts,
                            "until": a.ts + self.config.dual_run_timeout_s}
        elif d.type == "replay":
            inc.awaiting = {"kind": "replay", "action": a.id, "nodes": list(d.nodes), "asked": a.ts,
                            "until": a.ts + self.config.replay_timeout_s, "plan": plan, "results": results or {}}
        out.actions.append(a)
        if d.type in EVICTING_ACTIONS:
            new = [n for n in d.nodes if n not in inc.evicted_nodes]
            inc.evicted_nodes = sorted(set(inc.evicted_nodes) | set(new))
            for n in new:
                self._profile(n).evicted(now)
            if d.type != "requeue" and d.path == "hot":
                self.spares_used += len(new)
        if d.type == "degrade":
            self.stragglers.kept_running(d.nodes, now)
        elif d.type in EVICTING_ACTIONS:
            self.stragglers.evicted(d.nodes)
            self.replacing.update(d.nodes)

    def _shadowed(self) -> bool:
        return self.config.shadow if self.shadow_ops is None else self.shadow_ops

    def _close(self, ts: float, out: Outputs) -> None:
        inc = self.incident
        record = inc.record(ts, self.config.budgets)
        out.incidents.append(record)
        if inc.decided_ts is not None and not inc.planned and self.acted:  # a precedent for the job's next ones
            entry = kb.entry(to_dict(record), self.acted, [to_dict(t.finding) for t in self.gathered])
            self.precedents = [*self.precedents[-(_KEEP_PRECEDENTS - 1):], entry]
        self.acted = []
        if inc.rungs and inc.rungs[-1]["rung"] == "restart" and inc.recovered_ts is not None:
            # the restart got the job going: the same fault back soon goes on up the ladder
            self.watch = {"incident": inc.id, "rungs": inc.rungs, "until": ts + self.config.ladder_watch_s}
        if inc.signature and inc.decided_ts is not None:  # it may come back after its restart: a crash loop
            self.loops = {**{k: v for k, v in self.loops.items() if k != inc.signature},
                          inc.signature: {"incident": inc.to_dict(), "step": inc.stall_step}}
            while len(self.loops) > KEEP_WAITING:
                del self.loops[next(iter(self.loops))]
        self.incident = None
        self.gathered = []

    def await_controller(self, inc: Timeline) -> None:
        """`inc` is decided and its job trains on: it waits for the controller's word (the newest few are kept)."""
        self.waiting = [*self.waiting[-(KEEP_WAITING - 1):], inc]

    def done_asking(self, inc: Timeline) -> None:
        """`inc` got its answer (or gave up on it): once its job has recovered it waits no more."""
        if inc.recovered_ts is not None and inc in self.waiting:
            self.waiting.remove(inc)

    def let_go(self) -> None:
        """The open incident is decided and handed on: no incident is open, no evidence gathered."""
        self.incident = None
        self.gathered = []

    def summarize(self, of: Sequence[Typed] | None = None) -> str:
        """One line of what the findings (the open incident's when None) say, for a reason."""
        kinds: dict[str, int] = {}
        for t in self.gathered if of is None else of:
            kinds[t.label] = kinds.get(t.label, 0) + 1
        return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(kinds.items())) or "no findings"

    def _profile(self, node: str) -> NodeProfile:
        p = self.profiles.get(node)
        if p is None:
            p = self.profiles[node] = NodeProfile(node)
        return p

    # --- state ---------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"incident": self.incident.to_dict() if self.incident else None,
                "waiting": [w.to_dict() for w in self.waiting],
                "evidence": [to_dict(t.finding) for t in self.gathered],
                "profiles": {n: p.to_dict() for n, p in sorted(self.profiles.items())},
                "guards": self.guards.to_dict(), "spares_used": self.spares_used, "max_step": self.max_step,
                "spares_reported": self.spares_reported,
                "degraded": dict(self.stragglers.degraded), "kept": dict(self.stragglers.kept),
                "replacing": sorted(self.replacing),
                "finished": sorted(self.finished),
                "restarting": list(self.restarting) if self.restarting else None,
                "life": self.life, "run_ts": None if self.run_ts == float("-inf") else self.run_ts,
                "loops": self.loops, "shadow": self.shadow.state(), "shadow_ops": self.shadow_ops,
                "watch": self.watch, "precedents": [e.to_dict() for e in self.precedents], "acted": self.acted}

    @classmethod
    def from_state(cls, state: dict[str, Any], config: TriageConfig, topo: Topology) -> Triage:
        tri = cls(topo.job, config, topo)
        tri.incident = Timeline.from_dict(state["incident"]) if state["incident"] else None
        tri.waiting = [Timeline.from_dict(w) for w in state["waiting"]]
        tri.gathered = [typed(decode_obj(f)) for f in state["evidence"]]
        tri.profiles = {n: NodeProfile.from_dict(p) for n, p in state["profiles"].items()}
        tri.guards = Guards.from_dict(state["guards"], config.safety)
        tri.spares_used = state["spares_used"]
        tri.spares_reported = state["spares_reported"]
        tri.max_step = state["max_step"]
        tri.stragglers.degraded = dict(state["degraded"])
        tri.stragglers.kept = dict(state["kept"])
        tri.replacing = set(state["replacing"])
        tri.finished = set(state["finished"])
        tri.restarting = tuple(state["restarting"]) if state["restarting"] else None
        tri.life = state["life"]
        tri.run_ts = float("-inf") if state["run_ts"] is None else state["run_ts"]
        tri.loops = dict(state["loops"])
        tri.shadow = Shadow.from_state(state["shadow"], config.shadow_window_s)
        tri.shadow_ops = state["shadow_ops"]
        tri.watch = state["watch"]
        tri.precedents = [kb.Entry.from_dict(e) for e in state["precedents"]]
        tri.acted = list(state["acted"])
        return tri

