"""`gangwatch eval`: replay simulated scenarios and score the outputs against their ground truth.

For every injected fault (event time throughout):
- detected: an incident of the fault's own class opened at or after the fault's onset (an incident of another
  class detects nothing: a hang taken for a fail-stop is a miss); detection latency = incident `detected_ts` -
  onset. The scenario table still shows the class the first incident after onset had, right or wrong.
- localized: that incident's `culprit_nodes` hold every node of the fault and name at most as many other
  nodes as the fault has (`Floor.named_innocents`, 1 per faulty node unless its class says otherwise; nodes
  of the scenario's other faults are no innocents). A verdict naming one culprit and one neighbour still
  narrows a 2,048-GPU job to two machines a human or a dual run can check; one naming the whole gang
  localizes nothing, whatever it includes.
  Localization latency = `localized_ts` - onset.
- evictions: nodes named by evicting actions (replace, evict_group, isolate, requeue);
  precision = evicted culprits / evicted nodes; innocents per culprit = evicted non-culprits / culprits.
- false incidents: every incident that explains none of the run's faults (no fault matched it), in any run;
  the only exception is a `stall` that names nobody (the whole job waiting alike, a long checkpoint: the
  class exists for it, and it pages only past its budget, which counts as a page).
Healthy and planned runs score their false evictions, false pages (escalations) and false incidents (all
must be 0), and so do precursor faults (hardware wear that interrupts nothing: no incident expected) and
benign ones (a rank steadily slower than its peers: a difference, not a fault): those must be reported (a
`heterogeneous` finding per rank) and never evicted. On a run with no fault at all (healthy, benign,
precursor) a finding that would open an incident and names a node or rank is a false finding too (floor 0),
whether or not triage then opened one: an output that fires at everything fails even where triage holds it.

Each class has a quality floor (`FLOORS`, declared with the class in
schemas/classes.py: recall, localization, innocent nodes
evicted per culprit, every fault detected and localized within its stage
budget; no false eviction on healthy, planned and benign runs; no false incident on any run). `check` lists
what falls below; `gangwatch eval` prints the table and then fails (exit 7) on
a missed floor, which is what fails CI.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gangwatch.schemas import EVICTING_ACTIONS as EVICTING
from gangwatch.schemas.classes import CLASSES, Floor


@dataclass
class FaultScore:
    scenario: str
    kind: str
    cls: str
    nodes: list[str]
    detected: bool = False
    class_ok: bool = False
    localized: bool = False
    detect_s: float | None = None
    localize_s: float | None = None
    incident_class: str | None = None  # the class of the incident that detected it, else of the first one after onset
    incident_nodes: list[str] = field(default_factory=list)  # the culprit nodes that incident named


@dataclass
class BenignScore:
    """A difference that is no fault (a heterogeneous rank): it must be reported on its rank, never evicted."""

    scenario: str
    kind: str
    ranks: list[int]
    nodes: list[str]
    reported: bool = False


# benign fault kind -> the finding type that must report it, and on what: each of its ranks, or its node
EXPECTED_REPORT = {"heterogeneous": ("heterogeneous", "rank"), "clock_skew": ("clock_skew", "node"),
                   "late_delivery": ("telemetry_gap", "node")}


@dataclass
class ScenarioScore:
    scenario: str
    healthy: bool
    planned: bool
    faults: list[FaultScore] = field(default_factory=list)
    benign: list[BenignScore] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    innocent_evicted: list[str] = field(default_factory=list)
    pages: int = 0  # escalations: a human called (false on a healthy, benign or planned run)
    actions: dict[str, int] = field(default_factory=dict)
    incidents: int = 0
    findings: int = 0
    false_incidents: list[str] = field(default_factory=list)  # "class:id" of each incident no fault explains
    explained: list[str] = field(default_factory=list)  # ids of the incidents that detected a fault
    false_findings: int = 0  # on a run with no fault: findings that would open an incident, naming a node or rank
    records: int = 0
    replay_s: float = 0.0

    @property
    def ok(self) -> bool:
        if not all(b.reported for b in self.benign):
            return False
        if self.false_incidents or self.false_findings:
            return False
        if self.healthy or self.planned:
            return not self.evicted and not self.pages
        return all(f.detected and f.class_ok and f.localized for f in self.faults) and not self.innocent_evicted


def _latest(incidents: list[dict]) -> list[dict]:
    """The latest version of each incident, in order of first appearance."""
    latest: dict[str, dict] = {}
    for inc in incidents:
        latest[inc["id"]] = inc
    return list(latest.values())


ALLOWED_UNEXPLAINED = ("stall",)  # incidents of these classes that name nobody are no false alarm (module doc)


def _opens_an_incident(f: dict) -> bool:
    """Whether this finding (a wire dict) would open an incident, as triage reads its type's policy."""
    from gangwatch.detectors.catalog import REGISTRY
    from gangwatch.schemas import DecodeError, decode_obj

    decls = REGISTRY.types.get(f["type"])
    if decls is not None and all(d.policy.incident is None for d in decls):
        return False  # never opens one, whatever its evidence says (no need to read it)
    rec = decode_obj({"kind": "finding", "v": 1, **f})
    if isinstance(rec, DecodeError):
        raise ValueError(f"a finding the scorer cannot read: {rec}")
    return REGISTRY.typed(rec).incident_class is not None


