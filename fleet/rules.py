"""Rules that warn before a fault, mined from node fault histories and kept only when they hold on history they
were not learned on. Two kinds:

- *precursor*: "when a node that is up and healthy has `burst` or more events of class A within `burst_window_s`,
  a fault of class T follows on the same node within `horizon_days`". A is a class of the history that is not a
  fault (`ecc_correctable`, `thermal`, `link_errors`, `nic_flap`, ...), T a target class (`DEFAULT_TARGETS`, shell
  patterns: fail_stop, sdc, hang, fail_slow, unknown and every `xid_*`); `any_fault` stands for any target class;
- *probation*: "after a repair of a fault of class A ends (the node is back), a fault of class T follows within
  `window_h` hours of that end". Faults after faults (a node's first days back, the repair workflow's own stress
  test, a part that fails again) are these, counted from the repair's end, never from the fault's start.

*Faults* are events of a target class. One that starts while its node is still down from an earlier one (before
its `end`, or within `SAME_OUTAGE_S` of its start when the end is unknown) is the same outage: one fault that
carries both classes (an Xid and the fail-stop it caused are one fault, not a fault and its repeat). A node is *in
repair* from an outage's start to its end (`SAME_OUTAGE_S` when the end is unknown, the history's end when
`open`), and *just back* for `settle_days` after that; at any other time it is *healthy*.

Precursor rules are counted in node-days: each node of the history (every node with at least one event) on each
UTC day (`floor(t / 86400)`) of a part of the history, less the node-days that are not healthy throughout (the node
in repair or just back at any moment of the day). For a rule (A, k, T) and a healthy node-day (n, d):

- *antecedent*: an A burst completes on n during day d, i.e. an A event on day d is the k-th of k A events
  within the burst window (k = 1: any A event). Several bursts in one day are one antecedent node-day. Single
  events of a noisy class (correctable ECC) are weak; k lets a burst be the signal, and k is learned (below);
- *outcome*: a T fault starts on n during days d+1 .. d+H. Day d itself is left out for every node-day alike, so
  a fault is never its own consequence, nor is a fault that came before the burst on the same day.

Over the healthy node-days of a part: support = node-days with the antecedent, hits = those with the outcome,
precision (confidence) = hits / support, base rate = node-days with the outcome / all healthy node-days, lift =
precision / base rate, recall = faults of T in the part with an antecedent node-day in the H days before them
(`warned`) / faults of T in the part, nodes = the distinct nodes of the hits.

Probation rules are counted in repairs: support = repairs of class A that ended (a known, finite end) on a day of
the part, hits = those followed by a T fault within `window_h` of the end, precision = hits / support, base rate =
1 - exp(-rate * window), rate = T faults that started on a healthy node / healthy node-time of the part (the chance
that a healthy node has such a fault within as long a window), lift, recall (faults of T that started in the part
within a window after a repair's end, of all of them) and nodes as above. The window is learned among
`windows_h`, as k is for bursts.

Out of sample. The history's days, from its first event to its last, are cut at `split`. The training part is
the days before the cut less the last H (their outcome would look past the cut); the test part the days from the
cut less the last H (their outcome is not fully seen). Learning reads only the training part: for each (A, T)
the burst size k among `bursts` (the window among `windows_h`) is the one with the smallest one-sided binomial
p-value of its hits against the training base rate (support at least `min_support`), and the rule is *learned*
when that p-value is under `screen_alpha` with a lift above 1. Each learned rule is then scored on the test part
alone: p = P(X >= hits) for X ~ Binomial(support, test base rate), and the m learned rules' p-values are corrected
together by Benjamini-Hochberg (`corrected_p`, the BH-adjusted p-value: the false discovery rate at which the
rule would be kept; m counts both kinds). A rule *holds* when its test support is at least `min_support`, its
test lift at least `min_lift` and its corrected p under `alpha`, so that a fleet without any pattern gets no
suggestion with probability about 1 - alpha. Node-days of one node are not independent (one fault is the outcome
of up to H of them), which the binomial test ignores; the minimum lift is the margin for it. A rule whose hits
come from fewer than `few_nodes` nodes is marked (`few_nodes_note`: "support from 5 nodes"): it may be a few bad
machines rather than a pattern of the fleet.

A history of faults only (no event of another class) can teach probation rules only: `only_recurrence` says so.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

from gangwatch.fleet.history import NodeEvent, in_order

DAY_S = 86400.0
ANY_FAULT = "any_fault"
DEFAULT_TARGETS = ("fail_stop", "sdc", "hang", "fail_slow", "unknown", "xid_*")
SAME_OUTAGE_S = 3600.0
HOLDS = "holds out of sample"
PRECURSOR = "precursor"
PROBATION = "probation"
TAINT_KEY = "gangwatch.io/precursor"
PROBATION_TAINT_KEY = "gangwatch.io/probation"
TAINT_EFFECT = "PreferNoSchedule"
TAINT_QUANTILE = 0.9  # the taint lasts until this share of the training hits' faults had come

NodeDay = tuple[str, int]
Interval = tuple[float, float]


@dataclass(frozen=True)
class Params:
    """What the miner looks for and how sure it must be; a bad value is a ValueError saying what to give."""

    horizon_days: int = 7
    split: float = 0.6
    targets: tuple[str, ...] = DEFAULT_TARGETS
    bursts: tuple[int, ...] = (1, 2, 3, 5)
    burst_window_s: float = DAY_S
    windows_h: tuple[float, ...] = (6.0, 24.0, 72.0, 168.0)
    settle_days: float = 3.0
    min_support: int = 10
    min_lift: float = 2.0
    alpha: float = 0.01
    screen_alpha: float = 0.05
    few_nodes: int = 10

    def __post_init__(self) -> None:
        if self.horizon_days < 1:
            raise ValueError(f"horizon of {self.horizon_days} days: give at least 1 day")
        if not 0.0 < self.split < 1.0:
            raise ValueError(f"split {self.split}: give the share of the history to learn on, between 0 and 1 "
                             "(e.g. 0.6)")
        if not self.targets:
            raise ValueError("no target class: name at least one fault class (e.g. fail_stop)")
        if not self.bursts or min(self.bursts) < 1:
            raise ValueError(f"burst sizes {self.bursts}: give counts of 1 or more")
        if self.burst_window_s <= 0:
            raise ValueError(f"burst window of {self.burst_window_s} s: give a positive number of seconds")
        if not self.windows_h or min(self.windows_h) <= 0:
            raise ValueError(f"probation windows {self.windows_h}: give positive numbers of hours")
        if self.settle_days < 0:
            raise ValueError(f"settle of {self.settle_days} days: give 0 or more days")
        if self.min_support < 1:
            raise ValueError(f"minimum support {self.min_support}: give at least 1")
        for name in ("alpha", "screen_alpha"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name} {getattr(self, name)}: give a probability between 0 and 1")

    def is_target(self, cls: str) -> bool:
        """Whether `cls` is a fault this miner predicts (a shell pattern of `targets` matches it)."""
        return any(fnmatchcase(cls, pattern.lower()) for pattern in self.targets)

    @property
    def probation_windows_h(self) -> tuple[float, ...]:
        """The probation windows tried: `windows_h` up to the horizon (the horizon alone if none is)."""
        return tuple(sorted(w for w in set(self.windows_h) if w <= self.horizon_days * 24.0)) or \
            (self.horizon_days * 24.0,)


@dataclass(frozen=True)
class Score:
    """One rule over one part of the history (see the module's definitions): in healthy node-days for a
    precursor rule, in repairs for a probation rule (`node_days` then counts the part's healthy node-days)."""

    node_days: int
    support: int
    hits: int
    base_rate: float
    p_value: float
    warned: int
    faults: int
    nodes: int = 0

    @property
    def confidence(self) -> float:
        """P(fault within the horizon | antecedent): the precision; 0 without support."""
        return self.hits / self.support if self.support else 0.0

    precision = confidence

    @property
    def recall(self) -> float:
        """The share of the part's faults of the target that the rule warned of; 0 without any."""
        return self.warned / self.faults if self.faults else 0.0

    @property
    def lift(self) -> float:
        """confidence / base rate; 0 when the part has no fault of the target (no hit is then possible)."""
        return self.confidence / self.base_rate if self.base_rate > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"node_days": self.node_days, "support": self.support, "hits": self.hits, "nodes": self.nodes,
                "confidence": round(self.confidence, 4), "recall": round(self.recall, 4),
                "base_rate": round(self.base_rate, 5), "lift": round(self.lift, 3),
                "p_value": float(f"{self.p_value:.3g}"), "warned": self.warned, "faults": self.faults}


@dataclass(frozen=True)
class Rule:
    """A candidate rule with its training and test scores; `verdict` is `HOLDS` or why it does not.
    `corrected_p` is the test p-value corrected over the learned rules (Benjamini-Hochberg; None: not learned)."""

    antecedent: str
    burst: int
    target: str
    horizon_days: int
    burst_window_s: float
    train: Score
    test: Score
    taint_h: int
    verdict: str
    kind: str = PRECURSOR
    window_h: float = 0.0  # probation: the window after the repair's end
    corrected_p: float | None = None
    few_nodes: int = 0  # the `few_nodes` it was judged against

    @property
    def holds(self) -> bool:
        return self.verdict == HOLDS

    @property
    def name(self) -> str:
        if self.kind == PROBATION:
            return f"back from {self.antecedent} repair -> {self.target} in {_hours(self.window_h * 3600.0)}h"
        return (f"{self.antecedent} x{self.burst}/{_hours(self.burst_window_s)}h -> {self.target} "
                f"in {self.horizon_days}d")

    @property
    def few_nodes_note(self) -> str:
        """'support from N nodes' when the test hits come from fewer than `few_nodes` nodes; '' otherwise."""
        n = self.test.nodes
        return f"support from {n} node{'s' * (n != 1)}" if 0 < n < self.few_nodes else ""

    def actions(self) -> dict[str, dict[str, Any]]:
        """What to do about it, as plain data: a detection rule and a scheduler taint."""
        value = re.sub(r"[^A-Za-z0-9_.-]", "_", self.antecedent)[:63].strip("_.-") or "precursor"
        if self.kind == PROBATION:
            return {
                "detect": {"when_class": self.antecedent, "when": "repair_end", "then": "raise_node_risk",
                           "watch_for": self.target, "watch_h": _hours(self.window_h * 3600.0),
                           "confidence": round(self.test.confidence, 3), "lift": round(self.test.lift, 2)},
                "taint": {"key": PROBATION_TAINT_KEY, "value": value, "effect": TAINT_EFFECT, "for_h": self.taint_h,
                          "from": "repair_end", "after": f"a {self.antecedent} repair ends (the node is back)"},
            }
        return {
            "detect": {"when_class": self.antecedent, "at_least": self.burst,
                       "within_h": _hours(self.burst_window_s), "then": "raise_node_risk",
                       "watch_for": self.target, "watch_days": self.horizon_days,
                       "confidence": round(self.test.confidence, 3), "lift": round(self.test.lift, 2)},
            "taint": {"key": TAINT_KEY, "value": value, "effect": TAINT_EFFECT, "for_h": self.taint_h,
                      "from": "burst",
                      "after": f"{self.burst} {self.antecedent} within {_hours(self.burst_window_s)} h"},
        }

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.name, "kind": self.kind, "antecedent": self.antecedent, "burst": self.burst,
                "burst_window_s": self.burst_window_s, "window_h": self.window_h, "target": self.target,
                "horizon_days": self.horizon_days, "verdict": self.verdict,
                "corrected_p": None if self.corrected_p is None else float(f"{self.corrected_p:.3g}"),
                "note": self.few_nodes_note, "train": self.train.to_dict(), "test": self.test.to_dict(),
                "actions": self.actions()}

    def row(self) -> dict[str, Any]:
        """One flat line of a table: the rule, then its figures on the test part."""
        when = (f"back+{_hours(self.window_h * 3600.0)}h" if self.kind == PROBATION
                else f">={self.burst}/{_hours(self.burst_window_s)}h")
        return {"kind": self.kind, "antecedent": self.antecedent, "when": when, "target": self.target,
                "lift": round(self.test.lift, 2), "precision": round(self.test.precision, 3),
                "recall": f"{self.test.warned}/{self.test.faults}", "support": self.test.support,
                "hits": self.test.hits, "nodes": self.test.nodes, "test_p": f"{self.test.p_value:.2g}",
                "corrected_p": "-" if self.corrected_p is None else f"{self.corrected_p:.2g}",
                "taint_h": self.taint_h, "note": self.few_nodes_note or "-"}


