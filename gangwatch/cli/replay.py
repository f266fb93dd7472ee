"""`gangwatch replay` and `gangwatch store query`: files through the core, and SQL over what it stored."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import orjson

from gangwatch.cli import console
from gangwatch.cli.options import (
    EXIT_CORRUPT,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    UserError,
    iso,
    number,
    opt,
    positive,
    settings_opts,
)
from gangwatch.cli.services import check_store_url, wait_for_kafka, wait_for_store


def check_inputs(files: list[Path]) -> None:
    for p in files:
        if not p.exists():
            raise UserError(f"no such file: {p}", EXIT_INPUT)
        if p.is_dir():
            raise UserError(f"{p} is a directory; give JSONL or JSONL.gz files (`gangwatch ingest` turns a "
                            "folder of dumps into one)", EXIT_INPUT)


def http_url(raw: str) -> str:
    """An http(s)://HOST[:PORT][/path] option value (e.g. --alertmanager)."""
    from urllib.parse import urlsplit

    if urlsplit(raw).scheme not in ("http", "https") or not urlsplit(raw).hostname:
        raise ValueError("want http(s)://HOST[:PORT]")
    return raw


def prepare_out(out: Path, *, append: bool) -> None:
    """`out` is a directory we may write; a rerun replaces the previous outputs (store included) unless
    `append`."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory", EXIT_INPUT)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".gangwatch-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UserError(f"cannot write to --out {out}: {e.strerror or e}", EXIT_INPUT) from None
    if not append and (out / "store").is_dir():
        shutil.rmtree(out / "store")
    if not append:
        (out / PARTIAL).unlink(missing_ok=True)  # the outputs are about to be replaced by a whole replay


def open_store_for(args: argparse.Namespace, out: Path):
    """The store the outputs also go to, or None."""
    if args.no_store:
        return None
    from gangwatch.sinks.store import open_store

    url = args.store or f"chdb:{out / 'store'}"
    wait_for_store(url, args.connect_timeout)
    return open_store(url)


def cmd_replay(args: argparse.Namespace) -> int:
    from gangwatch.streams import replay
    from gangwatch.triage.core import Core

    st = args.settings  # detectors' thresholds, triage, topics and sinks: flags > GANGWATCH_* > --config > defaults
    check_inputs(args.files)
    if args.store and not args.no_store:
        check_store_url(args.store)  # a mistyped URL writes nothing, not even --out
    out = args.out
    prepare_out(out, append=args.append)
    extra = []
    if args.publish:
        from gangwatch.schemas.signature import SECRET_ENV, TopicSigner
        from gangwatch.sinks.kafka import KafkaSink

        wait_for_kafka(args.publish, args.connect_timeout)
        t = st.topic_settings()
        secret = st.get("sinks.webhook_secret")
        if not secret:
            print(f"note: actions published on {t.actions} are not signed (no {SECRET_ENV}): the controller and the "
                  "fencing adapters refuse them", file=sys.stderr)
        extra.append(KafkaSink(args.publish, findings_topic=t.findings, actions_topic=t.actions,
                               incidents_topic=t.incidents, dlq_topic=t.dlq,
                               signer=TopicSigner(secret) if secret else None))
    if args.webhook:
        from gangwatch.sinks.webhook import WebhookSink

        extra.append(WebhookSink(args.webhook, st.get("sinks.webhook_secret")))
    if args.alertmanager:
        from gangwatch.sinks.alertmanager import AlertmanagerSink

        extra.append(AlertmanagerSink(args.alertmanager))
    responder = simulated_controller(args.simulate_controller) if args.simulate_controller else None
    store = open_store_for(args, out)
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    progress = console.ProgressLine() if show and not args.quiet else None
    try:
        summary = replay.run(args.files, out, store, telemetry=args.telemetry, progress=progress, sinks=extra,
                             append=args.append, core=Core(st.core_config()), responder=responder)
    finally:
        if progress is not None:
            progress.done()
        if store is not None:
            store.close()
    if summary.interrupted is not None:
        partial(out, summary, quiet=args.quiet)
    if not args.quiet:
        print(console.summary(summary))
        shown = console.outcome(out)
        if shown:
            print(shown)
        why = summary.why_nothing()
        if why:
            print(console.wrapped(f"nothing found: {why}", 0))
    if summary.stopped:
        raise UserError("; ".join(summary.stopped) + " (everything before it was replayed and stored)",
                        EXIT_CORRUPT)
    refuse_unusable(summary.invalid, summary.empty, f"the reasons are in {out / 'rejected.jsonl'}")
    return 0


PARTIAL = "PARTIAL"  # a file in --out whose presence says the outputs there are partial (the replay was stopped)


def partial(out: Path, summary, *, quiet: bool) -> None:
    """After Ctrl-C: mark `out` partial (`OUT/PARTIAL`, what was read and up to when), print the summary so far
    (unless `quiet`), and end with one line saying so (exit 130, as for any interrupted command)."""
    upto = iso(summary.last_ts) if summary.last_ts is not None else "no event"
    what = f"{summary.records:,} records ({summary.interrupted:.0%} of the input) read, up to event time {upto}"
    (out / PARTIAL).write_text(f"partial: the replay was interrupted (Ctrl-C) after {what}.\nThe outputs here "
                               "hold what was found up to then; incidents still open then were never decided.\n"
                               "Replay again (without --append) for complete outputs.\n")
    if not quiet:
        print(console.summary(summary))
    raise UserError(f"interrupted (Ctrl-C) after {summary.records:,} records ({summary.interrupted:.0%} of the "
                    f"input), up to event time {upto}: the outputs in {out} are partial (marked by "
                    f"{out / PARTIAL})", EXIT_INTERRUPTED)


def refuse_unusable(invalid: list[str], empty: list[str], reasons: str) -> None:
    """UserError (bad input) naming the inputs without one valid record: those whose lines did not decode
    (`reasons` says where the reasons went) and those without a line."""
    said = []
    if invalid:
        said.append(f"no line of {', '.join(invalid)} is a contract-v1 record (JSONL or JSONL.gz); {reasons}")
    if empty:
        said.append(f"{', '.join(empty)} {'is' if len(empty) == 1 else 'are'} empty: not one record")
    if said:
        raise UserError("; ".join(said), EXIT_INPUT)


def cmd_store_query(args: argparse.Namespace) -> int:
    print_rows(query_store(args, args.sql), args.format)
    return 0


def query_store(args: argparse.Namespace, sql: str) -> list[dict]:
    """Run `sql` on the store of `--store`, else of `--out` (a replay's `store/`); only reads: a store that is not
    there is a one-line error, never created, and the store is opened read-only (the engine's `readonly`
    setting: a write, DDL or setting change is refused); the store's own SQL error is one line too."""
    if args.store is None:
        path = args.out / "store"
        if not path.is_dir():
            raise UserError(f"no store at {path}: replay something first, or pass --store", EXIT_INPUT)
        args.store = f"chdb:{path}"
    from gangwatch.sinks.store import READONLY_CODE, NoSuchStore, error_line, open_store

    wait_for_store(args.store, args.connect_timeout)
    try:
        store = open_store(args.store, create=False, readonly=True)  # a query creates and changes nothing
    except NoSuchStore as e:
        raise UserError(str(e), EXIT_INPUT) from None
    try:
        return store.query(sql)
    except Exception as e:  # the store's own SQL error: its message says what is wrong
        line = error_line(e)
        if getattr(e, "code", None) == READONLY_CODE or f"Code: {READONLY_CODE}." in line:
            raise UserError(f"refused: queries here only read (the store is opened read-only), so nothing was "
                            f"changed ({line})") from None
        raise UserError(f"the query failed: {line}") from None
    finally:
        store.close()


def print_rows(rows: list[dict], fmt: str) -> None:
    """`table` (aligned columns and a row count), `jsonl` (one object a line), `json` (one array), `csv`."""
    import orjson

    if fmt == "jsonl":
        for r in rows:
            sys.stdout.buffer.write(orjson.dumps(r) + b"\n")
        return
    if fmt == "json":
        sys.stdout.buffer.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2) + b"\n")
        return
    if fmt == "csv":
        import csv

        writer = csv.writer(sys.stdout, lineterminator="\n")
        if rows:
            writer.writerow(list(rows[0]))
        for r in rows:
            writer.writerow([orjson.dumps(v).decode() if isinstance(v, list | dict) else _cell(v) for v in r.values()])
        return
    if not rows:
        print("(no rows)")
        return
    cols = list(rows[0])
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)))
    from gangwatch.report.text import counted

    print(f"({counted(len(rows), 'row')})")


