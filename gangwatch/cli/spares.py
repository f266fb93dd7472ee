"""`gangwatch spares`: the warm-standby pool a job needs, sized from the fleet's failure history (gangwatch.fleet)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import orjson

from gangwatch.cli.options import EXIT_FLOOR, EXIT_INPUT, EXIT_USAGE, UserError, integer, number, opt, positive
from gangwatch.cli.replay import connect_timeout_opt, query_store
from gangwatch.fleet.history import NodeEvent, from_incidents, in_order, parse, parse_time

DAY = 86400.0
MIN_REPAIR_WINDOWS = 3  # a history's failures must span this many repair horizons (--repair-hours) to size from

DESCRIPTION = """\
How many warm spare machines to hold for a job so that a failed machine is replaced in seconds: the number
that covers the job's machines down at once (in repair) for a share of the hours (--percentile, 0.99), sized
from the fleet's failure history. The history is files in the import format (CSV or JSON lines, gzipped or
not: node, start, end, class, description; an end of `open` is a repair still going on; an event without end
takes --repair-hours), or, without --history, the store's unplanned incidents: one failure per culprit
machine, whose repair time the store does not know, so each takes --repair-hours.

Several estimators (the empirical machines down at once over trailing windows; a compound model of bursts
arriving at a trailing rate and each machine's repair time drawn from the history's distribution; the same with
a rate that drifts as it did; each at stricter levels) are backtested on the history itself: fitted at rolling
origins with what was known then, scored on the next --hold-days. The advice is the one that met the target at
the least cost (its pool over the pool that would have sufficed), one level stricter; the output prints its
backtest coverage and cost, every estimator's, and the advice at each origin. --since/--until bound the
history it is fitted on; --backtest also fits at --split and scores on the rest. A job of M machines in a
fleet of F sees each down machine with probability M/F; the fleet's size is --fleet, else the machines the
history names (machines that never failed are not named: pass --fleet). --evaluate scores the advisor on
generated fleets and exits 7 below its floors."""


def _events(args: argparse.Namespace) -> list[NodeEvent]:
    """The failures of `--history`'s files, else of the store's unplanned incidents (each taking the horizon),
    kept to `--class`."""
    if args.history:
        events: list[NodeEvent] = []
        for path in args.history:
            if not path.is_file():
                raise UserError(f"no such file: {path}" if not path.exists() else f"{path} is not a file",
                                EXIT_INPUT)
            try:
                events += parse(path.read_bytes(), str(path))  # CSV or JSON lines, gzipped or not
            except ValueError as e:
                raise UserError(str(e), EXIT_INPUT) from None
    else:
        rows = query_store(args, "SELECT id, job, class, planned, onset_ts, detected_ts, ts, recovered_ts, "
                           "culprit_nodes FROM gw_incidents FINAL WHERE planned = 0")
        events = [replace(e, end=None) for e in from_incidents(rows)]
    if args.classes:
        wanted = {c.strip().lower() for c in args.classes}
        present = sorted({e.cls for e in events})
        if not wanted & set(present):
            raise UserError(f"--class {', '.join(sorted(wanted))}: no event of that class; the history's classes: "
                            f"{', '.join(present) or 'none'}", EXIT_INPUT)
        events = [e for e in events if e.cls in wanted]
    return sorted(events, key=in_order)


def _long_enough(args: argparse.Namespace, events: list[NodeEvent]) -> None:
    """UserError (bad input) for a history whose failures span fewer than `MIN_REPAIR_WINDOWS` repair horizons:
    too short to show a rate, let alone how it varies (a 4-minute history read as a daily rate gives thousands)."""
    source = ", ".join(map(str, args.history)) if args.history else "the store's unplanned incidents"
    need_s = MIN_REPAIR_WINDOWS * args.repair_hours * 3600
    span_s = events[-1].start - events[0].start if events else 0.0
    if span_s >= need_s:
        return
    what = (f"{len(events)} failure{'s' * (len(events) != 1)} from {_when(events[0].start)} to "
            f"{_when(events[-1].start)}, {span_s / DAY:.2f} days" if events else "no failure")
    raise UserError(f"{source}: {what}; sizing a pool needs failures over at least {MIN_REPAIR_WINDOWS} repair "
                    f"windows ({MIN_REPAIR_WINDOWS} x --repair-hours {args.repair_hours:g} = "
                    f"{need_s / DAY:g} days): give a longer history", EXIT_INPUT)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job_machines(args: argparse.Namespace) -> int:
    """The machines of job `args.job` from the store: its latest topology (a `job` record in gw_telemetry),
    else the distinct nodes its telemetry names; UserError saying to pass --machines when neither is there."""
    from gangwatch.report.queries import Param, literal

    job = literal(Param("job", "String", "''", ""), args.job)
    [row] = query_store(args, f"""
        SELECT (SELECT argMax(arrayUniq(extractAll(payload, '"node":"([^"]*)"')), ts) FROM gw_telemetry
                WHERE kind = 'job' AND job = {job}) AS topology,
               (SELECT uniqExact(node) FROM gw_telemetry WHERE job = {job} AND node != '') AS nodes,
               (SELECT max(job_ranks) FROM gw_jobs FINAL WHERE job = {job}) AS ranks""")
    machines = int(row.get("topology") or 0) or int(row.get("nodes") or 0)
    if machines:
        return machines
    ranks = int(row.get("ranks") or 0)
    if ranks:
        raise UserError(f"the store has job {args.job!r}'s {ranks} ranks but not the machines they run on (no "
                        f"telemetry stored): pass --machines N (e.g. {-(-ranks // 8)} at 8 ranks a machine)")
    raise UserError(f"the store has no job {args.job!r} (gw_jobs, gw_telemetry): pass --machines N, or a job "
                    "`gangwatch sql ettr` lists")


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")


def cmd_spares(args: argparse.Namespace) -> int:
    if args.evaluate:
        return _evaluate(args)
    if args.machines is None and args.job is None:
        raise UserError("give the job's size: --machines N, or --job J (its machines from the store)", EXIT_USAGE)
    from gangwatch.fleet import spares  # numpy: loaded by the command that needs it, not by every command

    machines = args.machines if args.machines is not None else job_machines(args)
    events = _events(args)
    until = args.until if args.until is not None else spares.history_end(events)
    events = [e for e in events if e.start <= until and (args.since is None or e.start >= args.since)]
    _long_enough(args, events)
    knobs = dict(fleet_machines=args.fleet, percentile=args.percentile, horizon_s=args.repair_hours * 3600,
                 hold_s=args.hold_days * DAY, since=args.since, until=until)
    try:
        advice = spares.advise(events, machines, **knobs)
        test = spares.holdout(events, machines, split=args.split, **knobs) if args.backtest else None
    except ValueError as e:
        raise UserError(str(e), EXIT_USAGE) from None
    if args.format == "json":
        out = {**advice.to_dict(), **({"holdout": test.to_dict()} if test else {})}
        sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    print("\n".join(advice.explain(_day) + (["", *test.explain(_day)] if test else [])))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from gangwatch.evaluation import spares_backtest

    results = spares_backtest.evaluate()
    if args.format == "json":
        doc = {"summary": spares_backtest.summary(results), "floors": spares_backtest.FLOORS,
               "seeds": [{"seed": r.seed, **r.holdout.to_dict()} for r in results],
               "below": spares_backtest.check(results)}
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print("\n".join(spares_backtest.table(results)))
    below = spares_backtest.check(results)
    for line in below:
        print(f"below the floor: {line}", file=sys.stderr)
    return EXIT_FLOOR if below else 0


def when(raw: str) -> float:
    """A time for --since/--until: epoch seconds or ISO 8601 (no zone: UTC), from 2000 on."""
    try:
        t = parse_time(raw, "time")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("time: ")) from None
    if t is None:
        raise argparse.ArgumentTypeError("empty time")
    return t


def fraction(raw: str) -> float:
    """A share strictly between 0 and 1 (--percentile 0.99, --split 0.6)."""
    try:
        value = number(raw)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e}: {raw!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"want a fraction between 0 and 1 (e.g. 0.99), got {raw}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("spares", help="the warm-standby pool a job needs, sized from the fleet's failure history",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  gangwatch spares --machines 1024 --history fleet.csv --fleet 2000\n"
                       "  gangwatch spares --machines 1024 --history fleet.csv.gz --fleet 2000 --until 2026-05-01 "
                       "--backtest\n"
                       "  gangwatch spares --job llm-70b --store clickhouse://ch1:9000/gangwatch --repair-hours 48\n"
                       "  gangwatch spares --machines 64 --out gangwatch-demo --percentile 0.999 --format json\n"
                       "  gangwatch spares --evaluate")
    size = s.add_mutually_exclusive_group()
    size.add_argument("--job", metavar="J", help="the job to size for: its machines from the store's telemetry")
    size.add_argument("--machines", type=positive(integer), metavar="N", help="the job's size in machines")
    s.add_argument("--history", nargs="+", action="extend", type=Path, metavar="FILE",
                   help="failure history files, CSV or JSON lines (node,start,end,class,description); "
                   "default: the store's unplanned incidents")
    s.add_argument("--class", dest="classes", action="append", default=[], metavar="C",
                   help="count only events of this class as failures (repeat for more; default every event: "
                   "leave precursors such as ecc_correctable out this way)")
    s.add_argument("--fleet", type=positive(integer), metavar="N",
                   help="the fleet's size in machines (default: the machines the history names)")
    s.add_argument("--repair-hours", type=positive(number), default=24.0, metavar="H",
                   help="repair time of a failure without an end: the replacement horizon (default 24)")
    s.add_argument("--percentile", type=fraction, default=0.99, metavar="P",
                   help="the share of time the spares must cover (default 0.99)")
    s.add_argument("--hold-days", type=positive(number), default=90.0, metavar="D",
                   help="how long the pool is held before it is sized again: the span each backtest fold is "
                   "scored on (default 90)")
    s.add_argument("--since", type=when, metavar="T", help="fit on the history from T on (ISO 8601 or epoch s)")
    s.add_argument("--until", type=when, metavar="T",
                   help="fit on the history before T, as it was known then: a repair that ended later was still "
                   "open (default: the history's last start or end)")
    s.add_argument("--backtest", action="store_true",
                   help="also advise at --split with what was known then and score that on the rest")
    s.add_argument("--split", type=fraction, default=0.6, metavar="F",
                   help="--backtest: fit on this first share of the history, score on the rest (default 0.6)")
    s.add_argument("--evaluate", action="store_true",
                   help="score the advisor on 10 generated fleets (fit on 60%%, judged on the rest); exit 7 "
                   "below its floors")
    opt(s, "--store", env="GANGWATCH_STORE",
        help="chdb:PATH or clickhouse://HOST:PORT[/DB] (default: OUT/store, a replay's)")
    opt(s, "--out", type=Path, default=Path("gangwatch-out"), help="a replay's output directory (its store/)")
    s.add_argument("--format", choices=("table", "json"), default="table", help="output format (default table)")
    connect_timeout_opt(s)
    s.set_defaults(func=cmd_spares)
