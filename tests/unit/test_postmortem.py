"""`gangwatch report`'s model and text (gangwatch/report/postmortem.py) from rows built here, its SQL on chDB, and its
one-line errors.

The rows are what the store holds: contract records through the sink's own row functions (sinks/tables.py).
Stage seconds, offsets from the onset, time per state and ETTR are computed here from the timestamps, by
direct sums or by sampling the time axis, never copied from the code's output.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from html.parser import HTMLParser

import pytest
from gangwatch.schemas import Action, Finding, Incident, Job, RankInfo, Step
from gangwatch.sinks.store import open_store
from gangwatch.sinks.tables import action_row, finding_row, incident_row, job_row, telemetry_row

from gangwatch.cli import main
from gangwatch.cli.options import EXIT_EXTRA, EXIT_INPUT, EXIT_USAGE
from gangwatch.report import postmortem as pm
from gangwatch.report import text as reporttext

pytestmark = pytest.mark.unit

T0 = dt.datetime(2026, 3, 2, 8, 0, tzinfo=dt.UTC).timestamp()
BUDGETS = {"detect": 2.0, "localize": 300.0, "replace": 120.0, "rollback": 120.0, "comm_rebuild": 60.0,
           "total": 150.0}
RANKS = 8  # two per node: rank r on node n{r // 2}
STEPS = 60
SLOW_RANK, SLOW_FROM = 5, 30  # rank 5 (node n002) computes slower from step 30 on

ONSET = T0 + 30.25
TIMES = {"onset": ONSET, "detected": ONSET + 2.5, "localized": ONSET + 9.125, "decided": ONSET + 15.5,
         "recovered": ONSET + 200.0}


def _stage_s() -> dict[str, float]:
    """The stages as triage times them (docs/domain.md): each from the stage before it to its own milestone."""
    t = TIMES
    return {"detect": t["detected"] - t["onset"], "localize": t["localized"] - t["detected"],
            "decide": t["decided"] - t["localized"], "total": t["recovered"] - t["onset"]}


def _finding(fid: str, ts: float, **kw) -> Finding:
    base = {"type": "fail_slow", "detector": "failslow.compute", "rank": SLOW_RANK, "node": "n002", "score": 3.5,
            "evidence": {"cost_frac": 0.1}}
    return Finding(id=fid, ts=ts, job="j1", **{**base, **kw})


INCIDENT = Incident(id="i-slow", ts=TIMES["recovered"], job="j1", cls="hang", onset_ts=ONSET,
                    detected_ts=TIMES["detected"], localized_ts=TIMES["localized"], decided_ts=TIMES["decided"],
                    recovered_ts=TIMES["recovered"], culprit_nodes=["n002"], evicted_nodes=["n002"], path="hot",
                    stage_s=_stage_s(), over_budget=[])
FINDINGS = [
    _finding("f-c", ONSET + 14.0, score=9.0),
    _finding("f-a", ONSET + 2.5),
    _finding("f-b", ONSET + 3.0, type="hw_fault", detector="hardware.nvml", score=0.6,
             evidence={"name": "THROTTLE:sw_thermal", "temp_c": 91.0, "message": "line one\nline two"}),
    _finding("f-uncited", ONSET + 4.0, type="stack_outlier", detector="flight"),
]
ACTIONS = [
    Action(id="a-2", ts=TIMES["decided"], job="j1", incident="i-slow", type="replace", nodes=["n002"],
           reason="THROTTLE:sw_thermal, fail_slow x2; n002 makes each step 12% longer: replace",
           evidence=["f-c", "f-a"], path="hot"),
    Action(id="a-1", ts=TIMES["decided"] - 1.0, job="j1", incident="i-slow", type="escalate", nodes=["n002"],
           reason="shadow first", evidence=["f-b"], path="manual", extra={"shadow": True}),
]
LIFE = [(T0 - 5.0, "starting"), (T0, "running"), (T0 + 100.0, "paused"), (T0 + 130.0, "running"),
        (T0 + 400.0, "finished")]
PLANNED = Incident(id="i-maint", ts=T0 + 101.0, job="j1", cls="planned", planned=True, onset_ts=T0 + 100.0,
                   detected_ts=T0 + 100.0, recovered_ts=T0 + 130.0)
OTHER = Incident(id="i-other", ts=T0 + 3 * 86400, job="j2", cls="fail_stop", onset_ts=T0 + 3 * 86400,
                 detected_ts=T0 + 3 * 86400 + 1.0, culprit_nodes=["n9"])


def _step_s(rank: int, step: int) -> tuple[float, float]:
    """(step_s, compute_s): a synchronous job's step lasts as long as its slowest rank's compute, plus 0.2 s."""
    compute = [0.8 + (0.3 if r == SLOW_RANK and step >= SLOW_FROM else 0.0) + 0.001 * r for r in range(RANKS)]
    return max(compute) + 0.2, compute[rank]


def _step_ts(rank: int, step: int) -> float:
    return T0 + step + 0.01 * rank


def _steps() -> list[Step]:
    return [Step(ts=_step_ts(r, s), job="j1", rank=r, step=s, step_s=_step_s(r, s)[0], compute_s=_step_s(r, s)[1])
            for r in range(RANKS) for s in range(STEPS)]


def _life() -> list[Finding]:
    return [Finding(id=f"life-{k}", ts=ts, job="j1", type="job_state", detector="life",
                    evidence={"state": st, "previous": LIFE[k - 1][1] if k else None, "cause": "test"})
            for k, (ts, st) in enumerate(LIFE)]


def _report(**kw) -> pm.IncidentReport:
    return pm.incident_report(incident_row(INCIDENT), [action_row(a) for a in ACTIONS],
                              [finding_row(f) for f in FINDINGS if f.id != "f-uncited"], BUDGETS, **kw)


def _iso_ms(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{round(ts % 1 * 1000):03d}Z"


# --- the model from rows ------------------------------------------------------------------------------------------


def test_stages_are_judged_against_the_budgets_given():
    r = _report()
    want = _stage_s()
    assert [s.name for s in r.stages] == list(want)
    for s in r.stages:
        assert s.seconds == pytest.approx(want[s.name], abs=1e-9)
        budget = BUDGETS.get(s.name)
        assert s.budget == budget and s.over == (budget is not None and want[s.name] > budget)
    assert r.over_budget == ["detect", "total"]  # 2.5 s against 2 s; 200 s against 150 s; decide has no budget


def test_a_stage_without_a_budget_is_over_only_where_the_row_says_so():
    row = {**incident_row(INCIDENT), "over_budget": ["decide"]}
    [decide] = [s for s in pm.stages(row, BUDGETS) if s.name == "decide"]
    assert decide.budget is None and decide.over


def test_the_evidence_chain_is_the_cited_findings_in_time_order_each_once():
    rows = [finding_row(f) for f in FINDINGS if f.id != "f-uncited"]
    r = pm.incident_report(incident_row(INCIDENT), [], rows + rows[:1], BUDGETS)  # a retried insert: twice
    cited = sorted((f for f in FINDINGS if f.id != "f-uncited"), key=lambda f: (f.ts, f.id))
    assert [e.id for e in r.evidence] == [f.id for f in cited] == ["f-a", "f-b", "f-c"]
    b = r.evidence[1]
    assert (b.type, b.rank, b.node, b.score) == ("hw_fault", SLOW_RANK, "n002", 0.6)
    assert "name THROTTLE:sw_thermal" in b.gist and "message line one" in b.gist and "line two" not in b.gist


def test_the_decision_is_the_first_action_carried_out_not_a_shadow_one():
    r = _report()
    assert [a.id for a in r.actions] == ["a-1", "a-2"]  # by time
    assert r.decision.id == "a-2" and r.decision.reason.endswith("replace")
    shadow_only = pm.incident_report(incident_row(INCIDENT), [action_row(ACTIONS[1])], [], BUDGETS)
    assert shadow_only.decision.id == "a-1" and shadow_only.decision.shadow
    assert pm.incident_report(incident_row(INCIDENT), [], [], BUDGETS).decision is None


def _acted(*acts: tuple[str, float, list[str]]) -> pm.IncidentReport:
    rows = [action_row(Action(id=f"a-{i}", ts=TIMES["decided"] + dt_, job="j1", incident="i-slow", type=t, nodes=n,
                              reason=f"{t} because", evidence=[], path="hot")) for i, (t, dt_, n) in enumerate(acts)]
    return pm.incident_report(incident_row(INCIDENT), rows, [], BUDGETS)


def test_the_root_cause_names_the_decision_that_closed_it_and_the_ladder_before_it():
    """Issue 47: a hang's report said `decision: collect_stacks` (its sweep) where `replace n001` decided it; an
    SDC's said `dual_run` where rollback + isolate + dual_run did; a degrade said "recovered"."""
    hang = _acted(("collect_stacks", -20.0, []), ("replace", 0.0, ["n001"]))
    assert [a.type for a in hang.decided_by] == ["replace"] and [a.type for a in hang.ladder] == ["collect_stacks"]
    text = reporttext.incident_text(hang)
    assert "decision: replace n001" in text and "ladder before it: collect_stacks at " in text
    sdc = _acted(("rollback", 0.0, []), ("isolate", 0.0, ["n003"]), ("dual_run", 0.0, ["n003"]))
    assert [a.type for a in sdc.decided_by] == ["rollback", "isolate", "dual_run"] and sdc.ladder == ()
    assert "decision: rollback + isolate n003 + dual_run n003" in reporttext.incident_text(sdc)
    slow = _acted(("degrade", 0.0, ["n002"]))
    assert slow.state == "running degraded" and slow.times["recovered"] is not None
    text = reporttext.incident_text(slow)
    assert "running degraded" in text.splitlines()[0] and "recovered" not in text.splitlines()[0]
    assert "  running degraded: kept running and watched, nothing repaired" in text
    only_sweep = _acted(("collect_stacks", 0.0, []))
    assert [a.type for a in only_sweep.decided_by] == ["collect_stacks"] and only_sweep.ladder == ()
    from gangwatch.report.htmlpage import incident_html  # the page says the same

    page = incident_html(hang)
    assert "<p>decision: <b>replace</b> n001 (path hot)</p><p>ladder before it: collect_stacks at " in page
    assert "<p>decision: <b>rollback</b> + <b>isolate</b> n003 + <b>dual_run</b> n003 (path hot)" in incident_html(sdc)
    assert "running degraded" in incident_html(slow) and "recovered" not in incident_html(slow).split("<h2>")[0]