SHADOW_SQL = """SELECT job, type, count() AS would, countIf(verdict = 'true') AS right,
    countIf(verdict = 'false') AS wrong, countIf(verdict = '') AS unscored,
    if(right + wrong > 0, round(right / (right + wrong), 3), NULL) AS precision
FROM gw_actions FINAL WHERE shadow = 1{where} GROUP BY job, type ORDER BY job, type"""


def cmd_store_shadow(args: argparse.Namespace) -> int:
    """Shadow mode's score: per job and action type, how many would-be actions were right."""
    if args.job is not None and not args.job.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise UserError(f"--job {args.job!r}: a job id of letters, digits, '-', '_' and '.'")
    rows = query_store(args, SHADOW_SQL.format(where=f" AND job = '{args.job}'" if args.job else ""))
    if rows or args.format != "table":
        print_rows(rows, args.format)
        return 0
    [seen] = query_store(args, "SELECT countIf(shadow = 1) AS would, countIf(shadow = 0) AS sent, "
                         "uniqExactIf(job, shadow = 1) AS jobs FROM gw_actions FINAL")
    if seen["would"]:
        why = f"job {args.job!r} has no would-be actions (shadow mode recorded {seen['would']} for {seen['jobs']} " \
              "other jobs)"
    else:
        why = (f"shadow mode was off: no would-be action is stored ({seen['sent']} actions were taken for real); "
               "turn it on with --set triage.shadow=true, or an ops record of type 'shadow' for one job")
    print(f"(no rows: {why})")
    return 0


