"""`gangwatch controller`: the reference job controller (control/controller.py) on a torchrun job."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from gangwatch.cli.options import UserError, integer, number, opt, positive
from gangwatch.cli.replay import connect_timeout_opt
from gangwatch.cli.services import hostports, wait_for_kafka
from gangwatch.cli.simcontroller import cmd_simulated, simulated_opts


def _names(raw: str) -> list[str]:
    names = [n.strip() for n in raw.split(",") if n.strip()]
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a node is named twice in {raw!r}")
    return names


def cmd_controller(args: argparse.Namespace) -> int:
    from gangwatch.control.controller import Controller, RecoveryPublisher, TopicSource, WebhookSource, run
    from gangwatch.control.launcher import JobSpec
    from gangwatch.schemas.signature import SECRET_ENV, TopicVerifier, topic_secret
    from gangwatch.schemas.topics import TopicSettings

    if args.simulate:
        return cmd_simulated(args)
    command = args.script[1:] if args.script[:1] == ["--"] else args.script
    if not command and not args.dry_run:
        raise UserError("name the training script after --, e.g. -- examples/tiny_job/train.py --steps 500")
    if not args.job or not args.nodes:
        raise UserError("--job and --nodes are required")
    if set(args.nodes) & set(args.spares):
        raise UserError("a node cannot be both in --nodes and in --spares")
    secret = topic_secret()
    if args.listen and not secret:
        raise UserError(f"--listen needs the webhook secret in {SECRET_ENV}")
    if not secret and not args.dry_run:
        raise UserError(f"actions on the alert topic are signed with the worker's secret: set {SECRET_ENV} to it "
                        "(unsigned or forged actions are refused)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s controller %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # its INFO lines are connection chatter

    wait_for_kafka(args.bootstrap, args.connect_timeout)
    topics = TopicSettings.from_env(prefix=args.prefix)
    spec = JobSpec(job=args.job, command=command, ckpt_dir=args.ckpt_dir, run_dir=args.state_dir / "runs",
                   nproc_per_node=args.nproc_per_node, host=args.rdzv_host,
                   env={"GANGWATCH_BOOTSTRAP": args.bootstrap, "GANGWATCH_TOPIC_PREFIX": topics.prefix})
    group = args.group or f"gangwatch-controller-{args.job}"
    verify = TopicVerifier(secret, tolerance_s=args.signature_tolerance) if secret else None
    topic = TopicSource(args.bootstrap, topics, args.job, group, actions=not args.listen, verify=verify)
    sources: list[TopicSource | WebhookSource] = [topic]
    publisher = RecoveryPublisher(args.bootstrap, topics)
    try:
        if args.listen:
            [(host, port)] = hostports(args.listen, 8080)
            webhook = WebhookSource(host, port, secret, tolerance_s=args.signature_tolerance)
            sources.append(webhook)
            logging.getLogger("gangwatch.controller").info("webhook receiver at %s", webhook.url)
        topic.wait_assigned(args.connect_timeout)
        controller = Controller(spec, args.nodes, args.spares, publisher, state_dir=args.state_dir,
                                dry_run=args.dry_run, resume_timeout_s=args.resume_timeout,
                                evidence_wait_s=args.evidence_wait, stop_grace_s=args.stop_grace,
                                replay_timeout_s=args.replay_timeout)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        run(controller, sources, stop)
    finally:
        for source in sources:
            source.close()
        publisher.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "controller", help="the reference job controller: run a torchrun job and carry out gangwatch's actions",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Launch a training job as one torchrun per node (all on this machine, each with "
        "GANGWATCH_NODE set to its name), read the job's actions from the alert topic (or from webhook POSTs "
        "with --listen; either way signed with the worker's secret, GANGWATCH_WEBHOOK_SECRET, and refused "
        "unsigned, forged, stale or replayed), apply each once (stop and restart without the culprit node, a "
        "spare name in its place; roll back to a checkpoint before the corruption for SDC) and publish recovery "
        "records at each stage, so incidents close with real timings. For tests, drills and small clusters. "
        "The job must follow the launcher's protocol (GANGWATCH_CKPT_DIR, GANGWATCH_RESUME_FROM, "
        "GANGWATCH_PROGRESS; see examples/tiny_job/train.py). Stop with Ctrl-C / TERM: the job is stopped too.",
        epilog="example: GANGWATCH_WEBHOOK_SECRET=... gangwatch controller --job j1 --nodes n1,n2 --spares n3 "
        "--ckpt-dir ckpt/ -- examples/tiny_job/train.py --steps 2000")
    c.add_argument("script", nargs=argparse.REMAINDER, metavar="-- SCRIPT [ARG ...]",
                   help="the training script and its arguments, as torchrun takes them")
    opt(c, "--job", help="the job id (actions of other jobs are ignored; every rank gets it as GANGWATCH_JOB)")
    opt(c, "--nodes", type=_names, help="node names the job runs on, comma-separated (one torchrun each)")
    opt(c, "--spares", type=_names, default=[], help="spare node names that take an evicted node's place",
        shown_default="none")
    opt(c, "--nproc-per-node", type=positive(integer), default=2, help="ranks per node")
    opt(c, "--ckpt-dir", type=Path, default=Path("checkpoints"), help="where the job writes its checkpoints")
    opt(c, "--state-dir", type=Path, default=Path("gangwatch-controller"),
        help="applied action ids, the node set, and each launch's logs (runs/attempt-N/)")
    opt(c, "--listen", help="take actions from signed webhook POSTs at HOST:PORT instead of the topic "
        "(secret in GANGWATCH_WEBHOOK_SECRET)")
    opt(c, "--signature-tolerance", type=positive(number), default=300.0,
        help="seconds the timestamp of an action's signature (on the topic, or a --listen request) may be from "
        "this clock; older (or replayed) actions are refused")
    opt(c, "--group", help="consumer group", shown_default="gangwatch-controller-JOB")
    opt(c, "--rdzv-host", default="127.0.0.1", help="address the torchrun rendezvous listens on")
    opt(c, "--resume-timeout", type=positive(number), default=300.0,
        help="seconds a restarted job has to finish its first step before the recovery is reported failed")
    opt(c, "--evidence-wait", type=positive(number), default=10.0,
        help="seconds a rollback waits for its findings (they name the first corrupt step)")
    opt(c, "--stop-grace", type=positive(number), default=20.0,
        help="seconds between TERM and KILL when stopping the job")
    opt(c, "--replay-timeout", type=positive(number), default=300.0,
        help="seconds a replay group or a dual run's node has to run its step; past it, it is killed and fails")
    c.add_argument("--dry-run", action="store_true",
                   help="launch nothing and touch nothing: log what each action would do")
    opt(c, "--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers, comma-separated")
    opt(c, "--prefix", env="GANGWATCH_TOPIC_PREFIX", help="topic name prefix", shown_default="gw.")
    connect_timeout_opt(c)
    simulated_opts(c)
    c.set_defaults(func=cmd_controller)
