"""The reference job controller: gangwatch's actions carried out on a real torchrun job, each stage timed.

    gangwatch controller --job j1 --nodes n1,n2 --spares n3 --ckpt-dir ckpt/ -- examples/tiny_job/train.py

For tests, drills and small clusters. It launches the job (control/launcher.py:
one torchrun per node), reads the job's actions from the alert topic
(`gw.actions`) or from signed webhook POSTs, applies each action once, and
reports every stage of the recovery back as `recovery` records on the topic
`topic_for` gives them (`gw.ops`), stamped with when the stage really happened,
so the incident closes with real timings (triage/incident.py).

What each action does:

| action                               | what the controller does                                        |
|--------------------------------------|-----------------------------------------------------------------|
| `replace`, `evict_group`, `isolate`, | stop the job; a spare name takes each named node's place;       |
| `requeue` naming nodes               | restart from the latest checkpoint                              |
| `rollback`                           | the same without the named nodes (isolated), from the newest    |
|                                      | checkpoint older than the first corrupt step of its evidence    |
| `restart_in_process`, `requeue`      | stop and restart on the same nodes from the latest checkpoint   |
| naming no node                       |                                                                 |
| `isolate` of nodes already out (or   | nothing more: accepted                                          |
| leaving with a rollback), `degrade`  |                                                                 |
| `replay`                             | stop the job; run its step from the latest checkpoint on each   |
|                                      | group's nodes, all groups at once (control/trials.py); one      |
|                                      | `replay_result`, `results` {group id: pass/fail}; then wait     |
| `dual_run`                           | once its evidence is in (as a rollback's), one step from the    |
|                                      | checkpoint a rollback would choose on each suspect and on a     |
|                                      | reference (a spare, else a node of the job that is no suspect), |
|                                      | each alone, while the job runs on; one `dual_run_result`,       |
|                                      | `digests` {node: sha256 hex}, `reference`                       |
| `readmit`                            | the named nodes taken out become spares again                   |
| `escalate`                           | logged for a human                                              |
| `collect_stacks`                     | nothing: the node agents answer it                              |

A replay group that exits non-zero, or runs past `replay_timeout_s` (killed),
fails; a dual run's node that does either gives no digest (triage then asks a
human). A replay stops the job first (a `restart` lifecycle record, reason
`replay <id>`, said before): the job is stuck anyway, and stays stopped after
the answer until the next action (another phase, or the `replace` of the
culprit) restarts it.

The job's ordinary life goes out too, as job-level `lifecycle` records (source
`controller`, on `gw.telemetry` keyed by job), each stamped with when it
happened, before what it announces: `start` when the controller launches the
job, `restart` (reason: the action's type and id) right before it stops the
job to carry out an action that restarts it, `stop` (reason `user`) when the
controller itself is stopped (TERM, INT, `close()`) while the job still runs,
and `end` once every torchrun exited 0. So gangwatch knows the silence that
follows each is no fault.

Every action but `escalate` and `collect_stacks` is answered `accepted` when
the controller takes it, with `spares`: how many spare names it still holds
then (before carrying the action out). Phases reported for an action that
restarts the job: that `accepted`, `replaced` (with `spares` left after the
swap) when the new gang with the spares is started
(only when nodes were swapped), then from the job's own progress file
`ckpt_loaded`, `comm_ready`, and `resumed` at the end of the first step after
the restart. `failed` when it cannot be done: no spare left (the job is then
left stopped: a human must add nodes), no checkpoint to roll back to, or the
restarted job exits or has not resumed within `resume_timeout_s`.

Once means once: an action is written to the journal `<state dir>/applied`
(`control.journal.AppliedLog`, the fencing adapters' too) when it is accepted
(before it is carried out), and ids found there are skipped, so a
redelivered action, or a restarted controller reading the topic again, changes
nothing. A controller that dies in the middle of an action does not retry it:
the incident stays open past its budget, which is how a human notices. The
node set (who is in, which spares are left, who was taken out) is kept in
`<state dir>/nodes.json` the same way, so a restarted controller relaunches on
the nodes it had, not on the ones it was first given.

The rollback target: the `sdc_suspect` findings behind a `rollback` carry the
first step whose replica digests disagreed; the controller reads findings from
`gw.findings` to learn it (waiting up to `evidence_wait_s` for them, as the two
topics are not ordered with each other) and restarts from the newest
checkpoint written after an earlier step. The corruption itself may predate
that step by up to the job's digest interval, so a job should compute digests
at least as often as it checkpoints; without any step in the evidence the
oldest checkpoint kept is used.

`dry_run`: nothing is launched, stopped or published, and no state is written;
each action is logged with what would be done.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gangwatch.control.follow import TopicReader
from gangwatch.control.journal import AppliedLog
from gangwatch.control.launcher import CKPT_NAME, Gang, JobSpec, checkpoints, latest, newest_before
from gangwatch.control.trials import Trial
from gangwatch.schemas import Action, DecodeError, Finding, Lifecycle, Record, Recovery, decode, encode
from gangwatch.schemas.security import kafka_python_security
from gangwatch.schemas.signature import (
    DEFAULT_TOLERANCE_S,
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    SignatureVerifier,
    TopicVerifier,
)
from gangwatch.schemas.topics import TopicSettings, topic_for

log = logging.getLogger("gangwatch.controller")

TAKE_OUT = frozenset({"replace", "evict_group", "isolate", "requeue"})  # the named nodes leave the job
IN_PLACE = frozenset({"restart_in_process", "requeue"})  # no node named: restart on the same nodes
FOR_A_HUMAN = frozenset({"escalate"})
NEEDS_EVIDENCE = frozenset({"rollback", "dual_run"})  # they wait for the findings naming the first corrupt step
MILESTONE_PHASE = {"ckpt_loaded": "ckpt_loaded", "comm_ready": "comm_ready", "step": "resumed"}
_FINDINGS_KEPT = 10_000

Publish = Callable[[Record], None]  # sends one input record (recovery, lifecycle) to its topic


@dataclass
class Nodes:
    """Who runs the job, which spare names are left, and who was taken out (in the order it happened)."""

    active: list[str]
    spares: list[str]
    out: list[str]

    @classmethod
    def load(cls, path: Path | None, active: Sequence[str], spares: Sequence[str]) -> Nodes:
        if path is not None and path.exists():
            saved = json.loads(path.read_text())
            log.info("node set from %s (not the command line): %s", path, saved)
            return cls(**saved)
        return cls(list(active), list(spares), [])

    def save(self, path: Path | None) -> None:
        if path is None:
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"active": self.active, "spares": self.spares, "out": self.out}))
        os.replace(tmp, path)

    def without(self, nodes: Iterable[str]) -> Nodes | None:
        """The node set with `nodes` taken out and spares in their places (same order); None: too few spares."""
        gone = set(nodes)
        leaving = [n for n in self.active if n in gone]
        if len(leaving) > len(self.spares):
            return None
        spares = list(self.spares)
        swap = {n: spares.pop(0) for n in leaving}
        return Nodes([swap.get(n, n) for n in self.active], spares, [*self.out, *leaving])


class Controller:
    """Carries out one job's actions on its gang of torchrun processes and reports the recovery stages.

    `publish` sends a `recovery` or `lifecycle` record (`Publisher` on Kafka); `clock` is
    wall-clock time, the event time of the records it reports; `gang` makes a
    launch, `Gang(spec, nodes, resume_from, attempt)` (tests pass a stand-in).
    """

    def __init__(self, spec: JobSpec, nodes: Sequence[str], spares: Sequence[str], publish: Publish, *,
                 state_dir: Path | None = None, dry_run: bool = False, resume_timeout_s: float = 300.0,
                 evidence_wait_s: float = 10.0, stop_grace_s: float = 20.0, replay_timeout_s: float = 300.0,
                 replay_steps: int = 1, clock: Callable[[], float] = time.time,
                 gang: Callable[..., Gang] = Gang) -> None:
        self.spec, self.publish, self.dry_run, self.clock, self._new_gang = spec, publish, dry_run, clock, gang
        self.resume_timeout_s, self.evidence_wait_s, self.stop_grace_s = resume_timeout_s, evidence_wait_s, stop_grace_s
        self.replay_timeout_s, self.replay_steps = replay_timeout_s, replay_steps
        state = None if dry_run else state_dir
        if state is not None:
            state.mkdir(parents=True, exist_ok=True)
        self._nodes_file = state / "nodes.json" if state is not None else None
        self.applied = AppliedLog(state / "applied" if state is not None else None)
        self.nodes = Nodes.load(self._nodes_file, nodes, spares)
        self.gang: Gang | None = None
        self.findings: OrderedDict[str, Finding] = OrderedDict()  # recent findings of the job, by id
        self._deferred: list[tuple[Action, float]] = []  # rollbacks, dual runs waiting for their evidence, by when
        self._trials: list[Trial] = []  # replays and dual runs under way
        self._pending: list[Action] = []  # actions whose restart has not resumed yet
        self._phases: dict[str, set[str]] = {}  # action id -> phases reported
        self._restored: dict[str, Path | None] = {}  # action id -> the checkpoint its restart loaded
        self._resume_by = 0.0
        self._ended = False  # `end` was said
        self._exit_said: Gang | None = None  # the launch whose exit was said (or that this controller stopped)

    # --- the job --------------------------------------------------------------------------------

    def start(self) -> None:
        """Launch the job on the current nodes, from the latest checkpoint if there is one."""
        if self.dry_run:
            log.info("dry run: not launching %s", self.spec.job)
            return
        self._say("start")
        self._launch(latest(self.spec.ckpt_dir))

    def finished(self) -> bool:
        """The job ran to its end: every torchrun exited with 0 and no recovery is under way."""
        if self.gang is None or self._pending or self._deferred or self._trials:
            return False
        codes = self.gang.returncodes().values()
        return all(code == 0 for code in codes)

    def close(self) -> None:
        """Stop the job (the controller owns it: nothing it launched outlives it): a job still running is
        stopped on purpose (`stop`, reason `user`); a job that finished has its `end` said."""
        for trial in self._trials:
            trial.stop()
        if self.gang is None:
            return
        if self.gang.running():
            self._say("stop", "user")
        elif self.finished() and not self._ended:
            self._ended = True
            self._say("end")
        self.gang.stop(self.stop_grace_s)

    def _launch(self, resume_from: Path | None) -> None:
        attempt = len(list(self.spec.run_dir.glob("attempt-*")))
        self.gang = self._new_gang(self.spec, self.nodes.active, resume_from, attempt)
        self.gang.start()
        log.info("job %s started (attempt %d) on %s from %s; logs in %s", self.spec.job, attempt,
                 ", ".join(self.nodes.active), resume_from or "scratch", self.gang.dir)

    # --- inputs ---------------------------------------------------------------------------------

    def remember(self, f: Finding) -> None:
        """A finding of the job: kept a while, as evidence an action may point to."""
        self.findings[f.id] = f
        while len(self.findings) > _FINDINGS_KEPT:
            self.findings.popitem(last=False)

    def handle(self, a: Action) -> None:
        """Apply one action, once."""
        if a.job != self.spec.job or a.type == "collect_stacks":
            return
        if a.id in self.applied:
            log.info("action %s (%s) was already applied: skipped", a.id, a.type)
            return
        self.applied.add(a, (), ok=True, at=self.clock())  # accepted: never again, even if it fails midway
        log.info("action %s: %s %s: %s", a.id, a.type, ",".join(a.nodes) or "-", a.reason)
        if a.type in FOR_A_HUMAN:
            log.warning("%s is for a human; this controller does nothing about it", a.type)
            return
        self._report(a, "accepted", self.clock(), spares=len(self.nodes.spares))
        if a.type in NEEDS_EVIDENCE:
            self._deferred.append((a, time.monotonic() + self.evidence_wait_s))
            self._apply_rollbacks()
        elif a.type == "replay":
            self._replay(a)
        elif a.type == "readmit":
            self._readmit(a)
        elif a.type in TAKE_OUT and a.nodes:
            leaving = {*self.nodes.out, *(n for r, _ in self._deferred if r.type == "rollback" for n in r.nodes)}
            if set(a.nodes) <= leaving:
                log.info("%s: %s already out of the job, or on the way out", a.type, ", ".join(a.nodes))
            else:
                self._restart(a, take_out=a.nodes, resume_from=latest(self.spec.ckpt_dir))
        elif a.type in IN_PLACE:
            self._restart(a, take_out=(), resume_from=latest(self.spec.ckpt_dir))
        # degrade: the job keeps running; nothing to do

    def tick(self) -> None:
        """Follow what is under way: deferred rollbacks and dual runs, replays, and the restarted job's progress."""
        self._apply_rollbacks()
        self._follow_trials()
        self._watch_exit()
        if not self._pending or self.gang is None:
            return
        for m in self.gang.milestones():
            phase = MILESTONE_PHASE.get(m.get("event"))
            if phase is not None:
                for a in self._pending:
                    self._report(a, phase, float(m["ts"]), **self._checkpoint_named(a, phase))
        done = [a for a in self._pending if "resumed" in self._phases.get(a.id, ())]
        if done:
            log.info("job %s resumed", self.spec.job)
            self._pending = []
        elif not self.gang.running():
            self._exit_said = self.gang
            self._fail_pending(f"the restarted job exited ({exits(self.gang.returncodes())}) before its first step")
        elif time.monotonic() > self._resume_by:
            self._fail_pending(f"the restarted job did not resume within {self.resume_timeout_s:g} s")

    def _watch_exit(self) -> None:
        """Say once per launch how the job ended when it ended by itself (a crash, a user's Ctrl-C or kill, or
        its end), not stopped by this controller: each torchrun's exit code or signal, and what happens next."""
        g = self.gang
        if g is None or g is self._exit_said or self._pending or g.running():
            return
        self._exit_said = g
        codes = g.returncodes()
        if all(code == 0 for code in codes.values()):
            log.info("job %s (attempt %d) ran to its end: every torchrun exited with 0", self.spec.job, g.attempt)
            return
        log.warning("job %s (attempt %d) ended by itself: %s; it is not restarted unless an action says so (the "
                    "controller keeps waiting for gangwatch's; Ctrl-C stops the controller)", self.spec.job,
                    g.attempt, exits(codes))

    def _stop_gang(self) -> None:
        """Stop the current launch on purpose (its exit is this controller's doing: not said as the job's own)."""
        if self.gang is not None:
            self._exit_said = self.gang
            self.gang.stop(self.stop_grace_s)

    # --- carrying it out ------------------------------------------------------------------------

    def _apply_rollbacks(self) -> None:
        for a, deadline in list(self._deferred):
            first_bad = self._first_unverified_step(a)
            if first_bad is None and time.monotonic() < deadline:
                continue  # the evidence may still be on its way
            self._deferred.remove((a, deadline))
            if first_bad is None:
                kept = checkpoints(self.spec.ckpt_dir)
                target = kept[0][1] if kept else None
                log.warning("%s %s: no step in its evidence; using the oldest checkpoint kept", a.type, a.id)
            else:
                target = newest_before(self.spec.ckpt_dir, first_bad)
            if a.type == "dual_run":
                self._dual_run(a, target)  # no checkpoint that old: from the start, which is trusted too
                continue
            if target is None:
                self._report(a, "failed", self.clock())
                log.error("rollback %s: no checkpoint older than step %s", a.id, first_bad)
                continue
            self._restart(a, take_out=a.nodes, resume_from=target)

    def _first_unverified_step(self, a: Action) -> int | None:
        """The earliest step the evidence does not vouch for: the one after the last step the suspect's replicas
        still agreed on when a finding says (digests compared every few steps leave the steps between
        unchecked), else the first mismatching step itself."""
        steps = []
        for i in a.evidence:
            ev = f.evidence if (f := self.findings.get(i)) is not None else {}
            if isinstance(ev.get("last_agreeing_step"), int):
                steps.append(ev["last_agreeing_step"] + 1)
            elif isinstance(ev.get("step"), int):
                steps.append(ev["step"])
        return min(steps) if steps else None

    def _restart(self, a: Action, take_out: Sequence[str], resume_from: Path | None) -> None:
        """Stop the job and start it again without `take_out`, from `resume_from`."""
        nodes = self.nodes.without(take_out)
        if self.dry_run:
            log.info("dry run: would stop %s and restart it on %s from %s", self.spec.job,
                     ", ".join(nodes.active) if nodes else "(no spare left)", resume_from or "scratch")
            return
        if nodes is None:
            self._stop_gang()  # stopped, not restarted: the failed recovery is what says so
            self._report(a, "failed", self.clock())
            log.error("no spare left to replace %s (spares: %s): the job is stopped; add nodes and restart it",
                      ", ".join(take_out), self.nodes.spares)
            return
        if self.gang is not None:
            self._say("restart", f"{a.type} {a.id}")  # before the stop: the old run's silence is this restart's
            self._stop_gang()
        swapped = nodes.active != self.nodes.active
        self.nodes = nodes
        self.nodes.save(self._nodes_file)
        self._launch(resume_from)
        self._restored[a.id] = resume_from
        if swapped:
            self._report(a, "replaced", self.clock(), spares=len(self.nodes.spares))
        self._pending = [*(p for p in self._pending if p.id != a.id), a]
        self._resume_by = time.monotonic() + self.resume_timeout_s

    def _replay(self, a: Action) -> None:
        """Stop the job and start every group of the replay from the latest checkpoint."""
        if self.dry_run:
            log.info("dry run: would stop %s and replay %d step(s) from %s on groups %s", self.spec.job,
                     self.replay_steps, latest(self.spec.ckpt_dir) or "scratch", a.extra.get("groups"))
            return
        if self.gang is not None and self.gang.running():
            self._say("restart", f"replay {a.id}")  # stopped for the replay; the next action restarts it
            self._stop_gang()
        try:
            trial = Trial.replay(self.spec, a, latest(self.spec.ckpt_dir), self.replay_steps, self.replay_timeout_s,
                                 time.monotonic(), self._new_gang)
        except ValueError as e:
            log.error("%s", e)
            self._report(a, "failed", self.clock())
            return
        self._trials.append(trial)

    def _dual_run(self, a: Action, resume_from: Path | None) -> None:
        """One step from `resume_from` on each suspect and on a reference machine, each alone."""
        reference = next((n for n in (*self.nodes.spares, *self.nodes.active) if n not in a.nodes), None)
        if self.dry_run:
            log.info("dry run: would run one step from %s on %s and on reference %s", resume_from or "scratch",
                     ", ".join(a.nodes), reference)
            return
        if reference is None or not a.nodes:
            log.error("dual run %s: no machine to trust as the reference (spares %s, nodes %s) or no suspect",
                      a.id, self.nodes.spares, self.nodes.active)
            self._report(a, "dual_run_result", self.clock(), digests={})
            return
        self._trials.append(Trial.dual_run(self.spec, a, a.nodes, reference, resume_from, self.replay_timeout_s,
                                           time.monotonic(), self._new_gang))

    def _follow_trials(self) -> None:
        """Answer each replay or dual run whose runs are all over."""
        for trial in [t for t in self._trials if t.poll(time.monotonic())]:
            self._trials.remove(trial)
            if trial.kind == "replay":
                self._report(trial.action, "replay_result", self.clock(), results=trial.results())
            else:
                self._report(trial.action, "dual_run_result", self.clock(), digests=trial.digests(),
                             reference=trial.reference)

    def _readmit(self, a: Action) -> None:
        """Cleared nodes that were taken out become spares again."""
        back = [n for n in a.nodes if n in self.nodes.out]
        if not back or self.dry_run:
            log.info("readmit %s: %s", a.id, f"would make {back} spares again" if back else "none of them is out")
            return
        self.nodes = Nodes(self.nodes.active, [*self.nodes.spares, *back], [n for n in self.nodes.out if n not in back])
        self.nodes.save(self._nodes_file)
        log.info("readmitted %s: spares now %s", ", ".join(back), ", ".join(self.nodes.spares))

    def _fail_pending(self, why: str) -> None:
        log.error("%s: recovery failed", why)
        for a in self._pending:
            self._report(a, "failed", self.clock())
        self._pending = []

    def _say(self, event: str, reason: str | None = None) -> None:
        """A job-level `lifecycle` record, stamped now (before what it announces happens). A broker that fails
        it is logged: the controller carries the action out all the same."""
        if self.dry_run:
            return
        rec = Lifecycle(ts=round(self.clock(), 6), job=self.spec.job, event=event,
                        reason=reason[:256] if reason else None, source="controller")
        log.info("job %s: %s%s", self.spec.job, event, f" ({reason})" if reason else "")
        self._publish(rec, f"the {event} record of job {self.spec.job}")

    def _publish(self, rec: Record, what: str) -> None:
        """Publish `rec`; a broker that fails it is logged: the controller owns the job and goes on with it."""
        try:
            self.publish(rec)
        except Exception as e:
            log.error("%s could not be published: %s: %s", what, type(e).__name__, e)

    def _checkpoint_named(self, a: Action, phase: str) -> dict[str, Any]:
        """`ckpt_loaded` says which checkpoint the restart loaded (`extra.checkpoint` "step-<N>", `extra.step`):
        what a drill's restore check reads."""
        path = self._restored.get(a.id) if phase == "ckpt_loaded" else None
        m = CKPT_NAME.match(path.name) if path is not None else None
        return {"extra": {"checkpoint": f"step-{int(m.group(1))}", "step": int(m.group(1))}} if m else {}

    def _report(self, a: Action, phase: str, ts: float, **answer: object) -> None:
        """One `recovery` record of `a` (once per phase); `answer`: its `results`, `digests`, `reference`,
        `spares`."""
        seen = self._phases.setdefault(a.id, set())
        if phase in seen:
            return
        seen.add(phase)
        log.info("recovery %s: %s%s", a.id, phase, f" {answer}" if answer else "")
        if not self.dry_run:
            self._publish(Recovery(ts=round(ts, 6), job=a.job, action=a.id, phase=phase, **answer),
                          f"the {phase} record of action {a.id}")


