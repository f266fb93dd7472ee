"""The analysts' shipped queries (gangwatch/sql/*.sql) on both engines, against figures computed here.

A month of a 32-job fleet is drawn from a seed: each job's incidents of every class (planned ones
too), most recovered, some still open, each written twice as the worker writes an incident that
moves (a first version without its recovery, then the final one: `FINAL` must keep the latter),
with culprit and evicted nodes out of 64, stage seconds in stage order and the stages over
budget. The rows go into the embedded chDB store and into the real ClickHouse server through the
sink's own row function; every shipped query runs on both (`gangwatch sql`, the command a user
types) and must give what plain Python computes from the drawn incidents.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from collections import defaultdict

import pytest
from gangwatch.schemas import Finding, Incident
from gangwatch.schemas.classes import CLASSES as INCIDENT_CLASSES
from gangwatch.sinks.store import open_store
from gangwatch.sinks.tables import incident_row, job_row

from gangwatch.cli import main
from gangwatch.queries import catalog

pytestmark = pytest.mark.integration

T0 = dt.datetime(2026, 11, 2, tzinfo=dt.UTC).timestamp()  # a Monday
DAY = 86400.0
STAGES = ("detect", "localize", "decide", "replace", "rollback", "comm_rebuild", "total")
CLASSES = ("fail_stop", "fail_slow", "hang", "sdc", "stall", "unknown", "planned")
NOW = T0 + 31 * DAY


def month(seed: int = 7) -> list[Incident]:
    """The final version of every incident of the month (the store also gets an earlier one of each)."""
    rng = random.Random(seed)
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
            out.append(Incident(id=f"i-{j}-{k}", ts=(recovered or detected) + 1, job=f"job{j:02d}", cls=cls,
                                planned=cls == "planned", onset_ts=onset, detected_ts=detected,
                                recovered_ts=recovered, culprit_nodes=culprits, evicted_nodes=evicted,
                                path="hot" if evicted else None, stage_s=stages, over_budget=over))
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
        out += [Finding(id=f"f-{j}-{k}", ts=ts, job=f"job{j:02d}", type="job_state", detector="life",
                        evidence={"state": st, "previous": seq[k - 1][1] if k else None, "cause": "drawn",
                                  "ended_ranks": 0, "job_ranks": 8})
                for k, (ts, st) in enumerate(seq)]
    return out


LIVES = lives()
STOPS = {"fail_stop", "hang", "stall", "unknown"}


@pytest.fixture(params=["chdb", "server"])
def store_url(request, tmp_path, unique):
    if request.param == "chdb":
        url = f"chdb:{tmp_path / 'store'}"
    else:
        host, port = request.getfixturevalue("clickhouse_addr")
        url = f"clickhouse://{host}:{port}/{unique}"
    store = open_store(url)
    store.create_tables()
    earlier = [Incident(**{**{f: getattr(i, f) for f in ("id", "job", "cls", "planned", "onset_ts", "detected_ts",
                                                         "culprit_nodes")}, "ts": i.detected_ts})
               for i in INCIDENTS]  # what the worker wrote when each was detected
    store.insert("gw_incidents", [incident_row(i) for i in earlier])
    store.insert("gw_incidents", [incident_row(i) for i in INCIDENTS])
    store.insert("gw_jobs", [job_row(f) for f in LIVES])
    yield url
    if request.param == "server":
        store.query(f"DROP DATABASE IF EXISTS {unique}")
    store.close()


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


def test_every_shipped_query_is_tested_here():
    tested = {"open_incidents", "time_to_recover", "stages_vs_budget", "interruptions_by_class", "top_offender_nodes",
              "ettr"}
    assert set(catalog()) == tested
