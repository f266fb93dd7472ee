"""The worker's settings: what `gangwatch worker` runs with, filled by `gangwatch.settings` (flags, variables, TOML).

A plain dataclass beside the worker, importing neither Faust nor the core: `gangwatch config show` and `--help`
read its fields and defaults without loading what the worker runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gangwatch.schemas.topics import TopicSettings
from gangwatch.triage.budgets import CoreConfig


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
    hold_s: float = 30.0  # how long a node event waits for the map of its node to a job
    job_hold_s: float = 600.0  # how long a job's records wait for its job record (a start-up at scale takes minutes;
    # at least twice the longest wait the worker has seen)
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
    max_future_s: float = 3600.0  # a record this far ahead of the worker's clock is dead-lettered (a clock that
    # wrong is no clock; smaller skews are the job's clocks detector's: learned and corrected)
    stats_every_s: float = 10.0  # log a progress line this often (0: never)
    metrics_port: int = 9464  # serve Prometheus metrics on this port; 0: no endpoint
    sink_queue: int = 100_000  # records each sink's delivery queue holds; what finds it full is dead-lettered
    sink_pause_s: float = 5.0  # the longest the jobs agent holds its input for a sink's backlog, per episode
    sink_give_up_s: float = 600.0  # a delivery failing (transiently) this long becomes dead letters
    core: CoreConfig | None = None  # detectors' thresholds and triage (None: defaults); lateness_s above wins

    @property
    def own_topics(self) -> TopicSettings:
        """`topics` with this app's own internal topics (its `by-job`: another app id never reads it)."""
        return replace(self.topics, app=self.app_id)
