"""`gangwatch agent`: the node agent, one per node (producers/agent/)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
from pathlib import Path

from gangwatch.cli.options import at_least_zero, integer, number, opt, port, positive
from gangwatch.cli.services import check_kafka_credentials, kafka_security

DESCRIPTION = """\
Run one per node, next to the training processes. It collects:

  gpu    NVML samples of every GPU every --gpu-every seconds: temperature, power, SM clock,
         utilization, throttle reasons, ECC counts, pending row remaps, PCIe replays, NVLink CRC
  hw     hardware events from the kernel log (Xid with its firmware dump folded in, ECC,
         NVLink/SXid, PCIe AER, NIC link changes), from /dev/kmsg, `journalctl -k -f` or a file
  stack  on a `collect_stacks` action for a job with ranks on this node: `py-spy dump` of each
         rank's process (found by GANGWATCH_JOB / TORCHELASTIC_RUN_ID / SLURM_JOB_ID and RANK in
         its environment), snapshot = the action's id
  flight new PyTorch flight-recorder dumps in --flight-dir (TORCH_FR_DUMP_TEMP_FILE + rank)

and sends them to Kafka: gpu and hw on <prefix>node-events keyed by node; stack and flight
on <prefix>traces keyed by job; it reads actions from <prefix>actions. It starts without a
broker: records spool to --spool-dir (bounded) and are sent, in order, once Kafka answers.
Prometheus can scrape it on --metrics-port (polls per collector, queue, losses, records by
kind, spool bytes). Stop with Ctrl-C or TERM: what is queued is sent (or spooled) first.

It is also the relay of this node's training processes (--relay): trainer clients whose
GANGWATCH_RELAY names its socket hand it their steps, heartbeats and events, and it sends them
packed per job into large envelopes (--relay-max-records, --relay-linger-s) on <prefix>telemetry
and <prefix>jobs; while Kafka is slow or away it spools them and goes on taking them (it never
waits on the broker for more than a second). A client without GANGWATCH_RELAY, refused, or whose
agent is gone, sends to Kafka itself."""

EPILOG = """\
privileges: NVML needs none. /dev/kmsg needs root or CAP_SYSLOG where kernel.dmesg_restrict=1
(journalctl -k: root or the systemd-journal group). py-spy, and reading /proc/PID/environ of
another user's processes, need root or CAP_SYS_PTRACE (in a container: --cap-add SYS_PTRACE).
A collector that cannot read its source is left out, with one line in the log saying why.

example: gangwatch agent --bootstrap kafka1:9092 --flight-dir /var/lib/fr"""


def cmd_agent(args: argparse.Namespace) -> int:
    from gangwatch.producers.agent import Agent, AgentSettings

    logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")
    level = getattr(logging, args.loglevel.upper())
    logging.getLogger("gangwatch").setLevel(level)
    # kafka-python logs every retry while the broker or a topic is missing; the outbox says it once
    logging.getLogger("kafka").setLevel(level if level == logging.DEBUG else logging.CRITICAL)
    from gangwatch.producers.trainer.relay import relay_path

    given = {"node": args.node, "bootstrap": args.bootstrap, "topic_prefix": args.prefix, "kmsg": args.kmsg,
             "gpu_every_s": args.gpu_every, "flight_dir": args.flight_dir, "spool_dir": args.spool_dir,
             "from_start": args.from_start, "py_spy": args.py_spy, "metrics_port": args.metrics_port,
             "heartbeat_s": args.heartbeat_s, "relay_max_records": args.relay_max_records,
             "relay_linger_s": args.relay_linger_s}
    settings = AgentSettings(**{k: v for k, v in given.items() if v is not None})  # the rest: its defaults
    settings = dataclasses.replace(settings, relay=relay_path(args.relay, settings.node))
    # wrong credentials are one line; a broker not up yet is no reason to stop (the agent spools until it is)
    check_kafka_credentials(settings.bootstrap, kafka_security(), timeout_s=5.0)
    agent = Agent(settings)
    if args.once:
        agent.run_once()
        return 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    agent.run()
    return 0


def envelope_size(raw: str) -> int:
    value = positive(integer)(raw)
    if value > 1000:
        raise ValueError("at most 1000 (records in one batch message)")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    a = sub.add_parser("agent", help="the node agent: GPU samples, kernel-log events, stack sweeps and "
                       "flight-recorder dumps of this node, to Kafka (run one per node)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=DESCRIPTION,
                       epilog=EPILOG)
    opt(a, "--node", help="this node's name, as the job's ranks name it", shown_default="$SLURMD_NODENAME or the "
        "hostname")
    opt(a, "--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers, comma-separated")
    opt(a, "--prefix", env="GANGWATCH_TOPIC_PREFIX", default="gw.", help="topic name prefix")
    opt(a, "--kmsg", default="auto", metavar="SOURCE",
        help="kernel log: auto (/dev/kmsg if readable, else journalctl -k, else none), /dev/kmsg, journal, off, "
        "or a FILE followed like tail -F (across rotation and truncation)")
    opt(a, "--gpu-every", type=at_least_zero(number), default=5.0, help="seconds between GPU samples; 0: none")
    opt(a, "--heartbeat-s", type=at_least_zero(number), default=5.0,
        help="seconds between checks for ranks frozen but alive (stopped, traced, uninterruptible): each gets a "
        "heartbeat from the agent, so the pipeline sees a hang to sweep, not a death to evict; at most the jobs' "
        "own heartbeat period; 0: none")
    opt(a, "--flight-dir", type=Path,
        help="directory PyTorch writes flight-recorder dumps to; without it, none are watched")
    opt(a, "--spool-dir", type=Path, shown_default="<temp dir>/gangwatch-agent-spool/<node>",
        help="where records wait while Kafka is away, one directory per agent (64 MiB at most per node or job)")
    opt(a, "--py-spy", help="the py-spy executable", shown_default="py-spy on the PATH or beside this Python")
    opt(a, "--metrics-port", type=port(integer), default=9465,
        help="serve Prometheus metrics on this port (/metrics); taken by another process (a second agent on the "
        "host): a free port, named in the log; 0: none")
    opt(a, "--relay", metavar="PATH", env="GANGWATCH_RELAY",
        shown_default="<temp dir>/gangwatch-agent/<node>.sock",
        help="the Unix socket the trainer clients of this node hand their records to (those whose "
        "GANGWATCH_RELAY names it; {node} in either stands for the node's name); off: no relay")
    opt(a, "--relay-max-records", type=envelope_size, default=512,
        help="records per envelope the relay sends at most (1-1000)")
    opt(a, "--relay-linger-s", type=at_least_zero(number), default=0.25,
        help="seconds an envelope of the relay waits for more records; framework and lifecycle records go at once")
    opt(a, "--from-start", type=bool, default=False,
        help="read the kernel log from its start and publish the flight dumps already in --flight-dir "
        "(default: only what appears from now on)")
    a.add_argument("--once", action="store_true",
                   help="one pass of the GPU, kernel-log and flight collectors, send (or spool), exit; no actions "
                   "are answered (for tests and cron)")
    opt(a, "-l", "--loglevel", dest="loglevel", default="info", choices=("debug", "info", "warning", "error"),
        help="log level")
    a.set_defaults(func=cmd_agent)
