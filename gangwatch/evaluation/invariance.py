"""`gangwatch eval --suite invariance`: the same decisions whatever the weather.

A job's decisions (actions, ids included, and incidents with their culprits) must not depend on what is
only the monitoring's: one healthy node's wall clock (every producer on it) off by any offset from the start or
stepped mid-run, or the order in which the producers' streams are read (arrival order, event-time order). This
module generates small jobs of several sizes (with no fault, a node lost, a rank hung), perturbs each in those
ways, replays every variant through the pure core exactly as `gangwatch replay` does, and reports each variant
whose decisions differ from its job's unperturbed replay in arrival order. A perturbed run may add a
`clock_skew` or `telemetry_gap` finding naming the node whose clock or delivery was off: those are the
monitoring's tickets, not decisions, and are not compared.

Everything is a pure function of the case (the simulator is seeded), so a changed decision reproduces with
`gangwatch simulate` and `gangwatch replay` of the case it names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gangwatch.producers.simulate import Fault, Scenario
from gangwatch.producers.simulate.emit import messages
from gangwatch.schemas import Outputs
from gangwatch.schemas.codec import decode_obj
from gangwatch.triage.budgets import CoreConfig
from gangwatch.triage.core import Core

# as the monitoring path delivered the records; sorted by the senders' times; one node's records held `FLUSH_S`
# from `at_s` on and then delivered at once (a spool flushed after a broker blip or an agent's restart)
ORDERS = ("arrival", "event", "flush")
FLUSH_S = 20.0
FAULT_S = 120.0  # when a job's fault strikes
# the lateness bound the decisions are held to: a node's records read up to this early or late (its clock off this
# far, read in event-time order); past it the gang's proof of life (the failstop's `prove_max_s`) stops waiting
BOUND_S = 60.0
DIAGNOSTIC = frozenset({"collect_stacks"})  # actions that gather evidence and decide nothing (see `Decisions.same`)


@dataclass(frozen=True)
class Job:
    """A generated job: `nodes` nodes of `gpus` ranks (one tensor-parallel group per node, data parallel across
    nodes) and its fault (None, "node_loss" or "dataloader_hang"), on node n001 (its first rank for a hang; a job
    of one node hangs its second rank) at `FAULT_S`. `mono`: its clients stamp their monotonic clock (today's do;
    False: older clients). `end`: its controller says the job's `end` when the run's time is up (a producer on
    a clock of its own, neither of the job's nodes')."""

    nodes: int
    fault: str | None = None
    gpus: int = 2
    seed: int = 3
    duration_s: float = 240.0
    mono: bool = True
    end: bool = False

    @property
    def name(self) -> str:
        return f"{self.nodes}n-{self.fault or 'healthy'}-s{self.seed}" + ("" if self.mono else "-nomono") + \
            ("-end" if self.end else "")

    def faults(self) -> tuple[Fault, ...]:
        if self.fault is None:
            return ()
        if self.fault == "dataloader_hang":  # (a job of one node: its second rank)
            return (Fault("dataloader_hang", FAULT_S, rank=self.gpus if self.nodes > 1 else 1),)
        return (Fault(self.fault, FAULT_S, node="n001"),)

    def takes(self, p: Perturbation) -> bool:
        """Whether `p` can be tried on this job: the simulator makes nothing happen after a fault that stops
        the job's steps (a clock step or a flush from then on is not simulated)."""
        return self.fault is None or p.at_s < FAULT_S

    @property
    def healthy_node(self) -> str:
        """A node the fault leaves alone: the one whose clock is shifted."""
        return "n000"

    def scenario(self, *more: Fault) -> Scenario:
        return Scenario(self.name, self.seed, tp=self.gpus, pp=1, dp=self.nodes, gpus_per_node=self.gpus,
                        duration_s=self.duration_s, faults=self.faults() + more, mono=self.mono)


