"""A rank's lifecycle record counts the same whichever way the core is fed: record by record (`process`, the
worker's one-by-one path) or in runs (`process_many`, replay's and the worker's batch path).

Found on the real job (tests/integration/test_real_job.py, the user stop): every rank said `stop` after the
job's last step, yet the batch path reported a hang 20 s later, because its run of records never showed the
hang detector the lifecycle records.
"""

from __future__ import annotations

import pytest
from gangwatch.schemas import Heartbeat, Job, Lifecycle, RankInfo, Step
from gangwatch.triage.core import Core

pytestmark = pytest.mark.unit

T0 = 1_700_000_000.0


def stopped_job() -> list:
    """Four ranks step for 6 s, the controller says `stop`, the ranks step once more and each says `stop`
    (SIGTERM), as a user's stop of the reference controller goes."""
    recs: list = [Job(ts=T0, job="j", heartbeat_s=2.0, ranks=[RankInfo(rank=r, node=f"n{r // 2 + 1}")
                                                              for r in range(4)])]
    t = T0
    for step in range(40):
        t += 0.15
        recs += [Step(ts=t + 0.001 * r, job="j", rank=r, step=step, step_s=0.15) for r in range(4)]
        if step % 13 == 0:
            recs += [Heartbeat(ts=t + 0.005 + 0.001 * r, job="j", rank=r, step=step) for r in range(4)]
    recs.append(Lifecycle(ts=t + 0.01, job="j", event="stop", reason="user", source="controller"))
    recs += [Step(ts=t + 0.02 + 0.001 * r, job="j", rank=r, step=40, step_s=0.15) for r in range(4)]
    recs += [Lifecycle(ts=t + 0.05 + 0.001 * r, job="j", event="stop", rank=r, reason="SIGTERM", source="trainer")
             for r in range(4)]
    return recs


def faults(out) -> list[tuple[str, str | None]]:
    return [(f.type, f.node) for f in out.findings if f.type != "job_state"] + [(a.type, None) for a in out.actions]


@pytest.mark.parametrize("path", ["process", "process_many"])
def test_a_job_every_rank_of_which_said_stop_is_not_hung_whichever_path_fed_it(path):
    core = Core()
    recs = stopped_job()
    found = []
    if path == "process":
        for r in recs:
            found += faults(core.process(r))
    else:
        found += faults(core.process_many(recs))
    found += faults(core.advance(recs[-1].ts + 60.0))
    assert found == []
