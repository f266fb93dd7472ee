"""Stack sweep: parse py-spy dumps, normalize call paths, cluster the ranks of one snapshot.

A hang looks the same from every rank's heartbeat; its stacks do not. Healthy
ranks of a synchronous job wait in the same place (the collective), the culprit
is somewhere else (a stuck data loader, a checkpoint write, a driver call). So:

1. parse each rank's dump (`py-spy dump` text, or a `frames` list) into threads;
2. normalize frames to ``func (file-basename)``: line numbers, directories,
   pids, thread ids and hex addresses vanish, so identical call paths match;
3. take one signature per rank (its main thread by default);
4. group identical signatures first (a 16k-rank sweep has a handful of distinct
   ones), then cluster the distinct signatures with agglomerative clustering on
   the cosine distance of their frame (and caller->callee pair) tokens;
5. the largest cluster is healthy; small clusters are suspects.

`StackDetector` collects `stack` records per snapshot and analyses a snapshot
once every rank of the topology reported, or when `advance(now)` passes the
snapshot's first record time plus a collection window.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any, ClassVar, NamedTuple

import numpy as np
from gangwatch.detectors.config import StackConfig
from gangwatch.detectors.registry import FindingType, Policy, Typed
from gangwatch.detectors.sweeps import Sweep, SweepDetector, SweepEvidence
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Record, Stack

_THREAD_RE = re.compile(r'^Thread\s+(\S+)\s+\(([^)]*)\)(?::\s*"(.*)")?')
_PROCESS_RE = re.compile(r"^Process\s+(\d+)")
_HEX_RE = re.compile(r"0x[0-9a-fA-F]+")
THREAD_BREAK = "|"  # separates threads inside one signature; not a token
_EVIDENCE_FRAMES = 16


# --- parsing ---------------------------------------------------------------------------


class StackFrame(NamedTuple):
    """One raw frame: function (``Class.method`` for methods), file as printed, line."""

    func: str
    file: str | None
    line: int | None


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread of a dump; `frames` are innermost first, as py-spy prints them."""

    thread: str  # id as printed: hex address or native thread id
    state: str | None  # "idle", "active", "active+gil", ... (None when not printed)
    name: str | None  # "MainThread", ...
    frames: tuple[StackFrame, ...]
    pid: int | None = None

    @property
    def is_main(self) -> bool:
        return self.name == "MainThread"

    @property
    def is_active(self) -> bool:
        return bool(self.state) and self.state.startswith("active")


def _parse_frame(text: str) -> StackFrame:
    """``func (file:line)``, ``func (file)`` or a bare ``func``."""
    if text.endswith(")"):
        i = text.rfind(" (")
        if i > 0:
            func, loc = text[:i], text[i + 2:-1]
            file, sep, line = loc.rpartition(":")
            if sep and line.isdigit():
                return StackFrame(func, file, int(line))
            return StackFrame(func, loc or None, None)
    return StackFrame(text, None, None)


def parse_pyspy(text: str) -> list[ThreadStack]:
    """Threads of one `py-spy dump` text (several processes with ``--subprocesses``).

    Process headers set the pid of the threads below them; ``Thread <id> (<state>): "<name>"``
    starts a thread; frame lines (indented 4) follow it; deeper-indented lines
    (``--locals`` arguments and locals) and anything unrecognized are skipped.
    """
    out: list[ThreadStack] = []
    pid: int | None = None
    head: tuple[str, str | None, str | None] | None = None
    frames: list[StackFrame] = []

    def flush() -> None:
        if head is not None:
            out.append(ThreadStack(head[0], head[1], head[2], tuple(frames), pid))

    for raw in text.splitlines():
        stripped = raw.lstrip()
        if not stripped:
            continue
        indent = len(raw) - len(stripped)
        if indent:
            if head is not None and indent < 8:
                frames.append(_parse_frame(stripped.rstrip()))
            continue
        if stripped.startswith("Thread "):
            flush()
            m = _THREAD_RE.match(stripped)
            head = (m[1], m[2], m[3]) if m else (stripped[7:].split(" ", 1)[0], None, None)
            frames = []
        elif stripped.startswith("Process "):
            flush()
            head, frames = None, []
            m = _PROCESS_RE.match(stripped)
            pid = int(m[1]) if m else None
    flush()
    return out


