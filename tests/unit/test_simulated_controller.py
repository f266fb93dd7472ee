"""Active diagnosis in replay: `gangwatch replay --simulate-controller` answers the actions as a controller would.

A simulated SDC scenario: the simulated controller knows the corrupting node from the ground truth, so the dual
run confirms it; told another node is the broken one, the same run's digests clear the suspect and it is
readmitted. Replaying twice gives the same bytes (the answers are a function of the actions)."""

from __future__ import annotations

import orjson
import pytest
from gangwatch.producers.simulate.responder import Delays, SimulatedController
from gangwatch.schemas import Action

from gangwatch.cli import main

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def sdc_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("sdc")
    assert main(["simulate", "--out", str(d), "--name", "sdc", "--fault", "sdc:60:n005", "--duration", "240"]) == 0
    return d


def replay(d, out, answer):
    assert main(["replay", str(d / "sdc.jsonl.gz"), "--out", str(d / out), "--no-store", "-q",
                 "--simulate-controller", answer]) == 0
    lines = (d / out / "incidents.jsonl").read_bytes().splitlines()
    return [orjson.loads(x) for x in lines], (d / out / "actions.jsonl").read_bytes()


def test_the_dual_run_confirms_the_corrupting_node_from_the_ground_truth(sdc_run):
    incidents, actions = replay(sdc_run, "truth", str(sdc_run / "sdc.truth.json"))
    last = [i for i in incidents if i["class"] == "sdc" and i["culprit_nodes"] == ["n005"]][-1]
    assert last["resolution"] == "confirmed" and set(last["proof"]) == {"n005", "spare-ref"}
    assert last["proof"]["n005"] != last["proof"]["spare-ref"] and b'"readmit"' not in actions
    again = replay(sdc_run, "truth2", str(sdc_run / "sdc.truth.json"))
    assert again[1] == actions  # deterministic


def test_equal_digests_readmit_a_suspect_the_controller_finds_healthy(sdc_run):
    incidents, actions = replay(sdc_run, "other", "n011")
    readmits = [orjson.loads(x) for x in actions.splitlines() if b'"readmit"' in x]
    assert [a["nodes"] for a in readmits] == [["n005"]]
    first = [i for i in incidents if i["id"] == readmits[0]["incident"]][-1]
    assert first["resolution"] == "not_confirmed" and first["culprit_nodes"] == []


def test_a_bad_simulated_controller_argument_is_one_line(sdc_run, tmp_path, capsys):
    bad = tmp_path / "t.json"
    bad.write_text('{"nope": 1}')
    assert main(["replay", str(sdc_run / "sdc.jsonl.gz"), "--out", str(tmp_path / "o"), "--no-store", "-q",
                 "--simulate-controller", str(bad)]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "truth.json" in err


def test_the_simulated_controller_answers_once_and_as_told():
    c = SimulatedController(faulty=frozenset({"n1"}), corrupting=frozenset(), spares=1, delays=Delays(accept_s=2),
                            silent=frozenset({"requeue"}), fails=frozenset({"rollback"}))

    def act(i, kind, nodes=(), **extra):
        return Action(id=f"a{i}", ts=100.0, job="j", incident="i", type=kind, nodes=list(nodes), extra=extra)

    replace = c.answer(act(1, "replace", ["n1"]))
    assert [(r.phase, r.ts) for r in replace][:2] == [("accepted", 102.0), ("replaced", 132.0)]
    assert replace[1].spares == 0 and replace[-1].phase == "resumed" and c.answer(act(1, "replace", ["n1"])) == []
    assert c.answer(act(2, "requeue")) == [] and c.answer(act(3, "rollback"))[-1].phase == "failed"
    [r] = c.answer(act(4, "replay", groups=[{"id": "g1", "nodes": ["n0", "n1"]}, {"id": "g2", "nodes": ["n2"]}]))
    assert r.results == {"g1": "fail", "g2": "pass"}
    [d] = c.answer(act(5, "dual_run", ["n1"]))
    assert d.digests["n1"] == d.digests[d.reference]  # faulty, but not corrupting: the same result