def _hours(seconds: float) -> float | int:
    h = seconds / 3600.0
    return int(h) if h == int(h) else round(h, 2)


def day_of(t: float) -> int:
    """The UTC day of an event time (days since the epoch)."""
    return math.floor(t / DAY_S)


def binomial_tail(hits: int, n: int, p: float) -> float:
    """P(X >= hits) for X ~ Binomial(n, p); the tail is summed on the side away from the mode, so a tiny p-value
    keeps its precision."""
    if hits <= 0 or p >= 1.0:
        return 1.0
    if hits > n or p <= 0.0:
        return 0.0
    if hits > n * p:  # at or past the mode: terms shrink upward
        return min(1.0, _tail_sum(hits, n, p, up=True))
    return max(0.0, 1.0 - _tail_sum(hits - 1, n, p, up=False))


def _tail_sum(start: int, n: int, p: float, *, up: bool) -> float:
    """sum of pmf(i) for i from `start` away from the mode (up: to n; down: to 0); terms shrink monotonically."""
    log_first = (math.lgamma(n + 1) - math.lgamma(start + 1) - math.lgamma(n - start + 1)
                 + start * math.log(p) + (n - start) * math.log1p(-p))
    odds = p / (1.0 - p)
    total = term = 1.0
    i = start
    while (i < n) if up else (i > 0):
        term *= (n - i) / (i + 1) * odds if up else i / (n - i + 1) / odds
        i += 1 if up else -1
        total += term
        if term < 1e-17 * total:
            break
    return math.exp(log_first) * total


