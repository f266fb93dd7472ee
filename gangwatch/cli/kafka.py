"""`gangwatch worker`, `topics` and `publish`: the production path on Kafka."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gangwatch.cli import console
from gangwatch.cli.options import (
    EXIT_CORRUPT,
    EXIT_EXTRA,
    EXIT_SERVICE,
    UserError,
    at_least_zero,
    integer,
    iso,
    number,
    opt,
    port,
    positive,
    settings_opts,
)
from gangwatch.cli.replay import check_inputs, connect_timeout_opt, http_url, refuse_unusable
from gangwatch.cli.services import wait_for_kafka, wait_for_store


def _topic_settings(args: argparse.Namespace):
    from gangwatch.schemas.topics import TopicSettings

    return TopicSettings.from_env(prefix=args.prefix, partitions=args.partitions, replication=args.replication,
                                  app=getattr(args, "app_id", None))


def cmd_worker(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from gangwatch.producers.metrics import MetricsUnavailable
    from gangwatch.streams import worker
    from gangwatch.streams.faust_adapter import UntestedFramework, check_versions

    try:
        check_versions()  # the worker reaches into Faust's internals: only versions it was tested with
    except UntestedFramework as e:
        raise UserError(str(e), EXIT_EXTRA) from None

    st = args.settings  # every setting, from flags, GANGWATCH_* variables, --config and defaults
    settings = st.worker_settings()
    if st.source("worker.request_timeout_s") == "default":  # at least the session timeout, with room
        settings = replace(settings, request_timeout_s=max(settings.session_timeout_s + 10, 40.0))
    if st.source("worker.web_port") != "default":  # a port given turns the web views on
        settings = replace(settings, web=True)
    wait_for_kafka(settings.bootstrap, args.connect_timeout)
    if settings.store:
        wait_for_store(settings.store, args.connect_timeout)
    try:
        worker.run(settings, loglevel=args.loglevel, create=args.create_topics)
    except MetricsUnavailable as e:
        raise UserError(str(e)) from None  # names the port and --metrics-port
    return 0


def cmd_topics_create(args: argparse.Namespace) -> int:
    from gangwatch.streams.topic_admin import create_topics

    wait_for_kafka(args.bootstrap, args.connect_timeout)
    s = _topic_settings(args)
    made = create_topics(s, args.bootstrap)
    print(f"created {console.counted(len(made), 'topic')}" + "".join(f"\n  {t}" for t in made) if made else
          f"all {console.counted(len(s.all()), 'topic')} exist ({s.prefix}*, {s.partitions} partitions)")
    return 0


def cmd_topics_list(args: argparse.Namespace) -> int:
    from gangwatch.streams.topic_admin import list_topics

    wait_for_kafka(args.bootstrap, args.connect_timeout)
    for name, n in list_topics(args.bootstrap, _topic_settings(args).prefix).items():
        print(f"{name:<40} {n} partitions")
    return 0


def consumer_timeout_ms(timeout_s: float) -> float:
    """kafka-python's `consumer_timeout_ms` for `--timeout`: milliseconds, or infinity (its own default) for
    never (an int of an infinity cannot be made)."""
    return timeout_s * 1000 if math.isinf(timeout_s) else int(timeout_s * 1000)


def cmd_topics_tail(args: argparse.Namespace) -> int:
    """Print what arrives on a topic, one line per record, times in ISO 8601."""
    import orjson
    from kafka import KafkaConsumer

    from gangwatch.schemas.security import kafka_python_security

    wait_for_kafka(args.bootstrap, args.connect_timeout)
    topic = args.topic if "." in args.topic else _topic_settings(args).name(args.topic)
    consumer = KafkaConsumer(topic, bootstrap_servers=args.bootstrap, client_id="gangwatch-tail",
                             auto_offset_reset="earliest" if args.from_beginning else "latest",
                             enable_auto_commit=False, consumer_timeout_ms=consumer_timeout_ms(args.timeout),
                             **kafka_python_security())  # GANGWATCH_KAFKA_* SASL/SSL
    shown = 0
    try:
        for msg in consumer:
            if args.json:
                print(msg.value.decode(errors="replace"), flush=True)
            else:
                try:
                    obj = orjson.loads(msg.value)
                except orjson.JSONDecodeError:
                    obj = {"raw": msg.value[:200].decode(errors="replace")}
                print(console.one_line(obj), flush=True)
            shown += 1
            if args.max and shown >= args.max:
                break
    finally:
        consumer.close()
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from gangwatch.streams.file_publish import kafka_send, publish
    from gangwatch.streams.topic_admin import missing_topics

    check_inputs(args.files)
    wait_for_kafka(args.bootstrap, args.connect_timeout)
    topics = _topic_settings(args)
    missing = missing_topics(args.bootstrap, (*topics.inputs, topics.dlq), timeout_s=args.connect_timeout)
    if missing:
        raise UserError(f"{args.bootstrap} has no topic {missing[0]}"
                        + (f" (nor {len(missing) - 1} more of gangwatch's topics)" if len(missing) > 1 else "")
                        + f": create gangwatch's topics first: gangwatch topics create --bootstrap {args.bootstrap}"
                        + (f" --prefix {topics.prefix}" if topics.prefix != type(topics)().prefix else ""),
                        EXIT_SERVICE)
    send, close = kafka_send(args.bootstrap)
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    progress = console.ProgressLine("publishing") if show else None
    try:
        done = publish(args.files, send, _topic_settings(args), envelope=args.envelope, rate=args.rate,
                       speed=args.realtime, progress=progress)
    finally:
        if progress is not None:
            progress.done()
        close()
    rate = done.records / done.wall_s if done.wall_s > 0 else 0.0
    print(f"published {done.records:,} records in {done.messages:,} messages to {args.bootstrap} in "
          f"{done.wall_s:.1f} s ({rate:,.0f} records/s); event time {iso(done.first_ts)} .. {iso(done.last_ts)}")
    if done.rejected:
        print(f"{done.rejected:,} lines did not decode: sent to the dead-letter topic with the reason")
    if done.stopped:
        raise UserError("; ".join(done.stopped) + " (everything before it was published)", EXIT_CORRUPT)
    refuse_unusable(done.invalid or [], done.empty or [],
                    f"the reasons went to the dead-letter topic {_topic_settings(args).dlq}")
    return 0


def kafka_opts(p: argparse.ArgumentParser) -> None:
    opt(p, "--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers, comma-separated")
    opt(p, "--prefix", env="GANGWATCH_TOPIC_PREFIX", help="topic name prefix", shown_default="gw.")
    opt(p, "--partitions", type=positive(integer), env="GANGWATCH_TOPIC_PARTITIONS",
        help="partitions of every topic; all job-keyed inputs must agree", shown_default=8)
    opt(p, "--replication", type=positive(integer), env="GANGWATCH_TOPIC_REPLICATION",
        help="replication factor of new topics", shown_default=1)
    connect_timeout_opt(p)


def register(sub: argparse._SubParsersAction) -> None:
    w = sub.add_parser("worker", help="run the detectors and triage on Kafka (a Faust worker; run one per machine)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Consume the gangwatch input topics, run the detectors and triage per job on event "
                       "time, and publish findings, actions (the alert topic) and incidents keyed by job; bad "
                       "messages go to the DLQ topic with the reason, topic, partition and offset. Start several "
                       "workers with the same --app-id to share the partitions; a worker that dies is replaced "
                       "with its jobs' state (Faust tables backed by changelog topics). Stop with Ctrl-C / TERM. "
                       "Every setting, detector thresholds and triage budgets included, also comes from --set, "
                       "GANGWATCH_* variables and --config (`gangwatch config show` lists them).",
                       epilog="topics (prefix gw. by default): inputs telemetry (step, heartbeat, framework; key job), "
                       "jobs (job), node-events (hw, gpu; key node), traces (stack, flight), ops (ops, recovery); "
                       "outputs findings, actions, incidents, dlq. They are created if missing.\n"
                       "example: gangwatch worker --bootstrap kafka1:9092 --store clickhouse://ch1:9000/gangwatch")
    # every option of the worker is a flag of a setting (gangwatch.settings): defaults and variables are its
    opt(w, "--bootstrap", setting="worker.bootstrap", help="Kafka bootstrap servers, comma-separated")
    opt(w, "--prefix", setting="topics.prefix", help="topic name prefix")
    opt(w, "--partitions", type=positive(integer), setting="topics.partitions",
        help="partitions of every topic; all job-keyed inputs must agree")
    opt(w, "--replication", type=positive(integer), setting="topics.replication",
        help="replication factor of new topics")
    connect_timeout_opt(w)
    settings_opts(w)
    opt(w, "--app-id", setting="worker.app_id", help="Faust app id = consumer group, table changelog prefix and "
        "the name of its own re-keying topic (PREFIX<app id>.by-job)")
    opt(w, "--store", setting="sinks.store",
        help="also write outputs to chdb:PATH or clickhouse://HOST:PORT[/DB] (default: Kafka only)")
    opt(w, "--telemetry", type=bool, setting="sinks.telemetry", help="with --store: also store every raw input record")
    opt(w, "--webhook", setting="sinks.webhook", help="job-controller URL: every action is POSTed there, signed "
        "with HMAC-SHA256 (X-Gangwatch-Signature-V1) using the secret sinks.webhook_secret (GANGWATCH_WEBHOOK_SECRET)")
    opt(w, "--alertmanager", metavar="URL", type=http_url, setting="sinks.alertmanager",
        help="push incidents as alerts to this Alertmanager (http://HOST:9093)")
    opt(w, "--batch-max", type=positive(integer), setting="worker.batch_max", help="messages per batch")
    opt(w, "--batch-within", type=positive(number), setting="worker.batch_within_s",
        help="seconds to wait filling a batch")
    opt(w, "--tick", type=positive(number), setting="worker.tick_s", help="silence timer period, seconds")
    opt(w, "--silence", type=bool, setting="worker.silence",
        help="advance event time through wall-clock silence, so missed heartbeats fire when nothing arrives; "
        "--no-silence behaves like replay: no input, no time")
    opt(w, "--lateness", type=at_least_zero(number), setting="core.lateness_s",
        help="seconds behind the newest event time that timeouts are evaluated")
    opt(w, "--hold", type=at_least_zero(number), setting="worker.hold_s",
        help="seconds a node event waits for the map of its node to a job")
    opt(w, "--job-hold", type=at_least_zero(number), setting="worker.job_hold_s",
        help="seconds a job's records wait for its job record, which travels on another topic (a start-up at "
        "scale takes minutes; at least twice the longest wait seen)")
    opt(w, "--table-store", setting="worker.table_store",
        help="Faust table store: memory:// (rebuilt from the changelog at start) or rocksdb://")
    opt(w, "--datadir", setting="worker.datadir", help="Faust data directory, one per worker, kept (default: a "
        "temporary one, removed when the worker stops; rocksdb:// tables need one given)")
    opt(w, "--session-timeout", type=positive(number), setting="worker.session_timeout_s",
        help="Kafka consumer session timeout, seconds")
    opt(w, "--heartbeat-interval", type=positive(number), setting="worker.heartbeat_interval_s",
        help="Kafka consumer heartbeat interval, seconds")
    opt(w, "--request-timeout", type=positive(number), setting="worker.request_timeout_s",
        help="Kafka request timeout, seconds; at least the session timeout", shown_default="session + 10, >= 40")
    opt(w, "--commit-interval", type=positive(number), setting="worker.commit_interval_s",
        help="seconds between offset commits")
    opt(w, "--standby-replicas", type=at_least_zero(integer), setting="worker.standby_replicas",
        help="table standby replicas kept warm on other workers")
    opt(w, "--offset-reset", choices=("earliest", "latest"), setting="worker.offset_reset",
        help="where a new consumer group starts")
    opt(w, "--fetch-wait", type=positive(integer), setting="worker.fetch_wait_ms",
        help="ms the broker may hold a fetch that finds no data (Faust's own 1500 starves a busy partition)")
    opt(w, "--stats-every", type=at_least_zero(number), setting="worker.stats_every_s",
        help="seconds between progress lines in the log; 0: none")
    opt(w, "--metrics-port", type=port(integer), setting="worker.metrics_port",
        help="serve Prometheus metrics on this port (/metrics: records, rejects, lag, findings, actions, "
        "incident stage times, Faust's own sensor); taken by another process: a free port, named in the log; 0: none")
    opt(w, "--web-port", type=positive(integer), setting="worker.web_port",
        help="serve Faust's web views on this port (giving it turns them on, as worker.web does)")
    w.add_argument("--no-create-topics", dest="create_topics", action="store_false",
                   help="do not create missing topics at start")
    opt(w, "-l", "--loglevel", dest="loglevel", default="info", choices=("debug", "info", "warning", "error"),
        help="log level")
    w.set_defaults(func=cmd_worker)

    t = sub.add_parser("topics", help="create or list the Kafka topics gangwatch uses, or tail one")
    tsub = t.add_subparsers(dest="topics_command", metavar="ACTION", required=True)
    tc = tsub.add_parser("create", help="create every missing gangwatch topic (existing topics are left alone)")
    kafka_opts(tc)
    opt(tc, "--app-id", setting="worker.app_id", help="also the internal topic of the workers of this app id "
        "(PREFIX<app id>.by-job), for workers run with --no-create-topics")
    tc.set_defaults(func=cmd_topics_create)
    tl = tsub.add_parser("list", help="list the topics with the prefix and their partition counts")
    kafka_opts(tl)
    tl.set_defaults(func=cmd_topics_list)
    tt = tsub.add_parser("tail", help="print the records arriving on a topic (e.g. actions), one line each",
                         epilog="example: gangwatch topics tail actions --from-beginning")
    tt.add_argument("topic", metavar="TOPIC", help="a topic name, or a suffix such as actions, findings, dlq")
    kafka_opts(tt)
    tt.add_argument("--from-beginning", action="store_true", help="start at the oldest record (default: new only)")
    tt.add_argument("--max", type=positive(integer), help="stop after this many records")
    tt.add_argument("--timeout", type=positive(number), default=float("inf"),
                    help="stop after this many seconds without a record (default: never)")
    tt.add_argument("--json", action="store_true", help="print the records as they are (JSON lines)")
    tt.set_defaults(func=cmd_topics_tail)

    p = sub.add_parser("publish", help="put contract-v1 JSONL(.gz) files onto the Kafka input topics",
                       description="Merge the files by event time and send each record to the topic of its kind, "
                       "keyed as the worker expects (job id; node id for node events), consecutive records of one "
                       "topic and key packed into batch envelopes. Lines that do not decode go to the dead-letter "
                       "topic with the reason. By default as fast as Kafka takes them (a backlog).",
                       epilog="example: gangwatch simulate --fault xid79:60:n003 --out sim/ && "
                       "gangwatch publish sim/sim.jsonl.gz --bootstrap 127.0.0.1:9092 --realtime")
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="JSONL or JSONL.gz files of contract-v1 records")
    kafka_opts(p)
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--rate", type=positive(number), help="records per second (default: as fast as possible)")
    pace.add_argument("--realtime", type=positive(number), nargs="?", const=1.0, metavar="SPEED",
                      help="pace by the records' event time, SPEED x real time (default 1: live delivery)")
    opt(p, "--envelope", type=positive(integer), default=64,
        help="records per batch envelope (consecutive records of one topic and key)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress line with percentage and ETA (default: on when stderr is a terminal)")
    p.set_defaults(func=cmd_publish)