def test_the_step_window_keeps_one_point_per_rank_and_step_inside_it():
    steps = _steps()
    rows = [telemetry_row(s) for s in steps]
    again = next(r for r in rows if (r["rank"], r["step"]) == (2, 20))
    broken = next(r for r in rows if (r["rank"], r["step"]) == (3, 25))
    rows = [r for r in rows if r is not broken] + [{**again, "ts": again["ts"] + 0.001, "step_s": 9.0},
                                                   {**broken, "step_s": math.nan}]
    start, end = T0 + 10.0, T0 + 50.0
    w = pm.step_window(rows, start, end, named=[SLOW_RANK], nodes_of={r: f"n{r // 2:03d}" for r in range(RANKS)},
                       culprits=["n002"])
    want = {(s.rank, s.step): s.step_s for s in steps if start <= s.ts <= end}
    want[(2, 20)] = 9.0  # stored again later: the later one counts
    del want[(3, 25)]  # no finite step time
    assert w.ranks == sorted({r for r, _ in want}) and w.steps == sorted({s for _, s in want})
    grid = w.matrix()
    for i, r in enumerate(w.ranks):
        for j, s in enumerate(w.steps):
            assert grid[i][j] == want.get((r, s)), (r, s)
    compute = w.matrix("compute_s")
    assert compute[w.ranks.index(SLOW_RANK)][w.steps.index(40)] == pytest.approx(_step_s(SLOW_RANK, 40)[1])
    assert w.culprit_ranks == {4, 5} and w.named_ranks == {SLOW_RANK}
    assert w.step_at(ONSET) == math.ceil(ONSET - T0)  # step s finishes at T0 + s (+ 0.01 rank)
    assert w.step_at(end + 1) is None


