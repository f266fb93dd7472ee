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
   Once every rank has exited cleanly the job is over: later findings (the steps
   have stopped, after all) open nothing.
"""

from __future__ import annotations

from typing import Any

from gangwatch.detectors.base import stable_id
from gangwatch.detectors.catalog import typed
from gangwatch.detectors.failstop import clean_exit
from gangwatch.detectors.registry import Typed
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import EVICTING_ACTIONS, Action, Finding, Outputs, Record, decode_obj, to_dict
from gangwatch.triage.config import TriageConfig
from gangwatch.triage.decide import Decision, Situation, decide
from gangwatch.triage.incident import Timeline
from gangwatch.triage.localize import localize
from gangwatch.triage.profile import NodeProfile
from gangwatch.triage.safety import Guards

_CORROBORATE_S = 1800.0  # a numeric anomaly this soon after an SDC decision belongs to it
_KEEP_WAITING = 16


class Triage:
    """Incidents and decisions of one job."""

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
        self.spares_used = 0
        self.max_step = -1
        self.degraded: dict[str, float] = {}  # node -> when it was last left running as a straggler
        self.finished: set[int] = set()  # ranks that exited cleanly since the job (re)started

    # --- inputs ---------------------------------------------------------------

    def on_topology(self, topo: Topology) -> None:
        self.topo = topo
        self.finished = set()

    # Each input method appends what it produces to `out` (a new `Outputs` when not given) and returns it.

    def on_findings(self, findings: list[Finding], out: Outputs | None = None) -> Outputs:
        out = Outputs() if out is None else out
        out.findings += findings
        touched: dict[str, float] = {}
        for f in findings:
            t = typed(f)
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
                if inc and inc.decided_ts is not None and rec.step > inc.stall_step and rec.ts > inc.decided_ts:
                    inc.recovered_ts = rec.ts
                    self._close(rec.ts, out)
        elif rec.kind == "recovery":
            self._on_recovery(rec, out)
        elif rec.kind == "ops":
            self.guards.on_ops(rec, self.config.planned_window_s)
        elif rec.kind == "framework" and clean_exit(rec) and self.topo is not None and rec.rank < self.topo.size:
            self.finished.add(rec.rank)
        return out

    def _job_over(self) -> bool:
        """Every rank exited cleanly: the job finished, and the silence and stalled steps after it are no fault."""
        return self.topo is not None and len(self.finished) == self.topo.size

    def _on_recovery(self, rec: Record, out: Outputs) -> None:
        inc = self.incident
        if inc is not None and rec.action in inc.actions:
            if inc.on_phase(rec.phase, rec.ts):
                if rec.phase == "resumed":
                    self._close(rec.ts, out)
                else:
                    out.incidents.append(inc.record(rec.ts, self.config.budgets))
            return
        for w in self.waiting:
            if rec.action in w.actions and w.on_phase(rec.phase, rec.ts):
                out.incidents.append(w.record(rec.ts, self.config.budgets))
                if rec.phase == "resumed":
                    self.waiting.remove(w)
                return

    def advance(self, now: float, out: Outputs | None = None) -> Outputs:
        out = Outputs() if out is None else out
        inc = self.incident
        if inc is not None and inc.decided_ts is None and now >= inc.decide_at:
            self._decide(inc.decide_at, out)
        return out

    # --- incidents --------------------------------------------------------------

    def _consider(self, t: Typed, out: Outputs) -> None:
        if self._job_over():
            return  # recorded in the profiles; nothing left to recover
        f, p = t.finding, t.policy
        cls = t.incident_class
        if p.incident == "fail_slow" and f.node in self.degraded and \
                f.ts - self.degraded[f.node] < self.config.safety.failslow_cooldown_s:
            return  # already decided to live with this straggler: no flapping
        inc = self.incident
        if inc is None and p.incident == "sdc" and f.rank is None:
            recent = [w for w in self.waiting if w.cls == "sdc" and f.ts - w.detected_ts <= _CORROBORATE_S]
            if recent:  # the numbers going bad after a replica mismatch: the same corruption surfacing
                recent[-1].findings.append(f.id)
                out.incidents.append(recent[-1].record(f.ts, self.config.budgets))
                return
        if inc is None:
            if cls is None:
                return
            inc = self._open(t, cls)
            inc.findings.append(f.id)
            self.gathered.append(t)
            if p.sweep and inc.cls != "planned":  # a planned stop is no stall to debug
                self._collect_stacks(t, out)
        else:
            changed = cls is not None and inc.promote(cls)
            if inc.decided_ts is None and (changed or p.sweep_result):
                # a new class, or the sweep is in: the rest of it arrives within seconds
                inc.decide_at = min(inc.decide_at, f.ts + self.config.settle_s)
            inc.findings.append(f.id)
            self.gathered.append(t)
        if inc.decided_ts is not None and t.verdict and f.node not in inc.culprit_nodes:
            self._decide(f.ts, out)  # a new culprit after the decision: decide again for it

    def _open(self, t: Typed, cls: str) -> Timeline:
        f = t.finding
        onset = t.onset_ts
        planned = self.guards.is_planned(f.ts)
        wait = {"hang": self.config.hang_collect_s, "fail_slow": self.config.safety.failslow_hold_s}.get(
            cls, self.config.settle_s)
        if t.policy.sweep_result:
            wait = 0.0  # a finished sweep is already all the evidence there will be
        inc = Timeline(id=stable_id("i", self.job, f.id), job=self.job, cls="planned" if planned else cls,
                       onset_ts=onset, detected_ts=f.ts, planned=planned, decide_at=f.ts + wait)
        self.incident = inc
        self.gathered = []
        return inc

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
        loc = localize(self.gathered, topo, self.config.confidence)
        if inc.localized_ts is None and (loc.culprits or loc.group):
            inc.localized_ts = now
        situation = Situation(
            cls=inc.cls, loc=loc, threshold=self.config.confidence,
            spares_left=None if self.config.spares is None else self.config.spares - self.spares_used,
            replace_cost_s=self.config.replace_cost_s, failslow_horizon_s=self.config.failslow_horizon_s,
            slowdown_frac=max((s for t in self.gathered if t.finding.node in loc.culprits
                               and (s := t.slowdown_frac) is not None), default=0.0),
            software_ranks=tuple(t.finding.rank for t in self.gathered if t.software and t.finding.rank is not None),
            numeric_only=not loc.culprits and any(t.policy.incident == "sdc" for t in self.gathered),
            summary=self._summary(),
            job_level=tuple(t.describe for t in self.gathered if t.policy.job_level),
        )
        already = set(inc.evicted_nodes)
        decisions = [d for d in decide(situation) if not (d.nodes and set(d.nodes) <= already)]
        decisions = self.guards.review(decisions, now, len(topo.nodes))
        first = inc.decided_ts is None
        if first:
            inc.decided_ts = now
            inc.stall_step = self.max_step
        inc.culprit_nodes = sorted(set(inc.culprit_nodes) | set(loc.culprits) | set(loc.group_nodes))
        for d in decisions:
            self._act(d, now, loc.evidence or [t.finding.id for t in self.gathered[:16]], out)
        if first and inc.path in ("non_stop", None) and not any(d.type == "escalate" for d in decisions):
            inc.recovered_ts = now  # kept running: nothing to recover from
            self._close(now, out)
            return
        out.incidents.append(inc.record(now, self.config.budgets))
        if first and inc.cls in ("sdc", "fail_slow"):
            # the job did not stop, so steps going on prove nothing: wait for the controller's word
            self.waiting = [*self.waiting[-(_KEEP_WAITING - 1):], inc]
            self.incident = None
            self.gathered = []

    def _act(self, d: Decision, now: float, evidence: list[str], out: Outputs) -> None:
        inc = self.incident
        a = Action(id=stable_id("a", inc.id, d.type, *d.nodes), ts=round(now, 6), job=self.job, incident=inc.id,
                   type=d.type, nodes=list(d.nodes), reason=d.reason, evidence=sorted(evidence), path=d.path)
        if a.id in inc.actions:
            return
        inc.actions.append(a.id)
        out.actions.append(a)
        if inc.path is None or d.type != "escalate":
            inc.path = d.path if inc.path in (None, "non_stop") or d.type in ("replace", "evict_group") else inc.path
        if d.type in EVICTING_ACTIONS:
            new = [n for n in d.nodes if n not in inc.evicted_nodes]
            inc.evicted_nodes = sorted(set(inc.evicted_nodes) | set(new))
            for n in new:
                self._profile(n).evicted(now)
            if d.type != "requeue" and d.path == "hot":
                self.spares_used += len(new)
        if d.type == "degrade":
            for n in d.nodes:
                self.degraded[n] = now

    def _close(self, ts: float, out: Outputs) -> None:
        inc = self.incident
        out.incidents.append(inc.record(ts, self.config.budgets))
        self.incident = None
        self.gathered = []

    def _summary(self) -> str:
        kinds: dict[str, int] = {}
        for t in self.gathered:
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
                "degraded": dict(self.degraded), "finished": sorted(self.finished)}

    @classmethod
    def from_state(cls, state: dict[str, Any], config: TriageConfig, topo: Topology) -> Triage:
        tri = cls(topo.job, config, topo)
        tri.incident = Timeline.from_dict(state["incident"]) if state["incident"] else None
        tri.waiting = [Timeline.from_dict(w) for w in state["waiting"]]
        tri.gathered = [typed(decode_obj(f)) for f in state["evidence"]]
        tri.profiles = {n: NodeProfile.from_dict(p) for n, p in state["profiles"].items()}
        tri.guards = Guards.from_dict(state["guards"], config.safety)
        tri.spares_used = state["spares_used"]
        tri.max_step = state["max_step"]
        tri.degraded = dict(state["degraded"])
        tri.finished = set(state["finished"])
        return tri

