"""Helpers for tests and benchmarks that run the Faust worker against the real broker.

- `scenario()`: a small job as contract records (a node goes silent, another gets a fatal Xid).
- `messages()`: records packed into Kafka messages the way sidecars publish them (`topic_for`).
- `WorkerProc`: `gangwatch worker` in a subprocess, with test settings; stop = TERM, wait, KILL.
- `read_all()` / `wait_for()`: read topics from the beginning (no consumer group), poll to a condition.
- `caught_up()`: has a consumer group committed every message of some topics (now, or as they stood)?
- `PrivateBroker`: a broker of one test's own (deploy/kafka/broker.sh on free ports), which it may kill.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gangwatch.schemas import Heartbeat, Hw, Job, RankInfo, Record, Step, encode, encode_batch
from gangwatch.schemas.topics import TopicSettings, topic_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient

from tests.integration.daemons import Pki, free_port

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000.0


def scenario(*, nodes: int = 4, per_node: int = 4, seconds: int = 40, hb: float = 1.0, silent: str | None = "n001",
             silent_at: float = 20.0, xid_node: str | None = "n002", xid_at: float = 30.5,
             job: str = "j1") -> list[Record]:
    """Records of one synchronous job in event-time order, every timestamp distinct.

    Every rank heartbeats and steps once per `hb`; from `silent_at` the ranks of node
    `silent` send nothing (and everybody else stops stepping: the collective stalls, but
    heartbeats go on); at `xid_at` node `xid_node` reports a fatal Xid 79.
    """
    n = nodes * per_node
    recs: list[Record] = [Job(ts=T0, job=job, heartbeat_s=hb, ranks=[
        RankInfo(rank=i * per_node + g, node=f"n{i:03d}", gpu=g, tp=g, pp=0, dp=i)
        for i in range(nodes) for g in range(per_node)])]
    for k in range(1, int(seconds / hb) + 1):
        t = T0 + k * hb
        stalled = silent is not None and k * hb >= silent_at
        for r in range(n):
            if silent is not None and f"n{r // per_node:03d}" == silent and k * hb >= silent_at:
                continue
            if not stalled:
                recs.append(Step(ts=t + 0.001 * r, job=job, rank=r, step=k, step_s=hb, compute_s=0.6 * hb,
                                 comm_wait_s=0.35 * hb, data_wait_s=0.01))
            recs.append(Heartbeat(ts=t + 0.001 * r + 0.0005, job=job, rank=r, step=k if not stalled else None))
    if xid_node is not None:
        recs.append(Hw(ts=T0 + xid_at + 0.0007, node=xid_node, gpu=1, source="xid", code=79,
                       message="NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."))
    recs.sort(key=lambda r: r.ts)
    return recs


def messages(recs: Iterable[Record], topics: TopicSettings, *, batch: int = 16) -> list[tuple[str, bytes, bytes]]:
    """(topic, key, value) in record order; consecutive records of one topic and key share a batch message."""
    out: list[tuple[str, bytes, bytes]] = []
    group: list[Record] = []
    where: tuple[str, str] | None = None

    def flush() -> None:
        if group:
            value = encode(group[0]) if len(group) == 1 else encode_batch(group, group[0].ts)
            out.append((where[0], where[1].encode(), value))
            group.clear()

    for rec in recs:
        dest = topic_for(rec, topics)
        if dest != where or len(group) >= batch:
            flush()
            where = dest
        group.append(rec)
    flush()
    return out


def write_jsonl(path: Path, msgs: list[tuple[str, bytes, bytes]]) -> Path:
    path.write_bytes(b"".join(v + b"\n" for _, _, v in msgs))
    return path


def produce(bootstrap: str, msgs: Iterable[tuple[str, bytes, bytes]]) -> int:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_request_size=16 * 1024 * 1024)
    n = 0
    for topic, key, value in msgs:
        producer.send(topic, key=key, value=value)
        n += 1
    producer.flush()
    producer.close()
    return n


def worker_args(bootstrap: str, app_id: str, topics: TopicSettings, *extra: str) -> list[str]:
    """`gangwatch worker` with the fast test settings (docs/design.md, "Running the real services").

    No metrics endpoint (`--metrics-port 0`): tests run several workers on one host, and the
    default port is fixed; a test that wants one passes `--metrics-port P` in `extra` (the last wins).
    """
    return [sys.executable, "-m", "gangwatch", "worker", "--bootstrap", bootstrap, "--app-id", app_id,
            "--prefix", topics.prefix, "--partitions", str(topics.partitions), "--session-timeout", "6",
            "--heartbeat-interval", "1", "--request-timeout", "20", "--standby-replicas", "0",
            "--table-store", "memory://", "--offset-reset", "earliest", "--commit-interval", "0.5",
            "--metrics-port", "0", *extra]


class WorkerProc:
    """One worker subprocess; its output goes to `log` (read it when a test fails)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None, checkout: Path = REPO) -> None:
        """`checkout`: the code the worker runs (another checkout's, as a benchmark's baseline; its own venv's
        python in `args`)."""
        self.log = log
        self._fh = open(log, "ab")
        full_env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(args, cwd=checkout, stdout=self._fh, stderr=subprocess.STDOUT, env=full_env,
                                     start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 20.0) -> int | None:
        """TERM, wait, then KILL."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._fh.close()
        return self.proc.returncode

    def kill(self) -> None:
        """Die at once, like a crashed machine (no commit, no goodbye to the group)."""
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)
        self._fh.close()

    def tail(self, n: int = 60) -> str:
        lines = self.log.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def consume(bootstrap: str, topic: str, group: str, n: int, timeout_ms: int = 15_000) -> list:
    """The first `n` messages of `topic` read through consumer group `group` (fewer if the timeout passes)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             consumer_timeout_ms=timeout_ms, enable_auto_commit=False)
    got = []
    for msg in consumer:
        got.append(msg)
        if len(got) == n:
            break
    consumer.close()
    return got


