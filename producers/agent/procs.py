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
sweep dumps each rank once.

Reading another user's `/proc/PID/environ` needs root or CAP_SYS_PTRACE;
processes the agent may not read are skipped.
"""

from __future__ import annotations

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


def _parent(pid_dir: Path) -> int | None:
    """The parent pid from `stat` (`pid (comm) state ppid ...`; comm may hold spaces and parentheses)."""
    try:
        stat = (pid_dir / "stat").read_text(errors="replace")
        return int(stat[stat.rindex(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def rank_processes(node: str, proc_root: Path = PROC) -> list[RankProcess]:
    """The ranks running on this node, one process per (job, rank), sorted by job and rank.

    A rank with neither a job variable nor a rendezvous address is a job of its own
    (`launch.job_id`); the id the agent derives for it names nothing and no action finds it.
    """
    found: dict[int, tuple[RankProcess, int | None]] = {}
    for pid_dir in proc_root.iterdir():
        if not pid_dir.name.isdigit():
            continue
        env = _environ(pid_dir)
        if not env or "RANK" not in env or env.get("GANGWATCH_NODE", node) != node:
            continue  # not a rank, or another node's
        try:
            rank = int(env["RANK"])
        except ValueError:
            continue
        prefix = next((env[v] for v in FR_PREFIX_VARS if env.get(v)), None)
        proc = RankProcess(pid=int(pid_dir.name), job=job_id(env, node), rank=rank, fr_prefix=prefix)
        found[proc.pid] = (proc, _parent(pid_dir))
    tops: dict[tuple[str, int], RankProcess] = {}
    for proc, parent in sorted(found.values(), key=lambda item: item[0].pid):
        above = found.get(parent) if parent is not None else None
        if above is not None and (above[0].job, above[0].rank) == (proc.job, proc.rank):
            continue  # a worker process of that rank
        tops.setdefault((proc.job, proc.rank), proc)
    return [tops[k] for k in sorted(tops)]
