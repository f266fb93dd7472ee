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
- `gangwatch controller` (streams/controller.py) driving examples/tiny_job/train.py:
  two simulated nodes of two ranks each (gloo on CPU), spare n3, checkpoints
  every 10 steps; the fault travels to the ranks in their environment. It reads
  actions from the alert topic, or with `webhook=True` receives them as signed
  POSTs from the worker (findings, which name a rollback's first corrupt step,
  it always reads from their topic).

Everything is stopped at exit, the job's processes included: the controller
stops its job; whatever it left (a controller that died cannot) is killed from
the process tree recorded while waiting.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gangwatch.sinks.controller import SECRET_ENV
from gangwatch.sinks.store import ClickHouseStore
from gangwatch.streams.launcher import checkpoints, descendants, free_port, process_start
from gangwatch.streams.topics import TopicSettings

from tests.integration.kafkakit import REPO, WorkerProc, worker_args

TRAIN = REPO / "examples" / "tiny_job" / "train.py"
NODES, SPARES = ("n1", "n2"), ("n3",)
CKPT_EVERY = 10
# the five durations reported per fault, from the incident's stages (triage/incident.py): recover is
# decided -> the first collective of the restarted job; first_step is that -> its first step done
FIVE = ("detect", "localize", "decide", "recover", "first_step")
RECOVER_STAGES = ("replace", "rollback", "comm_rebuild")


@dataclass(frozen=True)
class Fault:
    """A fault of examples/tiny_job/train.py: `kind` on `node`'s local rank 0 from `step` on."""

    kind: str
    step: int
    node: str = "n2"

    def env(self) -> dict[str, str]:
        return {"FAULT": self.kind, "FAULT_NODE": self.node, "FAULT_STEP": str(self.step), "FAULT_LOCAL_RANK": "0"}


class LiveJob:
    def __init__(self, bootstrap: str, topics: TopicSettings, clickhouse: tuple[str, int], workdir: Path, *,
                 job: str, fault: Fault | None = None, webhook: bool = False,
                 worker_extra: tuple[str, ...] = ()) -> None:
        self.bootstrap, self.topics, self.workdir, self.job, self.fault = bootstrap, topics, workdir, job, fault
        self.webhook, self.worker_extra = webhook, worker_extra
        self.host, self.port = clickhouse
        self.store = ClickHouseStore(self.host, self.port, database=job)  # creates the database
        self.store.create_tables()  # the worker creates them too; here they exist before the first query
        self.procs: dict[str, WorkerProc] = {}
        self.ended: set[str] = set()  # processes that finished as the test expected (their exit is no failure)
        self.family: set[tuple[int, int]] = set()  # (pid, start) of every process the controller started
        self.state = workdir / "controller"
        self.ckpt = workdir / "ckpt"

    # --- running --------------------------------------------------------------------------------

    def start(self, steps: int, *train_args: str) -> None:
        """The worker, the agents, then the controller with the job (`steps` steps, then it ends)."""
        url = f"clickhouse://{self.host}:{self.port}/{self.job}"
        # actions reach the controller on the alert topic, or POSTed by the worker to the controller's webhook
        listen = f"127.0.0.1:{free_port('127.0.0.1')}" if self.webhook else ""
        webhook = ("--webhook", f"http://{listen}/actions") if listen else ()
        secret = {SECRET_ENV: f"secret-of-{self.job}"} if listen else {}
        self._spawn("worker", worker_args(self.bootstrap, self.job, self.topics, "--store", url, *webhook,
                                              *self.worker_extra), env=secret)
        for node in (*NODES, *SPARES):
            self._spawn(f"agent-{node}", self._gangwatch("agent", "--node", node, "--kmsg", "off", "--gpu-every", "0",
                                                         "--spool-dir", str(self.workdir / f"spool-{node}")))
        self._spawn("controller", self._gangwatch(
            "controller", "--job", self.job, "--nodes", ",".join(NODES), "--spares", ",".join(SPARES),
            "--ckpt-dir", str(self.ckpt), "--state-dir", str(self.state), *(("--listen", listen) if listen else ()),
            "--", str(TRAIN), "--steps", str(steps), "--ckpt-every", str(CKPT_EVERY), *train_args),
            env={**(self.fault.env() if self.fault else {}), **secret})

    def _gangwatch(self, command: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "gangwatch", command, "--bootstrap", self.bootstrap, "--prefix",
                self.topics.prefix, *args]

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
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
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.logs()}")
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

    def nodes(self) -> dict:
        """The controller's node set: active, spares left, taken out."""
        path = self.state / "nodes.json"
        return json.loads(path.read_text()) if path.exists() else {"active": list(NODES), "out": []}

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
