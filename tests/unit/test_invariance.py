"""One truth whatever the weather (issue 42): properties over generated jobs.

A job's decisions (actions with their ids, incidents with their culprits) must not depend on what is only the
monitoring's: one healthy node's clock off from the start or stepped mid-run, or the order in which the records
are read (as they arrived, sorted by the senders' times, or one node's spool flushed late), for jobs of one
node to eight. Each example replays
a simulated job twice through the pure core (`gangwatch.evaluation.invariance`, the same code as `gangwatch eval
--suite invariance`). CI draws a fixed, bounded set of examples (derandomized); `bench/bench_invariance.py`
draws many more, larger offsets and larger jobs.

The lateness bound these properties hold within: a node's clock off by up to 60 s either way (in an event-time
replay its records come that much early or late). Past it, the failstop's proof of life by the gang's progress
(`prove_max_s`, 60 s) gives up waiting and silence is judged as silence.
"""

from __future__ import annotations

import heapq
from operator import itemgetter

import pytest
from gangwatch.producers.simulate import Fault, Scenario, simulate
from gangwatch.producers.simulate.emit import _merged, messages
from gangwatch.schemas.records import EVICTING_ACTIONS
from hypothesis import HealthCheck, Phase, assume, example, given, settings
from hypothesis import strategies as st

from gangwatch.evaluation.invariance import Job, Perturbation, changed, decide, records

pytestmark = pytest.mark.unit

# no shrinking: an example replays a job twice (seconds), and a failure's example is small enough as drawn (CI once
# spent 5 minutes shrinking one); `bench/bench_invariance.py` explores further
BOUNDED = settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
                   phases=(Phase.explicit, Phase.generate))

# today's clients stamp their monotonic clock (`mono`), older ones do not: the job's peers tell a clock off to both
jobs = st.builds(Job, nodes=st.sampled_from([1, 2, 3, 4, 8]),
                 fault=st.sampled_from([None, "node_loss", "dataloader_hang"]), seed=st.integers(1, 60),
                 mono=st.booleans(), end=st.booleans())
offsets = st.tuples(st.sampled_from([-1.0, 1.0]), st.floats(3.0, 60.0)).map(lambda t: round(t[0] * t[1], 1))


def no_change(job: Job, p: Perturbation) -> None:
    assume(not (job.nodes == 1 and job.fault == "node_loss"))  # a one-node job losing its node: nothing to compare
    c = changed(job, p)
    assert c is None, str(c)


@BOUNDED
@given(job=jobs, offset=offsets, order=st.sampled_from(["arrival", "event"]))
def test_a_node_clock_off_from_the_start_changes_no_decision(job, offset, order):
    no_change(job, Perturbation(order, offset, 0.0))


@BOUNDED
@given(job=jobs, offset=offsets, at_s=st.floats(10.0, 110.0).map(lambda x: round(x, 1)))
@example(job=Job(1, None, seed=1), offset=11.0, at_s=10.0)  # a job of one node has no peer: its monotonic clock tells
def test_a_node_clock_stepped_mid_run_changes_no_decision_read_as_it_arrived(job, offset, at_s):
    assume(job.mono or job.nodes > 1)  # (without it, the next test)
    no_change(job, Perturbation("arrival", offset, at_s))


@pytest.mark.parametrize("offset", [11.0, -30.0])
def test_a_one_node_job_whose_clients_send_no_monotonic_clock_evicts_nobody_for_its_clock_stepping(offset):
    """Older clients (no `mono`): a job of one node has nothing to tell its clock stepped ahead from a silence of
    its own (no peer, no monotonic clock); it may page, but nobody is evicted for time alone."""
    old = Job(1, None, seed=1, mono=False)
    got = decide(records(old, Perturbation("arrival", offset, 10.0)))
    assert not [a for a in got.actions if a[0] in EVICTING_ACTIONS], got
    assert decide(records(Job(1, None, seed=1), Perturbation("arrival", offset, 10.0))).same(
        decide(records(Job(1, None, seed=1), Perturbation()))), "with `mono` the same job must decide as unshifted"


