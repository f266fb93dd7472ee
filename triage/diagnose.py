"""Active diagnosis: what triage asks the controller to run when passive evidence is not enough.

Three answers come back as `recovery` records of the action that asked:

- **Dual run** (SDC): after `rollback` + `isolate`, the `dual_run` action asks the controller to run the same
  step (same weights, same input) on each suspect and on a reference machine and report each one's digest
  (`dual_run_result`, `digests`, `reference`). Equal digests clear a suspect (it is readmitted and the incident
  closes as `not_confirmed`); a different one confirms the SDC (the node stays out and the incident keeps the
  digests as its proof). A missing digest, or no answer within `dual_run_timeout_s`, goes to a human.
- **Replay** (a fault nobody can be blamed for): `triage.rerun_plan` plans which machine groups replay the job's
  step, phase by phase; each `replay_result` says which groups failed, and the failing groups intersect into the
  culprit.
- **The escalation ladder**, when localization fails: evict the smallest group holding every suspect (when the
  blast-radius guard allows), else restart the job and watch for the fault to come back, else replay, else a
  human. Each rung tried is recorded on the incident with when it was tried, against the localize budget.
  A class decided by its budget (`stall`: every rank waited alike past its budget, nobody named) skips the
  restart: whatever the whole job waits on (a filesystem, a long save) a restart would not cure, and it would
  lose the work since the last save.

Pure: the records in, verdicts and decisions out. `ActiveDiagnosis` is the collaborator of `triage.triage.Triage`
that asks and reads the answers; it keeps no state of its own (what an incident waits for is on the incident) and
acts only through `triage.handle.TriageHandle`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gangwatch.schemas import Outputs, Recovery
from gangwatch.schemas.classes import CLASSES
from gangwatch.triage import rerun_plan as replayplan
from gangwatch.triage.decide import Decision
from gangwatch.triage.handle import TriageHandle
from gangwatch.triage.incident import Timeline
from gangwatch.triage.localize import Localization, localize
from gangwatch.triage.rerun_plan import ReplayPlan

RUNGS = ("group", "restart", "replay", "human")


@dataclass(frozen=True)
class DualRunVerdict:
    """What a dual run's digests say of each suspect."""

    cleared: tuple[str, ...]  # digest equal to the reference's
    confirmed: tuple[str, ...]  # digest different from the reference's
    missing: tuple[str, ...]  # no digest came back (or no reference): nothing can be said
    reference: str | None
    proof: dict[str, str]  # node -> digest, the reference's included

    @property
    def conclusive(self) -> bool:
        return not self.missing


def judge_dual_run(suspects: tuple[str, ...] | list[str], rec: Recovery) -> DualRunVerdict:
    """Compare each suspect's digest with the reference machine's (`rec.reference`, else the one machine in
    `rec.digests` that is no suspect)."""
    digests = {str(k): str(v) for k, v in (rec.digests or {}).items() if v not in (None, "")}
    ref = rec.reference
    if ref is None:
        others = sorted(set(digests) - set(suspects))
        ref = others[0] if len(others) == 1 else None
    want = digests.get(ref) if ref is not None else None
    cleared, confirmed, missing = [], [], []
    for n in suspects:
        got = digests.get(n)
        if got is None or want is None:
            missing.append(n)
        elif got == want:
            cleared.append(n)
        else:
            confirmed.append(n)
    return DualRunVerdict(tuple(cleared), tuple(confirmed), tuple(missing), ref, digests)


def describe_dual_run(v: DualRunVerdict) -> str:
    """One line for a reason: what the digests showed."""
    ref = f"reference {v.reference} {v.proof.get(v.reference, '?')[:12]}" if v.reference else "no reference digest"
    parts = [f"{n} {v.proof[n][:12]} {'==' if n in v.cleared else '!='}" for n in (*v.cleared, *v.confirmed)]
    parts += [f"{n} no digest" for n in v.missing]
    return f"dual run: {'; '.join(parts)} {ref}"


def rungs_said(rungs: list[dict]) -> str:
    """The rungs tried so far, for a human's page: `group refused (blast radius) at +12 s; restart at +15 s`."""
    return "; ".join(f"{r['rung']} {r.get('outcome', 'tried')} at +{r['after_s']:.0f} s" for r in rungs) or "none"


