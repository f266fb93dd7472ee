"""The warm-standby pool a job needs: how many spare machines cover its machines down at once, at a percentile.

A machine that fails is swapped for a warm spare in seconds and goes to repair; it is back in the pool when
repaired. So the spares in use at an instant are the job's machines in repair at that instant, and the pool
to hold is a high percentile (P99 by default) of that count. It is sized from the fleet's failure history.

**Outages.** Each event of the history takes its machine out from `start` to `end`; an event without an end
takes the repair time given, the *replacement horizon* (`horizon_s`); one that ends where it starts took
nothing out. Overlapping outages of one machine are one outage (a machine in repair cannot fail again).

**The job in a larger fleet.** A job of M machines placed anywhere in a fleet of F sees each machine down with
probability q = M / F: when n of the fleet's machines are down, the job's are Binomial(n, q) (binomial
thinning; sampling a random M-machine subset gives the hypergeometric, slightly narrower, so thinning errs
toward more spares). A job packed into racks sees bursts whole, not thinned: size it as its own fleet then
(F = M).

Two estimates, and the advice is the larger:

- **parametric**: failures arrive over-dispersed (a switch or a driver rollout takes several machines at once).
  Count the fleet's failures in consecutive windows of W, the mean repair time, so that a window's count is
  the machines down at its end. The *dispersion index* D = variance / mean of those counts (1: Poisson) is
  pooled within blocks of the trailing window's length, so a rate that drifts is not read as burstiness. The
  rate comes from the trailing window only (it follows drift). The job's count is negative binomial fitted by
  moments: mean q * rate * F * W, dispersion 1 + q (D - 1) (what thinning does to a compound count).
- **empirical**: the time-weighted distribution of the fleet's machines down at once over the trailing window
  (default the last 30 days), thinned to the job: the exact P-quantile of that mixture. It sees what the
  model smooths over (repair times that vary, several bursts overlapping) and follows drift.

The parametric bound needs a long history to see bursts but little to follow the rate; the empirical one has
the drift but sees only the bursts of the last weeks. Taking the larger covers what either sees.

`backtest` scores the advice out of sample: fitted on the history before an instant (an outage still open at
that instant has an unknown end then, and takes the horizon), it measures on the rest the fraction of time the
job's machines down at once were <= spares, in expectation over the job's placement (time spent with n of the
fleet down counts P(Binomial(n, q) <= spares)), to compare with the percentile.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace

from gangwatch.fleet.history import NodeEvent

DAY = 86400.0
_EPS = 1e-12  # a CDF within this of the percentile reaches it (sums of floats)


@dataclass(frozen=True)
class Outage:
    """One machine out of service from `start` to `end` (merged: one machine's outages never overlap)."""

    start: float
    end: float
    node: str


@dataclass(frozen=True)
class Advice:
    """The spares to hold, and how they were computed (every figure a reader needs to redo it)."""

    spares: int
    percentile: float
    job_machines: int
    fleet_machines: int
    fleet_from: str  # "given", "seen" (machines named in the history) or "job" (the history names fewer)
    failures: int  # outages in the history (after merging), begun in [since, until]
    unknown_ends: int  # of them, those that took the horizon
    since: float
    until: float
    window_s: float  # the trailing window actually used (the history may be shorter)
    horizon_s: float
    repair_s: float  # W: the mean outage, the parametric model's window
    rate: float  # failures per machine-day over the trailing window
    rate_all: float  # failures per machine-day over the whole history
    dispersion: float  # D of the fleet's failures per W window (1: Poisson)
    windows: int  # W windows D was measured on
    mean_down: float  # the job's mean machines down at once (parametric)
    parametric: int
    empirical: int

    @property
    def bound(self) -> str:
        """Which estimate the advice is: "parametric", "empirical" or "both" (equal)."""
        if self.parametric == self.empirical:
            return "both"
        return "parametric" if self.parametric > self.empirical else "empirical"

    @property
    def job_dispersion(self) -> float:
        """The dispersion index of the job's count (`thinned`)."""
        return thinned(self.dispersion, self.job_machines / self.fleet_machines)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "bound": self.bound, "job_dispersion": self.job_dispersion}

    def explain(self) -> list[str]:
        """What a person reads: the advice, then each estimate with the figures behind it."""
        fleet = {"given": "given", "seen": "machines named in the history: pass the real size if some never "
                 "failed", "job": "the history names fewer machines than the job: read as the job's own"}
        p = f"P{self.percentile * 100:g}"
        w, days = self.repair_s / 3600, self.window_s / DAY
        return [
            f"spares {self.spares} for a job of {self.job_machines:,} machines: the {p} of its machines down at "
            f"once (bound by {self.bound})",
            f"  fleet {self.fleet_machines:,} machines ({fleet[self.fleet_from]}); {self.failures:,} outages over "
            f"{(self.until - self.since) / DAY:.1f} days, {self.unknown_ends:,} without an end took the "
            f"{self.horizon_s / 3600:g} h horizon; mean outage W = {w:.1f} h",
            f"  rate {self.rate:.5f} failures/machine-day over the last {days:.1f} days, {self.rate_all:.5f} over "
            f"the whole history (x{self.rate / self.rate_all if self.rate_all else 0:.2f})",
            f"  parametric {self.parametric}: negative binomial, job mean {self.mean_down:.2f} down, dispersion "
            f"index {self.dispersion:.2f} (fleet failures per {w:.1f} h window, {self.windows} windows; "
            f"1 = Poisson), {self.job_dispersion:.2f} for the job",
            f"  empirical {self.empirical}: {p} over the last {days:.1f} days of the fleet's machines down at once, "
            f"thinned to the job (q = {self.job_machines / self.fleet_machines:.3f})",
        ]


