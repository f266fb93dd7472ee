"""Active diagnosis in triage: a dual run's digests confirm or clear an SDC suspect; silence goes to a human."""

from __future__ import annotations

import pytest
from gangwatch.schemas import Recovery
from gangwatch.triage.budgets import TriageConfig
from gangwatch.triage.triage import Triage

from tests.unit import test_triage
from tests.unit.test_triage import T0, run, sdc_decided

topo = test_triage.topo  # the fixture: a 16-node job, 2 stages x 8 replicas

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


def climb(tri, items, controller, until, step=5.0):
    """Feed `items`, then let event time run to `until` in `step`s as a worker's ticks would, feeding what
    `controller` answers to every action at the answer's time."""
    from gangwatch.producers.simulate.responder import answers
    from gangwatch.schemas import Outputs

    seen = run(tri, items)
    pending = answers(controller, seen.actions)
    now = max(x[1] if isinstance(x, tuple) else x.ts for x in items)
    while now < until:
        now = min(until, now + step)
        due = [r for r in pending if r.ts <= now]
        pending = [r for r in pending if r.ts > now]
        out = Outputs()
        for rec in due:
            out.extend(run(tri, [("advance", rec.ts), rec]))
        out.extend(run(tri, [("advance", now)]))
        seen.extend(out)
        pending = sorted(pending + answers(controller, out.actions), key=lambda r: r.ts)
    return seen


@pytest.mark.parametrize("faulty", ["n006", "n013"])
def test_a_stall_nobody_explains_pages_then_is_replayed_to_the_machine(topo, faulty):
    """Every rank alike and the sweep names nobody (a hang with identical stacks everywhere): a human is paged at
    the stall budget; still stalled a budget later, the job is replayed in groups and the failing groups
    intersect into the machine, which is replaced; the rungs and the replay's cost are on the incident."""
    from gangwatch.producers.simulate.responder import SimulatedController

    from tests.unit.test_triage import hang

    tri = Triage("j", TriageConfig(), topo)
    controller = SimulatedController(faulty=frozenset({faulty}))
    out = climb(tri, [hang(T0 + 40), ("advance", T0 + 20 + 300)], controller, T0 + 20 + 1200)
    types = [a.type for a in out.actions]
    assert types[:2] == ["collect_stacks", "escalate"] and "replayed" in out.actions[1].reason
    replays = [a for a in out.actions if a.type == "replay"]
    assert replays[0].ts == T0 + 20 + 600 and [a.extra["phase"] for a in replays] == [1, 2]
    assert all({"id", "nodes"} <= set(g) for a in replays for g in a.extra["groups"])
    assert types[-1] == "replace" and out.actions[-1].nodes == [faulty]
    assert "replay:" in out.actions[-1].reason and "failed where every other suspect passed" in out.actions[-1].reason
    inc = out.incidents[-1]
    assert inc.culprit_nodes == [faulty] and inc.localized_ts == out.actions[-1].ts
    rungs = inc.extra["rungs"]
    assert [r["rung"] for r in rungs] == ["page", "replay"] and rungs[-1]["outcome"] == "localized"
    assert rungs[-1]["runs"] == sum(len(a.extra["groups"]) for a in replays)


def test_a_fault_that_does_not_reproduce_in_replay_goes_to_a_human_and_silence_too(topo):
    from gangwatch.producers.simulate.responder import SimulatedController

    from tests.unit.test_triage import hang

    tri = Triage("j", TriageConfig(), topo)
    out = climb(tri, [hang(T0 + 40), ("advance", T0 + 20 + 300)], SimulatedController(), T0 + 20 + 1200)
    last = out.actions[-1]
    assert last.type == "escalate" and "did not reproduce" in last.reason and "replay" in last.reason
    assert [r["rung"] for r in out.incidents[-1].extra["rungs"]] == ["page", "replay", "human"]

    tri = Triage("j", TriageConfig(replay_timeout_s=600), topo)
    silent = SimulatedController(faulty=frozenset({"n006"}), silent=frozenset({"replay"}))
    out = climb(tri, [hang(T0 + 40), ("advance", T0 + 20 + 300)], silent, T0 + 20 + 600 + 700)
    assert [a.type for a in out.actions][-2:] == ["replay", "escalate"]
    assert "no answer within 600 s" in out.actions[-1].reason


