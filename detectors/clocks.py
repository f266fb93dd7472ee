"""Each node's clock, learned from the job itself, and the job's own time, robust to one node's clock.

Event time is every node's own clock. A node whose NTP daemon died drifts by tens of seconds; taken as it
stands, a node 30 s ahead moves the whole job's time 30 s forward (every other rank then looks silent), and a
node 30 s behind looks silent itself. A synchronous job carries the fix in its own records: every step ends in
collectives that release all ranks of a pipeline stage within milliseconds of each other, so each step is a
clock-sync round.

- **A step's reference.** A node is one clock and one vote, however many ranks it has (its ranks' median end
  time of the step). Once `close_frac` of the job's ranks reported step s, its reference is tried: for each
  pipeline stage (stages finish a step at slightly different times; the ranks of one stage together), the median
  of the votes that agree (within `sync_s` of the median vote), when they are `min_nodes` or more, more than half
  of the nodes heard, and their ranks ended the step together (a job whose ranks do not synchronise each step
  teaches nothing). Clocks that disagree decide nothing yet: the step is tried again at each record that brings
  a power-of-two count of nodes, and at its last rank (so the first records to arrive, two ranks of one node
  whose clock jumped beside one of another, never make the reference). References of the last `keep_steps`
  steps are kept, so a record that arrives later (a lagging or skewed node) is compared with its step's
  reference when it comes.
- **A node's offset** is the median, over its ranks' records of its last `window` steps, of their step-end
  time minus the reference. Once it rests on `min_steps` steps that agree (spread at most `max_spread_s`) and passes
  `tolerance_s` either way, it is *applied*: `JobMonitor` hands every other detector that node's records with
  the offset taken out, and one `clock_skew` finding names the node and the offset (an operator's ticket: fix
  NTP there; no incident, no eviction). A drift by another `tolerance_s` is reported again; an offset back
  within half the tolerance is dropped.
- **The job's time** (`now()`) is not the newest time any record carried: it is the newest corrected time of
  a node whose clock is known (learned over `min_steps` steps, its newest step agreeing), or the `k`-th newest
  of all the nodes' newest corrected times (k = 2 for jobs of three nodes or more, 5 % of the nodes for large
  jobs), whichever is later: a lone node ahead, before its offset is learned (start-up, a clock that just
  jumped), cannot move the job's time, and dead or lagging nodes do not hold it back. `JobCore` moves its
  watermark by it.

Jobs of one or two nodes learn nothing (with two clocks, which one is wrong cannot be told) and take the
newest time as it comes. The learning is read from the records' raw times only (this detector is first in the
catalog and sees the records as they came); what it corrects is the others' concern.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from operator import itemgetter
from typing import Any, ClassVar

import numpy as np
from gangwatch.detectors.base import DetectorBase, SavedJob, fill_missing
from gangwatch.detectors.clocksteps import ClockSteps
from gangwatch.detectors.config import ClockConfig
from gangwatch.detectors.floats import median, nanmedian_rows
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.runs import RecordRun, observe_each
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Record
from gangwatch.schemas.columns import StepRows
from gangwatch.schemas.evidence import Evidence

_RANK_KINDS = frozenset({"step", "heartbeat", "framework"})
_NODE_KINDS = frozenset({"gpu", "hw"})
_LAST_WORDS = frozenset({"end", "stop"})  # a controller's lifecycle events that say the job's run is over
_OTHER_KINDS = frozenset({"lifecycle", "stack", "flight", "recovery"})  # a rank's or node's when they name one


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockSkew(Evidence):
    """A node's clock is off: its ranks end each step `offset_s` later (negative: earlier) than their stage."""

    offset_s: float  # what is taken out of the node's times from now on
    spread_s: float  # the median absolute deviation of its per-step offsets
    steps: int  # the steps the offset rests on
    tolerance_s: float  # offsets smaller than this are left alone
    # the node's own monotonic clock showed its wall clock step by this much, at once (`clocksteps.py`); None: the
    # offset was learned from the job's steps
    stepped_s: float | None = None


def _skew_says(f: Finding, ev: ClockSkew) -> str:
    if ev.stepped_s is not None:
        return (f"the clock of {f.node} stepped {ev.stepped_s:+.1f} s at once (its monotonic clock did not): its "
                "times are corrected; an NTP step during a job says its time sync is loose. Nobody is evicted for it")
    way = "ahead" if ev.offset_s > 0 else "behind"
    return (f"the clock of {f.node} runs {abs(ev.offset_s):.1f} s {way} of the job's (over {ev.steps} steps): its "
            "times are corrected; fix its time sync (NTP, chrony). Nobody is evicted for it")


CLOCK_SKEW = FindingType("clock_skew", ClockSkew, Policy(incident=None, weight=0.0, risk=0.0,
                                                         describe=_skew_says))


