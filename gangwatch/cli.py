"""The `gangwatch` command line.

Each subcommand is a small function over the packages; `gangwatch SUBCOMMAND --help`
explains it. Every option can also come from an environment variable named
GANGWATCH_<OPTION> (e.g. GANGWATCH_STORE), shown in the help.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gangwatch import __version__


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"GANGWATCH_{name.upper()}", default)


# --- replay --------------------------------------------------------------------


def cmd_replay(args: argparse.Namespace) -> int:
    from gangwatch.sinks.store import open_store
    from gangwatch.streams import replay

    missing = [p for p in args.files if not p.exists()]
    if missing:
        print(f"gangwatch replay: no such file: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    out = args.out
    extra = []
    if args.publish:
        from gangwatch.sinks.kafka import KafkaSink
        from gangwatch.streams.topics import TopicSettings

        t = TopicSettings.from_env()
        extra.append(KafkaSink(args.publish, findings_topic=t.findings, actions_topic=t.actions,
                               incidents_topic=t.incidents, dlq_topic=t.dlq))
    if args.webhook:
        from gangwatch.sinks.controller import WebhookSink

        extra.append(WebhookSink(args.webhook))
    store = None if args.no_store else open_store(args.store or f"chdb:{out / 'store'}")
    try:
        summary = replay.run(args.files, out, store, telemetry=args.telemetry, progress=args.progress, sinks=extra)
    finally:
        if store is not None:
            store.close()
    if not args.quiet:
        print(summary.render())
    return 0


# --- schema --------------------------------------------------------------------


def cmd_schema_export(args: argparse.Namespace) -> int:
    from gangwatch.schemas.jsonschema import export

    paths = export(args.dir)
    print(f"wrote {len(paths)} JSON Schema files to {args.dir}")
    return 0


# --- ingest --------------------------------------------------------------------


def cmd_ingest(args: argparse.Namespace) -> int:
    import orjson

    from gangwatch.producers.dumps import flight_records, kmsg_records, pyspy_records

    try:
        if args.format == "kmsg":
            if not args.path.is_file():
                raise ValueError(f"not a file: {args.path}")
            gpu_of = dict(_pci_gpu(x) for x in args.gpu_of or ())
            recs = kmsg_records(args.path, node=args.node, ts=args.ts, gpu_of=gpu_of, job=args.job,
                                gpus_per_node=args.gpus_per_node)
        else:
            if not args.path.is_dir():
                raise ValueError(f"not a directory: {args.path}")
            make = pyspy_records if args.format == "pyspy" else flight_records
            recs = make(args.path, job=args.job or "job", gpus_per_node=args.gpus_per_node, ts=args.ts)
    except ValueError as e:
        print(f"gangwatch ingest: {e}", file=sys.stderr)
        return 2
    data = b"".join(orjson.dumps(r) + b"\n" for r in recs)
    if args.out is None:
        sys.stdout.buffer.write(data)
    else:
        args.out.write_bytes(data)
        print(f"wrote {len(recs)} records to {args.out}", file=sys.stderr)
    return 0


def _pci_gpu(spec: str) -> tuple[str, int]:
    pci, sep, gpu = spec.rpartition("=")
    if not sep or not gpu.isdigit():
        raise ValueError(f"--gpu-of wants PCI=GPU (e.g. 0000:3b:00=2), got {spec!r}")
    return pci, int(gpu)


# --- simulate / eval / demo ----------------------------------------------------------


def _suite(name: str, size: str) -> list:
    from gangwatch.producers.simulate import standard_suite

    if name != "standard":
        raise SystemExit(f"gangwatch: unknown suite {name!r} (known: standard)")
    return standard_suite(size)


def cmd_simulate(args: argparse.Namespace) -> int:
    from gangwatch.producers.simulate import Fault, Scenario, write

    if args.suite:
        scenarios = _suite(args.suite, args.size)
        if args.only:
            scenarios = [s for s in scenarios if any(o in s.name for o in args.only)]
    else:
        faults = []
        for spec in args.fault or ():
            try:
                kind, at_s, where, *mag = spec.split(":")
                faults.append(Fault(kind, float(at_s), **({"rank": int(where[1:])} if where.startswith("r")
                                                           else {"node": where}),
                                    magnitude=float(mag[0]) if mag else 0.0))
            except ValueError as e:
                raise SystemExit(f"gangwatch simulate: bad --fault {spec!r}: {e}") from None
        scenarios = [Scenario(args.name, args.seed, args.tp, args.pp, args.dp, gpus_per_node=args.gpus_per_node,
                              duration_s=args.duration, faults=tuple(faults), batch=args.batch)]
    for sc in scenarios:
        stream, truth = write(sc, args.out)
        print(f"{stream}  ({sc.tp * sc.pp * sc.dp} ranks, {sc.duration_s:.0f} s)  truth: {truth.name}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from gangwatch import evaluate

    scenarios = _suite(args.suite, args.size)
    if args.only:
        scenarios = [s for s in scenarios if any(o in s.name for o in args.only)]
    show = (lambda s: print(f"  {s.scenario}: {'ok' if s.ok else 'NOT ok'} ({s.records:,} records, "
                            f"{s.replay_s:.1f} s)", file=sys.stderr, flush=True)) if not args.quiet else None
    scores = evaluate.evaluate(scenarios, args.work, progress=show)
    print(evaluate.render(scores))
    if args.json:
        args.json.write_bytes(evaluate.to_json(scores))
        print(f"scores written to {args.json}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gangwatch.producers.simulate import Fault, Scenario, write
    from gangwatch.streams import replay

    sc = Scenario("demo", seed=7, tp=8, pp=2, dp=4, duration_s=240.0, faults=(
        Fault("thermal_straggler", at_s=40.0, rank=21, magnitude=0.12),
        Fault("xid79", at_s=150.0, node="n005", params={"gpu": 3}),
    ))
    out = args.out
    stream, truth = write(sc, out)
    print(f"simulated {sc.tp * sc.pp * sc.dp} ranks on {sc.pp * sc.dp} nodes for {sc.duration_s:.0f} s: "
          f"a thermal straggler (rank 21, +12%) at 40 s, then Xid 79 on n005 gpu 3 at 150 s -> {stream}")
    from gangwatch.sinks.store import open_store

    store = None if args.no_store else open_store(f"chdb:{out / 'store'}")
    summary = replay.run([stream], out, store, progress=None)
    print(summary.render())
    import orjson

    print("\nactions:")
    for line in (out / "actions.jsonl").read_bytes().splitlines():
        a = orjson.loads(line)
        print(f"  {a['type']:<16} {','.join(a['nodes']) or '-':<8} {a.get('path') or '':<9} {a['reason'][:90]}")
    latest: dict[str, dict] = {}
    for line in (out / "incidents.jsonl").read_bytes().splitlines():
        inc = orjson.loads(line)
        latest[inc["id"]] = inc
    print("\nincidents:")
    for inc in latest.values():
        stages = ", ".join(f"{k} {v:.0f}s" for k, v in inc["stage_s"].items())
        culprits = ",".join(inc["culprit_nodes"]) or "-"
        print(f"  {inc['class']:<10} culprit {culprits:<8} path {inc.get('path') or '-':<9} {stages}")
    if store is not None:
        print(f"\nSQL: the store at {out / 'store'} has gw_findings, gw_actions, gw_incidents "
              "(chDB; e.g. SELECT class, culprit_nodes, stage_names, stage_seconds FROM gw_incidents FINAL)")
    return 0


# --- worker / topics -------------------------------------------------------------


def _topic_settings(args: argparse.Namespace):
    from gangwatch.streams.topics import TopicSettings

    return TopicSettings.from_env(prefix=args.prefix, partitions=args.partitions, replication=args.replication)


def cmd_worker(args: argparse.Namespace) -> int:
    from gangwatch.streams import worker

    settings = worker.WorkerSettings(
        bootstrap=args.bootstrap, app_id=args.app_id, topics=_topic_settings(args), store=args.store,
        webhook=args.webhook,
        telemetry=args.telemetry, batch_max=args.batch_max, batch_within_s=args.batch_within, tick_s=args.tick,
        silence=args.silence, lateness_s=args.lateness, hold_s=args.hold, table_store=args.table_store,
        datadir=args.datadir, session_timeout_s=args.session_timeout, heartbeat_interval_s=args.heartbeat_interval,
        request_timeout_s=(max(args.session_timeout + 10, 40.0) if args.request_timeout is None
                           else args.request_timeout),
        commit_interval_s=args.commit_interval, standby_replicas=args.standby_replicas,
        offset_reset=args.offset_reset, web=args.web_port is not None, web_port=args.web_port or 6066,
        fetch_wait_ms=args.fetch_wait, stats_every_s=args.stats_every,
    )
    worker.run(settings, loglevel=args.loglevel, create=args.create_topics)
    return 0


def cmd_topics_create(args: argparse.Namespace) -> int:
    from gangwatch.streams.topics import create_topics

    s = _topic_settings(args)
    made = create_topics(s, args.bootstrap)
    print(f"created {len(made)} topics" + "".join(f"\n  {t}" for t in made) if made else
          f"all {len(s.all())} topics exist ({s.prefix}*, {s.partitions} partitions)")
    return 0


def cmd_topics_list(args: argparse.Namespace) -> int:
    from gangwatch.streams.topics import list_topics

    for name, n in list_topics(args.bootstrap, args.prefix or _env("topic_prefix", "gw.")).items():
        print(f"{name:<40} {n} partitions")
    return 0


def _kafka_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", default=_env("bootstrap", "127.0.0.1:9092"),
                   help="Kafka bootstrap servers, comma-separated (env GANGWATCH_BOOTSTRAP; default 127.0.0.1:9092)")
    p.add_argument("--prefix", default=None,
                   help="topic name prefix (env GANGWATCH_TOPIC_PREFIX; default gw.)")
    p.add_argument("--partitions", type=int, default=None,
                   help="partitions of every topic; all job-keyed inputs must agree (env GANGWATCH_TOPIC_PARTITIONS; "
                   "default 8)")
    p.add_argument("--replication", type=int, default=None,
                   help="replication factor of new topics (env GANGWATCH_TOPIC_REPLICATION; default 1)")


# --- parser --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gangwatch",
        description="Watch large GPU training jobs as a stream: what broke, where, and what to do.",
        epilog="Start with `gangwatch demo`. Docs: README.md; the wire format: `gangwatch schema export DIR`.",
    )
    p.add_argument("--version", action="version", version=f"gangwatch {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser("replay", help="replay JSONL(.gz) telemetry files through the detectors and triage",
                       description="Decode the files (batches unpacked), merge them by event time, run the "
                       "detectors and triage, and write findings/actions/incidents as JSONL plus the embedded "
                       "chDB store. Bad lines go to rejected.jsonl with the reason.")
    r.add_argument("files", nargs="+", type=Path, metavar="FILE", help="JSONL or JSONL.gz files of contract-v1 records")
    r.add_argument("--out", type=Path, default=Path(_env("out", "gangwatch-out")),
                   help="output directory (env GANGWATCH_OUT; default: ./gangwatch-out)")
    r.add_argument("--store", default=_env("store"),
                   help="where rows go: chdb:PATH (embedded, default OUT/store) or clickhouse://HOST:PORT[/DB] "
                   "(env GANGWATCH_STORE)")
    r.add_argument("--no-store", action="store_true", help="write JSONL only")
    r.add_argument("--telemetry", action="store_true", help="also store every raw input record (gw_telemetry)")
    r.add_argument("--publish", metavar="BOOTSTRAP", default=_env("publish"),
                   help="also publish findings, actions (the alert topic), incidents and rejects to Kafka "
                   "(topic names as `gangwatch topics list`; env GANGWATCH_PUBLISH)")
    r.add_argument("--webhook", default=_env("webhook"),
                   help="also POST every action to this job-controller URL, signed with GANGWATCH_WEBHOOK_SECRET")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar (default: on when stderr is a terminal)")
    r.add_argument("-q", "--quiet", action="store_true", help="no summary")
    r.set_defaults(func=cmd_replay)

    g = sub.add_parser("ingest", help="turn per-rank dumps or a node's kernel log into replayable records",
                       description="pyspy / flight: read a folder with one file per rank (`*rank<N>*.txt` py-spy "
                       "dumps or `*rank<N>*.pkl` PyTorch flight-recorder pickles, loaded without executing code) "
                       "and write a `job` record and one `stack`/`flight` record per rank, all in one snapshot. "
                       "kmsg: read one node's kernel log (dmesg text) and write an `hw` record per GPU, ECC, NIC, "
                       "PCIe or NVLink event (multi-line firmware dumps fold into their Xid).",
                       epilog="examples: gangwatch ingest pyspy tests/data/pyspy/dataloader-hang-8ranks "
                       "--out sweep.jsonl && gangwatch replay sweep.jsonl --out out/ ; "
                       "gangwatch ingest kmsg /var/log/dmesg.txt --node n003 --gpu-of 0000:3b:00=2 --out hw.jsonl")
    g.add_argument("format", choices=["pyspy", "flight", "kmsg"], help="what PATH holds")
    g.add_argument("path", type=Path, metavar="PATH", help="a folder of per-rank dumps, or a kernel log file")
    g.add_argument("--out", type=Path, help="JSONL file to write (default: stdout)")
    g.add_argument("--job", help="job id (pyspy/flight: default `job`; kmsg: also write a job record on --node)")
    g.add_argument("--gpus-per-node", type=int, default=1,
                   help="ranks per node when placing ranks on nodes n000, n001, ... (default 1: one node per rank)")
    g.add_argument("--node", default="n000", help="kmsg: the node the log comes from (default n000)")
    g.add_argument("--gpu-of", action="append", metavar="PCI=GPU",
                   help="kmsg: map a PCI bus id as the log prints it to a GPU index; repeatable")
    g.add_argument("--ts", type=float, default=1_700_000_000.0, help="event time of the sweep (fixed by default)")
    g.set_defaults(func=cmd_ingest)

    m = sub.add_parser("simulate", help="generate contract-v1 telemetry of a training job with injected faults",
                       description="Deterministic (by seed) telemetry of a synchronous training job: steps, "
                       "heartbeats, NVML samples, kernel-log lines, stack/flight sweeps after stalls, NCCL-timeout "
                       "storms; writes NAME.jsonl.gz and NAME.truth.json (the ground truth).",
                       epilog="fault kinds: xid79, node_loss, thermal_straggler, nic_degradation, "
                       "intermittent_straggler, dataloader_hang, pp_deadlock, sdc, planned_maintenance. "
                       "example: gangwatch simulate --dp 8 --fault thermal_straggler:60:r21:0.1 --out sim/")
    m.add_argument("--out", type=Path, default=Path("sim"), help="output folder (default ./sim)")
    m.add_argument("--suite", help="write a whole scenario suite instead (standard)")
    m.add_argument("--size", choices=["ci", "full"], default="full", help="suite size (default full)")
    m.add_argument("--only", nargs="*", help="with --suite: only scenarios whose name contains one of these")
    m.add_argument("--name", default="sim")
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--tp", type=int, default=8)
    m.add_argument("--pp", type=int, default=2)
    m.add_argument("--dp", type=int, default=8)
    m.add_argument("--gpus-per-node", type=int, default=8)
    m.add_argument("--duration", type=float, default=300.0, help="seconds of event time (default 300)")
    m.add_argument("--batch", action="store_true", help="pack each node's step records into batch messages")
    m.add_argument("--fault", action="append", metavar="KIND:AT_S:WHERE[:MAGNITUDE]",
                   help="inject a fault; WHERE is a node (n003) or a rank (r21); repeatable")
    m.set_defaults(func=cmd_simulate)

    ev = sub.add_parser("eval", help="replay a scenario suite and score it against the ground truth",
                        description="Generate each scenario, replay it, and score detection and localization "
                        "latency, recall, eviction precision, innocent nodes evicted per culprit and false "
                        "evictions on healthy and planned runs. Prints a table.")
    ev.add_argument("--suite", default="standard", help="scenario suite (default: standard)")
    ev.add_argument("--size", choices=["ci", "full"], default=_env("eval_size", "full"),
                    help="ci: a quarter of the ranks, fits the CI budget; full: 128-2,048 ranks "
                    "(env GANGWATCH_EVAL_SIZE; default full)")
    ev.add_argument("--only", nargs="*", help="only scenarios whose name contains one of these")
    ev.add_argument("--json", type=Path, help="also write the scores as JSON here")
    ev.add_argument("--work", type=Path, help="keep generated streams and outputs here (default: a temp dir)")
    ev.add_argument("-q", "--quiet", action="store_true", help="no per-scenario progress lines")
    ev.set_defaults(func=cmd_eval)

    d = sub.add_parser("demo", help="simulate a small job with two faults and replay it (no server needed)",
                       description="The quickest look at gangwatch: 64 simulated ranks, a thermal straggler and "
                       "then an Xid 79, replayed through the detectors and triage into the embedded chDB store.")
    d.add_argument("--out", type=Path, default=Path("gangwatch-demo"), help="output folder (default ./gangwatch-demo)")
    d.add_argument("--no-store", action="store_true", help="JSONL only, no chDB store")
    d.set_defaults(func=cmd_demo)

    s = sub.add_parser("schema", help="the wire contract: export JSON Schema files")
    ssub = s.add_subparsers(dest="schema_command", metavar="ACTION", required=True)
    e = ssub.add_parser("export", help="write one JSON Schema file per record kind into DIR")
    e.add_argument("dir", type=Path, metavar="DIR")
    e.set_defaults(func=cmd_schema_export)

    w = sub.add_parser("worker", help="run the detectors and triage on Kafka (a Faust worker; run one per machine)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Consume the gangwatch input topics, run the detectors and triage per job on event "
                       "time, and publish findings, actions (the alert topic) and incidents keyed by job; bad "
                       "messages go to the DLQ topic with the reason, topic, partition and offset. Start several "
                       "workers with the same --app-id to share the partitions; a worker that dies is replaced "
                       "with its jobs' state (Faust tables backed by changelog topics). Stop with Ctrl-C / TERM.",
                       epilog="topics (prefix gw. by default): inputs telemetry (step, heartbeat, framework; key job), "
                       "jobs (job), node-events (hw, gpu; key node), traces (stack, flight), ops (ops, recovery); "
                       "outputs findings, actions, incidents, dlq. They are created if missing.\n"
                       "example: gangwatch worker --bootstrap kafka1:9092 --store clickhouse://ch1:9000/gangwatch")
    _kafka_args(w)
    w.add_argument("--app-id", default=_env("app_id", "gangwatch"),
                   help="Faust app id = consumer group and table changelog prefix (env GANGWATCH_APP_ID; "
                   "default gangwatch)")
    w.add_argument("--store", default=_env("store"),
                   help="also write outputs to chdb:PATH or clickhouse://HOST:PORT[/DB] (env GANGWATCH_STORE; "
                   "default: Kafka topics only)")
    w.add_argument("--telemetry", action="store_true", help="with --store: also store every raw input record")
    w.add_argument("--webhook", default=_env("webhook"),
                   help="job-controller URL: every action is POSTed there, signed with HMAC-SHA256 of the body "
                   "(X-Gangwatch-Signature) using the secret in GANGWATCH_WEBHOOK_SECRET (env GANGWATCH_WEBHOOK)")
    w.add_argument("--batch-max", type=int, default=int(_env("batch_max", "20000")),
                   help="messages per batch (env GANGWATCH_BATCH_MAX; default 20000)")
    w.add_argument("--batch-within", type=float, default=float(_env("batch_within", "0.1")),
                   help="seconds to wait filling a batch (env GANGWATCH_BATCH_WITHIN; default 0.1)")
    w.add_argument("--tick", type=float, default=float(_env("tick", "0.5")),
                   help="silence timer period, seconds (env GANGWATCH_TICK; default 0.5)")
    w.add_argument("--silence", action=argparse.BooleanOptionalAction, default=_env("silence", "1") != "0",
                   help="advance event time through wall-clock silence, so missed heartbeats fire when nothing "
                   "arrives (env GANGWATCH_SILENCE=0 turns it off; --no-silence makes the worker behave like replay: "
                   "no input, no time)")
    w.add_argument("--lateness", type=float, default=float(_env("lateness", "1.0")),
                   help="seconds behind the newest event time that timeouts are evaluated (env GANGWATCH_LATENESS; "
                   "default 1.0)")
    w.add_argument("--hold", type=float, default=float(_env("hold", "30")),
                   help="seconds a record waits for its job record, a node event for its job (env GANGWATCH_HOLD; "
                   "default 30)")
    w.add_argument("--table-store", default=_env("table_store", "memory://"),
                   help="Faust table store: memory:// (rebuilt from the changelog at start) or rocksdb:// "
                   "(env GANGWATCH_TABLE_STORE; default memory://)")
    w.add_argument("--datadir", default=_env("datadir"),
                   help="Faust data directory, one per worker (env GANGWATCH_DATADIR; default in the temp dir)")
    w.add_argument("--session-timeout", type=float, default=float(_env("session_timeout", "30")),
                   help="Kafka consumer session timeout, seconds (env GANGWATCH_SESSION_TIMEOUT; default 30)")
    w.add_argument("--heartbeat-interval", type=float, default=float(_env("heartbeat_interval", "3")),
                   help="Kafka consumer heartbeat interval, seconds (env GANGWATCH_HEARTBEAT_INTERVAL; default 3)")
    w.add_argument("--request-timeout", type=float, default=None,
                   help="Kafka request timeout, seconds; at least the session timeout (default: session + 10, >= 40)")
    w.add_argument("--commit-interval", type=float, default=float(_env("commit_interval", "2.8")),
                   help="seconds between offset commits (env GANGWATCH_COMMIT_INTERVAL; default 2.8)")
    w.add_argument("--standby-replicas", type=int, default=int(_env("standby_replicas", "1")),
                   help="table standby replicas kept warm on other workers (env GANGWATCH_STANDBY_REPLICAS; default 1)")
    w.add_argument("--offset-reset", choices=("earliest", "latest"), default=_env("offset_reset", "earliest"),
                   help="where a new consumer group starts (env GANGWATCH_OFFSET_RESET; default earliest)")
    w.add_argument("--fetch-wait", type=int, default=int(_env("fetch_wait", "50")),
                   help="ms the broker may hold a fetch that finds no data (env GANGWATCH_FETCH_WAIT; default 50; "
                   "Faust's own 1500 starves a busy partition)")
    w.add_argument("--stats-every", type=float, default=float(_env("stats_every", "10")),
                   help="seconds between progress lines in the log; 0: none (env GANGWATCH_STATS_EVERY; default 10)")
    w.add_argument("--web-port", type=int, default=None, help="serve Faust's web views on this port (default: off)")
    w.add_argument("--no-create-topics", dest="create_topics", action="store_false",
                   help="do not create missing topics at start")
    w.add_argument("-l", "--loglevel", default=_env("loglevel", "info"),
                   choices=("debug", "info", "warning", "error"),
                   help="log level (env GANGWATCH_LOGLEVEL; default info)")
    w.set_defaults(func=cmd_worker)

    t = sub.add_parser("topics", help="create or list the Kafka topics gangwatch uses")
    tsub = t.add_subparsers(dest="topics_command", metavar="ACTION", required=True)
    tc = tsub.add_parser("create", help="create every missing gangwatch topic (existing topics are left alone)")
    _kafka_args(tc)
    tc.set_defaults(func=cmd_topics_create)
    tl = tsub.add_parser("list", help="list the topics with the prefix and their partition counts")
    _kafka_args(tl)
    tl.set_defaults(func=cmd_topics_list)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
