"""`gangwatch controller --simulate TRUTH.json|n003,n007 --job J`: the controller's simulated mode
(control/simulated.py): no torchrun, the job's actions answered from a ground truth, in real (or drill) time."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from gangwatch.cli.options import EXIT_INPUT, UserError, at_least_zero, number, opt, positive

# (option, what it delays, its default: `producers.simulate.controller.Delays`'s, not imported here since that
# package loads numpy and every `gangwatch` start builds this parser)
DELAYS = (("accept", "accepted", 1.0), ("replace", "replaced, after accepted", 30.0),
          ("ckpt", "ckpt_loaded, after that", 40.0), ("comm", "comm_ready, after ckpt_loaded", 10.0),
          ("resume", "resumed, after comm_ready", 5.0), ("replay", "a replay's replay_result", 120.0),
          ("dual-run", "a dual run's dual_run_result", 60.0))


def _types(raw: str) -> frozenset[str]:
    from gangwatch.schemas.records import ACTION_TYPES

    types = frozenset(t.strip() for t in raw.split(",") if t.strip())
    unknown = sorted(types - set(ACTION_TYPES))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown action type {unknown[0]!r}; one of {', '.join(ACTION_TYPES)}")
    return types


def simulated_opts(c: argparse.ArgumentParser) -> None:
    """The options of the simulated mode (on `gangwatch controller`)."""
    g = c.add_argument_group("simulated mode (--simulate: no job is run; actions are answered from a ground truth)")
    opt(g, "--simulate", metavar="TRUTH.json|NODES", env=False,
        help="answer the job's actions as a controller would, from a scenario's NAME.truth.json (its faults' "
        "machines fail a replay, its SDC machines give other digests in a dual run) or the faulty machines, "
        "comma-separated; recovery records are published where the real controller publishes them, each when due")
    for name, what, default in DELAYS:
        opt(g, f"--{name}-delay", dest=f"delay_{name.replace('-', '_')}_s", type=at_least_zero(number), env=False,
            default=default, metavar="S", help=f"seconds to {what}")
    opt(g, "--speed", type=positive(number), default=1.0, env=False, metavar="X",
        help="the clock runs X times as fast as the wall clock from --clock-origin (a drill's job time)")
    opt(g, "--clock-origin", type=number, env=False, metavar="EPOCH_S",
        help="when the fast clock equals the wall clock", shown_default="start")
    opt(g, "--no-answer", type=_types, default=frozenset(), env=False, metavar="TYPES",
        help="action types never answered, comma-separated (to try the timeouts)", shown_default="none")
    opt(g, "--fail", type=_types, default=frozenset(), env=False, metavar="TYPES",
        help="action types whose restart fails, comma-separated", shown_default="none")


def cmd_simulated(args: argparse.Namespace) -> int:
    """Run the simulated mode until TERM / Ctrl-C."""
    from dataclasses import fields

    from gangwatch.cli.services import wait_for_kafka
    from gangwatch.control import simulated
    from gangwatch.control.controller import Publisher, TopicSource
    from gangwatch.producers.simulate.responder import Delays
    from gangwatch.schemas.signature import SECRET_ENV, TopicVerifier, topic_secret
    from gangwatch.schemas.topics import TopicSettings

    if not args.job:
        raise UserError("--job is required")
    if args.script or args.listen:
        raise UserError("--simulate runs no job and reads the alert topic: drop the script and --listen")
    secret = topic_secret()
    if not secret:
        raise UserError(f"actions on the alert topic are signed with the worker's secret: set {SECRET_ENV} to it "
                        "(unsigned or forged actions are refused)")
    delays = Delays(**{f.name: getattr(args, f"delay_{f.name}") for f in fields(Delays)})
    try:
        controller, truth = simulated.controller_of(args.simulate, delays=delays, silent=args.no_answer,
                                                    fails=args.fail, spares=len(args.spares) if args.spares else None)
    except FileNotFoundError:
        raise UserError(f"--simulate {args.simulate}: no such file", EXIT_INPUT) from None
    except ValueError as e:
        raise UserError(str(e), EXIT_INPUT) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s controller %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)

    wait_for_kafka(args.bootstrap, args.connect_timeout)
    topics = TopicSettings.from_env(prefix=args.prefix)
    clock = simulated.EventClock(args.speed, args.clock_origin)
    group = args.group or f"gangwatch-controller-{args.job}"
    source = TopicSource(args.bootstrap, topics, args.job, group,
                         verify=TopicVerifier(secret, tolerance_s=args.signature_tolerance))
    publisher = Publisher(args.bootstrap, topics)
    try:
        source.wait_assigned(args.connect_timeout)
        mode = simulated.SimulatedMode(args.job, controller, publisher, clock,
                                       simulated.truth_checkpoints(truth) if truth is not None else None)
        logging.getLogger("gangwatch.controller").info(
            "simulated controller for job %s on %s (faulty: %s; clock x%g)", args.job, topics.actions,
            ",".join(sorted(controller.faulty)) or "none", args.speed)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        simulated.run(mode, source, stop, clock.wall_seconds)
    finally:
        source.close()
        publisher.close()
    return 0
