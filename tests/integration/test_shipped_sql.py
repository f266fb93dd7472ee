"""The analysts' shipped queries (gangwatch/report/sql/*.sql) on both engines, against figures computed here.

A month of a 32-job fleet is drawn from a seed: each job's incidents of every class (planned ones
too), most recovered, some still open, each written twice as the worker writes an incident that
moves (a first version without its recovery, then the final one: `FINAL` must keep the latter),
with culprit and evicted nodes out of 64, stage seconds in stage order and the stages over
budget; each job's life (gw_jobs, its gang's size changing at restarts); the stragglers of the
fail-slow incidents and findings of every type naming nodes and GPUs (each written twice, as a
retried insert does); and the nodes' raw telemetry, NVML samples on the days each node was up
(evicted nodes away for a while, or for good), which the store rolls up per node and day. The
rows go into the embedded chDB store and into the real ClickHouse server through the sink's own
row functions; every shipped query runs on both (`gangwatch sql`, the command a user types) and
must give what plain Python computes from the drawn month.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import math
import random
from collections import defaultdict

import pytest
from gangwatch.detectors.catalog import REGISTRY
from gangwatch.detectors.failslow import StragglerEvidence
from gangwatch.schemas import Finding, Incident
from gangwatch.schemas.classes import CLASSES as INCIDENT_CLASSES
from gangwatch.schemas.records import Gpu, Hw, Record, Step
from gangwatch.sinks.store import open_store
from gangwatch.sinks.tables import DDL, finding_row, incident_row, job_row, telemetry_row
from gangwatch.triage.budgets import Budgets

from gangwatch.cli import main
from gangwatch.report.queries import FOLDER, catalog

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 11, 2, tzinfo=dt.UTC).timestamp()  # a Monday
DAY = 86400.0
STAGES = ("detect", "localize", "decide", "replace", "rollback", "comm_rebuild", "total")
CLASSES = ("fail_stop", "fail_slow", "hang", "sdc", "stall", "unknown", "planned")
NOW = T0 + 31 * DAY


def month(seed: int = 7) -> list[Incident]:
    """The final version of every incident of the month (the store also gets an earlier one of each); one of
    them in a job with no life in gw_jobs."""
    rng, decide = random.Random(seed), random.Random(seed + 1)
    out = []
    for j in range(32):
        for k in range(rng.randint(0, 9)):
            cls = rng.choice(CLASSES)
            onset = T0 + rng.uniform(0, 30 * DAY)
            detected = onset + rng.uniform(1, 40)
            recovered = onset + rng.uniform(60, 4000) if rng.random() < 0.8 else None
            culprits = sorted(rng.sample([f"n{n:02d}" for n in range(64)], rng.randint(0, 2)))
            evicted = [n for n in culprits if rng.random() < 0.7]
            stages = {s: round(rng.uniform(0.5, 900), 3) for s in STAGES if rng.random() < 0.7}
            over = [s for s in stages if rng.random() < 0.2]
            decided = detected + decide.uniform(5, 7200) if evicted and decide.random() < 0.8 else None
            out.append(Incident(id=f"i-{j}-{k}", ts=(recovered or detected) + 1, job=f"job{j:02d}", cls=cls,
                                planned=cls == "planned", onset_ts=onset, detected_ts=detected, decided_ts=decided,
                                recovered_ts=recovered, culprit_nodes=culprits, evicted_nodes=evicted,
                                path="hot" if evicted else None, stage_s=stages, over_budget=over))
    out.append(Incident(id="i-nolife", ts=T0 + 3 * DAY, job="job-nolife", cls="fail_slow", onset_ts=T0 + 2 * DAY,
                        detected_ts=T0 + 2 * DAY + 30, culprit_nodes=["n07"]))
    return out


INCIDENTS = month()


def lives(seed: int = 11) -> list[Finding]:
    """Each job's life over the month, as the `job_state` findings the life detector emits (gw_jobs' rows):
    starting, running, pauses, failures and restarts, and for most jobs a clean end."""
    rng = random.Random(seed)
    out = []
    for j in range(32):
        t = T0 + rng.uniform(0, 2 * DAY)
        seq = [(t, "starting")]
        t += rng.uniform(30, 300)
        seq.append((t, "running"))
        while t < T0 + 29 * DAY:
            t += rng.uniform(0.2, 3) * DAY
            if rng.random() < 0.5:
                seq.append((t, "paused"))
                t += rng.uniform(60, 900)
            else:
                seq.append((t, "failed"))
                t += rng.uniform(5, 60)
                seq.append((t, "restarting"))
                t += rng.uniform(60, 600)
                seq.append((t, "starting"))
                t += rng.uniform(30, 300)
            seq.append((t, "running"))
        if rng.random() < 0.7:
            seq.append((t + rng.uniform(0, DAY), "finished"))
        restarts = [sum(st == "restarting" for _, st in seq[:k + 1]) for k in range(len(seq))]
        out += [Finding(id=f"f-{j}-{k}", ts=ts, job=f"job{j:02d}", type="job_state", detector="life",
                        evidence={"state": st, "previous": seq[k - 1][1] if k else None, "cause": "drawn",
                                  "ended_ranks": 0, "job_ranks": 8 * (1 + (j + restarts[k]) % 4)})
                for k, (ts, st) in enumerate(seq)]  # a restart may come back with another gang size
    return out


LIVES = lives()
STOPS = {"fail_stop", "hang", "stall", "unknown"}
NODES = [f"n{n:02d}" for n in range(64)]


def straggler(fid: str, ts: float, job: str, node: str, onset: float, cost: float | None, slowdown: float) -> Finding:
    """A `fail_slow` finding as the fail-slow detector writes it (its evidence a StragglerEvidence)."""
    ev = StragglerEvidence(relative=4.2, individual=5.1, slowdown_frac=slowdown, steps_flagged=6, window=20, step=900,
                           pp=0, compute_s=1.3, stage_median_s=1.0, comm_wait_s=0.05, onset_ts=onset, cost_frac=cost)
    return Finding(id=fid, ts=ts, job=job, type="fail_slow", detector="failslow", rank=3, node=node, gpu=3,
                   score=4.2, evidence=ev.encode())


def findings(seed: int = 13) -> list[Finding]:
    """The stragglers of each fail-slow incident: reported 0 to 3 times while it is open (some without a cost_frac:
    their slowdown_frac stands in) and once before its onset (no part of that one's cost); and findings of every other
    registered type naming a node of the first 16 (or none) and a GPU (or none)."""
    rng = random.Random(seed)
    out = []
    for i in INCIDENTS:
        if i.cls != "fail_slow":
            continue
        node = (i.culprit_nodes or ["n00"])[0]
        end = i.recovered_ts or NOW
        for k in range(rng.randint(0, 3)):
            cost = None if rng.random() < 0.25 else round(rng.uniform(0.01, 0.6), 6)
            out.append(straggler(f"s-{i.id}-{k}", rng.uniform(i.onset_ts, end), i.job, node, i.onset_ts, cost,
                                 round(rng.uniform(0.05, 0.9), 6)))
        out.append(straggler(f"s-{i.id}-before", i.onset_ts - rng.uniform(60, 2 * DAY), i.job, node,
                             i.onset_ts - 3 * DAY, 0.99, 0.99))
    others = sorted(set(REGISTRY.types) - {"fail_slow"})
    for k in range(700):
        out.append(Finding(id=f"g-{k}", ts=T0 + rng.uniform(0, 30 * DAY), job=f"job{rng.randrange(32):02d}",
                           type=rng.choice(others), detector="drawn", node=rng.choice(NODES[:16] + [None]),
                           gpu=rng.choice([None, None, *range(8)]), evidence={"drawn": k}))
    return out


FINDINGS = findings()


def evicted_at(i: Incident) -> float:
    """When an incident evicted its nodes: its decision, else its detection, else its onset."""
    return next(t for t in (i.decided_ts, i.detected_ts, i.onset_ts, i.ts) if t is not None)


def telemetry(seed: int = 17) -> list[Record]:
    """Raw records of the month and a few days past it: on each day a node is up (three days in four), one to three
    NVML samples; some kernel events (hw); step records (naming a rank, no node). After an unplanned eviction its
    node is away that day and 0 to 5 more days (for good, one time in six); a planned one takes nobody away."""
    rng = random.Random(seed)
    away: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for i in INCIDENTS:
        for n in i.evicted_nodes if not i.planned else ():
            day = int(evicted_at(i) // DAY)
            away[n].append((day, day + (10**6 if rng.random() < 1 / 6 else rng.randint(0, 5))))
    out: list[Record] = []
    first = int(T0 // DAY)
    for n in NODES:
        for day in range(first, first + 34):
            if any(a <= day <= b for a, b in away[n]) or rng.random() < 0.25:
                continue
            for _ in range(rng.randint(1, 3)):
                out.append(Gpu(ts=day * DAY + rng.uniform(0, DAY), node=n, gpu=rng.randrange(8), util_pct=97.0))
            if rng.random() < 0.1:
                out.append(Hw(ts=day * DAY + rng.uniform(0, DAY), node=n, source="xid", message="Xid 13", code=13))
    for k in range(200):
        out.append(Step(ts=T0 + rng.uniform(0, 30 * DAY), job="job00", rank=k % 8, step=k, step_s=1.0))
    return out


TELEMETRY = telemetry()


@pytest.fixture(params=["chdb", "server"])
def engine_url(request, tmp_path, unique):
    """An empty store on each engine (the server's database dropped after the test)."""
    if request.param == "chdb":
        yield f"chdb:{tmp_path / 'store'}"
        return
    host, port = request.getfixturevalue("clickhouse_addr")
    yield f"clickhouse://{host}:{port}/{unique}"
    store = open_store(f"clickhouse://{host}:{port}/default")
    store.query(f"DROP DATABASE IF EXISTS {unique}")
    store.close()


@pytest.fixture
def store_url(engine_url):
    """The drawn month in a store of each engine."""
    url = engine_url
    store = open_store(url)
    store.create_tables()
    earlier = [Incident(**{**{f: getattr(i, f) for f in ("id", "job", "cls", "planned", "onset_ts", "detected_ts",
                                                         "culprit_nodes")}, "ts": i.detected_ts})
               for i in INCIDENTS]  # what the worker wrote when each was detected
    store.insert("gw_incidents", [incident_row(i) for i in earlier])
    store.insert("gw_incidents", [incident_row(i) for i in INCIDENTS])
    store.insert("gw_jobs", [job_row(f) for f in LIVES])
    for _ in range(2):  # a retried insert: FINAL keeps one row per id
        store.insert("gw_findings", [finding_row(f) for f in FINDINGS])
    store.insert("gw_telemetry", [telemetry_row(r) for r in TELEMETRY[::2]])
    store.insert("gw_telemetry", [telemetry_row(r) for r in TELEMETRY[1::2]])  # the rollup sums across inserts
    store.close()
    return url


@pytest.fixture
def sql(capsys):
    """Run a shipped query as a user types it: `gangwatch sql NAME --store URL --format json --param k=v ...`."""

    def run(url: str, name: str, **params: object) -> list[dict]:
        capsys.readouterr()
        argv = ["sql", name, "--store", url, "--format", "json", *[a for k, v in params.items()
                                                                     for a in ("--param", f"{k}={v}")]]
        assert main(argv) == 0, capsys.readouterr().err
        return json.loads(capsys.readouterr().out)

    return run


def unplanned(since: float = 0.0, until: float = 0.0) -> list[Incident]:
    return [i for i in INCIDENTS if not i.planned and i.onset_ts >= since and (not until or i.onset_ts < until)]


def close(got: float | None, want: float | None, tol: float = 0.051) -> bool:
    return (got is None) == (want is None) and (got is None or abs(got - want) <= tol)


def test_open_incidents(store_url, sql):
    got = sql(store_url, "open_incidents", now=NOW)
    want = sorted((i for i in unplanned() if i.recovered_ts is None), key=lambda i: (i.onset_ts, i.id))
    assert [r["id"] for r in got] == [i.id for i in want] and got
    assert all(close(r["open_s"], NOW - i.onset_ts) and r["culprit_nodes"] == i.culprit_nodes
               for r, i in zip(got, want, strict=True))
    one = sql(store_url, "open_incidents", now=NOW, job=want[0].job)
    assert {r["job"] for r in one} == {want[0].job} and len(one) == sum(i.job == want[0].job for i in want)


# The data's last event time: the latest ts of anything the store's output tables hold (queries.BUILTINS).
DATA_END = max(r.ts for r in (*INCIDENTS, *FINDINGS, *LIVES))


@pytest.mark.parametrize(("name", "end"), [("open_incidents", "now"), ("failslow_cost", "until"),
                                           ("planned_vs_platform", "until")])
def test_a_window_without_an_end_ends_at_the_datas_last_event_not_the_wall_clock(store_url, sql, name, end):
    got = sql(store_url, name)
    assert got and got == sql(store_url, name, **{end: DATA_END}) != sql(store_url, name, **{end: DATA_END + DAY})
    if name == "open_incidents":
        onset = {i.id: i.onset_ts for i in INCIDENTS}
        assert all(close(r["open_s"], DATA_END - onset[r["id"]]) for r in got)


def test_time_to_recover_per_job_and_week(store_url, sql):
    since, until = T0 + 7 * DAY, T0 + 28 * DAY
    got = sql(store_url, "time_to_recover", since=since, until=until)
    groups: dict[tuple[str, str], list[Incident]] = defaultdict(list)
    for i in unplanned(since, until):
        day = dt.datetime.fromtimestamp(i.onset_ts, dt.UTC).date()
        groups[(i.job, str(day - dt.timedelta(days=day.weekday())))].append(i)
    assert [(r["job"], r["week"]) for r in got] == sorted(groups)
    for r in got:
        incs = groups[(r["job"], r["week"])]
        ttr = [i.recovered_ts - i.onset_ts for i in incs if i.recovered_ts is not None]
        assert (r["incidents"], r["recovered"]) == (len(incs), len(ttr))
        assert close(r["mttr_s"], sum(ttr) / len(ttr) if ttr else None)
        assert close(r["max_ttr_s"], max(ttr) if ttr else None)


def test_stages_against_their_budgets(store_url, sql):
    got = sql(store_url, "stages_vs_budget")
    want = {}
    for stage in STAGES:
        xs = sorted(i.stage_s[stage] for i in unplanned() if stage in i.stage_s)
        over = sum(stage in i.over_budget for i in unplanned() if stage in i.stage_s)
        want[stage] = (len(xs), xs[int(0.5 * len(xs))], xs[min(len(xs) - 1, int(0.95 * len(xs)))], xs[-1], over)
    assert [r["stage"] for r in got] == list(STAGES)  # in stage order, not alphabetical
    for r in got:
        n, p50, p95, top, over = want[r["stage"]]
        assert (r["incidents"], r["over_budget"]) == (n, over)
        assert close(r["p50_s"], p50) and close(r["p95_s"], p95) and close(r["max_s"], top)
    hangs = sql(store_url, "stages_vs_budget", **{"class": "hang"})
    assert sum(r["incidents"] for r in hangs if r["stage"] == "total") == \
        sum("total" in i.stage_s for i in unplanned() if i.cls == "hang")
    week = (T0 + 7 * DAY, T0 + 14 * DAY)  # one job's second week
    job = next(i.job for i in unplanned(*week) if "detect" in i.stage_s)
    mine = [i for i in unplanned(*week) if i.job == job]
    got = {r["stage"]: r for r in sql(store_url, "stages_vs_budget", job=job, since=week[0], until=week[1])}
    for stage in STAGES:
        xs = sorted(i.stage_s[stage] for i in mine if stage in i.stage_s)
        assert (got[stage]["incidents"], got[stage]["max_s"]) == (len(xs), round(xs[-1], 1)) if xs else \
            stage not in got


def test_interruptions_by_class_keep_planned_apart(store_url, sql):
    got = {r["class"]: r for r in sql(store_url, "interruptions_by_class")}
    total = len(unplanned())
    for cls in CLASSES:
        incs = [i for i in INCIDENTS if i.cls == cls]
        r = got[cls]
        assert (r["platform"], r["planned_stops"]) == (sum(not i.planned for i in incs), sum(i.planned for i in incs))
        assert close(r["platform_share"], sum(not i.planned for i in incs) / total, 0.0006)
        assert r["recovered"] == sum(not i.planned and i.recovered_ts is not None for i in incs)
    assert got["planned"]["platform"] == 0 and got["planned"]["platform_share"] == 0  # never the platform's


def test_top_offender_nodes(store_url, sql):
    got = sql(store_url, "top_offender_nodes", limit=10)
    blamed, evicted = defaultdict(int), defaultdict(int)
    for i in unplanned():
        for n in i.culprit_nodes:
            blamed[n] += 1
        for n in i.evicted_nodes:
            evicted[n] += 1
    nodes = sorted(set(blamed) | set(evicted), key=lambda n: (-blamed[n], -evicted[n], n))[:10]
    assert [(r["node"], r["blamed"], r["evicted"]) for r in got] == [(n, blamed[n], evicted[n]) for n in nodes]


def union(spans: list[tuple[float, float]]) -> float:
    """The length of the union of [start, end) spans (empty ones count nothing)."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(x for x in spans if x[1] > x[0]):
        total += max(0.0, b - max(a, reach))
        reach = max(reach, b)
    return total


def ettr(job: str, until: float = 0.0) -> tuple[float, float, float, float]:
    """(wall, running, lost, ettr) of `job` by the definition in ettr.sql, computed here."""
    moves = sorted((f.ts, f.evidence["state"]) for f in LIVES if f.job == job and (not until or f.ts < until))
    end = until or moves[-1][0]
    ends = [ts for ts, _ in moves[1:]] + [end]
    running = [(a, b) for (a, st), b in zip(moves, ends, strict=True) if st == "running"]
    running_s = sum(max(0.0, min(b, end) - min(a, end)) for a, b in running)
    incs = [(i.onset_ts, i.recovered_ts or 1e18) for i in INCIDENTS if i.job == job and not i.planned
            and i.cls in STOPS]
    lost = sum(union([(max(a, o), min(b, e, end)) for o, e in incs]) for a, b in running)
    wall = end - moves[0][0]
    return wall, running_s, lost, (running_s - lost) / wall


@pytest.mark.parametrize("until", [0.0, T0 + 20 * DAY])
def test_effective_training_time_ratio_per_job(store_url, sql, until):
    assert STOPS == {n for n, c in INCIDENT_CLASSES.items() if c.stops_the_job}  # what ettr.sql names
    got = sql(store_url, "ettr", **({"until": until} if until else {}))
    jobs = sorted({f.job for f in LIVES if not until or f.ts < until})
    assert [r["job"] for r in got] == jobs
    for r in got:
        wall, running, lost, ratio = ettr(r["job"], until)
        assert close(r["wall_s"], wall) and close(r["running_s"], running) and close(r["lost_s"], lost), r
        assert close(r["ettr"], ratio, 0.00006) and 0 <= r["ettr"] < 1
    assert any(r["lost_s"] > 0 for r in got)  # incidents did cost some jobs training time


def spans_length(spans: list[tuple[float, float]], minus: list[tuple[float, float]]) -> float:
    """The length of what `spans` cover and `minus` does not: summed over the pieces between all their ends."""
    cuts = sorted({x for span in spans + minus for x in span})
    return sum(b - a for a, b in itertools.pairwise(cuts) if covered(a, spans) and not covered(a, minus))


def covered(x: float, spans: list[tuple[float, float]]) -> bool:
    return any(a <= x < b for a, b in spans)


@pytest.mark.parametrize(("since", "until"), [(0.0, NOW), (T0 + 5 * DAY, T0 + 20 * DAY)])
def test_planned_vs_platform_per_job_and_in_all(store_url, sql, since, until):
    got = sql(store_url, "planned_vs_platform", since=since, until=until)
    incs = [i for i in INCIDENTS if since <= i.onset_ts < until]
    jobs = sorted({i.job for i in incs})
    assert [r["job"] for r in got] == [*jobs, "(all)"]
    totals = [0, 0, 0.0, 0.0]
    for r in got[:-1]:
        mine = [i for i in incs if i.job == r["job"]]
        span = {i.id: (i.onset_ts, min(i.recovered_ts or math.inf, until)) for i in mine}
        planned = [span[i.id] for i in mine if i.planned]
        want = (sum(not i.planned for i in mine), len(planned),
                spans_length([span[i.id] for i in mine if not i.planned and i.cls in STOPS], planned),
                spans_length(planned, []))
        assert (r["platform"], r["planned"]) == want[:2] and close(r["platform_down_s"], want[2]), r
        assert close(r["planned_down_s"], want[3]), r
        totals = [t + w for t, w in zip(totals, want, strict=True)]
    everything = got[-1]
    assert (everything["platform"], everything["planned"]) == tuple(totals[:2])
    assert close(everything["platform_down_s"], totals[2], 0.5) and close(everything["planned_down_s"], totals[3], 0.5)
    assert close(everything["platform_share"], totals[0] / (totals[0] + totals[1]), 0.00006)
    assert close(everything["platform_down_share"], totals[2] / (totals[2] + totals[3]), 0.00006)
    assert 0 < totals[3] and 0 < totals[2]  # both kinds of downtime were drawn
    one = sql(store_url, "planned_vs_platform", since=since, until=until, job=jobs[0])
    assert [r["job"] for r in one] == [jobs[0], "(all)"] and one[0] == got[0]


def step_cost(f: Finding) -> float:
    """What a straggler costs each step, as triage reads it: its cost_frac, else its slowdown_frac."""
    return f.evidence["slowdown_frac"] if f.evidence["cost_frac"] is None else f.evidence["cost_frac"]


@pytest.mark.parametrize("until", [NOW, T0 + 20 * DAY])
def test_failslow_cost_per_job(store_url, sql, until):
    got = sql(store_url, "failslow_cost", until=until)
    want: dict[str, list] = defaultdict(lambda: [0, 0, 0.0, 0.0, 0.0, 0.0, False])
    for i in INCIDENTS:
        if i.planned or i.cls != "fail_slow" or i.onset_ts >= until:
            continue
        end = min(i.recovered_ts or math.inf, until)
        c = max((step_cost(f) for f in FINDINGS if f.type == "fail_slow" and f.job == i.job
                 and i.onset_ts <= f.ts <= end), default=0.0)
        lost = (end - i.onset_ts) * c / (1 + c)
        moves = sorted((f.ts, f.evidence["job_ranks"]) for f in LIVES if f.job == i.job)
        ranks = ([r for t, r in moves if t <= i.onset_ts] or [moves[0][1]])[-1] if moves else None
        w = want[i.job]
        w[:6] = [w[0] + 1, w[1] + (end == until), w[2] + end - i.onset_ts, w[3] + lost,
                 w[4] + lost * (ranks or 0) / 3600, max(w[5], c)]
        w[6] = w[6] or ranks is not None
    assert [r["job"] for r in got] == sorted(want)
    for r in got:
        n, still_open, open_s, lost, gpu_h, peak, known = want[r["job"]]
        assert (r["incidents"], r["still_open"]) == (n, still_open), r
        assert close(r["open_s"], open_s) and close(r["lost_s"], lost) and close(r["peak_cost_frac"], peak, 0.00006)
        assert close(r["gpu_hours"], gpu_h if known else None, 0.0006), r
    assert any(r["lost_s"] > 0 for r in got) and {"job-nolife"} == {r["job"] for r in got if r["gpu_hours"] is None}
    assert any(f.evidence["cost_frac"] is None for f in FINDINGS)  # the slowdown stood in for some


def innocent(clean_days: int, kinds: set[str], since: float = 0.0, until: float = math.inf) -> list[dict]:
    """Every unplanned eviction of [since, until) as innocent_evictions.sql defines it, from the raw records."""
    seen: dict[str, set[int]] = defaultdict(set)
    for r in TELEMETRY:
        if getattr(r, "node", None) and r.kind in kinds:
            seen[r.node].add(int(r.ts // DAY))
    rows = []
    for i in INCIDENTS:
        t = evicted_at(i)
        if i.planned or not since <= t < until:
            continue
        for n in i.evicted_nodes:
            later = [j.onset_ts for j in INCIDENTS if not j.planned and n in j.culprit_nodes and j.onset_ts > t]
            blamed = int(min(later) // DAY) if later else math.inf
            clean = sorted(d for d in seen[n] if t // DAY < d < blamed)
            rows.append({"job": i.job, "incident": i.id, "class": i.cls, "node": n, "evicted_ts": t,
                         "returned": str(dt.date(1970, 1, 1) + dt.timedelta(days=clean[0])) if clean else None,
                         "clean_days": len(clean), "blamed_again_ts": min(later, default=None),
                         "innocent": int(len(clean) >= clean_days)})
    return sorted(rows, key=lambda r: (r["evicted_ts"], r["incident"], r["node"]))


def test_innocent_evictions_from_the_rollup(store_url, sql):
    assert "gw_node_days" in catalog()["innocent_evictions"].text
    assert "gw_telemetry" not in catalog()["innocent_evictions"].text  # the rollup, never the raw records
    every = sql(store_url, "innocent_evictions", all=1)
    want = innocent(3, {"gpu"})
    assert every == want
    assert {0, 1} == {r["innocent"] for r in want} and any(r["blamed_again_ts"] for r in want if r["clean_days"])
    assert sql(store_url, "innocent_evictions") == [r for r in want if r["innocent"]]
    week = sql(store_url, "innocent_evictions", clean_days=7, kinds="gpu,hw", since=T0 + 3 * DAY, until=T0 + 25 * DAY)
    assert week == [r for r in innocent(7, {"gpu", "hw"}, T0 + 3 * DAY, T0 + 25 * DAY) if r["innocent"]] and week


def test_node_days_rollup_sums_what_telemetry_named(store_url):
    store = open_store(store_url)
    try:
        got = store.query("SELECT node, toString(day) AS day, kind, job, sum(records) AS records FROM gw_node_days "
                          "GROUP BY node, day, kind, job ORDER BY node, day, kind, job")
        raw = store.query("SELECT count() AS n FROM gw_telemetry")[0]["n"]
    finally:
        store.close()
    want: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for r in TELEMETRY:
        if getattr(r, "node", None):
            day = dt.datetime.fromtimestamp(r.ts, dt.UTC).date()
            want[(r.node, str(day), r.kind, getattr(r, "job", None) or "")] += 1
    assert [(r["node"], r["day"], r["kind"], r["job"], r["records"]) for r in got] == \
        [(*k, n) for k, n in sorted(want.items())]
    assert raw == len(TELEMETRY) > len(got)


def test_a_store_of_an_older_release_gets_the_rollup(engine_url):
    old = open_store(engine_url)
    for table, stmt in DDL.items():
        if not table.startswith("gw_node_days"):
            old.query(stmt.format(db="").strip())  # the tables as a release without the rollup made them
    old.insert("gw_telemetry", [telemetry_row(TELEMETRY[0])])  # before the upgrade: not rolled up
    old.close()
    store = open_store(engine_url)
    try:
        store.create_tables()
        store.create_tables()  # again: IF NOT EXISTS, nothing doubled
        store.insert("gw_telemetry", [telemetry_row(r) for r in TELEMETRY[1:4]])
        got = store.query("SELECT sum(records) AS n FROM gw_node_days")[0]["n"]
    finally:
        store.close()
    assert got == sum(1 for r in TELEMETRY[1:4] if getattr(r, "node", None)) > 0


BUDGETED = tuple(f.name for f in dataclasses.fields(Budgets))


def test_stage_budget_defaults_are_triages():
    params = catalog()["stage_budget_revision"].params
    assert {n: float(params[n].default) for n in BUDGETED} == dataclasses.asdict(Budgets())
    assert set(BUDGETED) <= set(STAGES)


@pytest.mark.parametrize("given", [{}, {"class": "hang", "detect": 30, "total": 450.5}])
def test_stage_budget_revision(store_url, sql, given):
    got = sql(store_url, "stage_budget_revision", **given)
    budgets = {**dataclasses.asdict(Budgets()), **{k: v for k, v in given.items() if k in BUDGETED}}
    incs = [i for i in unplanned() if given.get("class", i.cls) == i.cls]
    assert [r["stage"] for r in got] == [s for s in STAGES if s in BUDGETED]  # in stage order; `decide` has none
    for r in got:
        xs = sorted(i.stage_s[r["stage"]] for i in incs if r["stage"] in i.stage_s)
        p50, p95 = xs[int(0.5 * len(xs))], xs[min(len(xs) - 1, int(0.95 * len(xs)))]
        suggested = max(5.0, math.ceil(max(p95, 1.5 * p50) / 5) * 5)
        assert (r["incidents"], r["budget_s"], r["suggested_s"]) == (len(xs), budgets[r["stage"]], suggested), r
        assert close(r["p50_s"], p50) and close(r["p95_s"], p95)
        assert r["over_budget"] == sum(x > budgets[r["stage"]] for x in xs)
        assert r["over_suggested"] == sum(x > suggested for x in xs) <= len(xs) * 0.05 + 1
    assert any(r["suggested_s"] != r["budget_s"] for r in got)


def can_open_an_incident() -> set[str]:
    """Finding types some detector declares as able to open an incident, as evidence against a node."""
    return {name for name, declared in REGISTRY.types.items()
            if any(ft.policy.incident is not None and ft.policy.opens is not False and not ft.policy.job_level
                   for ft in declared)}


@pytest.mark.parametrize("given", [{}, {"types": "hw_fault,fail_slow", "since": T0 + 4 * DAY, "until": T0 + 9 * DAY,
                                        "limit": 7}])
def test_top_offender_gpus(store_url, sql, given):
    default = catalog()["top_offender_gpus"].params["types"].default.strip("'")
    assert set(default.split(",")) == can_open_an_incident()
    types = set(given.get("types", default).split(","))
    since, until = given.get("since", 0.0), given.get("until", math.inf)
    named = [f for f in FINDINGS if f.node and f.type in types and since <= f.ts < until]
    per_gpu: dict[tuple[str, int | None], list[Finding]] = defaultdict(list)
    for f in named:
        per_gpu[(f.node, f.gpu)].append(f)
    per_node = {n: sum(f.node == n for f in named) for n in {f.node for f in named}}
    order = sorted(per_gpu, key=lambda k: (-len(per_gpu[k]), -per_node[k[0]], k[0], -1 if k[1] is None else k[1]))
    want = [{"node": n, "gpu": g, "findings": len(per_gpu[(n, g)]), "node_findings": per_node[n],
             "types": sorted({f.type for f in per_gpu[(n, g)]}), "jobs": len({f.job for f in per_gpu[(n, g)]}),
             "last_ts": max(f.ts for f in per_gpu[(n, g)])} for n, g in order][:given.get("limit", 20)]
    assert sql(store_url, "top_offender_gpus", **given) == want
    assert any(r["gpu"] is None for r in want) or given  # node-level findings have a row of their own


def test_machines_down_per_day(store_url, sql):
    """What the spare-pool advisor reads (`gangwatch spares`): per UTC day of onset, the unplanned incidents that
    took machines, their failures (culprits), distinct machines, the largest burst, recovered and open ones."""
    days: dict[str, list[Incident]] = defaultdict(list)
    for i in INCIDENTS:
        if not i.planned and i.culprit_nodes:
            days[dt.datetime.fromtimestamp(i.onset_ts, dt.UTC).date().isoformat()].append(i)
    got = sql(store_url, "machines_down")
    assert [r["day"] for r in got] == sorted(days) and got
    for r in got:
        incs = days[r["day"]]
        n = sum(len(i.culprit_nodes) for i in incs)
        back = [i.recovered_ts - i.onset_ts for i in incs if i.recovered_ts is not None]
        assert (r["incidents"], r["failures"], r["largest"]) == (len(incs), n, max(len(i.culprit_nodes) for i in incs))
        assert r["machines"] == len({x for i in incs for x in i.culprit_nodes})
        assert (r["recovered"], r["open"]) == (sum(len(i.culprit_nodes) for i in incs if i.recovered_ts), n -
                                               sum(len(i.culprit_nodes) for i in incs if i.recovered_ts))
        assert close(r["mean_recover_s"], sum(back) / len(back) if back else None)
    job = INCIDENTS[0].job
    mine = sql(store_url, "machines_down", job=job, since=T0 + 5 * DAY)
    assert sum(r["failures"] for r in mine) == sum(len(i.culprit_nodes) for i in INCIDENTS if i.job == job
                                                   and not i.planned and i.onset_ts >= T0 + 5 * DAY)


def test_every_shipped_query_is_tested_here():
    """Every query shipped in gangwatch/report/sql/ runs here, on chDB and on the ClickHouse server."""
    tested = {"open_incidents", "time_to_recover", "stages_vs_budget", "interruptions_by_class", "top_offender_nodes",
              "ettr", "planned_vs_platform", "failslow_cost", "innocent_evictions", "stage_budget_revision",
              "top_offender_gpus", "machines_down"}
    assert set(catalog()) == tested, f"untested or gone: {sorted(set(catalog()) ^ tested)} (in {FOLDER})"
