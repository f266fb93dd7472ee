"""The warm-standby pool advisor (fleet/spares.py), the outage generator, machines_down.sql and `gangwatch spares`.

Expected figures are computed here: Poisson probabilities from their formula (math), the Kaplan-Meier survival by
hand, the empirical quantile by sweeping the history's elementary intervals and counting the machines down at
each one's midpoint, the backtests' coverage the same way.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest
from gangwatch.fleet import spares
from gangwatch.fleet.history import OPEN, NodeEvent, from_incidents, in_order, parse, to_csv
from gangwatch.fleet.spares import DAY, advise
from gangwatch.producers.simulate.outages import fleet, outages
from gangwatch.schemas import Incident, Job, RankInfo
from gangwatch.sinks.store import open_store
from gangwatch.sinks.tables import incident_row, job_row, telemetry_row

from gangwatch import cli
from gangwatch.cli import spares as spares_cli
from gangwatch.evaluation import spares_backtest as spares_eval
from gangwatch.report.queries import catalog, render

pytestmark = pytest.mark.unit

T0 = 1767571200.0  # 2026-01-05T00:00:00Z
HOUR = 3600.0


# --- direct computations ------------------------------------------------------------------------------------------


def first_reaching(cdf_terms, p: float) -> int:
    """The smallest s whose cumulative sum of `cdf_terms` (an iterator of P(X = s)) reaches p."""
    total = 0.0
    for s, x in enumerate(cdf_terms):
        total += x
        if total >= p - 1e-12:
            return s
    raise AssertionError("the distribution never reached p")


def poisson_quantile(mean: float, p: float) -> int:
    return first_reaching((math.exp(-mean) * mean ** k / math.factorial(k) for k in range(10_000)), p)


def nb_quantile(mean: float, var: float, p: float) -> int:
    """P(X = k) = Gamma(k + r) / (Gamma(r) k!) (r / (r + m))^r (m / (r + m))^k with var = m + m^2 / r."""
    r = mean * mean / (var - mean)
    return first_reaching((math.exp(math.lgamma(k + r) - math.lgamma(r) - math.lgamma(k + 1))
                           * (r / (r + mean)) ** r * (mean / (r + mean)) ** k for k in range(10_000)), p)


def binomial_cdf(s: int, n: int, q: float) -> float:
    return sum(math.comb(n, k) * q ** k * (1 - q) ** (n - k) for k in range(min(s, n) + 1))


def time_at_levels(events: list[NodeEvent], horizon_s: float, since: float, until: float) -> dict[int, float]:
    """Seconds of [since, until) with n distinct machines down, by sweeping every elementary interval."""
    spans = [(e.node, e.start, e.start + horizon_s if e.end is None else e.end) for e in events]
    cuts = sorted({since, until, *(t for _, a, b in spans for t in (a, b) if since < t < until)})
    out: dict[int, float] = defaultdict(float)
    for a, b in zip(cuts, cuts[1:], strict=False):
        mid = (a + b) / 2
        out[len({node for node, s, e in spans if s <= mid < e})] += b - a
    return out


def mixture_quantile(time_at: dict[int, float], q: float, p: float) -> int:
    total = sum(time_at.values())
    for s in range(max(time_at) + 1):
        if sum(tau * binomial_cdf(s, n, q) for n, tau in time_at.items()) / total >= p - 1e-12:
            return s
    return max(time_at)


def regular(per_day: list[int], machines: int = 100) -> list[NodeEvent]:
    """Day d has per_day[d] failures, spread over its hours (never on a day's edge), each down exactly a day;
    machines taken in turn."""
    out, k = [], 0
    for d, c in enumerate(per_day):
        for i in range(c):
            start = T0 + d * DAY + (i + 0.5) * DAY / c
            out.append(NodeEvent(start, f"m{k % machines:03d}", "fail_stop", start + DAY))
            k += 1
    return sorted(out, key=in_order)


# --- the estimators against a direct computation -----------------------------------------------------------------


def poisson_cdf(s: int, mean: float) -> float:
    return sum(math.exp(-mean) * mean ** k / math.factorial(k) for k in range(s + 1))


def random_history(seed: int, nodes: int = 40, n: int = 300, days: float = 40) -> list[NodeEvent]:
    """Random outages of random length, a fifth without an end, some overlapping on one machine."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = T0 + rng.uniform(0, days * DAY)
        end = None if rng.random() < 0.2 else start + rng.choice([0.0, rng.uniform(HOUR, 72 * HOUR)])
        out.append(NodeEvent(start, f"n{rng.randrange(nodes):02d}", "fail_stop", end))
    return sorted(out, key=in_order)


def known(events: list[NodeEvent], at: float, q: float = 1.0, hold_s: float = 30 * DAY, p: float = 0.99,
          horizon_s: float = DAY) -> spares.Known:
    return spares.Known(spares.known_at(spares.outages(events, horizon_s), at), T0, at, q, hold_s, p)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_empirical_figure_is_the_swept_quantile_of_the_trailing_window(seed):
    events = random_history(seed)
    at = T0 + 40 * DAY
    for percentile in (0.5, 0.9, 0.99):
        k = known(events, at, q=25 / 40, p=percentile, horizon_s=30 * HOUR)
        swept = time_at_levels([e for e in events if e.start < at], 30 * HOUR, at - 30 * DAY, at)
        assert spares.empirical(k, 30, percentile) == mixture_quantile(swept, 25 / 40, percentile)


def test_repair_times_are_kaplan_meier_with_open_repairs_censored():
    # five repairs of 10, 20, 30, 40, 50 h ended; two still open at `at` after 25 h and 45 h; one without end
    at = T0 + 100 * DAY
    events = [NodeEvent(T0 + i * DAY, f"m{i}", "x", T0 + i * DAY + h * HOUR)
              for i, h in enumerate((10, 20, 30, 40, 50))]
    events += [NodeEvent(at - 25 * HOUR, "o1", "x", OPEN), NodeEvent(at - 45 * HOUR, "o2", "x", OPEN),
               NodeEvent(T0 + 50 * DAY, "u", "x")]
    r = spares.repairs(spares.outages(events, DAY), at)
    assert (r.finished, r.censored) == (5, 2)
    # at risk: 7 at 10 h, 6 at 20 h, then o1 censored at 25 h: 4 at 30 h, 3 at 40 h, o2 censored at 45: 1 at 50 h
    want = [6 / 7, 6 / 7 * 5 / 6, 6 / 7 * 5 / 6 * 3 / 4, 6 / 7 * 5 / 6 * 3 / 4 * 2 / 3, 0.0]
    assert list(r.times) == [h * HOUR for h in (10, 20, 30, 40, 50)]
    assert r.survival == pytest.approx(want)
    assert r.area(np.array([15 * HOUR]))[0] == pytest.approx(10 * HOUR + 5 * HOUR * 6 / 7)
    assert r.median_s == 40 * HOUR  # S(30 h) = 0.536 > 1/2, S(40 h) = 0.357


def test_the_compound_model_is_the_poisson_of_arrivals_still_in_repair():
    # single failures every 6 h for 60 days, each down exactly 2 days
    at = T0 + 60 * DAY
    events = [NodeEvent(T0 + i * 6 * HOUR, f"m{i % 300:03d}", "x", T0 + i * 6 * HOUR + 2 * DAY) for i in range(240)]
    hold = 10 * DAY
    k = known(events, at, hold_s=hold)
    rate = k.rate(30)
    assert rate == pytest.approx(4 / DAY)
    got = k.coverage(rate)
    # at u after `at`: the 8 machines down at `at` (ages 0..42 h every 6 h) still down while age + u < 48 h,
    # plus Poisson(rate * min(u, 2 days)) new ones
    u = (np.arange(spares.GRID) + 0.5) / spares.GRID * hold
    for s in (5, 8, 12):
        want = 0.0
        for ui in u:
            still = sum(1 for j in range(1, 8) if j * 6 * HOUR + ui < 2 * DAY)
            want += (poisson_cdf(s - still, rate * min(ui, 2 * DAY)) if s >= still else 0.0) / spares.GRID
        assert got[s] == pytest.approx(want, abs=1e-9)
    assert spares.compound(k, rate, 0.99) == next(s for s in range(60) if got[s] >= 0.99 - 1e-12)


def test_a_job_in_a_larger_fleet_is_thinned():
    events = random_history(5)
    at = T0 + 40 * DAY
    whole, half = known(events, at, q=1.0), known(events, at, q=0.5)
    assert spares.compound(half, half.rate(None), 0.99) < spares.compound(whole, whole.rate(None), 0.99)
    assert spares.empirical(half, None, 0.99) <= spares.empirical(whole, None, 0.99)


def test_a_rate_that_drifts_widens_the_model():
    events = outages(400, 240, seed=4, repair_sigma=1.2, wander=0.4)
    k = known(events, T0 + 240 * DAY, hold_s=90 * DAY)
    assert k.drift() > 0
    assert spares.drifting(k, 30, 0.99) >= spares.compound(k, k.rate(30), 0.99)
    steady = known(outages(400, 240, seed=4, repair_sigma=1.2), T0 + 240 * DAY)
    assert steady.drift() < k.drift()


# --- the backtest, the choice, the holdout --------------------------------------------------------------------------


def test_each_fold_is_fitted_on_what_was_known_and_scored_on_the_swept_hours_after():
    events = random_history(4, days=80, n=600)
    since, until, hold = T0, T0 + 80 * DAY, 20 * DAY
    spans = spares.known_at(spares.outages(events, 30 * HOUR), until)
    tried = spares.trials(spans, since, until, 25 / 40, percentile=0.9, hold_s=hold, names=["empirical 30d"])
    [trial] = tried
    assert [f.at for f in trial.folds] == spares.origins(since, until, hold) and len(trial.folds) >= 3
    for f in trial.folds:
        assert f.until == min(until, f.at + hold)
        # fitted on what was known: an outage still open at the origin had no end yet (it is down to the origin)
        before = [e if e.end is None or e.end <= f.at else NodeEvent(e.start, e.node, e.cls, OPEN)
                  for e in events if e.start < f.at]
        fit = time_at_levels([e if e.end != OPEN else NodeEvent(e.start, e.node, e.cls, f.at + DAY) for e in before],
                             30 * HOUR, max(since, f.at - 30 * DAY), f.at)
        assert f.spares == mixture_quantile(fit, 25 / 40, 0.9)
        swept = time_at_levels(events, 30 * HOUR, f.at, f.until)
        assert f.coverage == pytest.approx(sum(t * binomial_cdf(f.spares, n, 25 / 40) for n, t in swept.items())
                                           / (f.until - f.at))
        assert f.needed == mixture_quantile(swept, 25 / 40, 0.9)


def test_the_advice_is_the_cheapest_estimator_that_met_the_target_one_level_stricter():
    events = fleet(2)
    a = spares.advise(events, 400, fleet_machines=400, until=T0 + 0.6 * 365 * DAY)
    met = [t for t in a.trials if t.met]
    assert met and a.cheapest == min(met, key=lambda t: t.cost).estimator and a.met
    assert a.estimator == spares.stricter(a.cheapest) != a.cheapest
    for t in a.trials:
        hours = sum(f.until - f.at for f in t.folds)
        assert t.coverage == pytest.approx(sum(f.coverage * (f.until - f.at) for f in t.folds) / hours)
        assert t.cost == pytest.approx(sum(f.spares / max(f.needed, 1) for f in t.folds) / len(t.folds))
    now = spares.Known(spares.known_at(spares.outages([e for e in events if e.start < a.until], DAY), a.until),
                       a.since, a.until, 1.0, a.hold_s, a.percentile)
    assert a.spares == spares.ESTIMATORS[a.estimator](now)


def test_floors_on_the_ten_evaluation_fleets():
    """The issue's done-when: fitted on the first 60%, the advice covers >= 0.99 of the remaining hours in every
    seed, at <= 1.5x the pool that would have sufficed (median) and <= 2x (worst)."""
    results = spares_eval.evaluate()
    got = spares_eval.summary(results)
    assert spares_eval.check(results) == [], spares_eval.table(results)
    assert got["coverage_min"] >= 0.99 and got["cost_median"] <= 1.5 and got["cost_max"] <= 2.0
    # the naive estimators do not: the trailing window's empirical P99 misses the rest in some seeds
    naive = [r.holdout.estimators[list(spares.ESTIMATORS).index("empirical 30d")] for r in results]
    assert min(f.coverage for f in naive) < 0.99


def test_the_holdout_scores_the_advice_made_at_the_split_on_the_swept_rest():
    events = random_history(6, days=90, n=700)
    h = spares.holdout(events, 25, fleet_machines=40, split=0.6, horizon_s=30 * HOUR, hold_s=20 * DAY,
                       since=T0, until=T0 + 90 * DAY)
    at = T0 + 54 * DAY
    assert h.at == pytest.approx(at) and h.advice.until == h.at
    assert h.advice.still_open == sum(e.start < at and e.end is not None and e.end > at for e in events)
    swept = time_at_levels(events, 30 * HOUR, at, T0 + 90 * DAY)
    assert h.coverage == pytest.approx(sum(t * binomial_cdf(h.advice.spares, n, 25 / 40) for n, t in swept.items())
                                       / (36 * DAY))
    assert h.needed == mixture_quantile(swept, 25 / 40, 0.99)


# --- bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, says", [
    (lambda e: advise([], 8), "no outage in the history"),
    (lambda e: advise([NodeEvent(T0, "a", "x", T0)], 1), "no outage in the history"),
    (lambda e: advise(e[:5], 8), "too short to backtest"),
    (lambda e: advise(e, 0), "at least 1 machine"),
    (lambda e: advise(e, 64, fleet_machines=32), "smaller than the job"),
    (lambda e: advise(e, 8, percentile=1.0), "between 0 and 1"),
    (lambda e: advise(e, 8, horizon_s=0), "positive and finite"),
    (lambda e: spares.holdout(e, 8, split=1.5), "fraction of the history"),
    (lambda e: outages(0, 10, seed=1), "at least 1 machine"),
    (lambda e: outages(10, 10, seed=1, burst_p=2), "between 0 and 1"),
    (lambda e: outages(10, 10, seed=1, burst_p=0.1, burst_max=20), "burst_max <= machines"),
])
def test_bad_input_is_one_line(call, says):
    with pytest.raises(ValueError, match=says) as e:
        call(random_history(1))
    assert "\n" not in str(e.value)


