"""A fleet day: many jobs of every size on one fleet of GPUs, concurrent and churning, faults at published rates,
with their ground truth (`gangwatch simulate --fleet`).

A `Fleet` is G GPUs (nodes of `gpus_per_node`) for H hours of event time. Jobs arrive as a Poisson process sized
to keep the fleet `busy` (80 %) full, each on a block of free nodes (first fit; a job that finds none waits for
one), each a `Scenario` of its own on those nodes: its own seed, shape, step time, clocks and faults.

- **Sizes and lengths.** Most jobs are small and a few are large (`SIZES`: 1-node jobs are half of all jobs,
  64-node ones 1 %), lengths log-normal around 40 minutes and longer for larger jobs. These are this project's
  assumptions, shaped like what published characterisations of GPU clusters report (most jobs small, a few
  large ones holding most GPU time: Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters", USENIX
  ATC 2019; Hu et al., "Characterization of Large Language Model Development in the Datacenter", NSDI 2024),
  not drawn from their data.
- **Faults** at the rate and mix of Meta's Llama 3 pre-training (Dubey et al., "The Llama 3 Herd of Models",
  2024, table 5): 419 unexpected interruptions in 54 days on 16,384 H100 GPUs (1.97e-5 per GPU-hour), and 47
  planned ones. `FAULT_MIX` maps each published cause onto what the simulator can inject: a faulty GPU, HBM3,
  SRAM or GPU system processor is a GPU lost (`xid79`); a software bug a hang in the data loader; NCCL watchdog
  timeouts and dependencies a pipeline deadlock; a switch, cable or NIC a degraded link; a host taken for
  maintenance, a power supply, SSD, chassis, CPU or memory a node lost; silent data corruption `sdc`; a GPU's
  thermal interface a throttled GPU. `fault_rate` multiplies the rate, so that a short fleet has faults to
  score. A job gets at most one fault (the first drawn); after a fault that stops it, its controller stops it
  `STOP_AFTER_S` later (as a real one does once it has answered), so the fleet goes on without it.
- **Ordinary life** at the rates of `LIFE`: a node's clock off from the start or stepped mid-run, a node's
  telemetry late or flushed in one burst, a rank steadily slower (a difference, no fault), clients without
  `mono`; the simulator's own noise in every job (checkpoint stalls, NIC flaps, loss spikes, ECC single-bit
  errors). A job ends in one of three ways, drawn: its controller's `end`, every rank's exit code 0, or telemetry
  that just stops.

The truth (`truth(fleet)`) lists every job with its scenario's truth (nodes renamed to the fleet's) and how it
ended; `gangwatch eval --fleet` scores a replay against it (`gangwatch/evaluation/fleetscore.py`).
"""

from __future__ import annotations

import heapq
import math
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

from gangwatch.producers.simulate.emit import _merged, boot_time
from gangwatch.producers.simulate.physics import simulate
from gangwatch.producers.simulate.scenario import STALL_KINDS, Fault, Scenario
from gangwatch.producers.simulate.truth import truth_of
from gangwatch.producers.simulate.writer import write_stream, write_truth

HOUR_S = 3600.0
# Llama 3 pre-training: interruptions per GPU-hour (54 days on 16,384 GPUs)
UNEXPECTED_PER_GPU_HOUR = 419 / (16_384 * 54 * 24)
PLANNED_PER_GPU_HOUR = 47 / (16_384 * 54 * 24)
# published cause (share of the 419, %) -> the simulator's fault kind
FAULT_MIX: tuple[tuple[str, float, str], ...] = (
    ("faulty GPU", 30.1, "xid79"), ("GPU HBM3 memory", 17.2, "xid79"), ("software bug", 12.9, "dataloader_hang"),
    ("network switch/cable", 8.4, "nic_degradation"), ("host maintenance", 7.6, "node_loss"),
    ("GPU SRAM memory", 4.5, "xid79"), ("GPU system processor", 4.1, "xid79"), ("NIC", 1.7, "nic_degradation"),
    ("NCCL watchdog timeouts", 1.7, "pp_deadlock"), ("silent data corruption", 1.4, "sdc"),
    ("GPU thermal interface and sensor", 1.4, "thermal_straggler"), ("SSD", 0.7, "node_loss"),
    ("power supply", 0.7, "node_loss"), ("server chassis", 0.5, "node_loss"), ("IO expansion board", 0.5, "node_loss"),
    ("dependency", 0.5, "pp_deadlock"), ("CPU", 0.5, "node_loss"), ("system memory", 0.5, "node_loss"),
)
# job size in nodes -> share of jobs
SIZES: tuple[tuple[int, float], ...] = ((1, 0.50), (2, 0.20), (4, 0.14), (8, 0.09), (16, 0.04), (32, 0.02),
                                        (64, 0.01))
