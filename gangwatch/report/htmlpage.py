"""The post-mortem as one self-contained HTML file: a `gangwatch.report.postmortem` model, its plots as inline SVG.

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

from gangwatch.fleet.kb import ActionTaken
from gangwatch.report import figures as fg
from gangwatch.report.postmortem import (
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
from gangwatch.report.text import counted, iso, seconds

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


MASK_STYLE = {fg.WARMUP: ("#c6dbef", None), fg.JOB_PAUSE: ("#d9d9d9", "//")}  # else a known pause: ("#e5e5e5", "..")


def _shade(ax: Any, spans: Iterable[tuple[float, float, str]], seen: set[str] | None = None) -> None:
    """Shade each (x0, x1, why), labelled once per reason (in `seen`, shared across the axes of one figure)."""
    seen = set() if seen is None else seen
    for x0, x1, why in spans:
        color, hatch = MASK_STYLE.get(why, ("#e5e5e5", ".."))
        ax.axvspan(x0, x1, facecolor=color, edgecolor="#bbbbbb", hatch=hatch, linewidth=0, zorder=0,
                   label=None if why in seen else f"{why}: out of scale")
        seen.add(why)


def _step_spans(masked: dict[int, str], steps: list[int]) -> list[tuple[float, float, str]]:
    """Masked steps as (x0, x1, why) on a step axis, neighbours of one reason merged."""
    out: list[tuple[float, float, str]] = []
    for s in steps:
        why = masked.get(s)
        if why is None:
            continue
        if out and out[-1][2] == why and out[-1][1] >= s - 0.5 - 1e-9:
            out[-1] = (out[-1][0], s + 0.5, why)
        else:
            out.append((s - 0.5, s + 0.5, why))
    return out


def _time_spans(w: StepWindow, masked: dict[int, str], origin: float) -> list[tuple[float, float, str]]:
    return [(sp.t0 - origin, sp.t1 - origin, sp.reason) for sp in fg.mask_spans(w, masked)]


def _tag(ax: Any, x: float, y: float, text: str, color: str = "#b00000", **kw: Any) -> None:
    """A label in the plot with an arrow to (x, y)."""
    ax.annotate(text, xy=(x, y), xytext=kw.pop("xytext", (18, 14)), textcoords="offset points", fontsize=9,
                color=color, fontweight="bold", arrowprops={"arrowstyle": "->", "color": color, "lw": 1.2},
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": color, "alpha": 0.9}, **kw)


# --- plots ------------------------------------------------------------------


def _highlighted(w: StepWindow) -> list[int]:
    """The ranks drawn as their own line, at most HIGHLIGHT_MAX: the named ones, then the culprit nodes' others;
    drawn in this order reversed, so the named ones end on top."""
    named = sorted(r for r in w.named_ranks if r in w.series)
    others = sorted(r for r in w.culprit_ranks if r in w.series and r not in w.named_ranks)
    return (named + others)[:HIGHLIGHT_MAX]


def steps_plot(w: StepWindow, onset: float, detected: float | None) -> str:
    """Step time per rank against seconds from the onset: every rank a grey line (their range and median, for a
    large job), the ranks the findings name in red, the other ranks of the culprit nodes in orange; masked steps
    (warm-up, pauses) shaded, and the y range set by the others. A log scale where a spike would flatten the
    rest (the longest unmasked step over 4x the median)."""
    masked = fg.masked_steps(w)
    fig = _figure(11, 4.2)
    ax = fig.add_subplot()
    _shade(ax, _time_spans(w, masked, onset))
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
    values = [p.step_s for points in w.series.values() for p in points if p.step not in masked]
    if values:
        low, high = fg.scale(values)
        pad = 0.1 * (high - low) + 1e-3
        ax.set_ylim(max(0.0, low - pad), high + pad)
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
    """`what` (step_s, or compute_s) by rank (rows) and step (columns), missing cells blank, the colour scale
    set by the unmasked steps only (warm-up and pauses shaded over, out of it); the culprit ranks' rows named,
    the steps of the onset and of the detection marked."""
    import numpy as np

    masked = fg.masked_steps(w)
    fig = _figure(11, max(3.0, min(9.0, 1.5 + 0.12 * len(w.ranks))))
    ax = fig.add_subplot()
    steps, ranks = w.steps, w.ranks
    grid = np.array([[math.nan if v is None else v for v in row] for row in w.matrix(what)], dtype=float)
    low, high = fg.scale(grid[i][j] for i in range(len(ranks)) for j, s in enumerate(steps) if s not in masked)
    image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest", cmap="viridis",
                      vmin=low, vmax=high, extent=(steps[0] - 0.5, steps[-1] + 0.5, len(ranks) - 0.5, -0.5))
    fig.colorbar(image, ax=ax, label=f"{'compute' if what == 'compute_s' else 'step'} time (s)", extend="both")
    for x0, x1, why in _step_spans(masked, steps):
        ax.axvspan(x0, x1, facecolor="#ffffff", alpha=0.75, hatch="//", edgecolor="#888888", linewidth=0)
        ax.text((x0 + x1) / 2, -0.5, why, rotation=90, va="top", ha="center", fontsize=7, color="#333333")
    _name_rows(ax, ranks, w)
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


def _name_rows(ax: Any, ranks: list[int], w: StepWindow) -> None:
    """Rank ticks (all of them up to 32 rows, else only the culprits'), the culprits' in bold red."""
    culprits = w.culprits
    shown = range(len(ranks)) if len(ranks) <= 32 else [i for i, r in enumerate(ranks) if r in culprits]
    ax.set_yticks(list(shown), [fg.rank_label(w, ranks[i]) if ranks[i] in culprits else str(ranks[i])
                                for i in shown], fontsize=7)
    for label, i in zip(ax.get_yticklabels(), shown, strict=True):
        if ranks[i] in culprits:
            label.set_color("#b00000")
            label.set_fontweight("bold")


def failstop_plot(w: StepWindow, onset: float, detected: float | None, culprit_nodes: Iterable[str]) -> str:
    """Two panels over seconds from the onset. Top: seconds since each rank's last heartbeat (the others as the
    range of theirs, a live rank stays under its period; the culprits as red lines that climb once they fall
    silent), the culprits' hardware and framework events marked. Bottom: the last step each node finished
    (the culprit nodes in red): a synchronous job stops as a whole, its heartbeats say who died."""
    live = fg.liveness(w, culprit_nodes)
    masked = fg.masked_steps(w)
    fig = _figure(11, 5.6)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    xs = [t - onset for t in live.times]
    seen: set[str] = set()
    for ax in (top, bottom):
        _shade(ax, _time_spans(w, masked, onset), seen)
    others = [r for r in live.age if r not in live.culprits]
    if others:
        hi = [max((live.age[r][k] for r in others if live.age[r][k] is not None), default=math.nan)
              for k in range(len(xs))]
        lo = [min((live.age[r][k] for r in others if live.age[r][k] is not None), default=math.nan)
              for k in range(len(xs))]
        top.fill_between(xs, lo, hi, color="#bbbbbb", label=f"the other {counted(len(others), 'rank')}: range",
                         step="post")
    peak = 0.0
    for r in live.culprits:
        if r not in live.age:
            continue
        ys = [math.nan if v is None else v for v in live.age[r]]
        top.plot(xs, ys, color="#d62728", linewidth=2, label=f"{fg.rank_label(w, r)} (culprit)")
        last = live.silent_from(r)
        if last is not None and not math.isnan(ys[-1]):
            peak = max(peak, ys[-1])
            beat = max((live.age[o][-1] or 0.0 for o in others), default=0.0)
            text = (f"silent since {last - onset:+.1f} s" if ys[-1] > 2 * max(beat, 1.0)
                    else "heartbeats go on: alive, not progressing")
            _tag(top, xs[-1], ys[-1], f"{fg.rank_label(w, r)}: {text}", xytext=(-260, 20))
    for e in live.marks:
        what = f"{e.what} {e.node} {e.reason}".strip() if e.kind == "hw" else f"{e.what}, {fg.rank_label(w, e.rank)}"
        for ax in (top, bottom):
            ax.axvline(e.ts - onset, color="#8b0000", linewidth=1, linestyle=":")
        top.annotate(what, xy=(e.ts - onset, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -4 - 11 * (
            live.marks.index(e) % 4)), textcoords="offset points", fontsize=8, color="#8b0000", va="top")
    _mark(top, 0.0, "onset", "#000000")
    _mark(top, None if detected is None else detected - onset, "detected", "#1f77b4")
    top.set_ylabel("s since last heartbeat")
    top.set_ylim(0, max(peak, max((v for row in live.age.values() for v in row if v is not None), default=1.0)) * 1.1)
    top.grid(alpha=0.3)
    top.legend(loc="upper left", fontsize=8, ncol=3)
    for node, row in sorted(live.progress.items()):
        mine = node in live.culprit_nodes
        bottom.step(xs, [math.nan if v is None else v for v in row], where="post", color="#d62728" if mine else
                    "#9a9a9a", linewidth=2 if mine else 0.8, label=f"{node} (culprit)" if mine else None,
                    zorder=3 if mine else 2)
    bottom.plot([], [], color="#9a9a9a", linewidth=0.8, label="other nodes")
    _mark(bottom, 0.0, None, "#000000")
    _mark(bottom, None if detected is None else detected - onset, None, "#1f77b4")
    bottom.set_ylabel("last step done")
    bottom.set_xlabel("seconds from onset")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="upper left", fontsize=8, ncol=2)
    return _svg(fig, "failstop")


def failslow_plot(d: fg.Deviation, w: StepWindow, onset_step: int | None, detected_step: int | None) -> str:
    """Each rank's compute time as % above its pipeline stage's median at the same step: the others grey, the
    culprits red and named with their mean deviation; masked steps shaded and left out of the lines and the
    y range."""
    fig = _figure(11, 4.2)
    ax = fig.add_subplot()
    _shade(ax, _step_spans(d.masked, d.steps))
    shown = [r for r in d.ranks if r not in d.culprits]
    for k, r in enumerate(shown):
        ys = [math.nan if v is None or s in d.masked else v for s, v in zip(d.steps, d.row(r), strict=True)]
        ax.plot(d.steps, ys, color="#9a9a9a", linewidth=0.7, alpha=0.6, label="other ranks" if k == 0 else None)
    for n, r in enumerate(d.culprits):
        ys = [math.nan if v is None or s in d.masked else v for s, v in zip(d.steps, d.row(r), strict=True)]
        ax.plot(d.steps, ys, color="#d62728", linewidth=2, label=f"{fg.rank_label(w, r)} (culprit)")
        last = max((j for j, y in enumerate(ys) if not math.isnan(y)), default=None)
        if last is not None and n < 4:
            _tag(ax, d.steps[last], ys[last], f"{fg.rank_label(w, r)}: {d.mean.get(r, math.nan):+.1f}% "
                 "vs its stage", xytext=(-220, 12 + 16 * n))
    low, high = d.scale
    mine = [v for r in d.culprits for s, v in zip(d.steps, d.row(r), strict=True)
            if v is not None and s not in d.masked]
    ax.set_ylim(min(low, -1.0) * 1.15, max([high, 1.0, *mine]) * 1.15)
    ax.axhline(0, color="#555555", linewidth=0.8)
    for step, label, color in ((onset_step, "onset", "#000000"), (detected_step, "detected", "#1f77b4")):
        if step is not None:
            ax.axvline(step, color=color, linestyle="--", linewidth=1.2, label=f"{label} (step {step})")
    ax.set_xlabel("step")
    ax.set_ylabel(f"{'compute' if d.what == 'compute_s' else 'step'} time vs stage median (%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, ncol=3)
    return _svg(fig, "failslow")


def deviation_heatmap(d: fg.Deviation, w: StepWindow, onset_step: int | None) -> str:
    """The deviations by rank and step, red above the stage's median, blue below, the scale symmetric and set by
    the unmasked steps only (masked columns hatched); the culprit rows named."""
    import numpy as np

    fig = _figure(11, max(3.0, min(9.0, 1.5 + 0.12 * len(d.ranks))))
    ax = fig.add_subplot()
    grid = np.array([[math.nan if v is None else v for v in row] for row in d.grid], dtype=float)
    low, high = d.scale
    image = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest", cmap="RdBu_r", vmin=low,
                      vmax=high, extent=(d.steps[0] - 0.5, d.steps[-1] + 0.5, len(d.ranks) - 0.5, -0.5))
    fig.colorbar(image, ax=ax, label="% vs stage median", extend="both")
    for x0, x1, why in _step_spans(d.masked, d.steps):
        ax.axvspan(x0, x1, facecolor="#ffffff", hatch="//", edgecolor="#888888", linewidth=0)
        ax.text((x0 + x1) / 2, -0.5, why, rotation=90, va="top", ha="center", fontsize=7, color="#333333")
    _name_rows(ax, d.ranks, w)
    if onset_step is not None:
        ax.axvline(onset_step, color="#000000", linestyle="--", linewidth=1.2, label=f"onset (step {onset_step})")
        ax.legend(loc="lower left", fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    return _svg(fig, "deviation")


def hang_plot(clusters: list[fg.Cluster], w: StepWindow) -> str:
    """The first stack sweep after the onset: one bar per cluster of call paths (ranks in it), the healthy
    majority grey, the culprits' cluster red; each bar says where its ranks are (the frame that sets it apart)
    and who they are."""
    fig = _figure(11, 1.2 + 0.55 * len(clusters))
    ax = fig.add_subplot()
    ys = list(range(len(clusters)))[::-1]
    colors = ["#d62728" if c.culprit else "#9a9a9a" if k == 0 else "#ff9f4a" for k, c in enumerate(clusters)]
    ax.barh(ys, [len(c.ranks) for c in clusters], color=colors, height=0.6)
    healthy = clusters[0]
    for y, k, c in zip(ys, range(len(clusters)), clusters, strict=True):
        where = c.frame if k == 0 else fg.distinct_frame(c, healthy)
        nodes = ", ".join(c.nodes[:4]) + (f" (+{len(c.nodes) - 4} nodes)" if len(c.nodes) > 4 else "")
        who = f"ranks {fg.ranks_text(c.ranks)}" + (f" on {nodes}" if nodes else "")
        tag = "CULPRIT: " if c.culprit else "majority: " if k == 0 else ""
        ax.text(len(c.ranks), y, f"  {tag}{len(c.ranks)} in {where}\n  {who}", va="center", fontsize=8,
                color="#b00000" if c.culprit else "#222222", fontweight="bold" if c.culprit else "normal")
    ax.set_yticks(ys, [f"cluster {k}" for k in range(len(clusters))])
    ax.set_xlim(0, max(len(c.ranks) for c in clusters) * 2.2)
    ax.set_xlabel("ranks in the cluster (first stack sweep after the onset)")
    return _svg(fig, "stacks")


def sdc_plot(v: fg.Vote, w: StepWindow, onset_step: int | None) -> str:
    """The replica-digest vote of the culprit's shard(s): per replica (rows) and step, green where the digest
    is the shard's majority, red where it dissents, grey where unchecked; the culprit rows named."""
    import numpy as np
    from matplotlib.colors import ListedColormap

    fig = _figure(11, max(2.6, min(9.0, 1.4 + 0.3 * len(v.rows))))
    ax = fig.add_subplot()
    grid = np.array(v.cells, dtype=float)
    cmap = ListedColormap(["#d9d9d9", "#d62728", "#74c476"])  # UNCHECKED, DISSENT, AGREE
    ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap, vmin=-1.5, vmax=1.5,
              extent=(v.steps[0] - 0.5, v.steps[-1] + 0.5, len(v.rows) - 0.5, -0.5))
    for x0, x1, _ in _step_spans(v.masked, v.steps):
        ax.axvspan(x0, x1, facecolor="none", hatch="//", edgecolor="#555555", linewidth=0)
    ax.set_yticks(range(len(v.rows)), v.labels, fontsize=7)
    for label, r in zip(ax.get_yticklabels(), v.rows, strict=True):
        if r in v.culprits:
            label.set_color("#b00000")
            label.set_fontweight("bold")
    for n, r in enumerate(x for x in v.rows if x in v.culprits):
        if n < 3 and v.dissents(r):
            i = v.rows.index(r)
            j = next(j for j, c in enumerate(v.cells[i]) if c == fg.DISSENT)
            _tag(ax, v.steps[j], i, f"{fg.rank_label(w, r)}: dissents in {counted(v.dissents(r), 'step')}",
                 xytext=(-200, 10 + 14 * n))
    if onset_step is not None:
        ax.axvline(onset_step, color="#000000", linestyle="--", linewidth=1.2)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color="#74c476", label="agrees with its shard's majority"),
                       Patch(color="#d62728", label="dissents"), Patch(color="#d9d9d9", label="unchecked")],
              loc="upper left", bbox_to_anchor=(0, -0.18), fontsize=8, ncol=3)
    ax.set_xlabel("step")
    return _svg(fig, "sdc")


