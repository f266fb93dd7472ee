"""Flight-recorder localization: who never reached the collective the others wait in.

Every process group numbers its collectives (a per-group sequence id). In a
hang, the ranks of a group that did reach collective W wait in it; a rank that
never enqueued W (stuck in its data loader, in another group, in a driver call)
or enqueued it but never started it (its GPU stream is stuck) is the suspect.
For each process group of one snapshot, across the ranks that reported:

- W, the group's frontier, is the highest sequence id that at least half of its
  members enqueued; the group is stalled at W when some of them have not
  completed it;
- members whose `last_enqueued` is below W never enqueued it (``never_enqueued``);
  failing that, members that enqueued W but whose known `last_started` is below
  it while others started it never started it (``never_started``); members that
  enqueued a collective another member completed, but never completed it
  themselves, stopped there on their own GPU (``never_completed``: the others
  could not have finished it without them); suspects are at most
  `max_suspect_fraction` of the group;
- a group a rank ran point-to-point ops on (``p2p`` entries) has counters that
  count those ops too (PyTorch's), so they differ from stage to stage of a
  pipeline without anyone being late: there only the ids of its collective
  entries are compared;
- the op / size / dtype recorded at each sequence id must agree; a minority that
  differs from a strict majority is reported (``op_mismatch``, ``size_mismatch``,
  ``dtype_mismatch``);
- every process group is followed, not only the first that shows a stall, and
  the suspects are sorted out on one wait-for graph over all of them (see
  `_WaitFor`): a rank waits at its oldest collective not completed in a group
  for the members that never enqueued it (or never started it), or, when all
  enqueued it and nobody finished it, for every member that did not finish it;
  a rank blocked in a point-to-point op (a pipeline send or receive, with its
  ``peer``) waits for its peer; a ``never_completed`` rank waits on nobody. A
  suspect that waits, directly or through others, for a suspect that does not
  wait back on it is a consequence, not a root cause, and is not reported (a
  TP-group hang leaves its ranks behind in their DP groups; a pipeline
  neighbour waiting to receive from a stuck rank is behind in its own groups; a
  rank whose group's others all wait on a culprit elsewhere is behind there).
  What is left are root causes, as many as there are: two ranks each holding up
  a different group are both named; suspects that wait on each other (a cycle)
  are all kept, with less confidence.

`FlightDetector` collects `flight` records per snapshot and analyses a snapshot
once every rank of the topology reported, or `window_s` after its first record.
One ``stack_outlier`` finding (detector ``flight``) per suspect rank.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, ClassVar

from gangwatch.detectors.base import SavedJob, fill_missing
from gangwatch.detectors.config import FlightConfig
from gangwatch.detectors.registry import FindingType, Policy, Typed
from gangwatch.detectors.sweeps import Sweep, SweepDetector, SweepEvidence
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Flight, Record
from gangwatch.schemas.collectives import P2P_OPS, op_name, p2p_peer
from gangwatch.schemas.evidence import absent

_REASON_ORDER = {"never_enqueued": 0, "never_started": 1, "never_completed": 2, "op_mismatch": 3, "size_mismatch": 4,
                 "dtype_mismatch": 5}
_EVIDENCE_REASONS = 16


@dataclass(frozen=True, slots=True)
class GroupView:
    """One rank's view of one process group; -1 means unknown."""

    desc: str | None
    ranks: tuple[int, ...]
    enqueued: int
    started: int
    completed: int


@dataclass(frozen=True, slots=True)
class RankView:
    """What one rank's `flight` record says, reduced to what the analysis needs."""

    has_groups: bool  # the record listed its groups: a group it does not list is one it never used
    groups: dict[str, GroupView]
    entries: dict[str, dict[int, tuple[str, int | None, str | None]]]  # pg -> seq -> (op, size, dtype)
    waits_on: tuple[tuple[str, str, int], ...] = ()  # point-to-point ops not completed: (pg, op, peer's rank)
    p2p: frozenset[str] = frozenset()  # groups it ran point-to-point ops on: their counters count those too
    collectives: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # pg -> counters from its entries


