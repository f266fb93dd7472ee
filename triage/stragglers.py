"""Straggler decisions of one job: how `triage.triage.Triage` decides the classes declared `decided_by="stragglers"`
(`schemas/classes.py`: fail-slow).

Several stragglers found in one window are decided together, per failure domain (a node, or the nodes under one
switch), on what replacing them truly gains against what it costs (`triage.decide.straggler_plan`); a straggler
whose own node's hardware explains it is decided after a short hold; one kept running is not decided again
unless it got much worse. A collaborator of `Triage`: it keeps what it decided to live with (`degraded`, `kept`)
and acts only through `triage.handle.TriageHandle`.
"""

from __future__ import annotations

from collections.abc import Iterable

from gangwatch.detectors.base import stable_id
from gangwatch.detectors.registry import Typed
from gangwatch.schemas import Outputs
from gangwatch.triage.decide import Situation, decide, straggler_plan
from gangwatch.triage.handle import TriageHandle
from gangwatch.triage.incident import Timeline
from gangwatch.triage.localize import Localization


class Stragglers:
    """The job's fail-slow decisions, and the stragglers it decided to keep running."""

    def __init__(self, triage: TriageHandle) -> None:
        self.triage = triage
        self.degraded: dict[str, float] = {}  # node -> when it was last left running as a straggler
        self.kept: dict[str, float] = {}  # node -> what its straggler costs (of each step) since it was kept

    # --- what triage tells it ------------------------------------------------------

    def restarted(self) -> None:
        """A new run of the job: its stragglers are measured afresh."""
        self.kept = {}

    def kept_running(self, nodes: Iterable[str], now: float) -> None:
        """A `degrade` was decided for `nodes` (sent or shadowed): no flapping for a while."""
        self.degraded.update({n: now for n in nodes})

    def evicted(self, nodes: Iterable[str]) -> None:
        """`nodes` were evicted: they are no longer kept running."""
        for n in nodes:
            self.kept.pop(n, None)

    # --- its decisions ----------------------------------------------------------------

    def settled(self, t: Typed) -> bool:
        """A straggler already decided: kept running within the cooldown (and not much worse since), or being
        replaced (it straggles until the controller swaps it out). Its finding opens nothing."""
        f, cfg = t.finding, self.triage.config
        if f.node in self.degraded and f.ts - self.degraded[f.node] < cfg.safety.failslow_cooldown_s \
                and not self._worse(t):
            return True
        return f.node in self.triage.replacing

    def _worse(self, t: Typed) -> bool:
        """A straggler kept running now costs `failslow_regrow` times what it did when it was kept."""
        kept, now = self.kept.get(t.finding.node), t.slowdown_frac
        return kept is not None and now is not None and now >= max(self.triage.config.safety.failslow_regrow * kept,
                                                                    kept + 0.02)

    def corroborate(self, inc: Timeline, t: Typed) -> None:
        """A straggler whose own node's hardware explains it (throttling, a degrading link) in the same window
        is decided after a short hold, not the full hysteresis."""
        f, cfg = t.finding, self.triage.config
        window = cfg.corroborate_window_s
        if t.slowdown_frac is not None:  # a straggler: was its node's hardware already telling?
            prof = self.triage.profiles.get(f.node)
            ids = prof.explains_slow(t.onset_ts - window, f.ts) if prof is not None and f.node else []
        elif t.explains_slow and f.node is not None:  # hardware news: is there a straggler on that node?
            onset = min((g.onset_ts for g in self.triage.gathered
                         if g.slowdown_frac is not None and g.finding.node == f.node), default=None)
            ids = [f.id] if onset is not None and f.ts >= onset - window else []
        else:
            ids = []
        if ids:
            inc.findings += [i for i in ids if i not in inc.findings]
            inc.decide_at = min(inc.decide_at, f.ts + cfg.safety.failslow_corroborated_hold_s)

    def decide(self, inc: Timeline, loc: Localization, now: float, out: Outputs) -> None:
        """Several stragglers at once: each failure domain (a node, or the nodes under one switch) is decided as
        one action, on what replacing it truly gains (down to the next-slowest) against what it costs, all of
        them planned together; unrelated domains become incidents of their own. The incident keeps the domain
        of the finding that opened it."""
        tri = self.triage
        topo, cfg, gathered = tri.topo, tri.config, tri.gathered
        domain = {n: topo.switch_of(n) or n for n in loc.culprits}
        groups: dict[str, list[str]] = {}
        for n in loc.culprits:
            groups.setdefault(domain[n], []).append(n)
        mine = {d: [t for t in gathered if domain.get(t.finding.node) == d] for d in groups}
        cost = {d: max((t.slowdown_frac for t in mine[d] if t.slowdown_frac is not None), default=0.0) for d in groups}
        floor = max([t.slow_floor for t in gathered if t.slowdown_frac is not None] +
                    [c for n, c in self.kept.items() if n not in domain], default=0.0)
        order = sorted(groups, key=lambda d: (-cost[d], d))
        plans = straggler_plan([cost[d] for d in order], floor, cfg.failslow_horizon_s, cfg.replace_cost_s)
        full_hold = inc.detected_ts + cfg.safety.failslow_hold_s
        if now < full_hold and not any(p.replace for p in plans):
            # decided early on its hardware's word, and not worth a replacement (yet: a throttling GPU's slowdown
            # may still be growing): keeping it running can wait for the full hold and the rest of the evidence
            inc.decide_at = full_hold
            return
        opener = next((domain[t.finding.node] for t in gathered if t.finding.node in domain), order[0])
        for d, plan in zip(order, plans, strict=True):
            nodes = sorted(groups[d])
            ids = [t.finding.id for t in mine[d]]
            target = inc if d == opener else self._split(inc, mine[d], nodes, now)
            if target is inc:
                inc.findings = [i for i in inc.findings if not any(i in [t.finding.id for t in mine[o]]
                                                                   for o in groups if o != opener)]
            sub = Localization(culprits=nodes, confidence=min(loc.per_node[n] for n in nodes),
                               per_node={n: loc.per_node[n] for n in nodes}, evidence=sorted(ids))
            where = f" under switch {d}" if d not in nodes else ""
            situation = Situation(
                cls=inc.cls, loc=sub, threshold=cfg.confidence,
                spares_left=tri.spares_left(), pool=tri.pool(),
                replace_cost_s=cfg.replace_cost_s, failslow_horizon_s=cfg.failslow_horizon_s,
                slowdown_frac=cost[d], remaining_frac=plan.remaining_frac, gain_frac=plan.gain_frac,
                replacements=plan.replacements, replace=plan.replace, summary=tri.summarize(mine[d]), where=where,
                page_frac=cfg.straggler_page_frac)
            decisions = tri.guards.review(decide(situation), now, len(topo.nodes))
            target.decided_ts, target.stall_step = now, tri.max_step
            target.localized_ts = target.localized_ts or now
            target.culprit_nodes = sorted(set(target.culprit_nodes) | set(nodes))
            for dd in decisions:
                tri.act(dd, now, sub.evidence, out, target)
                if dd.type == "degrade":
                    self.kept.update({n: cost[d] for n in dd.nodes})
            if target.path in ("non_stop", None) and not any(dd.type == "escalate" for dd in decisions):
                target.recovered_ts = now  # kept running: nothing to recover from
                out.incidents.append(target.record(now, cfg.budgets))
                continue
            out.incidents.append(target.record(now, cfg.budgets))
            tri.await_controller(target)  # the controller reports its recovery
        tri.let_go()

    def _split(self, inc: Timeline, mine: list[Typed], nodes: list[str], now: float) -> Timeline:
        """An incident of its own (of `inc`'s class) for stragglers unrelated to the ones of `inc` (found in the
        same window)."""
        first = min(mine, key=lambda t: (t.finding.ts, t.finding.id))
        since = first.onset_ts - self.triage.config.corroborate_window_s
        profiles = self.triage.profiles
        hw = [i for n in nodes if n in profiles for i in profiles[n].explains_slow(since, now)]
        return Timeline(id=stable_id("i", self.triage.job, first.finding.id), job=self.triage.job, cls=inc.cls,
                        onset_ts=min(t.onset_ts for t in mine), detected_ts=first.finding.ts, localized_ts=now,
                        decide_at=now, findings=list(dict.fromkeys([t.finding.id for t in mine] + hw)))
