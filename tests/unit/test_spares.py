"""The warm-standby pool advisor (fleet/spares.py), the outage generator, machines_down.sql and `gangwatch spares`.

Expected figures are computed here: the Poisson and negative binomial quantiles from their formulas (math),
the empirical quantile by sweeping the history's elementary intervals and counting the machines down at each
one's midpoint, the backtest's coverage the same way.
"""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from datetime import UTC, datetime

import pytest
from gangwatch.fleet.history import NodeEvent, from_incidents, in_order, parse, to_csv
from gangwatch.fleet.spares import DAY, advise, backtest
from gangwatch.producers.simulate.outages import outages
from gangwatch.schemas import Incident, Job, RankInfo
from gangwatch.sinks.store import open_store
from gangwatch.sinks.tables import incident_row, job_row, telemetry_row

from gangwatch import cli
from gangwatch.cli import spares as spares_cli
from gangwatch.queries import catalog, render

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


# --- the figure against a direct computation ----------------------------------------------------------------------


def test_without_dispersion_the_parametric_figure_is_the_poisson_quantile():
    events = regular([6] * 60)  # six a day, each down a day: every instant after the first day has 6 down
    a = advise(events, 50, fleet_machines=100, since=T0, until=T0 + 60 * DAY)
    q = 50 / 100
    assert a.repair_s == pytest.approx(DAY) and a.rate == pytest.approx(6 / 100)
    assert a.dispersion < 1 and a.mean_down == pytest.approx(q * 6)
    assert a.parametric == poisson_quantile(q * 6, 0.99)
    assert a.empirical == first_reaching((binomial_cdf(s, 6, q) - binomial_cdf(s - 1, 6, q) for s in range(7)), 0.99)
    assert a.spares == max(a.parametric, a.empirical) and a.bound == "parametric"


@pytest.mark.parametrize("percentile", [0.9, 0.99, 0.999])
def test_an_over_dispersed_history_gets_the_negative_binomial_quantile(percentile):
    counts = [2, 3, 14, 2, 1, 3, 2, 20, 4, 2] * 6  # bursty days
    events = regular(counts, machines=400)
    a = advise(events, 100, fleet_machines=400, percentile=percentile, since=T0, until=T0 + 60 * DAY,
               window_s=60 * DAY)  # one window over the whole history: D is the plain var / mean
    m = sum(counts) / len(counts)
    d = sum((c - m) ** 2 for c in counts) / (len(counts) - 1) / m
    assert a.dispersion == pytest.approx(d)
    q = 100 / 400
    job_mean, job_d = q * m, 1 + q * (d - 1)
    assert a.mean_down == pytest.approx(job_mean)
    assert a.parametric == nb_quantile(job_mean, job_d * job_mean, percentile)
    assert a.parametric > poisson_quantile(job_mean, percentile) or percentile < 0.99


