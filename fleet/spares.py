"""The warm-standby pool a job needs, advised by the estimator that did best in backtests on the history itself.

A machine that fails is swapped for a warm spare in seconds and goes to repair; it is back in the pool when
repaired. So the spares in use at an instant are the job's machines in repair at that instant, and the pool to
hold is the smallest that covers a share `percentile` (0.99) of the hours: the P99 of machines down at once.

**Outages.** Each event of the history takes its machine out from `start` to `end`; an event without an end
takes the repair time given, the *replacement horizon* (`horizon_s`); an end of `open` (math.inf) is down to
the history's end (and, known at an instant, to that instant at least); one that ends where it starts took
nothing out. Overlapping outages of one machine are one outage (a machine in repair cannot fail again).

**The job in a larger fleet.** A job of M machines placed anywhere in a fleet of F sees each machine down with
probability q = M / F: when n of the fleet's machines are down, the job's are Binomial(n, q) (binomial
thinning). A job packed into racks sees bursts whole, not thinned: size it as its own fleet then (F = M).

**Estimators.** Each maps what was known at an instant t to a pool for the next `hold_s`:

- `empirical D`: the P-quantile of the machines down at once over the trailing D days (or the whole history),
  time-weighted and thinned to the job. It sees repair times as they were and bursts as they overlapped, and
  only the recent past when D is short.
- `compound D`: the machines down over the next `hold_s`, modelled. Failures arrive as bursts (starts within
  `BURST_GAP_S` of each other are one arrival) at the rate of the trailing D days, a burst's size drawn from the
  history's; each machine stays down for a time drawn from the repair times' Kaplan-Meier distribution (repairs
  still open at t are censored there, not given the horizon). At a time u after t, the machines down are those
  down at t still in repair (each with probability S(a + u) / S(a), a its repair's age) plus the new arrivals
  still in repair: compound Poisson of mean rate x integral of S from 0 to u. So a repair time that varies counts
  as a distribution (a three-week repair that begins in the last week of the hold adds a week, not three), and
  the machines now in long repairs count for as long as such repairs last. The pool is the smallest whose
  coverage, averaged over the hold, reaches P.
- `compound peak`: the same with the highest of the 30-day, 90-day and whole-history rates: a rate that may
  drift back up.
- `... +`: each of those at a stricter level, 1 - (1 - P) / 4, a margin that the backtest prices.

**Chosen by its own backtest.** Rolling origins: at each of up to `FOLDS` instants after the first quarter of
the history (at least `MIN_TRAIN_S` in), every estimator is fitted on what was known then (an outage still
open had no end yet) and scored on the next `hold_s` (to the history's end at most): the share of those hours
the job's machines down at once were <= its pool, in expectation over the job's placement, and the pool that
would have sufficed (the smallest covering P of those hours, known only afterwards). An estimator *met the
target* when its coverage over all the folds' hours together reached P and no fold fell below
1 - 2 (1 - P) (0.98 for P99): a miss in the mean, or a bad quarter, is a miss. The advice is the estimator that
met the target at the least cost (the mean over folds of its pool over the pool that sufficed, that pool
counted as at least 1), fitted on the whole history; if none met it, the one that came closest (highest
coverage), and the advice says the target was not met.

`holdout` scores the whole procedure once more out of sample: the advice made with what was known at a split
(its own estimator chosen by backtests on the part before), on the rest.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from gangwatch.fleet.history import NodeEvent

DAY = 86400.0
HOUR = 3600.0
BURST_GAP_S = HOUR  # failures starting within this of the previous one are one arrival (a burst)
FOLDS = 8  # rolling origins of the backtest, at most
MIN_TRAIN_S = 30 * DAY  # the first origin is at least this far into the history ...
MIN_TRAIN_SHARE = 0.25  # ... and at least this share of it
MIN_TEST_S = 7 * DAY  # the last origin leaves at least this much to score on
RATE_NODES = 7  # rates a drifting compound model averages over (Gauss-Hermite nodes)
DRIFT_BLOCK_S = 30 * DAY  # the blocks whose counts measure how the rate drifts
GRID = 24  # instants of the hold at which the compound model's distribution is computed
_EPS = 1e-12  # a CDF within this of the percentile reaches it (sums of floats)


@dataclass(frozen=True)
class Outage:
    """One machine out of service from `start` to `end` (merged: one machine's outages never overlap). `known`:
    the end was recorded (or is still open), not the horizon taken for a missing one."""

    start: float
    end: float
    node: str
    known: bool = True


# --- outages and the fleet's machines down at once --------------------------------------------------------------


def outages(events: Iterable[NodeEvent], horizon_s: float) -> list[Outage]:
    """Every machine's outages, an event without end taking `horizon_s`, overlapping ones merged, empty ones
    dropped; sorted by start. An open end stays infinite."""
    by_node: dict[str, list[tuple[float, float, bool]]] = defaultdict(list)
    for e in events:
        end = e.start + horizon_s if e.end is None else e.end
        if end > e.start:
            by_node[e.node].append((e.start, end, e.end is not None))
    out = []
    for node, spans in by_node.items():
        spans.sort()
        a, b, known = spans[0]
        for s, t, k in spans[1:]:
            if s <= b:
                if t > b:
                    b, known = t, k
            else:
                out.append(Outage(a, b, node, known))
                a, b, known = s, t, k
        out.append(Outage(a, b, node, known))
    return sorted(out, key=lambda o: (o.start, o.node))


def known_at(spans: Iterable[Outage], at: float) -> list[Outage]:
    """The outages as known at `at`: those begun by then; one that ended after it was still open then (one
    without a recorded end keeps the horizon's)."""
    return [o if o.end <= at or not o.known else replace(o, end=math.inf) for o in spans if o.start <= at]


def levels(spans: Sequence[Outage], since: float, until: float) -> dict[int, float]:
    """Seconds of [since, until) the fleet spent with n machines down, by n (a sweep over the spans' ends)."""
    inside = [o for o in spans if o.start < until and o.end > since]
    edges = sorted([(max(o.start, since), 1) for o in inside] + [(min(o.end, until), -1) for o in inside])
    out: dict[int, float] = defaultdict(float)
    n, t = 0, since
    for at, step in edges:
        if at > t:
            out[n] += at - t
            t = at
        n += step
    if until > t:
        out[n] += until - t
    return dict(out)


# --- distributions ---------------------------------------------------------------------------------------------


def _binomial_pmf(n: int, q: float) -> list[float]:
    """P(Binomial(n, q) = k) for k = 0..n, by the ratio of successive terms (in logs: no overflow)."""
    if q >= 1:
        return [0.0] * n + [1.0]
    if q <= 0:
        return [1.0] + [0.0] * n
    log_p, odds = n * math.log1p(-q), math.log(q) - math.log1p(-q)
    out = [math.exp(log_p)]
    for k in range(n):
        log_p += math.log((n - k) / (k + 1)) + odds
        out.append(math.exp(log_p))
    return out


def _first_reaching(cdf: Iterable[float], p: float) -> int:
    """The first index whose value reaches p (the last index when none does)."""
    s = 0
    for s, x in enumerate(cdf):
        if x >= p - _EPS:
            return s
    return s


def mixture_quantile(time_at: dict[int, float], q: float, p: float) -> int:
    """The smallest s with P(job down <= s) >= p, the job's count being Binomial(n, q) for the share of time
    the fleet had n down."""
    total = sum(time_at.values())
    if total <= 0:
        return 0
    pmf = np.zeros(max(time_at) + 1)
    for n, tau in time_at.items():
        pmf[:n + 1] += tau / total * np.array(_binomial_pmf(n, q))
    return _first_reaching(np.cumsum(pmf), p)


def covered(time_at: dict[int, float], q: float, spares: int) -> float:
    """The share of the time the job's machines down at once were <= `spares` (Binomial(n, q) for n down)."""
    total = sum(time_at.values())
    if total <= 0:
        return 1.0
    return sum(tau * min(1.0, sum(_binomial_pmf(n, q)[:spares + 1])) for n, tau in time_at.items()) / total


@dataclass(frozen=True)
class Repairs:
    """The Kaplan-Meier distribution of repair times: S(x) = P(repair > x), a step function that drops at the
    `times` of finished repairs (`survival` just after each); past the last one it stays where it is."""

    times: tuple[float, ...]
    survival: tuple[float, ...]
    finished: int
    censored: int

    def s(self, x: np.ndarray) -> np.ndarray:
        """S at each of `x` (seconds)."""
        surv = np.concatenate(([1.0], self.survival))
        return surv[np.searchsorted(np.array(self.times), x, side="right")]

    def area(self, x: np.ndarray) -> np.ndarray:
        """The integral of S from 0 to each of `x`: the mean time a repair begun x ago has spent down so far."""
        times = np.concatenate(([0.0], self.times))
        surv = np.concatenate(([1.0], self.survival))
        cum = np.concatenate(([0.0], np.cumsum(surv[:-1] * np.diff(times))))
        i = np.searchsorted(times, x, side="right") - 1
        return cum[i] + surv[i] * (x - times[i])

    @property
    def median_s(self) -> float:
        """The median repair (the first time S drops to 1/2 or below; the last finished one if it never does)."""
        for t, s in zip(self.times, self.survival, strict=True):
            if s <= 0.5:
                return t
        return self.times[-1] if self.times else 0.0


def repairs(spans: Iterable[Outage], at: float) -> Repairs:
    """The repair-time distribution of the outages known at `at` with a recorded end: those ended count as they
    lasted, those still open as lasting at least until `at` (censored); ends that took the horizon are left out."""
    done: dict[float, int] = defaultdict(int)
    lasted = []
    for o in spans:
        if not o.known:
            continue
        if o.end <= at:
            done[o.end - o.start] += 1
        lasted.append(min(o.end, at) - o.start)
    lasted.sort()
    times, surv, s, i = [], [], 1.0, 0
    for t in sorted(done):
        while i < len(lasted) and lasted[i] < t:
            i += 1
        at_risk = len(lasted) - i
        s *= 1 - done[t] / at_risk
        times.append(t)
        surv.append(s)
    finished = sum(done.values())
    return Repairs(tuple(times), tuple(surv), finished, len(lasted) - finished)


def arrivals(spans: Sequence[Outage]) -> list[tuple[float, int]]:
    """The failures as arrivals: (start, machines) with starts within `BURST_GAP_S` of the previous one joined."""
    out: list[tuple[float, int]] = []
    last = -math.inf
    for o in sorted(spans, key=lambda o: o.start):
        if o.start - last <= BURST_GAP_S and out:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((o.start, 1))
        last = o.start
    return out


# --- estimators ------------------------------------------------------------------------------------------------


class Known:
    """What an estimator reads: the outages known at `at` (ends after it open), since `since`, for a job of
    share `q` of the fleet, to be held for `hold_s`; what several estimators compute from them is kept."""

    def __init__(self, spans: Sequence[Outage], since: float, at: float, q: float, hold_s: float,
                 percentile: float) -> None:
        self.spans, self.since, self.at, self.q, self.hold_s, self.percentile = spans, since, at, q, hold_s, percentile
        self._levels: dict[float | None, dict[int, float]] = {}
        self._coverage: dict[float, np.ndarray] = {}
        self.arrivals = arrivals(spans)
        self.repairs = repairs(spans, at)

    def levels(self, days: float | None) -> dict[int, float]:
        if days not in self._levels:
            self._levels[days] = levels(self.spans, self.trailing(days), self.at)
        return self._levels[days]

    def trailing(self, days: float | None) -> float:
        """The start of the trailing window of `days` (None: the whole history)."""
        return self.since if days is None else max(self.since, self.at - days * DAY)

    def rate(self, days: float | None) -> float:
        """Arrivals (bursts counted once) per second over the trailing `days`."""
        since = self.trailing(days)
        return sum(since <= t < self.at for t, _ in self.arrivals) / max(self.at - since, HOUR)

    def coverage(self, arrival_rate: float, spread: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
        """The compound model's coverage of a pool of s, by s, averaged over the hold (module docstring); with a
        `spread` (variance now, variance added a day), over a rate log-normal about `arrival_rate`, too."""
        key = (arrival_rate, *spread)
        if key not in self._coverage:
            self._coverage[key] = _compound(self, arrival_rate, spread)
        return self._coverage[key]

    def drift(self) -> float:
        """How far the log of the arrival rate moves a day, as a variance: the mean squared change of the log
        count between consecutive `DRIFT_BLOCK_S` blocks, less what Poisson counts alone would give, per day
        (0 with fewer than three blocks or no excess)."""
        n = int((self.at - self.since) // DRIFT_BLOCK_S)
        if n < 3:
            return 0.0
        counts = np.zeros(n)
        for t, _ in self.arrivals:
            i = int((self.at - t) // DRIFT_BLOCK_S)
            if 0 <= i < n:
                counts[i] += 1
        counts = np.maximum(counts, 0.5)
        steps = np.diff(np.log(counts))
        noise = (1 / counts[1:] + 1 / counts[:-1]).mean()
        return max(0.0, float((steps ** 2).mean() - noise)) / (DRIFT_BLOCK_S / DAY)


def empirical(k: Known, days: float | None, p: float) -> int:
    """The p-quantile of the job's machines down at once over the trailing `days`."""
    return mixture_quantile(k.levels(days), k.q, p)


def compound(k: Known, arrival_rate: float, p: float, spread: tuple[float, float] = (0.0, 0.0)) -> int:
    """The smallest pool whose coverage over the next `hold_s`, averaged over `GRID` instants, reaches p."""
    if not k.arrivals or not k.repairs.times:
        return empirical(k, None, p)
    return _first_reaching(k.coverage(arrival_rate, spread), p)


def drifting(k: Known, days: float, p: float) -> int:
    """`compound` with the rate of the trailing `days` drifting as it did: log-normal about it, of variance the
    count's own (1 / arrivals) plus the history's drift a day for each day from the window's middle."""
    since = k.trailing(days)
    count = sum(since <= t < k.at for t, _ in k.arrivals)
    if not count:
        return compound(k, k.rate(days), p)
    drift = k.drift()
    return compound(k, k.rate(days), p, (1 / count + drift * (k.at - since) / 2 / DAY, drift))


def _compound(k: Known, arrival_rate: float, spread: tuple[float, float] = (0.0, 0.0)) -> np.ndarray:
    """P(the job's machines down <= s), by s, averaged over `GRID` instants of the hold: the machines down at
    `at` still in repair (each with S(age + u) / S(age); a horizon end as it is) plus the arrivals since, at
    `arrival_rate`, still in repair: compound Poisson of mean rate x integral of S to u, a burst's size drawn
    from the history's and thinned to the job. Computed with discrete Fourier transforms, on a support wide
    enough that what wraps around is negligible."""
    seen = np.bincount([n for _, n in k.arrivals]).astype(float) / len(k.arrivals)
    sizes = np.zeros(len(seen))
    for b in np.nonzero(seen)[0]:  # a burst of b machines brings Binomial(b, q) of the job's
        sizes[:b + 1] += seen[b] * np.array(_binomial_pmf(int(b), k.q))
    down = [o for o in k.spans if o.end > k.at]
    age = np.array([k.at - o.start for o in down if o.known])
    left = np.array([o.end - k.at for o in down if not o.known])
    u = (np.arange(GRID) + 0.5) / GRID * k.hold_s
    mean_new = arrival_rate * k.repairs.area(u)  # by instant
    if spread != (0.0, 0.0):  # each instant at each of RATE_NODES rates (Gauss-Hermite), mean-preserving
        z, w = np.polynomial.hermite_e.hermegauss(RATE_NODES)
        sd = np.sqrt(spread[0] + spread[1] * u / DAY)
        mean_new = (mean_new[:, None] * np.exp(sd[:, None] * z[None, :] - sd[:, None] ** 2 / 2)).ravel()
        weights = np.tile(w / w.sum(), GRID) / GRID
        u = np.repeat(u, RATE_NODES)
    else:
        weights = np.full(GRID, 1 / GRID)
    mean_size = float(np.dot(np.arange(len(sizes)), sizes))
    square = float(np.dot(np.arange(len(sizes)) ** 2, sizes))
    top = float(mean_new.max())
    width = 1 << math.ceil(math.log2(len(down) + top * mean_size + 12 * math.sqrt(top * square) + 4 * len(sizes) + 16))
    s_age = k.repairs.s(age)
    still = k.q * np.divide(k.repairs.s(age[None, :] + u[:, None]), s_age[None, :],
                            out=np.ones((len(u), len(age))), where=s_age[None, :] > 0)
    still = np.concatenate((still, k.q * (left[None, :] > u[:, None])), axis=1)  # (GRID, machines down)
    padded = np.zeros(width)
    padded[:len(sizes)] = sizes
    spectrum = np.exp(mean_new[:, None] * (np.fft.rfft(padded)[None, :] - 1))  # the new arrivals
    phase = np.exp(-2j * np.pi * np.arange(width // 2 + 1) / width)
    for j in range(still.shape[1]):  # each machine now down: (1 - p) + p z
        spectrum *= 1 - still[:, j:j + 1] + still[:, j:j + 1] * phase[None, :]
    pmf = np.clip(np.fft.irfft(spectrum, n=width, axis=1), 0.0, None)
    return weights @ np.cumsum(pmf, axis=1)


STRICTER = (1, 3, 10, 30, 100)  # the levels of the model estimators: the misses allowed divided by these


def _family(name: str, fit: Callable[[Known, float], int]) -> dict[str, Estimator]:
    """`fit` at each level of `STRICTER`, named `name`, `name +3`, `name +10`, ..."""
    return {f"{name}{f' +{n}' if n > 1 else ''}": lambda k, n=n: fit(k, 1 - (1 - k.percentile) / n)
            for n in STRICTER}


Estimator = Callable[[Known], int]
FAMILIES: dict[str, dict[str, Estimator]] = {
    # at the target only: a stricter quantile of a few thousand hours is their few worst, not an estimate
    **{f"empirical {d or 'all'}{'d' if d else ''}": {f"empirical {d or 'all'}{'d' if d else ''}":
                                                     lambda k, d=d: empirical(k, d, k.percentile)}
       for d in (30, 90, None)},
    **{f"compound {d or 'all'}{'d' if d else ''}": _family(f"compound {d or 'all'}{'d' if d else ''}",
                                                           lambda k, p, d=d: compound(k, k.rate(d), p))
       for d in (30, 90, None)},
    "compound peak": _family("compound peak", lambda k, p: compound(k, max(k.rate(d) for d in (30, 90, None)), p)),
    **{f"drifting {d}d": _family(f"drifting {d}d", lambda k, p, d=d: drifting(k, d, p)) for d in (30, 90)},
}
ESTIMATORS: dict[str, Estimator] = {name: fit for family in FAMILIES.values() for name, fit in family.items()}


def stricter(name: str) -> str:
    """The estimator of `name`'s family one level stricter (itself at the strictest)."""
    family = next(list(f) for f in FAMILIES.values() if name in f)
    return family[min(family.index(name) + 1, len(family) - 1)]


# --- the backtest and the advice -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fold:
    """One estimator at one origin: its pool, the share of the next hours it covered, and the pool that would
    have sufficed (the smallest covering the percentile of those hours)."""

    at: float
    until: float
    spares: int
    coverage: float
    needed: int

    @property
    def cost(self) -> float:
        """The pool over the pool that sufficed (counted as at least 1)."""
        return self.spares / max(self.needed, 1)


@dataclass(frozen=True)
class Trial:
    """An estimator's rolling-origin backtest."""

    estimator: str
    folds: tuple[Fold, ...]
    percentile: float

    @property
    def coverage(self) -> float:
        """The share of all the folds' hours covered."""
        hours = sum(f.until - f.at for f in self.folds)
        return sum(f.coverage * (f.until - f.at) for f in self.folds) / hours if hours else 1.0

    @property
    def worst(self) -> float:
        return min((f.coverage for f in self.folds), default=1.0)

    @property
    def cost(self) -> float:
        """The mean over folds of the pool over the pool that sufficed."""
        return sum(f.cost for f in self.folds) / len(self.folds) if self.folds else math.inf

    @property
    def met(self) -> bool:
        """Whether it met the target: the percentile over all the hours, and no fold below twice the misses."""
        return bool(self.folds) and self.coverage >= self.percentile - _EPS \
            and self.worst >= 1 - 2 * (1 - self.percentile) - _EPS

    def to_dict(self) -> dict[str, object]:
        return {"estimator": self.estimator, "coverage": self.coverage, "worst": self.worst, "cost": self.cost,
                "met": self.met, "folds": [asdict(f) for f in self.folds]}


@dataclass(frozen=True)
class Advice:
    """The spares to hold, which estimator gave them, and its backtest (every figure a reader needs to redo it)."""

    spares: int
    estimator: str  # the one advised: `cheapest` one level stricter
    cheapest: str  # the estimator that met the target at the least cost in the backtest
    met: bool  # whether `cheapest` met the target in the backtest (else it came closest)
    percentile: float
    job_machines: int
    fleet_machines: int
    fleet_from: str  # "given", "seen" (machines named in the history) or "job" (the history names fewer)
    failures: int  # outages begun in [since, until)
    arrivals: int  # of them, as arrivals (a burst once)
    unknown_ends: int  # outages without a recorded end (they took the horizon)
    still_open: int  # outages still open at `until`
    since: float
    until: float
    hold_s: float
    horizon_s: float
    median_repair_s: float
    rate: float  # failures per machine-day over the whole history
    rate_30d: float  # ... over the last 30 days
    trials: tuple[Trial, ...] = field(default=())

    @property
    def chosen(self) -> Trial:
        return next(t for t in self.trials if t.estimator == self.estimator)

    def to_dict(self) -> dict[str, object]:
        out = {k: v for k, v in asdict(self).items() if k != "trials"}
        chosen = self.chosen
        return {**out, "backtest_coverage": chosen.coverage, "backtest_cost": chosen.cost,
                "trials": [t.to_dict() for t in self.trials]}

    def explain(self, iso: Callable[[float], str] = lambda t: f"{t:.0f}") -> list[str]:
        """What a person reads: the advice, its backtest, every estimator's, and the advice over the history."""
        fleet = {"given": "given", "seen": "machines named in the history: pass the real size if some never "
                 "failed", "job": "the history names fewer machines than the job: read as the job's own"}
        p = f"P{self.percentile * 100:g}"
        c = self.chosen
        met = "met the target" if self.met else f"NO estimator met the target {self.percentile:g}; the closest"
        lines = [
            f"spares {self.spares} for a job of {self.job_machines:,} machines: the {p} of its machines down at "
            f"once over the next {self.hold_s / DAY:g} days, by `{self.estimator}`",
            f"  backtest: coverage {c.coverage:.4f} (worst fold {c.worst:.4f}), cost {c.cost:.2f}x the pool that "
            f"would have sufficed, over {len(c.folds)} fold{'s' * (len(c.folds) != 1)}; {met} at the least cost",
            f"  fleet {self.fleet_machines:,} machines ({fleet[self.fleet_from]}); {self.failures:,} outages "
            f"({self.arrivals:,} arrivals, bursts once) over {(self.until - self.since) / DAY:.1f} days, "
            f"{self.unknown_ends:,} without an end took the {self.horizon_s / 3600:g} h horizon, "
            f"{self.still_open:,} still open; median repair {self.median_repair_s / 3600:.1f} h",
            f"  rate {self.rate:.5f} failures/machine-day over the whole history, {self.rate_30d:.5f} over the "
            "last 30 days",
            "",
            f"{'estimator':<18} {'coverage':>8} {'worst':>7} {'cost':>6}  met",
        ]
        for t in sorted(self.trials, key=lambda t: (not t.met, t.cost)):
            lines.append(f"{t.estimator:<18} {t.coverage:>8.4f} {t.worst:>7.4f} {t.cost:>6.2f}  "
                         f"{'yes' if t.met else 'no'}{'  <- advised' if t is c else ''}")
        lines += ["", f"the advice over the history (`{self.estimator}` at each origin):",
                  f"{'fitted at':<12} {'spares':>6} {'needed':>6} {'coverage':>8}  scored until"]
        for f in c.folds:
            lines.append(f"{iso(f.at):<12} {f.spares:>6} {f.needed:>6} {f.coverage:>8.4f}  {iso(f.until)}")
        lines.append(f"{iso(self.until):<12} {self.spares:>6} {'-':>6} {'-':>8}  (now)")
        return lines


def _check(job_machines: int, fleet_machines: int | None, percentile: float, horizon_s: float,
           hold_s: float) -> None:
    if job_machines < 1:
        raise ValueError(f"the job's size must be at least 1 machine, got {job_machines}")
    if fleet_machines is not None and fleet_machines < job_machines:
        raise ValueError(f"the fleet ({fleet_machines} machines) is smaller than the job ({job_machines}): "
                         "give the fleet's real size")
    if not 0 < percentile < 1:
        raise ValueError(f"the percentile is a fraction between 0 and 1 (e.g. 0.99), got {percentile}")
    if not (horizon_s > 0 and hold_s > 0 and math.isfinite(horizon_s) and math.isfinite(hold_s)):
        raise ValueError("the repair horizon and the hold must be positive and finite")


def _fleet(events: Sequence[NodeEvent], job_machines: int, fleet_machines: int | None) -> tuple[int, str]:
    if fleet_machines is not None:
        return fleet_machines, "given"
    seen = len({e.node for e in events})
    return (seen, "seen") if seen >= job_machines else (job_machines, "job")


def origins(since: float, until: float, hold_s: float) -> list[float]:
    """The backtest's origins: up to `FOLDS`, evenly from a quarter of the history (at least `MIN_TRAIN_S` in) to
    a whole hold before its end (or to the first, scored on what is left when that is at least `MIN_TEST_S`)."""
    first = since + max(MIN_TRAIN_S, MIN_TRAIN_SHARE * (until - since))
    if until - first < MIN_TEST_S:
        return []
    last = max(first, until - hold_s)
    n = min(FOLDS, 1 + int((last - first) // MIN_TEST_S))
    return [first + (last - first) * i / max(n - 1, 1) for i in range(n)]


def trials(spans: Sequence[Outage], since: float, until: float, q: float, *, percentile: float, hold_s: float,
           names: Iterable[str] | None = None) -> list[Trial]:
    """Every estimator's rolling-origin backtest over [since, until) (`origins`), each fold scored on the next
    `hold_s` (to `until` at most) against what happened."""
    names = list(ESTIMATORS if names is None else names)
    folds: dict[str, list[Fold]] = {n: [] for n in names}
    for at in origins(since, until, hold_s):
        end = min(until, at + hold_s)
        seen = levels(spans, at, end)
        needed = mixture_quantile(seen, q, percentile)
        k = Known(known_at(spans, at), since, at, q, hold_s, percentile)
        for n in names:
            s = ESTIMATORS[n](k)
            folds[n].append(Fold(at, end, s, covered(seen, q, s), needed))
    return [Trial(n, tuple(folds[n]), percentile) for n in names]


def choose(tried: Sequence[Trial]) -> tuple[Trial, Trial]:
    """(the estimator that met the target at the least cost, else the one with the highest coverage; the one
    advised: the same one level stricter, a margin for having picked the cheapest of many that passed)."""
    met = [t for t in tried if t.met]
    best = min(met, key=lambda t: t.cost) if met else max(tried, key=lambda t: (t.coverage, -t.cost))
    by_name = {t.estimator: t for t in tried}
    return best, by_name.get(stricter(best.estimator), best)


def advise(events: Sequence[NodeEvent], job_machines: int, *, fleet_machines: int | None = None,
           percentile: float = 0.99, horizon_s: float = DAY, hold_s: float = 90 * DAY,
           since: float | None = None, until: float | None = None) -> Advice:
    """The spares for a job of `job_machines`, for the next `hold_s`, from the outages of `events` begun in
    [since, until] (default: the history's first start to its last start or end), by the estimator its own
    backtest chose; `fleet_machines` default: the machines the history names (the job's size if fewer).
    ValueError, one line, for a bad value, a history with no outage or one too short to backtest."""
    _check(job_machines, fleet_machines, percentile, horizon_s, hold_s)
    fleet, fleet_from = _fleet(events, job_machines, fleet_machines)
    since = min((e.start for e in events), default=0.0) if since is None else since
    until = history_end(events) if until is None else until
    kept = [e for e in events if since <= e.start <= until]
    spans = known_at(outages(kept, horizon_s), until)
    if not spans or until <= since:
        raise ValueError("no outage in the history (no event that took a machine out between its first and last "
                         "start): nothing to size the pool from")
    if not origins(since, until, hold_s):
        raise ValueError(f"the history spans {(until - since) / DAY:.1f} days: too short to backtest an estimator "
                         f"(want at least {(MIN_TRAIN_S + MIN_TEST_S) / DAY:g} days)")
    q = job_machines / fleet
    tried = trials(spans, since, until, q, percentile=percentile, hold_s=hold_s)
    cheapest, best = choose(tried)
    now = Known(spans, since, until, q, hold_s, percentile)
    recent = max(since, until - 30 * DAY)
    return Advice(spares=ESTIMATORS[best.estimator](now), estimator=best.estimator, cheapest=cheapest.estimator,
                  met=cheapest.met,
                  percentile=percentile, job_machines=job_machines, fleet_machines=fleet, fleet_from=fleet_from,
                  failures=len(spans), arrivals=len(arrivals(spans)), unknown_ends=sum(not o.known for o in spans),
                  still_open=sum(o.end == math.inf for o in spans), since=since, until=until, hold_s=hold_s,
                  horizon_s=horizon_s, median_repair_s=repairs(spans, until).median_s,
                  rate=len(spans) / fleet / ((until - since) / DAY),
                  rate_30d=sum(o.start >= recent for o in spans) / fleet / ((until - recent) / DAY),
                  trials=tuple(tried))


def history_end(events: Iterable[NodeEvent]) -> float:
    """Where a history ends: its last start or recorded end."""
    return max((t for e in events for t in (e.start, e.end) if t is not None and t != math.inf), default=0.0)


@dataclass(frozen=True)
class Holdout:
    """The advice made with what was known at `at`, scored on [`at`, `until`): coverage, and the pool that would
    have sufficed; `estimators`: each estimator's own pool and coverage there, for comparison."""

    advice: Advice
    at: float
    until: float
    coverage: float
    needed: int
    estimators: tuple[Fold, ...]

    @property
    def cost(self) -> float:
        return self.advice.spares / max(self.needed, 1)

    def to_dict(self) -> dict[str, object]:
        return {"at": self.at, "until": self.until, "spares": self.advice.spares, "estimator": self.advice.estimator,
                "coverage": self.coverage, "needed": self.needed, "cost": self.cost,
                "estimators": {n: asdict(f) for n, f in zip(ESTIMATORS, self.estimators, strict=True)}}

    def explain(self, iso: Callable[[float], str] = lambda t: f"{t:.0f}") -> list[str]:
        return [f"holdout: advised at {iso(self.at)} with what was known then: spares {self.advice.spares} by "
                f"`{self.advice.estimator}`; on the {(self.until - self.at) / DAY:.1f} days after, coverage "
                f"{self.coverage:.4f} against the target {self.advice.percentile:g}; the pool that would have "
                f"sufficed {self.needed}, so {self.cost:.2f}x"]


def holdout(events: Sequence[NodeEvent], job_machines: int, *, split: float = 0.6,
            fleet_machines: int | None = None, percentile: float = 0.99, horizon_s: float = DAY,
            hold_s: float = 90 * DAY, since: float | None = None, until: float | None = None) -> Holdout:
    """Advise with what was known at since + split * span (an outage still open then had no end yet), and score
    that on the rest. The fleet's size is `fleet_machines`, else the machines the whole history names."""
    if not 0 < split < 1:
        raise ValueError(f"the split is the fraction of the history to fit on, between 0 and 1, got {split}")
    _check(job_machines, fleet_machines, percentile, horizon_s, hold_s)
    fleet, fleet_from = _fleet(events, job_machines, fleet_machines)
    since = min((e.start for e in events), default=0.0) if since is None else since
    until = history_end(events) if until is None else until
    at = since + split * (until - since)
    before = [e if e.end is None or e.end <= at else replace(e, end=math.inf) for e in events if e.start < at]
    advice = advise(before, job_machines, fleet_machines=fleet, percentile=percentile, horizon_s=horizon_s,
                    hold_s=hold_s, since=since, until=at)
    spans = known_at(outages([e for e in events if since <= e.start < until], horizon_s), until)
    seen = levels(spans, at, until)
    q = job_machines / fleet
    k = Known(known_at(spans, at), since, at, q, hold_s, percentile)
    each = tuple(Fold(at, until, s, covered(seen, q, s), 0) for s in (ESTIMATORS[n](k) for n in ESTIMATORS))
    needed = mixture_quantile(seen, q, percentile)
    return Holdout(advice=replace(advice, fleet_from=fleet_from), at=at, until=until,
                   coverage=covered(seen, q, advice.spares), needed=needed,
                   estimators=tuple(replace(f, needed=needed) for f in each))
