"""Ground truth of a scenario: what was injected, where, when; and the benign noise that is not a fault."""

from __future__ import annotations

from typing import Any

from gangwatch.producers.simulate.physics import Plan, first_step_starting_at, simulate
from gangwatch.producers.simulate.scenario import STALL_KINDS, Scenario

RANK_MAPPING = ("rank = node_index * gpus_per_node + gpu; tp = rank % tp; pp = rank // tp % pp; "
                "dp = rank // (tp * pp); nodes n000, n001, ...")


def _t(x: float | None) -> float | None:
    return None if x is None else round(float(x), 6)


def truth(sc: Scenario) -> dict[str, Any]:
    """JSON-able ground truth (see `truth_of` for the layout)."""
    return truth_of(simulate(sc))


def truth_of(plan: Plan) -> dict[str, Any]:
    """{scenario, job, topology, healthy, faults: [{kind, class, planned, onset_ts, onset_step, nodes,
    ranks, gpus, magnitude, stall, ...}], stall, segments, benign: {checkpoints, nic_flaps, loss_spikes,
    ecc_sbe_gpus}}. `onset_step`: first step the fault shows in (SDC: the first step whose replica
    digest is corrupt; stall: the step that never completes)."""
    sc, topo = plan.sc, plan.topo
    segs = plan.segments
    faults = []
    for f in plan.faults:
        names = segs[0].nodes
        entry: dict[str, Any] = {
            "kind": f.kind, "class": f.fault.cls, "planned": f.kind == "planned_maintenance",
            "onset_ts": _t(f.ts), "at_s": f.fault.at_s, "nodes": [names[f.node]], "ranks": list(f.ranks),
            "gpus": [[names[f.node], f.gpu]] if f.gpu is not None else [[names[f.node], g] for g in range(topo.G)],
            "magnitude": f.magnitude, "stall": f.kind in STALL_KINDS,
            "params": {k: v for k, v in sorted(f.fault.params.items())},
        }
        if f.kind == "sdc":
            entry["onset_step"] = plan.sdc_step.get(f.rank)
        elif f.kind in STALL_KINDS:
            stop = plan.stop
            entry["onset_step"] = stop.step if stop is not None and f in stop.faults else None
        else:
            entry["onset_step"] = first_step_starting_at(segs, f.ts)
        if f.kind == "planned_maintenance":
            seg = next((s for s in segs if s.stop is not None and s.stop.fault is f), None)
            if seg is not None:
                entry["stop_ts"] = _t(seg.stop.ts)
                entry["last_step"] = seg.stop.step
                entry["ops_ts"] = _t(max(sc.start_ts + 0.001, f.ts - float(f.param("lead_s", 120.0))))
                nxt = segs[seg.index + 1] if seg.index + 1 < len(segs) else None
                entry["restart_ts"] = _t(nxt.t0) if nxt else None
                entry["replacement"] = nxt.nodes[f.node] if nxt else None
        faults.append(entry)
    stop = plan.stop
    stall = None
    if stop is not None:
        seg = next(s for s in segs if s.stop is stop)
        stall = {"kind": stop.fault.kind, "ts": _t(stop.ts), "step": stop.step,
                 "last_step_end_ts": _t(seg.end[-1]) if len(seg.end) else None,
                 "nccl_timeout_ts": _t(stop.ts + sc.nccl_timeout_s),
                 "sweep_ts": _t(stop.ts + sc.sweep_after_s) if sc.sweep_after_s is not None else None}
    last = [s for s in segs if len(s.end)]
    return {
        "scenario": sc.name, "seed": sc.seed, "job": sc.job_id,
        "start_ts": _t(sc.start_ts), "end_ts": _t(sc.end_ts), "duration_s": sc.duration_s,
        "topology": {"tp": sc.tp, "pp": sc.pp, "dp": sc.dp, "gpus_per_node": sc.gpus_per_node,
                     "n_ranks": topo.n, "n_nodes": topo.n_nodes, "mapping": RANK_MAPPING},
        "heartbeat_s": sc.heartbeat_s, "launch_s": sc.launch_s, "nccl_timeout_s": sc.nccl_timeout_s,
        "gpu_sample_s": sc.gpu_sample_s,
        "healthy": not plan.faults,
        "faults": faults,
        "stall": stall,
        "segments": [{"t0": _t(s.t0), "first_step": s.step0, "steps": len(s.end),
                      "last_step": int(s.steps[-1]) if len(s.end) else None,
                      "nodes_replaced": {a: b for a, b in zip(segs[0].nodes, s.nodes, strict=True) if a != b}}
                     for s in segs],
        "last_step": int(last[-1].steps[-1]) if last else None,
        "benign": {
            "checkpoints": [{"step": k, "ts": _t(a), "end_ts": _t(b)} for s in segs for k, a, b in s.ckpt
                            if not (s.stop is not None and s.stop.kind == "planned" and k == s.stop.step)],
            "nic_flaps": [{"node": plan.phys_nodes[fl.node], "down_ts": _t(fl.down_ts), "up_ts": _t(fl.up_ts)}
                          for fl in plan.benign.flaps
                          if plan.node_on[fl.node] <= fl.down_ts < plan.node_off[fl.node] and fl.up_ts < sc.end_ts],
            "loss_spikes": [k for s in segs for k in s.loss_spikes],
            "ecc_sbe_gpus": [[topo.node_name(g // topo.G), g % topo.G] for g in plan.benign.ecc_gpus.tolist()],
        },
    }
