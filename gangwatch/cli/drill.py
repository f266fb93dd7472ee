"""`gangwatch drill`: a game day of the live pipeline on a simulated job (gangwatch/evaluation/drill*.py)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from gangwatch.cli.options import EXIT_DRILL, UserError, integer, number, opt, positive, settings_opts
from gangwatch.cli.replay import connect_timeout_opt

DELAY_NAMES = ("accept", "replace", "ckpt", "comm", "resume", "replay", "dual-run")


def _kinds(raw: str) -> tuple[str, ...]:
    from gangwatch.evaluation.drill import KINDS

    kinds = tuple(k.strip() for k in raw.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown kind {unknown[0]!r}" if unknown else "no kind named")
    return kinds


def _delay(raw: str) -> tuple[str, float]:
    name, eq, value = raw.partition("=")
    if not eq or name.strip() not in DELAY_NAMES:
        raise argparse.ArgumentTypeError(f"want NAME=SECONDS with NAME one of {', '.join(DELAY_NAMES)}")
    seconds = number(value)
    if seconds < 0:
        raise argparse.ArgumentTypeError("a delay must not be negative")
    return name.strip(), seconds


def cmd_drill(args: argparse.Namespace) -> int:
    import logging

    from gangwatch.cli.services import wait_for_kafka, wait_for_store
    from gangwatch.evaluation import drill, drill_live
    from gangwatch.triage.budgets import Budgets

    try:
        spec = drill.DrillSpec(job=args.job or f"drill-{args.seed}-{_suffix()}", seed=args.seed,
                               faults=args.faults, kinds=args.kinds or drill.DEFAULT_KINDS,
                               duration_s=args.duration, tp=args.tp, pp=args.pp, dp=args.dp,
                               gpus_per_node=args.gpus_per_node, lead_s=args.lead, window_s=args.window,
                               quiet_s=args.quiet)
    except ValueError as e:
        raise UserError(str(e)) from None
    budgets = Budgets(**args.settings.get("triage.budgets"))
    logging.getLogger("kafka").setLevel(logging.ERROR)  # its warnings are about its own event loop and groups
    wait_for_kafka(args.bootstrap, args.connect_timeout)
    if args.store:
        wait_for_store(args.store, args.connect_timeout)
    settings = [*(["--config", args.config] if args.config else []),
                *(a for s in args.set_settings for a in ("--set", s))]
    live = drill_live.Live(bootstrap=args.bootstrap, store=args.store, speed=args.speed, prefix=args.prefix,
                           keep_topics=args.keep_topics, settings=settings, delays=dict(args.delay or ()))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"gangwatch-{spec.job}-"))
    try:
        passed = _drill(args, spec, live, budgets, workdir)
    except BaseException:
        if args.workdir is None:
            print(f"  the drill's logs are kept in {workdir}", file=sys.stderr, flush=True)
        raise
    if args.workdir is None:  # a folder of its own: removed after a drill that passed, kept for one that did not
        if passed:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"the drill's logs are kept in {workdir} (remove it when done)", file=sys.stderr, flush=True)
    return 0 if passed else EXIT_DRILL


def _drill(args: argparse.Namespace, spec: Any, live: Any, budgets: Any, workdir: Path) -> bool:
    """Run the drill and print its report; whether it passed."""
    import orjson

    from gangwatch.evaluation import drill, drill_live

    quiet = args.format == "json"
    say = None if quiet else (lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    if say is not None:
        say(f"drill {spec.job}: {spec.ranks} ranks on {spec.nodes} machines, {spec.faults} events, x{args.speed:g}; "
            f"logs in {workdir}")
    out = drill_live.run(spec, live, workdir, progress=say)
    report = drill.score(out.drill, budgets)
    if args.restore_check:
        report = drill.Report(report.rows, report.wrong, report.unexpected, budgets,
                              drill.restore_check(out.drill, args.seed))
    notes = [f"stopped after {out.wall_s:.0f} s of wall time, before every event had its outcome"] * out.timed_out
    if out.dead_letters:
        notes.append(f"the worker refused records: {out.dead_letters[0]}")
    if args.format == "json":
        print(orjson.dumps(drill.to_json(report, job=spec.job, seed=spec.seed, speed=args.speed,
                                         wall_s=round(out.wall_s, 1), records=out.records, notes=notes,
                                         workdir=str(workdir)), option=orjson.OPT_INDENT_2).decode())
    else:
        head = (f"drill {spec.job}: {spec.ranks} ranks on {spec.nodes} machines, seed {spec.seed}, x{args.speed:g}, "
                f"{out.wall_s:.0f} s wall, {out.records:,} records")
        print(drill.render(report, head))
        for note in notes:
            print(f"note: {note}")
    return report.passed and not out.timed_out


def _suffix() -> str:
    import secrets

    return secrets.token_hex(3)


def register(sub: argparse._SubParsersAction) -> None:
    d = sub.add_parser(
        "drill", help="a game day of the live pipeline: inject faults into a simulated job, score each stage",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run the live pipeline on a simulated job: the Kafka broker, a `gangwatch worker` and the "
        "controller's simulated mode (`gangwatch controller --simulate`) as subprocesses, on topics of the "
        "drill's own, and a feeder that publishes the job's records as their time comes, with --faults events "
        "injected at random times (from --seed): machines killed, ranks hung, a slow GPU, a corrupted replica, "
        "and benign ones (a job-wide pause, a user's stop) that must open nothing. Prints per event the seconds "
        "from its injection to detection, localization, decision and recovery against the stage budgets, and "
        "the actions that should not have happened. Exit 8 when an event failed its budget or an action was "
        "wrong. docs/drills.md.",
        epilog="example: gangwatch drill --faults 3 --seed 7 --speed 10 --restore-check")
    opt(d, "--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers, comma-separated")
    opt(d, "--store", help="the worker also writes to this store (clickhouse://HOST:PORT/DB or chdb:PATH)",
        shown_default="none")
    opt(d, "--faults", type=positive(integer), default=3, help="events to inject")
    opt(d, "--seed", type=integer, default=1, help="what is injected where and when follows from it")
    opt(d, "--duration", type=positive(number), help="seconds of job time the events are planned within (later "
        "when the job is still recovering)", shown_default="240 per event")
    opt(d, "--kinds", type=_kinds, help="kinds of event, comma-separated, from: node_loss, xid79, "
        "dataloader_hang, pp_deadlock, thermal_straggler, sdc, pause, stop, intermittent_straggler, "
        "nic_degradation", shown_default="the first eight")
    opt(d, "--speed", type=positive(number), default=1.0,
        help="the job's time runs this many times as fast as the wall clock (10: a minute of the job in 6 s)")
    d.add_argument("--restore-check", action="store_true",
                   help="pick a checkpoint the controller restored (ckpt_loaded's extra.checkpoint) and say "
                   "whether the job resumed from it")
    opt(d, "--format", choices=("table", "json"), default="table", help="output")
    opt(d, "--job", env=False, help="the simulated job's id", shown_default="drill-SEED-RANDOM")
    opt(d, "--tp", type=positive(integer), default=2, env=False, help="tensor-parallel size of the job")
    opt(d, "--pp", type=positive(integer), default=2, env=False, help="pipeline stages")
    opt(d, "--dp", type=positive(integer), default=4, env=False, help="data-parallel replicas")
    opt(d, "--gpus-per-node", type=positive(integer), default=1, env=False, help="GPUs (ranks) per machine")
    opt(d, "--lead", type=positive(number), default=60.0, help="seconds of healthy running before each event")
    opt(d, "--window", type=positive(number), default=600.0,
        help="seconds an event has for its outcome before the drill goes on")
    opt(d, "--quiet", type=positive(number), default=45.0,
        help="seconds watched after an outcome that needs no restart, and after a pause")
    d.add_argument("--delay", type=_delay, action="append", metavar="NAME=SECONDS",
                   help=f"the simulated controller's delay, repeatable; NAME one of {', '.join(DELAY_NAMES)} "
                   "(gangwatch controller --help)")
    opt(d, "--prefix", env=False, help="topic prefix: its topics are made if missing and kept afterwards; the "
        "drill's worker reads them from their start, so name topics no other pipeline uses",
        shown_default="gw.drill.JOB., deleted afterwards")
    d.add_argument("--keep-topics", action="store_true", help="keep the drill's own topics afterwards")
    opt(d, "--workdir", type=Path, help="where the worker's and controller's logs and the truth go",
        shown_default="a new temporary folder, removed after a drill that passed")
    connect_timeout_opt(d)
    settings_opts(d)
    d.set_defaults(func=cmd_drill)
