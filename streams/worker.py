"""The Faust worker: the pure core on real Kafka (`gangwatch worker`).

`make_app(settings)` builds the app (there is no module-level app); `run(settings)`
creates the topics and runs a Faust worker until TERM/INT. The logic lives in
`streams.runner`; this module only wires it to Faust, with the I/O half in
`streams.workerio` (`WorkerIO`) and what reaches into Faust and aiokafka in `streams.faust_adapter`:

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
  at most every `save_every_s` per job that batches touched (`WorkerIO.take`: packing
  a big job's state is not paid per batch, and a tick packs for a budget, the jobs
  waiting longest first; `WorkerIO.offer` compresses them in a thread, out of the
  batch lock, so batches go on meanwhile); the router's node -> job map is table
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
  node event the router still holds (`NodeRouter.resume_points`), in one checkpoint
  protocol (`streams.checkpoint.Checkpoint`: sinks settle, states are written and
  confirmed, offsets are committed under that cap; Faust's own commits included).
  A replacement worker (after a crash or a rebalance) starts there, and the
  restored states tell the records they processed (skipped) from those they owe
  (processed now).
- Silence: a timer advances each job's event time by the wall time since its
  last batch arrived (watermark = max event time + elapsed - lateness), but only
  while the job's partitions are caught up and no rebalance is running, so a
  missed heartbeat fires when nothing arrives and a lagging consumer is never
  mistaken for silence. Nor is a broker outage: when no fetch has been answered
  for `fresh_s` the runner is told (`JobRunner.input_down`), and once fetches come back
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
import functools
import gc
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gangwatch.detectors.stacks import preload as preload_stacks
from gangwatch.sinks.interface import Sink
from gangwatch.streams import faust_adapter
from gangwatch.streams.router import NodeRouter
from gangwatch.streams.runner import JobRunner
from gangwatch.streams.topic_admin import create_topics
from gangwatch.streams.worker_settings import WorkerSettings
from gangwatch.streams.workerio import WorkerIO
from gangwatch.triage.budgets import CoreConfig

if TYPE_CHECKING:  # Faust, aiokafka and prometheus-client are imported where a worker starts, so that
    import faust  # `WorkerSettings` (and `gangwatch config show`) loads without the worker extra
    from faust.types import TP
    from gangwatch.schemas.signature import TopicSigner

log = logging.getLogger("gangwatch.worker")

STATE_MAX_BYTES = 16 * 1024 * 1024  # the largest message the worker sends: a job's saved state, compressed
_RAW: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw", "value_serializer": "raw"}


async def _producer_knows(app: faust.App, tables: tuple[Any, ...], quiet: faust_adapter.ChangelogsNotYet) -> None:
    """Wait until the producer has metadata for the tables' changelog topics.

    A table write picks its changelog partition from the producer's metadata; on a
    fresh worker that metadata may not have the changelog topics yet, and the write
    would crash the agent. Cheap once known (aiokafka answers from its cache).
    """
    producer = faust_adapter.aiokafka_producer(app)
    for table in tables:
        await producer.partitions_for(table.changelog_topic.get_topic_name())
    quiet.done()  # the changelog topics exist: a missing one from now on is an error again


def action_signer(s: WorkerSettings, topic: str) -> TopicSigner | None:
    """What signs the actions the worker publishes on `topic`: the webhook's secret (setting, or
    GANGWATCH_WEBHOOK_SECRET); without one they go unsigned, and every actuator refuses them (said once)."""
    from gangwatch.schemas.signature import SECRET_ENV, TopicSigner, topic_secret

    secret = s.webhook_secret or topic_secret()
    if not secret:
        log.warning("actions on %s are not signed: no secret in %s (sinks.webhook_secret); the controller and the "
                    "fencing adapters refuse unsigned actions", topic, SECRET_ENV)
        return None
    return TopicSigner(secret)


def make_app(s: WorkerSettings, sinks: list[Sink] | None = None) -> faust.App:
    """The Faust app of one gangwatch worker (agents, tables, timer), not started."""
    import faust
    from gangwatch.sinks.queued import RetryPolicy, SinkPause, queued
    from gangwatch.streams.metrics import WorkerMetrics, instrument

    retry = RetryPolicy(give_up_s=s.sink_give_up_s)
    sinks = [queued(sink, capacity=s.sink_queue, retry=retry) for sink in sinks or []]  # off the loop, a thread each

    faust_adapter.cap_fetch_wait(s.fetch_wait_ms)
    faust_adapter.seek_uncommitted()
    t = s.own_topics
    datadir = Path(s.datadir or Path(tempfile.gettempdir()) / "gangwatch-faust" / s.app_id)
    datadir.parent.mkdir(parents=True, exist_ok=True)  # Faust makes only the last level
    from gangwatch.streams.client_security import faust_app_kwargs

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
        # each worker names itself to the broker (its group member ids begin so): which one reads what
        broker_client_id=f"gangwatch-{socket.gethostname()}-{os.getpid()}",
        **faust_app_kwargs(),  # GANGWATCH_KAFKA_* SASL/SSL (streams/client_security.py); nothing for PLAINTEXT
    )
    quiet = faust_adapter.ChangelogsNotYet(s.app_id)  # until _producer_knows
    faust_adapter.NormalStates(s.app_id, t.prefix)  # Faust's ERROR lines for normal states, said as INFO
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

    @functools.lru_cache(maxsize=1 << 16)
    def node_partition(node: str) -> int:  # (node-events is keyed by node, the node-job table too; jobs by job)
        return faust_adapter.partition_of(node.encode(), t.partitions)

    def node_partitions_read() -> set[int]:
        return {tp.partition for tp in app.consumer.assignment() if tp.topic == t.node_events}

    # a job whose nodes' events another worker routes waits for its marks (streams/marks.py)
    runner = JobRunner(t, core, hold_s=s.job_hold_s, silence=s.silence, load=load,
                       reconnect_s=s.reconnect_s, max_future_s=s.max_future_s,
                       keep_records=bool(sinks) and s.telemetry, node_partition=node_partition,
                       node_partitions_read=node_partitions_read, mark_hold_s=s.hold_s)
    router = NodeRouter(t, nodemap, hold_s=s.hold_s)
    metrics = WorkerMetrics()
    instrument(app, metrics)  # Faust's own sensor, into the same registry
    wio = WorkerIO(app, runner, router, states, job_topics, (t.node_events, t.node_jobs), sinks or [], s.telemetry,
                metrics, s.save_every_s, signer=action_signer(s, t.actions))
    faust_adapter.attach(app, wio)  # the adapter's seek tells it where reading starts; tests read it too
    pause = wio.pause = SinkPause(wio.sinks, s.sink_pause_s)

    # the jobs agent and the timer both move cores: one at a time from "process" to "state saved", so a
    # saved state never covers outputs that are still on their way
    busy = asyncio.Lock()

    @app.agent(job_src, name="gangwatch-jobs")
    async def jobs(stream: faust.StreamT) -> None:
        await _producer_knows(app, (states, nodemap), quiet)
        async for events in stream.take_events(s.batch_max, within=s.batch_within_s):
            metrics.messages_in(events)
            while pause.hold():  # a sink's queue is over its high-water mark: wait (bounded), not in the lock
                await asyncio.sleep(0.05)
            async with busy:
                start = time.monotonic()
                # no await between: what `in_order` counts as read is what the runner has (the commits follow it)
                res = runner.on_batch(wio.in_order(events), wio.lagging, wio.node_events_pending_from)
                await wio.publish(res)  # delivered before the state that says "done" is written
                wio.save(res)  # the timer takes states
            wio.batch_done(res, time.monotonic() - start)

    @app.agent(node_src, name="gangwatch-route")
    async def route(stream: faust.StreamT) -> None:
        await _producer_knows(app, (states, nodemap), quiet)
        async for events in stream.take_events(s.batch_max, within=s.batch_within_s):
            metrics.messages_in(events)
            res = router.on_batch(wio.in_order(events))
            await wio.publish(res)
            metrics.count(res)

    gave_up = [0]  # waits for marks given up, as last logged

    @app.timer(s.tick_s)
    async def tick() -> None:
        if app.rebalancing or app.in_recovery or wio.stopping:
            return
        await _producer_knows(app, (states, nodemap), quiet)
        async with busy:
            res = runner.on_tick(wio.caught_up, wio.lagging, wio.node_events_pending_from)
            # how far this worker's router has read each job's node events, for the workers that run the jobs
            mine = app.consumer.assignment()
            routed = [(tp.topic, tp.partition) for tp in mine if tp.topic == t.node_events]
            local = {tp.partition for tp in mine if tp.topic == t.by_job}
            res.sends += router.marks(routed, wio.lagging, lambda key: node_partition(key.decode()), local).sends
            if runner.marks.given_up > gave_up[0]:
                log.warning("%d jobs went on without the node events of a partition no worker's router marked for "
                            "%.0f s (its worker gone and not replaced?): a node event sent meanwhile may come late",
                            runner.marks.given_up - gave_up[0], s.hold_s)
                gave_up[0] = runner.marks.given_up
            await wio.publish(res)
            wio.save(res)
            taken = wio.take(wio.clock())  # within the tick's budget
        await wio.offer(taken)  # compressed in a thread, out of the lock: batches go on meanwhile
        await wio.commit_read()
        wio.find_skipped()
        await wio.rewind()
        metrics.count(res)
        router.on_tick()
        wio.sample_metrics()
        wio.stats(router, s.stats_every_s)

    @app.timer(s.tick_s)
    async def watch_path() -> None:
        # apart from `tick`, and awaiting nothing: a commit or a send to a broker that is gone blocks the tick
        # until the broker is back (measured: 48 s of a 45 s outage), and an outage never seen would let the
        # first producers to resend make the others look silent
        if not (app.rebalancing or app.in_recovery):
            wio.watch_path(s.fresh_s)

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: set[TP], **kwargs: Any) -> None:
        lost = {tp.partition for tp in revoked if tp.topic in job_topics}
        gone = runner.drop_partitions(lost)
        wio.forget(gone)
        wio.revoked(revoked)
        if gone:
            log.info("revoked partitions %s: dropped %d jobs from memory", sorted(lost), len(gone))

    @app.on_partitions_assigned.connect
    async def on_assigned(sender: Any, assigned: set[TP], **kwargs: Any) -> None:
        runner.resume()
        wio.assigned = {tp.partition for tp in assigned if tp.topic in job_topics}
        wio.cap_commits()

    @app.on_rebalance_complete.connect
    async def on_recovered(sender: Any, **kwargs: Any) -> None:
        # the tables are recovered and no input is read yet: every job of our partitions in memory before its
        # first record, so what they owe caps the commits from the start
        async with busy:
            wio.restore_assigned()

    @app.on_before_shutdown.connect
    def on_shutdown(sender: Any, **kwargs: Any) -> None:
        wio.stop(in_flight=busy.locked())

    return app


def run(s: WorkerSettings, *, loglevel: str = "info", create: bool = True) -> None:
    """Create the topics (idempotent), then run one worker until TERM/INT. Does not return normally.

    Without a `datadir`, a worker whose tables are in memory gets a temporary one of its own, removed when it
    stops; a `datadir` given (rocksdb:// tables need one) is kept.
    """
    if create:
        made = create_topics(s.own_topics, s.bootstrap)
        if made:
            log.info("created topics: %s", ", ".join(made))
    sinks: list[Sink] = []
    if s.store:
        from gangwatch.sinks.store import open_store
        from gangwatch.sinks.storesink import StoreSink

        sinks.append(StoreSink(open_store(s.store), telemetry=s.telemetry, retries=0))  # the queue retries
    if s.webhook:
        from gangwatch.sinks.webhook import WebhookSink

        sinks.append(WebhookSink(s.webhook, s.webhook_secret,  # None: the secret is GANGWATCH_WEBHOOK_SECRET
                                 single_attempt=True))  # the queue retries, off the event loop
    if s.alertmanager:
        from gangwatch.sinks.alertmanager import AlertmanagerSink

        sinks.append(AlertmanagerSink(s.alertmanager))
    # scikit-learn (stack sweeps' clustering) takes seconds to import: imported on the first sweep, it stalled the
    # event loop, every job of the worker with it (6-9 s measured on a loaded host); imported here, beside the start
    threading.Thread(target=preload_stacks, name="gangwatch-preload", daemon=True).start()
    own = None  # a data directory this process made, removed when it stops (tables in memory keep nothing there)
    if not s.datadir and s.table_store.startswith("memory"):
        own = Path(tempfile.mkdtemp(prefix=f"gangwatch-faust-{s.app_id}-"))
        s = replace(s, datadir=str(own))
    try:
        _run_app(s, sinks, loglevel)
    finally:
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)


def _run_app(s: WorkerSettings, sinks: list[Sink], loglevel: str) -> None:
    import faust
    from gangwatch.streams.metrics import serve_metrics

    app = make_app(s, sinks)
    if s.metrics_port:
        endpoint = serve_metrics(faust_adapter.attached(app).metrics, s.metrics_port)  # raises MetricsUnavailable
        log.info("metrics on http://0.0.0.0:%d/metrics", endpoint.port)
    # Each record is a few short-lived objects. With the collector's defaults (a young pass every 700
    # allocations, older passes walking every long-lived object: modules, Faust, the jobs' state) collection
    # took 10-15 % of the runner's time (measured in-process on bench_worker's records). What lives as long as
    # the process is frozen out of collection, and the young generation is collected every 50,000 allocations.
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    faust.Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()
