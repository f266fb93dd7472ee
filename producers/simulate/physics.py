"""Synchronous-training physics: when every step of every rank ends, and where the job stops.

Per step (vectorized over ranks):

    compute_r   = stage baseline(pp_r) * warm-up * (1 + jitter) * straggler factor_r (+ checkpoint save)
    data_r      = small exponential input wait
    comm        = collective cost after the last rank arrives (NIC degradation, link flaps raise it)
    step_s      = max_r(compute_r + data_r) + comm          (equal on every rank)
    comm_wait_r = step_s - compute_r - data_r               (a straggler waits least)

Fail-slow kinds: a thermal straggler's compute grows by `magnitude` over `ramp_s`; an
intermittent one by `magnitude` in a share `prob` of steps; NIC degradation makes the
collective cost (everyone's comm_wait) grow by `magnitude` (a ring is as fast as its
slowest link) and the node's own ranks compute NIC_COMPUTE_SHARE * magnitude slower
(NCCL kernels hold SMs longer), so the node stands out in compute_s a little.

A stall (xid79, node loss, data-loader hang, pipeline deadlock) stops progress in
the step in progress at the fault time; planned maintenance stops gracefully after
a checkpoint, and the job may restart on a spare node (a new `Segment`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from gangwatch.producers.simulate.faults import Resolved, resolve
from gangwatch.producers.simulate.noise import Benign, decaying, grad_curve, loss_curve, plan_benign
from gangwatch.producers.simulate.placement import Topology, rng
from gangwatch.producers.simulate.scenario import STALL_KINDS, Scenario

COMPUTE_FRAC = 0.82  # share of base_step_s spent computing on an average stage
COMM_FRAC = 0.15  # share of base_step_s in the collectives once everyone arrived
NIC_COMPUTE_SHARE = 0.25  # a degraded NIC also slows its node's compute (comm kernels hold SMs longer)


@dataclass
class Stop:
    """Why a segment's steps end before the scenario does."""

    kind: str  # "stall" or "planned"
    fault: Resolved
    ts: float  # stall: fault time; planned: end of the final (checkpointed) step
    step: int  # stall: the step in progress that never completes; planned: the last completed step
    step_start: float = 0.0  # stall: start of the hung step
    arrive: np.ndarray | None = None  # stall: per-rank offsets at which ranks reached the collectives
    also: tuple[Resolved, ...] = ()  # stall: the other culprits of the same hang (same onset)

    @property
    def faults(self) -> tuple[Resolved, ...]:
        """Every fault behind the stop: the one that stopped it, then the others of the same hang."""
        return (self.fault, *self.also)


@dataclass
class Segment:
    """One run of the job processes: from a `job` record to the end, a stop or a restart."""

    index: int
    t0: float  # the job record; processes come up within `launch_s`
    t_end: float  # next segment's t0, or the scenario end
    nodes: list[str]  # node name by node index
    step0: int
    first_start: float
    start: np.ndarray  # (n,) step start ts
    end: np.ndarray  # (n,) step end ts
    compute: np.ndarray  # (n, R)
    data: np.ndarray  # (n, R)
    comm: np.ndarray  # (n,) collective cost after the last arrival
    loss: np.ndarray  # (n,)
    grad_norm: np.ndarray  # (n,)
    ckpt: list[tuple[int, float, float]]  # (step, start, end of the save)
    hb_first: np.ndarray  # (R,) each rank's first heartbeat, seconds after t0 (process up + phase in (0, hb])
    alive_until: np.ndarray  # (R,) when each rank's process goes silent
    stop: Stop | None = None
    loss_spikes: list[int] = field(default_factory=list)

    @property
    def steps(self) -> np.ndarray:
        return self.step0 + np.arange(len(self.end))

    @property
    def step_s(self) -> np.ndarray:
        return self.end - self.start


@dataclass
class Plan:
    """Everything the record emitters need, computed without building any record."""

    sc: Scenario
    topo: Topology
    faults: list[Resolved]
    benign: Benign
    segments: list[Segment]
    phys_nodes: list[str]  # every node that ever ran: base nodes, then spares
    node_on: np.ndarray  # (P,) ts the node's NVML samples start
    node_off: np.ndarray  # (P,) ts they stop (node lost or drained)
    gpu_off: dict[tuple[int, int], float]  # (phys node, gpu) -> ts its samples stop (fell off the bus)
    sdc_step: dict[int, int]  # rank -> first step whose replica digest is corrupt

    @property
    def stop(self) -> Stop | None:
        for s in self.segments:
            if s.stop is not None and s.stop.kind == "stall":
                return s.stop
        return None