@dataclass(frozen=True)
class Backtest:
    """Out-of-sample coverage: the advice fitted before `at`, scored on [`at`, `until`)."""

    advice: Advice  # the fit at `at`
    at: float
    until: float
    fits: int  # 1, or one per `refit_s` (walk-forward)
    spares_min: int
    spares_max: int
    coverage: float  # fraction of the test time the job's machines down at once were <= spares
    coverage_parametric: float  # ... had the parametric estimate alone been held
    coverage_empirical: float
    mean_down: float  # the job's mean machines down at once over the test

    def to_dict(self) -> dict[str, object]:
        return {**{k: v for k, v in asdict(self).items() if k != "advice"}, "advice": self.advice.to_dict()}

    def explain(self) -> list[str]:
        fits = "one fit" if self.fits == 1 else f"{self.fits} fits, spares {self.spares_min}..{self.spares_max}"
        return [f"backtest: fitted on the first {(self.at - self.advice.since) / DAY:.1f} days, scored on the next "
                f"{(self.until - self.at) / DAY:.1f} ({fits}): coverage {self.coverage:.4f} against the target "
                f"{self.advice.percentile:g}; parametric alone {self.coverage_parametric:.4f}, empirical alone "
                f"{self.coverage_empirical:.4f}; the job's mean down {self.mean_down:.2f}"]


# --- outages and the fleet's machines down at once --------------------------------------------------------------


def outages(events: Iterable[NodeEvent], horizon_s: float) -> list[Outage]:
    """Every machine's outages, an event without end taking `horizon_s`, overlapping ones merged, empty ones
    dropped; sorted by start."""
    by_node: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        end = e.start + horizon_s if e.end is None else e.end
        if end > e.start:
            by_node[e.node].append((e.start, end))
    out = []
    for node, spans in by_node.items():
        spans.sort()
        a, b = spans[0]
        for s, t in spans[1:]:
            if s <= b:
                b = max(b, t)
            else:
                out.append(Outage(a, b, node))
                a, b = s, t
        out.append(Outage(a, b, node))
    return sorted(out, key=lambda o: (o.start, o.node))


def levels(spans: Sequence[Outage], since: float, until: float) -> dict[int, float]:
    """Seconds of [since, until) the fleet spent with n machines down, by n (a sweep over the spans' ends)."""
    edges = sorted([(max(o.start, since), 1) for o in spans if o.start < until and o.end > since]
                   + [(min(o.end, until), -1) for o in spans if o.start < until and o.end > since])
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


def mixture_quantile(time_at: dict[int, float], q: float, p: float) -> int:
    """The smallest s with P(job down <= s) >= p, the job's count being Binomial(n, q) for the share of time
    the fleet had n down."""
    total = sum(time_at.values())
    if total <= 0:
        return 0
    top = max(time_at)
    pmf = [0.0] * (top + 1)
    for n, tau in time_at.items():
        for k, x in enumerate(_binomial_pmf(n, q)):
            pmf[k] += tau / total * x
    cdf = 0.0
    for s, x in enumerate(pmf):
        cdf += x
        if cdf >= p - _EPS:
            return s
    return top


