"""A knowledge base of closed incidents: what each one was, what fixed it, and which past ones a new one is like.

An `Entry` is one closed incident (recovered, or ended by a resolution such as `self_resolved`, `job_stopped`,
`withdrawn`) made from the rows gangwatch stores: its `gw_incidents` row (the latest version), its `gw_actions`
rows and the `gw_findings` rows those actions cite. It holds the timeline (milestone times), the root cause
(class, culprit nodes, the decision's reason), the path taken (the actions in order), each stage against its
budget, links (finding and action ids) and an evidence `Signature`.

A signature is a set of features of the cited findings that leave out everything particular to one occurrence
(nodes, ranks, ids, times, measured values), so the same failure mode on another node of another job gives the
same set, and a hang and a straggler share almost nothing. Per finding:

- `type:T`: its type (`hang`, `fail_stop`, `hw_fault`, ...); `det:D`: its detector (`hardware.xid`, `flight`, ...);
- `named:F` when it names a node, F the detector's family (`stacks`, `flight`, `hardware`, `failstop`, ...);
- `xid:N` for a hardware event of the Xid source with code N;
- `ev:T.K=V` for each categorical field K of its evidence among `CATEGORICAL` (`cause`, `source`, `severity`,
  `name`, `reason`, `op`, `desc`, `top_frame`, ...), and `code` when it is not an Xid;
- `error:TEXT` for a software failure's message (evidence with a `message` and no hardware `source`): its first
  line, lower case, numbers and addresses as `#`.

Two signatures compare by weighted Jaccard: the weight of the features they share over the weight of the
features either has, each feature weighing `WEIGHTS[its prefix]` (1 for a prefix not listed); 0 when both are
empty.

A fleet history (`gangwatch.fleet.history`: tickets, a drain log, the import format) makes entries too
(`from_history`), so "has this node failed like this before" is answered from a deployment's first day: one entry
per fault of the history (an event of a fault class, or any event with an end: the machine was out), its class
and node, onset at its start, recovered at its end, the history's description as its cause. Its signature is
made from its class alone: `xid:N` for `xid_N` (so an Xid 79 incident is like a history's Xid 79s), `type:C` for
an incident class C (`fail_stop`, `hang`, ...), else `class:C`.

Pure: the standard library and `gangwatch.schemas` only (`json` reads evidence text), no I/O, no clock, so triage
can call `closest` at decision time with a `Signature` made by `Signature.of` from the findings it holds.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from gangwatch.schemas.classes import CLASSES

if TYPE_CHECKING:
    from gangwatch.fleet.history import NodeEvent

HISTORY_PATH = "history"  # the `path` and `job` of an entry made from a fleet history
HISTORY_FAULTS = ("fail_stop", "sdc", "hang", "fail_slow", "unknown", "xid_*")  # fault classes (shell patterns)
SIGNATURE_VERSION = 1  # bump when features are made differently: saved signatures of another version are refused
WEIGHTS: dict[str, float] = {"type": 3.0, "xid": 4.0, "error": 2.0, "named": 2.0, "det": 1.0, "ev": 1.0}
CATEGORICAL = ("cause", "source", "severity", "name", "reason", "metric", "counter", "desc", "op", "top_frame",
               "whole_node", "nonfinite")
MILESTONES = ("onset", "detected", "localized", "decided", "recovered")
DIAGNOSTIC = frozenset({"collect_stacks", "replay"})  # actions that gather evidence and decide nothing
MIN_SIMILARITY = 0.5
TEXT_MAX = 80  # characters of a feature's value

_VOLATILE = re.compile(r"0x[0-9a-f]+|\d+(?:\.\d+)?", re.IGNORECASE)
_SPACE = re.compile(r"\s+")

FindingTuple = tuple[str, str, str | None, Mapping[str, Any]]  # (type, detector, node or None, evidence)


# --- the signature -------------------------------------------------------------------------------------------


def _text(value: object) -> str:
    return _SPACE.sub(" ", str(value)).strip()[:TEXT_MAX]


def _finding_features(ftype: str, detector: str, node: str | None, ev: Mapping[str, Any]) -> set[str]:
    out = {f"type:{ftype}", f"det:{detector}"}
    if node:
        out.add(f"named:{detector.split('.')[0]}")
    for key in CATEGORICAL:
        v = ev.get(key)
        if isinstance(v, bool):
            out.add(f"ev:{ftype}.{key}={str(v).lower()}")
        elif isinstance(v, int | str) and _text(v):
            out.add(f"ev:{ftype}.{key}={_text(v)}")
    code = ev.get("code")
    if isinstance(code, int) and not isinstance(code, bool):
        out.add(f"xid:{code}" if ev.get("source") == "xid" else f"ev:{ftype}.code={code}")
    message = ev.get("message")
    if isinstance(message, str) and message.strip() and "source" not in ev:
        first = message.strip().splitlines()[0]
        out.add(f"error:{_text(_VOLATILE.sub('#', first).lower())}")
    return out


def weight(feature: str) -> float:
    """A feature's weight in the similarity: `WEIGHTS` of the part before its first colon (1 when not listed)."""
    return WEIGHTS.get(feature.partition(":")[0], 1.0)