def thread_stacks(rec: Stack) -> list[ThreadStack]:
    """Threads of a `stack` record: parsed py-spy text, or its `frames` list as the main thread."""
    if rec.format == "frames":
        frames = tuple(StackFrame(f.func, f.file, f.line) for f in rec.frames or ())
        return [ThreadStack("0", None, "MainThread", frames)]
    return parse_pyspy(rec.dump or "")


# --- normalization and signatures ------------------------------------------------------


def normalize_frame(func: str, file: str | None) -> str:
    """``func (basename)``: no line number, no directory, hex addresses masked to ``0x``."""
    if "0x" in func:
        func = _HEX_RE.sub("0x", func)
    if not file:
        return func
    cut = max(file.rfind("/"), file.rfind("\\"))
    return f"{func} ({file[cut + 1:]})"


def signature(threads: Sequence[ThreadStack], threads_mode: str = "main") -> tuple[str, ...]:
    """A rank's normalized call path(s), innermost first; threads joined by `THREAD_BREAK`.

    `threads_mode`: ``main`` = the main thread(s), else the active threads, else the
    first thread; ``active`` = main plus active threads; ``all`` = every thread.
    """
    if threads_mode == "all":
        chosen = list(threads)
    else:
        chosen = [t for t in threads if t.is_main or (threads_mode == "active" and t.is_active)]
        if not chosen:
            chosen = [t for t in threads if t.is_active] or list(threads[:1])
    out: list[str] = []
    for t in chosen:
        if out:
            out.append(THREAD_BREAK)
        out.extend(normalize_frame(f.func, f.file) for f in t.frames)
    return tuple(out)


def _tokens(sig: Sequence[str]) -> list[str]:
    """Frames plus caller->callee pairs, so the order of a path counts, not only its set."""
    toks = [f for f in sig if f != THREAD_BREAK]
    pairs = [f"{a}<-{b}" for a, b in zip(sig, sig[1:], strict=False) if THREAD_BREAK not in (a, b)]
    return toks + pairs or ["<empty>"]


@cache
def _vectorizer() -> Any:
    """scikit-learn is imported on the first sweep, not at start-up (it costs ~2 s to import)."""
    from sklearn.feature_extraction.text import HashingVectorizer

    return HashingVectorizer(analyzer=_tokens, n_features=2**18, alternate_sign=False, binary=True, norm="l2")


# --- clustering ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StackCluster:
    """Ranks sharing a call path; id 0 is the largest (dominant) cluster."""

    id: int
    ranks: tuple[int, ...]
    signature: tuple[str, ...]  # the cluster's most common signature
    distance: float  # cosine distance of `signature` from the dominant cluster's signature


def cluster_ranks(
    signatures: Mapping[int, Sequence[str]], *, distance_threshold: float = 0.3, max_distinct: int = 512,
) -> list[StackCluster]:
    """Cluster ranks by call-path similarity; clusters ordered by size (desc), then lowest rank.

    Identical signatures are merged first, so the cost depends on the number of
    distinct signatures, not of ranks. Beyond `max_distinct` distinct signatures
    only the most common ones are clustered; each other one joins its nearest
    cluster when within `distance_threshold`, else stands alone.
    """
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank in sorted(signatures):
        groups.setdefault(tuple(signatures[rank]), []).append(rank)
    keys = sorted(groups, key=lambda k: (-len(groups[k]), groups[k][0]))
    if not keys:
        return []
    x = _vectorizer().transform(keys)
    labels = _labels(x, distance_threshold, max_distinct)
    members: dict[int, list[int]] = {}
    rep: dict[int, int] = {}  # label -> index of its most common signature (keys are sorted by count)
    for i, lab in enumerate(labels.tolist()):
        members.setdefault(lab, []).extend(groups[keys[i]])
        rep.setdefault(lab, i)
    order = sorted(members, key=lambda lab: (-len(members[lab]), min(members[lab])))
    reps = [rep[lab] for lab in order]
    sims = (x[reps] @ x[reps[0]].T).toarray().ravel().tolist()  # each cluster's path against the dominant one's
    return [StackCluster(cid, tuple(sorted(members[lab])), keys[i], round(max(0.0, 1.0 - sim), 6))
            for cid, (lab, i, sim) in enumerate(zip(order, reps, sims, strict=True))]


