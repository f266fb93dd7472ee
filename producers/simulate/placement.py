"""Rank placement and parallel groups of a simulated job, plus deterministic per-purpose RNGs.

Mapping (documented contract of the simulator):

    rank = node_index * gpus_per_node + gpu
    tp   = rank % TP                 (innermost: a tensor-parallel group is contiguous ranks)
    pp   = (rank // TP) % PP
    dp   = rank // (TP * PP)

Process groups, as Megatron builds them: the tensor-parallel group of a rank has
the same (pp, dp); its pipeline group the same (tp, dp) across stages; its
data-parallel group the same (tp, pp) shard across replicas. Group ids (`pg`) are
numeric strings like PyTorch's: "0" is the world, then the tp groups, the pp
groups, the dp groups.
"""

from __future__ import annotations

import zlib

import numpy as np

# PCI bus ids of the 8 GPUs of an HGX H100 board, and of the node's NICs
GPU_BUS = ("1b", "43", "52", "61", "9d", "c3", "d1", "df")
NIC_BUS = ("18", "40", "4f", "5e", "9a", "c0", "ce", "dc")
GROUP_DESC = {"tp": "TENSOR_MODEL_PARALLEL_GROUP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
              "dp": "DATA_PARALLEL_GROUP"}


def rng(seed: int, *names: object) -> np.random.Generator:
    """An independent generator per purpose: adding a stream never shifts another one."""
    words = [seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF]
    words += [zlib.crc32(str(n).encode()) for n in names]
    return np.random.default_rng(np.random.SeedSequence(words))


def gpu_bus(gpu: int) -> str:
    return GPU_BUS[gpu] if gpu < len(GPU_BUS) else f"{(0x10 + 0x11 * gpu) & 0xFF:02x}"


def nic_bus(i: int) -> str:
    return NIC_BUS[i] if i < len(NIC_BUS) else f"{(0x0e + 0x11 * i) & 0xFF:02x}"


class Topology:
    """Arrays indexed by rank (`tp`, `pp`, `dp`, `node`, `gpu`, `shard`) and group helpers."""

    def __init__(self, tp: int, pp: int, dp: int, gpus_per_node: int, spares: int = 4, first_node: int = 0,
                 width: int = 0) -> None:
        self.TP, self.PP, self.DP, self.G = tp, pp, dp, gpus_per_node
        self.n = tp * pp * dp
        self.n_nodes = self.n // gpus_per_node
        r = np.arange(self.n, dtype=np.int64)
        self.rank = r
        self.tp = r % tp
        self.pp = (r // tp) % pp
        self.dp = r // (tp * pp)
        self.node = r // gpus_per_node
        self.gpu = r % gpus_per_node
        self.shard = self.pp * tp + self.tp  # id of the (tp, pp) shard
        self.first = first_node  # the job's nodes are the fleet's first_node, first_node + 1, ...
        self._width = width or max(3, len(str(first_node + self.n_nodes + spares - 1)))
        self.n_tp_groups, self.n_pp_groups, self.n_dp_groups = pp * dp, tp * dp, tp * pp

    # --- names -----------------------------------------------------------------------
    def node_name(self, index: int) -> str:
        return f"n{self.first + index:0{self._width}d}"

    def node_names(self) -> list[str]:
        return [self.node_name(i) for i in range(self.n_nodes)]

    def node_index(self, name: str) -> int:
        if not (name.startswith("n") and name[1:].isdigit()) or not 0 <= int(name[1:]) - self.first < self.n_nodes:
            raise ValueError(f"unknown node {name!r} (job has nodes {self.node_name(0)}.."
                             f"{self.node_name(self.n_nodes - 1)})")
        return int(name[1:]) - self.first

    def node_ranks(self, index: int) -> list[int]:
        return list(range(index * self.G, (index + 1) * self.G))

    def job_ranks(self, names: list[str], nodes_per_switch: int = 0) -> list[dict]:
        """The `ranks` list of a `job` record, with `names[node_index]` as node names; with `nodes_per_switch`,
        each rank also names its leaf switch (consecutive node indices share one)."""
        out = [{"rank": r, "node": names[n], "gpu": g, "tp": t, "pp": p, "dp": d}
               for r, n, g, t, p, d in zip(self.rank.tolist(), self.node.tolist(), self.gpu.tolist(),
                                           self.tp.tolist(), self.pp.tolist(), self.dp.tolist(), strict=True)]
        if nodes_per_switch > 0:
            for rec, n in zip(out, self.node.tolist(), strict=True):
                rec["switch"] = f"sw{n // nodes_per_switch:02d}"
        return out

    # --- groups ------------------------------------------------------------------------
    def members(self, kind: str, rank: int) -> list[int]:
        t, p, d = int(self.tp[rank]), int(self.pp[rank]), int(self.dp[rank])
        TP, PP = self.TP, self.PP
        if kind == "tp":
            return list(range((d * PP + p) * TP, (d * PP + p + 1) * TP))
        if kind == "pp":
            return [t + TP * q + TP * PP * d for q in range(PP)]
        if kind == "dp":
            return [t + TP * p + TP * PP * q for q in range(self.DP)]
        raise ValueError(kind)

    def group_size(self, kind: str) -> int:
        return {"tp": self.TP, "pp": self.PP, "dp": self.DP}[kind]

    def pg(self, kind: str, rank: int) -> str:
        """The numeric process-group id of `rank`'s group of this kind."""
        t, p, d = int(self.tp[rank]), int(self.pp[rank]), int(self.dp[rank])
        if kind == "tp":
            return str(1 + d * self.PP + p)
        if kind == "pp":
            return str(1 + self.n_tp_groups + d * self.TP + t)
        return str(1 + self.n_tp_groups + self.n_pp_groups + p * self.TP + t)
