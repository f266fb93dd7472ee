"""What `gangwatch slurm` and `gangwatch kubernetes` share: where actions come from, the state file, output.

Both have four subcommands:

    gangwatch slurm apply   [--from FILE... | Kafka options] [--act]   # fence the nodes of new actions
    gangwatch slurm resume  NODE... --repaired NOTE [--act]          # after a confirmed repair
    gangwatch slurm breaker                                          # the fleet breaker: tripped or not, why
    gangwatch slurm reset-breaker --note NOTE                        # let a tripped breaker fence again

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

from gangwatch.cli.options import EXIT_INPUT, EXIT_SERVICE, UserError, integer, iso, number, opt, positive
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


EXIT_BREAKER = 1  # `apply`: the fleet breaker refused actions; `breaker`: it is tripped


def _breaker(args: argparse.Namespace) -> Any:
    from gangwatch.control.fence import Breaker, breaker_path

    return Breaker(breaker_path(args.state), share=args.breaker_share, window_s=args.breaker_window,
                   min_nodes=args.breaker_min, fleet_nodes=args.fleet_nodes)


def _tripped_line(name: str, st: dict[str, Any]) -> str:
    return (f"FLEET BREAKER TRIPPED {iso(st.get('at'))}: {st.get('why', '?')}\n"
            f"    no node is fenced until a person resets it: gangwatch {name} reset-breaker --note '...'")


def topic_verifier(args: argparse.Namespace) -> Any:
    """How `apply` checks the actions it reads from the topic (None for --from files); without the secret, one
    line before anything is connected."""
    if args.files:
        return None
    from gangwatch.schemas.signature import SECRET_ENV, TopicVerifier, topic_secret

    secret = topic_secret()
    if not secret:
        raise UserError(f"actions on the alert topic are signed with the worker's secret: set {SECRET_ENV} to it "
                        "(unsigned or forged actions are refused; files given with --from are read as they are)")
    return TopicVerifier(secret, tolerance_s=args.signature_tolerance)


def apply(args: argparse.Namespace, backend: Any, verify: Any = None) -> int:
    """`... apply`: every action from the files, or from the alert topic (checked by `verify`, from
    `topic_verifier`) until TERM / --idle-timeout."""
    from gangwatch.control.fence import ActionTopic, AppliedLog, Fencer, follow, read_records
    from gangwatch.schemas.topics import TopicSettings

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    breaker = _breaker(args)
    fencer = Fencer(backend, act=args.act, applied=AppliedLog(args.state), node_map=node_map(args.node_map),
                    report=print_outcomes, retries=args.retries, breaker=breaker)
    st = breaker.state()
    if st.get("tripped"):
        print(_tripped_line(args.command, st), flush=True)
    failed = 0
    if args.files:
        check_inputs(args.files)
        for path in args.files:
            for rec in read_records(path):
                failed += any(o.error for o in fencer.handle(rec))
    else:
        from gangwatch.cli.services import wait_for_kafka

        verify = verify or topic_verifier(args)
        wait_for_kafka(args.bootstrap, args.connect_timeout)
        topics = TopicSettings.from_env(prefix=args.prefix)
        source = ActionTopic(args.bootstrap, topics, args.group or f"gangwatch-{backend.name}",
                             verify=verify, from_beginning=args.from_beginning)
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
    refused = source.refused if not args.files else 0
    print(f"{fencer.handled} action(s) handled, {fencer.duplicates} already applied before"
          + (f", {refused} refused for their signature (see WARNING above)" if refused else "")
          + (f", {failed} failed" if failed else "")
          + (f", {fencer.refused} refused by the fleet breaker" if fencer.refused else "")
          + ("" if args.act else "; dry run: nothing was changed (add --act)"), flush=True)
    if fencer.uncounted:
        print(f"dry run: the fleet breaker was not checked, the watched nodes could not be counted "
              f"({fencer.uncounted}); a real run counts them first", flush=True)
    if failed:
        raise UserError(f"{failed} action(s) could not be applied (see ERROR above); they are not recorded as "
                        "applied, so running again retries them", EXIT_SERVICE)
    if fencer.refused:
        if args.act:
            print(f"the fleet breaker is tripped: see `gangwatch {args.command} breaker`; after a look, "
                  f"`gangwatch {args.command} reset-breaker --note '...'`", flush=True)
        else:
            print("dry run: a real run would have tripped the fleet breaker (a dry run trips it for itself only)",
                  flush=True)
        return EXIT_BREAKER
    return 0


def resume(args: argparse.Namespace, backend: Any) -> int:
    """`... resume NODE... --repaired NOTE`: put repaired nodes back (only those gangwatch fenced)."""
    from gangwatch.control.fence import AppliedLog, Fencer

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


def breaker(args: argparse.Namespace, backend: Callable[[], Any]) -> int:
    """`... breaker`: the fleet breaker's state, the nodes that count against it now, and its limit."""
    from gangwatch.control.fence import AppliedLog, Fencer

    b = _breaker(args)
    st = b.state()
    name = args.command
    print(f"state file: {b.path}" + ("" if b.path.exists() else " (none yet)"))
    if st.get("tripped"):
        print(_tripped_line(name, st))
    else:
        print("fleet breaker: closed (fencing allowed)"
              + (f"; last reset {iso(st.get('reset_at'))} by {st.get('by', '?')}: {st.get('note', '')}"
                 if st.get("reset_at") is not None else ""))
    applied = AppliedLog(args.state)
    fenced = sorted(applied.fenced_since(b.counting_since(st)))
    since = "the last reset" if (st.get("reset_at") or 0) > b.clock() - b.window_s else f"{b.window_s:.0f} s"
    print(f"nodes fenced within {since}: {len(fenced)}" + (f" ({', '.join(fenced)})" if fenced else ""))
    try:
        fencer = Fencer(backend(), breaker=b)
        watched, source = fencer.watched()
        print(f"limit: {b.limit(watched)} node(s) per {b.window_s:.0f} s = {b.share:.0%} of {watched} watched "
              f"nodes (from {source}), at least {b.min_nodes}")
    except Exception as e:  # the scheduler unreachable, no credentials: the state is still worth showing
        print(f"limit: unknown ({e}); {b.share:.0%} of the watched nodes, at least {b.min_nodes}")
    refused = _refused_since(applied, st)
    if st.get("tripped") and refused:
        print(f"refused since the trip: {len(refused)} action(s)")
        for r in refused:
            print(f"    {iso(r['at'])}  {r.get('type')}  {r.get('id')}  job {r.get('job')}  nodes "
                  f"{','.join(r.get('nodes') or [])}")
    return EXIT_BREAKER if st.get("tripped") else 0