def test_the_job_life_time_in_each_state_matches_the_time_axis_sampled():
    life = pm.moves([job_row(f) for f in reversed(_life())])
    got = pm.time_in_states(life)
    dt_s = 0.01
    sampled: dict[str, float] = {}
    t = LIFE[0][0]
    while t < LIFE[-1][0]:
        state = [st for ts, st in LIFE if ts <= t][-1]
        sampled[state] = sampled.get(state, 0.0) + dt_s
        t += dt_s
    assert set(got) == set(sampled) == {"starting", "running", "paused"}
    assert all(got[k] == pytest.approx(sampled[k], abs=0.05) for k in got)


def test_alive_jobs_overlap_the_period():
    spans = [{"job": "before", "first_ts": 0.0, "last_ts": 50.0, "last_state": "finished"},
             {"job": "still", "first_ts": 0.0, "last_ts": 50.0, "last_state": "running"},
             {"job": "inside", "first_ts": 120.0, "last_ts": 150.0, "last_state": "stopped"},
             {"job": "after", "first_ts": 200.0, "last_ts": 250.0, "last_state": "running"},
             {"job": "ends-in", "first_ts": 0.0, "last_ts": 100.0, "last_state": "failed"}]
    assert pm.alive(spans, 100.0, 200.0) == {"still", "inside", "ends-in"}
    assert pm.alive(spans, 100.0, None) == {"still", "inside", "after", "ends-in"}


