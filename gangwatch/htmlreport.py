"""The post-mortem as one self-contained HTML file: a `gangwatch.postmortem` model, its plots as inline SVG.

Nothing is fetched when the page is viewed: no script, no stylesheet, font or image from elsewhere. Each plot
is matplotlib's SVG (Agg backend; text left as text in the browser's own sans-serif), inlined in a
`<figure class="plot" data-plot=NAME>`; the heat map's raster sits inside its SVG as a `data:` URI. A plot
without data is a `<figure class="plot empty">` saying why. matplotlib is imported only here, on first use
(`pip install 'gangwatch[report]'`), so no other command pays for it.

Plots: an incident's step time per rank around its onset (onset and detection marked), the per-rank heat map
of step time (rank x step) and its stages against their budgets; a job's life with its incidents and each
incident's time to recover; a period's interruptions over time, by class, and ETTR per job.
"""

from __future__ import annotations

import datetime as dt
import html
import io
import math
import statistics
from collections.abc import Iterable
from typing import Any

from gangwatch.postmortem import (
    MILESTONES,
    Ettr,
    IncidentLine,
    IncidentReport,
    JobReport,
    Move,
    PeriodReport,
    Point,
    Stage,
    StepWindow,
)
from gangwatch.reporttext import iso, seconds

BAND_RANKS = 64  # above this many ranks, the step plot draws the spread of the others, not a line each
HIGHLIGHT_MAX = 16  # ranks drawn as their own line at most (named ranks first)
CLASS_COLORS = {"fail_stop": "#d62728", "hang": "#9467bd", "stall": "#8c564b", "fail_slow": "#ff7f0e",
                "sdc": "#e377c2", "unknown": "#7f7f7f", "planned": "#bcbd22"}
STATE_COLORS = {"starting": "#9ecae1", "running": "#31a354", "paused": "#fdae6b", "stopping": "#fd8d3c",
                "stopped": "#bdbdbd", "finished": "#636363", "failed": "#de2d26", "restarting": "#756bb1"}
CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0; } td, th { padding: 2px 10px; text-align: left;
  vertical-align: top; border-bottom: 1px solid #eee; } th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.over { color: #b00; font-weight: bold; } .open { color: #b00; } .muted { color: #777; }
figure.plot { margin: 1em 0; } figure.plot svg { max-width: 100%; height: auto; }
figure.empty { padding: 1em; background: #f8f8f8; color: #777; }
code, .mono { font-family: monospace; } td:first-child { white-space: nowrap; }
"""


# --- matplotlib, imported on first use ------------------------------------------


def _figure(width: float, height: float) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Any, name: str) -> str:
    """The figure as an inline <svg> element (no XML prolog; ids salted by `name`, so two plots never share one)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _plot(name: str, svg: str, caption: str) -> str:
    return (f'<figure class="plot" data-plot="{name}" id="plot-{name}">{svg}'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _empty(name: str, why: str) -> str:
    return f'<figure class="plot empty" data-plot="{name}" id="plot-{name}"><p>{html.escape(why)}</p></figure>'


def _mark(ax: Any, x: float | None, label: str, color: str) -> None:
    if x is not None:
        ax.axvline(x, color=color, linestyle="--", linewidth=1.2, label=label)


# --- plots ------------------------------------------------------------------


def _highlighted(w: StepWindow) -> list[int]:
    """The ranks drawn as their own line, at most HIGHLIGHT_MAX: the named ones, then the culprit nodes' others;
    drawn in this order reversed, so the named ones end on top."""
    named = sorted(r for r in w.named_ranks if r in w.series)
    others = sorted(r for r in w.culprit_ranks if r in w.series and r not in w.named_ranks)
    return (named + others)[:HIGHLIGHT_MAX]


def steps_plot(w: StepWindow, onset: float, detected: float | None) -> str:
    """Step time per rank against seconds from the onset: every rank a grey line (their range and median, for a
    large job), the ranks the findings name in red, the other ranks of the culprit nodes in orange. A log scale
    where a spike would flatten the rest (the longest step over 4x the median)."""
    fig = _figure(11, 4.2)
    ax = fig.add_subplot()
    shown = _highlighted(w)
    rest = [r for r in w.ranks if r not in shown]
    if len(rest) > BAND_RANKS:
        by_step: dict[int, list[Point]] = {}
        for r in rest:
            for p in w.series[r]:
                by_step.setdefault(p.step, []).append(p)
        xs = [statistics.median(p.ts for p in by_step[s]) - onset for s in sorted(by_step)]
        vals = [sorted(p.step_s for p in by_step[s]) for s in sorted(by_step)]
        ax.fill_between(xs, [v[0] for v in vals], [v[-1] for v in vals], color="#cccccc", label="other ranks: range")
        ax.plot(xs, [statistics.median(v) for v in vals], color="#888888", linewidth=1, label="other ranks: median")
    else:
        for i, r in enumerate(rest):
            pts = w.series[r]
            ax.plot([p.ts - onset for p in pts], [p.step_s for p in pts], color="#9a9a9a", linewidth=0.8,
                    alpha=0.7, label="other ranks" if i == 0 else None)
    labelled = False
    for r in reversed(shown):
        pts = w.series[r]
        named = r in w.named_ranks
        if named:
            label = f"rank {r} (the findings name it)"
        else:
            label, labelled = (None if labelled else "other ranks of the culprit nodes"), True
        ax.plot([p.ts - onset for p in pts], [p.step_s for p in pts], color="#d62728" if named else "#ff7f0e",
                linewidth=2 if named else 1.2, label=label)
    values = [p.step_s for points in w.series.values() for p in points]
    if values and max(values) > 4 * statistics.median(values) > 0:
        from matplotlib.ticker import FormatStrFormatter

        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    _mark(ax, 0.0, "onset", "#000000")
    _mark(ax, None if detected is None else detected - onset, "detected", "#1f77b4")
    ax.set_xlabel("seconds from onset")
    ax.set_ylabel("step time (s)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, ncol=2)
    return _svg(fig, "steps")


def heatmap_plot(w: StepWindow, onset: float, detected: float | None, what: str = "step_s") -> str:
    """`what` (step_s, or compute_s) by rank (rows) and step (columns), missing cells blank, colours spread over
    the 2nd..98th percentile (a one-step spike does not wash the rest out); the steps of the onset and of the
    detection marked."""
    import numpy as np

    fig = _figure(11, max(3.0, min(9.0, 1.5 + 0.12 * len(w.ranks))))
    ax = fig.add_subplot()
    steps, ranks = w.steps, w.ranks
    grid = np.array([[math.nan if v is None else v for v in row] for row in w.matrix(what)], dtype=float)
    low, high = (float(x) for x in np.nanpercentile(grid, [2, 98]))
    image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest", cmap="viridis",
                      vmin=low, vmax=max(high, low + 1e-9), extent=(steps[0] - 0.5, steps[-1] + 0.5, len(ranks) - 0.5,
                                                                    -0.5))
    fig.colorbar(image, ax=ax, label=f"{'compute' if what == 'compute_s' else 'step'} time (s)", extend="both")
    if len(ranks) <= 32:
        ax.set_yticks(range(len(ranks)), [str(r) for r in ranks], fontsize=7)
    for ts, label, color in ((onset, "onset", "#ffffff"), (detected, "detected", "#ff7f0e")):
        if ts is None:
            continue
        step = w.step_at(ts)
        if step is None:  # after the last step any rank finished (a fail-stop): at the right edge
            ax.axvline(steps[-1] + 0.5, color=color, linestyle="--", linewidth=1.2,
                       label=f"{label} (after step {steps[-1]})")
        else:
            ax.axvline(step, color=color, linestyle="--", linewidth=1.2, label=f"{label} (step {step})")
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    ax.legend(loc="upper left", fontsize=8)
    return _svg(fig, "heatmap" if what == "step_s" else "heatmap-compute")


def stages_plot(stages: Iterable[Stage]) -> str:
    """Each stage's seconds as a bar (red when over its budget) with its budget as an outlined bar behind it."""
    items = list(stages)
    fig = _figure(11, 0.6 + 0.45 * len(items))
    ax = fig.add_subplot()
    ys = list(range(len(items)))[::-1]
    budgets = [s.budget if s.budget is not None else 0.0 for s in items]
    ax.barh(ys, budgets, height=0.7, color="none", edgecolor="#555555", linestyle="--", label="budget")
    ax.barh(ys, [s.seconds for s in items], height=0.45, color=["#d62728" if s.over else "#2ca02c" for s in items],
            label="observed")
    for y, s in zip(ys, items, strict=True):
        note = seconds(s.seconds) + (f" of {seconds(s.budget)}" if s.budget is not None else " (no budget)")
        ax.text(max(s.seconds, s.budget or 0.0), y, "  " + note + ("  OVER" if s.over else ""), va="center",
                fontsize=8, color="#b00000" if s.over else "#222222")
    ax.set_yticks(ys, [s.name for s in items])
    ax.set_xlabel("seconds")
    ax.set_xlim(0, 1.35 * max([s.seconds for s in items] + budgets + [1.0]))
    ax.legend(loc="lower right", fontsize=8)
    return _svg(fig, "stages")


def _bin_width(span: float) -> tuple[float, str]:
    for width, name in ((3600.0, "hour"), (86400.0, "day"), (7 * 86400.0, "week")):
        if span / width <= 72:
            return width, name
    return 30 * 86400.0, "30 days"


def interruptions_plot(incidents: Iterable[IncidentLine], since: float, until: float | None) -> str:
    """Incidents by onset in bins of an hour, a day or a week (whichever gives at most 72), stacked by class."""
    import matplotlib.dates as mdates

    items = [i for i in incidents if i.onset_ts is not None]
    end = until if until is not None else max([i.onset_ts for i in items] + [since]) + 1.0
    width, unit = _bin_width(max(end - since, 1.0))
    n = max(1, math.ceil((end - since) / width))
    starts = [since + k * width for k in range(n)]
    counts: dict[str, list[int]] = {}
    for i in items:
        k = min(n - 1, int((i.onset_ts - since) // width))
        counts.setdefault(i.cls, [0] * n)[k] += 1
    fig = _figure(11, 3.6)
    ax = fig.add_subplot()
    xs = mdates.date2num([dt.datetime.fromtimestamp(t, dt.UTC) for t in starts])
    bottom = [0] * n
    for cls in sorted(counts):
        ax.bar(xs, counts[cls], width=width / 86400.0, bottom=bottom, align="edge",
               color=CLASS_COLORS.get(cls, "#17becf"), label=cls, edgecolor="white", linewidth=0.5)
        bottom = [a + b for a, b in zip(bottom, counts[cls], strict=True)]
    ax.xaxis_date()
    ax.set_ylabel(f"incidents per {unit}")
    ax.set_xlabel("onset (UTC)")
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.grid(axis="y", alpha=0.3)
    if counts:
        ax.legend(fontsize=8, ncol=4)
    return _svg(fig, "interruptions")


def ettr_plot(rows: Iterable[Ettr]) -> str:
    """ETTR per job as horizontal bars, lowest first, each with its value."""
    items = sorted((e for e in rows if e.ettr is not None), key=lambda e: (e.ettr, e.job))
    fig = _figure(11, 0.8 + 0.32 * max(1, len(items)))
    ax = fig.add_subplot()
    ys = list(range(len(items)))
    ax.barh(ys, [e.ettr for e in items], color=["#d62728" if e.ettr < 0.9 else "#2ca02c" for e in items])
    for y, e in zip(ys, items, strict=True):
        ax.text(e.ettr, y, f" {e.ettr:.3f}", va="center", fontsize=8)
    ax.set_yticks(ys, [e.job for e in items], fontsize=8)
    ax.set_xlim(0, 1.12)
    ax.axvline(1.0, color="#555555", linewidth=0.8)
    ax.set_xlabel("ETTR (productive training time / wall time)")
    return _svg(fig, "ettr")


def life_plot(moves: Iterable[Move], incidents: Iterable[IncidentLine]) -> str:
    """A job's life as a band of its states (each move lasts until the next) over its incidents, each from onset
    to recovery (open ones to the last move)."""
    seq = list(moves)
    items = [i for i in incidents if i.onset_ts is not None]
    t0 = min([m.ts for m in seq] + [i.onset_ts for i in items])
    t1 = max([m.ts for m in seq] + [i.recovered_ts or i.onset_ts for i in items])
    t1 = max(t1, t0 + 1.0)
    fig = _figure(11, 2.6)
    ax = fig.add_subplot()
    seen: set[str] = set()
    for a, b in zip(seq, [*seq[1:], None], strict=True):
        end = b.ts if b is not None else t1
        ax.broken_barh([(a.ts - t0, max(end - a.ts, (t1 - t0) / 400))], (1.1, 0.8),
                       color=STATE_COLORS.get(a.state, "#cccccc"), label=None if a.state in seen else a.state)
        seen.add(a.state)
    for i in items:
        end = i.recovered_ts if i.recovered_ts is not None else t1
        ax.broken_barh([(i.onset_ts - t0, max(end - i.onset_ts, (t1 - t0) / 400))], (0.1, 0.8),
                       color=CLASS_COLORS.get(i.cls, "#17becf"), label=None if i.cls in seen else i.cls)
        seen.add(i.cls)
    ax.set_yticks([0.5, 1.5], ["incidents", "life"])
    ax.set_xlabel(f"seconds from {iso(t0, ms=False)}")
    ax.set_xlim(0, (t1 - t0) * 1.02)
    ax.legend(fontsize=8, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.35))
    return _svg(fig, "life")


def recover_plot(incidents: Iterable[IncidentLine], total_budget: float | None) -> str:
    """Each recovered incident's seconds from onset to recovery, against the `total` budget."""
    items = [i for i in incidents if i.recover_s is not None]
    fig = _figure(11, 0.8 + 0.32 * max(1, len(items)))
    ax = fig.add_subplot()
    ys = list(range(len(items)))[::-1]
    over = [total_budget is not None and i.recover_s > total_budget for i in items]
    ax.barh(ys, [i.recover_s for i in items], color=["#d62728" if o else CLASS_COLORS.get(i.cls, "#17becf")
                                                    for i, o in zip(items, over, strict=True)])
    if total_budget is not None:
        ax.axvline(total_budget, color="#555555", linestyle="--", label=f"total budget {seconds(total_budget)}")
        ax.legend(fontsize=8)
    ax.set_yticks(ys, [f"{i.id} ({i.cls})" for i in items], fontsize=8)
    ax.set_xlabel("seconds from onset to recovery")
    return _svg(fig, "recover")


# --- pages ------------------------------------------------------------------


def _e(v: object) -> str:
    return html.escape("" if v is None else str(v))


def _table(head: Iterable[str], rows: Iterable[Iterable[object]], classes: Iterable[str] = ()) -> str:
    cls = list(classes)
    out = ["<table><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>"]
    for k, row in enumerate(rows):
        attr = f' class="{cls[k]}"' if k < len(cls) and cls[k] else ""
        out.append(f"<tr{attr}>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>")
    return "".join(out) + "</table>"


def _page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _incident_rows(items: Iterable[IncidentLine]) -> str:
    rows = [(iso(i.onset_ts, ms=False), i.id, i.job, i.cls + (" (planned)" if i.planned else ""),
             ",".join(i.culprit_nodes) or "-", i.path or "-",
             seconds(i.recover_s) if i.recovered_ts is not None else "open", ",".join(i.over_budget) or "-")
            for i in items]
    return _table(("onset", "id", "job", "class", "culprit", "path", "recovered in", "over budget"), rows)


def incident_html(r: IncidentReport) -> str:
    """The post-mortem of one incident as a self-contained page."""
    onset, detected = r.times.get("onset"), r.times.get("detected")
    state = "recovered" if r.times.get("recovered") is not None else '<span class="open">open (not recovered)</span>'
    body = [f"<h1>Incident <code>{_e(r.id)}</code></h1>",
            f"<p>job <code>{_e(r.job)}</code> &middot; class <b>{_e(r.cls)}</b>{' (planned)' if r.planned else ''}"
            f" &middot; culprit nodes <b>{_e(', '.join(r.culprit_nodes) or '-')}</b> &middot; {state}</p>",
            "<h2>Timeline (UTC)</h2>",
            _table(("stage", "time", "from onset"),
                   [(m, iso(r.times.get(m)), "" if r.times.get(m) is None or onset is None or m == "onset"
                     else "+" + seconds(r.times[m] - onset)) for m in MILESTONES]),
            "<h2>Root cause</h2>"]
    d = r.decision
    body.append(f"<p>class <b>{_e(r.cls)}</b>; culprit nodes <b>{_e(', '.join(r.culprit_nodes) or '-')}</b></p>")
    body.append("<p>decision: none recorded</p>" if d is None else
                f"<p>decision: <b>{_e(d.type)}</b> {_e(', '.join(d.nodes) or '-')}"
                f"{' (path ' + _e(d.path) + ')' if d.path else ''}{' [shadow]' if d.shadow else ''}</p>"
                f"<blockquote>{_e(d.reason)}</blockquote>")
    body.append(f"<h2>Evidence chain ({len(r.evidence)} findings the actions cite)</h2>")
    body.append(_table(("time", "type", "detector", "rank", "node", "score", "evidence"),
                       [(iso(e.ts), e.type, e.detector, e.rank, e.node, e.score, e.gist) for e in r.evidence])
                if r.evidence else "<p class=\"muted\">no action of this incident cites a stored finding</p>")
    body.append("<h2>Recovery path</h2>")
    body.append(f"<p>path <b>{_e(r.path or '-')}</b>; evicted {_e(', '.join(r.evicted_nodes) or '-')}</p>")
    body.append(_table(("time", "action", "nodes", "path", "reason"),
                       [(iso(a.ts), a.type + (" [shadow]" if a.shadow else ""), ", ".join(a.nodes) or "-",
                         a.path or "-", a.reason) for a in r.actions]))
    body.append("<h2>Stages against their budgets</h2>")
    body.append(_table(("stage", "seconds", "budget", ""),
                       [(s.name, f"{s.seconds:.3f}", "-" if s.budget is None else f"{s.budget:g}",
                         "OVER BUDGET" if s.over else "") for s in r.stages],
                       ["over" if s.over else "" for s in r.stages]))
    body.append(_plot("stages", stages_plot(r.stages), "stage seconds (bars) against their budgets (outlines)")
                if r.stages else _empty("stages", "no stage completed yet"))
    body.append("<h2>Step time around the onset</h2>")
    w = r.steps
    if w is None or onset is None:
        why = "no step telemetry stored around the onset (replay with --telemetry to keep it)"
        body += [_empty("steps", why), _empty("heatmap", why)]
    else:
        span = f"{iso(w.start)} .. {iso(w.end)}" + (" (cut: too many records)" if w.truncated else "")
        body.append(_plot("steps", steps_plot(w, onset, detected),
                          f"step time per rank, {len(w.ranks)} ranks, {span}; dashed: onset and detection"))
        body.append(_plot("heatmap", heatmap_plot(w, onset, detected),
                          "step time by rank and step; dashed: the steps of the onset and of the detection"))
        if w.has_compute:
            body.append(_plot("compute", heatmap_plot(w, onset, detected, "compute_s"),
                              "compute time by rank and step (a synchronous job's step time is the slowest "
                              "rank's: the compute time shows which rank it is)"))
    return _page(f"gangwatch incident {r.id}", body)


def job_html(r: JobReport, total_budget: float | None = None) -> str:
    """The report of one job as a self-contained page: its ETTR, its life, its incidents."""
    e = r.ettr
    body = [f"<h1>Job <code>{_e(r.job)}</code></h1>",
            "<p>ETTR <b>" + ("-" if e is None or e.ettr is None else f"{e.ettr:.3f}") + "</b>"
            + ("" if e is None else f" (running {seconds(e.running_s)}, lost to incidents {seconds(e.lost_s)}, "
               f"wall {seconds(e.wall_s)}; gangwatch/sql/ettr.sql)") + "</p>",
            "<h2>Life</h2>"]
    body.append(_plot("life", life_plot(r.moves, r.incidents), "the job's states over time, and its incidents")
                if r.moves or any(i.onset_ts is not None for i in r.incidents) else _empty("life", "no life stored"))
    body.append(_table(("time", "from", "to", "cause"), [(iso(m.ts), m.previous or "-", m.state, m.cause)
                                                         for m in r.moves]))
    body.append("<p>" + _e(", ".join(f"{k} {seconds(v)}" for k, v in sorted(r.state_s.items()))) + "</p>")
    body.append(f"<h2>Incidents ({len(r.incidents)})</h2>")
    body.append(_incident_rows(r.incidents))
    body.append(_plot("recover", recover_plot(r.incidents, total_budget), "time to recover per incident")
                if any(i.recover_s is not None for i in r.incidents) else _empty("recover", "no incident recovered"))
    return _page(f"gangwatch job {r.job}", body)


def period_html(r: PeriodReport) -> str:
    """The report of a period as a self-contained page: interruptions over time and by class, ETTR per job."""
    until = iso(r.until, ms=False) if r.until is not None else "(no end)"
    body = [f"<h1>Period {_e(iso(r.since, ms=False))} .. {_e(until)}</h1>",
            f"<h2>Interruptions ({len(r.incidents)})</h2>",
            _plot("interruptions", interruptions_plot(r.incidents, r.since, r.until), "incidents by onset and class")
            if r.incidents else _empty("interruptions", "no incident in the period"),
            _table(("class", "platform (unplanned)", "planned", "share of the platform's", "recovered"),
                   [(c["class"], c["platform"], c["planned_stops"], c["platform_share"], c["recovered"])
                    for c in r.classes]),
            _incident_rows(r.incidents),
            "<h2>ETTR per job</h2>",
            _plot("ettr", ettr_plot(r.ettr), "ETTR per job alive in the period, from its first move to the period's "
                  "end (or its own)") if any(e.ettr is not None for e in r.ettr) else _empty("ettr", "no job life"),
            _table(("job", "ETTR", "running", "lost to incidents", "wall"),
                   [(e.job, "-" if e.ettr is None else f"{e.ettr:.3f}", seconds(e.running_s), seconds(e.lost_s),
                     seconds(e.wall_s)) for e in r.ettr])]
    return _page("gangwatch period report", body)
