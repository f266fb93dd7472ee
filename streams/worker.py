"""The Faust worker: the pure core on real Kafka (`gangwatch worker`).

`make_app(settings)` builds the app (there is no module-level app); `run(settings)`
creates the topics and runs a Faust worker until TERM/INT. The logic lives in
`streams.runner`; this module only wires it to Faust:

- agent `gangwatch-jobs` reads every job-keyed input topic plus `by-job` (all
  with the same partition count, keyed by job: co-partitioned), in batches of
  `stream.take_events(batch_max, within)`, and hands them to a `JobRunner`
  (one `Core` per job, event-time order within a batch). What comes out is
  published keyed by job: findings, actions (the alert topic), incidents, DLQ.
- agent `gangwatch-route` reads `node-events` (keyed by node) and `node-jobs`
  (the node -> job map the jobs agent publishes on every `job` record) and
  re-publishes node events keyed by their job onto `by-job` (`NodeRouter`).
- State: each job's `Core.state()` (zlib'd JSON) is saved in table
  `core-state` (changelog topic `<app id>-core-state-changelog`) on the timer,
  at most every `save_every_s` per job that batches touched (`_Glue.save`: packing
  a big job's state is not paid per batch); the router's node -> job map is table
  `node-job`. Both use `use_partitioner=True`: a table key is a job (or node)
  id hashed by the same murmur2 partitioner as the producers' keys, so the
  state of a job lives on the changelog partition of that job's input partition
  and a replacement worker recovers exactly the jobs it is given. A batch's
  outputs are delivered before its state is written, and the state carries the
  input offsets (and digests of recent node events) it already holds, so a
  partition replayed after a rebalance or crash is skipped: each record reaches
  a core once, outputs are at least once (with stable ids).
- Commits: no input offset is committed past a record that no written state has
  processed (`JobRunner.resume_points`: records a job holds for a slower input or
  for its job record, and records read since its newest written state) nor past a
  node event the router still holds (`NodeRouter.resume_points`): `_Glue.cap_commits`
  lowers what Faust commits, and the timer commits what the cap held back once it
  is saved. A replacement worker (after a crash or a rebalance) starts there, and
  the restored states tell the records they processed (skipped) from those they
  owe (processed now).
- Silence: a timer advances each job's event time by the wall time since its
  last batch arrived (watermark = max event time + elapsed - lateness), but only
  while the job's partitions are caught up and no rebalance is running, so a
  missed heartbeat fires when nothing arrives and a lagging consumer is never
  mistaken for silence. Nor is a broker outage: when no fetch has been answered
  for `fresh_s` the runner is told (`JobRunner.path`), and once fetches come back
  it waits `reconnect_s` for every producer's spooled backlog before going on.
- Sinks: each is wrapped in `sinks.queued.queued` (a bounded queue and a delivery thread of its own; the
  Alertmanager sink has its own), so the batch lock only ever enqueues; what a sink can never deliver comes
  back as dead letters, published on the DLQ topic. While a sink's queue is over its high-water mark the jobs
  agent waits before its next batch, outside the lock (`SinkPause`: at most `sink_pause_s` at a time; the
  timer and the consumer's heartbeats go on).
- Metrics: `streams.metrics` counts every batch's, tick's and routing step's
  `Result` and samples lag, jobs and sinks on every tick; Faust's own Prometheus
  sensor writes into the same registry; `run()` serves it on `metrics_port`.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import tempfile
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gangwatch.sinks.base import Sink
from gangwatch.streams.checkpoint import Checkpoints
from gangwatch.streams.router import NodeRouter
from gangwatch.streams.runner import JobRunner, Msg, Result
from gangwatch.streams.topics import TopicSettings, create_topics
from gangwatch.triage.engine import CoreConfig

if TYPE_CHECKING:  # Faust, aiokafka and prometheus-client are imported where a worker starts, so that
    import faust  # `WorkerSettings` (and `gangwatch config show`) loads without the worker extra
    from faust.types import TP
    from gangwatch.streams.metrics import WorkerMetrics

log = logging.getLogger("gangwatch.worker")

STATE_MAX_BYTES = 16 * 1024 * 1024  # the largest message the worker sends: a job's saved state, compressed
_RAW: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker needs; the CLI fills it from `gangwatch.settings` (flags, GANGWATCH_* variables, TOML).

    The fields are the settings' `worker` and `sinks` sections (`topics` is its own section, `lateness_s`
    comes from `core`); their defaults are the settings' defaults.
    """

    bootstrap: str = "127.0.0.1:9092"
    app_id: str = "gangwatch"
    topics: TopicSettings = field(default_factory=TopicSettings)
    store: str | None = None  # sink URL: chdb:PATH or clickhouse://HOST:PORT[/DB]; None: Kafka outputs only
    telemetry: bool = False  # also store every input record (gw_telemetry)
    webhook: str | None = None  # job-controller URL that gets every action (signed; GANGWATCH_WEBHOOK_SECRET)
    webhook_secret: str | None = field(default=None, repr=False)  # None: the sink reads GANGWATCH_WEBHOOK_SECRET
    alertmanager: str | None = None  # Alertmanager base URL that gets incidents as alerts
    batch_max: int = 20_000  # records (messages) per take() batch
    batch_within_s: float = 0.1  # ... or whatever arrived within this time
    tick_s: float = 0.5  # silence timer period
    save_every_s: float = 1.0  # a touched job's state is saved at most this often (and at most ~10 % of the time)
    silence: bool = True  # advance event time through wall-clock silence
    lateness_s: float = 1.0  # how far behind the newest event time timeouts are evaluated
    hold_s: float = 30.0  # how long a record waits for its job record, a node event for its job
    table_store: str = "memory://"  # or rocksdb:// (needs rocksdict and a --datadir per worker)
    datadir: str | None = None
    session_timeout_s: float = 30.0
    heartbeat_interval_s: float = 3.0
    request_timeout_s: float = 40.0  # must be >= the session timeout
    commit_interval_s: float = 2.8
    standby_replicas: int = 1
    offset_reset: str = "earliest"
    web: bool = False
    web_port: int = 6066
    fetch_wait_ms: int = 50  # the broker's longest wait on a fetch with no data (Faust hard-codes 1500 ms)
    fresh_s: float = 1.5  # no fetch answered for this long: the input path is down, and silence is no news
    reconnect_s: float = 15.0  # after it answers again, wait this long for every producer's backlog
    max_future_s: float = 60.0  # a record this far ahead of the worker's clock is dead-lettered (clock skew)
    stats_every_s: float = 10.0  # log a progress line this often (0: never)
    metrics_port: int = 9464  # serve Prometheus metrics on this port; 0: no endpoint
    sink_queue: int = 100_000  # records each sink's delivery queue holds; what finds it full is dead-lettered
    sink_pause_s: float = 5.0  # the longest the jobs agent holds its input for a sink's backlog, per episode
    sink_give_up_s: float = 600.0  # a delivery failing (transiently) this long becomes dead letters
    core: CoreConfig | None = None  # detectors' thresholds and triage (None: defaults); lateness_s above wins