# --- the terminal text --------------------------------------------------------------------------------------------


def test_the_incident_text_has_the_timeline_cause_chain_path_and_stages():
    text = reporttext.incident_text(_report())
    for m, ts in TIMES.items():
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(m + " "))
        assert _iso_ms(ts) in line
        if m != "onset":
            assert f"+{ts - ONSET:.1f} s" in line
    assert "culprit nodes n002" in text and "decision: replace n002 (path hot)" in text
    assert " ".join(ACTIONS[0].reason.split()) in " ".join(text.split())  # wrapped, never cut
    chain = text[text.index("evidence chain"):text.index("recovery path")]
    at = {f.id: chain.find(_iso_ms(f.ts)) for f in FINDINGS}
    assert 0 < at["f-a"] < at["f-b"] < at["f-c"] and at["f-uncited"] == -1 and "stack_outlier" not in chain
    stage_lines = {ln.split()[0]: ln for ln in text[text.index("stages against budget"):].splitlines()[1:5]}
    assert "OVER BUDGET by 0.5 s" in stage_lines["detect"] and "OVER BUDGET by 50.0 s" in stage_lines["total"]
    assert "OVER" not in stage_lines["localize"] and "no budget" in stage_lines["decide"]
    assert f"recovered {_iso_ms(TIMES['recovered'])}, 200.0 s after onset" in text
    assert "none stored around the onset" in text  # no step window given


def test_an_open_incident_says_so():
    row = {**incident_row(INCIDENT), "recovered_ts": None, "stage_names": ["detect"], "stage_seconds": [2.5]}
    text = reporttext.incident_text(pm.incident_report(row, [], [], BUDGETS))
    assert "OPEN (not recovered)" in text and "not recovered (as far as the store knows)" in text
    assert "decision: none recorded" in text and "(none: no action" in text


def test_the_job_text_counts_the_life_and_lists_incidents():
    ettr = [{"job": "j1", "wall_s": 405.0, "running_s": 370.0, "lost_s": 170.0, "ettr": 0.4938}]
    r = pm.job_report("j1", [job_row(f) for f in _life()], [incident_row(i) for i in (INCIDENT, PLANNED)], ettr)
    text = reporttext.job_text(r)
    assert "ETTR 0.494" in text and "starting 1, paused 1" in text and "finished 1" in text
    assert text.index("i-slow") < text.index("i-maint") and f"recovered {_stage_s()['total']:.1f} s" in text