def _cell(v: object) -> str:
    return "" if v is None else str(v)  # a float in full (repr's shortest exact form): 1767225600.225973


def simulated_controller(spec: str):
    """`--simulate-controller`: a scenario's ground truth (a .json file) or the faulty nodes, comma-separated."""
    from gangwatch.producers.simulate.responder import SimulatedController, answers

    if spec.endswith(".json"):
        path = Path(spec)
        try:
            truth = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError as e:
            raise UserError(f"--simulate-controller {spec}: not JSON ({e}); want a scenario's NAME.truth.json",
                            EXIT_INPUT) from None
        if not isinstance(truth, dict) or "faults" not in truth:
            raise UserError(f"--simulate-controller {spec}: no `faults` in it; want the NAME.truth.json "
                            "`gangwatch simulate` writes beside NAME.jsonl.gz", EXIT_INPUT)
        controller = SimulatedController.of_truth(truth)
    else:
        nodes = frozenset(n.strip() for n in spec.split(",") if n.strip())
        if not nodes:
            raise UserError("--simulate-controller: name the faulty nodes (n003,n007) or a truth file", EXIT_USAGE)
        controller = SimulatedController(faulty=nodes, corrupting=nodes)
    return lambda actions: answers(controller, actions)


def connect_timeout_opt(p: argparse.ArgumentParser) -> None:
    opt(p, "--connect-timeout", type=positive(number), default=15.0,
        help="seconds to wait for an unreachable Kafka or ClickHouse before giving up")