@dataclass(frozen=True)
class Signature:
    """An incident's evidence as a comparable set of features (the module's list); JSON-able with `to_json`."""

    features: frozenset[str] = frozenset()

    @classmethod
    def of(cls, findings: Iterable[FindingTuple]) -> Signature:
        """The signature of findings given as (type, detector, node or None, evidence dict) tuples."""
        out: set[str] = set()
        for ftype, detector, node, ev in findings:
            out |= _finding_features(ftype, detector or "", node, ev if isinstance(ev, Mapping) else {})
        return cls(frozenset(out))

    def similarity(self, other: Signature) -> float:
        """Weighted Jaccard in [0, 1]: symmetric, 1 for equal non-empty sets, 0 when nothing is shared."""
        union = self.features | other.features
        if not union:
            return 0.0
        return sum(map(weight, self.features & other.features)) / sum(map(weight, union))

    def to_json(self) -> dict[str, Any]:
        """`{"v": SIGNATURE_VERSION, "features": [sorted]}`: the saved form."""
        return {"v": SIGNATURE_VERSION, "features": sorted(self.features)}

    @classmethod
    def from_json(cls, value: Any) -> Signature:
        """The signature `to_json` gave; ValueError for another version or shape (make it again with `of`)."""
        if not isinstance(value, Mapping) or value.get("v") != SIGNATURE_VERSION:
            raise ValueError(f"not a version {SIGNATURE_VERSION} signature: make it again from the findings "
                             "with Signature.of")
        features = value.get("features")
        if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
            raise ValueError("a signature's features must be a list of strings")
        return cls(frozenset(features))


# --- entries -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActionTaken:
    """One action of an incident's path (`shadow`: only recorded, nothing was sent)."""

    id: str
    ts: float
    type: str
    nodes: tuple[str, ...]
    path: str
    reason: str
    shadow: bool = False


@dataclass(frozen=True)
class StageTime:
    """One stage's seconds against its budget (None: the stage has none, or none was given)."""

    name: str
    seconds: float
    budget: float | None
    over: bool


