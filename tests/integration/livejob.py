"""A real training job watched live, for the integration tests and the benchmark.

    with LiveJob(bootstrap, topics, ("127.0.0.1", 9000), workdir, job="t1", fault=Fault("kill", step=60)) as live:
        live.start(steps=3000)
        inc = live.wait_incident(timeout=420)   # closed, from gw_incidents FINAL in ClickHouse
        print(live.stages(inc))                 # detect, localize, decide, recover, first_step

What runs, each a subprocess of its own (logs in `workdir`):
- `gangwatch worker` on the real broker, writing to the ClickHouse server (a
  database named after the job), with the silence timer on: a node that stops
  heartbeating is noticed in wall-clock time;
- `gangwatch agent` per node name (the job's two and the spare), answering
  `collect_stacks` with real py-spy dumps;
- `gangwatch controller` (control/controller.py) driving examples/tiny_job/train.py:
  two simulated nodes of two ranks each (gloo on CPU), spare n3, checkpoints
  every 10 steps; the fault travels to the ranks in their environment. It reads
  actions from the alert topic, or with `webhook=True` receives them as signed
  POSTs from the worker (findings, which name a rollback's first corrupt step,
  it always reads from their topic).

Everything is stopped at exit, the job's processes included: the controller
stops its job; whatever it left (a controller that died cannot) is killed from
the process tree recorded while waiting.

The same run, replayed: `replayed()` reads every input topic from the start
(what the trainers, the agents and the controller sent), in event time, plus
one record of another job stamped now (replay has no wall clock: it moves
every job's time to where the worker's silence timer had it), through
`gangwatch replay`'s code, and `outcome()` puts live and replayed outputs in
the same terms (action types and nodes, incident classes and culprits) to be
compared.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gangwatch.control.launcher import checkpoints, descendants, free_port, process_start
from gangwatch.producers.simulate.responder import SimulatedController, answers
from gangwatch.schemas import Action, DecodeError, Incident, Job, RankInfo, decode, encode
from gangwatch.schemas.signature import SECRET_ENV
from gangwatch.schemas.topics import TopicSettings
from gangwatch.sinks.store import ClickHouseStore

from tests.integration.daemons import metric_samples
from tests.integration.kafkakit import REPO, WorkerProc, caught_up, end_offsets, read_all, worker_args

TRAIN = REPO / "examples" / "tiny_job" / "train.py"
NODES, SPARES = ("n1", "n2"), ("n3",)
CKPT_EVERY = 10
# the five durations reported per fault, from the incident's stages (triage/incident.py): recover is
# decided -> the first collective of the restarted job; first_step is that -> its first step done
FIVE = ("detect", "localize", "decide", "recover", "first_step")
RECOVER_STAGES = ("replace", "rollback", "comm_rebuild")


EVICTING = frozenset({"replace", "evict_group", "isolate", "requeue"})  # with nodes: they take nodes out
RESTARTING = frozenset({"restart_in_process", "requeue"})  # without nodes: the job restarts where it is


@dataclass(frozen=True)
class Fault:
    """A fault of examples/tiny_job/train.py: `kind` on `node`'s local rank 0 from `step` on (`rank`: on that
    global rank instead, wherever it runs: a code bug; a pause is every rank's)."""

    kind: str
    step: int
    node: str = "n2"
    rank: int | None = None

    def env(self) -> dict[str, str]:
        env = {"FAULT": self.kind, "FAULT_NODE": self.node, "FAULT_STEP": str(self.step), "FAULT_LOCAL_RANK": "0"}
        if self.rank is not None:
            env["FAULT_RANK"] = str(self.rank)
        return env


@dataclass(frozen=True)
class Outcome:
    """What gangwatch did about a run, ids and times aside: pages (escalate: nodes), evictions (type: nodes),
    restarts (type), incidents (class: culprit nodes), each sorted."""

    pages: tuple[tuple[str, ...], ...]
    evictions: tuple[tuple[str, tuple[str, ...]], ...]
    restarts: tuple[str, ...]
    incidents: tuple[tuple[str, tuple[str, ...]], ...]
    others: tuple[str, ...]  # every other action type (collect_stacks, degrade, ...)