def benjamini_hochberg(p_values: list[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values, in the order given: q_i = min over j with p_j >= p_i of p_j * m / rank_j
    (capped at 1); keeping those with q < alpha keeps the expected share of false rules among those kept under
    alpha."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    out = [1.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, p_values[i] * m / rank)
        out[i] = min(1.0, running)
    return out


@dataclass(frozen=True)
class Outage:
    """A fault as the miner reads it: its node, start, classes and when the node was back (None: unknown)."""

    node: str
    start: float
    classes: list[str]
    end: float | None


@dataclass
class _Index:
    """The history as the miner reads it: times of each class per node (targets as deduplicated faults), the
    outages, and when each node was not healthy."""

    nodes: frozenset[str]
    times: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # class -> node -> sorted times
    targets: tuple[str, ...] = ()  # target classes present, then ANY_FAULT
    outages: list[Outage] = field(default_factory=list)
    unhealthy: dict[str, list[Interval]] = field(default_factory=dict)  # node -> merged [from, to) intervals
    sick_days: set[NodeDay] = field(default_factory=set)  # node-days not healthy throughout
    first_day: int = 0
    last_day: int = 0


def outages(events: list[NodeEvent], params: Params) -> list[Outage]:
    """The faults of `events` (sorted by start) as outages, in order of start. A target event that starts while its
    node is still down (before the outage's end, or within `SAME_OUTAGE_S` of its start when no end is known) joins
    that outage, which then carries its class too and ends at the later end."""
    latest: dict[str, tuple[float, int]] = {}  # node -> (down until, where its latest outage is in `out`)
    out: list[Outage] = []
    for e in events:
        if not params.is_target(e.cls):
            continue
        until, at = latest.get(e.node, (-math.inf, -1))
        if e.start <= until:
            o = out[at]
            if e.cls not in o.classes:
                o.classes.append(e.cls)
            if e.end is not None and e.end > until:
                out[at] = Outage(o.node, o.start, o.classes, e.end)
                latest[e.node] = (e.end, at)
            continue
        latest[e.node] = (e.end if e.end is not None else e.start + SAME_OUTAGE_S, len(out))
        out.append(Outage(e.node, e.start, [e.cls], e.end))
    return out


def _unhealthy(outs: list[Outage], settle_s: float, history_end: float) -> dict[str, list[Interval]]:
    """Per node, the merged intervals in repair or just back: [start, end + settle)."""
    per: dict[str, list[Interval]] = {}
    for o in outs:
        end = o.end if o.end is not None else o.start + SAME_OUTAGE_S
        per.setdefault(o.node, []).append((o.start, min(end, history_end) + settle_s))
    for node, spans in per.items():
        spans.sort()
        merged = [spans[0]]
        for a, b in spans[1:]:
            if a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        per[node] = merged
    return per


def _index(events: list[NodeEvent], params: Params) -> _Index:
    """`events` sorted by start, as times per class and node: other classes as they are, targets as outages."""
    idx = _Index(nodes=frozenset(e.node for e in events), first_day=day_of(events[0].start),
                 last_day=day_of(events[-1].start))
    for e in events:
        if not params.is_target(e.cls):
            idx.times.setdefault(e.cls, {}).setdefault(e.node, []).append(e.start)
    idx.outages = outages(events, params)
    for o in idx.outages:
        for cls in (*o.classes, ANY_FAULT):
            idx.times.setdefault(cls, {}).setdefault(o.node, []).append(o.start)
    present = sorted(c for c in idx.times if c != ANY_FAULT and params.is_target(c))
    idx.targets = (*present, ANY_FAULT) if present else ()
    idx.unhealthy = _unhealthy(idx.outages, params.settle_days * DAY_S, (idx.last_day + 1) * DAY_S)
    for node, spans in idx.unhealthy.items():
        for a, b in spans:
            last = min(idx.last_day, math.ceil(b / DAY_S) - 1)
            idx.sick_days.update((node, d) for d in range(day_of(a), last + 1))
    return idx


def only_recurrence(events: Iterable[NodeEvent], params: Params | None = None) -> bool:
    """Whether the history holds faults only (no event of a class that is not a target, such as a precursor):
    then only probation rules (faults after faults) can be learned from it."""
    p = params or Params()
    return all(p.is_target(e.cls) for e in events)


def _bursts(times: dict[str, list[float]], k: int, window_s: float) -> dict[NodeDay, float]:
    """Antecedent node-days of bursts of k within `window_s` -> when the day's first burst completed."""
    out: dict[NodeDay, float] = {}
    for node, ts in times.items():
        for i in range(k - 1, len(ts)):
            if ts[i] - ts[i - k + 1] <= window_s:
                out.setdefault((node, day_of(ts[i])), ts[i])
    return out


@dataclass(frozen=True)
class _Outcomes:
    """The healthy node-days of one part whose horizon holds a fault of one target, and those faults."""

    positive: frozenset[NodeDay]
    faults: tuple[tuple[str, float], ...]  # (node, start) of the faults that are some node-day's outcome
    node_days: int  # healthy node-days of the part


def _healthy_days(idx: _Index, part: tuple[int, int]) -> int:
    a, b = part
    return len(idx.nodes) * (b - a + 1) - sum(a <= d <= b for _, d in idx.sick_days)


def _outcomes(idx: _Index, target: str, part: tuple[int, int], horizon: int) -> _Outcomes:
    a, b = part
    positive: set[NodeDay] = set()
    faults = []
    for node, ts in idx.times[target].items():
        for t in ts:
            fd = day_of(t)
            if a < fd <= b + horizon:
                faults.append((node, t))
                positive.update((node, d) for d in range(max(a, fd - horizon), min(b, fd - 1) + 1))
    return _Outcomes(frozenset(positive - idx.sick_days), tuple(faults), _healthy_days(idx, part))


def _score(ante: dict[NodeDay, float], out: _Outcomes, part: tuple[int, int], horizon: int) -> Score:
    a, b = part
    days = [nd for nd in ante if a <= nd[1] <= b]
    hit_days = [nd for nd in days if nd in out.positive]
    base = len(out.positive) / out.node_days if out.node_days else 0.0
    warned = sum(any((node, d) in ante for d in range(max(a, day_of(t) - horizon), min(b, day_of(t) - 1) + 1))
                 for node, t in out.faults)
    return Score(node_days=out.node_days, support=len(days), hits=len(hit_days), base_rate=base,
                 p_value=binomial_tail(len(hit_days), len(days), base), warned=warned, faults=len(out.faults),
                 nodes=len({n for n, _ in hit_days}))


def _taint_hours(ante: dict[NodeDay, float], target: dict[str, list[float]], part: tuple[int, int],
                 horizon: int) -> int:
    """Hours after a burst by which `TAINT_QUANTILE` of the training hits' faults had come (the horizon if none)."""
    delays = []
    for (node, d), t in ante.items():
        ts = target.get(node, [])
        i = bisect.bisect_left(ts, (d + 1) * DAY_S)
        if part[0] <= d <= part[1] and i < len(ts) and day_of(ts[i]) <= d + horizon:
            delays.append(ts[i] - t)
    return _quantile_hours(delays, horizon * 24.0)


def _quantile_hours(delays: list[float], cap_h: float) -> int:
    """`TAINT_QUANTILE` of `delays` (seconds) in whole hours, at least 1 and at most `cap_h` (`cap_h` if none)."""
    if not delays:
        return max(1, math.ceil(cap_h))
    delays.sort()
    q = delays[min(len(delays) - 1, math.ceil(TAINT_QUANTILE * len(delays)) - 1)]
    return max(1, min(math.ceil(cap_h), math.ceil(q / 3600.0)))


# --- probation: faults after a repair's end --------------------------------------------------------------------


def _returns(idx: _Index, cls: str, part: tuple[int, int]) -> list[tuple[str, float]]:
    a, b = part
    return [(o.node, o.end) for o in idx.outages
            if (cls == ANY_FAULT or cls in o.classes) and o.end is not None and math.isfinite(o.end)
            and a <= day_of(o.end) <= b]


def _healthy_s(idx: _Index, part: tuple[int, int]) -> float:
    """Healthy node-seconds of the part."""
    lo, hi = part[0] * DAY_S, (part[1] + 1) * DAY_S
    sick = sum(max(0.0, min(y, hi) - max(x, lo)) for spans in idx.unhealthy.values() for x, y in spans)
    return len(idx.nodes) * (hi - lo) - sick


def _healthy_at(idx: _Index, node: str, t: float) -> bool:
    """Whether `node` was healthy just before `t` (a fault that starts at t on a healthy node)."""
    return not any(x < t <= y for x, y in idx.unhealthy.get(node, ()))


def _probation_score(idx: _Index, ends: list[tuple[str, float]], target: str, part: tuple[int, int],
                     window_h: float) -> Score:
    a, b = part
    w = window_h * 3600.0
    times = idx.times[target]
    hit_nodes: list[str] = []
    for node, end in ends:
        ts = times.get(node, [])
        i = bisect.bisect_right(ts, end)
        if i < len(ts) and ts[i] <= end + w:
            hit_nodes.append(node)
    lo, hi = a * DAY_S, (b + 1) * DAY_S
    in_part = [(n, t) for n, ts in times.items() for t in ts if lo <= t < hi]
    healthy_faults = sum(_healthy_at(idx, n, t) for n, t in in_part)
    exposure = _healthy_s(idx, part)
    base = 1.0 - math.exp(-healthy_faults / exposure * w) if exposure > 0 else 0.0
    by_node: dict[str, list[float]] = {}
    for n, e in ends:
        by_node.setdefault(n, []).append(e)
    warned = sum(any(e < t <= e + w for e in by_node.get(n, ())) for n, t in in_part)
    return Score(node_days=round(exposure / DAY_S), support=len(ends), hits=len(hit_nodes), base_rate=base,
                 p_value=binomial_tail(len(hit_nodes), len(ends), base), warned=warned, faults=len(in_part),
                 nodes=len(set(hit_nodes)))


def _probation_taint(idx: _Index, ends: list[tuple[str, float]], target: str, window_h: float) -> int:
    """Hours after a repair's end by which `TAINT_QUANTILE` of the training hits' faults had come (the window if
    none)."""
    delays = []
    for node, end in ends:
        ts = idx.times[target].get(node, [])
        i = bisect.bisect_right(ts, end)
        if i < len(ts) and ts[i] <= end + window_h * 3600.0:
            delays.append(ts[i] - end)
    return _quantile_hours(delays, window_h)


def parts(first_day: int, last_day: int, params: Params) -> tuple[tuple[int, int], tuple[int, int]]:
    """The training and test parts (first and last node-day, inclusive) of a history spanning these days."""
    span = last_day - first_day + 1
    cut = first_day + math.floor(params.split * span)
    h = params.horizon_days
    train, test = (first_day, cut - 1 - h), (cut, last_day - h)
    if train[1] < train[0] or test[1] < test[0]:
        need = math.ceil((h + 1) / min(params.split, 1.0 - params.split))
        raise ValueError(f"the history covers {span} days: with a {h}-day horizon and a {params.split} split "
                         f"both parts need more than {h} days (at least {need} days of history); give a longer "
                         "history or a shorter horizon")
    return train, test


def _learned(s: Score, p: Params) -> bool:
    return s.p_value < p.screen_alpha and s.lift > 1.0


def mine(events: Iterable[NodeEvent], params: Params | None = None, **changes: Any) -> list[Rule]:
    """Every candidate rule of both kinds that had enough training support, scored on both parts; those that hold
    first, then by test p-value. `changes` replace fields of `params` (e.g. `split=0.5`)."""
    p = replace(params or Params(), **changes)
    evs = sorted(events, key=in_order)
    if not evs:
        raise ValueError("the history is empty: give events in the import format (node, start, end, class, "
                         "description)")
    idx = _index(evs, p)
    train, test = parts(idx.first_day, idx.last_day, p)
    h = p.horizon_days
    common = {"horizon_days": h, "burst_window_s": p.burst_window_s, "few_nodes": p.few_nodes}
    rules = []
    burst_cache: dict[tuple[str, int], dict[NodeDay, float]] = {}
    for target in idx.targets:
        out_train = _outcomes(idx, target, train, h)
        out_test = _outcomes(idx, target, test, h)
        for ante_cls in sorted(c for c in idx.times if c != ANY_FAULT and not p.is_target(c)):
            best: tuple[int, Score, dict[NodeDay, float]] | None = None
            for k in sorted(set(p.bursts)):
                if (ante_cls, k) not in burst_cache:
                    bursts = _bursts(idx.times[ante_cls], k, p.burst_window_s)
                    burst_cache[ante_cls, k] = {nd: t for nd, t in bursts.items() if nd not in idx.sick_days}
                ante = burst_cache[ante_cls, k]
                s = _score(ante, out_train, train, h)
                if s.support >= p.min_support and (best is None or s.p_value < best[1].p_value):
                    best = (k, s, ante)
            if best is not None:
                k, s_train, ante = best
                rules.append(Rule(antecedent=ante_cls, burst=k, target=target, train=s_train,
                                  test=_score(ante, out_test, test, h),
                                  taint_h=_taint_hours(ante, idx.times[target], train, h), verdict="", **common))
        for ante_cls in idx.targets:
            ends_train, ends_test = _returns(idx, ante_cls, train), _returns(idx, ante_cls, test)
            if len(ends_train) < p.min_support:
                continue
            w, s_train = min(((w, _probation_score(idx, ends_train, target, train, w))
                              for w in p.probation_windows_h), key=lambda ws: ws[1].p_value)
            rules.append(Rule(antecedent=ante_cls, burst=1, target=target, train=s_train,
                              test=_probation_score(idx, ends_test, target, test, w),
                              taint_h=_probation_taint(idx, ends_train, target, w), verdict="", kind=PROBATION,
                              window_h=w, **common))
    learned = [i for i, r in enumerate(rules) if _learned(r.train, p)]
    corrected = dict(zip(learned, benjamini_hochberg([rules[i].test.p_value for i in learned]), strict=True))
    rules = [replace(r, corrected_p=corrected.get(i), verdict=_verdict(r, corrected.get(i), p))
             for i, r in enumerate(rules)]
    rules.sort(key=lambda r: (not r.holds, r.test.p_value, -r.test.lift, r.name))
    return rules


def _verdict(r: Rule, corrected_p: float | None, p: Params) -> str:
    if corrected_p is None:
        return f"not learned: training p {r.train.p_value:.2g} >= {p.screen_alpha} or lift <= 1"
    if r.test.support < p.min_support:
        return f"test support {r.test.support} < {p.min_support}"
    if r.test.lift < p.min_lift:
        return f"test lift {r.test.lift:.2f} < {p.min_lift}"
    if corrected_p >= p.alpha:
        return f"corrected p {corrected_p:.2g} >= {p.alpha} (Benjamini-Hochberg)"
    return HOLDS


def suggest(events: Iterable[NodeEvent], params: Params | None = None, **changes: Any) -> list[Rule]:
    """The rules learned on the first part of the history (`split`) that hold on the rest; see `mine`."""
    return [r for r in mine(events, params, **changes) if r.holds]
