"""Benchmark: the tiny torchrun job watched live, healthy for 5 minutes and broken four ways, with stage durations.

The same set-up as tests/integration/test_real_job.py (tests/integration/livejob.py:
the worker writing to ClickHouse, one agent per node, the reference controller
driving examples/tiny_job/train.py on 2 nodes x 2 ranks with spare n3), in longer
and fuller runs:

- healthy: `--minutes` of training (5 by default; the tests run about 75 s),
  ended by the job itself; reported: findings above precursor severity while it
  trained and in the 30 s after its end, actions and incidents (each should be 0);
- each fault of `--faults` (kill, hang, slow, sdc) on n2: the decision, and for
  the incident its five durations (detect, localize, decide, recover =
  decided -> the restarted job's first collective, first_step = that -> its first
  step), its total and the stages over budget.

Prints one table; asserts nothing.

    deploy/dev.sh up
    PYTHONPATH=. python bench/bench_real_job.py [--minutes 5] [--faults kill,hang,slow,sdc]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

from gangwatch.schemas.topics import TopicSettings
from gangwatch.streams.topic_admin import create_topics
from kafka.admin import KafkaAdminClient

from tests.integration.livejob import FIVE, Fault, LiveJob

FAULTS = {"kill": Fault("kill", 60), "hang": Fault("hang", 60), "slow": Fault("slow", 60), "sdc": Fault("sdc", 45)}
CLASS = {"kill": "fail_stop", "hang": "hang", "slow": "fail_slow", "sdc": "sdc"}
STEPS_PER_S = 7.5  # the tiny job's pace on a 2-core machine (0.1 s of simulated device time per step)


def one_run(bootstrap: str, clickhouse: tuple[str, int], workdir: Path, name: str, fault: Fault | None,
            steps: int, deadline_s: float) -> dict:
    job_id = f"bench{uuid.uuid4().hex[:8]}"
    topics = TopicSettings(prefix=f"{job_id}.", partitions=4)
    create_topics(topics, bootstrap)
    run_dir = workdir / name
    run_dir.mkdir()
    started = time.monotonic()
    row: dict = {"run": name}
    try:
        with LiveJob(bootstrap, topics, clickhouse, run_dir, job=job_id, fault=fault) as live:
            live.start(steps)
            if fault is None:
                ended = live.run_to_end(deadline_s)
                first = [m["ts"] for m in live.milestones(0) if m["event"] == "step"]
                row["trained_s"] = round(ended - first[0]) if first else None
                time.sleep(30)  # what the detectors make of the end: past their timeouts (hang: 20 s)
                loud = [f for f in live.findings() if json.loads(f["evidence"]).get("severity") != "precursor"]
                row["findings"] = sum(f["ts"] <= ended for f in loud)
                row["after_end"] = sum(f["ts"] > ended for f in loud)
                if loud:
                    print("findings above precursor severity:", *loud, sep="\n  ", flush=True)
                row["actions"] = len(live.actions())
                row["incidents"] = len(live.incidents())
            else:
                row.update(fault_row(live, CLASS[name], deadline_s))
            live.store._client.execute(f"DROP DATABASE IF EXISTS {job_id}")
    except AssertionError as e:
        row["error"] = str(e).splitlines()[0]
        print(e, flush=True)
    finally:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        admin.delete_topics([t for t in admin.list_topics() if t.startswith(topics.prefix)])
        admin.close()
    row["wall_s"] = round(time.monotonic() - started)
    return row


def fault_row(live: LiveJob, cls: str, deadline_s: float) -> dict:
    def found(closed: bool) -> list[dict]:
        return [i for i in live.incidents() if i["class"] == cls and i["decided_ts"] is not None
                and (i["recovered_ts"] is not None or not closed)]

    live.wait(lambda: bool(found(False)), deadline_s, f"a decided {cls} incident")
    decided = [a for a in live.actions() if a["type"] != "collect_stacks"]
    row = {"culprits": ",".join(found(False)[0]["culprit_nodes"]),
           "decision": "; ".join(f"{a['type']} {','.join(a['nodes'])}" for a in decided)}
    if all(a["type"] == "escalate" for a in decided):
        row["error"] = "escalated: nothing for the controller to do"
        return row
    try:
        live.wait(lambda: bool(found(True)), deadline_s, f"a recovered {cls} incident")
    except AssertionError:
        row["error"] = "not recovered"
        return row
    inc = found(True)[0]
    stages = dict(zip(inc["stage_names"], inc["stage_seconds"], strict=True))
    row.update(live.stages(inc))
    row["total"] = stages.get("total")
    row["over_budget"] = ",".join(inc["over_budget"]) or "-"
    others = [i for i in live.incidents() if i["id"] != inc["id"]]
    acted = {}
    for a in live.actions():
        acted.setdefault(a["incident"], []).append(a["type"])
    row["other_incidents"] = "; ".join(f"{i['class']}: {','.join(acted.get(i['id'], [])) or 'no action'}"
                                       for i in others) or "-"
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="training time of the healthy run (0: none)")
    p.add_argument("--faults", default="kill,hang,slow,sdc", help="faulty runs, comma-separated ('' for none)")
    p.add_argument("--deadline", type=float, default=600.0, help="seconds each wait may take")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: every run stops its processes
    bootstrap = os.environ.get("GANGWATCH_KAFKA", "127.0.0.1:9092")
    host, _, port = os.environ.get("GANGWATCH_CLICKHOUSE", "127.0.0.1:9000").rpartition(":")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gangwatch-realjob-") as tmp:
        if args.minutes > 0:
            steps = int(args.minutes * 60 * STEPS_PER_S)
            rows.append(one_run(bootstrap, (host, int(port)), Path(tmp), "healthy", None, steps,
                                args.minutes * 60 + args.deadline))
            print(rows[-1], flush=True)
        for name in filter(None, args.faults.split(",")):
            rows.append(one_run(bootstrap, (host, int(port)), Path(tmp), name, FAULTS[name], 100_000, args.deadline))
            print(rows[-1], flush=True)
    columns = ["run", *FIVE, "total", "over_budget", "culprits", "decision", "other_incidents", "trained_s",
               "findings", "after_end", "actions", "incidents", "wall_s", "error"]
    columns = [c for c in columns if any(c in r for r in rows)]
    print("\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(str(r.get(c, "")) for c in columns) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
