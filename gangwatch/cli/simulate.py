"""`gangwatch simulate`, `eval` and `demo`: generated telemetry with known faults, scored or shown."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gangwatch.cli import console
from gangwatch.cli.options import EXIT_FLOOR, EXIT_USAGE, UserError, command_name, integer, number, opt, positive
from gangwatch.producers.fault_kinds import FAULT_HELP


def _suite(name: str, size: str, only: list[str] | None) -> list:
    from gangwatch.producers.simulate import standard_suite

    if name != "standard":
        raise UserError(f"unknown suite {name!r} (known: standard)")
    scenarios = standard_suite(size)
    if only:
        scenarios = [s for s in scenarios if any(o in s.name for o in only)]
        if not scenarios:
            raise UserError(f"--only {' '.join(only)} matches no scenario of the {name} suite")
    return scenarios


def _fault(spec: str):
    from gangwatch.producers.simulate import Fault

    try:
        kind, at_s, where, *mag = spec.split(":")
        where_kw = {"rank": int(where[1:])} if where.startswith("r") else {"node": where}
        return Fault(kind, float(at_s), **where_kw, magnitude=float(mag[0]) if mag else 0.0)
    except ValueError as e:
        why = str(e) if "unknown" in str(e) or ":" in str(e) else "want KIND:AT_S:WHERE[:MAGNITUDE]"
        raise UserError(f"bad --fault {spec!r}: {why}") from None


def _fleet(args: argparse.Namespace):
    from gangwatch.producers.simulate.fleetday import Fleet

    try:
        return Fleet(gpus=args.gpus, hours=args.hours, seed=args.seed, fault_rate=args.fault_rate)
    except ValueError as e:
        raise UserError(f"--fleet: {e}", EXIT_USAGE) from None


def cmd_simulate(args: argparse.Namespace) -> int:
    from gangwatch.producers.simulate import Scenario, write

    if args.fleet:
        from gangwatch.producers.simulate import fleetday

        stream, truth = fleetday.write(_fleet(args), args.out, args.name if args.name != "sim" else "fleet")
        print(f"{stream}  ({args.gpus:,} GPUs for {args.hours:g} h)  truth: {truth.name}")
        return 0
    if args.suite:
        scenarios = _suite(args.suite, args.size, args.only)
    else:
        faults = tuple(_fault(s) for s in args.fault or ())
        try:
            scenarios = [Scenario(args.name, args.seed, args.tp, args.pp, args.dp, gpus_per_node=args.gpus_per_node,
                                  duration_s=args.duration, faults=faults, batch=args.batch)]
        except ValueError as e:
            raise UserError(str(e), EXIT_USAGE) from None
    for sc in scenarios:
        try:
            stream, truth = write(sc, args.out)
        except ValueError as e:  # a fault naming a node or rank the job does not have, ...
            raise UserError(f"scenario {sc.name}: {e}", EXIT_USAGE) from None
        print(f"{stream}  ({sc.tp * sc.pp * sc.dp} ranks, {sc.duration_s:.0f} s)  truth: {truth.name}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from gangwatch.evaluation import scoring as evaluate

    if args.fleet:
        return _eval_fleet(args)
    if args.suite == "invariance":
        return _eval_invariance(args)
    scenarios = _suite(args.suite, args.size, args.only)
    show = (lambda s: print(f"  {s.scenario}: {'ok' if s.ok else 'NOT ok'} ({s.records:,} records, "
                            f"{s.replay_s:.1f} s)", file=sys.stderr, flush=True)) if not args.quiet else None
    scores = evaluate.evaluate(scenarios, args.work, progress=show)
    print(evaluate.render(scores))
    if args.json:
        args.json.write_bytes(evaluate.to_json(scores))
        print(f"scores written to {args.json}")
    missed = [] if args.no_floor else evaluate.check(scores)
    if missed:
        more = f" (and {len(missed) - 1} more: {'; '.join(missed[1:])})" if len(missed) > 1 else ""
        raise UserError(f"quality floor missed: {missed[0]}{more}", EXIT_FLOOR)
    return 0


def _eval_fleet(args: argparse.Namespace) -> int:
    from gangwatch.evaluation import fleetscore

    score = fleetscore.run(_fleet(args), args.work)
    print(fleetscore.render(score))
    if args.json:
        args.json.write_bytes(fleetscore.to_json(score))
        print(f"scores written to {args.json}")
    floor = fleetscore.FleetFloor(false_pages_per_day_500=args.max_false_pages)
    missed = [] if args.no_floor else fleetscore.check(score, floor)
    if missed:
        more = f" (and {len(missed) - 1} more: {'; '.join(missed[1:])})" if len(missed) > 1 else ""
        raise UserError(f"fleet floor missed: {missed[0]}{more}", EXIT_FLOOR)
    return 0


def _fleet_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("a fleet day (--fleet)")
    g.add_argument("--fleet", action="store_true",
                   help="many jobs of every size on one fleet for hours, with churn, ordinary life and faults at "
                   "published rates (Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs)")
    g.add_argument("--gpus", type=positive(integer), default=512, help="the fleet's GPUs, whole nodes of 8 "
                   "(default 512)")
    g.add_argument("--hours", type=positive(number), default=2.0, help="hours of event time (default 2)")
    g.add_argument("--fault-rate", type=number, default=1.0, metavar="X",
                   help="the published fault rate times X, so that a short fleet has faults to score (default 1)")
    if not any(a.dest == "seed" for a in p._actions):  # (`simulate` has its own)
        g.add_argument("--seed", type=integer, default=1, help="the fleet's random seed (default 1)")


def _eval_invariance(args: argparse.Namespace) -> int:
    from gangwatch.evaluation import invariance

    show = (lambda job, n, found: print(f"  {job.name}: {n} perturbed, {len(found)} changed", file=sys.stderr,
                                        flush=True)) if not args.quiet else None
    report = invariance.run(args.size, args.only, progress=show)
    print(report.render())
    if not args.no_floor and len(report.changed) > args.max_changed:
        raise UserError(f"invariance: {len(report.changed)} perturbed replays changed a decision (at most "
                        f"{args.max_changed} allowed): {report.changed[0]}", EXIT_FLOOR)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gangwatch.cli.replay import prepare_out
    from gangwatch.producers.simulate import Fault, Scenario, write
    from gangwatch.streams import replay

    sc = Scenario("demo", seed=7, tp=8, pp=2, dp=4, duration_s=240.0, faults=(
        Fault("thermal_straggler", at_s=40.0, rank=21, magnitude=0.12),
        Fault("xid79", at_s=150.0, node="n005", params={"gpu": 3}),
    ))
    out = args.out
    prepare_out(out, append=False)
    stream, truth = write(sc, out)
    print(f"simulated {sc.tp * sc.pp * sc.dp} ranks on {sc.pp * sc.dp} nodes for {sc.duration_s:.0f} s: "
          f"a thermal straggler (rank 21 on n002, its compute 12% slower: its steps less, compute being only part "
          f"of a step) at 40 s, then Xid 79 on n005 gpu 3 at 150 s -> {stream}")
    store = None
    if not args.no_store:
        from gangwatch.sinks.store import open_store

        store = open_store(f"chdb:{out / 'store'}")
    try:
        summary = replay.run([stream], out, store)
    finally:
        if store is not None:
            store.close()
    print(console.summary(summary))
    print(console.outcome(out))
    if store is not None:
        print(f"\nSQL over the store: {command_name()} store query \"SELECT class, culprit_nodes, stage_names, "
              f"stage_seconds FROM gw_incidents FINAL\" --out {out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("simulate", help="generate contract-v1 telemetry of a training job with injected faults",
                       description="Deterministic (by seed) telemetry of a synchronous training job: steps, "
                       "heartbeats, NVML samples, kernel-log lines, stack/flight sweeps after stalls, NCCL-timeout "
                       "storms; writes NAME.jsonl.gz and NAME.truth.json (the ground truth).",
                       epilog="fault kinds: " + "; ".join(f"{k}: {what}" for k, what in FAULT_HELP.items()) +
                       ". example: gangwatch simulate --dp 8 --fault thermal_straggler:60:r21:0.1 --out sim/")
    opt(m, "--out", type=Path, default=Path("sim"), env="GANGWATCH_SIM_OUT", help="output folder")
    m.add_argument("--suite", help="write a whole scenario suite instead (standard)")
    m.add_argument("--size", choices=["ci", "full"], default="full", help="suite size (default full)")
    m.add_argument("--only", nargs="*", help="with --suite: only scenarios whose name contains one of these")
    m.add_argument("--name", default="sim", help="scenario name, the files' stem (default sim)")
    m.add_argument("--seed", type=integer, default=1, help="random seed (default 1)")
    m.add_argument("--tp", type=positive(integer), default=8, help="tensor-parallel size (default 8)")
    m.add_argument("--pp", type=positive(integer), default=2, help="pipeline stages (default 2)")
    m.add_argument("--dp", type=positive(integer), default=8, help="data-parallel replicas (default 8)")
    m.add_argument("--gpus-per-node", type=positive(integer), default=8, help="GPUs (ranks) per node (default 8)")
    m.add_argument("--duration", type=positive(number), default=300.0, help="seconds of event time (default 300)")
    m.add_argument("--batch", action="store_true", help="pack each node's step records into batch messages")
    m.add_argument("--fault", action="append", metavar="KIND:AT_S:WHERE[:MAGNITUDE]",
                   help="inject a fault; WHERE is a node (n003) or a rank (r21); repeatable")
    _fleet_options(m)
    m.set_defaults(func=cmd_simulate)

    ev = sub.add_parser("eval", help="replay a scenario suite and score it against the ground truth",
                        description="Generate each scenario, replay it, and score detection and localization "
                        "latency, recall, eviction precision, innocent nodes evicted per culprit and false "
                        "evictions on healthy, planned and benign runs. Prints a table, then checks every class "
                        "against its quality floor (declared with each class in schemas/classes.py).",
                        epilog="Exits 7 when a class falls below its floor (recall, localization, innocent "
                        "evictions, a fault detected or localized over its stage budget, a false eviction on a "
                        "healthy, planned or benign run, a heterogeneous rank not reported), naming the class and "
                        "the floor in one line on stderr: that is what fails CI.")
    ev.add_argument("--suite", default="standard",
                    help="scenario suite (default: standard); 'invariance': small jobs of several sizes replayed "
                    "with one healthy node's clock off or stepped and in event-time order, each compared with "
                    "its unperturbed replay (no action or incident may change)")
    ev.add_argument("--max-changed", type=integer, default=0, metavar="N",
                    help="with --suite invariance: fail when more than N perturbed replays changed a decision "
                    "(default 0)")
    opt(ev, "--size", choices=["ci", "full"], default="full", env="GANGWATCH_EVAL_SIZE",
        help="ci: a quarter of the ranks, fits the CI budget; full: 128-2,048 ranks")
    ev.add_argument("--only", nargs="*", help="only scenarios whose name contains one of these")
    ev.add_argument("--json", type=Path, help="also write the scores as JSON here")
    ev.add_argument("--work", type=Path, help="keep generated streams and outputs here (default: a temp dir)")
    ev.add_argument("-q", "--quiet", action="store_true", help="no per-scenario progress lines")
    ev.add_argument("--no-floor", action="store_true", help="print the scores only; never fail on a missed floor")
    _fleet_options(ev)
    ev.add_argument("--max-false-pages", type=number, default=0.05, metavar="N",
                    help="with --fleet: fail above N false pages a day per 500 GPUs (default 0.05); a fleet day "
                    "also fails on any false eviction, any hardware fault missed, and hard faults detected over "
                    "15 s or localized over 60 s (p90)")
    ev.set_defaults(func=cmd_eval)

    d = sub.add_parser("demo", help="simulate a small job with two faults and replay it (no server needed)",
                       description="The quickest look at gangwatch: 64 simulated ranks, a thermal straggler and "
                       "then an Xid 79, replayed through the detectors and triage into the embedded chDB store.")
    d.add_argument("--out", type=Path, default=Path("gangwatch-demo"), help="output folder (default ./gangwatch-demo)")
    d.add_argument("--no-store", action="store_true", help="JSONL only, no chDB store")
    d.set_defaults(func=cmd_demo)
