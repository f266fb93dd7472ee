"""Post-mortem reports over the store: one incident, one job, or a period, for the terminal.

Two halves, kept apart. Gathering (`gather_incident`, `gather_job`, `gather_period`, `gather_latest`) runs SQL
through a callable that returns rows (the command line passes the `query_store` of `gangwatch sql`, so the
same stores, the same errors); the SQL keeps to ClickHouse 18.16: no JOINs, no lambdas that read columns,
`FINAL` on the ReplacingMergeTrees, values put in as literals by `gangwatch.report.queries.literal`. The report
model (`incident_report`, `job_report`, `period_report`) is pure functions of those rows: no I/O, no clock.
`*_text` renders a model for the terminal; `gangwatch.report.htmlpage` renders the same model as HTML.

Times are event-time floats (epoch s) in the model and ISO 8601 UTC in the text. A stage's budget is the
`triage.budgets.*` setting the report runs with (a stage without one, `decide`, has none): a stage is over
when its seconds exceed it, as triage judges it (`triage/incident.py`).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from gangwatch.fleet.kb import DIAGNOSTIC, ActionTaken
from gangwatch.report.queries import Param, catalog, literal, render

Rows = list[dict[str, Any]]
Run = Callable[[str], Rows]

MILESTONES = ("onset", "detected", "localized", "decided", "recovered")
ENDED = frozenset({"finished", "stopped", "failed"})  # a job whose last move is one of these is not running on
STEP_ROWS_MAX = 1_000_000  # step records one report reads at most (a window of a very large job is cut there)
LATEST = 20  # incidents `gather_latest` lists
INCIDENT_COLUMNS = ("id, ts, job, class, planned, onset_ts, detected_ts, localized_ts, decided_ts, recovered_ts, "
                    "culprit_nodes, evicted_nodes, path, stage_names, stage_seconds, over_budget")


class EmptyStore(ValueError):
    """The store holds no incidents and no job life: nothing was written to it yet."""


class NotInStore(ValueError):
    """The incident or job asked for is not in the store (which holds others)."""


# --- the model ---------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One stage of an incident: its seconds against its budget (None: the stage has no budget)."""

    name: str
    seconds: float
    budget: float | None
    over: bool


@dataclass(frozen=True)
class Evidence:
    """A finding an incident's actions cite."""

    id: str
    ts: float
    type: str
    detector: str
    rank: int | None
    node: str
    score: float | None
    gist: str  # the evidence's telling fields, one line
    event_ts: float | None = None  # when the event itself was logged, where the finding came later (`_event_time`)

    @property
    def at(self) -> float:
        """The event's own time where the evidence dates it (a kernel-log line: the time a plot marks it at), else
        the finding's: the time a report shows it at and orders it by."""
        return self.ts if self.event_ts is None else self.event_ts


class Point(NamedTuple):
    """One rank's step: when it finished, how long it took, its compute part (None: not reported) and its
    replica digest ("" : none)."""

    step: int
    ts: float
    step_s: float
    compute_s: float | None
    digest: str = ""


class Place(NamedTuple):
    """Where a rank runs (the job record): its node and its tensor-, pipeline- and data-parallel coordinates."""

    node: str
    tp: int = 0
    pp: int = 0
    dp: int = 0


class Event(NamedTuple):
    """A record of the window that is no step: `kind` heartbeat (`what` its step), hw (`what` e.g. "Xid 79"),
    framework (`what` its type: exit, exception, nccl_timeout, ...), lifecycle (`what` its event, `reason`
    its reason: pause/checkpoint, restart, ...) or restart (a new `job` record)."""

    ts: float
    kind: str
    what: str
    rank: int | None = None
    node: str = ""
    reason: str = ""