def reset_breaker(args: argparse.Namespace) -> int:
    """`... reset-breaker --note NOTE`: close a tripped breaker (recorded in the state file and the log)."""
    from gangwatch.control.fence import AppliedLog, Breaker, breaker_path

    note = (args.note or "").strip()
    if not note:
        raise UserError("say why fencing may go on: --note 'detector fixed in 1.4.2; the 12 drains checked'")
    b = Breaker(breaker_path(args.state))
    st = b.state()
    if not st.get("tripped"):
        print(f"the fleet breaker of {args.state} is not tripped: nothing to reset ({b.path})")
        return 0
    applied = AppliedLog(args.state)
    refused = _refused_since(applied, st)
    b.reset(note)
    applied.breaker("reset", {"note": note, "was": st})
    print(f"reset the fleet breaker of {args.state} ({b.path}), tripped {iso(st.get('at'))}: {st.get('why', '?')}")
    print("fencing goes on with the next action; nodes fenced before now no longer count against it")
    if refused:
        print(f"{len(refused)} action(s) refused while it was tripped were not applied, and nothing applies them "
              "now (drain by hand those that are real faults, or run `apply --from` on them again):")
        for r in refused:
            print(f"    {iso(r['at'])}  {r.get('type')}  {r.get('id')}  job {r.get('job')}  nodes "
                  f"{','.join(r.get('nodes') or [])}")
    return 0


def _refused_since(applied: Any, st: dict[str, Any]) -> list[dict[str, Any]]:
    """The actions refused since the trip, one line each (the last refusal of an action delivered again)."""
    since = st.get("at") if isinstance(st.get("at"), int | float) else 0.0
    out = {r.get("id"): r for r in applied.refusals if isinstance(r.get("at"), int | float) and r["at"] >= since}
    return list(out.values())


def _share(raw: str) -> float:
    value = number(raw)
    if not 0 < value <= 1:
        raise ValueError("a share of the nodes: more than 0, at most 1 (0.05 is 5 %)")
    return value


def _breaker_opts(p: argparse.ArgumentParser, env: str, what: str) -> None:
    opt(p, "--fleet-nodes", type=positive(integer), env=f"GANGWATCH_{env}_FLEET_NODES",
        help=f"how many nodes gangwatch watches, what the fleet breaker's share is of; wins over the count of "
        f"{what} (the default), so set it where the cluster holds nodes gangwatch does not watch")
    opt(p, "--breaker-share", type=_share, default=0.05, env=f"GANGWATCH_{env}_BREAKER_SHARE",
        help="the fleet breaker trips when an action would make more than this share of the watched nodes "
        "fenced within --breaker-window")
    opt(p, "--breaker-window", type=positive(number), default=3600.0, env=f"GANGWATCH_{env}_BREAKER_WINDOW",
        help="seconds over which the fleet breaker counts the distinct nodes fenced")
    opt(p, "--breaker-min", type=positive(integer), default=2, env=f"GANGWATCH_{env}_BREAKER_MIN",
        help="the fleet breaker allows at least this many nodes per window, however small the fleet")


