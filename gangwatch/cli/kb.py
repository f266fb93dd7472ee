"""`gangwatch kb search`: the knowledge base of closed incidents (`gangwatch.fleet.kb`) over the store: past
incidents of a node, of a class, with words in their root cause, or most like one incident, with what fixed each.
The SQL goes through `query_store`, as `gangwatch sql`'s and `gangwatch report`'s does."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gangwatch.cli.options import EXIT_USAGE, UserError, integer, opt, positive, settings_opts
from gangwatch.cli.replay import connect_timeout_opt, print_rows, query_store
from gangwatch.fleet import kb

DESCRIPTION = """\
Search the closed incidents of the store (recovered ones: the store keeps no other resolution) as a knowledge
base. Each has its timeline, root cause (class, culprit nodes, the decision's reason), evidence signature (what
its cited findings were, without nodes, ranks or times), the actions it took, what ended it and how long it took
to recover, and its stages against their budgets (triage.budgets.*: --set, GANGWATCH_* or --config).
--like ID ranks them by how alike their evidence is to incident ID's (weighted Jaccard of the signatures; ID
may still be open); --node, --class and --cause (every word in the root cause, any case) filter. Without
--like, the most recent come first. docs/knowledge-base.md says how signatures are made.

--history FILE adds a fleet history in the import format (docs/fleet-history.md: CSV or JSON lines, gzip too):
each of its faults is an entry (class, node, start, end, description), so "has this node failed like this
before" is answered from a deployment's first day, before gangwatch has closed any incident. With --history the
store is read only when --store or --out is given; --class then takes the history's own class names, and --like
an entry id of the history (NODE@START/CLASS) as well as an incident of the store."""

ACTION_COLUMNS = "id, ts, incident, type, nodes, reason, evidence, path, shadow"
FINDING_COLUMNS = "id, ts, job, type, detector, rank, node, score, evidence"
DEFAULT_OUT = Path("gangwatch-out")
REASON_WIDTH = 60  # characters of the decision's reason in the table


def gather(run: Callable[[str], list[dict]]) -> tuple[list[dict], list[dict], list[dict]]:
    """Every incident (latest version), every action of an incident, and every finding an action cites."""
    from gangwatch.report.postmortem import INCIDENT_COLUMNS

    incidents = run(f"SELECT {INCIDENT_COLUMNS} FROM gw_incidents FINAL ORDER BY ifNull(onset_ts, ts), id")
    if not incidents:
        return [], [], []
    actions = run(f"SELECT {ACTION_COLUMNS} FROM gw_actions FINAL WHERE incident != '' ORDER BY ts, id")
    findings = run(f"SELECT {FINDING_COLUMNS} FROM gw_findings FINAL WHERE id IN "
                   "(SELECT arrayJoin(evidence) FROM gw_actions FINAL WHERE incident != '') ORDER BY ts, id")
    return incidents, actions, findings


def _like(like: str, incidents: list[dict], actions: list[dict], findings: list[dict],
          budgets: dict[str, float]) -> kb.Entry:
    """Incident `like`'s entry (closed or still open); UserError for an id the store does not hold."""
    rows = [r for r in incidents if r["id"] == like]
    if not rows:
        where = "the store holds no incidents" if not incidents else "`gangwatch kb search` lists the closed ones"
        raise UserError(f"--like {like}: no incident {like!r} in the store ({where})", EXIT_USAGE)
    return kb.entry(kb.latest(rows)[0], [a for a in actions if a["incident"] == like], findings, budgets)


def _outcome(e: kb.Entry) -> dict[str, str]:
    """What fixed it and how long it took; an incident a degrade closed (path non_stop) was fixed by nothing and
    did not recover: it ran on degraded (issue 47: the table said "fixed_by degrade n001, recovered_in 66.5 s")."""
    from gangwatch.report.text import seconds

    if e.path == "non_stop":
        return {"fixed_by": "none: kept running", "recovered_in": "running degraded"}
    return {"fixed_by": e.fix, "recovered_in": seconds(e.recover_s)}


def _table_row(m: kb.Match, like: bool) -> dict[str, Any]:
    from gangwatch.report.text import iso

    e = m.entry
    reason = e.reason if len(e.reason) <= REASON_WIDTH else e.reason[:REASON_WIDTH - 3] + "..."
    return {**({"similarity": f"{m.similarity:.2f}"} if like else {}), "onset": iso(e.times.get("onset"), ms=False),
            "incident": e.id, "job": e.job, "class": e.cls, "culprit": ",".join(e.culprit_nodes) or "-",
            "cause": reason or "-", **_outcome(e),
            "over_budget": ",".join(e.over_budget) or "-"}


