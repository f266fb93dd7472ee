"""Benchmark: the Faust worker on the real broker, next to a raw consumer that only decodes.

1. Pre-fills `gw.telemetry` with N records of one 2,048-rank job (steps and
   heartbeats in batch envelopes: by default 16 records, one node's step, as a
   node sidecar sends them; `--envelopes 8,64` measures each size in turn, on
   topics of its own). `--jitter S`: ranks report up to S seconds late, so that
   the envelopes of one step overlap in time (each in time order, as a node agent's
   relay packs it).
2. Raw: an aiokafka consumer (no group) reads and `schemas.decode`s them all. Beside it, the runner
   alone: `JobRunner.on_batch` on the same messages in this process (decode + the core + the runner's
   bookkeeping, CPU seconds): the worker minus Kafka and Faust.
3. Worker: `gangwatch worker` in a subprocess (defaults, `--no-silence`) consumes
   them; progress is the records it handed to its cores (its metrics endpoint), polled every 0.1 s.
   Reported: the steady rate (first commit -> last commit) and the rate from spawn,
   and its ratio to the raw consumer on the same topic, per envelope size.
4. Latency: a fresh worker (silence on) and fresh topics; `--jobs` jobs sharing
   the ranks are offered a fixed load of live records (event time = wall time),
   and a fatal Xid hits a node every `--xid-every` s (jobs in turn, so each Xid is
   its own incident); it goes node-events -> router -> by-job -> the job's core
   and becomes a finding and, after the triage's settle time, an action. An
   output's latency is when the bench saw it on its topic minus when the record
   that made it decidable was produced (found by replaying what was produced
   through one core per job): decisions wait on event time for evidence by
   design (storm windows, settle time, lateness); that wait is not latency.

With `--baseline CHECKOUT` (another checkout with its own `.venv`, e.g. `git worktree add /tmp/base HEAD~3`
and `/tmp/base/gw --help` to make its venv) step 3 runs that checkout's worker and this one's alternately
(`--repeat` times each) on the same topic, each as a consumer group of its own: before and after, side by
side in one run. `--seconds 0` skips the latency run.

Prints a table with the targets; asserts nothing.

    deploy/kafka/broker.sh start
    PYTHONPATH=. python bench/bench_worker.py [--records 1000000] [--rate 20000] [--seconds 20]
    PYTHONPATH=. python bench/bench_worker.py --records 300000 --envelopes 16,64 --seconds 0 --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from operator import attrgetter
from pathlib import Path

import orjson
from gangwatch.schemas import DecodeError, Heartbeat, Hw, Job, RankInfo, Step, decode, encode, encode_batch
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.topic_admin import create_topics
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient

from tests.integration.kafkakit import WorkerProc, group_members, wait_for, worker_args

GPUS = 8


def make_job(ranks: int, ts: float, hb: float, job: str = "j1", node_prefix: str = "n") -> Job:
    return Job(ts=ts, job=job, heartbeat_s=hb, ranks=[
        RankInfo(rank=r, node=f"{node_prefix}{r // GPUS:05d}", gpu=r % GPUS, tp=r % GPUS, pp=0, dp=r // GPUS)
        for r in range(ranks)])


def node_batch(node: int, step: int, ts: float, job: str = "j1", first_rank: int | None = None) -> bytes:
    """One node's report of one step: a step and a heartbeat per rank (16 records)."""
    recs = []
    base = node * GPUS if first_rank is None else first_rank
    for g in range(GPUS):
        r = base + g
        recs.append(Step(ts=ts, job=job, rank=r, step=step, step_s=1.0, compute_s=0.6, comm_wait_s=0.35,
                         data_wait_s=0.01))
        recs.append(Heartbeat(ts=ts, job=job, rank=r, step=step))
    return encode_batch(recs, ts)


# --- throughput ----------------------------------------------------------------------


