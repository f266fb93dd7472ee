"""Who this process is, read from what the launcher put in the environment.

torchrun (torchelastic) sets `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`
and `TORCHELASTIC_RUN_ID`; Slurm sets `SLURM_JOB_ID` and `SLURMD_NODENAME`.
gangwatch's own variables win over both:

| variable                 | what                                        | default                       |
|--------------------------|---------------------------------------------|-------------------------------|
| `GANGWATCH_JOB`          | job id (the Kafka key of every record)      | see `job_id`                  |
| `GANGWATCH_NODE`         | this node's name, as the node agent names it | `SLURMD_NODENAME`, hostname  |
| `GANGWATCH_BOOTSTRAP`    | Kafka bootstrap servers `host:port[,...]`   | none: pass `bootstrap=`/`send=` |
| `GANGWATCH_TOPIC_PREFIX` | topic prefix (as `gangwatch topics` uses)   | `gw.`                         |

Without a launcher (a plain `python train.py`) the process is rank 0 of a job of one.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from gangwatch.schemas.topics import TopicSettings


@dataclass(frozen=True)
class Launch:
    """This process's place in the job."""

    job: str
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: str
    bootstrap: str | None
    topic_prefix: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Launch:
        """Read the environment; non-None `overrides` (rank=..., job=...) win."""
        env = os.environ if env is None else env
        given = {k: v for k, v in overrides.items() if v is not None}
        world = int(given.get("world_size", env.get("WORLD_SIZE", 1)))
        node = str(given.get("node") or env.get("GANGWATCH_NODE") or env.get("SLURMD_NODENAME")
                   or socket.gethostname())
        values = {
            "job": given.get("job") or job_id(env, node),
            "rank": int(env.get("RANK", 0)),
            "world_size": world,
            "local_rank": int(env.get("LOCAL_RANK", 0)),
            "local_world_size": int(env.get("LOCAL_WORLD_SIZE", world)),
            "node": node,
            "bootstrap": env.get("GANGWATCH_BOOTSTRAP"),
            "topic_prefix": env.get("GANGWATCH_TOPIC_PREFIX") or "gw.",
        }
        values.update(given)
        return cls(**values)

    @property
    def topics(self) -> TopicSettings:
        """The names of gangwatch's topics under this job's prefix."""
        return TopicSettings(prefix=self.topic_prefix)


def job_id(env: Mapping[str, str], node: str) -> str:
    """The job id every rank of one job agrees on, from the first source that has one.

    `GANGWATCH_JOB`, then torchrun's `TORCHELASTIC_RUN_ID` (which is "none" when
    `--rdzv-id` was not given), then `SLURM_JOB_ID`; then the rendezvous address
    `MASTER_ADDR:MASTER_PORT`, which all ranks of one job share; a process with
    none of these is a job of its own, named after its node and pid.
    """
    for name in ("GANGWATCH_JOB", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = env.get(name)
        if value and value != "none":
            return value
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return f"{node}-{os.getpid()}"
