"""The knowledge base of closed incidents (gangwatch/fleet/kb.py) and `gangwatch kb search` (gangwatch/cli/kb.py).

Rows are made here the way the store holds them (contract records through the sink's row functions) and as
incident records (JSONL), then from a real replay into chDB of three simulated scenarios: the same fault kind on
two nodes of two jobs and another kind. Expected figures come from the records and the scenarios' ground truth:
recovery times by subtraction, similarities by hand from the documented weights, filters by direct selection.
"""

from __future__ import annotations

import datetime as dt
import json

import orjson
import pytest
from gangwatch.fleet import kb
from gangwatch.schemas import Action, Finding, Incident, to_dict
from gangwatch.sinks.store import open_store
from gangwatch.sinks.tables import action_row, finding_row, incident_row

from gangwatch import cli
from gangwatch.cli import kb as kb_cli
from gangwatch.cli.options import EXIT_USAGE

pytestmark = pytest.mark.unit

T0 = dt.datetime(2026, 3, 2, 8, 0, tzinfo=dt.UTC).timestamp()
BUDGETS = {"detect": 2.0, "localize": 300.0, "replace": 120.0, "total": 150.0}

Spec = tuple[str, str, str | None, dict]  # (type, detector, node, evidence)


def _xid(node: str, code: int = 79, rank: int = 2) -> list[Spec]:
    """A GPU that fell off the bus: the Xid, the kernel line and the process that died of it."""
    name = {79: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", 48: "DBE_ECC_ERROR"}[code]
    return [("hw_fault", "hardware.xid", node,
             {"severity": "fatal", "source": "xid", "code": code, "name": name, "count": 1,
              "message": f"NVRM: Xid (PCI:0000:{rank}b:00): {code}, pid={1000 + rank}"}),
            ("fail_stop", "failstop.process", node,
             {"cause": "exception", "ranks": [rank], "node_ranks": 2,
              "message": f"RuntimeError: CUDA error at 0x{rank:04x}: unspecified launch failure (step {rank * 7})"})]


def _hang(node: str) -> list[Spec]:
    return [("hang", "hang.progress", None, {"last_step": 50, "last_progress_ts": T0, "threshold_s": 20.0,
                                             "baseline_s": 1.0, "lagging_ranks": []}),
            ("stack_outlier", "flight", node, {"snapshot": "s-1", "pg": "14", "desc": "DATA_PARALLEL_GROUP",
                                               "seq": 52, "op": "allreduce", "reason": "never_enqueued"}),
            ("stack_outlier", "stacks", node, {"snapshot": "s-1", "cluster": 1, "top_frame": "_recv (connection.py)"})]


def _straggler(node: str) -> list[Spec]:
    return [("fail_slow", "failslow.compute", node, {"slowdown_frac": 0.2, "steps_flagged": 9, "cost_frac": 0.1}),
            ("hw_fault", "hardware.nvml", node, {"severity": "degraded", "source": "nvml", "code": None,
                                                 "name": "THROTTLE:hw_thermal", "count": 3, "message": "91 C"})]


class Case:
    """One incident with its actions and findings, as records."""

    def __init__(self, iid: str, job: str, cls: str, onset: float, culprit: str, specs: list[Spec], *,
                 recover_s: float | None = 90.0, reason: str = "", path: str = "hot", sweep: bool = False) -> None:
        self.findings = [Finding(id=f"f-{iid}-{k}", ts=onset + 1.0 + k, job=job, type=t, detector=d, node=n,
                                 rank=k, score=0.5 + k, evidence=ev) for k, (t, d, n, ev) in enumerate(specs)]
        decided = onset + 10.0
        ids = [f.id for f in self.findings]
        self.actions = ([Action(id=f"a-{iid}-s", ts=onset + 2.0, job=job, incident=iid, type="collect_stacks",
                                reason="no step progress: sweep", evidence=ids[:1])] if sweep else [])
        self.actions.append(Action(id=f"a-{iid}-d", ts=decided, job=job, incident=iid, type="replace", nodes=[culprit],
                                   reason=reason or f"{cls}; culprit {culprit}", evidence=ids, path=path))
        recovered = None if recover_s is None else onset + recover_s
        stages = {"detect": 1.0, "localize": 5.0, "decide": 4.0, **({"total": recover_s} if recover_s else {})}
        self.incident = Incident(
            id=iid, ts=recovered or decided, job=job, cls=cls, onset_ts=onset, detected_ts=onset + 1.0,
            localized_ts=onset + 6.0, decided_ts=decided, recovered_ts=recovered, culprit_nodes=[culprit],
            evicted_nodes=[culprit], path=path, stage_s=stages,
            over_budget=[k for k, v in stages.items() if k in BUDGETS and v > BUDGETS[k]])

    def rows(self) -> tuple[list[dict], list[dict], list[dict]]:
        return [incident_row(self.incident)], [action_row(a) for a in self.actions], [finding_row(f) for f in
                                                                                     self.findings]


def _rows(cases: list[Case]) -> tuple[list[dict], list[dict], list[dict]]:
    inc, act, fnd = [], [], []
    for c in cases:
        i, a, f = c.rows()
        inc, act, fnd = inc + i, act + a, fnd + f
    return inc, act, fnd


def _sig(specs: list[Spec]) -> kb.Signature:
    return kb.Signature.of(specs)


# --- the signature ----------------------------------------------------------------------------------------------


def test_the_same_failure_on_another_node_rank_and_time_has_the_same_signature():
    a, b = _sig(_xid("n001", rank=2)), _sig(_xid("n017", rank=13))
    assert a == b and a.similarity(b) == 1.0
    assert "xid:79" in a.features and not any("n001" in f or "n017" in f for f in a.features)
    assert _sig(_hang("n003")) == _sig(_hang("n040"))


def test_the_similarity_is_weighted_jaccard_by_the_documented_weights():
    a = kb.Signature(frozenset({"type:hang", "det:hang.progress", "named:stacks"}))
    b = kb.Signature(frozenset({"type:hang", "xid:79", "named:stacks", "ev:x.y=z"}))
    want = (3 + 2) / (3 + 1 + 2 + 4 + 1)  # shared: type, named; union adds det, xid and the ev field
    assert a.similarity(b) == pytest.approx(want) and b.similarity(a) == pytest.approx(want)
    assert a.similarity(kb.Signature(frozenset({"type:fail_slow"}))) == 0.0
    assert kb.Signature().similarity(kb.Signature()) == 0.0


def test_a_hang_and_a_straggler_do_not_look_alike_and_another_xid_is_between():
    xid79 = _sig(_xid("n001"))
    assert _sig(_hang("n001")).similarity(_sig(_straggler("n001"))) == 0.0
    assert xid79.similarity(_sig(_hang("n001"))) == 0.0  # the same node does not make them alike
    other_xid = xid79.similarity(_sig(_xid("n002", code=48)))
    assert 0.0 < other_xid < 1.0


def test_a_signature_round_trips_as_json_and_refuses_another_version():
    s = _sig(_hang("n003") + _xid("n004"))
    assert kb.Signature.from_json(json.loads(json.dumps(s.to_json()))) == s
    for bad in ({"v": 99, "features": []}, ["type:hang"], {"v": 1, "features": [1]}):
        with pytest.raises(ValueError):
            kb.Signature.from_json(bad)


# --- entries ----------------------------------------------------------------------------------------------------


def test_an_entry_has_its_timeline_root_cause_path_stages_and_links():
    c = Case("i-1", "j1", "hang", T0, "n003", _hang("n003"), recover_s=200.0, sweep=True,
             reason="hang, stack_outlier x2; culprit n003")
    late = Action(id="a-i-1-late", ts=T0 + 500.0, job="j1", incident="i-1", type="requeue", nodes=["n003"],
                  reason="after the recovery", path="cold")
    shadow = Action(id="a-i-1-sh", ts=T0 + 5.0, job="j1", incident="i-1", type="escalate", reason="shadow",
                    evidence=["f-gone"], path="manual", extra={"shadow": True})
    inc, act, fnd = c.rows()
    (e,) = kb.entries(inc, [*act, action_row(late), action_row(shadow)], fnd, BUDGETS)
    rec = c.incident
    assert e.times == {"onset": rec.onset_ts, "detected": rec.detected_ts, "localized": rec.localized_ts,
                       "decided": rec.decided_ts, "recovered": rec.recovered_ts}
    assert e.recover_s == pytest.approx(rec.recovered_ts - rec.onset_ts)
    assert [a.id for a in e.actions] == ["a-i-1-s", "a-i-1-sh", "a-i-1-d", "a-i-1-late"]  # by event time
    assert e.decision.id == "a-i-1-d" and e.reason == "hang, stack_outlier x2; culprit n003"
    assert e.ended_by.id == "a-i-1-d" and e.fix == "replace n003 (hot)"  # the requeue came after the recovery
    assert e.culprit_nodes == ("n003",) and "n003" in e.root_cause and "hang" in e.root_cause
    cited = ["f-i-1-0", "f-gone", "f-i-1-1", "f-i-1-2"]  # in the order first cited: sweep, shadow, decision
    assert list(e.findings) == cited and [a.id for a in e.actions] == e.to_dict()["links"]["actions"]
    want_over = [k for k, v in rec.stage_s.items() if k in BUDGETS and v > BUDGETS[k]]
    assert e.over_budget == want_over == ["total"]
    assert [(s.name, s.seconds, s.budget) for s in e.stages] == [(k, v, BUDGETS.get(k)) for k, v in
                                                                 rec.stage_s.items()]
    assert e.signature == _sig(_hang("n999"))


def test_only_closed_incidents_at_their_latest_version_are_entries():
    closed = Case("i-rec", "j1", "fail_stop", T0, "n001", _xid("n001"))
    opened = Case("i-open", "j1", "fail_stop", T0 + 900.0, "n002", _xid("n002"), recover_s=None)
    early = Incident(id="i-rec", ts=T0 + 1.0, job="j1", cls="hang", onset_ts=T0, detected_ts=T0 + 1.0)
    stopped = Incident(id="i-stop", ts=T0 + 50.0, job="j2", cls="hang", onset_ts=T0 + 20.0, detected_ts=T0 + 40.0,
                       extra={"resolution": "job_stopped"})
    inc, act, fnd = _rows([closed, opened])
    rows = [incident_row(early), *inc]  # store rows; and incident records (JSONL) with a resolution
    records = [to_dict(r) for r in (early, closed.incident, opened.incident, stopped)]
    assert [e.id for e in kb.entries(rows, act, fnd)] == ["i-rec"]
    got = kb.entries(records, [to_dict(a) for c in (closed, opened) for a in c.actions],
                     [to_dict(f) for c in (closed, opened) for f in c.findings])
    assert [e.id for e in got] == ["i-rec", "i-stop"]  # by onset
    assert got[0].cls == "fail_stop" and got[0].signature == _sig(_xid("n5"))  # the later row, evidence as dicts
    assert got[1].resolution == "job_stopped" and got[1].fix == "job_stopped" and got[1].recover_s is None


def test_an_entry_round_trips_through_its_json_form():
    e = kb.entries(*Case("i-1", "j1", "fail_stop", T0, "n001", _xid("n001")).rows(), BUDGETS)[0]
    assert kb.Entry.from_dict(orjson.loads(orjson.dumps(e.to_dict()))) == e
    with pytest.raises(ValueError, match="not a knowledge-base entry"):
        kb.Entry.from_dict({"id": "i-1"})


# --- search and closest -----------------------------------------------------------------------------------------


def _fleet() -> list[Case]:
    return [Case("i-a", "ja", "fail_stop", T0, "n001", _xid("n001"), reason="Xid 79 fell off the bus; n001"),
            Case("i-b", "jb", "fail_stop", T0 + 1000.0, "n005", _xid("n005", rank=11),
                 reason="Xid 79 fell off the bus; n005"),
            Case("i-c", "jc", "fail_stop", T0 + 2000.0, "n006", _xid("n006", rank=5),
                 reason="Xid 79 FELL off the bus; n006", recover_s=300.0),
            Case("i-d", "jd", "fail_stop", T0 + 3000.0, "n001", _xid("n001", code=48), reason="Xid 48 ECC; n001"),
            Case("i-e", "je", "hang", T0 + 4000.0, "n005", _hang("n005"), sweep=True, reason="hang; n005"),
            Case("i-f", "jf", "fail_slow", T0 + 5000.0, "n007", _straggler("n007"), reason="thermal straggler")]


def test_like_ranks_the_same_failure_first_the_more_recent_among_equals():
    cases = _fleet()
    es = kb.entries(*_rows(cases))
    got = kb.search(es, like="i-a")
    assert [m.entry.id for m in got] == ["i-c", "i-b", "i-d", "i-f"]  # i-e, a hang, shares nothing
    assert [m.similarity for m in got[:2]] == [1.0, 1.0] and 1 > got[2].similarity > got[3].similarity > 0
    assert got[3].similarity < kb.MIN_SIMILARITY  # a throttled straggler shares only "hardware named the node"
    assert [m.entry.id for m in kb.search(es, like=es[0], limit=1)] == ["i-c"]
    assert got[0].entry.recover_s == pytest.approx(300.0) and got[0].entry.fix == "replace n006 (hot)"


def test_filters_by_node_class_and_cause_most_recent_first():
    cases = _fleet()
    es = kb.entries(*_rows(cases))

    def want(keep) -> list[str]:
        return [c.incident.id for c in sorted(cases, key=lambda c: -c.incident.onset_ts) if keep(c)]

    assert [m.entry.id for m in kb.search(es)] == want(lambda c: True)
    assert [m.entry.id for m in kb.search(es, node="n005")] == want(lambda c: "n005" in c.incident.culprit_nodes)
    assert [m.entry.id for m in kb.search(es, cls="fail_stop")] == want(lambda c: c.incident.cls == "fail_stop")
    words = ("fell", "BUS")
    assert [m.entry.id for m in kb.search(es, cause="fell BUS")] == want(
        lambda c: all(w.lower() in c.actions[-1].reason.lower() for w in words))
    assert [m.entry.id for m in kb.search(es, node="n001", cls="fail_stop", cause="ecc")] == ["i-d"]
    assert kb.search(es, node="n404") == [] and len(kb.search(es, limit=2)) == 2


def test_search_refuses_an_unknown_id_and_a_limit_under_one():
    es = kb.entries(*_rows(_fleet()))
    with pytest.raises(ValueError, match="no closed incident 'i-nope'"):
        kb.search(es, like="i-nope")
    with pytest.raises(ValueError, match="limit"):
        kb.search(es, limit=0)


def test_closest_cites_the_most_alike_past_incident_above_the_floor():
    es = kb.entries(*_rows(_fleet()))
    now = kb.Signature.of(_xid("n100", rank=3))  # as triage would make it from the findings it holds
    m = kb.closest(now, es, 0.9)
    assert m.entry.id == "i-c" and m.similarity == 1.0  # i-a, i-b and i-c are equal: the most recent
    assert "i-c" in m.cite() and "replace n006 (hot)" in m.cite() and "300 s" in m.cite()
    ecc = kb.closest(kb.Signature.of(_xid("n100", code=48)), es, 0.99)
    assert ecc.entry.id == "i-d"
    assert kb.closest(kb.Signature.of(_hang("n1")), [e for e in es if e.cls != "hang"], 0.1) is None
    assert kb.closest(kb.Signature(), es, 0.5) is None
    with pytest.raises(ValueError):
        kb.closest(now, es, 0.0)


# --- a replay into chDB, and the command ---------------------------------------------------------------------


SCENARIOS = {"a": ("1", "xid79:60:n001"), "b": ("2", "xid79:70:n002"), "c": ("3", "dataloader_hang:60:r3")}


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """Three simulated jobs (8 ranks, 2 per node) replayed one after the other into one chDB store, each with the
    simulated controller, so every incident recovers. Returns (out dir, {job: (fault kind, class) from the truth})."""
    root = tmp_path_factory.mktemp("kb")
    sim, out = root / "sim", root / "out"
    kinds = {}
    for name, (seed, fault) in SCENARIOS.items():
        assert cli.main(["simulate", "--name", name, "--seed", seed, "--tp", "2", "--pp", "1", "--dp", "4",
                         "--gpus-per-node", "2", "--duration", "150", "--fault", fault, "--out", str(sim)]) == 0
        truth = orjson.loads((sim / f"{name}.truth.json").read_bytes())
        ((kind, cls),) = {(f["kind"], f["class"]) for f in truth["faults"]}
        kinds[truth["job"]] = kind, cls
        assert cli.main(["replay", str(sim / f"{name}.jsonl.gz"), "--out", str(out), "--append", "-q",
                         "--simulate-controller", str(sim / f"{name}.truth.json")]) == 0
    return out, kinds


def _store_rows(out) -> tuple[list[dict], list[dict], list[dict]]:
    store = open_store(f"chdb:{out / 'store'}", create=False)
    try:
        return kb_cli.gather(store.query)
    finally:
        store.close()


def test_like_one_replayed_xid_finds_the_other_first(replayed):
    out, kinds = replayed
    es = kb.entries(*_store_rows(out))
    by_job = {e.job: e for e in es}
    assert set(by_job) == set(kinds)  # one closed incident per job
    same = [j for j in kinds if j != "a" and kinds[j] == kinds["a"]]
    got = kb.search(es, like=by_job["a"].id)
    assert [m.entry.job for m in got][:1] == same and got[0].entry.culprit_nodes != by_job["a"].culprit_nodes
    assert all(m.similarity < got[0].similarity for m in got[1:])
    assert kb.closest(by_job["a"].signature, [by_job["c"]], kb.MIN_SIMILARITY) is None
    assert [m.entry.job for m in kb.search(es, cls="hang")] == [j for j in kinds if kinds[j][1] == "hang"]


def _kb(monkeypatch, capsys, *argv: str) -> tuple[int, str, str]:
    if kb_cli not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, kb_cli))
    code = cli.main(["kb", "search", *argv])
    got, err = capsys.readouterr()
    assert "Traceback" not in got + err
    return code, got, err