@BOUNDED
@given(job=jobs, offset=st.one_of(st.just(0.0), offsets), at_s=st.sampled_from([0.0, 60.0]))
@example(job=Job(1, None, seed=3, end=True), offset=25.0, at_s=60.0)  # found live: the end read 25 s early
def test_the_same_telemetry_read_in_event_time_order_decides_as_read_as_it_arrived(job, offset, at_s):
    """Replay = live in both orders: a job's recorded telemetry (a node's clock off or not) replayed sorted by
    the senders' times decides as it did read as it arrived."""
    assume(not (job.nodes == 1 and job.fault == "node_loss"))
    assume(Perturbation("event", offset, at_s).within_bound(job))
    arrived = decide(records(job, Perturbation("arrival", offset, at_s)))
    sorted_ = decide(records(job, Perturbation("event", offset, at_s)))
    assert sorted_.same(arrived), f"{job.name}, clock {offset:+g} s at {at_s:g} s: arrival order {arrived}; " \
                                  f"event-time order {sorted_}"


@BOUNDED
@given(job=jobs, offset=st.one_of(st.just(0.0), offsets), at_s=st.floats(0.0, 110.0).map(lambda x: round(x, 1)))
@example(job=Job(2, None, seed=3), offset=30.0, at_s=0.0)  # found by `gangwatch eval --suite invariance`
def test_a_node_spool_flushed_late_changes_no_decision(job, offset, at_s):
    """Its records from `at_s` on held 20 s, then delivered at once; its clock right, or off from `at_s` on (a
    node behind in steps, its beats told late, must not make its peer silent)."""
    no_change(job, Perturbation("flush", offset, at_s))


def test_a_one_node_job_s_spool_flushed_late_while_another_job_goes_on_pages_nobody():
    """Found on a fleet day (issue 44): the records of a job of one node held 30 s (its spool flushed late), while
    another job's records move the stream's time. The whole job looks silent (a `monitoring_gap`); the held
    records, stamped before that report, withdraw it, and the page waits the lateness bound (`late_s`) for them."""
    one = Scenario("a", 3, tp=2, pp=1, dp=1, gpus_per_node=2, duration_s=240.0,
                   faults=(Fault("late_delivery", 60.0, node="n000", params={"flush_s": 30.0}),))
    other = Scenario("b", 4, tp=2, pp=1, dp=2, gpus_per_node=2, duration_s=240.0, first_node=10)
    both = [r for _, r in heapq.merge(_merged(simulate(one), False), _merged(simulate(other), False),
                                      key=itemgetter(0))]
    got = decide(both)
    assert got.actions == (), str(got)


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
          phases=(Phase.explicit, Phase.generate))
@given(step_s=st.sampled_from([1.0, 2.5, 5.0]), lag_s=st.floats(5.0, 30.0).map(lambda x: round(x, 1)),
       nodes=st.sampled_from([2, 3]), seed=st.integers(1, 60))
@example(step_s=5.0, lag_s=19.5, nodes=2, seed=29)  # found on a fleet day (issue 44, seed 6)
def test_a_node_whose_records_come_late_while_other_jobs_move_the_stream_is_evicted_by_nobody(step_s, lag_s, nodes,
                                                                                             seed):
    """One node's records all arrive `lag_s` late (a slow relay) from 60 s on, while another job's records move
    the stream's time. The gang's steps prove the node alive: its peers go on completing steps that need it. With
    steps of 5 s the proof (a step ended `prove_s` after the node was last heard) comes up to a step after
    `prove_s`, and the wait for it ended at `prove_s`: the node was replaced 1.6 s before its records came."""
    one = Scenario("a", seed, tp=2, pp=1, dp=nodes, gpus_per_node=2, duration_s=240.0, base_step_s=step_s,
                   faults=(Fault("late_delivery", 60.0, node="n001", params={"lag_s": lag_s}),))
    other = Scenario("b", 4, tp=2, pp=1, dp=2, gpus_per_node=2, duration_s=240.0, first_node=10)
    both = [r for _, r in heapq.merge(_merged(simulate(one), False), _merged(simulate(other), False),
                                      key=itemgetter(0))]
    got = decide(both)
    assert not [a for a in got.actions if a[0] in EVICTING_ACTIONS], str(got)


@pytest.mark.parametrize("job,p", [
    (Job(2, None, seed=3, end=True), Perturbation("event", 25.0, 0.0)),  # its `end` read before the steps ahead
    (Job(1, None, seed=3, end=True), Perturbation("arrival", -30.0, 0.0)),  # its node's last records 30 s before
], ids=["2 nodes, one ahead, sorted", "1 node behind, as arrived"])
def test_the_controller_s_end_on_a_clock_of_no_node_makes_no_silence(job, p):
    """The controller's `end` is stamped on its own clock, not a node's: read as the job's time, it made the ranks
    look silent for as long as the clocks disagree (a `hang` of a job of two nodes, one ahead, sorted by stamped
    times; a `monitoring_gap` of a job of one node behind). The job's last word moves no time: the silence before
    it is the end."""
    assert changed(job, p) is None, str(changed(job, p))