def read_all(bootstrap: str, topics: Iterable[str], *, timestamps: bool = False,
             security: dict[str, Any] | None = None) -> dict[str, list[tuple[Any, bytes]]]:
    """Every message now in `topics`, per topic, in partition order (no consumer group): (key, value), or with
    `timestamps` (the message's timestamp in epoch seconds: when its producer sent it, value). `security`:
    kafka-python's SASL/SSL arguments (`KafkaSecurity.kafka_python()`)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                             **(security or {}))
    try:
        tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        end = consumer.end_offsets(tps)
        got: dict[TopicPartition, list] = {tp: [] for tp in tps}
        deadline = time.monotonic() + 30
        while any(consumer.position(tp) < end[tp] for tp in tps) and time.monotonic() < deadline:
            for tp, msgs in consumer.poll(timeout_ms=200).items():
                got[tp] += [(m.timestamp / 1000.0 if timestamps else m.key, m.value) for m in msgs]
        out: dict[str, list] = {t: [] for t in topics}
        for tp in tps:
            out[tp.topic] += got[tp]
        return out
    finally:
        consumer.close()


def wait_for(cond: Callable[[], bool], timeout: float, what: str, every: float = 0.25,
             proc: WorkerProc | None = None) -> None:
    """Poll `cond` until true; fail with `what` (and the worker's log tail, and what `caught_up` last found
    behind) at the deadline."""
    deadline = time.monotonic() + timeout
    BEHIND.clear()
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and not proc.alive():
            raise AssertionError(f"worker exited ({proc.proc.returncode}) while waiting for {what}:\n{proc.tail()}")
        time.sleep(every)
    tail = f"\n--- worker log ---\n{proc.tail()}" if proc is not None else ""
    behind = f"\nnot committed to the end (committed, end): {BEHIND}" if BEHIND else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{behind}{tail}")


BEHIND: dict[str, tuple[int | None, int]] = {}  # "topic:partition" -> (committed, end), as `caught_up` last saw


def end_offsets(bootstrap: str, topics: Iterable[str]) -> dict[TopicPartition, int]:
    """Each partition's end offset of `topics` now."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    try:
        return consumer.end_offsets([TopicPartition(t, p) for t in topics
                                     for p in sorted(consumer.partitions_for_topic(t) or ())])
    finally:
        consumer.close()


