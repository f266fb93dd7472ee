"""Localization fusion: from an incident's findings to culprit nodes, a confidence, and the evidence chain.

Each finding lends weight to a node (the reporting rank of a timeout lends none:
it is a victim). Weights of one node combine as independent evidence,
`1 - prod(1 - w)`. Nodes at or above the confidence threshold are culprits. When
only rank-level evidence points into several nodes (stack or flight outliers
without node-level corroboration), the answer is a parallel group: the smallest
of the TP, PP-stage or DP group that holds every suspect rank (over-eviction),
with a count of the presumably innocent nodes it takes along.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding

NODE_LEVEL = frozenset({"fail_stop", "hw_fault", "sdc_suspect"})
# facts about the whole job (ranks that never started, every rank silent at once): never evidence against a node
JOB_LEVEL = frozenset({"start_timeout", "monitoring_gap"})


def weight(f: Finding) -> float:
    """How strongly one finding points at its node on its own (0: not at all)."""
    if f.type in JOB_LEVEL:
        return 0.0
    if f.type == "fail_stop":
        if f.evidence.get("cause") == "heartbeat":
            return 0.9 if f.evidence.get("whole_node") else 0.7
        return 0.5  # a process exit or exception: a rank, maybe not the machine
    if f.type == "hw_fault":
        return {"fatal": 0.95, "degraded": 0.4, "evidence": 0.3}.get(f.evidence.get("severity"), 0.0)
    if f.type == "sdc_suspect":
        return 0.9 if f.rank is not None else 0.0
    if f.type == "stack_outlier":
        return 0.7 if f.detector.startswith("flight") else 0.6
    if f.type == "fail_slow":
        return 0.7
    return 0.0


def _specificity(findings: list[Finding]) -> dict[str, float]:
    """Per stack/flight finding, how specific it is within its sweep (1: the most specific suspect).

    A stuck rank drags its pipeline neighbours into odd stacks too: the smallest
    outlier cluster (stacks) and the highest-scoring suspect (flight) are the
    likeliest cause, the larger clusters its victims.
    """
    out: dict[str, float] = {}
    sweeps: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        if f.type == "stack_outlier":
            fam = "flight" if f.detector.startswith("flight") else "stacks"
            sweeps.setdefault((fam, str(f.evidence.get("snapshot"))), []).append(f)
    for (fam, _), group in sweeps.items():
        if fam == "stacks":
            sizes = [max(1, int(f.evidence.get("cluster_size") or 1)) for f in group]
            best = min(sizes)
            out.update({f.id: best / size for f, size in zip(group, sizes, strict=True)})
        else:
            top = max((f.score or 0.0) for f in group) or 1.0
            out.update({f.id: 1.0 if (f.score or 0.0) >= top else 0.5 * (f.score or 0.0) / top for f in group})
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


def _sweep_suspects(findings: list[Finding], spec: dict[str, float]) -> tuple[list[int], set[str]]:
    """The ranks a stack / flight-recorder sweep points at most, and the ids of findings on them.

    Each rank's evidence from the two recorders combines; only the top-scoring
    ranks are suspects, the others are taken for victims of the stall.
    """
    per_rank: dict[int, dict[str, float]] = {}
    for f in findings:
        if f.type == "stack_outlier" and f.rank is not None:
            fam = per_rank.setdefault(f.rank, {})
            fam[_family(f)] = max(fam.get(_family(f), 0.0), weight(f) * spec.get(f.id, 1.0))
    if not per_rank:
        return [], set()
    score = {r: 1.0 - _prod(1.0 - w for w in fams.values()) for r, fams in per_rank.items()}
    top = max(score.values())
    ranks = sorted(r for r, v in score.items() if v >= top - 0.02)
    chosen = set(ranks)
    return ranks, {f.id for f in findings if f.type == "stack_outlier" and f.rank in chosen}


def _prod(xs) -> float:
    out = 1.0
    for x in xs:
        out *= x
    return out


def localize(findings: list[Finding], topo: Topology, threshold: float) -> Localization:
    """Fuse the findings of one incident into culprit nodes (or a group)."""
    spec = _specificity(findings)
    suspect_ranks, suspect_ids = _sweep_suspects(findings, spec)
    best: dict[tuple[str, str], tuple[float, str]] = {}  # (node, detector family) -> strongest (weight, id)
    ids: dict[str, list[str]] = {}
    node_level: set[str] = set()
    for f in findings:
        if f.type == "stack_outlier" and f.id not in suspect_ids:
            continue  # a victim of the stall, not a suspect
        w = weight(f) * spec.get(f.id, 1.0)
        if w <= 0 or f.node is None:
            continue
        ids.setdefault(f.node, []).append(f.id)
        key = (f.node, _family(f))
        if w > best.get(key, (0.0, ""))[0]:
            best[key] = (w, f.id)
        if f.type in NODE_LEVEL and w >= 0.5:
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
    if len(outlier_nodes) > 1 and not (outlier_nodes & node_level):
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
        comm = [f for f in findings if f.type == "comm_error" and f.evidence.get("suspect_ranks")]
        if comm:  # no other evidence: the ranks in every timed-out group, weakly
            loc.suspect_ranks = sorted(set(comm[0].evidence["suspect_ranks"]))
            loc.per_node.update({n: 0.3 for n in comm[0].evidence.get("suspect_nodes", [])})
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
