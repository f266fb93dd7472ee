"""`gangwatch spares --evaluate`: the spares advisor scored on generated fleets, as a real history would be.

Each seed is an evaluation fleet (`producers/simulate/outages.fleet`: 400 machines over a year, heavy-tailed
repairs, bursts, a rate and repair times that drift). The advice for the whole fleet is made with what was known
at 60% of the history (`fleet.spares.holdout`, its estimator chosen by backtests on that part alone), and scored
on the remaining 40%: the share of those hours it covered, and its size over the smallest pool that would have
covered `percentile` of them (known only afterwards). Every estimator is scored the same way beside it.

Floors (`FLOORS`): the advice covers the percentile in every seed, costs at most 1.5x the pool that sufficed
(median over seeds) and at most 2x in the worst seed. `check` lists what falls below; the command exits 7 then.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from gangwatch.fleet import spares
from gangwatch.producers.simulate.outages import fleet

SEEDS = tuple(range(10))
SPLIT = 0.6
PERCENTILE = 0.99
FLOORS = {"coverage_min": PERCENTILE, "cost_median": 1.5, "cost_max": 2.0}


@dataclass(frozen=True)
class Seed:
    seed: int
    holdout: spares.Holdout


def evaluate(seeds: Iterable[int] | None = None, *, wander: float = 0.1) -> list[Seed]:
    """Each seed's holdout (default `SEEDS`): the advice for the whole fleet made at `SPLIT`, scored on the rest."""
    out = []
    for seed in SEEDS if seeds is None else seeds:
        events = fleet(seed, wander=wander)
        machines = len({e.node for e in events})
        out.append(Seed(seed, spares.holdout(events, machines, split=SPLIT, percentile=PERCENTILE)))
    return out


def summary(results: list[Seed]) -> dict[str, float]:
    """The advice's worst coverage, median and worst cost over the seeds."""
    return {"coverage_min": min(r.holdout.coverage for r in results),
            "cost_median": statistics.median(r.holdout.cost for r in results),
            "cost_max": max(r.holdout.cost for r in results)}


def check(results: list[Seed]) -> list[str]:
    """What falls below a floor, one line each (empty: all met)."""
    got, out = summary(results), []
    if got["coverage_min"] < FLOORS["coverage_min"]:
        bad = [r.seed for r in results if r.holdout.coverage < PERCENTILE]
        out.append(f"coverage {got['coverage_min']:.4f} < {PERCENTILE} in seeds {bad}")
    for key in ("cost_median", "cost_max"):
        if got[key] > FLOORS[key]:
            out.append(f"{key.replace('_', ' ')} {got[key]:.2f}x > {FLOORS[key]}x")
    return out


def table(results: list[Seed]) -> list[str]:
    """Per seed, the advice; then per estimator over the seeds: lowest and mean coverage, median and worst cost."""
    lines = [f"{'seed':>4} {'advised by':<18} {'spares':>6} {'needed':>6} {'coverage':>8} {'cost':>5}  "
             "backtest coverage, cost"]
    for r in results:
        h, c = r.holdout, r.holdout.advice.chosen
        lines.append(f"{r.seed:>4} {h.advice.estimator:<18} {h.advice.spares:>6} {h.needed:>6} {h.coverage:>8.4f} "
                     f"{h.cost:>5.2f}  {c.coverage:.4f}, {c.cost:.2f}")
    got = summary(results)
    lines += [f"advice: lowest coverage {got['coverage_min']:.4f}, cost median {got['cost_median']:.2f}x, worst "
              f"{got['cost_max']:.2f}x (floors: >= {FLOORS['coverage_min']}, <= {FLOORS['cost_median']}x, <= "
              f"{FLOORS['cost_max']}x)", "",
              f"{'estimator':<18} {'cov_min':>7} {'cov_mean':>8} {'below':>5} {'cost_med':>8} {'cost_max':>8}"]
    for i, name in enumerate(spares.ESTIMATORS):
        folds = [r.holdout.estimators[i] for r in results]
        lines.append(f"{name:<18} {min(f.coverage for f in folds):>7.4f} "
                     f"{statistics.mean(f.coverage for f in folds):>8.4f} "
                     f"{sum(f.coverage < PERCENTILE for f in folds):>5} "
                     f"{statistics.median(f.cost for f in folds):>8.2f} {max(f.cost for f in folds):>8.2f}")
    return lines