async def _producer_knows(app: faust.App, tables: tuple[Any, ...]) -> None:
    """Wait until the producer has metadata for the tables' changelog topics.

    A table write picks its changelog partition from the producer's metadata; on a
    fresh worker that metadata may not have the changelog topics yet, and the write
    would crash the agent. Cheap once known (aiokafka answers from its cache).
    """
    producer = app.producer._ensure_producer()  # the aiokafka producer under faust-streaming 0.15's driver
    for table in tables:
        await producer.partitions_for(table.changelog_topic.get_topic_name())


def make_app(s: WorkerSettings, sinks: list[Sink] | None = None) -> faust.App:
    """The Faust app of one gangwatch worker (agents, tables, timer), not started."""
    import faust
    from gangwatch.sinks.queued import RetryPolicy, SinkPause, queued
    from gangwatch.streams.metrics import WorkerMetrics, instrument

    retry = RetryPolicy(give_up_s=s.sink_give_up_s)
    sinks = [queued(sink, capacity=s.sink_queue, retry=retry) for sink in sinks or []]  # off the loop, a thread each

    _fetch_wait(s.fetch_wait_ms)
    _seek_uncommitted()
    t = s.topics
    datadir = Path(s.datadir or Path(tempfile.gettempdir()) / "gangwatch-faust" / s.app_id)
    datadir.parent.mkdir(parents=True, exist_ok=True)  # Faust makes only the last level
    from gangwatch.streams.security import faust_app_kwargs

    app = faust.App(
        s.app_id,
        broker=[f"kafka://{h.strip()}" for h in s.bootstrap.split(",") if h.strip()],
        store=s.table_store,
        datadir=str(datadir),
        autodiscover=False,
        topic_partitions=t.partitions,
        topic_replication_factor=t.replication,
        broker_session_timeout=s.session_timeout_s,
        broker_heartbeat_interval=s.heartbeat_interval_s,
        broker_request_timeout=max(s.request_timeout_s, s.session_timeout_s),
        broker_commit_interval=s.commit_interval_s,
        stream_wait_empty=False,
        table_standby_replicas=s.standby_replicas,
        consumer_auto_offset_reset=s.offset_reset,
        web_enabled=s.web,
        web_port=s.web_port,
        producer_max_request_size=STATE_MAX_BYTES,
        **faust_app_kwargs(),  # GANGWATCH_KAFKA_* SASL/SSL (streams/security.py); nothing for PLAINTEXT
    )
    job_topics = (*t.job_inputs, t.by_job)
    job_src = app.topic(*job_topics, **_RAW)
    node_src = app.topic(t.node_events, t.node_jobs, **_RAW)
    # a 100k-rank job's state is ~0.8 MB compressed (bench: 0.76 MB, packed in 0.8-0.9 s): the changelog topic
    # takes messages up to the producer's request size, not the broker's 1 MB default
    states = app.Table("core-state", partitions=t.partitions, use_partitioner=True, key_type=bytes,
                       value_type=bytes, help="Core.state() per job (zlib JSON)",
                       extra_topic_configs={"max.message.bytes": str(STATE_MAX_BYTES)})
    nodemap = app.Table("node-job", partitions=t.partitions, use_partitioner=True, key_type=bytes,
                        value_type=bytes, help="node -> the job running on it")

    def load(job: str) -> bytes | None:
        return states.get(job.encode())

    core = replace(s.core or CoreConfig(), lateness_s=s.lateness_s)
    runner = JobRunner(t, core, hold_s=s.hold_s, silence=s.silence, load=load,
                       reconnect_s=s.reconnect_s, max_future_s=s.max_future_s,
                       keep_records=bool(sinks) and s.telemetry)
    router = NodeRouter(t, nodemap, hold_s=s.hold_s)
    metrics = WorkerMetrics()
    instrument(app, metrics)  # Faust's own sensor, into the same registry
    glue = _Glue(app, runner, router, states, job_topics, (t.node_events, t.node_jobs), sinks or [], s.telemetry,
                 metrics, s.save_every_s)
    app.gangwatch = glue  # type: ignore[attr-defined]  # for tests and introspection
    pause = glue.pause = SinkPause(glue.sinks, s.sink_pause_s)

    # the jobs agent and the timer both move cores: one at a time from "process" to "state saved", so a
    # saved state never covers outputs that are still on their way
    busy = asyncio.Lock()

    @app.agent(job_src, name="gangwatch-jobs")
    async def jobs(stream: faust.StreamT) -> None:
        await _producer_knows(app, (states, nodemap))
        async for events in stream.take_events(s.batch_max, within=s.batch_within_s):
            while pause.hold():  # a sink's queue is over its high-water mark: wait (bounded), not in the lock
                await asyncio.sleep(0.05)
            msgs = [glue.msg(e) for e in events]
            async with busy:
                start = time.monotonic()
                res = runner.on_batch(msgs, glue.lagging, glue.upstream)
                await glue.publish(res)  # delivered before the state that says "done" is written
                glue.save(res, take=False)  # the timer takes states
            glue.batch_done(res, time.monotonic() - start)

    @app.agent(node_src, name="gangwatch-route")
    async def route(stream: faust.StreamT) -> None:
        await _producer_knows(app, (states, nodemap))
        async for events in stream.take_events(s.batch_max, within=s.batch_within_s):
            res = router.on_batch([glue.msg(e) for e in events])
            await glue.publish(res)
            metrics.count(res)

    @app.timer(s.tick_s)
    async def tick() -> None:
        if app.rebalancing or app.in_recovery:
            return
        await _producer_knows(app, (states, nodemap))
        async with busy:
            res = runner.on_tick(glue.caught_up, glue.lagging, glue.upstream)
            await glue.publish(res)
            glue.save(res, take=True)
        await glue.commit_released()
        metrics.count(res)
        router.on_tick()
        glue.sample_metrics()
        glue.stats(router, s.stats_every_s)

    @app.timer(s.tick_s)
    async def watch_path() -> None:
        # apart from `tick`, and awaiting nothing: a commit or a send to a broker that is gone blocks the tick
        # until the broker is back (measured: 48 s of a 45 s outage), and an outage never seen would let the
        # first producers to resend make the others look silent
        if not (app.rebalancing or app.in_recovery):
            glue.watch_path(s.fresh_s)

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        lost = {tp.partition for tp in revoked if tp.topic in job_topics}
        gone = runner.drop_partitions(lost)
        glue.forget(gone)
        for tp in revoked:
            glue.held_back.pop(tp, None)
        if gone:
            log.info("revoked partitions %s: dropped %d jobs from memory", sorted(lost), len(gone))

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        runner.resume()
        glue.assigned = {tp.partition for tp in assigned if tp.topic in job_topics}
        glue.cap_commits()

    @app.on_rebalance_complete.connect
    async def on_recovered(sender: Any, **kwargs: Any) -> None:
        # the tables are recovered and no input is read yet: every job of our partitions in memory before its
        # first record, so what they owe caps the commits from the start
        async with busy:
            glue.restore_assigned()

    @app.on_before_shutdown.connect
    def on_shutdown(sender: Any, **kwargs: Any) -> None:
        left = [sink.close() for sink in glue.sinks]
        if not any(left) and not pause.dead_letters():  # all delivered: the states waiting for it can be written
            glue.take_states()
            glue.checkpoints.note_settled()
            glue.checkpoints.write_settled()

    return app


