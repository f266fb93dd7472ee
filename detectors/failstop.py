"""Fail-stop: ranks that stop heartbeating, processes that exit or crash, and jobs that never start.

Every rank of a job is in one of four states:

- not started: not heard from since the job record. Imports, data loading and
  communicator set-up take minutes at scale, so a rank's silence before its first
  record is start-up, not a fault. A job whose ranks have not all appeared
  `start_timeout_s` after its job record gets one `start_timeout` finding naming
  the ranks that never did and their nodes (triage informs a human; nobody is
  evicted for a start that never happened).
- live: heard from (a heartbeat, a step or a framework event). It is missing once
  `miss_factor` heartbeat periods plus `slack_s` pass without a record: two periods
  forgive one lost or late heartbeat (reporters beat from their own thread, so a
  long step or a GC pause delays a heartbeat, it does not stop them).
- silent: reported missing; a newer record makes it live again.
- exited: it sent an `exit` record (or raised, or ran out of memory), so its silence afterwards is
  expected, not news.
  An exit with a non-zero or unknown `code` is a fail-stop at once; a clean one
  (`code` 0, as every rank of a finished job sends) is no finding at all.

A rank that says it stops (a `lifecycle` record: `stop`, `end`; the trainer client sends one when SIGTERM
or SIGINT reaches it) counts as exited too, and so does every rank when the launcher or controller says the
whole job stops, ends or restarts: a job stopped by its user, finished or restarted by its controller falls
silent on purpose, which is nobody's fault.

A clean exit is the job's end only if the job ends with it. One rank leaving with code 0 while its peers
still train (a stray `sys.exit(0)`) is that rank's failure: once a peer reports losing a remote rank after it
(while most of the job has not exited cleanly: at a job's end, the last ranks see the first ones go), or when,
`end_window_s` after it, most of the job's ranks still run, it is a `fail_stop` of that rank (cause `exit`,
"exited with code 0 while ... still ran"). Every rank exiting cleanly within the window is the job's end, with
or without a `stop` record (older clients sent none).

When the input ends (`finish`, replay) just after peers reported losing a remote rank, before any silence
could be timed out, the ranks that neither exited nor reported anything, silent since before those reports,
are the ones that vanished: named from what there is (a fail-stop of their node), if they are a minority.

A silence it reported stands only while no record of those ranks stamped before the finding turns up: a
heartbeat held back by a loaded host or a slow link, arriving late, withdraws it (`silence_withdrawn`, naming
the finding); triage then cancels what was not decided yet, or gives the eviction back to the blast-radius
budget. The rank's records are late, so its silence is judged that much later from then on (`late_s`: the
lateness the withdrawal showed, for the rest of the run).

A rank falling silent while most of the job says it stops (a user's stop whose record from that rank was
lost) stopped with them; a few ranks stopping (a launcher tearing down a node whose rank was killed outright)
hide nobody's silence.

Before the job's first step nobody is evicted for silence alone: a rank that falls silent during start-up
(a heartbeat held back on a loaded host, a slow import) is held until the start deadline unless its peers
report losing it; a dead machine's own hardware events or a crash record speak for it meanwhile.

When a rank dies outright (power, kernel panic, SIGKILL, the OOM killer) it says
nothing; its peers' communicators fail within milliseconds and they raise errors
such as "Connection closed by peer ... typically caused by a remote worker
crashing". Those are consequences, not culprits: a `peer_lost` finding (no weight
against the reporter's node) and the reporter counts as exited. The culprit is the
rank that vanished without a word: its silence is a fail-stop of its node even when
nobody else in the job speaks any more, because the peers said why.

A launcher tears a node's remaining ranks down once one of them fails (torchrun
stops the whole node when a worker raises), so a rank that falls silent on a node
where a sibling reported losing a peer is the teardown's, not a culprit, as long
as some other node vanished without a word: the silent rank is held for
`grace_factor` periods plus `slack_s`, the time for that node to time out, and then
named a consequence (`peer_lost`, cause `teardown`). With no wordless node
elsewhere the silence is reported as usual (the culprit may be the silent sibling).

Missing ranks are reported per node: when no rank of a node is left alive, one
finding names the node and its silent ranks; a node where only some ranks are
missing is reported once the first of them has been missing for `grace_factor`
periods plus `slack_s` more (a node's ranks beat out of phase, up to a period
apart: time for its siblings to time out too), so a node is one finding, not eight.

Silence is a node's only while the rest of the job is heard from, or its peers
reported losing a remote worker. If no rank of the job has sent anything for a
period plus `slack_s`, missing ranks are held; once every live rank is missing the
job went silent as a whole, which is the monitoring path failing (sidecars,
broker, collector) or the job stopping without a word, not a node fault. Where
the gang ended together (every live rank's newest step the same, on two nodes or
more, or on one node whose agent spoke on after its ranks missed a beat; none
crashed: the job's own logical clock agrees, as at the end of a job whose
launcher reports nothing) it is the job's end: a `silent_end` finding moves the
job's life to `finished` (expected silence; a step or heartbeat heard later moves
it back to `running`). A job of one node whose agent fell silent with its ranks
is that node's `fail_stop`, witnessed by the stream (`witness: stream`): named,
paged after the lateness bound, evicted by nobody, since the node lost and the
job ended unsaid look alike. Otherwise (ranks at different steps, several nodes,
a crash) one job-level `monitoring_gap` finding.

The times kept of a rank's records are the job's, in its node's clock offset as the job's clock has it now:
when the clock learns or changes a node's offset, they move with it (`_rebase`); a node whose clock runs behind,
read before the clock knew it, would otherwise look silent for as long as its clock is off. And the gang's steps
are the job's own clock: ranks that reported steps two past any the rest of the gang reported are not silent yet
(no rank of a synchronous job gets a step ahead of the others: the others' records of those steps are still to
come), up to `prove_max_s`.

Timeouts are evaluated on a fixed event-time grid of `tick_s`, so the findings do
not depend on how often `advance` is called, and a finding's ts is the grid point
it was found at: a node gone silent is reported at most `miss_factor` periods +
`slack_s` + `tick_s` after its last heartbeat (2 periods + 1 s by default).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
from gangwatch.detectors.base import DetectorBase, SavedJob, fill_missing
from gangwatch.detectors.config import FailStopConfig
from gangwatch.detectors.floats import decode_floats, encode_floats, finite_or_none
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.runs import RecordRun, observe_each, ranks_and_times
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Framework, Record
from gangwatch.schemas.evidence import Evidence

_CRASH_TYPES = frozenset({"exit", "exception", "oom"})
# what a rank's communicator raises when a *remote* rank died (gloo, NCCL, torch.distributed)
PEER_LOST = re.compile(
    r"closed by peer|remote worker crash|connection reset by peer|remote process exited|peer .{0,40}(?:died|exited)"
    r"|communicator was aborted|ncclRemoteError|remote end closed|broken pipe", re.IGNORECASE)
NOT_STARTED, LIVE, SILENT, EXITED, GAP = 0, 1, 2, 3, 4  # GAP: silent, but the gang's steps show it alive
_MILESTONES = 16  # the job's newest steps kept to learn its step interval


def clean_exit(rec: Framework) -> bool:
    """An `exit` with code 0 (an optional `code` field, as on `hw` records): the process finished its work."""
    return rec.type == "exit" and rec.extra.get("code") == 0


# --- what it finds ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessFailure(Evidence):
    """A rank's process exited (non-zero or unknown code), raised, or ran out of memory."""

    cause: str  # the framework record's type: exit, exception, oom
    ranks: list[int]
    message: str  # the framework's own text, first 500 characters
    node_ranks: int  # ranks on the node


@dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatLoss(Evidence):
    """Ranks of one node stopped heartbeating while the rest of the job went on."""

    cause: str  # "heartbeat"
    ranks: list[int]  # the silent ranks
    node_ranks: int
    whole_node: bool  # no rank of the node is left alive
    first_silent_ts: float  # the earliest last record of a silent rank
    last_seen_ts: float  # the latest one
    timeout_s: float  # silence that makes a rank missing
    # who saw the node fall silent: `peers`, the rest of the job heard; `stream`, a job of one node whose own
    # agent fell silent with its ranks while other records moved the job's time (its decision waits `late_s`)
    witness: str = "peers"


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerLoss(Evidence):
    """A rank's communicator failed because a remote rank went away: a consequence, not a culprit."""

    cause: str  # the framework record's type
    ranks: list[int]
    message: str  # the framework's own text, first 500 characters


@dataclass(frozen=True, slots=True, kw_only=True)
class SilenceWithdrawn(Evidence):
    """A record of a rank reported silent, stamped before the report, arrived late: the report was wrong."""

    withdrawn: str  # the fail_stop finding's id
    ranks: list[int]  # the ranks heard from again
    late_ts: float  # the late record's own time
    reported_ts: float  # when they were reported silent


@dataclass(frozen=True, slots=True, kw_only=True)
class TelemetryGap(Evidence):
    """A node's ranks fell silent while the rest of the job kept completing steps they take part in: they lived,
    their records did not arrive (in time). A monitoring problem of that node, never a death."""

    cause: str  # "delivery lag" (its records turned up late), "records lost" (they resumed, the gap's never came),
    # "no records" (nothing since)
    ranks: list[int]  # the node's ranks that were silent
    node_ranks: int
    last_seen_ts: float  # the newest time of a record of theirs before the gap
    silent_s: float  # how long nothing of theirs arrived
    lag_s: float | None  # how late their records turned up (None: none did)
    peers_step: int  # the step the rest of the job had reached meanwhile


@dataclass(frozen=True, slots=True, kw_only=True)
class MonitoringGap(Evidence):
    """Every live rank of the job fell silent at once."""

    cause: str  # "heartbeat"
    silent_ranks: int
    job_ranks: int
    silent_nodes: int
    first_silent_ts: float
    last_seen_ts: float
    timeout_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SilentEnd(Evidence):
    """The job's life as its silence tells it (the fields of `life.JobState`, so that the job's life in the store
    reads the same): `finished` when every live rank stopped after the same step and fell silent together,
    `running` when one is heard from again after that."""

    state: str  # "finished" | "running"
    previous: str | None
    cause: str
    ended_ranks: int
    job_ranks: int
    step: int  # the step every rank had finished
    nodes: int  # how many nodes fell silent


@dataclass(frozen=True, slots=True, kw_only=True)
class StartTimeout(Evidence):
    """Ranks never heard from `start_timeout_s` after the job record."""

    ranks: list[int]  # the ranks that never reported
    nodes: list[str]  # their nodes
    job_ranks: int
    job_ts: float  # the job record's time
    start_timeout_s: float


_VOLATILE = re.compile(r"0x[0-9a-f]+|\d+(?:\.\d+)?", re.IGNORECASE)  # addresses, counts, steps, times, ports


def failure_signature(ev: ProcessFailure, rank: int | None) -> str:
    """What a software failure looks like wherever it recurs: its cause, its rank and its message with the
    numbers taken out ("RuntimeError: bad value at step 1234 (0x7f..)" -> "runtimeerror: bad value at step #
    (#)"), so the same bug after a restart has the same signature."""
    words = " ".join(_VOLATILE.sub("#", ev.message.lower()).split())[:200]
    return f"{ev.cause}|rank {rank}|{words}"


def _fail_stop_weight(f: Finding, ev: ProcessFailure | HeartbeatLoss) -> float:
    if isinstance(ev, HeartbeatLoss):
        return 0.9 if ev.whole_node else 0.7
    return 0.5  # a process exit or exception: a rank, maybe not the machine


def _start_timeout_says(f: Finding, ev: StartTimeout) -> str:
    more = f" and {len(ev.nodes) - 8} more" if len(ev.nodes) > 8 else ""
    return (f"{len(ev.ranks)} of {ev.job_ranks} ranks never reported within {ev.start_timeout_s} s of the job start "
            f"(on {', '.join(ev.nodes[:8])}{more}): check how they were launched; a start that never happened "
            "evicts nobody")


def _telemetry_gap_says(f: Finding, ev: TelemetryGap) -> str:
    why = {"delivery lag": f"its records turned up {ev.lag_s or 0:.0f} s late: a slow or congested path from the "
                           "node (its sidecar's spool, the relay, the network)",
           "records lost": "its records resumed on time but those of the gap never came: the sidecar or its spool "
                           "lost them",
           "no records": "nothing has arrived from its ranks since: check the node's sidecar and its link"}.get(
        ev.cause, ev.cause)
    return (f"{len(ev.ranks)} rank(s) of {f.node} sent nothing for {ev.silent_s:.0f} s while the job went on to step "
            f"{ev.peers_step}, which they take part in: alive, so no eviction; {why}")


def _monitoring_gap_says(f: Finding, ev: MonitoringGap) -> str:
    return (f"all {ev.silent_ranks} live ranks on {ev.silent_nodes} nodes fell silent at once: the monitoring path "
            "(sidecars, broker, collector) failed or the job stopped without a word, which is no node's fault: "
            "check them before touching any node")


def _node_lost_says(f: Finding, ev: HeartbeatLoss) -> str:
    return (f"{f.node}, the job's one node, fell silent with its agent at {ev.last_seen_ts:.3f} while the stream went "
            "on: the node is lost or cut off, or the job ended and its node's telemetry with it, unsaid; nothing "
            "here tells which: a human must look")


FAIL_STOP = FindingType("fail_stop", (ProcessFailure, HeartbeatLoss), Policy(
    incident="fail_stop", verdict=lambda f, ev: ev.cause == "heartbeat", node_level=True, weight=_fail_stop_weight,
    risk=0.8, onset="last_seen_ts", software=lambda f, ev: ev.cause in _CRASH_TYPES,
    signature=lambda f, ev: failure_signature(ev, f.rank) if isinstance(ev, ProcessFailure) else None,
    evicts=lambda f, ev: getattr(ev, "witness", "peers") != "stream",
    waits=lambda f, ev: "late" if getattr(ev, "witness", "peers") == "stream" else None,
    describe=lambda f, ev: _node_lost_says(f, ev) if getattr(ev, "witness", "peers") == "stream" else None))
