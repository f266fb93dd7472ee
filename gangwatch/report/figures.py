"""What an incident's plots show, as data: pure functions of a `gangwatch.report.postmortem.StepWindow`, no drawing.

`gangwatch.report.htmlpage` draws these; the tests check them (the highlighted series is the culprit, masked steps
are out of the colour scale) without matplotlib. Each incident class gets the view that points at its culprit:

- fail-stop: every rank's heartbeat age over time (a live rank stays under its heartbeat period, a dead one
  climbs), and the last step each node finished; the culprit's hardware and framework events marked;
- fail-slow: each rank's compute time as its deviation (%) from the median of its pipeline stage at the same
  step. A synchronous job's step time is the slowest rank's, the same on every rank; the compute part is the
  rank's own, and against its stage's median a checkpoint or a job-wide slowdown cancels out;
- hang (and stall): the ranks of the first stack sweep after the onset clustered by call path
  (`gangwatch.detectors.stacks.cluster_ranks`), who is in which cluster;
- sdc: the replica-digest vote per step and replica of the culprit's shard(s).

Masked steps: warm-up (the first `warmup_steps` after a (re)start: a `job` record, a lifecycle `start` or
`restart`), known pauses (lifecycle `pause` .. `resume`, e.g. a checkpoint save) and job-wide pauses nobody
announced (at most `PAUSE_RUN` consecutive steps whose median step time over the ranks is `PAUSE_FACTOR` times
the window's). They are shaded in the plots and kept out of every colour scale.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gangwatch.detectors.config import FailSlowConfig
from gangwatch.report.postmortem import Event, StepWindow

WARMUP_STEPS = FailSlowConfig().warmup_steps
PAUSE_FACTOR = 2.5  # a step whose median step time is this many times the window's is a pause of the whole job
PAUSE_RUN = 3  # ... when at most this many such steps follow each other (longer: the job is slow, not paused)
SCALE_PERCENTILE = 99.0  # a colour scale spans the unmasked values up to this percentile of their size
MAX_ROWS = 32  # rows (ranks, replicas) a grid shows at most: the culprits first
WARMUP, PAUSE, JOB_PAUSE = "warm-up", "pause", "job-wide pause"


@dataclass(frozen=True)
class Span:
    """A stretch of event time [t0, t1] a plot shades, and why (`WARMUP`, `PAUSE` (with its reason), ...)."""

    t0: float
    t1: float
    reason: str


# --- masked steps -----------------------------------------------------------------


def _step_times(w: StepWindow) -> dict[int, tuple[float, float, float]]:
    """step -> (earliest start over the ranks, latest end, median step time)."""
    by: dict[int, list[tuple[float, float]]] = {}
    for points in w.series.values():
        for p in points:
            by.setdefault(p.step, []).append((p.ts - p.step_s, p.ts, p.step_s))
    return {s: (min(a for a, _, _ in v), max(b for _, b, _ in v), statistics.median(x for _, _, x in v))
            for s, v in by.items()}


def restarts(events: Iterable[Event]) -> list[float]:
    """When the job (re)started: a new `job` record, a lifecycle `start` or `restart`."""
    return sorted(e.ts for e in events
                  if e.kind == "restart" or (e.kind == "lifecycle" and e.what in ("start", "restart")))


def pauses(events: Iterable[Event], end: float) -> list[Span]:
    """Known pauses: each lifecycle `pause` to the next `resume` of the same rank (or of the job), else `end`."""
    open_: dict[int | None, Event] = {}
    out = []
    for e in events:
        if e.kind != "lifecycle":
            continue
        if e.what == "pause":
            open_.setdefault(e.rank, e)
        elif e.what == "resume" and e.rank in open_:
            p = open_.pop(e.rank)
            out.append(Span(p.ts, e.ts, f"{PAUSE} ({p.reason})" if p.reason else PAUSE))
    out += [Span(p.ts, end, f"{PAUSE} ({p.reason})" if p.reason else PAUSE) for p in open_.values()]
    return sorted(out, key=lambda s: s.t0)


def masked_steps(w: StepWindow, warmup_steps: int = WARMUP_STEPS) -> dict[int, str]:
    """step -> why it is kept out of the scales: warm-up, a known pause (its reason), a job-wide pause."""
    times = _step_times(w)
    order = sorted(times, key=lambda s: times[s][1])
    out: dict[int, str] = {}
    for r in restarts(w.events):
        for s in [s for s in order if times[s][1] >= r][:warmup_steps]:
            out.setdefault(s, WARMUP)
    for span in pauses(w.events, w.end):
        for s in order:
            if times[s][0] < span.t1 and times[s][1] > span.t0:
                out.setdefault(s, span.reason)
    rest = [times[s][2] for s in order if s not in out]
    if rest:
        base = statistics.median(rest)
        run: list[int] = []
        for s in [*order, None]:
            if s is not None and s not in out and times[s][2] > PAUSE_FACTOR * base:
                run.append(s)
                continue
            if 0 < len(run) <= PAUSE_RUN:
                out.update(dict.fromkeys(run, JOB_PAUSE))
            run = []
    return dict(sorted(out.items()))


def mask_spans(w: StepWindow, masked: Mapping[int, str]) -> list[Span]:
    """The masked steps as stretches of time (neighbouring steps of one reason merged), and the known pauses."""
    times = _step_times(w)
    out: list[Span] = []
    for s in sorted((s for s in masked if s in times), key=lambda s: times[s][0]):
        t0, t1, _ = times[s]
        if out and out[-1].reason == masked[s] and t0 <= out[-1].t1 + 1e-9 + 0.5 * (t1 - t0):
            out[-1] = Span(out[-1].t0, max(out[-1].t1, t1), masked[s])
        else:
            out.append(Span(t0, t1, masked[s]))
    known = [p for p in pauses(w.events, w.end) if not any(o.t0 <= p.t0 and p.t1 <= o.t1 for o in out)]
    return sorted(out + known, key=lambda s: s.t0)


def scale(values: Iterable[float | None], symmetric: bool = False) -> tuple[float, float]:
    """A colour scale over `values` (None and non-finite left out): their 100-SCALE_PERCENTILE .. SCALE_PERCENTILE
    percentiles, or +-the SCALE_PERCENTILE percentile of their size when `symmetric`."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return (-1.0, 1.0) if symmetric else (0.0, 1.0)

    def pct(xs: list[float], q: float) -> float:
        k = (len(xs) - 1) * q / 100.0
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    if symmetric:
        top = max(pct(sorted(abs(v) for v in vals), SCALE_PERCENTILE), 1e-9)
        return -top, top
    lo, hi = pct(vals, 100.0 - SCALE_PERCENTILE), pct(vals, SCALE_PERCENTILE)
    return lo, max(hi, lo + 1e-9)