# --- where actions come from, where recovery records go ------------------------------------------


class Publisher:
    """Sends input records (`recovery`, `lifecycle`) to their topic, keyed as `topic_for` says (by job), waiting
    for each acknowledgement."""

    def __init__(self, bootstrap: str, topics: TopicSettings) -> None:
        from kafka import KafkaProducer

        self.topics = topics
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", client_id="gangwatch-controller",
                                       **kafka_python_security())

    def __call__(self, rec: Record) -> None:
        topic, key = topic_for(rec, self.topics)
        self._producer.send(topic, key=key.encode(), value=encode(rec)).get(timeout=30)

    def close(self) -> None:
        """Flush what is still queued, at most 10 s; a broker that is away then costs those records, said once."""
        from kafka.errors import KafkaError

        try:
            self._producer.close(timeout=10)
        except KafkaError as e:
            log.error("records not delivered at exit (the broker did not take them within 10 s): %s: %s",
                      type(e).__name__, e)


RecoveryPublisher = Publisher  # its earlier name, when it sent recovery records only


class TopicSource(TopicReader):
    """One job's actions (unless `actions=False`) and findings from the output topics, through a consumer group
    (`control.follow`): a new group starts at the end, since actions published before the controller ever ran
    are not its to apply; offsets are committed after each poll's records were handled."""

    def __init__(self, bootstrap: str, topics: TopicSettings, job: str, group: str, *, actions: bool = True,
                 verify: TopicVerifier | None = None) -> None:
        """`verify`: how actions are checked (their v1 signature); without it, none is acted on."""
        super().__init__(bootstrap, [topics.findings, *([topics.actions] if actions else [])], group,
                         client_id="gangwatch-controller", verify=verify)
        self.job = job

    def poll(self, timeout_s: float) -> list[Action | Finding]:
        out: list[Action | Finding] = []
        for key, r in self.poll_keyed(timeout_s):
            if not (isinstance(r, (Action, Finding)) and r.job == self.job
                    and (key is None or key.decode(errors="replace") == self.job)):
                continue
            out.append(r)
        return out


