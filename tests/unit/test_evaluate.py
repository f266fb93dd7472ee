"""The evaluator: scoring several faults at once and benign differences, and the quality floor CI enforces."""

from __future__ import annotations

import pytest

from gangwatch.cli import main
from gangwatch.cli.options import EXIT_FLOOR
from gangwatch.evaluation import scoring as evaluate
from gangwatch.evaluation.scoring import FaultScore, Floor, ScenarioScore, check, score

pytestmark = pytest.mark.unit


def truth(*faults, healthy=False):
    return {"scenario": "s", "healthy": healthy, "faults": list(faults)}


def fault(kind, cls, node, onset, rank=0):
    return {"kind": kind, "class": cls, "planned": False, "onset_ts": onset, "nodes": [node], "ranks": [rank]}


def incident(i, cls, det, culprits, loc=None):
    return {"id": i, "class": cls, "detected_ts": det, "localized_ts": loc if loc is not None else det + 5,
            "culprit_nodes": culprits}


def test_several_faults_at_once_each_find_the_incident_that_names_them():
    t = truth(fault("thermal_straggler", "fail_slow", "n001", 100.0),
              fault("thermal_straggler", "fail_slow", "n002", 101.0))
    incs = [incident("a", "fail_slow", 105.0, ["n001"]), incident("b", "fail_slow", 106.0, ["n002"])]
    s = score(t, [], [], incs)
    assert [(f.localized, f.detect_s) for f in s.faults] == [(True, 5.0), (True, 5.0)] and s.ok


def test_a_benign_difference_must_be_reported_and_never_evicted():
    t = truth(fault("heterogeneous", None, "n003", 0.0, rank=27))
    het = {"type": "heterogeneous", "rank": 27, "ts": 40.0}
    s = score(t, [het], [], [])
    assert s.benign[0].reported and s.ok and not s.faults
    assert not score(t, [], [], []).ok  # not reported
    evicted = score(t, [het], [{"type": "replace", "nodes": ["n003"]}], [])
    assert not evicted.ok and evicted.innocent_evicted == ["n003"]
    assert check([evicted]) == ["benign: 1 false eviction(s), floor 0"]
    assert check([score(t, [], [], [])]) == [
        "benign: 0/1 benign faults reported (heterogeneous ranks, skewed clocks, late nodes), floor all"]


def _scored(cls, detected=True, localized=True, detect_s=5.0, localize_s=20.0, evicted=(), culprit="n001"):
    s = ScenarioScore("s", False, False)
    s.faults = [FaultScore("s", "k", cls, [culprit], detected=detected, class_ok=detected, localized=localized,
                           detect_s=detect_s if detected else None, localize_s=localize_s if localized else None,
                           incident_class=cls if detected else None)]
    s.evicted = list(evicted)
    s.innocent_evicted = [n for n in evicted if n != culprit]
    return s


def test_the_floor_names_the_class_and_what_it_missed():
    assert check([_scored("fail_slow"), _scored("hang", evicted=["n001", "n002"])]) == []  # over-eviction: hang
    assert check([_scored("fail_slow"), _scored("fail_slow", detected=False, localized=False)]) == [
        "fail_slow: recall 0.50 below its floor 1.00", "fail_slow: localization 0.50 below its floor 1.00"]
    assert check([_scored("fail_stop", evicted=["n001", "n009"])]) == [
        "fail_stop: 1.00 innocent nodes evicted per culprit, floor 0.0"]
    assert check([_scored("sdc", detect_s=75.0)]) == ["sdc: detection took 75.0 s, over its budget of 60 s"]
    healthy = ScenarioScore("h", True, False, evicted=["n004"])
    assert check([healthy]) == ["healthy: 1 false eviction(s), floor 0"]
    assert check([_scored("sdc", detect_s=75.0)], {"sdc": Floor(detect_s=90.0)}) == []
    # a power loss is found from silence within 2 heartbeat periods + 1 s (11 s in the suite): 11.2 s is late
    assert check([_scored("fail_stop", detect_s=10.5)]) == []
    assert check([_scored("fail_stop", detect_s=11.2)]) == ["fail_stop: detection took 11.2 s, over its budget of 11 s"]


def test_eval_exits_7_naming_the_class_below_its_floor(capsys, monkeypatch):
    monkeypatch.setitem(evaluate.FLOORS, "fail_stop", Floor(detect_s=0.1))  # an Xid 79 takes ~1.5 s to find
    code = main(["eval", "--suite", "standard", "--size", "ci", "--only", "xid79_64", "--quiet"])
    out, err = capsys.readouterr()
    assert code == EXIT_FLOOR and "xid79_64" in out
    [line] = err.strip().splitlines()
    assert line.startswith("gangwatch eval: error: quality floor missed: fail_stop: detection took 1.5 s, over "
                           "its budget of 0 s")
    monkeypatch.setitem(evaluate.FLOORS, "fail_stop", Floor())
    assert main(["eval", "--size", "ci", "--only", "xid79_64", "--quiet"]) == 0
    assert main(["eval", "--size", "ci", "--only", "xid79_64", "--quiet", "--no-floor"]) == 0
