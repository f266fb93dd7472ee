"""Hang localization at scale: simulated hangs at 128, 2,048 and 16,384 ranks, replayed end to end.

For each size and hang kind (a stuck data loader, a deadlock in one pipeline
stage) it simulates the job, replays it, and reports the event-time latency
from the stall to detection and to localization, whether the culprit node was
named, how many innocent nodes were evicted, and the replay wall time.

    python3 bench/bench_hang_scale.py [--ranks 128,2048,16384]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402
from gangwatch.producers.simulate import Fault, Scenario, write  # noqa: E402
from gangwatch.streams import replay  # noqa: E402

from gangwatch.evaluation.scoring import EVICTING  # noqa: E402


def run(n: int, kind: str, tmp: Path) -> dict:
    pp = 4
    dp = n // (8 * pp)
    # the culprit: a rank in stage 2 of a replica two thirds into the job, tp index 5
    rank = 5 + 8 * 2 + 8 * pp * (2 * dp // 3)
    sc = Scenario(f"{kind}_{n}", seed=21, tp=8, pp=pp, dp=dp, duration_s=130.0, batch=True,
                  faults=(Fault(kind, 60.0, rank=rank),))
    t0 = time.perf_counter()
    stream, truth_path = write(sc, tmp)
    gen_s = time.perf_counter() - t0
    out = tmp / f"out_{kind}_{n}"
    summary = replay.run([stream], out, None, progress=None)
    truth = orjson.loads(truth_path.read_bytes())
    fault = truth["faults"][0]
    incs: dict[str, dict] = {}
    for line in (out / "incidents.jsonl").read_bytes().splitlines():
        inc = orjson.loads(line)
        incs[inc["id"]] = inc
    actions = [orjson.loads(x) for x in (out / "actions.jsonl").read_bytes().splitlines()]
    inc = next((i for i in incs.values() if i["detected_ts"] >= fault["onset_ts"] - 1), None)
    evicted = {n for a in actions if a["type"] in EVICTING for n in a["nodes"]}
    stream.unlink()
    return {
        "ranks": n, "kind": kind, "culprit": fault["nodes"][0],
        "named": bool(inc and fault["nodes"][0] in inc["culprit_nodes"]),
        "detect_s": round(inc["detected_ts"] - fault["onset_ts"], 1) if inc else None,
        "localize_s": round(inc["localized_ts"] - fault["onset_ts"], 1) if inc and inc.get("localized_ts") else None,
        "innocent": len(evicted - set(fault["nodes"])), "records": summary.records, "gen_s": gen_s,
        "replay_s": summary.wall_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="128,2048,16384")
    ap.add_argument("--kinds", default="dataloader_hang,pp_deadlock")
    args = ap.parse_args()
    print(f"{'ranks':>6} {'kind':<16} {'culprit':<8} {'named':<5} {'detect s':>8} {'localize s':>10} "
          f"{'innocent':>8} {'records':>10} {'replay s':>8}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gw-hang-") as tmp:
        for n in (int(x) for x in args.ranks.split(",")):
            for kind in args.kinds.split(","):
                r = run(n, kind, Path(tmp))
                print(f"{r['ranks']:>6} {r['kind']:<16} {r['culprit']:<8} {'yes' if r['named'] else 'NO':<5} "
                      f"{r['detect_s']!s:>8} {r['localize_s']!s:>10} {r['innocent']:>8} {r['records']:>10,} "
                      f"{r['replay_s']:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
