"""The I/O half of the Faust worker (`WorkerIO`): Faust events in, the runner's results out to Kafka, the state
table and the sinks.

`make_app` (streams/worker.py) builds the app and its agents and timers; each of them hands its work to the one
`WorkerIO` of the app, which turns Faust events into `Msg`, publishes a `Result`'s sends, saves job states to the
table once their outputs are delivered, caps the commits at what the saved states cover, and tells the runner
where its inputs stand (caught up, lagging, the broker answering). Apart from the worker so that it can be
tested on fakes of Faust's app and consumer, without building one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gangwatch.sinks.interface import Sink
from gangwatch.streams import faust_adapter
from gangwatch.streams.checkpoint import Checkpoint
from gangwatch.streams.checkpoint import tp as _tp
from gangwatch.streams.jobstate import JobState, Taken, seal
from gangwatch.streams.router import NodeRouter
from gangwatch.streams.runner import JobRunner, Msg, Result

if TYPE_CHECKING:  # as in streams/worker.py: Faust and prometheus-client load only where a worker starts
    import faust
    from gangwatch.schemas.signature import TopicSigner
    from gangwatch.streams.metrics import WorkerMetrics

log = logging.getLogger("gangwatch.worker")  # the worker's logger: its lines read as the worker's, as before

# A hole (`WorkerIO.in_order`) is sought back to after RESEEK_FIRST_S, then again at doubling intervals up to
# RESEEK_MAX_S, at most RESEEKS times; a hole still not read after that, with messages read past it, is given
# up (said in the log, counted) and reading goes on after it (`WorkerIO.rewind`).
RESEEK_FIRST_S, RESEEK_MAX_S, RESEEKS = 5.0, 60.0, 8


def event_time_text(newest: float | None, now: float) -> str:
    """The progress line's event time: the newest one processed and how far the wall clock is past it.

    Not called "lag": for live data the distance is the pipeline's lag, but a replayed or
    simulated stream (event times of 2026-01-01, say) is months "behind" a pipeline that
    keeps up, so the line shows the event time itself and the distance in a readable unit.
    """
    if newest is None:
        return "no event time yet"
    when = datetime.fromtimestamp(newest, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    behind = now - newest
    ahead = behind < 0
    behind = abs(behind)
    if behind < 60:
        span = f"{behind:.3f} s"
    elif behind < 3600:
        span = f"{behind / 60:.1f} min"
    elif behind < 86400:
        span = f"{behind / 3600:.1f} h"
    else:
        span = f"{behind / 86400:.1f} days"
    return f"newest event time {when} ({span} {'ahead of' if ahead else 'behind'} the clock)"


def _seal_all(taken: list[Taken]) -> list[bytes]:
    return [seal(t) for t in taken]


class WorkerIO:
    """The I/O half of the worker: Faust events -> `Msg`, `Result` -> sends, table writes, sinks."""

    def __init__(self, app: faust.App, runner: JobRunner, router: NodeRouter, states: Any,
                 job_topics: tuple[str, ...], node_topics: tuple[str, ...], sinks: list[Sink], telemetry: bool,
                 metrics: WorkerMetrics, save_every_s: float = 1.0, signer: TopicSigner | None = None,
                 save_budget_s: float = 0.05) -> None:
        self.app = app
        self.signer = signer  # signs the actions it publishes on the alert topic (schemas/signature.py)
        self.metrics = metrics
        self.runner = runner
        self.router = router
        self.states = states
        self.job_topics = job_topics
        self.node_topics = node_topics
        self.sinks = sinks
        self.telemetry = telemetry
        self.pause: Any = None  # SinkPause: holds the input for a sink's backlog, collects sinks' dead letters
        # the worker is stopping (`stop`): a batch still under way feeds no sink and saves no state, so the next
        # worker reads its records again and delivers their outputs
        self.stopping = False
        self.next_offset: dict[tuple[str, int], int] = {}  # (topic, partition) -> after the last message handed on
        self.inputs = frozenset((*job_topics, *node_topics))
        self.holes: dict[tuple[str, int], int] = {}  # (topic, partition) -> first offset not handed over (in_order)
        # sinks settle -> states written -> offsets committed under the cap (streams/checkpoint.py)
        self.checkpoint = Checkpoint(sinks, states, runner, router, self.next_offset, self.holes,
                                     lambda: self.app.consumer.assignment(), faust_adapter.watch_changelog_sends)
        self.positioned: set[tuple[str, int]] = set()  # inputs sought back to their committed offsets (`started`)
        self.gated: set[tuple[str, int]] = set()  # inputs with messages left out before that seek
        self.unknown_start: set[tuple[str, int]] = set()  # inputs the group has no committed offset for (`started`)
        self._sought: dict[tuple[str, int], tuple[int, float, int]] = {}  # ... -> (offset, monotonic time, seeks)
        self.past_hole: dict[tuple[str, int], int] = {}  # (topic, partition) -> first offset read past its hole
        self.assigned: set[int] = set()
        self.save_every_s = save_every_s
        self.clock = time.monotonic  # when states are due (wall time: saving is I/O, not event logic)
        self.touched: set[str] = set()  # jobs batches changed since their state was last taken
        self.next_take: dict[str, float] = {}  # job -> monotonic time its state may be taken again
        self.save_budget_s = save_budget_s  # packing states per tick: past it, the next are taken on the next tick
        self.sealing: set[str] = set()  # jobs whose taken state is being compressed (`offer`)
        self.sent = 0
        self.batches = 0
        self.lag_s = 0.0  # wall clock - newest event time, after the last batch (live data: the pipeline's lag)
        self.newest_ts: float | None = None  # the newest event time of the last batch that processed records
        self._started = time.monotonic()
        self._last_stats = self._started

    def started(self, starts: Mapping[Any, int], assigned: Iterable[Any]) -> None:
        """Faust sought the `assigned` partitions back to their committed offsets (the adapter's seek back):
        reading starts at `starts` (the committed offset, or the first record the log keeps), or for a partition
        not in it (never committed, reset policy `latest`) where the saved states of its jobs say
        (`resume_from_states`), else at its first message from here (`in_order`)."""
        for tp in assigned:
            where = (tp.topic, tp.partition)
            if tp.topic in self.inputs:
                self.positioned.add(where)
                if tp in starts and where not in self.next_offset:
                    self.next_offset[where] = starts[tp]
                elif tp not in starts:
                    self.unknown_start.add(where)
                if where in self.gated and where in self.next_offset:  # see `in_order`: maybe never delivered again
                    self.holes.setdefault(where, self.next_offset[where])
        self.gated.clear()
        self.resume_from_states()

    def resume_from_states(self) -> None:
        """An input the group has no committed offset for (its offsets expired, or were deleted; reset policy
        `latest`) is read from the saved states of its jobs, not from the log's end: from the lowest offset one
        of them has not processed there (what it read up to, and what it owes). It becomes a hole at that
        offset, sought back to (`rewind`), and messages from the end wait for it. Reset policy `earliest`
        reads such an input from the log's start: nothing to do."""
        for where in sorted(self.unknown_start):
            topic, partition = where
            key = f"{topic}:{partition}"
            points = [st.offsets[key] for st in self.runner.jobs.values()
                      if st.partition == partition and key in st.offsets]
            points += [min(st.owed[key])[0] for st in self.runner.jobs.values()
                       if st.partition == partition and st.owed.get(key)]
            if not points:
                continue
            self.unknown_start.discard(where)
            point = min(points)
            read = self.next_offset.get(where)
            if read is None or read > point:
                log.info("%s:%d has no committed offset: reading it from the saved states' own offsets, from %d",
                         topic, partition, point)
                self.next_offset[where] = point
                self.holes[where] = min(self.holes.get(where, point), point)

    def in_order(self, events: list[Any]) -> list[Msg]:
        """The batch's messages, each partition's read in offset order with none missing; what comes after a hole
        is left out, and the partition is read again from the hole (`rewind`).

        Faust can drop messages it fetched: those of a partition not active yet, those behind its read offset
        when a fetch from before its seek back to the committed offsets is still being handed out. It then
        counts the hole as read. Handed to the runner, the message after a hole would move a job's offsets
        past records it never saw (its state would skip them as replayed, its commits pass them). So a message
        past the next offset of its partition is not handed on; the partition is sought back, and the commit
        cap stays at the hole until it is read (`resume_points`). Messages below the next offset are repeats:
        handed on (the runner skips them), the next offset stays.

        Nothing of an input partition is handed on before Faust's seek back to the committed offsets (`started`):
        Faust resumes the partitions and its fetcher reads on while the seek asks the broker for each committed
        offset, and of what that fetch delivers it drops a part, so the first message to come through is no
        evidence of where reading starts (it can be past records a restored job owes). The seek reads them
        again, from where `started` says. Faust counts a message as read only once the agent took it, which can
        be after the seek: then it drops the seek's copies up to that offset. So a partition with messages left
        out before the seek starts as a hole at its start, sought back to on the next tick unless the seek's copy
        arrives first: the invariant is that every input partition is handed on from a known start, in offset
        order, with no offset missing.
        """
        out, read, holes, inputs, positioned = [], self.next_offset, self.holes, self.inputs, self.positioned
        for e in events:
            m = e.message
            tp = (m.topic, m.partition)
            if tp not in positioned and m.topic in inputs:  # fetched before the seek: read again after it
                self.gated.add(tp)
                continue
            want = read.get(tp)
            if want is not None and m.offset > want or tp in holes:
                hole = holes.setdefault(tp, want)
                if hole != m.offset:  # still past the hole: read again once the seek lands
                    if m.offset > hole and m.offset < self.past_hole.get(tp, m.offset + 1):
                        self.past_hole[tp] = m.offset
                    continue
                del holes[tp]  # the hole is read
                self.past_hole.pop(tp, None)
            if want is None or m.offset >= want:  # a repeat leaves the next offset where it is
                read[tp] = m.offset + 1
            ts = m.timestamp or 0.0
            out.append(Msg(m.topic, m.partition, m.offset, m.key, m.value, ts / 1000.0 if ts > 1e11 else ts))
        return out

    def revoked(self, tps: Any) -> None:
        """Partitions taken from this worker: what it read and committed there is forgotten (read again from the
        committed offsets if they come back)."""
        for tp in tps:
            where = (tp.topic, tp.partition)
            self.next_offset.pop(where, None)
            self.positioned.discard(where)
            self.gated.discard(where)
            self.holes.pop(where, None)
            self._sought.pop(where, None)
            self.past_hole.pop(where, None)
            self.unknown_start.discard(where)
        self.checkpoint.revoked(tps)

    def find_skipped(self) -> None:
        """Owed records (read by an earlier worker, not processed: `JobState`) behind what was read here were
        never handed over: the partition is read again from the oldest of them (a hole, see `in_order`).

        A restored job's owed records come before its partition's read position passes them: reading resumes at
        the committed offset, which the cap keeps at or below them. Seen passed anyway (Faust dropped them, or
        the group's offset had moved past them), they would be owed forever and hold the commits there.
        """
        for st in self.runner.jobs.values():
            for where, pos in st.owed.items():
                topic, _, partition = where.rpartition(":")
                tp = (topic, int(partition))
                read = self.next_offset.get(tp)
                if pos and read is not None and tp not in self.holes and read > (low := min(pos)[0]):
                    self.holes[tp] = low
                    self.next_offset[tp] = low

    async def rewind(self, now: float | None = None) -> None:
        """Seek each partition with a hole back to it; again while the hole is not read, at doubling intervals
        (RESEEK_FIRST_S to RESEEK_MAX_S), at most RESEEKS times.

        A hole still not read after the last seek, with messages read past it, is given up: its messages up to
        the first one read past it are lost to this worker, said in the log and counted
        (`gangwatch_input_messages_given_up`), what restored jobs owed there is given up, and reading goes on
        from there (a hole nothing was read past only holds the commit, which costs nothing: it stays until a
        message comes). A hole the log no longer keeps (retention deleted it before it was read) moves to the
        first record kept in the same way."""
        now = time.monotonic() if now is None else now
        for tp in [tp for tp in self._sought if tp not in self.holes]:
            del self._sought[tp]
        due = []
        for tp, offset in self.holes.items():
            last = self._sought.get(tp)
            if last is None or last[0] != offset:
                due.append(tp)
            elif now - last[1] >= min(RESEEK_FIRST_S * 2 ** (last[2] - 1), RESEEK_MAX_S):
                if last[2] < RESEEKS:
                    due.append(tp)
                elif (past := self.past_hole.get(tp)) is not None:
                    log.error("%s:%d: messages %d-%d could not be read after %d seeks back over %.0f s; giving them "
                              "up and reading on from %d", tp[0], tp[1], offset, past - 1, RESEEKS,
                              sum(min(RESEEK_FIRST_S * 2 ** k, RESEEK_MAX_S) for k in range(RESEEKS)), past)
                    self._skip(tp, past, "unreadable")
                    due.append(tp)
        if not due:
            return
        try:
            kept = await self.app.consumer.earliest_offsets(*(_tp(*tp) for tp in due))
        except Exception as e:  # the broker away or a rebalance: seek anyway, look again on the next seek
            log.info("could not ask where %d partitions' logs start (%s); seeking back anyway", len(due), e)
            kept = {}
        for tp in due:
            offset = self.holes[tp]
            first = kept.get(_tp(*tp))
            if first is not None and first > offset:
                log.warning("%s:%d: messages %d-%d were deleted by the topic's retention before this worker read "
                            "them; reading on from %d", tp[0], tp[1], offset, first - 1, first)
                self._skip(tp, first, "deleted")
                offset = first
            last = self._sought.get(tp)
            seeks = last[2] + 1 if last is not None and last[0] == offset else 1
            self._sought[tp] = (offset, now, seeks)
            log.warning("%s:%d: messages from offset %d were not handed over (dropped by Faust, or behind the "
                        "group's offset); reading them again (seek %d of at most %d)", tp[0], tp[1], offset, seeks,
                        RESEEKS)
            await self.app.consumer.seek(_tp(*tp), offset)

    def _skip(self, tp: tuple[str, int], to: int, why: str) -> None:
        """Give up the messages of `tp` from its hole up to `to`: reading goes on from `to`."""
        given_up = to - self.holes[tp]
        self.holes[tp] = self.next_offset[tp] = to
        if self.past_hole.get(tp, to + 1) <= to:
            del self.past_hole[tp]
        self.touched.update(self.runner.deleted(*tp, to))  # their saved states still list them owed
        if self.metrics is not None:
            self.metrics.given_up(tp[0], why, given_up)

    def save(self, res: Result) -> None:
        """Remember the jobs `res` touched (their states are taken on the tick: `take`, `offer`); write every offered
        state whose outputs every sink has settled (`streams.checkpoint`: a saved state never covers an output
        still waiting in a sink's queue)."""
        if self.stopping:
            return
        self.touched |= res.dirty
        self.checkpoint.write_settled()

    def stop(self, in_flight: bool) -> None:
        """The worker is stopping: close the sinks (each delivers its queue within its close timeout), then save
        the states of the touched jobs if every output they cover was delivered. `in_flight`: a batch is between
        the runner and its sinks; then no state is saved (it would cover outputs no sink got). Either way it says
        what was not delivered and where it will come from."""
        self.stopping = True
        left = {sink.name: sink.close() for sink in self.sinks}
        dead = self.pause.dead_letters() if self.pause is not None else []
        undelivered = {name: n for name, n in left.items() if n}
        if not undelivered and not dead and not in_flight:
            self.touched |= self.sealing  # states on their way to the checkpoint (`offer`): taken again, now
            jobs = self.runner.jobs
            self.checkpoint.offer({job: self.runner.state_of(job) for job in sorted(self.touched) if job in jobs})
            self.checkpoint.sinks_settled()
            self.checkpoint.write_settled()
            log.info("stopped: every output delivered, the states of %d jobs saved", len(self.runner.jobs))
            return
        said = [f"{n} record(s) for sink {name}" for name, n in undelivered.items()]
        said += [f"{len(dead)} dead letter(s) not yet on {self.runner.topics.dlq}"] if dead else []
        said += ["a batch under way"] if in_flight else []
        log.warning("stopping with %s not delivered: no state was saved after them, so the next worker of this "
                    "app id reads those inputs again from the last saved state and delivers them", ", ".join(said))

    def take(self, now: float) -> list[tuple[str, JobState, Taken]]:
        """On the tick, in the batch lock: take the states of the touched jobs due at monotonic time `now`, those
        waiting longest first, until packing them has taken `save_budget_s` (one at least); the others wait for the
        next tick. `offer` compresses and offers them, out of the lock.

        A job's state is taken at most every `save_every_s`, and at least ten times as long apart as packing it
        took (a 100k-rank job's state is megabytes), so saving costs the worker at most ~10 % of its time; and a
        tick holds the event loop (every job's batches and silence) for its budget plus one job's packing at most,
        however many jobs are due. What is not saved yet is no loss: the commits stop at the oldest record no
        written state covers (`cap_commits`), so a replacement reads it again. A job a revoke took meanwhile is
        skipped (its new owner restores the saved state and reads on from there).
        """
        if self.stopping:
            return []
        jobs, taken = self.runner.jobs, []
        began = self.clock()
        for at, job in sorted((self.next_take.get(job, -math.inf), job) for job in self.touched):
            if at > now or taken and self.clock() - began >= self.save_budget_s:
                break
            self.touched.discard(job)
            if job in jobs:
                start = self.clock()
                taken.append((job, jobs[job], self.runner.take_state(job)))
                self.next_take[job] = start + max(self.save_every_s, 10 * (self.clock() - start))
                self.sealing.add(job)
        return taken

    async def offer(self, taken: list[tuple[str, JobState, Taken]]) -> None:
        """Compress the states `take` took in a thread (`jobstate.seal`: zlib lets go of the GIL, so the event loop
        and the batches go on meanwhile), then offer them to the checkpoint: those of jobs still held as they were
        taken (not revoked, nor restored anew, meanwhile), unless the worker is stopping (`stop` takes them again)."""
        if not taken:
            return
        try:
            blobs = await asyncio.get_running_loop().run_in_executor(None, _seal_all, [t for *_, t in taken])
        finally:
            self.sealing.difference_update(job for job, *_ in taken)
        if self.stopping:
            return
        jobs = self.runner.jobs
        self.checkpoint.offer({job: blob for (job, st, _), blob in zip(taken, blobs, strict=True)
                               if jobs.get(job) is st})
        self.checkpoint.write_settled()

    def forget(self, jobs: list[str]) -> None:
        """Jobs this worker no longer has: nothing of theirs is saved from here."""
        self.checkpoint.drop(jobs)
        self.touched.difference_update(jobs)
        for job in jobs:
            self.next_take.pop(job, None)

    def cap_commits(self) -> None:
        """Faust's own commits go through the checkpoint's cap from here (`Checkpoint.install`)."""
        self.checkpoint.install(lambda capped: faust_adapter.wrap_commit(self.app, capped))

    async def commit_read(self) -> None:
        await self.checkpoint.commit_read()

    async def publish(self, res: Result) -> None:
        """Send the outputs and wait until the broker has them; then feed the sinks."""
        send: Callable[..., Any] = self.app.producer.send
        signer = self.signer
        pending = [await send(m.topic, m.key, m.value, partition=None, timestamp=None,
                              headers=signer.headers(m.value, m.action_id) if signer and m.action_id else None)
                   for m in res.sends]
        if pending:
            await asyncio.gather(*pending)
        self.sent += len(res.sends)
        if self.stopping:  # the sinks are closed: these outputs come again from the next worker (no state covers them)
            return
        for sink in self.sinks:
            try:
                if self.telemetry:
                    for rec in res.records:
                        sink.observe(rec)
                for dead in res.rejects:
                    sink.reject(dead)
                sink.write(res.outputs)
                sink.flush()
            except Exception:
                self.metrics.sink_failed(sink)
                raise
        self.checkpoint.sinks_settled()  # before their dead letters are taken: a state waits for its dead letters
        dead = self.pause.dead_letters() if self.pause is not None else []
        pending = [await send(self.runner.topics.dlq, d.source.encode(), d.encode(), partition=None, timestamp=None,
                              headers=None) for d in dead]  # what a sink can never deliver: on the DLQ topic
        if pending:
            await asyncio.gather(*pending)

    def batch_done(self, res: Result, seconds: float) -> None:
        """After a batch took `seconds`: count it, and the event-time lag if it processed records."""
        self.batches += 1
        cores = self.runner.cores
        newest = max((cores[j].max_ts for j in res.dirty if j in cores), default=None)
        if newest is not None:
            self.newest_ts = newest
            self.lag_s = time.time() - newest
        self.metrics.count(res)
        self.metrics.batch_done(seconds, None if newest is None else self.lag_s)

    def sample_metrics(self) -> None:
        """The gauges of the tick: lag per input partition, jobs in memory, the router's totals, the sinks."""
        self.metrics.sample(lag=self.lag_records(), jobs=len(self.runner.jobs), routed=self.router.routed,
                            dropped=self.router.dropped, sinks=self.sinks)

    def lag_records(self) -> dict[tuple[str, int], int]:
        """Messages left to read on each input (topic, partition) this worker holds, where the end is known."""
        lag = {}
        for tp in self.app.consumer.assignment():
            if tp.topic not in self.inputs:
                continue
            try:
                hw = self.app.consumer.highwater(tp)
            except Exception:  # revoked meanwhile
                continue
            pos = self._position(tp.topic, tp.partition)
            if hw is not None and pos is not None:
                lag[(tp.topic, tp.partition)] = max(0, hw - pos)
        return lag

    def caught_up(self, job: str) -> bool:
        """Nothing of the job's partition is left to read on any of its topics (as far as we know)."""
        st = self.runner.jobs.get(job)
        if st is None or st.partition < 0:
            return True
        consumer = self.app.consumer
        for topic in self.job_topics:
            pos = self.next_offset.get((topic, st.partition))
            if pos is None:
                continue
            try:
                hw = consumer.highwater(_tp(topic, st.partition))
            except Exception:  # not assigned / not known yet
                continue
            if hw is not None and pos < hw:
                return False
        return True

    def watch_path(self, fresh_s: float) -> None:
        """Tell the runner whether the input path answers (`JobRunner.input_up` / `input_down`); log when that
        changes."""
        runner = self.runner
        outages, no_grace = runner.outages, math.isinf(runner.trust_from)
        if self.answering(fresh_s):
            runner.input_up()
        else:
            runner.input_down()
        if runner.outages > outages:
            log.warning("no fetch answered for %.1f s: the broker is unreachable; silence is not judged until it "
                        "is back and every producer had %.0f s to resend its spool", fresh_s, runner.reconnect_s)
        elif no_grace and runner.outage is not None and not math.isinf(runner.trust_from):
            log.info("fetches answered again: waiting %.0f s for every producer's backlog", runner.reconnect_s)

    def answering(self, fresh_s: float) -> bool:
        """Whether the broker answers our fetches: some assigned partition had one answered within `fresh_s`.

        An idle partition is fetched every `fetch_wait_ms`; a busy one whose records wait in the
        consumer's buffer is not re-fetched meanwhile, so one fresh answer is enough. Records taken
        from the consumer's buffer prove nothing: they were fetched before, maybe from a broker gone
        since. Partitions Faust does not fetch on purpose (paused; their buffer full while the agents are busy; the
        whole flow stopped for a rebalance) tell nothing either: a long pause is not an outage. True when it
        cannot tell (not started, nothing assigned or fetched, nothing fetched on purpose).
        """
        if not getattr(self.app.consumer, "flow_active", True):  # Faust stopped fetching (a rebalance): no opinion
            return True
        try:
            consumer = faust_adapter.aiokafka_consumer(self.app)
            idle = faust_adapter.not_fetching(self.app)  # paused, or a buffer full: nothing fetched by design
            stamps = [consumer.last_poll_timestamp(tp) for tp in consumer.assignment() if tp not in idle]
        except Exception:  # not started or mid-rebalance: no opinion
            return True
        stamps = [t for t in stamps if t is not None]
        return not stamps or time.time() - max(stamps) / 1000.0 <= fresh_s

    def lagging(self, topic: str, partition: int) -> bool:
        """Data is left to read at (topic, partition), or we cannot tell yet (no fetch has reported its end)."""
        try:
            hw = self.app.consumer.highwater(_tp(topic, partition))
        except Exception:  # not assigned to us: not ours to wait for
            return False
        if hw is None:
            return True
        pos = self._position(topic, partition)
        if pos is None:  # a new group starts at the start (earliest) or at the end (latest)
            return hw > 0 and self.app.conf.consumer_auto_offset_reset == "earliest"
        return pos < hw

    def _position(self, topic: str, partition: int) -> int | None:
        """The next offset to read at (topic, partition): after what we read, else after what the group
        committed; None for a partition neither has seen (a new group: where it starts is the reset policy's)."""
        pos = self.next_offset.get((topic, partition))
        if pos is None:  # nothing read since start: compare with where the group left off
            committed = faust_adapter.committed_offset(self.app, _tp(topic, partition))
            if committed is None:
                return 0 if self.app.conf.consumer_auto_offset_reset == "earliest" else None
            pos = committed  # Kafka's committed offset is the next one to read
        return pos

    def node_events_pending_from(self) -> float:
        """Event time from which the router (ours) may still publish node events onto by-job."""
        inputs = [(tp.topic, tp.partition) for tp in self.app.consumer.assignment() if tp.topic in self.node_topics]
        runner = self.runner
        return self.router.node_events_pending_from(inputs, self.lagging, runner.by_job_read, runner.job_nodes,
                                                    runner.jobs)

    def restore_assigned(self) -> None:
        """After a rebalance: bring every saved job of our partitions into memory (so silence is watched, and
        what it owes caps the commits)."""
        n = self.app.conf.topic_partitions
        restored = 0
        for key in list(self.states.keys()):
            job = key.decode()
            p = faust_adapter.partition_of(key, n)
            if p in self.assigned and job not in self.runner.jobs:
                saved = self.states.get(key)
                if saved:
                    self.runner.restore(job, saved, p)
                    restored += 1
        if restored:
            log.info("restored %d jobs from table core-state", restored)
            self.resume_from_states()

    def stats(self, router: NodeRouter, every_s: float) -> None:
        now = time.monotonic()
        if every_s <= 0 or now - self._last_stats < every_s:
            return
        self._last_stats = now
        r = self.runner
        cp = self.checkpoint
        log.info("processed %d records (%.0f/s since start) in %d batches, %d jobs, %d state saves (%d not yet on "
                 "the broker, %d waiting for sinks), %d messages sent, %d node events routed, %d dropped, %d replayed "
                 "records skipped; %s; commits held back on %d inputs",
                 r.records, r.records / max(now - self._started, 1e-9), self.batches, len(r.cores), cp.saves,
                 len(cp.unconfirmed), cp.pending.waiting(), self.sent, router.routed, router.dropped,
                 r.duplicates, event_time_text(self.newest_ts, time.time()), len(cp.capped()))
        for line in self.waiting():
            log.info("%s", line)

    def waiting(self) -> list[str]:
        """One line per job holding records: which of its inputs it waits for (read up to where, of how much)."""
        r, lines = self.runner, []
        for job, st in sorted(r.jobs.items()):
            if not st.held:
                continue
            behind = []
            for topic in r.inputs:
                if self.lagging(topic, st.partition):
                    try:
                        hw = self.app.consumer.highwater(_tp(topic, st.partition))
                    except Exception:
                        hw = None
                    behind.append(f"{topic}:{st.partition} (next {self._position(topic, st.partition)}, end {hw}, "
                                  f"read to event time {r.frontier.get((topic, st.partition), -math.inf):.3f})")
            held = sum(it.n for it in st.held)
            lines.append(f"job {job} holds {held} records from event time {st.held[0].ts:.3f}: waiting for "
                         f"{', '.join(behind) or 'no input'}; node events up to {self.node_events_pending_from():.3f}")
        for (topic, partition), offset in sorted(self.checkpoint.capped().items()):
            where = f"{topic}:{partition}"
            tp = _tp(topic, partition)
            why = [f"job {job} from {at} (owed {sorted(st.owed.get(where, ()))[:3]}, written "
                   f"{st.written.next.get(where)}/{st.written.low.get(where)}, read to {st.offsets.get(where)})"
                   for job, st in sorted(r.jobs.items()) if (at := st.uncovered().get(where)) is not None]
            lines.append(f"commit of {where} held at {self.checkpoint.committed.get(tp)} (read to {offset}): "
                         f"{'; '.join(why)}")
        return lines

