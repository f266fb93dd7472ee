"""Benchmark: what watching a fleet costs (issue 44): a fleet day replayed, in records/s, CPU-seconds per GPU-hour
watched, memory, and how many times faster than real time; and what a 2,048-GPU day would take at that rate.

Generates a fleet (`gangwatch simulate --fleet`: jobs of every size with churn, ordinary life and faults at the
published rate times `--fault-rate`) of `--gpus` GPUs for `--hours` hours, writes its stream, then replays it in
this process (`streams.replay.run`, the path `gangwatch replay` and `gangwatch eval --fleet` take), timing it
beside a plain `orjson` pass over the same file (the floor of any reader), measured one after the other in one
run. The memory is the process's peak RSS after the replay (Linux `ru_maxrss`), per 1,000 ranks of the largest
number of ranks the fleet ran at once. Nothing is asserted; figures vary with the machine's load.

    python3 bench/bench_fleet_day.py [--gpus 512] [--hours 2] [--fault-rate 20] [--seed 1]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import orjson
from gangwatch.producers.simulate.fleetday import Fleet, plan, write
from gangwatch.streams import replay
from gangwatch.streams.replay import open_text

TARGET_GPUS, TARGET_HOURS, TARGET_S = 2048, 24.0, 600.0  # the day, and the time it may take to replay


def peak_ranks(fleet: Fleet) -> int:
    """The most ranks the fleet's jobs ran at once."""
    edges = []
    for j in plan(fleet):
        sc = j.scenario
        ranks = sc.tp * sc.pp * sc.dp
        edges += [(j.start_ts, ranks), (j.end_ts, -ranks)]
    top = now = 0
    for _, d in sorted(edges):
        now += d
        top = max(top, now)
    return top


def orjson_pass(path: Path) -> tuple[int, float]:
    t0, n = time.process_time(), 0
    with open_text(path) as fh:
        for line in fh:
            obj = orjson.loads(line)
            n += len(obj["items"]) if obj.get("kind") == "batch" else 1
    return n, time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=512, help="the fleet's GPUs, whole nodes of 8 (default 512)")
    ap.add_argument("--hours", type=float, default=2.0, help="hours of event time (default 2)")
    ap.add_argument("--fault-rate", type=float, default=20.0, help="the published fault rate times this (default 20)")
    ap.add_argument("--seed", type=int, default=1, help="the fleet's seed (default 1)")
    args = ap.parse_args()
    fleet = Fleet(gpus=args.gpus, hours=args.hours, seed=args.seed, fault_rate=args.fault_rate)
    with tempfile.TemporaryDirectory(prefix="gangwatch-bench-fleet-") as tmp:
        t0 = time.perf_counter()
        stream, _ = write(fleet, Path(tmp))
        made_s = time.perf_counter() - t0
        records, floor_cpu = orjson_pass(stream)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        summary = replay.run([stream], Path(tmp) / "out", None, progress=None)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gpu_hours = args.gpus * args.hours
    ranks = peak_ranks(fleet)
    rate = records / cpu
    day = records * (TARGET_GPUS * TARGET_HOURS) / gpu_hours  # records of the target day, at this fleet's density
    print(f"fleet: {args.gpus} GPUs for {args.hours:g} h, seed {args.seed}, faults x{args.fault_rate:g}: "
          f"{records:,} records ({summary.records:,} replayed), generated in {made_s:.1f} s")
    print(f"{'measure':<44} {'value':>14}")
    rows = [
        ("orjson pass, records/s (CPU)", f"{records / floor_cpu:,.0f}"),
        ("replay, records/s (CPU)", f"{rate:,.0f}"),
        ("replay / orjson", f"{floor_cpu / cpu:.3f}"),
        ("replay wall s / CPU s", f"{wall:.1f} / {cpu:.1f}"),
        ("CPU-seconds per GPU-hour watched", f"{cpu / gpu_hours:.3f}"),
        ("times faster than real time", f"{args.hours * 3600 / wall:,.0f}x"),
        ("peak RSS, MB (whole process)", f"{rss_mb:,.0f}"),
        ("peak ranks at once / MB per 1,000 of them", f"{ranks:,} / {rss_mb / max(ranks, 1) * 1000:,.0f}"),
        (f"a {TARGET_GPUS:,}-GPU {TARGET_HOURS:g} h day: records (at this density)", f"{day:,.0f}"),
        (f"... its replay at this rate, s (target {TARGET_S:g})", f"{day / rate:,.0f}"),
    ]
    for name, value in rows:
        print(f"{name:<44} {value:>14}")


if __name__ == "__main__":
    main()