def localizes(inc: dict, nodes: list[str], faulty: set[str]) -> bool:
    """`inc` names every node of a fault on `nodes`, and at most its class's `Floor.named_innocents` innocent
    nodes per node of the fault (`faulty`: the nodes of all the scenario's faults, which are no innocents)."""
    named = set(inc.get("culprit_nodes") or [])
    slack = (FLOORS.get(inc["class"]) or Floor()).named_innocents
    return (inc.get("localized_ts") is not None and set(nodes) <= named
            and len(named - faulty - set(nodes)) <= slack * len(nodes))


def score(truth: dict[str, Any], findings: list[dict], actions: list[dict], incidents: list[dict]) -> ScenarioScore:
    """Score one scenario's outputs against its ground truth (a precursor, class None, expects no incident: it is
    not scored, and evicting its node is an innocent eviction)."""
    faults = [f for f in truth["faults"] if f["class"] is not None]
    planned = bool(faults) and all(f["planned"] for f in faults)
    s = ScenarioScore(truth["scenario"], truth["healthy"], planned, findings=len(findings))
    incs = _latest(incidents)
    s.incidents = len(incs)
    for a in actions:
        s.actions[a["type"]] = s.actions.get(a["type"], 0) + 1
    s.pages = s.actions.get("escalate", 0)
    for f in truth["faults"]:
        if f["class"] is None and f["kind"] in EXPECTED_REPORT:
            want, on = EXPECTED_REPORT[f["kind"]]
            reported = {x[on] for x in findings if x["type"] == want and x["ts"] >= f["onset_ts"] - 1.0}
            s.benign.append(BenignScore(truth["scenario"], f["kind"], list(f["ranks"]), list(f["nodes"]),
                                        reported=set(f[f"{on}s"]) <= reported))
    culprit_nodes = {n for f in faults if not f["planned"] for n in f["nodes"]}
    evicted = sorted({n for a in actions if a["type"] in EVICTING for n in a["nodes"]})
    s.evicted = evicted
    s.innocent_evicted = [n for n in evicted if n not in culprit_nodes]
    explained: set[str] = set()
    for f in faults:
        fs = FaultScore(truth["scenario"], f["kind"], f["class"], list(f["nodes"]))
        onset = f["onset_ts"]
        faulty = culprit_nodes | set(f["nodes"])
        # the incident this fault caused: the first one of its class detected after onset (small slack for
        # lateness) that localizes it (several faults at once may be several incidents), else the first of its
        # class naming its node, else the first of its class; an incident of another class detects nothing
        cands = [i for i in incs if i["detected_ts"] is not None and i["detected_ts"] >= onset - 1.0]
        mine = [i for i in cands if i["class"] == f["class"]]
        naming = [i for i in mine if set(f["nodes"]) & set(i.get("culprit_nodes") or [])]
        match = next((i for i in mine if localizes(i, f["nodes"], faulty)), next(iter(naming + mine), None))
        fs.incident_class = match["class"] if match is not None else cands[0]["class"] if cands else None
        if match is not None:
            explained.add(match["id"])
            fs.detected = fs.class_ok = True
            fs.detect_s = round(match["detected_ts"] - onset, 3)
            fs.incident_nodes = list(match.get("culprit_nodes") or [])
            if localizes(match, f["nodes"], faulty):
                fs.localized = True
                fs.localize_s = round(match["localized_ts"] - onset, 3)
        s.faults.append(fs)
    s.explained = sorted(explained)
    s.false_incidents = [f"{i['class']}:{i['id']}" for i in incs if i["id"] not in explained
                         and not (i["class"] in ALLOWED_UNEXPLAINED and not i.get("culprit_nodes"))]
    if not faults:  # nothing happened that should open anything: a finding that would, blaming someone, is false
        s.false_findings = sum(1 for x in findings if (x.get("node") is not None or x.get("rank") is not None)
                               and _opens_an_incident(x))
    return s


def run_scenario(sc: Any, work: Path) -> ScenarioScore:
    """Generate one scenario, replay it (JSONL only), score it."""
    from gangwatch.producers.simulate import write

    stream, truth_path = write(sc, work)
    summary, outputs = replayed(stream, work / f"{sc.name}.out")
    s = score(orjson.loads(truth_path.read_bytes()), *outputs)
    s.records, s.replay_s = summary.records, round(summary.wall_s, 3)
    return s