def test_the_command_on_the_replayed_store(replayed, monkeypatch, capsys):
    out, kinds = replayed
    inc, act, _ = _store_rows(out)
    ids = {r["job"]: r["id"] for r in inc}
    code, text, _ = _kb(monkeypatch, capsys, "--like", ids["a"], "--out", str(out), "--format", "json")
    hits = orjson.loads(text)
    assert code == 0 and hits[0]["id"] == ids["b"] and hits[0]["similarity"] == 1.0
    assert hits[0]["ended_by"] in hits[0]["links"]["actions"] and hits[0]["recover_s"] > 0
    code, text, _ = _kb(monkeypatch, capsys, "--like", ids["a"], "--out", str(out))
    lines = text.splitlines()
    assert code == 0 and ids["a"] in lines[0] and lines[1].split()[0] == "similarity" and ids["b"] in lines[2]
    node_b = [r for r in inc if r["job"] == "b"][0]["culprit_nodes"][0]
    code, text, _ = _kb(monkeypatch, capsys, "--node", node_b, "--out", str(out), "--format", "json")
    want = sorted(r["id"] for r in inc if node_b in r["culprit_nodes"] or node_b in r["evicted_nodes"])
    assert code == 0 and sorted(h["id"] for h in orjson.loads(text)) == want
    word = "stack_outlier"
    code, text, _ = _kb(monkeypatch, capsys, "--cause", word, "--class", "hang", "--out", str(out), "--format", "json")
    hangs = {r["id"] for r in inc if r["class"] == "hang"}
    want = sorted({a["incident"] for a in act if word in a["reason"] and a["type"] != "collect_stacks"} & hangs)
    assert code == 0 and sorted(h["id"] for h in orjson.loads(text)) == want and want


