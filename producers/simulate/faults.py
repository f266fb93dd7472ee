"""Faults resolved against a topology: which node, GPU and ranks each one hits, and when."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gangwatch.producers.simulate.placement import Topology, rng
from gangwatch.producers.simulate.scenario import CO_STALL_KINDS, NODE_KINDS, STALL_KINDS, Fault, Scenario


@dataclass(frozen=True)
class Resolved:
    """A fault pinned down: onset time `ts`, node index, GPU (per-GPU kinds) and culprit ranks."""

    index: int  # position in scenario.faults
    fault: Fault
    ts: float
    node: int
    gpu: int | None
    ranks: tuple[int, ...]
    magnitude: float

    @property
    def kind(self) -> str:
        return self.fault.kind

    @property
    def rank(self) -> int:
        return self.ranks[0]

    def param(self, name: str, default: Any = None) -> Any:
        return self.fault.params.get(name, default)


def resolve(sc: Scenario, topo: Topology) -> list[Resolved]:
    """Resolve every fault of `sc` (sorted by onset); raises ValueError on an impossible one."""
    out = []
    for i, f in enumerate(sc.faults):
        node = topo.node_index(f.node) if f.node is not None else None
        if f.rank is not None:
            if not 0 <= f.rank < topo.n:
                raise ValueError(f"{f.kind}: rank {f.rank} outside 0..{topo.n - 1}")
            r_node = f.rank // topo.G
            if node is not None and node != r_node:
                raise ValueError(f"{f.kind}: rank {f.rank} is on {topo.node_name(r_node)}, not {f.node}")
            node = r_node
        assert node is not None
        if f.kind in NODE_KINDS:
            gpu = None
            ranks = tuple(topo.node_ranks(node))
        else:
            if f.rank is not None:
                gpu = f.rank % topo.G
            elif "gpu" in f.params:
                gpu = int(f.params["gpu"])
                if not 0 <= gpu < topo.G:
                    raise ValueError(f"{f.kind}: gpu {gpu} outside 0..{topo.G - 1}")
            else:
                gpu = int(rng(sc.seed, "fault-gpu", i).integers(topo.G))
            ranks = (node * topo.G + gpu,)
        if f.kind == "pp_deadlock" and topo.PP < 2:
            raise ValueError("pp_deadlock needs pp >= 2")
        out.append(Resolved(i, f, sc.start_ts + f.at_s, node, gpu, ranks, f.effective_magnitude))
    out.sort(key=lambda r: (r.ts, r.index))
    stops = [r for r in out if r.kind in STALL_KINDS or r.kind == "planned_maintenance"]
    if stops:
        first = stops[0]
        late = [r for r in out if r.ts > first.ts]
        if late:
            raise ValueError(f"{late[0].kind} at {late[0].fault.at_s}s comes after the job stopped "
                             f"({first.kind} at {first.fault.at_s}s); faults after a stop are not simulated")
        together = all(r.kind in CO_STALL_KINDS and r.ts == first.ts for r in stops)
        if len(stops) > 1 and not together:
            raise ValueError("at most one stopping fault (stall or planned maintenance) per scenario, or several "
                             f"{' / '.join(sorted(CO_STALL_KINDS))} faults at the same at_s (one hang, several "
                             "culprits)")
        if together and len({r.rank for r in stops}) < len(stops):
            raise ValueError("the culprits of one hang are different ranks")
    return out