def rank_label(w: StepWindow, rank: int) -> str:
    node = w.node(rank)
    return f"rank {rank}" + (f" ({node})" if node else "")


def _culprits_first(ranks: Iterable[int], culprits: Iterable[int], limit: int = MAX_ROWS) -> list[int]:
    """At most `limit` ranks, every culprit among them, in rank order."""
    pool = sorted(set(ranks))
    mine = [r for r in pool if r in set(culprits)]
    return sorted(mine + [r for r in pool if r not in set(mine)][:max(0, limit - len(mine))])


# --- fail-slow: compute time against the stage's median ---------------------------------------------------------


@dataclass(frozen=True)
class Deviation:
    """Each rank's `what` (compute_s, else step_s) as % above (+) or below (-) the median of its pipeline stage
    at the same step. `grid[i][j]`: rank `ranks[i]` at step `steps[j]` (None: missing); `masked`: step -> why;
    `scale`: the colour scale, symmetric, from the unmasked cells only; `culprits`: the ranks highlighted;
    `mean`: rank -> its mean deviation over the unmasked steps from `since_step` on."""

    what: str
    steps: list[int]
    ranks: list[int]
    grid: list[list[float | None]]
    masked: dict[int, str]
    scale: tuple[float, float]
    culprits: list[int]
    mean: dict[int, float]

    def row(self, rank: int) -> list[float | None]:
        return self.grid[self.ranks.index(rank)]


