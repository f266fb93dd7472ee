"""The node agent: one process per node that reports what the training processes cannot see themselves.

    from gangwatch.producers.agent import Agent, AgentSettings

    agent = Agent(AgentSettings(node="n017", bootstrap="kafka1:9092", flight_dir=Path("/var/fr")))
    agent.run()            # until agent.stop() (the CLI calls it on SIGTERM / SIGINT)

Collectors, each in its own module and its own thread:

| collector       | module      | reads                               | publishes                             |
|-----------------|-------------|-------------------------------------|---------------------------------------|
| GPU samples     | `gpu`       | NVML, every `gpu_every_s`           | `gpu` on `node-events`, key node      |
| kernel log      | `kernel`    | /dev/kmsg, journalctl -k, or a file | `hw` (Xid, ECC, NVLink, PCIe, NIC), same |
| stack sweeps    | `stacks`    | `collect_stacks` actions; py-spy    | `stack` on `traces`, key job          |
| flight recorder | `flightdir` | new dumps in `flight_dir`           | `flight` on `traces`, key job         |
| frozen ranks    | `frozen`    | ranks' /proc/PID/stat, `heartbeat_s`| `heartbeat` on `telemetry`, key job   |

Frozen ranks: a rank whose process lives but is stopped (`T`, SIGSTOP), traced
(`t`) or in uninterruptible sleep (`D`: swapping, a hung filesystem or driver
call) cannot send its own heartbeats, and would look dead: fail-stop would have
it replaced, though it trains on once the freeze ends. For such a rank the agent
sends a `heartbeat` each period on its behalf (`ts` now, `source: "agent"`,
`proc_state` the letter), so the core sees it alive and making no progress: a
hang that names the frozen rank and its state, not a death to evict. Ranks in `R` or `S`
beat by themselves and get nothing; a zombie or a vanished process is dead and
gets nothing. `heartbeat_s` must not exceed the jobs' own heartbeat period (both
default to 5 s); 0 turns the check off.

`procs` finds the job's ranks on this node in /proc (`RankTable`: cheaply, every
period); `outbox` sends everything with the trainer client's delivery (bounded
queue, one sending thread, a spool on disk while the broker is away, resent in
order).

With `relay` set (`gangwatch agent` sets it to `<temp dir>/gangwatch-agent/<node>.sock`
unless `--relay off`), `run()` also listens there for the records of this node's
training processes and packs them into large envelopes for the outbox (`relay`:
up to `relay_max_records` records or `relay_linger_s`). A relay that cannot
listen is left out with one line in the log; the training processes then send
to Kafka themselves.

With `metrics_port` set, `run()` serves Prometheus metrics on it (`gangwatch agent`
does on 9465 unless `--metrics-port 0`): polls and failures per collector, the
outbox's queue, losses, records by kind and the delivery's counts
(producers/metrics.py). Without prometheus-client, one line in the log and no
endpoint; the agent runs on.

A collector that cannot start (no GPU, no readable kernel log) is left out with
one line in the log; one that fails while running logs the failure once and is
tried again at its next turn. Nothing waits for the broker: records spool until
it answers. `run_once()` makes one pass of the GPU, kernel-log, flight and
frozen-rank collectors, sends or spools what they found, and returns (tests, cron); it does
not listen for actions.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gangwatch.producers import metrics
from gangwatch.producers.agent.flightdir import FlightWatcher
from gangwatch.producers.agent.frozen import FrozenRanks
from gangwatch.producers.agent.gpu import GpuSampler, open_nvml
from gangwatch.producers.agent.kernel import KernelLog, open_source
from gangwatch.producers.agent.outbox import Outbox
from gangwatch.producers.agent.procs import PROC, RankProcess, RankTable, rank_processes
from gangwatch.producers.agent.relay import Relay
from gangwatch.producers.agent.stacks import ActionListener, StackSweeper
from gangwatch.producers.nvml import Nvml, RealNvml, gpu_indices
from gangwatch.producers.trainer.delivery import KafkaSend, Send
from gangwatch.schemas.signature import TopicVerifier, topic_secret
from gangwatch.schemas.topics import TopicSettings

log = logging.getLogger("gangwatch.agent")


def default_node() -> str:
    """This node's name as the trainer client names it (launch.py): Slurm's node name, else the hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def default_py_spy() -> str:
    """py-spy on the PATH, else the one installed next to this Python (a virtual environment's bin/)."""
    return shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))


def default_spool_dir(node: str) -> Path:
    """`<tmp>/gangwatch-agent-spool/<node>`: agents of several simulated nodes on one host keep apart."""
    return Path(tempfile.gettempdir()) / "gangwatch-agent-spool" / re.sub(r"[^A-Za-z0-9._-]", "_", node)


