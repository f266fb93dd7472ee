"""Stack sweeps on demand: a `collect_stacks` action in, one `stack` record per local rank out.

When an incident opens with a hang or a storm of NCCL timeouts, triage asks for
a sweep: an `action` of type `collect_stacks` on the alert topic (`gw.actions`,
keyed by job) that names the job; its `nodes` list is empty, meaning "every node
of the job". So every agent must see every action: `ActionListener` reads the
topic with no consumer group (a shared group would hand each action to one
agent only), assigned to all its partitions and starting at their end: an
action from before the agent started is old news.

For an action naming a job with ranks on this node (`procs.rank_processes`),
`StackSweeper` runs `py-spy dump --pid P` on each rank's process, in parallel,
and makes each dump a `stack` record: format `py-spy`, snapshot = the action's
id, so that the stack detector sees the dumps of every node as one sweep. An
action delivered twice is answered once.

A dump that fails is left out of the sweep, with its real cause in the log
(`dump_failure`): the process's own state comes first (`/proc/PID/stat`: stopped
`T`, stopped by a tracer `t`, in uninterruptible sleep `D`, exited), then a
permission refusal for what it is: another user's process while the agent is
not root (py-spy then needs root or CAP_SYS_PTRACE), or a refusal to root
itself (ptrace restricted: `kernel.yama.ptrace_scope` 3, a seccomp or AppArmor
profile, a container without CAP_SYS_PTRACE). Root is never told it lacks root.
A rank frozen that way is named to the core by the agent's heartbeats for it
(`frozen`): its stall names it even though the sweep has no stack of it.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gangwatch.producers.agent.procs import PROC, RankProcess, proc_state
from gangwatch.schemas import Action, decode
from gangwatch.schemas.records import FROZEN_STATES
from gangwatch.schemas.security import kafka_python_security
from gangwatch.schemas.signature import TopicVerifier

log = logging.getLogger("gangwatch.agent")

# what ptrace and /proc refusals look like in py-spy's (and its libraries') messages
_REFUSED = re.compile(r"permission denied|operation not permitted|os error (1|13)\b|EPERM|EACCES", re.IGNORECASE)


def dump_failure(message: str, state: str | None, *, euid: int, owner: int | None) -> str:
    """Why py-spy could not dump a process, in words: `message` is py-spy's (its last line of stderr, or a
    timeout said in words), `state` the process's `/proc/PID/stat` letter (None: it is gone), `euid` the agent's
    effective uid, `owner` the process's uid (None: unknown)."""
    refused = bool(_REFUSED.search(message))
    if state is None or state in "ZX":
        return f"the process has exited ({'a zombie' if state else 'gone'}): nothing to dump ({message})"
    if refused and euid != 0 and owner is not None and owner != euid:
        return (f"another user's process (uid {owner}; the agent runs as uid {euid}): py-spy needs root or "
                f"CAP_SYS_PTRACE for it ({message})")
    if state in FROZEN_STATES:
        how = {"T": "it dumps once it is continued (SIGCONT)",
               "t": "a debugger, or another py-spy, holds it: one tracer at a time",
               "D": "a hung filesystem or driver call: it dumps once the call returns"}[state]
        return f"the process is {FROZEN_STATES[state]} ({state}), not a permission problem: {how} ({message})"
    if refused and euid == 0:
        return (f"refused although the agent runs as root: ptrace is restricted on this node "
                f"(kernel.yama.ptrace_scope 3, a seccomp or AppArmor profile, or a container without "
                f"CAP_SYS_PTRACE) ({message})")
    if refused:
        return f"refused: the agent (uid {euid}) may not trace it; give it CAP_SYS_PTRACE or run it as root ({message})"
    return message


