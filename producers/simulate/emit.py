"""Turn a `Plan` into contract-v1 record dicts, merged in event-time order.

Streams (each already in time order, merged with `heapq.merge`): job/ops/hw/framework/
stack/flight events, per-rank steps, per-rank heartbeats, per-GPU NVML samples. Per-step
work is vectorized with numpy over ranks; only the final dict building is per record.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Iterator
from operator import itemgetter

import numpy as np
from gangwatch.producers.simulate.physics import Plan, Segment, simulate
from gangwatch.producers.simulate.placement import gpu_bus, nic_bus, rng
from gangwatch.producers.simulate.scenario import Scenario
from gangwatch.producers.simulate.traces import stall_records

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def generate(sc: Scenario) -> Iterator[dict]:
    """Every record of the scenario, one dict each, in event-time order (batches never packed)."""
    for _, rec in _merged(simulate(sc), batch=False):
        yield rec


def messages(sc: Scenario) -> Iterator[dict]:
    """The messages a file or topic carries: like `generate`, but with `sc.batch` each node's
    step records of a step are packed into one `batch` message (ts = its latest item)."""
    for _, rec in _merged(simulate(sc), batch=sc.batch):
        yield rec


def _merged(plan: Plan, batch: bool) -> Iterator[tuple[float, dict]]:
    merged = heapq.merge(_events(plan), _steps(plan, batch), _heartbeats(plan), _gpus(plan), key=itemgetter(0))
    monitoring = [f for f in plan.faults if f.kind in ("clock_skew", "late_delivery")]
    return _delivered(plan, merged, monitoring) if monitoring else merged


# --- what the monitoring path does to a node's records: its clock, their delivery ------------------------------


def _delivered(plan: Plan, stream: Iterator[tuple[float, dict]], faults: list) -> Iterator[tuple[float, dict]]:
    """The stream as the monitoring path delivers it: a `clock_skew` node's records carry its clock's time (from
    the fault's onset), a `late_delivery` node's arrive late (in arrival order: the order key moves, the time
    does not). Records are matched to a node by their rank (of the fault's node) or their `node`."""
    name = plan.segments[0].nodes
    skews = [(f.ts, set(f.ranks), name[f.node], float(f.param("offset_s", 30.0))) for f in faults
             if f.kind == "clock_skew"]
    lates = [(f.ts, set(f.ranks), name[f.node], f.param("flush_s"), float(f.param("lag_s", 20.0))) for f in faults
             if f.kind == "late_delivery"]
    held: list[tuple[float, int, dict]] = []
    seq = 0
    for key, rec in stream:
        for at, ranks, node, off in skews:
            _skew(rec, at, ranks, node, off)
        delay = None
        for at, ranks, node, flush, lag in lates:
            if rec["ts"] >= at and _of_node(rec, ranks, node):
                delay = (at + flush - key + seq * 1e-6) if flush is not None and key < at + flush else \
                    (None if flush is not None else lag)
        while held and held[0][0] <= key:
            yield heapq.heappop(held)[::2]
        if delay is None:
            yield key, rec
        else:
            seq += 1
            heapq.heappush(held, (key + delay, seq, rec))
    while held:
        yield heapq.heappop(held)[::2]


def _of_node(rec: dict, ranks: set[int], node: str) -> bool:
    if rec.get("kind") == "batch":
        return any(_of_node(x, ranks, node) for x in rec["items"])
    return rec.get("rank") in ranks if rec.get("rank") is not None else rec.get("node") == node


def _skew(rec: dict, at: float, ranks: set[int], node: str, off: float) -> None:
    """The node's records from `at` on (by the true time) carry its clock's: `off` seconds ahead."""
    if rec.get("kind") == "batch":
        for x in rec["items"]:
            _skew(x, at, ranks, node, off)
        rec["ts"] = max(x["ts"] for x in rec["items"])
    elif rec["kind"] != "job" and rec["ts"] >= at and _of_node(rec, ranks, node):
        rec["ts"] = round(rec["ts"] + off, 6)


# --- steps ---------------------------------------------------------------------------------


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer over uint64 arrays."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


BOOTED = 1_700_000_000.0  # 2023-11-14: before it, each node booted once (the same for every scenario on it)


def boot_time(name: str, start_ts: float) -> float:
    """When node `name` booted (its monotonic clock's zero), by its name alone: a job that goes on in a later
    scenario (a drill's next episode, the next job on a fleet's node) runs on the same monotonic clock. A
    scenario that starts before `BOOTED` has its nodes booted days before it."""
    latest = min(BOOTED, start_ts - 86_400.0)
    return latest - 86_400.0 * (zlib.crc32(name.encode()) % 13) - zlib.crc32(name.encode()[::-1]) % 86_400


def _boots(plan: Plan) -> dict[str, float]:
    return {name: boot_time(name, plan.sc.start_ts) for name in plan.phys_nodes}


def _steps(plan: Plan, batch: bool) -> Iterator[tuple[float, dict]]:
    sc, topo = plan.sc, plan.topo
    job, R, G = sc.job_id, topo.n, topo.G
    boots = _boots(plan)
    n_shards = topo.TP * topo.PP
    shard_ids = np.arange(n_shards, dtype=np.uint64)
    seed_word = np.uint64(sc.seed & 0xFFFFFFFF) << np.uint64(32)
    sdc = sorted(plan.sdc_step.items())
    for seg in plan.segments:
        r = rng(sc.seed, "report", seg.index)
        boot = np.array([boots[seg.nodes[rk // G]] for rk in range(R)])
        for i, k in enumerate(seg.steps.tolist()):
            end = float(seg.end[i])
            ts = np.round(end + r.uniform(0.0005, 0.004, R), 6)
            mono = np.round(ts - boot, 6).tolist() if sc.mono else None
            ss = round(end - float(seg.start[i]), 6)
            c = np.round(seg.compute[i], 6)
            d = np.round(seg.data[i], 6)
            cw = np.maximum(np.round(ss - c - d, 6), 0.0)
            h = _mix(seed_word ^ (np.uint64(k) * np.uint64(n_shards) + shard_ids))
            shard_hex = [f"{v:016x}" for v in h.tolist()]
            dig = [shard_hex[s] for s in topo.shard.tolist()]
            for rank, first in sdc:
                if k >= first:  # the corrupted replica diverges from its peers
                    bad = _mix(np.array([h[topo.shard[rank]] ^ np.uint64(0x5DC0000 + rank)], np.uint64))
                    dig[rank] = f"{int(bad[0]):016x}"
            loss = round(float(seg.loss[i]), 5)
            gn = round(float(seg.grad_norm[i]), 5)
            cols = zip(range(R), ts.tolist(), c.tolist(), cw.tolist(), d.tolist(), dig, strict=True)
            recs = [{"kind": "step", "v": 1, "ts": t, "job": job, "rank": rk, "step": k, "step_s": ss,
                     "compute_s": cc, "comm_wait_s": ww, "data_wait_s": dd, "loss": loss, "grad_norm": gn,
                     "replica_digest": dg}
                    for rk, t, cc, ww, dd, dg in cols]
            if mono is not None:
                for rec, m in zip(recs, mono, strict=True):
                    rec["mono"] = m
            if batch:
                out = []
                for n in range(topo.n_nodes):
                    items = sorted(recs[n * G:(n + 1) * G], key=itemgetter("ts"))
                    bts = items[-1]["ts"]
                    out.append((bts, {"kind": "batch", "v": 1, "ts": bts, "items": items}))
                out.sort(key=itemgetter(0))
                yield from out
            else:
                for j in np.argsort(ts, kind="stable").tolist():
                    rec = recs[j]
                    yield rec["ts"], rec


# --- heartbeats --------------------------------------------------------------------------------


def _heartbeats(plan: Plan) -> Iterator[tuple[float, dict]]:
    sc = plan.sc
    job, G, boots = sc.job_id, plan.topo.G, _boots(plan)
    for seg in plan.segments:
        times = _beat_times(sc, seg)
        rank, k = np.nonzero(times < np.minimum(seg.alive_until, seg.t_end)[:, None])
        ts = times[rank, k]
        order = np.lexsort((rank, ts))
        idx = np.searchsorted(seg.end, ts, side="right") - 1
        for r, t, ix in zip(rank[order].tolist(), ts[order].tolist(), idx[order].tolist(), strict=True):
            rec = {"kind": "heartbeat", "v": 1, "ts": t, "job": job, "rank": r}
            if ix >= 0:
                rec["step"] = seg.step0 + ix
            if sc.mono:
                rec["mono"] = round(t - boots[seg.nodes[r // G]], 6)
            yield t, rec


def _beat_times(sc: Scenario, seg: Segment) -> np.ndarray:
    """(R, K) heartbeat times of every rank of a segment, rounded to the microsecond.

    A rank's heartbeat thread beats a period after its previous beat, always a little
    late and now and then much later (see `Noise`); the delays add up, as a thread
    that waits a period after each beat drifts.
    """
    nz, hb = sc.noise, sc.heartbeat_s
    n_ranks, n_beats = len(seg.hb_first), int((seg.t_end - seg.t0) // hb) + 2
    late = np.zeros((n_ranks, n_beats))
    r = rng(sc.seed, "hb-delay", seg.index)
    if nz.hb_delay_s > 0:
        late[:, 1:] += r.exponential(nz.hb_delay_s, (n_ranks, n_beats - 1))
    if nz.hb_pause_prob > 0:
        paused = r.random((n_ranks, n_beats - 1)) < nz.hb_pause_prob
        late[:, 1:] += paused * r.uniform(0.0, nz.hb_pause_s, (n_ranks, n_beats - 1))
    nominal = seg.t0 + np.arange(n_beats) * hb + seg.hb_first[:, None]
    return np.round(nominal + np.cumsum(late, axis=1), 6)


# --- NVML samples ----------------------------------------------------------------------------

IDLE, STARTUP, ACTIVE, CKPT, SPIN, OFF = range(6)
_UTIL = np.array([0, 25, 97, 12, 100, 0], float)
_POWER = np.array([72, 180, 640, 210, 285, 0], float)
_CLOCK = np.array([345, 1980, 1980, 1980, 1980, 0], float)
_TEMP = np.array([0, 4, 14, 6, 9, 0], float)


def _gpus(plan: Plan) -> Iterator[tuple[float, dict]]:
    sc, topo, bn = plan.sc, plan.topo, plan.benign
    G = topo.G
    P = len(plan.phys_nodes)
    PG = P * G
    r = rng(sc.seed, "nvml")
    phase = r.uniform(0.0, sc.gpu_sample_s, PG)
    order = np.argsort(phase, kind="stable")
    base_temp = r.uniform(52.0, 66.0, PG)
    ecc = np.zeros(PG, np.int64)
    ecc[:topo.n] = bn.ecc_start
    pcie = np.zeros(PG, np.int64)
    pcie[:topo.n] = bn.pcie_replay
    nvlink = np.zeros(PG, np.int64)
    # failing links: (physical GPU, onset, the counter they drive, errors per sample interval, their own RNG)
    links = [(f.node * G + f.gpu, f.ts, pcie if f.param("counter", "pcie_replay") == "pcie_replay" else nvlink,
              float(f.param("rate_per_s", 1.0 if f.param("counter", "pcie_replay") == "pcie_replay" else 1000.0))
              * sc.gpu_sample_s, rng(sc.seed, "link", f.index))
             for f in plan.faults if f.kind == "link_errors"]
    pnode = np.arange(PG) // G
    on, off = plan.node_on[pnode], plan.node_off[pnode].copy()
    for (p, g), t in plan.gpu_off.items():
        off[p * G + g] = t
    # rank running on each physical GPU, per segment (-1: not in that segment's job)
    seg_rank = []
    for seg in plan.segments:
        m = np.full(PG, -1)
        for i, name in enumerate(seg.nodes):
            p = plan.phys_nodes.index(name)
            m[p * G:(p + 1) * G] = np.arange(i * G, (i + 1) * G)
        seg_rank.append(m)
    thermal = [(f.node * G + f.gpu, f.ts, max(float(f.param("ramp_s", 60.0)), 1e-9), f.magnitude)
               for f in plan.faults if f.kind == "thermal_straggler"]
    names = plan.phys_nodes
    boots = _boots(plan)
    j = 0
    while True:
        ts = np.round(sc.start_ts + j * sc.gpu_sample_s + phase, 6)
        if ts.min() >= sc.end_ts:
            break
        state = np.full(PG, IDLE)
        for seg, m in zip(plan.segments, seg_rank, strict=True):
            _segment_states(plan, seg, m, ts, state)
        state[(ts < on) | (ts >= off) | (ts >= sc.end_ts)] = OFF
        util = np.clip(_UTIL[state] + np.where(state == ACTIVE, np.round(r.normal(0, 1.0, PG)), 0), 0, 100)
        power = np.maximum(_POWER[state] + r.normal(0, 12.0, PG), 0)
        clock = _CLOCK[state] - np.where(state == ACTIVE, 15 * r.integers(0, 6, PG), 0)
        temp = base_temp + _TEMP[state] + r.normal(0, 0.6, PG)
        throttle: dict[int, list[str]] = {}
        for pg_, t0, ramp_s, mag in thermal:
            if ts[pg_] >= t0 and state[pg_] != OFF:
                ramp = min(1.0, (ts[pg_] - t0) / ramp_s)
                temp[pg_] = max(temp[pg_], base_temp[pg_] + (91.0 - base_temp[pg_]) * ramp)
                if state[pg_] in (ACTIVE, CKPT, SPIN):
                    clock[pg_] = 15 * round(1980 / (1 + mag * ramp) / 15)
                throttle[pg_] = ["sw_thermal", "hw_thermal"] if ramp > 0.75 else ["sw_thermal"] if ramp > 0.25 else []
        if len(bn.ecc_gpus):
            ecc[bn.ecc_gpus] += r.poisson(0.15, len(bn.ecc_gpus))
        for pg_, t0, counter, per_sample, lr in links:
            if ts[pg_] >= t0 and state[pg_] != OFF:
                counter[pg_] += lr.poisson(per_sample)
        cols = zip(order.tolist(), ts[order].tolist(), state[order].tolist(), np.round(temp[order]).tolist(),
                   np.round(power[order], 1).tolist(), clock[order].tolist(), util[order].tolist(),
                   ecc[order].tolist(), pcie[order].tolist(), nvlink[order].tolist(), strict=True)
        for pg_, t, st, tc, pw, ck, ut, e, pr, nv in cols:
            if st == OFF:
                continue
            yield t, {"kind": "gpu", "v": 1, "ts": t, "node": names[pg_ // G], "gpu": pg_ % G, "temp_c": int(tc),
                      "power_w": pw, "sm_clock_mhz": int(ck), "util_pct": int(ut), "throttle": throttle.get(pg_, []),
                      "ecc_sbe": e, "ecc_dbe": 0, "remap_pending": False, "pcie_replay": pr, "nvlink_crc": nv,
                      **({"mono": round(t - boots[names[pg_ // G]], 6)} if sc.mono else {})}
        j += 1


def _segment_states(plan: Plan, seg: Segment, rank_of: np.ndarray, ts: np.ndarray, state: np.ndarray) -> None:
    m = (ts >= seg.t0) & (ts < seg.t_end) & (rank_of >= 0)
    if not m.any():
        return
    t, rk = ts[m], rank_of[m]
    st = np.full(len(t), ACTIVE)
    st[t < seg.first_start] = STARTUP
    for _, a, b in seg.ckpt:
        st[(t >= a) & (t < b)] = CKPT
    stop = seg.stop
    if stop is not None and stop.kind == "stall":
        after = t >= stop.fault.ts
        st[after] = SPIN
        for f in stop.faults:
            if f.kind == "dataloader_hang":  # the culprit's GPU idles; the others spin in NCCL
                st[after & np.isin(rk, f.ranks)] = IDLE
    st[t >= seg.alive_until[rk]] = IDLE
    state[m] = st


# --- discrete events -------------------------------------------------------------------------


def _events(plan: Plan) -> list[tuple[float, dict]]:
    sc, topo = plan.sc, plan.topo
    job = sc.job_id
    r = rng(sc.seed, "events")
    ev: list[tuple[float, dict]] = []
    for seg in plan.segments:
        ev.append((seg.t0, {"kind": "job", "v": 1, "ts": round(seg.t0, 6), "job": job, "heartbeat_s": sc.heartbeat_s,
                            "ranks": topo.job_ranks(seg.nodes, sc.nodes_per_switch)}))
        stop = seg.stop
        if stop is None:
            continue
        if stop.kind == "stall":
            ev += stall_records(plan, seg, stop)
        else:
            node = seg.nodes[stop.fault.node]
            for rank, until in enumerate(seg.alive_until.tolist()):
                t = round(until - 0.05, 6)
                ev.append((t, {"kind": "framework", "v": 1, "ts": t, "job": job, "rank": rank, "type": "exit",
                               "message": f"graceful exit after checkpoint at step {stop.step}: "
                                          f"planned maintenance on {node}"}))
    for f in plan.faults:
        name = plan.segments[0].nodes[f.node]

        def hw(ts: float, source: str, message: str, gpu: int | None = None, code: int | None = None,
               node: str = name) -> None:
            rec = {"kind": "hw", "v": 1, "ts": round(ts, 6), "node": node, "source": source, "message": message}
            if gpu is not None:
                rec["gpu"] = gpu
            if code is not None:
                rec["code"] = code
            ev.append((rec["ts"], rec))

        if f.kind == "xid79":
            bus = gpu_bus(f.gpu)
            pid = int(f.param("pid", 1000 + int(r.integers(0, 60000))))
            hw(f.ts, "xid", f"NVRM: Xid (PCI:0000:{bus}:00): 79, pid={pid}, name=python, GPU has fallen off the bus.",
               f.gpu, 79)
            hw(f.ts + 0.002, "kernel", f"NVRM: GPU 0000:{bus}:00.0: GPU has fallen off the bus.", f.gpu)
        elif f.kind == "nic_degradation":
            nic = int(f.param("nic", 0))
            nb = nic_bus(nic)
            hw(f.ts, "nic", f"mlx5_core 0000:{nb}:00.0: Port module event[error]: module {nic}, Cable error, "
                            f"High BER; link degraded 400000Mb/s -> 200000Mb/s")
            every = float(f.param("event_every_s", 30.0))
            stop_ts = plan.stop.fault.ts if plan.stop else sc.end_ts
            t = f.ts + every
            while t < min(stop_ts, sc.end_ts):
                a, b = int(r.integers(200, 5000)), int(r.integers(5, 80))
                hw(t, "nic", f"infiniband mlx5_{nic}: port 1: symbol_error +{a}, port_rcv_errors +{b}, "
                             f"link_error_recovery +{int(r.integers(0, 3))} in {every:g}s")
                t += every
        elif f.kind == "thermal_straggler" and f.param("bmc", True):
            t = f.ts + 0.8 * float(f.param("ramp_s", 60.0))
            if t < sc.end_ts:
                hw(t, "bmc", f"SEL {int(r.integers(0x100, 0xFFFF)):04X} | GPU{f.gpu}_TEMP | Temperature | "
                             f"Upper Critical going high | Asserted | Reading 91 > Threshold 90 degrees C", f.gpu)
        elif f.kind == "planned_maintenance":
            lead = float(f.param("lead_s", 120.0))
            t = max(sc.start_ts + 0.001, f.ts - lead)
            restart = f.param("restart_after_s", 60.0)
            seg0 = next(s for s in plan.segments if s.stop is not None and s.stop.fault is f)
            rec = {"kind": "ops", "v": 1, "ts": round(t, 6), "job": job, "node": name, "type": "maintenance",
                   "planned": True, "note": str(f.param("note", "kernel upgrade"))}
            if restart is not None:
                rec["until_ts"] = round(seg0.stop.ts + float(restart), 6)
            ev.append((rec["ts"], rec))
    for fl in plan.benign.flaps:
        p = fl.node
        if not plan.node_on[p] <= fl.down_ts < plan.node_off[p] or fl.up_ts >= sc.end_ts:
            continue
        nb = nic_bus(fl.nic)
        for t, what in ((fl.down_ts, "Link down"), (fl.up_ts, "Link up")):
            if t >= plan.node_off[p]:
                continue  # the node was gone before its link came back: it says nothing more
            rec = {"kind": "hw", "v": 1, "ts": round(t, 6), "node": plan.phys_nodes[p], "source": "nic",
                   "message": f"mlx5_core 0000:{nb}:00.0 ibp{int(nb, 16)}s0: {what}"}
            ev.append((rec["ts"], rec))
    ev.sort(key=itemgetter(0))
    return ev