@dataclass(frozen=True)
class StepWindow:
    """Step times of every rank in [start, end]: `series[rank]` is its points, by step.

    `named_ranks`: ranks the cited findings name; `culprit_ranks`: ranks on the culprit nodes (the job's
    topology). `truncated`: the window held more than `STEP_ROWS_MAX` records and was cut. `places`: rank ->
    where it runs; `events`: the window's other records (heartbeats, hardware and framework events, lifecycle
    moments, restarts) by time; `stacks`: rank -> its normalized call path in the first stack sweep after the
    onset (`gangwatch.detectors.stacks.signature`).
    """

    start: float
    end: float
    series: dict[int, tuple[Point, ...]]
    named_ranks: frozenset[int] = frozenset()
    culprit_ranks: frozenset[int] = frozenset()
    truncated: bool = False
    places: dict[int, Place] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    stacks: dict[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def culprits(self) -> frozenset[int]:
        """The ranks a plot points at: the ones the findings name, else every rank of the culprit nodes."""
        return self.named_ranks or self.culprit_ranks

    def node(self, rank: int) -> str:
        place = self.places.get(rank)
        return place.node if place is not None else ""

    @property
    def ranks(self) -> list[int]:
        return sorted(self.series)

    @property
    def steps(self) -> list[int]:
        return sorted({p.step for points in self.series.values() for p in points})

    @property
    def has_compute(self) -> bool:
        return any(p.compute_s is not None for points in self.series.values() for p in points)

    def matrix(self, what: str = "step_s") -> list[list[float | None]]:
        """`what` (step_s or compute_s) by rank (rows, in `ranks` order) and step (columns, in `steps` order);
        None where missing."""
        col = {s: i for i, s in enumerate(self.steps)}
        out = []
        for r in self.ranks:
            row: list[float | None] = [None] * len(col)
            for p in self.series[r]:
                row[col[p.step]] = getattr(p, what)
            out.append(row)
        return out

    def step_at(self, ts: float) -> int | None:
        """The first step any rank finished at or after `ts` (the step a fault at `ts` lands in); None past the
        window."""
        done = [p.step for points in self.series.values() for p in points if p.ts >= ts]
        return min(done) if done else None


@dataclass(frozen=True)
class IncidentReport:
    id: str
    job: str
    cls: str
    planned: bool
    path: str
    culprit_nodes: tuple[str, ...]
    evicted_nodes: tuple[str, ...]
    times: dict[str, float | None]  # MILESTONES -> event time (None: not reached)
    stages: tuple[Stage, ...]
    evidence: tuple[Evidence, ...]
    actions: tuple[ActionTaken, ...]
    steps: StepWindow | None = None

    @property
    def decided_by(self) -> tuple[ActionTaken, ...]:
        """The actions the incident was decided by: its first carried out that gathers more than evidence (not a
        sweep or a replay: `kb.DIAGNOSTIC`), with every other action of that moment (an SDC's rollback, isolate and
        dual run); only diagnostic ones: the first of them; nothing carried out (shadow mode): the same of all."""
        done = [a for a in self.actions if not a.shadow] or list(self.actions)
        first = next((a for a in done if a.type not in DIAGNOSTIC), None)
        if first is None:
            return tuple(done[:1])
        return tuple(a for a in done if abs(a.ts - first.ts) <= 1e-3)

    @property
    def ladder(self) -> tuple[ActionTaken, ...]:
        """The evidence-gathering actions that came before the decision (sweeps, replays)."""
        decided = self.decided_by
        until = decided[0].ts if decided else float("inf")
        return tuple(a for a in self.actions if a.type in DIAGNOSTIC and a.ts < until and a not in decided)

    @property
    def decision(self) -> ActionTaken | None:
        """The first action the incident was decided by (`decided_by`)."""
        return (self.decided_by or (None,))[0]

    @property
    def state(self) -> str:
        """Where it stands: `recovered`; `running degraded` (decided to keep running, watched: nothing was
        repaired: its path `non_stop`, or a degrade its last action that acts); `open`."""
        done = [a for a in self.actions if not a.shadow] or list(self.actions)
        acting = [a for a in done if a.type not in DIAGNOSTIC and a.type != "escalate"]
        if self.path == "non_stop" or (acting and acting[-1].type == "degrade"):
            return "running degraded"
        return "recovered" if self.times.get("recovered") is not None else "open"

    @property
    def milestones(self) -> list[tuple[str, float | None]]:
        """The timeline: each of MILESTONES and its time, `recovered` named `closed` where the incident runs
        degraded (its close is no recovery)."""
        degraded = self.state == "running degraded"
        return [("closed" if m == "recovered" and degraded else m, self.times.get(m)) for m in MILESTONES]

    @property
    def over_budget(self) -> list[str]:
        return [s.name for s in self.stages if s.over]


@dataclass(frozen=True)
class IncidentLine:
    """An incident in a list: what it was, when, and how long it took to recover (None: not recovered)."""

    id: str
    job: str
    cls: str
    planned: bool
    onset_ts: float | None
    recovered_ts: float | None
    culprit_nodes: tuple[str, ...]
    path: str
    over_budget: tuple[str, ...]

    @property
    def state(self) -> str:
        """As `IncidentReport.state`, from the row alone: `running degraded` where its path is `non_stop` (a
        degrade decided it, nothing was repaired, whatever its close time), `recovered`, `open`."""
        if self.path == "non_stop":
            return "running degraded"
        return "recovered" if self.recovered_ts is not None else "open"

    @property
    def recover_s(self) -> float | None:
        """Seconds from onset to recovery; None where it did not recover (open, or running degraded)."""
        if self.onset_ts is None or self.recovered_ts is None or self.state != "recovered":
            return None
        return max(0.0, self.recovered_ts - self.onset_ts)


@dataclass(frozen=True)
class Move:
    """A move in a job's life: from `ts` on, the job is `state`."""

    ts: float
    state: str
    previous: str
    cause: str


@dataclass(frozen=True)
class Ettr:
    """A job's effective training time ratio, as `gangwatch/report/sql/ettr.sql` defines it (None: no wall time)."""

    job: str
    wall_s: float
    running_s: float
    lost_s: float
    ettr: float | None


@dataclass(frozen=True)
class JobReport:
    job: str
    moves: tuple[Move, ...]
    incidents: tuple[IncidentLine, ...]
    ettr: Ettr | None
    state_s: dict[str, float] = field(default_factory=dict)  # seconds spent in each state, first move to last
    entered: dict[str, int] = field(default_factory=dict)  # how many times the job entered each state


@dataclass(frozen=True)
class PeriodReport:
    since: float
    until: float | None  # None: no end
    incidents: tuple[IncidentLine, ...]
    classes: tuple[dict[str, Any], ...]  # rows of `gangwatch sql interruptions_by_class` for the period
    ettr: tuple[Ettr, ...]  # jobs alive in the period, from their first move to the period's end


# --- rows -> model (pure) ----------------------------------------------------


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def stages(row: Mapping[str, Any], budgets: Mapping[str, float]) -> tuple[Stage, ...]:
    """An incident row's stages in stored (stage) order, each against `budgets[name]`; a stage without a budget
    is over only where the row's `over_budget` says so."""
    stored_over = set(row.get("over_budget") or ())
    out = []
    for name, seconds in zip(row.get("stage_names") or (), row.get("stage_seconds") or (), strict=True):
        budget = _float(budgets.get(name))
        over = seconds > budget if budget is not None else name in stored_over
        out.append(Stage(name, float(seconds), budget, over))
    return tuple(out)


def gist(evidence: str | Mapping[str, Any] | None, limit: int = 140) -> str:
    """A finding's evidence (its JSON text or dict) as one short line: name, cause, code, message where it has
    them (and the cost share of a straggler), else its first few plain fields."""
    if isinstance(evidence, str):
        try:
            evidence = orjson.loads(evidence) if evidence else {}
        except orjson.JSONDecodeError:
            return evidence.splitlines()[0][:limit] if evidence.strip() else ""
    if not isinstance(evidence, Mapping):
        return ""
    plain = {k: first_line(v) for k, v in evidence.items() if isinstance(v, str | int | float | bool)}
    plain = {k: v for k, v in plain.items() if v}
    keys = [k for k in ("name", "cause", "code", "message", "cost_frac") if k in plain] or list(plain)[:3]
    text = "; ".join(f"{k} {plain[k]}" for k in keys)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def first_line(v: object) -> str:
    text = str(v).strip()
    return text.splitlines()[0] if text else ""


# what the time an event's evidence dates it by is, by the hw record's source
LOGGED_BY = {"xid": "kernel log", "kernel": "kernel log", "bmc": "BMC log", "nic": "link down"}


def _event_ts(evidence: Mapping[str, Any], found: float) -> float | None:
    """The event's own time where a finding's evidence dates it before the finding (a kernel-log line, judged once
    its storm window passed); None where it does not."""
    at = evidence.get("event_ts")
    return float(at) if isinstance(at, int | float) and found - at >= 0.05 else None


def _clock(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%H:%M:%S.%f")[:10]


def _event_time(evidence: Mapping[str, Any], found: float) -> str:
    """"kernel log HH:MM:SS.s, found HH:MM:SS.s; " (the log or moment its source names) where the evidence dates
    the event itself before the finding: one event, its two times, each named."""
    at = _event_ts(evidence, found)
    if at is None:
        return ""
    return f"{LOGGED_BY.get(str(evidence.get('source') or ''), 'logged')} {_clock(at)}, found {_clock(found)}; "


def _evidence_dict(evidence: str | Mapping[str, Any] | None) -> Mapping[str, Any]:
    if isinstance(evidence, str):
        try:
            evidence = orjson.loads(evidence) if evidence else {}
        except orjson.JSONDecodeError:
            return {}
    return evidence if isinstance(evidence, Mapping) else {}


def evidence_chain(rows: Iterable[Mapping[str, Any]]) -> tuple[Evidence, ...]:
    """Finding rows as the evidence chain: each finding once, in event-time order (the event's own time where the
    evidence dates it earlier than the finding: `Evidence.at`), then id; such a finding's gist starts with both
    times, named (`_event_time`)."""
    seen: dict[str, Evidence] = {}
    for r in rows:
        rank, found, ev = r.get("rank"), float(r["ts"]), _evidence_dict(r.get("evidence"))
        seen[r["id"]] = Evidence(r["id"], found, r["type"], r.get("detector") or "",
                                 None if rank is None else int(rank), r.get("node") or "", _float(r.get("score")),
                                 _event_time(ev, found) + gist(r.get("evidence")), _event_ts(ev, found))
    return tuple(sorted(seen.values(), key=lambda e: (e.at, e.id)))


def actions(rows: Iterable[Mapping[str, Any]]) -> tuple[ActionTaken, ...]:
    out = {r["id"]: ActionTaken(r["id"], float(r["ts"]), r["type"], tuple(r.get("nodes") or ()), r.get("path") or "",
                                r.get("reason") or "", bool(r.get("shadow"))) for r in rows}
    return tuple(sorted(out.values(), key=lambda a: (a.ts, a.id)))


def places(payload: str | None) -> dict[int, Place]:
    """rank -> where it runs, from a `job` record's JSON (its `gw_telemetry` payload); {} for none or a bad one."""
    if not payload:
        return {}
    try:
        rec = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return {}
    ranks = rec.get("ranks") if isinstance(rec, dict) else None
    out = {}
    for r in ranks or ():
        if isinstance(r, dict) and "rank" in r and "node" in r:
            out[int(r["rank"])] = Place(str(r["node"]), *(int(r.get(k) or 0) for k in ("tp", "pp", "dp")))
    return out


def events(rows: Iterable[Mapping[str, Any]]) -> tuple[Event, ...]:
    """Telemetry rows (ts, kind, rank, node, step, payload) that are not steps as events, by time."""
    out = []
    for r in rows:
        kind, rank = r["kind"], r.get("rank")
        rank = None if rank is None else int(rank)
        try:
            rec = orjson.loads(r.get("payload") or "{}")
        except orjson.JSONDecodeError:
            rec = {}
        rec = rec if isinstance(rec, dict) else {}
        if kind == "heartbeat":
            out.append(Event(float(r["ts"]), kind, "" if r.get("step") is None else str(r["step"]), rank))
        elif kind == "hw":
            code, source = rec.get("code"), str(rec.get("source") or "")
            what = f"Xid {code}" if source == "xid" and code is not None else (source + (f" {code}" if code else ""))
            gpu = rec.get("gpu")
            out.append(Event(float(r["ts"]), kind, what, None, str(r.get("node") or ""),
                             "" if gpu is None else f"gpu {gpu}"))
        elif kind == "framework":
            out.append(Event(float(r["ts"]), kind, str(rec.get("type") or ""), rank))
        elif kind == "lifecycle":
            out.append(Event(float(r["ts"]), kind, str(rec.get("event") or ""), rank, "", str(rec.get("reason") or "")))
        elif kind == "job":
            out.append(Event(float(r["ts"]), "restart", "job record"))
    return tuple(sorted(out, key=lambda e: (e.ts, e.kind, -1 if e.rank is None else e.rank)))


def stack_signatures(rows: Iterable[Mapping[str, Any]]) -> dict[int, tuple[str, ...]]:
    """rank -> its normalized call path, from the `stack` rows of one sweep (payload: the record's JSON); a rank
    whose record does not decode is left out."""
    from gangwatch.detectors.stacks import signature, thread_stacks
    from gangwatch.schemas import Stack, decode

    out = {}
    for r in rows:
        for rec in decode(r["payload"]):
            sig = signature(thread_stacks(rec)) if isinstance(rec, Stack) else ()
            if sig:
                out[int(rec.rank)] = sig
    return out


def step_window(rows: Iterable[Mapping[str, Any]], start: float, end: float, *, named: Iterable[int] = (),
                nodes_of: Mapping[int, str] | None = None, culprits: Iterable[str] = (),
                truncated: bool = False, where: Mapping[int, Place] | None = None,
                others: Iterable[Event] = (), stacks: Mapping[int, tuple[str, ...]] | None = None) -> StepWindow:
    """Step rows (rank, step, ts, step_s, compute_s[, digest]) in [start, end] as a window; a (rank, step)
    stored twice counts once (its latest record); rows without a finite step time are left out. The ranks'
    nodes come from `where` (rank -> Place) or `nodes_of` (rank -> node)."""
    latest: dict[tuple[int, int], Point] = {}
    for r in rows:
        ts, v = float(r["ts"]), _float(r.get("step_s"))
        if r.get("rank") is None or r.get("step") is None or v is None or not math.isfinite(v):
            continue
        if not start <= ts <= end:
            continue
        key = (int(r["rank"]), int(r["step"]))
        c = _float(r.get("compute_s"))
        if key not in latest or ts >= latest[key].ts:
            latest[key] = Point(key[1], ts, v, c if c is not None and math.isfinite(c) else None,
                                str(r.get("digest") or ""))
    series: dict[int, list[Point]] = {}
    for (rank, _), point in sorted(latest.items()):
        series.setdefault(rank, []).append(point)
    spots = dict(where) if where is not None else {r: Place(n) for r, n in (nodes_of or {}).items()}
    culprit_set = set(culprits)
    on_culprits = frozenset(r for r, p in spots.items() if p.node in culprit_set)
    return StepWindow(start, end, {r: tuple(p) for r, p in series.items()}, frozenset(named), on_culprits, truncated,
                      spots, tuple(e for e in others if start <= e.ts <= end or (e.kind == "restart" and e.ts <= end)),
                      dict(stacks or {}))


def incident_report(row: Mapping[str, Any], action_rows: Rows, finding_rows: Rows, budgets: Mapping[str, float],
                    steps: StepWindow | None = None) -> IncidentReport:
    """The report of one incident from its row (`gw_incidents FINAL`), its actions' rows and the rows of the
    findings they cite."""
    return IncidentReport(
        id=row["id"], job=row["job"], cls=row["class"], planned=bool(row.get("planned")), path=row.get("path") or "",
        culprit_nodes=tuple(row.get("culprit_nodes") or ()), evicted_nodes=tuple(row.get("evicted_nodes") or ()),
        times={m: _float(row.get(f"{m}_ts")) for m in MILESTONES}, stages=stages(row, budgets),
        evidence=evidence_chain(finding_rows), actions=actions(action_rows), steps=steps)


def incident_line(row: Mapping[str, Any]) -> IncidentLine:
    return IncidentLine(row["id"], row["job"], row["class"], bool(row.get("planned")), _float(row.get("onset_ts")),
                        _float(row.get("recovered_ts")),
                        tuple(row.get("culprit_nodes") or ()), row.get("path") or "",
                        tuple(row.get("over_budget") or ()))


def incident_lines(rows: Iterable[Mapping[str, Any]]) -> tuple[IncidentLine, ...]:
    """Incidents by onset (an incident without one last), then id."""
    lines = [incident_line(r) for r in rows]
    return tuple(sorted(lines, key=lambda i: (i.onset_ts if i.onset_ts is not None else math.inf, i.id)))


def moves(rows: Iterable[Mapping[str, Any]]) -> tuple[Move, ...]:
    out = [Move(float(r["ts"]), r["state"], r.get("previous") or "", r.get("cause") or "") for r in rows]
    return tuple(sorted(out, key=lambda m: m.ts))


def time_in_states(life: Iterable[Move]) -> dict[str, float]:
    """Seconds the job spent in each state: each move lasts until the next; the last move has no span (the
    job's life, as far as the store knows, ends there)."""
    seq = list(life)
    out: dict[str, float] = {}
    for a, b in zip(seq, seq[1:], strict=False):
        out[a.state] = out.get(a.state, 0.0) + max(0.0, b.ts - a.ts)
    return out


def ettr_row(row: Mapping[str, Any]) -> Ettr:
    return Ettr(row["job"], float(row["wall_s"]), float(row["running_s"]), float(row["lost_s"]),
                _float(row.get("ettr")))


def job_report(job: str, life_rows: Rows, incident_rows: Rows, ettr_rows: Rows) -> JobReport:
    life = moves(life_rows)
    entered: dict[str, int] = {}
    for m in life:
        entered[m.state] = entered.get(m.state, 0) + 1
    mine = [r for r in ettr_rows if r["job"] == job]
    return JobReport(job, life, incident_lines(incident_rows), ettr_row(mine[0]) if mine else None,
                     time_in_states(life), entered)


def alive(spans: Iterable[Mapping[str, Any]], since: float, until: float | None) -> set[str]:
    """Jobs whose life overlaps [since, until): started before `until`, and still going at `since` (their last
    move at or after it, or a last state that is not an end). `spans`: job, first_ts, last_ts, last_state."""
    end = math.inf if until is None else until
    return {s["job"] for s in spans
            if float(s["first_ts"]) < end and (float(s["last_ts"]) >= since or s["last_state"] not in ENDED)}


def period_ettr(spans: Rows, at_end: Rows, at_last: Rows, since: float, until: float | None) -> tuple[Ettr, ...]:
    """ETTR per job alive in the period, from its first move to the period's end (`at_end`: ettr.sql with
    until = the end), or to its own end for a job that ended before it (`at_last`: ettr.sql to each job's last
    move)."""
    keep = alive(spans, since, until)
    ended_before = {s["job"] for s in spans
                    if s["last_state"] in ENDED and (until is None or float(s["last_ts"]) < until)}
    by_end = {r["job"]: r for r in at_end}
    by_last = {r["job"]: r for r in at_last}
    out = []
    for job in sorted(keep):
        row = by_last.get(job) if job in ended_before or until is None else by_end.get(job)
        if row is not None:
            out.append(ettr_row(row))
    return tuple(out)


def period_report(since: float, until: float | None, incident_rows: Rows, class_rows: Rows,
                  ettr: tuple[Ettr, ...]) -> PeriodReport:
    return PeriodReport(since, until, incident_lines(incident_rows), tuple(class_rows), ettr)


# --- gathering: SQL through `run` ---------------------------------------------


def _s(value: str) -> str:
    return literal(Param("value", "String", "''", ""), value)


def _f(value: float) -> str:
    return literal(Param("value", "Float64", "0", ""), repr(float(value)))


def _check_not_empty(run: Run) -> None:
    """EmptyStore when the store holds no incident and no job move; else nothing (the lookup just missed)."""
    counts = run("SELECT (SELECT count() FROM gw_incidents) AS incidents, (SELECT count() FROM gw_jobs) AS moves")
    if not counts or not (int(counts[0]["incidents"]) or int(counts[0]["moves"])):
        raise EmptyStore("the store holds no incidents and no job life: replay or run something into it "
                         "first (`gangwatch replay FILE --out DIR`)")


def gather_latest(run: Run, limit: int = LATEST) -> tuple[IncidentLine, ...]:
    """The `limit` latest incidents (by onset), oldest first; EmptyStore for a store with nothing in it."""
    rows = run(f"SELECT {INCIDENT_COLUMNS} FROM gw_incidents FINAL ORDER BY ifNull(onset_ts, ts) DESC, id "
               f"LIMIT {int(limit)}")
    if not rows:
        _check_not_empty(run)
    return incident_lines(rows)


def gather_steps(run: Run, job: str, start: float, end: float, *, named: Iterable[int], culprits: Iterable[str],
                 before: float, cls: str = "") -> StepWindow | None:
    """The telemetry of `job` in [start, end] from gw_telemetry (stored only by `--telemetry`): its steps (with
    their replica digests for an `sdc` incident), heartbeats, framework and lifecycle records, its (re)starts,
    the hardware events of its nodes, the first stack sweep at or after `before` (for a `hang` or `stall`), and
    the placement of its latest `job` record at or before `before`; None when no step of the window was stored."""
    window = f"job = {_s(job)} AND ts >= {_f(start)} AND ts <= {_f(end)}"
    digest = ", visitParamExtractString(payload, 'replica_digest') AS digest" if cls == "sdc" else ""
    rows = run(f"SELECT rank, step, ts, step_s, compute_s{digest} FROM gw_telemetry WHERE {window} AND kind = 'step' "
               "AND rank IS NOT NULL AND step IS NOT NULL "
               f"AND step_s IS NOT NULL ORDER BY rank, step LIMIT {STEP_ROWS_MAX + 1}")
    if not rows:
        return None
    topo = run(f"SELECT ts, kind, rank, node, step, payload FROM gw_telemetry WHERE job = {_s(job)} AND kind = 'job' "
               f"AND ts <= {_f(before)} ORDER BY ts DESC LIMIT 1")
    where = places(topo[0]["payload"] if topo else None)
    nodes = sorted({p.node for p in where.values()})
    quiet = run("SELECT ts, kind, rank, node, step, '' AS payload FROM gw_telemetry "
                f"WHERE {window} AND kind = 'heartbeat' ORDER BY ts LIMIT {STEP_ROWS_MAX}")
    said = run("SELECT ts, kind, rank, node, step, payload FROM gw_telemetry "
               f"WHERE {window} AND kind IN ('framework', 'lifecycle', 'job') ORDER BY ts LIMIT 10000")
    hw = run("SELECT ts, kind, rank, node, step, payload FROM gw_telemetry WHERE kind = 'hw' "
             f"AND node IN ({', '.join(_s(n) for n in nodes)}) AND ts >= {_f(start)} AND ts <= {_f(end)} "
             "ORDER BY ts LIMIT 10000") if nodes else []
    stacks: dict[int, tuple[str, ...]] = {}
    if cls in ("hang", "stall"):
        first = run("SELECT visitParamExtractString(payload, 'snapshot') AS snapshot, min(ts) AS at FROM gw_telemetry "
                    f"WHERE {window} AND kind = 'stack' GROUP BY snapshot HAVING at >= {_f(before)} "
                    "ORDER BY at LIMIT 1")
        if first:
            stacks = stack_signatures(run(
                f"SELECT payload FROM gw_telemetry WHERE {window} AND kind = 'stack' "
                f"AND visitParamExtractString(payload, 'snapshot') = {_s(first[0]['snapshot'])}"))
    return step_window(rows[:STEP_ROWS_MAX], start, end, named=named, where=where, culprits=culprits,
                       truncated=len(rows) > STEP_ROWS_MAX, others=events([*topo, *quiet, *said, *hw]), stacks=stacks)


def gather_incident(run: Run, incident: str, budgets: Mapping[str, float], *, window_s: float = 60.0
                    ) -> IncidentReport:
    """One incident: its latest row, its actions, the findings they cite and the step times from `window_s`
    before its onset to `window_s` after its detection. NotInStore for an id the store does not hold."""
    rows = run(f"SELECT {INCIDENT_COLUMNS} FROM gw_incidents FINAL WHERE id = {_s(incident)}")
    if not rows:
        _check_not_empty(run)
        raise NotInStore(f"no incident {incident!r} in the store: `gangwatch report` without --incident lists "
                         "the latest ones")
    row = rows[0]
    acts = run("SELECT id, ts, type, nodes, reason, path, shadow FROM gw_actions FINAL "
               f"WHERE incident = {_s(incident)} ORDER BY ts, id")
    cited = run("SELECT id, ts, type, detector, rank, node, score, evidence FROM gw_findings FINAL "
                f"WHERE job = {_s(row['job'])} AND id IN (SELECT arrayJoin(evidence) FROM gw_actions FINAL "
                f"WHERE incident = {_s(incident)}) ORDER BY ts, id")
    steps = None
    onset = _float(row.get("onset_ts"))
    if onset is not None:
        detected = _float(row.get("detected_ts")) or onset
        culprits = set(row.get("culprit_nodes") or ())
        named = {int(f["rank"]) for f in cited
                 if f.get("rank") is not None and (not culprits or f.get("node") in culprits)}
        steps = gather_steps(run, row["job"], onset - window_s, detected + window_s, named=named, culprits=culprits,
                             before=onset, cls=row["class"])
    return incident_report(row, acts, cited, budgets, steps)


def gather_job(run: Run, job: str) -> JobReport:
    """One job: its life (gw_jobs), its incidents and its ETTR; NotInStore for a job the store does not know."""
    life = run(f"SELECT ts, state, previous, cause FROM gw_jobs FINAL WHERE job = {_s(job)} ORDER BY ts, id")
    incidents = run(f"SELECT {INCIDENT_COLUMNS} FROM gw_incidents FINAL WHERE job = {_s(job)} "
                    "ORDER BY ifNull(onset_ts, ts), id")
    if not life and not incidents:
        _check_not_empty(run)
        raise NotInStore(f"no job {job!r} in the store (no incident, no life): `gangwatch sql ettr` lists the jobs "
                         "it knows")
    ettr = run(render(catalog()["ettr"], {"job": job})) if life else []
    return job_report(job, life, incidents, ettr)


def gather_period(run: Run, since: float, until: float | None) -> PeriodReport:
    """The incidents with an onset in [since, until) (an incident without one: its record time), the counts per
    class of `gangwatch sql interruptions_by_class`, and the ETTR of every job alive in the period."""
    end = f" AND ifNull(onset_ts, ts) < {_f(until)}" if until is not None else ""
    incidents = run(f"SELECT {INCIDENT_COLUMNS} FROM gw_incidents FINAL WHERE ifNull(onset_ts, ts) >= {_f(since)}"
                    f"{end} ORDER BY ifNull(onset_ts, ts), id")
    params = {"since": repr(since), **({"until": repr(until)} if until is not None else {})}
    classes = run(render(catalog()["interruptions_by_class"], params)) if incidents else []
    spans = run("SELECT job, min(ts) AS first_ts, max(ts) AS last_ts, argMax(state, ts) AS last_state "
                "FROM gw_jobs FINAL" + (f" WHERE ts < {_f(until)}" if until is not None else "") +
                " GROUP BY job ORDER BY job")
    if not incidents and not spans:
        _check_not_empty(run)
    at_last = run(render(catalog()["ettr"], {})) if spans else []
    at_end = run(render(catalog()["ettr"], {"until": repr(until)})) if spans and until is not None else []
    return period_report(since, until, incidents, classes, period_ettr(spans, at_end, at_last, since, until))
