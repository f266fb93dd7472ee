"""The worker's self-metrics for Prometheus: what went through it, what it decided, how far behind it is.

`gangwatch worker` serves them on `--metrics-port` (default 9464, env
`GANGWATCH_METRICS_PORT`; 0 = off; a port another process holds: a free one, named in a warning) at
`/metrics`, from a thread of its own
(`gangwatch.producers.metrics.serve`), so a scrape is answered even while the
event loop is busy with a long batch. Scrape it with:

    scrape_configs:
      - job_name: gangwatch-worker
        static_configs: [{targets: ["worker-host:9464"]}]

Three sources end up on that one endpoint (one registry per worker app):

- **gangwatch's own series**, below. Counters are pushed from the event loop
  after every batch and tick (`count(result)`), from the counts a `Result` of
  `streams.runner` carries; gauges are sampled on every tick. Nothing here reads
  the runner from the scrape thread, so no lock is needed.
- **Faust's own Prometheus sensor** (`faust.sensors.prometheus`), under the
  fixed prefix `gangwatch_faust_` (not the app id, so dashboards work for every
  deployment): messages received per topic (counted per batch: `instrument`),
  table operations, sends and send errors, commit latency, rebalances, end and
  committed offsets per partition. With `--web-port`, Faust's web server also
  serves the same registry at `/metrics`.
- prometheus-client's `process_*` and `python_*` series (CPU, memory, GC).

- `gangwatch_records_total{kind}` (counter): input records handed to a job's core (job, step,
  heartbeat, hw, ...)
- `gangwatch_duplicates_total` (counter): replayed records skipped, the job's saved state
  already held them
- `gangwatch_decode_rejects_total{topic}` (counter): input items that broke the contract, by the
  topic they came on
- `gangwatch_dlq_messages_total{cause, topic}` (counter): dead letters sent to the DLQ; cause
  `decode` (broke the contract), `future` (event time over `max_future_s` ahead of the worker's
  clock: a sender's clock is wrong), `no_job` (no `job` record within `--hold`) or `core` (the core
  refused it, e.g. older than the job's topology)
- `gangwatch_findings_total{type, detector}`, `gangwatch_actions_total{type}` (counters): what
  was published
- `gangwatch_incident_stage_seconds{stage, class}` (histogram): stage durations of each
  incident when it closes (detect, localize, decide, replace, rollback, comm_rebuild, total)
- `gangwatch_batch_seconds` (histogram): wall time of one batch: process, publish, save state
- `gangwatch_consumer_lag_records{topic, partition}` (gauge): messages left to read on each
  input partition this worker holds
- `gangwatch_event_time_lag_seconds` (gauge): wall clock minus the newest event time processed,
  set by each batch that processed records (on live data: how far behind the pipeline runs)
- `gangwatch_jobs` (gauge): jobs held in memory
- `gangwatch_node_events_routed_total`, `gangwatch_node_events_dropped_total` (counters): node
  events re-keyed to their job, and dropped because no job ran on their node within `--hold`
- `gangwatch_input_messages_given_up_total{topic, cause}` (counter): input messages this worker
  gave up, each also said in the log: `deleted` by the topic's retention before it read them, or
  `unreadable` after every seek back to them
- `gangwatch_sink_queue_depth{sink}` (gauge): records a sink holds, not delivered yet (each
  sink's delivery queue, `sinks/queued.py`; the Alertmanager sink's own outbox)
- `gangwatch_sink_failures_total{sink}` (counter): records a sink could never deliver (its dead
  letters), failed deliveries a sink reports itself, and exceptions a sink raised

Useful queries: `rate(gangwatch_records_total[5m])` (input rate by kind),
`sum(gangwatch_consumer_lag_records)` (backlog), `histogram_quantile(0.9,
sum by (le, stage) (rate(gangwatch_incident_stage_seconds_bucket[1d])))` (stage
times against their budgets in docs/domain.md).

An incident is re-emitted as it moves and may be re-emitted after a restart; its
stages are observed once, the first time this process sees it closed (it
remembers the last 10,000 closed incident ids).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from gangwatch.producers.metrics import Endpoint, process_registry, serve
from gangwatch.schemas import Incident
from gangwatch.streams.runner import Result
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.registry import CollectorRegistry

FAUST_PREFIX = "gangwatch_faust"
# Stage durations run from seconds (detect) to an hour and more (a requeue); budgets are 60-600 s.
STAGE_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
KEEP_CLOSED = 10_000  # closed incident ids remembered, so a re-emitted incident is observed once


def sink_name(sink: Any) -> str:
    """The `sink` label of a sink: its class name without `Sink`, in lower case (store, webhook, alertmanager)."""
    name = type(sink).__name__
    return (name[:-4] if name.endswith("Sink") and len(name) > 4 else name).lower()


def sink_failures(sink: Any) -> int:
    """Failed deliveries a sink counts itself: `failures` (an int) or `failed` (an int, or the list it keeps)."""
    for attr in ("failures", "failed"):
        value = getattr(sink, attr, None)
        if isinstance(value, int):
            return value
        if isinstance(value, list):
            return len(value)
    return 0


def sink_queue_depth(sink: Any) -> int:
    """Outputs a sink holds that are not sent yet: its `pending()`, if it has one (else it holds none)."""
    pending = getattr(sink, "pending", None)
    return int(pending()) if callable(pending) else 0


class WorkerMetrics:
    """The series of one worker, in `registry` (default: a fresh one with the process collectors).

    The worker calls `count(result)` for every batch, tick and routing result,
    `batch_done(seconds, lag)` after a batch, and `sample(...)` on every tick.
    Everything is called from the event loop.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else process_registry()
        self.faust: Any = None  # Faust's own series (`instrument`), fed per batch by `messages_in`
        r = self.registry
        self.records = Counter("gangwatch_records", "Input records handed to a job's core, by kind.", ["kind"],
                               registry=r)
        self.duplicates = Counter("gangwatch_duplicates", "Replayed records skipped: the job's state already held "
                                  "them.", registry=r)
        self.decode_rejects = Counter("gangwatch_decode_rejects", "Input items that broke the contract, by the topic "
                                      "they came on.", ["topic"], registry=r)
        self.dlq = Counter("gangwatch_dlq_messages", "Dead letters sent to the DLQ topic, by cause (decode, future, "
                           "no_job, core) and the input topic of the message.", ["cause", "topic"], registry=r)
        self.findings = Counter("gangwatch_findings", "Findings published, by type and detector.",
                                ["type", "detector"], registry=r)
        self.actions = Counter("gangwatch_actions", "Actions published, by type.", ["type"], registry=r)
        self.stages = Histogram("gangwatch_incident_stage_seconds", "Stage durations of incidents, observed when "
                                "an incident closes, by stage and incident class.", ["stage", "class"],
                                buckets=STAGE_BUCKETS, registry=r)
        self.batch_seconds = Histogram("gangwatch_batch_seconds", "Wall time of one batch: process, publish, save "
                                       "state.", buckets=BATCH_BUCKETS, registry=r)
        self.lag_records = Gauge("gangwatch_consumer_lag_records", "Messages left to read on each input partition "
                                 "this worker holds.", ["topic", "partition"], registry=r)
        self.lag_seconds = Gauge("gangwatch_event_time_lag_seconds", "Wall clock minus the newest event time "
                                 "processed, after the last batch that processed any.", registry=r)
        self.jobs = Gauge("gangwatch_jobs", "Jobs held in memory.", registry=r)
        self.given_up_messages = Counter("gangwatch_input_messages_given_up", "Input messages this worker gave up: "
                                         "deleted by retention before it read them, or unreadable after every seek "
                                         "back (streams/workerio.py rewind), by topic and cause.",
                                         ["topic", "cause"], registry=r)
        self.routed = Counter("gangwatch_node_events_routed", "Node events re-keyed to their job.", registry=r)
        self.dropped = Counter("gangwatch_node_events_dropped", "Node events dropped: no job on their node within "
                               "the hold time.", registry=r)
        self.sink_depth = Gauge("gangwatch_sink_queue_depth", "Outputs a sink holds that are not sent yet.",
                                ["sink"], registry=r)
        self.sink_failures = Counter("gangwatch_sink_failures", "Failed deliveries a sink reports, and exceptions "
                                     "a sink raised.", ["sink"], registry=r)
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._lag_series: set[tuple[str, str]] = set()
        self._totals: dict[tuple[str, str], int] = {}  # last cumulative count read from a component

    # --- pushed from results ------------------------------------------------------------------------

    def count(self, res: Result) -> None:
        """Count what one batch, tick or routing step took in and put out."""
        for kind, n in res.kinds.items():
            self.records.labels(kind).inc(n)
        if res.duplicates:
            self.duplicates.inc(res.duplicates)
        for (cause, topic), n in res.dead.items():
            self.dlq.labels(cause, topic).inc(n)
            if cause == "decode":
                self.decode_rejects.labels(topic).inc(n)
        out = res.outputs
        for f in out.findings:
            self.findings.labels(f.type, f.detector).inc()
        for a in out.actions:
            self.actions.labels(a.type).inc()
        for inc in out.incidents:
            self.closed(inc)

    def closed(self, inc: Incident) -> None:
        """Observe the stage durations of an incident the first time it is seen closed (recovered)."""
        if inc.recovered_ts is None or inc.id in self._closed:
            return
        self._closed[inc.id] = None
        if len(self._closed) > KEEP_CLOSED:
            self._closed.popitem(last=False)
        for stage, seconds in inc.stage_s.items():
            self.stages.labels(stage, inc.cls).observe(seconds)

    def batch_done(self, seconds: float, lag_s: float | None) -> None:
        """A batch took `seconds` of wall time; `lag_s`: wall clock - newest event time it processed, if any."""
        self.batch_seconds.observe(seconds)
        if lag_s is not None:
            self.lag_seconds.set(lag_s)

    def messages_in(self, events: list[Any]) -> None:
        """Faust's `messages_received` series for one batch of events (see `instrument`)."""
        if self.faust is None or not events:
            return
        per_topic: dict[str, int] = {}
        newest: dict[tuple[str, int], int] = {}
        for e in events:
            m = e.message
            per_topic[m.topic] = per_topic.get(m.topic, 0) + 1
            newest[(m.topic, m.partition)] = m.offset
        self.faust.messages_received.inc(len(events))
        for topic, n in per_topic.items():
            self.faust.messages_received_per_topics.labels(topic=topic).inc(n)
        for (topic, partition), offset in newest.items():
            self.faust.messages_received_per_topics_partition.labels(topic=topic, partition=partition).set(offset)

    def given_up(self, topic: str, cause: str, messages: int) -> None:
        self.given_up_messages.labels(topic, cause).inc(messages)

    def sink_failed(self, sink: Any) -> None:
        """A sink raised."""
        self.sink_failures.labels(sink_name(sink)).inc()

    # --- sampled on every tick ----------------------------------------------------------------------

    def sample(self, *, lag: Mapping[tuple[str, int], int], jobs: int, routed: int, dropped: int,
               sinks: Iterable[Any] = ()) -> None:
        """Set the gauges, and advance the counters that come from cumulative counts kept elsewhere.

        `lag`: messages left per (topic, partition) this worker holds; a partition no longer
        in it (revoked) loses its series. `routed`, `dropped`: the node router's totals.
        """
        now = set()
        for (topic, partition), n in lag.items():
            key = (topic, str(partition))
            self.lag_records.labels(*key).set(n)
            now.add(key)
        for key in self._lag_series - now:
            self.lag_records.remove(*key)
        self._lag_series = now
        self.jobs.set(jobs)
        self._advance(self.routed, ("router", "routed"), routed)
        self._advance(self.dropped, ("router", "dropped"), dropped)
        for sink in sinks:
            name = sink_name(sink)
            self.sink_depth.labels(name).set(sink_queue_depth(sink))
            self._advance(self.sink_failures.labels(name), ("sink", name), sink_failures(sink))

    def _advance(self, counter: Any, key: tuple[str, str], total: int) -> None:
        """Increase `counter` by what `total`, a count kept by a component, grew since the last call."""
        grown = total - self._totals.get(key, 0)
        if grown > 0:
            counter.inc(grown)
        self._totals[key] = max(total, self._totals.get(key, 0))


