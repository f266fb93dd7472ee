"""Self-metrics for Prometheus: serving them from any gangwatch process, and what the producers report.

Three kinds of gangwatch process answer Prometheus, each on a port of its own:

- `gangwatch worker`: `--metrics-port` (env `GANGWATCH_METRICS_PORT`), default 9464;
  its series are in `streams/metrics.py`.
- `gangwatch agent`: `--metrics-port` (env `GANGWATCH_METRICS_PORT`), default 9465;
  `gangwatch_agent_*` and `gangwatch_producer_*`, below.
- the trainer client: env `GANGWATCH_METRICS_PORT` only, off without it;
  `gangwatch_trainer_*` and `gangwatch_producer_*`, below.

A port of 0 turns the endpoint off. A port another process holds (a second agent or
worker on one host) does not stop the process: its endpoint moves to a free port the
kernel picks, and one warning names the taken port, the port it serves on instead, and
the option (`--metrics-port` / `GANGWATCH_METRICS_PORT`) that fixes it; give each
process a port of its own where Prometheus scrapes a fixed target. Every rank of a job on one node runs a trainer
client, so a rank serves on `GANGWATCH_METRICS_PORT + LOCAL_RANK` (eight ranks
and 9470: ports 9470-9477). Each endpoint also carries the standard `process_*`
and `python_*` series of prometheus-client.

**Why this module lives in producers/.** The agent and the trainer client are
producers, and producers import nothing downstream (tests/contract/test_layering.py):
not `streams`, not `gangwatch.cli`. `schemas` is the pure contract and does no
I/O. So what every process shares, `serve()`, is defined here, at the left end
of the import chain; the worker's `streams/metrics.py` imports it from here
(streams may import anything), and keeps the worker's own series to itself.

**prometheus-client stays optional for the trainer client.** The core install
(`pip install gangwatch`) does not bring it, and importing this module does not
import it: only `serve()` / `start()` do, when a port is asked for. Without the
package the trainer client and the agent log one line and carry on without an
endpoint; their job is the telemetry, not the metrics.

**Producers are read when Prometheus scrapes (pull), not instrumented (push).**
The trainer client, its `Delivery` and the agent's `Outbox` already keep the
counts they need (records handed over by kind, messages acknowledged, sends
that failed, records lost, queue lengths, spool bytes). `watch(obj)` adds an
object to the one collector of this process, which reads those counts on each
scrape through its reader (`metric_samples` beside `TrainerClient` and `Agent`). So the
training thread never touches prometheus-client, nothing costs anything while
nobody scrapes, and all metric names and help texts are in this one file. The
reads are of plain ints, `len()` of deques and C-level copies of small dicts:
each is atomic under the GIL, so the scrape thread needs no lock of the sender's.

Series (all without per-process labels: Prometheus's own `instance` label tells the
processes apart; the `*_info` series carry who the process is, for joins):

- `gangwatch_producer_records_total{kind}` (counter): records handed to delivery (sent, or
  spooled while Kafka is away)
- `gangwatch_producer_sent_messages_total` (counter): batch messages Kafka acknowledged (new or
  from the spool); `gangwatch_producer_sent_records_total`: the records in them
- `gangwatch_producer_send_failures_total` (counter): sends that failed (the message was spooled)
- `gangwatch_producer_dropped_records_total` (counter): records lost: queue full, invalid, not
  encodable, or given up by a full spool
- `gangwatch_producer_spool_bytes` (gauge): backlog on local disk, waiting for Kafka
- `gangwatch_producer_queue_depth{queue}` (gauge): records waiting in memory for the sending
  thread (`steps` and `control` in a training process, `outbox` in the agent; `relay` in the
  agent: records of the training processes lingering in the relay or waiting in the outbox)
- `gangwatch_trainer_info{job_id, rank, local_rank, node}` (gauge, 1): who the training process is
- `gangwatch_trainer_last_step` (gauge): the last step the training loop finished
- `gangwatch_agent_info{node}` (gauge, 1): the node the agent watches
- `gangwatch_agent_polls_total{collector}`, `gangwatch_agent_poll_failures_total{collector}`
  (counters): polls of each collector (GPU samples, kernel log, flight-recorder dumps,
  collect_stacks actions), and those that raised
- `gangwatch_trainer_relay_records_total{outcome}` (counter, a training process using its node's
  relay): records the relay `accepted`, `refused` (full, or a bad frame) or `failed` to answer
  for (gone, or no answer in time); the last two the client delivered itself
- `gangwatch_trainer_relay_connected` (gauge, 0 or 1): connected to the node's relay now
- `gangwatch_agent_relay_records_total{outcome}` (counter): records of the training processes the
  agent's relay `accepted` or `refused` (full or closing: their clients sent them themselves);
  `gangwatch_agent_relay_bad_frames_total`: frames refused as bad; `gangwatch_agent_relay_envelopes_total`:
  envelopes it handed to the outbox (records / envelopes: the mean envelope size)
- `gangwatch_agent_relay_clients` (gauge): training processes connected to the relay now

(`job_id`, not `job`: Prometheus sets `job` itself, the scrape job's name.)
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from gangwatch.producers.trainer.delivery import Delivery

log = logging.getLogger("gangwatch.metrics")

PORT_ENV = "GANGWATCH_METRICS_PORT"
OPTION = f"--metrics-port or {PORT_ENV}"  # how a port is chosen, named when the one asked for is taken
WORKER_PORT, AGENT_PORT = 9464, 9465  # the defaults of `gangwatch worker` and `gangwatch agent`
INSTALL = "pip install prometheus-client"


class MetricsUnavailable(RuntimeError):
    """No endpoint could be served: prometheus-client is not installed, or the port is taken."""


# --- serving -------------------------------------------------------------------------------------


class Endpoint(NamedTuple):
    """A running `/metrics` HTTP server (a daemon thread); `close()` stops it."""

    port: int
    server: Any  # wsgiref's server, from prometheus_client.start_http_server

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def process_registry() -> Any:
    """A fresh prometheus-client registry with the standard process, platform and GC collectors in it.

    Each gangwatch process serves its own registry rather than prometheus-client's
    global one: a test may build several workers in one process, and a training
    script's own metrics keep their own endpoint.
    """
    from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def serve(port: int, registry: Any, addr: str = "0.0.0.0", who: str = "gangwatch",
          option: str = OPTION) -> Endpoint:
    """Serve `registry` at `http://ADDR:PORT/metrics` from a daemon thread; raises `MetricsUnavailable`.

    A thread, not the process's event loop: a worker whose loop is busy with a long
    batch still answers the scrape. A port another process holds (a second worker or
    agent on the host) is not fatal: the endpoint moves to a free port the kernel
    picks, and one warning names both ports and `option` (how to fix the port).
    """
    try:
        from prometheus_client import start_http_server
    except ImportError:
        raise MetricsUnavailable(f"prometheus-client is not installed ({INSTALL})") from None
    try:
        server, _ = start_http_server(port, addr=addr, registry=registry)
    except OSError as e:
        if e.errno != errno.EADDRINUSE or port == 0:
            raise MetricsUnavailable(f"cannot serve metrics on port {port}: {e.strerror or e} "
                                     f"({option}; 0 turns the endpoint off)") from None
        try:
            server, _ = start_http_server(0, addr=addr, registry=registry)
        except OSError as e2:
            raise MetricsUnavailable(f"cannot serve metrics on port {port} (taken) nor on a free one: "
                                     f"{e2.strerror or e2} ({option}; 0 turns the endpoint off)") from None
        log.warning("gangwatch: %s: metrics port %d is taken; serving metrics on port %d instead "
                    "(choose one with %s; 0 turns the endpoint off)", who, port, server.server_port, option)
    return Endpoint(server.server_port, server)


def port_from_env(environ: Mapping[str, str] | None = None) -> int:
    """`GANGWATCH_METRICS_PORT` as a port number; 0 (off) when unset, empty, or not a port (with a log line)."""
    raw = ((os.environ if environ is None else environ).get(PORT_ENV) or "").strip()
    if not raw:
        return 0
    try:
        port = int(raw)
        if not 0 <= port < 65536:
            raise ValueError
    except ValueError:
        log.warning("gangwatch: %s=%r is not a port number; no metrics endpoint", PORT_ENV, raw)
        return 0
    return port


# --- what the producers report -------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One metric: its name (a counter's without `_total`: prometheus-client adds it), type, help, label names."""

    name: str
    type: str  # "counter" or "gauge"
    help: str
    labels: tuple[str, ...] = ()