def preload() -> None:
    """Import what clustering a sweep needs (scikit-learn: seconds) now, so that the first sweep does not wait
    for it. The worker calls it at start, off its event loop."""
    _vectorizer()
    from sklearn.cluster import AgglomerativeClustering  # noqa: F401


def _labels(x: Any, threshold: float, max_distinct: int) -> np.ndarray:
    n = x.shape[0]
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    head = min(n, max_distinct)
    labels = np.empty(n, dtype=np.int64)
    if head == 1:
        labels[0] = 0
    else:
        from sklearn.cluster import AgglomerativeClustering

        dist = np.clip(1.0 - (x[:head] @ x[:head].T).toarray(), 0.0, 2.0)
        np.fill_diagonal(dist, 0.0)
        model = AgglomerativeClustering(
            n_clusters=None, distance_threshold=threshold, metric="precomputed", linkage="average")
        labels[:head] = model.fit_predict(dist)
    if head < n:
        sim = (x[head:] @ x[:head].T).toarray()
        nearest = sim.argmax(axis=1)
        close = 1.0 - sim[np.arange(n - head), nearest] <= threshold
        fresh = labels[:head].max() + 1 + np.arange(n - head)
        labels[head:] = np.where(close, labels[:head][nearest], fresh)
    return labels


def suspect_clusters(
    clusters: Sequence[StackCluster], n_ranks: int, *, max_outlier_fraction: float = 0.25,
    min_dominant_fraction: float = 0.5,
) -> list[StackCluster]:
    """Clusters other than the dominant one, each at most `max_outlier_fraction` of the ranks.

    Nothing is suspect unless the dominant cluster holds at least
    `min_dominant_fraction` of the ranks: without a clear majority there is no
    "healthy" call path to compare with.
    """
    if len(clusters) < 2 or len(clusters[0].ranks) < min_dominant_fraction * n_ranks:
        return []
    return [c for c in clusters[1:] if len(c.ranks) <= max_outlier_fraction * n_ranks]


def distinguishing_frames(sig: Sequence[str], healthy: Sequence[str]) -> tuple[list[str], list[str]]:
    """(frames of `sig` absent from `healthy`, frames of `healthy` absent from `sig`), in path order."""
    a, b = set(sig), set(healthy)
    extra = [f for f in dict.fromkeys(sig) if f not in b and f != THREAD_BREAK]
    missing = [f for f in dict.fromkeys(healthy) if f not in a and f != THREAD_BREAK]
    return extra, missing


# --- detector --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StackOutlier(SweepEvidence):
    """A rank whose call path belongs to a small cluster, away from the dominant one of its stage."""

    cluster: int  # the cluster's id within the sweep (0: the dominant one)
    cluster_size: int  # ranks in its cluster
    dominant_size: int
    ranks_compared: int  # ranks of its stage (or the sweep) clustered together
    stage: int
    ranks_reported: int  # dumps in the sweep
    node_suspects: int  # suspect ranks on its node
    frames: list[str]  # frames its path has and the dominant one lacks (first 16)
    missing_frames: list[str]  # frames the dominant path has and its lacks
    top_frame: str | None


def _stack_specificity(sweep: Sequence[Typed]) -> list[float]:
    """A stuck rank drags its pipeline neighbours into odd stacks too: the smallest cluster is the likeliest cause."""
    sizes = [max(1, int(t.evidence.cluster_size or 1)) for t in sweep]
    best = min(sizes)
    return [best / size for size in sizes]


STACK_OUTLIER = FindingType("stack_outlier", StackOutlier, Policy(
    incident="hang", weight=0.6, risk=0.3, sweep_result=True, specificity=_stack_specificity))


