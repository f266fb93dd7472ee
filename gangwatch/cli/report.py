"""`gangwatch report`: the post-mortem of an incident, a job or a period, from the store, in the terminal and as one
self-contained HTML page (`--html`). The SQL goes through `query_store`, as `gangwatch sql`'s does; the model and
the text are `gangwatch.report.postmortem`'s, the page `gangwatch.report.htmlpage`'s."""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
from collections.abc import Callable
from pathlib import Path

from gangwatch.cli.options import EXIT_INPUT, EXIT_USAGE, UserError, number, opt, positive, settings_opts
from gangwatch.cli.replay import connect_timeout_opt, query_store

DESCRIPTION = """\
The post-mortem of one incident (--incident ID): its timeline (onset, detected, localized, decided, recovered),
the findings its actions cite in order, its root cause (class, culprit nodes, the decision and its reason), its
recovery path, and each stage against its budget (triage.budgets.*: --set, GANGWATCH_* or --config, as the
pipeline takes them), over-budget stages marked. Of one job (--job ID): its life (starts, pauses, stops, ends),
its incidents and its ETTR (gangwatch/report/sql/ettr.sql). Of a period (--since T [--until T]): its incidents, counts
per class and the ETTR of every job alive in it. With none of them, the latest incidents and their ids.
--html FILE also writes the report as one self-contained page with its plots (no network needed to view it):
step time per rank around the onset and a rank x step heat map (these need the raw telemetry: replay with
--telemetry), the stages against their budgets; a period's interruptions over time and ETTR per job."""


def parse_time(raw: str) -> float:
    """ISO 8601 (UTC unless it names an offset: 2026-01-01, 2026-01-01T06:00:00Z, 2026-01-01 08:00+02:00) or
    epoch seconds, as epoch seconds; ValueError saying what it takes."""
    try:
        value = float(raw)
    except ValueError:
        pass
    else:
        if math.isfinite(value):
            return value
    try:
        t = dt.datetime.fromisoformat(raw.strip())
    except ValueError:
        raise ValueError(f"{raw!r} is not a time: want ISO 8601 UTC (2026-01-01T00:00:00Z, 2026-01-01) or "
                         "epoch seconds") from None
    return (t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)).timestamp()


def _period(args: argparse.Namespace) -> tuple[float, float | None]:
    if args.until is not None and args.since is None:
        raise UserError("--until needs --since: a period is --since T [--until T]")
    try:
        since = parse_time(args.since)
        until = None if args.until is None else parse_time(args.until)
    except ValueError as e:
        raise UserError(f"--since/--until: {e}") from None
    if until is not None and until <= since:
        raise UserError(f"--until ({args.until}) must be after --since ({args.since})")
    return since, until


def _report(args: argparse.Namespace) -> tuple[str, Callable[[], str] | None]:
    """The terminal text and, for --html, what writes the page."""
    from gangwatch.report import postmortem as pm
    from gangwatch.report import text

    def run(sql: str) -> list[dict]:
        return query_store(args, sql)

    budgets = dict(args.settings.get("triage.budgets"))
    if args.incident is not None:
        inc = pm.gather_incident(run, args.incident, budgets, window_s=args.window)
        return text.incident_text(inc), lambda: _html().incident_html(inc)
    if args.job is not None:
        job = pm.gather_job(run, args.job)
        return text.job_text(job), lambda: _html().job_html(job, budgets.get("total"))
    if args.since is not None or args.until is not None:
        since, until = _period(args)
        period = pm.gather_period(run, since, until)
        return text.period_text(period), lambda: _html().period_html(period)
    if args.html is not None:
        raise UserError("--html needs what to report: --incident ID, --job ID or --since T [--until T]")
    return text.latest_text(pm.gather_latest(run)), None


def _html():
    from gangwatch.report import htmlpage

    return htmlpage


def _check_html(path: Path) -> None:
    """Where --html writes, checked before any work: its folder exists, and it is no folder itself."""
    if path.is_dir():
        raise UserError(f"--html {path} is a folder; give a file name (e.g. {path / 'report.html'})", EXIT_INPUT)
    folder = path.parent
    if not folder.is_dir():
        raise UserError(f"cannot write --html {path}: its folder {folder} does not exist (create it first)",
                        EXIT_INPUT)


def cmd_report(args: argparse.Namespace) -> int:
    from gangwatch.report import postmortem as pm

    if args.html is not None:
        _check_html(args.html)
    try:
        text, page = _report(args)
    except pm.EmptyStore as e:
        raise UserError(str(e), EXIT_INPUT) from None
    except pm.NotInStore as e:
        raise UserError(str(e), EXIT_USAGE) from None
    html = page() if args.html is not None and page is not None else None  # a missing extra fails before output
    print(text)
    if html is not None:
        args.html.write_text(html, encoding="utf-8")
        print(f"HTML report: {args.html}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("report", help="post-mortem of an incident, a job or a period (terminal, and --html with plots)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  gangwatch report --out gangwatch-demo\n"
                       "  gangwatch report --incident i-0123456789abcdef --out gangwatch-demo --html incident.html\n"
                       "  gangwatch report --job llm-70b --store clickhouse://ch1:9000/gangwatch\n"
                       "  gangwatch report --since 2026-01-01 --until 2026-02-01 --html january.html")
    what = r.add_mutually_exclusive_group()
    what.add_argument("--incident", metavar="ID", help="one incident (its id: `gangwatch report` lists the latest)")
    what.add_argument("--job", metavar="ID", help="one job: its life, incidents and ETTR")
    what.add_argument("--since", metavar="T", help="a period from T (ISO 8601 UTC, or epoch seconds)")
    r.add_argument("--until", metavar="T", help="the period's end, T excluded (default: no end)")
    r.add_argument("--html", type=Path, metavar="FILE", help="also write the report as one self-contained HTML page")
    opt(r, "--window", type=positive(number), default=60.0, env=False,
        help="seconds of step telemetry plotted before the onset and after the detection")
    opt(r, "--store", env="GANGWATCH_STORE",
        help="chdb:PATH or clickhouse://HOST:PORT[/DB] (default: OUT/store, a replay's)")
    opt(r, "--out", type=Path, default=Path("gangwatch-out"), help="a replay's output directory (its store/)")
    connect_timeout_opt(r)
    settings_opts(r)
    r.set_defaults(func=cmd_report)