Sample = tuple[Family, tuple[str, ...], float]  # (metric, label values in the order of its labels, value)

RECORDS = Family("gangwatch_producer_records", "counter",
                 "Records handed to delivery (sent, or spooled while Kafka is away), by kind.", ("kind",))
SENT_MESSAGES = Family("gangwatch_producer_sent_messages", "counter",
                       "Batch messages Kafka acknowledged (new ones and ones from the spool).")
SENT_RECORDS = Family("gangwatch_producer_sent_records", "counter", "Records in the messages Kafka acknowledged.")
SEND_FAILURES = Family("gangwatch_producer_send_failures", "counter",
                       "Sends to Kafka that failed; the message went to the spool.")
DROPPED = Family("gangwatch_producer_dropped_records", "counter",
                 "Records lost: pushed out of a full queue, invalid, not encodable, or given up by a full spool.")
SPOOL_BYTES = Family("gangwatch_producer_spool_bytes", "gauge", "Backlog on local disk waiting for Kafka, bytes.")
QUEUE_DEPTH = Family("gangwatch_producer_queue_depth", "gauge",
                     "Records waiting in memory for the sending thread.", ("queue",))
TRAINER_INFO = Family("gangwatch_trainer_info", "gauge", "Who this training process is (always 1).",
                      ("job_id", "rank", "local_rank", "node"))
