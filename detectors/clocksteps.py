"""A node's wall clock stepping, seen at once by the node's own monotonic clock.

An NTP daemon that finds its clock far off steps it (chrony's `makestep`, ntpd at start, an operator's
`date -s`): every record the node stamps from then on is that much ahead or behind. The node's peers tell it
(`ClockDetector`, after `min_steps` steps), but a job of one node has no peers, and a job of two cannot tell which
of its clocks stepped. The node itself can. A sender that stamps `mono` beside `ts` (its monotonic clock, Linux
CLOCK_MONOTONIC: NTP slews it but never steps it, and every process of a booted node reads the same one) keeps
`ts - mono` fixed until its wall clock steps. So, per node:

- Its **base** is `ts - mono` of its first record with `mono` in this attempt of the job (less the step already
  known of it: a restart, maybe a reboot, keeps the node's frame).
- A record's **step** is `ts - mono - base`. One that is newest by the node's own monotonic clock and differs from
  the node's known step by `tolerance_s / 2` or more: the clock stepped. From then on the node's records without
  `mono` are read with that step taken out, and one `clock_skew` finding names the node (at the next move of
  time, through `ClockDetector.advance`).
- A record with `mono` is read with its own step taken out, so one stamped before the step and read after it (a
  replay sorted by the senders' times, a spool flushed late) keeps its own.

What this takes out is what the clock did during the job: an offset it had from the start stays, for the peers
to tell (`ClockDetector`). Senders without `mono` (older clients, other tools) change nothing. `JobMonitor`
passes every record of the job through here before anything reads its time (`JobCore.process`), so every
detector, the job's clock and triage see one frame.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Record
from gangwatch.schemas.columns import StepRows


class ClockSteps:
    """Per node: the base of its wall clock on its monotonic clock, and the step taken out of its records."""

    def __init__(self, topo: Topology, tolerance_s: float, keep: dict[str, float] | None = None) -> None:
        self.half = tolerance_s / 2  # a change of a node's step this large is a step of its clock
        self.topo = topo
        n = len(topo.nodes)
        self.node_pos = {node: i for i, node in enumerate(topo.nodes)}
        self.base = np.full(n, np.nan)  # ts - mono of the node's first record with `mono`, less its step then
        self.top = np.full(n, -np.inf)  # the newest `mono` of each node's records
        self.off = np.zeros(n)  # the step taken out of the node's records (0: none)
        for node, off in (keep or {}).items():
            if node in self.node_pos:
                self.off[self.node_pos[node]] = off
        self.any_off = bool(self.off.any())  # (asked of every record)
        self.news: set[int] = set()  # nodes whose clock stepped since the last `said`

    def set_topology(self, topo: Topology) -> None:
        """A new attempt: new processes (a node may have rebooted, its monotonic clock with it), the same clocks."""
        if (topo.ts, topo.ranks) != (self.topo.ts, self.topo.ranks):
            news = {self.topo.nodes[i] for i in self.news}
            self.__init__(topo, 2 * self.half, self.kept())
            self.news = {self.node_pos[n] for n in news if n in self.node_pos}

    def kept(self) -> dict[str, float]:
        """Node -> its step, for the nodes whose clock stepped."""
        return {node: float(self.off[i]) for node, i in self.node_pos.items() if self.off[i]}

    def said(self) -> list[tuple[str, float]]:
        """The nodes whose clock stepped since last asked, with the step now taken out of their records."""
        out = [(self.topo.nodes[i], float(self.off[i])) for i in sorted(self.news)]
        self.news.clear()
        return out

    def _node(self, rec: Record) -> int | None:
        node = getattr(rec, "node", None)
        if node is not None:
            return self.node_pos.get(node)
        rank = getattr(rec, "rank", None)
        if rank is None or not 0 <= rank < self.topo.size:
            return None
        return int(self.topo.node_index[rank])

    def _step(self, i: int, ts: float, mono: float) -> float:
        """What to take out of the time of node i's record stamped `ts` at `mono` (and what it teaches)."""
        d = ts - mono
        if math.isnan(self.base[i]):
            self.base[i] = d - self.off[i]
            self.top[i] = mono
            return float(self.off[i])
        s = float(d - self.base[i])
        newest = mono >= self.top[i]
        if newest:
            self.top[i] = mono
        if abs(s - self.off[i]) < self.half:
            return float(self.off[i])
        if newest:  # the node's clock stepped
            self.off[i] = round(s, 3)
            self.any_off = bool(self.off.any())
            self.news.add(i)
        return s

    def step_of(self, rec: Record) -> float:
        """What to take out of `rec`'s time: its node's clock step (and what it teaches)."""
        i = self._node(rec)
        if i is None:
            return 0.0
        mono = getattr(rec, "mono", None)
        return float(self.off[i]) if mono is None else self._step(i, rec.ts, mono)

    def steps_of_rows(self, rows: StepRows) -> np.ndarray | None:
        """`step_of` of every item of `rows`, in item order (at once when no item changes what is known; None:
        nothing to take out of any)."""
        has_mono = "mono" in rows.cols or (rows.beats is not None and "mono" in rows.beats)
        if not has_mono and not self.any_off:
            return None
        rank = np.asarray(rows.column("rank"), dtype=np.int64)
        ok = (rank >= 0) & (rank < self.topo.size)
        node = np.where(ok, self.topo.node_index[np.where(ok, rank, 0)] if self.topo.size else 0, -1)
        ts = np.asarray(rows.ts, dtype=np.float64)
        mono = np.asarray(rows.column("mono"), dtype=np.float64) if has_mono else np.full(len(ts), np.nan)
        at = np.where(ok, node, 0)
        off = np.where(ok, self.off[at], 0.0)
        has = ok & ~np.isnan(mono)
        s = ts - mono - self.base[at]
        if has.any() and (np.isnan(s[has]).any() or (np.abs(s[has] - off[has]) >= self.half).any()):
            # a node's first record with `mono`, a step or a record from before one: item by item, in order
            return np.array([0.0 if not k else float(self.off[j]) if np.isnan(m) else self._step(j, t, m)
                             for k, j, t, m in zip(ok.tolist(), node.tolist(), ts.tolist(), mono.tolist(),
                                                   strict=True)])
        if has.any():
            np.maximum.at(self.top, node[has], mono[has])
        return off if off.any() else None

    def unstepped(self, rec: Record) -> Record:
        """`rec` with its node's clock step taken out of its time (itself when there is none)."""
        if getattr(rec, "mono", None) is None and not self.any_off:
            return rec
        s = self.step_of(rec)
        return dataclasses.replace(rec, ts=rec.ts - s) if s else rec

    def unstepped_rows(self, rows: StepRows) -> StepRows:
        """`unstepped` of every item of `rows`, in item order."""
        by = self.steps_of_rows(rows)
        return rows if by is None or not by.any() else rows.shifted(by.tolist())

    def state(self) -> dict[str, Any]:
        """Node -> [base, newest mono, step] for the nodes it knows, and the nodes not reported yet."""
        return {"nodes": {node: [None if math.isnan(self.base[i]) else float(self.base[i]),
                                 None if not np.isfinite(self.top[i]) else float(self.top[i]), float(self.off[i])]
                          for node, i in self.node_pos.items() if not math.isnan(self.base[i]) or self.off[i]},
                "news": sorted(self.topo.nodes[i] for i in self.news)}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology, tolerance_s: float) -> ClockSteps:
        steps = cls(topo, tolerance_s)
        for node, (base, top, off) in state["nodes"].items():
            i = steps.node_pos.get(node)
            if i is not None:
                steps.base[i] = np.nan if base is None else base
                steps.top[i] = -np.inf if top is None else top
                steps.off[i] = off
        steps.any_off = bool(steps.off.any())
        steps.news = {steps.node_pos[n] for n in state["news"] if n in steps.node_pos}
        return steps