def test_a_restart_that_does_not_cure_climbs_to_replay_when_the_fault_comes_back(topo):
    """Two suspects whose group is over the blast radius: a restart, watched; the job steps again (recovered),
    then the same fault comes back within the watch: no second restart, the next rung (replay) finds the node."""
    from gangwatch.producers.simulate.responder import SimulatedController
    from gangwatch.schemas import Step
    from gangwatch.triage.budgets import Safety

    from tests.unit.test_triage import hang, outlier

    tri = Triage("j", TriageConfig(safety=Safety(max_evict_nodes=1)), topo)
    run(tri, [Step(ts=T0 + 10, job="j", rank=0, step=5, step_s=1.0)])
    out = run(tri, [hang(T0 + 40), outlier(topo, T0 + 70, 3), outlier(topo, T0 + 70, 11), ("advance", T0 + 200)])
    assert [a.type for a in out.actions] == ["collect_stacks", "requeue"]
    out = run(tri, [Step(ts=T0 + 400, job="j", rank=0, step=6, step_s=1.0)])
    assert out.incidents[-1].recovered_ts == T0 + 400 and tri.watch is not None
    controller = SimulatedController(faulty=frozenset({"n000"}))
    items = [hang(T0 + 900, key=2), outlier(topo, T0 + 930, 3, snapshot="s2"),
             outlier(topo, T0 + 930, 11, snapshot="s2"), ("advance", T0 + 1100)]
    out = climb(tri, items, controller, T0 + 3000)
    types = [a.type for a in out.actions]
    assert "requeue" not in types and types.count("replay") >= 1 and types[-1] == "replace"
    assert out.actions[-1].nodes == ["n000"]
    rungs = out.incidents[-1].extra["rungs"]
    assert [r["rung"] for r in rungs] == ["group", "restart", "replay"] and rungs[-1]["outcome"] == "localized"
    assert rungs[1]["outcome"].startswith("the fault came back")


def test_the_controllers_spare_count_picks_hot_replacement_or_cold_restart_and_the_reason_says_so(topo):
    """A fail-stop with a culprit: replaced hot while the controller reports a warm spare, requeued cold once it
    reports none; the reason names the pool. Without any count, the configured pool (unlimited here) decides."""
    from gangwatch.schemas import Step

    from tests.unit.test_triage import lost

    def fail_stop(tri, at):
        run(tri, [Step(ts=at - 5, job="j", rank=0, step=int(at), step_s=1.0)])
        return [a for a in run(tri, [lost(topo, "n003", at), ("advance", at + 30)]).actions]

    tri = Triage("j", TriageConfig(), topo)
    [a] = fail_stop(tri, T0 + 100)
    assert (a.type, a.path) == ("replace", "hot") and "pool" not in a.reason
    for count, want in ((1, ("replace", "hot")), (0, ("requeue", "cold"))):
        tri = Triage("j", TriageConfig(), topo)
        run(tri, [Recovery(ts=T0 + 50, job="j", action="a-earlier", phase="accepted", spares=count)])
        [a] = fail_stop(tri, T0 + 100)
        assert (a.type, a.path) == want and f"pool: {count} warm spare" in a.reason and "controller's count" in a.reason
        assert Triage.from_state(tri.state(), TriageConfig(), topo).spares_left() == tri.spares_left()


def test_a_decision_cites_the_closest_past_incident_of_the_job_and_what_fixed_it(topo):
    """Two whole nodes lost a while apart: the second replacement's reason names the first incident, how it was
    fixed and how long recovery took; a kept state cites the same; a different kind of fault cites nothing."""
    from gangwatch.schemas import Step

    from tests.unit.test_triage import lost

    tri = Triage("j", TriageConfig(), topo)
    run(tri, [Step(ts=T0 + 95, job="j", rank=0, step=1, step_s=1.0)])
    [first] = run(tri, [lost(topo, "n003", T0 + 100), ("advance", T0 + 130)]).actions
    assert "like incident" not in first.reason
    out = run(tri, [Recovery(ts=T0 + 200, job="j", action=first.id, phase="resumed")])
    assert out.incidents[-1].recovered_ts == T0 + 200 and len(tri.precedents) == 1
    saved = Triage.from_state(tri.state(), TriageConfig(), topo)
    for t in (tri, saved):
        run(t, [Step(ts=T0 + 995, job="j", rank=0, step=50, step_s=1.0)])
        [second] = run(t, [lost(topo, "n007", T0 + 1000), ("advance", T0 + 1030)]).actions
        assert (second.type, second.nodes) == ("replace", ["n007"])
        assert f"like incident {first.incident}" in second.reason and "fail_stop on n003" in second.reason
        assert "fixed by replace n003" in second.reason
    from tests.unit.test_triage import hang

    other = Triage("j", TriageConfig(), topo)
    other.precedents = list(tri.precedents)
    out = run(other, [hang(T0 + 2000), ("advance", T0 + 2000 + 400)])
    assert out.actions and all("like incident" not in a.reason for a in out.actions)