class ActiveDiagnosis:
    """The job's active diagnosis: the ladder's rungs, replay phases and dual runs asked for, and their answers."""

    def __init__(self, triage: TriageHandle) -> None:
        self.triage = triage

    def answer(self, w: Timeline, rec: Recovery, out: Outputs) -> None:
        """The answer `w` waited for (`w.awaiting`): a dual run's digests or a replay phase's results."""
        asked, w.awaiting = w.awaiting, None
        if asked["kind"] == "dual_run":
            self._on_dual_run(w, asked, rec, out)
        elif asked["kind"] == "replay":
            self._on_replay(w, asked, rec, out)

    def _on_replay(self, w: Timeline, asked: dict[str, Any], rec: Recovery, out: Outputs) -> None:
        """A replay phase's results: the next phase, or the culprit its failing groups intersect into (replaced),
        or a human when the fault did not reproduce or stays ambiguous."""
        tri = self.triage
        results = {**asked["results"], **{str(k): str(v) for k, v in (rec.results or {}).items()}}
        plan = ReplayPlan.from_json(asked["plan"])
        now = rec.ts
        step = w.rungs[-1] if w.rungs and w.rungs[-1]["rung"] == "replay" else {}
        d = self._replay(w, now, results, plan)
        if d is not None:
            step["outcome"] = f"phase {d.data['phase']} asked"
            tri.act(d, now, list(w.findings[:16]), out, w, results=results)
            out.incidents.append(w.record(now, tri.config.budgets))
            return
        v = replayplan.localize(plan, results)
        cost = plan.cost
        said = (f"replay: {v.reason} ({len(plan.phases)} phase{'s' if len(plan.phases) != 1 else ''}, "
                f"{cost.total_runs} runs, {cost.total_machine_runs} machine-runs)")
        step.update(outcome=v.outcome, runs=cost.total_runs, machine_runs=cost.total_machine_runs,
                    after_s=round(now - w.detected_ts, 3))
        if v.outcome == "localized":
            culprits = tuple(sorted(v.culprits))
            w.localized_ts = w.localized_ts or now
            w.culprit_nodes = sorted(set(w.culprit_nodes) | set(culprits))
            left = tri.spares_left()
            pool = f" (pool: {tri.pool()})" if tri.pool() else ""
            decisions = [Decision("replace", culprits, "hot", f"{tri.summarize()}; {said}: replace{pool}")
                         if left is None or left >= len(culprits) else
                         Decision("requeue", culprits, "cold", f"{tri.summarize()}; {said}: no hot spare left"
                                  f"{pool}, full requeue without it")]
        else:
            w.rungs.append({"rung": "human", "outcome": "paged", "ts": round(now, 6),
                            "after_s": round(now - w.detected_ts, 3),
                            "over_budget": now - w.detected_ts > tri.config.budgets.localize})
            decisions = [Decision("escalate", tuple(sorted(v.candidates | v.culprits)), "manual",
                                  f"{tri.summarize()}; {said}; the escalation ladder tried: "
                                  f"{rungs_said(w.rungs[:-1])}: a human must look", {"rung": "human"})]
        for d in tri.guards.review(decisions, now, len(tri.topo.nodes)):
            tri.act(d, now, list(w.findings[:16]), out, w)
        out.incidents.append(w.record(now, tri.config.budgets))

    def _on_dual_run(self, w: Timeline, asked: dict[str, Any], rec: Recovery, out: Outputs) -> None:
        """Equal digests readmit a suspect; a different one confirms the SDC; a missing one goes to a human."""
        tri = self.triage
        v = judge_dual_run(asked["nodes"], rec)
        w.proof = v.proof
        said = describe_dual_run(v)
        if v.cleared:
            tri.guards.give_back(list(v.cleared))
            tri.act(Decision("readmit", v.cleared, w.path or "hot",
                             f"{said}: the same step gives the same result on {', '.join(v.cleared)}: "
                             "not confirmed, return to service"), rec.ts, [], out, w)
        if v.missing:
            tri.act(Decision("escalate", v.missing, "manual", f"{said}: the dual run did not say; a human must "
                             "confirm or clear the suspect"), rec.ts, [], out, w)
        w.resolution = "confirmed" if v.confirmed else "not_confirmed" if v.conclusive else "unconfirmed"
        if v.confirmed:
            w.culprit_nodes = sorted(v.confirmed)
        if not v.confirmed and v.conclusive:  # nothing was wrong after all: the incident is over
            w.culprit_nodes, w.recovered_ts = [], w.recovered_ts or rec.ts
        tri.done_asking(w)  # answered: once the job resumed it waits no more
        out.incidents.append(w.record(rec.ts, tri.config.budgets))

    def climb(self, inc: Timeline, loc: Localization, decisions: list[Decision], now: float) -> list[Decision]:
        """Localization failed: the next rung of the escalation ladder, recorded on the incident; a human once
        every rung configured was tried."""
        tri, cfg = self.triage, self.triage.config
        tried = {r["rung"] for r in inc.rungs}
        budget = CLASSES[inc.cls].decided_by == "budget"  # a job-wide wait: whatever it waits on a restart won't cure

        def rung(name: str, outcome: str) -> None:
            inc.rungs.append({"rung": name, "outcome": outcome, "ts": round(now, 6),
                              "after_s": round(now - inc.detected_ts, 3),
                              "over_budget": now - inc.detected_ts > cfg.budgets.localize})

        for name in cfg.ladder:
            if name in tried:
                continue
            if name == "group":
                if any(d.type == "evict_group" for d in decisions):
                    rung("group", "evicted")
                    return decisions
                if loc.group:
                    rung("group", "refused by the blast-radius guard")
                continue  # no group holds the suspects: not a rung for this fault
            if name == "restart":
                if budget:
                    continue  # the whole job waits alike (a filesystem, a long save): a restart would only lose work
                rung("restart", "restarted, watching")
                return [Decision("requeue", (), "cold",
                                 f"{tri.summarize()}; no culprit: restart the job and watch for the fault to come "
                                 f"back within {cfg.ladder_watch_s:.0f} s (escalation ladder)")]
            if name == "replay":
                if budget and not any(r["rung"] == "page" for r in inc.rungs):
                    # a job-wide wait: a human first; a replay only if the job is still stalled a budget later
                    rung("page", f"paged; replay at +{now - inc.detected_ts + cfg.stall_budget_s:.0f} s "
                                 "if still stalled")
                    inc.awaiting = {"kind": "ladder", "action": None, "nodes": [], "asked": now,
                                    "until": now + cfg.stall_budget_s}
                    return [d if d.type != "escalate" else
                            Decision(d.type, d.nodes, d.path, f"{d.reason}; if it is still stalled in "
                                     f"{cfg.stall_budget_s:.0f} s it will be replayed to find the machine")
                            for d in decisions]
                d = self._replay(inc, now, None)
                if d is not None:
                    rung("replay", f"phase {d.data['phase']} asked")
                    return [d]
                rung("replay", "not possible for this job's topology")
        if not decisions and any(r["rung"] == "page" for r in inc.rungs):
            return []  # paged already, and nothing left to try
        said = rungs_said(inc.rungs)
        rung("human", "paged")
        pages = [d for d in decisions if d.type == "escalate"] or [
            Decision("escalate", tuple(loc.group_nodes), "manual", f"{tri.summarize()}; no culprit with confidence")]
        if not said or said == "none":
            return pages
        return [Decision("escalate", d.nodes, "manual", f"{d.reason}; the escalation ladder tried: {said}",
                         {"rung": "human"}) for d in pages]

    def next_rung(self, w: Timeline, out: Outputs) -> None:
        """The wait before `w`'s next rung (`awaiting` kind `ladder`) is over: climb on, on the evidence gathered."""
        tri = self.triage
        until, w.awaiting = w.awaiting["until"], None
        for d in self.climb(w, localize(tri.gathered, tri.topo, tri.config.confidence), [], until):
            tri.act(d, until, list(w.findings[:16]), out, w)
        out.incidents.append(w.record(until, tri.config.budgets))

    def _replay(self, inc: Timeline, now: float, results: dict[str, str] | None = None,
                plan: ReplayPlan | None = None) -> Decision | None:
        """The first replay phase of the job (`plan` None), or the one after `plan`'s last given every result so
        far; None when there is none (a topology no group can run, or nothing left to tell apart)."""
        if plan is None:
            try:
                plan = replayplan.plan(self.triage.topo)
            except ValueError:
                return None
        else:
            nxt = replayplan.next_phase(plan, results or {})
            if nxt is None:
                return None
            plan = plan.extend(nxt)
        phase = plan.phases[-1]
        nodes = tuple(sorted({n for g in phase.groups for n in g.nodes}))
        return Decision("replay", nodes, "cold",
                        f"{self.triage.summarize()}; no culprit: replay the step from the last checkpoint on "
                        f"{phase.runs} group{'s' if phase.runs != 1 else ''} of machines at once "
                        f"({phase.machine_runs} machines), phase {phase.number}; the failing groups intersect into "
                        "the culprit (escalation ladder)",
                        data={**phase.to_json(), "plan": plan.to_json()})

    def unanswered(self, w: Timeline, now: float, out: Outputs) -> None:
        """What `w` asked for got no answer in time: a human finishes the diagnosis."""
        asked, w.awaiting = w.awaiting, None
        self.triage.act(Decision("escalate", tuple(asked["nodes"]), "manual",
                              f"{asked['kind'].replace('_', ' ')} asked at {asked['asked']:.0f} got no answer within "
                              f"{now - asked['asked']:.0f} s: a human must finish the diagnosis"), now, [], out, w)
        self.triage.done_asking(w)
        out.incidents.append(w.record(now, self.triage.config.budgets))