# --- a clean end, however it is said ------------------------------------------------------------------------------

def ended(form: str, nodes: int = 4, agent_s: float = 0.0) -> list[dict]:
    """A healthy simulated job of `nodes` nodes whose every rank finished its last step, then said so: `end` (the
    job's own final record), `exit 0` (each rank's exit code, nothing else), `silence` (nothing at all). With
    `agent_s`, each node's agent goes on sampling its (now idle) GPUs that long after."""
    sc = Scenario("e", 3, tp=2, pp=1, dp=nodes, gpus_per_node=2, duration_s=120.0)
    msgs = list(messages(sc))
    end = max(m["ts"] for m in msgs)
    if form == "end":
        msgs.append({"kind": "lifecycle", "v": 1, "ts": end + 0.5, "job": "e", "event": "end", "source": "trainer"})
    elif form == "exit 0":
        msgs += [{"kind": "framework", "v": 1, "ts": end + 0.5 + 0.01 * r, "job": "e", "rank": r, "type": "exit",
                  "code": 0} for r in range(2 * nodes)]
    for k in range(int(agent_s // 10)):
        msgs += [{"kind": "gpu", "v": 1, "ts": end + 3.0 + 10.0 * k + 0.1 * n, "node": f"n{n:03d}", "gpu": 0,
                  "util_pct": 0} for n in range(nodes)]
    return msgs


@pytest.mark.parametrize("nodes", [2, 3, 4, 8])
@pytest.mark.parametrize("form", ["end", "exit 0", "silence"])
def test_a_clean_end_looks_clean_however_it_is_said(form, nodes):
    got = decide(ended(form, nodes), silence_s=120.0)
    assert got.actions == () and got.incidents == (), str(got)


def test_a_one_node_job_whose_telemetry_stops_with_its_node_s_names_the_node_and_evicts_nothing():
    """On one node, telemetry that stops, the node's agent's with it, is that node's death as much as the job's
    end: the node is named (a `fail_stop` the stream witnessed) and a human is told, no node evicted; said by `end`
    or exit codes, it is clean there too."""
    got = decide(ended("silence", 1), silence_s=120.0)
    assert [(t, n) for t, n, _ in got.actions] == [("escalate", ("n000",))], str(got)
    assert got.incidents == (("fail_stop", ("n000",)),), str(got)
    assert decide(ended("end", 1), silence_s=120.0).actions == ()


@settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck),
          phases=(Phase.explicit, Phase.generate))
@given(gpus=st.sampled_from([2, 4, 8]), at_s=st.floats(60.0, 180.0).map(lambda x: round(x, 1)),
       seed=st.integers(1, 60))
def test_a_one_node_job_whose_node_is_lost_while_another_job_goes_on_names_it_and_evicts_nothing(gpus, at_s, seed):
    """Found on a fleet day (issue 44): a job of one node whose node dies, its agent with it, while another job
    moves the stream's time, was a `monitoring_gap` naming no node (the hardware fault missed). Nothing tells a
    lost node from a job that ended without a word and took its node's telemetry along, so the node is named (a
    `fail_stop`, its decision after the lateness bound, `late_s`) and a human decides: nobody is evicted."""
    one = Scenario("a", seed, tp=gpus, pp=1, dp=1, gpus_per_node=gpus, duration_s=240.0,
                   faults=(Fault("node_loss", at_s, node="n000"),))
    other = Scenario("b", 4, tp=2, pp=1, dp=2, gpus_per_node=2, duration_s=at_s + 120.0, first_node=10)
    both = [r for _, r in heapq.merge(_merged(simulate(one), False), _merged(simulate(other), False),
                                      key=itemgetter(0))]
    got = decide(both)
    assert [(t, n) for t, n, _ in got.actions] == [("escalate", ("n000",))], str(got)
    assert ("fail_stop", ("n000",)) in got.incidents, str(got)


@pytest.mark.parametrize("form", ["end", "exit 0", "silence"])
def test_a_one_node_job_whose_node_still_speaks_after_its_ranks_ended_together_ended(form):
    """Its node's agent (NVML samples of idle GPUs) goes on after the ranks stopped at one step: the node lives, so
    the job ended; no page, however the end is said (issue 44: half a fleet's jobs are of one node)."""
    got = decide(ended(form, 1, agent_s=60.0), silence_s=120.0)
    assert got.actions == () and got.incidents == (), str(got)
