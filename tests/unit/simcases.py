"""Scenarios and helpers shared by the simulator's tests (64 ranks unless a case says otherwise)."""

from __future__ import annotations

from collections import defaultdict
from functools import cache

from gangwatch.producers.simulate import (
    Fault,
    Noise,
    Scenario,
    generate,
)

# 64 ranks: tp 8 x pp 2 x dp 4, nodes n000..n007; rank = node * 8 + gpu
SMALL = dict(tp=8, pp=2, dp=4, duration_s=200.0)


def sc_(name: str, *faults: Fault, seed: int = 7, **kw) -> Scenario:
    return Scenario(name, seed, **{**SMALL, **kw}, faults=faults)


@cache
def recs_of(sc: Scenario) -> tuple:
    return tuple(generate(sc))


def by_kind(recs, kind):
    return [r for r in recs if r["kind"] == kind]


HEALTHY = sc_("healthy", duration_s=300.0)
THERMAL = sc_("thermal", Fault("thermal_straggler", 40.0, rank=21, magnitude=0.10, params={"ramp_s": 20.0}))
XID = sc_("xid", Fault("xid79", 100.0, node="n003", params={"gpu": 2}))
NODE_LOSS = sc_("loss", Fault("node_loss", 100.0, node="n005"))
HANG = sc_("hang", Fault("dataloader_hang", 100.0, rank=13))
DEADLOCK = sc_("deadlock", Fault("pp_deadlock", 100.0, rank=35))
SDC = sc_("sdc", Fault("sdc", 60.0, rank=42, params={"anomaly_after_s": 60.0}))
NIC = sc_("nic", Fault("nic_degradation", 60.0, node="n002", magnitude=0.3), duration_s=240.0)
INTERMITTENT = sc_("intermittent", Fault("intermittent_straggler", 30.0, rank=50, magnitude=0.2))
PLANNED = sc_("planned", Fault("planned_maintenance", 120.0, node="n006", params={"restart_after_s": 30.0}),
              duration_s=260.0, batch=True)
ALL = [HEALTHY, THERMAL, XID, NODE_LOSS, HANG, DEADLOCK, SDC, NIC, INTERMITTENT, PLANNED]
# odd shapes: no tensor / pipeline parallelism; a node spanning several stages and replicas
ODD = [
    Scenario("flat_dp", 3, tp=1, pp=1, dp=16, duration_s=120.0, faults=[Fault("dataloader_hang", 50.0, rank=9)]),
    Scenario("tp2", 4, tp=2, pp=4, dp=2, duration_s=120.0, faults=[Fault("node_loss", 50.0, node="n001")]),
    Scenario("tp2_pp", 5, tp=2, pp=4, dp=2, duration_s=120.0, faults=[Fault("pp_deadlock", 50.0, rank=3)],
             abort_on_timeout=True, noise=Noise(enabled=False)),
]


def steps_table(recs):
    table = defaultdict(dict)
    for r in by_kind(recs, "step"):
        table[r["step"]][r["rank"]] = r
    return table


def sweep(recs):
    stacks = by_kind(recs, "stack")
    flights = by_kind(recs, "flight")
    assert stacks and len({s["snapshot"] for s in stacks}) == 1
    assert {f["snapshot"] for f in flights} == {stacks[0]["snapshot"]}
    return {s["rank"]: s for s in stacks}, {f["rank"]: f for f in flights}