def random_history(seed: int, nodes: int = 40, n: int = 300, days: float = 40) -> list[NodeEvent]:
    """Random outages of random length, a fifth without an end, some overlapping on one machine."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        start = T0 + rng.uniform(0, days * DAY)
        end = None if rng.random() < 0.2 else start + rng.choice([0.0, rng.uniform(HOUR, 72 * HOUR)])
        out.append(NodeEvent(start, f"n{rng.randrange(nodes):02d}", "fail_stop", end))
    return sorted(out, key=in_order)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_empirical_figure_is_the_swept_quantile_of_the_trailing_window(seed):
    events = random_history(seed)
    until = T0 + 40 * DAY
    for percentile in (0.5, 0.9, 0.99):
        a = advise(events, 25, fleet_machines=40, percentile=percentile, horizon_s=30 * HOUR,
                   window_s=10 * DAY, since=T0, until=until)
        swept = time_at_levels([e for e in events if e.start < until], 30 * HOUR, until - 10 * DAY, until)
        assert a.empirical == mixture_quantile(swept, 25 / 40, percentile)
        assert a.unknown_ends == sum(e.end is None for e in events)


def test_the_backtest_scores_the_fit_made_before_the_split_on_the_swept_rest():
    events = random_history(4)
    since, until = T0, T0 + 40 * DAY
    b = backtest(events, 25, fleet_machines=40, split=0.5, percentile=0.9, horizon_s=30 * HOUR,
                 window_s=10 * DAY, since=since, until=until)
    at = since + 20 * DAY
    assert b.at == at and b.fits == 1
    # what was known at the split: an outage still open then has no end yet, and takes the horizon
    assert b.advice.unknown_ends == sum(e.start < at and (e.end is None or e.end > at) for e in events)
    assert b.advice.failures <= sum(e.start < at for e in events)
    swept = time_at_levels(events, 30 * HOUR, at, until)
    for got, spares in ((b.coverage, b.advice.spares), (b.coverage_parametric, b.advice.parametric),
                        (b.coverage_empirical, b.advice.empirical)):
        assert got == pytest.approx(sum(t * binomial_cdf(spares, n, 25 / 40) for n, t in swept.items())
                                    / (until - at))
    assert b.mean_down == pytest.approx(sum(n * t for n, t in swept.items()) * 25 / 40 / (until - at))


# --- bursts, drift, out-of-sample coverage --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bursts_need_more_spares_than_a_poisson_fit_of_the_same_mean(seed):
    bursty = advise(outages(2000, 180, seed=seed, burst_p=0.05), 1024, fleet_machines=2000)
    assert bursty.dispersion > 2
    assert bursty.parametric > poisson_quantile(bursty.mean_down, 0.99)
    smooth = advise(outages(2000, 180, seed=seed), 1024, fleet_machines=2000)
    assert smooth.dispersion < 1.5 and bursty.spares > smooth.spares


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_trailing_window_follows_a_rate_that_doubled(seed):
    drifting = advise(outages(2000, 180, seed=seed, rate=0.004, drift=2.0), 1024, fleet_machines=2000)
    steady = advise(outages(2000, 180, seed=seed, rate=0.004), 1024, fleet_machines=2000)
    assert drifting.rate == pytest.approx(0.008, rel=0.2) and drifting.rate_all == pytest.approx(0.004 * 4 / 3, rel=0.2)
    assert drifting.dispersion < 1.5  # pooled within windows: the step is not read as burstiness
    assert drifting.spares > steady.spares and drifting.mean_down > 1.6 * steady.mean_down


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_fit_misses_a_rate_that_doubles_after_it_and_daily_refits_follow(seed):
    events = outages(2000, 180, seed=seed, rate=0.004, drift=2.0, drift_from=0.75)
    once = backtest(events, 1024, fleet_machines=2000)
    daily = backtest(events, 1024, fleet_machines=2000, refit_s=DAY)
    assert daily.fits == 72 and daily.spares_max > once.advice.spares
    assert once.coverage < 0.95 and 0.97 < daily.coverage


@pytest.mark.parametrize("percentile, low, high", [(0.99, 0.98, 1.0), (0.9, 0.88, 0.97)])
def test_out_of_sample_coverage_is_near_the_target_on_a_bursty_fleet(percentile, low, high):
    for seed in range(5):
        events = outages(4000, 240, seed=seed, rate=0.004, repair_h=12, burst_p=0.03, burst_max=8)
        b = backtest(events, 1024, fleet_machines=4000, percentile=percentile, horizon_s=12 * HOUR)
        assert low <= b.coverage <= high, (seed, b)


# --- bad input ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("call, says", [
    (lambda e: advise([], 8), "no outage in the history"),
    (lambda e: advise([NodeEvent(T0, "a", "x", T0)], 1), "no outage in the history"),
    (lambda e: advise(e, 0), "at least 1 machine"),
    (lambda e: advise(e, 64, fleet_machines=32), "smaller than the job"),
    (lambda e: advise(e, 8, percentile=1.0), "between 0 and 1"),
    (lambda e: advise(e, 8, horizon_s=0), "positive and finite"),
    (lambda e: backtest(e, 8, split=1.5), "fraction of the history"),
    (lambda e: backtest(e, 8, refit_s=-1), "refit interval"),
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
    repair = [e.down_s for e in events if e.end is not None]
    assert sum(repair) / len(repair) == pytest.approx(24 * HOUR, rel=0.15)
    assert not any(e.description for e in outages(200, 30, seed=9))


# --- machines_down.sql on chDB ----------------------------------------------------------------------------------------


def incidents(seed: int = 3) -> list[Incident]:
    rng = random.Random(seed)
    out = []
    for k in range(120):
        onset = T0 + rng.uniform(0, 20 * DAY)
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
    events = outages(500, 90, seed=2, burst_p=0.05, open_p=0.1)
    (tmp_path / "a.csv").write_text(to_csv(events[:700]))
    (tmp_path / "b.csv").write_text(to_csv(events[700:]))
    code, out, _ = gw("spares", "--machines", "128", "--history", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"),
                      "--fleet", "500", "--repair-hours", "36", "--backtest", "--format", "json")
    assert code == 0
    got = json.loads(out)
    want = advise(parse(to_csv(events)), 128, fleet_machines=500, horizon_s=36 * HOUR)
    assert got["spares"] == want.spares and got["bound"] == want.bound and got["horizon_s"] == 36 * HOUR
    assert 0 < got["backtest"]["coverage"] <= 1 and got["backtest"]["advice"]["until"] == got["backtest"]["at"]
    code, out, _ = gw("spares", "--machines", "128", "--history", str(tmp_path / "a.csv"), "--class", "xid_79")
    assert code == 2


def test_spares_for_a_job_of_the_store(gw, store):
    code, out, _ = gw("spares", "--job", "job0", "--store", store, "--format", "json")
    assert code == 0
    got = json.loads(out)
    culprits = from_incidents(incident_row(i) for i in incidents())
    assert got["job_machines"] == 12  # the latest topology: 48 ranks on 12 machines
    assert got["unknown_ends"] == len(culprits)  # the store knows the job's recovery, not the machine's repair
    code, out, _ = gw("spares", "--job", "job0", "--store", store)
    assert code == 0 and out.startswith("spares ") and "bound by" in out


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
