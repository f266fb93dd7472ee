"""Fail-slow: stragglers, the ranks that make every other rank wait.

In synchronous training every rank reports the same `step_s`, so a straggler
shows in `compute_s` (it computes longest) and in `comm_wait_s` (it waits
least), compared with the peers that do the same work: the ranks of its
pipeline stage. Per closed step, vectorized over all ranks, in three separate
steps (each a small pure function):

1. score     - `relative_scores`: robust z of compute_s against the stage
               median/MAD, and of comm_wait_s the other way round; both must
               agree (the smaller counts). `individual_scores`: the rank's
               compute_s over its own EWMA baseline, normalized by the same
               ratio of its stage, so a job-wide slowdown scores nobody.
2. threshold - `threshold`: a hit when the relative score is high, or when
               the individual score is high and the relative score supports
               it; the individual score never fires alone.
3. persist   - `persist`: k hits in the last n scored steps of the rank.

One `fail_slow` finding per rank per episode; an episode ends after
`rearm_steps` consecutive clean steps. Baselines learn only from clean steps
of ranks not in an episode. Warm-up steps after a (re)start are not scored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.steps import BufferConfig, Closed, StepBuffer, StepScorer, decode_floats, encode_floats, median
from gangwatch.detectors.steps import finite_or_none as _fin
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding
from gangwatch.schemas.evidence import Evidence

_MAD_TO_SIGMA = 1.4826
_FIELDS = {"compute_s": "f", "comm_wait_s": "f", "step_s": "f"}


@dataclass(frozen=True)
class FailSlowConfig:
    warmup_steps: int = 10  # closed steps after a (re)start that are not scored
    rel_threshold: float = 3.0  # relative robust z at which a step is a hit
    ind_threshold: float = 3.0  # individual robust z at which a step is a hit ...
    support_threshold: float = 2.0  # ... if the relative z is at least this high too
    floor_frac: float = 0.02  # spread floor, as a fraction of the stage median compute_s (quiet jobs)
    min_peers: int = 4  # fewest ranks with a value for a stage to be compared; smaller stages are pooled
    hits: int = 3  # k: hits in the window that flag a rank
    window: int = 10  # n: last scored steps of a rank considered (at most 32)
    rearm_steps: int = 50  # consecutive clean scored steps that end an episode (>= window)
    alpha: float = 0.05  # EWMA weight of the individual baseline (a running mean until 1/alpha steps)
    min_history: int = 5  # baseline steps before a rank has an individual score
    buffer: BufferConfig = BufferConfig()


# --- 1. score -----------------------------------------------------------------------------------


def peer_groups(pp: np.ndarray, min_peers: int) -> list[np.ndarray]:
    """Rank indices of each pipeline stage; stages with fewer than `min_peers` ranks are pooled."""
    groups, small = [], []
    for g in np.unique(pp):
        idx = np.flatnonzero(pp == g)
        (groups if idx.size >= min_peers else small).append(idx)
    if small:
        groups.append(np.sort(np.concatenate(small)))
    return groups


def group_stats(x: np.ndarray, groups: list[np.ndarray], min_peers: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: median and sigma-equivalent spread (1.4826 x MAD) of the finite values of its group.

    NaN for ranks whose group has fewer than `min_peers` finite values.
    """
    med = np.full(x.shape, np.nan)
    spread = np.full(x.shape, np.nan)
    for idx in groups:
        v = x[idx]
        v = v[np.isfinite(v)]
        if v.size < min_peers:
            continue
        m = median(v)
        med[idx] = m
        spread[idx] = _MAD_TO_SIGMA * median(np.abs(v - m))
    return med, spread


def _z(dev: np.ndarray, spread: np.ndarray, floor: np.ndarray) -> np.ndarray:
    scale = np.fmax(spread, floor)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(scale > 0, dev / scale, np.nan)


def relative_scores(compute: np.ndarray, comm: np.ndarray, step: np.ndarray, groups: list[np.ndarray],
                    cfg: FailSlowConfig) -> tuple[np.ndarray, np.ndarray]:
    """Robust z of each rank against its stage peers; (score, stage median compute_s).

    compute_s counts upwards (a straggler computes longest), comm_wait_s
    downwards (it waits least). With both, the smaller z is the score (both
    must agree); with one, that one; NaN where neither can be scored.
    Spreads are floored at `floor_frac` x the stage median compute_s (or
    step_s when compute_s is missing), so a very quiet job does not turn a
    1% wobble into a large z.
    """
    med_c, sp_c = group_stats(compute, groups, cfg.min_peers)
    ref = med_c
    if np.isnan(med_c).any():  # no compute_s: floor from the step time instead
        ref = np.where(np.isfinite(med_c), med_c, group_stats(step, groups, cfg.min_peers)[0])
    floor = cfg.floor_frac * ref
    z_c = _z(compute - med_c, sp_c, floor)
    med_w, sp_w = group_stats(comm, groups, cfg.min_peers)
    z_w = _z(med_w - comm, sp_w, floor)
    return np.fmin(z_c, z_w), med_c