def rank_view(rec: Flight, entries_per_pg: int = 64) -> RankView:
    """Reduce a `flight` record: per group the last enqueued / started / completed ids (the
    larger of the group's counters and what its entries show) and its last `entries_per_pg`
    collectives. Point-to-point entries (``"p2p": true``, or an op named ``send`` / ``recv``: a
    dump framed by another producer keeps PyTorch's ``nccl:send 0->3`` and marks nothing) do not
    count there (their ids are their own); those not completed whose peer is known (`peer`, else
    from PyTorch's name) are what the rank waits on, and the group they ran on is marked (PyTorch's
    group counters count its point-to-point ops too). Op names are compared normalized
    (``nccl:_all_gather_base`` is ``allgather``)."""
    ents: dict[str, dict[int, tuple[str, int | None, str | None]]] = {}
    derived: dict[str, list[int]] = {}  # pg -> [enqueued, started, completed]
    pending: list[tuple[str, str, int]] = []  # (pg, op, peer's index in the group)
    p2p: set[str] = set()
    for e in rec.entries:
        op = op_name(e.op)
        if e.extra.get("p2p") or op in P2P_OPS:
            p2p.add(e.pg)
            peer = e.extra.get("peer")
            if type(peer) is not int:
                name = e.extra.get("profiling_name")
                peer = p2p_peer(name if isinstance(name, str) else e.op)
            if e.state != "completed" and type(peer) is int and peer >= 0:
                pending.append((e.pg, op, peer))
            continue
        ents.setdefault(e.pg, {})[e.seq] = (op, e.size, e.dtype)
        d = derived.setdefault(e.pg, [-1, -1, -1])
        d[0] = max(d[0], e.seq)
        if e.state != "scheduled":
            d[1] = max(d[1], e.seq)
        if e.state == "completed":
            d[2] = max(d[2], e.seq)
    for pg, seqs in ents.items():
        if len(seqs) > entries_per_pg:
            ents[pg] = {s: seqs[s] for s in sorted(seqs)[-entries_per_pg:]}
    groups: dict[str, GroupView] = {}
    for g in rec.groups or ():
        d = derived.get(g.pg, [-1, -1, -1])
        groups[g.pg] = GroupView(g.desc, tuple(g.ranks), max(g.last_enqueued, d[0]), max(g.last_started, d[1]),
                                 max(g.last_completed, d[2]))
    for pg, d in derived.items():
        if pg not in groups:
            groups[pg] = GroupView(None, (), d[0], d[1], d[2])
    waits = []
    for pg, op, peer in pending:
        members = sorted(groups[pg].ranks) if pg in groups else []
        if peer < len(members) and members[peer] != rec.rank:
            waits.append((pg, op, members[peer]))
    return RankView(rec.groups is not None, groups, ents, tuple(dict.fromkeys(waits)), frozenset(p2p),
                    {pg: (d[0], d[1], d[2]) for pg, d in derived.items()})


@dataclass(frozen=True, slots=True)
class Suspect:
    """One reason to suspect one rank in one process group."""

    rank: int
    pg: str
    desc: str | None
    seq: int
    reason: str
    score: float
    op: str | None = None
    size: int | None = None
    dtype: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def _majority(values: list[Any]) -> tuple[Any, int] | None:
    """The value held by a strict majority of `values` (Nones ignored), with its count."""
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    (top, count), *_ = Counter(vals).most_common(1)
    return (top, count) if count * 2 > len(vals) else None


