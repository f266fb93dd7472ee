"""`gangwatch sql`: the analysts' shipped queries (gangwatch/report/sql/*.sql), listed, explained and run."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from gangwatch.cli.options import EXIT_USAGE, UserError, opt
from gangwatch.cli.replay import connect_timeout_opt, print_rows, query_store

DESCRIPTION = """\
Run one of the queries gangwatch ships for analysts (one file each in gangwatch/report/sql/, the same SQL on a
ClickHouse server and on the embedded chDB store): open incidents, time to recover per job and week, stage
budgets against what was observed and the budgets to revise them to, interruptions by class (planned apart),
planned against the platform's downtime per job, top offender nodes and GPUs, ETTR per job, what stragglers
cost per job (seconds and GPU-hours), innocent evictions (nodes evicted that later ran clean), machines down
per day. `--list` names them; `gangwatch sql NAME --explain` prints what one answers, its parameters and its
SQL (to copy and change). Parameters are put in as literals of their type (a string quoted, a number checked),
never as SQL."""


def cmd_sql(args: argparse.Namespace) -> int:
    from gangwatch.report import queries

    shipped = queries.catalog()
    if args.list or not args.name:
        width = max(map(len, shipped))
        for name, q in shipped.items():
            params = " ".join(f"[{p}=]" for p in q.params)
            print(f"{name:<{width}}  {q.summary}" + (f"  ({params})" if params else ""))
        return 0
    q = shipped.get(args.name)
    if q is None:
        raise UserError(f"no query named {args.name!r}: `gangwatch sql --list` names them ({', '.join(shipped)})",
                        EXIT_USAGE)
    given = {}
    for item in args.param:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise UserError(f"--param {item!r}: want NAME=VALUE, e.g. --param job=llm-70b", EXIT_USAGE)
        given[name.strip()] = value
    try:
        sql = queries.render(q, given)
    except ValueError as e:
        raise UserError(str(e), EXIT_USAGE) from None
    if args.explain:
        print(textwrap.fill(q.doc, 100))
        for p in q.params.values():
            print(f"  --param {p.name}=... ({p.type}, default {p.default}): {p.doc}")
        for name, text in queries.BUILTINS.items():
            if "{" + name + "}" in q.text:
                print(f"  {{{name}}}: the data's last event time, {text}")
        print()
        print(sql if given else q.text)
        return 0
    print_rows(query_store(args, sql), args.format)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("sql", help="the analysts' shipped queries: MTTR, stage budgets, offenders, open incidents",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  gangwatch sql --list\n"
                       "  gangwatch sql time_to_recover --param job=llm-70b --store clickhouse://ch1:9000/gangwatch\n"
                       "  gangwatch sql stages_vs_budget --out gangwatch-demo --format csv > stages.csv\n"
                       "  gangwatch sql top_offender_nodes --explain")
    s.add_argument("name", nargs="?", metavar="NAME", help="the query (see --list)")
    s.add_argument("--list", action="store_true", help="name every shipped query and what it answers")
    s.add_argument("--explain", action="store_true", help="print what the query answers, its parameters and its SQL")
    s.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a parameter of the query (repeat for more; --explain lists them)")
    opt(s, "--store", env="GANGWATCH_STORE",
        help="chdb:PATH or clickhouse://HOST:PORT[/DB] (default: OUT/store, a replay's)")
    opt(s, "--out", type=Path, default=Path("gangwatch-out"), help="a replay's output directory (its store/)")
    s.add_argument("--format", choices=("table", "csv", "json", "jsonl"), default="table",
                   help="output format (default table)")
    connect_timeout_opt(s)
    s.set_defaults(func=cmd_sql)