def individual_scores(compute: np.ndarray, baseline: np.ndarray, groups: list[np.ndarray],
                      cfg: FailSlowConfig) -> np.ndarray:
    """Robust z of each rank's compute_s / own baseline against the same ratio of its stage peers.

    Dividing by the stage's typical ratio takes out what happened to everyone
    (checkpoint, new sequence length, throttled cluster): only a rank that
    slowed down more than its peers scores. NaN where the baseline is unknown.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(baseline > 0, compute / baseline, np.nan)
    med, spread = group_stats(ratio, groups, cfg.min_peers)
    return _z(ratio - med, spread, cfg.floor_frac * med)


def slowdown_frac(r: int, compute: np.ndarray, comm: np.ndarray, step: np.ndarray, med_c: np.ndarray,
                  groups: list[np.ndarray]) -> float:
    """How much longer rank `r` computes than its stage's median (0.0 when it cannot be told).

    Without compute_s, estimated from the wait it did not have:
    (stage median wait - its wait) / (stage median step - stage median wait).
    """
    if np.isfinite(compute[r]) and med_c[r] > 0:
        return float(compute[r] / med_c[r] - 1)
    idx = next((g for g in groups if r in g), np.array([], dtype=np.int64))
    w, st = comm[idx][np.isfinite(comm[idx])], step[idx][np.isfinite(step[idx])]
    if not (w.size and st.size and np.isfinite(comm[r])):
        return 0.0
    med_w = median(w)
    denom = median(st) - med_w
    return float((med_w - comm[r]) / denom) if denom > 0 else 0.0


# --- 2. threshold -------------------------------------------------------------------------------


def threshold(rel: np.ndarray, ind: np.ndarray, cfg: FailSlowConfig) -> np.ndarray:
    """Hit per rank: relative z over its threshold, or individual z over its own with relative support."""
    with np.errstate(invalid="ignore"):
        return (rel >= cfg.rel_threshold) | ((ind >= cfg.ind_threshold) & (rel >= cfg.support_threshold))


# --- 3. persistence -----------------------------------------------------------------------------


def persist(hist: np.ndarray, hit: np.ndarray, scored: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Shift this step's hit into each scored rank's bit history; (new history, hits in the last `window`).

    Ranks not scored this step keep their history: the window counts a
    rank's own scored steps.
    """
    mask = np.uint32((1 << window) - 1)
    shifted = ((hist << np.uint32(1)) | hit.astype(np.uint32)) & mask
    new = np.where(scored, shifted, hist).astype(np.uint32)
    return new, _popcount(new)


def _popcount(a: np.ndarray) -> np.ndarray:
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(a).astype(np.int32)
    return np.unpackbits(a.astype("<u4").view(np.uint8)).reshape(-1, 32).sum(axis=1).astype(np.int32)


# --- what it finds ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerEvidence(Evidence):
    """One rank flagged as a straggler at `step`. Scores are robust z (unitless); None where not known."""

    relative: float | None  # against the ranks of its pipeline stage
    individual: float | None  # against its own baseline, relative to its stage
    slowdown_frac: float  # how much longer it computes than its stage's median (0.1 = 10 %)
    steps_flagged: int  # hits in the last `window` scored steps
    window: int  # steps
    step: int
    pp: int  # its pipeline stage
    compute_s: float | None
    stage_median_s: float | None  # the stage's median compute_s
    comm_wait_s: float | None
    onset_ts: float  # the oldest hit still in the window: when the straggling began, as far as can be told


FAIL_SLOW = FindingType("fail_slow", StragglerEvidence, Policy(
    incident="fail_slow", weight=0.7, risk=0.3, onset="onset_ts", slowdown_frac=lambda f, ev: ev.slowdown_frac))


# --- the detector -------------------------------------------------------------------------------


