"""Fail-slow: stragglers, the ranks that make every other rank wait, told apart from ranks that are merely slower.

In synchronous training every rank reports the same `step_s`, so a straggler
shows in `compute_s` (it computes longest) and in `comm_wait_s` (it waits
least), compared with the peers that do the same work: the ranks of its
pipeline stage. But real fleets are uneven: a rank on an older GPU, a shared
or split GPU, a slower network path, is slower than its peers from its first
step without anything being broken. **Fail-slow is a change, not a
difference**: a rank is a straggler only when it has slowed down against its
own usual level *and* stands out from its peers.

Per closed step, vectorized over all ranks:

0. calibrate - for `calib_steps` scored steps after the job (or its last
               restart, a new `job` record) began, each rank's usual
               *slowness* (its work over its stage's median, minus 1) is
               learned and nobody is flagged. At the end, a rank steadily and
               clearly slower than its stage (`het_min_frac` and `het_z`
               spreads of the stage's usual slownesses above their median)
               (and slower than the stage's median in most of those steps)
               gets one `heterogeneous` finding with its steady ratio (judged
               over `het_min_s` of event time at least: a job of short steps
               calibrates in seconds, and seconds of a busy host are no
               steady difference; until then its steps are gathered on): a
               difference, reported once, and no reason to evict while what
               it costs the job is small; one costing the job
               `het_incident_frac` (10 %) of its step or more is a straggler
               all the same, decided like one (replace, or a human told the
               figure).
1. score     - `relative_scores`: robust z of compute_s against the stage
               median/MAD, and of comm_wait_s the other way round; both must
               agree (the smaller counts). `individual_scores`: the rank's
               slowness now over its own usual slowness, in spreads of the
               stage, so a job-wide slowdown scores nobody and a rank that
               was always slower scores 0 for it.
2. threshold - `threshold`: a hit needs both: the relative score over its
               threshold with the individual one in support, or the
               individual score over its threshold with the relative one in
               support. Neither fires alone.
3. persist   - `persist`: hits in the last `window` (fast, steady
               stragglers) or in the last `long_window` scored steps
               (intermittent ones: slow in a fraction of steps); where
               `window` steps last less than `min_window_s` (8 s) of event
               time, the rank must stay flagged for the difference too. How many
               hits are needed adapts to the stage's own rate of stray hits
               (`needed_hits`): noisy jobs (real CPU jobs have heavy-tailed
               step times) need more persistence, quiet ones `hits` /
               `long_hits`.

One `fail_slow` finding per rank per episode, and another whenever the rank
has since grown a quarter slower in its slow steps (a few times at most: a
thermal ramp that is still climbing: triage decides on the true cost). An episode ends after `rearm_steps` consecutive
clean steps. A straggler's cost (`cost_frac`) is what it adds to the job's
step on its own: the step is set by the slowest rank, so only what its work
exceeds the slowest stage's typical work by counts; `floor_frac` is what the
ranks not flagged (heterogeneous or merely noisy) add, which no replacement
of stragglers removes. Baselines learn only from quiet steps of ranks not in
an episode. Warm-up steps after a (re)start or a rewind are not scored.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

import numpy as np
from gangwatch.detectors.base import SavedJob, fill_missing
from gangwatch.detectors.config import BufferConfig, FailSlowConfig
from gangwatch.detectors.floats import decode_floats, encode_floats, median
from gangwatch.detectors.floats import finite_or_none as _fin
from gangwatch.detectors.registry import FindingType, Policy
from gangwatch.detectors.slowscore import (
    group_stats,
    hits_in,
    individual_scores,
    needed_hits,
    normal_isf,
    peer_groups,
    persist,
    relative_scores,
    slowdown_frac,
    slowness,
    step_costs,
    threshold,
)
from gangwatch.detectors.step_buffer import Closed, StepBuffer
from gangwatch.detectors.step_scorer import StepScorer
from gangwatch.detectors.topology import Topology
from gangwatch.schemas import Finding
from gangwatch.schemas.evidence import Evidence

_RING = 16  # steps of each stage's median work kept to tell what is typical
_FIELDS = {"compute_s": "f", "comm_wait_s": "f", "step_s": "f"}


# --- what it finds ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerEvidence(Evidence):
    """One rank flagged as a straggler at `step`. Scores are robust z (unitless); None where not known."""

    relative: float | None  # against the ranks of its pipeline stage
    individual: float | None  # against its own usual level, relative to its stage
    slowdown_frac: float  # how much longer it computes than its stage's median (0.1 = 10 %)
    steps_flagged: int  # hits in the last `window` scored steps
    window: int  # steps
    step: int
    pp: int  # its pipeline stage
    compute_s: float | None
    stage_median_s: float | None  # the stage's median compute_s
    comm_wait_s: float | None
    onset_ts: float  # the oldest hit still in the window when the episode began: when the straggling began
    cost_frac: float | None = None  # what it alone adds to the job's step, recently (0.1 = 10 % of the step)
    floor_frac: float | None = None  # what ranks not flagged add: no replacement of stragglers removes it
    long_hits: int | None = None  # hits in the last `long_window` scored steps (intermittent stragglers)
    long_window: int | None = None


def _cost(f: Finding, ev: StragglerEvidence) -> float:
    return ev.cost_frac if ev.cost_frac is not None else ev.slowdown_frac


FAIL_SLOW = FindingType("fail_slow", StragglerEvidence, Policy(
    incident="fail_slow", weight=0.7, risk=0.3, onset="onset_ts", slowdown_frac=_cost,
    slow_floor=lambda f, ev: ev.floor_frac or 0.0))


@dataclass(frozen=True, slots=True, kw_only=True)
class Heterogeneity(Evidence):
    """A rank steadily slower than its stage since the job (or its last restart) began: a difference, not a fault.

    Measured over the calibration steps; `ratio` is its work over its stage's median (1.08: 8 % slower).
    """

    ratio: float
    cost_frac: float  # what it adds to the job's step (0 when its stage has room to spare)
    stage_spread_frac: float  # how much the stage's ranks usually differ (1.4826 x MAD of their ratios)
    steps: int  # steps it was measured over
    since_step: int  # the first of them
    step: int  # the last of them
    pp: int
    incident_frac: float | None = None  # what replacing it must save of each step to be decided on (None: never)
    floor_frac: float | None = None  # what the next-slowest rank adds: no replacement of this one saves that


def _costly(ev: Heterogeneity) -> bool:
    """Replacing it would save the job `incident_frac` of each step: its cost down to the next-slowest rank."""
    return ev.incident_frac is not None and ev.cost_frac - (ev.floor_frac or 0.0) >= ev.incident_frac


# a difference, not a fault, while it costs little; costing the job a tenth of its step, a straggler to decide
HETEROGENEOUS = FindingType("heterogeneous", Heterogeneity, Policy(
    incident="fail_slow", opens=lambda f, ev: _costly(ev), weight=lambda f, ev: 0.7 if _costly(ev) else 0.0,
    risk=lambda f, ev: 0.3 if _costly(ev) else 0.0, grade="heterogeneous",
    slowdown_frac=lambda f, ev: ev.cost_frac if _costly(ev) else None, slow_floor=lambda f, ev: ev.floor_frac or 0.0,
    label=lambda f, ev: "heterogeneous"))


# --- the detector -------------------------------------------------------------------------------


# fail-slow's saved state from before it calibrated (job state version 2): what it keeps when brought up to date
_KEPT_BEFORE_CALIBRATION = frozenset({"config", "buffer", "epoch", "warm", "hist", "in_episode", "flag_ts",
                                      "clean_run"})

class FailSlowDetector(StepScorer):
    """Stragglers of one job, from per-rank compute and collective-wait times, and its steadily slower ranks."""

    name: ClassVar[str] = "failslow"
    finding_types: ClassVar[tuple[FindingType, ...]] = (FAIL_SLOW, HETEROGENEOUS)

    def __init__(self, topo: Topology, config: FailSlowConfig | None = None) -> None:
        self.config = config or FailSlowConfig()
        cfg = self.config
        if not (1 <= cfg.hits <= cfg.window <= 32 and 1 <= cfg.long_hits <= cfg.long_window <= 32
                and cfg.rearm_steps >= max(cfg.window, cfg.long_window) and cfg.calib_steps >= 1):
            raise ValueError("need 1 <= hits <= window <= 32, 1 <= long_hits <= long_window <= 32, "
                             "rearm_steps >= both windows and calib_steps >= 1")
        self._reset(topo)

    def _reset(self, topo: Topology) -> None:
        n = topo.size
        self.topo = topo
        self.groups = peer_groups(topo.pp, self.config.min_peers)
        self.buf = StepBuffer(n, _FIELDS, self.config.buffer)
        self.epoch = 0
        self.warm = 0
        self.calib = 0  # calibration steps done since the (re)start
        self.first_step = -1  # the first calibration step
        self.calib_ts = np.nan  # when it closed (event time)
        self.het_wait = False  # calibration is done, heterogeneity still gathered until `het_min_s` have passed
        self.base = np.full(n, np.nan)  # usual slowness (EWMA), quiet steps only
        self.nbase = np.zeros(n, dtype=np.int32)  # steps in the baseline
        self.level = np.full(n, np.nan)  # recent slowness (EWMA over every scored step)
        self.run_num = np.zeros(n, dtype=np.int32)  # steps since the first hit still in the long window
        self.hit_level = np.full(n, np.nan)  # slowness in the hit steps of that run (EWMA, fast)
        self.rate = np.full(n, self.config.min_hit_rate)  # stray-hit rate per scored step (EWMA)
        self.csum = np.zeros(n)  # calibration: sum and count of each rank's slowness
        self.cnum = np.zeros(n, dtype=np.int32)
        self.cabove = np.zeros(n, dtype=np.int32)  # calibration steps it was slower than its stage's median
        self.cscale = np.zeros(n)  # calibration: the stage's spread of slowness, summed over the steps
        self.het = np.zeros(n, dtype=bool)  # reported heterogeneous since the (re)start
        self.hist = np.zeros(n, dtype=np.uint32)  # hit bits, newest lowest
        self.in_episode = np.zeros(n, dtype=bool)
        self.flag_ts = np.full(n, np.nan)  # when the rank's current unbroken run of flagged steps began
        self.clean_run = np.zeros(n, dtype=np.int32)  # consecutive scored steps without a hit
        self.ep_onset = np.full(n, np.nan)  # when the current episode began
        self.ep_cost = np.full(n, np.nan)  # the cost last reported for it
        self.ep_reports = np.zeros(n, dtype=np.int32)  # findings of it so far
        self.ep_level = np.full(n, np.nan)  # its slowness in its slow steps when last reported
        # the last _RING steps' median work of each stage and median step: what is typical (a checkpoint is not)
        self.ring_work = np.full((len(self.groups), _RING), np.nan)
        self.ring_step = np.full(_RING, np.nan)
        self.ring_at = 0

    def set_topology(self, topo: Topology) -> None:
        """New `job` record (a restart): ranks may sit on other hardware now; every per-rank state starts afresh."""
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
        compute, comm, step = c.vals["compute_s"], c.vals["comm_wait_s"], c.vals["step_s"]
        stats_c = group_stats(compute, self.groups, cfg.min_peers)
        rel, med_c = relative_scores(compute, comm, step, self.groups, cfg, stats_c)
        slow, scale, med_w = slowness(compute, comm, step, self.groups, cfg, stats_c)
        scored = np.isfinite(rel)
        typ_work, typ_step, odd = self._typical(med_w, step)
        has = np.isfinite(slow) & ~odd  # an odd step (a checkpoint save, a job-wide stall) teaches nothing
        self.level = np.where(has, np.where(np.isnan(self.level), slow, self.level + cfg.level_alpha *
                                            (slow - self.level)), self.level)
        if self.calib < cfg.calib_steps:
            return self._calibrate(c, rel, slow, scale, typ_work, typ_step, scored & ~odd, has)
        judged: list[Finding] = []
        if self.het_wait:
            self._gather(slow, scale, has & ~self.in_episode)
            judged = self._judged(c, typ_work, typ_step)
        ind = individual_scores(slow, self.base, scale)
        hit = threshold(rel, ind, cfg, self.base / scale)
        self.hist, count = persist(self.hist, hit, scored, cfg.window)
        count_long = hits_in(self.hist, cfg.long_window)
        running = scored & (count_long > 0)  # a run of hits: from its first hit on, how slow its hit steps are
        add = running & has
        self.run_num = np.where(running, self.run_num + add, 0).astype(np.int32)
        learn_hit = add & hit
        self.hit_level = np.where(running, np.where(learn_hit, np.where(np.isnan(self.hit_level), slow, (
            self.hit_level + cfg.hit_alpha * (slow - self.hit_level))), self.hit_level), np.nan)
        need, need_long = self._needed()
        self.clean_run = np.where(scored, np.where(hit, 0, self.clean_run + 1), self.clean_run).astype(np.int32)
        self.in_episode &= self.clean_run < cfg.rearm_steps
        flagged = scored & ((count >= need) | (count_long >= need_long))
        self.flag_ts = np.where(flagged, np.where(np.isnan(self.flag_ts), c.ts, self.flag_ts), np.nan)
        short_by = cfg.min_window_s - cfg.window * typ_step if np.isfinite(typ_step) else 0.0
        new = flagged & ~self.in_episode & (c.ts - self.flag_ts >= max(0.0, short_by))
        # the cost of a straggler: how slow its hit steps are now, times the share of its steps that are hits (a
        # steady one: all; an intermittent one: some); of the others, their recent slowness
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.minimum(1.0, count_long / np.maximum(np.minimum(self.run_num, cfg.long_window), 1))
            now = np.where(np.isfinite(self.hit_level), self.hit_level * share, self.level)
            costs = step_costs(np.where(new | self.in_episode, now, self.level), typ_work, typ_step)
            # grown: slower in its slow steps (a ramp; not an intermittent one's share of slow steps wobbling)
            grown = self.in_episode & flagged & (self.hit_level >= np.fmax(cfg.regrow * self.ep_level, self.ep_level +
                                                                            cfg.regrow_min_slowness)) & \
                (costs >= self.ep_cost + cfg.regrow_min_frac) & (self.ep_reports < cfg.max_reports)
        for r in np.flatnonzero(new):
            # the oldest hit in its window, or when it was first flagged when it had to stay flagged (short steps)
            self.ep_onset[r] = min(self._onset(c, int(r), step, count[r] >= need[r]), float(self.flag_ts[r]))
        self.ep_reports = np.where(new, 0, self.ep_reports).astype(np.int32)
        self.in_episode |= new
        with np.errstate(invalid="ignore"):
            quiet = np.fmin(rel, ind) < cfg.learn_below
        self._learn(slow, has & ~hit & ~self.in_episode & quiet)
        with np.errstate(invalid="ignore"):
            self.rate = np.where(scored & ~odd & ~self.in_episode,
                                 self.rate + cfg.hit_rate_alpha * (hit - self.rate), self.rate)
        report = np.flatnonzero(new | grown)
        if report.size == 0:
            return judged
        floor = float(costs[~self.in_episode].max()) if (~self.in_episode).any() else 0.0
        out = judged
        for r in report.tolist():
            self.ep_cost[r], self.ep_level[r] = costs[r], self.hit_level[r]
            self.ep_reports[r] += 1
            out.append(self._finding(c, r, rel, ind, compute, comm, med_c, count, count_long, costs[r], floor))
        return out

    def _typical(self, med_w: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, float, bool]:
        """Record this step's median work per stage and median step; (typical work per rank, typical step,
        whether this step is odd: half as long again as the typical step, a checkpoint save or a stall)."""
        st = step[np.isfinite(step)]
        now = median(st) if st.size else np.nan
        typ = np.nanmedian(self.ring_step) if np.isfinite(self.ring_step).sum() >= 4 else np.nan
        odd = bool(np.isfinite(typ) and np.isfinite(now) and now > 1.5 * typ)
        i = self.ring_at % _RING
        self.ring_step[i] = now
        for g, idx in enumerate(self.groups):
            self.ring_work[g, i] = med_w[idx[0]]
        self.ring_at += 1
        work = np.full(med_w.shape, np.nan)
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a stage with no value yet: NaN, said once here
            typical = np.nanmedian(self.ring_work, axis=1)
            for g, idx in enumerate(self.groups):
                work[idx] = typical[g]
            return work, float(np.nanmedian(self.ring_step)), odd

    def _calibrate(self, c: Closed, rel: np.ndarray, slow: np.ndarray, scale: np.ndarray, med_w: np.ndarray,
                   typ_step: float, scored: np.ndarray, has: np.ndarray) -> list[Finding]:
        """One calibration step: learn every rank's usual slowness and the stray-hit rate; report
        heterogeneous ranks after the last one."""
        cfg = self.config
        if self.calib == 0:
            self.first_step, self.calib_ts = c.step, c.ts
        self.calib += 1
        self._gather(slow, scale, has)
        self._learn(slow, has, running=True)
        with np.errstate(invalid="ignore"):
            stray = rel >= cfg.rel_threshold
        self.rate = np.where(scored, self.rate + cfg.hit_rate_alpha * (stray - self.rate), self.rate)
        if self.calib < cfg.calib_steps:
            return []
        return self._judged(c, med_w, typ_step)

    def _gather(self, slow: np.ndarray, scale: np.ndarray, has: np.ndarray) -> None:
        """One step of each rank's slowness into what heterogeneity is judged on."""
        with np.errstate(invalid="ignore"):  # in logs: heavy-tailed step times average without their tail
            self.csum = np.where(has, self.csum + np.where(has, np.log1p(np.fmax(slow, -0.99)), 0.0), self.csum)
        self.cnum = self.cnum + has
        self.cscale = np.where(has, self.cscale + np.where(has, scale, 0.0), self.cscale)
        with np.errstate(invalid="ignore"):
            self.cabove = self.cabove + (has & (slow > 0))

    def _judged(self, c: Closed, med_w: np.ndarray, typ_step: float) -> list[Finding]:
        """Heterogeneous ranks, once `het_min_s` of event time were gathered (else gather on: `het_wait`)."""
        # (calib_ts is NaN in a state migrated from before it was kept: calibrated long ago, judge now)
        self.het_wait = bool(c.ts - self.calib_ts < self.config.het_min_s)
        return [] if self.het_wait else self._heterogeneous(c, med_w, typ_step)

    def _heterogeneous(self, c: Closed, med_w: np.ndarray, typ_step: float) -> list[Finding]:
        cfg = self.config
        enough = self.cnum >= max(1, cfg.calib_steps // 2)
        with np.errstate(invalid="ignore", divide="ignore"):
            usual = np.where(enough, np.expm1(self.csum / np.maximum(self.cnum, 1)), np.nan)
        med, spread = group_stats(usual, self.groups, cfg.min_peers)
        # a few dozen means spread by chance less than they should: never less than a step's spread allows
        with np.errstate(invalid="ignore", divide="ignore"):
            spread = np.fmax(spread, self.cscale / np.maximum(self.cnum, 1) / np.sqrt(np.maximum(self.cnum, 1)))
        z = np.full(usual.shape, cfg.het_z)
        for idx in self.groups:  # every rank of a stage is tested once: the bar rises with the stage's size
            z[idx] = max(cfg.het_z, normal_isf(cfg.het_false_alarm / idx.size))
        with np.errstate(invalid="ignore"):
            het = (usual - med >= np.fmax(cfg.het_min_frac, z * spread)) & ~self.in_episode & \
                (self.cabove >= cfg.het_steady * self.cnum)
        self.het |= het
        costs = step_costs(usual, med_w, typ_step)
        top = np.argsort(np.nan_to_num(costs))[::-1][:2]  # the slowest two: each one's floor is the other's cost
        out = []
        for r in np.flatnonzero(het).tolist():
            out.append(HETEROGENEOUS.finding(
                ts=c.ts, job=self.topo.job, detector="failslow.heterogeneous", topo=self.topo, rank=r,
                key=("het", r, c.step), score=round(float((usual[r] - med[r]) / max(spread[r], cfg.floor_frac)), 4),
                evidence=Heterogeneity(
                    ratio=round(float(1.0 + usual[r]), 6), cost_frac=round(float(costs[r]), 6),
                    stage_spread_frac=round(float(spread[r]), 6), steps=int(self.cnum[r]),
                    since_step=int(self.first_step), step=c.step, pp=int(self.topo.pp[r]),
                    incident_frac=cfg.het_incident_frac,
                    floor_frac=round(float(costs[top[1] if r == top[0] else top[0]]) if costs.size > 1 else 0.0, 6))))
        return out

    def _needed(self) -> tuple[np.ndarray, np.ndarray]:
        """Per rank, the hits its stage needs in the short and in the long window, from the stage's stray-hit
        rate: the mean rate of its ranks not in an episode, leaving out the highest tenth (a straggler on its way
        to being flagged does not raise it; stray hits are rare, so most ranks' own rate is 0: not the median)."""
        cfg = self.config
        need = np.full(self.topo.size, cfg.window + 1, dtype=np.int32)
        need_long = np.full(self.topo.size, cfg.long_window + 1, dtype=np.int32)
        for idx in self.groups:
            quiet = np.sort(self.rate[idx[~self.in_episode[idx]]])
            quiet = quiet[:quiet.size - max(1, quiet.size // 10)] if quiet.size > 1 else quiet
            rate = max(cfg.min_hit_rate, float(quiet.mean()) if quiet.size else cfg.min_hit_rate)
            need[idx] = needed_hits(cfg.window, rate, cfg.false_alarm, cfg.hits)
            need_long[idx] = needed_hits(cfg.long_window, rate, cfg.false_alarm, cfg.long_hits)
        return need, need_long

    def _onset(self, c: Closed, r: int, step: np.ndarray, short: bool) -> float:
        """The oldest hit still in the window that flagged rank `r`: when the straggling began, as far as told."""
        window = self.config.window if short else self.config.long_window
        back = int(self.hist[r] & np.uint32((1 << window) - 1)).bit_length() - 1
        st = step[np.isfinite(step)]
        return c.ts - max(back, 0) * (median(st) if st.size else 0.0)

    def _learn(self, slow: np.ndarray, learn: np.ndarray, running: bool = False) -> None:
        """Update the usual slowness of `learn` ranks: a running mean in calibration, an EWMA after it."""
        idx = np.flatnonzero(learn)
        if idx.size == 0:
            return
        n = np.minimum(self.nbase[idx] + 1, 1 << 20)
        a = 1.0 / n if running else np.maximum(self.config.alpha, 1.0 / n)
        b = self.base[idx]
        x = slow[idx]
        b = np.where(np.isnan(b), x, b)
        self.base[idx] = b + a * (x - b)
        self.nbase[idx] = n

    def _finding(self, c: Closed, r: int, rel: np.ndarray, ind: np.ndarray, compute: np.ndarray,
                 comm: np.ndarray, med_c: np.ndarray, count: np.ndarray, count_long: np.ndarray, cost: float,
                 floor: float) -> Finding:
        cfg = self.config
        slow = slowdown_frac(r, compute, comm, c.vals["step_s"], med_c, self.groups)
        return FAIL_SLOW.finding(
            ts=c.ts, job=self.topo.job, detector="failslow.compute", topo=self.topo,
            rank=r, key=(r, c.step), score=float(rel[r]),
            evidence=StragglerEvidence(
                relative=_fin(rel[r]), individual=_fin(ind[r]), slowdown_frac=round(slow, 6),
                steps_flagged=int(count[r]), window=cfg.window, step=c.step, pp=int(self.topo.pp[r]),
                compute_s=_fin(compute[r]), stage_median_s=_fin(med_c[r]), comm_wait_s=_fin(comm[r]),
                onset_ts=round(float(self.ep_onset[r]), 6), cost_frac=round(float(cost), 6),
                floor_frac=round(floor, 6), long_hits=int(count_long[r]), long_window=cfg.long_window),
        )

    # --- state ---

    def state(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "buffer": self.buf.state(), "epoch": self.epoch, "warm": self.warm,
                "calib": self.calib, "first_step": self.first_step,
                "calib_ts": self.calib_ts if np.isfinite(self.calib_ts) else None, "het_wait": self.het_wait,
                "base": encode_floats(self.base), "nbase": self.nbase.tolist(), "level": encode_floats(self.level),
                "run_num": self.run_num.tolist(), "hit_level": encode_floats(self.hit_level),
                "rate": self.rate.tolist(), "csum": self.csum.tolist(), "cnum": self.cnum.tolist(),
                "cabove": self.cabove.tolist(), "cscale": self.cscale.tolist(),
                "het": self.het.tolist(), "hist": self.hist.tolist(), "in_episode": self.in_episode.tolist(),
                "flag_ts": encode_floats(self.flag_ts),
                "clean_run": self.clean_run.tolist(), "ep_onset": encode_floats(self.ep_onset),
                "ring_work": [encode_floats(r) for r in self.ring_work], "ring_step": encode_floats(self.ring_step),
                "ring_at": self.ring_at, "ep_reports": self.ep_reports.tolist(),
                "ep_level": encode_floats(self.ep_level),
                "ep_cost": encode_floats(self.ep_cost)}

    @classmethod
    def from_state(cls, state: dict[str, Any], topo: Topology) -> FailSlowDetector:
        known = {f.name for f in fields(FailSlowConfig)}
        conf = {k: v for k, v in state["config"].items() if k in known}  # a setting since retired is dropped
        det = cls(topo, FailSlowConfig(**{**conf, "buffer": BufferConfig(**conf["buffer"])}))
        if state["buffer"]["size"] != topo.size:
            return det  # another topology: nothing of the old per-rank state applies
        det.buf.load(state["buffer"])
        det.epoch, det.warm = state["epoch"], state["warm"]
        det.hist = np.asarray(state["hist"], dtype=np.uint32)
        det.in_episode = np.asarray(state["in_episode"], dtype=bool)
        det.flag_ts = decode_floats(state["flag_ts"])[0]
        det.clean_run = np.asarray(state["clean_run"], dtype=np.int32)
        det.calib, det.first_step = state["calib"], state["first_step"]
        det.calib_ts = np.nan if state["calib_ts"] is None else float(state["calib_ts"])
        det.het_wait = bool(state["het_wait"])
        det.base = decode_floats(state["base"])[0]
        det.nbase = np.asarray(state["nbase"], dtype=np.int32)
        det.level = decode_floats(state["level"])[0]
        det.run_num = np.asarray(state["run_num"], dtype=np.int32)
        det.hit_level = decode_floats(state["hit_level"])[0]
        det.rate = np.asarray(state["rate"], dtype=np.float64)
        det.csum = np.asarray(state["csum"], dtype=np.float64)
        det.cnum = np.asarray(state["cnum"], dtype=np.int32)
        det.cabove = np.asarray(state["cabove"], dtype=np.int32)
        det.cscale = np.asarray(state["cscale"], dtype=np.float64)
        det.het = np.asarray(state["het"], dtype=bool)
        det.ep_onset = decode_floats(state["ep_onset"])[0]
        det.ep_cost = decode_floats(state["ep_cost"])[0]
        det.ep_reports = np.asarray(state["ep_reports"], dtype=np.int32)
        det.ep_level = decode_floats(state["ep_level"])[0]
        if len(state["ring_work"]) == len(det.groups):
            det.ring_work = np.array([decode_floats(r)[0] for r in state["ring_work"]]).reshape(len(det.groups), _RING)
            det.ring_step = decode_floats(state["ring_step"])[0]
            det.ring_at = state["ring_at"]
        return det

    @classmethod
    def upgrade_state(cls, state: dict[str, Any] | None, version: int, job: SavedJob) -> dict[str, Any] | None:
        """Its saved state brought up to date (`DetectorBase.upgrade_state`): one saved before calibration has its
        baselines learnt again; one saved before `calib_ts` was kept has it unknown (judged at once: it calibrated
        long ago)."""
        state = super().upgrade_state(state, version, job)
        if version != 2:
            return state
        if "calib" not in state or "flag_ts" not in state:
            empty = cls(job.topo).state()
            if "calib" not in state:  # what it kept then stays; the rest, baselines of another kind, starts afresh
                state.update({k: v for k, v in empty.items() if k not in _KEPT_BEFORE_CALIBRATION})
            fill_missing(state, {"flag_ts": empty["flag_ts"]})
        fill_missing(state, {"calib_ts": None, "het_wait": False})
        return state
