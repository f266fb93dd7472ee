"""The standard scenario suite: every fault kind (several nodes and magnitudes), healthy runs, planned stops;
uneven fleets (ranks steadily slower from the first step: nobody may be evicted), several stragglers at once
(on one node, under one switch, unrelated), intermittent and hardware-corroborated stragglers, and hangs with
two culprits.

`size="full"`: 128 to 2,048 ranks; `size="ci"`: the same scenarios with a quarter of
the data-parallel replicas (32 to 512 ranks) and a 10-minute healthy run instead of
an hour. Culprits are placed by position in the job (a fraction of the node list),
so both sizes keep them inside the topology.
"""

from __future__ import annotations

from typing import Any

from gangwatch.producers.simulate.scenario import Fault, Noise, Scenario

SIZES = ("ci", "full")


def standard_suite(size: str = "full") -> list[Scenario]:
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}")
    full = size == "full"
    out: list[Scenario] = []

    def add(name: str, seed: int, pp: int, dp: int, duration_s: float, faults: list[tuple] = (), **kw: Any) -> None:
        dp = dp if full else max(2, dp // 4)
        n_nodes = pp * dp  # tp = 8 = one node per (pp, dp)
        built = []
        for kind, at_s, where, *rest in faults:
            magnitude = rest[0] if rest else 0.0
            params = rest[1] if len(rest) > 1 else {}
            if isinstance(where, float):  # a position in the node list
                built.append(Fault(kind, at_s, node=f"n{min(int(where * n_nodes), n_nodes - 1):03d}",
                                   magnitude=magnitude, params=params))
            else:  # (pp stage, replica position, tp index): one rank
                stage, pos, t = where
                rank = t + 8 * stage + 8 * pp * min(int(pos * dp), dp - 1)
                built.append(Fault(kind, at_s, rank=rank, magnitude=magnitude, params=params))
        name = name.format(n=8 * pp * dp)
        out.append(Scenario(name, seed, 8, pp, dp, duration_s=duration_s, faults=tuple(built), **kw))

    # healthy runs, with benign noise only
    add("healthy_1h_{n}", 101, 2, 8, 3600.0 if full else 600.0)
    add("healthy_{n}", 102, 4, 32, 300.0)
    add("healthy_{n}_batch", 103, 4, 64, 240.0, batch=True)
    add("healthy_noisy_{n}", 104, 2, 16, 600.0, noise=Noise(
        jitter=0.03, ckpt_every_s=90.0, ckpt_s=9.0, loss_spike_prob=0.02, ecc_gpu_frac=0.05, nic_flaps=3,
        hb_pause_prob=0.02, hb_pause_s=4.0))
    # ranks come up over four minutes after the job record (imports, data loading, NCCL set-up)
    add("healthy_slow_start_{n}", 105, 4, 16, 420.0, launch_s=240.0)
    # fail-stop
    add("xid79_{n}", 201, 2, 16, 200.0, [("xid79", 100.0, 0.1, 0.0, {"gpu": 2})])
    add("xid79_late_node_{n}", 202, 4, 64, 190.0, [("xid79", 90.0, 0.78, 0.0, {"gpu": 5})])
    add("node_loss_{n}", 203, 4, 16, 200.0, [("node_loss", 100.0, 0.11)])
    add("node_loss_abort_{n}", 204, 4, 32, 220.0, [("node_loss", 120.0, 0.4)], abort_on_timeout=True)
    # fail-slow
    add("thermal_10pct_{n}", 301, 2, 16, 300.0, [("thermal_straggler", 60.0, (1, 0.3, 3), 0.10)])
    add("thermal_5pct_{n}", 302, 4, 32, 300.0, [("thermal_straggler", 60.0, (2, 0.6, 5), 0.05)])
    add("thermal_20pct_{n}_batch", 303, 4, 64, 240.0, [("thermal_straggler", 60.0, (0, 0.53, 1), 0.20)],
        batch=True)
    add("nic_30pct_{n}", 304, 4, 16, 300.0, [("nic_degradation", 90.0, 0.17, 0.30)])
    add("nic_15pct_{n}", 305, 4, 32, 300.0, [("nic_degradation", 90.0, 0.6, 0.15, {"nic": 3})])
    add("intermittent_15pct_{n}", 306, 4, 16, 300.0, [("intermittent_straggler", 60.0, (3, 0.4, 2), 0.15)])
    add("intermittent_30pct_{n}", 307, 4, 64, 240.0,
        [("intermittent_straggler", 60.0, (1, 0.77, 7), 0.30, {"prob": 0.2})])
    # hangs
    add("dataloader_hang_{n}", 401, 4, 16, 220.0, [("dataloader_hang", 120.0, (2, 0.3, 5))])
    add("dataloader_hang_last_stage_{n}", 402, 4, 64, 200.0, [("dataloader_hang", 100.0, (3, 0.7, 6))])
    add("pp_deadlock_{n}", 403, 4, 16, 210.0, [("pp_deadlock", 110.0, (1, 0.35, 3))])
    add("pp_deadlock_flat_{n}", 404, 4, 32, 200.0, [("pp_deadlock", 100.0, (2, 0.9, 0))], peer_states=False)
    # silent data corruption
    add("sdc_{n}", 501, 4, 16, 300.0, [("sdc", 90.0, (1, 0.6, 4))])
    add("sdc_silent_{n}", 502, 4, 64, 240.0, [("sdc", 60.0, (3, 0.2, 2), 0.0, {"anomaly_after_s": None})])
    # planned operations
    add("planned_restart_{n}", 601, 4, 16, 400.0,
        [("planned_maintenance", 150.0, 0.3, 0.0, {"note": "kernel upgrade", "restart_after_s": 60.0})])
    add("planned_stop_{n}", 602, 2, 8, 300.0,
        [("planned_maintenance", 200.0, 0.25, 0.0, {"restart_after_s": None, "note": "BMC firmware"})])
    # mixtures and traps
    add("thermal_then_xid_{n}", 701, 4, 32, 280.0,
        [("thermal_straggler", 60.0, (1, 0.1, 4), 0.12), ("xid79", 180.0, 0.5, 0.0, {"gpu": 0})])
    add("thermal_during_ckpt_{n}", 702, 2, 16, 300.0, [("thermal_straggler", 100.0, (0, 0.8, 6), 0.08)],
        noise=Noise(ckpt_every_s=60.0))
    # the ordinary life of a job: synchronous checkpoints of 45 s every 150 s the loop does not announce (the
    # whole job stalls, heartbeats go on): stalls that end by themselves, nobody paged or evicted
    add("long_checkpoints_{n}", 805, 4, 16, 600.0, [], noise=Noise(ckpt_every_s=150.0, ckpt_s=45.0))
    # an uneven fleet: ranks 3 % to 15 % slower than their stage from the first step, nothing broken
    add("heterogeneous_{n}", 801, 4, 16, 600.0, [("heterogeneous", 0.0, (0, 0.1, 2), 0.03),
                                                  ("heterogeneous", 0.0, (1, 0.45, 5), 0.06),
                                                  ("heterogeneous", 0.0, (2, 0.3, 0), 0.09),
                                                  ("heterogeneous", 0.0, (3, 0.7, 7), 0.12),
                                                  ("heterogeneous", 0.0, (3, 0.9, 4), 0.15)])
    # the true cost: a 14 % straggler where a rank is 12 % slower anyway gains ~2 % of a step: keep it
    add("straggler_over_heterogeneous_{n}", 802, 4, 16, 300.0, [("heterogeneous", 0.0, (2, 0.5, 1), 0.12),
                                                                 ("thermal_straggler", 80.0, (2, 0.2, 6), 0.14,
                                                                  {"ramp_s": 10.0})])
    # several culprits at once: two GPUs of one node, two nodes under one switch, three unrelated nodes
    add("slow_pair_node_{n}", 803, 4, 16, 300.0, [("thermal_straggler", 80.0, (1, 0.3, 2), 0.25, {"ramp_s": 20.0}),
                                                   ("thermal_straggler", 80.0, (1, 0.3, 6), 0.25, {"ramp_s": 20.0})])
    add("slow_pair_switch_{n}", 804, 4, 16, 300.0, [("nic_degradation", 90.0, (1, 0.6, 0), 0.60),
                                                     ("nic_degradation", 92.0, (2, 0.6, 0), 0.60)],
        nodes_per_switch=4)
    add("slow_triple_{n}", 805, 4, 32, 300.0, [("thermal_straggler", 80.0, (0, 0.2, 1), 0.25, {"ramp_s": 20.0}),
                                                ("thermal_straggler", 85.0, (2, 0.5, 4), 0.30, {"ramp_s": 20.0}),
                                                ("thermal_straggler", 90.0, (3, 0.8, 7), 0.35, {"ramp_s": 20.0})])
    # slow in a quarter of the steps only; and a throttling GPU that says so (decided on its evidence)
    add("intermittent_25pct_{n}", 806, 4, 32, 300.0,
        [("intermittent_straggler", 90.0, (2, 0.35, 3), 0.25, {"prob": 0.25})])
    add("thermal_throttled_{n}", 807, 4, 16, 300.0, [("thermal_straggler", 90.0, (1, 0.65, 5), 0.30,
                                                      {"ramp_s": 10.0})])
    # hangs with two culprits: two ranks each holding up a different collective; a data loader holding up its
    # tensor-parallel group while a pipeline rank sits in a stray broadcast (its neighbour waits to receive)
    add("hang_two_culprits_{n}", 901, 4, 32, 200.0, [("dataloader_hang", 100.0, (1, 0.2, 3)),
                                                      ("dataloader_hang", 100.0, (3, 0.75, 6))])
    add("hang_collective_and_p2p_{n}", 902, 4, 32, 200.0, [("dataloader_hang", 100.0, (2, 0.3, 1)),
                                                             ("pp_deadlock", 100.0, (1, 0.65, 4))],
        peer_states=False)
    # time you can trust: a node's clock off (either way, on one node and on two), a node's records late (steadily,
    # or its spool flushed in one burst), alone and beside a real fault (which must still be found as fast)
    add("clock_ahead_{n}", 1001, 2, 8, 240.0, [("clock_skew", 0.0, 0.3, 0.0, {"offset_s": 30.0})])
    add("clock_behind_late_{n}", 1002, 4, 16, 240.0, [("clock_skew", 60.0, 0.6, 0.0, {"offset_s": -45.0})])
    add("clocks_two_far_{n}", 1003, 4, 16, 240.0, [("clock_skew", 0.0, 0.2, 0.0, {"offset_s": 300.0}),
                                                   ("clock_skew", 30.0, 0.7, 0.0, {"offset_s": -20.0})])
    add("late_20s_{n}", 1004, 2, 8, 240.0, [("late_delivery", 30.0, 0.4, 0.0, {"lag_s": 20.0})])
    add("late_60s_{n}_batch", 1005, 4, 16, 300.0, [("late_delivery", 40.0, 0.9, 0.0, {"lag_s": 60.0})], batch=True)
    add("spool_flush_{n}", 1006, 4, 16, 240.0, [("late_delivery", 80.0, 0.3, 0.0, {"flush_s": 40.0})])
    add("xid79_beside_clock_{n}", 1007, 4, 16, 220.0, [("clock_skew", 0.0, 0.55, 0.0, {"offset_s": 30.0}),
                                                       ("xid79", 120.0, 0.1, 0.0, {"gpu": 3})])
    add("hang_beside_late_{n}", 1008, 4, 16, 220.0, [("late_delivery", 20.0, 0.85, 0.0, {"lag_s": 20.0}),
                                                     ("dataloader_hang", 120.0, (1, 0.3, 2))])
    return out

