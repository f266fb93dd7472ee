"""A decision due before a record's time is taken before that record is read, whatever the event-time grid.

Live, the worker's clock decides an incident as soon as its decision is due; what the decision causes (the
controller restarting the job, its ranks stopping on SIGTERM) carries later times. Replayed, event time moves
with the records in steps of `tick_s`, so the controller's `restart` could arrive while the grid still stood
just short of the decision: the job read as stopped on purpose first, and the incident closed with no action
(CI, an SDC run: live rollback, isolate, dual run; replayed, nothing). `JobCore` advances to such a record's
time first, on the record path and on the run path alike.
"""

from __future__ import annotations

import pytest
from gangwatch.schemas import Heartbeat, Job, Lifecycle, Outputs, RankInfo, Step
from gangwatch.triage.core import JobCore

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0
JOB = Job(ts=T0, job="j", heartbeat_s=2.0, ranks=[RankInfo(rank=r, node=f"n{r // 2 + 1}") for r in range(4)])


def beats(ranks, start: float, end: float, steps: bool = True) -> list:
    """A step (unless not `steps`: the gang waits in a collective) and a heartbeat per rank every second in
    [start, end)."""
    out, t = [], start
    while t < end:
        for r in ranks:
            if steps:
                out.append(Step(ts=t, job="j", rank=r, step=int(t - T0), step_s=1.0))
            out.append(Heartbeat(ts=t + 0.01, job="j", rank=r))
        t += 1.0
    return out


def feed(core: JobCore, recs: list, runs: bool, out: Outputs) -> None:
    if runs:
        core.process_many(recs, out)
    else:
        for r in recs:
            core.process(r, out)


@pytest.mark.parametrize("runs", [False, True], ids=["record by record", "in runs"])
def test_a_restart_just_past_a_due_decision_comes_after_it(runs):
    core, out = JobCore(JOB), Outputs()
    feed(core, [JOB, *beats(range(4), T0 + 1, T0 + 20)], runs, out)  # n2's ranks (2, 3) fall silent at T0 + 20
    t = T0 + 20
    while core.triage.due() == float("inf"):  # n1 waits for n2 (no step) until the silence is an incident
        feed(core, beats((0, 1), t, t + 1, steps=False), runs, out)
        t += 1
        assert t < T0 + 60, "n2's silence opened no incident"
    due, lateness, tick = core.triage.due(), core.config.lateness_s, core.config.tick_s
    last = due + lateness - 0.3  # n1's last records before the restart: the grid stands 0.3 s short of the decision
    feed(core, [r for r in beats((0, 1), t, last, steps=False) if r.ts < last]
         + [Heartbeat(ts=last, job="j", rank=r) for r in (0, 1)], runs, out)
    assert core.watermark < due < core.watermark + tick
    assert not out.actions
    restart = Lifecycle(ts=due + lateness + 0.05, job="j", event="restart", reason="rollback a-1", source="controller")
    feed(core, [restart], runs, out)
    assert [(a.type, a.nodes, a.ts) for a in out.actions] == [("replace", ["n2"], due)]