def caught_up(bootstrap: str, group: str, topics: Iterable[str],
              to: dict[TopicPartition, int] | None = None) -> bool:
    """Has `group` committed every message now in `topics` (with `to`, from `end_offsets`: every message that
    was there then; a job still running keeps writing, and its newest records are always a batch away)?"""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    try:
        tps = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        end = consumer.end_offsets(tps) if to is None else {tp: to.get(tp, 0) for tp in tps}
        committed = admin.list_group_offsets(group).get(group, {})
        BEHIND.clear()
        for tp in tps:
            if end[tp] == 0:
                continue
            off = committed.get(tp)
            pos = getattr(off, "offset", off)
            if pos is None or pos < end[tp]:
                BEHIND[f"{tp.topic}:{tp.partition}"] = (pos, end[tp])
        return not BEHIND
    finally:
        consumer.close()
        admin.close()


def group_members(bootstrap: str, group: str) -> int:
    """Members of a consumer group that is Stable (0 while it is rebalancing or absent)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        info = admin.describe_groups([group]).get(group, {})
        return len(info.get("members") or []) if info.get("group_state") == "Stable" else 0
    finally:
        admin.close()


def assignments(bootstrap: str, group: str) -> dict[int, set[tuple[str, int]]]:
    """Per worker process (its pid, from the client id `gangwatch-HOST-PID` each worker gives itself), the
    (topic, partition)s the group gave it; {} while the group is not Stable."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        info = admin.describe_groups([group]).get(group, {})
        if info.get("group_state") != "Stable":
            return {}
        out: dict[int, set[tuple[str, int]]] = {}
        for m in info.get("members") or []:
            pid = int(str(m["client_id"]).rsplit("-", 1)[1])
            got = (m.get("member_assignment") or {}).get("assigned_partitions") or []
            out[pid] = {(a["topic"], p) for a in got for p in a["partitions"]}
        return out
    finally:
        admin.close()


class PrivateBroker:
    """A real broker for one test (deploy/kafka/broker.sh, its own ports and directory), to kill and restart.

    The shared broker of the session must never go down; this one may: `kill()` is SIGKILL (no clean
    shutdown, as a crashed machine), `start()` again recovers its data.
    """

    def __init__(self, workdir: Path, *, sasl_ssl: tuple[Pki, dict[str, str]] | None = None) -> None:
        """`sasl_ssl`: (certificates, SASL PLAIN users and passwords) for a second listener, SASL_SSL on
        `secure_port` (`secure_bootstrap`); the PLAINTEXT one stays for the broker's own readiness probe."""
        self.port = free_port()
        self.dir = workdir / "kafka"
        controller = free_port()
        self.env = {**os.environ, "GANGWATCH_KAFKA_PORT": str(self.port),
                    "GANGWATCH_KAFKA_CONTROLLER_PORT": str(controller),
                    "GANGWATCH_KAFKA_DIR": str(self.dir), "GANGWATCH_KAFKA_HEAP_OPTS": "-Xms128m -Xmx512m",
                    "PYTHON": sys.executable}
        self.secure_port: int | None = None
        if sasl_ssl is not None:
            pki, users = sasl_ssl
            self.secure_port = free_port()
            ports = f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{controller}," \
                    f"SASL_SSL://127.0.0.1:{self.secure_port}"
            plain = " ".join(f'user_{u}="{pw}"' for u, pw in users.items())
            extra = workdir / "kafka-sasl-ssl.properties"
            extra.write_text("\n".join([
                f"listeners={ports}", f"advertised.listeners={ports}",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL",
                "sasl.enabled.mechanisms=PLAIN",
                f"listener.name.sasl_ssl.plain.sasl.jaas.config="
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain};",
                "ssl.keystore.type=PEM", f"ssl.keystore.location={pki.keystore}", ""]))
            self.env["GANGWATCH_KAFKA_EXTRA_CONFIG"] = str(extra)

    @property
    def secure_bootstrap(self) -> str:
        assert self.secure_port is not None, "a broker made without sasl_ssl"
        return f"127.0.0.1:{self.secure_port}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self, command: str) -> None:
        done = subprocess.run([str(REPO / "deploy" / "kafka" / "broker.sh"), command], env=self.env,
                              capture_output=True, text=True, timeout=240)
        if done.returncode != 0:
            raise RuntimeError(f"broker.sh {command} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def start(self) -> None:
        self._run("start")

    def kill(self) -> None:
        pid = int((self.dir / "broker.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the broker (pid {pid}) survived SIGKILL for 10 s")

    def stop(self) -> None:
        self._run("stop")
