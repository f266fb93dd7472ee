"""Run every benchmark in one process and print one table of figures against their targets.

    python3 bench/run_all.py            # 1k / 16k / 100k ranks (a few minutes)
    python3 bench/run_all.py --quick    # 1k / 4k ranks only

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
    sizes = [1024, 4096] if args.quick else [1024, 16_384, 100_000]
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
    first = replay_rows[0]
    growth = (big["replay_rps"] / first["replay_rps"])
    full = next(r for r in trainer["rows"] if r["variant"] == "context + 2 sections")
    rows = [
        ("replay / orjson-decode records/s", f"{big['ratio']:.3f} at {big['ranks']:,} ranks", ">= 0.30"),
        ("replay records/s", f"{big['replay_rps']:,.0f} at {big['ranks']:,} ranks", "-"),
        ("replay records/s, largest / smallest job", f"{growth:.2f} ({first['ranks']:,} -> {big['ranks']:,})",
         "~1 (linear)"),
        ("core memory per rank", f"{big['bytes_per_rank']:,.0f} B at {big['ranks']:,} ranks", "<= 2,048 B"),
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