def stages_plot(stages: Iterable[Stage]) -> str:
    """Each stage's seconds as a bar (red when over its budget) with its budget as a shaded, outlined bar behind
    it. Where the values span more than a factor of 20 (a 2 s detection beside a 400 s total), the axis is
    logarithmic, so the short stages are bars rather than slivers."""
    items = list(stages)
    fig = _figure(11, 0.6 + 0.45 * len(items))
    ax = fig.add_subplot()
    ys = list(range(len(items)))[::-1]
    budgets = [s.budget if s.budget is not None else 0.0 for s in items]
    values = [v for v in [s.seconds for s in items] + budgets if v > 0] or [1.0]
    log = max(values) / min(values) > 20
    floor = min(values) / 3 if log else 0.0  # where a bar starts on a log axis (it has no 0)
    top = max(values) * (6.0 if log else 1.45)  # room for the labels right of the longest bar, inside the frame

    def bar(v: float) -> float:
        return max(v - floor, 0.0)

    ax.barh(ys, [bar(b) for b in budgets], left=floor, height=0.7, color="#eeeeee", edgecolor="#555555",
            linestyle="--", label="budget")
    ax.barh(ys, [bar(s.seconds) for s in items], left=floor, height=0.45,
            color=["#d62728" if s.over else "#2ca02c" for s in items], label="observed")
    for y, s in zip(ys, items, strict=True):
        note = seconds(s.seconds) + (f" of {seconds(s.budget)}" if s.budget is not None else " (no budget)")
        ax.text(max(s.seconds, s.budget or 0.0, floor), y, "  " + note + ("  OVER" if s.over else ""), va="center",
                fontsize=8, color="#b00000" if s.over else "#222222", clip_on=True)
    ax.set_yticks(ys, [s.name for s in items])
    if log:
        ax.set_xscale("log")
        ax.set_xlabel("seconds (log scale)")
    else:
        ax.set_xlabel("seconds")
    ax.set_xlim(floor if log else 0.0, top)
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
    for a, b in zip(seq, [*seq[1:], None] if seq else [], strict=True):  # a job whose life was not stored: none
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
             seconds(i.recover_s) if i.recover_s is not None else i.state, ",".join(i.over_budget) or "-")
            for i in items]
    return _table(("onset", "id", "job", "class", "culprit", "path", "recovered in", "over budget"), rows)


