"""Which training processes run on this node, found in /proc without asking anybody.

A rank of a job is a process whose environment has `RANK` and a job id. The job
id is derived exactly as the trainer client derives it (`launch.job_id`:
`GANGWATCH_JOB`, then `TORCHELASTIC_RUN_ID`, then `SLURM_JOB_ID`, then the
rendezvous address), so the agent and the ranks agree on it without talking.

Child processes inherit the environment: a rank's data-loader workers carry the
same `RANK` and job id. The rank's own process is the top of that tree, the one
whose parent is not of the same job and rank; that is the process `py-spy dump`
is pointed at (the real hung-job dumps in tests/data are of that process).

A rank that names its node (`GANGWATCH_NODE`, as the trainer client reports it)
belongs to that node's agent: when several named nodes share one machine (a test
bed, or containers sharing a PID namespace) each agent claims only its own, so a
sweep dumps each rank once. Likewise a rank that names its topic prefix
(`GANGWATCH_TOPIC_PREFIX`) belongs to the agents of that prefix: two gangwatch
deployments on one machine (staging beside production, or two test beds) never
report each other's ranks into their topics.

Reading another user's `/proc/PID/environ` needs root or CAP_SYS_PTRACE;
processes the agent may not read are skipped.

`rank_processes` reads every process's environment on each call: right for a
sweep now and then. `RankTable` keeps the answer up to date for what runs every
heartbeat period (`frozen.FrozenRanks`): one listing of /proc and one read of
each rank's `stat` per refresh, and the environment of a new process once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gangwatch.producers.trainer.launch import job_id

PROC = Path("/proc")
# where PyTorch writes flight-recorder dumps: this prefix + the rank (the older name of the variable second)
FR_PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


@dataclass(frozen=True)
class RankProcess:
    """One rank of a job running here; `fr_prefix`: its flight-recorder dump path without the rank, if set."""

    pid: int
    job: str
    rank: int
    fr_prefix: str | None = None


def _environ(pid_dir: Path) -> dict[str, str] | None:
    try:
        raw = (pid_dir / "environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def _stat(pid_dir: Path) -> list[str] | None:
    """The fields of `stat` after comm (`pid (comm) state ppid ...`; comm may hold spaces and parentheses):
    [state, ppid, ...], the starting time at index 19 (field 22); None when the process is gone."""
    try:
        stat = (pid_dir / "stat").read_text(errors="replace")
        fields = stat[stat.rindex(")") + 2:].split()
    except (OSError, ValueError):
        return None
    return fields or None


def proc_state(pid: int, proc_root: Path = PROC) -> tuple[str | None, int | None]:
    """(the `stat` state letter, the owner's uid) of process `pid`; (None, None) when it is gone."""
    pid_dir = proc_root / str(pid)
    fields = _stat(pid_dir)
    if not fields:
        return None, None
    try:
        return fields[0], pid_dir.stat().st_uid
    except OSError:
        return fields[0], None


def status_of(pid: int, proc_root: Path = PROC) -> tuple[str, str | None] | None:
    """(state letter, the command name of its tracer) of process `pid`, both from one read of its `status`
    (`State`, `TracerPid`): the tracer is None when none is, "" when the one named is gone (or unreadable).
    None when `status` cannot be read."""
    try:
        status = (proc_root / str(pid) / "status").read_text(errors="replace")
    except OSError:
        return None
    fields = dict(line.partition(":")[::2] for line in status.splitlines())
    state, traced_by = fields.get("State", "").strip()[:1], fields.get("TracerPid", "0").strip()
    if traced_by in ("", "0"):
        return state, None
    try:
        return state, (proc_root / traced_by / "comm").read_text(errors="replace").strip()
    except OSError:
        return state, ""


def _parent(pid_dir: Path) -> int | None:
    """The parent pid from `stat`."""
    fields = _stat(pid_dir)
    try:
        return int(fields[1]) if fields else None
    except (ValueError, IndexError):
        return None


def _started(fields: list[str]) -> str:
    """The starting time (field 22, in clock ticks since boot): with the pid, it names one process for good."""
    return fields[19] if len(fields) > 19 else ""


def rank_processes(node: str, proc_root: Path = PROC, *, prefix: str | None = None) -> list[RankProcess]:
    """The ranks running on this node, one process per (job, rank), sorted by job and rank; with `prefix`, only
    those that name that topic prefix or none (see the module's docstring).

    A rank with neither a job variable nor a rendezvous address is a job of its own
    (`launch.job_id`); the id the agent derives for it names nothing and no action finds it.
    """
    found: dict[int, tuple[RankProcess, int | None]] = {}
    for pid_dir in proc_root.iterdir():
        if not pid_dir.name.isdigit():
            continue
        proc = _rank_of(pid_dir, node, prefix)
        if proc is not None:
            found[proc.pid] = (proc, _parent(pid_dir))
    tops: dict[tuple[str, int], RankProcess] = {}
    for proc, parent in sorted(found.values(), key=lambda item: item[0].pid):
        above = found.get(parent) if parent is not None else None
        if above is not None and (above[0].job, above[0].rank) == (proc.job, proc.rank):
            continue  # a worker process of that rank
        tops.setdefault((proc.job, proc.rank), proc)
    return [tops[k] for k in sorted(tops)]


def _rank_of(pid_dir: Path, node: str, prefix: str | None) -> RankProcess | None:
    """The rank this process is of (its environment says), if any and if it is this node's (and prefix's)."""
    env = _environ(pid_dir)
    if not env or "RANK" not in env or env.get("GANGWATCH_NODE", node) != node:
        return None  # not a rank, or another node's
    if prefix is not None and (env.get("GANGWATCH_TOPIC_PREFIX") or prefix) != prefix:
        return None  # another deployment's (the topics it sends to, launch.py: empty or unset names none)
    try:
        rank = int(env["RANK"])
    except ValueError:
        return None
    prefix = next((env[v] for v in FR_PREFIX_VARS if env.get(v)), None)
    return RankProcess(pid=int(pid_dir.name), job=job_id(env, node), rank=rank, fr_prefix=prefix)


@dataclass(frozen=True)
class _Seen:
    started: str  # `_started`: a pid reused by a new process is told apart by it
    proc: RankProcess | None  # None: not a rank (or not this node's)
    worker: bool  # its parent was of the same job and rank when it was classified


class RankTable:
    """The ranks of this node, kept up to date cheaply, with each one's process state.

    `states()` lists /proc once, reads the `stat` of each rank's process once,
    and classifies only processes it has not seen before (their environment and
    `stat`, once). A new pid is classified at the second listing that shows it:
    between fork and exec a child still shows its parent's environment (at the
    first refresh every process is classified at once: they are old). Processes
    found not to be ranks are classified again every `recheck_s`, in case one was
    read in that window after all.

    A process whose parent was of the same job and rank when it was classified is
    a worker of that rank for good: a data-loader worker left behind by a dead
    rank (reparented) is never taken for the rank itself, as it would be by its
    parent pid alone.
    """

    def __init__(self, node: str, proc_root: Path = PROC, *, prefix: str | None = None,
                 recheck_s: float = 300.0) -> None:
        self.node, self.proc_root, self.prefix, self.recheck_s = node, Path(proc_root), prefix, recheck_s
        self._seen: dict[int, _Seen] = {}
        self._pending: set[int] = set()  # listed once, classified at the next listing
        self._first = True
        self._checked: float | None = None  # when the non-ranks were last classified again

    def states(self, now: float) -> list[tuple[RankProcess, str]]:
        """(rank process, its `stat` state letter) of each rank here, by job and rank; a rank whose
        process is gone (or whose pid another process took) is left out."""
        self._refresh(now)
        tops: dict[tuple[str, int], RankProcess] = {}
        for pid in sorted(self._seen):
            seen = self._seen[pid]
            if seen.proc is not None and not seen.worker:
                tops.setdefault((seen.proc.job, seen.proc.rank), seen.proc)
        out: list[tuple[RankProcess, str]] = []
        for key in sorted(tops):
            proc = tops[key]
            fields = _stat(self.proc_root / str(proc.pid))  # the one read per rank per refresh
            if fields is None or _started(fields) != self._seen[proc.pid].started:
                del self._seen[proc.pid]  # gone, or its pid taken by a new process: classified again if listed
                continue
            out.append((proc, fields[0]))
        return out

    def _refresh(self, now: float) -> None:
        try:
            listed = {int(name) for name in os.listdir(self.proc_root) if name.isdigit()}
        except OSError:
            return
        for pid in self._seen.keys() - listed:
            del self._seen[pid]
        self._pending &= listed
        if self._checked is None:
            self._checked = now
        elif now - self._checked >= self.recheck_s:
            self._checked = now
            for pid in [pid for pid, seen in self._seen.items() if seen.proc is None]:
                del self._seen[pid]
                self._pending.add(pid)  # still listed: classified below
        new = listed - self._seen.keys()
        ready = new if self._first else new & self._pending
        self._pending = (self._pending | new) - ready
        self._first = False
        parents: dict[int, int | None] = {}
        for pid in ready:
            pid_dir = self.proc_root / str(pid)
            fields = _stat(pid_dir)
            if fields is None:
                continue  # gone since the listing
            self._seen[pid] = _Seen(started=_started(fields), proc=_rank_of(pid_dir, self.node, self.prefix),
                                    worker=False)
            try:
                parents[pid] = int(fields[1])
            except (ValueError, IndexError):
                parents[pid] = None
        for pid, parent in parents.items():  # the parents of the new ones are known by now (seen or new)
            proc, above = self._seen[pid].proc, self._seen.get(parent) if parent is not None else None
            if proc is not None and above is not None and above.proc is not None \
                    and (above.proc.job, above.proc.rank) == (proc.job, proc.rank):
                self._seen[pid] = _Seen(started=self._seen[pid].started, proc=proc, worker=True)
