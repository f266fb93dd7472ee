"""`gangwatch rules`: precursor rules mined from node fault histories (suggest), and a history to try it on."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gangwatch.cli.options import EXIT_INPUT, EXIT_USAGE, UserError, integer, iso, number, positive
from gangwatch.cli.replay import connect_timeout_opt, print_rows, query_store

DESCRIPTION = """\
Mine a fleet's history for rules that warn before a fault, of two kinds:

- precursor: a class of event A (correctable-ECC bursts, thermal throttling, link errors, NIC flaps) on a node
  that is up and healthy, followed on the same node by a fault of a target class within --horizon-days. Counted
  in healthy node-days (not in repair, nor within --settle-days of a repair's end): support is the node-days
  with an A burst (k or more A events within 24 h; k is learned), precision the share of them followed by the
  fault on one of the next N days, base rate that share over all healthy node-days, lift their ratio;
- probation: a repair of a fault of class A ends (the node is back) and a fault of class T follows within a
  window counted from that end (6, 24, 72 or 168 h, learned): the node's first days back. Support is the
  repairs that ended, precision the share followed by the fault, base rate the chance of such a fault in as
  long a window on a healthy node.

Rules are learned on the first --split of the history (by time) and kept only if they hold on the rest, which
they were not learned on: enough test support, test lift at least --min-lift, and the one-sided binomial test of
the test hits against the test base rate under --alpha after a Benjamini-Hochberg correction over every rule
learned (corrected_p). Recall is the share of the test part's faults of the target the rule warned of; nodes the
distinct nodes of its hits (a rule from fewer than 10 is marked "support from N nodes"). Each suggestion comes
with what to do: a detection rule and a soft scheduler taint for as long as the faults it warned of took to
come, from the burst or from the repair's end. A history of faults only can teach probation rules only; it is
said once. docs/fleet-history.md explains the definitions.

The history is files in the import format (CSV with a header, or JSON lines: node, start, end, class,
description) and/or gangwatch's own incidents from a store (each incident's latest version, one event per
culprit node, planned ones left out). Without --history the store is read (--store, env GANGWATCH_STORE, else
OUT/store); with --history, only when --store or --out is given."""

INCIDENTS_SQL = """SELECT id, argMax(job, version) AS last_job, argMax(class, version) AS last_class,
    argMax(planned, version) AS last_planned, argMax(ts, version) AS last_ts,
    argMax(ifNull(onset_ts, toFloat64(-1)), version) AS last_onset,
    argMax(ifNull(detected_ts, toFloat64(-1)), version) AS last_detected,
    argMax(ifNull(recovered_ts, toFloat64(-1)), version) AS last_recovered,
    argMax(culprit_nodes, version) AS last_culprits
FROM gw_incidents GROUP BY id ORDER BY id"""


def read_history(path: Path):
    """A history file's events (gzipped or not); UserError (exit 3) naming the file when it is missing or wrong."""
    from gangwatch.fleet import history

    if not path.exists():
        raise UserError(f"no such file: {path}", EXIT_INPUT)
    if path.is_dir():
        raise UserError(f"{path} is a directory; give a history file (CSV with a header, or JSON lines)", EXIT_INPUT)
    try:
        return history.parse(path.read_bytes(), str(path))  # gzipped or not, by its magic
    except ValueError as e:
        raise UserError(str(e), EXIT_INPUT) from None


def _latest(v: object) -> object:
    return None if v is None or (isinstance(v, int | float) and v < 0) else v


def _incidents(args: argparse.Namespace):
    from gangwatch.fleet import history

    rows = query_store(args, INCIDENTS_SQL)
    return history.from_incidents([
        {"id": r["id"], "job": r["last_job"], "class": r["last_class"], "planned": r["last_planned"],
         "ts": r["last_ts"], "onset_ts": _latest(r["last_onset"]), "detected_ts": _latest(r["last_detected"]),
         "recovered_ts": _latest(r["last_recovered"]), "culprit_nodes": r["last_culprits"]} for r in rows])


def _params(args: argparse.Namespace):
    from gangwatch.fleet.rules import DEFAULT_TARGETS, Params

    try:
        return Params(horizon_days=args.horizon_days, split=args.split,
                      targets=DEFAULT_TARGETS + tuple(t.lower() for t in args.target), settle_days=args.settle_days,
                      min_support=args.min_support, min_lift=args.min_lift, alpha=args.alpha)
    except ValueError as e:
        raise UserError(str(e), EXIT_USAGE) from None


