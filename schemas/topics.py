"""Kafka topics of gangwatch: names, partitions and keys (the wire contract's addresses).

Producers, the worker and the controllers all name topics from here; creating
and listing them on a broker is `gangwatch.streams.topic_admin`
(`gangwatch topics create --bootstrap 127.0.0.1:9092`, `gangwatch topics list`).

Inputs (every job-keyed topic has the same partition count, so one job's
records of every kind land on the same partition number: co-partitioned):

| topic             | kinds                                 | key  |
|-------------------|---------------------------------------|------|
| `gw.telemetry`    | step, heartbeat, framework            | job  |
| `gw.jobs`         | job                                   | job  |
| `gw.node-events`  | hw, gpu, and ops that name no job     | node |
| `gw.traces`       | stack, flight                         | job  |
| `gw.ops`          | ops (of a job), recovery              | job  |

Outputs, keyed by job: `gw.findings`, `gw.actions` (the alert topic the job
controller reads), `gw.incidents`; `gw.dlq` takes rejected messages (a JSON
object with the reason and where the message came from).

Internal (the worker's own): `gw.node-jobs` (compacted; node -> job, keyed by
node, co-partitioned with `gw.node-events`) and `gw.<app id>.by-job` (node
events re-keyed by their job, co-partitioned with the job-keyed inputs; one per
app id, `app`, so that workers of another app id never read them: `gw.by-job`
without one). The node -> job map is the same for every app reading the same
inputs, so they share it. Faust adds its table changelogs
(`<app id>-<table>-changelog`) itself.

Every setting can come from the environment: GANGWATCH_TOPIC_PREFIX (`gw.`),
GANGWATCH_TOPIC_PARTITIONS (8), GANGWATCH_TOPIC_REPLICATION (1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any

from gangwatch.schemas import Record


@dataclass(frozen=True)
class TopicSettings:
    """Topic names (`prefix` + a fixed suffix), partition count and replication of every gangwatch topic."""

    prefix: str = "gw."
    partitions: int = 8
    replication: int = 1
    app: str = ""  # the worker's app id: its own re-keying topic (`by_job`); "" outside a worker

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> TopicSettings:
        """Defaults, then GANGWATCH_TOPIC_<FIELD> variables, then GANGWATCH_TOPICS__<FIELD> (the settings
        object's names, `gangwatch.settings`), then explicit (non-None) overrides."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f"GANGWATCH_TOPICS__{f.name.upper()}") or env.get(f"GANGWATCH_TOPIC_{f.name.upper()}")
            if raw:
                values[f.name] = int(raw) if f.type in ("int", int) else raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)

    # --- names ------------------------------------------------------------------

    def name(self, suffix: str) -> str:
        return f"{self.prefix}{suffix}"

    @property
    def telemetry(self) -> str:
        return self.name("telemetry")

    @property
    def jobs(self) -> str:
        return self.name("jobs")

    @property
    def node_events(self) -> str:
        return self.name("node-events")

    @property
    def traces(self) -> str:
        return self.name("traces")

    @property
    def ops(self) -> str:
        return self.name("ops")

    @property
    def findings(self) -> str:
        return self.name("findings")

    @property
    def actions(self) -> str:
        return self.name("actions")

    @property
    def incidents(self) -> str:
        return self.name("incidents")

    @property
    def dlq(self) -> str:
        return self.name("dlq")

    @property
    def node_jobs(self) -> str:
        return self.name("node-jobs")

    @property
    def by_job(self) -> str:
        return self.name(f"{self.app}.by-job" if self.app else "by-job")

    # --- groups -----------------------------------------------------------------

    @property
    def job_inputs(self) -> tuple[str, ...]:
        """Input topics keyed by job (the worker's main agent reads these plus `by_job`)."""
        return (self.jobs, self.telemetry, self.traces, self.ops)

    @property
    def inputs(self) -> tuple[str, ...]:
        return (*self.job_inputs, self.node_events)

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.findings, self.actions, self.incidents, self.dlq)

    @property
    def internal(self) -> tuple[str, ...]:
        """The workers' own topics: the node -> job map, and an app's re-keying topic (with `app`)."""
        return (self.node_jobs, self.by_job) if self.app else (self.node_jobs,)

    def all(self) -> tuple[str, ...]:
        return (*self.inputs, *self.outputs, *self.internal)

    def configs(self, topic: str) -> dict[str, str]:
        """Topic configs beyond the broker defaults.

        Every topic takes messages as large as the contract allows (`GANGWATCH_MAX_MESSAGE_BYTES`, 16 MiB),
        not the broker's 1 MB default: the `job` record of a 100,000-rank job is 6.3 MB, and a node's batch
        envelope of stack dumps can be megabytes. (A topic that exists already keeps its own configs.)
        """
        from gangwatch.schemas.codec import MAX_MESSAGE_BYTES

        out = {"max.message.bytes": str(MAX_MESSAGE_BYTES)}
        if topic == self.node_jobs:
            out["cleanup.policy"] = "compact"
        return out


_BY_KIND = {
    "step": "telemetry", "heartbeat": "telemetry", "framework": "telemetry", "lifecycle": "telemetry",
    "job": "jobs", "hw": "node_events", "gpu": "node_events",
    "stack": "traces", "flight": "traces", "recovery": "ops",
    "finding": "findings", "action": "actions", "incident": "incidents",
}


def topic_for(rec: Record, settings: TopicSettings | None = None) -> tuple[str, str]:
    """Where a producer publishes `rec`: (topic, key). Keys are job ids, or node ids on `node-events`.

    An `ops` record that names a job goes to `ops` keyed by the job; one that names
    only a node (a cluster-wide maintenance of that node) is a node event.
    """
    s = settings or TopicSettings()
    kind = rec.kind
    if kind == "ops":
        return (s.ops, rec.job) if rec.job else (s.node_events, rec.node or "")
    attr = _BY_KIND.get(kind)
    if attr is None:
        raise ValueError(f"no topic for kind {kind!r}")
    return getattr(s, attr), (rec.node if attr == "node_events" else rec.job)
