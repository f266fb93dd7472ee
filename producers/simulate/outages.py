"""A seeded fleet outage history: which machines of a fleet went down when, and for how long.

    from gangwatch.producers.simulate.outages import outages
    events = outages(2000, 180, seed=1, rate=0.004, burst_p=0.05, drift=2.0)   # list[NodeEvent]

`machines` machines (`m0000`, `m0001`, ...) over `days` days from `start`. Failures arrive as a Poisson process
whose rate is `rate` machine failures per machine-day, bursts included: with probability `burst_p` an arrival is a
correlated event (a switch, a rack, a bad driver rollout) that takes `burst_min`..`burst_max` neighbouring machines
at once (uniform), each repaired in its own time; otherwise it takes one machine. Drift: from `drift_from` of the
span on (a fraction, default the last third) the rate is multiplied by `drift`; `trend` multiplies it by a factor
going linearly from 1 on the first day to `trend` on the last, and `wander` lets it walk: its logarithm takes a
normal step of spread `wander` every 30 days. A repair lasts a lognormal time of mean `repair_h` hours and log-scale
spread `repair_sigma` (0: always `repair_h`; 1.7 is heavy-tailed: the mean five times the median, set by a few
multi-week repairs), scaled by a factor going linearly from 1 to `repair_trend`. A fraction `open_p` of the failures
carry no end (the repair time was never recorded), as real histories do; a repair still going on at the history's
end has the end `open`. The same arguments always give the same history.

`fleet(seed)` is one of the evaluation fleets `gangwatch spares --evaluate` scores the advisor on: 400 machines
over a year, heavy-tailed repairs, bursts, and a rate and repair times that drift, each seed its own way.
"""

from __future__ import annotations

import math

import numpy as np
from gangwatch.fleet.history import OPEN, NodeEvent, in_order
from gangwatch.producers.simulate.placement import rng

DAY = 86400.0
START = 1767571200.0  # 2026-01-05T00:00:00Z, a Monday


def outages(machines: int, days: float, *, seed: int, rate: float = 0.004, repair_h: float = 24.0,
            repair_sigma: float = 0.5, burst_p: float = 0.0, burst_min: int = 4, burst_max: int = 16,
            drift: float = 1.0, drift_from: float = 2 / 3, trend: float = 1.0, wander: float = 0.0,
            repair_trend: float = 1.0, open_p: float = 0.0, start: float = START) -> list[NodeEvent]:
    """The fleet's failures, sorted by start: one event per machine taken out (a burst is several at one
    instant, with one description). ValueError for an argument out of its range."""
    _check(machines, days, rate, repair_h, repair_sigma, burst_p, burst_min, burst_max, drift, drift_from, open_p)
    if trend <= 0 or wander < 0 or repair_trend <= 0:
        raise ValueError("trend and repair_trend must be > 0 and wander >= 0")
    r = rng(seed, "outages")
    walk = np.cumsum(rng(seed, "outages", "wander").normal(0.0, wander, size=int(days // 30) + 1))
    per_arrival = 1 - burst_p + burst_p * (burst_min + burst_max) / 2  # machines one arrival takes, on average
    width = len(str(machines - 1))
    events: list[NodeEvent] = []
    for day in range(math.ceil(days)):
        length = min(1.0, days - day)
        mid = (day + length / 2) / days  # where in the span (0..1) this day lies
        factor = (drift if mid >= drift_from else 1.0) * (1 + (trend - 1) * mid) * math.exp(walk[day // 30])
        expected = rate * factor * machines * length / per_arrival
        for at in sorted(day + r.uniform(0, length, size=r.poisson(expected))):
            size = int(r.integers(burst_min, burst_max + 1)) if r.random() < burst_p else 1
            first_machine = int(r.integers(0, machines))
            t = start + float(at) * DAY
            what = f"burst: {size} machines at once" if size > 1 else ""
            for k in range(size):
                down_s = _repair_s(r, repair_h, repair_sigma) * (1 + (repair_trend - 1) * mid)
                end = None if r.random() < open_p else t + down_s
                if end is not None and end > start + days * DAY:
                    end = OPEN
                node = f"m{(first_machine + k) % machines:0{width}d}"
                events.append(NodeEvent(start=t, node=node, cls="fail_stop", end=end, description=what))
    return sorted(events, key=in_order)


def fleet(seed: int, wander: float = 0.1) -> list[NodeEvent]:
    """Evaluation fleet `seed`: 400 machines over 365 days, 0.004 failures per machine-day, 2% of arrivals a
    burst of 2 to 8 machines, repairs of median 1.4 days and mean five times that (lognormal, spread 1.7), and
    drift drawn per seed: the rate trending to 0.6..1.6 times its start, walking (spread `wander` a month), repair
    times trending to 0.5..1.5 times theirs; 3% of repairs never recorded."""
    r = rng(seed, "fleet")
    trend, repair_trend = float(r.uniform(0.6, 1.6)), float(r.uniform(0.5, 1.5))
    return outages(400, 365, seed=seed, rate=0.004, repair_h=33.6 * math.exp(1.7 ** 2 / 2), repair_sigma=1.7,
                   burst_p=0.02, burst_min=2, burst_max=8, trend=trend, wander=wander, repair_trend=repair_trend,
                   open_p=0.03)


def _repair_s(r: np.random.Generator, mean_h: float, sigma: float) -> float:
    """A lognormal repair time of mean `mean_h` hours (exp(mu + sigma^2 / 2) = mean)."""
    if sigma == 0:
        return mean_h * 3600.0
    mu = math.log(mean_h * 3600.0) - sigma * sigma / 2
    return float(r.lognormal(mu, sigma))


def _check(machines: int, days: float, rate: float, repair_h: float, repair_sigma: float, burst_p: float,
           burst_min: int, burst_max: int, drift: float, drift_from: float, open_p: float) -> None:
    if machines < 1 or days <= 0:
        raise ValueError(f"want at least 1 machine over more than 0 days, got {machines} over {days}")
    if rate < 0 or repair_h <= 0 or repair_sigma < 0 or drift < 0:
        raise ValueError("rate, drift and repair_sigma must be >= 0 and repair_h > 0")
    if not (0 <= burst_p <= 1 and 0 <= open_p <= 1 and 0 <= drift_from <= 1):
        raise ValueError("burst_p, open_p and drift_from are fractions: between 0 and 1")
    if not 1 <= burst_min <= burst_max <= machines:
        raise ValueError(f"want 1 <= burst_min <= burst_max <= machines, got {burst_min}..{burst_max} of {machines}")