def register(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("replay", help="replay JSONL(.gz) telemetry files through the detectors and triage",
                       description="Decode the files (batches unpacked), merge them by event time, run the "
                       "detectors and triage, and write findings/actions/incidents as JSONL plus the embedded "
                       "chDB store. Bad lines go to rejected.jsonl with the reason. A rerun into the same --out "
                       "replaces its outputs (store included) unless --append. Detector thresholds and triage "
                       "settings come from --set, GANGWATCH_* variables and --config (`gangwatch config show`).",
                       epilog="example: gangwatch replay run.jsonl.gz --out out/ && "
                       "gangwatch store query 'SELECT type, count() FROM gw_findings GROUP BY type' --out out/")
    r.add_argument("files", nargs="+", type=Path, metavar="FILE", help="JSONL or JSONL.gz files of contract-v1 records")
    opt(r, "--out", type=Path, default=Path("gangwatch-out"), help="output directory")
    opt(r, "--store", setting="sinks.store", shown_default="chdb:OUT/store",
        help="where rows go: chdb:PATH (embedded, default OUT/store) or clickhouse://HOST:PORT[/DB]")
    r.add_argument("--no-store", action="store_true", help="write JSONL only")
    r.add_argument("--append", action="store_true", help="add to the outputs already in --out instead of replacing")
    opt(r, "--telemetry", type=bool, setting="sinks.telemetry",
        help="also store every raw input record (gw_telemetry)")
    opt(r, "--publish", metavar="BOOTSTRAP", help="also publish findings, actions (the alert topic), incidents and "
        "rejects to this Kafka (topic names as `gangwatch topics list`)")
    opt(r, "--webhook", setting="sinks.webhook", help="also POST every action to this job-controller URL, signed "
        "with sinks.webhook_secret (GANGWATCH_WEBHOOK_SECRET)")
    opt(r, "--alertmanager", metavar="URL", type=http_url, setting="sinks.alertmanager",
        help="also push incidents as alerts to this Alertmanager (http://HOST:9093; its v2 API)")
    opt(r, "--simulate-controller", metavar="TRUTH|NODES",
        help="answer the actions as a job controller would (recovery phases, replay results, dual-run digests), "
        "knowing the broken machines from a scenario's NAME.truth.json or from a list (n003,n007): the loop "
        "of active diagnosis in replay (producers/simulate/responder.py)")
    connect_timeout_opt(r)
    settings_opts(r)
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line with percentage and ETA (default: on when stderr is a terminal)")
    r.add_argument("-q", "--quiet", action="store_true", help="no summary")
    r.set_defaults(func=cmd_replay)

    s = sub.add_parser("store", help="query the store (embedded chDB or a ClickHouse server) with SQL")
    ssub = s.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    q = ssub.add_parser("query", help="run one SQL query and print the rows",
                        description="Run SQL on the store a replay wrote (--out DIR, default ./gangwatch-out) or "
                        "on a ClickHouse server (--store clickhouse://HOST:PORT/DB). Tables: gw_findings, "
                        "gw_actions, gw_incidents (use FINAL for the latest state), gw_jobs (each job's life), "
                        "gw_node_profiles, gw_rejected, gw_telemetry.",
                        epilog="example: gangwatch store query \"SELECT class, culprit_nodes, stage_names, "
                        "stage_seconds FROM gw_incidents FINAL\" --out gangwatch-demo")
    q.add_argument("sql", metavar="SQL", help="one ClickHouse SQL statement")
    opt(q, "--out", type=Path, default=Path("gangwatch-out"), help="a replay's output directory (its store/)")
    opt(q, "--store", help="chdb:PATH or clickhouse://HOST:PORT[/DB] instead of OUT/store")
    q.add_argument("--format", choices=("table", "jsonl"), default="table", help="output format (default table)")
    connect_timeout_opt(q)
    q.set_defaults(func=cmd_store_query)
    sh = ssub.add_parser("shadow", help="shadow mode's score: how many would-be actions were right, per job and type",
                         description="Under shadow mode (--set triage.shadow=true, or an ops record of type "
                         "'shadow' for one job) gangwatch records every action it would take and sends none, then "
                         "scores each would-be eviction and page: wrong when the node trained on clean or the job "
                         "recovered by itself (docs/settings.md, triage/shadow.py). This prints, per job and action "
                         "type, how many were recorded, right, wrong and not scored yet, and the precision "
                         "(right / scored): the figure to switch automation on by.",
                         epilog="example: gangwatch store shadow --store clickhouse://127.0.0.1:9000/gangwatch")
    opt(sh, "--job", help="only this job")
    opt(sh, "--out", type=Path, default=Path("gangwatch-out"), help="a replay's output directory (its store/)")
    opt(sh, "--store", help="chdb:PATH or clickhouse://HOST:PORT[/DB] instead of OUT/store")
    sh.add_argument("--format", choices=("table", "jsonl"), default="table", help="output format (default table)")
    connect_timeout_opt(sh)
    sh.set_defaults(func=cmd_store_shadow)
