"""A seeded fleet history for the precursor miner (`gangwatch.fleet.rules`), with the patterns planted in it known.

    from gangwatch.producers.simulate.precursors import FleetSpec, Planted, generate

    spec = FleetSpec(seed=1, nodes=200, days=120, planted=(Planted("thermal", "fail_stop", 0.3, within_days=3),))
    events = generate(spec)                 # NodeEvent list, sorted by start

What a history holds, node by node, each stream drawn as a Poisson process from its own random generator (seeded
by the seed, the stream's name and the node), so the background of a seed is the same whatever is planted:

- background faults: `fault_per_day` per node, their class drawn from `fault_mix`, each with a repair time
  (`end`) drawn from `repair_s`;
- noise of every precursor class (`noise`): occurrences at `per_day` per node, each of `events` events (drawn
  uniformly from the range) spread over `spread_s`: correctable ECC as frequent single events and rarer bursts,
  thermal throttling, link-error bursts, NIC flaps;
- planted patterns (`Planted`): each occurrence of the antecedent (a noise occurrence of that class with at least
  `min_events` events, or a background fault of that class; `any_fault`: any background fault) that falls within
  the pattern's `active` share of the history is followed, with `probability`, by a fault of the target class on
  the same node, `U(0, within_days)` days after the occurrence's last event (after the machine is back, for a
  fault). Planted faults are consequences only: they plant nothing themselves.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gangwatch.fleet.history import NodeEvent, in_order

DAY_S = 86400.0
ANY_FAULT = "any_fault"


@dataclass(frozen=True)
class Noise:
    """One kind of benign occurrence of a precursor class."""

    cls: str
    per_day: float  # occurrences per node per day
    events: tuple[int, int] = (1, 1)  # events per occurrence: drawn uniformly from this range, both ends included
    spread_s: float = 0.0  # an occurrence's events fall within this many seconds of its first


@dataclass(frozen=True)
class Planted:
    """A share of the antecedent's occurrences followed by a `target` fault on the same node within some days."""

    antecedent: str
    target: str
    probability: float
    within_days: float = 3.0
    min_events: int = 1  # only occurrences with at least this many events (a burst) plant
    active: tuple[float, float] = (0.0, 1.0)  # the share of the history (by time) in which the pattern holds

    def __post_init__(self) -> None:
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"planted probability {self.probability}: give a share between 0 and 1")
        if self.within_days <= 0:
            raise ValueError(f"planted within {self.within_days} days: give a positive number of days")
        lo, hi = self.active
        if not 0.0 <= lo < hi <= 1.0:
            raise ValueError(f"planted active {self.active}: give shares 0 <= from < to <= 1")


DEFAULT_NOISE = (
    Noise("ecc_correctable", 0.3),
    Noise("ecc_correctable", 0.02, (3, 10), 3600.0),
    Noise("thermal", 0.01, (1, 3), 7200.0),
    Noise("link_errors", 0.01, (1, 4), 1800.0),
    Noise("nic_flap", 0.02, (1, 2), 600.0),
)
DEFAULT_FAULT_MIX = (("fail_stop", 0.45), ("xid_79", 0.2), ("hang", 0.1), ("fail_slow", 0.1), ("sdc", 0.05),
                     ("unknown", 0.1))


@dataclass(frozen=True)
class FleetSpec:
    """A fleet and what happens to it; `generate(spec)` is the same list for the same spec."""

    seed: int = 0
    nodes: int = 200
    days: int = 120
    start_ts: float = 1_767_225_600.0  # 2026-01-01T00:00:00Z: a UTC midnight, so day d of the spec is a UTC day
    fault_per_day: float = 0.002
    fault_mix: tuple[tuple[str, float], ...] = DEFAULT_FAULT_MIX
    repair_s: tuple[float, float] = (3600.0, 8 * 3600.0)
    noise: tuple[Noise, ...] = DEFAULT_NOISE
    planted: tuple[Planted, ...] = ()

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.days < 1:
            raise ValueError(f"a fleet of {self.nodes} nodes over {self.days} days: give at least 1 of each")
        if self.fault_per_day < 0 or any(n.per_day < 0 for n in self.noise):
            raise ValueError("rates are per node per day and cannot be negative")

    @property
    def end_ts(self) -> float:
        return self.start_ts + self.days * DAY_S


def node_name(i: int) -> str:
    return f"node{i:04d}"


