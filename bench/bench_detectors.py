"""Benchmark: FailSlowDetector + JobSlowdownDetector + SdcDetector fed `step` records at scale.

For each job size (default 16,384 and 100,000 ranks) it generates a few steps
of synthetic Step records (tests/unit/stepgen.py: noise, one straggler), then
times the three step detectors together:

- per record: `observe(rec)` on each detector, record by record;
- batch: one `StepColumns` per step's records, shared by the three `observe_many`;

and reports records/s (records fed, not record x detector), the memory the
detectors hold per rank (tracemalloc, after the steps closed: baselines and
per-rank state; and the peak while a step is buffered), and the size of their
JSON state per rank. Prints figures; asserts nothing about time.

    PYTHONPATH=. python bench/bench_detectors.py [--ranks 16384,100000] [--steps 4] [--seed 0]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: keep BLAS / OpenMP from fanning out
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import orjson  # noqa: E402
from gangwatch.detectors.config import FailSlowConfig, SlowdownConfig  # noqa: E402
from gangwatch.detectors.failslow import FailSlowDetector  # noqa: E402
from gangwatch.detectors.runs import StepColumns  # noqa: E402
from gangwatch.detectors.sdc import SdcDetector  # noqa: E402
from gangwatch.detectors.slowdown import JobSlowdownDetector  # noqa: E402
from gangwatch.detectors.topology import Topology  # noqa: E402

from tests.unit.stepgen import Straggler, gen_steps, make_topology  # noqa: E402

KINDS = (FailSlowDetector, JobSlowdownDetector, SdcDetector)


def detectors(topo: Topology) -> list:
    """The three step detectors with warm-up off, so that the few benchmark steps are scored in full."""
    return [FailSlowDetector(topo, FailSlowConfig(warmup_steps=0)),
            JobSlowdownDetector(topo, SlowdownConfig(warmup_steps=0)), SdcDetector(topo)]


def run_records(dets: list, batches: list) -> int:
    found = 0
    for batch in batches:
        for d in dets:
            obs = d.observe
            for rec in batch:
                found += len(obs(rec))
    return found


def run_batch(dets: list, batches: list) -> int:
    found = 0
    for batch in batches:
        cols = StepColumns(batch)
        for d in dets:
            found += len(d.observe_many(cols))
    return found


def timed(fn, dets: list, batches: list) -> tuple[float, int]:
    gc.collect()
    t = time.perf_counter()
    found = fn(dets, batches)
    return time.perf_counter() - t, found


def memory(topo: Topology, batches: list) -> tuple[float, float]:
    """Bytes per rank the detectors hold once the steps closed, and at the peak while one is buffered."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    dets = detectors(topo)
    run_batch(dets, batches)
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del dets
    return (held - base) / topo.size, (peak - base) / topo.size


def measure(n: int, steps: int = 4, seed: int = 0) -> dict:
    """Records/s of the three step detectors (per record and batch) and their memory per rank, at `n` ranks."""
    tp, pp = 8, 8 if n % 64 == 0 else 1
    topo = make_topology(n, tp=tp if n % tp == 0 else 1, pp=pp)
    batches = list(gen_steps(topo, steps + 1, seed=seed, stragglers=[Straggler(n // 3, 1.3)]))
    batches, extra = batches[:-1], batches[-1]
    records = n * steps
    t_rec, f_rec = timed(run_records, detectors(topo), batches)
    dets = detectors(topo)
    t_batch, f_batch = timed(run_batch, dets, batches)
    if f_rec != f_batch:
        raise RuntimeError("per-record and batch paths disagree")
    for d in dets:  # one more step, half reported: its open arrays are part of the state
        for rec in extra[: n // 2]:
            d.observe(rec)
    state_b = sum(len(orjson.dumps(d.state())) for d in dets) / n
    held, peak = memory(topo, batches)
    return {"ranks": n, "steps": steps, "records": records, "record_rps": records / t_rec,
            "batch_rps": records / t_batch, "batch_ms_per_step": 1000 * t_batch / steps, "held_b": held,
            "peak_b": peak, "state_b": state_b, "findings": f_batch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="16384,100000", help="comma-separated job sizes")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"{'ranks':>8} {'steps':>5} {'records':>9} | {'per-record rec/s':>16} {'batch rec/s':>12} "
          f"{'batch ms/step':>13} | {'held B/rank':>11} {'peak B/rank':>11} {'state B/rank':>12} | findings")
    for n in (int(x) for x in args.ranks.split(",")):
        m = measure(n, args.steps, args.seed)
        print(f"{n:>8} {m['steps']:>5} {m['records']:>9} | {m['record_rps']:>16,.0f} {m['batch_rps']:>12,.0f} "
              f"{m['batch_ms_per_step']:>13.1f} | {m['held_b']:>11.0f} {m['peak_b']:>11.0f} {m['state_b']:>12.0f} | "
              f"{m['findings']}")


if __name__ == "__main__":
    main()
