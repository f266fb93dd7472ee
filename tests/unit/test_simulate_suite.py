"""The simulator's ground truth, validation, the standard suite, and uneven fleets / several culprits."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from gangwatch.producers.simulate import (
    BENIGN_KINDS,
    FAULT_CLASS,
    FAULT_KINDS,
    PRECURSOR_KINDS,
    Fault,
    Noise,
    Scenario,
    simulate,
    standard_suite,
    truth,
)

from tests.unit.simcases import (
    ALL,
    HEALTHY,
    NODE_LOSS,
    XID,
    by_kind,
    recs_of,
    sc_,
    steps_table,
    sweep,
)

pytestmark = pytest.mark.unit


# --- ground truth --------------------------------------------------------------------------------


def test_truth_content():
    assert truth(HEALTHY)["faults"] == [] and truth(HEALTHY)["healthy"] is True
    for sc in ALL[1:]:
        t = truth(sc)
        assert t["healthy"] is False and len(t["faults"]) == 1
        f, inj = t["faults"][0], sc.faults[0]
        assert f["kind"] == inj.kind and f["class"] == FAULT_CLASS[inj.kind]
        assert f["onset_ts"] == sc.start_ts + inj.at_s
        if inj.node:
            assert f["nodes"] == [inj.node]
        if inj.rank is not None:
            assert f["ranks"] == [inj.rank] and f["nodes"] == [f"n{inj.rank // 8:03d}"]
        json.dumps(t)
    t = truth(NODE_LOSS)
    assert t["faults"][0]["ranks"] == list(range(40, 48)) and t["stall"]["step"] == t["faults"][0]["onset_step"]
    assert t["last_step"] == t["stall"]["step"] - 1
    assert truth(XID)["faults"][0]["gpus"] == [["n003", 2]]
    assert {FAULT_CLASS[k] for k in FAULT_KINDS} == {"fail_stop", "fail_slow", "hang", "sdc", "planned", None}
    assert {k for k in FAULT_KINDS if FAULT_CLASS[k] is None} == PRECURSOR_KINDS | BENIGN_KINDS  # no incident


def test_validation_errors():
    with pytest.raises(ValueError):
        Fault("meteor", 10.0, node="n001")
    with pytest.raises(ValueError):
        Fault("xid79", 10.0)
    with pytest.raises(ValueError):
        simulate(sc_("bad", Fault("xid79", 10.0, node="n099")))
    with pytest.raises(ValueError):
        simulate(sc_("bad", Fault("xid79", 10.0, node="n001", rank=3)))
    with pytest.raises(ValueError):
        simulate(sc_("bad", Fault("xid79", 50.0, node="n001"), Fault("sdc", 60.0, rank=3)))
    with pytest.raises(ValueError):
        Scenario("bad", 1, tp=3, pp=1, dp=1)


def test_noise_off_is_regular():
    sc = sc_("quiet", noise=Noise.off(), duration_s=60.0)
    table = steps_table(recs_of(sc))
    assert len({r["step_s"] for rows in table.values() for r in rows.values()}) == 1
    assert not by_kind(recs_of(sc), "hw")


# --- suite ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", ["ci", "full"])
def test_standard_suite_covers_every_kind(size):
    suite = standard_suite(size)
    assert len(suite) >= 20 and len({s.name for s in suite}) == len(suite)
    kinds = Counter(f.kind for s in suite for f in s.faults)
    # every kind that interrupts the job is scored; precursors open no incident, so there is nothing to score
    assert set(kinds) == set(FAULT_KINDS) - PRECURSOR_KINDS and all(n >= 2 for n in kinds.values())
    assert sum(1 for s in suite if not s.faults) >= 3
    ranks = [s.n_ranks for s in suite]
    if size == "full":
        assert min(ranks) >= 128 and max(ranks) == 2048
        assert any(s.duration_s >= 3600 and not s.faults for s in suite)
    else:
        assert max(ranks) <= 512
    for s in suite:
        plan = simulate(s)  # physics only: every scenario resolves and runs
        t = truth(s)
        for f in t["faults"]:
            if f["kind"] in ("sdc",) or not f["stall"]:
                assert f["onset_step"] is not None, (s.name, f)
        assert plan.segments[0].steps.size > 50


# --- uneven fleets, switches, hangs with several culprits --------------------------------------------


def test_a_heterogeneous_rank_is_steadily_slower_from_its_first_step_and_nothing_else_happens():
    sc = sc_("het", Fault("heterogeneous", 0.0, rank=21, magnitude=0.08), duration_s=120.0)
    plan = simulate(sc)
    seg = plan.segments[0]
    stage = plan.topo.pp == plan.topo.pp[21]
    ratio = seg.compute[:, 21] / np.median(seg.compute[:, stage], axis=1)
    assert np.median(ratio[:5]) == pytest.approx(1.08, abs=0.02) and np.median(ratio) == pytest.approx(1.08, abs=0.01)
    t = truth(sc)
    assert not t["healthy"] and t["faults"][0]["class"] is None and t["stall"] is None
    recs = recs_of(sc)  # its hardware says nothing: nothing is broken
    assert not [r for r in by_kind(recs, "hw") if r["node"] == "n002"]
    assert not [g for g in by_kind(recs, "gpu") if (g["node"], g["gpu"]) == ("n002", 5) and g["throttle"]]


def test_the_job_record_names_each_ranks_switch():
    sc = sc_("sw", duration_s=30.0, nodes_per_switch=2)
    [job] = by_kind(recs_of(sc), "job")
    assert {(r["node"], r["switch"]) for r in job["ranks"]} >= {("n000", "sw00"), ("n001", "sw00"), ("n002", "sw01")}
    assert "switch" not in by_kind(recs_of(sc_("nosw", duration_s=30.0)), "job")[0]["ranks"][0]


def test_two_hangs_at_once_are_one_stall_with_two_culprits():
    sc = sc_("two", Fault("dataloader_hang", 80.0, rank=13), Fault("pp_deadlock", 80.0, rank=34),
             duration_s=140.0, peer_states=False)
    plan = simulate(sc)
    stop = plan.stop
    assert {f.rank for f in stop.faults} == {13, 34}
    t = truth(sc)
    assert [f["onset_step"] for f in t["faults"]] == [stop.step, stop.step]
    stacks, flights = sweep(recs_of(sc))
    assert "dataloader" in stacks[13]["dump"] and "broadcast (" in stacks[34]["dump"]
    # rank 34 (stage 0)'s pipeline neighbour 42 waits to receive from it: a point-to-point entry naming stage 0
    [wait] = [e for e in flights[42]["entries"] if e.get("p2p") and e["state"] == "started"]
    assert (wait["op"], wait["peer"]) == ("recv", 0)
    with pytest.raises(ValueError, match="same at_s"):
        simulate(sc_("bad", Fault("dataloader_hang", 80.0, rank=13), Fault("xid79", 80.0, node="n005"),
                     duration_s=140.0))
    with pytest.raises(ValueError, match="different ranks"):
        simulate(sc_("bad2", Fault("dataloader_hang", 80.0, rank=13), Fault("pp_deadlock", 80.0, rank=13),
                     duration_s=140.0))