# --- the SQL on the embedded store ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    path = tmp_path_factory.mktemp("pm") / "store"
    store = open_store(f"chdb:{path}")
    try:
        store.create_tables()
        early = Incident(id=INCIDENT.id, ts=INCIDENT.detected_ts, job="j1", cls="fail_slow", onset_ts=ONSET,
                         detected_ts=INCIDENT.detected_ts)  # the version written at detection: FINAL drops it
        store.insert("gw_incidents", [incident_row(i) for i in (early, INCIDENT, PLANNED, OTHER)])
        store.insert("gw_findings", [finding_row(f) for f in FINDINGS])
        store.insert("gw_actions", [action_row(a) for a in ACTIONS])
        store.insert("gw_jobs", [job_row(f) for f in _life()])
        topo = Job(ts=T0 - 5.0, job="j1", ranks=[RankInfo(rank=r, node=f"n{r // 2:03d}") for r in range(RANKS)])
        store.insert("gw_telemetry", [telemetry_row(r) for r in [topo, *_steps()]])
    finally:
        store.close()
    return f"chdb:{path}"


def _run(url: str):
    def run(sql: str) -> list[dict]:
        store = open_store(url, create=False)
        try:
            return store.query(sql)
        finally:
            store.close()
    return run


def _lost(intervals: list[tuple[float, float]], incidents: list[tuple[float, float]]) -> float:
    """Seconds of the running intervals inside any incident, by sampling every 10 ms."""
    n = 0
    for a, b in intervals:
        t = a
        while t < b:
            n += any(o <= t < e for o, e in incidents)
            t += 0.01
    return n * 0.01


def test_the_incident_from_the_store(store_url):
    r = pm.gather_incident(_run(store_url), "i-slow", BUDGETS, window_s=10.0)
    assert r.cls == "hang" and [e.id for e in r.evidence] == ["f-a", "f-b", "f-c"]
    assert r.decision.id == "a-2" and r.over_budget == ["detect", "total"]
    w = r.steps
    start, end = ONSET - 10.0, TIMES["detected"] + 10.0
    want_steps = sorted({s for s in range(STEPS) if any(start <= _step_ts(r_, s) <= end for r_ in range(RANKS))})
    assert w.ranks == list(range(RANKS)) and w.steps == want_steps
    assert w.named_ranks == {SLOW_RANK} and w.culprit_ranks == {4, 5}


def test_the_job_and_its_ettr_from_the_store(store_url):
    r = pm.gather_job(_run(store_url), "j1")
    assert [m.state for m in r.moves] == [st for _, st in LIFE] and [i.id for i in r.incidents] == ["i-slow", "i-maint"]
    running = [(LIFE[k][0], LIFE[k + 1][0]) for k in range(len(LIFE) - 1) if LIFE[k][1] == "running"]
    lost = _lost(running, [(ONSET, TIMES["recovered"])])  # a hang stops the job; the planned stop is not lost
    wall = LIFE[-1][0] - LIFE[0][0]
    want = (sum(b - a for a, b in running) - lost) / wall
    assert r.ettr.ettr == pytest.approx(want, abs=1e-3) and r.ettr.lost_s == pytest.approx(lost, abs=0.1)


def test_a_period_from_the_store(store_url):
    day = pm.gather_period(_run(store_url), T0 - 60.0, T0 + 86400.0)
    assert [i.id for i in day.incidents] == ["i-slow", "i-maint"]
    counts = {c["class"]: (c["platform"], c["planned_stops"]) for c in day.classes}
    assert counts == {"hang": (1, 0), "planned": (0, 1)}
    assert [e.job for e in day.ettr] == ["j1"]
    later = pm.gather_period(_run(store_url), T0 + 2 * 86400, None)
    assert [i.id for i in later.incidents] == ["i-other"] and later.ettr == ()  # j1 finished before it
    assert [i.id for i in pm.gather_latest(_run(store_url))] == ["i-slow", "i-maint", "i-other"]