def covered(time_at: dict[int, float], q: float, spares: int) -> float:
    """The share of the time the job's machines down at once were <= `spares` (Binomial(n, q) for n down)."""
    total = sum(time_at.values())
    if total <= 0:
        return 1.0
    return sum(tau * min(1.0, sum(_binomial_pmf(n, q)[:spares + 1])) for n, tau in time_at.items()) / total


def thinned(dispersion: float, q: float) -> float:
    """The dispersion index of a count thinned by q: 1 + q (D - 1) (1: Poisson, also for an under-dispersed D)."""
    return 1 + q * (max(dispersion, 1.0) - 1)


def nb_quantile(mean: float, dispersion: float, p: float) -> int:
    """The smallest s with P(X <= s) >= p, X negative binomial of `mean` and variance `dispersion` * mean
    (Poisson when the dispersion is 1 or less)."""
    if mean <= 0:
        return 0
    r = mean / (dispersion - 1) if dispersion > 1 + 1e-9 else None  # variance = mean + mean^2 / r
    log_pmf = -mean if r is None else r * math.log(r / (r + mean))
    cdf, s = 0.0, 0
    while True:
        cdf += math.exp(log_pmf)
        if cdf >= p - _EPS:
            return s
        if r is None:
            log_pmf += math.log(mean / (s + 1))
        else:
            log_pmf += math.log((s + r) / (s + 1) * mean / (r + mean))
        s += 1


# --- the advice ------------------------------------------------------------------------------------------------


def _check(job_machines: int, fleet_machines: int | None, percentile: float, horizon_s: float,
           window_s: float) -> None:
    if job_machines < 1:
        raise ValueError(f"the job's size must be at least 1 machine, got {job_machines}")
    if fleet_machines is not None and fleet_machines < job_machines:
        raise ValueError(f"the fleet ({fleet_machines} machines) is smaller than the job ({job_machines}): "
                         "give the fleet's real size")
    if not 0 < percentile < 1:
        raise ValueError(f"the percentile is a fraction between 0 and 1 (e.g. 0.99), got {percentile}")
    if not (horizon_s > 0 and window_s > 0 and math.isfinite(horizon_s) and math.isfinite(window_s)):
        raise ValueError("the repair horizon and the trailing window must be positive and finite")


def _fleet(events: Sequence[NodeEvent], job_machines: int, fleet_machines: int | None) -> tuple[int, str]:
    if fleet_machines is not None:
        return fleet_machines, "given"
    seen = len({e.node for e in events})
    return (seen, "seen") if seen >= job_machines else (job_machines, "job")


