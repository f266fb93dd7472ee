"""What `gangwatch slurm` and `gangwatch kubernetes` share: where actions come from, the state file, output.

Both have two subcommands:

    gangwatch slurm apply   [--from FILE... | Kafka options] [--act]   # fence the nodes of new actions
    gangwatch slurm resume  NODE... --repaired NOTE [--act]          # after a confirmed repair

Dry run unless `--act` is on the command line (on purpose no environment variable:
acting on a cluster is decided where the command is written).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gangwatch.cli.options import EXIT_INPUT, EXIT_SERVICE, UserError, iso, number, opt, positive
from gangwatch.cli.replay import check_inputs, connect_timeout_opt


def node_map(path: Path | None) -> dict[str, str]:
    """`--node-map FILE`: a JSON object {gangwatch node id: the cluster's node name}."""
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"--node-map {path}: not JSON ({e})", EXIT_INPUT) from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise UserError(f"--node-map {path}: want a JSON object of node id -> node name strings", EXIT_INPUT)
    return data


def print_outcomes(action: Any, outcomes: list[Any]) -> None:
    head = f"{iso(action.ts)}  {action.type:<12} job {action.job}  incident {action.incident}  ({action.id})"
    print(head, flush=True)
    for o in outcomes:
        print(f"    {o.node}: {o.what}" + (f"  ERROR: {o.error}" if o.error else ""), flush=True)


def apply(args: argparse.Namespace, backend: Any) -> int:
    """`... apply`: every action from the files, or from the alert topic until TERM / --idle-timeout."""
    from gangwatch.streams.fence import ActionTopic, AppliedLog, Fencer, follow, read_records
    from gangwatch.streams.topics import TopicSettings

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    fencer = Fencer(backend, act=args.act, applied=AppliedLog(args.state), node_map=node_map(args.node_map),
                    report=print_outcomes, retries=args.retries)
    failed = 0
    if args.files:
        check_inputs(args.files)
        for path in args.files:
            for rec in read_records(path):
                failed += any(o.error for o in fencer.handle(rec))
    else:
        from gangwatch.cli.services import wait_for_kafka

        wait_for_kafka(args.bootstrap, args.connect_timeout)
        topics = TopicSettings.from_env(prefix=args.prefix)
        source = ActionTopic(args.bootstrap, topics, args.group or f"gangwatch-{backend.name}",
                             from_beginning=args.from_beginning)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        try:
            source.wait_assigned(args.connect_timeout)
            print(f"reading actions from {topics.actions} at {args.bootstrap}"
                  + ("" if args.act else " (dry run: add --act to change the cluster)"), flush=True)
            follow(fencer, source, stop, idle_timeout_s=args.idle_timeout)
        finally:
            source.close()
    print(f"{fencer.handled} action(s) handled, {fencer.duplicates} already applied before"
          + (f", {failed} failed" if failed else "")
          + ("" if args.act else "; dry run: nothing was changed (add --act)"), flush=True)
    if failed:
        raise UserError(f"{failed} action(s) could not be applied (see ERROR above); they are not recorded as "
                        "applied, so running again retries them", EXIT_SERVICE)
    return 0


def resume(args: argparse.Namespace, backend: Any) -> int:
    """`... resume NODE... --repaired NOTE`: put repaired nodes back (only those gangwatch fenced)."""
    from gangwatch.streams.fence import AppliedLog, Fencer

    if not (args.repaired or "").strip():
        raise UserError("say how the repair was confirmed: --repaired 'ticket 123: GPU replaced, dcgmi diag passed'")
    fencer = Fencer(backend, act=args.act, applied=AppliedLog(args.state), node_map=node_map(args.node_map))
    outcomes = fencer.restore(args.nodes, args.repaired)
    for o in outcomes:
        print(f"{o.node}: {o.what}" + (f"  ERROR: {o.error}" if o.error else ""), flush=True)
    if not args.act:
        print("dry run: nothing was changed (add --act)")
    if any(o.error for o in outcomes):
        raise UserError("some nodes could not be resumed (see ERROR above)", EXIT_SERVICE)
    return 0


def add_commands(sub: argparse._SubParsersAction, name: str, *, help: str, description: str, fence: str,
                 backend_opts: Callable[[argparse.ArgumentParser], None],
                 cmd_apply: Callable[[argparse.Namespace], int], cmd_resume: Callable[[argparse.Namespace], int],
                 example: str) -> None:
    """`gangwatch NAME apply|resume` with the shared options and the backend's own."""
    env = name.upper()
    top = sub.add_parser(name, help=help, description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter, epilog=example)
    tsub = top.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)

    a = tsub.add_parser("apply", help=f"{fence} the nodes of replace, isolate, evict_group, requeue actions, once",
                        description=f"Read actions from JSONL(.gz) files (--from; e.g. a replay's "
                        "actions.jsonl) or from the alert topic, and for every replace, isolate, evict_group or "
                        f"requeue action naming nodes {fence} its nodes, once per action id (ids kept in --state). "
                        "Other actions are listed and left to the job controller. Dry run unless --act.")
    a.add_argument("--from", dest="files", nargs="+", type=Path, metavar="FILE",
                   help="read actions from these JSONL(.gz) files instead of Kafka (other records are skipped)")
    a.add_argument("--act", action="store_true", help=f"really {fence} (default: dry run, nothing changes)")
    opt(a, "--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers, comma-separated")
    opt(a, "--prefix", env="GANGWATCH_TOPIC_PREFIX", help="topic name prefix (actions: PREFIXactions)",
        shown_default="gw.")
    opt(a, "--group", env=f"GANGWATCH_{env}_GROUP", help="Kafka consumer group", shown_default=f"gangwatch-{name}")
    a.add_argument("--from-beginning", action="store_true",
                   help="a new consumer group starts at the oldest action (default: only new ones)")
    opt(a, "--idle-timeout", type=positive(number), env=False,
        help="stop after this many seconds without a record (default: run until TERM)")
    opt(a, "--retries", type=int, default=3, env=False, help="retries of a failed scheduler call, with backoff")
    connect_timeout_opt(a)
    _common(a, env, name)
    backend_opts(a)
    a.set_defaults(func=cmd_apply)

    r = tsub.add_parser("resume", help="put repaired nodes back in service (only nodes gangwatch took out)",
                        description="Bring nodes back after a confirmed repair. gangwatch never does this on its "
                        "own; only nodes it fenced are touched, and the note goes into the --state log.")
    r.add_argument("nodes", nargs="+", metavar="NODE", help="node names (gangwatch ids, mapped by --node-map)")
    r.add_argument("--repaired", required=True, metavar="NOTE",
                   help="how the repair was confirmed (ticket, test run): required, kept in the log")
    r.add_argument("--act", action="store_true", help="really resume (default: dry run)")
    _common(r, env, name)
    backend_opts(r)
    r.set_defaults(func=cmd_resume)


def _common(p: argparse.ArgumentParser, env: str, name: str) -> None:
    opt(p, "--state", type=Path, env=f"GANGWATCH_{env}_STATE", default=Path(f"gangwatch-{name}-applied.jsonl"),
        help="append-only log of applied action ids and resumes (JSON lines)")
    opt(p, "--node-map", type=Path, env=f"GANGWATCH_{env}_NODE_MAP",
        help="JSON file {gangwatch node id: cluster node name} (default: the same names)")
