"""The numbers behind fail-slow: scores, thresholds and persistence, vectorized over a job's ranks (pure functions).

`detectors.failslow` keeps the per-job state and turns these into findings; its
docstring explains the three steps (score, threshold, persist) these implement.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import numpy as np
from gangwatch.detectors.floats import median

if TYPE_CHECKING:
    from gangwatch.detectors.config import FailSlowConfig

_MAD_TO_SIGMA = 1.4826


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
                    cfg: FailSlowConfig, stats_c: tuple[np.ndarray, np.ndarray] | None = None,
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Robust z of each rank against its stage peers; (score, stage median compute_s).

    compute_s counts upwards (a straggler computes longest), comm_wait_s
    downwards (it waits least). With both, the smaller z is the score (both
    must agree); with one, that one; NaN where neither can be scored.
    Spreads are floored at `floor_frac` x the stage median compute_s (or
    step_s when compute_s is missing), so a very quiet job does not turn a
    1% wobble into a large z. `stats_c`: compute_s's `group_stats`, when already at hand.
    """
    med_c, sp_c = stats_c if stats_c is not None else group_stats(compute, groups, cfg.min_peers)
    ref = med_c
    if np.isnan(med_c).any():  # no compute_s: floor from the step time instead
        ref = np.where(np.isfinite(med_c), med_c, group_stats(step, groups, cfg.min_peers)[0])
    floor = cfg.floor_frac * ref
    z_c = _z(compute - med_c, sp_c, floor)
    med_w, sp_w = group_stats(comm, groups, cfg.min_peers)
    z_w = _z(med_w - comm, sp_w, floor)
    return np.fmin(z_c, z_w), med_c


def slowness(compute: np.ndarray, comm: np.ndarray, step: np.ndarray, groups: list[np.ndarray],
             cfg: FailSlowConfig, stats_c: tuple[np.ndarray, np.ndarray] | None = None,
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per rank: (how much longer it works than its stage's median, 0.1 = 10 %; the stage's spread of that,
    floored at `floor_frac`; the stage's median work in seconds).

    Work is compute_s, or, where a rank did not report it, the part of the step
    it did not spend waiting in the collective (step_s - comm_wait_s). `stats_c`: compute_s's
    `group_stats`, used when every rank reported compute_s.
    """
    every = bool(np.isfinite(compute).all())
    work = compute if every else np.where(np.isfinite(compute), compute, step - comm)
    med, spread = stats_c if every and stats_c is not None else group_stats(work, groups, cfg.min_peers)
    with np.errstate(divide="ignore", invalid="ignore"):
        slow = np.where(med > 0, work / med - 1.0, np.nan)
        scale = np.where(med > 0, np.fmax(spread / med, cfg.floor_frac), np.nan)
    return slow, scale, med


def individual_scores(slow: np.ndarray, usual: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Robust z of each rank's slowness now over its usual slowness, in spreads of its stage.

    Slowness is already relative to the stage (what happened to everyone,
    a checkpoint, a new sequence length, a throttled cluster, is taken out),
    and the usual slowness takes out what the rank always was: only a rank
    that slowed down scores. NaN where the usual level is unknown.
    """
    with np.errstate(invalid="ignore"):
        return (slow - usual) / scale


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


def step_costs(level: np.ndarray, med_work: np.ndarray, step_s: float) -> np.ndarray:
    """What each rank alone adds to the job's step, as a fraction of the step (0 for most).

    The step waits for the slowest rank, so a rank costs only what its work
    (`(1 + level) x` its stage's typical median work) exceeds the slowest
    stage's typical work by: a slow rank of a light stage may cost nothing.
    `step_s`: the job's typical step.
    """
    crit = med_work[np.isfinite(med_work)]
    if not (crit.size and np.isfinite(step_s) and step_s > 0):
        return np.zeros(level.shape)
    with np.errstate(invalid="ignore"):
        extra = np.fmax((1.0 + level) * med_work - float(crit.max()), 0.0)
    return np.where(np.isfinite(extra), extra / step_s, 0.0)


# --- 2. threshold -------------------------------------------------------------------------------


def threshold(rel: np.ndarray, ind: np.ndarray, cfg: FailSlowConfig, usual: np.ndarray | None = None) -> np.ndarray:
    """Hit per rank: both scores up, one of them over its threshold and the other at least in support.

    A rank that stands out from its peers but not from its own usual level is
    heterogeneous, not failing; one that changed but still matches its peers
    is not slow. For a rank that usually stands out (`usual`: its usual
    slowness in spreads of its stage, at least `support_threshold`), standing
    out says nothing: only the change counts, at its full threshold. Where the
    individual score is unknown there is no hit.
    """
    s = cfg.support_threshold
    with np.errstate(invalid="ignore"):
        ordinary = True if usual is None else ~(usual >= s)
        return ((rel >= cfg.rel_threshold) & (ind >= s) & ordinary) | ((ind >= cfg.ind_threshold) & (rel >= s))


# --- 3. persistence -----------------------------------------------------------------------------


def persist(hist: np.ndarray, hit: np.ndarray, scored: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """Shift this step's hit into each scored rank's bit history; (new history, hits in the last `window`).

    Ranks not scored this step keep their history: the window counts a
    rank's own scored steps. The history keeps 32 steps; `window` is at most 32.
    """
    shifted = ((hist << np.uint32(1)) | hit.astype(np.uint32)) & np.uint32(0xFFFFFFFF)
    new = np.where(scored, shifted, hist).astype(np.uint32)
    return new, hits_in(new, window)


def hits_in(hist: np.ndarray, window: int) -> np.ndarray:
    """Hits among the last `window` scored steps of each history."""
    return _popcount(hist & np.uint32((1 << window) - 1))


def _popcount(a: np.ndarray) -> np.ndarray:
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(a).astype(np.int32)
    return np.unpackbits(a.astype("<u4").view(np.uint8)).reshape(-1, 32).sum(axis=1).astype(np.int32)


def needed_hits(n: int, rate: float, alpha: float, at_least: int) -> int:
    """Fewest hits among `n` scored steps that stray hits at `rate` per step reach with chance at most `alpha`.

    The binomial tail, so a job whose steps are noisy needs more persistence
    than a quiet one; never fewer than `at_least`. The rate is rounded up on
    a grid of 20 per decade (cached).
    """
    q = 10.0 ** (math.ceil(math.log10(min(max(rate, 1e-12), 0.5)) * 20) / 20)
    return max(at_least, _needed(n, q, alpha))


@functools.lru_cache(maxsize=4096)
def _needed(n: int, p: float, alpha: float) -> int:
    tail = 0.0
    for k in range(n, -1, -1):
        tail += math.comb(n, k) * p ** k * (1 - p) ** (n - k)
        if tail > alpha:
            return k + 1
    return 0


@functools.lru_cache(maxsize=1024)
def normal_isf(p: float) -> float:
    """x such that a standard normal exceeds x with chance `p` (bisection on erfc; cached)."""
    lo, hi = 0.0, 40.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 0.5 * math.erfc(mid / math.sqrt(2.0)) > p:
            lo = mid
        else:
            hi = mid
    return hi