LAST_STEP = Family("gangwatch_trainer_last_step", "gauge", "The last step the training loop finished.")
AGENT_INFO = Family("gangwatch_agent_info", "gauge", "The node this agent watches (always 1).", ("node",))
POLLS = Family("gangwatch_agent_polls", "counter", "Polls of each collector of the agent.", ("collector",))
POLL_FAILURES = Family("gangwatch_agent_poll_failures", "counter", "Collector polls that raised.", ("collector",))
TRAINER_RELAY_RECORDS = Family("gangwatch_trainer_relay_records", "counter",
                               "Records handed to the node's relay: accepted, refused (full or a bad frame) or "
                               "failed (gone or no answer); refused and failed ones were sent directly.",
                               ("outcome",))
TRAINER_RELAY_CONNECTED = Family("gangwatch_trainer_relay_connected", "gauge",
                                 "1 while connected to the node's relay, else 0.")
RELAY_RECORDS = Family("gangwatch_agent_relay_records", "counter",
                       "Records of the training processes the relay accepted, or refused (full or closing).",
                       ("outcome",))
RELAY_BAD_FRAMES = Family("gangwatch_agent_relay_bad_frames", "counter", "Frames the relay refused as bad.")
RELAY_ENVELOPES = Family("gangwatch_agent_relay_envelopes", "counter", "Envelopes the relay handed to the outbox.")
RELAY_CLIENTS = Family("gangwatch_agent_relay_clients", "gauge", "Training processes connected to the relay now.")