@dataclass(frozen=True)
class AgentSettings:
    """What the agent reads and where it sends it (the `gangwatch agent` options)."""

    node: str = field(default_factory=default_node)
    bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = "gw."
    kmsg: str = "auto"  # auto, off, /dev/kmsg, journal, or a file path (kernel.open_source)
    gpu_every_s: float = 5.0  # 0: no GPU samples
    flight_dir: Path | None = None
    spool_dir: Path | None = None  # default: `default_spool_dir(node)`
    from_start: bool = False  # read the kernel log from its start, publish the flight dumps already there
    py_spy: str = field(default_factory=default_py_spy)
    metrics_port: int = 0  # serve Prometheus metrics on this port while `run()` runs; 0: no endpoint
    heartbeat_s: float = 5.0  # period of the frozen-rank check (at most the jobs' heartbeat period); 0: none
    relay: Path | None = None  # the relay's Unix socket while `run()` runs; None: no relay
    relay_max_records: int = 512  # records per envelope at most (1 to 1000)
    relay_linger_s: float = 0.25  # how long an envelope waits for more records


class Collector(Protocol):
    name: str
    every_s: float  # pause between two polls

    def poll(self, now: float) -> list[dict[str, Any]]:
        """Contract-v1 records of what is new since the last poll; `now` is the wall-clock time."""

    def close(self) -> None: ...


