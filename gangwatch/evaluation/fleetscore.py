"""A fleet day scored as an operator reads it (`gangwatch eval --fleet`): false pages per day per 500 GPUs.

The fleet (`producers/simulate/fleetday.py`) is generated, replayed through the pure core as one stream (every job
at once, as a worker sees them), and each job's outputs are scored against its truth with the scenario scorer
(`scoring.score`: a fault counts as detected only by an incident of its class, localized only when that incident
names its node and few innocents). On top of that, per fleet:

- **false pages**: `escalate` actions whose incident explains no fault (or on a job with none), per day per 500
  GPUs: what decides whether an operator leaves automatic actions on;
- **false evictions**: nodes evicted that no fault explains, and the GPU-hours they cost (the node out of its job
  for the rest of the day);
- **missed faults**: faults no incident of their class detected (hardware ones apart: `fail_stop`);
- **latency** of detection and localization per class, p50 and p90.

`check` holds it to floors (`FleetFloor`); CI runs a small fleet with faults upsampled and fails below them.
"""

from __future__ import annotations

import math
import tempfile
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gangwatch.evaluation.scoring import ScenarioScore, replayed, score
from gangwatch.schemas import EVICTING_ACTIONS

HARDWARE = frozenset({"fail_stop"})  # classes whose faults are a machine's: none may be missed


@dataclass(frozen=True)
class FleetFloor:
    """What a fleet day must do: at most `false_pages_per_day_500` false pages a day per 500 GPUs, at most
    `false_evictions`, no hardware fault missed, hard faults detected within `detect_p90_s` (p90) and localized
    within `localize_p90_s` (the issue's bar: 0.05 false pages, 0 false evictions, 15 s, 60 s)."""

    false_pages_per_day_500: float = 0.05
    false_evictions: int = 0
    hardware_missed: int = 0
    detect_p90_s: float = 15.0
    localize_p90_s: float = 60.0


@dataclass
class FleetScore:
    gpus: int
    hours: float
    jobs: int
    faults: int
    records: int = 0
    replay_s: float = 0.0
    false_pages: list[str] = field(default_factory=list)  # "job:incident class" of each false page
    false_evictions: list[str] = field(default_factory=list)  # "job:node"
    false_eviction_gpu_hours: float = 0.0
    missed: list[str] = field(default_factory=list)  # "job:kind on node"
    by_class: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs_scored: list[ScenarioScore] = field(default_factory=list)

    @property
    def false_pages_per_day_500(self) -> float:
        return len(self.false_pages) / (self.hours / 24.0) / (self.gpus / 500.0)

    @property
    def hardware_missed(self) -> list[str]:
        return [m for m in self.missed if m.split(" ", 1)[0].split(":", 1)[1] in HARDWARE]


def _p(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)], 3)


def score_fleet(truth: dict[str, Any], findings: list[dict], actions: list[dict], incidents: list[dict]) -> FleetScore:
    """Score a fleet's outputs (wire dicts, any jobs mixed) against its truth (`fleet.truth`)."""
    fl = truth["fleet"]
    by_job: dict[str, dict[str, list[dict]]] = defaultdict(lambda: {"f": [], "a": [], "i": []})
    for key, rows in (("f", findings), ("a", actions), ("i", incidents)):
        for row in rows:
            by_job[row["job"]][key].append(row)
    out = FleetScore(fl["gpus"], fl["hours"], len(truth["jobs"]), 0)
    lat: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"detect": [], "localize": [], "n": [], "ok": []})
    for job in truth["jobs"]:
        got = by_job.get(job["job"], {"f": [], "a": [], "i": []})
        s = score(job["truth"], got["f"], got["a"], got["i"])
        out.jobs_scored.append(s)
        explained = set(s.explained)
        classes = {i["id"]: i["class"] for i in got["i"]}
        out.false_pages += [f"{job['job']}:{classes.get(a['incident'], '?')}" for a in got["a"]
                            if a["type"] == "escalate" and a["incident"] not in explained]
        for node in s.innocent_evicted:
            out.false_evictions.append(f"{job['job']}:{node}")
            when = min((a["ts"] for a in got["a"] if a["type"] in EVICTING_ACTIONS and node in a["nodes"]),
                       default=fl["end_ts"])
            out.false_eviction_gpu_hours += fl["gpus_per_node"] * max(0.0, fl["end_ts"] - when) / 3600.0
        for f in s.faults:
            out.faults += 1
            c = lat[f.cls]
            c["n"].append(1)
            c["ok"].append(1 if f.detected and f.localized else 0)
            if not f.detected:
                out.missed.append(f"{job['job']}:{f.cls} {f.kind} on {','.join(f.nodes)}")
            if f.detect_s is not None:
                c["detect"].append(f.detect_s)
            if f.localize_s is not None:
                c["localize"].append(f.localize_s)
    out.false_eviction_gpu_hours = round(out.false_eviction_gpu_hours, 2)
    out.by_class = {cls: {"faults": len(c["n"]), "right": sum(c["ok"]),
                          "detect_p50_s": _p(c["detect"], 0.5), "detect_p90_s": _p(c["detect"], 0.9),
                          "localize_p50_s": _p(c["localize"], 0.5), "localize_p90_s": _p(c["localize"], 0.9)}
                    for cls, c in sorted(lat.items())}
    return out