def replayed(stream: Path, out: Path) -> tuple[Any, tuple[list[dict], list[dict], list[dict]]]:
    """Replay a generated stream (JSONL outputs only) into `out`: (its summary, (findings, actions, incidents))."""
    from gangwatch.streams import replay

    summary = replay.run([stream], out, None, progress=None)
    read = lambda name: [orjson.loads(x) for x in (out / name).read_bytes().splitlines()]  # noqa: E731
    return summary, (read("findings.jsonl"), read("actions.jsonl"), read("incidents.jsonl"))


def evaluate(scenarios: Iterable[Any], work: Path | None = None, progress=None) -> list[ScenarioScore]:
    with tempfile.TemporaryDirectory(prefix="gangwatch-eval-") as tmp:
        base = work or Path(tmp)
        out = []
        for sc in scenarios:
            s = run_scenario(sc, base)
            if progress:
                progress(s)
            out.append(s)
        return out


def _mean(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.1f}" if xs else "-"


def _p50(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f}" if xs else "-"


def by_class(scores: list[ScenarioScore]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for s in scores:
        key_faults = s.faults if s.faults else []
        if s.benign:
            r = rows.setdefault("benign", {"runs": 0, "expected": 0, "reported": 0, "false_evictions": 0,
                                           "false_pages": 0, "false_incidents": 0, "false_findings": 0})
            r["runs"] += 1
            r["expected"] += len(s.benign)
            r["reported"] += sum(b.reported for b in s.benign)
            if not s.faults:  # nothing else happened: any eviction, page, incident or blaming finding is a false one
                r["false_evictions"] += len(s.evicted)
                r["false_pages"] += s.pages
                r["false_incidents"] += len(s.false_incidents)
                r["false_findings"] += s.false_findings
        if s.healthy or (not s.faults and not s.benign):  # a precursor alone is scored as a healthy run
            r = rows.setdefault("healthy", {"runs": 0, "false_evictions": 0, "false_pages": 0, "false_incidents": 0,
                                            "false_findings": 0})
            r["runs"] += 1
            r["false_evictions"] += len(s.evicted)
            r["false_pages"] += s.pages
            r["false_incidents"] += len(s.false_incidents)
            r["false_findings"] += s.false_findings
            continue
        for f in key_faults:
            r = rows.setdefault(f.cls, {"faults": 0, "detected": 0, "class_ok": 0, "localized": 0, "detect_s": [],
                                        "localize_s": [], "evicted": 0, "evicted_culprits": 0, "culprits": 0,
                                        "false_evictions": 0, "false_pages": 0, "false_incidents": 0})
            r["faults"] += 1
            r["detected"] += f.detected
            r["class_ok"] += f.class_ok
            r["localized"] += f.localized
            if f.detect_s is not None:
                r["detect_s"].append(f.detect_s)
            if f.localize_s is not None:
                r["localize_s"].append(f.localize_s)
        if s.faults:
            cls = s.faults[0].cls
            r = rows[cls]
            r["false_incidents"] += len(s.false_incidents)
            culprits = {n for f in s.faults for n in f.nodes}
            if s.planned:
                r["false_evictions"] += len(s.evicted)
                r["false_pages"] += s.pages
            else:
                r["evicted"] += len(s.evicted)
                r["evicted_culprits"] += len([n for n in s.evicted if n in culprits])
                r["culprits"] += len(culprits)
    return rows


def render(scores: list[ScenarioScore]) -> str:
    lines = [f"{'scenario':<34} {'ok':<3} {'class':<10} {'detect s':>8} {'local s':>8} {'evicted':<22} "
             f"{'actions':<40} {'rec/s':>8}"]
    for s in scores:
        f = s.faults[0] if s.faults else None
        acts = ",".join(f"{k}:{v}" for k, v in sorted(s.actions.items()))
        rate = s.records / s.replay_s if s.replay_s else 0
        lines.append(f"{s.scenario:<34} {'yes' if s.ok else 'NO':<3} "
                     f"{(f.incident_class or '-') if f else ('-' if not s.incidents else 'INCIDENT'):<10} "
                     f"{(f.detect_s if f and f.detect_s is not None else '-')!s:>8} "
                     f"{(f.localize_s if f and f.localize_s is not None else '-')!s:>8} "
                     f"{','.join(s.evicted)[:22] or '-':<22} {acts[:40] or '-':<40} {rate:>8,.0f}")
    lines.append("")
    lines.append(f"{'class':<10} {'faults':>6} {'recall':>7} {'class ok':>8} {'localized':>9} {'detect p50':>10} "
                 f"{'local p50':>9} {'evict prec':>10} {'innoc/culprit':>13} {'false evict':>11} {'false page':>10} "
                 f"{'false inc':>9} {'false find':>10}")
    for cls, r in sorted(by_class(scores).items()):
        if cls == "healthy":
            lines.append(f"{'healthy':<10} {r['runs']:>6} {'':>7} {'':>8} {'':>9} {'':>10} {'':>9} {'':>10} "
                         f"{'':>13} {r['false_evictions']:>11} {r['false_pages']:>10} {r['false_incidents']:>9} "
                         f"{r['false_findings']:>10}")
            continue
        if cls == "benign":  # recall here: the share of benign ranks reported as such
            lines.append(f"{'benign':<10} {r['expected']:>6} {r['reported'] / r['expected']:>7.2f} {'':>8} {'':>9} "
                         f"{'':>10} {'':>9} {'':>10} {'':>13} {r['false_evictions']:>11} {r['false_pages']:>10} "
                         f"{r['false_incidents']:>9} {r['false_findings']:>10}")
            continue
        n = r["faults"]
        prec = f"{r['evicted_culprits'] / r['evicted']:.2f}" if r["evicted"] else "-"
        innoc = f"{(r['evicted'] - r['evicted_culprits']) / r['culprits']:.2f}" if r["culprits"] else "-"
        lines.append(f"{cls:<10} {n:>6} {r['detected'] / n:>7.2f} {r['class_ok'] / n:>8.2f} "
                     f"{r['localized'] / n:>9.2f} {_p50(r['detect_s']):>10} {_p50(r['localize_s']):>9} "
                     f"{prec:>10} {innoc:>13} {r['false_evictions']:>11} {r.get('false_pages', 0):>10} "
                     f"{r['false_incidents']:>9} {'':>10}")
    ok = sum(s.ok for s in scores)
    lines.append("")
    lines.append(f"{ok}/{len(scores)} scenarios fully right")
    return "\n".join(lines)


def to_json(scores: list[ScenarioScore]) -> bytes:
    rows = by_class(scores)
    for r in rows.values():
        for k in ("detect_s", "localize_s"):
            if k in r:
                r[k + "_mean"] = float(_mean(r[k])) if r[k] else None
    return orjson.dumps({"scenarios": [{**asdict(s), "ok": s.ok} for s in scores], "by_class": rows},
                        option=orjson.OPT_INDENT_2)


# --- the quality floor -----------------------------------------------------------------------------


# each class's floor is declared with the class (schemas/classes.py); classes without one are no fault classes
FLOORS: dict[str, Floor] = {name: c.floor for name, c in CLASSES.items() if c.floor is not None}
NO_EVICTION = ("healthy", "benign", "planned")  # runs where nobody may be evicted at all


def check(scores: list[ScenarioScore], floors: dict[str, Floor] | None = None) -> list[str]:
    """Every floor the run falls below, one line each ("fail_slow: recall 0.89 below its floor 1.00");
    empty when all classes hold."""
    floors = FLOORS if floors is None else floors
    out = []
    rows = by_class(scores)
    for cls, r in sorted(rows.items()):
        if cls in NO_EVICTION and r["false_evictions"]:
            out.append(f"{cls}: {r['false_evictions']} false eviction(s), floor 0")
        if cls in NO_EVICTION and r.get("false_pages"):
            out.append(f"{cls}: {r['false_pages']} false page(s) (escalations), floor 0")
        if r.get("false_incidents"):  # in any run: an incident that explains none of its faults
            out.append(f"{cls}: {r['false_incidents']} incident(s) that no fault explains, floor 0")
        if r.get("false_findings"):
            out.append(f"{cls}: {r['false_findings']} finding(s) that would open an incident on a run with no "
                       "fault, floor 0")
        if cls == "benign" and r["reported"] < r["expected"]:
            out.append(f"benign: {r['reported']}/{r['expected']} benign faults reported (heterogeneous ranks, skewed "
                       "clocks, late nodes), floor all")
        floor = floors.get(cls)
        if floor is None or not r.get("faults"):
            continue
        n = r["faults"]
        for what, got, least in (("recall", r["detected"] / n, floor.recall),
                                 ("localization", r["localized"] / n, floor.localized)):
            if got < least:
                out.append(f"{cls}: {what} {got:.2f} below its floor {least:.2f}")
        if r["culprits"]:
            innoc = (r["evicted"] - r["evicted_culprits"]) / r["culprits"]
            if innoc > floor.innocent_per_culprit:
                out.append(f"{cls}: {innoc:.2f} innocent nodes evicted per culprit, floor {floor.innocent_per_culprit}")
        for what, xs, budget in (("detection", r["detect_s"], floor.detect_s),
                                 ("localization", r["localize_s"], floor.localize_s)):
            if xs and max(xs) > budget:
                out.append(f"{cls}: {what} took {max(xs):.1f} s, over its budget of {budget:.0f} s")
    return out
