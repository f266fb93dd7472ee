"""Benchmark: replay throughput against plain JSON decoding of the same file, memory per rank, growth.

For each job size it simulates a short run (steps, heartbeats, NVML samples; benign
noise, no fault; at least 120 s below 4,096 ranks, so the file is not all start-up)
into a JSONL.gz file, then measures side by side in one run:

- `orjson`: read the gzip lines and `orjson.loads` each one (the floor of any reader);
- `decode`: the same with `schemas.decode` (validation, typed records);
- `replay`: `replay.run` of the file in this process (decode + every detector + triage + JSONL outputs);
- `record path`: the same, but every record through `Core.process` one at a time (the path before
  issue 11: the runs of records `Core.process_many` takes together are what it saves);
- `whole process`: `gangwatch replay FILE` in a subprocess with the embedded chDB store on (interpreter
  start, imports, the store's inserts: what a person waits for);

and reports records/s of each, the replay/orjson and whole-process/orjson ratios (target >= 0.30), and
the memory the core holds per rank after the run (tracemalloc, target <= 1 KB).
Nothing is asserted; figures vary with the machine's load.

With `--baseline CHECKOUT` (another checkout of the code, e.g. `git worktree add /tmp/base HEAD~3`) it
also replays each file with that code and with this checkout's, alternately, each in a fresh interpreter
(`--repeat` times), in CPU seconds, and prints a second table: before and after measured side by side on
one file, each beside an orjson pass made just before it.

    python3 bench/bench_replay.py [--ranks 128,100000] [--duration 30] [--baseline /tmp/base --repeat 2]
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
import tomllib
import tracemalloc
from pathlib import Path

import orjson
from gangwatch.producers.simulate import Scenario, write
from gangwatch.schemas import DecodeError, decode
from gangwatch.streams import replay
from gangwatch.streams.replay import open_text
from gangwatch.triage.core import Core


def scenario(n: int, duration_s: float) -> Scenario:
    pp = 4 if n % 32 == 0 else 1
    return Scenario(f"bench_{n}", seed=5, tp=8, pp=pp, dp=n // (8 * pp), duration_s=duration_s, batch=True)


def orjson_only(path: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    with open_text(path) as fh:
        for line in fh:
            obj = orjson.loads(line)
            n += len(obj["items"]) if obj.get("kind") == "batch" else 1
    return n, time.perf_counter() - t0


def decode_only(path: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    n = 0
    with open_text(path) as fh:
        for line in fh:
            n += sum(1 for r in decode(line) if not isinstance(r, DecodeError))
    return n, time.perf_counter() - t0


def replay_run(path: Path, out: Path) -> tuple[int, float]:
    t0 = time.perf_counter()
    s = replay.run([path], out, None, progress=None)
    return s.records, time.perf_counter() - t0


def record_path_run(path: Path, out: Path) -> tuple[int, float]:
    """`replay.run` with the core fed one record at a time (`Core.process`), as before the run path."""

    class OneByOne(replay.Replay):
        def feed_many(self, items: list[replay.Item]) -> None:
            for item in items:
                self.feed(item)

    t0 = time.perf_counter()
    inputs = [replay.InputFile(path)]
    rep = OneByOne([replay.JsonlSink(out)])
    for item in replay.merged(inputs):
        rep.feed(item)
    s = rep.close()
    return s.records, time.perf_counter() - t0


def whole_process(path: Path, out: Path) -> float:
    """Seconds of `gangwatch replay FILE --out OUT` (chDB store on) in a fresh interpreter."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gangwatch", "replay", str(path), "--out", str(out), "--quiet",
                    "--no-progress"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


# replay of argv[1] in CPU seconds (process time: a shared machine's load moves it less than wall time)
_TIMED_REPLAY = """
import sys, tempfile, time
from pathlib import Path
from gangwatch.streams import replay
t0 = time.process_time()
s = replay.run([Path(sys.argv[1])], Path(tempfile.mkdtemp()), None)
print(s.records, time.process_time() - t0, replay.__file__)
"""