def cmd_search(args: argparse.Namespace) -> int:
    from gangwatch.schemas.classes import CLASSES

    if args.cls is not None and not args.history and args.cls not in CLASSES:
        raise UserError(f"--class {args.cls}: not an incident class (one of {', '.join(CLASSES)}; a history's own "
                        "classes with --history)", EXIT_USAGE)
    args.cls = args.cls.lower() if args.cls is not None else None
    budgets = dict(args.settings.get("triage.budgets"))
    past = _history(args.history)
    if not args.history or args.store is not None or args.out is not None:
        args.out = args.out or DEFAULT_OUT
        incidents, actions, findings = gather(lambda sql: query_store(args, sql))
    else:
        incidents, actions, findings = [], [], []
    from_history = {e.id: e for e in past}
    if args.like in from_history:
        like: kb.Entry | None = from_history[args.like]
    elif args.like is not None and args.out is None and args.store is None:
        raise UserError(f"--like {args.like}: no fault {args.like!r} in the history (its ids are NODE@START/CLASS, "
                        "listed by a search without --like; the store was not read: add --store or --out)",
                        EXIT_USAGE)
    else:
        like = _like(args.like, incidents, actions, findings, budgets) if args.like is not None else None
    entries = kb.entries(incidents, actions, findings, budgets) + past
    found = kb.search(entries, node=args.node, cls=args.cls, cause=args.cause, like=like, limit=args.limit)
    if args.format == "json":
        print_rows([{**({"similarity": m.similarity} if like is not None else {}), **m.entry.to_dict()}
                    for m in found], "json")
        if not found:
            print(_why_none(args, incidents, entries), file=sys.stderr)
        return 0
    if like is not None:
        print(f"closed incidents like {like.id} ({like.root_cause}), most alike first:")
    if not found:
        print(f"(no rows: {_why_none(args, incidents, entries)})")
        return 0
    print_rows([_table_row(m, like is not None) for m in found], "table")
    return 0


def _history(paths: list[Path]) -> list[kb.Entry]:
    """The faults of the history files as entries (none without files)."""
    from gangwatch.cli.rules import read_history

    return kb.from_history(e for path in paths for e in read_history(path))


def _why_none(args: argparse.Namespace, incidents: list[dict], entries: list) -> str:
    """Why a search found nothing: no incidents, none closed yet, or none that the filters keep."""
    if not incidents and not entries and args.history:
        return f"the history ({', '.join(map(str, args.history))}) holds no fault and the store was not read"
    if not incidents and not entries:
        return "the store holds no incidents yet: replay or run something into it first"
    if not entries:
        n = len({r["id"] for r in incidents})
        return (f"none of the store's {n} incident{'s' * (n != 1)} is closed yet: the knowledge base holds "
                "recovered ones (`gangwatch sql open_incidents` lists the open ones)")
    given = [f"{flag} {v}" for flag, v in (("--node", args.node), ("--class", args.cls), ("--cause", args.cause))
             if v is not None]
    return f"no closed incident of the {len(entries)} matches {' '.join(given) or 'the search'}"


def register(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser("kb", help="knowledge base of closed incidents: search by node, class, cause or likeness",
                       description="The store's closed incidents as a knowledge base: `gangwatch kb search --help`.")
    ksub = k.add_subparsers(dest="kb_command", metavar="SUBCOMMAND", required=True)
    s = ksub.add_parser("search", help="past incidents like one, or of a node, class or cause, with what fixed them",
                        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  gangwatch kb search --out gangwatch-demo\n"
                        "  gangwatch kb search --like i-0123456789abcdef --out gangwatch-demo\n"
                        "  gangwatch kb search --node n017 --class fail_stop --store clickhouse://ch1:9000/gangwatch\n"
                        "  gangwatch kb search --cause 'fallen off the bus' --format json\n"
                        "  gangwatch kb search --history tickets.csv.gz --node gpu-a017 --class xid_79")
    s.add_argument("--node", metavar="N", help="only incidents that blamed or evicted node N")
    s.add_argument("--class", dest="cls", metavar="C", help="only incidents of class C (fail_stop, hang, ...)")
    s.add_argument("--cause", metavar="TEXT", help="only incidents whose root cause has every word of TEXT")
    s.add_argument("--like", metavar="ID", help="rank by how alike their evidence is to incident ID's")
    s.add_argument("--limit", type=positive(integer), default=10, metavar="N", help="at most N (default 10)")
    s.add_argument("--format", choices=("table", "json"), default="table", help="output format (default table)")
    opt(s, "--store", env="GANGWATCH_STORE",
        help="chdb:PATH or clickhouse://HOST:PORT[/DB] (default: OUT/store, a replay's)")
    opt(s, "--out", type=Path, shown_default=DEFAULT_OUT, help="a replay's output directory (its store/)")
    s.add_argument("--history", nargs="+", action="extend", type=Path, default=[], metavar="FILE",
                   help="also the faults of fleet history files in the import format (CSV or JSON lines, .gz "
                   "too); repeatable; the store is then read only with --store or --out")
    connect_timeout_opt(s)
    settings_opts(s)
    s.set_defaults(func=cmd_search)