class StackSweeper:
    """`py-spy dump` of every local rank of a job, as `stack` records of one snapshot."""

    def __init__(self, *, py_spy: str, processes: Callable[[], list[RankProcess]], timeout_s: float = 30.0,
                 clock: Callable[[], float] = time.time, proc_root: Path = PROC,
                 euid: Callable[[], int] = os.geteuid) -> None:
        self.py_spy, self.timeout_s = py_spy, timeout_s
        self._processes, self._clock = processes, clock
        self.proc_root, self._euid = proc_root, euid

    def sweep(self, job: str, snapshot: str) -> list[dict[str, Any]]:
        """One `stack` record per rank of `job` on this node that py-spy could dump."""
        ranks = [p for p in self._processes() if p.job == job]
        if not ranks:
            log.info("collect_stacks %s: job %s has no process on this node", snapshot, job)
            return []
        with ThreadPoolExecutor(max_workers=min(16, len(ranks)), thread_name_prefix="py-spy") as pool:
            dumps = list(pool.map(self._dump, ranks))
        recs = [{"kind": "stack", "v": 1, "ts": ts, "job": job, "rank": p.rank, "snapshot": snapshot,
                 "format": "py-spy", "dump": text} for p, (ts, text) in zip(ranks, dumps, strict=True) if text]
        log.info("collect_stacks %s: dumped %d of the %d ranks of job %s here", snapshot, len(recs), len(ranks), job)
        return recs

    def _dump(self, proc: RankProcess) -> tuple[float, str | None]:
        """(when, the dump text), or (when, None) with the reason in the log."""
        what = f"py-spy dump --pid {proc.pid} (rank {proc.rank} of job {proc.job})"
        try:
            done = subprocess.run([self.py_spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True,
                                  errors="replace", timeout=self.timeout_s, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            log.warning("%s: py-spy is not at %r; install it (pip install py-spy) or pass --py-spy", what,
                        self.py_spy)
            return self._clock(), None
        except subprocess.TimeoutExpired:
            log.warning("%s failed: %s", what, self._cause(proc, f"no answer within {self.timeout_s:.0f} s"))
            return self._clock(), None
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            log.warning("%s failed: %s", what, self._cause(proc, why[:300]))
            return self._clock(), None
        return self._clock(), done.stdout

    def _cause(self, proc: RankProcess, message: str) -> str:
        state, owner = proc_state(proc.pid, self.proc_root)
        return dump_failure(message, state, euid=self._euid(), owner=owner)


class ActionListener:
    """The collector that answers `collect_stacks` actions; `poll` waits up to `wait_s` for one.

    Until the broker answers and the topic exists, it retries every `retry_s`
    (saying so once in the log). `sweep_of(job, now)` tells the flight-recorder
    watcher which sweep a dump written now belongs to.
    """

    name = "collect_stacks actions"

    def __init__(self, bootstrap: str, topic: str, node: str, sweeper: StackSweeper, *, wait_s: float = 1.0,
                 retry_s: float = 5.0, connect_timeout_s: float = 5.0, sweep_window_s: float = 900.0,
                 verify: TopicVerifier | None = None) -> None:
        """`verify`: checks each action's signature (the worker's secret); one that fails is refused, one log line
        each, counted in `refused`. None: actions are answered unchecked (no secret configured)."""
        self.bootstrap, self.topic, self.node, self.sweeper = bootstrap, topic, node, sweeper
        self.verify = verify
        self.refused = 0
        self.wait_s, self.retry_s, self.connect_timeout_s = wait_s, retry_s, connect_timeout_s
        self.sweep_window_s = sweep_window_s
        self.every_s = retry_s  # pause between polls: none once connected (poll itself waits)
        self._consumer = None
        self._complaint: str | None = None  # the last reason logged for not listening
        self._handled: OrderedDict[str, None] = OrderedDict()  # recent action ids, answered once each
        self._sweeps: dict[str, tuple[str, float]] = {}  # job -> (its latest collect_stacks id, when it came)

    def poll(self, now: float) -> list[dict[str, Any]]:
        if self._consumer is None and not self._connect():
            return []
        recs: list[dict[str, Any]] = []
        for batch in self._consumer.poll(timeout_ms=int(self.wait_s * 1000)).values():
            for msg in batch:
                for rec in decode(msg.value):
                    if isinstance(rec, Action) and rec.type == "collect_stacks" and self._signed(rec, msg):
                        recs += self.handle(rec, now)
        return recs

    def _signed(self, action: Action, msg: Any) -> bool:
        if self.verify is None:
            return True
        verdict = self.verify(msg.value, msg.headers, action.id)
        if not verdict:
            self.refused += 1
            log.warning("collect_stacks %s of job %s refused: %s (actions are signed with the worker's secret, "
                        "GANGWATCH_WEBHOOK_SECRET)", action.id, action.job, verdict.reason)
        return bool(verdict)

    def handle(self, action: Action, now: float) -> list[dict[str, Any]]:
        """Answer one `collect_stacks` action: sweep the job's ranks here, unless it names other nodes only."""
        if action.id in self._handled or (action.nodes and self.node not in action.nodes):
            return []
        self._handled[action.id] = None
        if len(self._handled) > 1024:
            self._handled.popitem(last=False)
        self._sweeps[action.job] = (action.id, now)
        return self.sweeper.sweep(action.job, action.id)

    def sweep_of(self, job: str, now: float) -> str | None:
        """The id of the latest sweep asked for `job`, if it was asked within `sweep_window_s`."""
        sweep = self._sweeps.get(job)
        return sweep[0] if sweep is not None and now - sweep[1] <= self.sweep_window_s else None

    def _connect(self) -> bool:
        from kafka import KafkaConsumer, TopicPartition
        from kafka.errors import KafkaError

        consumer = None
        try:
            consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                                     client_id=f"gangwatch-agent-{self.node}",
                                     bootstrap_timeout_ms=int(self.connect_timeout_s * 1000),
                                     **kafka_python_security())
            partitions = consumer.partitions_for_topic(self.topic)
            if not partitions:
                raise LookupError(f"topic {self.topic} does not exist yet (gangwatch topics create)")
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            consumer.assign(tps)
            consumer.seek_to_end(*tps)
            for tp in tps:
                consumer.position(tp)  # fix the starting point now: every action published from here on is seen
        except (KafkaError, LookupError, OSError) as e:
            if consumer is not None:
                consumer.close()
            why = f"{type(e).__name__}: {e}"
            if why != self._complaint:
                log.warning("not listening for collect_stacks actions yet (%s); retrying every %.0f s", why,
                            self.retry_s)
                self._complaint = why
            return False
        self._consumer, self.every_s = consumer, 0.0
        log.info("listening for collect_stacks actions on %s (%d partitions, from their end)", self.topic, len(tps))
        return True

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