class FailSlowDetector(StepScorer):
    """Stragglers of one job, from per-rank compute and collective-wait times."""

    name: ClassVar[str] = "failslow"
    finding_types: ClassVar[tuple[FindingType, ...]] = (FAIL_SLOW,)

    def __init__(self, topo: Topology, config: FailSlowConfig | None = None) -> None:
        self.config = config or FailSlowConfig()
        cfg = self.config
        if not (1 <= cfg.hits <= cfg.window <= 32 and cfg.rearm_steps >= cfg.window):
            raise ValueError("need 1 <= hits <= window <= 32 and rearm_steps >= window")
        self._reset(topo)

    def _reset(self, topo: Topology) -> None:
        n = topo.size
        self.topo = topo
        self.groups = peer_groups(topo.pp, self.config.min_peers)
        self.buf = StepBuffer(n, _FIELDS, self.config.buffer)
        self.epoch = 0
        self.warm = 0
        self.base = np.full(n, np.nan)  # EWMA of compute_s, clean steps only
        self.nbase = np.zeros(n, dtype=np.int32)  # steps in the baseline
        self.hist = np.zeros(n, dtype=np.uint32)  # hit bits, newest lowest
        self.in_episode = np.zeros(n, dtype=bool)
        self.clean_run = np.zeros(n, dtype=np.int32)  # consecutive scored steps without a hit

    def set_topology(self, topo: Topology) -> None:
        """New `job` record: ranks may sit on other hardware now; every per-rank state starts afresh."""
        self._reset(topo)

    # --- feeding ---

    def _score(self, closed: list[Closed]) -> list[Finding]:
        out: list[Finding] = []
        for c in closed:
            out += self._score_step(c)
        return out

    def _score_step(self, c: Closed) -> list[Finding]:
        cfg = self.config
        if c.epoch != self.epoch:  # the job was rewound to a checkpoint: warm up again
            self.epoch, self.warm = c.epoch, 0
        if self.warm < cfg.warmup_steps:
            self.warm += 1
            return []
        compute, comm = c.vals["compute_s"], c.vals["comm_wait_s"]
        rel, med_c = relative_scores(compute, comm, c.vals["step_s"], self.groups, cfg)
        base = np.where(self.nbase >= cfg.min_history, self.base, np.nan)
        ind = individual_scores(compute, base, self.groups, cfg)
        hit = threshold(rel, ind, cfg)
        scored = np.isfinite(rel)
        self.hist, count = persist(self.hist, hit, scored, cfg.window)
        self.clean_run = np.where(scored, np.where(hit, 0, self.clean_run + 1), self.clean_run).astype(np.int32)
        self.in_episode &= self.clean_run < cfg.rearm_steps
        new = scored & (count >= cfg.hits) & ~self.in_episode
        self.in_episode |= new
        self._learn(compute, np.isfinite(compute) & ~hit & ~self.in_episode)
        return [self._finding(c, int(r), rel, ind, compute, comm, med_c, count) for r in np.flatnonzero(new)]

    def _learn(self, compute: np.ndarray, learn: np.ndarray) -> None:
        """EWMA update of the baselines of `learn` ranks (a running mean for the first 1/alpha steps)."""
        idx = np.flatnonzero(learn)
        if idx.size == 0:
            return
        n = np.minimum(self.nbase[idx] + 1, 1 << 20)
        a = np.maximum(self.config.alpha, 1.0 / n)
        b = self.base[idx]
        x = compute[idx]
        b = np.where(np.isnan(b), x, b)
        self.base[idx] = b + a * (x - b)
        self.nbase[idx] = n

    def _finding(self, c: Closed, r: int, rel: np.ndarray, ind: np.ndarray, compute: np.ndarray,
                 comm: np.ndarray, med_c: np.ndarray, count: np.ndarray) -> Finding:
        slow = slowdown_frac(r, compute, comm, c.vals["step_s"], med_c, self.groups)
        # the oldest hit still in the window: how many steps ago the straggling began, as far as we can tell
        back = int(self.hist[r] & ((1 << self.config.window) - 1)).bit_length() - 1
        step_s = c.vals["step_s"][np.isfinite(c.vals["step_s"])]
        onset = c.ts - max(back, 0) * (median(step_s) if step_s.size else 0.0)
        return FAIL_SLOW.finding(
            ts=c.ts, job=self.topo.job, detector="failslow.compute", topo=self.topo,
            rank=r, key=(r, c.step), score=float(rel[r]),
            evidence=StragglerEvidence(
                relative=_fin(rel[r]), individual=_fin(ind[r]), slowdown_frac=round(slow, 6),
                steps_flagged=int(count[r]), window=self.config.window, step=c.step, pp=int(self.topo.pp[r]),
                compute_s=_fin(compute[r]), stage_median_s=_fin(med_c[r]), comm_wait_s=_fin(comm[r]),
                onset_ts=round(onset, 6)),
        )

    # --- state ---

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "buffer": self.buf.state(), "epoch": self.epoch, "warm": self.warm,
                "base": encode_floats(self.base), "nbase": self.nbase.tolist(), "hist": self.hist.tolist(),
                "in_episode": self.in_episode.tolist(), "clean_run": self.clean_run.tolist()}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> FailSlowDetector:
        conf = dict(state["config"])
        det = cls(topo, FailSlowConfig(**{**conf, "buffer": BufferConfig(**conf["buffer"])}))
        if state["buffer"]["size"] != topo.size:
            return det  # another topology: nothing of the old per-rank state applies
        det.buf.load(state["buffer"])
        det.epoch, det.warm = state["epoch"], state["warm"]
        det.base = decode_floats(state["base"])[0]
        det.nbase = np.asarray(state["nbase"], dtype=np.int32)
        det.hist = np.asarray(state["hist"], dtype=np.uint32)
        det.in_episode = np.asarray(state["in_episode"], dtype=bool)
        det.clean_run = np.asarray(state["clean_run"], dtype=np.int32)
        return det