def delivery_samples(deliveries: Iterable[Delivery]) -> Iterator[Sample]:
    """The `gangwatch_producer_*` counts of one or more `Delivery`s (the agent has one per Kafka key), summed."""
    kinds: dict[str, int] = {}
    sent = sent_records = failures = spool = 0
    for d in deliveries:
        for kind, n in dict(d.kinds).items():  # a C-level copy: the sending thread may add a kind meanwhile
            kinds[kind] = kinds.get(kind, 0) + n
        sent += d.sent_messages
        sent_records += d.sent_records
        failures += d.failures
        spool += d.spool.bytes
    for kind in sorted(kinds):
        yield RECORDS, (kind,), kinds[kind]
    yield SENT_MESSAGES, (), sent
    yield SENT_RECORDS, (), sent_records
    yield SEND_FAILURES, (), failures
    yield SPOOL_BYTES, (), spool


class ProducerCollector:
    """The prometheus-client collector of a producer process: reads every watched object on each scrape.

    `watch(obj, read)` adds an object with the function that turns it into samples;
    objects are held weakly (a client that is never closed does not leak through
    here). Samples of the same series from several objects are added up.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: weakref.WeakKeyDictionary[Any, Callable[[Any], Iterable[Sample]]] = \
            weakref.WeakKeyDictionary()

    def watch(self, obj: Any, read: Callable[[Any], Iterable[Sample]]) -> None:
        with self._lock:
            self._watched[obj] = read

    def unwatch(self, obj: Any) -> None:
        with self._lock:
            self._watched.pop(obj, None)

    def samples(self) -> dict[Family, dict[tuple[str, ...], float]]:
        """Every watched object's samples, by metric and label values (added up across objects)."""
        with self._lock:
            watched = list(self._watched.items())
        out: dict[Family, dict[tuple[str, ...], float]] = {}
        for obj, read in watched:
            try:
                got = list(read(obj))
            except Exception:  # a broken reader must not fail the whole scrape
                log.exception("gangwatch: reading metrics of %s failed", type(obj).__name__)
                continue
            for family, values, value in got:
                series = out.setdefault(family, {})
                series[values] = series.get(values, 0) + value
        return out

    def collect(self) -> Iterator[Any]:
        """prometheus-client's collector protocol: one metric family per `Family` that has samples."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for family, series in sorted(self.samples().items(), key=lambda kv: kv[0].name):
            cls = CounterMetricFamily if family.type == "counter" else GaugeMetricFamily
            metric = cls(family.name, family.help, labels=list(family.labels))
            for values, value in sorted(series.items()):
                metric.add_metric(list(values), value)
            yield metric


# The producer side of this process: one collector, and at most one endpoint.
COLLECTOR = ProducerCollector()
_endpoint: Endpoint | None = None
_start_lock = threading.Lock()


def start(port: int, who: str) -> Endpoint | None:
    """Serve this process's producer metrics on `port`, once per process; None, with one log line, if it cannot.

    Never raises: the agent and the trainer client go on without an endpoint. A later
    call returns the endpoint already running (a second client in the process joins it).
    """
    global _endpoint
    with _start_lock:
        if _endpoint is not None:
            if port != _endpoint.port:
                log.info("gangwatch: metrics are already served on port %d (not %d)", _endpoint.port, port)
            return _endpoint
        try:
            registry = process_registry()
            registry.register(COLLECTOR)
            _endpoint = serve(port, registry, who=who)
        except ImportError:
            log.warning("gangwatch: %s: no metrics endpoint: prometheus-client is not installed (%s)", who, INSTALL)
            return None
        except MetricsUnavailable as e:
            log.warning("gangwatch: %s: no metrics endpoint: %s", who, e)
            return None
        log.info("gangwatch: %s metrics on http://0.0.0.0:%d/metrics", who, _endpoint.port)
        return _endpoint


def stop() -> None:
    """Stop this process's producer endpoint (for tests; a process's endpoint otherwise lives as long as it)."""
    global _endpoint
    with _start_lock:
        if _endpoint is not None:
            _endpoint.close()
        _endpoint = None