def run(fleet: Any, work: Path | None = None) -> FleetScore:
    """Generate `fleet`, replay it (JSONL), score it."""
    from gangwatch.producers.simulate.fleetday import write

    with tempfile.TemporaryDirectory(prefix="gangwatch-fleet-") as tmp:
        base = Path(work or tmp)
        stream, truth_path = write(fleet, base)
        summary, outputs = replayed(stream, base / "fleet.out")
        s = score_fleet(orjson.loads(truth_path.read_bytes()), *outputs)
        s.records, s.replay_s = summary.records, round(summary.wall_s, 1)
        return s


def render(s: FleetScore) -> str:
    days = s.hours / 24.0
    lines = [f"fleet: {s.gpus:,} GPUs for {s.hours:g} h ({s.gpus * s.hours:,.0f} GPU-hours), {s.jobs} jobs, "
             f"{s.faults} faults; {s.records:,} records replayed in {s.replay_s:g} s",
             f"false pages: {len(s.false_pages)} ({s.false_pages_per_day_500:.3f} a day per 500 GPUs)"
             + (f": {', '.join(s.false_pages[:8])}" if s.false_pages else ""),
             f"false evictions: {len(s.false_evictions)} ({s.false_eviction_gpu_hours:g} GPU-hours)"
             + (f": {', '.join(s.false_evictions[:8])}" if s.false_evictions else ""),
             f"faults missed: {len(s.missed)}" + (f": {'; '.join(s.missed[:8])}" if s.missed else ""),
             "",
             f"{'class':<10} {'faults':>6} {'right':>6} {'detect p50':>10} {'p90':>7} {'localize p50':>12} {'p90':>7}"]
    show = lambda x: "-" if x is None else f"{x:g}"  # noqa: E731
    for cls, c in s.by_class.items():
        lines.append(f"{cls:<10} {c['faults']:>6} {c['right']:>6} {show(c['detect_p50_s']):>10} "
                     f"{show(c['detect_p90_s']):>7} {show(c['localize_p50_s']):>12} {show(c['localize_p90_s']):>7}")
    if days < 1:
        lines.append(f"(a {s.hours:g} h fleet: per-day figures are its counts x {1 / days:g})")
    return "\n".join(lines)


def to_json(s: FleetScore) -> bytes:
    d = asdict(s)
    d.pop("jobs_scored")
    d["false_pages_per_day_500"] = round(s.false_pages_per_day_500, 4)
    d["hardware_missed"] = s.hardware_missed
    return orjson.dumps(d, option=orjson.OPT_INDENT_2)


def check(s: FleetScore, floor: FleetFloor = FleetFloor()) -> list[str]:
    """Each floor the fleet day missed, in words (empty: none)."""
    missed = []
    if s.false_pages_per_day_500 > floor.false_pages_per_day_500:
        missed.append(f"{s.false_pages_per_day_500:.3f} false pages a day per 500 GPUs (at most "
                      f"{floor.false_pages_per_day_500:g}): {', '.join(s.false_pages[:5])}")
    if len(s.false_evictions) > floor.false_evictions:
        missed.append(f"{len(s.false_evictions)} false evictions (at most {floor.false_evictions}): "
                      f"{', '.join(s.false_evictions[:5])}")
    if len(s.hardware_missed) > floor.hardware_missed:
        missed.append(f"{len(s.hardware_missed)} hardware faults missed: {'; '.join(s.hardware_missed[:5])}")
    for cls in HARDWARE:
        c = s.by_class.get(cls)
        if c and c["detect_p90_s"] is not None and c["detect_p90_s"] > floor.detect_p90_s:
            missed.append(f"{cls} detection p90 {c['detect_p90_s']:g} s (at most {floor.detect_p90_s:g} s)")
        if c and c["localize_p90_s"] is not None and c["localize_p90_s"] > floor.localize_p90_s:
            missed.append(f"{cls} localization p90 {c['localize_p90_s']:g} s (at most {floor.localize_p90_s:g} s)")
    return missed
