"""Benchmark: what Faust alone delivers to an agent, messages per second, with its own monitor and with the worker's.

What the worker pays per message before its own code runs: a Faust agent that takes its events in batches
(`stream.take_events`, as the worker's agents do) and does nothing with them, reading a pre-filled topic of
batch envelopes from the real broker. Run alternately in fresh processes (each its own consumer group):

- `faust-monitor`: Faust's default monitor, which Faust calls four times per message;
- `worker-monitor`: the worker's (`streams.metrics.instrument`: Faust's Prometheus sensor counting per batch).

Both cap the fetch wait as the worker does. Reported: messages/s from the first message the agent got to the last
(start-up and the group's join left out), each run and the median per mode, and their ratio. Asserts nothing.

    deploy/kafka/broker.sh start
    PYTHONPATH=. python bench/bench_faust_handover.py [--messages 100000] [--per-message 16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

MODES = ("faust-monitor", "worker-monitor")


def child(args: argparse.Namespace) -> None:
    """One Faust worker reading `args.topic` to its end; prints {"seconds": ...} and exits."""
    import faust
    from gangwatch.streams import faust_adapter
    from gangwatch.streams.metrics import WorkerMetrics, instrument

    faust_adapter.cap_fetch_wait(100)  # the worker's default fetch wait
    app = faust.App(f"bench-handover-{uuid.uuid4().hex[:8]}", broker=f"kafka://{args.bootstrap}",
                    store="memory://", datadir=args.datadir, autodiscover=False, web_enabled=False, topic_partitions=1,
                    consumer_auto_offset_reset="earliest", stream_wait_empty=False)
    metrics = WorkerMetrics() if args.child == "worker-monitor" else None
    if metrics is not None:
        instrument(app, metrics)
    topic = app.topic(args.topic, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw")
    seen, first = 0, None

    @app.agent(topic)
    async def count(stream: faust.StreamT) -> None:
        nonlocal seen, first
        async for events in stream.take_events(1000, within=0.05):
            if first is None:
                first = time.perf_counter()
            if metrics is not None:
                metrics.messages_in(events)  # what the worker's agents do with each batch
            seen += len(events)
            if seen >= args.messages:
                print(json.dumps({"seconds": time.perf_counter() - first, "messages": seen}), flush=True)
                os._exit(0)  # a bench child: nothing to clean up

    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


def fill(bootstrap: str, topic: str, messages: int, per_message: int) -> None:
    from gangwatch.schemas import Step, encode_batch
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1)])
    admin.close()
    value = encode_batch([Step(ts=1.7e9 + k, job="j", rank=k, step=1, step_s=1.0) for k in range(per_message)],
                         1.7e9)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20)
    for _ in range(messages):
        producer.send(topic, key=b"j", value=value)
    producer.flush()
    producer.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default=os.environ.get("GANGWATCH_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--per-message", type=int, default=16, help="records per envelope (the payload's size)")
    p.add_argument("--repeat", type=int, default=3, help="runs of each mode, alternating")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--topic", help=argparse.SUPPRESS)
    p.add_argument("--datadir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    topic = f"bench-handover-{uuid.uuid4().hex[:8]}"
    print(f"pre-filling {args.messages:,} messages of {args.per_message} records into {topic} ...")
    fill(args.bootstrap, topic, args.messages, args.per_message)
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.repeat):
        for mode in MODES:
            with tempfile.TemporaryDirectory(prefix="bench-handover-") as datadir:  # Faust's app directory
                out = subprocess.run([sys.executable, __file__, "--child", mode, "--topic", topic, "--bootstrap",
                                      args.bootstrap, "--messages", str(args.messages), "--datadir", datadir],
                                     capture_output=True, text=True, timeout=600, check=False)
            # Faust's worker logs what its process prints: the result is on a line of its own, or inside a log line
            found = [x[x.index('{"seconds"'):] for x in (out.stdout + out.stderr).splitlines() if '{"seconds"' in x]
            if not found:
                sys.exit(f"the {mode} run printed no result (exit {out.returncode}):\n{out.stderr[-3000:]}")
            got = json.loads(found[0].strip())
            rates[mode].append(got["messages"] / got["seconds"])
            print(f"  {mode:14s} {rates[mode][-1]:10,.0f} messages/s")
    med = {m: statistics.median(r) for m, r in rates.items()}
    print(f"\nbench_faust_handover: {args.messages:,} messages of {args.per_message} records, {args.repeat} runs each")
    print(f"{'mode':14s} {'median messages/s':>18s}  runs")
    for m in MODES:
        print(f"{m:14s} {med[m]:18,.0f}  {', '.join(f'{r:,.0f}' for r in rates[m])}")
    print(f"worker-monitor / faust-monitor: {med['worker-monitor'] / med['faust-monitor']:.2f}")


if __name__ == "__main__":
    main()