def outcome(actions: list[dict], incidents: list[dict]) -> Outcome:
    """`actions` (one per id) and `incidents` (the latest of each id) as live (ClickHouse) or replay (JSONL) give
    them."""
    pages, evictions, restarts, others = [], [], [], []
    for a in actions:
        nodes = tuple(a.get("nodes") or ())
        if a["type"] == "escalate":
            pages.append(nodes)
        elif a["type"] in EVICTING and nodes:
            evictions.append((a["type"], nodes))
        elif a["type"] in RESTARTING:
            restarts.append(a["type"])
        else:
            others.append(a["type"])
    incs = [(i["class"], tuple(i.get("culprit_nodes") or ())) for i in incidents]
    return Outcome(tuple(sorted(pages)), tuple(sorted(evictions)), tuple(sorted(restarts)), tuple(sorted(incs)),
                   tuple(sorted(others)))


class LiveJob:
    def __init__(self, bootstrap: str, topics: TopicSettings, clickhouse: tuple[str, int], workdir: Path, *,
                 job: str, fault: Fault | None = None, webhook: bool = False,
                 worker_extra: tuple[str, ...] = (), nodes: tuple[str, ...] = NODES,
                 spares: tuple[str, ...] = SPARES, nproc: int = 2, fault_env: dict[str, str] | None = None,
                 controller_extra: tuple[str, ...] = (), relay: bool = False) -> None:
        """`nodes` the job runs on, `nproc` ranks each, `spares` for the controller; `fault_env`: more of
        train.py's fault variables (FAULT_LATE_NODE, ...) beside `fault`'s; `controller_extra`: more options of
        `gangwatch controller` (--replay-timeout, ...); `relay`: the ranks hand their records to their node's
        agent (GANGWATCH_RELAY), as in production, instead of sending them to Kafka themselves."""
        self.bootstrap, self.topics, self.workdir, self.job, self.fault = bootstrap, topics, workdir, job, fault
        self.job_nodes, self.spare_nodes, self.nproc, self.fault_env = nodes, spares, nproc, fault_env or {}
        self.controller_extra, self.relay = controller_extra, relay
        self.webhook, self.worker_extra = webhook, worker_extra
        # every process of this job (the agents, the controller and the ranks it starts) gets a temp dir of its own:
        # the agents' relay sockets (`<temp dir>/gangwatch-agent/<node>.sock`) are then this job's alone, though
        # jobs running beside it name their nodes alike (short: a socket's path has at most 107 bytes)
        self.tmp = Path(tempfile.mkdtemp(prefix="gwlive"))
        self.host, self.port = clickhouse
        self.store = ClickHouseStore(self.host, self.port, database=job)  # creates the database
        self.store.create_tables()  # the worker creates them too; here they exist before the first query
        self.procs: dict[str, WorkerProc] = {}
        self.ended: set[str] = set()  # processes that finished as the test expected (their exit is no failure)
        self.family: set[tuple[int, int]] = set()  # (pid, start) of every process the controller started
        self.state = workdir / "controller"
        self.ckpt = workdir / "ckpt"
        self._listen, self._secret = "", {}  # the controller's webhook address and secret (with `webhook`)
        self.agent_ports: dict[str, int] = {}  # node -> its agent's metrics port

    # --- running --------------------------------------------------------------------------------

    def start(self, steps: int, *train_args: str) -> None:
        """The worker, the agents, then the controller with the job (`steps` steps, then it ends)."""
        self.start_watching()
        self.start_controller(steps, *train_args)

    def start_watching(self) -> None:
        """The worker and the agents: what watches the job, with or without the controller."""
        url = f"clickhouse://{self.host}:{self.port}/{self.job}"
        # actions reach the controller on the alert topic, or POSTed by the worker to the controller's webhook
        self._listen = f"127.0.0.1:{free_port('127.0.0.1')}" if self.webhook else ""
        webhook = ("--webhook", f"http://{self._listen}/actions") if self._listen else ()
        self._secret = {SECRET_ENV: f"secret-of-{self.job}"}  # signs the actions, on the topic as in a POST
        self._spawn("worker", worker_args(self.bootstrap, self.job, self.topics, "--store", url, *webhook,
                                              *self.worker_extra), env=self._secret)
        for node in (*self.job_nodes, *self.spare_nodes):
            self.agent_ports[node] = free_port("127.0.0.1")
            self._spawn(f"agent-{node}", self._gangwatch("agent", "--node", node, "--kmsg", "off", "--gpu-every", "0",
                                                         "--spool-dir", str(self.workdir / f"spool-{node}"),
                                                         "--metrics-port", str(self.agent_ports[node])),
                        env=self._secret)  # stack sweeps only when signed with it

    def start_controller(self, steps: int, *train_args: str) -> None:
        """The controller with the job (again, after `stop_controller`: the same job id, state and checkpoints)."""
        listen = self._listen
        self.ended.discard("controller")
        self._spawn("controller", self._gangwatch(
            "controller", "--job", self.job, "--nodes", ",".join(self.job_nodes),
            "--spares", ",".join(self.spare_nodes), "--nproc-per-node", str(self.nproc),
            "--ckpt-dir", str(self.ckpt), "--state-dir", str(self.state), *(("--listen", listen) if listen else ()),
            *self.controller_extra, "--", str(TRAIN), "--steps", str(steps), "--ckpt-every", str(CKPT_EVERY),
            *train_args),
            env={**self._job_env(), **self._secret})

    def _job_env(self) -> dict[str, str]:
        """The job's environment beside the controller's: the fault's variables, and the relay's path. The agents
        listen at their default, `<temp dir>/gangwatch-agent/<node>.sock`, in this job's own temp dir."""
        relay = {"GANGWATCH_RELAY": str(self.tmp / "gangwatch-agent" / "{node}.sock")} if self.relay else {}
        return {**(self.fault.env() if self.fault else {}), **self.fault_env, **relay}

    def relayed(self, node: str) -> float:
        """Records of the training processes the agent of `node` took on its relay (its metrics endpoint)."""
        return sum(s.value for s in metric_samples(self.agent_ports[node])
                   if s.name == "gangwatch_agent_relay_records_total" and s.labels.get("outcome") == "accepted")

    def stop_controller(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> float:
        """A user stops the controller (and with it the job) with `sig`; returns when it had exited (epoch s)."""
        controller = self.procs["controller"]
        self._record_family()
        controller.proc.send_signal(sig)
        self.wait(lambda: not controller.alive(), timeout, "the stopped controller to exit", until_exit="controller")
        if controller.proc.returncode != 0:
            raise AssertionError(f"the stopped controller failed ({controller.proc.returncode})\n{self.logs()}")
        controller.stop()  # (closes its log)
        self.ended.add("controller")
        return time.time()

    def torchrun(self, steps: int, *train_args: str, timeout: float = 400.0) -> float:
        """The job without the controller: one torchrun per node, started as a user would, run to its end (each
        exits 0); returns when it ended (epoch s)."""
        from gangwatch.control.launcher import Gang, JobSpec

        spec = JobSpec(job=self.job, command=[str(TRAIN), "--steps", str(steps), "--ckpt-every", str(CKPT_EVERY),
                                              *train_args],
                       ckpt_dir=self.ckpt, run_dir=self.state / "runs",
                       env={"GANGWATCH_BOOTSTRAP": self.bootstrap, "GANGWATCH_TOPIC_PREFIX": self.topics.prefix,
                            "PYTHONPATH": str(REPO), **self._job_env()}, nproc_per_node=self.nproc)
        gang = Gang(spec, self.job_nodes, None, 0)
        gang.start()
        try:
            self.wait(lambda: not gang.running(), timeout, "the torchrun job to end")
        finally:
            gang.stop(10.0)
        codes = gang.returncodes()
        assert set(codes.values()) == {0}, f"torchrun exited {codes}\n{self.logs()}"
        return time.time()

    def _gangwatch(self, command: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "gangwatch", command, "--bootstrap", self.bootstrap, "--prefix",
                self.topics.prefix, *args]

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        env = {"TMPDIR": str(self.tmp), **(env or {})}
        self.procs[name] = WorkerProc(args, self.workdir / f"{name}.log", env=env)

    def wait(self, cond: Callable[[], bool], timeout: float, what: str, *, until_exit: str | None = None) -> None:
        """Poll `cond` until true; fail with the logs when a process dies (other than `until_exit`) or time is up."""
        deadline = time.monotonic() + timeout
        while True:
            self._record_family()
            if cond():
                return
            for name, p in self.procs.items():
                if name != until_exit and name not in self.ended and not p.alive():
                    raise AssertionError(f"{name} exited ({p.proc.returncode}) waiting for {what}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.progress()}\n"
                                     f"{self.logs()}")
            time.sleep(1.0)

    def run_to_end(self, timeout: float) -> float:
        """Wait for the job to finish (the controller exits 0 once every rank exited 0); returns when (epoch s)."""
        controller = self.procs["controller"]
        self.wait(lambda: not controller.alive(), timeout, "the job to finish", until_exit="controller")
        if controller.proc.returncode != 0:
            raise AssertionError(f"the controller failed ({controller.proc.returncode})\n{self.logs()}")
        self.ended.add("controller")  # later waits (for the worker to catch up) do not count its exit as a failure
        return time.time()

    def _record_family(self) -> None:
        c = self.procs.get("controller")
        if c is not None and c.alive():
            self.family.update(descendants(c.proc.pid))

    def progress(self) -> str:
        """Where the job got to (each attempt's last milestones) and what gangwatch found so far: what a timed-out
        wait needs to tell a job too slow to reach its fault from a fault nobody saw."""
        out = []
        for path in sorted(self.state.glob("runs/attempt-*/progress.jsonl")):
            lines = path.read_text(errors="replace").splitlines()
            out.append(f"--- {path.parent.name}: {len(lines)} milestones, the last: {lines[-3:]}")
        try:
            found = [(round(f["ts"], 3), f["type"], f["detector"], f["node"], f["rank"]) for f in self.findings()]
        except Exception as e:  # noqa: BLE001 - a diagnosis must not hide the failure it explains
            found = [f"(findings unreadable: {e})"]
        out.append(f"--- findings ({len(found)}), the last 20: {found[-20:]}")
        return "\n".join(out)

    def logs(self, n: int = 25) -> str:
        out = [f"--- {name} ---\n{p.tail(n)}" for name, p in self.procs.items()]
        for log in sorted(self.state.glob("runs/attempt-*/*.log")):
            lines = log.read_text(errors="replace").splitlines()
            out.append(f"--- {log.relative_to(self.workdir)} ---\n" + "\n".join(lines[-n:]))
        return "\n".join(out)

    def stop(self) -> None:
        """Stop the controller (and with it the job), the agents and the worker; kill what the job left."""
        self._record_family()
        controller = self.procs.get("controller")
        if controller is not None:
            controller.stop(timeout=60)
        for pid, start in self.family:
            if process_start(pid) == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for name, p in self.procs.items():
            if name != "controller":
                p.stop()
        self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> LiveJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what happened --------------------------------------------------------------------------

    def query(self, sql: str) -> list[dict]:
        return self.store.query(sql)

    def incidents(self) -> list[dict]:
        return self.query("SELECT * FROM gw_incidents FINAL ORDER BY onset_ts")

    def actions(self) -> list[dict]:
        return self.query("SELECT ts, type, nodes, incident FROM gw_actions FINAL ORDER BY ts, type")

    def findings(self) -> list[dict]:
        return self.query("SELECT ts, type, detector, rank, node, evidence FROM gw_findings FINAL ORDER BY ts")

    def wait_incident(self, cls: str, timeout: float) -> dict:
        """The first incident of class `cls`, once it is closed (recovered)."""
        def closed() -> list[dict]:
            return [i for i in self.incidents() if i["class"] == cls and i["recovered_ts"] is not None]

        self.wait(lambda: bool(closed()), timeout, f"a recovered {cls} incident in gw_incidents")
        return closed()[0]

    def attempts(self) -> int:
        """Launches of the job so far (the controller's and `torchrun`'s)."""
        return len(list((self.state / "runs").glob("attempt-*")))

    def outcome(self) -> Outcome:
        """What the worker did about the run, from ClickHouse."""
        return outcome(self.query("SELECT type, nodes FROM gw_actions FINAL"),
                       self.query("SELECT class, culprit_nodes FROM gw_incidents FINAL"))

    def caught_up(self, timeout: float = 180.0) -> None:
        """Wait for the worker to have read (and committed) every input on the topics now (a job still training
        keeps writing: what it writes after this call is not waited for)."""
        now = end_offsets(self.bootstrap, self.topics.job_inputs)
        self.wait(lambda: caught_up(self.bootstrap, self.job, self.topics.job_inputs, to=now), timeout,
                  "the worker to read every input")

    def inputs(self, order: str = "event") -> list:
        """Every input record on the topics so far (batches unpacked), in event time; `order="arrival"`: in the
        order their messages were sent (the messages' timestamps, across topics; a message's records in its own
        order), as the worker may read them."""
        sent = []
        for msgs in read_all(self.bootstrap, self.topics.inputs, timestamps=True).values():
            sent += [(at, [r for r in decode(value) if not isinstance(r, DecodeError)]) for at, value in msgs]
        if order == "arrival":
            sent.sort(key=lambda m: m[0])  # (stable: each partition's messages stay in their order)
            return [r for _, recs in sent for r in recs]
        return sorted((r for _, recs in sent for r in recs), key=lambda r: r.ts)

    def delivery_delays(self, rank: int) -> list[float]:
        """For each input record of `rank`, how long after its event time its message was sent to the broker."""
        out = []
        for msgs in read_all(self.bootstrap, self.topics.inputs, timestamps=True).values():
            for sent, value in msgs:
                out += [sent - r.ts for r in decode(value) if not isinstance(r, DecodeError) and
                        getattr(r, "rank", None) == rank]
        return out

    def crashes(self, rank: int) -> list:
        """The uncaught exceptions `rank` reported so far (framework records of type `exception`)."""
        return [r for r in self.inputs() if r.kind == "framework" and r.type == "exception" and r.rank == rank]

    def action_records(self) -> list[Action]:
        """Every action on the alert topic (with its `extra`: a replay's groups, ...), in time order."""
        recs = [r for _, value in read_all(self.bootstrap, [self.topics.actions])[self.topics.actions]
                for r in decode(value) if isinstance(r, Action) and r.job == self.job]
        return sorted({r.id: r for r in recs}.values(), key=lambda a: a.ts)

    def incident_records(self) -> list[Incident]:
        """The newest record of each incident on the incidents topic (with its `extra`: rungs, proof, ...)."""
        newest: dict[str, Incident] = {}
        for _, value in read_all(self.bootstrap, [self.topics.incidents])[self.topics.incidents]:
            for r in decode(value):
                if isinstance(r, Incident) and r.job == self.job:
                    newest[r.id] = r
        return sorted(newest.values(), key=lambda i: i.onset_ts or 0.0)

    def replayed(self, controller: SimulatedController | None = None, order: str = "event") -> Outcome:
        """The run's inputs replayed (see the module's docstring), up to now, sorted by event time or (`order=
        "arrival"`) as their messages were sent. With a simulated `controller`, the answers of active diagnosis
        (replay and dual-run results) are its own instead of the recorded ones."""
        from gangwatch.streams import replay
        from gangwatch.triage.core import Core

        # each kept, to compare when they differ
        name = ("replay" if controller is None else "replay-simulated") + ("-arrival" if order == "arrival" else "")
        src = self.workdir / f"{name}-input.jsonl"
        now = Job(ts=time.time(), job=f"{self.job}-clock", ranks=[RankInfo(rank=0, node="clock")])
        recs = [r for r in self.inputs(order) if controller is None or
                not (r.kind == "recovery" and r.phase in ("replay_result", "dual_run_result"))]
        src.write_bytes(b"".join(encode(r) + b"\n" for r in [*recs, now]))
        out = self._replay_dir = self.workdir / name
        replay.run([src], out, None, progress=None, core=Core(self._settings().core_config()),
                   responder=None if controller is None else lambda actions: answers(controller, actions))

        return outcome(self._replay_rows("actions"), self._replay_rows("incidents"))

    def _settings(self):
        """The settings the worker ran with: the defaults and its `--set NAME=VALUE` (`worker_extra`), not this
        process's GANGWATCH_* variables."""
        from gangwatch import settings

        sets = [v for k, v in zip(self.worker_extra, self.worker_extra[1:], strict=False) if k == "--set"]
        flags = {name: (value, f"--set {name}") for name, _, value in (x.partition("=") for x in sets)}
        return settings.load(flags, environ={})

    def replayed_findings(self) -> list[tuple]:
        """What the last `replayed()` found (type, rank, node, evidence): what a failing comparison shows."""
        return [(f["type"], f["rank"], f["node"], f["evidence"]) for f in self._replay_rows("findings")]

    def _replay_rows(self, name: str) -> list[dict]:
        """The latest of each id in the last replay's `name`.jsonl, for this job."""
        path = getattr(self, "_replay_dir", self.workdir / "replay") / f"{name}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return list({r["id"]: r for r in rows if r["job"] == self.job}.values())

    def nodes(self) -> dict:
        """The controller's node set: active, spares left, taken out."""
        path = self.state / "nodes.json"
        return json.loads(path.read_text()) if path.exists() else {"active": list(self.job_nodes), "out": []}

    def milestones(self, attempt: int) -> list[dict]:
        path = self.state / "runs" / f"attempt-{attempt}" / "progress.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def newest_checkpoint(self) -> int:
        found = checkpoints(self.ckpt)
        return found[-1][0] if found else -1

    @staticmethod
    def stages(incident: dict) -> dict[str, float]:
        """The five durations of an incident, seconds (a stage that did not happen is absent)."""
        s = dict(zip(incident["stage_names"], incident["stage_seconds"], strict=True))
        out = {k: s[k] for k in ("detect", "localize", "decide") if k in s}
        if any(k in s for k in RECOVER_STAGES):
            out["recover"] = round(sum(s.get(k, 0.0) for k in RECOVER_STAGES), 3)
        if "total" in s and "recover" in out:
            out["first_step"] = round(s["total"] - sum(out.values()), 3)
        return out
