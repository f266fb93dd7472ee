"""Replay planning: which groups of machines re-run the job's step, phase by phase, to find a faulty machine.

When passive evidence cannot name the machine behind a fault (every rank shows the same stack), the job's
step is run again from its last checkpoint on groups of machines, with the job's TP and PP sizes and a
smaller DP, and the groups that fail are intersected. Model: a group fails iff it holds a faulty machine.

**What a group needs to run (the rule).** A step needs every layer, so a group is a job of its own with the
job's TP and PP: its nodes must run every (tp, pp) shard of the model the same number of times k, its DP size.
Every node runs the ranks it ran, in the shard it ran; only the dp index changes. A node's *kind* is the
multiset of shards its ranks run: one pipeline stage when a node hosts one TP group, two stages (or two
replicas of one stage) when it hosts two, one half of a stage's TP group when that group spans two nodes (the
other half is another kind). One node of each kind makes a *pipeline*, runnable when the kinds, taken once each,
run every shard equally often; a job whose kinds do not is refused. The machines of one stage alone are not
runnable (they hold that stage's layers only), so no group is a stage: every group here is one pipeline, and
the groups of one phase share no node, so they run at once. A TP group that spans two nodes is rebuilt from any
two nodes that ran its two halves (its traffic crosses the same network for every pair).

**Phases.** Each phase packs the nodes still under suspicion into pipelines, spread evenly: as many pipelines
as a kind has usable nodes (D, fewer once confirmed culprits are out), or as there are suspects if fewer; it
completes each with known-good nodes (nodes outside `suspects`, or of a group that passed). With every node
suspect, phase 1 replays the job's own D pipelines, one per data-parallel replica (or pair of replicas when a
node hosts two); phase 2, built from phase 1's results, replays each node of the failing pipelines in a pipeline
of its own, completed from the pipelines that passed. A failed group whose other suspects all passed elsewhere
names its last one; a failed group whose suspects all passed elsewhere means the fault does not reproduce.

**When two phases suffice.** With P kinds and D pipelines, a single faulty node leaves P suspects after
phase 1 and a pair leaves P (one pipeline) or 2P (two): phase 2 tests each alone when they number at most D.
So two phases pinpoint any single fault when D >= P and any pair when D >= 2P. No two-phase plan needs less
for a single fault, and for a pair none needs less than D >= 2P - 1: phase 1 can do no better than whole
pipelines; of the 2P suspects two failing ones leave, phase 2 must test each alone except at most one per
pipeline left out, or two paired in one group, and either way some kind needs 2P - 3 known-good nodes from
the D - 2 pipelines that passed. Below the bound further phases follow, each packing the remaining suspects
into the D pipelines, until each is tested alone (3 phases for PP 16 x DP 8; 5 for a pair at PP 16 x DP 4).
With PP 1 and one TP group per node, phase 1 replays each node alone. With D = 1 (DP 1) nothing can be split:
`next_phase` gives none, and the verdict lists every node of the pipeline as a candidate.

Nodes outside `suspects` are taken as good: a fault among them is blamed on the suspects they replay with.
Pure: no I/O, no clock. Phases and plans are JSON-able (`to_json` / `from_json`) for action records and state;
results come back as {group id: "pass" | "fail"}, for every group of every phase run so far.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gangwatch.detectors.topology import Topology

PASS, FAIL = "pass", "fail"


@dataclass(frozen=True, slots=True)
class Group:
    """One replay run: `nodes` (sorted) run one pipeline of the job at data-parallel size `dp`; `suspects`
    (sorted, a non-empty subset of `nodes`) are the nodes it tests, the others being known good."""

    id: str
    nodes: tuple[str, ...]
    suspects: tuple[str, ...]
    dp: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "nodes": list(self.nodes), "suspects": list(self.suspects), "dp": self.dp}


@dataclass(frozen=True, slots=True)
class Phase:
    """Replay runs that share no node and run at once; `number` counts from 1."""

    number: int
    groups: tuple[Group, ...]

    @property
    def runs(self) -> int:
        return len(self.groups)

    @property
    def machine_runs(self) -> int:
        return sum(len(g.nodes) for g in self.groups)

    def to_json(self) -> dict[str, Any]:
        return {"phase": self.number, "groups": [g.to_json() for g in self.groups]}

    @classmethod
    def from_json(cls, value: Any) -> Phase:
        """The phase `to_json` wrote (e.g. read back from an action record)."""
        try:
            groups = tuple(Group(str(g["id"]), tuple(map(str, g["nodes"])), tuple(map(str, g["suspects"])),
                                 int(g["dp"])) for g in value["groups"])
            return cls(int(value["phase"]), groups)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a replay phase ({type(e).__name__}: {e}); pass what Phase.to_json wrote") from None


@dataclass(frozen=True, slots=True)
class Cost:
    """What the phases run so far cost: replay runs (groups) and machine-runs (nodes x runs), per phase."""

    runs: tuple[int, ...]
    machine_runs: tuple[int, ...]

    @property
    def total_runs(self) -> int:
        return sum(self.runs)

    @property
    def total_machine_runs(self) -> int:
        return sum(self.machine_runs)


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """The replay of one job: its kinds of node, the suspects it started from, and the phases issued so far.

    `kinds[t]` lists the nodes of kind t in replica order; one node of every kind is a pipeline that replays at
    data-parallel size `dp`. A plan only grows (`extend`); it holds no results.
    """

    job: str
    kinds: tuple[tuple[str, ...], ...]
    dp: int
    suspects: frozenset[str]
    phases: tuple[Phase, ...]

    @property
    def cost(self) -> Cost:
        return Cost(tuple(p.runs for p in self.phases), tuple(p.machine_runs for p in self.phases))

    def extend(self, phase: Phase) -> ReplayPlan:
        """This plan with `phase` (from `next_phase`) issued after its last one."""
        if phase.number != len(self.phases) + 1:
            raise ValueError(f"phase {phase.number} cannot follow phase {len(self.phases)}; "
                             "extend a plan with the phase next_phase gave for it")
        return ReplayPlan(self.job, self.kinds, self.dp, self.suspects, (*self.phases, phase))

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "kinds": [list(k) for k in self.kinds], "dp": self.dp,
                "suspects": sorted(self.suspects), "phases": [p.to_json() for p in self.phases]}

    @classmethod
    def from_json(cls, value: Any) -> ReplayPlan:
        """The plan `to_json` wrote (e.g. from a job's saved state)."""
        try:
            return cls(str(value["job"]), tuple(tuple(map(str, k)) for k in value["kinds"]), int(value["dp"]),
                       frozenset(map(str, value["suspects"])), tuple(Phase.from_json(p) for p in value["phases"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a replay plan ({type(e).__name__}: {e}); pass what ReplayPlan.to_json wrote") \
                from None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the results so far say.

    `localized`: `culprits` failed in a group where every other suspect was cleared, and no node is left in
    doubt. `ambiguous`: `culprits` are proven so far, `candidates` may still be faulty (`reason` says whether a
    further phase can narrow them). `none_failed`: every group passed, the fault did not reproduce.
    """

    outcome: str
    culprits: frozenset[str]
    candidates: frozenset[str]
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "culprits": sorted(self.culprits), "candidates": sorted(self.candidates),
                "reason": self.reason}


def plan(topology: Topology, suspects: Collection[str] | None = None) -> ReplayPlan:
    """The replay plan of a job with its first phase; `suspects` are the nodes still under suspicion (default:
    every node of the job), the other nodes serving as known-good fillers."""
    kinds, dp = _kinds(topology)
    if isinstance(suspects, str):
        raise ValueError(f"suspects must be a collection of node names, not the string {suspects!r}")
    nodes = set(topology.nodes)
    chosen = frozenset(nodes if suspects is None else suspects)
    if unknown := chosen - nodes:
        raise ValueError(f"suspects {_few(unknown)} are not nodes of job {topology.job}; name nodes of its job record")
    if not chosen:
        raise ValueError(f"no suspects for job {topology.job}: name at least one node, or pass None for every node")
    return ReplayPlan(topology.job, kinds, dp, chosen, (_pack(kinds, dp, chosen, frozenset(), 1),))


def next_phase(plan: ReplayPlan, results: Mapping[str, str]) -> Phase | None:
    """The phase to run after the plan's last one, given the result of every group issued so far; None when
    nothing is left to replay (`localize` then says what was found)."""
    return _next(plan, _read(plan, results))


def localize(plan: ReplayPlan, results: Mapping[str, str]) -> Verdict:
    """Intersect the results of every group issued so far into culprit nodes (see `Verdict`)."""
    ev = _read(plan, results)
    if not ev.failing:
        return Verdict("none_failed", frozenset(), frozenset(),
                       "every replay group passed: the fault did not reproduce")
    if ev.contradicted:
        ids = [g.id for g in ev.contradicted]
        return Verdict("ambiguous", ev.confirmed, frozenset(n for g in ev.contradicted for n in g.suspects),
                       f"{_few(ids)} failed though each of its suspects passed in another group: "
                       "the fault does not reproduce reliably")
    if not ev.uncertain:
        return Verdict("localized", ev.confirmed, frozenset(),
                       f"{_few(ev.confirmed)} failed where every other suspect passed")
    if _next(plan, ev) is not None:
        reason = f"phase {len(plan.phases) + 1} can tell them apart"
    else:
        reason = "no runnable group can tell them apart: a kind of node has no known-good spare to pair them with"
    return Verdict("ambiguous", ev.confirmed, ev.uncertain, reason)


@dataclass(frozen=True, slots=True)
class _Evidence:
    failing: tuple[tuple[Group, frozenset[str]], ...]  # failed groups, each with its suspects not cleared
    contradicted: tuple[Group, ...]  # failed groups whose suspects were all cleared
    confirmed: frozenset[str]  # the one suspect left in a failed group
    uncertain: frozenset[str]  # suspects neither cleared nor confirmed


def _read(plan: ReplayPlan, results: Mapping[str, str]) -> _Evidence:
    groups = [g for p in plan.phases for g in p.groups]
    ids = {g.id for g in groups}
    if unknown := set(results) - ids:
        raise ValueError(f"replay results name groups {_few(unknown)} the plan does not have; "
                         "answer the groups of its phases")
    if missing := ids - set(results):
        raise ValueError(f"replay results miss groups {_few(missing)}; every group run needs \"pass\" or \"fail\"")
    if bad := {k for k, v in results.items() if v not in (PASS, FAIL)}:
        k = min(bad)
        raise ValueError(f"replay result of group {k} is {results[k]!r}; each result must be \"pass\" or \"fail\"")
    cleared = frozenset(n for g in groups if results[g.id] == PASS for n in g.nodes)
    failing = tuple((g, frozenset(g.suspects) - cleared) for g in groups if results[g.id] == FAIL)
    confirmed = frozenset(n for _, left in failing if len(left) == 1 for n in left)
    return _Evidence(failing, tuple(g for g, left in failing if not left), confirmed,
                     plan.suspects - cleared - confirmed)


def _next(plan: ReplayPlan, ev: _Evidence) -> Phase | None:
    """Pack the uncertain nodes into a phase, unless the results stand (nothing failed, nothing in doubt, or a
    contradiction) or every group of it would surely fail again (it holds what a failed group left)."""
    if not ev.failing or ev.contradicted or not ev.uncertain:
        return None
    phase = _pack(plan.kinds, plan.dp, ev.uncertain, ev.confirmed, len(plan.phases) + 1)
    known = [left for _, left in ev.failing]
    useful = any(not any(left <= set(g.suspects) for left in known) for g in phase.groups)
    return phase if useful else None


def _pack(kinds: tuple[tuple[str, ...], ...], dp: int, test: frozenset[str], bad: frozenset[str],
          number: int) -> Phase:
    """Pipelines holding the nodes of `test`, spread evenly, completed with nodes neither tested nor `bad`.

    As many pipelines as the scarcest kind has usable nodes, or as there are nodes to test if fewer; each kind's
    tested nodes go to distinct pipelines (round-robin, carried on from kind to kind), so every pipeline tests at
    least one node and any two differ by at most one. A kind with more nodes to test than pipelines keeps the
    rest for a later phase. No group when a kind has no usable node left.
    """
    usable = [[n for n in kind if n not in bad] for kind in kinds]
    under = [[n for n in nodes if n in test] for nodes in usable]
    m = min([sum(map(len, under))] + [len(nodes) for nodes in usable])
    members: list[list[str]] = [[] for _ in range(m)]
    tested: list[list[str]] = [[] for _ in range(m)]
    start = 0
    for nodes, candidates in zip(usable, under, strict=True):
        taken = candidates[:m]
        slots = [(start + i) % m for i in range(len(taken))]
        for j, n in zip(slots, taken, strict=True):
            members[j].append(n)
            tested[j].append(n)
        free = sorted(set(range(m)) - set(slots))
        good = [n for n in nodes if n not in test][: len(free)]
        for j, n in zip(free, good, strict=True):
            members[j].append(n)
        start += len(taken)
    width = len(str(max(m - 1, 0)))
    return Phase(number, tuple(Group(f"p{number}-{j:0{width}d}", tuple(sorted(nodes)), tuple(sorted(t)), dp)
                               for j, (nodes, t) in enumerate(zip(members, tested, strict=True))))


def _kinds(topology: Topology) -> tuple[tuple[tuple[str, ...], ...], int]:
    """The job's kinds of node (each in replica order: lowest dp it runs, then name) and the DP size of a
    pipeline (one node of each kind); a ValueError when such a pipeline would not run every shard equally
    often, or when kinds have unequal numbers of nodes."""
    shards: list[Counter[int]] = [Counter() for _ in topology.nodes]
    low_dp = [topology.size] * len(topology.nodes)
    for node, shard, dp in zip(topology.node_index.tolist(), topology.shard.tolist(), topology.dp.tolist(),
                               strict=True):
        shards[node][shard] += 1
        low_dp[node] = min(low_dp[node], dp)
    by_kind: dict[tuple[tuple[int, int], ...], list[int]] = defaultdict(list)
    for i, counts in enumerate(shards):
        by_kind[tuple(sorted(counts.items()))].append(i)
    pipeline: Counter[int] = Counter()
    for kind in by_kind:
        pipeline.update(dict(kind))
    times = set(pipeline.values())
    if len(times) != 1:
        raise ValueError(f"job {topology.job}: one node of each kind runs the model's shards unequally often "
                         f"({len(times)} different counts), so no replay group is a runnable pipeline; "
                         "replay this job by hand")
    sizes = {len(v) for v in by_kind.values()}
    if len(sizes) != 1:
        raise ValueError(f"job {topology.job}: its {len(by_kind)} kinds of node have unequal numbers of nodes "
                         f"({min(sizes)} to {max(sizes)}), so its nodes do not form whole pipelines; "
                         "replay this job by hand")
    names = topology.nodes
    kinds = tuple(tuple(names[i] for i in sorted(idx, key=lambda i: (low_dp[i], names[i])))
                  for _, idx in sorted(by_kind.items()))
    return kinds, times.pop()


def _few(names: Iterable[str], shown: int = 5) -> str:
    """Up to `shown` sorted names, and how many more."""
    ordered = sorted(map(str, names))
    more = f" and {len(ordered) - shown} more" if len(ordered) > shown else ""
    return ", ".join(ordered[:shown]) + more