# ordinary life: kind -> share of jobs that have it (on one healthy node or rank)
LIFE: tuple[tuple[str, float], ...] = (("clock_skew", 0.04), ("clock_step", 0.03), ("late_delivery", 0.02),
                                       ("spool_flush", 0.02), ("heterogeneous", 0.03), ("no_mono", 0.05))
END_FORMS = ("said", "exit 0", "silence")
STOP_AFTER_S = 150.0  # a stopped job's controller stops it this long after its fault (it answered meanwhile)
MIN_JOB_S = 600.0
# every job ends this long before the day does, its nodes' agents heard after it: the day's end cuts every
# producer at once, which no real fleet does (a job of one node whose telemetry just stopped at the end of the day
# looked like its node lost, where a clock ahead elsewhere moved the stream's time past it)
END_MARGIN_S = 120.0


@dataclass(frozen=True)
class Fleet:
    """G GPUs for H hours (see the module's docstring). `step_s`, `heartbeat_s`: every job's (a step record and a
    heartbeat per rank per period: what watching costs grows with them)."""

    gpus: int = 512
    hours: float = 2.0
    seed: int = 1
    fault_rate: float = 1.0
    gpus_per_node: int = 8
    busy: float = 0.8
    step_s: float = 5.0
    heartbeat_s: float = 5.0
    start_ts: float = 1_767_225_600.0  # 2026-01-01T00:00:00Z

    def __post_init__(self) -> None:
        if self.gpus < self.gpus_per_node or self.gpus % self.gpus_per_node:
            raise ValueError(f"a fleet of {self.gpus} GPUs is not whole nodes of {self.gpus_per_node}")
        if self.hours <= 0 or self.fault_rate < 0 or not 0 < self.busy <= 1:
            raise ValueError("hours must be > 0, fault_rate >= 0 and busy in (0, 1]")

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def end_ts(self) -> float:
        return self.start_ts + self.hours * HOUR_S

    @property
    def width(self) -> int:
        return max(4, len(str(self.nodes - 1)))


@dataclass(frozen=True)
class FleetJob:
    """One job of the fleet: its scenario (on the fleet's nodes `first`..), how it ends, what it lives through."""

    scenario: Scenario
    first: int
    nodes: int  # its block of the fleet's nodes (a spare for planned maintenance included)
    end: str  # one of END_FORMS; "stopped": its controller stopped it after a fault
    life: tuple[str, ...] = field(default=())
    causes: tuple[str, ...] = field(default=())  # the published cause of each fault

    @property
    def start_ts(self) -> float:
        return self.scenario.start_ts

    @property
    def end_ts(self) -> float:
        return self.scenario.start_ts + self.scenario.duration_s


def _shape(nodes: int, gpus_per_node: int) -> tuple[int, int, int]:
    """(tp, pp, dp) of a job of `nodes` nodes: data parallel on one node, tensor parallel within a node beyond."""
    g = gpus_per_node
    if nodes == 1:
        tp = 2 if g % 2 == 0 and g > 2 else 1
        return tp, 1, g // tp
    if nodes >= 8:
        return g, 2, nodes // 2
    return g, 1, nodes


def _place(free_at: list[float], n: int, t: float) -> tuple[int, float]:
    """The first block of `n` nodes free at `t` (its first node, t), else the block free soonest after `t`."""
    best = (0, math.inf)
    for first in range(len(free_at) - n + 1):
        at = max(free_at[first:first + n])
        if at <= t:
            return first, t
        if at < best[1]:
            best = (first, at)
    return best