def _fetch_wait(ms: int) -> None:
    """Cap the consumer's fetch wait (Faust 0.15 passes fetch_max_wait_ms=1500 to aiokafka, fixed).

    aiokafka does not re-fetch a partition whose records are still buffered, so the next
    fetch of a busy partition can sit behind a fetch of idle ones that the broker holds
    for the whole wait: a worker busy on one hot partition then idles ~1.5 s per cycle
    (measured: 1k messages/s instead of 3k). Patched on the consumer Faust creates.
    """
    from faust.transport.drivers import aiokafka as driver

    cls = driver.AIOKafkaConsumerThread
    orig = getattr(cls, "_gangwatch_orig_create", None) or cls._create_worker_consumer

    def create(self: Any, transport: Any) -> Any:
        consumer = orig(self, transport)
        consumer._fetch_max_wait_ms = ms  # read when the consumer starts its fetcher
        return consumer

    cls._gangwatch_orig_create = orig
    cls._create_worker_consumer = create


def _seek_uncommitted() -> None:
    """Make Faust's seek back to the committed offsets reach every input partition (`_seek_to_committed`)."""
    from faust.transport.drivers import aiokafka as driver

    async def seek_to_committed(self: Any) -> Mapping[Any, int | None]:
        app = self.consumer.app
        return await self.call_thread(_seek_to_committed, self._ensure_consumer(),
                                      app.conf.consumer_auto_offset_reset, app.tables.changelog_topics)

    driver.AIOKafkaConsumerThread.seek_to_committed = seek_to_committed


