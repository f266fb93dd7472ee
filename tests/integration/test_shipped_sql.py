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
import random
from collections import defaultdict

import pytest
from gangwatch.schemas import Incident
from gangwatch.sinks.store import open_store
from gangwatch.sinks.tables import incident_row

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


def test_every_shipped_query_is_tested_here():
    tested = {"open_incidents", "time_to_recover", "stages_vs_budget", "interruptions_by_class", "top_offender_nodes"}
    assert set(catalog()) == tested
