"""Every branch of the decision tree."""

from __future__ import annotations

import pytest
from gangwatch.triage.decide import Situation, decide
from gangwatch.triage.localize import Localization

pytestmark = pytest.mark.unit


def loc(culprits=(), conf=0.9, group=None, group_nodes=(), per_node=None):
    return Localization(culprits=list(culprits), confidence=conf if culprits or group else 0.0,
                        per_node=per_node or {n: conf for n in culprits}, group=group, group_nodes=list(group_nodes),
                        innocent_nodes=max(0, len(group_nodes) - 1), suspect_ranks=[3, 11] if group else [])


def kinds(decisions):
    return [(d.type, d.nodes, d.path) for d in decisions]


def sit(cls="fail_stop", **kw):
    kw.setdefault("loc", loc(["n003"]))
    return Situation(cls=cls, threshold=0.5, spares_left=kw.pop("spares_left", None), **kw)


def test_hardware_fail_stop_with_spare_is_a_hot_replace():
    assert kinds(decide(sit())) == [("replace", ("n003",), "hot")]


def test_a_culprit_named_only_by_evidence_with_an_innocent_reading_is_paged_not_evicted():
    said = ("n003, the job's one node, fell silent with its agent",)
    [page] = decide(sit(unsure=said, unsure_nodes=("n003",)))
    assert (page.type, page.nodes, page.path) == ("escalate", ("n003",), "manual") and said[0] in page.reason
    assert kinds(decide(sit(unsure_nodes=("n007",)))) == [("replace", ("n003",), "hot")]  # (said of another node)


def test_spares_exhausted_is_a_cold_requeue():
    assert kinds(decide(sit(spares_left=0))) == [("requeue", ("n003",), "cold")]


def test_planned_takes_no_action():
    assert decide(sit("planned")) == []


def test_sdc_with_suspect_is_rollback_isolate_dual_run():
    assert kinds(decide(sit("sdc"))) == [("rollback", ("n003",), "hot"), ("isolate", ("n003",), "hot"),
                                         ("dual_run", ("n003",), "hot")]


def test_sdc_without_suspect_rolls_back_and_escalates():
    assert [d.type for d in decide(sit("sdc", loc=loc()))] == ["rollback", "escalate"]


def test_no_culprit_escalates():
    [d] = decide(sit("hang", loc=loc(per_node={"n001": 0.3})))
    assert d.type == "escalate" and d.path == "manual" and "n001" in d.reason


def test_low_confidence_escalates():
    [d] = decide(sit(loc=loc(["n003"], conf=0.4)))
    assert d.type == "escalate"


def test_group_only_evicts_the_group_and_counts_innocents():
    [d] = decide(sit("hang", loc=loc(group="pp", group_nodes=["n000", "n004", "n008"])))
    assert (d.type, d.nodes, d.path) == ("evict_group", ("n000", "n004", "n008"), "hot")
    assert "2 presumably healthy" in d.reason


def test_cheap_straggler_is_degraded():
    [d] = decide(sit("fail_slow", slowdown_frac=0.03))  # 54 s over 30 min < 120 s replacement
    assert (d.type, d.path) == ("degrade", "non_stop")


def test_costly_straggler_is_replaced():
    [d] = decide(sit("fail_slow", slowdown_frac=0.10))
    assert (d.type, d.nodes, d.path) == ("replace", ("n003",), "hot")


def test_a_straggler_without_spare_is_kept_running_unless_it_costs_a_tenth_of_the_step():
    [d] = decide(sit("fail_slow", slowdown_frac=0.05, spares_left=0))
    assert d.type == "degrade"
    [d] = decide(sit("fail_slow", slowdown_frac=0.10, spares_left=0))  # a human is told what it costs
    assert d.type == "escalate" and "the job loses 10.0% of every step" in d.reason


def test_single_rank_software_fault_restarts_in_process():
    [d] = decide(sit(loc=loc(["n001"], conf=0.5), software_ranks=(9,)))
    assert (d.type, d.path) == ("restart_in_process", "in_process")


def test_many_ranks_software_crash_requeues():
    [d] = decide(sit(loc=loc(), software_ranks=(1, 2, 3, 9)))
    assert (d.type, d.path) == ("requeue", "cold")


def test_every_action_has_a_reason_and_a_path():
    for s in [sit(), sit("sdc"), sit("fail_slow", slowdown_frac=0.5), sit("hang", loc=loc()),
              sit(loc=loc(), software_ranks=(4,))]:
        decided = decide(s)
        assert decided, s  # every one of these decides something, or this checks nothing
        for d in decided:
            assert d.reason and d.path in ("hot", "cold", "in_process", "non_stop", "manual")
