"""Benchmark: what replay planning (`triage.rerun_plan`) costs to find one or two faulty machines.

For each layout (pp x dp, TP 8 on 8-GPU nodes unless named: tp 4 puts two TP groups on a node, two
replicas of one stage or two stages of one replica; tp 16 spreads one over two nodes) it builds the plan, then
replays it against every single faulty node and a seeded sample of pairs (a group fails iff it holds a faulty
node), and reports: the kinds of node (k) and pipelines (d); phase 1's replay runs and machine-runs (nodes x
runs); for a single fault and for a pair, the most phases, replay runs and machine-runs all phases took, and
whether every verdict named exactly the faulty nodes; and the time to plan. Prints figures; asserts nothing.

    PYTHONPATH=. python bench/bench_rerun_plan.py [--pairs 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import time

from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Job, RankInfo
from gangwatch.triage.rerun_plan import ReplayPlan, localize, next_phase, plan

GPUS = 8
LAYOUTS = [  # name, pp, dp, tp, order (a node's two tp-4 groups: "pp" two stages, "dp" two replicas)
    ("pp1 dp128", 1, 128, 8, "pp"),
    ("pp2 dp64", 2, 64, 8, "pp"),
    ("pp4 dp8", 4, 8, 8, "pp"),
    ("pp4 dp128", 4, 128, 8, "pp"),
    ("pp8 dp16", 8, 16, 8, "pp"),
    ("pp8 dp128", 8, 128, 8, "pp"),
    ("pp16 dp32", 16, 32, 8, "pp"),
    ("pp16 dp64", 16, 64, 8, "pp"),
    ("tp4/2 replicas pp8 dp128", 8, 128, 4, "dp"),
    ("tp4/2 stages pp8 dp128", 8, 128, 4, "pp"),
    ("tp16/2 nodes pp4 dp128", 4, 128, 16, "pp"),
    ("pp16 dp8", 16, 8, 8, "pp"),
    ("pp8 dp12", 8, 12, 8, "pp"),
    ("pp16 dp4", 16, 4, 8, "pp"),
    ("pp4 dp1", 4, 1, 8, "pp"),
]


def topology(pp: int, dp: int, tp: int, order: str) -> Topology:
    ranks = []
    for r in range(tp * pp * dp):
        cell = r // tp
        p, d = (cell % pp, cell // pp) if order == "pp" else (cell // dp, cell % dp)
        ranks.append(RankInfo(rank=r, node=f"n{r // GPUS:04d}", gpu=r % GPUS, tp=r % tp, pp=p, dp=d))
    return Topology.from_job(Job(ts=0.0, job="bench", ranks=ranks))


def replay(p: ReplayPlan, faulty: set[str]) -> tuple[ReplayPlan, bool]:
    """The plan run to its end against `faulty`, and whether its verdict named exactly them."""
    results: dict[str, str] = {}
    while True:
        results |= {g.id: "fail" if faulty.intersection(g.nodes) else "pass" for g in p.phases[-1].groups}
        nxt = next_phase(p, results)
        if nxt is None:
            verdict = localize(p, results)
            return p, verdict.outcome == "localized" and verdict.culprits == faulty
        p = p.extend(nxt)


def worst(p: ReplayPlan, faults: list[set[str]]) -> tuple[int, int, int, int]:
    """Most phases, replay runs and machine-runs over `faults`, and how many verdicts were not exact."""
    phases = runs = machine = wrong = 0
    for f in faults:
        done, exact = replay(p, f)
        phases, runs = max(phases, len(done.phases)), max(runs, done.cost.total_runs)
        machine, wrong = max(machine, done.cost.total_machine_runs), wrong + (not exact)
    return phases, runs, machine, wrong


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=300, help="seeded sample of faulty pairs per layout")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"{'layout':<26} {'nodes':>5} {'k':>3} {'d':>4} | {'phase 1 runs':>12} {'m-runs':>6} | "
          f"{'single: phases':>14} {'runs':>4} {'m-runs':>6} {'inexact':>7} | "
          f"{'pair: phases':>12} {'runs':>4} {'m-runs':>6} {'inexact':>7} | {'plan ms':>7}")
    for name, pp, dp, tp, order in LAYOUTS:
        topo = topology(pp, dp, tp, order)
        t = time.perf_counter()
        p = plan(topo)
        plan_ms = 1000 * (time.perf_counter() - t)
        rnd = random.Random(args.seed)
        nodes = list(topo.nodes)
        one = worst(p, [{n} for n in nodes])
        two = worst(p, [set(rnd.sample(nodes, 2)) for _ in range(args.pairs)] if len(nodes) > 1 else [])
        print(f"{name:<26} {len(nodes):>5} {len(p.kinds):>3} {len(p.kinds[0]):>4} | "
              f"{p.cost.runs[0]:>12} {p.cost.machine_runs[0]:>6} | "
              f"{one[0]:>14} {one[1]:>4} {one[2]:>6} {one[3]:>7} | "
              f"{two[0]:>12} {two[1]:>4} {two[2]:>6} {two[3]:>7} | {plan_ms:>7.1f}")


if __name__ == "__main__":
    main()