def _day(d: int) -> str:
    return iso(d * 86400.0)[:10]


def cmd_suggest(args: argparse.Namespace) -> int:
    import orjson

    from gangwatch.fleet.history import in_order
    from gangwatch.fleet.rules import day_of, mine, only_recurrence, parts

    params = _params(args)
    events = [e for path in args.history for e in read_history(path)]
    if not args.history or args.store or args.out:
        args.store = args.store or (None if args.history else os.environ.get("GANGWATCH_STORE") or None)
        args.out = args.out or Path("gangwatch-out")
        events += _incidents(args)
    events.sort(key=in_order)
    try:
        rules = mine(events, params)
        train, test = parts(day_of(events[0].start), day_of(events[-1].start), params)
    except ValueError as e:
        raise UserError(str(e), EXIT_INPUT) from None
    classes = sorted({e.cls for e in events})
    if not any(params.is_target(c) for c in classes):
        print(f"no class of the history is a target ({', '.join(params.targets)}): nothing to predict; name the "
              f"faults with --target CLASS (the history's classes: {', '.join(classes)})", file=sys.stderr)
    elif only_recurrence(events, params):
        print("the history holds faults only (no other event, such as a precursor, before them): only recurrence "
              "can be learned from it (probation rules: faults after a repair's end)", file=sys.stderr)
    shown = rules if args.all else [r for r in rules if r.holds]
    if args.format == "json":
        doc = {"events": len(events), "nodes": len({e.node for e in events}),
               "train_days": [_day(d) for d in train], "test_days": [_day(d) for d in test],
               "horizon_days": params.horizon_days, "learned": sum(not r.verdict.startswith("not learned")
                                                                   for r in rules),
               "rules": [r.to_dict() for r in shown]}
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    nodes = len({e.node for e in events})
    print(f"{len(events)} events on {nodes} nodes; learned on node-days {_day(train[0])}..{_day(train[1])}, "
          f"tested on {_day(test[0])}..{_day(test[1])} (horizon {params.horizon_days} days)")
    if not shown:
        learned = sum(not r.verdict.startswith("not learned") for r in rules)
        print(f"no rule holds out of sample ({len(rules)} candidates, {learned} learned on the training part; "
              "--all shows each with why)")
        return 0
    print_rows([{**r.row(), **({"verdict": r.verdict} if args.all else {})} for r in shown], "table")
    print("(corrected_p: Benjamini-Hochberg over the rules learned; recall: faults of the test part warned of)")
    for r in (r for r in shown if r.holds):
        print(f"- {r.name}: {_advice(r)}" + (f" ({r.few_nodes_note})" if r.few_nodes_note else ""))
    return 0


def _advice(r) -> str:
    """What to do about a rule that holds, in words."""
    a = r.actions()
    taint = f"{a['taint']['key']}={a['taint']['value']}:{a['taint']['effect']} for {a['taint']['for_h']} h"
    if a["taint"]["from"] == "repair_end":
        return (f"when a repair of {r.antecedent} ends, watch the node for {r.target} for {a['detect']['watch_h']} h "
                f"and taint it {taint} from the repair's end")
    return (f"on {a['detect']['at_least']}x {r.antecedent} within {a['detect']['within_h']} h, raise the node's "
            f"risk and watch it for {r.target} for {r.horizon_days} days; taint {taint}")