@dataclass(frozen=True)
class Perturbation:
    """One node's clock `offset_s` off from `at_s` on (0: from the start; no offset: none), records read in
    `order` (`flush`: that node's records from `at_s` on held `FLUSH_S` seconds, then delivered at once)."""

    order: str = "arrival"
    offset_s: float = 0.0
    at_s: float = 0.0

    def within_bound(self, job: Job) -> bool:
        """Whether the property holds `job`'s decisions to this perturbation: its records read no more than
        `BOUND_S` early or late (any order but event time, or a clock off that little), each producer's in its own
        order. Sorted by the stamped times, a clock stepped back by d has its node's records after the step read
        before its last d seconds of records before it: another node keeps the job's time meanwhile, but a job of
        one node has no other, and its own records out of their order are outside the bound."""
        if self.order != "event":
            return True
        reordered = job.nodes == 1 and self.offset_s < 0 and self.at_s > 0
        return abs(self.offset_s) <= BOUND_S and not reordered

    def __str__(self) -> str:
        clock = "" if not self.offset_s else f"clock {self.offset_s:+g} s" + (
            f" stepped at {self.at_s:g} s" if self.at_s else " from the start")
        order = f"its records from {self.at_s:g} s flushed {FLUSH_S:g} s late" if self.order == "flush" \
            else f"{self.order} order"
        return ", ".join(x for x in (clock, order) if x)


@dataclass(frozen=True)
class Decisions:
    """What a run decided: its actions (type, nodes, id) and incidents (class, culprit nodes), in order."""

    actions: tuple[tuple[str, tuple[str, ...], str], ...]
    incidents: tuple[tuple[str, tuple[str, ...]], ...]

    def __str__(self) -> str:
        acts = ", ".join(f"{t} {'/'.join(n) or '-'}" for t, n, _ in self.actions) or "no action"
        incs = ", ".join(f"{c} {'/'.join(n) or '-'}" for c, n in self.incidents) or "no incident"
        return f"{acts}; {incs}"


    def same(self, other: Decisions, ids: bool = True) -> bool:
        """The same decisions: actions (with their ids when `ids`) and incidents. A sweep request
        (`collect_stacks`) is the monitoring's own diagnostic, not a decision about the job: whether a hang asks
        for one or a sweep taken anyway came first can turn on milliseconds (the simulator sweeps a fixed time
        after a stall, about when the hang's threshold runs out), so it is not compared."""
        def kept(d: Decisions) -> list:
            return [(t, n, i if ids else None) for t, n, i in d.actions if t not in DIAGNOSTIC]
        return kept(self) == kept(other) and self.incidents == other.incidents


@dataclass(frozen=True)
class Changed:
    job: Job
    perturbation: Perturbation
    expected: Decisions
    got: Decisions

    def __str__(self) -> str:
        return f"{self.job.name} [{self.perturbation}]: {self.got}  (unperturbed: {self.expected})"


def records(job: Job, p: Perturbation) -> list[dict]:
    """The job's messages as perturbed: the clock shift made by the simulator (every record of the node carries
    its clock's time), then the order."""
    more = (Fault("clock_skew", p.at_s, node=job.healthy_node, params={"offset_s": p.offset_s}),) \
        if p.offset_s else ()
    if p.order == "flush":
        more += (Fault("late_delivery", p.at_s, node=job.healthy_node, params={"flush_s": FLUSH_S}),)
    elif p.order not in ORDERS:
        raise ValueError(f"unknown order {p.order!r}; one of {', '.join(ORDERS)}")
    sc = job.scenario(*more)
    msgs = list(messages(sc))
    if job.end:  # the controller's, on its own clock (the true time), after everything else the job sent
        msgs.append({"kind": "lifecycle", "v": 1, "ts": sc.start_ts + sc.duration_s, "job": sc.job_id,
                     "event": "end", "source": "controller"})
    if p.order == "event":
        msgs.sort(key=lambda m: m["ts"])
    return msgs


def decide(msgs: Iterable[dict], config: CoreConfig | None = None, silence_s: float = 0.0) -> Decisions:
    """Replay the messages through the pure core, record by record (`gangwatch replay`'s path); with
    `silence_s`, time then runs on that long with nothing read, a second at a time, as the worker's silence timer
    moves it (the end of a file is no silence; the end of a live stream is)."""
    core, out = Core(config or CoreConfig()), Outputs()
    last = None
    for m in msgs:
        core.process(decode_obj(m), out)
        last = m["ts"] if last is None else max(last, m["ts"])
    if last is not None:
        for k in range(1, int(silence_s) + 1):
            core.advance(last + k, out)
    out.extend(core.finish())
    latest: dict[str, tuple[str, tuple[str, ...]]] = {}
    for inc in out.incidents:  # an incident's updates: its last word
        latest[inc.id] = (inc.cls, tuple(sorted(inc.culprit_nodes)))
    return Decisions(tuple((a.type, tuple(sorted(a.nodes)), a.id) for a in out.actions), tuple(latest.values()))