def instrument(app: Any, metrics: WorkerMetrics) -> None:
    """Install Faust's own Prometheus sensor on `app`, writing into the worker's registry, counting messages per
    batch (`messages_in`) instead of per message.

    Faust calls its monitor four times for every message (received, event in, event out, acknowledged); the
    bookkeeping behind those calls halved what Faust alone delivers (measured: 2,548 messages/s with its
    default monitor, 4,626 without, an agent doing nothing with its batches). The worker's monitor keeps
    every other series of Faust's sensor (sends, commits, rebalances, tables, offsets) and counts the
    messages received, per topic and with each partition's newest offset, once per batch from the agents
    (`WorkerMetrics.messages_in`); the per-event series (events, their latency) are not kept. With
    `--web-port`, Faust's web server also serves the registry at `/metrics`.
    """
    from faust.sensors.prometheus import FaustMetrics, PrometheusMonitor
    from faust.web import Response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    class BatchMonitor(PrometheusMonitor):
        """Faust's Prometheus sensor without its per-message hooks (see `instrument`)."""

        def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
            pass

        def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
            return None

        def on_stream_event_out(self, tp: Any, offset: int, stream: Any, event: Any, state: Any = None) -> None:
            pass

        def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
            pass

    faust_metrics = FaustMetrics.create(metrics.registry, FAUST_PREFIX)
    app.monitor = BatchMonitor(metrics=faust_metrics)
    metrics.faust = faust_metrics

    @app.page("/metrics")
    async def metrics_page(self: Any, request: Any) -> Any:
        return Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST},
                        status=200)


def serve_metrics(metrics: WorkerMetrics, port: int) -> Endpoint:
    """Serve the worker's registry on `port` (all interfaces), or on a free port with a warning when `port` is
    taken; raises `MetricsUnavailable` if it cannot serve at all."""
    return serve(port, metrics.registry, who="worker")
