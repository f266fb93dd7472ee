"""Start and stop a training job as a gang of `torchrun` processes, one per node, for the reference controller.

    spec = JobSpec(job="j1", command=["python", "train.py"], ckpt_dir=Path("ckpt"), run_dir=Path("run"))
    gang = Gang(spec, nodes=["n1", "n2"], resume_from=latest(spec.ckpt_dir), attempt=0)
    gang.start()          # one torchrun per node name, all joining one c10d rendezvous
    gang.milestones()     # what the job reported so far: ckpt_loaded, comm_ready, step
    gang.stop()           # TERM, a grace period, then KILL whatever is left

A node here is a name. On a small cluster every torchrun would run on its own
machine; for tests and drills they all run on this one, each with
`GANGWATCH_NODE=<name>`, which is the name the trainer client reports and the
node agent answers to. Replacing a node is starting the next gang with a spare
name in its place.

Every torchrun gets `--nnodes=<gang size> --nproc-per-node=N --rdzv-backend=c10d
--rdzv-endpoint=HOST:PORT` (a fresh port per gang) and `--max-restarts=0`: when a
rank dies, torchrun stops the job instead of restarting it by itself, so that the
recovery is gangwatch's decision, carried out by the controller. The first
node's torchrun is started first and hosts the rendezvous store (the others start
once it listens), as node 0 does on a cluster: which process holds the store
decides how the others learn that the job is over, so it is kept the same. (`--node-rank`
is left out: the c10d rendezvous ignores it and assigns ranks itself, so which
rank runs on which node is what the job's `job` record says.)

The protocol between the launcher and the training script, all through the
environment, each variable set for every rank (examples/tiny_job/train.py
follows it):

| variable                | meaning                                                                     |
|-------------------------|-----------------------------------------------------------------------------|
| `GANGWATCH_JOB`         | the job id (the same across restarts: one job, many gangs)                  |
| `GANGWATCH_NODE`        | the node name this rank runs on                                             |
| `GANGWATCH_BOOTSTRAP`   | where the trainer client sends (with `GANGWATCH_TOPIC_PREFIX`: the          |
|                         | controller's own Kafka and prefix, passed in `JobSpec.env`)                 |
| `GANGWATCH_CKPT_DIR`    | where rank 0 writes checkpoints, named `step-<step>.pt`                     |
| `GANGWATCH_RESUME_FROM` | the checkpoint to load before training, unset for a fresh start             |
| `GANGWATCH_PROGRESS`    | a file rank 0 appends milestones to, one JSON object per line (below)      |
| `GANGWATCH_REPLAY_STEPS`| a replay (control/trials.py): run this many steps from the checkpoint, then |
|                         | exit 0, writing no checkpoint and sending no telemetry; unset in training   |
| `GANGWATCH_DIGEST_OUT`  | with it (a dual run), rank 0 then writes there the sha256 (hex) of every    |
|                         | rank's parameters                                                           |

Milestones: `{"ts": <epoch seconds>, "event": E, ...}` with E `ckpt_loaded` (the
checkpoint is in memory), `comm_ready` (the first collective went through) and
`step` (the first step after the start is done).

A checkpoint's file name carries the step it was written after, so the launcher
can choose one without opening it (`checkpoints`, `latest`, `newest_before`).
Processes are Linux processes: stopping a gang also finds their descendants in
/proc, so nothing outlives a stop, whatever torchrun managed to clean up.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

CKPT_NAME = re.compile(r"^step-(\d+)\.pt$")


@dataclass(frozen=True)
class JobSpec:
    """What to run and where its files go; the same for every gang of the job."""

    job: str
    command: Sequence[str]  # the training script and its arguments, as torchrun takes them
    ckpt_dir: Path
    run_dir: Path  # per gang: `attempt-<n>/<node>.log` and `attempt-<n>/progress.jsonl`
    nproc_per_node: int = 2
    host: str = "127.0.0.1"  # where the rendezvous listens
    env: dict[str, str] = field(default_factory=dict)  # added to this process's environment for every rank
    torchrun: Sequence[str] = (sys.executable, "-m", "torch.distributed.run")
    rendezvous_timeout_s: float = 60.0  # for the first node's torchrun to open the rendezvous


class Gang:
    """One launch of the job: a torchrun per node joining one rendezvous; `attempt` numbers the launches."""

    def __init__(self, spec: JobSpec, nodes: Sequence[str], resume_from: Path | None, attempt: int) -> None:
        self.spec, self.nodes, self.resume_from, self.attempt = spec, list(nodes), resume_from, attempt
        self.dir = spec.run_dir / f"attempt-{attempt}"
        self.progress = self.dir / "progress.jsonl"
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.spec.ckpt_dir.mkdir(parents=True, exist_ok=True)
        port = free_port(self.spec.host)
        for i, node in enumerate(self.nodes):
            if i == 1:  # the first node's torchrun hosts the rendezvous store, as node 0 does on a cluster
                wait_listening(self.spec.host, port, self.procs[self.nodes[0]], self.spec.rendezvous_timeout_s)
            env = {**os.environ, **self.spec.env, "GANGWATCH_JOB": self.spec.job, "GANGWATCH_NODE": node,
                   "GANGWATCH_CKPT_DIR": str(self.spec.ckpt_dir), "GANGWATCH_PROGRESS": str(self.progress)}
            env.pop("GANGWATCH_RESUME_FROM", None)
            if self.resume_from is not None:
                env["GANGWATCH_RESUME_FROM"] = str(self.resume_from)
            args = [*self.spec.torchrun, f"--nnodes={len(self.nodes)}", f"--nproc-per-node={self.spec.nproc_per_node}",
                    "--rdzv-backend=c10d", f"--rdzv-endpoint={self.spec.host}:{port}",
                    f"--rdzv-id={self.spec.job}-{self.attempt}", "--max-restarts=0", *self.spec.command]
            with open(self.dir / f"{node}.log", "ab") as log:
                self.procs[node] = subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True)

    def returncodes(self) -> dict[str, int | None]:
        """Per node, its torchrun's exit code (None while it runs)."""
        return {node: p.poll() for node, p in self.procs.items()}

    def running(self) -> bool:
        return any(code is None for code in self.returncodes().values())

    def milestones(self) -> list[dict]:
        """What the job reported so far (rank 0's progress lines; a line still being written is skipped)."""
        try:
            lines = self.progress.read_text().splitlines()
        except FileNotFoundError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    def stop(self, grace_s: float = 20.0) -> None:
        """TERM every torchrun (it stops its ranks), wait up to `grace_s`, then KILL everything still there."""
        family = [d for p in self.procs.values() if p.poll() is None for d in descendants(p.pid)]
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in self.procs.values():
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for pid, start in family:
            if process_start(pid) == start:  # the same process, not a new one that got its pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def wait_listening(host: str, port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    """Return once `host:port` accepts connections; raise if `proc` (the listener) exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"torchrun exited ({proc.returncode}) before its rendezvous listened") from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"no rendezvous at {host}:{port} after {timeout_s:g} s") from None
            time.sleep(0.1)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def process_start(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat field 22), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[19])  # fields after the command name start at field 3


def descendants(pid: int) -> list[tuple[int, int]]:
    """(pid, start time) of every live descendant of `pid`, children before grandchildren."""
    out: list[tuple[int, int]] = []
    todo = [pid]
    while todo:
        parent = todo.pop(0)
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            for kid in kids:
                start = process_start(kid)
                if start is not None:
                    out.append((kid, start))
                    todo.append(kid)
    return out


# --- checkpoints ------------------------------------------------------------------------------------


def checkpoints(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    found = []
    for path in ckpt_dir.glob("step-*.pt"):
        m = CKPT_NAME.match(path.name)
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found)


def latest(ckpt_dir: Path) -> Path | None:
    """The newest checkpoint, None before the first."""
    found = checkpoints(ckpt_dir)
    return found[-1][1] if found else None


def newest_before(ckpt_dir: Path, step: int) -> Path | None:
    """The newest checkpoint written after a step earlier than `step`, None when there is none."""
    found = [path for s, path in checkpoints(ckpt_dir) if s < step]
    return found[-1] if found else None