def localize(views: Mapping[int, RankView], *, max_suspect_fraction: float = 0.5) -> list[Suspect]:
    """Root-cause suspects of one snapshot (rank -> its view), sorted by rank, reason, pg."""
    behind: list[Suspect] = []
    mismatched: list[Suspect] = []
    graph = _WaitFor()
    pgs = sorted({pg for v in views.values() for pg in v.groups})
    for pg in pgs:
        declared = sorted({r for v in views.values() if pg in v.groups for r in v.groups[pg].ranks})
        members = declared or sorted(r for r, v in views.items() if pg in v.groups)
        p2p = any(pg in v.p2p for v in views.values())
        rows: list[tuple[int, GroupView]] = []
        for r in members:
            v = views.get(r)
            if v is None:
                continue
            g = v.groups.get(pg)
            if p2p:  # its counters count point-to-point ops too: only what collective entries show compares
                if pg in v.collectives:
                    rows.append((r, GroupView(g.desc if g else None, (), *v.collectives[pg])))
            elif g is not None:
                rows.append((r, g))
            elif v.has_groups:
                rows.append((r, GroupView(None, (), -1, -1, -1)))  # a member that never used the group
        desc = next((g.desc for _, g in rows if g.desc), None)
        behind += _behind(pg, desc, rows, views, max_suspect_fraction)[0]
        behind += _unfinished(pg, desc, rows, views, max_suspect_fraction)
        graph.add_group(pg, rows)
        mismatched += _mismatches(pg, desc, [r for r, _ in rows], views)
    for r, v in views.items():
        for _, _, peer in v.waits_on:
            graph.edge(r, peer)
    suspects = {s.rank for s in behind}
    # a rank its group's peers finished a collective without has a fault of its own: it waits on nobody
    graph.sinks = {s.rank for s in behind if s.reason == "never_completed"}
    victims, cycles = graph.victims(suspects)
    out = [s if s.rank not in cycles else replace(s, score=round(s.score / 2, 4), detail={**s.detail, "cycle": True})
           for s in behind if s.rank not in victims]
    out += mismatched
    return sorted(out, key=lambda s: (s.rank, _REASON_ORDER.get(s.reason, 9), s.pg, s.seq))


class _WaitFor:
    """The wait-for graph of one snapshot, over every process group.

    A rank waits at its oldest collective not completed in a group, k: for the
    members that never enqueued k; failing that, for the members that never
    started it while it did (when started ids are known); failing that (everyone
    enqueued k and nobody finished it: some GPU is held up, its own or another
    group's op before k in its stream), for every member that did not complete k.
    A rank that did not finish k while a member did waits on nobody in that group
    (the fault is its own). A rank with a point-to-point op not completed waits
    for its peer. Edges to the members of one (group, k) go through one hub node,
    so a stalled group of n ranks costs n edges, not n².
    """

    def __init__(self) -> None:
        self.out: dict[object, set[object]] = {}
        self.sinks: set[int] = set()

    def edge(self, a: object, b: object) -> None:
        if a != b:
            self.out.setdefault(a, set()).add(b)

    def add_group(self, pg: str, rows: list[tuple[int, GroupView]]) -> None:
        for r, g in rows:
            if g.enqueued < 0 or g.completed >= g.enqueued:
                continue
            k = g.completed + 1 if g.completed >= 0 else g.enqueued  # completion unknown: its last one
            if any(q.completed >= k for _, q in rows):
                continue  # a member finished k: nobody holds it up but this rank
            on = [q for q, h in rows if h.enqueued < k]
            kind = "enqueue"
            if not on and g.started >= k:
                on = [q for q, h in rows if 0 <= h.started < k]
                kind = "start"
            if not on and g.completed >= 0:
                on = [q for q, h in rows if q != r and h.completed < k]
                kind = "finish"
            if not on:
                continue
            hub = (pg, k, kind)
            self.edge(r, hub)
            for q in on:
                self.edge(hub, q)

    def victims(self, suspects: set[int]) -> tuple[set[int], set[int]]:
        """(victims, cycle members) among `suspects`: a suspect that waits, directly or through others, for a
        suspect that does not wait back on it is a victim; suspects left that wait on each other are a cycle."""
        comp = _components({a: (() if a in self.sinks else bs) for a, bs in self.out.items()} |
                           {s: () for s in self.sinks})
        members: dict[int, list[int]] = {}
        for s in suspects:
            members.setdefault(comp.get(s, -1 - s), []).append(s)
        # components come out of _components numbered sinks first: a successor's number is lower than its own
        order = sorted(set(comp.values()))
        succ: dict[int, set[int]] = {}
        for a, bs in self.out.items():
            if a in self.sinks:
                continue
            for b in bs:
                if comp[a] != comp[b]:
                    succ.setdefault(comp[a], set()).add(comp[b])
        holds: dict[int, bool] = {}  # component -> it reaches a component with a suspect in it (not itself)
        for c in order:
            holds[c] = any(holds[d] or d in members for d in succ.get(c, ()))
        victims = {s for s in suspects if holds.get(comp.get(s, -1 - s), False)}
        cycles = {s for c, ss in members.items() if len(ss) > 1 for s in ss if s not in victims}
        return victims, cycles


