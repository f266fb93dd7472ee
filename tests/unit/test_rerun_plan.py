"""Replay planning (`triage.rerun_plan`): every single faulty node, and every pair of them (a seeded sample on
the largest jobs), is named exactly, within two phases wherever the job has the replicas for it; the groups of a
phase share no node, and each runs every (tp, pp) shard of the model equally often."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import orjson
import pytest
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Job, RankInfo
from gangwatch.triage.rerun_plan import Phase, ReplayPlan, Verdict, localize, next_phase, plan

pytestmark = pytest.mark.unit

GPUS = 8


def make(pp: int, dp: int, *, tp: int = 8, order: str = "pp") -> Topology:
    """A job of `GPUS`-GPU nodes, tp fastest, then pp (`order="pp"`: a node's two TP groups of tp 4 are two stages
    of one replica) or dp (`order="dp"`: two replicas of one stage); tp 16 spans two nodes."""
    ranks = []
    for r in range(tp * pp * dp):
        cell = r // tp
        p, d = (cell % pp, cell // pp) if order == "pp" else (cell // dp, cell % dp)
        ranks.append(RankInfo(rank=r, node=f"n{r // GPUS:04d}", gpu=r % GPUS, tp=r % tp, pp=p, dp=d))
    return Topology.from_job(Job(ts=0.0, job="j", ranks=ranks))


@dataclass(frozen=True)
class Case:
    """A layout, its kinds of node (k) and pipelines (d) counted by hand, and the most phases a single fault and
    a pair may take: 1 when each node is a pipeline (k = 1), 2 when d >= k (single) or d >= 2k (pair)."""

    name: str
    pp: int
    dp: int
    tp: int
    order: str
    k: int
    d: int
    single: int
    pair: int


CASES = [
    Case("pp1 dp128", 1, 128, 8, "pp", 1, 128, 1, 1),
    Case("pp2 dp16", 2, 16, 8, "pp", 2, 16, 2, 2),
    Case("pp4 dp8", 4, 8, 8, "pp", 4, 8, 2, 2),
    Case("pp4 dp32 dp-major", 4, 32, 8, "dp", 4, 32, 2, 2),
    Case("pp8 dp16", 8, 16, 8, "pp", 8, 16, 2, 2),
    Case("pp8 dp128", 8, 128, 8, "pp", 8, 128, 2, 2),
    Case("pp16 dp32", 16, 32, 8, "pp", 16, 32, 2, 2),
    Case("pp16 dp64", 16, 64, 8, "pp", 16, 64, 2, 2),
    Case("tp4 two replicas a node pp8 dp128", 8, 128, 4, "dp", 8, 64, 2, 2),
    Case("tp4 two stages a node pp8 dp32", 8, 32, 4, "pp", 4, 32, 2, 2),
    Case("tp16 over two nodes pp2 dp8", 2, 8, 16, "pp", 4, 8, 2, 2),
    Case("tp16 over two nodes pp4 dp128", 4, 128, 16, "pp", 8, 128, 2, 2),
    # d < 2k: after phase 1 a pair leaves up to 2k suspects, more than the d pipelines can hold one each;
    # pp16 dp8: 32 -> 4 a pipeline, 2 fail -> 8 left -> each alone in phase 3 (a single: 16 -> 2 a pipeline).
    Case("pp16 dp8", 16, 8, 8, "pp", 16, 8, 3, 3),
    Case("pp8 dp12", 8, 12, 8, "pp", 8, 12, 2, 3),
]

PAIRS_EXHAUSTIVE = 2_100  # every pair up to this many, else a seeded sample
PAIRS_SAMPLED = 400


def shard_counts(topo: Topology) -> tuple[list[str], np.ndarray]:
    """Nodes and, per node, how many of its ranks run each (tp, pp) shard: straight from the ranks."""
    nodes = sorted({r.node for r in topo.ranks})
    shards = sorted({(r.tp, r.pp) for r in topo.ranks})
    row, col = {n: i for i, n in enumerate(nodes)}, {s: j for j, s in enumerate(shards)}
    m = np.zeros((len(nodes), len(shards)), dtype=np.int64)
    for r in topo.ranks:
        m[row[r.node], col[(r.tp, r.pp)]] += 1
    return nodes, m


class Checker:
    """Replays a plan against a set of faulty nodes (a group fails iff it holds one), checking every phase."""

    def __init__(self, topo: Topology) -> None:
        nodes, self.counts = shard_counts(topo)
        self.row = {n: i for i, n in enumerate(nodes)}

    def check_phase(self, phase: Phase) -> None:
        seen: set[str] = set()
        for g in phase.groups:
            assert list(g.nodes) == sorted(set(g.nodes)) and g.suspects and set(g.suspects) <= set(g.nodes)
            assert not seen & set(g.nodes), f"phase {phase.number}: groups share nodes"
            seen |= set(g.nodes)
            per_shard = self.counts[[self.row[n] for n in g.nodes]].sum(axis=0)
            assert set(per_shard.tolist()) == {g.dp}, f"group {g.id} runs shards unequally: not runnable"

    def run(self, p: ReplayPlan, faulty: Iterable[str]) -> tuple[ReplayPlan, Verdict]:
        """The plan run to its end and its verdict; phases after the first are checked (check that one once)."""
        bad = set(faulty)
        results: dict[str, str] = {}
        while True:
            if len(p.phases) > 1:
                self.check_phase(p.phases[-1])
            results |= {g.id: "fail" if bad.intersection(g.nodes) else "pass" for g in p.phases[-1].groups}
            nxt = next_phase(p, results)
            if nxt is None:
                return p, localize(p, results)
            p = p.extend(nxt)


def pairs(topo: Topology, seed: int = 7) -> list[tuple[str, ...]]:
    """Every pair of nodes, or on large jobs a seeded sample plus the pairs that share a pipeline (lowest dp)
    or a stage set, which a sample rarely draws."""
    nodes = sorted({r.node for r in topo.ranks})
    if len(nodes) * (len(nodes) - 1) // 2 <= PAIRS_EXHAUSTIVE:
        return list(itertools.combinations(nodes, 2))
    rnd = random.Random(seed)
    low_dp: dict[str, int] = {}
    stages: dict[str, set[int]] = {}
    for r in topo.ranks:
        low_dp[r.node] = min(low_dp.get(r.node, r.dp), r.dp)
        stages.setdefault(r.node, set()).add(r.pp)
    first = [n for n in nodes if low_dp[n] == 0]
    alike = [n for n in nodes if stages[n] == stages[first[-1]]][:20]
    return ([tuple(rnd.sample(nodes, 2)) for _ in range(PAIRS_SAMPLED)]
            + list(itertools.combinations(first, 2)) + list(itertools.combinations(alike, 2)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_single_and_pair_is_named(case: Case) -> None:
    topo = make(case.pp, case.dp, tp=case.tp, order=case.order)
    p = plan(topo)
    nodes = sorted({r.node for r in topo.ranks})
    assert (len(p.kinds), len(p.kinds[0])) == (case.k, case.d)
    assert p.cost.runs == (case.d,) and p.cost.machine_runs == (len(nodes),)  # phase 1: the job's pipelines
    check = Checker(topo)
    check.check_phase(p.phases[0])
    for faults, most in [((n,), case.single) for n in nodes] + [(ab, case.pair) for ab in pairs(topo)]:
        done, verdict = check.run(p, faults)
        assert verdict.outcome == "localized" and verdict.culprits == set(faults), (faults, verdict)
        assert len(done.phases) <= most, (faults, done.cost)


def test_phase_two_tests_each_suspect_alone_with_nodes_that_passed() -> None:
    topo = make(4, 8)
    p = plan(topo)
    by_replica = {d: {r.node for r in topo.ranks if r.dp == d} for d in range(8)}
    faulty = {min(by_replica[2]), max(by_replica[5])}
    results = {g.id: "fail" if faulty & set(g.nodes) else "pass" for g in p.phases[0].groups}
    second = next_phase(p, results)
    assert second is not None
    failed = by_replica[2] | by_replica[5]
    assert sorted(n for g in second.groups for n in g.suspects) == sorted(failed)
    for g in second.groups:
        assert len(g.suspects) == 1 and not (set(g.nodes) - set(g.suspects)) & failed
    assert p.extend(second).cost.runs == (8, 8) and p.extend(second).cost.machine_runs == (32, 32)


def test_single_fault_costs_one_pipeline_per_node_of_its_replica() -> None:
    topo = make(8, 16)
    done, verdict = Checker(topo).run(plan(topo), ["n0042"])
    assert verdict.culprits == {"n0042"}
    assert done.cost.runs == (16, 8) and done.cost.machine_runs == (128, 64)
    assert done.cost.total_runs == 24 and done.cost.total_machine_runs == 192


def test_no_fault_is_none_failed() -> None:
    for topo in (make(4, 8), make(1, 16), make(8, 32, tp=4)):
        done, verdict = Checker(topo).run(plan(topo), [])
        assert len(done.phases) == 1
        assert verdict.outcome == "none_failed" and not verdict.culprits and not verdict.candidates


def test_dp1_cannot_split_a_single_pipeline() -> None:
    topo = make(4, 1)
    done, verdict = Checker(topo).run(plan(topo), ["n0002"])
    assert len(done.phases) == 1
    assert verdict.outcome == "ambiguous" and not verdict.culprits
    assert verdict.candidates == {r.node for r in topo.ranks}
    assert "no known-good spare" in verdict.reason


def test_narrower_suspects_restrict_the_plan() -> None:
    topo = make(8, 16)
    suspects = {r.node for r in topo.ranks if r.pp in (3, 5)}
    p = plan(topo, suspects)
    assert p.cost.runs == (16,)  # 32 suspects over 16 pipelines: two each
    assert all(len(g.suspects) == 2 and set(g.suspects) <= suspects for g in p.phases[0].groups)
    check = Checker(topo)
    check.check_phase(p.phases[0])
    for faults in [(n,) for n in sorted(suspects)] + list(itertools.combinations(sorted(suspects), 2)):
        done, verdict = check.run(p, faults)
        assert verdict.culprits == set(faults) and verdict.outcome == "localized" and len(done.phases) <= 2
        assert all(set(g.suspects) <= suspects for ph in done.phases for g in ph.groups)

    few = {"n0003", "n0040", "n0101"}
    p = plan(topo, few)
    check.check_phase(p.phases[0])
    assert p.cost.runs == (3,) and p.cost.machine_runs == (24,)
    assert sorted(g.suspects for g in p.phases[0].groups) == [(n,) for n in sorted(few)]
    for faults in [("n0040",), ("n0003", "n0101")]:
        done, verdict = check.run(p, faults)
        assert len(done.phases) == 1 and verdict.culprits == set(faults)


def test_fault_that_does_not_come_back_is_ambiguous() -> None:
    p = plan(make(4, 8))
    first = {g.id: "pass" for g in p.phases[0].groups}
    failed = p.phases[0].groups[3]
    first[failed.id] = "fail"
    second = next_phase(p, first)
    assert second is not None
    p = p.extend(second)
    results = first | {g.id: "pass" for g in second.groups}
    verdict = localize(p, results)
    assert verdict.outcome == "ambiguous" and verdict.candidates == set(failed.nodes)
    assert next_phase(p, results) is None


@pytest.mark.parametrize("pp,dp", [(2, 3), (4, 2), (4, 8), (16, 4), (1, 6)])
def test_many_faults_are_never_misnamed(pp: int, dp: int) -> None:
    topo = make(pp, dp)
    p, check = plan(topo), Checker(topo)
    check.check_phase(p.phases[0])
    nodes = sorted({r.node for r in topo.ranks})
    rnd = random.Random(pp * 100 + dp)
    for k in list(range(1, len(nodes) + 1)) * 6:
        faults = set(rnd.sample(nodes, k))
        done, verdict = check.run(p, faults)
        assert verdict.culprits <= faults <= verdict.culprits | verdict.candidates
        assert verdict.outcome == "ambiguous" or verdict.culprits == faults
        assert len(done.phases) <= len(nodes)


def test_phase_and_plan_travel_as_json() -> None:
    topo = make(4, 8)
    p = plan(topo)
    wire = orjson.loads(orjson.dumps(p.phases[0].to_json()))
    assert wire["phase"] == 1 and all(isinstance(g["nodes"], list) and g["id"] for g in wire["groups"])
    assert Phase.from_json(wire) == p.phases[0]
    results = orjson.loads(orjson.dumps({g["id"]: "fail" if "n0009" in g["nodes"] else "pass"
                                         for g in wire["groups"]}))
    second = next_phase(p, results)
    assert second is not None
    p2 = ReplayPlan.from_json(orjson.loads(orjson.dumps(p.extend(second).to_json())))
    assert p2 == p.extend(second)
    results |= {g.id: "fail" if "n0009" in g.nodes else "pass" for g in second.groups}
    verdict = localize(p2, results)
    assert verdict.culprits == {"n0009"}
    assert orjson.loads(orjson.dumps(verdict.to_json()))["culprits"] == ["n0009"]


def test_mistakes_are_one_line_value_errors() -> None:
    topo = make(4, 8)
    p = plan(topo)
    ok = {g.id: "pass" for g in p.phases[0].groups}
    first = p.phases[0].groups[0].id
    bad_calls = [
        (lambda: plan(topo, ["n0001", "nope"]), "not nodes of job j"),
        (lambda: plan(topo, "n0001"), "collection of node names"),
        (lambda: plan(topo, []), "no suspects"),
        (lambda: localize(p, {k: v for k, v in ok.items() if k != first}), "miss groups"),
        (lambda: next_phase(p, ok | {"p9-1": "pass"}), "the plan does not have"),
        (lambda: localize(p, ok | {first: "FAILED"}), "must be \"pass\" or \"fail\""),
        (lambda: p.extend(p.phases[0]), "cannot follow"),
        (lambda: Phase.from_json({"phase": 1}), "not a replay phase"),
        (lambda: ReplayPlan.from_json([]), "not a replay plan"),
    ]
    for call, words in bad_calls:
        with pytest.raises(ValueError, match=words) as e:
            call()
        assert "\n" not in str(e.value)


def ranks_on(node: str, cells: list[tuple[int, int]], start: int) -> list[RankInfo]:
    """tp-4 cells (pp, dp) placed one after the other on `node`, ranks from `start`."""
    return [RankInfo(rank=start + i * 4 + t, node=node, gpu=i * 4 + t, tp=t, pp=p, dp=d)
            for i, (p, d) in enumerate(cells) for t in range(4)]


def test_layouts_without_whole_pipelines_are_refused() -> None:
    # stage 0 twice on one node, stage 1 once per node: one node of each kind runs stage 0 twice, stage 1 once
    uneven = ranks_on("a", [(0, 0), (0, 1)], 0) + ranks_on("b", [(1, 0)], 8) + ranks_on("c", [(1, 1)], 12)
    with pytest.raises(ValueError, match="unequally often"):
        plan(Topology.from_job(Job(ts=0.0, job="u", ranks=uneven)))
    # two nodes run both stages, two run one each: kinds of unequal sizes
    ragged = (ranks_on("a", [(0, 0), (1, 0)], 0) + ranks_on("b", [(0, 1), (1, 1)], 8)
              + ranks_on("c", [(0, 2)], 16) + ranks_on("d", [(1, 2)], 20))
    with pytest.raises(ValueError, match="unequal numbers of nodes"):
        plan(Topology.from_job(Job(ts=0.0, job="r", ranks=ragged)))