# facts about the whole job: never evidence against a node, escalated to a human with what they mean; a node
# whose ranks never started is mildly suspect, a monitoring gap is the job's, never a node's
# a victim's report joins the fail-stop of the node that vanished; it points at no node (the reporter is fine)
PEER_LOST_TYPE = FindingType("peer_lost", PeerLoss, Policy(incident="fail_stop", opens=False, weight=0.0, risk=0.0))
# a report of silence taken back: triage withdraws what it was used for
SILENCE_WITHDRAWN = FindingType("silence_withdrawn", SilenceWithdrawn, Policy(
    incident=None, weight=0.0, risk=0.0, withdraws=lambda f, ev: ev.withdrawn))
# a node's monitoring, not the node: an operator's ticket (no incident, no eviction)
TELEMETRY_GAP = FindingType("telemetry_gap", TelemetryGap, Policy(incident=None, weight=0.0, risk=0.0,
                                                                   describe=_telemetry_gap_says))
MONITORING_GAP = FindingType("monitoring_gap", MonitoringGap, Policy(
    incident="unknown", job_level=True, risk=0.0, onset="last_seen_ts", describe=_monitoring_gap_says))
# the job's end by silence (or its telemetry coming back after one): the job's life, not a fault (`life.QUIET`)
SILENT_END = FindingType("silent_end", SilentEnd, Policy(
    incident=None, weight=0.0, risk=0.0, job_state=lambda f, ev: ev.state,
    describe=lambda f, ev: f"job {ev.state}: {ev.cause}"))
START_TIMEOUT = FindingType("start_timeout", StartTimeout, Policy(
    incident="unknown", job_level=True, risk=0.2, describe=_start_timeout_says))