def plan(fleet: Fleet) -> list[FleetJob]:
    """The fleet's jobs, in order of start (deterministic by `fleet.seed`)."""
    r = random.Random(f"fleet/{fleet.seed}")
    sizes = [n for n, _ in SIZES if n <= fleet.nodes] or [1]
    weights = [w for n, w in SIZES if n <= fleet.nodes] or [1.0]
    mean_len = {n: _mean_length(n) for n in sizes}
    node_s = sum(w * n * mean_len[n] for n, w in zip(sizes, weights, strict=True)) / sum(weights)
    per_s = fleet.busy * fleet.nodes / node_s  # arrivals a second that keep the fleet `busy` full
    free_at = [fleet.start_ts] * fleet.nodes
    jobs: list[FleetJob] = []
    t = fleet.start_ts
    # the fleet starts `busy` full: that many jobs arrive in its first minutes
    mean_nodes = sum(n * w for n, w in zip(sizes, weights, strict=True)) / sum(weights)
    warm = [fleet.start_ts + r.uniform(0, 300.0) for _ in range(max(1, round(fleet.busy * fleet.nodes / mean_nodes)))]
    arrivals = iter(sorted(warm))
    k = 0
    while True:
        t = next(arrivals, None) or t + r.expovariate(per_s)
        if t >= fleet.end_ts - MIN_JOB_S:
            break
        n = r.choices(sizes, weights)[0]
        length = min(r.lognormvariate(math.log(mean_len[n]), 0.8), 12 * HOUR_S)
        job = _job(fleet, r, k, n, t, max(MIN_JOB_S, length), free_at)
        if job is None:
            continue
        k += 1
        jobs.append(job)
        for i in range(job.first, job.first + job.nodes):
            free_at[i] = job.end_ts + 30.0
    return sorted(jobs, key=lambda j: (j.start_ts, j.first))


def _mean_length(nodes: int) -> float:
    return 40 * 60.0 * (1 + math.log2(nodes) / 2)