class StackDetector(SweepDetector):
    """Outlier stacks in stack sweeps of one job (``stack_outlier`` findings, one per suspect rank)."""

    name: ClassVar[str] = "stacks"
    kind: ClassVar[str] = "stack"
    kinds: ClassVar[frozenset[str]] = frozenset({"stack"})
    finding_types: ClassVar[tuple[FindingType, ...]] = (STACK_OUTLIER,)

    def __init__(self, topo: Topology, config: StackConfig | None = None) -> None:
        self.config = config or StackConfig()
        super().__init__(topo, self.config.window_s, self.config.max_pending, self.config.remember_done)
        self._interned: dict[str, dict[tuple[str, ...], tuple[str, ...]]] = {}  # one copy per distinct path

    def entry(self, rec: Record, sweep: Sweep) -> tuple[str, ...]:
        sig = signature(thread_stacks(rec), self.config.threads)
        return self._interned.setdefault(rec.snapshot, {}).setdefault(sig, sig)

    def _close(self, sid: str, ts: float) -> list[Finding]:
        self._interned.pop(sid, None)
        return super()._close(sid, ts)

    def analyse(self, snapshot: str, sigs: Mapping[int, tuple[str, ...]], ts: float) -> list[Finding]:
        """Findings for one snapshot's signatures (rank -> signature), stamped `ts`."""
        cfg = self.config
        if len(sigs) < cfg.min_ranks:
            return []
        parts: dict[int, dict[int, tuple[str, ...]]] = {}
        for rank, sig in sigs.items():
            stage = int(self.topo.pp[rank]) if cfg.by_stage and rank < self.topo.size else 0
            parts.setdefault(stage, {})[rank] = sig
        suspects: list[tuple[int, int, StackCluster, StackCluster, int]] = []  # rank, stage, cluster, dominant, n
        for stage in sorted(parts):
            part = parts[stage]
            if len(part) < cfg.min_ranks:
                continue
            clusters = cluster_ranks(part, distance_threshold=cfg.distance_threshold, max_distinct=cfg.max_distinct)
            for c in suspect_clusters(clusters, len(part), max_outlier_fraction=cfg.max_outlier_fraction,
                                      min_dominant_fraction=cfg.min_dominant_fraction):
                suspects += [(r, stage, c, clusters[0], len(part)) for r in c.ranks]
        per_node: dict[str | None, int] = {}
        for rank, *_ in suspects:
            node = self.topo.node_of(rank)
            per_node[node] = per_node.get(node, 0) + 1
        out = []
        for rank, stage, c, dom, n in sorted(suspects, key=lambda s: s[0]):
            extra, missing = distinguishing_frames(c.signature, dom.signature)
            node = self.topo.node_of(rank)
            out.append(STACK_OUTLIER.finding(
                ts=ts, job=self.topo.job, detector="stacks", topo=self.topo, rank=rank,
                key=(snapshot, rank), score=c.distance,
                evidence=StackOutlier(snapshot=snapshot, cluster=c.id, cluster_size=len(c.ranks),
                                      dominant_size=len(dom.ranks), ranks_compared=n, stage=stage,
                                      ranks_reported=len(sigs), node_suspects=per_node[node],
                                      frames=extra[:_EVIDENCE_FRAMES], missing_frames=missing[:_EVIDENCE_FRAMES],
                                      top_frame=c.signature[0] if c.signature else None),
            ))
        return out

    # --- state ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        pending = {}
        for sid, sweep in self.pending.items():
            table: dict[tuple[str, ...], int] = {}
            ranks = [[r, table.setdefault(s, len(table))] for r, s in sorted(sweep.items.items())]
            pending[sid] = {"first_ts": sweep.first_ts, "last_ts": sweep.last_ts,
                            "signatures": [list(s) for s in table], "ranks": ranks,
                            "raw": [[r, t] for r, t in sorted(sweep.raw.items())]}
        return {"config": asdict(self.config), "pending": pending, "done": list(self.done)}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> StackDetector:
        det = cls(topo, StackConfig(**state["config"]))
        for sid, snap in state["pending"].items():
            table = [tuple(s) for s in snap["signatures"]]
            det.pending[sid] = Sweep(float(snap["first_ts"]), float(snap["last_ts"]),
                                     {int(r): table[i] for r, i in snap["ranks"]},
                                     {int(r): float(t) for r, t in snap.get("raw", ())})  # (none: saved before)
            det._interned[sid] = {s: s for s in table}
        det.done.extend(state["done"])
        return det