def _components(out: Mapping[object, Any]) -> dict[object, int]:
    """Strongly connected components (Tarjan, iterative): node -> component number, numbered in the order they
    are completed, so every edge between two components points to a lower number."""
    index: dict[object, int] = {}
    low: dict[object, int] = {}
    comp: dict[object, int] = {}
    stack: list[object] = []
    on_stack: set[object] = set()
    nodes = list(out) + [b for bs in out.values() for b in bs]
    n = done = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(out.get(root, ())))]
        index[root] = low[root] = n
        n += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = n
                    n += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(out.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp[x] = done
                    if x == node:
                        break
                done += 1
    return comp


def _behind(pg: str, desc: str | None, rows: list[tuple[int, GroupView]], views: Mapping[int, RankView],
            max_fraction: float) -> tuple[list[Suspect], set[int]]:
    n = len(rows)
    if n < 2:
        return [], set()
    frontier = sorted((g.enqueued for _, g in rows), reverse=True)[(n + 1) // 2 - 1]
    if frontier < 0:
        return [], set()
    ahead = [(r, g) for r, g in rows if g.enqueued >= frontier]
    waiting = {r for r, g in ahead if g.completed < frontier}
    if not waiting:
        return [], set()
    late = [(r, g) for r, g in rows if g.enqueued < frontier]
    reason = "never_enqueued"
    if not late:
        started = [r for r, g in ahead if g.started >= frontier]
        late = [(r, g) for r, g in ahead if 0 <= g.started < frontier and g.completed < frontier]
        reason = "never_started"
        if len(started) * 2 < n:
            late = []
    if not late or len(late) > max_fraction * n:
        return [], waiting
    seen = [views[r].entries.get(pg, {}).get(frontier) for r, _ in ahead]
    op = _majority([x[0] for x in seen if x])
    size = _majority([x[1] for x in seen if x])
    dtype = _majority([x[2] for x in seen if x])
    score = round(len(waiting) / n, 4)
    out = [Suspect(r, pg, desc, frontier, reason, score, op and op[0], size and size[0], dtype and dtype[0],
                   {"last_enqueued": g.enqueued, "last_started": g.started, "last_completed": g.completed,
                    "group_size": n, "ranks_waiting": len(waiting)})
           for r, g in late]
    return out, waiting - {r for r, _ in late}


def _unfinished(pg: str, desc: str | None, rows: list[tuple[int, GroupView]], views: Mapping[int, RankView],
                max_fraction: float) -> list[Suspect]:
    """Members that enqueued a collective another member completed, and never completed it themselves
    (``never_completed``): their GPU, or their watchdog, stopped there; the others could not have finished it
    without them running it. At most `max_fraction` of the group."""
    n = len(rows)
    done = max((g.completed for _, g in rows), default=-1)
    late = [(r, g) for r, g in rows if 0 <= g.completed < min(g.enqueued, done)]
    if n < 2 or not late or len(late) > max_fraction * n:
        return []
    out = []
    for r, g in late:
        k = g.completed + 1
        finished = sum(1 for _, h in rows if h.completed >= k)
        seen = [views[q].entries.get(pg, {}).get(k) for q, _ in rows if q in views]
        op = _majority([x[0] for x in seen if x])
        size = _majority([x[1] for x in seen if x])
        dtype = _majority([x[2] for x in seen if x])
        out.append(Suspect(r, pg, desc, k, "never_completed", round(finished / n, 4), op and op[0], size and size[0],
                           dtype and dtype[0], {"last_enqueued": g.enqueued, "last_started": g.started,
                                                "last_completed": g.completed, "group_size": n,
                                                "ranks_waiting": n - finished}))
    return out


def _mismatches(pg: str, desc: str | None, ranks: list[int], views: Mapping[int, RankView]) -> list[Suspect]:
    by_seq: dict[int, dict[int, tuple[str, int | None, str | None]]] = {}
    for r in ranks:
        for seq, ent in views[r].entries.get(pg, {}).items() if r in views else ():
            by_seq.setdefault(seq, {})[r] = ent
    first: dict[tuple[int, str], Suspect] = {}
    for seq in sorted(by_seq):
        at = by_seq[seq]
        if len(at) < 3:
            continue
        for i, attr in enumerate(("op", "size", "dtype")):
            major = _majority([ent[i] for ent in at.values()])
            if major is None:
                continue
            value, count = major
            for r, ent in at.items():
                if ent[i] is not None and ent[i] != value and (r, attr) not in first:
                    first[(r, attr)] = Suspect(
                        r, pg, desc, seq, f"{attr}_mismatch", round(count / len(at), 4), ent[0], ent[1], ent[2],
                        {"expected": value, "got": ent[i], "ranks_agreeing": count, "ranks_compared": len(at)})
    return list(first.values())


# --- detector ------------------------------------------------------------------------------


# --- what it finds ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class FlightBehind(SweepEvidence):
    """A rank that never enqueued (or never started, or never completed) a collective the rest of its group
    waits in, or finished."""

    pg: str
    desc: str | None  # the group's description
    seq: int  # the frontier collective's sequence id in the group
    op: str | None
    reason: str  # never_enqueued | never_started | never_completed
    size: int | None
    dtype: str | None
    last_enqueued: int
    last_started: int
    last_completed: int
    group_size: int
    ranks_waiting: int
    cycle: bool | None = absent()  # True: everyone waits on everyone (a cycle), so less sure
    ranks_reported: int  # dumps in the sweep
    reasons: list[dict[str, Any]]  # every reason found for this rank: {pg, seq, op, reason} (first 16)


@dataclass(frozen=True, slots=True, kw_only=True)
class FlightMismatch(SweepEvidence):
    """A rank whose collective at `seq` disagrees with its group's majority in op, size or dtype."""

    pg: str
    desc: str | None
    seq: int
    op: str | None
    reason: str  # op_mismatch | size_mismatch | dtype_mismatch
    size: int | None
    dtype: str | None
    expected: Any  # the majority's value
    got: Any
    ranks_agreeing: int
    ranks_compared: int
    ranks_reported: int
    reasons: list[dict[str, Any]]


def _root(f: Finding, ev: FlightBehind | FlightMismatch) -> bool:
    """A rank behind in a group that waits for no other suspect: a root cause on its own."""
    return isinstance(ev, FlightBehind) and not ev.cycle


def _flight_specificity(sweep: Sequence[Typed]) -> list[float]:
    """Every root cause of a sweep counts in full (victims were already left out); of the rest (a cycle, an
    op / size mismatch) the highest-scoring is the likeliest cause, the others its victims."""
    top = max((t.finding.score or 0.0) for t in sweep if not t.root_cause) if not all(
        t.root_cause for t in sweep) else 1.0
    return [1.0 if t.root_cause or (t.finding.score or 0.0) >= (top or 1.0)
            else 0.5 * (t.finding.score or 0.0) / (top or 1.0) for t in sweep]


STACK_OUTLIER = FindingType("stack_outlier", (FlightBehind, FlightMismatch), Policy(
    incident="hang", weight=0.7, risk=0.3, sweep_result=True, specificity=_flight_specificity, root_cause=_root))


class FlightDetector(SweepDetector):
    """Ranks that hold up a process group, from flight-recorder sweeps of one job."""

    name: ClassVar[str] = "flight"
    kind: ClassVar[str] = "flight"
    kinds: ClassVar[frozenset[str]] = frozenset({"flight"})
    finding_types: ClassVar[tuple[FindingType, ...]] = (STACK_OUTLIER,)

    def __init__(self, topo: Topology, config: FlightConfig | None = None) -> None:
        self.config = config or FlightConfig()
        super().__init__(topo, self.config.window_s, self.config.max_pending, self.config.remember_done)

    def entry(self, rec: Record, sweep: Sweep) -> RankView:
        return rank_view(rec, self.config.entries_per_pg)

    def analyse(self, snapshot: str, views: Mapping[int, RankView], ts: float) -> list[Finding]:
        """Findings for one snapshot (rank -> view), stamped `ts`: one per suspect rank."""
        if len(views) < self.config.min_ranks:
            return []
        by_rank: dict[int, list[Suspect]] = {}
        for s in localize(views, max_suspect_fraction=self.config.max_suspect_fraction):
            by_rank.setdefault(s.rank, []).append(s)
        out = []
        for rank, reasons in sorted(by_rank.items()):
            top = reasons[0]
            shape = FlightMismatch if top.reason.endswith("_mismatch") else FlightBehind
            evidence = shape(snapshot=snapshot, pg=top.pg, desc=top.desc, seq=top.seq, op=top.op, reason=top.reason,
                             size=top.size, dtype=top.dtype, **top.detail, ranks_reported=len(views),
                             reasons=[{"pg": s.pg, "seq": s.seq, "op": s.op, "reason": s.reason}
                                      for s in reasons[:_EVIDENCE_REASONS]])
            out.append(STACK_OUTLIER.finding(
                ts=ts, job=self.topo.job, detector="flight", topo=self.topo,
                rank=rank if rank < self.topo.size else None, key=(snapshot, rank),
                score=max(s.score for s in reasons), evidence=evidence,
            ))
        return out

    # --- state ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "done": list(self.done),
                "pending": {sid: {"first_ts": s.first_ts, "last_ts": s.last_ts,
                                  "views": [[r, _view_state(v)] for r, v in sorted(s.items.items())],
                                  "raw": [[r, t] for r, t in sorted(s.raw.items())]}
                            for sid, s in self.pending.items()}}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> FlightDetector:
        det = cls(topo, FlightConfig(**state["config"]))
        for sid, s in state["pending"].items():
            det.pending[sid] = Sweep(float(s["first_ts"]), float(s["last_ts"]),
                                     {int(r): _view_from_state(v) for r, v in s["views"]},
                                     {int(r): float(t) for r, t in s.get("raw", ())})  # (none: saved before)
        det.done.extend(state["done"])
        return det

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        """Its saved state brought up to date (`DetectorBase.upgrade_state`)."""
        if version == 2:  # grew without a version change: a pending sweep's views may lack any of this
            for sweep in state["pending"].values():
                for _, view in sweep["views"]:
                    fill_missing(view, {"waits_on": [], "p2p": [], "collectives": {}})
        return state


def _view_state(v: RankView) -> dict[str, Any]:
    return {"has_groups": v.has_groups,
            "groups": {pg: [g.desc, list(g.ranks), g.enqueued, g.started, g.completed] for pg, g in v.groups.items()},
            "entries": {pg: [[seq, *ent] for seq, ent in ents.items()] for pg, ents in v.entries.items()},
            "waits_on": [list(w) for w in v.waits_on], "p2p": sorted(v.p2p),
            "collectives": {pg: list(c) for pg, c in v.collectives.items()}}


def _view_from_state(s: dict[str, Any]) -> RankView:
    groups = {pg: GroupView(d, tuple(ranks), e, st, c) for pg, (d, ranks, e, st, c) in s["groups"].items()}
    entries = {pg: {seq: (op, size, dtype) for seq, op, size, dtype in ents} for pg, ents in s["entries"].items()}
    collectives = {pg: (e, st, c) for pg, (e, st, c) in s["collectives"].items()}
    return RankView(bool(s["has_groups"]), groups, entries, tuple(tuple(w) for w in s["waits_on"]),
                    frozenset(s["p2p"]), collectives)