def deviation(w: StepWindow, masked: Mapping[int, str], since_step: int | None = None) -> Deviation:
    what = "compute_s" if w.has_compute else "step_s"
    steps = w.steps
    col = {s: j for j, s in enumerate(steps)}
    stage = {r: (w.places[r].pp if r in w.places else 0) for r in w.ranks}
    by: dict[tuple[int, int], list[float]] = {}
    for r, points in w.series.items():
        for p in points:
            v = getattr(p, what)
            if v is not None:
                by.setdefault((p.step, stage[r]), []).append(v)
    median = {k: statistics.median(v) for k, v in by.items()}
    grid: list[list[float | None]] = []
    for r in w.ranks:
        row: list[float | None] = [None] * len(steps)
        for p in w.series[r]:
            v, m = getattr(p, what), median.get((p.step, stage[r]))
            if v is not None and m:
                row[col[p.step]] = 100.0 * (v / m - 1.0)
        grid.append(row)
    keep = [j for j, s in enumerate(steps) if s not in masked]
    first = since_step if since_step is not None else (steps[0] if steps else 0)
    mean = {}
    for i, r in enumerate(w.ranks):
        vals = [grid[i][j] for j in keep if steps[j] >= first and grid[i][j] is not None]
        if vals:
            mean[r] = statistics.fmean(vals)
    culprits = sorted(w.culprits & set(w.ranks))
    return Deviation(what, steps, w.ranks, grid, dict(masked), scale((grid[i][j] for i in range(len(grid))
                                                                       for j in keep), symmetric=True),
                     culprits, mean)


# --- fail-stop: heartbeats and progress ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Liveness:
    """`times`: the grid of event times; `age[rank]`: seconds since the rank's last heartbeat at each time (None
    before its first in the window); `last_beat[rank]`: its last heartbeat; `progress[node]`: the highest step
    any of its ranks finished by each time (None before its first); `culprits`: the ranks highlighted;
    `marks`: the hardware events of the culprits' nodes and the framework events of the culprit ranks."""

    times: list[float]
    age: dict[int, list[float | None]]
    last_beat: dict[int, float]
    progress: dict[str, list[int | None]]
    culprits: list[int]
    culprit_nodes: list[str]
    marks: list[Event]

    def silent_from(self, rank: int) -> float | None:
        return self.last_beat.get(rank)


def liveness(w: StepWindow, culprit_nodes: Iterable[str], points: int = 400) -> Liveness:
    n = max(2, points)
    times = [w.start + (w.end - w.start) * k / (n - 1) for k in range(n)]
    beats: dict[int, list[float]] = {}
    for e in w.events:
        if e.kind == "heartbeat" and e.rank is not None:
            beats.setdefault(e.rank, []).append(e.ts)
    age: dict[int, list[float | None]] = {}
    for r, ts in beats.items():
        ts.sort()
        row: list[float | None] = []
        for t in times:
            k = bisect.bisect_right(ts, t)
            row.append(None if k == 0 else t - ts[k - 1])
        age[r] = row
    done: dict[str, list[tuple[float, int]]] = {}
    for r, pts in w.series.items():
        done.setdefault(w.node(r) or f"rank {r}", []).extend((p.ts, p.step) for p in pts)
    progress: dict[str, list[int | None]] = {}
    for node, items in done.items():
        items.sort()
        best, k, row_p = None, 0, []
        for t in times:
            while k < len(items) and items[k][0] <= t:
                best = items[k][1] if best is None else max(best, items[k][1])
                k += 1
            row_p.append(best)
        progress[node] = row_p
    nodes = sorted(set(culprit_nodes))
    culprits = sorted(w.culprits)
    marks = [e for e in w.events if (e.kind == "hw" and e.node in nodes)
             or (e.kind == "framework" and e.rank in set(culprits) and e.what != "nccl_timeout")]
    return Liveness(times, age, {r: ts[-1] for r, ts in beats.items()}, progress, culprits, nodes, marks)