def _job(fleet: Fleet, r: random.Random, k: int, n: int, arrive: float, length: float,
         free_at: list[float]) -> FleetJob | None:
    """Job `k` of `n` nodes arriving at `arrive` for `length` s, placed and given its faults and life; None when
    it would start too late to run `MIN_JOB_S`."""
    tp, pp, dp = _shape(n, fleet.gpus_per_node)
    gpus = n * fleet.gpus_per_node
    hours = length / HOUR_S
    unexpected = _poisson(r, UNEXPECTED_PER_GPU_HOUR * gpus * hours * fleet.fault_rate)
    planned = _poisson(r, PLANNED_PER_GPU_HOUR * gpus * hours * fleet.fault_rate) if n > 1 else 0
    need = n + (1 if planned and not unexpected else 0)
    first, start = _place(free_at, need, arrive)
    if start + MIN_JOB_S >= fleet.end_ts - END_MARGIN_S or math.isinf(start):
        return None
    start = round(start, 3)
    length = math.floor(min(length, fleet.end_ts - END_MARGIN_S - start) * 10) / 10
    name = f"j{k:04d}"
    node = lambda i: f"n{first + i:0{fleet.width}d}"  # noqa: E731
    faults: list[Fault] = []
    causes: list[str] = []
    end = r.choice(END_FORMS)
    warmup = 180.0
    if unexpected and length > warmup + 300.0:
        cause, _, kind = r.choices(FAULT_MIX, [w for _, w, _ in FAULT_MIX])[0]
        if kind == "sdc" and dp < 2:
            kind = "xid79"  # (no replica to disagree with: the simulator cannot corrupt a lone replica)
        if kind == "pp_deadlock" and pp < 2:
            kind = "dataloader_hang"  # (no pipeline stages to deadlock: a software hang of another kind)
        at = r.uniform(warmup, length - 300.0)
        if kind == "nic_degradation" and n == 1:  # a job of one node sends nothing through its NIC: unharmed
            kind = None
        at = round(at, 1)
        where = node(r.randrange(n))
        if kind is not None:
            faults.append(Fault(kind, at, node=where))
            causes.append(cause)
        if kind in STALL_KINDS:
            length = at + STOP_AFTER_S
            end = "stopped"
    elif planned and length > warmup + 600.0:
        at = round(r.uniform(warmup + 120.0, length - 300.0), 1)
        faults.append(Fault("planned_maintenance", at, node=node(r.randrange(n)), params={"restart_after_s": 60.0}))
        causes.append("planned maintenance")
    life = []
    healthy = [i for i in range(n) if not faults or faults[0].node != node(i)]
    # what happens in a job's ordinary life happens before a fault or maintenance stops it (the simulator runs
    # nothing after a stop)
    until = faults[0].at_s if faults and faults[0].kind in STALL_KINDS | {"planned_maintenance"} else length
    for kind, share in LIFE:
        if r.random() >= share or not healthy:
            continue
        if kind in ("clock_step", "late_delivery", "spool_flush") and until < 240.0:
            continue  # (no room before the stop)
        life.append(kind)
        where = node(r.choice(healthy))
        if kind == "clock_skew":
            faults.append(Fault("clock_skew", 0.0, node=where, params={"offset_s": round(r.choice([-1, 1]) *
                                                                                     r.uniform(3.0, 60.0), 1)}))
        elif kind == "clock_step":
            faults.append(Fault("clock_skew", round(r.uniform(60.0, until - 60.0), 1), node=where,
                                params={"offset_s": round(r.choice([-1, 1]) * r.uniform(3.0, 60.0), 1)}))
        elif kind == "late_delivery":
            faults.append(Fault("late_delivery", round(r.uniform(60.0, until / 2), 1), node=where,
                                params={"lag_s": round(r.uniform(5.0, 30.0), 1)}))
        elif kind == "spool_flush":
            faults.append(Fault("late_delivery", round(r.uniform(60.0, until - 120.0), 1), node=where,
                                params={"flush_s": round(r.uniform(10.0, 40.0), 1)}))
        elif kind == "heterogeneous":
            rank = r.choice([i for i in range(n * fleet.gpus_per_node) if i // fleet.gpus_per_node in healthy])
            faults.append(Fault("heterogeneous", 0.0, rank=rank))
    sc = Scenario(name, seed=fleet.seed * 100_003 + k, tp=tp, pp=pp, dp=dp, gpus_per_node=fleet.gpus_per_node,
                  heartbeat_s=fleet.heartbeat_s, base_step_s=fleet.step_s, duration_s=round(length, 1),
                  start_ts=start, job=name, faults=tuple(faults), first_node=first,
                  node_width=fleet.width, mono="no_mono" not in life, sweep_after_s=20.0)
    return FleetJob(sc, first, need, end, tuple(life), tuple(causes))


def _poisson(r: random.Random, mean: float) -> int:
    """A Poisson draw (Knuth's; the means here are small)."""
    limit, k, p = math.exp(-mean), 0, 1.0
    while True:
        p *= r.random()
        if p <= limit:
            return k
        k += 1


def _said_end(job: FleetJob) -> list[tuple[float, dict]]:
    """The records that end `job` as it ends (its stream stops at `end_ts` by itself)."""
    sc, t = job.scenario, job.end_ts
    if job.end == "said":
        return [(t + 1.0, {"kind": "lifecycle", "v": 1, "ts": round(t + 1.0, 6), "job": sc.job_id, "event": "end",
                           "source": "controller"})]
    if job.end == "exit 0":  # each rank's launcher says it, on its node's clock (off as the job's records are)
        n, out = sc.tp * sc.pp * sc.dp, []
        for rank in range(n):
            at = t + 0.5 + 0.001 * rank
            node = f"n{job.first + rank // sc.gpus_per_node:0{sc.node_width}d}"
            off = sum(float(f.params.get("offset_s", 0.0)) for f in sc.faults
                      if f.kind == "clock_skew" and f.node == node and sc.start_ts + f.at_s <= at)
            out.append((at, {"kind": "framework", "v": 1, "ts": round(at + off, 6), "job": sc.job_id, "rank": rank,
                             "type": "exit", "code": 0}))
        return out
    if job.end == "stopped":
        return [(t, {"kind": "lifecycle", "v": 1, "ts": round(t, 6), "job": sc.job_id, "event": "stop",
                     "source": "controller", "reason": "stopped after its fault"})]
    return []


IDLE_SAMPLE_S = 10.0  # a node agent's NVML period (the agent's default `--gpu-every`)


def _idle_samples(fleet: Fleet, jobs: list[FleetJob]) -> Iterator[tuple[float, dict]]:
    """What each node's agent says while no job runs there: an NVML sample of every idle GPU each
    `IDLE_SAMPLE_S` (a job's scenario samples its own nodes while it runs; a node whose records the job delivered
    late, or stamped ahead, starts again past the last of them, so that its agent's records keep their order)."""
    busy: list[list[tuple[float, float]]] = [[] for _ in range(fleet.nodes)]
    for j in jobs:
        late: dict[str | None, float] = {}  # node -> how far after the job's end its last record may be stamped
        for f in j.scenario.faults:  # or arrive: a clock ahead, records delivered late
            if f.kind in ("late_delivery", "clock_skew"):
                by = max(float(f.params.get(k) or 0.0) for k in ("lag_s", "flush_s", "offset_s"))
                late[f.node] = max(late.get(f.node, 0.0), by)
        for i in range(j.first, min(j.first + j.nodes, fleet.nodes)):
            busy[i].append((j.start_ts, j.end_ts + late.get(f"n{i:0{fleet.width}d}", 0.0)))
    names = [f"n{i:0{fleet.width}d}" for i in range(fleet.nodes)]
    boots = [boot_time(n, fleet.start_ts) for n in names]
    phase = [(zlib.crc32(n.encode()) % 1000) / 1000 * IDLE_SAMPLE_S for n in names]
    by_phase = sorted(range(fleet.nodes), key=lambda i: phase[i])  # each sweep in time order, as they arrive
    t = fleet.start_ts
    while t < fleet.end_ts:
        for i in by_phase:
            name = names[i]
            at = round(t + phase[i], 6)
            if at >= fleet.end_ts or any(a <= at < b for a, b in busy[i]):
                continue
            for g in range(fleet.gpus_per_node):
                yield at, {"kind": "gpu", "v": 1, "ts": at, "node": name, "gpu": g, "temp_c": 38, "power_w": 72.0,
                           "sm_clock_mhz": 345, "util_pct": 0, "throttle": [], "ecc_sbe": 0, "ecc_dbe": 0,
                           "remap_pending": False, "pcie_replay": 0, "nvlink_crc": 0, "mono": round(at - boots[i], 6)}
        t += IDLE_SAMPLE_S


def messages(fleet: Fleet, jobs: list[FleetJob] | None = None) -> Iterator[dict]:
    """Every job's messages and the idle nodes' agents', merged in the order they arrive (each producer's own
    order kept). A job is simulated when the fleet's time reaches its start and let go at its end, so a day holds
    the jobs of a moment, not all."""
    jobs = sorted(plan(fleet) if jobs is None else jobs, key=lambda j: j.start_ts)
    heap: list[tuple[float, int, dict, Iterator[tuple[float, dict]]]] = []
    idle = _idle_samples(fleet, jobs)
    first = next(idle, None)
    if first is not None:
        heap.append((first[0], -1, first[1], idle))
    nxt = 0
    while nxt < len(jobs) or heap:
        while nxt < len(jobs) and (not heap or jobs[nxt].start_ts <= heap[0][0]):
            job = jobs[nxt]
            stream = heapq.merge(_merged(simulate(job.scenario), batch=False), _said_end(job), key=itemgetter(0))
            first = next(stream, None)
            if first is not None:
                heapq.heappush(heap, (first[0], nxt, first[1], stream))
            nxt += 1
        key, i, rec, stream = heap[0]
        yield rec
        more = next(stream, None)
        if more is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (more[0], i, more[1], stream))


def truth(fleet: Fleet, jobs: list[FleetJob] | None = None) -> dict[str, Any]:
    """{fleet: its parameters, gpu_hours, jobs: [{job, start_ts, end_ts, nodes, end, life, causes, truth}]}."""
    jobs = plan(fleet) if jobs is None else jobs
    return {"fleet": {"gpus": fleet.gpus, "hours": fleet.hours, "seed": fleet.seed, "fault_rate": fleet.fault_rate,
                      "gpus_per_node": fleet.gpus_per_node, "start_ts": fleet.start_ts, "end_ts": fleet.end_ts,
                      "step_s": fleet.step_s, "heartbeat_s": fleet.heartbeat_s},
            "jobs": [{"job": j.scenario.job_id, "start_ts": j.start_ts, "end_ts": round(j.end_ts, 3),
                      "first_node": j.first, "nodes": j.nodes, "gpus": j.scenario.tp * j.scenario.pp * j.scenario.dp,
                      "end": j.end, "life": list(j.life), "causes": list(j.causes),
                      "truth": truth_of(simulate(j.scenario))} for j in jobs]}



def write(fleet: Fleet, out_dir: str | Path, name: str = "fleet") -> tuple[Path, Path]:
    """The fleet's messages to `<name>.jsonl.gz` and its truth to `<name>.truth.json` in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jobs = plan(fleet)
    stream = write_stream(messages(fleet, jobs), out / f"{name}.jsonl.gz")
    return stream, write_truth(truth(fleet, jobs), out / f"{name}.truth.json")
