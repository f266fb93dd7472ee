"""Precursor rules mined from node fault histories, kept only when they hold on history they were not learned on.

A rule reads: "when a node has `burst` or more events of class A within `burst_window_s`, a fault of class T
follows on the same node within `horizon_days`". A is any class of the history (a precursor such as
`ecc_correctable`, `thermal`, `link_errors`, `nic_flap`, or a fault: nodes with repeated faults), T a target
class (`DEFAULT_TARGETS`, shell patterns: fail_stop, sdc, hang, fail_slow, unknown and every `xid_*`); `any_fault`
stands for any target class, as antecedent or as target.

Everything is counted in node-days: each node of the history (every node with at least one event) on each UTC day
(`floor(t / 86400)`) of a part of the history. For a rule (A, k, T) and a node-day (n, d):

- *antecedent*: an A burst completes on n during day d, i.e. an A event on day d is the k-th of k A events
  within the burst window (k = 1: any A event). Several bursts in one day are one antecedent node-day. Single
  events of a noisy class (correctable ECC) are weak; k lets a burst be the signal, and k is learned (below);
- *outcome*: a T fault starts on n during days d+1 .. d+H. Day d itself is left out for every node-day alike, so
  a fault is never its own consequence, nor is a fault that came before the burst on the same day;
- *faults*: events of a target class. One that starts while its node is still down from an earlier one (before
  its `end`, or within `SAME_OUTAGE_S` of its start when the end is unknown) is the same outage: one fault that
  carries both classes (an Xid and the fail-stop it caused are one fault, not a fault and its repeat).

Over the node-days of a part: support = node-days with the antecedent, hits = those with the outcome, confidence
= hits / support, base rate = node-days with the outcome / all node-days, lift = confidence / base rate, and
warned = faults of T in the part with an antecedent node-day in the H days before them (of `faults` in all).

Out of sample. The history's days, from its first event to its last, are cut at `split`. The training part is
the days before the cut less the last H (their outcome would look past the cut); the test part the days from the
cut less the last H (their outcome is not fully seen). Learning reads only the training part: for each (A, T) the
burst size k among `bursts` is the one with the smallest one-sided binomial p-value of its hits against the
training base rate (support at least `min_support`), and the rule passes the screen when that p-value is under
`screen_alpha`. Each screened rule is then scored on the test part alone and *holds* when its test support is at
least `min_support`, its test lift at least `min_lift`, and P(X >= hits) for X ~ Binomial(support, test base
rate) is under `alpha / m`, m the number of screened rules (Bonferroni), so that a fleet without any pattern gets
no suggestion with probability about 1 - alpha. Node-days of one node are not independent (one fault is the
outcome of up to H of them), which the binomial test ignores; the minimum lift is the margin for it.
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
TAINT_KEY = "gangwatch.io/precursor"
TAINT_EFFECT = "PreferNoSchedule"
TAINT_QUANTILE = 0.9  # the taint lasts until this share of the training hits' faults had come

NodeDay = tuple[str, int]


@dataclass(frozen=True)
class Params:
    """What the miner looks for and how sure it must be; a bad value is a ValueError saying what to give."""

    horizon_days: int = 7
    split: float = 0.6
    targets: tuple[str, ...] = DEFAULT_TARGETS
    bursts: tuple[int, ...] = (1, 2, 3, 5)
    burst_window_s: float = DAY_S
    min_support: int = 10
    min_lift: float = 2.0
    alpha: float = 0.01
    screen_alpha: float = 0.05

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
        if self.min_support < 1:
            raise ValueError(f"minimum support {self.min_support}: give at least 1")
        for name in ("alpha", "screen_alpha"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"{name} {getattr(self, name)}: give a probability between 0 and 1")

    def is_target(self, cls: str) -> bool:
        """Whether `cls` is a fault this miner predicts (a shell pattern of `targets` matches it)."""
        return any(fnmatchcase(cls, pattern.lower()) for pattern in self.targets)


@dataclass(frozen=True)
class Score:
    """One rule over one part of the history, in node-days (see the module's definitions)."""

    node_days: int
    support: int
    hits: int
    base_rate: float
    p_value: float
    warned: int
    faults: int

    @property
    def confidence(self) -> float:
        """P(fault within the horizon | antecedent); 0 without support."""
        return self.hits / self.support if self.support else 0.0

    @property
    def lift(self) -> float:
        """confidence / base rate; 0 when the part has no fault of the target (no hit is then possible)."""
        return self.confidence / self.base_rate if self.base_rate > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"node_days": self.node_days, "support": self.support, "hits": self.hits,
                "confidence": round(self.confidence, 4), "base_rate": round(self.base_rate, 5),
                "lift": round(self.lift, 3), "p_value": float(f"{self.p_value:.3g}"), "warned": self.warned,
                "faults": self.faults}


