"""Silent data corruption (SDC): replicas that disagree, and numbers that blow up.

Two signals, per closed step:

- Digest (detector "sdc.digest", names a rank): data-parallel replicas of the
  same (tp, pp) shard must report the same `replica_digest`. In a shard
  where a clear majority (at least `min_majority` ranks, more than half of
  those reporting) agrees, every rank with another digest is suspect; it is
  reported at its first mismatching step, once per episode (the episode ends
  after `rearm_steps` agreeing steps). A shard without a clear majority
  blames nobody. When more than `widespread_frac` of the shards (and more
  than two) mismatch in one step, it is no single bad GPU (a digest that is
  not replica-invariant, a software fault): one job-wide finding, no rank.
- Numeric (detector "sdc.numeric", never names a rank): the job's loss and
  grad_norm per step (median over ranks) against a robust baseline of recent
  steps; NaN/Inf anywhere, or a jump of `jump_factor` x the baseline that is
  also `z_threshold` robust z out, is job-wide corroboration. Benign spikes
  (1.3x) stay below both.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
from gangwatch.detectors.base import SavedJob, fill_missing
from gangwatch.detectors.config import BufferConfig, SdcConfig
from gangwatch.detectors.floats import finite_or_none as _fin
from gangwatch.detectors.floats import median
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.runs import RecordRun
from gangwatch.detectors.step_buffer import Closed, StepBuffer
from gangwatch.detectors.step_scorer import StepScorer
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding, Record
from gangwatch.schemas.evidence import Evidence

_MAD_TO_SIGMA = 1.4826
_METRICS = ("loss", "grad_norm")
_FIELDS = {"replica_digest": "c", "loss": "nf", "grad_norm": "nf"}
_MAX_LISTED = 16  # ranks listed in evidence
_DIGEST = list(_FIELDS).index("replica_digest")  # its place in a buffered row
_KEEP_VOTES = 256  # voted steps whose incomplete votes are kept for records that come later


# --- digests --------------------------------------------------------------------------------------


@dataclass
class DigestVote:
    """Per rank: is it checked / in the minority; per shard: majority code, its count, replicas reporting."""

    checked: np.ndarray
    minority: np.ndarray
    major_code: np.ndarray
    major_count: np.ndarray
    total: np.ndarray


def digest_vote(codes: np.ndarray, shard: np.ndarray, n_shards: int, min_majority: int) -> DigestVote:
    """Majority vote of digest codes (-1 = none) within each shard, vectorized over all ranks."""
    has = codes >= 0
    idx = np.flatnonzero(has)
    sh, cd = shard[idx].astype(np.int64), codes[idx].astype(np.int64)
    width = int(cd.max()) + 1 if cd.size else 1
    keys, counts = np.unique(sh * width + cd, return_counts=True)
    k_shard, k_code = keys // width, keys % width
    total = np.bincount(sh, minlength=n_shards)
    major_count = np.zeros(n_shards, dtype=np.int64)
    np.maximum.at(major_count, k_shard, counts)
    major_code = np.full(n_shards, -1, dtype=np.int64)
    top = counts == major_count[k_shard]
    major_code[k_shard[top]] = k_code[top]  # unique whenever the majority is clear
    clear = (major_count >= min_majority) & (2 * major_count > total)
    checked = has & clear[shard]
    minority = checked & (codes != major_code[shard])
    return DigestVote(checked, minority, major_code, major_count, total)


# --- numbers --------------------------------------------------------------------------------------


def job_value(vals: np.ndarray, present: np.ndarray) -> tuple[float | None, str | None, int]:
    """(median of the finite values, label of the non-finite ones if any, how many ranks were non-finite)."""
    bad = present & ~np.isfinite(vals)
    n_bad = int(bad.sum())
    label = None
    if n_bad:
        b = vals[bad]
        label = "NaN" if np.isnan(b).any() else ("Infinity" if (b > 0).any() else "-Infinity")
    ok = vals[present & ~bad]
    return (median(ok) if ok.size else None), label, n_bad


def jump_score(v: float, history: np.ndarray, floor_frac: float) -> tuple[float, float, float | None]:
    """(baseline, robust z, ratio to baseline or None when the baseline is not positive)."""
    base = median(history)
    spread = _MAD_TO_SIGMA * median(np.abs(history - base))
    scale = max(spread, floor_frac * abs(base), 1e-12)
    return base, (v - base) / scale, (v / base if base > 0 else None)


# --- what it finds ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaMismatch(Evidence):
    """One rank's digest differs from the clear majority of its (tp, pp) shard's replicas."""

    step: int
    digest: str  # its digest
    majority_digest: str
    shard: int
    tp: int
    pp: int
    replicas: int  # replicas of the shard that reported a digest
    agree: int  # replicas holding the majority digest
    minority_ranks: list[int]  # every minority rank of the shard (at most 16)
    # the newest step at which this rank's digest still agreed with its replicas (None: never compared before):
    # the state up to it is verified, so a rollback to a checkpoint at or before it discards the corruption,
    # even when digests are compared only every few steps
    last_agreeing_step: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WidespreadMismatch(Evidence):
    """Many shards disagree in one step: no single bad GPU (a digest that is not replica-invariant, software)."""

    step: int
    reason: str  # "widespread"
    shards_mismatched: int
    shards: int  # shards with at least two replicas reporting
    ranks_minority: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NumericAnomaly(Evidence):
    """The job's loss or grad-norm went non-finite, or jumped far above its baseline."""

    metric: str  # loss or grad_norm
    value: float | str | None  # the job's value (median over ranks), or "NaN" / "Infinity" / "-Infinity"
    baseline: float | None
    z: float | None  # robust z against the baseline
    ratio: float | None  # value / baseline
    step: int
    nonfinite: bool
    ranks_nonfinite: int

    @property
    def fault(self) -> bool:
        """Strong enough to be a fault on its own: NaN / Inf, or a 5x jump (a benign spike is ~1.3x)."""
        return self.nonfinite or (self.ratio or 0) >= 5.0