class FailStopDetector(DetectorBase):
    """Start-up, missed heartbeats and crashed processes of one job."""

    name: ClassVar[str] = "failstop"
    kinds: ClassVar[frozenset[str]] = frozenset({"heartbeat", "step", "framework", "lifecycle"})
    finding_types: ClassVar[tuple[FindingType, ...]] = (FAIL_STOP, PEER_LOST_TYPE, MONITORING_GAP, START_TIMEOUT,
                                                        SILENCE_WITHDRAWN, TELEMETRY_GAP, SILENT_END)

    def __init__(self, topo: Topology, config: FailStopConfig | None = None) -> None:
        self.config = config or FailStopConfig()
        self.clock: Any = None  # the job's `clocks.ClockDetector` (JobMonitor hands it over): the job's own time
        self._reset(topo)

    def _lateness(self) -> np.ndarray:
        """How late each rank's records may come, on top of the timeout: what a withdrawn report showed
        (`late_s`), or its node's clock running ahead of the job's (known: `ClockDetector.ahead`), whose records,
        read in the order of their stamped times, come that much after the job's other clocks' (the launcher's,
        the controller's, a peer's). A rank dead there is judged that much later."""
        if self.clock is None:
            return self.late_s
        ahead = self.clock.ahead()
        return self.late_s if ahead is None else np.maximum(self.late_s, ahead)

    def _job_now(self) -> float:
        """The job's own time (its clock's: by its own nodes' records, not by a stream or timer moving it)."""
        return self.now if self.clock is None else min(self.now, self.clock.now())

    def _rebase(self) -> None:
        """The times kept of each rank's records (when last heard, when its newest step ended) moved to its node's
        clock offset as the job's clock has it now: kept under an older one (read before the clock learned that
        the node runs behind, say), a live node would look silent for as long as its clock is off, and the job's
        own logical clock (the gang's steps) says otherwise."""
        if self.clock is None:
            return
        off = self.clock.offset
        if self.node_off is None or len(self.node_off) != len(off):
            self.node_off = off.copy()
            return
        if np.array_equal(off, self.node_off):
            return
        delta = (self.node_off - off)[self.topo.node_index]  # a record's time here is its stamped time less `off`
        heard = self.status != NOT_STARTED
        self.last_seen[heard] += delta[heard]
        stepped = np.isfinite(self.step_ts)
        self.step_ts[stepped] += delta[stepped]
        self.node_off = off.copy()

    def _reset(self, topo: Topology) -> None:
        cfg = self.config
        hb = topo.heartbeat_s
        self.topo = topo
        self.status = np.full(topo.size, NOT_STARTED, dtype=np.int8)
        self.last_seen = np.full(topo.size, topo.ts, dtype=np.float64)  # exited ranks: when they exited
        self.timeout = cfg.miss_factor * hb + cfg.slack_s
        self.grace = cfg.grace_factor * hb + cfg.slack_s
        self.quiet = hb + cfg.slack_s  # no record from any rank for this long: the whole job is quiet
        self.start_deadline = topo.ts + cfg.start_timeout_s
        self.start_checked = False
        self.peer_lost_ts = -math.inf  # the latest report of a rank that lost a remote peer
        self.lost_peer = np.zeros(topo.size, dtype=bool)  # ranks that reported losing a remote peer
        self.crash_ts = np.full(topo.size, -np.inf)  # when a rank last raised or exited with a non-zero code
        self.clean_ts = np.full(topo.size, np.nan)  # when a rank exited cleanly (NaN: it did not), until judged
        self.exit_check = math.inf  # when the oldest clean exit not judged yet is judged
        self.stepped = False  # a step of this run was seen: start-up is over
        self.reported: dict[int, tuple[str, float]] = {}  # silent rank -> (the finding that said so, its time)
        self.late_s = np.zeros(topo.size)  # how late a rank's records were shown to arrive (a withdrawn report)
        self.stop_ts = np.full(topo.size, -np.inf)  # when a rank said it stops (lifecycle), or the job did
        self.now = -math.inf  # the job's time at the last advance: when records read now arrived
        self.arrived = np.full(topo.size, -np.inf)  # the job's time when a rank's newest record arrived
        self.last_step = np.full(topo.size, -1, dtype=np.int64)  # each rank's newest step (steps, heartbeats)
        self.step_ts = np.full(topo.size, -np.inf)  # the time of each rank's newest step record
        self.milestones: list[tuple[int, float]] = []  # (step, time) each time the job's newest step grew
        self.gap_since: dict[int, float] = {}  # node index -> when its ranks were found silent but alive
        self.gap_said: set[int] = set()  # nodes whose telemetry gap was reported (once a run)
        self.lag_since: dict[int, float] = {}  # node index -> the time of its first record of a run of late ones
        self.silent_end: float | None = None  # when the job was found ended by silence (until a rank is heard again)
        # each node's clock offset the times kept here are in (`_rebase`; not saved: the clock advances before this
        # detector, so a state is taken with these equal to the clock's, which a restored one starts from)
        self.node_off: np.ndarray | None = None
        self.next_tick = self._grid_at_or_after(self.start_deadline)

    def _grid_at_or_after(self, t: float) -> float:
        return t if math.isinf(t) else math.ceil(t / self.config.tick_s) * self.config.tick_s

    def set_topology(self, topo: Topology) -> None:
        """A new job record: the job (re)started, so every rank starts up again.

        The same record delivered twice (at-least-once transport) is not a restart
        and must not forget which ranks are silent.
        """
        if (topo.ts, topo.ranks) != (self.topo.ts, self.topo.ranks):
            self._reset(topo)

    # --- observe --------------------------------------------------------------

    def observe(self, rec: Record) -> list[Finding]:
        self._rebase()
        if rec.kind == "lifecycle":
            return self._lifecycle(rec)
        rank = rec.rank
        if rank >= self.topo.size or rec.ts < self.topo.ts:
            return []  # not a rank of this job, or a record of the run before the job record
        if rec.kind == "step" or (rec.kind == "heartbeat" and rec.step is not None):
            self.stepped = True  # a heartbeat's `step` is the last one its rank finished
            self._steps(np.array([rank]), np.array([rec.step]), np.array([rec.ts]), rec.kind == "step")
        state = self.status[rank]
        if self.arrived[rank] < self.now:
            self.arrived[rank] = self.now
        if self.silent_end is not None and rec.kind in ("step", "heartbeat"):
            return [self._heard_after_end(rec)] + self._observe_rank(rec, rank)
        late = self._late(rank, rec.ts) if state == SILENT else []  # a report it disproves, first
        if state == GAP:
            late = self._gap_back(rank, rec.ts)
        elif self.lag_since or self.now - rec.ts > self.timeout:  # (and what its lateness says, after)
            late = late + self._lagging(rank, rec.ts)
        found = self._observe_rank(rec, rank)
        return late + found if late else found

    def _steps(self, rank: np.ndarray, step: np.ndarray, ts: np.ndarray, stepped: bool) -> None:
        """Ranks' newest steps (and, from step records, when they ended them); the job's step milestones."""
        np.maximum.at(self.last_step, rank, step)
        if not stepped:
            return
        np.maximum.at(self.step_ts, rank, ts)
        before = self.milestones[-1][0] if self.milestones else -1
        if int(step.max()) <= before:
            return
        running = np.maximum.accumulate(step)  # each time the newest step grows, in record order
        grew = np.flatnonzero(running > np.concatenate(([before], running[:-1])))
        self.milestones += [(int(step[i]), float(ts[i])) for i in grew.tolist()]
        del self.milestones[:-_MILESTONES]

    def _interval(self) -> float | None:
        """The job's usual time per step, from its recent milestones (None: not known yet)."""
        if len(self.milestones) < 3:
            return None
        (s0, t0), (s1, t1) = self.milestones[0], self.milestones[-1]
        return max(t1 - t0, 0.0) / (s1 - s0)

    def _observe_rank(self, rec: Record, rank: int) -> list[Finding]:
        peer_lost = rec.kind == "framework" and rec.type in _CRASH_TYPES and bool(PEER_LOST.search(rec.message or ""))
        if rec.kind == "framework" and (rec.type == "exit" or peer_lost):
            self.status[rank] = EXITED
            self._heard(rank, rec.ts)
        else:
            self.beat(rank, rec.ts)
        if peer_lost:
            self.peer_lost_ts = max(self.peer_lost_ts, rec.ts)
            self.lost_peer[rank] = True
            self._refute_gaps(rec.ts)
            lost = [PEER_LOST_TYPE.finding(
                ts=rec.ts, job=self.topo.job, detector="failstop.process", topo=self.topo, rank=rec.rank,
                key=(rec.rank, "peer_lost", rec.ts), score=1.0,
                evidence=PeerLoss(cause=rec.type, ranks=[rec.rank], message=(rec.message or "")[:500]))]
            if 2 * int((~np.isnan(self.clean_ts)).sum()) >= self.topo.size:
                return lost  # most of the job exited cleanly: it is ending, and this rank saw its peers go
            return self._left_early(rec.ts, f"rank {rank} then lost a remote peer") + lost
        if rec.kind == "framework" and rec.type in _CRASH_TYPES:
            if clean_exit(rec):
                if np.isnan(self.clean_ts[rank]):
                    self.clean_ts[rank] = rec.ts
                    self.exit_check = min(self.exit_check, rec.ts + self.config.end_window_s)
                    self.next_tick = min(self.next_tick, self._grid_at_or_after(self.exit_check))
                return []
            self.crash_ts[rank] = max(self.crash_ts[rank], rec.ts)
            self.status[rank] = EXITED  # the process is gone: its silence from now on is no more news
            return self._crash(rec)
        return []

    def _lifecycle(self, rec: Record) -> list[Finding]:
        """A rank (or, without a rank, the whole job) says it stops, ends or is restarted: its silence from
        now on is expected. Any other lifecycle record of a rank is a sign of life."""
        if rec.ts < self.topo.ts or (rec.rank is not None and rec.rank >= self.topo.size):
            return []
        if rec.event in ("stop", "end", "restart"):
            if rec.rank is None:
                self.status[:] = EXITED
                np.maximum(self.last_seen, rec.ts, out=self.last_seen)
                self.stop_ts[:] = rec.ts
            else:
                self.status[rec.rank] = EXITED
                self._heard(rec.rank, rec.ts)
                self.stop_ts[rec.rank] = rec.ts
        elif rec.rank is not None:
            self.beat(rec.rank, rec.ts)
        return []

    def _left_early(self, t: float, why: str) -> list[Finding]:
        """The ranks that exited cleanly before `t` while the job went on without them: each a failure."""
        left = np.flatnonzero(self.clean_ts <= t)
        if not len(left):
            return []
        out = []
        for r in left.tolist():
            node = self.topo.node_of(r)
            out.append(FAIL_STOP.finding(
                ts=t, job=self.topo.job, detector="failstop.process", topo=self.topo, rank=r,
                key=(r, "exit0", float(self.clean_ts[r])), score=1.0,
                evidence=ProcessFailure(cause="exit", ranks=[r], message=(
                    f"exited with code 0 at {self.clean_ts[r]:.3f} while the job went on without it ({why})"),
                    node_ranks=len(self.topo.node_ranks.get(node, ())))))
        self.clean_ts[left] = np.nan
        pending = self.clean_ts[~np.isnan(self.clean_ts)]
        self.exit_check = float(pending.min()) + self.config.end_window_s if len(pending) else math.inf
        return out

    def _late(self, rank: int, ts: float) -> list[Finding]:
        """A record of a rank reported silent: stamped within a timeout before the report, it withdraws the report
        (every rank it named becomes live again once heard from): the rank was not silent that long when it was
        reported. One stamped earlier still leaves a timeout of silence before the report (a killed rank's last
        records, flushed after its death), and the report stands."""
        said = self.reported.get(rank)
        if said is None or ts > said[1]:
            self.reported.pop(rank, None)  # back after the report: a comeback, the report stands
            return []
        fid, at = said
        if at - ts >= self.timeout:
            return []
        ranks = sorted(r for r, (i, _) in self.reported.items() if i == fid)
        for r in ranks:
            del self.reported[r]
        self.late_s[ranks] = np.maximum(self.late_s[ranks], at - ts)
        self.beat(rank, ts)
        return [SILENCE_WITHDRAWN.finding(
            ts=ts, job=self.topo.job, detector="failstop.heartbeat", topo=self.topo, rank=rank,
            key=(fid, "withdrawn"), score=1.0,
            evidence=SilenceWithdrawn(withdrawn=fid, ranks=ranks, late_ts=round(ts, 6), reported_ts=round(at, 6)))]

    def beat(self, rank: int, ts: float) -> None:
        """A sign of life of a rank of this job (what `observe` does with a heartbeat or a step, from their
        rank and time alone: the run path calls it without building the record)."""
        state = self.status[rank]
        if state == SILENT:
            said = self.reported.get(rank)
            if said is not None and said[1] - ts >= self.timeout:
                return  # a timeout or more before it was reported silent: its past, told late (`_late`)
        # an exited process's own last records are not a comeback; a record a period later is a new process
        after = self.last_seen[rank] + (self.topo.heartbeat_s if state == EXITED else 0.0)
        if state == NOT_STARTED or ts > after:
            self.status[rank] = LIVE
            self._heard(rank, ts)

    def _heard(self, rank: int, ts: float) -> None:
        self.last_seen[rank] = max(self.last_seen[rank], ts)
        # (a node ahead only judges later: the earlier deadline at worst asks for a tick that finds nothing, and a
        # record here costs no pass over every rank)
        deadline = self.last_seen[rank] + self.timeout + self.late_s[rank]
        if deadline < self.next_tick:  # only after a lull; keep the grid aligned
            self.next_tick = self._grid_at_or_after(deadline)

    def _crash(self, rec: Framework) -> list[Finding]:
        node = self.topo.node_of(rec.rank)
        return [FAIL_STOP.finding(
            ts=rec.ts, job=self.topo.job, detector="failstop.process", topo=self.topo,
            rank=rec.rank, key=(rec.rank, rec.type, rec.ts), score=1.0,
            evidence=ProcessFailure(cause=rec.type, ranks=[rec.rank], message=(rec.message or "")[:500],
                                    node_ranks=len(self.topo.node_ranks.get(node, ()))),
        )]

    # --- advance --------------------------------------------------------------

    def advance(self, now: float) -> list[Finding]:
        self._rebase()
        out: list[Finding] = []
        if now > self.now:
            self.now = now
        while self.next_tick <= now:
            t = self.next_tick
            out += self._evaluate(t)
            self.next_tick = max(t + self.config.tick_s, self._grid_at_or_after(self._next_event()))
        return out

    def _next_event(self) -> float:
        live = self.status == LIVE
        silence = float((self.last_seen + self._lateness())[live].min()) + self.timeout if live.any() else math.inf
        silence = min(silence, self.exit_check)
        if self.gap_since:
            silence = min(silence, min(self.gap_since.values()) + self.config.gap_report_s)
        return silence if self.start_checked else min(silence, self.start_deadline)

    def _evaluate(self, t: float) -> list[Finding]:
        out = []
        if not self.start_checked and t >= self.start_deadline:
            self.start_checked = True
            out += self._start_timeout(t)
        live = self.status == LIVE
        if t >= self.exit_check:
            running = int(live.sum())
            if 2 * running > self.topo.size:  # most of the job still runs: the exit was no end
                out += self._left_early(t, f"{running} of {self.topo.size} ranks still ran "
                                           f"{self.config.end_window_s:g} s later")
            else:
                self.clean_ts[:] = np.nan  # the job is ending: those exits were its end
                self.exit_check = math.inf
        if self.gap_since:
            out += self._gap_reports(t)
        deadline = self.last_seen + self.timeout + self._lateness()
        # a rank whose records keep arriving is alive, whatever their times say (a clock behind, a backlog)
        missing = live & (deadline <= t) & (self.arrived + self.timeout <= t)
        if not missing.any():
            return out
        peers_said = self.peer_lost_ts >= float(self.last_seen[missing].min())  # lost after these fell silent
        if not self.stepped and not peers_said and t < self.start_deadline:
            return out  # start-up: silence alone evicts nobody before the first step (held to the deadline)
        stopping = int((self.stop_ts >= float(self.last_seen[missing].min()) - self.timeout).sum())
        if 2 * stopping > self.topo.size:  # most of the job stopped on purpose as these fell silent: stopped too
            self.status[missing] = EXITED
            return out
        if float(self.last_seen.max()) + self.quiet <= t and not peers_said:  # nobody in the job spoke lately
            if (missing == live).all():
                says = self._whole_silence(live, t)
                if says == "end":
                    out.append(self._silent_end(t, live))
                elif says == "node":
                    out.append(self._node_lost(t, live))
                elif says == "gap":
                    out.append(self._monitoring_gap(t, live))
            return out  # else hold: the rest of the job may be falling silent too (or its node's agent speak)
        alive = live & ~missing
        reporting = np.unique(self.topo.node_index[self.lost_peer]) if peers_said else np.empty(0, dtype=np.int64)
        crashed = self.crash_ts > -np.inf
        crash_at = {int(ni): float(self.crash_ts[crashed][self.topo.node_index[crashed] == ni].max())
                    for ni in np.unique(self.topo.node_index[crashed])}  # node -> its ranks' latest crash
        silent = np.unique(self.topo.node_index[missing])
        # wordless nodes first, so a node torn down after a sibling's report sees them as silent
        for ni in sorted(silent, key=lambda ni: bool(np.isin(ni, reporting))):
            node = self.topo.nodes[ni]
            ranks = np.asarray(self.topo.node_ranks[node])
            new = ranks[missing[ranks]]
            if not self.topo.elastic and not peers_said and ni not in crash_at:
                alive_by = self._alive_by_progress(new, missing, t)
                if alive_by is None:
                    continue  # the gang's next steps will tell: wait for them
                if alive_by:
                    self.status[new] = GAP
                    self.gap_since.setdefault(int(ni), t)
                    continue
            whole = not alive[ranks].any()
            torn = bool(np.isin(ni, reporting))
            # a sibling crashed about when these fell silent: its launcher tore the node down
            after_crash = abs(crash_at.get(int(ni), -np.inf) - float(self.last_seen[new].min())) <= self.timeout
            if (torn or after_crash or not whole) and t < float(deadline[new].min()) + self.grace:
                continue  # give its siblings (or, when torn down, the node that vanished) time to time out too
            if after_crash or (torn and self._wordless_node_elsewhere(ni)):
                self.status[new] = EXITED
                out += [PEER_LOST_TYPE.finding(
                    ts=t, job=self.topo.job, detector="failstop.heartbeat", topo=self.topo, rank=int(r),
                    key=(int(r), "teardown", float(self.last_seen[r])), score=1.0,
                    evidence=PeerLoss(cause="teardown", ranks=[int(r)], message=(
                        f"silent since {self.last_seen[r]:.3f} on {node}, where a sibling "
                        f"{'failed' if after_crash else 'reported losing a remote peer'}: stopped by its launcher "
                        "with the rest of its node"))) for r in new]
                continue
            self.status[new] = SILENT
            silent_since = float(self.last_seen[new].min())
            found = FAIL_STOP.finding(
                ts=t, job=self.topo.job, detector="failstop.heartbeat", node=node,
                key=(node, silent_since), score=len(new) / len(ranks),
                rank=int(new[0]) if len(new) == 1 else None, topo=self.topo,
                evidence=HeartbeatLoss(cause="heartbeat", ranks=new.tolist(), node_ranks=len(ranks),
                                       whole_node=whole, first_silent_ts=round(silent_since, 6),
                                       last_seen_ts=round(float(self.last_seen[new].max()), 6),
                                       timeout_s=self.timeout),
            )
            self.reported.update({int(r): (found.id, t) for r in new})
            out.append(found)
        return out

    def _alive_by_progress(self, ranks: np.ndarray, missing: np.ndarray, t: float) -> bool | None:
        """Whether the gang's own progress proves silent `ranks` alive: in a synchronous job, a step cannot
        complete without every rank, so peers that went on completing steps after the ranks were last heard
        from (two steps past theirs, ended later than a dead rank could have let them: its last records may
        trail its death by a flush, and the step it died in may still complete) waited for them, and they
        took part. True: alive (their records are late or lost); False: the gang stopped with them (a death,
        as far as silence tells); None: not known yet (steps longer than the silence so far) while
        `prove_max_s` allows waiting."""
        since = float(np.maximum(self.last_seen[ranks], self.arrived[ranks]).max())
        peers = (self.status == LIVE) & ~missing
        if peers.any() and int(self.last_step[ranks].max()) >= int(self.last_step[peers].max()) + 2 and \
                t < since + self.config.prove_max_s:
            # they reported steps two past any the rest of the gang reported: in a synchronous job no rank gets
            # a step ahead of the others, so the others' records of those steps are still to come (read late, or
            # stamped by a clock behind before the job knew it): their silence is not known yet
            return None
        interval = self._interval()
        if interval is None:
            return False  # no rhythm yet: silence is judged as it always was
        prove_s = self.config.slack_s + 2 * interval + 1.0
        newer = self.step_ts >= since + prove_s
        later = self.last_step >= int(self.last_step[ranks].max()) + 2
        if (peers & newer & later).any():
            return True
        wait = self.config.prove_max_s
        on = peers & (self.last_step > int(self.last_step[ranks].max())) & (self.step_ts > since)
        if t < since + min(prove_s, wait) and on.any():
            return None  # steps longer than a timeout, the gang stepped on: it has not had the time for two yet
        # the peers stepped past them, but not yet long enough after to tell: the step that tells ends after
        # `since + prove_s`, up to a step later (5 s steps: a late node was declared dead before it came)
        if t < since + min(prove_s + interval, wait) and (peers & later).any():
            return None
        return False

    def _refute_gaps(self, ts: float) -> None:
        """A rank lost a remote peer: silent ranks the gang's steps had shown alive (their last records may have
        been lost with a process killed before it flushed, so the peers' last steps looked like steps without
        them) may be the one it lost. They are missing again, judged with the report at the next tick."""
        gap = (self.status == GAP) & (self.last_seen <= ts)
        if not gap.any():
            return
        self.status[gap] = LIVE
        for ni in np.unique(self.topo.node_index[gap]).tolist():
            self.gap_since.pop(int(ni), None)
        self.next_tick = min(self.next_tick, self._grid_at_or_after(max(self.now, ts)))

    def _gap_back(self, rank: int, ts: float) -> list[Finding]:
        """A record of a rank in a telemetry gap: it is live again; its node's gap is reported (once a run)
        with how late this record came."""
        ni = int(self.topo.node_index[rank])
        since = self.gap_since.pop(ni, None)
        node = self.topo.nodes[ni]
        ranks = np.asarray(self.topo.node_ranks[node])
        gap = ranks[self.status[ranks] == GAP]
        self.status[gap] = LIVE
        self.arrived[gap] = np.maximum(self.arrived[gap], self.now)
        if ni in self.gap_said or since is None:
            return []
        lag = self._job_now() - ts
        if self.timeout / 2 <= lag < self.timeout:
            return []  # a burst a little late (a spool's flush): within what a silence allows, no ticket
        self.gap_said.add(ni)
        late = lag >= self.timeout
        seen = float(self.last_seen[gap].max())
        return [self._gap_finding(self.now, ni, gap, "delivery lag" if late else "records lost", seen,
                                  lag if late else None, self.now - seen)]

    def _news_of_lag(self, rank: np.ndarray, ts: np.ndarray) -> bool:
        """Some of these records arrive later than a silence would be noticed, from a node not reported yet."""
        late = ts + self.timeout < self.now
        if not late.any():
            return False
        late &= ts + self.timeout < self._job_now()
        if not late.any():
            return False
        nodes = np.unique(self.topo.node_index[rank[late]]).tolist()
        return any(ni not in self.gap_said for ni in nodes)

    def _lagging(self, rank: int, ts: float) -> list[Finding]:
        """A record of a live rank: arriving later than a silence would be noticed (by the job's own time, its
        other nodes' records), it starts or goes on with its node's lag; once the node's late records span a
        silence's length of its own time, its records lag for real (a spool flushed once is no lagging path):
        one telemetry gap (once a run). Arriving in time, it ends the lag. Their arrivals keep the ranks live
        meanwhile; what is reported is the path's delay."""
        ni = int(self.topo.node_index[rank])
        if ni in self.gap_said:
            return []
        lag = self._job_now() - ts
        if lag <= self.timeout:
            self.lag_since.pop(ni, None)
            return []
        since = self.lag_since.setdefault(ni, ts)
        if ts - since < self.timeout:
            return []
        del self.lag_since[ni]
        self.gap_said.add(ni)
        ranks = self._node_ranks(ni)
        return [self._gap_finding(self.now, ni, ranks, "delivery lag", float(self.last_seen[ranks].max()), lag,
                                  lag)]

    def _node_ranks(self, ni: int) -> np.ndarray:
        return np.asarray(self.topo.node_ranks[self.topo.nodes[ni]])

    def _gap_reports(self, t: float) -> list[Finding]:
        """Nodes silent but alive for `gap_report_s` with nothing arrived since: their telemetry gap."""
        out = []
        for ni, since in sorted(self.gap_since.items()):
            if t < since + self.config.gap_report_s:
                continue
            del self.gap_since[ni]
            ranks = np.asarray(self.topo.node_ranks[self.topo.nodes[ni]])
            gap = ranks[self.status[ranks] == GAP]
            if ni in self.gap_said or not len(gap):
                continue
            self.gap_said.add(ni)
            seen = float(self.last_seen[gap].max())
            out.append(self._gap_finding(t, ni, gap, "no records", seen, None, t - seen))
        return out

    def _gap_finding(self, ts: float, ni: int, ranks: np.ndarray, cause: str, seen: float, lag: float | None,
                     silent_s: float) -> Finding:
        node = self.topo.nodes[ni]
        return TELEMETRY_GAP.finding(
            ts=ts, job=self.topo.job, detector="failstop.heartbeat", node=node, topo=self.topo,
            key=(node, "gap", seen), score=1.0, rank=int(ranks[0]) if len(ranks) == 1 else None,
            evidence=TelemetryGap(cause=cause, ranks=ranks.tolist(), node_ranks=len(self.topo.node_ranks[node]),
                                  last_seen_ts=round(seen, 6), silent_s=round(silent_s, 3),
                                  lag_s=None if lag is None else round(lag, 3),
                                  peers_step=int(self.last_step.max())))

    def finish(self) -> list[Finding]:
        """The input ended (replay): a rank SIGKILLed in its last seconds is named from what there is, its peers'
        reports of losing it, though its silence is not timed out yet (silence past the last record is still
        no evidence: without such reports, nothing)."""
        if math.isinf(self.peer_lost_ts):
            return []
        vanished = (self.status == LIVE) & ~self.lost_peer & (self.last_seen < self.peer_lost_ts)
        if not vanished.any() or 2 * int(vanished.sum()) >= self.topo.size:
            return []
        out = []
        for ni in np.unique(self.topo.node_index[vanished]).tolist():
            node = self.topo.nodes[ni]
            ranks = np.asarray(self.topo.node_ranks[node])
            new = ranks[vanished[ranks]]
            self.status[new] = SILENT
            since = float(self.last_seen[new].min())
            out.append(FAIL_STOP.finding(
                ts=max(self.now, self.peer_lost_ts), job=self.topo.job, detector="failstop.heartbeat", node=node,
                key=(node, since), score=len(new) / len(ranks), rank=int(new[0]) if len(new) == 1 else None,
                topo=self.topo,
                evidence=HeartbeatLoss(cause="heartbeat", ranks=new.tolist(), node_ranks=len(ranks),
                                       whole_node=not ((self.status[ranks] == LIVE).any()),
                                       first_silent_ts=round(since, 6),
                                       last_seen_ts=round(float(self.last_seen[new].max()), 6),
                                       timeout_s=self.timeout)))
        return out

    def _wordless_node_elsewhere(self, ni: int) -> bool:
        """Another node has ranks gone silent and none that reported losing a peer: the one that vanished."""
        node_index = self.topo.node_index
        for other in np.unique(node_index[self.status == SILENT]):
            if other != ni and not self.lost_peer[node_index == other].any():
                return True
        return False

    def _whole_silence(self, live: np.ndarray, t: float) -> str | None:
        """What the silence of the whole job is. `end`: it ended together: every live rank had finished the same
        step (in a synchronous job ranks finish a step together; one behind stopped before the rest), none crashed
        in this run, and they are on two nodes or more, or on one node that spoke itself after they fell silent
        (its agent, heard once the ranks had missed a heartbeat: a sample a moment after their last word is no
        sign the node outlived them). `node`: a job of one node whose agent, heard up to its ranks' end, then fell
        silent too (not heard for `agent_wait_s`) while the job's time went on (the stream is read; the worker's
        clock moves a job's time only while its inputs are caught up): that node is gone, or cut off, which for
        the job is the same. `gap`: anything else (several nodes at once, a node whose agent was not heard lately,
        ranks dead while their node speaks): the monitoring path or the job stopped without a word, nobody's
        fault. None: not known yet (one node whose agent was heard lately, its next word not overdue yet)."""
        steps = self.last_step[live]
        together = bool(self.stepped and steps.min() == steps.max() >= 0 and not (self.crash_ts > -np.inf).any())
        nodes = np.unique(self.topo.node_index[live])
        if len(nodes) >= 2 or self.clock is None:
            return "end" if together and len(nodes) >= 2 else "gap"
        last = float(self.last_seen[live].max())
        heard = self.clock.agent_heard(self.topo.nodes[int(nodes[0])])
        if heard > last + self.topo.heartbeat_s:  # the node spoke once its ranks had missed a beat: it outlived them
            return "end" if together else "gap"
        wait = self.config.agent_wait_s
        if heard < last - wait:  # (or never heard) its agent fell silent long before its ranks: no word on the node
            return "gap"
        return None if t < heard + wait else "node"

    def _silent_end(self, t: float, live: np.ndarray) -> Finding:
        self.status[live] = SILENT
        self.silent_end = t
        n, nodes, step = int(live.sum()), len(np.unique(self.topo.node_index[live])), int(self.last_step[live][0])
        return SILENT_END.finding(
            ts=t, job=self.topo.job, detector="failstop.heartbeat", key=("finished", t), score=1.0,
            evidence=SilentEnd(state="finished", previous="running", step=step, nodes=nodes, job_ranks=self.topo.size,
                               ended_ranks=n, cause=(
                                   f"all {n} live ranks on {nodes} nodes finished step {step} and fell silent "
                                   f"together at {float(self.last_seen[live].max()):.3f}, no end said"
                                   if nodes > 1 else f"all {n} live ranks finished step {step} and fell silent "
                                   f"together at {float(self.last_seen[live].max()):.3f}, no end said; their node "
                                   "still reports")))

    def _heard_after_end(self, rec: Record) -> Finding:
        """A rank heard from again after the job's silent end: it runs (its telemetry was held up, or it went on)."""
        said, self.silent_end = self.silent_end, None
        return SILENT_END.finding(
            ts=max(rec.ts, said), job=self.topo.job, detector="failstop.heartbeat", key=("running", said), score=1.0,
            evidence=SilentEnd(state="running", previous="finished", step=int(self.last_step.max()), nodes=0,
                               job_ranks=self.topo.size, ended_ranks=0, cause=(
                                   f"rank {rec.rank} heard again ({rec.kind} at {rec.ts:.3f}) after the silent end "
                                   f"said at {said:.3f}")))

    def _node_lost(self, t: float, live: np.ndarray) -> Finding:
        """A job of one node fell silent with its node's agent: that node's fail-stop, witnessed by the stream
        rather than by peers (none). Its decision waits the lateness bound (`Policy.waits`, `triage.late_s`): the
        node's spool flushed within it withdraws the report, as a node's late records do."""
        self.status[live] = SILENT
        node = self.topo.nodes[int(self.topo.node_index[live][0])]
        ranks = np.flatnonzero(live)
        seen = self.last_seen[live]
        found = FAIL_STOP.finding(
            ts=t, job=self.topo.job, detector="failstop.heartbeat", node=node,
            key=(node, float(seen.min())), score=1.0, topo=self.topo,
            evidence=HeartbeatLoss(cause="heartbeat", ranks=ranks.tolist(), node_ranks=len(self.topo.node_ranks[node]),
                                   whole_node=True, first_silent_ts=round(float(seen.min()), 6),
                                   last_seen_ts=round(float(seen.max()), 6), timeout_s=self.timeout,
                                   witness="stream"))
        self.reported.update({int(r): (found.id, t) for r in ranks})
        return found

    def _monitoring_gap(self, t: float, live: np.ndarray) -> Finding:
        """The whole job silent, and no end: a report of silence that a late record withdraws, as a node's does
        (its records held up: a spool flushed late, a broker blip; triage waits `late_s` before telling a human)."""
        self.status[live] = SILENT
        seen = self.last_seen[live]
        found = MONITORING_GAP.finding(
            ts=t, job=self.topo.job, detector="failstop.heartbeat",
            key=("job", float(seen.max())), score=1.0,
            evidence=MonitoringGap(cause="heartbeat", silent_ranks=int(live.sum()), job_ranks=self.topo.size,
                                   silent_nodes=len(np.unique(self.topo.node_index[live])),
                                   first_silent_ts=round(float(seen.min()), 6),
                                   last_seen_ts=round(float(seen.max()), 6), timeout_s=self.timeout),
        )
        self.reported.update({int(r): (found.id, t) for r in np.flatnonzero(live)})
        return found

    def _start_timeout(self, t: float) -> list[Finding]:
        never = np.flatnonzero(self.status == NOT_STARTED)
        if not len(never):
            return []
        nodes = self.topo.nodes_of(never)
        return [START_TIMEOUT.finding(
            ts=t, job=self.topo.job, detector="failstop.start",
            key=("start", self.topo.ts), node=nodes[0] if len(nodes) == 1 else None,
            score=len(never) / self.topo.size,
            evidence=StartTimeout(ranks=never.tolist(), nodes=nodes, job_ranks=self.topo.size,
                                  job_ts=round(self.topo.ts, 6), start_timeout_s=self.config.start_timeout_s),
        )]

    # --- state ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "status": self.status.tolist(), "last_seen": self.last_seen.tolist(),
                "start_checked": self.start_checked,
                "peer_lost_ts": None if math.isinf(self.peer_lost_ts) else self.peer_lost_ts,
                "lost_peer": np.flatnonzero(self.lost_peer).tolist(),
                "crashed": {str(r): float(self.crash_ts[r]) for r in np.flatnonzero(self.crash_ts > -np.inf)},
                "clean": {str(r): float(self.clean_ts[r]) for r in np.flatnonzero(~np.isnan(self.clean_ts))},
                "stepped": self.stepped,
                "reported": {str(r): list(v) for r, v in sorted(self.reported.items())},
                "late_s": {str(r): float(self.late_s[r]) for r in np.flatnonzero(self.late_s)},
                "next_tick": None if math.isinf(self.next_tick) else self.next_tick,
                "now": finite_or_none(self.now), "arrived": encode_floats(self.arrived),
                "last_step": self.last_step.tolist(), "step_ts": encode_floats(self.step_ts),
                "milestones": [list(m) for m in self.milestones],
                "gap_since": {str(n): t for n, t in sorted(self.gap_since.items())}, "gap_said": sorted(self.gap_said),
                "lag_since": {str(n): t for n, t in sorted(self.lag_since.items())}, "silent_end": self.silent_end}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> FailStopDetector:
        det = cls(topo, FailStopConfig(**state["config"]))
        det.status = np.asarray(state["status"], dtype=np.int8)
        det.last_seen = np.asarray(state["last_seen"], dtype=np.float64)
        det.start_checked = state["start_checked"]
        det.peer_lost_ts = -math.inf if state["peer_lost_ts"] is None else state["peer_lost_ts"]
        det.lost_peer[state["lost_peer"]] = True
        for r, ts in state["crashed"].items():
            det.crash_ts[int(r)] = ts
        for r, ts in state["clean"].items():
            det.clean_ts[int(r)] = ts
        pending = det.clean_ts[~np.isnan(det.clean_ts)]
        det.exit_check = float(pending.min()) + det.config.end_window_s if len(pending) else math.inf
        det.stepped = state["stepped"]
        det.reported = {int(r): (v[0], v[1]) for r, v in state["reported"].items()}
        for r, s in state["late_s"].items():
            det.late_s[int(r)] = s
        det.next_tick = math.inf if state["next_tick"] is None else state["next_tick"]
        det.now = -math.inf if state["now"] is None else state["now"]
        det.arrived = np.nan_to_num(decode_floats(state["arrived"])[0], nan=-np.inf)
        det.last_step = np.asarray(state["last_step"], dtype=np.int64)
        det.step_ts = np.nan_to_num(decode_floats(state["step_ts"])[0], nan=-np.inf)
        det.milestones = [(int(s), float(t)) for s, t in state["milestones"]]
        det.gap_since = {int(n): t for n, t in state["gap_since"].items()}
        det.gap_said = set(state["gap_said"])
        det.lag_since = {int(n): t for n, t in state["lag_since"].items()}
        det.silent_end = state["silent_end"]
        return det

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        """Its saved state brought up to date (`DetectorBase.upgrade_state`)."""
        if version == 2:  # grew without a version change: any of this may be missing
            fill_missing(state, {"peer_lost_ts": None, "lost_peer": [], "crashed": {}, "clean": {}, "reported": {},
                                 "late_s": {}, "stepped": True})  # (a job saved before `stepped` was kept was past
            # start-up)
        elif version == 3:  # issue 34: arrivals, steps and telemetry gaps (a silent rank the gang's steps show alive)
            # a saved job's arrivals are not known: its ranks count as arrived when last seen (as before: by times)
            fill_missing(state, {"now": job.watermark, "arrived": [None] * job.size, "last_step": [-1] * job.size,
                                 "step_ts": [None] * job.size, "milestones": [], "gap_since": {}, "gap_said": [],
                                 "lag_since": {}})
        if version == 4:  # issue 42: the job's end by silence
            fill_missing(state, {"silent_end": None})
        return state

    def observe_run(self, run: RecordRun) -> list[tuple[int, list[Finding]]]:
        """Heartbeats and steps of ranks not exited nor silent, none of them due before the next tick: each only
        makes its rank live and moves its last-seen time forward (`observe` gives no finding and schedules nothing
        sooner for them). Otherwise `beat` on each in turn (what `observe` does with them); a run with a
        framework or lifecycle record goes through `observe`, record by record."""
        if "framework" in run.by_kind or "lifecycle" in run.by_kind:
            return observe_each(self, run)
        self._rebase()
        rank, ts = ranks_and_times(run, self.kinds)
        ok = (rank < self.topo.size) & (ts >= self.topo.ts)
        rank, ts = rank[ok], ts[ok]
        if rank.size == 0:
            return []
        if not self.stepped:  # start-up lasts until a step of this run (or a heartbeat that names its rank's last one)
            cols = run.steps() if "step" in run.by_kind else None
            topo = self.topo
            self.stepped = (cols is not None and bool(((cols.rank < topo.size) & (cols.ts >= topo.ts)).any())) \
                or any(step is not None and t >= topo.ts
                       for step, t in zip(run.lists("heartbeat", "step"), run.lists("heartbeat", "ts"), strict=True))
        status = self.status[rank]
        if ((status == SILENT) | (status == GAP)).any() or self.lag_since or self._news_of_lag(rank, ts):  # a late
            return observe_each(self, run)  # record may withdraw a report of silence, end or show a telemetry gap
        self.arrived[rank] = np.maximum(self.arrived[rank], self.now)
        beat_steps = run.lists("heartbeat", "step") if "heartbeat" in run.by_kind else []
        if any(s is not None for s in beat_steps):  # a heartbeat's `step`: its rank's newest
            beats = [(r, s) for r, s, t in zip(run.lists("heartbeat", "rank"), beat_steps,
                                               run.lists("heartbeat", "ts"), strict=True)
                     if s is not None and 0 <= r < self.topo.size and t >= self.topo.ts]
            if beats:
                r, s = np.array(beats, dtype=np.int64).T
                np.maximum.at(self.last_step, r, s)
        if "step" in run.by_kind:
            cols = run.steps()
            ok = (cols.rank >= 0) & (cols.rank < self.topo.size) & (cols.ts >= self.topo.ts)
            if ok.any():
                self._steps(cols.rank[ok], cols.step[ok], cols.ts[ok], True)
        if not ((status == LIVE) | (status == NOT_STARTED)).all() or float((ts + self.timeout).min()) < self.next_tick:
            beat = self.beat
            for r, t in zip(rank.tolist(), ts.tolist(), strict=True):
                beat(r, t)
            return []
        self.status[rank] = LIVE
        np.maximum.at(self.last_seen, rank, ts)
        return []