def telemetry(ranks: int, records: int, t0: float, jitter: float = 0.0):
    """`records` step and heartbeat records of one job, node by node within each step (the order sidecars send).

    `jitter` > 0: each rank reports its step up to that many seconds late (seeded): the envelopes of one step
    overlap in time (0: every node's records at one time, nodes 0.1 ms apart). Envelopes are packed in time
    order (`in_envelope`), as a node agent's relay packs them."""
    rnd = random.Random(7)
    n = 0
    step = 0
    while True:
        step += 1
        for node in range(ranks // GPUS):
            ts = t0 + step * 1.0 + node * 1e-4
            late = [round(rnd.uniform(0, jitter), 6) if jitter else 0.0 for _ in range(GPUS)]
            for g in range(GPUS):
                r = node * GPUS + g
                yield Step(ts=ts + late[g], job="j1", rank=r, step=step, step_s=1.0, compute_s=0.6,
                           comm_wait_s=0.35, data_wait_s=0.01)
                yield Heartbeat(ts=ts + late[g], job="j1", rank=r, step=step)
                n += 2
                if n >= records:
                    return


def in_envelope(chunk: list) -> bytes:
    """Records as one batch envelope, in time order (stable), as the node agent's relay sends them."""
    chunk = sorted(chunk, key=attrgetter("ts"))
    return encode_batch(chunk, chunk[0].ts)


def prefill(bootstrap: str, t: TopicSettings, ranks: int, records: int,
            per_msg: int = 2 * GPUS, jitter: float = 0.0) -> tuple[int, int, float]:
    """Job record + `records` telemetry records in envelopes of `per_msg`; returns (records, messages, seconds)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=1 << 20,
                             compression_type=None, max_request_size=16 << 20)
    t0 = 1_700_000_000.0
    producer.send(t.jobs, key=b"j1", value=encode(make_job(ranks, t0, hb=5.0)))
    n_msgs = records // per_msg
    started = time.perf_counter()
    chunk: list = []
    for rec in telemetry(ranks, n_msgs * per_msg, t0, jitter):
        chunk.append(rec)
        if len(chunk) == per_msg:
            producer.send(t.telemetry, key=b"j1", value=in_envelope(chunk))
            chunk = []
    producer.flush()
    producer.close()
    return n_msgs * per_msg, n_msgs, time.perf_counter() - started


def runner_alone(t: TopicSettings, ranks: int, records: int, per_msg: int, batch: int = 300,
                 jitter: float = 0.0) -> float:
    """Records per CPU second of `JobRunner.on_batch` alone, in this process, on the same messages the worker
    reads (job record, then envelopes of `per_msg`), `batch` messages per call and the job's state packed every
    20 calls: what the worker's logic costs without Kafka and Faust around it."""
    import gc

    from gangwatch.streams.runner import JobRunner, Msg

    t0 = 1_700_000_000.0
    msgs = [Msg(t.jobs, 0, 0, b"j1", encode(make_job(ranks, t0, hb=5.0)), t0)]
    chunk: list = []
    for rec in telemetry(ranks, records // per_msg * per_msg, t0, jitter):
        chunk.append(rec)
        if len(chunk) == per_msg:
            msgs.append(Msg(t.telemetry, 0, len(msgs), b"j1", in_envelope(chunk), t0))
            chunk = []
    runner = JobRunner(t, silence=False, wall=lambda: t0 + 1e6)
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()  # as the worker does (streams/worker.py run())
    gc.set_threshold(50_000, 20, 20)
    try:
        start = time.process_time()
        for k, i in enumerate(range(0, len(msgs), batch)):
            runner.on_batch(msgs[i:i + batch])
            if k % 20 == 0:
                runner.state_of("j1")
        cpu = time.process_time() - start
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    return runner.records / cpu


async def raw_consume(bootstrap: str, topic: str, messages: int) -> tuple[int, float]:
    """Read and decode `messages` messages; returns (records, seconds from first message to last)."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition as ATP

    meta = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)  # the partitions, from fresh metadata
    parts = meta.partitions_for_topic(topic) or set()
    meta.close()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=8 << 20,
                                fetch_max_bytes=64 << 20)
    await consumer.start()
    try:
        tps = [ATP(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        seen = records = 0
        first = None
        while seen < messages:
            batch = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            for msgs in batch.values():
                if first is None and msgs:
                    first = time.perf_counter()
                for m in msgs:
                    records += sum(1 for v in decode(m.value) if not isinstance(v, DecodeError))
                seen += len(msgs)
        return records, time.perf_counter() - (first or time.perf_counter())
    finally:
        await consumer.stop()


def processed(port: int) -> int:
    """Records the worker has handed to its cores so far (its `gangwatch_records_total`, summed over kinds)."""
    import urllib.request

    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return 0
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("gangwatch_records_total{")))


def worker_throughput(bootstrap: str, t: TopicSettings, app_id: str, records: int, per_msg: int,
                      log: Path, checkout: Path | None = None) -> dict[str, float]:
    """The worker of `checkout` (None: this one) consuming the pre-filled topic as group `app_id`.

    Progress is what the worker handed to its cores (its metrics endpoint, polled every 0.1 s), not its
    committed offsets: a job's commits move only when its state is saved (a 100k-rank job's, whose state takes
    ~0.1 s to pack, every second or two), which would make a short run look slower than it is. The worker runs with
    its defaults (its commit interval too), but for `--no-silence` and no standby replica."""
    from tests.integration.daemons import free_port

    port = free_port()
    spawn = time.perf_counter()
    args = worker_args(bootstrap, app_id, t, "--no-silence", "--standby-replicas", "0", "--metrics-port", str(port))
    if checkout is None:
        w = WorkerProc(args, log)
    else:
        w = WorkerProc([str(checkout / ".venv" / "bin" / "python"), *args[1:]], log, checkout=checkout)
    first_t = first_n = None
    last_n = 0
    last_t = spawn
    try:
        deadline = spawn + 600
        while time.perf_counter() < deadline:
            n = processed(port)
            now = time.perf_counter()
            if n > last_n:
                if first_t is None:
                    first_t, first_n = now, n
                last_n, last_t = n, now
            if n >= records:
                break
            if not w.alive():
                raise SystemExit(f"worker died:\n{w.tail()}")
            time.sleep(0.1)
    finally:
        w.stop()
    if last_n < records:
        raise SystemExit(f"worker processed {last_n}/{records} records before the deadline:\n{w.tail()}")
    steady = (last_n - first_n) / max(last_t - first_t, 1e-9)
    return {"steady": steady, "from_spawn": records / (last_t - spawn), "wall": last_t - spawn}


# --- latency -------------------------------------------------------------------------


def latency(bootstrap: str, t: TopicSettings, app_id: str, ranks: int, jobs: int, rate: float, seconds: float,
            xid_every: float, log: Path, extra: tuple[str, ...] = ()) -> dict[str, dict[str, float]]:
    """Live load on `jobs` jobs of `ranks / jobs` ranks; a fatal Xid every `xid_every` s, jobs in turn.

    Jobs take turns so that each Xid opens its own incident (Xids of one job within the
    triage's settle time become one incident and one action).
    """
    per_job = ranks // jobs
    names = [f"j{j:02d}" for j in range(jobs)]
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, max_request_size=16 << 20)
    w = WorkerProc(worker_args(bootstrap, app_id, t, *extra), log)
    wait_for(lambda: group_members(bootstrap, app_id) == 1, 120, "the worker to join", proc=w)
    now = time.time()  # the jobs start now: no silence before their first records
    for j, name in enumerate(names):
        producer.send(t.jobs, key=name.encode(), value=encode(make_job(per_job, now, hb=1.0, job=name,
                                                                       node_prefix=f"n{j:02d}-")))
    producer.flush()
    seen: dict[str, dict[str, float]] = {"findings": {}, "actions": {}}  # id -> wall time seen
    log_: list[tuple[str, bytes]] = []  # (job, message) in the order produced
    stop = threading.Event()

    def watch() -> None:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                 fetch_max_wait_ms=10)
        tps = [TopicPartition(topic, p) for topic in (t.findings, t.actions)
               for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        while not stop.is_set():
            for tp, msgs in consumer.poll(timeout_ms=20).items():
                at = time.time()
                kind = "findings" if tp.topic == t.findings else "actions"
                for m in msgs:
                    seen[kind].setdefault(orjson.loads(m.value)["id"], at)
        consumer.close()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        nodes = per_job // GPUS
        msgs_per_s = rate / (2 * GPUS)
        sent = xids = 0
        steps = [0] * jobs
        started = time.time()
        next_xid = started + 2.0
        while (elapsed := time.time() - started) < seconds:
            due = int(elapsed * msgs_per_s)
            while sent < due:
                j, node = divmod(sent % (jobs * nodes), nodes)
                if node == 0:
                    steps[j] += 1
                value = node_batch(node, steps[j], time.time(), job=names[j], first_rank=node * GPUS)
                producer.send(t.telemetry, key=names[j].encode(), value=value)
                log_.append((names[j], value))
                sent += 1
            if time.time() >= next_xid:
                j = xids % jobs
                victim = (xids // jobs * 7 + 3) % nodes
                xids += 1
                hw = Hw(ts=time.time(), node=f"n{j:02d}-{victim:05d}", gpu=0, source="xid", code=79,
                        message="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.")
                producer.send(t.node_events, key=hw.node.encode(), value=encode(hw))
                log_.append((names[j], encode(hw)))
                next_xid += xid_every
            time.sleep(0.002)
        producer.flush()
        ended = time.time()
        offered = sent * 2 * GPUS / (ended - started)
        time.sleep(3.0)  # let the outputs decidable before the end come out
    finally:
        stop.set()
        watcher.join(5)
        producer.close()
        w.stop()
    trigger = triggers(log_, [make_job(per_job, now, hb=1.0, job=n, node_prefix=f"n{j:02d}-")
                              for j, n in enumerate(names)])
    out: dict[str, dict[str, float]] = {"load": {"offered": offered, "xids": xids}}
    for kind, got in seen.items():
        # outputs no record triggers (the silence timer's, once the load stops) are not counted
        lat = sorted(at - trigger[i] for i, at in got.items() if i in trigger and trigger[i] <= ended)
        out[kind] = {"n": len(lat), "p50": statistics.median(lat) if lat else float("nan"),
                     "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan"),
                     "max": lat[-1] if lat else float("nan")}
    return out


def triggers(produced: list[tuple[str, bytes]], jobs: list[Job]) -> dict[str, float]:
    """Output id -> event time (= wall time produced) of the record whose arrival made the core emit it.

    Replays what was produced through one `Core` per job, as the worker runs them, so an
    output's latency is measured from the moment it became decidable, however long the
    detectors deliberately wait on event time (storm windows, settle times, grids).
    """
    from gangwatch.triage.core import Core

    cores = {}
    for job in jobs:
        cores[job.job] = Core()
        cores[job.job].process(job)
    first: dict[str, float] = {}
    for job, value in produced:
        for rec in decode(value):
            out = cores[job].process(rec)
            for o in (*out.findings, *out.actions):
                first.setdefault(o.id, rec.ts)
    return first


# --- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--ranks", type=int, default=2048)
    p.add_argument("--records", type=int, default=1_000_000, help="records pre-filled for the throughput runs")
    p.add_argument("--rate", type=float, default=20_000, help="offered load for the latency run, records/s")
    p.add_argument("--seconds", type=float, default=30.0, help="length of the latency run")
    p.add_argument("--xid-every", type=float, default=0.5, help="seconds between injected fatal Xids")
    p.add_argument("--jobs", type=int, default=16, help="jobs sharing the ranks in the latency run")
    p.add_argument("--envelopes", default="16", metavar="N[,N...]",
                   help="records per batch envelope (message), each size measured in turn (default: 16)")
    p.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                   help="another checkout (with its .venv) whose worker runs beside this one's, alternately")
    p.add_argument("--jitter", type=float, default=0.0, metavar="S",
                   help="each rank reports up to S seconds late (seeded): the envelopes of one step overlap in time, "
                        "as a synchronous job's nodes report (default 0: each node at one time, nodes apart)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each worker per envelope size (default: 1)")
    args = p.parse_args(argv)
    if args.baseline is not None and not (args.baseline / ".venv" / "bin" / "python").exists():
        p.error(f"{args.baseline} has no .venv: run {args.baseline}/gw --help once to make it")
    sizes = [int(x) for x in args.envelopes.split(",") if x.strip()]

    run = f"bench{uuid.uuid4().hex[:8]}"
    logs = Path(tempfile.mkdtemp(prefix=f"{run}-"))
    admin = KafkaAdminClient(bootstrap_servers=args.bootstrap)
    made: list[str] = []
    try:
        through = []  # (records per envelope, raw records/s, worker figures), side by side in this run
        for k, size in enumerate(sizes):
            t = TopicSettings.from_env(prefix=f"{run}e{k}.")
            made += create_topics(t, args.bootstrap)
            print(f"pre-filling {args.records:,} records of a {args.ranks:,}-rank job into {t.telemetry}, "
                  f"{size} per envelope ...", file=sys.stderr)
            records, messages, fill_s = prefill(args.bootstrap, t, args.ranks, args.records, size, args.jitter)
            print(f"  {records:,} records in {messages:,} messages, produced in {fill_s:.1f} s", file=sys.stderr)
            print("raw aiokafka consumer + decode ...", file=sys.stderr)
            raw_records, raw_s = asyncio.run(raw_consume(args.bootstrap, t.telemetry, messages))
            print("the runner alone, in this process ...", file=sys.stderr)
            alone = runner_alone(t, args.ranks, records, size, jitter=args.jitter)
            codes = [("this", None)] if args.baseline is None else [("baseline", args.baseline), ("this", None)]
            for rep in range(args.repeat):
                for code, checkout in codes:
                    print(f"Faust worker ({code}) ...", file=sys.stderr)
                    wk = worker_throughput(args.bootstrap, t, f"{run}-tp{k}-{code}{rep}", records + 1, size,
                                           logs / f"throughput{k}-{code}{rep}.log", checkout)
                    through.append((size, code if args.baseline else "", raw_records / raw_s, alone, wk))

        lat = None
        if args.seconds > 0:
            print(f"latency at {args.rate:,.0f} records/s for {args.seconds:.0f} s ...", file=sys.stderr)
            t2 = TopicSettings.from_env(prefix=f"{run}l.")
            made += create_topics(t2, args.bootstrap)
            lat = latency(args.bootstrap, t2, f"{run}-lat", args.ranks, args.jobs, args.rate, args.seconds,
                          args.xid_every, logs / "latency.log")
    except BaseException:
        print(f"bench_worker: the workers' logs are kept in {logs}", file=sys.stderr)
        raise
    finally:
        mine = [x for x in admin.list_topics() if x.startswith(run)]
        if mine:
            admin.delete_topics(mine)
        admin.close()

    rows = []
    shown = set()
    for size, code, raw_rate, alone, wk in through:
        if size not in shown:
            shown.add(size)
            rows.append((f"[{size}/envelope] raw consumer + decode", f"{raw_rate:,.0f} records/s", ""))
            rows.append((f"[{size}/envelope] runner alone (this code)", f"{alone:,.0f} records/cpu-s", ""))
        who = f"worker ({code})" if code else "worker"
        rows += [
            (f"[{size}/envelope] {who}, steady", f"{wk['steady']:,.0f} records/s", ">= 150,000 (a 100k-rank job)"),
            (f"[{size}/envelope] {who} / raw", f"{wk['steady'] / raw_rate:.0%}", ">= 50%"),
            (f"[{size}/envelope] {who}, from spawn", f"{wk['from_spawn']:,.0f} records/s ({wk['wall']:.1f} s)", ""),
        ]
    if lat is not None:
        rows.append((f"latency: offered load ({args.jobs} jobs)",
                     f"{lat['load']['offered']:,.0f} records/s, {lat['load']['xids']} Xids", ""))
    for kind in ("actions", "findings") if lat is not None else ():
        m = lat[kind]
        rows.append((f"{kind} latency p50 / p99 / max",
                     f"{m['p50'] * 1e3:,.0f} / {m['p99'] * 1e3:,.0f} / {m['max'] * 1e3:,.0f} ms (n={m['n']})",
                     "p99 <= 1,000 ms" if kind == "actions" else ""))
    late = f", ranks up to {args.jitter:g} s late (envelopes overlap)" if args.jitter else ""
    print(f"\nbench_worker: {args.ranks:,}-rank job, {args.records:,} records per envelope size, "
          f"{TopicSettings.from_env().partitions} partitions{late}")
    print(f"{'measure':<40} {'value':<36} target")
    for name, value, target in rows:
        print(f"{name:<40} {value:<36} {target}")
    shutil.rmtree(logs, ignore_errors=True)  # a run that ended well; one that did not keeps them and says where
    return 0


if __name__ == "__main__":
    sys.exit(main())
