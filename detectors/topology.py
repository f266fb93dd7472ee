"""The shape of one job: which node and GPU each rank runs on, and its parallel groups.

Built from a `job` record; every per-job detector reads it. Arrays are indexed by
rank so that batch paths can use numpy over all ranks of a step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from gangwatch.schemas import Job, RankInfo


@dataclass(frozen=True)
class Topology:
    """Rank placement of one job; `ranks[i]` describes rank i (ranks are dense 0..n-1)."""

    job: str
    heartbeat_s: float
    ranks: tuple[RankInfo, ...]
    ts: float = 0.0  # event time of the `job` record this topology came from
    elastic: bool = False  # the job goes on without a rank (its job record says `elastic`): progress proves nobody
    nodes: tuple[str, ...] = field(init=False)
    node_index: np.ndarray = field(init=False, repr=False)  # rank -> index into `nodes`
    tp: np.ndarray = field(init=False, repr=False)  # rank -> tensor-parallel index
    pp: np.ndarray = field(init=False, repr=False)  # rank -> pipeline stage
    dp: np.ndarray = field(init=False, repr=False)  # rank -> data-parallel replica
    shard: np.ndarray = field(init=False, repr=False)  # rank -> id of its (tp, pp) shard
    node_ranks: dict[str, tuple[int, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        nodes = sorted({r.node for r in self.ranks})
        index = {n: i for i, n in enumerate(nodes)}
        by_node: dict[str, list[int]] = defaultdict(list)
        for r in self.ranks:
            by_node[r.node].append(r.rank)
        shards = {k: i for i, k in enumerate(sorted({(r.tp, r.pp) for r in self.ranks}))}
        set_ = object.__setattr__
        set_(self, "nodes", tuple(nodes))
        set_(self, "node_index", np.array([index[r.node] for r in self.ranks], dtype=np.int32))
        set_(self, "tp", np.array([r.tp for r in self.ranks], dtype=np.int32))
        set_(self, "pp", np.array([r.pp for r in self.ranks], dtype=np.int32))
        set_(self, "dp", np.array([r.dp for r in self.ranks], dtype=np.int32))
        set_(self, "shard", np.array([shards[(r.tp, r.pp)] for r in self.ranks], dtype=np.int32))
        set_(self, "node_ranks", {n: tuple(rs) for n, rs in by_node.items()})

    @classmethod
    def from_job(cls, rec: Job) -> Topology:
        """Topology of a `job` record; ranks must be exactly 0..n-1, each once."""
        ordered = sorted(rec.ranks, key=lambda r: r.rank)
        if [r.rank for r in ordered] != list(range(len(ordered))):
            raise ValueError(f"job {rec.job}: ranks must be 0..{len(ordered) - 1}, each exactly once")
        return cls(rec.job, rec.heartbeat_s, tuple(ordered), rec.ts, bool(rec.extra.get("elastic")))

    @property
    def size(self) -> int:
        return len(self.ranks)

    def node_of(self, rank: int) -> str | None:
        return self.ranks[rank].node if 0 <= rank < len(self.ranks) else None

    def gpu_of(self, rank: int) -> int | None:
        return self.ranks[rank].gpu if 0 <= rank < len(self.ranks) else None

    def rank_on(self, node: str, gpu: int) -> int | None:
        """The rank running on one GPU of one node, if any."""
        for r in self.node_ranks.get(node, ()):
            if self.ranks[r].gpu == gpu:
                return r
        return None

    GROUPS = ("tp", "pp", "dp", "stage")

    def group_ranks(self, group: str, rank: int) -> np.ndarray:
        """Ranks of one parallel group of `rank`.

        `tp`: the tensor-parallel group (same pp and dp), usually one node;
        `pp`: the pipeline (same tp and dp, every stage);
        `dp`: the data-parallel replicas of its shard (same tp and pp);
        `stage`: every rank of its pipeline stage (same pp; ByteRobust's horizontal group).
        """
        if group == "tp":
            mask = (self.pp == self.pp[rank]) & (self.dp == self.dp[rank])
        elif group == "pp":
            mask = (self.tp == self.tp[rank]) & (self.dp == self.dp[rank])
        elif group == "dp":
            mask = (self.tp == self.tp[rank]) & (self.pp == self.pp[rank])
        elif group == "stage":
            mask = self.pp == self.pp[rank]
        else:
            raise ValueError(f"unknown group {group!r}; one of {', '.join(self.GROUPS)}")
        return np.flatnonzero(mask)

    def switch_of(self, node: str) -> str | None:
        """The leaf switch the job record names for `node`'s ranks (`switch` in a rank's entry), if any:
        nodes under one switch share a failure domain."""
        ranks = self.node_ranks.get(node, ())
        sw = self.ranks[ranks[0]].extra.get("switch") if ranks else None
        return str(sw) if sw not in (None, "") else None

    def nodes_of(self, ranks) -> list[str]:
        """The sorted distinct nodes hosting `ranks`."""
        idx = np.unique(self.node_index[np.asarray(ranks, dtype=np.int64)])
        return [self.nodes[i] for i in idx]