class Agent:
    """The collectors of one node and the outbox they share.

    For tests: `nvml` makes the NVML reader (a `FakeNvml`), `send` replaces
    Kafka for the outbox, `proc_root` replaces /proc for process discovery.
    """

    def __init__(self, settings: AgentSettings, *, nvml: Callable[[], Nvml] = RealNvml, send: Send | None = None,
                 proc_root: Path = PROC, clock: Callable[[], float] = time.time) -> None:
        self.settings, self._clock = settings, clock
        self.spool_dir = settings.spool_dir or default_spool_dir(settings.node)
        self.outbox = Outbox(send or KafkaSend(settings.bootstrap), self.spool_dir,
                             topic_prefix=settings.topic_prefix, clock=clock)
        self.relay: Relay | None = None  # listening while `run()` runs, when `settings.relay` names a socket
        self._stop = threading.Event()
        # per collector, for the metrics endpoint: each count is written by that collector's thread only
        self.polls: dict[str, int] = {}
        self.poll_failures: dict[str, int] = {}

        def processes() -> list[RankProcess]:
            return rank_processes(settings.node, proc_root, prefix=settings.topic_prefix)

        secret = topic_secret()
        if secret is None:
            log.info("collect_stacks actions are answered unchecked: set GANGWATCH_WEBHOOK_SECRET (the worker's) "
                     "to refuse unsigned, forged, stale and replayed ones")
        actions = TopicSettings(prefix=settings.topic_prefix).actions
        self.listener = ActionListener(settings.bootstrap, actions, settings.node,
                                       StackSweeper(py_spy=settings.py_spy, processes=processes, clock=clock),
                                       verify=TopicVerifier(secret) if secret else None)
        self.collectors: list[Collector] = []
        gpus = open_nvml(nvml) if settings.gpu_every_s > 0 else None
        if gpus is not None:
            self.collectors.append(GpuSampler(gpus, settings.node, settings.gpu_every_s))
        source = open_source(settings.kmsg, settings.from_start)
        if source is not None:
            log.info("following the kernel log %s", source.what)
            self.collectors.append(KernelLog(source, settings.node, gpu_of=gpu_indices(gpus) if gpus else None))
        if settings.flight_dir is not None:
            log.info("watching %s for flight-recorder dumps", settings.flight_dir)
            self.collectors.append(FlightWatcher(settings.flight_dir, processes=processes,
                                                 sweep_of=self.listener.sweep_of, from_start=settings.from_start))
        if settings.heartbeat_s > 0:
            self.collectors.append(FrozenRanks(RankTable(settings.node, proc_root, prefix=settings.topic_prefix),
                                                         settings.heartbeat_s))

    def run(self, close_timeout_s: float = 10.0) -> None:
        """Run every collector (and the action listener) until `stop()`; then send what is left and return."""
        self.outbox.start()
        everyone: list[Collector] = [*self.collectors, self.listener]
        for c in everyone:  # every key exists before the threads start: a scrape never sees the dicts grow
            self.polls[c.name] = self.poll_failures[c.name] = 0
        if self.settings.metrics_port:
            metrics.COLLECTOR.watch(self, metric_samples)
            metrics.start(self.settings.metrics_port, f"agent of node {self.settings.node}")
        self._start_relay()
        threads = [threading.Thread(target=self._keep_polling, args=(c,), name=f"gangwatch-agent {c.name}",
                                    daemon=True) for c in everyone]
        for t in threads:
            t.start()
        log.info("agent of node %s running: %s; sending to %s (spool %s)", self.settings.node,
                 ", ".join(c.name for c in everyone), self.settings.bootstrap, self.spool_dir)
        self._stop.wait()
        log.info("stopping: sending what is left")
        if self.relay is not None:  # first: what it holds goes to the outbox, its clients to Kafka directly
            self.relay.close(close_timeout_s / 4)
        deadline = time.monotonic() + close_timeout_s / 2
        for c, t in zip(everyone, threads, strict=True):
            t.join(max(0.0, deadline - time.monotonic()))
            if not t.is_alive():  # a collector still busy (a long py-spy run) is left to the process exit
                c.close()
        self.outbox.close(close_timeout_s / 2)
        metrics.COLLECTOR.unwatch(self)
        self._report()

    def run_once(self, close_timeout_s: float = 10.0) -> None:
        """One pass of the GPU, kernel-log, flight and frozen-rank collectors; send (or spool) the records; return."""
        for c in self.collectors:
            try:
                self.outbox.put(self._poll(c))
            except Exception:
                log.exception("%s failed", c.name)
            c.close()
        self.outbox.close(close_timeout_s)
        self._report()

    def _poll(self, c: Collector) -> list[dict[str, Any]]:
        """One poll of `c` at the agent's time; its heartbeats and NVML samples carry the node's monotonic clock
        read beside it (`mono`: what shows the node's wall clock stepping, `detectors/clocksteps.py`)."""
        now, mono = self._clock(), round(time.monotonic(), 6)
        recs = c.poll(now)
        for rec in recs:
            if rec.get("kind") in ("heartbeat", "gpu") and rec.get("ts") == now:
                rec.setdefault("mono", mono)
        return recs

    def stop(self) -> None:
        """Ask `run()` to finish (safe from a signal handler or another thread)."""
        self._stop.set()

    def _start_relay(self) -> None:
        s = self.settings
        if s.relay is None:
            return
        relay = Relay(s.relay, self.outbox, max_records=s.relay_max_records, linger_s=s.relay_linger_s)
        try:
            relay.start()
        except OSError as e:
            log.warning("no relay at %s (%s): the training processes of this node send to Kafka themselves",
                        s.relay, e)
            return
        self.relay = relay

    def _keep_polling(self, c: Collector) -> None:
        failing: str | None = None  # the failure last logged, so a lasting one is logged once
        while not self._stop.is_set():
            self.polls[c.name] = self.polls.get(c.name, 0) + 1
            try:
                self.outbox.put(self._poll(c))
                if failing is not None:
                    log.info("%s: working again", c.name)
                    failing = None
            except Exception as e:
                self.poll_failures[c.name] = self.poll_failures.get(c.name, 0) + 1
                why = f"{type(e).__name__}: {e}"
                if why != failing:
                    log.exception("%s failed; trying again every %.1f s", c.name, max(c.every_s, 1.0))
                    failing = why
            self._stop.wait(c.every_s if failing is None else max(c.every_s, 1.0))  # a failure: not in a tight loop

    def _report(self) -> None:
        box = self.outbox
        log.info("agent stopped: %d messages sent, %d records lost%s", box.sent, box.dropped,
                 f"; a backlog stays in {box.spool_dir} for the next start" if box.backlog else "")
        if self.relay is not None:
            r = self.relay
            log.info("relay: %d records of the training processes in %d envelopes; %d refused (full or closing), "
                     "%d bad frames", r.records, r.envelopes, r.refused, r.bad_frames)


def metric_samples(agent: Agent) -> Iterator[metrics.Sample]:
    """What an `Agent` reports: its node, its collectors' polls and failures, its outbox's queue and delivery."""
    yield metrics.AGENT_INFO, (agent.settings.node,), 1
    for name, n in sorted(dict(agent.polls).items()):
        yield metrics.POLLS, (name,), n
    for name, n in sorted(dict(agent.poll_failures).items()):
        yield metrics.POLL_FAILURES, (name,), n
    box = agent.outbox
    yield metrics.QUEUE_DEPTH, ("outbox",), box.queue_depth
    yield metrics.DROPPED, (), box.dropped
    yield from metrics.delivery_samples(box.deliveries())
    relay = agent.relay
    if relay is not None:
        yield metrics.QUEUE_DEPTH, ("relay",), relay.queue_depth
        yield metrics.RELAY_RECORDS, ("accepted",), relay.records
        yield metrics.RELAY_RECORDS, ("refused",), relay.refused
        yield metrics.RELAY_BAD_FRAMES, (), relay.bad_frames
        yield metrics.RELAY_ENVELOPES, (), relay.envelopes
        yield metrics.RELAY_CLIENTS, (), relay.clients