def simulate(sc: Scenario) -> Plan:
    topo = Topology(sc.tp, sc.pp, sc.dp, sc.gpus_per_node, first_node=sc.first_node, width=sc.node_width)
    faults = resolve(sc, topo)
    benign = plan_benign(sc, topo)
    names = topo.node_names()
    phys = list(names)
    node_on = [sc.start_ts] * len(phys)
    node_off = [math.inf] * len(phys)
    gpu_off: dict[tuple[int, int], float] = {}
    segments: list[Segment] = []
    t0, step0 = sc.start_ts, sc.start_step
    running = faults
    while True:
        seg = _run_segment(sc, topo, running, benign, len(segments), t0, list(names), step0)
        segments.append(seg)
        stop = seg.stop
        if stop is None:
            break
        f = stop.fault
        if stop.kind == "stall":
            if f.kind == "node_loss":
                node_off[phys.index(seg.nodes[f.node])] = f.ts
            elif f.kind == "xid79":
                gpu_off[(phys.index(seg.nodes[f.node]), f.gpu)] = f.ts
            break
        # planned maintenance: the node is drained when its processes have exited
        node_off[phys.index(seg.nodes[f.node])] = float(seg.alive_until.max())
        restart = f.param("restart_after_s", 60.0)
        if restart is None or stop.ts + restart >= sc.end_ts:
            break
        spare = topo.node_name(len(phys))
        phys.append(spare)
        t0 = stop.ts + float(restart)
        node_on.append(t0)
        node_off.append(math.inf)
        names = list(seg.nodes)
        names[f.node] = spare
        seg.t_end = t0
        seg.alive_until = np.minimum(seg.alive_until, t0)
        step0 = stop.step + 1
        # the drained node's own faults leave with it
        running = [r for r in running if r is not f and r.node != f.node]
    sdc = {f.rank: _first_step_ending_after(segments, f.ts) for f in faults if f.kind == "sdc"}
    return Plan(sc, topo, faults, benign, segments, phys, np.array(node_on), np.array(node_off), gpu_off,
                {r: s for r, s in sdc.items() if s is not None})


def _first_step_ending_after(segments: list[Segment], ts: float) -> int | None:
    for s in segments:
        i = int(np.searchsorted(s.end, ts, side="left"))
        if i < len(s.end):
            return int(s.step0 + i)
    return None


def first_step_starting_at(segments: list[Segment], ts: float) -> int | None:
    for s in segments:
        i = int(np.searchsorted(s.start, ts, side="left"))
        if i < len(s.start):
            return int(s.step0 + i)
    return None