@dataclass(frozen=True)
class Entry:
    """One incident as a knowledge-base entry. `actions` are in event-time order; `findings` are the ids its
    actions cite, in the order first cited."""

    id: str
    job: str
    cls: str
    planned: bool
    times: dict[str, float | None]  # MILESTONES -> event time (None: not reached)
    culprit_nodes: tuple[str, ...]
    evicted_nodes: tuple[str, ...]
    path: str
    resolution: str  # how it ended without a recovery ('' when it did not, or the rows do not say)
    actions: tuple[ActionTaken, ...]
    stages: tuple[StageTime, ...]
    signature: Signature
    findings: tuple[str, ...]
    description: str = ""  # a history entry's description (what the ticket said); '' for an incident

    @property
    def closed(self) -> bool:
        return self.times.get("recovered") is not None or bool(self.resolution)

    @property
    def decision(self) -> ActionTaken | None:
        """The action it was decided by: its first carried out that is not diagnostic (else its first carried
        out, else its first: shadow mode)."""
        done = [a for a in self.actions if not a.shadow]
        decided = [a for a in done if a.type not in DIAGNOSTIC]
        return (decided or done or list(self.actions) or [None])[0]

    @property
    def ended_by(self) -> ActionTaken | None:
        """The action that ended it: its last carried out, not diagnostic, at or before the recovery (None: none)."""
        rec = self.times.get("recovered")
        done = [a for a in self.actions if not a.shadow and a.type not in DIAGNOSTIC and (rec is None or a.ts <= rec)]
        return done[-1] if done else None

    @property
    def reason(self) -> str:
        """The decision's reason; a history entry's description when nothing was decided."""
        d = self.decision
        return d.reason if d is not None else self.description

    @property
    def recover_s(self) -> float | None:
        """Seconds from onset to recovery (None: not recovered, or no onset)."""
        onset, rec = self.times.get("onset"), self.times.get("recovered")
        return None if onset is None or rec is None else max(0.0, rec - onset)

    @property
    def over_budget(self) -> list[str]:
        return [s.name for s in self.stages if s.over]

    @property
    def root_cause(self) -> str:
        """Class, culprit nodes, the decision's reason and the resolution, as one line (what `cause` searches)."""
        nodes = ",".join(self.culprit_nodes) or "nobody named"
        text = f"{self.cls} on {nodes}: {self.reason or 'no decision recorded'}"
        return f"{text} ({self.resolution})" if self.resolution else text

    @property
    def fix(self) -> str:
        """What fixed it: the ending action and its nodes and path, else the resolution, else 'back in service' when
        it recovered (a history's fault), else '-'."""
        a = self.ended_by
        if a is not None:
            return " ".join(x for x in (a.type, ",".join(a.nodes), f"({a.path})" if a.path else "") if x)
        return self.resolution or ("back in service" if self.times.get("recovered") is not None else "-")

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`from_dict` reads it back)."""
        ended = self.ended_by
        return {"id": self.id, "job": self.job, "class": self.cls, "planned": self.planned, "times": dict(self.times),
                "root_cause": {"class": self.cls, "culprit_nodes": list(self.culprit_nodes), "reason": self.reason,
                               "resolution": self.resolution},
                "evicted_nodes": list(self.evicted_nodes), "path": self.path,
                "actions": [{"id": a.id, "ts": a.ts, "type": a.type, "nodes": list(a.nodes), "path": a.path,
                             "reason": a.reason, "shadow": a.shadow} for a in self.actions],
                "ended_by": ended.id if ended is not None else None, "fix": self.fix, "recover_s": self.recover_s,
                "stages": [{"name": s.name, "seconds": s.seconds, "budget": s.budget, "over": s.over}
                           for s in self.stages],
                "over_budget": self.over_budget, "signature": self.signature.to_json(),
                "links": {"findings": list(self.findings), "actions": [a.id for a in self.actions]},
                "description": self.description}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Entry:
        """An entry from `to_dict`'s form; ValueError naming what is missing or wrong."""
        try:
            cause = d["root_cause"]
            return cls(
                id=str(d["id"]), job=str(d["job"]), cls=str(d["class"]), planned=bool(d.get("planned")),
                times={m: _float(d["times"].get(m)) for m in MILESTONES},
                culprit_nodes=tuple(cause.get("culprit_nodes") or ()),
                evicted_nodes=tuple(d.get("evicted_nodes") or ()),
                path=str(d.get("path") or ""), resolution=str(cause.get("resolution") or ""),
                actions=tuple(ActionTaken(str(a["id"]), float(a["ts"]), str(a["type"]), tuple(a.get("nodes") or ()),
                                          str(a.get("path") or ""), str(a.get("reason") or ""), bool(a.get("shadow")))
                              for a in d.get("actions") or ()),
                stages=tuple(StageTime(str(s["name"]), float(s["seconds"]), _float(s.get("budget")), bool(s["over"]))
                             for s in d.get("stages") or ()),
                signature=Signature.from_json(d["signature"]), findings=tuple(d["links"]["findings"]),
                description=str(d.get("description") or ""))
        except (KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a knowledge-base entry: {type(e).__name__} {e} (want Entry.to_dict's form)"
                             ) from None


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def _evidence(value: Any) -> Mapping[str, Any]:
    """A finding's evidence: a dict as is, the store's JSON text parsed; {} for anything else."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, str) and value:
        try:
            parsed = json.loads(value)
        except ValueError:
            return {}
        return parsed if isinstance(parsed, Mapping) else {}
    return {}


def _resolution(row: Mapping[str, Any]) -> str:
    extra = row.get("extra")
    return str(row.get("resolution") or (extra.get("resolution") if isinstance(extra, Mapping) else "") or "")


def _stage_pairs(row: Mapping[str, Any]) -> list[tuple[str, float]]:
    if row.get("stage_names") is not None:
        return [(str(n), float(s)) for n, s in zip(row["stage_names"], row.get("stage_seconds") or (), strict=True)]
    return [(str(n), float(s)) for n, s in (row.get("stage_s") or {}).items()]


def stage_times(row: Mapping[str, Any], budgets: Mapping[str, float] | None = None) -> tuple[StageTime, ...]:
    """An incident row's stages in stored order (store rows: `stage_names`/`stage_seconds`; records: `stage_s`),
    each over when its seconds exceed `budgets[name]`, or, without a budget, where the row's `over_budget` says."""
    stored_over = set(row.get("over_budget") or ())
    budgets = budgets or {}
    out = []
    for name, seconds in _stage_pairs(row):
        budget = _float(budgets.get(name))
        out.append(StageTime(name, seconds, budget, seconds > budget if budget is not None else name in stored_over))
    return tuple(out)


def is_closed(row: Mapping[str, Any]) -> bool:
    """An incident row is closed when it has a recovery time or a resolution (`resolution`, or `extra.resolution`
    of an incident record; the store keeps no resolution, so there only recovered incidents are closed)."""
    return row.get("recovered_ts") is not None or bool(_resolution(row))


def entry(row: Mapping[str, Any], action_rows: Iterable[Mapping[str, Any]],
          finding_rows: Iterable[Mapping[str, Any]], budgets: Mapping[str, float] | None = None) -> Entry:
    """One incident's entry, closed or not, from its row, its actions' rows and the rows of findings (those its
    actions cite are used; others are ignored). Rows are what the store returns (`class`, `stage_names`, evidence
    as JSON text) or incident / action / finding records as dicts (`stage_s`, evidence as a dict)."""
    acts = sorted({str(a["id"]): a for a in action_rows}.values(), key=lambda a: (float(a["ts"]), str(a["id"])))
    cited: list[str] = []
    for a in acts:
        cited += [str(f) for f in a.get("evidence") or () if str(f) not in cited]
    by_id = {str(f["id"]): f for f in finding_rows}
    found = [by_id[f] for f in cited if f in by_id]
    sig = Signature.of((str(f["type"]), str(f.get("detector") or ""), f.get("node") or None,
                        _evidence(f.get("evidence"))) for f in found)
    return Entry(
        id=str(row["id"]), job=str(row["job"]), cls=str(row["class"]), planned=bool(row.get("planned")),
        times={m: _float(row.get(f"{m}_ts")) for m in MILESTONES},
        culprit_nodes=tuple(row.get("culprit_nodes") or ()), evicted_nodes=tuple(row.get("evicted_nodes") or ()),
        path=str(row.get("path") or ""), resolution=_resolution(row),
        actions=tuple(ActionTaken(str(a["id"]), float(a["ts"]), str(a["type"]), tuple(a.get("nodes") or ()),
                                  str(a.get("path") or ""), str(a.get("reason") or ""), _shadow(a)) for a in acts),
        stages=stage_times(row, budgets), signature=sig, findings=tuple(cited))


def _shadow(action: Mapping[str, Any]) -> bool:
    extra = action.get("extra")
    return bool(action.get("shadow") or (isinstance(extra, Mapping) and extra.get("shadow")))


def latest(incident_rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The latest row of each incident id (the greatest `ts`; the later row of equal ones), in first-seen order."""
    out: dict[str, Mapping[str, Any]] = {}
    for r in incident_rows:
        key = str(r["id"])
        if key not in out or float(r["ts"]) >= float(out[key]["ts"]):
            out[key] = r
    return list(out.values())


def entries(incident_rows: Iterable[Mapping[str, Any]], action_rows: Iterable[Mapping[str, Any]],
            finding_rows: Iterable[Mapping[str, Any]], budgets: Mapping[str, float] | None = None) -> list[Entry]:
    """The closed incidents (`is_closed`, judged on each incident's latest row) as entries, by onset (an incident
    without one last), then id. Actions join their incident by `incident`; findings by the ids actions cite."""
    acts: dict[str, list[Mapping[str, Any]]] = {}
    for a in action_rows:
        acts.setdefault(str(a.get("incident") or ""), []).append(a)
    findings = list(finding_rows)
    out = [entry(r, acts.get(str(r["id"]), []), findings, budgets) for r in latest(incident_rows) if is_closed(r)]
    return sorted(out, key=lambda e: (_onset(e) is None, _onset(e) or 0.0, e.id))


def _onset(e: Entry) -> float | None:
    return e.times.get("onset") if e.times.get("onset") is not None else e.times.get("detected")


# --- a fleet history ------------------------------------------------------------------------------------------


def history_signature(cls: str) -> Signature:
    """The signature of a history's fault of class `cls`: `xid:N` for `xid_N`, `type:C` for an incident class,
    else `class:C`."""
    m = re.fullmatch(r"xid[_-]?(\d+)", cls)
    if m:
        return Signature(frozenset({f"xid:{int(m.group(1))}"}))
    return Signature(frozenset({f"type:{cls}" if cls in CLASSES else f"class:{_text(cls)}"}))


def from_history(events: Iterable[NodeEvent], is_fault: Callable[[str], bool] | None = None) -> list[Entry]:
    """The faults of a fleet history as entries, by onset: every event whose class `is_fault` (default: a shell
    pattern of `HISTORY_FAULTS` matches it) or that has an end (the machine was out). Ids are `NODE@START/CLASS`
    (start in ISO 8601), so the same history gives the same ids; an end still `open` is the resolution
    `still out`, an unknown one `end not recorded`."""
    def fault(cls: str) -> bool:
        return is_fault(cls) if is_fault is not None else any(fnmatchcase(cls, p) for p in HISTORY_FAULTS)

    out = []
    for e in events:
        if not fault(e.cls) and e.end is None:
            continue
        back = e.end if e.end is not None and e.end != float("inf") else None
        resolution = "" if back is not None else "still out" if e.end is not None else "end not recorded"
        out.append(Entry(id=f"{e.node}@{iso(e.start)}/{e.cls}", job=HISTORY_PATH, cls=e.cls, planned=False,
                         times={m: e.start if m == "onset" else back if m == "recovered" else None
                                for m in MILESTONES},
                         culprit_nodes=(e.node,), evicted_nodes=(), path=HISTORY_PATH, resolution=resolution,
                         actions=(), stages=(), signature=history_signature(e.cls), findings=(),
                         description=e.description))
    return sorted(out, key=lambda x: (_onset(x) or 0.0, x.id))


# --- search --------------------------------------------------------------------------------------------------


def iso(ts: float | None) -> str:
    """Event time as ISO 8601 UTC to the second; '-' for None."""
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Match:
    """A past incident found: the entry and how alike it is (None: not ranked by likeness)."""

    entry: Entry
    similarity: float | None = None

    def cite(self) -> str:
        """One line for a decision's reason or a page: which past incident this is like and what fixed it."""
        e = self.entry
        rec = f" in {e.recover_s:.0f} s" if e.recover_s is not None else ""
        alike = f", similarity {self.similarity:.2f}" if self.similarity is not None else ""
        return (f"like incident {e.id} (job {e.job}, {iso(_onset(e))}: {e.cls} on {','.join(e.culprit_nodes) or '-'}"
                f"{alike}): fixed by {e.fix}{rec}")


def _recent_first(m: Match) -> tuple[float, float, str]:
    onset = _onset(m.entry)
    return -(m.similarity or 0.0), -(onset if onset is not None else float("-inf")), m.entry.id


def _words(text: str) -> list[str]:
    return [w for w in text.lower().split() if w]


def search(entries: Iterable[Entry], *, node: str | None = None, cls: str | None = None, cause: str | None = None,
           like: Entry | str | None = None, limit: int = 10) -> list[Match]:
    """Past incidents ranked: with `like` (an entry, or the id of one of `entries`), by signature similarity
    (those sharing nothing left out, `like` itself too), the more recent first among equals; without it, the most
    recent first. `node`: its culprit or evicted nodes include it; `cls`: its class; `cause`: every word is in its
    `root_cause` (case-insensitive). ValueError for an id not among `entries` or a `limit` under 1."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1 (got {limit})")
    pool = list(entries)
    if isinstance(like, str):
        found = [e for e in pool if e.id == like]
        if not found:
            raise ValueError(f"no closed incident {like!r} in the knowledge base: search without it to list them")
        like = found[0]
    words = _words(cause or "")
    out = []
    for e in pool:
        if node is not None and node not in e.culprit_nodes and node not in e.evicted_nodes:
            continue
        if cls is not None and e.cls != cls:
            continue
        if words and not all(w in e.root_cause.lower() for w in words):
            continue
        if like is None:
            out.append(Match(e))
            continue
        if e.id == like.id:
            continue
        s = like.signature.similarity(e.signature)
        if s > 0:
            out.append(Match(e, s))
    return sorted(out, key=_recent_first)[:limit]


def closest(signature: Signature, entries: Iterable[Entry], min_similarity: float = MIN_SIMILARITY) -> Match | None:
    """The past incident most like `signature` (the more recent of equals, then the smaller id), when its
    similarity is at least `min_similarity` (in (0, 1]) and above 0; None otherwise."""
    if not 0.0 < min_similarity <= 1.0:
        raise ValueError(f"min_similarity must be in (0, 1] (got {min_similarity})")
    good = [Match(e, s) for e in entries if (s := signature.similarity(e.signature)) >= min_similarity]
    return min(good, key=_recent_first) if good else None
