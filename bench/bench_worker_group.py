"""Benchmark: a fleet through a group of workers, one killed and one joining, against its replay.

1. `gangwatch simulate --fleet` (`--gpus`, `--hours`, `--fault-rate`, `--seed`): many jobs of every size, with
   churn, ordinary life and faults, in one file.
2. Its replay with each job on its own time (`Core(silence=False)`: a job's time moves with its own records, as
   in a worker; replay's default moves every job with the stream's newest time): the expected findings,
   actions and incidents.
3. Fresh topics; `--workers` `gangwatch worker` processes in one group (`--no-silence`, as replay: the end of
   the input is no silence); the file published at `--speed` x real time (`gangwatch publish --realtime`).
   `--kill-at` s after the publish starts, one worker is SIGKILLed (no goodbye: the group notices after its
   session timeout); `--join-at` s after it, a new one joins.
4. Once every input is consumed and the outputs stop growing: what the topics hold against the replay, per
   kind: lost (replay made it, no worker did), extra (a worker made it, replay did not) and doubled (the same
   output delivered twice: outputs are at least once, a worker killed after delivering a batch's outputs and
   before saving its state has them delivered again, with the same ids). How long the killed worker's jobs
   were unwatched is the group's session timeout plus the takeover (printed from the workers' logs).

Prints a table; exits 1 when an output was lost or extra (a doubled one is allowed), so it can gate a run.

    deploy/kafka/broker.sh start
    PYTHONPATH=. python bench/bench_worker_group.py [--gpus 64 --hours 0.5 --fault-rate 4000 --speed 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from gangwatch.schemas import decode
from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams import replay
from gangwatch.streams.topic_admin import create_topics
from gangwatch.triage.core import Core

from tests.integration.kafkakit import WorkerProc, caught_up, group_members, read_all, wait_for, worker_args

KINDS = ("findings", "actions", "incidents")


def key_of(rec) -> tuple:
    """What makes one output: its id, and for an incident (updated in place) its time and state too."""
    return (rec.job, rec.id, rec.ts) if rec.kind == "incident" else (rec.job, rec.id)


def expected_outputs(src: Path, work: Path) -> dict[str, Counter]:
    replay.run([src], work / "replay", None, progress=None, core=Core(silence=False))
    out = {}
    for name in KINDS:
        lines = (work / "replay" / f"{name}.jsonl").read_bytes().splitlines()
        out[name] = Counter(key_of(decode(line)[0]) for line in lines)
    return out


def topic_outputs(bootstrap: str, t: TopicSettings) -> dict[str, Counter]:
    got = read_all(bootstrap, [t.findings, t.actions, t.incidents])
    return {name: Counter(key_of(decode(v)[0]) for _, v in got[topic])
            for name, topic in zip(KINDS, (t.findings, t.actions, t.incidents), strict=True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--hours", type=float, default=0.5)
    ap.add_argument("--fault-rate", type=float, default=4000.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--speed", type=float, default=20.0, help="publish at this many times real time")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--kill-at", type=float, default=30.0, help="s after the publish starts (negative: no kill)")
    ap.add_argument("--join-at", type=float, default=20.0, help="s after the kill, a new worker joins")
    ap.add_argument("--work", type=Path, default=None, help="keep the files and logs here")
    args = ap.parse_args(argv)

    work = args.work or Path(tempfile.mkdtemp(prefix="gw-group-"))
    work.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    subprocess.run([py, "-m", "gangwatch", "simulate", "--fleet", "--out", str(work), "--name", "fleet",
                    "--gpus", str(args.gpus), "--hours", str(args.hours), "--fault-rate", str(args.fault_rate),
                    "--seed", str(args.seed)], check=True, stdout=subprocess.DEVNULL)
    src = work / "fleet.jsonl.gz"
    t0 = time.monotonic()
    want = expected_outputs(src, work)
    print(f"replay: {sum(map(sum, (c.values() for c in want.values())))} outputs in {time.monotonic() - t0:.1f} s")

    app_id = f"g{uuid.uuid4().hex[:10]}"
    t = TopicSettings(prefix=f"{app_id}.", partitions=args.partitions)
    create_topics(t, args.bootstrap)
    wargs = worker_args(args.bootstrap, app_id, t, "--no-silence")
    procs = [WorkerProc(wargs, work / f"worker{i}.log") for i in range(args.workers)]
    try:
        wait_for(lambda: group_members(args.bootstrap, app_id) == args.workers, 120, "the group formed")
        start = time.monotonic()
        pub = subprocess.Popen([py, "-m", "gangwatch", "publish", "--bootstrap", args.bootstrap, "--prefix", t.prefix,
                                "--partitions", str(args.partitions), "--realtime", str(args.speed), "--no-progress",
                                str(src)], stdout=subprocess.DEVNULL)
        killed = joined = None
        while pub.poll() is None or (killed is None and args.kill_at >= 0) or \
                (killed is not None and joined is None):
            now = time.monotonic() - start
            if killed is None and 0 <= args.kill_at <= now:
                procs[0].kill()
                killed = now
                print(f"killed worker 0 at {now:.1f} s")
            if killed is not None and joined is None and now >= killed + args.join_at:
                procs.append(WorkerProc(wargs, work / f"worker{len(procs)}.log"))
                joined = now
                print(f"worker {len(procs) - 1} joined at {now:.1f} s")
            time.sleep(0.2)
        published = time.monotonic() - start
        # (not by-job: a group's routers mark it every tick, so its commits trail its end by a tick or so)
        wait_for(lambda: caught_up(args.bootstrap, app_id, t.inputs), 600, "every input consumed")
        last, same = None, 0
        while same < 3:  # the outputs stopped growing (the last batches' decisions are delivered)
            time.sleep(2.0)
            n = sum(sum(c.values()) for c in topic_outputs(args.bootstrap, t).values())
            same = same + 1 if n == last else 0
            last = n
        got = topic_outputs(args.bootstrap, t)
    finally:
        for p in procs:
            p.stop()

    print(f"published in {published:.1f} s at {args.speed:g}x; {args.workers} workers"
          f"{'' if killed is None else f', one killed at {killed:.1f} s'}"
          f"{'' if joined is None else f', one joined at {joined:.1f} s'}")
    print(f"{'output':10} {'replay':>7} {'group':>7} {'lost':>5} {'extra':>6} {'doubled':>8}")
    bad = 0
    for name in KINDS:
        w, g = want[name], got[name]
        lost = sum(((w - g)).values())
        extra = sum((Counter(set(g)) - Counter(set(w))).values())
        doubled = sum(n - 1 for k, n in g.items() if n > 1 and k in w)
        bad += lost + extra
        print(f"{name:10} {sum(w.values()):7} {sum(g.values()):7} {lost:5} {extra:6} {doubled:8}")
        for k in sorted(set(w) - set(g))[:5]:
            print(f"  lost:  {k}")
        for k in sorted(set(g) - set(w))[:5]:
            print(f"  extra: {k}")
    print(f"files and worker logs: {work}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