def cmd_generate(args: argparse.Namespace) -> int:
    from gangwatch.fleet.history import to_csv
    from gangwatch.producers.simulate.precursors import FleetSpec, generate, parse_planted

    try:
        spec = FleetSpec(seed=args.seed, nodes=args.nodes, days=args.days, fault_per_day=args.fault_rate,
                         planted=tuple(parse_planted(p) for p in args.planted))
    except ValueError as e:
        raise UserError(str(e), EXIT_USAGE) from None
    if args.out.is_dir():
        raise UserError(f"--out {args.out} is a directory; give a file name (e.g. history.csv)", EXIT_INPUT)
    events = generate(spec)
    args.out.write_text(to_csv(events))
    planted = sum(e.description.startswith("planted") for e in events)
    print(f"{args.out}: {len(events)} events on {spec.nodes} nodes over {spec.days} days "
          f"({planted} planted faults)")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("rules", help="precursor rules mined from node fault histories, scored out of sample",
                       description="Precursor rules from node fault histories: `suggest` mines and scores them, "
                       "`generate` writes a history with a planted pattern to try it on.")
    rsub = s.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    g = rsub.add_parser("suggest", help="mine precursor rules; keep those that hold out of sample",
                        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="examples:\n  gangwatch rules generate --planted thermal:fail_stop:0.3:3 "
                        "--out history.csv\n  gangwatch rules suggest --history history.csv\n"
                        "  gangwatch rules suggest --history tickets.csv --out gangwatch-demo --all\n"
                        "  gangwatch rules suggest --store clickhouse://ch1:9000/gangwatch --horizon-days 3 "
                        "--format json > rules.json")
    g.add_argument("--history", nargs="+", action="extend", type=Path, default=[], metavar="FILE",
                   help="history files in the import format (CSV or JSON lines, .gz too); repeatable")
    g.add_argument("--store", help="also gangwatch's incidents from this store: chdb:PATH or "
                   "clickhouse://HOST:PORT[/DB]")
    g.add_argument("--out", type=Path, help="also gangwatch's incidents from a replay's store (OUT/store)")
    g.add_argument("--horizon-days", type=positive(integer), default=7,
                   help="a fault within this many days after the antecedent's day counts (default 7)")
    g.add_argument("--split", type=number, default=0.6,
                   help="the share of the history, by time, to learn on; the rest tests (default 0.6)")
    g.add_argument("--settle-days", type=number, default=3.0,
                   help="days after a repair's end that a node is not yet healthy: precursor rules leave them "
                   "out (default 3)")
    g.add_argument("--min-support", type=positive(integer), default=10,
                   help="node-days with the antecedent a rule needs in each part (default 10)")
    g.add_argument("--min-lift", type=positive(number), default=2.0, help="least test lift (default 2)")
    g.add_argument("--alpha", type=number, default=0.01,
                   help="false discovery rate of the rules kept: their test p-values, Benjamini-Hochberg corrected "
                   "over the rules learned, must be under it (default 0.01)")
    g.add_argument("--target", action="append", default=[], metavar="CLASS",
                   help="another fault class to predict, or a shell pattern (defaults: fail_stop, sdc, hang, "
                   "fail_slow, unknown, xid_*); repeatable")
    g.add_argument("--all", action="store_true", help="every candidate rule with its verdict, not only those kept")
    g.add_argument("--format", choices=("table", "json"), default="table", help="output format (default table)")
    connect_timeout_opt(g)
    g.set_defaults(func=cmd_suggest)

    m = rsub.add_parser("generate", help="write a generated fleet history (CSV), optionally with planted patterns",
                        description="A seeded fleet history in the import format: background faults, noise of "
                        "every precursor class (correctable ECC singles and bursts, thermal, link errors, NIC "
                        "flaps) and planted patterns: a share of an antecedent's occurrences followed by a fault "
                        "on the same node within some days (producers/simulate/precursors.py).",
                        epilog="planted: ANTECEDENT:TARGET[:PROBABILITY[:WITHIN_DAYS[:MIN_EVENTS]]] (defaults "
                        "0.3, 3 days, 1 event); ANTECEDENT may be a fault class, or any_fault (repeated faults).\n"
                        "examples:\n  gangwatch rules generate --planted thermal:fail_stop:0.3:3 --out history.csv\n"
                        "  gangwatch rules generate --planted ecc_correctable:xid_48:0.4:3:3 --seed 2 --out ecc.csv",
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("--out", type=Path, required=True, help="the CSV file to write")
    m.add_argument("--planted", action="append", default=[], metavar="A:T[:P[:DAYS[:MIN]]]",
                   help="a planted pattern; repeatable")
    m.add_argument("--nodes", type=positive(integer), default=200, help="nodes in the fleet (default 200)")
    m.add_argument("--days", type=positive(integer), default=120, help="days of history (default 120)")
    m.add_argument("--seed", type=integer, default=1, help="random seed (default 1)")
    m.add_argument("--fault-rate", type=number, default=0.002,
                   help="background faults per node per day (default 0.002)")
    m.set_defaults(func=cmd_generate)