def _rng(spec: FleetSpec, *names: object) -> random.Random:
    return random.Random("/".join(map(str, (spec.seed, *names))))


def _arrivals(r: random.Random, per_day: float, spec: FleetSpec) -> list[float]:
    """Times of a Poisson process of `per_day` over the history."""
    out: list[float] = []
    if per_day <= 0:
        return out
    t = spec.start_ts + r.expovariate(per_day / DAY_S)
    while t < spec.end_ts:
        out.append(t)
        t += r.expovariate(per_day / DAY_S)
    return out


def _occurrences(spec: FleetSpec, node: int) -> list[list[NodeEvent]]:
    """The node's background: each fault and each noise occurrence as its list of events."""
    name = node_name(node)
    r = _rng(spec, "faults", node)
    classes = [c for c, _ in spec.fault_mix]
    weights = [w for _, w in spec.fault_mix]
    occ = []
    for t in _arrivals(r, spec.fault_per_day, spec):
        cls = r.choices(classes, weights)[0]
        occ.append([NodeEvent(t, name, cls, t + r.uniform(*spec.repair_s), "background")])
    for j, nz in enumerate(spec.noise):
        r = _rng(spec, "noise", j, nz.cls, node)
        for t in _arrivals(r, nz.per_day, spec):
            count = r.randint(*nz.events)
            times = sorted([t, *(t + r.uniform(0.0, nz.spread_s) for _ in range(count - 1))])
            occ.append([NodeEvent(x, name, nz.cls, None, f"noise {count} events") for x in times if x < spec.end_ts])
    return [o for o in occ if o]


def _plants(spec: FleetSpec, node: int, occurrences: list[list[NodeEvent]]) -> list[NodeEvent]:
    """The faults the planted patterns add after this node's occurrences."""
    out = []
    fault_classes = {c for c, _ in spec.fault_mix}
    for j, pl in enumerate(spec.planted):
        r = _rng(spec, "planted", j, node)
        lo, hi = (spec.start_ts + share * spec.days * DAY_S for share in pl.active)
        for occ in occurrences:
            first, last = occ[0], occ[-1]
            is_fault = first.cls in fault_classes and first.end is not None
            matches = (pl.antecedent == first.cls or (pl.antecedent == ANY_FAULT and is_fault))
            if not matches or len(occ) < pl.min_events or not lo <= first.start < hi:
                continue
            if r.random() >= pl.probability:
                continue
            t = (last.end if is_fault and last.end is not None else last.start) + r.uniform(0.0, pl.within_days) * DAY_S
            if t < spec.end_ts:
                out.append(NodeEvent(t, first.node, pl.target, t + r.uniform(*spec.repair_s),
                                     f"planted after {first.cls} at {last.start!r}"))
    return out


def generate(spec: FleetSpec) -> list[NodeEvent]:
    """The fleet's history: background faults, noise and planted faults of every node, sorted by start."""
    events: list[NodeEvent] = []
    for node in range(spec.nodes):
        occ = _occurrences(spec, node)
        events.extend(e for o in occ for e in o)
        events.extend(_plants(spec, node, occ))
    return sorted(events, key=in_order)


def parse_planted(text: str) -> Planted:
    """`ANTECEDENT:TARGET[:PROBABILITY[:WITHIN_DAYS[:MIN_EVENTS]]]` (e.g. `thermal:fail_stop:0.3:3`) as a `Planted`."""
    parts = [p.strip() for p in text.split(":")]
    if len(parts) < 2 or len(parts) > 5 or not all(parts[:2]):
        raise ValueError(f"planted pattern {text!r}: want ANTECEDENT:TARGET[:PROBABILITY[:WITHIN_DAYS[:MIN_EVENTS]]], "
                         "e.g. thermal:fail_stop:0.3:3")
    try:
        prob = float(parts[2]) if len(parts) > 2 else 0.3
        within = float(parts[3]) if len(parts) > 3 else 3.0
        min_events = int(parts[4]) if len(parts) > 4 else 1
    except ValueError:
        raise ValueError(f"planted pattern {text!r}: PROBABILITY and WITHIN_DAYS are numbers, MIN_EVENTS a count "
                         "(e.g. ecc_correctable:xid_48:0.4:2:3)") from None
    return Planted(parts[0].lower(), parts[1].lower(), prob, within, min_events)
