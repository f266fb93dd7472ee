"""What `gangwatch report` prints on a terminal: an incident, a job, a period, the latest incidents.

Times are ISO 8601 UTC, durations in seconds with the budget beside them; reasons are shown whole, wrapped.
The report's model and how it is gathered from the store: `gangwatch.report.postmortem`; its HTML:
`gangwatch.report.htmlpage`.
"""

from __future__ import annotations

import datetime as dt
import textwrap
from collections.abc import Iterable

from gangwatch.report.postmortem import (
    Ettr,
    IncidentLine,
    IncidentReport,
    JobReport,
    PeriodReport,
    Stage,
    first_line,
)

WIDTH = 100  # columns reasons are wrapped to


def counted(n: int, noun: str, plural: str = "") -> str:
    """`n` and its noun, singular for one: "1 finding", "3 findings", "0 findings"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def iso(ts: float | None, ms: bool = True) -> str:
    """Event time as ISO 8601 UTC (to the millisecond unless `ms` is False); '-' for None."""
    if ts is None:
        return "-"
    try:
        t = dt.datetime.fromtimestamp(ts, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return repr(ts)
    return t.isoformat(timespec="milliseconds" if ms else "seconds").replace("+00:00", "Z")


def seconds(s: float | None) -> str:
    """A duration for a person: '-' for None, else seconds with one decimal below 10 min, minutes or hours above."""
    if s is None:
        return "-"
    if s < 600:
        return f"{s:.1f} s"
    if s < 36000:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _wrap(text: str, indent: int) -> str:
    pad = " " * indent
    return textwrap.fill(text, width=WIDTH, initial_indent=pad, subsequent_indent=pad) if text else ""


def _nodes(nodes: Iterable[str]) -> str:
    return ",".join(nodes) or "-"


def _act(a) -> str:
    """An action and its nodes ("replace n001"); one without nodes (a rollback, a job-wide sweep) by its name alone."""
    return f"{a.type} {_nodes(a.nodes)}" if a.nodes else a.type


def stage_lines(stages_: Iterable[Stage]) -> list[str]:
    out = []
    for s in stages_:
        if s.budget is None:
            budget, mark = "no budget", "OVER BUDGET" if s.over else ""
        else:
            budget, mark = seconds(s.budget), f"OVER BUDGET by {seconds(s.seconds - s.budget)}" if s.over else "ok"
        out.append(f"  {s.name:<13}{seconds(s.seconds):>10}  of {budget:<10}  {mark}".rstrip())
    return out


def incident_text(r: IncidentReport) -> str:
    """The terminal post-mortem of one incident: timeline, root cause, evidence chain, recovery path, stages."""
    state = {"open": "OPEN (not recovered)"}.get(r.state, r.state)
    lines = [f"incident {r.id}  job {r.job}  class {r.cls}{' (planned)' if r.planned else ''}  {state}", "",
             "timeline (UTC)"]
    onset = r.times.get("onset")
    for m, ts in r.milestones:
        since = f"  +{seconds(ts - onset)}" if ts is not None and onset is not None and m != "onset" else ""
        note = "  (kept running degraded: nothing recovered)" if m == "closed" else ""
        lines.append(f"  {m:<11}{iso(ts):<26}{since}{note}".rstrip())
    lines += ["", "root cause", f"  class {r.cls}; culprit nodes {_nodes(r.culprit_nodes)}"]
    decided = r.decided_by
    if not decided:
        lines.append("  decision: none recorded")
    else:
        d = decided[0]
        lines.append("  decision: " + " + ".join(_act(a) for a in decided)
                     + (f" (path {d.path})" if d.path else "") + (" [shadow: recorded, not sent]" if d.shadow else ""))
        if r.ladder:
            lines.append("  ladder before it: " + ", then ".join(f"{_act(a)} at {iso(a.ts)}" for a in r.ladder))
        if d.reason:
            lines.append(_wrap(d.reason, 4))
    lines += ["", f"evidence chain ({counted(len(r.evidence), 'finding')} the actions cite, in event-time order)"]
    if not r.evidence:
        lines.append("  (none: no action of this incident cites a stored finding)")
    for e in r.evidence:
        where = " ".join(x for x in (f"rank {e.rank}" if e.rank is not None else "", e.node) if x) or "job-wide"
        score = f"  score {e.score:.3g}" if e.score is not None else ""
        lines.append(f"  {iso(e.at)}  {e.type:<14} {e.detector:<18} {where}{score}")
        if e.gist:
            lines.append(_wrap(e.gist, 6))
    lines += ["", "recovery path",
              f"  path {r.path or '-'}; evicted {_nodes(r.evicted_nodes)}"]
    for a in r.actions:
        lines.append(f"  {iso(a.ts)}  {a.type} {_nodes(a.nodes)}" + (f" path {a.path}" if a.path else "")
                     + (" [shadow]" if a.shadow else ""))
    rec = r.times.get("recovered")
    if r.state == "running degraded":
        lines.append("  running degraded: kept running and watched, nothing repaired"
                     + (f" (its incident closed {iso(rec)})" if rec is not None else ""))
    else:
        lines.append(f"  recovered {iso(rec)}, {seconds(rec - onset)} after onset" if rec is not None
                     and onset is not None else "  not recovered (as far as the store knows)")
    lines += ["", "stages against budget"] + (stage_lines(r.stages) or ["  (no stage completed yet)"])
    over = r.over_budget
    lines.append(f"  over budget: {', '.join(over)}" if over else "  every stage within its budget")
    if r.steps is None:
        lines += ["", "step times: none stored around the onset (replay with --telemetry to keep them)"]
    else:
        w = r.steps
        lines += ["", f"step times: {counted(len(w.ranks), 'rank')}, steps {w.steps[0]}..{w.steps[-1]} in "
                      f"{iso(w.start)} .. {iso(w.end)}" + (" (cut: too many records)" if w.truncated else "")]
    return "\n".join(lines)


def incident_table(items: Iterable[IncidentLine]) -> list[str]:
    out = []
    for i in items:
        rec = {"recovered": f"recovered {seconds(i.recover_s)}", "open": "open (not recovered)"}.get(i.state, i.state)
        over = f"  over: {','.join(i.over_budget)}" if i.over_budget else ""
        out.append(f"  {iso(i.onset_ts, ms=False):<21} {i.id:<20} {i.job:<12} {i.cls:<10}"
                   f"{' planned' if i.planned else ''} culprit {_nodes(i.culprit_nodes):<8} path {i.path or '-':<8} "
                   f"{rec}{over}")
    return out


def ettr_lines(rows: Iterable[Ettr]) -> list[str]:
    return [f"  {e.job:<16} ETTR {'-' if e.ettr is None else f'{e.ettr:.3f}'}  (running {seconds(e.running_s)}, "
            f"lost to incidents {seconds(e.lost_s)}, wall {seconds(e.wall_s)})" for e in rows]


def job_text(r: JobReport) -> str:
    """The terminal report of one job: its life, state by state, its incidents and its ETTR."""
    lines = [f"job {r.job}", "", "ETTR (gangwatch/report/sql/ettr.sql)"]
    lines += ettr_lines([r.ettr]) if r.ettr else ["  - (no life stored for this job)"]
    counts = ", ".join(f"{k} {r.entered.get(k, 0)}" for k in ("starting", "paused", "stopped", "finished", "failed",
                                                            "restarting"))
    lines += ["", f"life ({counted(len(r.moves), 'move')}; entered: {counts})"]
    for m in r.moves:
        lines.append(f"  {iso(m.ts)}  {m.previous or '-':>10} -> {m.state:<10} {first_line(m.cause)[:60]}")
    if r.state_s:
        lines.append("  time in state: " + ", ".join(f"{k} {seconds(v)}" for k, v in sorted(r.state_s.items())))
    lines += ["", f"incidents ({len(r.incidents)})"] + (incident_table(r.incidents) or ["  (none)"])
    return "\n".join(lines)


def period_text(r: PeriodReport) -> str:
    """The terminal report of a period: its incidents, counts per class, ETTR per job alive in it."""
    lines = [f"period {iso(r.since, ms=False)} .. {iso(r.until, ms=False) if r.until is not None else '(no end)'}",
             "", f"incidents ({len(r.incidents)}, by onset)"] + (incident_table(r.incidents) or ["  (none)"])
    lines += ["", "per class (the platform's = unplanned; gangwatch sql interruptions_by_class)"]
    for c in r.classes:
        lines.append(f"  {c['class']:<10} platform {c['platform']:>4}  planned {c['planned_stops']:>4}  "
                     f"recovered {c['recovered']:>4}  share {c['platform_share']}")
    if not r.classes:
        lines.append("  (none)")
    lines += ["", "ETTR per job alive in the period (first move to the period's end, or to the job's)"]
    lines += ettr_lines(r.ettr) or ["  (no job life stored)"]
    return "\n".join(lines)


def latest_text(items: tuple[IncidentLine, ...]) -> str:
    if not items:
        return "no incidents in the store"
    latest = "the latest incident" if len(items) == 1 else f"the {len(items)} latest incidents"
    return "\n".join([f"{latest} (by onset); `gangwatch report --incident ID` for one:",
                      *incident_table(items)])