def _dispersion(starts: Sequence[float], since: float, until: float, w: float, block: int) -> tuple[float, int]:
    """D of the counts of `starts` per window of `w` (windows ending at `until`), pooled within blocks of
    `block` windows: the sum of squared deviations from each block's mean over the sum of (windows - 1) * mean;
    (D, windows). Windows with no start are counted without being listed."""
    k = int((until - since) // w)
    if k < 2:
        return 1.0, k
    sums: dict[int, list[int]] = defaultdict(lambda: [0, 0])  # block -> [sum of counts, sum of squares]
    for i, c in Counter(int((until - s) // w) for s in starts).items():  # window 0: the last
        if 0 <= i < k:
            sums[i // block][0] += c
            sums[i // block][1] += c * c
    squares = weights = 0.0
    for b, (s1, s2) in sums.items():
        n = min(block, k - b * block)
        if n >= 2:
            squares += (n * s2 - s1 * s1) / n
            weights += (n - 1) * s1 / n
    return (squares / weights if weights > 0 else 1.0), k


def advise(events: Sequence[NodeEvent], job_machines: int, *, fleet_machines: int | None = None,
           percentile: float = 0.99, horizon_s: float = DAY, window_s: float = 30 * DAY,
           since: float | None = None, until: float | None = None) -> Advice:
    """The spares for a job of `job_machines` from the failures of `events` begun in [since, until] (default: the
    first to the last start, both in); `fleet_machines` default: the machines the history names (the job's size if
    fewer). ValueError, one line, for a bad value or a history with no outage."""
    _check(job_machines, fleet_machines, percentile, horizon_s, window_s)
    fleet, fleet_from = _fleet(events, job_machines, fleet_machines)
    since = min((e.start for e in events), default=0.0) if since is None else since
    until = max((e.start for e in events), default=0.0) if until is None else until
    kept = [e for e in events if since <= e.start <= until]
    spans = outages(kept, horizon_s)
    if not spans or until <= since:
        raise ValueError("no outage in the history (no event that took a machine out between its first and last "
                         "start): nothing to size the pool from")
    q = job_machines / fleet
    w = sum(o.end - o.start for o in spans) / len(spans)
    window = min(window_s, until - since)
    recent = until - window
    rate = sum(o.start >= recent for o in spans) / fleet / (window / DAY)
    dispersion, windows = _dispersion([o.start for o in spans], since, until, w, max(2, round(window / w)))
    mean_down = q * rate * fleet * w / DAY
    parametric = nb_quantile(mean_down, thinned(dispersion, q), percentile)
    empirical = mixture_quantile(levels(spans, recent, until), q, percentile)
    return Advice(spares=max(parametric, empirical), percentile=percentile, job_machines=job_machines,
                  fleet_machines=fleet, fleet_from=fleet_from, failures=len(spans),
                  unknown_ends=sum(e.end is None for e in kept), since=since, until=until, window_s=window,
                  horizon_s=horizon_s, repair_s=w, rate=rate, rate_all=len(spans) / fleet / ((until - since) / DAY),
                  dispersion=dispersion, windows=windows, mean_down=mean_down, parametric=parametric,
                  empirical=empirical)


def known_at(events: Iterable[NodeEvent], at: float) -> list[NodeEvent]:
    """The history as known at `at`: events begun before it; an end after it was not known yet."""
    return [e if e.end is None or e.end <= at else replace(e, end=None) for e in events if e.start < at]


def backtest(events: Sequence[NodeEvent], job_machines: int, *, split: float = 0.6, refit_s: float | None = None,
             fleet_machines: int | None = None, percentile: float = 0.99, horizon_s: float = DAY,
             window_s: float = 30 * DAY, since: float | None = None, until: float | None = None) -> Backtest:
    """Fit on [since, since + split * span) and score on the rest; with `refit_s`, refit that often on all
    that is known by then (an operator rerunning the advisor), each fit scored until the next. The fleet's
    size is `fleet_machines`, else the machines the whole history names."""
    if not 0 < split < 1:
        raise ValueError(f"the split is the fraction of the history to fit on, between 0 and 1, got {split}")
    if refit_s is not None and not refit_s > 0:
        raise ValueError(f"the refit interval must be positive, got {refit_s}")
    _check(job_machines, fleet_machines, percentile, horizon_s, window_s)
    fleet, fleet_from = _fleet(events, job_machines, fleet_machines)
    since = min((e.start for e in events), default=0.0) if since is None else since
    until = max((e.start for e in events), default=0.0) if until is None else until
    at = since + split * (until - since)
    spans = outages([e for e in events if since <= e.start <= until], horizon_s)
    q = job_machines / fleet
    fits: list[tuple[Advice, dict[int, float]]] = []
    t = at
    while t < until:
        nxt = until if refit_s is None else min(until, t + refit_s)
        advice = advise(known_at(events, t), job_machines, fleet_machines=fleet, percentile=percentile,
                        horizon_s=horizon_s, window_s=window_s, since=since, until=t)
        fits.append((replace(advice, fleet_from=fleet_from), levels(spans, t, nxt)))
        t = nxt
    if not fits:
        raise ValueError("the history is empty after the split: nothing to score on")
    total = until - at

    def share(spares_of: str) -> float:
        return sum(covered(lv, q, getattr(a, spares_of)) * sum(lv.values()) for a, lv in fits) / total

    down = sum(n * tau for _, lv in fits for n, tau in lv.items()) * q / total
    spares = [a.spares for a, _ in fits]
    return Backtest(advice=fits[0][0], at=at, until=until, fits=len(fits), spares_min=min(spares),
                    spares_max=max(spares), coverage=share("spares"), coverage_parametric=share("parametric"),
                    coverage_empirical=share("empirical"), mean_down=down)
