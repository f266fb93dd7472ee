"""Run every benchmark in one process and print one table of figures against their targets.

    python3 bench/run_all.py            # replay at 128 and 100k ranks (several minutes)
    python3 bench/run_all.py --quick    # replay at 128 and 4k ranks only

Figures are measured side by side in this run (the machine is noisy: compare
ratios, not absolute numbers across runs). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ sits beside the packages

from bench import bench_detectors, bench_replay, bench_stacks, bench_trainer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only")
    ap.add_argument("--duration", type=float, default=30.0, help="simulated seconds per replay size")
    args = ap.parse_args()
    sizes = [128, 4096] if args.quick else [128, 100_000]
    stack_ranks = 4096 if args.quick else 16_384

    print("== replay vs decode (same file, side by side)", flush=True)
    replay_rows = bench_replay.measure(sizes, args.duration)
    print(bench_replay.render(replay_rows), flush=True)
    print("\n== step detectors (fail-slow + slowdown + SDC)", flush=True)
    det_rows = [bench_detectors.measure(n) for n in ([4096] if args.quick else [16_384, 100_000])]
    for m in det_rows:
        print(f"{m['ranks']:>7} ranks: {m['record_rps']:,.0f} rec/s per record, {m['batch_rps']:,.0f} rec/s batch, "
              f"{m['held_b']:.0f} B/rank held", flush=True)
    print("\n== trainer client overhead per step (CPU, side by side with a bare loop)", flush=True)
    trainer = bench_trainer.measure(20_000 if args.quick else 100_000)
    print(bench_trainer.render(trainer), flush=True)
    print("\n== stack clustering", flush=True)
    st = bench_stacks.measure(stack_ranks)
    print(f"{st['ranks']} ranks: parse {st['parse_s']:.3f} s + cluster {st['cluster_s']:.3f} s; detector "
          f"{st['detector_s']:.3f} s; suspects {'match' if st['suspects_match'] else 'MISMATCH'}", flush=True)

    big = replay_rows[-1]
    help_s = bench_replay.help_seconds()
    full = next(r for r in trainer["rows"] if r["variant"] == "context + 2 sections")
    rows = [
        *[(f"replay / orjson-decode records/s ({r['ranks']:,} ranks)",
           f"{r['ratio']:.3f} in-process, {r['whole_ratio']:.3f} whole+chDB", ">= 0.30") for r in replay_rows],
        *[(f"replay run path / record path ({r['ranks']:,} ranks)",
           f"{r['replay_rps'] / r['record_path_rps']:.2f}x ({r['record_path_rps']:,.0f} -> {r['replay_rps']:,.0f})",
           "-") for r in replay_rows],
        ("replay records/s, one job", f"{big['replay_rps']:,.0f} at {big['ranks']:,} ranks", ">= 150,000"),
        ("core memory per rank", f"{big['bytes_per_rank']:,.0f} B at {big['ranks']:,} ranks", "<= 1,024 B"),
        ("gangwatch --help", f"{help_s:.2f} s", "<= 0.3 s"),
        ("worker / raw aiokafka consume + decode", "not run here: bench/bench_worker.py", ">= 0.50"),
        *[(f"step detectors records/s ({m['ranks']:,} ranks)", f"{m['record_rps']:,.0f} / {m['batch_rps']:,.0f} batch",
           "-") for m in det_rows],
        (f"stack parse+cluster ({st['ranks']:,} ranks)", f"{st['total_s']:.2f} s", "<= 2 s at 16,384"),
        ("trainer client added per step (step_context + 2 sections)",
         f"{full['added_us']:.1f} us ({full['thread_us']:.1f} + {full['send_us']:.1f} alone)", "< 20 us"),
    ]
    print("\n== summary")
    w = max(len(r[0]) for r in rows)
    print(f"{'figure':<{w}}  {'measured':<32}  target")
    for name, value, target in rows:
        print(f"{name:<{w}}  {value:<32}  {target}")


if __name__ == "__main__":
    main()
