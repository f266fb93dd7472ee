"""Deterministic simulator of contract-v1 telemetry for a whole synchronous training job, with ground truth.

    from gangwatch.producers.simulate import Scenario, Fault, generate, truth, write, standard_suite

    sc = Scenario("demo", seed=1, tp=8, pp=2, dp=8, duration_s=300,
                  faults=[Fault("thermal_straggler", at_s=60, node="n003", magnitude=0.1)])
    for rec in generate(sc): ...            # record dicts in event-time order
    truth(sc)                               # JSON-able ground truth
    write(sc, "out/")                       # out/demo.jsonl.gz, out/demo.truth.json

Rank mapping: rank = node_index * gpus_per_node + gpu; tp = rank % tp (innermost),
pp = rank // tp % pp, dp = rank // (tp * pp); nodes n000, n001, ...

Modules: scenario (the inputs), topology (ranks, groups, RNG streams), noise (benign
noise), faults (resolution), physics (step timing, stops, restarts), traces (stall
evidence: timeouts, stacks, flight recorder), emit (records), truth, writer, suite.
"""

from gangwatch.producers.simulate.emit import generate, messages
from gangwatch.producers.simulate.physics import simulate
from gangwatch.producers.simulate.scenario import (
    BENIGN_KINDS,
    CO_STALL_KINDS,
    DEFAULT_MAGNITUDE,
    FAULT_CLASS,
    FAULT_KINDS,
    MONITORING_KINDS,
    PRECURSOR_KINDS,
    STALL_KINDS,
    Fault,
    Noise,
    Scenario,
)
from gangwatch.producers.simulate.suite import standard_suite
from gangwatch.producers.simulate.truth import RANK_MAPPING, truth
from gangwatch.producers.simulate.writer import write

__all__ = [
    "BENIGN_KINDS", "CO_STALL_KINDS", "DEFAULT_MAGNITUDE", "FAULT_CLASS", "FAULT_KINDS", "MONITORING_KINDS",
    "PRECURSOR_KINDS",
    "STALL_KINDS", "RANK_MAPPING",
    "Fault", "Noise", "Scenario", "generate", "messages", "simulate", "standard_suite", "truth", "write",
]
