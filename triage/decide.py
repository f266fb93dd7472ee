"""The decision tree: an incident's class and localization in, contract actions out.

A pure function of its inputs, each branch a recovery path with a measured
cost (domain.md):

| situation                                   | actions                         | path       |
|---------------------------------------------|---------------------------------|------------|
| planned operation                           | none                            |            |
| SDC with a suspect node                     | rollback + isolate + dual_run   | hot / cold |
| SDC with numeric corroboration only         | rollback + escalate             | manual     |
| never started / all silent, no culprit      | escalate (saying which)         | manual     |
| no culprit, or confidence below threshold   | escalate                        | manual     |
| evidence narrowed to a group, not a node    | evict_group                     | hot / cold |
| fail-slow whose cost is below eviction cost | degrade (keep running, watch)   | non_stop   |
| fail-slow costing more than eviction        | replace                         | hot        |
| one rank's software fault                   | restart_in_process              | in_process |
| software crash on many ranks                | requeue                         | cold       |
| hardware fail-stop or localized hang        | replace                         | hot        |
| ... with spares exhausted                   | requeue                         | cold       |

Safety guards (blast radius, silences) are applied afterwards by `triage.safety`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gangwatch.triage.localize import Localization


@dataclass(frozen=True)
class Decision:
    type: str
    nodes: tuple[str, ...]
    path: str
    reason: str


@dataclass(frozen=True)
class Situation:
    cls: str  # incident class
    loc: Localization
    threshold: float
    spares_left: int | None  # None: unlimited
    replace_cost_s: float = 120.0
    failslow_horizon_s: float = 1800.0
    slowdown_frac: float = 0.0  # fail-slow: how much slower the straggler makes the job
    software_ranks: tuple[int, ...] = ()  # ranks whose process exited / raised, without hardware evidence
    numeric_only: bool = False  # SDC suspected from loss / grad-norm only
    job_level: tuple[str, ...] = ()  # what job-level findings (start-up timeouts, monitoring gaps) say, for a human
    summary: str = ""  # one line of what happened, for reasons
    extra: dict = field(default_factory=dict)


def _spares_for(s: Situation, n: int) -> bool:
    return s.spares_left is None or s.spares_left >= n


def decide(s: Situation) -> list[Decision]:
    """Actions for one incident, most urgent first."""
    loc = s.loc
    culprits = tuple(loc.culprits)
    conf = f"confidence {loc.confidence:.2f}"
    if s.cls == "planned":
        return []
    if s.cls == "sdc":
        if culprits:
            path = "hot" if _spares_for(s, len(culprits)) else "cold"
            why = f"{s.summary}; suspected silent data corruption on {', '.join(culprits)} ({conf})"
            return [Decision("rollback", culprits, path, why + ": roll back to the last trusted checkpoint"),
                    Decision("isolate", culprits, path, why + ": keep the node out of training"),
                    Decision("dual_run", culprits, path, why + ": confirm by running the same work twice")]
        why = f"{s.summary}; numeric anomaly with no suspect node"
        return [Decision("rollback", (), "manual", why + ": roll back to the last trusted checkpoint"),
                Decision("escalate", (), "manual", why + ": a human must find the source")]
    if loc.group and loc.group_nodes:
        nodes = tuple(loc.group_nodes)
        path = "hot" if _spares_for(s, len(nodes)) else "cold"
        return [Decision("evict_group", nodes, path,
                         f"{s.summary}; suspects span {len(nodes)} nodes of one {loc.group} group "
                         f"(ranks {list(loc.suspect_ranks)[:8]}); evicting the group costs "
                         f"{loc.innocent_nodes} presumably healthy nodes")]
    if s.software_ranks and not culprits:
        return _software(s)
    if s.job_level and not culprits:  # a job that never fully started or went silent whole: nobody to evict
        return [Decision("escalate", (), "manual", f"{s.summary}; {'; '.join(s.job_level)}")]
    if not culprits or loc.confidence < s.threshold:
        hint = f"; weak suspects {sorted(loc.per_node)[:8]}" if loc.per_node else ""
        return [Decision("escalate", (), "manual", f"{s.summary}; no culprit with confidence{hint}")]
    if s.cls == "fail_slow":
        cost = s.slowdown_frac * s.failslow_horizon_s
        if cost < s.replace_cost_s:
            return [Decision("degrade", culprits, "non_stop",
                             f"{s.summary}; keeping it costs ~{cost:.0f} s over {s.failslow_horizon_s:.0f} s, "
                             f"less than a replacement ({s.replace_cost_s:.0f} s): keep running and watch")]
        if not _spares_for(s, len(culprits)):
            return [Decision("degrade", culprits, "non_stop", f"{s.summary}; no spare left: keep running")]
        return [Decision("replace", culprits, "hot",
                         f"{s.summary}; it costs ~{cost:.0f} s over {s.failslow_horizon_s:.0f} s, more than a "
                         f"replacement ({s.replace_cost_s:.0f} s)")]
    if s.software_ranks and len(set(s.software_ranks)) == 1 and loc.confidence < 0.7:
        return _software(s)
    if not _spares_for(s, len(culprits)):
        return [Decision("requeue", culprits, "cold", f"{s.summary}; culprit {', '.join(culprits)} ({conf}) "
                         "but no hot spare left: full requeue without it")]
    return [Decision("replace", culprits, "hot", f"{s.summary}; culprit {', '.join(culprits)} ({conf})")]


def _software(s: Situation) -> list[Decision]:
    ranks = sorted(set(s.software_ranks))
    if len(ranks) == 1:
        return [Decision("restart_in_process", (), "in_process",
                         f"{s.summary}; rank {ranks[0]} failed in software with no hardware evidence: "
                         "restart it in place")]
    return [Decision("requeue", (), "cold", f"{s.summary}; {len(ranks)} ranks failed in software: full requeue")]