def package_of(checkout: Path, into: Path) -> Path:
    """A `gangwatch` package of links to `checkout`'s sources, laid out as its pyproject's package-dir says:
    with it first on PYTHONPATH, an interpreter imports that checkout's code instead of the installed one."""
    dirs = tomllib.loads((checkout / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    subpackages = {name.removeprefix("gangwatch."): src for name, src in dirs.items() if name != "gangwatch"}
    pkg = into / "gangwatch"
    pkg.mkdir(parents=True)
    for part in (checkout / dirs["gangwatch"]).iterdir():
        if part.name not in subpackages:
            (pkg / part.name).symlink_to(part.resolve())
    for name, src in subpackages.items():
        (pkg / name).symlink_to((checkout / src).resolve())
    return into


def timed_replay(path: Path, checkout: Path, tmp: Path) -> tuple[int, float]:
    """(records, CPU seconds) of `replay.run` of `path` with `checkout`'s code, in a fresh interpreter."""
    where = tmp / f"pkg-{abs(hash(checkout.resolve()))}"
    if not where.exists():
        package_of(checkout, where)
    env = {**os.environ, "PYTHONPATH": str(where)}
    out = subprocess.run([sys.executable, "-c", _TIMED_REPLAY, str(path)], env=env, check=True, cwd=where,
                         capture_output=True, text=True).stdout.split()
    assert Path(out[2]).resolve().is_relative_to(checkout.resolve()), f"ran {out[2]}, not {checkout}"  # noqa: S101
    return int(out[0]), float(out[1])


def orjson_cpu(path: Path) -> float:
    """orjson records per CPU second on `path`."""
    t0 = time.process_time()
    n, _ = orjson_only(path)
    return n / (time.process_time() - t0)


def compare(sizes: list[int], duration_s: float, baseline: Path, repeat: int) -> list[dict]:
    """Replay of each size's file with `baseline`'s code and with this checkout's, alternately."""
    here = Path(__file__).resolve().parents[1]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gw-bench-") as tmp:
        for n in sizes:
            path, _ = write(scenario(n, duration_s if n >= 4096 else max(duration_s, 120.0)), tmp)
            for rep in range(repeat):
                for name, checkout in (("baseline", baseline), ("this", here)):
                    orj = orjson_cpu(path)
                    records, cpu = timed_replay(path, checkout, Path(tmp))
                    rows.append({"ranks": n, "records": records, "code": name, "rep": rep, "orjson_rps": orj,
                                 "replay_rps": records / cpu, "ratio": records / cpu / orj})
            path.unlink()
    return rows


def render_compare(rows: list[dict]) -> str:
    lines = [f"{'ranks':>7} {'records':>9} {'code':>8} | {'orjson rec/cpu-s':>16} {'replay rec/cpu-s':>16} | "
             f"{'replay/orjson':>13}"]
    lines += [f"{r['ranks']:>7} {r['records']:>9,} {r['code']:>8} | {r['orjson_rps']:>16,.0f} "
              f"{r['replay_rps']:>16,.0f} | {r['ratio']:>13.3f}" for r in rows]
    return "\n".join(lines)


def help_seconds(tries: int = 3) -> float:
    """The fastest of `tries` runs of `gangwatch --help` (a fresh interpreter each)."""
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gangwatch", "--help"], check=True, stdout=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - t0)
    return best


def memory_per_rank(path: Path, ranks: int) -> float:
    records = [r for it in replay.merged([replay.InputFile(path)]) if not isinstance(r := it.value, DecodeError)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    core = Core()
    for rec in records:
        core.process(rec)
    core.finish()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del core
    return held / ranks


def measure(sizes: list[int], duration_s: float, whole: bool = True, record_path: bool = True) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="gw-bench-") as tmp:
        for n in sizes:
            sc = scenario(n, duration_s if n >= 4096 else max(duration_s, 120.0))  # a small job: a longer run
            t0 = time.perf_counter()
            path, _ = write(sc, tmp)
            gen_s = time.perf_counter() - t0
            n_json, t_json = orjson_only(path)
            n_dec, t_dec = decode_only(path)
            n_rep, t_rep = replay_run(path, Path(tmp) / f"out_{n}")
            n_one, t_one = record_path_run(path, Path(tmp) / f"one_{n}") if record_path else (n_rep, float("nan"))
            t_whole = whole_process(path, Path(tmp) / f"whole_{n}") if whole else float("nan")
            mem = memory_per_rank(path, n)
            rows.append({"ranks": n, "records": n_rep, "gen_s": gen_s, "orjson_rps": n_json / t_json,
                         "decode_rps": n_dec / t_dec, "replay_rps": n_rep / t_rep, "record_path_rps": n_one / t_one,
                         "whole_rps": n_rep / t_whole,
                         "ratio": (n_rep / t_rep) / (n_json / t_json),
                         "whole_ratio": (n_rep / t_whole) / (n_json / t_json), "bytes_per_rank": mem})
            path.unlink()
    return rows


def render(rows: list[dict]) -> str:
    head = (f"{'ranks':>7} {'records':>9} | {'orjson rec/s':>12} {'decode rec/s':>12} {'record path':>12} "
            f"{'replay rec/s':>12} {'whole+chDB':>12} | {'replay/orjson':>13} {'whole/orjson':>12} "
            f"{'replay/record path':>18} | {'core B/rank':>11}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['ranks']:>7} {r['records']:>9,} | {r['orjson_rps']:>12,.0f} {r['decode_rps']:>12,.0f} "
                     f"{r['record_path_rps']:>12,.0f} {r['replay_rps']:>12,.0f} {r['whole_rps']:>12,.0f} | "
                     f"{r['ratio']:>13.3f} {r['whole_ratio']:>12.3f} "
                     f"{r['replay_rps'] / r['record_path_rps']:>18.2f} | {r['bytes_per_rank']:>11,.0f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="128,100000", help="comma-separated job sizes (multiples of 8)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of simulated training per size")
    ap.add_argument("--baseline", type=Path, help="another checkout to compare replay with, side by side")
    ap.add_argument("--repeat", type=int, default=2, help="alternating runs of each checkout (with --baseline)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.ranks.split(",")]
    print(render(measure(sizes, args.duration)))
    if args.baseline is not None:
        print()
        print(render_compare(compare(sizes, args.duration, args.baseline, args.repeat)))


if __name__ == "__main__":
    main()