@dataclass(frozen=True)
class Rule:
    """A candidate rule with its training and test scores; `verdict` is `HOLDS` or why it does not."""

    antecedent: str
    burst: int
    target: str
    horizon_days: int
    burst_window_s: float
    train: Score
    test: Score
    taint_h: int
    verdict: str

    @property
    def holds(self) -> bool:
        return self.verdict == HOLDS

    @property
    def name(self) -> str:
        return (f"{self.antecedent} x{self.burst}/{_hours(self.burst_window_s)}h -> {self.target} "
                f"in {self.horizon_days}d")

    def actions(self) -> dict[str, dict[str, Any]]:
        """What to do about it, as plain data: a detection rule and a scheduler taint."""
        value = re.sub(r"[^A-Za-z0-9_.-]", "_", self.antecedent)[:63].strip("_.-") or "precursor"
        return {
            "detect": {"when_class": self.antecedent, "at_least": self.burst,
                       "within_h": _hours(self.burst_window_s), "then": "raise_node_risk",
                       "watch_for": self.target, "watch_days": self.horizon_days,
                       "confidence": round(self.test.confidence, 3), "lift": round(self.test.lift, 2)},
            "taint": {"key": TAINT_KEY, "value": value, "effect": TAINT_EFFECT, "for_h": self.taint_h,
                      "after": f"{self.burst} {self.antecedent} within {_hours(self.burst_window_s)} h"},
        }

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.name, "antecedent": self.antecedent, "burst": self.burst,
                "burst_window_s": self.burst_window_s, "target": self.target, "horizon_days": self.horizon_days,
                "verdict": self.verdict, "train": self.train.to_dict(), "test": self.test.to_dict(),
                "actions": self.actions()}

    def row(self) -> dict[str, Any]:
        """One flat line of a table: the training screen's figures, then the test's."""
        return {"antecedent": self.antecedent, "burst": f">={self.burst}/{_hours(self.burst_window_s)}h",
                "target": self.target, "train_support": self.train.support,
                "train_lift": round(self.train.lift, 2), "test_support": self.test.support,
                "test_hits": self.test.hits, "test_conf": round(self.test.confidence, 3),
                "test_base": round(self.test.base_rate, 4), "test_lift": round(self.test.lift, 2),
                "test_p": f"{self.test.p_value:.2g}", "warned": f"{self.test.warned}/{self.test.faults}",
                "taint_h": self.taint_h}


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


@dataclass
class _Index:
    """The history as the miner reads it: times of each class per node (targets as deduplicated faults)."""

    nodes: frozenset[str]
    times: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # class -> node -> sorted times
    targets: tuple[str, ...] = ()  # target classes present, then ANY_FAULT
    first_day: int = 0
    last_day: int = 0


def _outages(events: list[NodeEvent], params: Params) -> list[tuple[str, float, list[str]]]:
    """The faults of the history as outages, in order of start: (node, start, classes). A target event that starts
    while its node is still down (before the outage's end, or within `SAME_OUTAGE_S` of its start when no end is
    known) joins that outage, which then carries its class too."""
    open_: dict[str, tuple[float, list[str]]] = {}  # node -> (down until, classes) of its latest outage
    out: list[tuple[str, float, list[str]]] = []
    for e in events:
        if not params.is_target(e.cls):
            continue
        until, classes = open_.get(e.node, (-math.inf, []))
        if e.start <= until:
            if e.cls not in classes:
                classes.append(e.cls)
            if e.end is not None and e.end > until:
                open_[e.node] = (e.end, classes)
            continue
        classes = [e.cls]
        open_[e.node] = (e.end if e.end is not None else e.start + SAME_OUTAGE_S, classes)
        out.append((e.node, e.start, classes))
    return out


def _index(events: list[NodeEvent], params: Params) -> _Index:
    """`events` sorted by start, as times per class and node: other classes as they are, targets as outages."""
    idx = _Index(nodes=frozenset(e.node for e in events), first_day=day_of(events[0].start),
                 last_day=day_of(events[-1].start))
    for e in events:
        if not params.is_target(e.cls):
            idx.times.setdefault(e.cls, {}).setdefault(e.node, []).append(e.start)
    for node, start, classes in _outages(events, params):
        for cls in (*classes, ANY_FAULT):
            idx.times.setdefault(cls, {}).setdefault(node, []).append(start)
    present = sorted(c for c in idx.times if c != ANY_FAULT and params.is_target(c))
    idx.targets = (*present, ANY_FAULT) if present else ()
    return idx


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
    """The node-days of one part whose horizon holds a fault of one target, and those faults."""

    positive: frozenset[NodeDay]
    faults: tuple[tuple[str, float], ...]  # (node, start) of the faults that are some node-day's outcome
    node_days: int