def perturbations(size: str = "ci") -> list[Perturbation]:
    """The perturbations tried on every job: each order, unshifted and with the node's clock ahead and behind
    from the start and stepped mid-run (`full` adds larger offsets and later steps)."""
    shifts = [(30.0, 0.0), (-30.0, 0.0), (25.0, 100.0), (-40.0, 100.0)]
    if size == "full":
        shifts += [(300.0, 0.0), (-300.0, 0.0), (5.0, 60.0), (-600.0, 150.0), (600.0, 30.0)]
    out = [Perturbation("event"), Perturbation("flush", at_s=60.0)]
    for off, at in shifts:
        out += [Perturbation(order, off, at) for order in ORDERS]
    return out


def jobs(size: str = "ci") -> list[Job]:
    sizes = (2, 3, 8) if size == "ci" else (1, 2, 3, 4, 8, 16)
    seeds = (3,) if size == "ci" else (3, 11)
    out = [Job(n, fault, seed=seed) for n in sizes for fault in (None, "node_loss", "dataloader_hang")
           for seed in seeds if not (n == 1 and fault == "node_loss")]
    if size == "full":  # and healthy jobs whose controller says their end (a clock of no node)
        out += [Job(n, None, seed=seed, end=True) for n in sizes for seed in seeds]
    return out


def ids_kept(job: Job, p: Perturbation) -> bool:
    """Whether `p` must keep the action ids too. Ids hash the decision's times in the job's frame. A job of two
    nodes whose clocks disagree from the start takes its frame from the one the job record's time allows (no step
    ends before its job began) and, where both are allowed, from the one behind: a clock shifted behind by less
    than the job's start-up took is that frame, and the ids carry its times. A job of one node has no other
    clock."""
    if job.nodes == 1:
        return not p.offset_s  # its one clock is its frame
    return job.nodes >= 3 or not p.offset_s or p.offset_s > 0 or p.at_s > 0


def changed(job: Job, p: Perturbation, expected: Decisions | None = None) -> Changed | None:
    """How `p` changed `job`'s decisions against its unperturbed replay in arrival order (None: it did not)."""
    expected = expected or decide(records(job, Perturbation()))
    got = decide(records(job, p))
    return None if got.same(expected, ids=ids_kept(job, p)) else Changed(job, p, expected, got)


def check(job: Job, tried: Iterable[Perturbation]) -> Iterator[Changed]:
    """Each perturbation of `job` whose decisions differ from the job's unperturbed replay in arrival order."""
    expected = decide(records(job, Perturbation()))
    for p in tried:
        c = changed(job, p, expected)
        if c is not None:
            yield c


@dataclass
class Report:
    tried: int
    changed: list[Changed]
    tried_within: int = 0  # of them, within the lateness bound (`BOUND_S`)

    def render(self) -> str:
        within = sum(c.perturbation.within_bound(c.job) for c in self.changed)
        lines = [f"invariance: {self.tried} perturbed replays, {len(self.changed)} changed a decision ({within} of "
                 f"{self.tried_within} within the {BOUND_S:g} s lateness bound)"]
        lines += [f"  {c}" for c in self.changed]
        return "\n".join(lines)


def run(size: str = "ci", only: list[str] | None = None, progress=None) -> Report:
    tried, within, changed = 0, 0, []
    ps = perturbations(size)
    for job in jobs(size):
        if only and not any(o in job.name for o in only):
            continue
        mine = [p for p in ps if job.takes(p)]
        found = list(check(job, mine))
        tried += len(mine)
        within += sum(p.within_bound(job) for p in mine)
        changed += found
        if progress:
            progress(job, len(mine), found)
    return Report(tried, changed, within)
