"""Heartbeats for ranks whose process lives but cannot beat: frozen is a hang to sweep, not a death to evict.

A rank's heartbeats come from a thread of its own process. When the whole
process is stopped (`T`: SIGSTOP, SIGTSTP, a job-control stop), stopped under a
tracer (`t`), or in uninterruptible sleep (`D`: swapping, a hung filesystem or
driver call), that thread stops with it, and from outside the rank looks dead:
fail-stop would report it missing after two periods and have it replaced (a
freeze of 30 s cost a restart 12 s in and the job 65 s down). It is not dead:
when the stop ends, or the page-in or the call returns, it trains on.

So every heartbeat period the agent reads each local rank's `/proc/PID/stat`
state (`procs.RankTable`: one read per rank) and, for a rank in `T`, `t` or `D`,
sends a `heartbeat` for it on the rank's behalf:

    {"kind": "heartbeat", "v": 1, "ts": <now>, "job": "j", "rank": 3, "source": "agent", "proc_state": "T"}

(`source` and `proc_state` are kept in the record's `extra`). The core counts
any heartbeat as a sign of life, so the rank stays live; its steps stop, so a
freeze longer than the job's rhythm allows is a hang, and the hang detector
names the frozen rank from these heartbeats (a `frozen_rank` finding: a py-spy
sweep cannot dump a stopped process); the job's stepping on again closes the
incident with nobody evicted.

A process in `R` or `S` beats by itself: nothing is sent for it (no traffic in
the common case). A zombie (`Z`, `X`) or a vanished process is dead: nothing is
sent, so its silence is a fail-stop as before. One state is read, the main
thread's: a heartbeat thread blocked alone while the main thread runs is not seen.

A rank stopped under py-spy (`t`, its `TracerPid` a process named py-spy) is
being looked at, not frozen: `py-spy dump` stops the process for the tenth of a
second it reads the stack, and `py-spy record` does so at every sample. The
agent's own stack sweep is such a look, and it runs exactly when a stall is
being diagnosed: a poll that fell inside the sweep's dump of rank 0 named rank
0 frozen and turned a whole job's pause into a hang of rank 0's node. So a `t`
is read again from `status` (state and tracer in one read) and is a freeze
only while a tracer other than py-spy still holds the process (a debugger at a
breakpoint): a dump that ended between the two reads, or whose py-spy is gone
by the time its name is read, is no freeze either.

Nor is a state that passes: a rank's main thread is in `D` for the
milliseconds of a page fault or a disk write, often, and a rank that starts
up or writes a checkpoint under load reads `D` now and then. A frozen state is
read again `confirm_s` (0.5 s) later and counts only when it is still there: a
real freeze (a stop, a hung filesystem) lasts seconds, and half a second is
nothing against fail-stop's two heartbeat periods.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from gangwatch.producers.agent.procs import RankProcess, RankTable, proc_state, status_of
from gangwatch.schemas.records import FROZEN_STATES as FROZEN  # the process lives, its threads do not run

log = logging.getLogger("gangwatch.agent")
SAMPLERS = frozenset({"py-spy"})  # tracers that stop a process only while they read it


class FrozenRanks:
    """The collector: every `every_s` (the heartbeat period), a heartbeat for each local rank that is frozen."""

    name = "frozen ranks"

    def __init__(self, table: RankTable, every_s: float, *, confirm_s: float = 0.5,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.table, self.every_s, self.confirm_s, self.sleep = table, every_s, confirm_s, sleep
        self._frozen: dict[tuple[str, int, int], str] = {}  # (job, rank, pid) -> state, to log each change once

    def poll(self, now: float) -> list[dict[str, Any]]:
        recs: list[dict[str, Any]] = []
        frozen: dict[tuple[str, int, int], str] = {}
        for proc, state in self._still_frozen(self.table.states(now)):
            key = (proc.job, proc.rank, proc.pid)
            frozen[key] = state
            if self._frozen.get(key) != state:
                log.info("rank %d of job %s (pid %d) is %s (%s): heartbeating for it while it lasts", proc.rank,
                         proc.job, proc.pid, FROZEN[state], state)
            recs.append({"kind": "heartbeat", "v": 1, "ts": now, "job": proc.job, "rank": proc.rank,
                         "source": "agent", "proc_state": state})
        for job, rank, pid in self._frozen.keys() - frozen.keys():
            log.info("rank %d of job %s (pid %d) is no longer frozen", rank, job, pid)
        self._frozen = frozen
        return recs

    def _still_frozen(self, read: list[tuple[RankProcess, str]]) -> list[tuple[RankProcess, str]]:
        """The ranks frozen at this read and again `confirm_s` later, with their state at the second read."""
        first = [proc for proc, state in read if self._frozen_state(proc, state) is not None]
        if not first:
            return []
        self.sleep(self.confirm_s)
        out = []
        for proc in first:
            state = proc_state(proc.pid, self.table.proc_root)[0]
            state = None if state is None else self._frozen_state(proc, state)
            if state is not None:
                out.append((proc, state))
        return out

    def _frozen_state(self, proc: RankProcess, state: str) -> str | None:
        """The frozen state `proc` is in, None when it is not frozen (`stat` said `state`)."""
        if state != "t":
            return state if state in FROZEN else None
        seen = status_of(proc.pid, self.table.proc_root)
        if seen is None:
            return state  # no `status` to read: `stat`'s word stands
        now, tracer = seen
        if now != "t":
            return now if now in FROZEN else None  # the trace ended since `stat` was read
        return None if not tracer or tracer in SAMPLERS else now  # no tracer, or one gone, or a look

    def close(self) -> None:
        pass