def test_a_history_naming_fewer_machines_than_the_job_is_the_jobs_own():
    events = random_history(1, nodes=10)
    a = advise(events, 64)
    assert (a.fleet_machines, a.fleet_from) == (64, "job")
    assert advise(events, 4).fleet_from == "seen" and advise(events, 4).fleet_machines == 10


# --- the generator --------------------------------------------------------------------------------------------------


def test_the_generator_is_seeded_and_draws_the_rate_bursts_and_drift_asked():
    args = dict(rate=0.004, burst_p=0.05, drift=2.0, open_p=0.1)
    events = outages(2000, 180, seed=9, **args)
    assert events == outages(2000, 180, seed=9, **args) and events != outages(2000, 180, seed=10, **args)
    assert events == sorted(events, key=in_order) and all(e.start >= T0 and e.start < T0 + 180 * DAY for e in events)
    assert len(events) / (2000 * 180) == pytest.approx(0.004 * (2 / 3 + 2 / 3), rel=0.15)
    late = sum(e.start >= T0 + 120 * DAY for e in events)
    assert late / (len(events) - late) == pytest.approx(1.0, rel=0.25)  # a third of the time at twice the rate
    bursts = defaultdict(set)
    for e in events:
        if e.description:
            bursts[e.start].add(e.node)
    assert bursts and all(4 <= len(nodes) <= 16 for nodes in bursts.values())
    assert sum(e.end is None for e in events) / len(events) == pytest.approx(0.1, abs=0.03)
    repair = [e.down_s for e in events if e.end is not None and not e.still_open]
    assert sum(repair) / len(repair) == pytest.approx(24 * HOUR, rel=0.15)
    assert not any(e.description for e in outages(200, 30, seed=9))
    # a trend: the rate at the end `trend` times the start's; a repair still going on at the end is open
    ramp = outages(2000, 180, seed=9, trend=3.0, repair_h=240)
    first, last = (sum(T0 + a * DAY <= e.start < T0 + (a + 30) * DAY for e in ramp) for a in (0, 150))
    assert last / first == pytest.approx((1 + 2 * 165 / 180) / (1 + 2 * 15 / 180), rel=0.15)
    assert any(e.still_open for e in ramp) and all(e.end > T0 + 180 * DAY for e in ramp if e.still_open)


