"""Benchmark: the invariance properties (issue 42) over many random jobs, and one large job.

Draws `--cases` random (job, perturbation) pairs: jobs of 1, 2, 3, 4, 8 or 16 nodes (two ranks each), healthy,
losing node n001 or with rank 2 hung at 120 s, any seed; one healthy node's clock off by `--max-offset` seconds
at most either way, from the start or stepped at a random moment before the fault, read as it arrived or sorted
by event time (or unshifted, sorted). Each is replayed against the job's unperturbed replay in arrival order
(`gangwatch.evaluation.invariance.changed`), and every case whose decisions changed is printed. Then one large
job (`--large-nodes`, default 1,000 nodes, 2,000 ranks, healthy) with a clock off and in event-time order.

Prints cases tried, decisions changed and the time it took; asserts nothing.

    python3 bench/bench_invariance.py [--cases 200] [--max-offset 600] [--seed 1] [--large-nodes 1000]
"""

from __future__ import annotations

import argparse
import random
import time

from gangwatch.evaluation.invariance import BOUND_S, ORDERS, Job, Perturbation, changed


def draw(rnd: random.Random, max_offset: float) -> tuple[Job, Perturbation]:
    nodes = rnd.choice([1, 2, 3, 4, 8, 16])
    fault = rnd.choice([None, "node_loss", "dataloader_hang"] if nodes > 1 else [None, "dataloader_hang"])
    job = Job(nodes, fault, seed=rnd.randint(1, 10_000))
    order = rnd.choice(ORDERS)
    if rnd.random() < 0.1:
        return job, Perturbation("event")
    offset = round(rnd.choice([-1.0, 1.0]) * rnd.uniform(3.0, max_offset), 1)
    at = 0.0 if rnd.random() < 0.5 else round(rnd.uniform(10.0, 115.0), 1)
    return job, Perturbation(order, offset, at)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=200, help="random cases (default 200)")
    ap.add_argument("--max-offset", type=float, default=600.0, help="largest clock offset, s (default 600)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the draws (default 1)")
    ap.add_argument("--large-nodes", type=int, default=1000, help="nodes of the large job (0: none; default 1000)")
    args = ap.parse_args()
    rnd = random.Random(args.seed)
    started, bad = time.monotonic(), []
    within = [0, 0]  # (tried, changed) within the lateness bound (`Perturbation.within_bound`)
    for _ in range(args.cases):
        job, p = draw(rnd, args.max_offset)
        c = changed(job, p)
        if p.within_bound(job):
            within[0] += 1
            within[1] += c is not None
        if c is not None:
            bad.append(c)
            print(f"  changed: {c}", flush=True)
    took = time.monotonic() - started
    print(f"invariance: {args.cases} random cases, {len(bad)} changed a decision "
          f"({within[1]} of {within[0]} within the {BOUND_S:g} s lateness bound); {took:.0f} s, "
          f"{took / max(args.cases, 1):.2f} s a case")
    if args.large_nodes:
        job = Job(args.large_nodes, None, duration_s=150.0)
        started = time.monotonic()
        c = changed(job, Perturbation("event", 45.0, 0.0))
        print(f"large job: {args.large_nodes} nodes ({2 * args.large_nodes} ranks), one clock +45 s, event order: "
              f"{'changed: ' + str(c) if c else 'no decision changed'} ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
