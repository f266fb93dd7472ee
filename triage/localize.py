"""Localization fusion: from an incident's findings to culprit nodes, a confidence, and the evidence chain.

Each finding lends weight to a node, as its type's policy says (declared beside
its detector; the reporting rank of a timeout lends none: it is a victim).
Weights of one node combine as independent evidence,
`1 - prod(1 - w)`. Nodes at or above the confidence threshold are culprits. When
only rank-level evidence points into several nodes (stack or flight outliers
without node-level corroboration), the answer is a parallel group: the smallest
of the TP, PP-stage or DP group that holds every suspect rank (over-eviction),
with a count of the presumably innocent nodes it takes along.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gangwatch.detectors.registry import Typed
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding


def _specificity(findings: Sequence[Typed]) -> dict[str, float]:
    """Per sweep finding, how specific it is within its sweep (1: the most specific suspect).

    A stuck rank drags its pipeline neighbours into odd stacks too: each kind of
    sweep result says which of one sweep's findings are the likeliest cause
    (`Policy.specificity`), the others being its victims.
    """
    out: dict[str, float] = {}
    sweeps: dict[tuple[int, str], list[Typed]] = {}
    for t in findings:
        if t.policy.sweep_result:
            sweeps.setdefault((id(t.declared), t.evidence.snapshot), []).append(t)
    for group in sweeps.values():
        rate = group[0].policy.specificity
        if rate is not None:
            out.update({t.finding.id: s for t, s in zip(group, rate(group), strict=True)})
    return out


def _family(f: Finding) -> str:
    return f.detector.split(".")[0]


@dataclass
class Localization:
    culprits: list[str] = field(default_factory=list)  # nodes at or above the threshold
    confidence: float = 0.0  # the weakest culprit's confidence (0 when none)
    per_node: dict[str, float] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)  # finding ids behind the culprits (or the group)
    group: str | None = None  # "tp" | "pp" | "dp" | "stage" | "suspects" when only a group could be named
    group_nodes: list[str] = field(default_factory=list)
    innocent_nodes: int = 0  # nodes a group eviction presumably takes along without fault
    suspect_ranks: list[int] = field(default_factory=list)


def _sweep_suspects(findings: Sequence[Typed], spec: dict[str, float]) -> tuple[list[int], set[str], bool]:
    """The ranks a stack / flight-recorder sweep points at most, the ids of findings on them, and whether
    each of them is a root cause on its own (then several are several culprits).

    Each rank's evidence from the two recorders combines; the top-scoring ranks
    are suspects, and so is every rank a sweep names as a root cause (a hang can
    have several); the others are taken for victims of the stall.
    """
    per_rank: dict[int, dict[str, float]] = {}
    roots: set[int] = set()
    for t in findings:
        f = t.finding
        if t.policy.sweep_result and f.rank is not None:
            fam = per_rank.setdefault(f.rank, {})
            fam[_family(f)] = max(fam.get(_family(f), 0.0), t.weight * spec.get(f.id, 1.0))
            if t.root_cause:
                roots.add(f.rank)
    if not per_rank:
        return [], set(), False
    score = {r: 1.0 - _prod(1.0 - w for w in fams.values()) for r, fams in per_rank.items()}
    top = max(score.values())
    chosen = {r for r, v in score.items() if v >= top - 0.02} | roots
    ranks = sorted(chosen)
    return ranks, {t.finding.id for t in findings if t.policy.sweep_result and t.finding.rank in chosen}, \
        chosen <= roots


def _prod(xs) -> float:
    out = 1.0
    for x in xs:
        out *= x
    return out


def localize(findings: Sequence[Typed], topo: Topology, threshold: float) -> Localization:
    """Fuse the (typed) findings of one incident into culprit nodes (or a group)."""
    spec = _specificity(findings)
    suspect_ranks, suspect_ids, independent = _sweep_suspects(findings, spec)
    best: dict[tuple[str, str], tuple[float, str]] = {}  # (node, detector family) -> strongest (weight, id)
    ids: dict[str, list[str]] = {}
    node_level: set[str] = set()
    for t in findings:
        f = t.finding
        if t.policy.sweep_result and f.id not in suspect_ids:
            continue  # a victim of the stall, not a suspect
        w = t.weight * spec.get(f.id, 1.0)
        if w <= 0 or f.node is None:
            continue
        ids.setdefault(f.node, []).append(f.id)
        key = (f.node, _family(f))
        if w > best.get(key, (0.0, ""))[0]:
            best[key] = (w, f.id)
        if t.node_level and w >= 0.5:
            node_level.add(f.node)
    # evidence from different sources combines as independent; many ranks of one node seen by the
    # same detector count once (their strongest), so a crowd of ranks cannot outvote a precise signal
    miss: dict[str, float] = {}
    for (node, _), (w, _) in best.items():
        miss[node] = miss.get(node, 1.0) * (1.0 - w)
    per_node = {n: round(1.0 - m, 4) for n, m in sorted(miss.items())}
    culprits = sorted(n for n, c in per_node.items() if c >= threshold)
    loc = Localization(per_node=per_node, suspect_ranks=suspect_ranks)
    outlier_nodes = set(topo.nodes_of(suspect_ranks)) if suspect_ranks else set()
    # several root causes, each holding up its own group, are several culprits (named below), not a group
    if len(outlier_nodes) > 1 and not (outlier_nodes & node_level) and not independent:
        kind, nodes = smallest_group(topo, suspect_ranks)
        loc.group, loc.group_nodes = kind, nodes
        loc.innocent_nodes = max(0, len(nodes) - 1)
        loc.confidence = min(per_node[n] for n in outlier_nodes)
        loc.evidence = sorted({i for n in outlier_nodes for i in ids[n]})
        return loc
    if culprits:
        loc.culprits = culprits
        loc.confidence = min(per_node[n] for n in culprits)
        loc.evidence = sorted({i for n in culprits for i in ids[n]})
    if not culprits:
        weak = [s for t in findings if (s := t.suspects) is not None and s[0]]
        if weak:  # no other evidence: e.g. the ranks in every timed-out group, weakly
            ranks, nodes = weak[0]
            loc.suspect_ranks = sorted(set(ranks))
            loc.per_node.update({n: 0.3 for n in nodes})
    return loc


def smallest_group(topo: Topology, ranks: list[int]) -> tuple[str, list[str]]:
    """The fewest nodes that surely hold the fault behind suspect `ranks`.

    Candidates: each parallel group kind (TP, pipeline, DP, pipeline stage) that
    holds every suspect, and the suspects' own nodes; the smallest wins, a named
    group on a tie.
    """
    best = ("suspects", topo.nodes_of(ranks))
    for kind in topo.GROUPS:
        members = set(topo.group_ranks(kind, ranks[0]).tolist())
        if set(ranks) <= members:
            nodes = topo.nodes_of(sorted(members))
            if len(nodes) <= len(best[1]):
                best = (kind, nodes)
    return best