class ClockDetector(DetectorBase):
    """Per-node clock offsets from the job's steps, and the job's own time (see the module's docstring)."""

    name: ClassVar[str] = "clocks"
    kinds: ClassVar[frozenset[str]] = _RANK_KINDS | _NODE_KINDS | _OTHER_KINDS
    finding_types: ClassVar[tuple[FindingType, ...]] = (CLOCK_SKEW,)

    def __init__(self, topo: Topology, config: ClockConfig | None = None) -> None:
        self.config = config or ClockConfig()
        self.steps = ClockSteps(topo, self.config.tolerance_s)  # steps of a node's clock, seen by its own
        self._reset(topo, {})

    def _reset(self, topo: Topology, keep: dict[str, tuple[float, list[float], float | None]]) -> None:
        """Arrays for `topo`'s nodes; `keep`: node -> (offset, recent samples, reported) carried over."""
        self.per_node = max((len(r) for r in topo.node_ranks.values()), default=1)  # samples a node gives a step
        n, w = len(topo.nodes), self.config.window * self.per_node
        self.topo = topo
        self.node_pos = {node: i for i, node in enumerate(topo.nodes)}
        self.learn = n >= 2  # (of two clocks, which one is wrong cannot be told: the one behind is the job's)
        self.min_nodes = min(3, n // 2 + 1)  # clocks a step's reference rests on
        self.k = 1 if n <= 2 else max(2, math.ceil(0.05 * n))
        # a job of two nodes: heartbeats of the other node read since each node's last record (see `now`)
        self.pair = n == 2
        self.beats_since = np.zeros(n, dtype=np.int64)
        self.node_step = np.full(n, -1, dtype=np.int64)  # ... and the newest step each node's ranks finished
        self.early_beats = 0  # heartbeats read while fewer nodes were heard than the job's time needs (see `now`)
        self.newest = np.full(n + 1, -np.inf)  # raw newest time per node, and (last) of records of no node
        self.agent = np.full(n, -np.inf)  # raw newest time of each node's own records (its agent's), not its ranks'
        self.offset = np.zeros(n)  # applied offset per node
        self.samples = np.full((n, w), np.nan)  # recent per-step offsets (ring)
        self.count = np.zeros(n, dtype=np.int64)  # samples written per node
        self.reported = np.full(n, np.nan)  # offset last reported per node (NaN: none)
        self.checked = np.full(n, -np.inf)  # the raw time of each node's latest record compared with a reference
        self.open: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # step -> (ranks, ts) gathered until it is fixed
        self.top = -1  # the newest step seen
        self.touched: set[int] = set()  # nodes with new samples since time last moved
        self.refs: dict[int, np.ndarray] = {}  # step -> reference end time per stage (NaN: none)
        self.stages = int(topo.pp.max()) + 1 if topo.size else 1
        for node, (off, recent, said) in keep.items():
            i = self.node_pos.get(node)
            if i is not None:
                self.offset[i] = off
                self.samples[i, :len(recent[-w:])] = recent[-w:]
                self.count[i] = len(recent[-w:])
                self.reported[i] = np.nan if said is None else said
        self._rank_offset: np.ndarray | None = None
        self._agreeing: np.ndarray | None = None  # cache of `_known`'s part that only samples and offsets move
        self._started = False  # k nodes were heard: start-up is over (`_early`), until the next topology

    def set_topology(self, topo: Topology) -> None:
        """A new job record: the ranks move, the nodes' clocks do not (what was learned of a node stays)."""
        if (topo.ts, topo.ranks) == (self.topo.ts, self.topo.ranks):
            return
        self.steps.set_topology(topo)
        self._reset(topo, self._kept())

    def _kept(self) -> dict[str, tuple[float, list[float], float | None]]:
        out = {}
        for node, i in self.node_pos.items():
            recent = self._recent(i)
            if recent or self.offset[i]:
                said = None if np.isnan(self.reported[i]) else float(self.reported[i])
                out[node] = (float(self.offset[i]), recent, said)
        return out

    def _recent(self, i: int) -> list[float]:
        """Node i's samples, oldest first."""
        w, c = self.samples.shape[1], int(self.count[i])
        if c <= w:
            return self.samples[i, :c].tolist()
        start = c % w
        return np.concatenate((self.samples[i, start:], self.samples[i, :start])).tolist()

    # --- what other parts ask -----------------------------------------------------------------------------

    @property
    def skewed(self) -> bool:
        """Some node's times are corrected."""
        return bool(self.offset.any())

    def rank_offsets(self) -> np.ndarray:
        """The applied offset of each rank's node."""
        if self._rank_offset is None:
            self._rank_offset = self.offset[self.topo.node_index] if self.topo.size else np.zeros(0)
        return self._rank_offset

    def _ahead_nodes(self) -> np.ndarray | None:
        """Per node, how far its clock is known to run ahead of the job's (learned from the job's steps, or stepped:
        `ClockSteps`), up to `ahead_wait_max_s`; None when no node's is."""
        if not self.skewed and not self.steps.any_off:
            return None
        off = self.offset + self.steps.off
        return np.clip(off, 0.0, self.config.ahead_wait_max_s) if (off > 0).any() else None

    def ahead(self) -> np.ndarray | None:
        """Per rank, `_ahead_nodes` of its node: ordered by their stamped times, its records may come that much
        after the job's other clocks' (the launcher's, the controller's, a peer's); None when no node runs ahead."""
        off = self._ahead_nodes()
        return off[self.topo.node_index] if off is not None and self.topo.size else None

    def offset_of(self, rec: Record) -> float:
        """The applied offset of the node a record comes from (0.0: none, or not known)."""
        node = getattr(rec, "node", None)
        if rec.kind in _NODE_KINDS or node is not None:  # a node's record (a dump may name its node, its rank, both)
            i = self.node_pos.get(node)
            return float(self.offset[i]) if i is not None else 0.0
        rank = getattr(rec, "rank", None)
        if rank is None or not 0 <= rank < self.topo.size:
            return 0.0
        return float(self.offset[self.topo.node_index[rank]])

    def corrected(self, rec: Record) -> Record:
        """`rec` with its node's offset taken out of its time (itself when there is none)."""
        off = self.offset_of(rec) if self.skewed else 0.0
        return dataclasses.replace(rec, ts=rec.ts - off) if off else rec

    def corrected_run(self, run: RecordRun) -> RecordRun:
        """`run` with every record's node offset taken out (itself when no node is corrected)."""
        if not self.skewed:
            return run
        offs = self.rank_offsets()
        pieces: list[Record | StepRows] = []
        for p in run.pieces:
            if type(p) is StepRows:
                pieces.append(_shifted(p, offs))
            else:
                pieces.append(self.corrected(p))
        return RecordRun(pieces)

    def heard(self, rec: Record | StepRows) -> None:
        """A record (or the first item of a `StepRows`) reached the job: its node's newest time moves (a record
        of no node, the controller's say, counts as one more source)."""
        if type(rec) is StepRows:
            rank = rec.cols["rank"][0] if rec.beats is None or (rec.steps_at and rec.steps_at[0] == 0) \
                else rec.beats["rank"][0]
            ts = rec.ts[0]
        else:
            rank, ts = getattr(rec, "rank", None), rec.ts
            if rank is None and rec.kind == "lifecycle" and rec.event in _LAST_WORDS and \
                    getattr(rec, "node", None) not in self.node_pos:
                return  # the controller's word that the job ended: the ranks' silence before it is the end
        if rank is not None:
            if not 0 <= rank < self.topo.size:
                return  # not a rank of this job: no source of its time
            i = self.topo.node_index[rank]
        else:
            i = self.node_pos.get(getattr(rec, "node", None), len(self.newest) - 1)
            if rec.kind in _NODE_KINDS and i < len(self.agent) and ts > self.agent[i]:
                self.agent[i] = ts
        if ts > self.newest[i]:
            self.newest[i] = ts

    def _node_of(self, rec: Record) -> int | None:
        rank = getattr(rec, "rank", None)
        if rank is not None:
            return int(self.topo.node_index[rank]) if 0 <= rank < self.topo.size else None
        return self.node_pos.get(getattr(rec, "node", None))

    def _count(self, node: int | None, beat: bool, step: int = -1) -> None:
        """A record of `node` read (a job of two nodes): it spoke; a heartbeat is a tick of the other's silence,
        once the node has caught up with the other's progress (its newest step at least the other's): the beats
        of a node behind in steps are its past, told late (a spool flushed late, a node whose clock is ahead read
        in event-time order), not time the other spent silent. A node that dies stops the gang at its step, so
        its peer is at that step (or past it) and its beats count."""
        if node is None:
            return
        self.beats_since[node] = 0
        if step > self.node_step[node]:
            self.node_step[node] = step
        if beat and self.node_step[node] >= self.node_step[1 - node]:
            self.beats_since[1 - node] += 1

    def frame(self) -> dict[str, Any]:
        """Which clock the job's times are in (an incident's record says it): `basis`, what the job's time rests
        on (`as stamped`: one node; `pair`: of a job of two nodes' clocks, the one that kept the frame; `steps`: the
        clocks that agree on each step's end), and `offsets_s`, the nodes whose times were corrected and by how much
        (a record of theirs stamped t was read at t - offset)."""
        return {"basis": "as stamped" if not self.learn else "pair" if self.pair else "steps",
                "offsets_s": {node: round(off, 3) for node, off in zip(self.topo.nodes, self.offset.tolist(),
                                                                       strict=True) if off}}

    def agent_heard(self, node: str) -> float:
        """When the node itself (its agent: NVML samples, kernel events) was last heard from, corrected (-inf:
        never in this run): a node that speaks while its ranks are silent is alive."""
        i = self.node_pos.get(node)
        return -math.inf if i is None else float(self.agent[i] - self.offset[i])

    def node_time(self, node: str) -> float:
        """How far a node's own records have been read: the newest corrected time of any of them (-inf: none yet;
        inf: not a node of the job, nothing to wait for)."""
        i = self.node_pos.get(node)
        if i is None:
            return math.inf
        return float(self.newest[i] - self.offset[i])

    def step_ends(self, step: np.ndarray) -> np.ndarray:
        """When the job finished each of these steps by the clocks that agreed on it: its reference (the latest
        stage's), in the job's frame; inf where none is known (a step not decided yet or long gone, a job of one
        node)."""
        out = np.full(len(step), np.inf)
        for s in np.unique(step).tolist():
            out[step == s] = self.step_end(s)
        return out

    def step_end(self, step: int) -> float:
        """`step_ends` of one step."""
        ref = self.refs.get(step)
        return math.inf if ref is None or np.isnan(ref).all() else float(np.nanmax(ref))

    def latest(self) -> float:
        """The newest corrected time any node has reached (-inf before any): where a finished input ends."""
        heard = np.isfinite(self.newest)
        if not heard.any():
            return -math.inf
        return float((self.newest - np.append(self.offset, 0.0))[heard].max())

    def now(self) -> float:
        """The job's time (-inf before any record): the newest corrected time of a node whose clock is known (its
        offset rests on `min_steps` steps and its newest step agrees with it), the newest time of a record of no
        node (the controller's, the launcher's; not its word that the job's run is over, `end` or `stop`: the
        silence before it is that end, whatever its clock says), or the k-th newest corrected time of all nodes,
        whichever is later. A node not known yet (start-up, a job without steps, a clock that just
        jumped) moves the job's time only with others; a known one moves it alone (in a replay sorted by the
        senders' times, a node whose clock ran ahead comes late: it must not hold the others back)."""
        seen = np.isfinite(self.newest)
        if not seen.any():
            return -math.inf
        times = self.newest - np.append(self.offset, 0.0) if self.skewed else self.newest
        if self.pair:
            return self._pair_now(times, seen)
        if self._early():  # start-up: the first node heard is no clock of the job's (one 300 s ahead set it)
            return float(times[-1]) if seen[-1] else -math.inf
        heard = times[seen]
        k = min(self.k, len(heard))
        t = float(heard.max() if k == 1 else np.partition(heard, len(heard) - k)[len(heard) - k])
        if k > 1:
            t = max(t, float(times[-1]))  # the controller's and launcher's say (records of no node) is trusted
            if self.learn:
                known = self._known()
                if known.any():
                    t = max(t, float(times[:-1][known].max()))
        return t

    def _pair_now(self, times: np.ndarray, seen: np.ndarray) -> float:
        """The time of a job of two nodes: the earlier of its two nodes' newest corrected times, so that neither
        clock moves it alone (a clock that just stepped ahead, before the step is learned, would make its peer
        look silent), or of the known ones when one is (a clock that stepped is known again once its offset is
        applied, which needs the time to move); but a node the other's ranks each beat twice since it last spoke
        (two heartbeat periods by the other's own heartbeats, whatever either clock says) holds it back no
        longer: it is silent, and the job's time is its peer's. Records of no node (the controller's, the
        launcher's) count as they come."""
        holding = self.beats_since < 2 * self.per_node
        if (holding & ~seen[:2]).any():  # a node not heard yet holds the time back too, until its peer's ranks
            return float(times[-1]) if seen[-1] else -math.inf  # each beat twice (start-up: one clock is none)
        pair = seen[:2] & holding
        known = pair & self._known()  # a clock that just stepped (either way) is not known: it waits for its
        if known.any():               # offset, and the time moves with its peer's meanwhile
            pair = known
        if pair.any():
            t = float(times[:2][pair].min())
        else:
            t = float(times[:2][seen[:2]].max()) if seen[:2].any() else -math.inf
        return max(t, float(times[-1])) if seen[-1] else t

    def _early(self) -> bool:
        """Start-up of a job of three nodes or more: fewer nodes heard than the time's k-th newest needs, and
        their ranks have not each beaten twice since (a node that never starts holds the time no longer)."""
        if self._started:
            return False
        heard = int(np.isfinite(self.newest[:-1]).sum())
        self._started = heard >= self.k  # (a node heard stays heard: asked at every heartbeat, answered once)
        return not self._started and self.early_beats < 2 * self.per_node * heard

    def _known(self) -> np.ndarray:
        """Per node: its clock is known (enough samples, and its newest agrees with its applied offset)."""
        if self._agreeing is None:  # (asked at every move of time; samples and offsets change at steps)
            n, w = len(self.count), self.samples.shape[1]
            enough = self.count >= self.config.min_steps * self.per_node
            latest = self.samples[np.arange(n), (self.count - 1) % w]
            self._agreeing = enough & (np.abs(latest - self.offset) < self.config.tolerance_s)
        if not self._agreeing.any():
            return self._agreeing
        # (and nothing of it much newer than its newest record checked: a clock that jumps since is not known)
        fresh = self.newest[:-1] <= self.checked + max(self.config.tolerance_s, 2 * self.topo.heartbeat_s)
        return self._agreeing & fresh

    # --- observe ----------------------------------------------------------------------------------------------

    def observe(self, rec: Record) -> list[Finding]:
        self.heard(rec)
        if rec.kind == "heartbeat" and self._early():
            self.early_beats += 1
        if self.pair:
            self._count(self._node_of(rec), rec.kind == "heartbeat", rec.step if rec.kind == "step" else -1)
        if rec.kind != "step" or not self.learn or not 0 <= rec.rank < self.topo.size:
            return []  # (a record stamped before the job record may be a node's clock behind: it teaches too)
        return self._steps(np.array([rec.rank]), np.array([rec.step]), np.array([rec.ts]))

    def observe_run(self, run: RecordRun) -> list[tuple[int, list[Finding]]]:
        topo = self.topo
        if self._early():  # start-up: record by record, each heartbeat counted while it is (as `observe` does)
            return observe_each(self, run)
        for kind in _RANK_KINDS:
            if kind in run.by_kind:
                if kind == "step":
                    cols = run.steps()
                    rank, ts = cols.rank, cols.ts
                else:
                    rank = np.array(run.lists(kind, "rank"), dtype=np.int64)
                    ts = np.array(run.lists(kind, "ts"), dtype=np.float64)
                ok = (rank >= 0) & (rank < topo.size)
                if ok.any():
                    np.maximum.at(self.newest, topo.node_index[rank[ok]], ts[ok])
        for kind in _NODE_KINDS | _OTHER_KINDS:
            for i in run.by_kind.get(kind, ()):
                self.heard(run.record(i))
        if self.pair:  # in the records' order: which node spoke, and whether with a heartbeat
            said = []
            for kind in _RANK_KINDS:
                steps = run.lists(kind, "step") if kind == "step" else None
                for j, (i, r) in enumerate(zip(run.by_kind.get(kind, ()), run.lists(kind, "rank"), strict=True)):
                    if 0 <= r < topo.size:
                        said.append((i, int(topo.node_index[r]), kind == "heartbeat", -1 if steps is None
                                     else int(steps[j])))
            for kind in _NODE_KINDS | _OTHER_KINDS:
                said += [(i, self._node_of(run.record(i)), False, -1) for i in run.by_kind.get(kind, ())]
            for _, node, beat, step in sorted(said, key=itemgetter(0)):
                self._count(node, beat, step)
        if "step" not in run.by_kind or not self.learn:
            return []
        cols = run.steps()
        ok = (cols.rank >= 0) & (cols.rank < topo.size)
        if not ok.all():
                self._steps(cols.rank[ok], cols.step[ok], cols.ts[ok])
        else:
            self._steps(cols.rank, cols.step, cols.ts)
        return []

    def _steps(self, rank: np.ndarray, step: np.ndarray, ts: np.ndarray) -> list[Finding]:
        """Step records, in order: each compared with its step's reference, and (until it is fixed) gathered for
        it. Written so that a run of records leaves exactly what those records one by one leave (the run path):
        a step's reference is fixed at the record that brings `close_frac` of the ranks, from those records; its
        records before then are compared at that record, the later ones each at its own place; every node's
        samples go to its ring in that order. (Offsets are applied when time moves: `advance`.)"""
        n = len(step)
        keep = self.config.keep_steps
        top = np.maximum.accumulate(np.concatenate(([self.top], step)))[1:]  # the newest step at each record
        ok = step > top - keep  # a step that far behind the newest is history: nothing to compare it with
        self.top = int(top[-1]) if n else self.top
        # `close_frac` of the ranks, and enough of them to come from `min_nodes` nodes
        need = min(self.topo.size, max(math.ceil(self.config.close_frac * self.topo.size),
                                       self.per_node * (self.min_nodes - 1) + 1))
        at: list[np.ndarray] = []  # where each sample is written (its record's place, or the fixing record's)
        devs: list[np.ndarray] = []
        nodes: list[np.ndarray] = []
        times: list[np.ndarray] = []
        for s in np.unique(step[ok]).tolist():
            idx = np.flatnonzero(ok & (step == s))
            ref = self.refs.get(s)
            if ref is None:
                r0, t0 = self.open.pop(s, (np.empty(0, np.int64), np.empty(0)))
                have = len(r0)
                r, t = np.concatenate((r0, rank[idx])), np.concatenate((t0, ts[idx]))
                for end in self._tries(r, have, need):
                    ref = self._fix(s, r[:end], t[:end])
                    if ref is not None:
                        break
                if ref is None:  # not decided yet: gather
                    self.open[s] = (r, t)
                    continue
                head, idx = idx[:end - have], idx[end - have:]
                at.append(np.full(end, head[-1]))
                devs.append(t[:end] - ref[self.topo.pp[r[:end]]])
                nodes.append(self.topo.node_index[r[:end]])
                times.append(t[:end])
            at.append(idx)
            devs.append(ts[idx] - ref[self.topo.pp[rank[idx]]])
            nodes.append(self.topo.node_index[rank[idx]])
            times.append(ts[idx])
        for old in [x for x in self.open if x <= self.top - keep]:
            del self.open[old]
        if at:
            order = np.argsort(np.concatenate(at), kind="stable")
            self._write(np.concatenate(nodes)[order], np.concatenate(devs)[order], np.concatenate(times)[order])
        return []

    def _tries(self, r: np.ndarray, have: int, need: int) -> list[int]:
        """The places (record counts, past the `have` already gathered) at which step s's reference is tried:
        the record that brings `need` of them, each later one that brings a new node when the nodes heard then
        are a power of two, and the one that completes the step. A function of the records' order alone, so a
        run of records and the same records one by one try (and fix) at the same record."""
        n = len(r)
        if n < need:
            return []
        node = self.topo.node_index[r]
        _, first = np.unique(node, return_index=True)
        new = np.zeros(n + 1, dtype=bool)
        new[first + 1] = True  # a prefix of length L ends with a node not heard before in it
        count = np.cumsum(new)  # nodes heard in the prefix of each length
        points = {need} if need > have else set()
        powers = new & (count & (count - 1) == 0) & (count >= self.min_nodes)
        points.update(int(L) for L in np.flatnonzero(powers) if L > max(have, need))
        if n >= self.topo.size:
            points.add(n)
        return sorted(p for p in points if have < p <= n)

    def _fix(self, s: int, r: np.ndarray, t: np.ndarray) -> np.ndarray | None:
        """Step s's reference from the records gathered for it (None: they do not decide it yet): each stage's
        agreed end time (see `_agreed`), else the whole job's, where its clocks agreed."""
        stage = self.topo.pp[r]
        ref = np.full(self.stages, np.nan)
        prev = self._previous_reference(s) if self.pair else None
        whole = self._agreed(r, t, prev)  # the job's, for stages of too few nodes (when all stages end together)
        for p in np.unique(stage).tolist():
            mine = stage == p
            ref[p] = self._agreed(r[mine], t[mine], prev)
            if np.isnan(ref[p]):
                ref[p] = whole
        if np.isnan(ref).all() and len(r) < self.topo.size:
            return None  # the clocks heard so far do not agree: wait for more of them (or all)
        self.refs[s] = ref
        for old in [x for x in self.refs if x <= self.top - self.config.keep_steps]:
            del self.refs[old]
        return ref

    def _previous_reference(self, s: int) -> float | None:
        """The latest reference time of the newest step before s that has one (None: none)."""
        earlier = [x for x in self.refs if x < s]
        before = self.refs[max(earlier)] if earlier else None
        return float(np.nanmax(before)) if before is not None and not np.isnan(before).all() else None

    def _agreed(self, r: np.ndarray, t: np.ndarray, prev: float | None = None) -> float:
        """The end time these records' clocks agree on, else NaN. A node is one clock, one vote (its ranks' median
        end time), however many ranks it has: the reference is the median of the votes of the nodes within
        `sync_s` of the median vote, when those are `min_nodes` or more (three, or the majority of a smaller
        job) and more than half of the nodes heard, and their ranks left the step together (most within
        `sync_s`). Two nodes that disagree decide nothing (which one is wrong cannot be told from them)."""
        node = self.topo.node_index[r]
        uniq, inv = np.unique(node, return_inverse=True)
        if len(uniq) < self.min_nodes:
            return math.nan
        votes = _group_medians(inv, t, len(uniq))
        mid = median(votes)
        agree = np.abs(votes - mid) <= self.config.sync_s
        n_agree = int(agree.sum())
        if len(uniq) == 2 == len(self.topo.nodes) and n_agree < 2:
            # a job of two nodes whose clocks disagree: which one is wrong cannot be told from them, so the job
            # keeps the frame it had (the clock that goes on from the previous step's reference: the other one
            # stepped) or, at the start, asks a third clock, the job record's (its launcher's): no step ends
            # before its job began, so a clock that says so is behind; of those that do not, it takes the one
            # behind (a record may come late, never early). The other is corrected to it, and every decision is
            # taken in one frame, whichever clock is wrong
            if prev is None:
                possible = votes >= self.topo.ts
                frame = votes[possible].min() if possible.any() else votes.min()
            else:
                frame = votes[np.argmin(np.abs(votes - prev))]
            agree = votes == frame
        elif n_agree < self.min_nodes or 2 * n_agree <= len(uniq):
            return math.nan
        ref = median(votes[agree])
        mine = agree[inv]
        return ref if median(np.abs(t[mine] - ref)) <= self.config.sync_s else math.nan

    def _write(self, node: np.ndarray, dev: np.ndarray, ts: np.ndarray) -> None:
        """Samples (a record's end time less its stage's reference) into their nodes' rings, in order; `ts`: the
        records' own times (a node's newest sampled one is where its clock was last checked)."""
        ok = ~np.isnan(dev)
        node, dev = node[ok], dev[ok]
        if not len(node):
            return
        ts = ts[ok]
        w = self.samples.shape[1]
        order = np.argsort(node, kind="stable")  # by node, each node's samples in order
        node, dev, ts = node[order], dev[order], ts[order]
        uniq = np.unique(node)
        self.checked[uniq] = ts[np.searchsorted(node, uniq, side="right") - 1]  # each node's newest checked
        first = np.searchsorted(node, node, side="left")
        k = np.arange(len(node)) - first  # the sample's place among its node's in this call
        total = np.bincount(node, minlength=len(self.count))
        last = k >= total[node] - w  # more than a ring's worth: the newest only
        node, dev, k = node[last], dev[last], k[last]
        self.samples[node, (self.count[node] + k) % w] = dev
        self.count += total
        self._agreeing = None
        self.touched.update(np.unique(node).tolist())

    def advance(self, now: float) -> list[Finding]:
        """Time moves: the offsets learned since the last move take effect (between two moves of time a run of
        records and the same records one by one see the same offsets), and clocks seen stepping are named."""
        out = [self._step_finding(node, step, now) for node, step in self.steps.said()]
        if not self.touched:
            return out
        nodes = np.array(sorted(self.touched), dtype=np.int64)
        self.touched.clear()
        return out + self._update(nodes, now)

    def _step_finding(self, node: str, step: float, now: float) -> Finding:
        off = float(self.offset[self.node_pos[node]]) + step  # its clock against the job's: learned and stepped
        return CLOCK_SKEW.finding(
            ts=now, job=self.topo.job, detector="clocks", node=node, key=(node, "step", round(step, 1)), score=1.0,
            topo=self.topo, evidence=ClockSkew(offset_s=round(off, 3), spread_s=0.0, steps=0,
                                               tolerance_s=self.config.tolerance_s, stepped_s=round(step, 3)))

    def _update(self, nodes: np.ndarray, now: float) -> list[Finding]:
        """Each node's offset from its recent samples; findings for offsets newly applied or drifted."""
        cfg = self.config
        enough = nodes[self.count[nodes] >= cfg.min_steps * self.per_node]
        if not len(enough):
            return []
        self._agreeing = None  # (offsets and, where a clock stepped, samples change below)
        rows = self.samples[enough]
        est = nanmedian_rows(rows)
        spread = nanmedian_rows(np.abs(rows - est[:, None]))
        for j, i in enumerate(enough.tolist()):
            stepped = self._stepped(i, est[j])
            if stepped is not None:
                est[j], spread[j] = stepped
        out = []
        for i, e, sp in zip(enough.tolist(), est.tolist(), spread.tolist(), strict=True):
            before = float(self.offset[i])
            if sp <= cfg.max_spread_s and abs(e) >= cfg.tolerance_s:
                self.offset[i] = e
            elif before and abs(e) < cfg.tolerance_s / 2:
                self.offset[i] = 0.0
            if self.offset[i] != before:
                self._rank_offset = None
                if abs(self.offset[i] - before) >= cfg.tolerance_s:
                    # its newest time by the clock it now has: the records before the change ran on the old one
                    # (a refinement of a few ms keeps it: its records unchecked yet, read early in an event-time
                    # replay, would take the node's time back to its last checked step and hold the job there)
                    self.newest[i] = min(self.newest[i], self.checked[i])
            said = self.reported[i]
            if self.offset[i] and (np.isnan(said) or abs(self.offset[i] - said) >= cfg.tolerance_s):
                self.reported[i] = self.offset[i]
                out.append(self._finding(i, float(sp), now))
            elif not self.offset[i] and not np.isnan(said):
                self.reported[i] = np.nan  # back in tolerance: a later skew is news again
        return out

    def _stepped(self, i: int, est: float) -> tuple[float, float] | None:
        """Node i's clock stepped (an NTP step, a clock set by hand): its newest `min_steps` steps agree with each
        other and neither with its applied offset nor with its window's median, which would take half a window
        of steps to follow. Its samples before the step are dropped (its history starts afresh at the step) and
        (offset, spread) of the newest are returned; None: no step."""
        cfg = self.config
        m, w = cfg.min_steps * self.per_node, self.samples.shape[1]
        if m >= w or self.count[i] <= m:
            return None
        newest = self.samples[i, (self.count[i] - 1 - np.arange(m)[::-1]) % w]
        if np.isnan(newest).any():
            return None
        e = median(newest)
        sp = median(np.abs(newest - e))
        if sp > cfg.max_spread_s or abs(e - self.offset[i]) < cfg.tolerance_s or abs(e - est) < cfg.tolerance_s:
            return None
        self.samples[i] = np.nan
        self.samples[i, :m] = newest
        self.count[i] = m
        return e, sp

    def _finding(self, i: int, spread: float, now: float) -> Finding:
        node, off = self.topo.nodes[i], float(self.offset[i])
        return CLOCK_SKEW.finding(
            ts=now, job=self.topo.job, detector="clocks", node=node,
            key=(node, round(off, 1)), score=1.0, topo=self.topo,
            evidence=ClockSkew(offset_s=round(off, 3), spread_s=round(spread, 3),
                               steps=int(min(self.count[i], self.samples.shape[1]) // self.per_node),
                               tolerance_s=self.config.tolerance_s))

    # --- state -----------------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config),
                "newest": {n: float(self.newest[i]) for n, i in [*self.node_pos.items(), ("", -1)]
                           if np.isfinite(self.newest[i])},
                "nodes": {n: [o, r, s] for n, (o, r, s) in self._kept().items()},
                "refs": {str(s): [None if np.isnan(x) else float(x) for x in ref] for s, ref in self.refs.items()},
                "open": {str(s): [r.tolist(), t.tolist()] for s, (r, t) in self.open.items()},
                "top": self.top, "touched": sorted(self.topo.nodes[i] for i in self.touched),
                "checked": {n: float(self.checked[i]) for n, i in self.node_pos.items()
                            if np.isfinite(self.checked[i])},
                "beats_since": {n: int(self.beats_since[i]) for n, i in self.node_pos.items()
                                if self.beats_since[i]},
                "node_steps": {n: int(self.node_step[i]) for n, i in self.node_pos.items()
                               if self.pair and self.node_step[i] >= 0},
                "early_beats": self.early_beats, "steps": self.steps.state(),
                "agent": {n: float(self.agent[i]) for n, i in self.node_pos.items() if np.isfinite(self.agent[i])}}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> ClockDetector:
        det = cls(topo, ClockConfig(**state["config"]))
        det._reset(topo, {n: (o, r, s) for n, (o, r, s) in state["nodes"].items()})
        for n, ts in state["newest"].items():
            if n in det.node_pos or n == "":
                det.newest[det.node_pos.get(n, -1)] = ts
        det.refs = {int(s): np.array([np.nan if x is None else x for x in ref], dtype=np.float64)
                    for s, ref in state["refs"].items() if len(ref) == det.stages}
        det.open = {int(s): (np.asarray(r, dtype=np.int64), np.asarray(t, dtype=np.float64))
                    for s, (r, t) in state["open"].items()}
        det.top = state["top"]
        det.touched = {det.node_pos[n] for n in state["touched"] if n in det.node_pos}
        for n, ts in state["checked"].items():
            if n in det.node_pos:
                det.checked[det.node_pos[n]] = ts
        for n, beats in state.get("beats_since", {}).items():  # (a state of version 4 saved before issue 42: none)
            if n in det.node_pos:
                det.beats_since[det.node_pos[n]] = beats
        det.early_beats = state["early_beats"]
        det.steps = ClockSteps.from_state(state["steps"], topo, det.config.tolerance_s)
        for n, ts in state["agent"].items():
            if n in det.node_pos:
                det.agent[det.node_pos[n]] = ts
        for n, step in state["node_steps"].items():
            if n in det.node_pos:
                det.node_step[det.node_pos[n]] = step
        return det

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        """Its saved state brought up to date (`DetectorBase.upgrade_state`)."""
        if version == 3 and state is None:  # added in version 4 (issue 34): nothing learned, `newest` comes with
            return {"config": {}, "newest": {}, "nodes": {}, "refs": {}, "open": {}, "top": -1, "touched": [],
                    "checked": {}, "beats_since": {}, "node_steps": {}, "early_beats": 0}  # the next records
        if version == 4 and state is not None:  # issue 42: heartbeats, nodes' steps and start-up counted (none yet)
            fill_missing(state, {"beats_since": {}, "node_steps": {}, "early_beats": 0})
        if version == 5 and state is not None:  # clock steps seen by the nodes' monotonic clocks: none yet
            fill_missing(state, {"steps": {"nodes": {}, "news": []}, "agent": {}})
        return state


def _group_medians(group: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    """The median of `x` within each of `n` groups (`group`: 0..n-1, each non-empty), in one sort."""
    order = np.lexsort((x, group))
    xs = x[order]
    count = np.bincount(group, minlength=n)
    start = np.concatenate(([0], np.cumsum(count)[:-1]))
    lo, hi = start + (count - 1) // 2, start + count // 2
    return (xs[lo] + xs[hi]) / 2.0


def _shifted(rows: StepRows, offs: np.ndarray) -> StepRows:
    """`rows` with each item's node offset taken out of its time (itself when none of its ranks has one)."""
    rank = np.asarray(rows.column("rank"), dtype=np.int64)
    ok = (rank >= 0) & (rank < len(offs))
    off = np.zeros(len(rank))
    off[ok] = offs[rank[ok]]
    return rows.shifted(off.tolist()) if off.any() else rows
