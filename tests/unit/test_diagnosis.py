"""Active diagnosis in triage: a dual run's digests confirm or clear an SDC suspect; silence goes to a human."""

from __future__ import annotations

import pytest
from gangwatch.schemas import Recovery
from gangwatch.triage.config import TriageConfig
from gangwatch.triage.job import Triage

from tests.unit.test_triage import T0, run, sdc_decided, topo  # noqa: F401  (topo: a fixture)

pytestmark = pytest.mark.unit


def dual_run(tri, topo):
    """An SDC decided on rank 42's node: the dual run it asked for, and its incident."""
    sdc_decided(tri, topo)
    (inc,) = tri.waiting
    assert inc.awaiting and inc.awaiting["kind"] == "dual_run" and inc.awaiting["nodes"] == ["n005"]
    return inc.awaiting["action"], inc


def answer(action, ts, **digests):
    return Recovery(ts=ts, job="j", action=action, phase="dual_run_result", digests=digests, reference="n009")


def test_equal_digests_clear_the_suspect_and_close_the_incident(topo):
    tri = Triage("j", TriageConfig(), topo)
    action, inc = dual_run(tri, topo)
    evicted_before = list(tri.guards.evictions)
    out = run(tri, [answer(action, T0 + 200, n005="abc123", n009="abc123")])
    assert [(a.type, a.nodes) for a in out.actions] == [("readmit", ["n005"])]
    assert "n005 abc123" in out.actions[0].reason and "not confirmed" in out.actions[0].reason
    last = out.incidents[-1]
    assert last.extra["resolution"] == "not_confirmed" and last.recovered_ts == T0 + 200
    assert last.extra["proof"] == {"n005": "abc123", "n009": "abc123"} and last.culprit_nodes == []
    assert tri.waiting == [] and all(n != "n005" for _, n in tri.guards.evictions) and evicted_before
    assert run(tri, [("advance", T0 + 5000)]).actions == []  # answered: no timeout later


def test_a_different_digest_confirms_and_the_node_stays_out(topo):
    tri = Triage("j", TriageConfig(), topo)
    action, inc = dual_run(tri, topo)
    out = run(tri, [answer(action, T0 + 200, n005="dead", n009="beef")])
    assert out.actions == []  # nothing to send: the node is already isolated
    last = out.incidents[-1]
    assert last.extra["resolution"] == "confirmed" and last.culprit_nodes == ["n005"]
    assert last.extra["proof"] == {"n005": "dead", "n009": "beef"} and "n005" in last.evicted_nodes
    assert tri.waiting == [inc] and inc.recovered_ts is None  # still waits for the rollback's resumption


def test_a_missing_digest_and_no_answer_go_to_a_human(topo):
    tri = Triage("j", TriageConfig(), topo)
    action, _ = dual_run(tri, topo)
    out = run(tri, [answer(action, T0 + 200, n009="beef")])
    assert [(a.type, a.nodes) for a in out.actions] == [("escalate", ["n005"])]
    assert "did not say" in out.actions[0].reason and out.incidents[-1].extra["resolution"] == "unconfirmed"

    slow = Triage("j", TriageConfig(dual_run_timeout_s=300), topo)
    action, inc = dual_run(slow, topo)
    asked = inc.awaiting["asked"]
    assert run(slow, [("advance", asked + 299)]).actions == []
    saved = Triage.from_state(slow.state(), TriageConfig(dual_run_timeout_s=300), topo)  # a restart keeps waiting
    for tri in (slow, saved):
        out = run(tri, [("advance", asked + 301), ("advance", asked + 900)])
        assert [(a.type, a.nodes, a.ts) for a in out.actions] == [("escalate", ["n005"], asked + 300)]
        assert "no answer within 300 s" in out.actions[0].reason
    late = run(slow, [answer(action, asked + 1000, n005="x", n009="x")])
    assert late.actions == [] and late.incidents == []  # answered after a human took over: recorded, no action