def _run_segment(sc: Scenario, topo: Topology, faults: list[Resolved], benign: Benign, index: int,
                 t0: float, nodes: list[str], step0: int) -> Segment:
    nz, R = sc.noise, topo.n
    r_jit, r_data, r_comm, r_loss = (rng(sc.seed, "seg", index, what) for what in ("jitter", "data", "comm", "loss"))
    r_fault = {f.index: rng(sc.seed, "fault", f.index, "seg", index) for f in faults}
    up = sc.launch_s * rng(sc.seed, "launch", index).random(R) if sc.launch_s > 0 else np.zeros(R)
    first_start = t0 + float(up.max()) + sc.startup_s  # synchronous: nobody steps before the last rank is up
    # stage baselines: the first stage (embedding) and the last (output layer, loss) do more work
    stage = np.ones(sc.pp)
    if sc.pp > 1:
        stage[-1] += sc.stage_skew
        stage[0] += sc.stage_skew / 2
    base_c = sc.base_step_s * COMPUTE_FRAC * stage[topo.pp]
    comm_base = sc.base_step_s * COMM_FRAC
    slow = [f for f in faults if f.kind in ("thermal_straggler", "intermittent_straggler", "nic_degradation",
                                            "heterogeneous")]
    stall = next((f for f in faults if f.kind in STALL_KINDS), None)
    also = tuple(f for f in faults if f.kind in STALL_KINDS and stall is not None and f is not stall
                 and f.ts == stall.ts)
    planned = next((f for f in faults if f.kind == "planned_maintenance"), None)
    flaps = [(fl.down_ts, fl.up_ts - fl.down_ts) for fl in benign.flaps if nodes[fl.node] == topo.node_name(fl.node)]
    ckpt_every = nz.ckpt_every_s if nz.enabled and nz.ckpt_every_s > 0 else math.inf
    next_ckpt = t0 + ckpt_every
    starts, ends, comps, datas, comms, ckpts, spikes = [], [], [], [], [], [], []
    stop: Stop | None = None
    t, j = first_start, 0
    while True:
        warm = 1.0 + nz.warmup_extra * math.exp(-3.0 * j / nz.warmup_steps) if nz.warmup_steps > 0 else 1.0
        c = base_c * warm
        if nz.jitter > 0:
            c = c * np.maximum(1.0 + nz.jitter * r_jit.standard_normal(R), 0.5)
        mult = np.ones(R)
        comm_mult = 1.0
        for f in slow:
            if t < f.ts:
                continue
            if f.kind == "thermal_straggler":
                ramp = min(1.0, (t - f.ts) / max(float(f.param("ramp_s", 60.0)), 1e-9))
                mult[f.rank] *= 1.0 + f.magnitude * ramp
            elif f.kind == "heterogeneous":
                mult[f.rank] *= 1.0 + f.magnitude
            elif f.kind == "intermittent_straggler":
                if r_fault[f.index].random() < float(f.param("prob", 0.3)):
                    mult[f.rank] *= 1.0 + f.magnitude
            else:  # nic_degradation
                mult[list(f.ranks)] *= 1.0 + NIC_COMPUTE_SHARE * f.magnitude
                comm_mult *= 1.0 + f.magnitude
        c = c * mult
        final = planned is not None and t >= planned.ts
        ck = None
        if t >= next_ckpt or final:
            save = nz.ckpt_s if nz.ckpt_s > 0 else 3.0
            c = c + save * (1.0 + 0.03 * r_jit.standard_normal(R))
            ck = (step0 + j, t, t + save)
            while next_ckpt <= t:
                next_ckpt += ckpt_every
        d = r_data.exponential(nz.data_wait_mean_s, R) if nz.data_wait_mean_s > 0 else np.zeros(R)
        arrive = c + d
        comm = comm_base * comm_mult * (1.0 + (0.01 * r_comm.standard_normal() if nz.enabled else 0.0))
        end = t + float(arrive.max()) + comm
        for down, dur in flaps:
            if t <= down < end:  # NCCL retries over the flapping link: the job hiccups
                comm += 0.5 * dur
                end += 0.5 * dur
        if stall is not None and stall.ts < end:
            stop = Stop("stall", stall, stall.ts, step0 + j, t, arrive, also)
            break
        if end > sc.end_ts:
            break
        starts.append(t)
        ends.append(end)
        comps.append(c)
        datas.append(d)
        comms.append(comm)
        if ck is not None:
            ckpts.append(ck)
        if nz.loss_spike_prob > 0 and r_loss.random() < nz.loss_spike_prob:
            spikes.append(step0 + j)
        t, j = end, j + 1
        if final:
            stop = Stop("planned", planned, end, step0 + j - 1)
            break
    n = len(ends)
    seg = Segment(
        index, t0, sc.end_ts, nodes, step0, first_start, np.array(starts), np.array(ends),
        np.array(comps).reshape(n, R), np.array(datas).reshape(n, R), np.array(comms),
        np.zeros(n), np.zeros(n), ckpts, up + sc.heartbeat_s * (1.0 - rng(sc.seed, "hb", index).random(R)),
        np.full(R, sc.end_ts), stop, spikes)
    _losses(sc, seg, faults, r_loss)
    _lifetimes(sc, topo, seg)
    return seg


def _losses(sc: Scenario, seg: Segment, faults: list[Resolved], r: np.random.Generator) -> None:
    steps = seg.steps.astype(float)
    n = len(steps)
    loss = loss_curve(steps) + 0.012 * r.standard_normal(n)
    grad = grad_curve(steps) * np.exp(0.05 * r.standard_normal(n))
    if seg.loss_spikes:
        at = np.array(seg.loss_spikes, float)
        loss += decaying(steps, at, r.uniform(0.3, 1.0, len(at)), 3.0)
        grad *= 1.0 + decaying(steps, at, r.uniform(0.5, 2.5, len(at)), 1.5)  # benign: under the 5x fault rule
    for f in faults:
        after = f.param("anomaly_after_s", 60.0) if f.kind == "sdc" else None
        if after is None:
            continue
        i = int(np.searchsorted(seg.start, f.ts + float(after), side="left"))
        if i < n:  # corrupted state surfaces: a spike, then a persistently worse loss
            at = np.array([steps[i]])
            loss += decaying(steps, at, np.array([1.5]), 20.0) + 0.04 * (steps >= steps[i])
            grad *= 1.0 + decaying(steps, at, np.array([30.0]), 2.0)
    seg.loss, seg.grad_norm = loss, grad


def _lifetimes(sc: Scenario, topo: Topology, seg: Segment) -> None:
    """When each rank's process goes silent (no more heartbeats)."""
    alive = seg.alive_until
    stop = seg.stop
    if stop is None:
        return
    f = stop.fault
    r = rng(sc.seed, "lifetimes", seg.index)
    if stop.kind == "planned":
        alive[:] = stop.ts + r.uniform(0.5, 2.0, topo.n)
        return
    if f.kind == "node_loss":
        alive[list(f.ranks)] = f.ts
    elif f.kind == "xid79":
        alive[f.rank] = f.ts + float(f.param("exception_after_s", 1.5)) + 0.2
    if sc.abort_on_timeout:
        die = f.ts + sc.nccl_timeout_s + r.uniform(5.0, 10.0, topo.n)
        np.minimum(alive, die, out=alive)