def _outcomes(times: dict[str, list[float]], nodes: int, part: tuple[int, int], horizon: int) -> _Outcomes:
    a, b = part
    positive: set[NodeDay] = set()
    faults = []
    for node, ts in times.items():
        for t in ts:
            fd = day_of(t)
            if a < fd <= b + horizon:
                faults.append((node, t))
                positive.update((node, d) for d in range(max(a, fd - horizon), min(b, fd - 1) + 1))
    return _Outcomes(frozenset(positive), tuple(faults), nodes * (b - a + 1))


def _score(ante: dict[NodeDay, float], out: _Outcomes, part: tuple[int, int], horizon: int) -> Score:
    a, b = part
    days = [nd for nd in ante if a <= nd[1] <= b]
    hits = sum(nd in out.positive for nd in days)
    base = len(out.positive) / out.node_days
    warned = sum(any((node, d) in ante for d in range(max(a, day_of(t) - horizon), min(b, day_of(t) - 1) + 1))
                 for node, t in out.faults)
    return Score(node_days=out.node_days, support=len(days), hits=hits, base_rate=base,
                 p_value=binomial_tail(hits, len(days), base), warned=warned, faults=len(out.faults))


def _taint_hours(ante: dict[NodeDay, float], target: dict[str, list[float]], part: tuple[int, int],
                 horizon: int) -> int:
    """Hours after a burst by which `TAINT_QUANTILE` of the training hits' faults had come (the horizon if none)."""
    delays = []
    for (node, d), t in ante.items():
        ts = target.get(node, [])
        i = bisect.bisect_left(ts, (d + 1) * DAY_S)
        if part[0] <= d <= part[1] and i < len(ts) and day_of(ts[i]) <= d + horizon:
            delays.append(ts[i] - t)
    if not delays:
        return horizon * 24
    delays.sort()
    q = delays[min(len(delays) - 1, math.ceil(TAINT_QUANTILE * len(delays)) - 1)]
    return max(1, min(horizon * 24, math.ceil(q / 3600.0)))


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


def mine(events: Iterable[NodeEvent], params: Params | None = None, **changes: Any) -> list[Rule]:
    """Every candidate rule that had enough training support, scored on both parts; those that hold first, then
    by test p-value. `changes` replace fields of `params` (e.g. `split=0.5`)."""
    p = replace(params or Params(), **changes)
    evs = sorted(events, key=in_order)
    if not evs:
        raise ValueError("the history is empty: give events in the import format (node, start, end, class, "
                         "description)")
    idx = _index(evs, p)
    train, test = parts(idx.first_day, idx.last_day, p)
    h, n = p.horizon_days, len(idx.nodes)
    burst_cache: dict[tuple[str, int], dict[NodeDay, float]] = {}
    candidates = []
    for target in idx.targets:
        out_train = _outcomes(idx.times[target], n, train, h)
        for ante_cls in sorted(idx.times):
            best: tuple[int, Score, dict[NodeDay, float]] | None = None
            for k in sorted(set(p.bursts)):
                if (ante_cls, k) not in burst_cache:
                    burst_cache[ante_cls, k] = _bursts(idx.times[ante_cls], k, p.burst_window_s)
                ante = burst_cache[ante_cls, k]
                s = _score(ante, out_train, train, h)
                if s.support >= p.min_support and (best is None or s.p_value < best[1].p_value):
                    best = (k, s, ante)
            if best is not None:
                candidates.append((ante_cls, target, *best))
    screened = sum(s.p_value < p.screen_alpha and s.lift > 1.0 for *_, s, _ in candidates)
    out_test = {target: _outcomes(idx.times[target], n, test, h) for target in idx.targets}
    rules = []
    for ante_cls, target, k, s_train, ante in candidates:
        s_test = _score(ante, out_test[target], test, h)
        rules.append(Rule(antecedent=ante_cls, burst=k, target=target, horizon_days=h,
                          burst_window_s=p.burst_window_s, train=s_train, test=s_test,
                          taint_h=_taint_hours(ante, idx.times[target], train, h),
                          verdict=_verdict(s_train, s_test, p, screened)))
    rules.sort(key=lambda r: (not r.holds, r.test.p_value, -r.test.lift, r.name))
    return rules


def _verdict(train: Score, test: Score, p: Params, screened: int) -> str:
    if not (train.p_value < p.screen_alpha and train.lift > 1.0):
        return f"not learned: training p {train.p_value:.2g} >= {p.screen_alpha}"
    if test.support < p.min_support:
        return f"test support {test.support} < {p.min_support}"
    if test.lift < p.min_lift:
        return f"test lift {test.lift:.2f} < {p.min_lift}"
    if test.p_value >= p.alpha / screened:
        return f"test p {test.p_value:.2g} >= {p.alpha}/{screened}"
    return HOLDS


def suggest(events: Iterable[NodeEvent], params: Params | None = None, **changes: Any) -> list[Rule]:
    """The rules learned on the first part of the history (`split`) that hold on the rest; see `mine`."""
    return [r for r in mine(events, params, **changes) if r.holds]
