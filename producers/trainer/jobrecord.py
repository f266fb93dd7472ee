"""The `job` record: where every rank runs and which parallel groups it belongs to.

Rank 0 sends it once when the client starts; the detectors need it to compare
a rank with its peers (its pipeline stage, its data-parallel replicas) and to
name the node to replace.

Parallel coordinates come from TP x PP x DP and the rank order of the
framework. The default, `order="tp-dp-pp"`, is Megatron-LM's default, DeepSpeed's
and torchtitan's: tensor parallel varies fastest, then data parallel, and the
pipeline stage slowest:

    tp = rank % TP,  dp = (rank // TP) % DP,  pp = rank // (TP * DP)

`order="tp-pp-dp"` is the layout of gangwatch's simulator (pp before dp). The
detectors read the coordinates from the record, so either is fine as long as it
matches what the framework really built.

Nodes: when `torch.distributed` is initialised, every rank's (node, local rank)
is gathered with `all_gather_object` (a collective: every rank creates its
client). Otherwise an explicit `nodes=` list names them (one name per rank, or
one per node); failing that, ranks are assumed placed in blocks of
`LOCAL_WORLD_SIZE` consecutive ranks per node (what torchrun and Slurm do), this
rank's block on this host and the other blocks on nodes named `node<k>`, which
no node agent will match: pass `nodes=` or create the client after
`init_process_group` on multi-node jobs.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from gangwatch.producers.trainer.launch import Launch
from gangwatch.schemas import Job, RankInfo

log = logging.getLogger("gangwatch.trainer")
ORDERS = ("tp-dp-pp", "tp-pp-dp")


def coordinates(rank: int, tp: int, pp: int, dp: int, order: str = "tp-dp-pp") -> tuple[int, int, int]:
    """(tp, pp, dp) indices of `rank`."""
    if order == "tp-dp-pp":
        return rank % tp, rank // (tp * dp), (rank // tp) % dp
    if order == "tp-pp-dp":
        return rank % tp, (rank // tp) % pp, rank // (tp * pp)
    raise ValueError(f"unknown rank order {order!r}; one of {', '.join(ORDERS)}")


def placements(launch: Launch, nodes: Sequence[str] | None = None) -> list[tuple[str, int]]:
    """(node, local rank) of every rank, by the first of: gathered, `nodes=`, block placement."""
    n, per_node = launch.world_size, max(1, launch.local_world_size)
    gathered = _gather(launch)
    if gathered is not None:
        return gathered
    if nodes is not None:
        if len(nodes) == n:
            return [(nodes[r], r % per_node) for r in range(n)]
        if len(nodes) * per_node == n:
            return [(nodes[r // per_node], r % per_node) for r in range(n)]
        raise ValueError(f"nodes= has {len(nodes)} names: give one per rank ({n}) or one per node "
                         f"({n // per_node} of {per_node} ranks)")
    mine = launch.rank // per_node
    if n > per_node:
        log.warning("gangwatch: %d ranks on %d nodes but only this node's name is known; the others are named "
                    "node<k> (create the client after init_process_group, or pass nodes=)", n, n // per_node)
    return [(launch.node if r // per_node == mine else f"node{r // per_node}", r % per_node) for r in range(n)]


def _gather(launch: Launch) -> list[tuple[str, int]] | None:
    """Every rank's (node, local rank) through torch.distributed, or None when it is not running."""
    if "torch" not in sys.modules:  # torch.distributed cannot be initialised without torch imported
        return None
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() != launch.world_size:
        return None
    out: list = [None] * launch.world_size
    dist.all_gather_object(out, (launch.node, launch.local_rank))
    return [(str(node), int(local)) for node, local in out]


def job_record(launch: Launch, ts: float, heartbeat_s: float, tp: int = 1, pp: int = 1, order: str = "tp-dp-pp",
               nodes: Sequence[str] | None = None, gpus: bool = True) -> Job:
    """The `job` record of the whole job (DP = world size / (TP x PP)); `gpus`: one GPU per local rank."""
    n = launch.world_size
    if tp < 1 or pp < 1 or n % (tp * pp):
        raise ValueError(f"world size {n} is not a multiple of tp x pp = {tp} x {pp}")
    dp = n // (tp * pp)
    ranks = []
    for rank, (node, local) in enumerate(placements(launch, nodes)):
        t, p, d = coordinates(rank, tp, pp, dp, order)
        ranks.append(RankInfo(rank=rank, node=node, gpu=local if gpus else None, tp=t, pp=p, dp=d))
    return Job(ts=ts, job=launch.job, ranks=ranks, heartbeat_s=heartbeat_s)
