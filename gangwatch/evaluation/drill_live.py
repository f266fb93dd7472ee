"""`gangwatch drill` on the real services: the drill's job (gangwatch.evaluation.drill) through a live pipeline.

    outcome = run(DrillSpec(job="drill-7", seed=7), Live(bootstrap="127.0.0.1:9092", speed=10), workdir)

What runs: topics of the drill's own (`gw.drill.<job>.`, deleted afterwards unless kept; with a prefix given,
its topics are used, or made, and kept), a `gangwatch worker` subprocess on them (a fresh app id, settings
passed through, `--store` when given), `gangwatch controller --simulate` (the controller's simulated mode,
answering from the drill's ground truth: `truth.json` in `workdir`, rewritten as the job saves checkpoints)
and, in this process, the feeder and the reader: the job's records are published (streams.publish.Publisher,
batched as sidecars send them) when the clock reaches their event time, and the actions, incidents and
recovery records read back are handed to the drill, which decides when episodes end.

Time: the clock is `control.simulated.EventClock` (wall time, or `speed` times as fast from the moment the
subprocesses were started, the same clock the controller answers on), so at `speed` 10 a minute of the job
takes 6 s. The job's event time then runs ahead of the wall clock; the worker is told to accept that
(`worker.max_future_s`). Subprocess logs: `workdir/worker.log`, `workdir/controller.log`.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from gangwatch.control.simulated import EventClock
from gangwatch.evaluation.drill import HOLD_S, Drill, DrillSpec, injections, truth_of
from gangwatch.schemas import DecodeError, decode
from gangwatch.schemas.security import kafka_python_security
from gangwatch.schemas.signature import SECRET_ENV
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.topic_admin import create_topics

STARTUP_S = 120.0  # wall seconds the worker and the controller get to join their groups


@dataclass(frozen=True)
class Live:
    """Where and how fast the drill runs."""

    bootstrap: str = "127.0.0.1:9092"
    store: str | None = None
    speed: float = 1.0
    prefix: str | None = None  # None: gw.drill.<job>. (the drill's own, deleted afterwards)
    keep_topics: bool = False
    settings: list[str] = field(default_factory=list)  # worker options passed through: --config F, --set K=V
    delays: dict[str, float] = field(default_factory=dict)  # the controller's: accept, replace, ckpt, ...


@dataclass
class Outcome:
    drill: Drill
    wall_s: float
    records: int  # sent
    dead_letters: list[str]  # reasons of what the worker refused (first few)
    timed_out: bool  # the wall-clock limit ended the drill before every injection had its outcome


class Child:
    """A gangwatch subprocess with its output in a log file; stopped with TERM, then KILL."""

    def __init__(self, name: str, args: list[str], log: Path, env: dict[str, str]) -> None:
        self.name, self.log = name, log
        self._fh = open(log, "ab")  # noqa: SIM115 - held for the child's life
        self.proc = subprocess.Popen([sys.executable, "-m", "gangwatch", *args], stdout=self._fh,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def check(self) -> None:
        """ConnectionError naming the log when the child exited."""
        if not self.alive():
            raise ConnectionError(f"the drill's {self.name} exited ({self.proc.returncode}): {self.tail()} "
                                  f"(log: {self.log})")

    def tail(self, n: int = 3) -> str:
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-n:])

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._fh.close()


def _write(path: Path, obj: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(obj))
    os.replace(tmp, path)


def wall_limit(spec: DrillSpec, speed: float) -> float:
    """Wall seconds after which the drill stops waiting: every injection given its lead, window and pause."""
    per = spec.lead_s + spec.window_s + spec.quiet_s + max(hi for _, hi in HOLD_S.values())
    return (spec.duration + spec.faults * per) / speed + 60.0


def _group_ready(admin, group: str) -> bool:
    """The consumer group is Stable with a member (kafka-python's description: a dict per group)."""
    info = admin.describe_groups([group]).get(group) or {}
    return info.get("group_state") == "Stable" and bool(info.get("members"))


def run(spec: DrillSpec, live: Live, workdir: Path, *, progress: Callable[[str], None] | None = None) -> Outcome:
    """Run the drill on the broker at `live.bootstrap`; what it saw comes back in `Outcome.drill`."""
    from kafka import KafkaConsumer, TopicPartition
    from kafka.admin import KafkaAdminClient

    from gangwatch.streams.file_publish import Publisher, kafka_send
    from gangwatch.streams.topic_admin import list_topics

    workdir.mkdir(parents=True, exist_ok=True)
    app = f"gangwatch-{spec.job}"
    prefix = live.prefix or f"gw.drill.{spec.job}."
    existing = list_topics(live.bootstrap, prefix)  # a prefix given may name topics that exist: as many partitions
    topics = TopicSettings(prefix=prefix, partitions=existing.get(f"{prefix}telemetry", 1), app=app)
    create_topics(topics, live.bootstrap)
    truth = workdir / "truth.json"
    planned = injections(spec)  # what the controller must know is broken: the plan's machines
    _write(truth, truth_of(spec, planned))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault(SECRET_ENV, secrets.token_hex(16))
    limit = wall_limit(spec, live.speed)
    clock = EventClock(live.speed)
    worker_args = ["worker", "--bootstrap", live.bootstrap, "--app-id", app, "--prefix", topics.prefix,
                   "--partitions", str(topics.partitions), "--table-store", "memory://", "--standby-replicas", "0",
                   "--offset-reset", "earliest", "--metrics-port", "0", "--session-timeout", "10",
                   "--heartbeat-interval", "1", "--commit-interval", "1",
                   "--datadir", str(workdir / "faust"), *live.settings,
                   *(["--store", live.store] if live.store else []),
                   *(["--set", f"worker.max_future_s={3600 + (live.speed - 1) * (limit + STARTUP_S):.0f}"]
                     if live.speed > 1 else [])]
    controller_args = ["controller", "--simulate", str(truth), "--job", spec.job, "--bootstrap", live.bootstrap,
                       "--prefix", topics.prefix, "--speed", f"{live.speed:g}", "--clock-origin", repr(clock.origin),
                       "--group", f"{app}-controller",
                       *(a for k, v in sorted(live.delays.items()) for a in (f"--{k}-delay", f"{v:g}"))]
    children = [Child("worker", worker_args, workdir / "worker.log", env),
                Child("controller", controller_args, workdir / "controller.log", env)]
    send, close_send = kafka_send(live.bootstrap)
    reader = KafkaConsumer(bootstrap_servers=live.bootstrap, group_id=None, enable_auto_commit=False,
                           fetch_max_wait_ms=20, **kafka_python_security())
    started = time.monotonic()
    dead: list[str] = []
    try:
        _await_ready(live.bootstrap, [app, f"{app}-controller"], children, KafkaAdminClient, progress)
        names = [topics.actions, topics.incidents, topics.ops, topics.dlq]
        tps = [TopicPartition(t, p) for t in names for p in sorted(reader.partitions_for_topic(t) or {0})]
        reader.assign(tps)
        reader.seek_to_beginning(*tps)
        drill = Drill(spec, round(clock(), 3))
        pub = Publisher(send, topics)
        shown, written, timed_out = 0.0, 0, False
        while not drill.finished:
            for rec in drill.due(clock()):
                pub.add(rec)
            pub.flush()
            if len(drill.checkpoints) != written:
                written = len(drill.checkpoints)
                _write(truth, truth_of(spec, planned, drill.checkpoints))
            for tp, msgs in reader.poll(timeout_ms=50).items():
                for m in msgs:
                    if tp.topic == topics.dlq:
                        dead.append(_dead_reason(m.value))
                        continue
                    for rec in decode(m.value):
                        if not isinstance(rec, DecodeError):
                            drill.observe(rec)
            for child in children:
                child.check()
            wall = time.monotonic() - started
            if wall > limit:
                timed_out = True
                break
            if progress is not None and wall - shown >= 5.0:
                shown = wall
                ep = drill.episode
                progress(f"job time +{clock() - drill.start_ts:.0f} s: event {drill.done + 1} of "
                         f"{spec.faults} ({ep.injection.kind}), {pub.result.records:,} records sent, "
                         f"{len(drill.seen.incidents)} incidents, {len(drill.seen.actions)} actions")
        settle = time.monotonic() + 2.0  # the last incident updates and answers in flight
        while time.monotonic() < settle:
            for msgs in reader.poll(timeout_ms=100).values():
                for m in msgs:
                    for rec in decode(m.value):
                        if not isinstance(rec, DecodeError):
                            drill.observe(rec)
        return Outcome(drill, time.monotonic() - started, pub.result.records, dead[:5], timed_out)
    finally:
        for child in reversed(children):
            child.stop()
        reader.close()
        close_send()
        if not live.keep_topics:
            _delete_topics(live.bootstrap, [topics.by_job, *([topics.prefix] if live.prefix is None else [])], app,
                           KafkaAdminClient)


def _await_ready(bootstrap: str, groups: list[str], children: list[Child], admin_cls, progress) -> None:
    """Wait until the worker and the controller have joined their groups (nothing they must see is sent before)."""
    admin = admin_cls(bootstrap_servers=bootstrap, client_id="gangwatch-drill", **kafka_python_security())
    try:
        deadline = time.monotonic() + STARTUP_S
        if progress is not None:
            progress("starting the worker and the controller ...")
        while not all(_group_ready(admin, g) for g in groups):
            for child in children:
                child.check()
            if time.monotonic() > deadline:
                raise ConnectionError(f"the drill's worker and controller did not join their consumer groups "
                                      f"within {STARTUP_S:g} s (logs: {', '.join(str(c.log) for c in children)})")
            time.sleep(0.5)
    finally:
        admin.close()


def _dead_reason(value: bytes) -> str:
    try:
        return str(orjson.loads(value).get("reason", ""))[:200]
    except (orjson.JSONDecodeError, AttributeError):
        return "(not JSON)"


def _delete_topics(bootstrap: str, starts: list[str], app: str, admin_cls) -> None:
    """Topics whose names start with one of `starts`, and the drill's worker's own (`<app id>-...`: its table
    changelogs); what cannot be deleted now stays (harmless: nothing reads them)."""
    from kafka.errors import KafkaError

    admin = admin_cls(bootstrap_servers=bootstrap, client_id="gangwatch-drill", **kafka_python_security())
    try:
        mine = [t for t in admin.list_topics() if t.startswith((*starts, f"{app}-"))]
        if mine:
            admin.delete_topics(mine)
    except KafkaError:
        pass
    finally:
        admin.close()