def add_commands(sub: argparse._SubParsersAction, name: str, *, help: str, description: str, fence: str,
                 backend_opts: Callable[[argparse.ArgumentParser], None],
                 cmd_apply: Callable[[argparse.Namespace], int], cmd_resume: Callable[[argparse.Namespace], int],
                 cmd_breaker: Callable[[argparse.Namespace], int], counted: str, example: str) -> None:
    """`gangwatch NAME apply|resume|breaker|reset-breaker` with the shared options and the backend's own."""
    env = name.upper()
    top = sub.add_parser(name, help=help, description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter, epilog=example)
    tsub = top.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)

    a = tsub.add_parser("apply", help=f"{fence} the nodes of replace, isolate, evict_group, requeue actions, once",
                        description=f"Read actions from JSONL(.gz) files (--from; e.g. a replay's "
                        "actions.jsonl) or from the alert topic, and for every replace, isolate, evict_group or "
                        f"requeue action naming nodes {fence} its nodes, once per action id (ids kept in --state). "
                        "Other actions are listed and left to the job controller. Dry run unless --act.",
                        epilog="The fleet breaker: an action that would make the distinct nodes fenced within "
                        "--breaker-window (1 h) more than --breaker-share (5 %) of the watched nodes (--fleet-nodes, "
                        "else the count of " + counted + "), or more than --breaker-min (2) where that is larger, "
                        "trips it: that action and every "
                        f"fencing action after it is refused (a line each, journalled as refused-by-breaker, exit "
                        f"status 1) until `gangwatch {name} reset-breaker --note NOTE`, across restarts (the state "
                        "file beside --state). Actions that fence nothing are never refused. A dry run counts "
                        "what it would fence and trips for itself only, never for a real run. See "
                        f"`gangwatch {name} breaker --help`.")
    a.add_argument("--from", dest="files", nargs="+", type=Path, metavar="FILE",
                   help="read actions from these JSONL(.gz) files instead of Kafka (other records are skipped)")
    a.add_argument("--act", action="store_true", help=f"really {fence} (default: dry run, nothing changes)")
    opt(a, "--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers, comma-separated")
    opt(a, "--prefix", env="GANGWATCH_TOPIC_PREFIX", help="topic name prefix (actions: PREFIXactions)",
        shown_default="gw.")
    opt(a, "--group", env=f"GANGWATCH_{env}_GROUP", help="Kafka consumer group", shown_default=f"gangwatch-{name}")
    a.add_argument("--from-beginning", action="store_true",
                   help="a new consumer group starts at the oldest action (default: only new ones)")
    opt(a, "--signature-tolerance", type=positive(number), default=300.0, env=False,
        help="seconds the timestamp of an action's signature may be from this clock; older actions (and copies "
        "of ones accepted) are refused. Actions on the topic must carry the v1 signature made with "
        "GANGWATCH_WEBHOOK_SECRET, the worker's secret")
    opt(a, "--idle-timeout", type=positive(number), env=False,
        help="stop after this many seconds without a record (default: run until TERM)")
    opt(a, "--retries", type=int, default=3, env=False, help="retries of a failed scheduler call, with backoff")
    connect_timeout_opt(a)
    _common(a, env, name)
    _breaker_opts(a, env, counted)
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

    br = tsub.add_parser("breaker", help="show the fleet breaker: tripped or not, why, what counts against it",
                         description="The fleet breaker's state (from the file beside --state), the distinct nodes "
                         "fenced within the window (since the last reset), its limit, and while tripped the "
                         "actions it refused. Exit status 0 when closed, 1 when tripped (for a monitoring check). "
                         "Give the same breaker options as `apply` to see its limit.")
    _common(br, env, name)
    _breaker_opts(br, env, counted)
    backend_opts(br)
    br.set_defaults(func=cmd_breaker)

    rb = tsub.add_parser("reset-breaker", help="let a tripped fleet breaker fence again (after a person looked)",
                         description="Close the tripped fleet breaker of this --state: the next fencing action is "
                         "applied again, and the nodes fenced before the reset no longer count against it. The "
                         "actions it refused are listed, not applied. The note goes into the state file and the "
                         "--state log. A running adapter reads the reset before its next action.")
    rb.add_argument("--note", required=True, metavar="NOTE",
                    help="why fencing may go on (what was checked, the ticket): required, kept in the log")
    _common(rb, env, name, node_map=False)
    rb.set_defaults(func=reset_breaker)


def _common(p: argparse.ArgumentParser, env: str, name: str, *, node_map: bool = True) -> None:
    opt(p, "--state", type=Path, env=f"GANGWATCH_{env}_STATE", default=Path(f"gangwatch-{name}-applied.jsonl"),
        help="append-only log of applied action ids and resumes (JSON lines); the fleet breaker's state is "
        "the file beside it, NAME.breaker.json")
    if not node_map:
        return
    opt(p, "--node-map", type=Path, env=f"GANGWATCH_{env}_NODE_MAP",
        help="JSON file {gangwatch node id: cluster node name} (default: the same names)")
