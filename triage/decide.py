"""The decision tree: an incident's class and localization in, contract actions out.

A pure function of its inputs, each branch a recovery path with a measured
cost (domain.md):

| situation                                   | actions                         | path       |
|---------------------------------------------|---------------------------------|------------|
| planned operation                           | none                            |            |
| SDC with a suspect node                     | rollback + isolate + dual_run   | hot / cold |
| SDC with numeric corroboration only         | rollback + escalate             | manual     |
| never started / all silent, no culprit      | escalate (saying which)         | manual     |
| job-wide stall, no culprit, past its budget | escalate (saying how long)      | manual     |
| stall on a frozen rank, past its budget     | escalate (naming it and how)    | manual     |
| no culprit, or confidence below threshold   | escalate                        | manual     |
| evidence narrowed to a group, not a node    | evict_group                     | hot / cold |
| fail-slow whose true gain is below its cost | degrade (keep running, watch)   | non_stop   |
| fail-slow gaining more than its replacement | replace                         | hot        |
| one rank's software fault                   | restart_in_process              | in_process |
| software crash on many ranks                | requeue                         | cold       |
| hardware fail-stop or localized hang        | replace                         | hot        |
| ... with spares exhausted                   | requeue                         | cold       |

A straggler's true cost: in a synchronous job the slowest rank sets the step,
so replacing a straggler gains only down to the next-slowest rank or group
(another straggler, a heterogeneous rank, noise): `straggler_plan` weighs that
gain over the horizon against the replacements it takes, for all the slow
groups of one decision together.

Which rows an incident can take is its class's `decided_by` (`schemas/classes.py`): `nobody` (planned) gets no
action, `dual_run` (SDC) the rollback rows, `budget` (a job-wide stall) the stall row, `stragglers` (fail-slow) the
straggler rows; `culprit` the rest.

Safety guards (blast radius, silences) are applied afterwards by `triage.safety`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gangwatch.schemas.classes import CLASSES
from gangwatch.triage.localize import Localization


@dataclass(frozen=True)
class Decision:
    type: str
    nodes: tuple[str, ...]
    path: str
    reason: str
    data: dict | None = None  # what the action carries beyond its nodes (a replay's groups), its `extra`


@dataclass(frozen=True)
class Situation:
    cls: str  # incident class
    loc: Localization
    threshold: float
    spares_left: int | None  # None: unlimited
    pool: str = ""  # the spare pool's state in words, said in the reasons of decisions that depend on it
    replace_cost_s: float = 120.0
    failslow_horizon_s: float = 1800.0
    slowdown_frac: float = 0.0  # fail-slow: how much longer the straggler makes each step (0.1 = 10 %)
    remaining_frac: float = 0.0  # ... how much longer it stays once replaced (the next-slowest ranks)
    gain_frac: float | None = None  # ... what the replacement(s) gain of every step (None: the difference)
    replacements: int = 1  # ... how many replacements that gain takes (the slow groups replaced together)
    replace: bool | None = None  # ... the joint plan's answer (None: this straggler's gain against its cost)
    where: str = ""  # ... what its culprits share, said after their names (" under switch sw02")
    page_frac: float = 0.10  # ... whose replacement would gain this much of each step, not replaced: a human is told
    software_ranks: tuple[int, ...] = ()  # ranks whose process exited / raised, without hardware evidence
    software_nodes: tuple[str, ...] = ()  # ... and their nodes (named in the action; never evicted for it)
    stalled_s: float = 0.0  # a job-wide stall: how long the job has made no progress
    frozen: tuple[str, ...] = ()  # a stall waiting on ranks alive but frozen, and nothing else: who and how
    frozen_nodes: tuple[str, ...] = ()  # ... and their nodes (named in the action; never evicted for it)
    job_level: tuple[str, ...] = ()  # what job-level findings (start-up timeouts, monitoring gaps) say, for a human
    unsure: tuple[str, ...] = ()  # what findings that name a node but evict nothing (`Policy.evicts`) say ...
    unsure_nodes: tuple[str, ...] = ()  # ... and the nodes they name
    summary: str = ""  # one line of what happened, for reasons
    extra: dict = field(default_factory=dict)


def _spares_for(s: Situation, n: int) -> bool:
    return s.spares_left is None or s.spares_left >= n


def _pool(s: Situation) -> str:
    return f" (pool: {s.pool})" if s.pool else ""


def decide(s: Situation) -> list[Decision]:
    """Actions for one incident, most urgent first."""
    loc = s.loc
    culprits = tuple(loc.culprits)
    conf = f"confidence {loc.confidence:.2f}"
    how = CLASSES[s.cls].decided_by
    if how == "nobody":
        return []
    if how == "dual_run":
        if culprits:
            path = "hot" if _spares_for(s, len(culprits)) else "cold"
            why = f"{s.summary}; suspected silent data corruption on {', '.join(culprits)} ({conf})"
            why += _pool(s)
            return [Decision("rollback", culprits, path, why + ": roll back to the last trusted checkpoint"),
                    Decision("isolate", culprits, path, why + ": keep the node out of training"),
                    Decision("dual_run", culprits, path, why + ": confirm by running the same work twice")]
        why = f"{s.summary}; numeric anomaly with no suspect node"
        return [Decision("rollback", (), "manual", why + ": roll back to the last trusted checkpoint"),
                Decision("escalate", (), "manual", why + ": a human must find the source")]
    if s.frozen:
        return [Decision("escalate", s.frozen_nodes, "manual",
                         f"{s.summary}; no step progress for {s.stalled_s:.0f} s while {'; '.join(s.frozen)}: the "
                         "job waits on it, and it trains on once it thaws; a frozen process is not evicted for it: "
                         "a human must look (a stopped one wants SIGCONT or its owner, one in uninterruptible sleep "
                         "its node's filesystems or driver)")]
    if loc.group and loc.group_nodes:
        nodes = tuple(loc.group_nodes)
        path = "hot" if _spares_for(s, len(nodes)) else "cold"
        return [Decision("evict_group", nodes, path,
                         f"{s.summary}; suspects span {len(nodes)} nodes of one {loc.group} group "
                         f"(ranks {list(loc.suspect_ranks)[:8]}); evicting the group costs "
                         f"{loc.innocent_nodes} presumably healthy nodes{_pool(s)}")]
    if s.software_ranks and not culprits:
        return _software(s)
    if how == "budget" and not culprits:
        return [Decision("escalate", (), "manual",
                         f"{s.summary}; job-wide stall: no step progress for {s.stalled_s:.0f} s and no culprit "
                         "(every rank looks alike): a human must look")]
    if s.job_level and not culprits:  # a job that never fully started or went silent whole: nobody to evict
        return [Decision("escalate", (), "manual", f"{s.summary}; {'; '.join(s.job_level)}")]
    if culprits and set(culprits) <= set(s.unsure_nodes):  # named, but by evidence with an innocent reading too
        return [Decision("escalate", culprits, "manual", f"{s.summary}; {'; '.join(s.unsure)}")]
    if not culprits or loc.confidence < s.threshold:
        hint = f"; weak suspects {sorted(loc.per_node)[:8]}" if loc.per_node else ""
        return [Decision("escalate", (), "manual", f"{s.summary}; no culprit with confidence{hint}")]
    if how == "stragglers":
        return _straggler(s, culprits)
    if s.software_ranks and len(set(s.software_ranks)) == 1 and loc.confidence < 0.7:
        return _software(s)
    if not _spares_for(s, len(culprits)):
        return [Decision("requeue", culprits, "cold", f"{s.summary}; culprit {', '.join(culprits)} ({conf}) "
                         f"but no hot spare left{_pool(s)}: full requeue without it")]
    return [Decision("replace", culprits, "hot", f"{s.summary}; culprit {', '.join(culprits)} ({conf}){_pool(s)}")]


def _straggler(s: Situation, culprits: tuple[str, ...]) -> list[Decision]:
    """Replace or keep a straggler, on what replacing it truly gains against what the replacements cost."""
    gain = s.gain_frac if s.gain_frac is not None else max(0.0, s.slowdown_frac - s.remaining_frac)
    n = max(1, s.replacements)
    saved, cost, horizon = gain * s.failslow_horizon_s, n * s.replace_cost_s, s.failslow_horizon_s
    together = "" if n == 1 else f" together with {n - 1} other slow group{'s' if n > 2 else ''}"
    who = f"{', '.join(culprits)}{s.where} make{'' if len(culprits) > 1 else 's'}"
    them = "them" if len(culprits) > 1 else "it"
    why = (f"{s.summary}; {who} each step {s.slowdown_frac:.1%} longer; replacing {them}{together} leaves it "
           f"{s.remaining_frac:.1%} longer (the next-slowest ranks): ~{saved:.0f} s saved over {horizon:.0f} s "
           f"against {n} replacement{'s' if n > 1 else ''} ({cost:.0f} s)")
    replace = s.replace if s.replace is not None else saved >= cost
    dear = gain >= s.page_frac  # what the job loses to it (down to the next-slowest) is too much to live with
    if not replace:
        if dear:
            return [Decision("escalate", culprits, "manual", f"{why}: replacing does not pay for itself, but the job "
                             f"loses {gain:.1%} of every step to it: a human must decide")]
        return [Decision("degrade", culprits, "non_stop", f"{why}: keep running and watch")]
    if not _spares_for(s, len(culprits)):
        if dear:
            return [Decision("escalate", culprits, "manual", f"{why}, but no spare left{_pool(s)}: the job loses "
                             f"{gain:.1%} of every step to it until a human adds one")]
        return [Decision("degrade", culprits, "non_stop", f"{why}, but no spare left{_pool(s)}: keep running")]
    return [Decision("replace", culprits, "hot", f"{why}: replace{_pool(s)}")]


@dataclass(frozen=True)
class StragglerPlan:
    """For one slow group of a joint decision: replace it or not, and the figures its reason shows."""

    replace: bool
    gain_frac: float  # of every step, gained by the replacements counted in `replacements`
    remaining_frac: float  # how much longer the step stays after them
    replacements: int


def straggler_plan(costs: Sequence[float], floor: float, horizon_s: float,
                   replace_cost_s: float) -> list[StragglerPlan]:
    """Which slow groups to replace, all together: `costs` (each group's cost alone, a fraction of the step)
    sorted from the slowest down; `floor`: what ranks that are not stragglers add (heterogeneous, noise).

    The step is set by the slowest rank left, so replacing the j slowest gains
    `costs[0] - max(costs[j], floor)` of every step; the j whose gain over the
    horizon, less its j replacements, is largest (none if no j gains its cost).
    A group left running is told what replacing it too would add.
    """
    k = len(costs)

    def gain(j: int) -> float:
        return 0.0 if j == 0 else max(0.0, costs[0] - max(costs[j] if j < k else 0.0, floor))

    def rest(j: int) -> float:
        return max(costs[j] if j < k else 0.0, floor) if j else costs[0] if k else floor

    nets = [gain(j) * horizon_s - j * replace_cost_s for j in range(k + 1)]
    best = 0
    for j in range(1, k + 1):  # a replacement that just pays for itself is made; on a tie, fewer
        if nets[j] >= 0 and (best == 0 or nets[j] > nets[best]):
            best = j
    out = []
    for i in range(k):
        if i < best:
            out.append(StragglerPlan(True, gain(best), rest(best), best))
        else:  # replacing it as well: what that would add, for how many more replacements
            out.append(StragglerPlan(False, gain(i + 1) - gain(best), rest(i + 1), i + 1 - best))
    return out


def _software(s: Situation) -> list[Decision]:
    ranks = sorted(set(s.software_ranks))
    if len(ranks) == 1:
        where = f" on {', '.join(s.software_nodes)}" if s.software_nodes else ""
        return [Decision("restart_in_process", tuple(s.software_nodes), "in_process",
                         f"{s.summary}; rank {ranks[0]}{where} failed in software with no hardware evidence: "
                         "restart it in place")]
    return [Decision("requeue", (), "cold", f"{s.summary}; {len(ranks)} ranks failed in software: full requeue")]
