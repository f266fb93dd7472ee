"""Benchmark: parse and cluster a 16,384-rank py-spy sweep on one core.

Generates synthetic `py-spy dump` texts (a handful of distinct call paths, with
random pids, thread ids, directories and line numbers, plus 1-3 outlier
ranks), then times parsing + signatures, clustering, and the whole
`StackDetector` path (records in, findings out). Prints figures; asserts nothing
about time.

    PYTHONPATH=. python bench/bench_stacks.py [--ranks 16384] [--seed 0] [--repeat 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core: keep BLAS / OpenMP from fanning out
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402

from gangwatch.detectors.stacks import StackDetector, cluster_ranks, parse_pyspy, signature, suspect_clusters  # noqa: E402
from gangwatch.detectors.topology import Topology  # noqa: E402
from gangwatch.schemas import Job, RankInfo, Stack  # noqa: E402

TAIL = [("_engine_run_backward", "torch/autograd/graph.py"), ("backward", "torch/autograd/__init__.py"),
        ("Tensor.backward", "torch/_tensor.py"), ("train_step", "megatron/training.py"),
        ("train", "megatron/training.py"), ("pretrain", "megatron/training.py"), ("main", "pretrain_gpt.py"),
        ("<module>", "pretrain_gpt.py")]
HEALTHY = [  # where healthy ranks wait: slightly different innermost frames, same call path below
    [("all_reduce", "torch/distributed/distributed_c10d.py"), ("wrapper", "torch/distributed/c10d_logger.py")] + TAIL,
    [("wait", "torch/distributed/distributed_c10d.py"), ("all_reduce", "torch/distributed/distributed_c10d.py"),
     ("wrapper", "torch/distributed/c10d_logger.py")] + TAIL,
    [("synchronize", "torch/cuda/__init__.py"), ("all_reduce", "torch/distributed/distributed_c10d.py"),
     ("wrapper", "torch/distributed/c10d_logger.py")] + TAIL,
]
OUTLIERS = [
    [("_PollLikeSelector.select", "selectors.py"), ("wait", "multiprocessing/connection.py"),
     ("Queue.get", "multiprocessing/queues.py"), ("_MultiProcessingDataLoaderIter._next_data",
                                                  "torch/utils/data/dataloader.py"),
     ("_BaseDataLoaderIter.__next__", "torch/utils/data/dataloader.py"), ("get_batch", "pretrain_gpt.py"),
     ("train_step", "megatron/training.py"), ("train", "megatron/training.py"), ("main", "pretrain_gpt.py"),
     ("<module>", "pretrain_gpt.py")],
    [("BufferedWriter.write", "io.py"), ("_save", "torch/serialization.py"), ("save", "torch/serialization.py"),
     ("save_checkpoint", "megatron/checkpointing.py"), ("train", "megatron/training.py"),
     ("main", "pretrain_gpt.py"), ("<module>", "pretrain_gpt.py")],
]


def dump_text(frames: list[tuple[str, str]], rng: random.Random) -> str:
    """One rank's py-spy dump: main thread on `frames`, plus two idle background threads."""
    pid = rng.randint(1000, 4_000_000)
    root = rng.choice(("/usr/lib/python3.11/site-packages/", "/opt/venv/lib/python3.11/site-packages/"))
    out = [f"Process {pid}: /usr/bin/python3 -u pretrain_gpt.py --tp 8", "Python v3.11.7 (/usr/bin/python3.11)", "",
           f'Thread 0x{rng.getrandbits(48):X} (idle): "MainThread"']
    out += [f"    {fn} ({root if '/' in f else ''}{f}:{rng.randint(1, 5000)})" for fn, f in frames]
    out += [f'Thread 0x{rng.getrandbits(48):X} (idle): "QueueFeederThread"',
            f"    Condition.wait (threading.py:{rng.randint(320, 330)})", "    Queue._feed (queues.py:231)",
            "    Thread.run (threading.py:982)",
            f'Thread 0x{rng.getrandbits(48):X} (idle): "Thread-3 (_pin_memory_loop)"',
            "    select (selectors.py:415)", "    _pin_memory_loop (pin_memory.py:55)"]
    return "\n".join(out) + "\n"


def generate(n: int, seed: int) -> tuple[list[str], list[int]]:
    """`n` dumps and the outlier ranks (1-3 of them, outlier call paths)."""
    rng = random.Random(seed)
    outliers = sorted(rng.sample(range(n), rng.randint(1, 3)))
    texts = [dump_text(rng.choice(OUTLIERS) if r in outliers else rng.choice(HEALTHY), rng) for r in range(n)]
    return texts, outliers


def measure(n: int = 16_384, seed: int = 0, repeat: int = 3, verbose: bool = False) -> dict:
    """Best-of-`repeat` parse and cluster times for an `n`-rank sweep, and the whole detector path."""
    t0 = time.perf_counter()
    texts, outliers = generate(n, seed)
    if verbose:
        print(f"generated {n} dumps ({sum(map(len, texts)) / 1e6:.1f} MB) in {time.perf_counter() - t0:.2f} s; "
              f"outlier ranks {outliers}")
    best_parse = best_cluster = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        sigs = {r: signature(parse_pyspy(t)) for r, t in enumerate(texts)}
        t1 = time.perf_counter()
        clusters = cluster_ranks(sigs)
        suspects = suspect_clusters(clusters, n)
        t2 = time.perf_counter()
        best_parse, best_cluster = min(best_parse, t1 - t0), min(best_cluster, t2 - t1)
    found = sorted(r for c in suspects for r in c.ranks)
    if verbose:
        print(f"distinct signatures {len(set(sigs.values()))}, clusters {len(clusters)} "
              f"(sizes {[len(c.ranks) for c in clusters]}), suspects {found}")
    topo = Topology.from_job(Job(ts=0.0, job="bench", ranks=[RankInfo(rank=r, node=f"n{r // 8:05d}", gpu=r % 8)
                                                              for r in range(n)]))
    recs = [Stack(ts=1.0 + r * 1e-6, job="bench", rank=r, snapshot="s-1", format="py-spy", dump=t)
            for r, t in enumerate(texts)]
    det = StackDetector(topo)
    t0 = time.perf_counter()
    findings = [f for rec in recs for f in det.observe(rec)]
    detector_s = time.perf_counter() - t0
    return {"ranks": n, "parse_s": best_parse, "cluster_s": best_cluster, "total_s": best_parse + best_cluster,
            "detector_s": detector_s, "suspects_match": found == outliers,
            "detector_match": sorted(f.rank for f in findings) == outliers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16_384)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    m = measure(args.ranks, args.seed, args.repeat, verbose=True)
    n = m["ranks"]
    print(f"parse+signature {m['parse_s']:.3f} s ({n / m['parse_s']:,.0f} ranks/s)")
    print(f"cluster         {m['cluster_s']:.4f} s")
    print(f"parse+cluster   {m['total_s']:.3f} s ({n / m['total_s']:,.0f} ranks/s), best of {args.repeat}; "
          f"suspects {'match' if m['suspects_match'] else 'MISMATCH'}")
    print(f"StackDetector   {m['detector_s']:.3f} s ({n / m['detector_s']:,.0f} ranks/s), findings "
          f"{'match' if m['detector_match'] else 'MISMATCH'}")


if __name__ == "__main__":
    main()