def _act(a: ActionTaken, bold: bool = True) -> str:
    """An action and its nodes; one without nodes (a rollback, a job-wide sweep) by its name alone."""
    name = f"<b>{_e(a.type)}</b>" if bold else _e(a.type)
    return f"{name} {_e(', '.join(a.nodes))}" if a.nodes else name


def incident_html(r: IncidentReport) -> str:
    """The post-mortem of one incident as a self-contained page."""
    onset = r.times.get("onset")
    state = r.state if r.state != "open" else '<span class="open">open (not recovered)</span>'
    body = [f"<h1>Incident <code>{_e(r.id)}</code></h1>",
            f"<p>job <code>{_e(r.job)}</code> &middot; class <b>{_e(r.cls)}</b>{' (planned)' if r.planned else ''}"
            f" &middot; culprit nodes <b>{_e(', '.join(r.culprit_nodes) or '-')}</b> &middot; {state}</p>",
            *class_plots(r),
            "<h2>Timeline (UTC)</h2>",
            _table(("stage", "time", "from onset"),
                   [(m + (" (running degraded: nothing recovered)" if m == "closed" else ""), iso(ts),
                     "" if ts is None or onset is None or m == "onset" else "+" + seconds(ts - onset))
                    for m, ts in r.milestones]),
            "<h2>Root cause</h2>"]
    decided = r.decided_by
    body.append(f"<p>class <b>{_e(r.cls)}</b>; culprit nodes <b>{_e(', '.join(r.culprit_nodes) or '-')}</b></p>")
    if not decided:
        body.append("<p>decision: none recorded</p>")
    else:
        d = decided[0]
        body.append("<p>decision: " + " + ".join(_act(a) for a in decided)
                    + f"{' (path ' + _e(d.path) + ')' if d.path else ''}{' [shadow]' if d.shadow else ''}</p>"
                    + ("<p>ladder before it: " + ", then ".join(f"{_act(a, bold=False)} at {iso(a.ts)}"
                                                             for a in r.ladder) + "</p>" if r.ladder else "")
                    + f"<blockquote>{_e(d.reason)}</blockquote>")
    body.append(f"<h2>Evidence chain ({counted(len(r.evidence), 'finding')} the actions cite)</h2>")
    body.append(_table(("time", "type", "detector", "rank", "node", "score", "evidence"),
                       [(iso(e.at), e.type, e.detector, e.rank, e.node, e.score, e.gist) for e in r.evidence])
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
    return _page(f"gangwatch incident {r.id}", body)


FIRST_PLOT = {"fail_stop": "failstop", "fail_slow": "failslow", "hang": "stacks", "stall": "stacks", "sdc": "sdc"}


def class_plots(r: IncidentReport) -> list[str]:
    """The plots of an incident's telemetry, the one its class calls for first, each pointing at the culprit:
    fail-stop: heartbeats and progress; fail-slow: compute time against the stage's median (and its heat map);
    hang or stall: the stack clusters (then heartbeats and progress); sdc: the digest vote; any class: the
    step time heat map last (an unknown class: the step time per rank first)."""
    onset, detected = r.times.get("onset"), r.times.get("detected")
    w = r.steps
    out = ["<h2>Around the onset: who it was</h2>"]
    if w is None or onset is None:
        why = "no telemetry stored around the onset (replay with --telemetry to keep it)"
        return [*out, _empty(FIRST_PLOT.get(r.cls, "steps"), why)]
    span = f"{iso(w.start)} .. {iso(w.end)}" + (" (cut: too many records)" if w.truncated else "")
    culprit = ", ".join(fg.rank_label(w, k) for k in sorted(w.culprits)[:4]) or ", ".join(r.culprit_nodes) or "-"
    masked = fg.masked_steps(w)
    onset_step, detected_step = w.step_at(onset), None if detected is None else w.step_at(detected)
    shaded = "; shaded: " + ", ".join(sorted(set(masked.values()))) + " (out of the scales)" if masked else ""
    if r.cls == "fail_stop" or (r.cls in ("hang", "stall") and not w.stacks):
        live = fg.liveness(w, r.culprit_nodes)
        out.append(_plot("failstop", failstop_plot(w, onset, detected, r.culprit_nodes),
                         f"culprit {culprit}: seconds since each rank's last heartbeat (a live rank stays under its "
                         f"period), and the last step each node finished; {len(live.marks)} hardware or framework "
                         f"events of the culprit marked at the time each was logged (a kernel-log line at the "
                         f"kernel's, as the evidence chain shows it); {span}{shaded}"))
    if r.cls in ("hang", "stall") and w.stacks:
        clusters = fg.stack_clusters(w)
        out.append(_plot("stacks", hang_plot(clusters, w),
                         f"culprit {culprit}: the ranks of the first stack sweep after the onset "
                         f"({counted(len(w.stacks), 'rank')}) by call path, and where each cluster is"))
        out.append(_plot("failstop", failstop_plot(w, onset, detected, r.culprit_nodes),
                         f"heartbeats and progress around the onset; {span}{shaded}"))
    if r.cls == "sdc":
        vote = fg.digest_vote(w, masked)
        out.append(_plot("sdc", sdc_plot(vote, w, onset_step), f"culprit {culprit}: the replica-digest vote per "
                         f"step of its shard's replicas{shaded}") if vote.rows and vote.steps
                   else _empty("sdc", "no replica digest stored in the window"))
    if r.cls == "fail_slow":
        dev = fg.deviation(w, masked, since_step=onset_step)
        what = "compute" if dev.what == "compute_s" else "step"
        out.append(_plot("failslow", failslow_plot(dev, w, onset_step, detected_step),
                         f"culprit {culprit}: each rank's {what} time as % above the median of its pipeline stage at "
                         f"the same step (a synchronous job's step time is the slowest rank's, the same everywhere)"
                         f"{shaded}"))
        out.append(_plot("deviation", deviation_heatmap(dev, w, onset_step),
                         f"the same by rank and step; colour scale from the unmasked steps only{shaded}"))
    if r.cls not in FIRST_PLOT:
        out.append(_plot("steps", steps_plot(w, onset, detected),
                         f"step time per rank, {counted(len(w.ranks), 'rank')}, {span}; dashed: onset and "
                         f"detection{shaded}"))
    out.append(_plot("heatmap", heatmap_plot(w, onset, detected),
                     f"step time by rank and step (all ranks of a synchronous job share it); dashed: the steps of "
                     f"the onset and of the detection{shaded}"))
    return out


def job_html(r: JobReport, total_budget: float | None = None) -> str:
    """The report of one job as a self-contained page: its ETTR, its life, its incidents."""
    e = r.ettr
    body = [f"<h1>Job <code>{_e(r.job)}</code></h1>",
            "<p>ETTR <b>" + ("-" if e is None or e.ettr is None else f"{e.ettr:.3f}") + "</b>"
            + ("" if e is None else f" (running {seconds(e.running_s)}, lost to incidents {seconds(e.lost_s)}, "
               f"wall {seconds(e.wall_s)}; gangwatch/report/sql/ettr.sql)") + "</p>",
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