# --- hang: stack clusters ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    """Ranks of one sweep sharing a call path: `frame` the innermost frame of `signature`, `culprit` whether it
    holds a culprit rank; clusters ordered by size, the largest (the healthy majority) first."""

    ranks: tuple[int, ...]
    nodes: tuple[str, ...]
    signature: tuple[str, ...]
    frame: str
    culprit: bool


def stack_clusters(w: StepWindow) -> list[Cluster]:
    from gangwatch.detectors.stacks import cluster_ranks

    culprits = w.culprits
    out = []
    for c in cluster_ranks(w.stacks):
        sig = tuple(f for f in c.signature if f != "|")
        out.append(Cluster(c.ranks, tuple(sorted({w.node(r) for r in c.ranks if w.node(r)})), c.signature,
                           sig[0] if sig else "(empty stack)", bool(culprits & set(c.ranks))))
    return out


def distinct_frame(cluster: Cluster, healthy: Cluster) -> str:
    """The innermost frame of `cluster`'s path that the healthy cluster's path lacks (its own innermost frame
    when there is none)."""
    theirs = set(healthy.signature)
    return next((f for f in cluster.signature if f != "|" and f not in theirs), cluster.frame)


def ranks_text(ranks: Iterable[int], limit: int = 12) -> str:
    """Ranks as ranges: 0-7, 9, 12-15; cut after `limit` items."""
    items: list[str] = []
    run: list[int] = []
    for r in [*sorted(set(ranks)), None]:
        if r is not None and run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            items.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [] if r is None else [r]
    return ", ".join(items[:limit]) + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


# --- sdc: the digest vote --------------------------------------------------------------------------------------------

AGREE, DISSENT, UNCHECKED = 1, 0, -1


@dataclass(frozen=True)
class Vote:
    """The replica-digest vote of the shards that hold a culprit rank (or a dissenting one): `rows` their ranks
    (by shard, then replica), `cells[i][j]`: AGREE, DISSENT (a minority digest) or UNCHECKED (no digest, or no
    clear majority) for rank `rows[i]` at step `steps[j]`; `masked` as everywhere."""

    steps: list[int]
    rows: list[int]
    labels: list[str]
    cells: list[list[int]]
    culprits: list[int]
    masked: dict[int, str]

    def dissents(self, rank: int) -> int:
        return sum(c == DISSENT for c in self.cells[self.rows.index(rank)])


def digest_vote(w: StepWindow, masked: Mapping[int, str]) -> Vote:
    shard = {r: ((w.places[r].tp, w.places[r].pp) if r in w.places else (0, 0)) for r in w.ranks}
    digests: dict[tuple[int, int], dict[int, str]] = {}  # (shard index, step) -> rank -> digest
    for r, points in w.series.items():
        for p in points:
            if p.digest:
                digests.setdefault(p.step, {})[r] = p.digest
    verdict: dict[tuple[int, int], int] = {}
    for step, got in digests.items():
        groups: dict[tuple[int, int], dict[int, str]] = {}
        for r, d in got.items():
            groups.setdefault(shard[r], {})[r] = d
        for members in groups.values():
            counts: dict[str, int] = {}
            for d in members.values():
                counts[d] = counts.get(d, 0) + 1
            top = max(counts.values())
            major = [d for d, c in counts.items() if c == top]
            clear = len(major) == 1 and 2 * top > len(members)
            for r, d in members.items():
                verdict[(r, step)] = UNCHECKED if not clear else AGREE if d == major[0] else DISSENT
    dissenting = {r for (r, _), v in verdict.items() if v == DISSENT}
    culprits = sorted(w.culprits & set(w.ranks)) or sorted(dissenting)
    shards = {shard[r] for r in [*culprits, *dissenting]}
    pool = [r for r in w.ranks if shard[r] in shards]
    rows = sorted(_culprits_first(pool, culprits), key=lambda r: (shard[r], w.places[r].dp if r in w.places else r))
    steps = w.steps
    cells = [[verdict.get((r, s), UNCHECKED) for s in steps] for r in rows]
    labels = [f"{rank_label(w, r)} tp{shard[r][0]} pp{shard[r][1]} dp{w.places[r].dp if r in w.places else '?'}"
              for r in rows]
    return Vote(steps, rows, labels, cells, culprits, dict(masked))