async def _seek_to_committed(consumer: Any, reset: str, skip: Container[str]) -> dict[Any, int | None]:
    """aiokafka's `seek_to_committed`, also for the partitions committed at offset 0 or not at all.

    aiokafka seeks only the partitions whose committed offset is above 0 and leaves the others where the fetcher
    is. Faust drops what it fetched for a partition not active yet, or still queued for an agent when a rebalance
    starts, and counts on this seek to read it again: a partition committed at 0 (commits capped at its first
    record) or never (a new group) stayed past those records, which were never delivered; a restarted worker then
    held its jobs forever, waiting for an input it could not read (the release point, `JobRunner`). Such a
    partition goes back to 0 (never committed: only under the earliest reset policy; latest leaves it be). The
    seek is local, no request to the broker (which may be the one coming back from an outage); where 0 is no
    longer in the log the fetcher falls back to the reset policy, i.e. the first record kept.
    `skip`: topics Faust positions itself (the tables' changelogs)."""
    committed = await consumer.seek_to_committed()
    for tp, offset in committed.items():
        if tp.topic in skip or (offset is not None and offset > 0):
            continue
        if offset == 0 or reset == "earliest":
            consumer.seek(tp, 0)
    return committed


class _Glue:
    """The I/O half of the worker: Faust events -> `Msg`, `Result` -> sends, table writes, sinks."""

    def __init__(self, app: faust.App, runner: JobRunner, router: NodeRouter, states: Any,
                 job_topics: tuple[str, ...], node_topics: tuple[str, ...], sinks: list[Sink], telemetry: bool,
                 metrics: WorkerMetrics, save_every_s: float = 1.0) -> None:
        self.app = app
        self.metrics = metrics
        self.runner = runner
        self.router = router
        self.states = states
        self.job_topics = job_topics
        self.node_topics = node_topics
        self.sinks = sinks
        self.telemetry = telemetry
        self.pause: Any = None  # SinkPause: holds the input for a sink's backlog, collects sinks' dead letters
        self.checkpoints = Checkpoints(sinks, self._write_state)  # states wait for their outputs' delivery
        self.next_offset: dict[tuple[str, int], int] = {}
        self.assigned: set[int] = set()
        self.held_back: dict[TP, int] = {}  # offsets Faust asked to commit that `cap_commits` lowered
        self.committed: dict[TP, int] = {}  # what this worker last committed, per input
        self._commit: Callable[[dict[TP, int]], Any] | None = None  # Faust's own commit, under the cap
        # states written to the table whose changelog message the broker has not confirmed yet (None: a plain
        # mapping, which has no changelog to wait for)
        self._unconfirmed: list[tuple[str, bytes, asyncio.Future | None]] = []
        self._changelog_sent: Any = None
        send = getattr(states, "send_changelog", None)
        if send is not None:  # a Faust table: know when a state is on the broker, not just in the producer's buffer

            def send_changelog(*args: Any, **kwargs: Any) -> Any:
                self._changelog_sent = fut = send(*args, **kwargs)
                return fut

            states.send_changelog = send_changelog
        self.save_every_s = save_every_s
        self.clock = time.monotonic  # when states are due (wall time: saving is I/O, not event logic)
        self.touched: set[str] = set()  # jobs batches changed since their state was last taken
        self.next_take: dict[str, float] = {}  # job -> monotonic time its state may be taken again
        self.saves = 0
        self.sent = 0
        self.batches = 0
        self.lag_s = 0.0  # wall clock - newest event time, after the last batch (live data: the pipeline's lag)
        self._started = time.monotonic()
        self._last_stats = self._started

    def msg(self, event: Any) -> Msg:
        m = event.message
        self.next_offset[(m.topic, m.partition)] = m.offset + 1
        ts = (m.timestamp or 0.0)
        return Msg(m.topic, m.partition, m.offset, m.key, m.value, ts / 1000.0 if ts > 1e11 else ts)

    def save(self, res: Result, take: bool) -> None:
        """Remember the jobs `res` touched; with `take` (the timer's tick), offer the states of those due; then
        write every offered state whose outputs every sink has settled (`streams.checkpoint`: a saved state never
        covers an output still waiting in a sink's queue).

        A job's state is taken at most every `save_every_s`, and at least ten times as long apart as packing it
        took (a 100k-rank job's state is megabytes), so saving costs the worker at most ~10 % of its time. What
        is not saved yet is no loss: the commits stop at the oldest record no written state covers
        (`cap_commits`), so a replacement reads it again. A job a revoke took meanwhile is skipped (its new owner
        restores the saved state and reads on from there).
        """
        self.touched |= res.dirty
        if take:
            self.take_states(self.clock())
        self.checkpoints.write_settled()

    def take_states(self, now: float | None = None) -> None:
        """Offer the states of the touched jobs due at monotonic time `now` (None: all of them, as at shutdown)."""
        jobs, states = self.runner.jobs, {}
        for job in sorted(self.touched):
            if now is not None and self.next_take.get(job, -math.inf) > now:
                continue
            self.touched.discard(job)
            if job in jobs:
                start = self.clock()
                states[job] = self.runner.state_of(job)
                self.next_take[job] = start + max(self.save_every_s, 10 * (self.clock() - start))
        self.checkpoints.offer(states)

    def forget(self, jobs: list[str]) -> None:
        """Jobs this worker no longer has: nothing of theirs is saved from here."""
        self.checkpoints.drop(jobs)
        self.touched.difference_update(jobs)
        for job in jobs:
            self.next_take.pop(job, None)

    def _write_state(self, job: str, blob: bytes) -> None:
        if self.runner.jobs.get(job) is not None:  # still ours
            self._changelog_sent = None
            self.states[job.encode()] = blob
            self._unconfirmed.append((job, blob, self._changelog_sent))
            self.saves += 1

    def _confirm_writes(self) -> None:
        """Tell the runner which written states the broker has (in the order they were written)."""
        done = 0
        for job, blob, fut in self._unconfirmed:
            if fut is not None and not fut.done():
                break
            done += 1
            if fut is None or not fut.cancelled() and fut.exception() is None:
                self.runner.saved(job, blob)
        del self._unconfirmed[:done]

    def cap_commits(self) -> None:
        """Commit no input offset past a record no written state has processed (`resume_points`).

        Faust commits the offset after the messages its streams acknowledged, and `take_events`
        acknowledges a whole batch, held records included. Its own view of what is committed is
        left alone (its acknowledgement bookkeeping depends on it); only what reaches the broker
        is lowered, and `commit_released` commits the rest once the records are saved.
        """
        consumer = self.app.consumer
        if self._commit is None:
            self._commit = consumer._commit  # ThreadDelegateConsumer._commit (faust-streaming 0.15)
            consumer._commit = self._commit_capped

    def resume_points(self) -> dict[tuple[str, int], int]:
        self._confirm_writes()
        return {**self.runner.resume_points(), **self.router.resume_points()}

    async def _commit_capped(self, offsets: dict[TP, int]) -> bool:
        points = self.resume_points()
        capped = {}
        for tp, offset in offsets.items():
            capped[tp] = min(offset, points.get((tp.topic, tp.partition), offset))
            if capped[tp] < offset:
                self.held_back[tp] = offset
            else:
                self.held_back.pop(tp, None)
        assert self._commit is not None
        done = await self._commit(capped)
        if done:
            self.committed.update(capped)
        return bool(done)

    async def commit_released(self) -> None:
        """Commit what the cap held back and is saved now (Faust commits again only when its acks move)."""
        if not self.held_back:
            return
        points = self.resume_points()
        due = {tp: offset for tp, offset in self.held_back.items()
               if min(offset, points.get((tp.topic, tp.partition), offset)) > self.committed.get(tp, -1)}
        if due:
            await self._commit_capped(due)

    async def publish(self, res: Result) -> None:
        """Send the outputs and wait until the broker has them; then feed the sinks."""
        send: Callable[..., Any] = self.app.producer.send
        pending = [await send(m.topic, m.key, m.value, partition=None, timestamp=None, headers=None)
                   for m in res.sends]
        if pending:
            await asyncio.gather(*pending)
        self.sent += len(res.sends)
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
        self.checkpoints.note_settled()  # before their dead letters are taken: a state waits for its dead letters
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
            self.lag_s = time.time() - newest
        self.metrics.count(res)
        self.metrics.batch_done(seconds, None if newest is None else self.lag_s)

    def sample_metrics(self) -> None:
        """The gauges of the tick: lag per input partition, jobs in memory, the router's totals, the sinks."""
        self.metrics.sample(lag=self.lag_records(), jobs=len(self.runner.jobs), routed=self.router.routed,
                            dropped=self.router.dropped, sinks=self.sinks)

    def lag_records(self) -> dict[tuple[str, int], int]:
        """Messages left to read on each input (topic, partition) this worker holds, where the end is known."""
        mine = {*self.job_topics, *self.node_topics}
        lag = {}
        for tp in self.app.consumer.assignment():
            if tp.topic not in mine:
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
        """Tell the runner whether the input path answers (`JobRunner.path`); log when that changes."""
        runner = self.runner
        outages, no_grace = runner.outages, math.isinf(runner.trust_from)
        runner.path(self.answering(fresh_s))
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
        since. True when it cannot tell (not started, nothing assigned, nothing fetched yet).
        """
        try:
            consumer = self.app.consumer._thread._ensure_consumer()  # aiokafka's, under Faust 0.15's driver
            stamps = [consumer.last_poll_timestamp(tp) for tp in consumer.assignment()]
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
            committed = self.app.consumer._committed_offset.get(_tp(topic, partition))
            if committed is None:
                return 0 if self.app.conf.consumer_auto_offset_reset == "earliest" else None
            pos = committed + 1
        return pos

    def upstream(self) -> float:
        """Event time from which the router (ours) may still publish node events onto by-job."""
        inputs = [(tp.topic, tp.partition) for tp in self.app.consumer.assignment() if tp.topic in self.node_topics]
        runner = self.runner
        return self.router.upstream(inputs, self.lagging, runner.by_job_read, runner.job_nodes, runner.jobs)

    def restore_assigned(self) -> None:
        """After a rebalance: bring every saved job of our partitions into memory (so silence is watched, and
        what it owes caps the commits)."""
        from aiokafka.partitioner import murmur2

        n = self.app.conf.topic_partitions
        restored = 0
        for key in list(self.states.keys()):
            job = key.decode()
            p = (murmur2(key) & 0x7FFFFFFF) % n
            if p in self.assigned and job not in self.runner.jobs:
                saved = self.states.get(key)
                if saved:
                    self.runner.restore(job, saved, p)
                    restored += 1
        if restored:
            log.info("restored %d jobs from table core-state", restored)

    def stats(self, router: NodeRouter, every_s: float) -> None:
        now = time.monotonic()
        if every_s <= 0 or now - self._last_stats < every_s:
            return
        self._last_stats = now
        r = self.runner
        log.info("processed %d records (%.0f/s since start) in %d batches, %d jobs, %d state saves, %d messages "
                 "sent, %d node events routed, %d dropped, %d replayed records skipped; event-time lag %.3f s",
                 r.records, r.records / max(now - self._started, 1e-9), self.batches, len(r.cores), self.saves,
                 self.sent, router.routed, router.dropped, r.duplicates, self.lag_s)


def _tp(topic: str, partition: int) -> TP:
    from faust.types import TP

    return TP(topic, partition)


def run(s: WorkerSettings, *, loglevel: str = "info", create: bool = True) -> None:
    """Create the topics (idempotent), then run one worker until TERM/INT. Does not return normally."""
    import faust
    from gangwatch.streams.metrics import serve_metrics

    if create:
        made = create_topics(s.topics, s.bootstrap)
        if made:
            log.info("created topics: %s", ", ".join(made))
    sinks: list[Sink] = []
    if s.store:
        from gangwatch.sinks.store import open_store
        from gangwatch.sinks.storesink import StoreSink

        sinks.append(StoreSink(open_store(s.store), telemetry=s.telemetry, retries=0))  # the queue retries
    if s.webhook:
        from gangwatch.sinks.controller import WebhookSink

        sinks.append(WebhookSink(s.webhook, s.webhook_secret,  # None: the secret is GANGWATCH_WEBHOOK_SECRET
                                 single_attempt=True))  # the queue retries, off the event loop
    if s.alertmanager:
        from gangwatch.sinks.alertmanager import AlertmanagerSink

        sinks.append(AlertmanagerSink(s.alertmanager))
    app = make_app(s, sinks)
    if s.metrics_port:
        endpoint = serve_metrics(app.gangwatch.metrics, s.metrics_port)  # raises MetricsUnavailable
        log.info("metrics on http://0.0.0.0:%d/metrics", endpoint.port)
    # Each record is a few short-lived objects. With the collector's defaults (a young pass every 700
    # allocations, older passes walking every long-lived object: modules, Faust, the jobs' state) collection
    # took 10-15 % of the runner's time (measured in-process on bench_worker's records). What lives as long as
    # the process is frozen out of collection, and the young generation is collected every 50,000 allocations.
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    faust.Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()