# --- the command: one-line errors, and the page -------------------------------------------------------------------


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["report", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_user_mistakes_are_one_line_each(capsys, store_url, tmp_path):
    cases = [(("--incident", "i-nope"), EXIT_USAGE, "no incident 'i-nope' in the store"),
             (("--job", "nobody"), EXIT_USAGE, "no job 'nobody' in the store"),
             (("--since", "last tuesday"), EXIT_USAGE, "want ISO 8601 UTC"),
             (("--until", "2026-03-02"), EXIT_USAGE, "--until needs --since"),
             (("--since", "2026-03-03", "--until", "2026-03-02"), EXIT_USAGE, "must be after --since"),
             (("--html", str(tmp_path / "x.html")), EXIT_USAGE, "--html needs what to report")]
    for argv, code, words in cases:
        got, _, err = _cli(capsys, *argv, "--store", store_url)
        lines = [ln for ln in err.splitlines() if ln.startswith("gangwatch report: error: ")]
        assert got == code and len(lines) == 1 and words in lines[0], (argv, err)
    empty = tmp_path / "empty" / "store"
    s = open_store(f"chdb:{empty}")
    s.create_tables()
    s.close()
    got, _, err = _cli(capsys, "--incident", "i-slow", "--store", f"chdb:{empty}")
    assert got == EXIT_INPUT and "holds no incidents and no job life" in err


@pytest.mark.parametrize("where", ["a missing folder", "a folder"])
def test_an_html_page_that_cannot_be_written_is_said_before_any_report(capsys, store_url, tmp_path, where):
    """Issue 47: the whole text report came first, then "No such file or directory"."""
    page = tmp_path / "missing" / "x.html" if where == "a missing folder" else tmp_path
    got, out, err = _cli(capsys, "--incident", "i-slow", "--store", store_url, "--html", str(page))
    lines = [ln for ln in err.splitlines() if ln.startswith("gangwatch report: error: ")]
    assert got == EXIT_INPUT and out == "" and len(lines) == 1, (out, err)
    assert ("its folder" in lines[0] and "does not exist" in lines[0]) if where == "a missing folder" else \
        "is a folder; give a file name" in lines[0]


def test_html_without_matplotlib_names_the_extra_and_writes_nothing(capsys, monkeypatch, store_url, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    page = tmp_path / "incident.html"
    code, out, err = _cli(capsys, "--incident", "i-slow", "--store", store_url, "--html", str(page))
    assert code == EXIT_EXTRA and "pip install 'gangwatch[report]'" in err and out == "" and not page.exists()
    assert _cli(capsys, "--incident", "i-slow", "--store", store_url)[0] == 0  # the terminal report needs none


class _Figures(HTMLParser):
    """Per `figure[data-plot]`: how many svg, path and image elements it holds; and every URL the page names."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: dict[str, dict[str, int]] = {}
        self.current: str | None = None
        self.urls: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.add(tag)
        self.urls += [v for k, v in attrs if k in ("src", "href", "xlink:href") and v]
        if tag == "figure" and a.get("data-plot"):
            self.current = a["data-plot"]
            self.plots[self.current] = {"svg": 0, "path": 0, "image": 0, "empty": "empty" in (a.get("class") or "")}
        elif self.current and tag in ("svg", "path", "image"):
            self.plots[self.current][tag] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self.current = None


def test_the_html_page_is_self_contained_with_every_plot(capsys, store_url, tmp_path):
    page = tmp_path / "incident.html"
    code, out, _ = _cli(capsys, "--incident", "i-slow", "--store", store_url, "--html", str(page))
    assert code == 0 and "incident i-slow" in out
    text = page.read_text(encoding="utf-8")
    parsed = _Figures()
    parsed.feed(text)
    assert set(parsed.plots) == {"stages", "failstop", "heatmap"}  # a hang with no stack sweep stored: liveness
    for name, got in parsed.plots.items():
        assert not got["empty"] and got["svg"] == 1 and got["path"] >= 5, (name, got)
    assert parsed.plots["heatmap"]["image"] >= 1  # the raster, inline
    assert text.index('data-plot="failstop"') < text.index('data-plot="stages"')  # the class's plot first
    assert {"script", "link", "iframe", "object"}.isdisjoint(parsed.tags)
    assert all(u.startswith(("#", "data:")) for u in parsed.urls), [u for u in parsed.urls if u[:1] != "#"][:5]
    assert not re.search(r"url\(\s*['\"]?(?!#|data:)", text) and "@import" not in text
    for name in ("job", "period"):
        argv = ("--job", "j1") if name == "job" else ("--since", "2026-03-01", "--until", "2026-03-08")
        f = tmp_path / f"{name}.html"
        assert _cli(capsys, *argv, "--store", store_url, "--html", str(f))[0] == 0
        p = _Figures()
        p.feed(f.read_text(encoding="utf-8"))
        want = {"life", "recover"} if name == "job" else {"interruptions", "ettr"}
        assert set(p.plots) == want and all(v["svg"] == 1 and v["path"] > 0 for v in p.plots.values()), p.plots


def test_counts_read_as_counts():
    """Issue 47: "the 1 latest incidents", "1 findings", "dissents at 58 steps" (read as a step number)."""
    from gangwatch.report.text import counted

    assert [counted(n, "finding") for n in (0, 1, 2, 1234)] == \
        ["0 findings", "1 finding", "2 findings", "1,234 findings"]
    assert counted(1, "child", "children") == "1 child" and counted(3, "child", "children") == "3 children"


def test_what_the_commands_print_counts_one_as_one(capsys):
    """Issue 47, the rest of "1 findings": the replay summary and progress line, a job's life, a step window."""
    from types import SimpleNamespace

    from gangwatch.cli import console

    one = SimpleNamespace(records=1, wall_s=1.0, first_ts=T0, last_ts=T0, rejected=0, findings=1, by_type={},
                          actions=1, incidents=1, out_dir="out")
    said = console.summary(one)
    assert "replayed  1 record in" in said and "incidents 1 record (one each" in said
    console.ProgressLine()(one, 0.5)
    line = capsys.readouterr().err.split("\x1b[2K")[-1]
    assert "50% 1 record (" in line and ", 1 finding, 1 action, " in line and "findings" not in line
    cut = SimpleNamespace(**{**vars(one), "findings": 23, "by_type": {"stack_outlier": 23}})
    words = " ".join(console.summary(cut).split())  # wrapped to the terminal, never cut
    assert f"stack_outlier 23 {console.meaning('stack_outlier', width=1000)} actions" in words
    assert console.meaning("stack_outlier", width=1000).endswith("away from the dominant one of its stage")
    many = SimpleNamespace(**{**vars(one), "records": 1234, "incidents": 2})
    assert "replayed  1,234 records in" in console.summary(many) and "incidents 2 records" in console.summary(many)
    job = pm.job_report("j1", [job_row(_life()[0])], [], [])
    assert "life (1 move; entered" in reporttext.job_text(job)
    steps = pm.step_window([telemetry_row(s) for s in _steps() if s.rank == 0], T0, T0 + STEPS)
    text = reporttext.incident_text(_report(steps=steps))
    assert f"step times: 1 rank, steps 0..{STEPS - 1} in" in text


def test_an_event_judged_after_its_window_shows_both_its_times_named():
    """Issue 47: a fail-stop report put the Xid at -1.5 s in its plot (the kernel log's time) and at +0.5 s in its
    evidence table (the finding's, after the 2 s storm window), neither explained. The finding now dates the event
    (`event_ts`), and the evidence chain names both."""
    from gangwatch.detectors.hardware import HardwareDetector

    from tests.unit.test_hardware import T0 as H0
    from tests.unit.test_hardware import topo, xid

    det = HardwareDetector(topo())
    det.observe(xid(H0 + 10.0))
    [found] = det.advance(H0 + 20.0)
    assert found.evidence["event_ts"] == H0 + 10.0 and found.ts > H0 + 10.0
    died = _finding("f-exit", H0 + 11.5, type="fail_stop", detector="failstop.process", rank=3, node="n001",
                    evidence={"cause": "exception"})  # between the Xid's logging and its finding
    chain = pm.evidence_chain([finding_row(died), finding_row(found)])
    clock = dt.datetime.fromtimestamp  # the names the gist gives, from the two times
    logged, judged = (clock(t, dt.UTC).strftime("%H:%M:%S.%f")[:10] for t in (H0 + 10.0, found.ts))
    assert [c.id for c in chain] == [found.id, "f-exit"]  # by the event's time: the Xid was logged first
    e = chain[0]
    assert (e.ts, e.event_ts, e.at) == (found.ts, H0 + 10.0, H0 + 10.0)
    assert e.gist.startswith(f"kernel log {logged}, found {judged}; ")
    assert chain[1].event_ts is None and chain[1].at == chain[1].ts and "found" not in chain[1].gist
    # the report shows the event at the time its plot marks it (the kernel log's), the finding's time named beside
    report = pm.incident_report(incident_row(INCIDENT), [], [finding_row(died), finding_row(found)], BUDGETS)
    text = reporttext.incident_text(report)
    chain_text = text[text.index("evidence chain"):text.index("recovery path")]
    assert f"  {_iso_ms(H0 + 10.0)}  hw_fault" in chain_text and _iso_ms(found.ts) not in chain_text
    assert chain_text.index(_iso_ms(H0 + 10.0)) < chain_text.index(_iso_ms(H0 + 11.5))


def test_the_stage_chart_turns_logarithmic_where_its_bars_span_orders_of_magnitude():
    """Issue 47: on a linear 0-400 s axis a 2 s detection was a sliver."""
    from gangwatch.report.htmlpage import stages_plot

    spread = stages_plot([pm.Stage("detect", 2.0, 30.0, False), pm.Stage("total", 400.0, 600.0, False)])
    close = stages_plot([pm.Stage("detect", 20.0, 30.0, False), pm.Stage("total", 40.0, 60.0, False)])
    assert "seconds (log scale)" in spread and "seconds (log scale)" not in close and "seconds" in close


def test_a_degraded_incident_is_listed_as_running_degraded_never_recovered():
    """Issue 47: a fail-slow decided by `degrade` (path non_stop) closed after 66.5 s and every list said "recovered
    66.5 s"; the job kept running with its straggler. An open one read "recovered open"."""
    degraded = {**incident_row(INCIDENT), "id": "i-kept", "class": "fail_slow", "path": "non_stop",
                "recovered_ts": ONSET + 66.5}
    open_ = {**incident_row(INCIDENT), "id": "i-open", "recovered_ts": None}
    fixed = incident_row(INCIDENT)
    lines = pm.incident_lines([degraded, open_, fixed])
    by_id = {i.id: i for i in lines}
    assert {k: (i.state, i.recover_s) for k, i in by_id.items()} == {
        "i-kept": ("running degraded", None), "i-open": ("open", None),
        "i-slow": ("recovered", pytest.approx(TIMES["recovered"] - ONSET))}
    rows = {ln.split()[1]: ln for ln in reporttext.incident_table(lines)}
    assert rows["i-kept"].rstrip().endswith("running degraded") and "recovered" not in rows["i-kept"]
    assert rows["i-open"].rstrip().endswith("open (not recovered)")
    assert rows["i-slow"].rstrip().endswith(f"recovered {TIMES['recovered'] - ONSET:.1f} s")
    from gangwatch.report import htmlpage

    page = htmlpage.job_html(pm.job_report("j1", [], [degraded, open_, fixed], []))
    cells = re.findall(r"<td>([^<]*)</td>", page)
    assert "running degraded" in cells and "open" in cells and f"{TIMES['recovered'] - ONSET:.1f} s" in cells
    assert "66.5 s" not in cells
    # the report of one: a degrade its last acting action (a sweep before it, an escalation after) is degraded too
    report = _acted(("collect_stacks", -5.0, []), ("degrade", 0.0, ["n002"]), ("escalate", 5.0, ["n002"]))
    assert report.state == "running degraded"
    # its timeline: the close is named a close, not a recovery (the fail-slow report said "recovered +66.5 s")
    timeline = reporttext.incident_text(report).split("root cause")[0]
    rows = [ln for ln in timeline.splitlines()[3:] if ln.strip()]
    assert [ln.split()[0] for ln in rows] == ["onset", "detected", "localized", "decided", "closed"]
    assert rows[-1].endswith(f"+{TIMES['recovered'] - ONSET:.1f} s  (kept running degraded: nothing recovered)")
    assert "recovered" not in timeline.replace("nothing recovered", "")
    from gangwatch.report.htmlpage import incident_html

    assert f"<td>closed (running degraded: nothing recovered)</td><td>{_iso_ms(TIMES['recovered'])}</td>" \
        in incident_html(report) and "<td>recovered</td>" not in incident_html(report)
    assert "<td>recovered</td>" in incident_html(_report())  # a recovery still reads as one
    assert _acted(("degrade", 0.0, ["n002"]), ("replace", 30.0, ["n002"])).state == "recovered"