class WebhookSource:
    """Actions POSTed by the worker's webhook sink, checked against the shared secret and queued.

    A request is answered 202 once queued (the controller applies it right after),
    401 when its signature does not verify or its timestamp is more than
    `tolerance_s` from `clock` (sinks/webhook.py: signature scheme v1), 409 when
    it replays a request already accepted, 400 when the body is no action or the
    `Idempotency-Key` is not its id, 413 (unread, the connection closed) when its
    `Content-Length` passes `max_body` bytes, 411 when it has none.
    """

    def __init__(self, host: str, port: int, secret: str | bytes, *, tolerance_s: float = DEFAULT_TOLERANCE_S,
                 clock: Callable[[], float] = time.time, max_body: int = 1 << 20) -> None:
        self.queue: queue.Queue[Action] = queue.Queue()
        source = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = self.headers.get("Content-Length", "")
                if not length.strip().isdigit() or int(length) > max_body:
                    status = 411 if not length.strip().isdigit() else 413
                    log.warning("webhook: a POST with Content-Length %r was refused (%d; at most %d bytes)",
                                length[:20], status, max_body)
                    self.close_connection = True  # the body is never read
                    self.send_response(status)
                else:
                    body = self.rfile.read(int(length))
                    self.send_response(source.accept(body, self.headers.get(SIGNATURE_HEADER),
                                                     self.headers.get(IDEMPOTENCY_HEADER)))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("webhook: " + fmt, *args)

        self._verify = SignatureVerifier(secret, tolerance_s=tolerance_s, clock=clock)
        self._server = ThreadingHTTPServer((host, port), Handler)
        self.url = f"http://{host}:{self._server.server_address[1]}/"
        self._thread = threading.Thread(target=self._server.serve_forever, name="gangwatch-webhook", daemon=True)
        self._thread.start()

    def accept(self, body: bytes, signature: str | None, key: str | None) -> int:
        """The HTTP status for one POST (queueing its action when it is good)."""
        verdict = self._verify(body, signature, key)
        if not verdict:
            log.warning("webhook: a POST for %r was refused (%d): %s", (key or "")[:80], verdict.status,
                        verdict.reason)
            return verdict.status
        recs = decode(body)
        if len(recs) != 1 or not isinstance(recs[0], Action):
            reason = recs[0].reason if recs and isinstance(recs[0], DecodeError) else "not one action"
            log.warning("webhook: refused a body that is no action: %s", reason)
            return 400
        if key != recs[0].id:
            log.warning("webhook: Idempotency-Key %r is not the action id %s", key, recs[0].id)
            return 400
        self.queue.put(recs[0])
        return 202

    def poll(self, timeout_s: float) -> list[Action]:
        out = []
        try:
            out.append(self.queue.get(timeout=timeout_s))
            while True:
                out.append(self.queue.get_nowait())
        except queue.Empty:
            return out

    def commit(self) -> None:
        pass  # an action is taken when it is applied (the journal)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def exits(codes: dict[str, int | None]) -> str:
    """Per node, how its torchrun ended: `n1 exit code 1, n2 killed by SIGINT (signal 2)` (Popen's negative code
    is the signal; 128 + N is a shell's way of saying signal N)."""
    def one(code: int | None) -> str:
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by {_signal_name(-code)} (signal {-code})"
        if code > 128 and _signal_name(code - 128) != str(code - 128):
            return f"exit code {code} (128 + {_signal_name(code - 128)})"
        return f"exit code {code}"

    return ", ".join(f"{node} {one(code)}" for node, code in codes.items())


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return str(n)


def run(controller: Controller, sources: Sequence[TopicSource | WebhookSource], stop: threading.Event,
        poll_s: float = 0.25) -> None:
    """Launch the job, then apply what arrives until `stop` is set or the job has finished; stop the job at the end."""
    controller.start()
    try:
        while not stop.is_set() and not controller.finished():
            for source in sources:
                for rec in source.poll(poll_s):
                    if rec.kind == "finding":
                        controller.remember(rec)
                    else:
                        controller.handle(rec)
                source.commit()
            controller.tick()
    finally:
        controller.close()
