"""python -m gangwatch.producers.simulate OUT_DIR [--size ci|full] [--only NAME ...] [--jobs N]: the standard suite."""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from gangwatch.producers.simulate.suite import SIZES, standard_suite
from gangwatch.producers.simulate.writer import write


def _one(args: tuple) -> tuple[str, float, int]:
    sc, out = args
    t = time.perf_counter()
    stream, _ = write(sc, out)
    return sc.name, time.perf_counter() - t, stream.stat().st_size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gangwatch.producers.simulate", description=__doc__)
    ap.add_argument("out_dir")
    ap.add_argument("--size", choices=SIZES, default="ci")
    ap.add_argument("--only", nargs="*", help="scenario names (default: all)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    a = ap.parse_args(argv)
    suite = [s for s in standard_suite(a.size) if not a.only or s.name in a.only]
    if not suite:
        print("no scenario matches", file=sys.stderr)
        return 2
    t = time.perf_counter()
    work = [(s, a.out_dir) for s in suite]
    if a.jobs > 1:
        with ProcessPoolExecutor(a.jobs) as ex:
            done = list(ex.map(_one, work))
    else:
        done = [_one(w) for w in work]
    for name, secs, size in done:
        print(f"{name:32s} {secs:6.1f} s {size / 1e6:8.1f} MB")
    print(f"{len(done)} scenarios in {time.perf_counter() - t:.1f} s -> {a.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
