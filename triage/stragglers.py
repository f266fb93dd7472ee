"""Straggler decisions of one job, the part of `triage.job.Triage` that is about fail-slow.

Several stragglers found in one window are decided together, per failure domain (a node, or the nodes under one
switch), on what replacing them truly gains against what it costs (`triage.decide.straggler_plan`); a straggler
whose own node's hardware explains it is decided after a short hold; one kept running is not decided again
unless it got much worse. A mixin: the job's state stays in `Triage`.
"""

from __future__ import annotations

from gangwatch.detectors.base import stable_id
from gangwatch.detectors.registry import Typed
from gangwatch.schemas import Outputs
from gangwatch.triage.decide import Situation, decide, straggler_plan
from gangwatch.triage.incident import KEEP_WAITING, Timeline
from gangwatch.triage.localize import Localization


class Stragglers:
    """`Triage`'s fail-slow decisions (uses its state and its `_act`, `_summary`, `spares_left` and `pool`)."""

    def _worse(self, t: Typed) -> bool:
        """A straggler kept running now costs `failslow_regrow` times what it did when it was kept."""
        kept, now = self.kept.get(t.finding.node), t.slowdown_frac
        return kept is not None and now is not None and now >= max(self.config.safety.failslow_regrow * kept,
                                                                    kept + 0.02)

    def _corroborate(self, inc: Timeline, t: Typed) -> None:
        """A straggler whose own node's hardware explains it (throttling, a degrading link) in the same window
        is decided after a short hold, not the full hysteresis."""
        f = t.finding
        window = self.config.corroborate_window_s
        if t.slowdown_frac is not None:  # a straggler: was its node's hardware already telling?
            prof = self.profiles.get(f.node)
            ids = prof.explains_slow(t.onset_ts - window, f.ts) if prof is not None and f.node else []
        elif t.explains_slow and f.node is not None:  # hardware news: is there a straggler on that node?
            onset = min((g.onset_ts for g in self.gathered if g.slowdown_frac is not None and g.finding.node == f.node),
                        default=None)
            ids = [f.id] if onset is not None and f.ts >= onset - window else []
        else:
            ids = []
        if ids:
            inc.findings += [i for i in ids if i not in inc.findings]
            inc.decide_at = min(inc.decide_at, f.ts + self.config.safety.failslow_corroborated_hold_s)

    def _decide_stragglers(self, inc: Timeline, loc: Localization, now: float, out: Outputs) -> None:
        """Several stragglers at once: each failure domain (a node, or the nodes under one switch) is decided as
        one action, on what replacing it truly gains (down to the next-slowest) against what it costs, all of
        them planned together; unrelated domains become incidents of their own. The incident keeps the domain
        of the finding that opened it."""
        topo, cfg = self.topo, self.config
        domain = {n: topo.switch_of(n) or n for n in loc.culprits}
        groups: dict[str, list[str]] = {}
        for n in loc.culprits:
            groups.setdefault(domain[n], []).append(n)
        mine = {d: [t for t in self.gathered if domain.get(t.finding.node) == d] for d in groups}
        cost = {d: max((t.slowdown_frac for t in mine[d] if t.slowdown_frac is not None), default=0.0) for d in groups}
        floor = max([t.slow_floor for t in self.gathered if t.slowdown_frac is not None] +
                    [c for n, c in self.kept.items() if n not in domain], default=0.0)
        order = sorted(groups, key=lambda d: (-cost[d], d))
        plans = straggler_plan([cost[d] for d in order], floor, cfg.failslow_horizon_s, cfg.replace_cost_s)
        full_hold = inc.detected_ts + cfg.safety.failslow_hold_s
        if now < full_hold and not any(p.replace for p in plans):
            # decided early on its hardware's word, and not worth a replacement (yet: a throttling GPU's slowdown
            # may still be growing): keeping it running can wait for the full hold and the rest of the evidence
            inc.decide_at = full_hold
            return
        opener = next((domain[t.finding.node] for t in self.gathered if t.finding.node in domain), order[0])
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
                cls="fail_slow", loc=sub, threshold=cfg.confidence,
                spares_left=self.spares_left(), pool=self.pool(),
                replace_cost_s=cfg.replace_cost_s, failslow_horizon_s=cfg.failslow_horizon_s,
                slowdown_frac=cost[d], remaining_frac=plan.remaining_frac, gain_frac=plan.gain_frac,
                replacements=plan.replacements, replace=plan.replace, summary=self._summary(mine[d]), where=where,
                page_frac=cfg.straggler_page_frac)
            decisions = self.guards.review(decide(situation), now, len(topo.nodes))
            target.decided_ts, target.stall_step = now, self.max_step
            target.localized_ts = target.localized_ts or now
            target.culprit_nodes = sorted(set(target.culprit_nodes) | set(nodes))
            for dd in decisions:
                self._act(dd, now, sub.evidence, out, target)
                if dd.type == "degrade":
                    self.kept.update({n: cost[d] for n in dd.nodes})
            if target.path in ("non_stop", None) and not any(dd.type == "escalate" for dd in decisions):
                target.recovered_ts = now  # kept running: nothing to recover from
                out.incidents.append(target.record(now, cfg.budgets))
                continue
            out.incidents.append(target.record(now, cfg.budgets))
            self.waiting = [*self.waiting[-(KEEP_WAITING - 1):], target]  # the controller reports its recovery
        self.incident = None
        self.gathered = []

    def _split(self, inc: Timeline, mine: list[Typed], nodes: list[str], now: float) -> Timeline:
        """An incident of its own for stragglers unrelated to the ones of `inc` (found in the same window)."""
        first = min(mine, key=lambda t: (t.finding.ts, t.finding.id))
        hw = [i for n in nodes if n in self.profiles
              for i in self.profiles[n].explains_slow(first.onset_ts - self.config.corroborate_window_s, now)]
        return Timeline(id=stable_id("i", self.job, first.finding.id), job=self.job, cls="fail_slow",
                        onset_ts=min(t.onset_ts for t in mine), detected_ts=first.finding.ts, localized_ts=now,
                        decide_at=now, findings=list(dict.fromkeys([t.finding.id for t in mine] + hw)))