SDC_SUSPECT = FindingType("sdc_suspect", (ReplicaMismatch, WidespreadMismatch, NumericAnomaly), Policy(
    incident="sdc",
    # a suspect rank opens it; job-wide numbers only when they are a fault, and then they name nobody
    opens=lambda f, ev: f.rank is not None or (isinstance(ev, NumericAnomaly) and ev.fault),
    verdict=lambda f, ev: f.rank is not None, node_level=True,
    weight=lambda f, ev: 0.9 if f.rank is not None else 0.0, risk=0.8))


# --- the detector -------------------------------------------------------------------------------


class SdcDetector(StepScorer):
    """Replica-digest disagreement (names ranks) and loss / grad-norm blow-ups (job-wide)."""

    name: ClassVar[str] = "sdc"
    finding_types: ClassVar[tuple[FindingType, ...]] = (SDC_SUSPECT,)

    def __init__(self, topo: Topology, config: SdcConfig | None = None) -> None:
        self.config = config or SdcConfig()
        self.hist: dict[str, deque[float]] = {m: deque(maxlen=self.config.history) for m in _METRICS}
        self.num_episode = {m: False for m in _METRICS}
        self.num_normal = {m: 0 for m in _METRICS}
        self._reset(topo)

    def _reset(self, topo: Topology) -> None:
        n = topo.size
        self.topo = topo
        self.n_shards = int(topo.shard.max()) + 1 if n else 0
        self.buf = StepBuffer(n, _FIELDS, self.config.buffer)
        self.buf.late = []  # records that came after their step was voted on: they vote too, late
        self.replicas = np.bincount(topo.shard, minlength=self.n_shards) if n else np.zeros(0, dtype=np.int64)
        self.ballots: dict[int, dict[int, dict[int, str]]] = {}  # step -> shard -> rank -> digest, of the shards
        # some replica of which had not voted when the step closed
        self.epoch = 0
        self.warm = 0
        self.flagged = np.zeros(n, dtype=bool)
        self.agree_run = np.zeros(n, dtype=np.int32)
        self.last_agree = np.full(n, -1, dtype=np.int64)  # newest step each rank's digest agreed (-1: none)
        self.wide_episode = False
        self.wide_clean = 0

    def set_topology(self, topo: Topology) -> None:
        """New `job` record: per-rank state starts afresh; the loss / grad_norm baseline is kept (same model)."""
        self._reset(topo)

    # --- feeding ---

    def observe(self, rec: Record) -> list[Finding]:
        found = super().observe(rec)  # the steps it closed, scored; then it, if it came after its step's vote
        late, self.buf.late = self.buf.late, []
        return found + [f for step, r, ts, row, _ in late for f in self._late_vote(step, r, ts, row)]

    def observe_run(self, run: RecordRun) -> list[tuple[int, list[Finding]]]:
        """As `observe` on each record in turn: the steps closed and the late records' votes, in record order
        (at one record, what it closed first)."""
        pos = run.by_kind.get("step")
        if not pos:
            return []
        at: list[int] = []
        closed = self.buf.add_columns(run.steps(), at)
        late, self.buf.late = self.buf.late, []
        events = sorted([(i, 0, k) for k, i in enumerate(at)] + [(row[4], 1, k) for k, row in enumerate(late)])
        out: dict[int, list[Finding]] = {}
        for i, what, k in events:
            if what == 0:
                found = self._score([closed[k]])
            else:
                step, r, ts, row, _ = late[k]
                found = self._late_vote(step, r, ts, row)
            if found:
                out.setdefault(pos[i], []).extend(found)
        return sorted(out.items())

    def _late_vote(self, step: int, r: int, ts: float, row: tuple[Any, ...]) -> list[Finding]:
        """A record of a step already voted on (a node's backlog, a spool flushed after the broker was away): its
        digest joins its step's vote, counted again, so a replica that differed from step 80 is found at step 80
        even when its records of steps 80 to 140, or its peers', came after the vote."""
        sh = int(self.topo.shard[r])
        ballot = self.ballots.get(step, {}).get(sh)
        digest = row[_DIGEST]
        if digest is None or ballot is None or r in ballot:
            return []
        ballot[r] = digest
        counts: dict[str, int] = {}
        for d in ballot.values():
            counts[d] = counts.get(d, 0) + 1
        top = sorted(counts.values(), reverse=True)
        if top[0] < self.config.min_majority or (len(top) > 1 and top[1] == top[0]):
            return []  # no majority yet
        maj = next(d for d, k in counts.items() if k == top[0])
        found = []
        for q, d in sorted(ballot.items()):
            if d == maj:
                self.last_agree[q] = max(self.last_agree[q], step)
            elif not self.flagged[q]:
                self.flagged[q] = True
                found.append(self._late_suspect(step, q, ts, ballot, maj, top[0]))
        return found

    def _late_suspect(self, step: int, r: int, ts: float, ballot: dict[int, str], maj: str, agree: int) -> Finding:
        s, info = int(self.topo.shard[r]), self.topo.ranks[r]
        minority = sorted(q for q, d in ballot.items() if d != maj)
        return SDC_SUSPECT.finding(
            ts=ts, job=self.topo.job, detector="sdc.digest", topo=self.topo, rank=r,
            key=(r, step), score=agree / len(ballot),
            evidence=ReplicaMismatch(
                step=step, digest=ballot[r], majority_digest=maj, shard=s, tp=info.tp, pp=info.pp,
                replicas=len(ballot), agree=agree, minority_ranks=minority[:_MAX_LISTED],
                last_agreeing_step=int(self.last_agree[r]) if self.last_agree[r] >= 0 else None))

    def _score(self, closed: list[Closed]) -> list[Finding]:
        out: list[Finding] = []
        for c in closed:
            if c.epoch != self.epoch:  # rewound to a checkpoint: numbers warm up again
                self.epoch, self.warm = c.epoch, 0
            out += self._digests(c)
            out += self._numbers(c)
        return out

    # --- digests ---

    def _digests(self, c: Closed) -> list[Finding]:
        codes = c.codes["replica_digest"]
        if not (codes >= 0).any():
            return []
        vote = digest_vote(codes, self.topo.shard, self.n_shards, self.config.min_majority)
        self._keep_ballots(c, vote)
        bad_shards = np.unique(self.topo.shard[vote.minority])
        multi = int((vote.total >= 2).sum())
        if bad_shards.size > max(2, self.config.widespread_frac * multi):
            return self._widespread(c, vote, bad_shards, multi)
        self.wide_clean += 1
        if self.wide_episode and self.wide_clean >= self.config.rearm_steps:
            self.wide_episode = False
        agree = vote.checked & ~vote.minority
        self.agree_run = np.where(agree, self.agree_run + 1, np.where(vote.minority, 0, self.agree_run))
        self.agree_run = self.agree_run.astype(np.int32)
        self.last_agree = np.where(agree, c.step, self.last_agree)
        self.flagged &= self.agree_run < self.config.rearm_steps
        new = vote.minority & ~self.flagged
        self.flagged |= new
        return [self._suspect(c, int(r), vote) for r in np.flatnonzero(new)]

    def _keep_ballots(self, c: Closed, vote: DigestVote) -> None:
        """The digests of a voted step's shards that some replica did not vote in yet: its record may still come."""
        short = np.flatnonzero((vote.total > 0) & (vote.total < self.replicas))
        if not short.size:
            return
        vocab, codes, shard = c.vocab["replica_digest"], c.codes["replica_digest"], self.topo.shard
        voted = np.flatnonzero((codes >= 0) & np.isin(shard, short))
        ballots: dict[int, dict[int, str]] = {}
        for r in voted.tolist():
            ballots.setdefault(int(shard[r]), {})[r] = vocab[codes[r]]
        self.ballots[c.step] = ballots
        while len(self.ballots) > _KEEP_VOTES:
            del self.ballots[min(self.ballots)]

    def _suspect(self, c: Closed, r: int, vote: DigestVote) -> Finding:
        vocab = c.vocab["replica_digest"]
        s = int(self.topo.shard[r])
        codes = c.codes["replica_digest"]
        peers = np.flatnonzero((self.topo.shard == s) & vote.minority)
        share = vote.major_count[s] / vote.total[s]
        info = self.topo.ranks[r]
        return SDC_SUSPECT.finding(
            ts=c.ts, job=self.topo.job, detector="sdc.digest", topo=self.topo, rank=r,
            key=(r, c.step), score=float(share),
            evidence=ReplicaMismatch(
                step=c.step, digest=vocab[codes[r]], majority_digest=vocab[vote.major_code[s]], shard=s, tp=info.tp,
                pp=info.pp, replicas=int(vote.total[s]), agree=int(vote.major_count[s]),
                minority_ranks=peers[:_MAX_LISTED].tolist(),
                last_agreeing_step=int(self.last_agree[r]) if self.last_agree[r] >= 0 else None),
        )

    def _widespread(self, c: Closed, vote: DigestVote, bad_shards: np.ndarray, multi: int) -> list[Finding]:
        self.wide_clean = 0
        if self.wide_episode:
            return []
        self.wide_episode = True
        return [SDC_SUSPECT.finding(
            ts=c.ts, job=self.topo.job, detector="sdc.digest", key=("widespread", c.step),
            score=bad_shards.size / max(multi, 1),
            evidence=WidespreadMismatch(step=c.step, reason="widespread", shards_mismatched=int(bad_shards.size),
                                        shards=multi, ranks_minority=int(vote.minority.sum())),
        )]

    # --- numbers ---

    def _numbers(self, c: Closed) -> list[Finding]:
        cfg = self.config
        warming = self.warm < cfg.warmup_steps
        out: list[Finding] = []
        seen_any = False
        for m in _METRICS:
            v, label, n_bad = job_value(c.vals[m], c.present[m])
            if v is None and label is None:
                continue
            seen_any = True
            base = z = ratio = None
            anomalous = label is not None
            if not anomalous and not warming and len(self.hist[m]) >= cfg.min_history:
                base, z, ratio = jump_score(v, np.fromiter(self.hist[m], dtype=np.float64), cfg.floor_frac)
                anomalous = ratio is not None and ratio >= cfg.jump_factor and z >= cfg.z_threshold
            if not anomalous:
                if not warming and v is not None:
                    self.hist[m].append(v)
                self.num_normal[m] += 1
                if self.num_episode[m] and self.num_normal[m] >= cfg.numeric_rearm_steps:
                    self.num_episode[m] = False
                continue
            self.num_normal[m] = 0
            if self.num_episode[m]:
                continue
            self.num_episode[m] = True
            if base is None and len(self.hist[m]):
                base = median(np.fromiter(self.hist[m], dtype=np.float64))
            out.append(SDC_SUSPECT.finding(
                ts=c.ts, job=self.topo.job, detector="sdc.numeric", key=(m, c.step),
                score=None if z is None else z,
                evidence=NumericAnomaly(
                    metric=m, value=label if label is not None else _fin(v),
                    baseline=None if base is None else _fin(base), z=None if z is None else _fin(z),
                    ratio=None if ratio is None else _fin(ratio), step=c.step, nonfinite=label is not None,
                    ranks_nonfinite=n_bad),
            ))
        if seen_any and warming:
            self.warm += 1
        return out

    # --- state ---

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "buffer": self.buf.state(), "epoch": self.epoch, "warm": self.warm,
                "flagged": self.flagged.tolist(), "agree_run": self.agree_run.tolist(),
                "last_agree": self.last_agree.tolist(),
                "wide_episode": self.wide_episode, "wide_clean": self.wide_clean,
                "hist": {m: list(h) for m, h in self.hist.items()}, "num_episode": dict(self.num_episode),
                "num_normal": dict(self.num_normal),
                "ballots": {str(st): {str(sh): {str(r): d for r, d in b.items()} for sh, b in m.items()}
                            for st, m in self.ballots.items()}}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> SdcDetector:
        conf = dict(state["config"])
        det = cls(topo, SdcConfig(**{**conf, "buffer": BufferConfig(**conf["buffer"])}))
        for m in _METRICS:
            det.hist[m].extend(state["hist"][m])
            det.num_episode[m] = bool(state["num_episode"][m])
            det.num_normal[m] = int(state["num_normal"][m])
        if state["buffer"]["size"] != topo.size:
            return det  # another topology: keep the job-wide baselines only
        det.buf.load(state["buffer"])
        det.epoch, det.warm = state["epoch"], state["warm"]
        det.flagged = np.asarray(state["flagged"], dtype=bool)
        det.agree_run = np.asarray(state["agree_run"], dtype=np.int32)
        det.last_agree = np.asarray(state["last_agree"], dtype=np.int64)
        det.wide_episode, det.wide_clean = state["wide_episode"], state["wide_clean"]
        det.ballots = {int(st): {int(sh): {int(r): d for r, d in b.items()} for sh, b in m.items()}
                       for st, m in state["ballots"].items()}
        return det

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        """Its saved state brought up to date (`DetectorBase.upgrade_state`)."""
        state = super().upgrade_state(state, version, job)
        if version == 2:  # grew without a version change
            fill_missing(state, {"last_agree": [-1] * state["buffer"]["size"]})
        elif version == 3:  # no vote kept: records of steps voted before the save count no more
            fill_missing(state, {"ballots": {}})
        return state