def test_the_evaluation_fleets_have_heavy_tailed_repairs_bursts_and_drift():
    events = fleet(0)
    repair = sorted(e.down_s for e in events if e.end is not None and not e.still_open)
    assert sum(repair) / len(repair) > 3 * repair[len(repair) // 2]  # the mean set by a few long repairs
    assert any(e.description.startswith("burst") for e in events) and fleet(0) == events != fleet(1)


# --- machines_down.sql on chDB ----------------------------------------------------------------------------------------


def incidents(seed: int = 3) -> list[Incident]:
    rng = random.Random(seed)
    out = []
    for k in range(120):
        onset = T0 + rng.uniform(0, 60 * DAY)
        culprits = sorted(rng.sample([f"n{n:02d}" for n in range(30)], rng.choice([0, 1, 1, 1, 2, 6])))
        recovered = onset + rng.uniform(60, 3000) if rng.random() < 0.8 else None
        cls = rng.choice(["fail_stop", "hang", "planned"])
        out.append(Incident(id=f"i{k}", ts=(recovered or onset) + 1, job=f"job{k % 3}", cls=cls,
                            planned=cls == "planned", onset_ts=onset, detected_ts=onset + 5, recovered_ts=recovered,
                            culprit_nodes=culprits))
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A chDB store with the incidents (each also in an earlier version without its recovery), a job whose
    topology names 12 machines, and a job known only by its ranks."""
    url = f"chdb:{tmp_path_factory.mktemp('spares') / 'store'}"
    s = open_store(url)
    s.create_tables()
    final = incidents()
    s.insert("gw_incidents", [incident_row(Incident(id=i.id, ts=i.onset_ts + 5, job=i.job, cls=i.cls,
                                                    planned=i.planned, onset_ts=i.onset_ts, detected_ts=i.detected_ts,
                                                    culprit_nodes=i.culprit_nodes)) for i in final])
    s.insert("gw_incidents", [incident_row(i) for i in final])
    ranks = [RankInfo(rank=r, node=f"n{r // 4:02d}", gpu=r % 4) for r in range(48)]
    s.insert("gw_telemetry", [telemetry_row(Job(ts=T0, job="job0", ranks=ranks[:8])),
                              telemetry_row(Job(ts=T0 + 60, job="job0", ranks=ranks))])
    from gangwatch.schemas import Finding
    s.insert("gw_jobs", [job_row(Finding(id="f1", ts=T0, job="ranks-only", type="job_state", detector="life",
                                         evidence={"state": "running", "previous": "starting", "cause": "x",
                                                   "ended_ranks": 0, "job_ranks": 64}))])
    s.close()
    return url


def test_machines_down_per_day_on_chdb(store):
    s = open_store(store, create=False)
    try:
        got = s.query(render(catalog()["machines_down"], {}))
        one_job = s.query(render(catalog()["machines_down"], {"job": "job1", "since": str(T0 + 5 * DAY)}))
    finally:
        s.close()
    days: dict[str, list[Incident]] = defaultdict(list)
    for i in incidents():
        if not i.planned and i.culprit_nodes:
            days[datetime.fromtimestamp(i.onset_ts, UTC).date().isoformat()].append(i)
    assert [r["day"] for r in got] == sorted(days)
    for r in got:
        incs = days[r["day"]]
        assert r["day_ts"] == datetime.fromisoformat(r["day"] + "T00:00:00+00:00").timestamp()
        assert (r["incidents"], r["failures"]) == (len(incs), sum(len(i.culprit_nodes) for i in incs))
        assert r["machines"] == len({n for i in incs for n in i.culprit_nodes})
        assert r["largest"] == max(len(i.culprit_nodes) for i in incs)
        assert r["recovered"] == sum(len(i.culprit_nodes) for i in incs if i.recovered_ts is not None)
        assert r["open"] == r["failures"] - r["recovered"]
        back = [i.recovered_ts - i.onset_ts for i in incs if i.recovered_ts is not None]
        assert (r["mean_recover_s"] is None) == (not back)
        assert not back or abs(r["mean_recover_s"] - sum(back) / len(back)) <= 0.051
    assert sum(r["failures"] for r in one_job) == sum(len(i.culprit_nodes) for i in incidents() if i.job == "job1"
                                                       and not i.planned and i.onset_ts >= T0 + 5 * DAY)
    assert sum(r["failures"] for r in got) == len(from_incidents(incident_row(i) for i in incidents()))


# --- the command line -----------------------------------------------------------------------------------------------


@pytest.fixture
def gw(capsys, monkeypatch):
    """`gangwatch ARGS` with `spares` registered; (exit code, stdout, the one error line or '')."""
    if spares_cli not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, spares_cli))

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err
        return code, out, err.strip()

    return run


def test_spares_from_history_files(gw, tmp_path):
    events = outages(500, 90, seed=2, burst_p=0.05, open_p=0.1, repair_sigma=1.5)
    (tmp_path / "a.csv").write_text(to_csv(events[:700]))
    (tmp_path / "b.csv.gz").write_bytes(gzip.compress(to_csv(events[700:]).encode()))
    code, out, _ = gw("spares", "--machines", "128", "--history", str(tmp_path / "a.csv"), str(tmp_path / "b.csv.gz"),
                      "--fleet", "500", "--repair-hours", "36", "--backtest", "--format", "json")
    assert code == 0
    got = json.loads(out)
    want = advise(parse(to_csv(events)), 128, fleet_machines=500, horizon_s=36 * HOUR)
    assert (got["spares"], got["estimator"], got["horizon_s"]) == (want.spares, want.estimator, 36 * HOUR)
    assert got["backtest_coverage"] == pytest.approx(want.chosen.coverage)
    assert got["backtest_cost"] == pytest.approx(want.chosen.cost)
    assert 0 < got["holdout"]["coverage"] <= 1 and got["holdout"]["needed"] >= 0
    assert any(e.still_open for e in events) and got["still_open"] == len({e.node for e in events if e.still_open})
    code, out, _ = gw("spares", "--machines", "128", "--history", str(tmp_path / "a.csv"), "--fleet", "500")
    assert code == 0 and "backtest: coverage" in out and "the advice over the history" in out


def test_until_fits_on_the_history_as_it_was_known_then(gw, tmp_path):
    events = outages(300, 120, seed=3, repair_sigma=1.5, burst_p=0.03, burst_max=6)
    (tmp_path / "h.csv").write_text(to_csv(events))
    until = T0 + 80 * DAY
    code, out, _ = gw("spares", "--machines", "300", "--history", str(tmp_path / "h.csv"), "--until",
                      "2026-03-26T00:00:00Z", "--since", str(T0 + DAY), "--format", "json")
    assert code == 0
    got = json.loads(out)
    want = advise(events, 300, since=T0 + DAY, until=until)
    assert (got["until"], got["since"], got["spares"]) == (until, T0 + DAY, want.spares)
    assert got["still_open"] == sum(1 for o in spares.outages(events, DAY) if o.start < until < o.end)


@pytest.mark.parametrize("text, code, says", [
    ("node,start,end,class\nm1,5,,fail_stop\n", 3, "h.csv:2: start: '5' is before 2000"),
    ("node,start,end,class\nm1,1767571200,1,fail_stop\n", 3, "h.csv:2: end: '1' is before 2000"),
])
def test_history_mistakes_name_the_file_and_line(gw, tmp_path, text, code, says):
    (tmp_path / "h.csv").write_text(text)
    got, _, err = gw("spares", "--machines", "8", "--history", str(tmp_path / "h.csv"))
    assert got == code and says in err


def test_an_open_end_is_read_and_written_and_gzip_is_read_by_its_magic():
    text = "node,start,end,class\nm1,2026-01-05,OPEN,fail_stop\nm2,2026-01-05,2026-01-06,xid_79\n"
    [a, b] = parse(gzip.compress(text.encode()), "h.csv")
    assert a.still_open and a.end == OPEN and not b.still_open and b.end == T0 + DAY
    assert parse(to_csv([a, b])) == [a, b] and ",open," in to_csv([a])
    jsonl = '{"node": "m1", "start": "2026-01-05", "end": "open", "class": "fail_stop"}\n'
    assert parse(jsonl)[0].still_open
    with pytest.raises(ValueError, match=r"h.jsonl:1: start: 19000 is before 2000 \(read as 1970-01-01\)"):
        parse('{"node": "m1", "start": 19000, "class": "fail_stop"}\n', "h.jsonl")


def test_a_class_that_matches_nothing_lists_the_classes(gw, tmp_path):
    (tmp_path / "h.csv").write_text(to_csv(outages(50, 60, seed=1)))
    code, _, err = gw("spares", "--machines", "8", "--history", str(tmp_path / "h.csv"), "--class", "xid_79")
    assert code == 3 and "--class xid_79: no event of that class; the history's classes: fail_stop" in err


@pytest.mark.parametrize("seeds", [(0, 1)])
def test_evaluate_prints_the_table_and_exits_7_below_the_floor(gw, monkeypatch, seeds):
    monkeypatch.setattr(spares_eval, "SEEDS", seeds)
    code, out, _ = gw("spares", "--evaluate", "--format", "json")
    got = json.loads(out)
    assert [s["seed"] for s in got["seeds"]] == list(seeds)
    assert code == (7 if got["below"] else 0)
    monkeypatch.setattr(spares_eval, "FLOORS", {**spares_eval.FLOORS, "cost_max": 0.5})
    code, out, err = gw("spares", "--evaluate")
    assert code == 7 and "below the floor: cost max" in err and "advised by" in out


def test_spares_for_a_job_of_the_store(gw, store):
    code, out, _ = gw("spares", "--job", "job0", "--store", store, "--format", "json")
    assert code == 0
    got = json.loads(out)
    culprits = from_incidents(incident_row(i) for i in incidents())
    assert got["job_machines"] == 12  # the latest topology: 48 ranks on 12 machines
    # the store knows the job's recovery, not the machine's repair: every outage took the horizon
    merged = spares.outages([replace(e, end=None) for e in culprits], DAY)
    assert got["unknown_ends"] == got["failures"] == len(merged)
    code, out, _ = gw("spares", "--job", "job0", "--store", store)
    assert code == 0 and out.startswith("spares ") and "backtest: coverage" in out


@pytest.mark.parametrize("argv, code, says", [
    (["--job", "ranks-only"], 2, "64 ranks but not the machines they run on (no telemetry stored): pass --machines"),
    (["--job", "nobody"], 2, "no job 'nobody'"),
    (["--machines", "8", "--history", "/no/such.csv"], 3, "no such file"),
    (["--machines", "100", "--fleet", "50"], 2, "smaller than the job"),
])
def test_spares_mistakes_are_one_line(gw, store, argv, code, says):
    got, _, err = gw("spares", *argv, "--store", store)
    assert got == code and says in err


def test_a_percentile_that_is_no_fraction_is_refused_by_the_parser(gw, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["spares", "--machines", "8", "--percentile", "99"])
    assert e.value.code == 2 and "--percentile: want a fraction between 0 and 1 (e.g. 0.99), got 99" in \
        capsys.readouterr().err


def test_a_bad_history_file_names_its_line(gw, tmp_path):
    (tmp_path / "h.csv").write_text("node,start,end,class\nm1,yesterday,,fail_stop\n")
    code, _, err = gw("spares", "--machines", "8", "--history", str(tmp_path / "h.csv"))
    assert code == 3 and "h.csv:2: start" in err