def test_the_command_says_a_mistake_in_one_line(replayed, monkeypatch, capsys):
    out, _ = replayed
    for argv, words in ((("--like", "i-nope"), "no incident 'i-nope' in the store"),
                        (("--class", "broken"), "not an incident class")):
        code, _, err = _kb(monkeypatch, capsys, *argv, "--out", str(out))
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == EXIT_USAGE and len(lines) == 1 and lines[0].startswith("gangwatch kb: error: ")
        assert words in lines[0]


def test_a_degraded_incident_is_fixed_by_nothing_and_did_not_recover_in_the_table():
    """Issue 47: `kb search` listed a fail-slow a degrade closed (path non_stop) as "fixed_by degrade n001 (non_stop),
    recovered_in 66.5 s": the straggler ran on, nothing was fixed."""
    kept = Case("i-kept", "j1", "fail_slow", T0, "n002", _xid("n002"), recover_s=66.5, path="non_stop")
    fixed = Case("i-fixed", "j2", "fail_stop", T0, "n003", _xid("n003"), recover_s=90.0)
    rows = {c.incident.id: kb_cli._table_row(kb.Match(kb.entry(c.rows()[0][0], c.rows()[1], c.rows()[2])), False)
            for c in (kept, fixed)}
    assert (rows["i-kept"]["fixed_by"], rows["i-kept"]["recovered_in"]) == ("none: kept running", "running degraded")
    assert (rows["i-fixed"]["fixed_by"], rows["i-fixed"]["recovered_in"]) == ("replace n003 (hot)", "90.0 s")
